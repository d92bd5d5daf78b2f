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
 * This file holds the contexts, memory, feeds, the profile, the GEMMs and
 * NCCL's average division; layers.cu the layers' kernels, loss_optim.cu
 * the loss, clipping and optimizers', attention.cu attention's. */
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

extern "C" void *mg_dk_workspace(size_t bytes) { return dk_ws(bytes); }

const float *dk_ones(size_t n)
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


void dk_bf16_reuse(const float *p, size_t n)
{
    mg_dk *k = DK();
    k->reuse = p;
    k->reuse_n = n;
    k->bf0_of = NULL;   /* p's floats may have changed since bf[0] was made */
}

extern "C" size_t mg__dk_bf16_rounded(void) { return DK()->rounded; }
extern "C" bool mg_dk_gemm_bf16(void) { return DK()->bf16; }

/* The n floats at p rounded to bfloat16 (to nearest, ties to even) into
 * o: on a GPU bfloat16 by a kernel, on emu floats holding the rounded
 * values. */
static void round_into(const float *p, size_t n, void *o)
{
    PROFILE("bf16 rounding");   /* what rounding once per step would save at most */
    mg_dk *k = DK();
    k->rounded += n;
#ifdef __CUDACC__
    if (!k->emu) {
        __nv_bfloat16 *b = (__nv_bfloat16 *)o;
        each(n, [=] HD(size_t i) { b[i] = __float2bfloat16_rn(p[i]); });
        return;
    }
#endif
    float *f = (float *)o;
    for (size_t i = 0; i < n; i++) f[i] = mg__bf16_to_f32(mg__f32_to_bf16(p[i]));
}

/* Bytes of a rounded element: a GPU's bfloat16, emu's float. */
static size_t rounded_size(const mg_dk *k) { return k->emu ? sizeof(float) : 2; }

size_t dk_bf16_bytes(size_t n)
{
    mg_dk *k = DK();
    return k->bf16 ? n * rounded_size(k) : 0;
}

/* *buf holding at least n rounded elements (grown on demand, by a quarter more). */
static void *grown(void **buf, size_t *cap, size_t n)
{
    if (n > *cap) {
        dev_free(*buf);
        *cap = n + n / 4 + 1024;
        *buf = dev_alloc(*cap * rounded_size(DK()));
    }
    return *buf;
}

void dk_bf16_keep(const float *p, size_t n, void *copy, bool round)
{
    mg_dk *k = DK();
    if (!k->bf16 || !p || !n) return;
    MG_ASSERT(k->n_kept < 4);
    if (round) round_into(p, n, copy);
    k->kept[k->n_kept].p = p;
    k->kept[k->n_kept].n = n;
    k->kept[k->n_kept++].copy = copy;
}

void dk_bf16_keep_own(int which, const float *p, size_t n)
{
    mg_dk *k = DK();
    if (k->bf16 && p && n) dk_bf16_keep(p, n, grown(&k->kb[which], &k->kb_n[which], n), true);
}

void dk_bf16_forget(void) { DK()->n_kept = 0; }

/* A GEMM's operand `which`: the n elements at p rounded, at the same
 * leading dimension and strides: from a kept span that holds them
 * (dk_bf16_keep), else into the context's buffer `which`. Operand 0 comes
 * again without rounding while dk_bf16_reuse names p and n. */
static const void *bf16_operand(int which, const float *p, size_t n)
{
    mg_dk *k = DK();
    for (int i = 0; i < k->n_kept; i++)
        if (p >= k->kept[i].p && p + n <= k->kept[i].p + k->kept[i].n)
            return (const char *)k->kept[i].copy + (size_t)(p - k->kept[i].p) * rounded_size(k);
    if (which == 0 && p == k->reuse && n == k->reuse_n && p == k->bf0_of && n == k->bf0_n)
        return k->bf[0];
    void *o = grown(&k->bf[which], &k->bf_n[which], n);
    if (which == 0) k->bf0_of = p, k->bf0_n = n;
    round_into(p, n, o);
    return o;
}

#ifdef __CUDACC__
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
            const __nv_bfloat16 *r = (const __nv_bfloat16 *)bf16_operand(0, lo, n);
            const void *a = r + (A - lo), *b = joint ? r + (B - lo) : bf16_operand(1, B, nb);
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
    if (bf16) {
        const float *r = (const float *)bf16_operand(0, lo, n);
        B = joint ? r + (B - lo) : (const float *)bf16_operand(1, B, nb);
        A = r + (A - lo);
    }
    for (int i = 0; i < count; i++)
        mg__gemm_host(ta, tb, M, N, K, alpha, A + at(sa, inner, i), lda, B + at(sb, inner, i), ldb,
                      beta, C + at(sc, inner, i), ldc);
}

static const bstride one_matrix = {0, 0};

extern "C" void mg_dk_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    dk_gemm_batched(ta, tb, M, N, K, alpha, A, lda, one_matrix, B, ldb, one_matrix, beta, C, ldc,
                 one_matrix, 1, 1);
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
