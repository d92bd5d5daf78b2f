/* The device kernels (dk.h): every kernel the zoo's models (the gpt
 * models, the lenets, mlp) and the optimizers need, written once as a
 * function of an element or of a row, and run either on a CUDA GPU (a
 * grid of threads, a warp per row) or on the host for the device kind
 * "emu" (a loop, one lane per row). GEMMs go to cuBLAS (to OpenBLAS under
 * emu), with TF32 off, so a GPU's results match the CPU's within float
 * rounding. Convolutions are im2col of the whole batch and one GEMM, with
 * the bias, ReLU and 2x2 pool in one pass after it.
 *
 * Reductions are deterministic: sums over rows are GEMMs with a vector
 * of ones (bias gradients) or column sums over blocks of rows in a fixed
 * order (LayerNorm's); the embedding gradient is a GEMM with the tokens'
 * one-hot matrix, not atomic adds; the loss and the gradient norm come
 * back to the host as per-row and per-lane partials and are added there
 * in order.
 *
 * Attention is attention.cu's (a fused kernel). */
#include <limits.h>
#include <pthread.h>
#include "core/bf16.h"
#include "device/dk_internal.h"
#include "optim/optim_impl.h"
#ifdef __CUDACC__
#include <dlfcn.h>
#endif

__thread mg_dk *mg__dk_cur;

#define MAX_GPUS 64
static mg_dk contexts[MAX_GPUS + 1];   /* [0]: emu; [1 + i]: cuda:i */
static bool ready[MAX_GPUS + 1];
static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;


#ifdef __CUDACC__

static void ckb(cublasStatus_t e, const char *what)
{
    if (e == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "multigrad: cublas: %s: status %d\n", what, (int)e);
    abort();
}

/* cuBLAS is opened when a GPU is first used, not linked: loading it (and
 * cublasLt, 0.5 GB) costs every process 70 ms and 200 MB of resident
 * memory, which a CPU run should not pay. */
#define STR_(x) #x
#define STR(x) STR_(x)
static struct {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_math)(cublasHandle_t, cublasMath_t);
    cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const float *, const float *, int, const float *, int, const float *,
                            float *, int);
    cublasStatus_t (*sgemm_strided)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                    int, int, const float *, const float *, int, long long,
                                    const float *, int, long long, const float *, float *, int,
                                    long long, int);
    cublasStatus_t (*gemm_strided_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void *, const void *, cudaDataType, int,
                                      long long, const void *, cudaDataType, int, long long,
                                      const void *, void *, cudaDataType, int, long long, int,
                                      cublasComputeType_t, cublasGemmAlgo_t);
    cublasStatus_t (*sgemm_ptrs)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                 int, const float *, const float *const *, int,
                                 const float *const *, int, const float *, float *const *, int,
                                 int);
    cublasStatus_t (*gemm_ptrs_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                   int, const void *, const void *const *, cudaDataType, int,
                                   const void *const *, cudaDataType, int, const void *,
                                   void *const *, cudaDataType, int, int, cublasComputeType_t,
                                   cublasGemmAlgo_t);
} blas;

/* The pointers have the headers' types exactly (checked unevaluated:
 * nothing is linked). */
template <class A, class B> struct same { static const bool value = false; };
template <class A> struct same<A, A> { static const bool value = true; };
static_assert(same<decltype(&cublasCreate_v2), decltype(blas.create)>::value, "cublasCreate");
static_assert(same<decltype(&cublasSetStream_v2), decltype(blas.set_stream)>::value, "stream");
static_assert(same<decltype(&cublasSetMathMode), decltype(blas.set_math)>::value, "math mode");
static_assert(same<decltype(&cublasSgemm_v2), decltype(blas.sgemm)>::value, "cublasSgemm");
static_assert(same<decltype(&cublasSgemmStridedBatched), decltype(blas.sgemm_strided)>::value,
              "cublasSgemmStridedBatched");
static_assert(same<decltype(&cublasSgemmBatched), decltype(blas.sgemm_ptrs)>::value,
              "cublasSgemmBatched");
/* (C++ sees an overload of these taking the compute type as a
 * cudaDataType; the cast picks the exported one, or does not compile.) */
static_assert(sizeof(static_cast<decltype(blas.gemm_strided_ex)>(&cublasGemmStridedBatchedEx)),
              "cublasGemmStridedBatchedEx");
static_assert(sizeof(static_cast<decltype(blas.gemm_ptrs_ex)>(&cublasGemmBatchedEx)),
              "cublasGemmBatchedEx");

