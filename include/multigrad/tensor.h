/* multigrad — the float32 kernels under every layer. A tensor is a plain
 * pointer to row-major, contiguous data (up to MG_MAX_DIMS dimensions,
 * passed alongside). Kernels take outputs first, then inputs, then
 * dimensions; backward kernels accumulate into parameter gradients (and
 * overwrite input gradients, which nothing else shares). Images are NCHW. */
#ifndef MULTIGRAD_TENSOR_H
#define MULTIGRAD_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "core.h"
#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_MAX_DIMS 4

/* BLAS threads for this process (default 1, or MG_THREADS). */
void mg_set_threads(int n);
int mg_get_threads(void);

/* Which kernels this process runs: the CPU, the OpenBLAS core its GEMM
 * uses and why (OpenBLAS's own choice, re-selected by multigrad because
 * that one was below this CPU or measured slower, or set by the user
 * through OPENBLAS_CORETYPE or MG_BLAS_CORE), and the SIMD level of the
 * library's own convolution kernels. Checked once, before the first GEMM;
 * a core below what the CPU supports is logged as a warning, unless the
 * user chose it (then --version and --verbose say so), and so is a core
 * asked for that OpenBLAS refused; each names who asked for the core. */
typedef struct mg_kernels_info {
    mg_cpu_info cpu;
    char blas[48];            /* "OpenBLAS 0.3.21" */
    char detected[24];        /* the core OpenBLAS chose when it loaded */
    mg_simd detected_simd;
    char core[24];            /* the core in use */
    mg_simd core_simd;
    const char *choice;       /* why this core, one phrase */
    bool switched;            /* re-selected by multigrad */
    bool below;               /* in use below the kernels measured best here */
    mg_simd own;              /* own conv kernels: MG_SIMD_AVX512 or MG_SIMD_NONE */
    char why[192];
    char fix[96];             /* what to do about a core below this CPU or refused, or "" */
} mg_kernels_info;
const mg_kernels_info *mg_kernels(void);
/* The OpenBLAS core multigrad selects on a CPU (measured fastest for its
 * vendor and SIMD level), NULL for "keep OpenBLAS's"; *why (may be NULL)
 * gets the reason. */
const char *mg_blas_core_for(const mg_cpu_info *cpu, const char **why);
/* Lines "cpu: ...", "gemm: ...", "conv: ...", "threads: ...", each
 * starting with prefix (may be NULL; "# " for benchmark headers), for
 * --version, verbose output and benchmark headers; returns snprintf's
 * count. */
int mg_kernels_describe(char *buf, size_t cap, const char *prefix);
/* --version of every tool: "TOOL (multigrad VERSION)" and those lines on
 * stdout. */
void mg_print_version(const char *tool);

/* GFLOP/s of the best square SGEMM of 384..1024 with the kernels and
 * threads in use (about 1.5 s): the peak the benchmarks compare with. */
double mg_sgemm_peak(void);
/* GFLOP/s of device d's float32 GEMM (cuBLAS on a GPU), the best of 10
 * products of 4096^3 (a few seconds); 0 when d cannot be used: the GPU
 * benchmarks' peak. */
double mg_device_sgemm_peak(mg_device d);

/* C[M,N] = alpha * op(A) op(B) + beta * C, row-major, through OpenBLAS. */
void mg_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
             const float *A, int lda, const float *B, int ldb, float beta,
             float *C, int ldc);

/* ---- im2col --------------------------------------------------------- */

/* One image x [c, h, w] to columns: col row (ci, ki, kj) holds, at
 * column oy*ow + ox, x[ci, oy*stride - pad + ki, ox*stride - pad + kj]
 * (0 outside the image). Rows are ldc floats apart, so the columns of
 * several images can sit side by side in one matrix [c*kh*kw, n*oh*ow]. */
void mg_im2col(float *col, int ldc, const float *x, int c, int h, int w,
               int kh, int kw, int stride, int pad, int oh, int ow);
