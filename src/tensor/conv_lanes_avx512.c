/* Convolution with 16 images in the vector lanes (AVX-512, stride 1):
 * forward, weight gradient and input gradient as register-blocked FMA
 * kernels on a batch-interleaved copy of the data, no im2col matrix.
 *
 * Why: a layer such as lenet-d2l's conv2 (20->50, 5x5, 13x13 -> 9x9) as
 * im2col + GEMM spends a third of its time outside the GEMM kernel
 * (building the 40,500-float column matrix per image, OpenBLAS packing it
 * again, col2im), and its small dimensions (50 channels, 81 pixels) fit no
 * vector width. With the images of a group of 16 in the lanes ("lanes
 * layout": plane, row, column, then image), every vector is 16 images at
 * one pixel, so any tap of any pixel is one aligned load, and each kernel
 * keeps a 5x5 (or 4x5) block of accumulators in registers:
 *  - forward: y[o][p] += w[o][c,ki,kj] * x[c][p + (ki,kj)] for MR output
 *    channels by NR pixels of a row (weights broadcast from a packed copy);
 *  - weight gradient: dw[o][c,ki,kj] += dy[o][p] * x[c][p + (ki,kj)] for MR
 *    channels by the kw taps of a kernel row, summed over the group's
 *    pixels, then over the lanes (the images);
 *  - input gradient: the scatter form of col2im done in registers: for NR
 *    pixels of a dy row and the kw taps of a kernel row, acc[kj][j] =
 *    sum_o w[o][c,ki,kj] * dy[o][p_j]; the sums that land on the same
 *    input pixel are added together and added to it once.
 * Nothing is computed for zero padding except what the padded input rows
 * hold. The copies in and out of the lanes layout are 16x16 transposes.
 * A fused 2x2 pool (with the bias and ReLU) runs in the lanes layout too,
 * so only pooled values are transposed back, and it writes the saved masks
 * in the per-image format of the other paths: either backward follows
 * either forward. Without a pool the pre-pool planes go through conv.c's
 * epilogues.
 *
 * Limits (conv.c chooses this path only within them): stride 1, kernel
 * rows of at most 5 taps, and a group's data (input, output and one more
 * of either) within the convolution's cache budget. */
#include <string.h>
#include "tensor/conv_impl.h"

#ifdef MG__HAVE_AVX512
#define AI static inline __attribute__((always_inline))
enum { L = MG__LANES, TILE = 5, PACK_AHEAD = 64 };

/* ---- Into and out of the lanes layout ---------------------------------- */

/* r[i][j] <-> r[j][i] (the well-known unpack/shuffle network). */
AI void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xDD);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
    }
}

/* The sixteen images' rows are sixteen streams, more than the hardware
 * prefetcher follows: each load prefetches its row PACK_AHEAD floats
 * ahead, each store its row for writing (the input and the input gradient
 * of a batch live in L3). */

/* dst[k][i] = src[i * img + k] for k < len, i < 16 (0 for i >= cn). */
static void pack_run(float *dst, const float *src, int cn, size_t img, int len)
{
    for (int x0 = 0; x0 < len; x0 += 16) {
        int nc = len - x0 < 16 ? len - x0 : 16;
        __m512 r[16];
        for (int i = 0; i < 16; i++) {
            if (i < cn) _mm_prefetch((const char *)(src + i * img + x0 + PACK_AHEAD), _MM_HINT_T0);
            r[i] = i < cn ? _mm512_maskz_loadu_ps(lanes(nc), src + i * img + x0)
                          : _mm512_setzero_ps();
        }
        transpose16(r);
        for (int j = 0; j < nc; j++) _mm512_storeu_ps(dst + (size_t)(x0 + j) * L, r[j]);
    }
}