/* Under contexts_lock. */
static mg_status load_cublas(void)
{
    static const char *const names[] = {"libcublas.so." STR(CUBLAS_VER_MAJOR), "libcublas.so"};
    if (blas.sgemm_strided) return MG_OK;
    void *h = NULL;
    for (int i = 0; i < 2 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return mg_error(MG_EUNSUPPORTED, "cannot load cuBLAS (%s): %s; install the CUDA "
                        "toolkit's libraries (or put them on LD_LIBRARY_PATH), or use --device "
                        "cpu", names[0], dlerror());
    *(void **)&blas.create = dlsym(h, "cublasCreate_v2");
    *(void **)&blas.set_stream = dlsym(h, "cublasSetStream_v2");
    *(void **)&blas.set_math = dlsym(h, "cublasSetMathMode");
    *(void **)&blas.sgemm = dlsym(h, "cublasSgemm_v2");
    *(void **)&blas.sgemm_strided = dlsym(h, "cublasSgemmStridedBatched");
    *(void **)&blas.gemm_strided_ex = dlsym(h, "cublasGemmStridedBatchedEx");
    *(void **)&blas.sgemm_ptrs = dlsym(h, "cublasSgemmBatched");
    *(void **)&blas.gemm_ptrs_ex = dlsym(h, "cublasGemmBatchedEx");
    if (!blas.create || !blas.set_stream || !blas.set_math || !blas.sgemm ||
        !blas.gemm_strided_ex || !blas.sgemm_strided || !blas.sgemm_ptrs || !blas.gemm_ptrs_ex) {
        blas.sgemm_strided = NULL;
        return mg_error(MG_EUNSUPPORTED, "%s lacks the functions multigrad calls; install "
                        "cuBLAS %d or newer, or use --device cpu", names[0], CUBLAS_VER_MAJOR);
    }
    return MG_OK;
}
#endif

mg_status mg__dk_get(mg_device d, mg_dk **out)
{
    *out = NULL;
    if (d.kind == MG_DEVICE_CPU) return MG_OK;
    int slot = d.kind == MG_DEVICE_EMU ? 0 : 1 + d.index;
    if (d.kind == MG_DEVICE_CUDA && (d.index < 0 || d.index >= MAX_GPUS))
        return mg_error(MG_EINVAL, "cuda:%d: at most %d GPUs are supported", d.index, MAX_GPUS);
    pthread_mutex_lock(&contexts_lock);
    mg_dk *k = &contexts[slot];
    mg_status st = MG_OK;
    if (!ready[slot]) {
        memset(k, 0, sizeof *k);
        k->dev = d;
        k->emu = d.kind == MG_DEVICE_EMU;
        if (!k->emu) {
            st = mg_device_check(d);
#ifdef __CUDACC__
            if (!st) st = load_cublas();
            cudaError_t e = st ? cudaSuccess : cudaSetDevice(d.index);
            if (e == cudaSuccess && !st) e = cudaStreamCreate(&k->stream);
            if (e == cudaSuccess && !st)
                e = cudaStreamCreateWithFlags(&k->copy, cudaStreamNonBlocking);
            if (e != cudaSuccess)
                st = mg_error(MG_EIO, "cuda:%d: cannot set up a stream: %s", d.index,
                              cudaGetErrorString(e));
            if (!st && blas.create(&k->blas) != CUBLAS_STATUS_SUCCESS)
                st = mg_error(MG_EIO, "cuda:%d: cannot set up cuBLAS", d.index);
            if (!st) {
                blas.set_stream(k->blas, k->stream);
                /* No TF32: float GEMMs round as the CPU's. */
                blas.set_math(k->blas, CUBLAS_DEFAULT_MATH);
            }
#else
            if (!st)
                st = mg_error(MG_EUNSUPPORTED, "cuda:%d: this build's kernels run on the host "
                              "only (a sanitizer build, or no nvcc); build with make and the "
                              "CUDA toolkit, or use --device cpu", d.index);
#endif
        }
        ready[slot] = !st;
    }
    pthread_mutex_unlock(&contexts_lock);
    if (!st) *out = k;
    return st;
}

mg_device mg__dk_device(const mg_dk *k) { return k ? k->dev : (mg_device){MG_DEVICE_CPU, 0}; }

void mg__dk_set_tf32(mg_dk *k, bool on)
{
#ifdef __CUDACC__
    if (!k->emu)
        ckb(blas.set_math(k->blas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
            "setting the math mode");
#else
    (void)k, (void)on;
#endif
}

void mg__dk_set_bf16(mg_dk *k, bool on) { k->bf16 = on; }

/* The kernels' own memory (device.h's); freed once their queued work is
 * done. Running out in the middle of a step leaves nothing to recover. */
static void *dev_alloc(size_t bytes)
{
    void *p = mg_device_alloc(DK()->dev, bytes);
    if (!p) {
        fprintf(stderr, "multigrad: the device kernels' workspace: %s\n", mg_last_error());
        abort();
    }
    return p;
}

static void dev_free(void *p)
{
    mg_dk_sync();
    mg_device_free(DK()->dev, p);
}

/* The workspace, at least `bytes` (previous contents are not kept). */
void *dk_ws(size_t bytes)
{
    mg_dk *k = DK();
    if (bytes <= k->ws_bytes) return k->ws;
    dev_free(k->ws);
    k->ws_bytes = bytes + bytes / 4 + 4096;
    k->ws = dev_alloc(k->ws_bytes);
    return k->ws;
}

/* n floats of 1. */
static const float *ones(size_t n)
{
    mg_dk *k = DK();
    if (n > k->ones_n) {
        dev_free(k->ones);
        k->ones_n = n + n / 4 + 1024;
        float *o = k->ones = (float *)dev_alloc(k->ones_n * sizeof(float));
        each(k->ones_n, [=] HD(size_t i) { o[i] = 1.0f; });
    }
    return k->ones;
}

void mg_dk_sync(void)
{
#ifdef __CUDACC__
    if (!DK()->emu) ck(cudaStreamSynchronize(DK()->stream), "waiting for the GPU");
#endif
}

void mg_dk_copy_out(void *dst, const void *src, size_t n)
{
    if (!n) return;
#ifdef __CUDACC__
    if (!DK()->emu) {
        ck(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, DK()->stream), "copy to host");
        ck(cudaStreamSynchronize(DK()->stream), "copy to host");
        return;
    }
#endif
    memcpy(dst, src, n);
}

void mg_dk_copy_in(void *dst, const void *src, size_t n)
{
    if (!n) return;
#ifdef __CUDACC__
    if (!DK()->emu) {
        /* From pageable memory the runtime stages the bytes before it
         * returns: src may change then, and the GPU need not have caught up. */
        ck(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, DK()->stream), "copy to GPU");
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* ---- Feeds: inputs copied in beside the kernels ------------------------------ */

struct mg_dk_feed {
    size_t cap;
    void *dev[2];          /* the device copies, in turn */
    int next;
#ifdef __CUDACC__
    void *host;            /* page-locked: the copy engine reads it */
    cudaEvent_t copied;    /* the last copy is done (host may change) */
    cudaEvent_t ready[2];  /* dev[b]'s readers are done */
#endif
};

mg_dk_feed *mg_dk_feed_create(size_t bytes)
{
    mg_dk *k = DK();
    mg_dk_feed *f = (mg_dk_feed *)calloc(1, sizeof *f);
    if (!f) return NULL;
    f->cap = bytes;
    bool ok = (f->dev[0] = mg_device_alloc(k->dev, bytes)) && (f->dev[1] = mg_device_alloc(k->dev, bytes));
#ifdef __CUDACC__
    if (ok && !k->emu) {
        ok = (f->host = mg_device_host_alloc(k->dev, bytes)) != NULL;
        /* Never recorded yet: waiting for them returns at once. */
        if (ok) ck(cudaEventCreateWithFlags(&f->copied, cudaEventDisableTiming), "an event");
        for (int b = 0; ok && b < 2; b++)
            ck(cudaEventCreateWithFlags(&f->ready[b], cudaEventDisableTiming), "an event");
        /* mg_device_alloc zeroed dev[] on the legacy default stream, which
         * the copy stream (non-blocking) does not follow: a first copy
         * could land before the zeros (behind the kernels queued so far)
         * and be wiped. The copy stream waits for them. */
        cudaEvent_t zeroed;
        if (ok) {
            ck(cudaEventCreateWithFlags(&zeroed, cudaEventDisableTiming), "an event");
            ck(cudaEventRecord(zeroed, 0), "marking the zeros");
            ck(cudaStreamWaitEvent(k->copy, zeroed, 0), "ordering a copy");
            cudaEventDestroy(zeroed);
        }
    }
#endif
    if (!ok) {
        mg_dk_feed_destroy(f);
        return NULL;
    }
    return f;
}

void mg_dk_feed_destroy(mg_dk_feed *f)
{
    if (!f) return;
    mg_dk *k = DK();
    mg_dk_sync();
#ifdef __CUDACC__
    if (f->host) {
        ck(cudaStreamSynchronize(k->copy), "waiting for a copy");
        cudaEventDestroy(f->copied);
        for (int b = 0; b < 2; b++) cudaEventDestroy(f->ready[b]);
        mg_device_host_free(k->dev, f->host);
    }
#endif
    mg_device_free(k->dev, f->dev[0]);
    mg_device_free(k->dev, f->dev[1]);
    free(f);
}

/* On a GPU: src goes to the page-locked buffer (once the last copy has
 * read it), and from there to dev[b] on the copy stream, which first
 * waits until the pass that last used dev[b] (the one before the last
 * feed) is done; the kernels queued from now on wait for the copy. So the
 * copy runs while the GPU still works on what was queued before. */
const void *mg_dk_feed_in(mg_dk_feed *f, const void *src, size_t n)
{
    MG_ASSERT(n <= f->cap);
    int b = f->next;
    f->next ^= 1;
#ifdef __CUDACC__
    mg_dk *k = DK();
    if (!k->emu) {
        ck(cudaStreamWaitEvent(k->copy, f->ready[b], 0), "ordering a copy");
        /* Everything queued so far, the last pass on dev[1 - b] too. */
        ck(cudaEventRecord(f->ready[1 - b], k->stream), "marking the kernels");
        ck(cudaEventSynchronize(f->copied), "waiting for the last copy");
        memcpy(f->host, src, n);
        ck(cudaMemcpyAsync(f->dev[b], f->host, n, cudaMemcpyHostToDevice, k->copy),
           "copy to GPU");
        ck(cudaEventRecord(f->copied, k->copy), "marking a copy");
        ck(cudaStreamWaitEvent(k->stream, f->copied, 0), "waiting for a copy");
        return f->dev[b];
    }
#endif
    memcpy(f->dev[b], src, n);
    return f->dev[b];
}

void mg_dk_zero(void *p, size_t bytes)
{
    if (!bytes) return;
#ifdef __CUDACC__
    if (!DK()->emu) {
        ck(cudaMemsetAsync(p, 0, bytes, DK()->stream), "zeroing");
        return;
    }
#endif
    memset(p, 0, bytes);
}

/* ---- Profile ------------------------------------------------------------------- *
 * MG_DK_PROFILE=1 in the environment: the GPU time of every kernel entry
 * (mg_dk_*, and the GEMMs within each), measured by events on the
 * stream, summed per name and printed to stderr at exit. Time the GPU
 * waited for the host within an entry counts too. */
#ifdef __CUDACC__
struct prof_rec {
    const char *name, *in;
    cudaEvent_t a, b;
};
static prof_rec *prof_v;
static size_t prof_n, prof_cap;
static int prof_on = -1;
static __thread const char *prof_outer;

static void prof_report(void)
{
    cudaDeviceSynchronize();
    struct row { const char *name, *in; double ms; long calls; } *r =
        (row *)calloc(prof_n + 1, sizeof *r);
    size_t nr = 0;
    double all = 0;
    for (size_t i = 0; r && i < prof_n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, prof_v[i].a, prof_v[i].b) != cudaSuccess) continue;
        size_t j = 0;
        while (j < nr && !(r[j].name == prof_v[i].name && r[j].in == prof_v[i].in)) j++;
        if (j == nr) r[nr++] = (row){prof_v[i].name, prof_v[i].in, 0, 0};
        r[j].ms += ms;
        r[j].calls++;
        if (!prof_v[i].in) all += ms;
    }
    for (size_t i = 0; i < nr; i++)   /* by time, largest first */
        for (size_t j = i + 1; j < nr; j++)
            if (r[j].ms > r[i].ms) {
                row t = r[i];
                r[i] = r[j];
                r[j] = t;
            }
    fprintf(stderr, "# device profile: %.1f ms in kernel entries\n", all);
    for (size_t i = 0; i < nr; i++)
        fprintf(stderr, "#   %9.2f ms %5.1f%% %7ld  %s%s%s\n", r[i].ms,
                all > 0 ? 100 * r[i].ms / all : 0, r[i].calls, r[i].name, r[i].in ? " in " : "",
                r[i].in ? r[i].in : "");
    free(r);
}

