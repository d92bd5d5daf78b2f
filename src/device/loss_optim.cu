/* The device kernels of the loss, gradient clipping and optimizers
 * (dk.h): softmax cross-entropy's per-row pieces (nn/loss.c), the
 * gradient's sum of squares and scaling, AdamW and SGD. The loss's rows
 * and the norm's per-lane partials come back to the host, added there in
 * order. */
#include <limits.h>
#include "device/dk_internal.h"
#include "optim/optim_impl.h"

/* ---- Loss ----------------------------------------------------------------------------- */

/* The rows of logits (this rank's columns [lo, lo + classes) when split
 * over the vocabulary; nn/loss.c): their maxima; the sums of
 * exp(z - max), the label's logit (if in these columns) and -(the first
 * column holding the maximum); the gradient. */
extern "C" void mg_dk_xent_max(float *mx, const float *logits, int n, int classes)
{
    PROFILE(__func__);
    int C = classes;
    rows((size_t)n, [=] HD(size_t r, int lane, int nl) {
        const float *z = logits + r * C;
        float m = -INFINITY;
        for (int j = lane; j < C; j += nl) m = fmaxf(m, z[j]);
        m = lane_max(m);
        if (lane == 0) mx[r] = m;
    });
}

extern "C" void mg_dk_xent_sums(float *sum, float *zy, float *arg, const float *logits,
                                const int32_t *labels, const float *mx, int n, int classes,
                                int lo)
{
    PROFILE(__func__);
    int C = classes;
    rows((size_t)n, [=] HD(size_t r, int lane, int nl) {
        const float *z = logits + r * C;
        float s = 0.0f;
        int first = INT_MAX;
        for (int j = lane; j < C; j += nl) {
            s += expf(z[j] - mx[r]);
            if (z[j] == mx[r] && j < first) first = j;
        }
        s = lane_sum(s);
        first = lane_min(first);
        if (lane) return;
        int y = labels[r] - lo;
        sum[r] = s;
        zy[r] = y >= 0 && y < C ? z[y] : 0.0f;
        arg[r] = first == INT_MAX ? -INFINITY : -(float)(lo + first);
    });
}

extern "C" void mg_dk_xent_grad(float *dlogits, const float *logits, const int32_t *labels,
                                const float *mx, const float *sum, int n, int classes, int lo)
{
    PROFILE(__func__);
    int C = classes;
    float inv_n = n > 0 ? 1.0f / (float)n : 0.0f;
    rows((size_t)n, [=] HD(size_t r, int lane, int nl) {
        const float *z = logits + r * C;
        float *g = dlogits + r * C, inv = 1.0f / sum[r];
        int y = labels[r] - lo;
        for (int j = lane; j < C; j += nl) {
            float v = expf(z[j] - mx[r]) * inv * inv_n;
            g[j] = j == y ? v - inv_n : v;
        }
    });
}

/* ---- Optimizers and clipping -------------------------------------------------------------- */

/* Two passes: 2^18 lanes each sum every 2^18-th square (enough loads in
 * flight to stream the gradients at the memory's speed), then 1024 lanes
 * each sum every 1024-th of those; the host adds the 1024 in order. */
static const size_t SUMSQ_LANES = (size_t)1 << 18, SUMSQ_OUT = 1024;

extern "C" double mg_dk_sumsq(const float *g, size_t n)
{
    PROFILE(__func__);
    if (!n) return 0.0;
    size_t L = n < SUMSQ_LANES ? n : SUMSQ_LANES, O = L < SUMSQ_OUT ? L : SUMSQ_OUT;
    double *part = (double *)dk_ws((L + O) * sizeof(double)), *out = part + L;
    each(L, [=] HD(size_t p) {
        double s = 0.0;
        for (size_t i = p; i < n; i += L) s += (double)g[i] * g[i];
        part[p] = s;
    });
    each(O, [=] HD(size_t p) {
        double s = 0.0;
        for (size_t i = p; i < L; i += O) s += part[i];
        out[p] = s;
    });
    double h[SUMSQ_OUT], s = 0.0;
    mg_dk_copy_out(h, out, O * sizeof(double));
    for (size_t p = 0; p < O; p++) s += h[p];
    return s;
}

extern "C" void mg_dk_scale(float *g, size_t n, float s)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { g[i] *= s; });
}

extern "C" void mg_dk_adam_update(float *p, const float *g, float *m, float *v, size_t n,
                                  const mg__adam_coef *c)
{
    PROFILE(__func__);
    const float b1 = c->beta1, omb1 = c->one_minus_beta1, b2 = c->beta2,
                omb2 = c->one_minus_beta2, eps = c->eps, nss = c->neg_step_size,
                bc2s = c->bc2_sqrt, wd = c->wd, decay = c->decay;
    each(n, [=] HD(size_t i) {
        mg__adam_elem(p, g, m, v, i, b1, omb1, b2, omb2, eps, nss, bc2s, wd, decay);
    });
}

extern "C" void mg_dk_sgd_update(float *p, const float *g, float *buf, size_t n,
                                 const mg__sgd_coef *c)
{
    PROFILE(__func__);
    const float neg_lr = c->neg_lr, wd = c->wd, mu = c->mu, omd = c->one_minus_damp;
    const bool nesterov = c->nesterov, first = c->first;
    if (mu == 0.0f) {
        each(n, [=] HD(size_t i) {
            float d = wd == 0.0f ? g[i] : g[i] + wd * p[i];
            p[i] = p[i] + neg_lr * d;
        });
        return;
    }
    each(n, [=] HD(size_t i) {
        float d = wd == 0.0f ? g[i] : g[i] + wd * p[i];
        float b = first ? d : (wd == 0.0f && omd == 1.0f && !nesterov) ? buf[i] * mu + g[i]
                                                                         : buf[i] * mu + omd * d;
        buf[i] = b;
        p[i] = p[i] + neg_lr * (nesterov ? d + mu * b : b);
    });
}