/* The adjoint: x[c, h, w] += the columns scattered back. */
void mg_col2im(float *x, const float *col, int ldc, int c, int h, int w,
               int kh, int kw, int stride, int pad, int oh, int ow);

/* ---- convolution ------------------------------------------------------ */

typedef enum { MG_POOL_NONE, MG_POOL_AVG, MG_POOL_MAX } mg_pool_kind;

/* A 2-d convolution (cross-correlation, as PyTorch), optionally followed
 * by a fused ReLU and a fused 2x2/2 pool (floor mode): the pre-pool map is
 * never written out, which saves two passes over the largest activation. */
typedef struct mg_conv2d_shape {
    int c, h, w;          /* input per image */
    int oc, kh, kw, stride, pad;
    int oh, ow;           /* convolution output */
    bool relu;
    mg_pool_kind pool;
    int ph, pw;           /* layer output: pooled (oh/2, ow/2) or (oh, ow) */
    int chunk;            /* images per im2col block (cache-sized) */
    bool simd;            /* AVX-512 kernels (MG_KERNELS=generic: portable C) */
    bool direct;          /* one input channel: direct convolution, no im2col */
    int dchunk;           /* images per block of the direct path */
    bool lanes;           /* stride 1: 16 images in the vector lanes, no im2col */
    int mr;               /* output channels per register block of that path */
} mg_conv2d_shape;

/* Fills the derived fields; false if the geometry is impossible. The
 * kernels are chosen here: AVX-512 when compiled in (unless
 * MG_KERNELS=generic), and for a single input channel with stride 1 a
 * direct convolution whose input rows stay in registers; other stride-1
 * layers with kernel rows of up to 5 taps whose group of 16 images fits
 * the cache budget (MG_CONV_CHUNK_KB) take the lanes path (16 images per
 * vector, register-blocked FMA kernels, no im2col; one thread, so with
 * more than two BLAS threads im2col + GEMM); the rest im2col + GEMM. */
bool mg_conv2d_shape_init(mg_conv2d_shape *s, int c, int h, int w, int oc,
                          int kh, int kw, int stride, int pad, bool relu,
                          mg_pool_kind pool);
/* Floats of workspace forward and backward need for batches of up to n
 * images (on the CPU the same for any n; on a device it grows with n). */
size_t mg_conv2d_workspace(const mg_conv2d_shape *s, int n);
/* Bytes per image the forward keeps for the backward: with a pool, per
 * channel and pooled row, four 16-bit masks per 16 pooled columns (which
 * element of each 2x2 window gets gradient: the ReLU was active for avg,
 * it is the first maximum for max). On a device: a byte per pooled output
 * with the same meaning. */
size_t mg_conv2d_saved_bytes(const mg_conv2d_shape *s);

/* y [n, oc, ph, pw]; saved: mg_conv2d_saved_bytes * n bytes. */
void mg_conv2d_forward(float *y, uint8_t *saved, const float *x,
                       const float *wt, const float *b,
                       const mg_conv2d_shape *s, int n, float *ws);
/* dw, db += the gradients; dx (NULL: skipped, e.g. the first layer) gets
 * the input gradient. dy is the gradient of y; y and saved come from the
 * forward of the same x. */
void mg_conv2d_backward(float *dx, float *dw, float *db, const float *dy,
                        const float *y, const uint8_t *saved, const float *x,
                        const float *wt, const mg_conv2d_shape *s, int n,
                        float *ws);

/* ---- pooling ---------------------------------------------------------- */

/* Pool planes x [nc, h, w] with a k x k window, stride s, no padding,
 * floor mode, into y [nc, oh, ow] (oh = (h-k)/s + 1). Max pooling records
 * in arg the flat input index (within the plane) of the first maximum in
 * row-major order; the backward sends each gradient there. */
void mg_avgpool2d_forward(float *y, const float *x, int nc, int h, int w, int k, int s);
void mg_avgpool2d_backward(float *dx, const float *dy, int nc, int h, int w, int k, int s);
void mg_maxpool2d_forward(float *y, int32_t *arg, const float *x, int nc, int h, int w,
                          int k, int s);