prof_scope::prof_scope(const char *name) : rec(0), was(prof_outer)
{
    if (prof_on < 0) {
        prof_on = mg_env_long("MG_DK_PROFILE", 0) != 0;
        if (prof_on) atexit(prof_report);
    }
    if (!prof_on || DK()->emu || prof_n == (1u << 20)) return;
    if (prof_n == prof_cap) {
        size_t cap = prof_cap ? 2 * prof_cap : 4096;
        prof_rec *v = (prof_rec *)realloc(prof_v, cap * sizeof *v);
        if (!v) return;
        prof_v = v;
        prof_cap = cap;
    }
    prof_rec *r = &prof_v[prof_n++];
    rec = prof_n;
    r->name = name;
    r->in = was;
    cudaEventCreate(&r->a);
    cudaEventCreate(&r->b);
    cudaEventRecord(r->a, DK()->stream);
    if (!was) prof_outer = name;
}

prof_scope::~prof_scope()
{
    if (!rec) return;
    cudaEventRecord(prof_v[rec - 1].b, DK()->stream);
    prof_outer = was;
}
#endif


/* emu's bfloat16 operand: a host copy of the n elements at p, each rounded
 * to bfloat16 (to nearest, ties to even) as the GPU's conversion does;
 * NULL when it cannot be had. */
static float *bf16_copy(const float *p, size_t n)
{
    float *c = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; c && i < n; i++) c[i] = mg__bf16_to_f32(mg__f32_to_bf16(p[i]));
    return c;
}

#ifdef __CUDACC__
/* A GPU's bfloat16 operand: the n elements at p rounded to bfloat16 (to
 * nearest, ties to even) into the context's buffer `which`, at the same
 * leading dimension and strides. */
static const void *bf16_dev(int which, const float *p, size_t n)
{
    mg_dk *k = DK();
    if (n > k->bf_n[which]) {
        dev_free(k->bf[which]);
        k->bf_n[which] = n + n / 4 + 1024;
        k->bf[which] = dev_alloc(k->bf_n[which] * sizeof(__nv_bfloat16));
    }
    __nv_bfloat16 *o = (__nv_bfloat16 *)k->bf[which];
    each(n, [=] HD(size_t i) { o[i] = __float2bfloat16_rn(p[i]); });
    return o;
}

/* The addresses of a batch's operands (elements of `size` bytes) in
 * device memory, for cuBLAS's pointer-array GEMMs: A's count, then B's,
 * then C's. Written by a kernel on the stream, so the next batch's
 * addresses are written only after this batch's GEMM has read these. */
static void **operand_ptrs(const void *A, bstride sa, const void *B, bstride sb, void *C,
                           bstride sc, int outer, int inner, size_t size)
{
    mg_dk *k = DK();
    size_t count = (size_t)outer * inner;
    if (3 * count > k->ptrs_n) {
        dev_free(k->ptrs);
        k->ptrs_n = 3 * count + 256;
        k->ptrs = (void **)dev_alloc(k->ptrs_n * sizeof(void *));
    }
    void **p = k->ptrs;
    const char *a = (const char *)A, *b = (const char *)B;
    char *c = (char *)C;
    each(count, [=] HD(size_t i) {
        p[i] = (void *)(a + at(sa, inner, (long long)i) * (long long)size);
        p[count + i] = (void *)(b + at(sb, inner, (long long)i) * (long long)size);
        p[2 * count + i] = c + at(sc, inner, (long long)i) * (long long)sizeof(float);
    });
    return p;
}
#endif

/* Row-major C = alpha op(A) op(B) + beta C for each of a batch of outer x
 * inner (at the strides); with bf16 on, A's and B's elements are rounded
 * to bfloat16 (to nearest, as PyTorch's autocast casts them) and the
 * products summed in float: on a GPU, cuBLAS on bfloat16 matrices with
 * float accumulation (the tensor cores). Not CUBLAS_COMPUTE_32F_FAST_16BF
 * on the float matrices: that lets cuBLAS keep float32 for some shapes
 * and round as it likes for others, so the numbers would depend on the
 * shape and the library. A batch whose strides are one stride is one
 * strided-batched call; others give cuBLAS each GEMM's addresses. */
