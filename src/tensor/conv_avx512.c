/* AVX-512 convolution kernels (compiled when the target has AVX-512F/BW;
 * MG_KERNELS=generic selects the portable C ones at run time).
 *
 * - im2col / col2im for stride 1: each run of output columns is one
 *   masked load (masked-off lanes neither fault nor read) and one store,
 *   full width where its tail is overwritten by the next run (masked
 *   stores are slow on Zen 4), instead of a loop per run; col2im gathers
 *   every contribution to
 *   an input row in a register and stores it once (no read-modify-write
 *   chains through memory, no memset).
 * - The fused 2x2 pool: a pair of conv rows (up to 32 columns) is split
 *   into the four window elements with two permutes, pooled, and the
 *   gradient masks come straight from the compare masks.
 * - Direct convolution of one input channel (the first layer): each output
 *   row pair of four channels is accumulated in sixteen registers over the
 *   kernel taps, pooled on the spot; the weight gradient keeps one
 *   accumulator per tap across a block of images. No im2col, no pre-pool
 *   map in memory.
 * Loads may run past the last valid column (into the next row or the
 * slack the caller provides); those lanes are never stored and meet zero
 * gradients in the backward. */
#include <stdint.h>
#include "tensor/conv_impl.h"

#ifdef MG__HAVE_AVX512
void mg__im2col_s1_avx512(float *col, int ldc, const float *x, int c, int h, int w,
                          int kh, int kw, int pad, int oh, int ow)
{
    if (pad == 0 && ow <= 16 && ow >= 8) {
        /* Every run lies inside the image: one load and one store each;
         * full stores except the last, whose tail would leave the image's
         * columns (with ow >= 8 a full store spills only into the next two
         * runs, written after it). */
        __mmask16 m = lanes(ow);
        for (int ci = 0; ci < c; ci++)
            for (int ki = 0; ki < kh; ki++)
                for (int kj = 0; kj < kw; kj++) {
                    float *dst = col + (size_t)((ci * kh + ki) * kw + kj) * ldc;
                    const float *src = x + ((size_t)ci * h + ki) * w + kj;
                    int oy = 0;
                    for (; oy < oh - 1; oy++)
                        _mm512_storeu_ps(dst + oy * ow, _mm512_maskz_loadu_ps(m, src + oy * w));
                    _mm512_mask_storeu_ps(dst + oy * ow, m, _mm512_maskz_loadu_ps(m, src + oy * w));
                }
        return;
    }
    for (int ci = 0; ci < c; ci++)
        for (int ki = 0; ki < kh; ki++)
            for (int kj = 0; kj < kw; kj++) {
                float *row = col + (size_t)((ci * kh + ki) * kw + kj) * ldc;
                for (int oy = 0; oy < oh; oy++) {
                    float *dst = row + oy * ow;
                    int iy = oy - pad + ki;
                    const float *src = x + ((size_t)ci * h + iy) * w;
                    bool inside = iy >= 0 && iy < h;
                    for (int ox0 = 0; ox0 < ow; ox0 += 16) {
                        int ix0 = ox0 - pad + kj;
                        __mmask16 m = inside ? range_mask(-ix0, w - ix0) & lanes(ow - ox0) : 0;
                        __m512 v = _mm512_maskz_loadu_ps(m, src + ix0);
                        /* A full store is cheaper than a masked one; its
                         * tail is overwritten by the next run, so only a
                         * store reaching past this image's columns is
                         * masked. */
                        if (oy * ow + ox0 + 16 <= oh * ow) _mm512_storeu_ps(dst + ox0, v);
                        else _mm512_mask_storeu_ps(dst + ox0, lanes(ow - ox0), v);
                    }
                }
            }
}

