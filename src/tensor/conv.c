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
 * A layer with one input channel (the first layer of an image model) has
 * so few taps per output that im2col would cost more than the arithmetic:
 * with AVX-512 it is a direct convolution instead (conv_avx512.c), forward
 * and weight gradient. Other stride-1 layers whose group of 16 images fits
 * the same cache budget (lenet-d2l's and lenet5's conv2) put the images in
 * the vector lanes (conv_lanes_avx512.c): FMA kernels read the input where
 * it lies, no im2col matrix and no BLAS packing, and their output goes
 * through the same epilogues. This file holds the portable C kernels and
 * the dispatch; all paths keep the same saved masks (conv_impl.h), so
 * either backward follows either forward. Limits: the fused pool is 2x2,
 * stride 2, no padding; other pools are layers. */
#include <stdint.h>
#include <string.h>
#include "tensor/conv_impl.h"
#include "device/dk.h"

/* Read at each shape set-up (model creation), not in the step. */
static size_t chunk_budget_floats(void)
{
    return (size_t)mg_env_long("MG_CONV_CHUNK_KB", 1024) * 256;
}

/* A group of the lanes path: its input, its output and one more of
 * either (the pre-pool planes, or the input gradient). */
static size_t lanes_data_floats(const mg_conv2d_shape *s)
{
    size_t in = (size_t)s->c * (s->h + 2 * s->pad) * (s->w + 2 * s->pad);
    size_t out = (size_t)s->oc * s->oh * s->ow;
    return 16 * (in + 2 * (out > in ? out : in));
}

static bool use_simd(void)
{
#ifdef MG__HAVE_AVX512
    return strcmp(mg_env_str("MG_KERNELS", "auto"), "generic") != 0;
#else
    return false;
#endif
}

bool mg_conv2d_shape_init(mg_conv2d_shape *s, int c, int h, int w, int oc,
                          int kh, int kw, int stride, int pad, bool relu,
                          mg_pool_kind pool)
{
    memset(s, 0, sizeof *s);
    if (c <= 0 || h <= 0 || w <= 0 || oc <= 0 || kh <= 0 || kw <= 0 ||
        stride <= 0 || pad < 0)
        return false;
    if (h + 2 * pad < kh || w + 2 * pad < kw) return false;
    int oh = (h + 2 * pad - kh) / stride + 1, ow = (w + 2 * pad - kw) / stride + 1;
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
    s->simd = use_simd();
    s->direct = s->simd && c == 1 && stride == 1 && ow <= 32 && kh * kw <= 25;
    /* Padded planes of a direct block: a quarter of the im2col budget (they
     * share L2 with the block's outputs). */
    size_t plane = (size_t)(h + 2 * pad) * (w + 2 * pad), dchunk = chunk_budget_floats() / 4 / plane;
    s->dchunk = dchunk < 1 ? 1 : dchunk > 4096 ? 4096 : (int)dchunk;
    /* Register blocks of 5 output channels, or 4 where that pads fewer. */
    s->mr = (4 - oc % 4) % 4 < (5 - oc % 5) % 5 ? 4 : 5;
    s->lanes = s->simd && stride == 1 && kw <= 5 &&
               lanes_data_floats(s) <= chunk_budget_floats();
    return true;
}

static size_t direct_floats(const mg_conv2d_shape *s)
{
    /* Slack: row loads run up to 32 + kw floats past a plane's last row. */
    return (size_t)s->dchunk * (s->h + 2 * s->pad) * (s->w + 2 * s->pad) + 64 + s->kw;
}

/* Few output channels: the weight gradient is computed transposed,
 * dW^T[K, oc] = col . dY^T, which OpenBLAS runs half again as fast as
 * dY . col^T when oc is small (a 16-row A panel wastes its kernel), and
 * added to dW at the end. Up to 64 channels: lenet-d2l's conv2 (50) trains
 * 5% faster so with the Haswell kernels (3 of 3 paired runs, AMD EPYC). */