void dk_gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                         int lda, bstride sa, const float *B, int ldb, bstride sb, float beta,
                         float *C, int ldc, bstride sc, int outer, int inner)
{
    int count = outer * inner;
    if (M <= 0 || N <= 0 || count <= 0) return;
    PROFILE("gemm");
    bool bf16 = DK()->bf16 && K > 0;
    size_t na = bf16 ? span(ta ? K : M, ta ? M : K, lda, sa, outer, inner) : 0;
    size_t nb = bf16 ? span(tb ? N : K, tb ? K : N, ldb, sb, outer, inner) : 0;
    /* Rounded from lo's n elements: A's, and B's too when their spans
     * overlap (attention's Q and K, both in the QKV rows: rounded once);
     * else B's own nb. */
    const float *lo = A;
    size_t n = na;
    bool joint = bf16 && A < B + nb && B < A + na;
    if (joint) {
        lo = A < B ? A : B;
        n = (size_t)((A + na > B + nb ? A + na : B + nb) - lo);
    }
#ifdef __CUDACC__
    if (!DK()->emu) {
        /* One stride: the inner's, or the outer's when inner is 1. */
        bool one = outer == 1 || inner == 1 ||
                   (sa.outer == inner * sa.inner && sb.outer == inner * sb.inner &&
                    sc.outer == inner * sc.inner);
        long long ra = inner == 1 ? sa.outer : sa.inner, rb = inner == 1 ? sb.outer : sb.inner;
        long long rc = inner == 1 ? sc.outer : sc.inner;
        /* Column-major cuBLAS computes C^T = op(B)^T op(A)^T. */
        cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasHandle_t h = DK()->blas;
        if (bf16) {
            const __nv_bfloat16 *r = (const __nv_bfloat16 *)bf16_dev(0, lo, n);
            const void *a = r + (A - lo), *b = joint ? r + (B - lo) : bf16_dev(1, B, nb);
            if (one) {
                ckb(blas.gemm_strided_ex(h, ob, oa, N, M, K, &alpha, b, CUDA_R_16BF, ldb, rb, a,
                                         CUDA_R_16BF, lda, ra, &beta, C, CUDA_R_32F, ldc, rc,
                                         count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "gemm (bfloat16)");
            } else {
                void **p = operand_ptrs(a, sa, b, sb, C, sc, outer, inner, 2);
                ckb(blas.gemm_ptrs_ex(h, ob, oa, N, M, K, &alpha, p + count, CUDA_R_16BF, ldb, p,
                                      CUDA_R_16BF, lda, &beta, p + 2 * count, CUDA_R_32F, ldc,
                                      count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "batched gemm (bfloat16)");
            }
        } else if (count == 1) {
            ckb(blas.sgemm(h, ob, oa, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc), "sgemm");
        } else if (one) {
            ckb(blas.sgemm_strided(h, ob, oa, N, M, K, &alpha, B, ldb, rb, A, lda, ra, &beta, C,
                                   ldc, rc, count),
                "batched sgemm");
        } else {
            void **p = operand_ptrs(A, sa, B, sb, C, sc, outer, inner, sizeof(float));
            ckb(blas.sgemm_ptrs(h, ob, oa, N, M, K, &alpha, (const float *const *)(p + count),
                                ldb, (const float *const *)p, lda, &beta,
                                (float *const *)(p + 2 * count), ldc, count),
                "batched sgemm");
        }
        return;
    }
#endif
    float *ra = NULL, *rb = NULL;
    if (bf16) {
        ra = bf16_copy(lo, n);
        rb = joint ? NULL : bf16_copy(B, nb);
        if (!ra || (!joint && !rb)) {
            fprintf(stderr, "multigrad: emu: out of memory for a bfloat16 GEMM's operands\n");
            abort();
        }
        B = joint ? ra + (B - lo) : rb;
        A = ra + (A - lo);
    }
    for (int i = 0; i < count; i++)
        mg__gemm_host(ta, tb, M, N, K, alpha, A + at(sa, inner, i), lda, B + at(sb, inner, i), ldb,
                      beta, C + at(sc, inner, i), ldc);
    free(ra);
    free(rb);
}

static const bstride one_matrix = {0, 0};

extern "C" void mg_dk_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    dk_gemm_batched(ta, tb, M, N, K, alpha, A, lda, one_matrix, B, ldb, one_matrix, beta, C, ldc,
                 one_matrix, 1, 1);
}

/* ---- Elementwise and dense ---------------------------------------------------- */

extern "C" void mg_dk_relu_forward(float *y, const float *x, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; });
}

extern "C" void mg_dk_relu_backward(float *dx, const float *dy, const float *y, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; });
}

extern "C" void mg_dk_add_into(float *y, const float *a, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { y[i] += a[i]; });
}

extern "C" void mg_dk_mul(float *y, const float *a, const float *b, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { y[i] = a[i] * b[i]; });
}

extern "C" void mg_dk_copy_floats(float *y, const float *x, size_t n)
{
    PROFILE(__func__);
    if (!n) return;
#ifdef __CUDACC__
    if (!DK()->emu) {
        ck(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, DK()->stream),
           "copy within the GPU");
        return;
    }
#endif
    memcpy(y, x, n * sizeof(float));
}

/* ---- Dropout, pooling, batch normalisation ---------------------------------- *
 * The CPU's kernels (src/tensor/dense.c, pool.c, batchnorm.c) element for
 * element: the same mask stream, and each input gradient gathered from the
 * outputs that cover it in the order the CPU adds them, so they agree
 * bit for bit; batch normalisation's sums per channel are a warp's, in
 * double as the CPU's. */

extern "C" void mg_dk_dropout_mask(uint8_t *keep, size_t n, float p, uint64_t seed,
                                   uint64_t counter)
{
    PROFILE(__func__);
    uint32_t thr = (uint32_t)((double)p * 16777216.0);
    /* Word i of the stream from block `counter`: mg_rng's order. */
    each(n, [=] HD(size_t i) {
        uint32_t w[4];
        mg__philox(seed, counter + i / 4, w);
        keep[i] = (w[i % 4] >> 8) >= thr;
    });
}

extern "C" void mg_dk_dropout_apply(float *y, const float *x, const uint8_t *keep, size_t n,
                                    float p)
{
    PROFILE(__func__);
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    each(n, [=] HD(size_t i) { y[i] = keep[i] ? x[i] * scale : 0.0f; });
}

/* The outputs o (of n along an axis, stride s, window k) whose windows
 * hold input i: [*o0, *o1]. */
static HD inline void covering(int i, int k, int s, int n, int *o0, int *o1)
{
    *o0 = i < k ? 0 : (i - k) / s + 1;
    *o1 = i / s < n - 1 ? i / s : n - 1;
}

/* Input element e of planes h x w pooled to oh x ow: its plane's outputs
 * start at *out (of the plane p it returns), the covering ones are rows
 * r[0..1] and columns r[2..3], and it is at *at within its plane. */
static HD inline size_t pooled_by(size_t e, int h, int w, int k, int s, int oh, int ow, int r[4],
                                  int *at)
{
    int iy = (int)(e / w % h), ix = (int)(e % w);
    covering(iy, k, s, oh, &r[0], &r[1]);
    covering(ix, k, s, ow, &r[2], &r[3]);
    *at = iy * w + ix;
    return e / ((size_t)h * w) * oh * ow;
}

extern "C" void mg_dk_avgpool2d_forward(float *y, const float *x, int nc, int h, int w, int k,
                                        int s)
{
    PROFILE(__func__);
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    each((size_t)nc * oh * ow, [=] HD(size_t q) {
        y[q] = mg__pool_mean(x + q / ((size_t)oh * ow) * h * w, w, k, s, (int)(q / ow % oh),
                             (int)(q % ow));
    });
}