void mg__col2im_s1_set_avx512(float *x, const float *col, int ldc, int c, int h, int w,
                              int kh, int kw, int pad, int oh, int ow)
{
    if (pad == 0 && w <= 16 && kh <= 8 && kw <= 16) {
        /* Input row iy gets tap (ki, kj) of output row iy - ki, shifted by
         * kj: lanes [kj, kj + ow). One accumulator per kernel row keeps
         * the additions independent. */
        __mmask16 mk[16];
        for (int kj = 0; kj < kw; kj++) mk[kj] = range_mask(kj, kj + ow) & lanes(w);
        for (int ci = 0; ci < c; ci++)
            for (int iy = 0; iy < h; iy++) {
                __m512 acc[8];
                int k0 = iy - oh + 1 > 0 ? iy - oh + 1 : 0, k1 = iy < kh - 1 ? iy : kh - 1;
                for (int ki = k0; ki <= k1; ki++) {
                    const float *r = col + (size_t)((ci * kh + ki) * kw) * ldc + (iy - ki) * ow;
                    __m512 a = _mm512_setzero_ps();
                    for (int kj = 0; kj < kw; kj++)
                        a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(mk[kj], r + (size_t)kj * ldc - kj));
                    acc[ki] = a;
                }
                __m512 sum = _mm512_setzero_ps();
                for (int ki = k0; ki <= k1; ki++) sum = _mm512_add_ps(sum, acc[ki]);
                _mm512_mask_storeu_ps(x + ((size_t)ci * h + iy) * w, lanes(w), sum);
            }
        return;
    }
    for (int ci = 0; ci < c; ci++)
        for (int iy = 0; iy < h; iy++)
            for (int x0 = 0; x0 < w; x0 += 16) {
                __m512 acc = _mm512_setzero_ps();
                __mmask16 in = lanes(w - x0);
                for (int ki = 0; ki < kh; ki++) {
                    int oy = iy + pad - ki;
                    if (oy < 0 || oy >= oh) continue;
                    const float *r = col + (size_t)((ci * kh + ki) * kw) * ldc + oy * ow;
                    for (int kj = 0; kj < kw; kj++) {
                        int ox0 = x0 + pad - kj;
                        __mmask16 m = range_mask(-ox0, ow - ox0) & in;
                        acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, r + (size_t)kj * ldc + ox0));
                    }
                }
                _mm512_mask_storeu_ps(x + ((size_t)ci * h + iy) * w + x0, in, acc);
            }
}

/* ---- The fused 2x2 pool on registers ----------------------------------- */

