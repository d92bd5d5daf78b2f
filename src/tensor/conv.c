/* 2-d convolution as im2col + GEMM over blocks of images, with an
 * optional fused ReLU and 2x2/2 pool.
 *
 * The batch is cut into chunks of images whose im2col matrix fits in
 * cache (MG_CONV_CHUNK_KB, default 1024 KiB): the columns of a chunk sit
 * side by side, so each GEMM is W[oc,K] x col[K, chunk*oh*ow] with one
 * long dimension, and the output block [oc, chunk*oh*ow] is turned into
 * NCHW by the epilogue, which adds the bias, applies the ReLU and pools in
 * the same pass. The backward recomputes im2col per chunk rather than
 * keeping the whole batch's columns (41 MB for lenet-d2l at batch 256).
 *
 * With a pool, the forward keeps one byte per pooled output: bit k set if
 * window element k (row-major in the 2x2 window) receives gradient (its
 * ReLU was active for avg, it is the first maximum for max). Limits: the
 * fused pool is 2x2 with stride 2 and no padding; other pools are layers. */
#include <string.h>
#include "multigrad/tensor.h"

/* Read at each shape set-up (model creation), not in the step. */
static size_t chunk_budget_floats(void)
{
    long kb = mg_env_long("MG_CONV_CHUNK_KB", 1024);
    return (size_t)(kb < 16 ? 16 : kb) * 256;
}

bool mg_conv2d_shape_init(mg_conv2d_shape *s, int c, int h, int w, int oc,
                          int kh, int kw, int stride, int pad, bool relu,
                          mg_pool_kind pool)
{
    memset(s, 0, sizeof *s);
    if (c <= 0 || h <= 0 || w <= 0 || oc <= 0 || kh <= 0 || kw <= 0 ||
        stride <= 0 || pad < 0)
        return false;
    int oh = (h + 2 * pad - kh) / stride + 1, ow = (w + 2 * pad - kw) / stride + 1;
    if (h + 2 * pad < kh || w + 2 * pad < kw || oh <= 0 || ow <= 0) return false;
    *s = (mg_conv2d_shape){.c = c, .h = h, .w = w, .oc = oc, .kh = kh, .kw = kw,
                           .stride = stride, .pad = pad, .oh = oh, .ow = ow,
                           .relu = relu, .pool = pool};
    if (pool != MG_POOL_NONE) {
        if (oh < 2 || ow < 2) return false;
        s->ph = oh / 2;
        s->pw = ow / 2;
    } else {
        s->ph = oh;
        s->pw = ow;
    }
    size_t per_image = (size_t)c * kh * kw * oh * ow;
    size_t chunk = chunk_budget_floats() / (per_image ? per_image : 1);
    s->chunk = chunk < 1 ? 1 : chunk > 4096 ? 4096 : (int)chunk;
    return true;
}

size_t mg_conv2d_workspace(const mg_conv2d_shape *s)
{
    size_t p = (size_t)s->oh * s->ow * s->chunk;
    return (size_t)s->c * s->kh * s->kw * p + (size_t)s->oc * p;
}

size_t mg_conv2d_saved_bytes(const mg_conv2d_shape *s)
{
    return s->pool == MG_POOL_NONE ? 0 : (size_t)s->oc * s->ph * s->pw;
}

/* One output plane from the GEMM block: bias, ReLU, pool, mask. */
static void epilogue_plane(float *dst, uint8_t *m, const float *src, float b,
                           const mg_conv2d_shape *s)
{
    int ow = s->ow, P = s->oh * s->ow;
    if (s->pool == MG_POOL_NONE) {
        if (s->relu) {
            for (int p = 0; p < P; p++) {
                float v = src[p] + b;
                dst[p] = v > 0.0f ? v : 0.0f;
            }
        } else {
            for (int p = 0; p < P; p++) dst[p] = src[p] + b;
        }
        return;
    }
    for (int py = 0; py < s->ph; py++) {
        const float *r0 = src + 2 * py * ow, *r1 = r0 + ow;
        float *d = dst + py * s->pw;
        uint8_t *mm = m + py * s->pw;
        for (int px = 0; px < s->pw; px++) {
            float v0 = r0[2 * px] + b, v1 = r0[2 * px + 1] + b;
            float v2 = r1[2 * px] + b, v3 = r1[2 * px + 1] + b;
            if (s->pool == MG_POOL_AVG) {
                if (s->relu) {
                    int k = (v0 > 0.0f) | (v1 > 0.0f) << 1 | (v2 > 0.0f) << 2 | (v3 > 0.0f) << 3;
                    v0 = v0 > 0.0f ? v0 : 0.0f;
                    v1 = v1 > 0.0f ? v1 : 0.0f;
                    v2 = v2 > 0.0f ? v2 : 0.0f;
                    v3 = v3 > 0.0f ? v3 : 0.0f;
                    mm[px] = (uint8_t)k;
                } else {
                    mm[px] = 0xF;
                }
                d[px] = ((v0 + v1) + (v2 + v3)) * 0.25f;
            } else {
                /* First maximum in row-major order wins ties (PyTorch). */
                float v = v0;
                int k = 0;
                if (v1 > v) { v = v1; k = 1; }
                if (v2 > v) { v = v2; k = 2; }
                if (v3 > v) { v = v3; k = 3; }
                if (s->relu && !(v > 0.0f)) {
                    d[px] = 0.0f;
                    mm[px] = 0;
                } else {
                    d[px] = v;
                    mm[px] = (uint8_t)(1 << k);
                }
            }
        }
    }
}

/* The gradient of one GEMM-block plane from the layer output's gradient;
 * returns its sum (the bias gradient). */