static bool dw_transposed(const mg_conv2d_shape *s) { return s->oc <= 64; }

/* The lanes path's workspace: packed weights for the forward (and the
 * weight gradient's padding rows) and for the input gradient, then a
 * group's input, output and pre-pool planes (or input gradient), each
 * 64-byte aligned. Returns its size in floats (with the alignment slack). */
typedef struct {
    float *wf, *wb, *x, *y, *b;
} lanes_ws;

static size_t lanes_layout(const mg_conv2d_shape *s, float *ws, lanes_ws *l)
{
#ifdef MG__HAVE_AVX512
    size_t K = (size_t)s->c * s->kh * s->kw, P = (size_t)s->oh * s->ow;
    size_t in = (size_t)s->c * (s->h + 2 * s->pad) * (s->w + 2 * s->pad) * MG__LANES;
    size_t out = (size_t)s->oc * P * MG__LANES;
    size_t sz[5] = {mg__lanes_oc_padded(s) * K, s->oc * K, in,
                    mg__lanes_oc_padded(s) * P * MG__LANES, out > in ? out : in};
    float **dst[5] = {&l->wf, &l->wb, &l->x, &l->y, &l->b};
    float *p = ws ? (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63) : NULL;
    size_t off = 0;
    for (int i = 0; i < 5; i++) {
        if (p) *dst[i] = p + off;
        off += (sz[i] + 15) / 16 * 16;
    }
    return off + 16;
#else
    (void)s, (void)ws, (void)l;
    return 0;
#endif
}

size_t mg_conv2d_workspace(const mg_conv2d_shape *s, int n)
{
    if (mg__dk_cur) return mg_dk_conv2d_workspace(s, n);
    size_t p = (size_t)s->oh * s->ow * s->chunk, K = (size_t)s->c * s->kh * s->kw;
    /* im2col + GEMM is there for every shape (the lanes path leaves it to
     * more than two BLAS threads). */
    size_t need = K * p + (size_t)s->oc * p + (dw_transposed(s) ? K * s->oc : 0);
    if (s->lanes && lanes_layout(s, NULL, NULL) > need) need = lanes_layout(s, NULL, NULL);
    if (s->direct && direct_floats(s) > need) need = direct_floats(s);
    return need;
}

size_t mg_conv2d_saved_bytes(const mg_conv2d_shape *s)
{
    if (mg__dk_cur) return mg_dk_conv2d_saved_bytes(s);
    return (size_t)s->oc * mg__plane_masks(s) * sizeof(uint16_t);
}

/* ---- Portable epilogues ----------------------------------------------- */

/* One output plane from the GEMM block: bias, ReLU, pool, masks. */
static void epilogue_plane(float *dst, uint16_t *m, const float *src, float b,
                           const mg_conv2d_shape *s)
{
    int ow = s->ow, P = s->oh * s->ow, nseg = mg__pool_segs(s);
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
    memset(m, 0, mg__plane_masks(s) * sizeof(uint16_t));
    for (int py = 0; py < s->ph; py++) {
        const float *r0 = src + 2 * py * ow, *r1 = r0 + ow;
        float *d = dst + py * s->pw;
        for (int px = 0; px < s->pw; px++) {
            uint16_t *mm = m + ((size_t)py * nseg + px / 16) * 4, bit = (uint16_t)(1u << (px % 16));
            float v[4] = {r0[2 * px] + b, r0[2 * px + 1] + b, r1[2 * px] + b, r1[2 * px + 1] + b};
            if (s->pool == MG_POOL_AVG) {
                for (int k = 0; k < 4; k++) {
                    if (s->relu && !(v[k] > 0.0f)) v[k] = 0.0f;
                    else mm[k] |= bit;
                }
                d[px] = ((v[0] + v[1]) + (v[2] + v[3])) * 0.25f;
            } else {
                /* First maximum in row-major order wins ties (PyTorch). */
                int k = 0;
                for (int q = 1; q < 4; q++)
                    if (v[q] > v[k]) k = q;
                if (s->relu && !(v[k] > 0.0f)) {
                    d[px] = 0.0f;
                } else {
                    d[px] = v[k];
                    mm[k] |= bit;
                }
            }
        }
    }
}

