/* Internal: sums, dot products and maxima of a row of floats in 16 fixed
 * lanes (element i goes to lane i % 16, each lane adding in order), the
 * lanes then folded in a fixed tree (16 -> 8 -> 4 -> 2 -> 1). The loops
 * vectorise without -ffast-math, and the result is the same bits whether
 * the compiler vectorises them or not: the order of the additions is the
 * code's (a build for a CPU without FMA contracts fewer products, as
 * everywhere else). A plain `s += x[i]` is one dependent chain (one add per
 * 4 cycles); this is 16 chains in one or two vector registers. The CPU's
 * row kernels of LayerNorm and the attention's softmax use them. */
#ifndef MG_TENSOR_LANES_H
#define MG_TENSOR_LANES_H

#define MG__LANES 16

static inline float mg__lanes_fold(float *a)
{
    for (int w = MG__LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) a[j] += a[j + w];
    return a[0];
}

/* The lanes of f(i) for i < n: the body `a[j] += (expression of i)`,
 * where i = i0 + j. */
#define MG__LANES_LOOP(n, body)                                                  \
    for (int i0_ = 0; i0_ < (n); i0_ += MG__LANES) {                             \
        int m_ = (n) - i0_ < MG__LANES ? (n) - i0_ : MG__LANES;                  \
        for (int j = 0; j < m_; j++) {                                           \
            int i = i0_ + j;                                                     \
            body;                                                                \
        }                                                                        \
    }

/* sum x[i] */
static inline float mg__lanes_sum(const float *x, int n)
{
    float a[MG__LANES] = {0};
    MG__LANES_LOOP(n, a[j] += x[i]);
    return mg__lanes_fold(a);
}

/* sum a[i] b[i] */
static inline float mg__lanes_dot(const float *x, const float *y, int n)
{
    float a[MG__LANES] = {0};
    MG__LANES_LOOP(n, a[j] += x[i] * y[i]);
    return mg__lanes_fold(a);
}

/* sum (x[i] - mu)^2 */
static inline float mg__lanes_sqdev(const float *x, int n, float mu)
{
    float a[MG__LANES] = {0};
    MG__LANES_LOOP(n, a[j] += (x[i] - mu) * (x[i] - mu));
    return mg__lanes_fold(a);
}

/* max x[i], n >= 1 (exact: any order gives the same value) */
static inline float mg__lanes_max(const float *x, int n)
{
    float a[MG__LANES];
    for (int j = 0; j < MG__LANES; j++) a[j] = x[0];
    MG__LANES_LOOP(n, a[j] = x[i] > a[j] ? x[i] : a[j]);
    for (int w = MG__LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) a[j] = a[j + w] > a[j] ? a[j + w] : a[j];
    return a[0];
}

/* x[i] = exp(x[i] - c) for i < n, through glibc's vector expf (exp.c,
 * compiled with -ffast-math: 16 lanes with AVX-512). */
void mg__exp_shifted(float *x, int n, float c);

#endif
