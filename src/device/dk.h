/* Internal to the library: the device kernels (src/device/kernels.cu).
 *
 * A model or optimizer on a device runs the same layers and the same
 * tensor.h calls as on the CPU; the calls find their device here. While a
 * tape or an optimizer on a device works, mg__dk_cur (thread-local) names
 * that device's context, and each kernel of tensor.h that has a device
 * version hands its call to the mg_dk_* function of the same arguments,
 * whose pointers are then device memory. Kernels are asynchronous on the
 * context's stream; results come back through mg_dk_copy_out.
 *
 * The device kind "emu" runs the very same kernel code on the host, one
 * lane per row where the GPU has a warp: every device code path is tested
 * where there is no GPU (CI), and a GPU run checks only what the hardware
 * adds. kernels.cu is compiled by nvcc when the CUDA toolkit is there
 * (then both kinds work) and as C++ by the host compiler otherwise;
 * attention.cu holds attention's, dk_internal.h what the files share. */
#ifndef MG_DEVICE_DK_H
#define MG_DEVICE_DK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "multigrad/device.h"
#include "multigrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_dk mg_dk;

/* The context of a device's kernels (its stream and cuBLAS handle), made
 * at first use; *out NULL for the CPU. An error when the device cannot be
 * used. */
mg_status mg__dk_get(mg_device d, mg_dk **out);
mg_device mg__dk_device(const mg_dk *k);   /* the CPU for NULL */
void mg__dk_set_tf32(mg_dk *k, bool on);
void mg__dk_set_bf16(mg_dk *k, bool on);
extern __thread mg_dk *mg__dk_cur;
/* Makes dk this thread's current context; returns the previous one, to
 * be given back to mg__dk_leave. */
static inline mg_dk *mg__dk_enter(mg_dk *dk)
{
    mg_dk *prev = mg__dk_cur;
    mg__dk_cur = dk;
    return prev;
}
static inline void mg__dk_leave(mg_dk *prev) { mg__dk_cur = prev; }

/* Waits for the context's work; copies n bytes from device memory src to
 * host memory dst after the work queued before (complete on return), or
 * from host memory in (queued; src is free again on return). */
void mg_dk_sync(void);
void mg_dk_copy_out(void *dst, const void *src, size_t n);
void mg_dk_copy_in(void *dst, const void *src, size_t n);
void mg_dk_zero(void *p, size_t bytes);

/* A feed: a tape's inputs copied to the current device in turn into two
 * buffers of `bytes`, so that a copy need not wait for the kernels that
 * read the one before (seed 000's pin_memory and non_blocking copies: on
 * a GPU through page-locked memory on a stream of its own, overlapping
 * the kernels queued before). mg_dk_feed_in copies n bytes of host memory
 * (free again on return) and returns their device copy, which stays
 * until the feed after next; the kernels queued after it see it. NULL
 * from create when the memory cannot be had. */
typedef struct mg_dk_feed mg_dk_feed;
mg_dk_feed *mg_dk_feed_create(size_t bytes);
void mg_dk_feed_destroy(mg_dk_feed *f);
const void *mg_dk_feed_in(mg_dk_feed *f, const void *src, size_t n);

/* The current context's workspace, at least `bytes` of its memory, until
 * the next kernel that uses it (the cross-entropy's rows, nn/loss.c). */
void *mg_dk_workspace(size_t bytes);

/* MG_AVG's division after NCCL's sum (comm/nccl.c), as comm/coll/reduce.c
 * divides: the n elements of type t at p (a GPU's memory) divided by
 * `by`, queued on `stream` (a cudaStream_t); f16 and bf16 through float,
 * integers truncating. 0 when queued; -1 in a build whose kernels were
 * not compiled for GPUs. */
int mg__dk_divide_async(void *p, size_t n, mg_dtype t, int by, void *stream);

/* Elements the current context has rounded to bfloat16 for GEMMs so far
 * (tests: an operand used again is not rounded again). */
size_t mg__dk_bf16_rounded(void);
/* Whether the current context's GEMMs round their operands to bfloat16. */
bool mg_dk_gemm_bf16(void);

/* The CPU's GEMM, which the device kind emu uses (src/tensor/tensor.c). */
void mg__gemm_host(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);

/* The device versions of tensor.h's kernels: the same arguments. */
void mg_dk_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc);
void mg_dk_relu_forward(float *y, const float *x, size_t n);
void mg_dk_relu_backward(float *dx, const float *dy, const float *y, size_t n);
size_t mg_dk_linear_kept(int n, int in, int out);
void mg_dk_linear_forward(float *y, const float *x, const float *wt, const float *b, int n,
                          int in, int out, bool relu, void *kept);