/* The inverse: dst[i * img + k] = src[k][i] for i < cn. */
static void unpack_run(float *dst, size_t img, const float *src, int cn, int len)
{
    for (int x0 = 0; x0 < len; x0 += 16) {
        int nc = len - x0 < 16 ? len - x0 : 16;
        __m512 r[16];
        for (int j = 0; j < 16; j++)
            r[j] = j < nc ? _mm512_loadu_ps(src + (size_t)(x0 + j) * L) : _mm512_setzero_ps();
        transpose16(r);
        for (int i = 0; i < cn; i++) {
            _m_prefetchw(dst + i * img + x0 + PACK_AHEAD);
            /* Masked stores only for a run's tail: they are slow on Zen 4. */
            if (nc == 16) _mm512_storeu_ps(dst + i * img + x0, r[i]);
            else _mm512_mask_storeu_ps(dst + i * img + x0, lanes(nc), r[i]);
        }
    }
}

void mg__lanes_pack(float *dst, const float *src, int cn, size_t img, int planes,
                    size_t plane, int rows, int cols, int pad)
{
    int hp = rows + 2 * pad, wp = cols + 2 * pad;
    if (pad == 0) {
        for (int p = 0; p < planes; p++)
            pack_run(dst + (size_t)p * rows * cols * L, src + p * plane, cn, img, rows * cols);
        return;
    }
    memset(dst, 0, sizeof(float) * (size_t)planes * hp * wp * L);
    for (int p = 0; p < planes; p++)
        for (int r = 0; r < rows; r++)
            pack_run(dst + (((size_t)p * hp + r + pad) * wp + pad) * L, src + p * plane + r * cols,
                     cn, img, cols);
}

void mg__lanes_unpack(float *dst, size_t img, size_t plane, const float *src, int cn,
                      int planes, int rows, int cols, int pad)
{
    int hp = rows + 2 * pad, wp = cols + 2 * pad;
    if (pad == 0) {
        for (int p = 0; p < planes; p++)
            unpack_run(dst + p * plane, img, src + (size_t)p * rows * cols * L, cn, rows * cols);
        return;
    }
    for (int p = 0; p < planes; p++)
        for (int r = 0; r < rows; r++)
            unpack_run(dst + p * plane + r * cols, img,
                       src + (((size_t)p * hp + r + pad) * wp + pad) * L, cn, cols);
}

/* ---- The fused pool in the lanes layout --------------------------------- */

/* A window element's lanes are images, so the 2x2 pool is plain vector
 * arithmetic (mg__pool4); only the masks change layout: the saved format
 * (conv_impl.h) holds, per image, channel, pooled row and segment of 16
 * pooled columns, a 16-bit mask over the columns for each window element,
 * where the pool gives a mask over the images per column. The words of
 * `bits` are the images: each column's mask becomes its bit. */
static inline __m256i add_column_bit(__m256i bits, __mmask16 images, int col)
{
    return _mm256_or_si256(bits, _mm256_and_si256(_mm256_movm_epi16(images),
                                                  _mm256_set1_epi16((short)(1 << col))));
}

/* The saved masks' offset of (channel o, pooled row py, segment sg) within
 * an image's. */
static size_t mask_at(const mg_conv2d_shape *s, int o, int py, int sg)
{
    return (size_t)o * mg__plane_masks(s) + ((size_t)py * mg__pool_segs(s) + sg) * 4;
}