extern "C" void mg_dk_avgpool2d_backward(float *dx, const float *dy, int nc, int h, int w, int k,
                                         int s)
{
    PROFILE(__func__);
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    float inv = 1.0f / (float)(k * k);
    each((size_t)nc * h * w, [=] HD(size_t e) {
        int r[4], at;
        const float *gp = dy + pooled_by(e, h, w, k, s, oh, ow, r, &at);
        float acc = 0.0f;
        for (int oy = r[0]; oy <= r[1]; oy++)
            for (int ox = r[2]; ox <= r[3]; ox++) acc += gp[oy * ow + ox] * inv;
        dx[e] = acc;
    });
}

extern "C" void mg_dk_maxpool2d_forward(float *y, int32_t *arg, const float *x, int nc, int h,
                                        int w, int k, int s)
{
    PROFILE(__func__);
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    each((size_t)nc * oh * ow, [=] HD(size_t q) {
        y[q] = mg__pool_max(x + q / ((size_t)oh * ow) * h * w, w, k, s, (int)(q / ow % oh),
                            (int)(q % ow), &arg[q]);
    });
}

extern "C" void mg_dk_maxpool2d_backward(float *dx, const float *dy, const int32_t *arg, int nc,
                                         int h, int w, int k, int s)
{
    PROFILE(__func__);
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    each((size_t)nc * h * w, [=] HD(size_t e) {
        int r[4], at;
        size_t o = pooled_by(e, h, w, k, s, oh, ow, r, &at);
        const float *gp = dy + o;
        const int32_t *ap = arg + o;
        float acc = 0.0f;
        for (int oy = r[0]; oy <= r[1]; oy++)
            for (int ox = r[2]; ox <= r[3]; ox++)
                if (ap[oy * ow + ox] == at) acc += gp[oy * ow + ox];
        dx[e] = acc;
    });
}

extern "C" void mg_dk_batchnorm2d_forward(float *y, float *mean, float *invstd, const float *x,
                                          const float *gamma, const float *beta,
                                          float *run_mean, float *run_var, int n, int c, int hw,
                                          float eps, float momentum, bool training)
{
    PROFILE(__func__);
    size_t m = (size_t)n * hw;
    rows((size_t)c, [=] HD(size_t ch, int lane, int lanes) {
        /* Element j of the channel: image j / hw, position j % hw. */
#define MG__AT(j) (((j) / hw * (size_t)c + ch) * hw + (j) % hw)
        float mu, is;
        if (training) {
            double sum = 0.0, s2 = 0.0;
            for (size_t j = lane; j < m; j += lanes) sum += x[MG__AT(j)];
            sum = lane_sum_d(sum);
            double dm = m ? sum / (double)m : 0.0;
            for (size_t j = lane; j < m; j += lanes) {
                double d = x[MG__AT(j)] - dm;
                s2 += d * d;
            }
            s2 = lane_sum_d(s2);
            double var = m ? s2 / (double)m : 0.0;
            double unbiased = m > 1 ? s2 / (double)(m - 1) : var;
            mu = (float)dm;
            is = (float)(1.0 / sqrt(var + eps));
            if (run_mean && lane == 0) {
                run_mean[ch] = (1.0f - momentum) * run_mean[ch] + momentum * (float)dm;
                run_var[ch] = (1.0f - momentum) * run_var[ch] + momentum * (float)unbiased;
            }
        } else {
            mu = run_mean[ch];
            is = (float)(1.0 / sqrt((double)run_var[ch] + eps));
        }
        if (lane == 0) {
            mean[ch] = mu;
            invstd[ch] = is;
        }
        float a = gamma[ch] * is, b = beta[ch] - mu * a;
        for (size_t j = lane; j < m; j += lanes) y[MG__AT(j)] = x[MG__AT(j)] * a + b;
    });
}

extern "C" void mg_dk_batchnorm2d_backward(float *dx, float *dgamma, float *dbeta,
                                           const float *dy, const float *x, const float *mean,
                                           const float *invstd, const float *gamma, int n, int c,
                                           int hw, bool training)
{
    PROFILE(__func__);
    size_t m = (size_t)n * hw;
    rows((size_t)c, [=] HD(size_t ch, int lane, int lanes) {
        float mu = mean[ch], is = invstd[ch];
        double sdy = 0.0, sdyx = 0.0;
        for (size_t j = lane; j < m; j += lanes) {
            float g = dy[MG__AT(j)];
            sdy += g;
            sdyx += (double)g * ((x[MG__AT(j)] - mu) * is);
        }
        sdy = lane_sum_d(sdy);
        sdyx = lane_sum_d(sdyx);
        if (lane == 0) {
            dgamma[ch] += (float)sdyx;
            dbeta[ch] += (float)sdy;
        }
        if (!dx) return;
        float a = gamma[ch] * is;
        float c0 = mg__bn_mean(training, m, sdy), c1 = mg__bn_mean(training, m, sdyx);
        for (size_t j = lane; j < m; j += lanes)
            dx[MG__AT(j)] = mg__bn_dx(a, dy[MG__AT(j)], c0, x[MG__AT(j)], mu, is, c1);
#undef MG__AT
    });
}

extern "C" void mg_dk_linear_forward(float *y, const float *x, const float *wt, const float *b,
                                     int n, int in, int out, bool relu)
{
    PROFILE(__func__);
    mg_dk_gemm(false, true, n, out, in, 1.0f, x, in, wt, in, 0.0f, y, out);
    mg_dk_bias_relu(y, b, n, out, relu);
}

extern "C" void mg_dk_bias_relu(float *y, const float *b, int n, int out, bool relu)
{
    PROFILE(__func__);
    if (!b && !relu) return;
    /* a warp per row: no division per element */
    rows((size_t)n, [=] HD(size_t r, int lane, int nl) {
        float *yr = y + r * out;
        for (int j = lane; j < out; j += nl) {
            float v = yr[j] + (b ? b[j] : 0.0f);
            yr[j] = relu ? (v > 0.0f ? v : 0.0f) : v;
        }
    });
}

extern "C" void mg_dk_bias_relu_backward(float *dy, float *db, const float *y, int n, int out,
                                         bool relu)
{
    PROFILE(__func__);
    if (relu) each((size_t)n * out, [=] HD(size_t i) { dy[i] = y[i] > 0.0f ? dy[i] : 0.0f; });
    /* db += dy^T 1 */
    if (db) mg_dk_gemm(true, false, out, 1, n, 1.0f, dy, out, ones((size_t)n), 1, 1.0f, db, 1);
}

extern "C" void mg_dk_linear_backward(float *dx, float *dw, float *db, float *dy, const float *y,
                                      const float *x, const float *wt, int n, int in, int out,
                                      bool relu)
{
    PROFILE(__func__);
    mg_dk_bias_relu_backward(dy, db, y, n, out, relu);
    mg_dk_gemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (dx) mg_dk_gemm(false, false, n, in, out, 1.0f, dy, out, wt, in, 0.0f, dx, in);
}

/* ---- LayerNorm and GELU --------------------------------------------------------- */

extern "C" void mg_dk_layernorm_forward(float *y, float *mean, float *rstd, const float *x,
                                        const float *w, const float *b, size_t nrows, int d,
                                        float eps)
{
    PROFILE(__func__);
    rows(nrows, [=] HD(size_t r, int lane, int nl) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        float s = 0.0f;
        for (int i = lane; i < d; i += nl) s += xr[i];
        float mu = lane_sum(s) / d, v = 0.0f;
        for (int i = lane; i < d; i += nl) {
            float c = xr[i] - mu;
            v += c * c;
        }
        float rs = 1.0f / sqrtf(lane_sum(v) / d + eps);
        for (int i = lane; i < d; i += nl) yr[i] = (xr[i] - mu) * rs * w[i] + b[i];
        if (lane == 0) {
            mean[r] = mu;
            rstd[r] = rs;
        }
    });
}

