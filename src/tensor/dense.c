/* Elementwise and dense kernels: ReLU, linear (GEMM + bias, optional
 * fused ReLU) and inverted dropout with counter-based masks. The linear
 * layer keeps PyTorch's weight layout [out, in], so the forward is one
 * GEMM with B transposed (OpenBLAS packs it; no explicit transpose), the
 * weight gradient dy^T x and the input gradient dy W. */
#include <string.h>
#include "multigrad/tensor.h"
#include "device/dk.h"

void mg_relu_forward(float *y, const float *x, size_t n)
{
    if (mg__dk_cur) {
        mg_dk_relu_forward(y, x, n);
        return;
    }
    for (size_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void mg_relu_backward(float *dx, const float *dy, const float *y, size_t n)
{
    if (mg__dk_cur) {
        mg_dk_relu_backward(dx, dy, y, n);
        return;
    }
    for (size_t i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void mg_copy_floats(float *y, const float *x, size_t n)
{
    if (mg__dk_cur) {
        mg_dk_copy_floats(y, x, n);
        return;
    }
    memcpy(y, x, n * sizeof(float));
}

void mg_add_into(float *restrict y, const float *restrict a, size_t n)
{
    if (mg__dk_cur) {
        mg_dk_add_into(y, a, n);
        return;
    }
    for (size_t i = 0; i < n; i++) y[i] += a[i];
}

mg_status mg_add_into_on(mg_device d, float *y, const float *a, size_t n)
{
    mg_device was = mg_device_current();
    MG_TRY(mg_device_set_current(d));
    mg_add_into(y, a, n);
    return mg_device_set_current(was);
}

void mg_mul(float *restrict y, const float *restrict a, const float *restrict b, size_t n)
{
    if (mg__dk_cur) {
        mg_dk_mul(y, a, b, n);
        return;
    }
    for (size_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}

size_t mg_linear_kept(int n, int in, int out)
{
    return mg__dk_cur ? mg_dk_linear_kept(n, in, out) : 0;
}

bool mg_gemm_bf16(void) { return mg__dk_cur && mg_dk_gemm_bf16(); }

void mg_linear_forward(float *y, const float *x, const float *wt, const float *b,
                       int n, int in, int out, bool relu)
{
    mg_linear_forward_kept(y, x, wt, b, n, in, out, relu, NULL);
}

void mg_linear_forward_kept(float *y, const float *x, const float *wt, const float *b, int n,
                            int in, int out, bool relu, void *kept)
{
    if (mg__dk_cur) {
        mg_dk_linear_forward(y, x, wt, b, n, in, out, relu, kept);
        return;
    }
    mg_gemm(false, true, n, out, in, 1.0f, x, in, wt, in, 0.0f, y, out);
    mg_bias_relu(y, b, n, out, relu);
}

void mg_bias_relu(float *y, const float *b, int n, int out, bool relu)
{
    if (mg__dk_cur) {
        mg_dk_bias_relu(y, b, n, out, relu);
        return;
    }
    for (int i = 0; i < n; i++) {
        float *yi = y + (size_t)i * out;
        if (relu) {
            for (int j = 0; j < out; j++) {
                float v = yi[j] + (b ? b[j] : 0.0f);
                yi[j] = v > 0.0f ? v : 0.0f;
            }
        } else if (b) {
            for (int j = 0; j < out; j++) yi[j] += b[j];
        }
    }
}

void mg_bias_relu_backward(float *dy, float *db, const float *y, int n, int out, bool relu)
{
    if (mg__dk_cur) {
        mg_dk_bias_relu_backward(dy, db, y, n, out, relu);
        return;
    }
    for (int i = 0; i < n; i++) {
        float *g = dy + (size_t)i * out;
        if (relu) {
            const float *yi = y + (size_t)i * out;
            for (int j = 0; j < out; j++) g[j] = yi[j] > 0.0f ? g[j] : 0.0f;
        }
        if (db)
            for (int j = 0; j < out; j++) db[j] += g[j];
    }
}

void mg_linear_backward(float *dx, float *dw, float *db, float *dy, const float *y,
                        const float *x, const float *wt, int n, int in, int out,
                        bool relu)
{
    mg_linear_backward_kept(dx, dw, db, dy, y, x, wt, n, in, out, relu, NULL);
}

void mg_linear_backward_kept(float *dx, float *dw, float *db, float *dy, const float *y,
                             const float *x, const float *wt, int n, int in, int out, bool relu,
                             const void *kept)
{
    if (mg__dk_cur) {
        mg_dk_linear_backward(dx, dw, db, dy, y, x, wt, n, in, out, relu, kept);
        return;
    }
    mg_bias_relu_backward(dy, db, y, n, out, relu);
    mg_gemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (dx) mg_gemm(false, false, n, in, out, 1.0f, dy, out, wt, in, 0.0f, dx, in);
}

void mg_dropout_mask(uint8_t *keep, size_t n, float p, uint64_t seed, uint64_t counter)
{
    if (mg__dk_cur) {
        mg_dk_dropout_mask(keep, n, p, seed, counter);
        return;
    }
    /* Keep iff a 24-bit uniform is >= p * 2^24: exact for p in 2^-24 steps. */
    uint32_t thr = (uint32_t)((double)p * 16777216.0);
    mg_rng r;
    mg_rng_init(&r, seed);
    r.counter = counter;
    for (size_t i = 0; i < n; i++) keep[i] = (mg_rng_u32(&r) >> 8) >= thr;
}

void mg_dropout_apply(float *y, const float *x, const uint8_t *keep, size_t n, float p)
{
    if (mg__dk_cur) {
        mg_dk_dropout_apply(y, x, keep, n, p);
        return;
    }
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < n; i++) y[i] = keep[i] ? x[i] * scale : 0.0f;
}