static inline __m512i idx_even(void)
{
    return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
}
static inline __m512i idx_odd(void)
{
    return _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
static inline __m512i idx_lo(void)
{
    return _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
}
static inline __m512i idx_hi(void)
{
    return _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
}

/* Rows r0 = (r0a | r0b), r1 = (r1a | r1b) of 32 columns, bias added:
 * pooled outputs of the `valid` lanes to dst, masks to m[0..3]. */
static inline void pool_fwd(__m512 r0a, __m512 r0b, __m512 r1a, __m512 r1b, bool relu,
                            mg_pool_kind pool, __mmask16 valid, float *dst, uint16_t *m)
{
    __m512i ie = idx_even(), io = idx_odd();
    __m512 a = _mm512_permutex2var_ps(r0a, ie, r0b), b = _mm512_permutex2var_ps(r0a, io, r0b);
    __m512 c = _mm512_permutex2var_ps(r1a, ie, r1b), d = _mm512_permutex2var_ps(r1a, io, r1b);
    __mmask16 mk[4];
    _mm512_mask_storeu_ps(dst, valid, mg__pool4(a, b, c, d, relu, pool, mk));
    for (int k = 0; k < 4; k++) m[k] = mk[k] & valid;
}

/* The pre-pool gradient rows of one segment from the pooled gradient. */
static inline void pool_bwd(const float *g, __mmask16 valid, const uint16_t *m, float scale,
                            __m512 *r0a, __m512 *r0b, __m512 *r1a, __m512 *r1b)
{
    __m512 gv = _mm512_mul_ps(_mm512_maskz_loadu_ps(valid, g), _mm512_set1_ps(scale));
    __m512 ga = _mm512_maskz_mov_ps(m[0], gv), gb = _mm512_maskz_mov_ps(m[1], gv);
    __m512 gc = _mm512_maskz_mov_ps(m[2], gv), gd = _mm512_maskz_mov_ps(m[3], gv);
    __m512i il = idx_lo(), ih = idx_hi();
    *r0a = _mm512_permutex2var_ps(ga, il, gb);
    *r0b = _mm512_permutex2var_ps(ga, ih, gb);
    *r1a = _mm512_permutex2var_ps(gc, il, gd);
    *r1b = _mm512_permutex2var_ps(gc, ih, gd);
}

void mg__pool_plane_avx512(float *dst, uint16_t *m, const float *src, float b,
                           const mg_conv2d_shape *s)
{
    int ow = s->ow, pw = s->pw, nseg = mg__pool_segs(s);
    __m512 bv = _mm512_set1_ps(b);
    for (int py = 0; py < s->ph; py++) {
        const float *r0 = src + 2 * py * ow, *r1 = r0 + ow;
        for (int sg = 0; sg < nseg; sg++) {
            int x0 = 32 * sg, nc = 2 * pw - x0;
            __mmask16 la = lanes(nc), lb = lanes(nc - 16);
            __m512 r0a = _mm512_add_ps(_mm512_maskz_loadu_ps(la, r0 + x0), bv);
            __m512 r0b = _mm512_add_ps(_mm512_maskz_loadu_ps(lb, r0 + x0 + 16), bv);
            __m512 r1a = _mm512_add_ps(_mm512_maskz_loadu_ps(la, r1 + x0), bv);
            __m512 r1b = _mm512_add_ps(_mm512_maskz_loadu_ps(lb, r1 + x0 + 16), bv);
            pool_fwd(r0a, r0b, r1a, r1b, s->relu, s->pool, lanes(pw - 16 * sg),
                     dst + py * pw + 16 * sg, m + ((size_t)py * nseg + sg) * 4);
        }
    }
}

float mg__pool_grad_plane_avx512(float *dst, const float *dy, const uint16_t *m,
                                 const mg_conv2d_shape *s)
{
    int ow = s->ow, pw = s->pw, nseg = mg__pool_segs(s);
    float scale = s->pool == MG_POOL_AVG ? 0.25f : 1.0f;
    __m512 sum = _mm512_setzero_ps(), zero = _mm512_setzero_ps();
    for (int py = 0; py < s->ph; py++) {
        float *r0 = dst + 2 * py * ow, *r1 = r0 + ow;
        for (int sg = 0; sg < nseg; sg++) {
            int x0 = 32 * sg, nc = ow - x0;
            __m512 r0a, r0b, r1a, r1b;
            pool_bwd(dy + py * pw + 16 * sg, lanes(pw - 16 * sg), m + ((size_t)py * nseg + sg) * 4,
                     scale, &r0a, &r0b, &r1a, &r1b);
            _mm512_mask_storeu_ps(r0 + x0, lanes(nc), r0a);
            _mm512_mask_storeu_ps(r0 + x0 + 16, lanes(nc - 16), r0b);
            _mm512_mask_storeu_ps(r1 + x0, lanes(nc), r1a);
            _mm512_mask_storeu_ps(r1 + x0 + 16, lanes(nc - 16), r1b);
            sum = _mm512_add_ps(sum, _mm512_add_ps(_mm512_add_ps(r0a, r0b), _mm512_add_ps(r1a, r1b)));
        }
        /* Columns past the segments (an odd width beyond 32*nseg). */
        for (int x = 32 * nseg; x < ow; x++) r0[x] = r1[x] = 0.0f;
    }
    for (int r = 2 * s->ph; r < s->oh; r++)
        for (int x0 = 0; x0 < ow; x0 += 16) _mm512_mask_storeu_ps(dst + r * ow + x0, lanes(ow - x0), zero);
    return _mm512_reduce_add_ps(sum);
}

/* ---- Direct convolution of one input channel --------------------------- */

/* Rows y and y+1 (if two) of CB output channels at columns 0..31, bias
 * included: r[j] = {row y cols 0..15, 16..31, row y+1 cols 0..15, 16..31}
 * of channel j (weights w + j * kh * kw). Each input row is loaded once
 * and feeds both output rows of every channel, and the 4 * CB independent
 * sums keep the FMA units busy (one channel at a time, four chains of
 * kh * kw dependent FMAs, left them waiting on latency). */
static inline __attribute__((always_inline)) void direct_rows(
    const float *xp, int wp, int y, const float *w, int kh, int kw, const float *b, bool two,
    const int CB, __m512 r[][4])
{
    __m512 acc[4][4];
    for (int j = 0; j < CB; j++)
        for (int q = 0; q < 4; q++) acc[j][q] = _mm512_set1_ps(b ? b[j] : 0.0f);
    for (int ri = 0; ri < kh + two; ri++) {
        const float *p = xp + (size_t)(y + ri) * wp;
        for (int kj = 0; kj < kw; kj++) {
            __m512 l0 = _mm512_loadu_ps(p + kj), l1 = _mm512_loadu_ps(p + kj + 16);
            for (int j = 0; j < CB; j++) {
                const float *wj = w + j * kh * kw;
                if (ri < kh) {
                    __m512 wv = _mm512_set1_ps(wj[ri * kw + kj]);
                    acc[j][0] = _mm512_fmadd_ps(wv, l0, acc[j][0]);
                    acc[j][1] = _mm512_fmadd_ps(wv, l1, acc[j][1]);
                }
                if (two && ri >= 1) {
                    __m512 wv = _mm512_set1_ps(wj[(ri - 1) * kw + kj]);
                    acc[j][2] = _mm512_fmadd_ps(wv, l0, acc[j][2]);
                    acc[j][3] = _mm512_fmadd_ps(wv, l1, acc[j][3]);
                }
            }
        }
    }
    for (int j = 0; j < CB; j++)
        for (int q = 0; q < 4; q++) r[j][q] = acc[j][q];
}

/* Output channels o0 .. o0 + CB - 1 of one image. */
static inline __attribute__((always_inline)) void direct_fwd_block(
    float *yi, uint16_t *mi, const float *xi, const float *wt, const float *b, int o0,
    const mg_conv2d_shape *s, int kh, int kw, const int CB)
{
    int wp = s->w + 2 * s->pad, ow = s->ow;
    size_t out_plane = (size_t)s->ph * s->pw, mplane = mg__plane_masks(s);
    const float *w = wt + (size_t)o0 * kh * kw, *bo = b ? b + o0 : NULL;
    __m512 zero = _mm512_setzero_ps(), r[4][4];
    /* The next block's output, for writing (PREFETCHW). */
    for (size_t k = 0; k < CB * out_plane; k += 16) _m_prefetchw(yi + (o0 + CB) * out_plane + k);
    if (s->pool != MG_POOL_NONE) {
        for (int py = 0; py < s->ph; py++) {
            direct_rows(xi, wp, 2 * py, w, kh, kw, bo, true, CB, r);
            for (int j = 0; j < CB; j++) {
                uint16_t dummy[4];
                pool_fwd(r[j][0], r[j][1], r[j][2], r[j][3], s->relu, s->pool, lanes(s->pw),
                         yi + (o0 + j) * out_plane + py * s->pw,
                         mi ? mi + (o0 + j) * mplane + (size_t)py * 4 : dummy);
            }
        }
    } else {
        for (int oy = 0; oy < s->oh; oy++) {
            direct_rows(xi, wp, oy, w, kh, kw, bo, false, CB, r);
            for (int j = 0; j < CB; j++) {
                if (s->relu) {
                    r[j][0] = _mm512_max_ps(r[j][0], zero);
                    r[j][1] = _mm512_max_ps(r[j][1], zero);
                }
                float *yo = yi + (o0 + j) * out_plane + oy * ow;
                _mm512_mask_storeu_ps(yo, lanes(ow), r[j][0]);
                _mm512_mask_storeu_ps(yo + 16, lanes(ow - 16), r[j][1]);
            }
        }
    }
}

/* Blocks of four channels (lenet-d2l conv1 forward 3.2 -> 2.4 us per
 * image), then the rest. */
static inline __attribute__((always_inline)) void direct_fwd_k(
    float *y, uint16_t *m, const float *xp, int cn, const float *wt, const float *b,
    const mg_conv2d_shape *s, int kh, int kw)
{
    int hp = s->h + 2 * s->pad, wp = s->w + 2 * s->pad;
    size_t out_plane = (size_t)s->ph * s->pw, mplane = mg__plane_masks(s);
    for (int i = 0; i < cn; i++) {
        const float *xi = xp + (size_t)i * hp * wp;
        float *yi = y + (size_t)i * s->oc * out_plane;
        uint16_t *mi = m ? m + (size_t)i * s->oc * mplane : NULL;
        int o = 0;
        for (; o + 4 <= s->oc; o += 4) direct_fwd_block(yi, mi, xi, wt, b, o, s, kh, kw, 4);
        switch (s->oc - o) {
        case 3: direct_fwd_block(yi, mi, xi, wt, b, o, s, kh, kw, 3); break;
        case 2: direct_fwd_block(yi, mi, xi, wt, b, o, s, kh, kw, 2); break;
        case 1: direct_fwd_block(yi, mi, xi, wt, b, o, s, kh, kw, 1); break;
        }
    }
}

void mg__direct_forward_avx512(float *y, uint16_t *m, const float *xp, int cn,
                               const float *wt, const float *b, const mg_conv2d_shape *s)
{
    if (s->kh == 3 && s->kw == 3) direct_fwd_k(y, m, xp, cn, wt, b, s, 3, 3);
    else if (s->kh == 5 && s->kw == 5) direct_fwd_k(y, m, xp, cn, wt, b, s, 5, 5);
    else direct_fwd_k(y, m, xp, cn, wt, b, s, s->kh, s->kw);
}

/* acc[t] += sum over the row pair of g * x (tap t = ki*kw + kj); each
 * input row is loaded once for both output rows. */
static inline __attribute__((always_inline)) void direct_taps(
    __m512 *acc, const float *xp, int wp, int y, int kh, int kw, __m512 g0a, __m512 g0b,
    __m512 g1a, __m512 g1b, bool two)
{
    for (int r = 0; r < kh + two; r++) {
        const float *p = xp + (size_t)(y + r) * wp;
        for (int kj = 0; kj < kw; kj++) {
            __m512 l0 = _mm512_loadu_ps(p + kj), l1 = _mm512_loadu_ps(p + kj + 16);
            if (r < kh)
                acc[r * kw + kj] = _mm512_fmadd_ps(g0b, l1, _mm512_fmadd_ps(g0a, l0, acc[r * kw + kj]));
            if (two && r >= 1)
                acc[(r - 1) * kw + kj] =
                    _mm512_fmadd_ps(g1b, l1, _mm512_fmadd_ps(g1a, l0, acc[(r - 1) * kw + kj]));
        }
    }
}

/* Images outer, channels inner: dy and the masks stream in memory order,
 * one plane after another. They come from L3 (conv2 wrote them for the
 * whole batch), and the hardware prefetcher leaves these short planes
 * waiting on memory: each plane prefetches the next. The accumulators of
 * a block of channels live in a stack buffer, in L1, as many channels as
 * DIRECT_BWD_ACC vectors hold (all 20 of lenet-d2l's 3x3 conv1: one pass,
 * so the next plane is the next in memory). Each (channel, tap) still
 * sums its images and rows in the same order. */
enum { DIRECT_BWD_ACC = 400 };

/* Prefetch (never faults, so the plane after the last is harmless). */
static inline void prefetch_next(const void *p, size_t bytes)
{
    for (size_t k = 0; k < bytes; k += 64) _mm_prefetch((const char *)p + k, _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void direct_bwd_k(
    float *dw, float *db, const float *dy, const float *y, const uint16_t *m, const float *xp,
    int cn, const mg_conv2d_shape *s, int kh, int kw)
{
    int hp = s->h + 2 * s->pad, wp = s->w + 2 * s->pad, ow = s->ow, taps = kh * kw;
    size_t out_plane = (size_t)s->ph * s->pw, mplane = mg__plane_masks(s);
    float scale = s->pool == MG_POOL_AVG ? 0.25f : 1.0f;
    __m512 zero = _mm512_setzero_ps();
    enum { MAXB = DIRECT_BWD_ACC / 9 };
    __m512 accs[DIRECT_BWD_ACC], sums[MAXB];
    int block = DIRECT_BWD_ACC / taps < MAXB ? DIRECT_BWD_ACC / taps : MAXB;
    for (int o0 = 0; o0 < s->oc; o0 += block) {
        int nb = s->oc - o0 < block ? s->oc - o0 : block;
        for (int j = 0; j < nb; j++) {
            sums[j] = zero;
            for (int t = 0; t < taps; t++) accs[j * taps + t] = zero;
        }
        for (int i = 0; i < cn; i++) {
            const float *xi = xp + (size_t)i * hp * wp;
            for (int j = 0; j < nb; j++) {
                int o = o0 + j;
                __m512 acc[25], sum = sums[j];
                for (int t = 0; t < taps; t++) acc[t] = accs[j * taps + t];
                const float *go = dy + ((size_t)i * s->oc + o) * out_plane;
                prefetch_next(go + out_plane, out_plane * sizeof(float));
                if (m)
                    prefetch_next(m + ((size_t)i * s->oc + o + 1) * mplane, mplane * sizeof(uint16_t));
                __m512 g0a, g0b, g1a, g1b;
                if (s->pool != MG_POOL_NONE) {
                    const uint16_t *mo = m + ((size_t)i * s->oc + o) * mplane;
                    for (int py = 0; py < s->ph; py++) {
                        pool_bwd(go + py * s->pw, lanes(s->pw), mo + (size_t)py * 4, scale, &g0a,
                                 &g0b, &g1a, &g1b);
                        /* A 33rd column (odd width 33) cannot occur: ow <= 32. */
                        sum = _mm512_add_ps(sum, _mm512_add_ps(_mm512_add_ps(g0a, g0b),
                                                               _mm512_add_ps(g1a, g1b)));
                        direct_taps(acc, xi, wp, 2 * py, kh, kw, g0a, g0b, g1a, g1b, true);
                    }
                } else {
                    const float *yo = y + ((size_t)i * s->oc + o) * out_plane;
                    for (int oy = 0; oy < s->oh; oy++) {
                        g0a = _mm512_maskz_loadu_ps(lanes(ow), go + oy * ow);
                        g0b = _mm512_maskz_loadu_ps(lanes(ow - 16), go + oy * ow + 16);
                        if (s->relu) {
                            g0a = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(lanes(ow), yo + oy * ow), zero, _CMP_GT_OQ), g0a);
                            g0b = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(lanes(ow - 16), yo + oy * ow + 16), zero, _CMP_GT_OQ), g0b);
                        }
                        sum = _mm512_add_ps(sum, _mm512_add_ps(g0a, g0b));
                        direct_taps(acc, xi, wp, oy, kh, kw, g0a, g0b, zero, zero, false);
                    }
                }
                for (int t = 0; t < taps; t++) accs[j * taps + t] = acc[t];
                sums[j] = sum;
            }
        }
        for (int j = 0; j < nb; j++) {
            float *dwo = dw + (size_t)(o0 + j) * taps;
            for (int t = 0; t < taps; t++) dwo[t] += _mm512_reduce_add_ps(accs[j * taps + t]);
            if (db) db[o0 + j] += _mm512_reduce_add_ps(sums[j]);
        }
    }
}

void mg__direct_backward_avx512(float *dw, float *db, const float *dy, const float *y,
                                const uint16_t *m, const float *xp, int cn,
                                const mg_conv2d_shape *s)
{
    if (s->kh == 3 && s->kw == 3) direct_bwd_k(dw, db, dy, y, m, xp, cn, s, 3, 3);
    else if (s->kh == 5 && s->kw == 5) direct_bwd_k(dw, db, dy, y, m, xp, cn, s, 5, 5);
    else direct_bwd_k(dw, db, dy, y, m, xp, cn, s, s->kh, s->kw);
}

#endif