/* The gradient of one GEMM-block plane from the layer output's gradient;
 * returns its sum (the bias gradient). */
static float grad_plane(float *dst, const float *dy, const float *y, const uint16_t *m,
                        const mg_conv2d_shape *s)
{
    int ow = s->ow, oh = s->oh, P = oh * ow, nseg = mg__pool_segs(s);
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
    memset(dst, 0, sizeof(float) * (size_t)P);
    float scale = s->pool == MG_POOL_AVG ? 0.25f : 1.0f;
    for (int py = 0; py < s->ph; py++) {
        float *r[2] = {dst + 2 * py * ow, dst + (2 * py + 1) * ow};
        for (int px = 0; px < s->pw; px++) {
            const uint16_t *mm = m + ((size_t)py * nseg + px / 16) * 4;
            float g = dy[py * s->pw + px] * scale;
            for (int k = 0; k < 4; k++)
                if (mm[k] >> (px % 16) & 1) {
                    r[k >> 1][2 * px + (k & 1)] = g;
                    sum += g;
                }
        }
    }
    return sum;
}

/* ---- Dispatch ---------------------------------------------------------- */

static void im2col_chunk(float *col, int ld, const float *x, int cn, const mg_conv2d_shape *s)
{
    size_t in_sz = (size_t)s->c * s->h * s->w;
    int P = s->oh * s->ow;
    for (int i = 0; i < cn; i++) {
#ifdef MG__HAVE_AVX512
        if (s->simd && s->stride == 1) {
            mg__im2col_s1_avx512(col + (size_t)i * P, ld, x + i * in_sz, s->c, s->h, s->w,
                                 s->kh, s->kw, s->pad, s->oh, s->ow);
            continue;
        }
#endif
        mg_im2col(col + (size_t)i * P, ld, x + i * in_sz, s->c, s->h, s->w, s->kh, s->kw,
                  s->stride, s->pad, s->oh, s->ow);
    }
}

#ifdef MG__HAVE_AVX512
/* Zero-padded copies of cn one-channel images for the direct path. */
static void pad_planes(float *xp, const float *x, int cn, const mg_conv2d_shape *s)
{
    int hp = s->h + 2 * s->pad, wp = s->w + 2 * s->pad;
    if (s->pad == 0) {
        memcpy(xp, x, sizeof(float) * (size_t)cn * s->h * s->w);
    } else {
        memset(xp, 0, sizeof(float) * (size_t)cn * hp * wp);
        for (int i = 0; i < cn; i++)
            for (int y = 0; y < s->h; y++)
                memcpy(xp + ((size_t)i * hp + y + s->pad) * wp + s->pad,
                       x + ((size_t)i * s->h + y) * s->w, sizeof(float) * (size_t)s->w);
    }
    memset(xp + (size_t)cn * hp * wp, 0, sizeof(float) * (size_t)(64 + s->kw));
}
#endif

/* The epilogue of a block of cn images from n0: pre-pool planes at
 * blk + o * ld + i * P (bias, ReLU, pool, masks) into y. */
