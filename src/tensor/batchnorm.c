/* Batch normalisation over (n, h, w) per channel, PyTorch's BatchNorm2d:
 * training normalises with the batch mean and biased variance and moves
 * the running statistics by `momentum` towards the batch mean and the
 * unbiased variance; eval normalises with the running statistics. Sums
 * are accumulated in double so large batches keep float accuracy. */
#include <math.h>
#include "multigrad/tensor.h"
#include "core/elem.h"
#include "device/dk.h"

void mg_batchnorm2d_forward(float *y, float *mean, float *invstd, const float *x,
                            const float *gamma, const float *beta,
                            float *run_mean, float *run_var, int n, int c, int hw,
                            float eps, float momentum, bool training)
{
    if (mg__dk_cur) {
        mg_dk_batchnorm2d_forward(y, mean, invstd, x, gamma, beta, run_mean, run_var, n, c, hw,
                                  eps, momentum, training);
        return;
    }
    size_t m = (size_t)n * hw;
    for (int ch = 0; ch < c; ch++) {
        float mu, is;
        if (training) {
            double s = 0.0, s2 = 0.0;
            for (int i = 0; i < n; i++) {
                const float *xp = x + ((size_t)i * c + ch) * hw;
                for (int k = 0; k < hw; k++) s += xp[k];
            }
            double dm = m ? s / (double)m : 0.0;
            for (int i = 0; i < n; i++) {
                const float *xp = x + ((size_t)i * c + ch) * hw;
                for (int k = 0; k < hw; k++) {
                    double d = xp[k] - dm;
                    s2 += d * d;
                }
            }
            double var = m ? s2 / (double)m : 0.0;
            double unbiased = m > 1 ? s2 / (double)(m - 1) : var;
            mu = (float)dm;
            is = (float)(1.0 / sqrt(var + eps));
            if (run_mean) {
                run_mean[ch] = (1.0f - momentum) * run_mean[ch] + momentum * (float)dm;
                run_var[ch] = (1.0f - momentum) * run_var[ch] + momentum * (float)unbiased;
            }
        } else {
            mu = run_mean[ch];
            is = (float)(1.0 / sqrt((double)run_var[ch] + eps));
        }
        mean[ch] = mu;
        invstd[ch] = is;
        float a = gamma[ch] * is, b = beta[ch] - mu * a;
        for (int i = 0; i < n; i++) {
            const float *xp = x + ((size_t)i * c + ch) * hw;
            float *yp = y + ((size_t)i * c + ch) * hw;
            for (int k = 0; k < hw; k++) yp[k] = xp[k] * a + b;
        }
    }
}

void mg_batchnorm2d_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                             const float *x, const float *mean, const float *invstd,
                             const float *gamma, int n, int c, int hw, bool training)
{
    if (mg__dk_cur) {
        mg_dk_batchnorm2d_backward(dx, dgamma, dbeta, dy, x, mean, invstd, gamma, n, c, hw,
                                   training);
        return;
    }
    size_t m = (size_t)n * hw;
    for (int ch = 0; ch < c; ch++) {
        float mu = mean[ch], is = invstd[ch];
        double sdy = 0.0, sdyx = 0.0;
        for (int i = 0; i < n; i++) {
            const float *xp = x + ((size_t)i * c + ch) * hw;
            const float *gp = dy + ((size_t)i * c + ch) * hw;
            for (int k = 0; k < hw; k++) {
                sdy += gp[k];
                sdyx += (double)gp[k] * ((xp[k] - mu) * is);
            }
        }
        dgamma[ch] += (float)sdyx;
        dbeta[ch] += (float)sdy;
        if (!dx) continue;
        float a = gamma[ch] * is;
        float c0 = mg__bn_mean(training, m, sdy), c1 = mg__bn_mean(training, m, sdyx);
        for (int i = 0; i < n; i++) {
            const float *xp = x + ((size_t)i * c + ch) * hw;
            const float *gp = dy + ((size_t)i * c + ch) * hw;
            float *dp = dx + ((size_t)i * c + ch) * hw;
            for (int k = 0; k < hw; k++) dp[k] = mg__bn_dx(a, gp[k], c0, xp[k], mu, is, c1);
        }
    }
}