void mg__lanes_pool(float *p16, uint16_t *masks, const float *y16, const float *b, int cn,
                    const mg_conv2d_shape *s)
{
    int ow = s->ow, pw = s->pw;
    size_t img = (size_t)s->oc * mg__plane_masks(s);
    for (int o = 0; o < s->oc; o++) {
        __m512 bv = _mm512_set1_ps(b ? b[o] : 0.0f);
        const float *yo = y16 + (size_t)o * s->oh * ow * L;
        for (int py = 0; py < s->ph; py++)
            for (int sg = 0; sg < mg__pool_segs(s); sg++) {
                __m256i bits[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                                   _mm256_setzero_si256(), _mm256_setzero_si256()};
                for (int px = 16 * sg; px < pw && px < 16 * sg + 16; px++) {
                    const float *z = yo + (size_t)(2 * py * ow + 2 * px) * L;
                    __mmask16 m[4];
                    __m512 v = mg__pool4(_mm512_add_ps(_mm512_loadu_ps(z), bv),
                                         _mm512_add_ps(_mm512_loadu_ps(z + L), bv),
                                         _mm512_add_ps(_mm512_loadu_ps(z + ow * L), bv),
                                         _mm512_add_ps(_mm512_loadu_ps(z + (ow + 1) * L), bv),
                                         s->relu, s->pool, m);
                    _mm512_storeu_ps(p16 + ((size_t)(o * s->ph + py) * pw + px) * L, v);
                    for (int k = 0; k < 4; k++)
                        bits[k] = add_column_bit(bits[k], m[k], px - 16 * sg);
                }
                if (!masks) continue;
                uint16_t w[4][16];
                for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)w[k], bits[k]);
                uint16_t *mo = masks + mask_at(s, o, py, sg);
                for (int i = 0; i < cn; i++)
                    for (int k = 0; k < 4; k++) mo[i * img + k] = w[k][i];
            }
    }
}

void mg__lanes_unpool(float *g16, float *db, const float *dy16, const uint16_t *masks, int cn,
                      const mg_conv2d_shape *s)
{
    int ow = s->ow, oh = s->oh, pw = s->pw;
    size_t img = (size_t)s->oc * mg__plane_masks(s);
    __m512 scale = _mm512_set1_ps(s->pool == MG_POOL_AVG ? 0.25f : 1.0f);
    __m512 zero = _mm512_setzero_ps();
    for (int o = 0; o < s->oc; o++) {
        float *go = g16 + (size_t)o * oh * ow * L;
        __m512 sum = zero;
        for (int py = 0; py < s->ph; py++) {
            for (int sg = 0; sg < mg__pool_segs(s); sg++) {
                uint16_t w[4][16] = {{0}};
                const uint16_t *mo = masks + mask_at(s, o, py, sg);
                for (int i = 0; i < cn; i++)
                    for (int k = 0; k < 4; k++) w[k][i] = mo[i * img + k];
                __m256i bits[4];
                for (int k = 0; k < 4; k++) bits[k] = _mm256_loadu_si256((const __m256i *)w[k]);
                for (int px = 16 * sg; px < pw && px < 16 * sg + 16; px++) {
                    __m512 g = _mm512_mul_ps(
                        _mm512_loadu_ps(dy16 + ((size_t)(o * s->ph + py) * pw + px) * L), scale);
                    float *z = go + (size_t)(2 * py * ow + 2 * px) * L;
                    size_t at[4] = {0, L, (size_t)ow * L, (size_t)(ow + 1) * L};
                    for (int k = 0; k < 4; k++) {
                        /* Bit px - 16 sg of each image's word, as a lane mask. */
                        __m256i top = _mm256_slli_epi16(bits[k], 15 - (px - 16 * sg));
                        __mmask16 m = _mm256_movepi16_mask(top);
                        __m512 v = _mm512_maskz_mov_ps(m, g);
                        _mm512_storeu_ps(z + at[k], v);
                        sum = _mm512_add_ps(sum, v);
                    }
                }
            }
            /* A last column outside every window (odd width). */
            for (int x = 2 * pw; x < ow; x++) {
                _mm512_storeu_ps(go + (size_t)(2 * py * ow + x) * L, zero);
                _mm512_storeu_ps(go + (size_t)((2 * py + 1) * ow + x) * L, zero);
            }
        }
        /* A last row outside every window (odd height). */
        for (int x = 2 * s->ph * ow; x < oh * ow; x++) _mm512_storeu_ps(go + (size_t)x * L, zero);
        if (db) db[o] += _mm512_reduce_add_ps(sum);
    }
}

/* ---- Weights ------------------------------------------------------------ */

int mg__lanes_oc_padded(const mg_conv2d_shape *s) { return (s->oc + s->mr - 1) / s->mr * s->mr; }