static void epilogue_chunk(float *y, uint16_t *masks, const float *blk, int ld, int n0, int cn,
                           const float *b, const mg_conv2d_shape *s)
{
    size_t out_sz = (size_t)s->oc * s->ph * s->pw, mplane = mg__plane_masks(s);
    size_t out_plane = (size_t)s->ph * s->pw, P = (size_t)s->oh * s->ow;
    for (int i = 0; i < cn; i++) {
        float *yi = y + (n0 + i) * out_sz;
        uint16_t *mi = masks ? masks + (size_t)(n0 + i) * s->oc * mplane : NULL;
        for (int o = 0; o < s->oc; o++) {
            float *dst = yi + o * out_plane;
            uint16_t *mo = mi ? mi + o * mplane : NULL;
            const float *src = blk + (size_t)o * ld + i * P;
            float bo = b ? b[o] : 0.0f;
#ifdef MG__HAVE_AVX512
            if (s->simd && s->pool != MG_POOL_NONE) {
                mg__pool_plane_avx512(dst, mo, src, bo, s);
                continue;
            }
#endif
            epilogue_plane(dst, mo, src, bo, s);
        }
    }
}

/* The pre-pool gradient planes of a block (blk + o * ld + i * P) from the
 * layer output's gradient; db += their sums. */
static void grad_chunk(float *blk, int ld, const float *dy, const float *y,
                       const uint16_t *masks, int n0, int cn, float *db, const mg_conv2d_shape *s)
{
    size_t out_sz = (size_t)s->oc * s->ph * s->pw, mplane = mg__plane_masks(s);
    size_t out_plane = (size_t)s->ph * s->pw, P = (size_t)s->oh * s->ow;
    for (int i = 0; i < cn; i++) {
        const float *dyi = dy + (n0 + i) * out_sz, *yi = y + (n0 + i) * out_sz;
        const uint16_t *mi = masks ? masks + (size_t)(n0 + i) * s->oc * mplane : NULL;
        for (int o = 0; o < s->oc; o++) {
            float *dst = blk + (size_t)o * ld + i * P;
            const uint16_t *mo = mi ? mi + o * mplane : NULL;
            float g;
#ifdef MG__HAVE_AVX512
            if (s->simd && s->pool != MG_POOL_NONE)
                g = mg__pool_grad_plane_avx512(dst, dyi + o * out_plane, mo, s);
            else
#endif
                g = grad_plane(dst, dyi + o * out_plane, yi + o * out_plane, mo, s);
            if (db) db[o] += g;
        }
    }
}

#ifdef MG__HAVE_AVX512
/* The lanes kernels run on one thread, im2col + GEMM on OpenBLAS's
 * threads. With two the lanes still win (lenet-d2l, AMD EPYC: 13.2-14.6k
 * against 9.0-10.9k images/s); beyond that the GEMM path, which scales. */
enum { LANES_MAX_THREADS = 2 };
static bool lanes_now(const mg_conv2d_shape *s)
{
    return s->lanes && mg_get_threads() <= LANES_MAX_THREADS;
}

/* The lanes path: per group of 16 images, the input into the lanes layout,
 * the kernels, the output (or input gradient) back. A fused pool runs in
 * the lanes layout, so only pooled values cross the transposes; without
 * one, the pre-pool planes go through the epilogues above. */
static void forward_lanes(float *y, uint16_t *masks, const float *x, const float *wt,
                          const float *b, const mg_conv2d_shape *s, int n, float *ws)
{
    lanes_ws l;
    lanes_layout(s, ws, &l);
    size_t plane = (size_t)s->h * s->w, in_sz = s->c * plane, mplane = mg__plane_masks(s);
    size_t out_plane = (size_t)s->ph * s->pw, out_sz = s->oc * out_plane;
    int P = s->oh * s->ow;
    mg__lanes_pack_weights(l.wf, NULL, wt, s);
    for (int n0 = 0; n0 < n; n0 += MG__LANES) {
        int cn = n - n0 < MG__LANES ? n - n0 : MG__LANES, ld = cn * P;
        mg__lanes_pack(l.x, x + n0 * in_sz, cn, in_sz, s->c, plane, s->h, s->w, s->pad);
        mg__lanes_forward(l.y, l.x, l.wf, s);
        if (s->pool != MG_POOL_NONE) {
            mg__lanes_pool(l.b, masks ? masks + n0 * s->oc * mplane : NULL, l.y, b, cn, s);
            mg__lanes_unpack(y + n0 * out_sz, out_sz, out_plane, l.b, cn, s->oc, s->ph, s->pw, 0);
        } else {
            mg__lanes_unpack(l.b, P, ld, l.y, cn, s->oc, s->oh, s->ow, 0);
            epilogue_chunk(y, masks, l.b, ld, n0, cn, b, s);
        }
    }
}

