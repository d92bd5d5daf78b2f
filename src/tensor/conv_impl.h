/* multigrad — internals of the convolution kernels shared by conv.c (the
 * portable C path and the dispatch) and conv_avx512.c (the AVX-512 path).
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

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define MG__HAVE_AVX512 1
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
#endif

#endif