void mg_dk_linear_backward(float *dx, float *dw, float *db, float *dy, const float *y,
                           const float *x, const float *wt, int n, int in, int out, bool relu,
                           const void *kept);
void mg_dk_bias_relu(float *y, const float *b, int n, int out, bool relu);
void mg_dk_bias_relu_backward(float *dy, float *db, const float *y, int n, int out, bool relu);
void mg_dk_add_into(float *y, const float *a, size_t n);
void mg_dk_copy_floats(float *y, const float *x, size_t n);
void mg_dk_dropout_mask(uint8_t *keep, size_t n, float p, uint64_t seed, uint64_t counter);
void mg_dk_dropout_apply(float *y, const float *x, const uint8_t *keep, size_t n, float p);
void mg_dk_avgpool2d_forward(float *y, const float *x, int nc, int h, int w, int k, int s);
void mg_dk_avgpool2d_backward(float *dx, const float *dy, int nc, int h, int w, int k, int s);
void mg_dk_maxpool2d_forward(float *y, int32_t *arg, const float *x, int nc, int h, int w,
                             int k, int s);
void mg_dk_maxpool2d_backward(float *dx, const float *dy, const int32_t *arg, int nc, int h,
                              int w, int k, int s);
void mg_dk_batchnorm2d_forward(float *y, float *mean, float *invstd, const float *x,
                               const float *gamma, const float *beta, float *run_mean,
                               float *run_var, int n, int c, int hw, float eps, float momentum,
                               bool training);
void mg_dk_batchnorm2d_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                                const float *x, const float *mean, const float *invstd,
                                const float *gamma, int n, int c, int hw, bool training);
void mg_dk_mul(float *y, const float *a, const float *b, size_t n);
void mg_dk_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                             const float *b, size_t rows, int d, float eps);
void mg_dk_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                              const float *mean, const float *rstd, const float *w, size_t rows,
                              int d);
void mg_dk_gelu_forward(float *y, const float *x, size_t n);
void mg_dk_gelu_backward(float *dx, const float *dy, const float *x, size_t n);
void mg_dk_gelu_forward_deriv(float *y, float *dydx, const float *x, size_t n);
/* sized_bf16: the GEMMs' precision when the buffers were sized, which
 * chooses the path (tensor.h's mg_attention_*_as). */
size_t mg_dk_attention_saved(int n, int T, int d, int heads, bool sized_bf16);
size_t mg_dk_attention_scratch(int n, int T, int d, int heads, bool sized_bf16);
void mg_dk_attention_forward(float *y, float *saved, const float *qkv, int n, int T, int d,
                             int heads, float *ws, bool sized_bf16);
void mg_dk_attention_backward(float *dqkv, const float *dy, const float *y, const float *saved,
                              const float *qkv, int n, int T, int d, int heads, float *ws,
                              bool sized_bf16);
size_t mg_dk_conv2d_saved_bytes(const mg_conv2d_shape *s);
size_t mg_dk_conv2d_workspace(const mg_conv2d_shape *s, int n);
void mg_dk_conv2d_forward(float *y, uint8_t *saved, const float *x, const float *wt,
                          const float *b, const mg_conv2d_shape *s, int n, float *ws);
void mg_dk_conv2d_backward(float *dx, float *dw, float *db, const float *dy, const float *y,
                           const uint8_t *saved, const float *x, const float *wt,
                           const mg_conv2d_shape *s, int n, float *ws);
void mg_dk_embedding_forward(float *y, const int32_t *tok, const float *wte, int lo, int rows,
                             const float *wpe, int n, int T, int d);
void mg_dk_embedding_backward(float *gte, float *gpe, const float *dy, const int32_t *tok, int lo,
                              int rows, int n, int T, int d);
/* The cross-entropy's per-row pieces (nn/loss.c's, which says what
 * they are). */
void mg_dk_xent_max(float *mx, const float *logits, int n, int classes);
void mg_dk_xent_sums(float *sum, float *zy, float *arg, const float *logits,
                     const int32_t *labels, const float *mx, int n, int classes, int lo);
void mg_dk_xent_grad(float *dlogits, const float *logits, const int32_t *labels, const float *mx,
                     const float *sum, int n, int classes, int lo);
double mg_dk_sumsq(const float *g, size_t n);
void mg_dk_scale(float *g, size_t n, float s);
struct mg__adam_coef;
struct mg__sgd_coef;
void mg_dk_adam_update(float *p, const float *g, float *m, float *v, size_t n,
                       const struct mg__adam_coef *c);
void mg_dk_sgd_update(float *p, const float *g, float *buf, size_t n,
                      const struct mg__sgd_coef *c);

#ifdef __cplusplus
}
#endif
#endif