static void backward_lanes(float *dx, float *dw, float *db, const float *dy, const float *y,
                           const uint16_t *masks, const float *x, const float *wt,
                           const mg_conv2d_shape *s, int n, float *ws)
{
    lanes_ws l;
    lanes_layout(s, ws, &l);
    size_t plane = (size_t)s->h * s->w, in_sz = s->c * plane, mplane = mg__plane_masks(s);
    size_t out_plane = (size_t)s->ph * s->pw, out_sz = s->oc * out_plane;
    int P = s->oh * s->ow;
    if (dx) mg__lanes_pack_weights(NULL, l.wb, wt, s);
    /* The weight gradient's padding channels read these rows. */
    memset(l.y + (size_t)s->oc * P * MG__LANES, 0,
           sizeof(float) * (size_t)(mg__lanes_oc_padded(s) - s->oc) * P * MG__LANES);
    for (int n0 = 0; n0 < n; n0 += MG__LANES) {
        int cn = n - n0 < MG__LANES ? n - n0 : MG__LANES, ld = cn * P;
        if (s->pool != MG_POOL_NONE) {
            mg__lanes_pack(l.b, dy + n0 * out_sz, cn, out_sz, s->oc, out_plane, s->ph, s->pw, 0);
            mg__lanes_unpool(l.y, db, l.b, masks + n0 * s->oc * mplane, cn, s);
        } else {
            grad_chunk(l.b, ld, dy, y, masks, n0, cn, db, s);
            mg__lanes_pack(l.y, l.b, cn, P, s->oc, ld, s->oh, s->ow, 0);
        }
        mg__lanes_pack(l.x, x + n0 * in_sz, cn, in_sz, s->c, plane, s->h, s->w, s->pad);
        mg__lanes_dw(dw, l.y, l.x, s);
        if (!dx) continue;
        mg__lanes_dx(l.b, l.y, l.wb, s);
        mg__lanes_unpack(dx + n0 * in_sz, in_sz, plane, l.b, cn, s->c, s->h, s->w, s->pad);
    }
}
#endif

void mg_conv2d_forward(float *y, uint8_t *saved, const float *x,
                       const float *wt, const float *b,
                       const mg_conv2d_shape *s, int n, float *ws)
{
    if (mg__dk_cur) {
        mg_dk_conv2d_forward(y, saved, x, wt, b, s, n, ws);
        return;
    }
    size_t in_sz = (size_t)s->c * s->h * s->w;
    uint16_t *masks = (uint16_t *)saved;
#ifdef MG__HAVE_AVX512
    if (s->direct) {
        size_t out_sz = (size_t)s->oc * s->ph * s->pw, mplane = mg__plane_masks(s);
        for (int n0 = 0; n0 < n; n0 += s->dchunk) {
            int cn = n - n0 < s->dchunk ? n - n0 : s->dchunk;
            pad_planes(ws, x + n0 * in_sz, cn, s);
            mg__direct_forward_avx512(y + n0 * out_sz, masks ? masks + n0 * s->oc * mplane : NULL,
                                      ws, cn, wt, b, s);
        }
        return;
    }
    if (lanes_now(s)) {
        forward_lanes(y, masks, x, wt, b, s, n, ws);
        return;
    }
#endif
    int K = s->c * s->kh * s->kw, P = s->oh * s->ow;
    float *col = ws, *blk = ws + (size_t)K * P * s->chunk;
    for (int n0 = 0; n0 < n; n0 += s->chunk) {
        int cn = n - n0 < s->chunk ? n - n0 : s->chunk;
        int ld = cn * P;
        im2col_chunk(col, ld, x + n0 * in_sz, cn, s);
        mg_gemm(false, false, s->oc, ld, K, 1.0f, wt, K, col, ld, 0.0f, blk, ld);
        epilogue_chunk(y, masks, blk, ld, n0, cn, b, s);
    }
}

