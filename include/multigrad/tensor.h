/* multigrad — float32 tensors and the kernels under every layer.
 * A tensor is a view: a pointer into an arena plus up to 4 dimensions,
 * row-major and contiguous. Kernels take outputs first, then inputs, then
 * dimensions; backward kernels accumulate into gradients. */
#ifndef MULTIGRAD_TENSOR_H
#define MULTIGRAD_TENSOR_H

#include <stddef.h>
#include <stdbool.h>
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_MAX_DIMS 4

typedef struct mg_tensor {
    float *data;
    int ndim;
    int shape[MG_MAX_DIMS];
} mg_tensor;

mg_tensor mg_tensor_view(float *data, int ndim, const int *shape);
size_t mg_tensor_numel(const mg_tensor *t);

/* BLAS threads for this process (default 1, or MG_THREADS). */
void mg_set_threads(int n);
int mg_get_threads(void);

/* C[M,N] = alpha * op(A) op(B) + beta * C, row-major, through OpenBLAS. */
void mg_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
             const float *A, int lda, const float *B, int ldb, float beta,
             float *C, int ldc);

#ifdef __cplusplus
}
#endif
#endif