extern "C" void mg_dk_layernorm_backward(float *dx, float *dw, float *db, const float *dy,
                                         const float *x, const float *mean, const float *rstd,
                                         const float *w, size_t nrows, int d)
{
    PROFILE(__func__);
    if (!nrows) return;
    /* dw += sum_r dy x-hat, db += sum_r dy: each column's sums over blocks
     * of rows (a thread per column and block, neighbours reading
     * neighbouring columns), then over the blocks, in a fixed order. */
    size_t nb = nrows < 64 ? nrows : 64, per = (nrows + nb - 1) / nb;
    float *part = (float *)dk_ws(2 * nb * d * sizeof(float));
    int D = d;
    each(nb * D, [=] HD(size_t i) {
        size_t blk = i / D, r1 = (blk + 1) * per < nrows ? (blk + 1) * per : nrows;
        int j = (int)(i % D);
        float sw = 0.0f, sb = 0.0f;
        for (size_t r = blk * per; r < r1; r++) {
            float g = dy[r * D + j];
            sw += g * ((x[r * D + j] - mean[r]) * rstd[r]);
            sb += g;
        }
        part[i] = sw;
        part[nb * D + i] = sb;
    });
    each((size_t)D, [=] HD(size_t j) {
        float sw = 0.0f, sb = 0.0f;
        for (size_t blk = 0; blk < nb; blk++) {
            sw += part[blk * D + j];
            sb += part[nb * D + blk * D + j];
        }
        dw[j] += sw;
        db[j] += sb;
    });
    if (!dx) return;
    rows(nrows, [=] HD(size_t r, int lane, int nl) {
        const float *xr = x + r * d, *gr = dy + r * d;
        float mu = mean[r], rs = rstd[r], s1 = 0.0f, s2 = 0.0f;
        for (int i = lane; i < d; i += nl) {
            float xh = (xr[i] - mu) * rs, g = gr[i] * w[i];
            s1 += g;
            s2 += g * xh;
        }
        float m1 = lane_sum(s1) / d, m2 = lane_sum(s2) / d;
        float *dr = dx + r * d;
        for (int i = lane; i < d; i += nl) {
            float xh = (xr[i] - mu) * rs;
            dr[i] = rs * (gr[i] * w[i] - m1 - xh * m2);
        }
    });
}


extern "C" void mg_dk_gelu_forward(float *y, const float *x, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { y[i] = x[i] * mg__gelu_s(x[i]); });
}

extern "C" void mg_dk_gelu_backward(float *dx, const float *dy, const float *x, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { dx[i] = dy[i] * mg__gelu_deriv(x[i], mg__gelu_s(x[i])); });
}

extern "C" void mg_dk_gelu_forward_deriv(float *y, float *dydx, const float *x, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) {
        float v = x[i], s = mg__gelu_s(v);
        y[i] = v * s;
        dydx[i] = mg__gelu_deriv(v, s);
    });
}

/* ---- Convolution with the fused ReLU and 2x2 pool ------------------------------------ */

/* All n images' columns side by side: col [c kh kw, N], N = n oh ow (the
 * column of image b, output (oy, ox) is b oh ow + oy ow + ox); the
 * pre-pool map Z = W col [oc, N] is one GEMM. The forward keeps a byte per
 * pooled output: bit k set when element k of its 2x2 window (row-major)
 * gets gradient (the ReLU was active for avg; the first maximum, when
 * not cut by the ReLU, for max), as the CPU's masks say. */
extern "C" size_t mg_dk_conv2d_saved_bytes(const mg_conv2d_shape *s)
{
    return s->pool == MG_POOL_NONE ? 0 : (size_t)s->oc * s->ph * s->pw;
}

extern "C" size_t mg_dk_conv2d_workspace(const mg_conv2d_shape *s, int n)
{
    size_t N = (size_t)n * s->oh * s->ow, K = (size_t)s->c * s->kh * s->kw;
    return 2 * K * N + (size_t)s->oc * N;
}

static void im2col_all(float *col, const float *x, const mg_conv2d_shape *sh, int n)
{
    mg_conv2d_shape s = *sh;
    size_t P = (size_t)s.oh * s.ow, N = (size_t)n * P, K = (size_t)s.c * s.kh * s.kw;
    each(K * N, [=] HD(size_t i) {
        size_t r = i / N, q = i % N, b = q / P, p = q % P;
        int ci = (int)(r / (s.kh * s.kw)), ki = (int)(r / s.kw % s.kh), kj = (int)(r % s.kw);
        int iy = (int)(p / s.ow) * s.stride - s.pad + ki, ix = (int)(p % s.ow) * s.stride - s.pad + kj;
        bool in = iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
        col[i] = in ? x[(((size_t)b * s.c + ci) * s.h + iy) * s.w + ix] : 0.0f;
    });
}

extern "C" void mg_dk_conv2d_forward(float *y, uint8_t *saved, const float *x, const float *wt,
                                     const float *bias, const mg_conv2d_shape *sh, int n,
                                     float *w)
{
    PROFILE(__func__);
    mg_conv2d_shape s = *sh;
    size_t P = (size_t)s.oh * s.ow, N = (size_t)n * P, K = (size_t)s.c * s.kh * s.kw;
    float *col = w, *Z = w + K * N;
    im2col_all(col, x, sh, n);
    mg_dk_gemm(false, false, s.oc, (int)N, (int)K, 1.0f, wt, (int)K, col, (int)N, 0.0f, Z,
               (int)N);
    if (s.pool == MG_POOL_NONE) {
        each((size_t)n * s.oc * P, [=] HD(size_t i) {   /* y [n, oc, oh, ow] */
            size_t p = i % P, o = i / P % s.oc, b = i / P / s.oc;
            float v = Z[o * N + b * P + p] + bias[o];
            y[i] = s.relu ? (v > 0.0f ? v : 0.0f) : v;
        });
        return;
    }
    size_t Q = (size_t)s.ph * s.pw;
    each((size_t)n * s.oc * Q, [=] HD(size_t i) {   /* y [n, oc, ph, pw] */
        size_t q = i % Q, o = i / Q % s.oc, b = i / Q / s.oc;
        size_t py = q / s.pw, px = q % s.pw;
        const float *z = Z + o * N + b * P + 2 * py * s.ow + 2 * px;
        float v[4] = {z[0] + bias[o], z[1] + bias[o], z[s.ow] + bias[o], z[s.ow + 1] + bias[o]};
        unsigned bits = 0;
        if (s.pool == MG_POOL_AVG) {
            for (int k = 0; k < 4; k++) {
                if (s.relu && !(v[k] > 0.0f)) v[k] = 0.0f;
                else bits |= 1u << k;
            }
            y[i] = ((v[0] + v[1]) + (v[2] + v[3])) * 0.25f;
        } else {
            int k = 0;   /* the first maximum in row-major order */
            for (int j = 1; j < 4; j++)
                if (v[j] > v[k]) k = j;
            bool cut = s.relu && !(v[k] > 0.0f);
            y[i] = cut ? 0.0f : v[k];
            bits = cut ? 0u : 1u << k;
        }
        saved[i] = (uint8_t)bits;
    });
}