void mg_conv2d_backward(float *dx, float *dw, float *db, const float *dy,
                        const float *y, const uint8_t *saved, const float *x,
                        const float *wt, const mg_conv2d_shape *s, int n,
                        float *ws)
{
    if (mg__dk_cur) {
        mg_dk_conv2d_backward(dx, dw, db, dy, y, saved, x, wt, s, n, ws);
        return;
    }
    size_t in_sz = (size_t)s->c * s->h * s->w;
    const uint16_t *masks = (const uint16_t *)saved;
#ifdef MG__HAVE_AVX512
    if (s->direct && !dx) {
        size_t out_sz = (size_t)s->oc * s->ph * s->pw, mplane = mg__plane_masks(s);
        for (int n0 = 0; n0 < n; n0 += s->dchunk) {
            int cn = n - n0 < s->dchunk ? n - n0 : s->dchunk;
            pad_planes(ws, x + n0 * in_sz, cn, s);
            mg__direct_backward_avx512(dw, db, dy + n0 * out_sz, y + n0 * out_sz,
                                       masks ? masks + n0 * s->oc * mplane : NULL, ws, cn, s);
        }
        return;
    }
    if (lanes_now(s)) {
        backward_lanes(dx, dw, db, dy, y, masks, x, wt, s, n, ws);
        return;
    }
#endif
    int K = s->c * s->kh * s->kw, P = s->oh * s->ow;
    float *col = ws, *blk = ws + (size_t)K * P * s->chunk;
    float *dwt = dw_transposed(s) ? blk + (size_t)s->oc * P * s->chunk : NULL;
    if (dwt) memset(dwt, 0, sizeof(float) * (size_t)K * s->oc);
    for (int n0 = 0; n0 < n; n0 += s->chunk) {
        int cn = n - n0 < s->chunk ? n - n0 : s->chunk;
        int ld = cn * P;
        grad_chunk(blk, ld, dy, y, masks, n0, cn, db, s);
        im2col_chunk(col, ld, x + n0 * in_sz, cn, s);
        if (dwt) mg_gemm(false, true, K, s->oc, ld, 1.0f, col, ld, blk, ld, 1.0f, dwt, s->oc);
        else mg_gemm(false, true, s->oc, K, ld, 1.0f, blk, ld, col, ld, 1.0f, dw, K);
        if (!dx) continue;
        mg_gemm(true, false, K, ld, s->oc, 1.0f, wt, K, blk, ld, 0.0f, col, ld);
        for (int i = 0; i < cn; i++) {
            float *dxi = dx + (n0 + i) * in_sz;
#ifdef MG__HAVE_AVX512
            if (s->simd && s->stride == 1) {
                mg__col2im_s1_set_avx512(dxi, col + (size_t)i * P, ld, s->c, s->h, s->w, s->kh,
                                         s->kw, s->pad, s->oh, s->ow);
                continue;
            }
#endif
            memset(dxi, 0, sizeof(float) * in_sz);
            mg_col2im(dxi, col + (size_t)i * P, ld, s->c, s->h, s->w, s->kh, s->kw, s->stride,
                      s->pad, s->oh, s->ow);
        }
    }
    if (dwt)
        for (int o = 0; o < s->oc; o++)
            for (int k = 0; k < K; k++) dw[(size_t)o * K + k] += dwt[(size_t)k * s->oc + o];
}
