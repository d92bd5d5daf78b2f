/* Internal: per-element formulas that the CPU's kernels and the device
 * kernels (src/device/kernels.cu, host and GPU) share, so that both
 * compute the very same expressions. */
#ifndef MG_CORE_ELEM_H
#define MG_CORE_ELEM_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MG_HD __host__ __device__
#else
#define MG_HD
#endif

/* Philox-4x32-10 (Salmon et al., SC'11), the block `ctr` of the stream
 * `seed` (src/core/rng.c: mg_rng's words are these blocks in turn). */
static inline MG_HD void mg__philox(uint64_t seed, uint64_t ctr, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int i = 0; i < 10; i++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* The k x k window of output (oy, ox) of a pool with stride s over a
 * plane of width w (src/tensor/pool.c): its mean, and its maximum with
 * the flat index of the first maximum in row-major order. */
static inline MG_HD float mg__pool_mean(const float *xp, int w, int k, int s, int oy, int ox)
{
    float acc = 0.0f;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) acc += xp[(oy * s + i) * w + ox * s + j];
    return acc * (1.0f / (float)(k * k));
}

static inline MG_HD float mg__pool_max(const float *xp, int w, int k, int s, int oy, int ox,
                                       int32_t *arg)
{
    int best = oy * s * w + ox * s;
    float m = xp[best];
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) {
            int idx = (oy * s + i) * w + ox * s + j;
            if (xp[idx] > m) {
                m = xp[idx];
                best = idx;
            }
        }
    *arg = best;
    return m;
}

/* Batch normalisation's input gradient of one element (src/tensor/
 * batchnorm.c): a = gamma * invstd; c0 and c1 the channel's means of dy
 * and of dy * (x - mean) * invstd in training, 0 in eval (mg__bn_mean of
 * their sums over the channel's m elements). */
static inline MG_HD float mg__bn_mean(bool training, size_t m, double sum)
{
    return training && m ? (float)(sum / (double)m) : 0.0f;
}

static inline MG_HD float mg__bn_dx(float a, float dy, float c0, float x, float mu, float is,
                                    float c1)
{
    return a * (dy - c0 - (x - mu) * is * c1);
}

/* GELU with the tanh approximation (src/tensor/gelu.c):
 * s = sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3); gelu(v) = v s.
 * Where the exponent -2u passes 80 (v below about -10.3) s is 0: under
 * -ffast-math an exp that overflows to inf gives a NaN (the vector
 * reciprocal's refinement takes inf * 0), which every v below about -10.2
 * did; the true s there is below 1.8e-35, so v s and the derivative are 0
 * to float's precision. */
#define MG__GELU_K 0.7978845608028654f   /* sqrt(2/pi) */
#define MG__GELU_C 0.044715f

static inline MG_HD float mg__gelu_s(float v)
{
    float u = MG__GELU_K * (v + MG__GELU_C * v * v * v), a = -2.0f * u;
    float s = 1.0f / (1.0f + expf(fminf(a, 80.0f)));
    return a < 80.0f ? s : 0.0f;
}

/* The derivative of v * s given s. Beyond |v| = 20, s is 0 or 1 exactly,
 * so s (1 - s) is 0: v is held there, so that v * du (whose v^2 overflows
 * past 1.8e19) stays finite and the term 0, not NaN. */
static inline MG_HD float mg__gelu_deriv(float v, float s)
{
    v = fminf(fmaxf(v, -20.0f), 20.0f);
    float du = 2.0f * MG__GELU_K * (1.0f + 3.0f * MG__GELU_C * v * v);
    return s + v * du * s * (1.0f - s);
}

/* One element of Adam/AdamW (src/optim/adam.c): decay, the moments,
 * the step; b1..decay are mg__adam_coef's fields. */
static inline MG_HD void mg__adam_elem(float *p, const float *g, float *m, float *v, size_t i,
                                       float b1, float omb1, float b2, float omb2, float eps,
                                       float nss, float bc2s, float wd, float decay)
{
    float pi = p[i] * decay;
    float gi = fmaf(wd, pi, g[i]);
    float mi = fmaf(omb1, gi, m[i] * b1);
    float vi = fmaf(omb2 * gi, gi, v[i] * b2);
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / bc2s + eps;
    p[i] = fmaf(nss, mi / denom, pi);
}

#endif
