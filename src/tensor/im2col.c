/* im2col and col2im: unfold image patches into the columns of a matrix so
 * a convolution becomes one GEMM, and fold column gradients back. For each
 * kernel tap the valid output columns of a row form one interval, found
 * once, so the inner loops are plain copies (stride 1 copies are
 * contiguous) with no per-element bounds tests. */
#include <string.h>
#include "multigrad/tensor.h"

/* Output columns ox with 0 <= ox*stride - pad + kj < w: [*lo, *hi). */
static void valid_range(int kj, int stride, int pad, int w, int ow, int *lo, int *hi)
{
    int a = pad - kj;                      /* need ox*stride >= a */
    int l = a <= 0 ? 0 : (a + stride - 1) / stride;
    int b = w + pad - kj;                  /* need ox*stride < b */
    int h = b <= 0 ? 0 : (b + stride - 1) / stride;
    if (h > ow) h = ow;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

void mg_im2col(float *col, int ldc, const float *x, int c, int h, int w,
               int kh, int kw, int stride, int pad, int oh, int ow)
{
    for (int ci = 0; ci < c; ci++) {
        const float *xc = x + (size_t)ci * h * w;
        for (int ki = 0; ki < kh; ki++) {
            for (int kj = 0; kj < kw; kj++) {
                float *row = col + (size_t)((ci * kh + ki) * kw + kj) * ldc;
                int lo, hi;
                valid_range(kj, stride, pad, w, ow, &lo, &hi);
                for (int oy = 0; oy < oh; oy++) {
                    float *dst = row + oy * ow;
                    int iy = oy * stride - pad + ki;
                    if (iy < 0 || iy >= h) {
                        memset(dst, 0, sizeof(float) * (size_t)ow);
                        continue;
                    }
                    /* First valid input element of this run (ix >= 0). */
                    const float *src = xc + (size_t)iy * w + (hi > lo ? lo * stride - pad + kj : 0);
                    for (int ox = 0; ox < lo; ox++) dst[ox] = 0.0f;
                    if (stride == 1) {
                        for (int i = 0; i < hi - lo; i++) dst[lo + i] = src[i];
                    } else {
                        for (int i = 0; i < hi - lo; i++) dst[lo + i] = src[i * stride];
                    }
                    for (int ox = hi; ox < ow; ox++) dst[ox] = 0.0f;
                }
            }
        }
    }
}

void mg_col2im(float *x, const float *col, int ldc, int c, int h, int w,
               int kh, int kw, int stride, int pad, int oh, int ow)
{
    for (int ci = 0; ci < c; ci++) {
        float *xc = x + (size_t)ci * h * w;
        for (int ki = 0; ki < kh; ki++) {
            for (int kj = 0; kj < kw; kj++) {
                const float *row = col + (size_t)((ci * kh + ki) * kw + kj) * ldc;
                int lo, hi;
                valid_range(kj, stride, pad, w, ow, &lo, &hi);
                for (int oy = 0; oy < oh; oy++) {
                    int iy = oy * stride - pad + ki;
                    if (iy < 0 || iy >= h || hi <= lo) continue;
                    const float *src = row + oy * ow + lo;
                    float *dst = xc + (size_t)iy * w + (lo * stride - pad + kj);
                    if (stride == 1) {
                        for (int i = 0; i < hi - lo; i++) dst[i] += src[i];
                    } else {
                        for (int i = 0; i < hi - lo; i++) dst[i * stride] += src[i];
                    }
                }
            }
        }
    }
}