static float grad_plane(float *dst, const float *dy, const float *y, const uint8_t *m,
                        const mg_conv2d_shape *s)
{
    int ow = s->ow, oh = s->oh, P = oh * ow;
    float sum = 0.0f;
    if (s->pool == MG_POOL_NONE) {
        if (s->relu) {
            for (int p = 0; p < P; p++) {
                float g = y[p] > 0.0f ? dy[p] : 0.0f;
                dst[p] = g;
                sum += g;
            }
        } else {
            for (int p = 0; p < P; p++) {
                dst[p] = dy[p];
                sum += dy[p];
            }
        }
        return sum;
    }
    float scale = s->pool == MG_POOL_AVG ? 0.25f : 1.0f;
    for (int py = 0; py < s->ph; py++) {
        float *r0 = dst + 2 * py * ow, *r1 = r0 + ow;
        const float *g = dy + py * s->pw;
        const uint8_t *mm = m + py * s->pw;
        for (int px = 0; px < s->pw; px++) {
            float v = g[px] * scale;
            int k = mm[px];
            float a0 = k & 1 ? v : 0.0f, a1 = k & 2 ? v : 0.0f;
            float a2 = k & 4 ? v : 0.0f, a3 = k & 8 ? v : 0.0f;
            r0[2 * px] = a0;
            r0[2 * px + 1] = a1;
            r1[2 * px] = a2;
            r1[2 * px + 1] = a3;
            sum += (a0 + a1) + (a2 + a3);
        }
        /* Floor mode: an odd last column gets no gradient. */
        for (int x = 2 * s->pw; x < ow; x++) r0[x] = r1[x] = 0.0f;
    }
    for (int r = 2 * s->ph; r < oh; r++) memset(dst + r * ow, 0, sizeof(float) * (size_t)ow);
    return sum;
}

void mg_conv2d_forward(float *y, uint8_t *saved, const float *x,
                       const float *wt, const float *b,
                       const mg_conv2d_shape *s, int n, float *ws)
{
    int K = s->c * s->kh * s->kw, P = s->oh * s->ow;
    size_t in_sz = (size_t)s->c * s->h * s->w, out_sz = (size_t)s->oc * s->ph * s->pw;
    size_t sv_sz = mg_conv2d_saved_bytes(s), sv_plane = (size_t)s->ph * s->pw;
    float *col = ws, *blk = ws + (size_t)K * P * s->chunk;
    for (int n0 = 0; n0 < n; n0 += s->chunk) {
        int cn = n - n0 < s->chunk ? n - n0 : s->chunk;
        int ld = cn * P;
        for (int i = 0; i < cn; i++)
            mg_im2col(col + (size_t)i * P, ld, x + (n0 + i) * in_sz, s->c, s->h, s->w,
                      s->kh, s->kw, s->stride, s->pad, s->oh, s->ow);
        mg_gemm(false, false, s->oc, ld, K, 1.0f, wt, K, col, ld, 0.0f, blk, ld);
        for (int i = 0; i < cn; i++) {
            float *yi = y + (n0 + i) * out_sz;
            uint8_t *mi = saved ? saved + (n0 + i) * sv_sz : NULL;
            for (int o = 0; o < s->oc; o++)
                epilogue_plane(yi + o * sv_plane, mi ? mi + o * sv_plane : NULL,
                               blk + (size_t)o * ld + (size_t)i * P, b ? b[o] : 0.0f, s);
        }
    }
}

void mg_conv2d_backward(float *dx, float *dw, float *db, const float *dy,
                        const float *y, const uint8_t *saved, const float *x,
                        const float *wt, const mg_conv2d_shape *s, int n,
                        float *ws)
{
    int K = s->c * s->kh * s->kw, P = s->oh * s->ow;
    size_t in_sz = (size_t)s->c * s->h * s->w, out_sz = (size_t)s->oc * s->ph * s->pw;
    size_t sv_sz = mg_conv2d_saved_bytes(s), sv_plane = (size_t)s->ph * s->pw;
    float *col = ws, *blk = ws + (size_t)K * P * s->chunk;
    for (int n0 = 0; n0 < n; n0 += s->chunk) {
        int cn = n - n0 < s->chunk ? n - n0 : s->chunk;
        int ld = cn * P;
        for (int i = 0; i < cn; i++) {
            const float *dyi = dy + (n0 + i) * out_sz, *yi = y + (n0 + i) * out_sz;
            const uint8_t *mi = saved ? saved + (n0 + i) * sv_sz : NULL;
            for (int o = 0; o < s->oc; o++) {
                float g = grad_plane(blk + (size_t)o * ld + (size_t)i * P, dyi + o * sv_plane,
                                     yi + o * sv_plane, mi ? mi + o * sv_plane : NULL, s);
                if (db) db[o] += g;
            }
        }
        for (int i = 0; i < cn; i++)
            mg_im2col(col + (size_t)i * P, ld, x + (n0 + i) * in_sz, s->c, s->h, s->w,
                      s->kh, s->kw, s->stride, s->pad, s->oh, s->ow);
        mg_gemm(false, true, s->oc, K, ld, 1.0f, blk, ld, col, ld, 1.0f, dw, K);
        if (!dx) continue;
        mg_gemm(true, false, K, ld, s->oc, 1.0f, wt, K, blk, ld, 0.0f, col, ld);
        for (int i = 0; i < cn; i++) {
            float *dxi = dx + (n0 + i) * in_sz;
            memset(dxi, 0, sizeof(float) * in_sz);
            mg_col2im(dxi, col + (size_t)i * P, ld, s->c, s->h, s->w, s->kh, s->kw,
                      s->stride, s->pad, s->oh, s->ow);
        }
    }
}