void mg__lanes_pack_weights(float *wf, float *wb, const float *wt, const mg_conv2d_shape *s)
{
    int K = s->c * s->kh * s->kw, mr = s->mr, ocp = mg__lanes_oc_padded(s), taps = s->kh * s->kw;
    /* Forward: [o block][c][ki][kj][mr], zero rows past oc. */
    if (wf)
        for (int o = 0; o < ocp; o++)
            for (int k = 0; k < K; k++)
                wf[((size_t)(o / mr) * K + k) * mr + o % mr] =
                    o < s->oc ? wt[(size_t)o * K + k] : 0.0f;
    /* Input gradient: [c][ki][o][kj]. */
    if (wb)
        for (int o = 0; o < s->oc; o++)
            for (int ci = 0; ci < s->c; ci++)
                for (int ki = 0; ki < s->kh; ki++)
                    memcpy(wb + (((size_t)ci * s->kh + ki) * s->oc + o) * s->kw,
                           wt + (size_t)o * K + ci * taps + ki * s->kw, sizeof(float) * s->kw);
}

/* ---- Kernels ------------------------------------------------------------ */

/* Output tiles of a row: as even as possible, at most TILE pixels. */
static int row_tiles(int ow) { return (ow + TILE - 1) / TILE; }
static void tile_span(int ow, int t, int *x0, int *nr)
{
    int nt = row_tiles(ow), base = ow / nt, extra = ow % nt;
    *nr = base + (t < extra);
    *x0 = t * base + (t < extra ? t : extra);
}

/* y[m][j] (MR channels, NR pixels of a row) = the sum over c, ki, kj of
 * w[m] * x[c][ki][j + kj]. x: the tile's first input pixel; w: the block's
 * packed weights. */
AI void fwd_tile(float *y, size_t ystride, const float *x, const float *w, int c, int kh, int kw,
                 size_t plane, size_t row, const int MR, const int NR)
{
    __m512 acc[5][5];
    for (int m = 0; m < MR; m++)
        for (int j = 0; j < NR; j++) acc[m][j] = _mm512_setzero_ps();
    for (int ci = 0; ci < c; ci++)
        for (int ki = 0; ki < kh; ki++) {
            const float *xr = x + ci * plane + ki * row;
            for (int kj = 0; kj < kw; kj++, w += MR) {
                __m512 xv[5];
                for (int j = 0; j < NR; j++) xv[j] = _mm512_loadu_ps(xr + (j + kj) * L);
                for (int m = 0; m < MR; m++) {
                    __m512 wv = _mm512_set1_ps(w[m]);
                    for (int j = 0; j < NR; j++) acc[m][j] = _mm512_fmadd_ps(wv, xv[j], acc[m][j]);
                }
            }
        }
    for (int m = 0; m < MR; m++)
        for (int j = 0; j < NR; j++) _mm512_storeu_ps(y + m * ystride + j * L, acc[m][j]);
}

/* The sums of the lanes of a, b, c and d (a third of the shuffles of
 * four _mm512_reduce_add_ps). */
AI __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    /* Per 128-bit lane: {a0+a2, b0+b2, a1+a3, b1+b3}, the same for c, d. */
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    /* Per 128-bit lane: {a, b, c, d}. */
    __m512 q = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(q), 1));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(q), hi);
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* dw[m][kj] += the sum over the group's pixels and lanes of
 * dy[m][p] * x[p + kj] (one kernel row of one input channel). Channels
 * m >= mvalid (padding) are computed but not stored. */