extern "C" void mg_dk_conv2d_backward(float *dx, float *dw, float *db, const float *dy,
                                      const float *y, const uint8_t *saved, const float *x,
                                      const float *wt, const mg_conv2d_shape *sh, int n,
                                      float *w)
{
    PROFILE(__func__);
    mg_conv2d_shape s = *sh;
    size_t P = (size_t)s.oh * s.ow, N = (size_t)n * P, K = (size_t)s.c * s.kh * s.kw;
    float *col = w, *dz = w + K * N, *dcol = dz + (size_t)s.oc * N;
    /* dz [oc, N]: the gradient before the pool and the ReLU. */
    each((size_t)s.oc * N, [=] HD(size_t i) {
        size_t o = i / N, b = i % N / P, p = i % P, oy = p / s.ow, ox = p % s.ow;
        if (s.pool == MG_POOL_NONE) {
            size_t j = (b * s.oc + o) * P + p;
            dz[i] = s.relu && !(y[j] > 0.0f) ? 0.0f : dy[j];
            return;
        }
        size_t py = oy / 2, px = ox / 2;
        if (py >= (size_t)s.ph || px >= (size_t)s.pw) {   /* the floor mode's dropped edge */
            dz[i] = 0.0f;
            return;
        }
        size_t j = ((b * s.oc + o) * s.ph + py) * s.pw + px;
        int k = (int)(oy % 2) * 2 + (int)(ox % 2);
        float g = dy[j] * (s.pool == MG_POOL_AVG ? 0.25f : 1.0f);
        dz[i] = saved[j] >> k & 1 ? g : 0.0f;
    });
    /* db += dz 1, dw += dz col^T */
    mg_dk_gemm(false, false, s.oc, 1, (int)N, 1.0f, dz, (int)N, ones(N), 1, 1.0f, db, 1);
    im2col_all(col, x, sh, n);
    mg_dk_gemm(false, true, s.oc, (int)K, (int)N, 1.0f, dz, (int)N, col, (int)N, 1.0f, dw,
               (int)K);
    if (!dx) return;
    /* dcol = W^T dz, then each input element gathers its columns. */
    mg_dk_gemm(true, false, (int)K, (int)N, s.oc, 1.0f, wt, (int)K, dz, (int)N, 0.0f, dcol,
               (int)N);
    size_t HW = (size_t)s.h * s.w;
    each((size_t)n * s.c * HW, [=] HD(size_t i) {
        size_t b = i / HW / s.c, ci = i / HW % s.c;
        int iy = (int)(i % HW / s.w), ix = (int)(i % s.w);
        float acc = 0.0f;
        for (int ki = 0; ki < s.kh; ki++) {
            int ty = iy + s.pad - ki;
            if (ty < 0 || ty % s.stride || ty / s.stride >= s.oh) continue;
            for (int kj = 0; kj < s.kw; kj++) {
                int tx = ix + s.pad - kj;
                if (tx < 0 || tx % s.stride || tx / s.stride >= s.ow) continue;
                size_t r = (ci * s.kh + ki) * s.kw + kj;
                acc += dcol[r * N + b * P + (size_t)(ty / s.stride) * s.ow + tx / s.stride];
            }
        }
        dx[i] = acc;
    });
}

/* ---- Embedding ---------------------------------------------------------------------- */

/* wte holds the rows of tokens [lo, lo + vocab): other tokens add 0, as
 * a NULL wpe does (the CPU's kernel, src/tensor/seq.c). */
extern "C" void mg_dk_embedding_forward(float *y, const int32_t *tok, const float *wte, int lo,
                                        int vocab, const float *wpe, int n, int T, int d)
{
    PROFILE(__func__);
    size_t D = (size_t)d;
    each((size_t)n * T * d, [=] HD(size_t i) {
        size_t p = i / D, j = i % D, t = p % T;
        int k = tok[p] - lo;
        float a = k >= 0 && k < vocab ? wte[(size_t)k * D + j] : 0.0f;
        y[i] = wpe ? a + wpe[t * D + j] : a;
    });
}

/* gpe[t] += the sequences' dy at t; gte += onehot(tokens - lo)^T dy, a
 * GEMM over chunks of positions (the one-hot matrix at most 16M floats). */
extern "C" void mg_dk_embedding_backward(float *gte, float *gpe, const float *dy,
                                         const int32_t *tok, int lo, int vocab, int n, int T,
                                         int d)
{
    PROFILE(__func__);
    size_t D = (size_t)d, N = (size_t)n * T, TD = (size_t)T * D;
    each(TD, [=] HD(size_t k) {
        float s = 0.0f;
        for (int b = 0; b < n; b++) s += dy[b * TD + k];
        gpe[k] += s;
    });
    size_t chunk = ((size_t)16 << 20) / (size_t)vocab;
    if (chunk < 1) chunk = 1;
    if (chunk > N) chunk = N;
    for (size_t p0 = 0; p0 < N; p0 += chunk) {
        size_t c = N - p0 < chunk ? N - p0 : chunk;
        float *oh = (float *)dk_ws((size_t)vocab * c * sizeof(float));
        each((size_t)vocab * c, [=] HD(size_t i) {
            size_t v = i / c, p = i % c;
            oh[i] = tok[p0 + p] - lo == (int32_t)v ? 1.0f : 0.0f;
        });
        mg_dk_gemm(false, false, vocab, d, (int)c, 1.0f, oh, (int)c, dy + p0 * D, d, 1.0f, gte, d);
    }
}

/* ---- Loss ----------------------------------------------------------------------------- */

extern "C" float mg_dk_softmax_xent(const float *logits, const int32_t *labels, int n,
                                    int classes, float *dlogits, int *correct)
{
    PROFILE(__func__);
    if (n <= 0) {
        if (correct) *correct = 0;
        return 0.0f;
    }
    float *part = (float *)dk_ws(2 * (size_t)n * sizeof(float));
    float inv_n = 1.0f / (float)n;
    int C = classes;
    rows((size_t)n, [=] HD(size_t r, int lane, int nl) {
        const float *z = logits + r * C;
        int y = labels[r];
        float mx = -INFINITY;
        int arg = INT_MAX;
        for (int j = lane; j < C; j += nl)
            if (arg == INT_MAX || z[j] > mx) {
                mx = z[j];
                arg = j;
            }
        float gmx = lane_max(mx);
        int garg = lane_min(mx == gmx ? arg : INT_MAX);
        float sum = 0.0f;
        for (int j = lane; j < C; j += nl) sum += expf(z[j] - gmx);
        sum = lane_sum(sum);
        bool ok = y >= 0 && y < C;
        if (lane == 0) {
            part[2 * r] = ok ? (gmx - z[y]) + logf(sum) : NAN;
            part[2 * r + 1] = garg == y ? 1.0f : 0.0f;
        }
        if (dlogits) {
            float inv = 1.0f / sum, *g = dlogits + r * C;
            for (int j = lane; j < C; j += nl) {
                float v = expf(z[j] - gmx) * inv * inv_n;
                g[j] = j == y ? v - inv_n : v;
            }
        }
    });
    float *h = (float *)malloc(2 * (size_t)n * sizeof(float));
    MG_ASSERT(h);
    mg_dk_copy_out(h, part, 2 * (size_t)n * sizeof(float));
    double total = 0.0;
    int hits = 0;
    for (int i = 0; i < n; i++) {
        total += (double)h[2 * i];
        hits += h[2 * i + 1] != 0.0f;
    }
    free(h);
    if (correct) *correct = hits;
    return (float)(total / n);
}

/* Split over the vocabulary (nn/tensor_parallel.c): the rows' maxima; the
 * sums of exp(z - max), the label's logit (if in these columns) and
 * -(the first column holding the maximum); the gradient. */
