/* Internal: per-element formulas that the CPU's kernels and the device
 * kernels (src/device/kernels.cu, host and GPU) share, so that both
 * compute the very same expressions. */
#ifndef MG_CORE_ELEM_H
#define MG_CORE_ELEM_H

#include <math.h>

#ifdef __CUDACC__
#define MG_HD __host__ __device__
#else
#define MG_HD
#endif

/* GELU with the tanh approximation (src/tensor/gelu.c):
 * s = sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3); gelu(v) = v s. */
#define MG__GELU_K 0.7978845608028654f   /* sqrt(2/pi) */
#define MG__GELU_C 0.044715f

static inline MG_HD float mg__gelu_s(float v)
{
    float u = MG__GELU_K * (v + MG__GELU_C * v * v * v);
    return 1.0f / (1.0f + expf(-2.0f * u));
}

/* The derivative of v * s given s. */
static inline MG_HD float mg__gelu_deriv(float v, float s)
{
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