AI void dw_row(float *dw, size_t dwstride, const float *dy, size_t dystride, const float *x,
               int oh, int ow, size_t row, int mvalid, const int MR, const int KJ)
{
    __m512 acc[5][5];
    for (int m = 0; m < MR; m++)
        for (int t = 0; t < KJ; t++) acc[m][t] = _mm512_setzero_ps();
    for (int oy = 0; oy < oh; oy++)
        for (int ox = 0; ox < ow; ox++) {
            const float *xp = x + oy * row + ox * L, *d = dy + (size_t)(oy * ow + ox) * L;
            __m512 xv[5];
            for (int t = 0; t < KJ; t++) xv[t] = _mm512_loadu_ps(xp + t * L);
            for (int m = 0; m < MR; m++) {
                __m512 dv = _mm512_loadu_ps(d + m * dystride);
                for (int t = 0; t < KJ; t++) acc[m][t] = _mm512_fmadd_ps(dv, xv[t], acc[m][t]);
            }
        }
    for (int m = 0; m < MR && m < mvalid; m++) {
        int t = 0;
        for (; t + 4 <= KJ; t += 4)
            _mm_storeu_ps(dw + m * dwstride + t,
                          _mm_add_ps(_mm_loadu_ps(dw + m * dwstride + t),
                                     sum4(acc[m][t], acc[m][t + 1], acc[m][t + 2], acc[m][t + 3])));
        for (; t < KJ; t++) dw[m * dwstride + t] += _mm512_reduce_add_ps(acc[m][t]);
    }
}

/* dx[d] += the sum over kj + j = d of acc[kj][j], acc[kj][j] = the sum
 * over o of w[o][kj] * dy[o][j]: one kernel row's contribution of NR dy
 * pixels of a row to the NR + KJ - 1 input pixels they touch. */
AI void dx_tile(float *dx, const float *dy, size_t dystride, const float *w, int oc,
                const int NR, const int KJ)
{
    __m512 acc[5][5];
    for (int t = 0; t < KJ; t++)
        for (int j = 0; j < NR; j++) acc[t][j] = _mm512_setzero_ps();
    for (int o = 0; o < oc; o++, w += KJ) {
        __m512 dv[5];
        for (int j = 0; j < NR; j++) dv[j] = _mm512_loadu_ps(dy + o * dystride + j * L);
        for (int t = 0; t < KJ; t++) {
            __m512 wv = _mm512_set1_ps(w[t]);
            for (int j = 0; j < NR; j++) acc[t][j] = _mm512_fmadd_ps(wv, dv[j], acc[t][j]);
        }
    }
    for (int d = 0; d < NR + KJ - 1; d++) {
        __m512 sum = _mm512_loadu_ps(dx + d * L);
        for (int t = 0; t < KJ; t++)
            if (d - t >= 0 && d - t < NR) sum = _mm512_add_ps(sum, acc[t][d - t]);
        _mm512_storeu_ps(dx + d * L, sum);
    }
}

/* One instance per register block: forward MR (4, 5) by NR (1..5), weight
 * gradient MR by KJ = kw (1..5), input gradient NR by KJ. */
typedef void fwd_fn(float *, size_t, const float *, const float *, int, int, int, size_t, size_t);
typedef void dw_fn(float *, size_t, const float *, size_t, const float *, int, int, size_t, int);
typedef void dx_fn(float *, const float *, size_t, const float *, int);

#define FWD(MR, NR)                                                                        \
    static void fwd_##MR##_##NR(float *y, size_t ys, const float *x, const float *w, int c, \
                                int kh, int kw, size_t plane, size_t row)                  \
    {                                                                                      \
        fwd_tile(y, ys, x, w, c, kh, kw, plane, row, MR, NR);                              \
    }
#define DW(MR, KJ)                                                                          \
    static void dw_##MR##_##KJ(float *dw, size_t dws, const float *dy, size_t dys,          \
                               const float *x, int oh, int ow, size_t row, int mvalid)      \
    {                                                                                       \
        dw_row(dw, dws, dy, dys, x, oh, ow, row, mvalid, MR, KJ);                           \
    }
#define DX(NR, KJ)                                                                          \
    static void dx_##NR##_##KJ(float *dx, const float *dy, size_t dys, const float *w, int oc) \
    {                                                                                       \
        dx_tile(dx, dy, dys, w, oc, NR, KJ);                                                \
    }
