/* Internal to the device kernels (the .cu files of src/device): what
 * their files share, the context of a device (struct mg_dk), the launch
 * helpers that run a function of an element or a row on a GPU or on the
 * host (emu), the lanes' reductions, the profile scope and the batched
 * GEMM. C++ only. */
#ifndef MG_DEVICE_DK_INTERNAL_H
#define MG_DEVICE_DK_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/tensor.h"
#include "device/dk.h"
#include "core/elem.h"
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#endif
#define HD MG_HD

struct mg_dk {
    mg_device dev;
    bool emu;
    void *ws;              /* the kernels' workspace (device memory), grown on demand */
    size_t ws_bytes;
    float *ones;           /* ones_n floats of 1: column sums as GEMMs */
    size_t ones_n;
    bool bf16;             /* GEMMs with bfloat16 operands (mg_device_set_bf16) */
    void *bf[2];           /* a GEMM's operands rounded to bfloat16 (a GPU's: bfloat16;
                              emu's: floats holding the rounded values), grown on demand */
    size_t bf_n[2];
    const float *bf0_of;   /* whose n floats bf[0] holds rounded ... */
    size_t bf0_n;
    const float *reuse;    /* ... and may give again while dk_bf16_reuse names them */
    size_t reuse_n;
    size_t rounded;        /* elements rounded so far (mg__dk_bf16_rounded) */
    struct {               /* spans rounded once for the kernel entry running (dk_bf16_keep) */
        const float *p;
        size_t n;
        const void *copy;
    } kept[4];
    int n_kept;
    void *kb[2];           /* the context's own kept copies (dk_bf16_keep_own), grown on demand */
    size_t kb_n[2];
    void **ptrs;           /* a batched GEMM's operands' addresses (a GPU's), grown on demand */
    size_t ptrs_n;
#ifdef __CUDACC__
    cudaStream_t stream;
    cudaStream_t copy;     /* the feeds' copies to the GPU, beside the kernels */
    cublasHandle_t blas;
#endif
};

static inline mg_dk *DK(void)
{
    MG_ASSERT(mg__dk_cur);
    return mg__dk_cur;
}

#ifdef __CUDACC__
/* A GPU failing in the middle of a step (an illegal address, a lost
 * device) leaves nothing to recover: say what failed and stop. */
static inline void ck(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return;
    fprintf(stderr, "multigrad: cuda: %s: %s (%s)\n", what, cudaGetErrorString(e),
            cudaGetErrorName(e));
    abort();
}
#endif

/* The workspace, at least `bytes` (previous contents are not kept). */
void *dk_ws(size_t bytes);
/* n floats of 1 (kernels.cu): column sums as GEMMs. */
const float *dk_ones(size_t n);
/* With bf16 on: the n floats at p do not change, once a GEMM has rounded
 * them, until the next call (p NULL: none), so the GEMMs that take them
 * as their first operand round them once, the first time (a linear's
 * backward: dY, once masked, feeds the weight and input gradients'
 * GEMMs). */
void dk_bf16_reuse(const float *p, size_t n);
/* With bf16 on, the bytes of n rounded elements (a GPU's bfloat16: 2 each;
 * emu's floats holding the rounded values: 4); with it off, 0. */
size_t dk_bf16_bytes(size_t n);
/* With bf16 on: until dk_bf16_forget, a GEMM operand lying within the n
 * floats at p is taken from `copy` (dk_bf16_bytes(n)), not rounded again.
 * round: p rounded into copy now; else copy holds them rounded already, by
 * an earlier entry (a linear's forward, for its backward), the floats
 * unchanged since. Up to 4 spans. */
void dk_bf16_keep(const float *p, size_t n, void *copy, bool round);
/* The same, the copy in the context's buffer `which` (0 or 1). */
void dk_bf16_keep_own(int which, const float *p, size_t n);
void dk_bf16_forget(void);

/* ---- Launching -------------------------------------------------------------- */