void mg_maxpool2d_backward(float *dx, const float *dy, const int32_t *arg, int nc,
                           int h, int w, int k, int s);

/* ---- elementwise and dense ------------------------------------------- */

void mg_relu_forward(float *y, const float *x, size_t n);
/* dx = dy where y > 0, else 0 (PyTorch's threshold_backward on the output). */
void mg_relu_backward(float *dx, const float *dy, const float *y, size_t n);

/* y [n, out] = x [n, in] W^T + b, then ReLU if relu. */
void mg_linear_forward(float *y, const float *x, const float *wt, const float *b,
                       int n, int in, int out, bool relu);
/* dw, db += ; dx (may be NULL) = dy W. With relu, dy is first masked in
 * place by y > 0. */
void mg_linear_backward(float *dx, float *dw, float *db, float *dy, const float *y,
                        const float *x, const float *wt, int n, int in, int out,
                        bool relu);
/* The same keeping operands for the backward: on a device whose GEMMs
 * round to bfloat16 (mg_device_set_bf16), the forward keeps x and W
 * rounded in `kept`, mg_linear_kept(n, in, out) bytes (0 elsewhere), and
 * the backward of the same x and W (unchanged since) takes them from
 * there instead of rounding them again. kept may be NULL (round each use);
 * a `kept` sized while the GEMMs did not round holds nothing: pass NULL. */
size_t mg_linear_kept(int n, int in, int out);
bool mg_gemm_bf16(void);   /* the current device's GEMMs round to bfloat16 */
void mg_linear_forward_kept(float *y, const float *x, const float *wt, const float *b, int n,
                            int in, int out, bool relu, void *kept);
void mg_linear_backward_kept(float *dx, float *dw, float *db, float *dy, const float *y,
                             const float *x, const float *wt, int n, int in, int out, bool relu,
                             const void *kept);

/* y [n, out] += b (b may be NULL), then ReLU if relu: mg_linear_forward's
 * end, for a product summed elsewhere first (a row-parallel layer's). */
void mg_bias_relu(float *y, const float *b, int n, int out, bool relu);
/* Its backward: dy masked in place by y > 0 if relu, then db += the
 * column sums of dy (db may be NULL). */
void mg_bias_relu_backward(float *dy, float *db, const float *y, int n, int out, bool relu);

/* y += a;  y = a * b (elementwise);  y = x (n floats, not overlapping). */
void mg_add_into(float *y, const float *a, size_t n);
/* mg_add_into with device d's kernels (memory of d), from any thread: the
 * current device is d meanwhile and then what it was. */
mg_status mg_add_into_on(mg_device d, float *y, const float *a, size_t n);
void mg_copy_floats(float *y, const float *x, size_t n);
void mg_mul(float *y, const float *a, const float *b, size_t n);

/* Inverted dropout: keep[i] = 1 with probability 1-p from the
 * counter-based stream (seed, counter); y = x * keep / (1-p). */
void mg_dropout_mask(uint8_t *keep, size_t n, float p, uint64_t seed, uint64_t counter);
void mg_dropout_apply(float *y, const float *x, const uint8_t *keep, size_t n, float p);

/* ---- transformer ------------------------------------------------------ */

/* LayerNorm over the last dimension d of `rows` rows (biased variance, as
 * PyTorch): y = (x - mean) * rstd * w + b; mean and rstd (1/sqrt(var+eps))
 * per row are kept for the backward. */
void mg_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, size_t rows, int d, float eps);
/* dw, db += ; dx (may be NULL) = the input gradient. */
void mg_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const float *w, size_t rows,
                           int d);