#define FIVE(M, A) M(A, 1) M(A, 2) M(A, 3) M(A, 4) M(A, 5)
#define FIVE_FN(P, A) {P##A##_1, P##A##_2, P##A##_3, P##A##_4, P##A##_5}
FIVE(FWD, 4)
FIVE(FWD, 5)
FIVE(DW, 4)
FIVE(DW, 5)
FIVE(DX, 1)
FIVE(DX, 2)
FIVE(DX, 3)
FIVE(DX, 4)
FIVE(DX, 5)
static fwd_fn *const fwd_fns[2][5] = {FIVE_FN(fwd_, 4), FIVE_FN(fwd_, 5)};
static dw_fn *const dw_fns[2][5] = {FIVE_FN(dw_, 4), FIVE_FN(dw_, 5)};
static dx_fn *const dx_fns[5][5] = {FIVE_FN(dx_, 1), FIVE_FN(dx_, 2), FIVE_FN(dx_, 3),
                                    FIVE_FN(dx_, 4), FIVE_FN(dx_, 5)};

/* Tiles outer, channel blocks inner: a tile's input (c x kh rows of
 * NR + kw - 1 pixels) stays in L1 while every block's weights stream by. */
void mg__lanes_forward(float *y, const float *x, const float *wf, const mg_conv2d_shape *s)
{
    int wp = s->w + 2 * s->pad, hp = s->h + 2 * s->pad, K = s->c * s->kh * s->kw, P = s->oh * s->ow;
    size_t row = (size_t)wp * L, plane = (size_t)hp * row, ys = (size_t)P * L;
    for (int oy = 0; oy < s->oh; oy++)
        for (int t = 0; t < row_tiles(s->ow); t++) {
            int x0, nr;
            tile_span(s->ow, t, &x0, &nr);
            fwd_fn *f = fwd_fns[s->mr - 4][nr - 1];
            for (int o = 0; o < s->oc; o += s->mr)
                f(y + (o * ys + (size_t)(oy * s->ow + x0) * L), ys, x + oy * row + x0 * L,
                  wf + (size_t)o * K, s->c, s->kh, s->kw, plane, row);
        }
}

/* dy: the group's output gradient with mg__lanes_oc_padded rows (those
 * past oc are read, not used). A block's dy (MR x P vectors) stays in L1
 * across all input channels and kernel rows. */
void mg__lanes_dw(float *dw, const float *dy, const float *x, const mg_conv2d_shape *s)
{
    int wp = s->w + 2 * s->pad, hp = s->h + 2 * s->pad, K = s->c * s->kh * s->kw, P = s->oh * s->ow;
    size_t row = (size_t)wp * L, plane = (size_t)hp * row, ys = (size_t)P * L;
    dw_fn *f = dw_fns[s->mr - 4][s->kw - 1];
    for (int o = 0; o < s->oc; o += s->mr)
        for (int ci = 0; ci < s->c; ci++)
            for (int ki = 0; ki < s->kh; ki++)
                f(dw + (size_t)o * K + (ci * s->kh + ki) * s->kw, K, dy + o * ys, ys,
                  x + ci * plane + ki * row, s->oh, s->ow, row, s->oc - o);
}

/* dx: the group's input gradient in the padded geometry, overwritten.
 * Tiles outer: a tile's dy (oc x NR vectors) stays in L1 while the
 * weights stream by. */
void mg__lanes_dx(float *dx, const float *dy, const float *wb, const mg_conv2d_shape *s)
{
    int wp = s->w + 2 * s->pad, hp = s->h + 2 * s->pad, P = s->oh * s->ow;
    size_t row = (size_t)wp * L, plane = (size_t)hp * row, ys = (size_t)P * L;
    memset(dx, 0, sizeof(float) * s->c * plane);
    for (int oy = 0; oy < s->oh; oy++)
        for (int t = 0; t < row_tiles(s->ow); t++) {
            int x0, nr;
            tile_span(s->ow, t, &x0, &nr);
            dx_fn *f = dx_fns[nr - 1][s->kw - 1];
            const float *d = dy + (size_t)(oy * s->ow + x0) * L;
            for (int ci = 0; ci < s->c; ci++)
                for (int ki = 0; ki < s->kh; ki++)
                    f(dx + ci * plane + (oy + ki) * row + x0 * L, d, ys,
                      wb + ((size_t)ci * s->kh + ki) * s->oc * s->kw, s->oc);
        }
}

#endif