#ifdef __CUDACC__
template <class F> __global__ void k_each(size_t n, F f)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        f(i);
}

/* A warp per row: every lane of a warp has the same row, so a warp is
 * either all in or all out and the shuffles see 32 lanes. */
template <class F> __global__ void k_rows(size_t rows, F f)
{
    size_t r = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r < rows) f(r, (int)(threadIdx.x & 31), 32);
}
#endif

#ifdef __CUDACC__
/* f(i) for i < n on a GPU, queued on stream s; the launch's error. */
template <class F> static cudaError_t each_on(cudaStream_t s, size_t n, F f)
{
    size_t b = (n + 255) / 256;
    if (b > 65536) b = 65536;
    k_each<<<(unsigned)b, 256, 0, s>>>(n, f);
    return cudaGetLastError();
}
#endif

/* f(i) for i < n. */
template <class F> static void each(size_t n, F f)
{
    if (!n) return;
#ifdef __CUDACC__
    if (!DK()->emu) {
        ck(each_on(DK()->stream, n, f), "launching a kernel");
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) f(i);
}

/* f(row, lane, lanes) for each row: the lanes of a row split its columns
 * (j = lane, lane + lanes, ...) and combine through lane_sum/max/min. */
template <class F> static void rows(size_t r, F f)
{
    if (!r) return;
#ifdef __CUDACC__
    if (!DK()->emu) {
        size_t b = (r + 7) / 8;
        k_rows<<<(unsigned)b, 256, 0, DK()->stream>>>(r, f);
        ck(cudaGetLastError(), "launching a kernel");
        return;
    }
#endif
    for (size_t i = 0; i < r; i++) f(i, 0, 1);
}

static HD inline float lane_sum(float v)
{
#ifdef __CUDA_ARCH__
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
#endif
    return v;
}

static HD inline double lane_sum_d(double v)
{
#ifdef __CUDA_ARCH__
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
#endif
    return v;
}

static HD inline float lane_max(float v)
{
#ifdef __CUDA_ARCH__
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
#endif
    return v;
}

static HD inline int lane_min(int v)
{
#ifdef __CUDA_ARCH__
    for (int o = 16; o > 0; o >>= 1) {
        int w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
#endif
    return v;
}

/* A GPU time scope of MG_DK_PROFILE=1 (kernels.cu): PROFILE(name) at the
 * top of a kernel entry. */
#ifdef __CUDACC__
struct prof_scope {
    size_t rec;   /* its record's index (the records move when they grow); 0: none */
    const char *was;
    explicit prof_scope(const char *name);
    ~prof_scope();
};
#define PROFILE(name) prof_scope prof_scope_(name)
#else
#define PROFILE(name) (void)0
#endif

/* ---- GEMM ---------------------------------------------------------------------- */

/* Where the operands of a batch of GEMMs lie: the i-th of `outer` x
 * `inner` at X + (i / inner) outer + (i % inner) inner elements (a batch
 * of sequences x heads, each head's columns inside its sequence's rows). */
typedef struct {
    long long outer, inner;
} bstride;

/* The elements of the rows x cols matrices (leading dimension ld) of a
 * batch that an operand spans. */
static inline size_t span(int rows, int cols, int ld, bstride s, int outer, int inner)
{
    return (size_t)s.outer * (size_t)(outer - 1) + (size_t)s.inner * (size_t)(inner - 1) +
           (size_t)(rows - 1) * (size_t)ld + (size_t)cols;
}

static HD inline long long at(bstride s, int inner, long long i)
{
    return i / inner * s.outer + i % inner * s.inner;
}

/* Row-major C = alpha op(A) op(B) + beta C for each of a batch of outer x
 * inner GEMMs at the strides (kernels.cu). */
void dk_gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                     bstride sa, const float *B, int ldb, bstride sb, float beta, float *C,
                     int ldc, bstride sc, int outer, int inner);

#endif