extern "C" void mg_dk_xent_max(float *mx, const float *logits, int n, int classes)
{
    PROFILE(__func__);
    int C = classes;
    rows((size_t)n, [=] HD(size_t r, int lane, int nl) {
        const float *z = logits + r * C;
        float m = -INFINITY;
        for (int j = lane; j < C; j += nl) m = fmaxf(m, z[j]);
        m = lane_max(m);
        if (lane == 0) mx[r] = m;
    });
}

extern "C" void mg_dk_xent_sums(float *sum, float *zy, float *arg, const float *logits,
                                const int32_t *labels, const float *mx, int n, int classes,
                                int lo)
{
    PROFILE(__func__);
    int C = classes;
    rows((size_t)n, [=] HD(size_t r, int lane, int nl) {
        const float *z = logits + r * C;
        float s = 0.0f;
        int first = INT_MAX;
        for (int j = lane; j < C; j += nl) {
            s += expf(z[j] - mx[r]);
            if (z[j] == mx[r] && j < first) first = j;
        }
        s = lane_sum(s);
        first = lane_min(first);
        if (lane) return;
        int y = labels[r] - lo;
        sum[r] = s;
        zy[r] = y >= 0 && y < C ? z[y] : 0.0f;
        arg[r] = first == INT_MAX ? -INFINITY : -(float)(lo + first);
    });
}

extern "C" void mg_dk_xent_grad(float *dlogits, const float *logits, const int32_t *labels,
                                const float *mx, const float *sum, int n, int classes, int lo)
{
    PROFILE(__func__);
    int C = classes;
    float inv_n = n > 0 ? 1.0f / (float)n : 0.0f;
    rows((size_t)n, [=] HD(size_t r, int lane, int nl) {
        const float *z = logits + r * C;
        float *g = dlogits + r * C, inv = 1.0f / sum[r];
        int y = labels[r] - lo;
        for (int j = lane; j < C; j += nl) {
            float v = expf(z[j] - mx[r]) * inv * inv_n;
            g[j] = j == y ? v - inv_n : v;
        }
    });
}

/* ---- Optimizers and clipping -------------------------------------------------------------- */

/* Two passes: 2^18 lanes each sum every 2^18-th square (enough loads in
 * flight to stream the gradients at the memory's speed), then 1024 lanes
 * each sum every 1024-th of those; the host adds the 1024 in order. */
static const size_t SUMSQ_LANES = (size_t)1 << 18, SUMSQ_OUT = 1024;

extern "C" double mg_dk_sumsq(const float *g, size_t n)
{
    PROFILE(__func__);
    if (!n) return 0.0;
    size_t L = n < SUMSQ_LANES ? n : SUMSQ_LANES, O = L < SUMSQ_OUT ? L : SUMSQ_OUT;
    double *part = (double *)dk_ws((L + O) * sizeof(double)), *out = part + L;
    each(L, [=] HD(size_t p) {
        double s = 0.0;
        for (size_t i = p; i < n; i += L) s += (double)g[i] * g[i];
        part[p] = s;
    });
    each(O, [=] HD(size_t p) {
        double s = 0.0;
        for (size_t i = p; i < L; i += O) s += part[i];
        out[p] = s;
    });
    double h[SUMSQ_OUT], s = 0.0;
    mg_dk_copy_out(h, out, O * sizeof(double));
    for (size_t p = 0; p < O; p++) s += h[p];
    return s;
}

extern "C" void mg_dk_scale(float *g, size_t n, float s)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { g[i] *= s; });
}

extern "C" void mg_dk_adam_update(float *p, const float *g, float *m, float *v, size_t n,
                                  const mg__adam_coef *c)
{
    PROFILE(__func__);
    const float b1 = c->beta1, omb1 = c->one_minus_beta1, b2 = c->beta2,
                omb2 = c->one_minus_beta2, eps = c->eps, nss = c->neg_step_size,
                bc2s = c->bc2_sqrt, wd = c->wd, decay = c->decay;
    each(n, [=] HD(size_t i) {
        mg__adam_elem(p, g, m, v, i, b1, omb1, b2, omb2, eps, nss, bc2s, wd, decay);
    });
}

extern "C" void mg_dk_sgd_update(float *p, const float *g, float *buf, size_t n,
                                 const mg__sgd_coef *c)
{
    PROFILE(__func__);
    const float neg_lr = c->neg_lr, wd = c->wd, mu = c->mu, omd = c->one_minus_damp;
    const bool nesterov = c->nesterov, first = c->first;
    if (mu == 0.0f) {
        each(n, [=] HD(size_t i) {
            float d = wd == 0.0f ? g[i] : g[i] + wd * p[i];
            p[i] = p[i] + neg_lr * d;
        });
        return;
    }
    each(n, [=] HD(size_t i) {
        float d = wd == 0.0f ? g[i] : g[i] + wd * p[i];
        float b = first ? d : (wd == 0.0f && omd == 1.0f && !nesterov) ? buf[i] * mu + g[i]
                                                                         : buf[i] * mu + omd * d;
        buf[i] = b;
        p[i] = p[i] + neg_lr * (nesterov ? d + mu * b : b);
    });
}

/* ---- MG_AVG after NCCL's sum (comm/nccl.c) -------------------------------- */

#ifdef __CUDACC__
#include <cuda_fp16.h>

/* x / by as comm/coll/reduce.c divides x: true division for floats (f16
 * and bf16 through float, rounded to nearest even once), C's truncating
 * division for integers. */
template <typename T> struct avg_div {
    static __device__ T go(T x, int by) { return (T)(x / (T)by); }
};
template <> struct avg_div<uint8_t> {
    static __device__ uint8_t go(uint8_t x, int by) { return (uint8_t)(x / (unsigned)by); }
};
template <> struct avg_div<__half> {
    static __device__ __half go(__half x, int by)
    {
        return __float2half_rn(__half2float(x) / (float)by);
    }
};
template <> struct avg_div<__nv_bfloat16> {
    static __device__ __nv_bfloat16 go(__nv_bfloat16 x, int by)
    {
        return __float2bfloat16_rn(__bfloat162float(x) / (float)by);
    }
};

template <typename T> static int avg_div_on(void *p, size_t n, int by, cudaStream_t s)
{
    T *q = (T *)p;
    return each_on(s, n, [=] __device__(size_t i) { q[i] = avg_div<T>::go(q[i], by); }) ==
                   cudaSuccess
               ? 0
               : -1;
}

extern "C" int mg__dk_divide_async(void *p, size_t n, mg_dtype t, int by, void *stream)
{
    if (!n) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    switch (t) {
    case MG_F32: return avg_div_on<float>(p, n, by, s);
    case MG_F64: return avg_div_on<double>(p, n, by, s);
    case MG_F16: return avg_div_on<__half>(p, n, by, s);
    case MG_BF16: return avg_div_on<__nv_bfloat16>(p, n, by, s);
    case MG_I32: return avg_div_on<int32_t>(p, n, by, s);
    case MG_I64: return avg_div_on<int64_t>(p, n, by, s);
    case MG_U8: return avg_div_on<uint8_t>(p, n, by, s);
    default: return -1;
    }
}
#else
extern "C" int mg__dk_divide_async(void *p, size_t n, mg_dtype t, int by, void *stream)
{
    (void)p, (void)n, (void)t, (void)by, (void)stream;
    return -1;
}
#endif