/* GELU with the tanh approximation; the backward reads the input x. */
void mg_gelu_forward(float *y, const float *x, size_t n);
void mg_gelu_backward(float *dx, const float *dy, const float *x, size_t n);
/* y = gelu(x) and dydx = gelu'(x) in one pass (one exp per element). */
void mg_gelu_forward_deriv(float *y, float *dydx, const float *x, size_t n);
/* Causal multi-head self-attention of n sequences of T positions: qkv
 * [n, T, 3d] holds q, k, v side by side (head j: columns j*d/heads of
 * each), y [n, T, d] the heads' outputs side by side; softmax scaled by
 * 1/sqrt(d/heads). lse, mg_attention_saved(n, T, d, heads) floats, keeps
 * what the backward needs: each softmax row's log-sum-exp [n, heads, T],
 * from which the backward recomputes the probabilities; on a device
 * where the batched GEMMs run (MG_ATTENTION: by default in float32 up to
 * 512 positions, and heads over 128 wide), the probabilities [n, heads,
 * T, T] themselves, as PyTorch's eager attention keeps them. The path
 * follows MG_ATTENTION and the GEMMs' precision (mg_gemm_bf16) as they
 * were when the buffers were sized: keep MG_ATTENTION the same from
 * sizing to backward; a precision switched since takes the _as calls with
 * the one sized for (a model's tape does). ws holds
 * mg_attention_scratch(n, T, d, heads) floats (on a device, its kernels'
 * need, which grows with n; on the CPU one sequence's). */
size_t mg_attention_saved(int n, int T, int d, int heads);
size_t mg_attention_scratch(int n, int T, int d, int heads);
void mg_attention_forward(float *y, float *lse, const float *qkv, int n, int T, int d,
                          int heads, float *ws);
/* dqkv [n, T, 3d] = the input gradient (overwritten). */
void mg_attention_backward(float *dqkv, const float *dy, const float *y, const float *lse,
                           const float *qkv, int n, int T, int d, int heads, float *ws);
/* The same for buffers sized while the GEMMs rounded to bfloat16
 * (sized_bf16) or not; the plain calls take the current precision. */
size_t mg_attention_saved_as(int n, int T, int d, int heads, bool sized_bf16);
void mg_attention_forward_as(float *y, float *lse, const float *qkv, int n, int T, int d,
                             int heads, float *ws, bool sized_bf16);
void mg_attention_backward_as(float *dqkv, const float *dy, const float *y, const float *lse,
                              const float *qkv, int n, int T, int d, int heads, float *ws,
                              bool sized_bf16);

/* Token and position embedding of n sequences of T tokens: y [n, T, d] =
 * wte[tok] + wpe[t], where wte holds the rows of tokens [lo, lo + rows)
 * only (the whole vocabulary: 0, vocab; a part of it split over
 * tensor-parallel ranks), a token outside them adding 0, and wpe may be
 * NULL (adding 0). The backward adds dy into the rows of gte its tokens
 * chose (those within the rows) and into gpe. */
void mg_embedding_forward(float *y, const int32_t *tok, const float *wte, int lo, int rows,
                          const float *wpe, int n, int T, int d);
void mg_embedding_backward(float *gte, float *gpe, const float *dy, const int32_t *tok, int lo,
                           int rows, int n, int T, int d);

/* ---- batch normalisation (per channel over n, h, w) ------------------- */

/* Training mode: normalises with the batch statistics (biased variance),
 * stores mean and 1/sqrt(var+eps) per channel, and updates the running
 * statistics as PyTorch does (momentum 0.1, unbiased variance) unless
 * run_mean and run_var are NULL. Eval mode (training false) uses the
 * running statistics. */
void mg_batchnorm2d_forward(float *y, float *mean, float *invstd, const float *x,
                            const float *gamma, const float *beta,
                            float *run_mean, float *run_var, int n, int c, int hw,
                            float eps, float momentum, bool training);
/* dgamma, dbeta += ; dx (may be NULL) = the input gradient. */
void mg_batchnorm2d_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                             const float *x, const float *mean, const float *invstd,
                             const float *gamma, int n, int c, int hw, bool training);

#ifdef __cplusplus
}
#endif
#endif
