/* multigrad — internals of the convolution kernels shared by conv.c (the
 * portable C path and the dispatch), conv_avx512.c (the AVX-512 im2col,
 * pool and direct kernels) and conv_lanes_avx512.c (images in the lanes).
 *
 * Saved pool masks: per (image, channel) plane, per pooled row, per
 * segment of 16 pooled columns, four uint16 masks (window element 0..3 in
 * row-major order), bit j for pooled column seg*16 + j. */
#ifndef MG_TENSOR_CONV_IMPL_H
#define MG_TENSOR_CONV_IMPL_H

#include "multigrad/tensor.h"

static inline int mg__pool_segs(const mg_conv2d_shape *s) { return (s->pw + 15) / 16; }
/* uint16 masks per (image, channel) plane. */
static inline size_t mg__plane_masks(const mg_conv2d_shape *s)
{
    return s->pool == MG_POOL_NONE ? 0 : (size_t)s->ph * mg__pool_segs(s) * 4;
}

/* F, BW and VL: every AVX-512 CPU since Skylake-SP. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MG__HAVE_AVX512 1
#include <immintrin.h>

/* The first n lanes (none for n <= 0, all for n >= 16). */
static inline __mmask16 lanes(int n)
{
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* Lanes l with lo <= l < hi. */
static inline __mmask16 range_mask(int lo, int hi)
{
    if (lo < 0) lo = 0;
    if (hi > 16) hi = 16;
    if (hi <= lo) return 0;
    return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* The 2x2 pool of window elements a, b (top row), c, d (bottom row), with
 * the ReLU before it if relu: the pooled values, and in m[k] the lanes
 * whose element k gets gradient (ReLU active for avg; the first maximum in
 * row-major order, as PyTorch, for max). */
static inline __m512 mg__pool4(__m512 a, __m512 b, __m512 c, __m512 d, bool relu,
                               mg_pool_kind pool, __mmask16 m[4])
{
    __m512 zero = _mm512_setzero_ps();
    if (pool == MG_POOL_AVG) {
        if (relu) {
            m[0] = _mm512_cmp_ps_mask(a, zero, _CMP_GT_OQ);
            m[1] = _mm512_cmp_ps_mask(b, zero, _CMP_GT_OQ);
            m[2] = _mm512_cmp_ps_mask(c, zero, _CMP_GT_OQ);
            m[3] = _mm512_cmp_ps_mask(d, zero, _CMP_GT_OQ);
            a = _mm512_maskz_mov_ps(m[0], a);
            b = _mm512_maskz_mov_ps(m[1], b);
            c = _mm512_maskz_mov_ps(m[2], c);
            d = _mm512_maskz_mov_ps(m[3], d);
        } else {
            m[0] = m[1] = m[2] = m[3] = 0xFFFF;
        }
        return _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)),
                             _mm512_set1_ps(0.25f));
    }
    __m512 mx = _mm512_max_ps(_mm512_max_ps(a, b), _mm512_max_ps(c, d));
    m[0] = _mm512_cmp_ps_mask(a, mx, _CMP_EQ_OQ);
    m[1] = _mm512_cmp_ps_mask(b, mx, _CMP_EQ_OQ) & ~m[0];
    m[2] = _mm512_cmp_ps_mask(c, mx, _CMP_EQ_OQ) & ~(m[0] | m[1]);
    m[3] = (__mmask16) ~(m[0] | m[1] | m[2]);
    if (!relu) return mx;
    __mmask16 pos = _mm512_cmp_ps_mask(mx, zero, _CMP_GT_OQ);
    for (int k = 0; k < 4; k++) m[k] &= pos;
    return _mm512_maskz_mov_ps(pos, mx);
}

/* im2col for stride 1. */
void mg__im2col_s1_avx512(float *col, int ldc, const float *x, int c, int h, int w,
                          int kh, int kw, int pad, int oh, int ow);
/* x = col2im(col) for stride 1 (overwrites x: no memset needed). */
void mg__col2im_s1_set_avx512(float *x, const float *col, int ldc, int c, int h, int w,
                              int kh, int kw, int pad, int oh, int ow);
/* Pool epilogue of one GEMM output plane (bias, ReLU, 2x2 pool, masks). */
void mg__pool_plane_avx512(float *dst, uint16_t *m, const float *src, float b,
                           const mg_conv2d_shape *s);
/* The plane's pre-pool gradient from the pooled one; returns its sum. */
float mg__pool_grad_plane_avx512(float *dst, const float *dy, const uint16_t *m,
                                 const mg_conv2d_shape *s);
/* Direct convolution of one input channel (stride 1, ow <= 32). xp holds
 * cn zero-padded planes (h+2pad) x (w+2pad) with slack after them. */
void mg__direct_forward_avx512(float *y, uint16_t *m, const float *xp, int cn,
                               const float *wt, const float *b, const mg_conv2d_shape *s);
void mg__direct_backward_avx512(float *dw, float *db, const float *dy, const float *y,
                                const uint16_t *m, const float *xp, int cn,
                                const mg_conv2d_shape *s);

/* Images in the lanes (conv_lanes_avx512.c): a group of MG__LANES images
 * as [plane][row][column][image]. */
enum { MG__LANES = 16 };
/* Planes of cn <= 16 images (image i at src + i * img, plane p at
 * + p * plane, rows x cols each) into the lanes layout with a zero border
 * of pad; lanes past cn are zero. */
void mg__lanes_pack(float *dst, const float *src, int cn, size_t img, int planes,
                    size_t plane, int rows, int cols, int pad);
/* The inverse, the border dropped. */
void mg__lanes_unpack(float *dst, size_t img, size_t plane, const float *src, int cn,
                      int planes, int rows, int cols, int pad);
/* The fused pool of a group: p16 [oc][ph][pw] pooled vectors from the
 * pre-pool ones y16 [oc][oh][ow] and the bias, and the masks of its cn
 * images in the saved format (masks: the group's first image's; NULL
 * keeps none). */
void mg__lanes_pool(float *p16, uint16_t *masks, const float *y16, const float *b, int cn,
                    const mg_conv2d_shape *s);
/* Its gradient: g16 [oc][oh][ow] from dy16 [oc][ph][pw] and the masks;
 * db += the sums. */
void mg__lanes_unpool(float *g16, float *db, const float *dy16, const uint16_t *masks, int cn,
                      const mg_conv2d_shape *s);
/* Output channels rounded up to the register block s->mr. */
int mg__lanes_oc_padded(const mg_conv2d_shape *s);
/* The weights as the kernels read them: wf (mg__lanes_oc_padded * K
 * floats) for the forward, wb (oc * K) for the input gradient; either may
 * be NULL. */
void mg__lanes_pack_weights(float *wf, float *wb, const float *wt, const mg_conv2d_shape *s);
/* y [oc padded][oh][ow] vectors from x [c][h+2pad][w+2pad]. */
void mg__lanes_forward(float *y, const float *x, const float *wf, const mg_conv2d_shape *s);
/* dw += from dy [oc padded][oh][ow] and x. */
void mg__lanes_dw(float *dw, const float *dy, const float *x, const mg_conv2d_shape *s);
/* dx [c][h+2pad][w+2pad] = the input gradient (border included). */
void mg__lanes_dx(float *dx, const float *dy, const float *wb, const mg_conv2d_shape *s);
#endif

#endif
