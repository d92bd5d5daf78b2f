/* Devices (device.h): the CPU, and NVIDIA GPUs through the CUDA runtime
 * when the library is built with the toolkit (MG_HAVE_CUDA). Without a
 * driver or a GPU the runtime's error is kept in words, so that asking
 * for cuda says why it cannot be had instead of failing later. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/core.h"
#include "multigrad/device.h"
#include "device/dk.h"
#include "device/sparse.h"
#ifdef MG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* The CPU's memory serves the CPU and the device kind emu. */
static bool host_mem(mg_device d) { return d.kind != MG_DEVICE_CUDA; }

/* What mg_device_of needs: emu's allocations (host memory, known only by
 * their addresses), and whether a GPU's memory was ever had (until then
 * no pointer is asked about, so a CPU run never starts the CUDA runtime). */
typedef struct { uintptr_t lo, hi; } emu_block;
static pthread_mutex_t emu_mu = PTHREAD_MUTEX_INITIALIZER;
static emu_block *emu_blocks;
static size_t emu_n, emu_cap;
static atomic_int emu_live;
#ifdef MG_HAVE_CUDA
static atomic_int cuda_used;
#endif

static bool emu_add(void *p, size_t bytes)
{
    pthread_mutex_lock(&emu_mu);
    bool ok = emu_n < emu_cap;
    if (!ok) {
        size_t cap = emu_cap ? 2 * emu_cap : 64;
        emu_block *b = realloc(emu_blocks, cap * sizeof *b);
        if (b) {
            emu_blocks = b;
            emu_cap = cap;
            ok = true;
        }
    }
    if (ok) emu_blocks[emu_n++] = (emu_block){(uintptr_t)p, (uintptr_t)p + bytes};
    pthread_mutex_unlock(&emu_mu);
    if (ok) atomic_fetch_add(&emu_live, 1);
    return ok;
}

static void emu_remove(void *p)
{
    pthread_mutex_lock(&emu_mu);
    for (size_t i = 0; i < emu_n; i++)
        if (emu_blocks[i].lo == (uintptr_t)p) {
            emu_blocks[i] = emu_blocks[--emu_n];
            atomic_fetch_sub(&emu_live, 1);
            break;
        }
    pthread_mutex_unlock(&emu_mu);
}

static bool emu_has(const void *p)
{
    if (!atomic_load(&emu_live)) return false;
    bool in = false;
    pthread_mutex_lock(&emu_mu);
    for (size_t i = 0; i < emu_n && !in; i++)
        in = emu_blocks[i].lo <= (uintptr_t)p && (uintptr_t)p < emu_blocks[i].hi;
    pthread_mutex_unlock(&emu_mu);
    return in;
}

mg_status mg_device_parse(const char *s, mg_device *out)
{
    if (s && !strcmp(s, "emu")) {
        *out = (mg_device){MG_DEVICE_EMU, 0};
        return MG_OK;
    }
    if (s && !strcmp(s, "cpu")) {
        *out = (mg_device){MG_DEVICE_CPU, 0};
        return MG_OK;
    }
    if (s && !strcmp(s, "cuda")) {
        *out = (mg_device){MG_DEVICE_CUDA, 0};
        return MG_OK;
    }
    if (s && !strncmp(s, "cuda:", 5)) {
        char *end;
        long i = strtol(s + 5, &end, 10);
        if (s[5] >= '0' && s[5] <= '9' && !*end && i < 1024) {
            *out = (mg_device){MG_DEVICE_CUDA, (int)i};
            return MG_OK;
        }
    }
    return mg_error(MG_EINVAL, "unknown device '%s': give cpu, cuda or cuda:N (N a GPU's "
                    "index, from 0), or emu (the GPU code path run on the CPU)", s ? s : "(null)");
}

void mg_device_format(mg_device d, char *buf, size_t cap)
{
    if (d.kind == MG_DEVICE_CPU) snprintf(buf, cap, "cpu");
    else if (d.kind == MG_DEVICE_EMU) snprintf(buf, cap, "emu");
    else snprintf(buf, cap, "cuda:%d", d.index);
}

bool mg_device_cuda_built(void)
{
#ifdef MG_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

int mg_device_cuda_count(const char **why)
{
#ifdef MG_HAVE_CUDA
    static char reason[256];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver) {
        int rt = 0;
        cudaRuntimeGetVersion(&rt);
        snprintf(reason, sizeof reason, "no NVIDIA driver is installed, or it is older than "
                 "this build's CUDA runtime %d.%d (cudaErrorInsufficientDriver)", rt / 1000,
                 rt % 1000 / 10);
        n = 0;
    } else if (e != cudaSuccess) {
        snprintf(reason, sizeof reason, "the CUDA runtime finds no usable GPU: %s (%s)",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        n = 0;
    } else if (n == 0) {
        snprintf(reason, sizeof reason, "the CUDA driver sees no GPU");
    }
    if (why) *why = n ? NULL : reason;
    return n;
#else
    if (why) *why = "multigrad was built without the CUDA backend (build it where the CUDA "
                    "toolkit is installed, without GPU=0)";
    return 0;
#endif
}

int mg_device_cuda_local(void)
{
    int n = mg_device_cuda_count(NULL);
    long local = mg_env_long("LOCAL_RANK", 0);
    return n > 0 && local > 0 ? (int)(local % n) : 0;
}

mg_status mg_device_check(mg_device d)
{
    if (host_mem(d)) return MG_OK;
    const char *why;
    int n = mg_device_cuda_count(&why);
    if (!n) return mg_error(MG_EUNSUPPORTED, "cuda:%d: %s; use --device cpu", d.index, why);
    if (d.index >= n)
        return mg_error(MG_EINVAL, "cuda:%d: this machine has %d GPU%s (cuda:0%s)", d.index, n,
                        n == 1 ? "" : "s", n == 1 ? "" : " and up");
    return MG_OK;
}

mg_status mg_device_describe(mg_device d, char *name, size_t cap, size_t *memory)
{
    if (host_mem(d)) {
        snprintf(name, cap, "%s%s", d.kind == MG_DEVICE_EMU ? "emulated on " : "", mg_cpu()->model);
        *memory = 0;
        return MG_OK;
    }
    MG_TRY(mg_device_check(d));
#ifdef MG_HAVE_CUDA
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, d.index);
    if (e != cudaSuccess)
        return mg_error(MG_EIO, "cuda:%d: cannot read its properties: %s", d.index,
                        cudaGetErrorString(e));
    snprintf(name, cap, "%s", p.name);
    *memory = p.totalGlobalMem;
#endif
    return MG_OK;
}

#ifdef MG_HAVE_CUDA
/* Makes d the calling thread's current GPU. */
static mg_status use(mg_device d)
{
    cudaError_t e = cudaSetDevice(d.index);
    if (e != cudaSuccess)
        return mg_error(MG_EIO, "cuda:%d: cannot use it: %s", d.index, cudaGetErrorString(e));
    return MG_OK;
}
#endif

void *mg_device_alloc(mg_device d, size_t bytes)
{
    if (host_mem(d)) {
        void *p = mg_alloc_zero(bytes ? bytes : 1);
        if (!p) mg_error(MG_ENOMEM, "cannot allocate %zu bytes", bytes);
        if (p && d.kind == MG_DEVICE_EMU && !emu_add(p, bytes ? bytes : 1)) {
            mg_free(p);
            mg_error(MG_ENOMEM, "emu: out of memory for the list of its allocations");
            return NULL;
        }
        return p;
    }
    if (mg_device_check(d)) return NULL;
#ifdef MG_HAVE_CUDA
    void *p = NULL;
    if (use(d)) return NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaSuccess) e = cudaMemset(p, 0, bytes);
    if (e == cudaSuccess) atomic_store(&cuda_used, 1);
    if (e != cudaSuccess) {
        if (p) cudaFree(p);
        mg_error(MG_ENOMEM, "cuda:%d: cannot allocate %zu bytes: %s", d.index, bytes,
                 cudaGetErrorString(e));
        return NULL;
    }
    return p;
#else
    return NULL;
#endif
}

void *mg_device_alloc_sparse(mg_device d, size_t bytes)
{
    if (d.kind == MG_DEVICE_CPU) {
        mg_error(MG_EINVAL, "mg_device_alloc_sparse is for devices (the CPU's: mg_map_zero)");
        return NULL;
    }
    if (mg_device_check(d)) return NULL;
    bool fallback;
    void *p = mg__sparse_alloc(d, bytes, &fallback);
    if (fallback) {
        mg_debug("%zu bytes of device memory allocated whole: without the driver's virtual "
                 "memory management no part of it can be given back", bytes);
        return mg_device_alloc(d, bytes);
    }
#ifdef MG_HAVE_CUDA
    if (p && d.kind == MG_DEVICE_CUDA) atomic_store(&cuda_used, 1);
#endif
    return p;
}

void mg_device_free(mg_device d, void *p)
{
    if (!p || mg__sparse_free(p)) return;
    if (host_mem(d)) {
        if (d.kind == MG_DEVICE_EMU) emu_remove(p);
        mg_free(p);
        return;
    }
#ifdef MG_HAVE_CUDA
    if (!use(d)) cudaFree(p);
#endif
}

static mg_status copy_plain(mg_device to, void *dst, mg_device from, const void *src, size_t n)
{
    if (host_mem(to) && host_mem(from)) {
        memmove(dst, src, n);
        return MG_OK;
    }
    MG_TRY(mg_device_check(to.kind == MG_DEVICE_CUDA ? to : from));
#ifdef MG_HAVE_CUDA
    enum cudaMemcpyKind k = host_mem(to)     ? cudaMemcpyDeviceToHost
                            : host_mem(from) ? cudaMemcpyHostToDevice
                                                         : cudaMemcpyDeviceToDevice;
    if (to.kind == MG_DEVICE_CUDA && from.kind == MG_DEVICE_CUDA && to.index != from.index) {
        cudaError_t e = cudaMemcpyPeer(dst, to.index, src, from.index, n);
        if (e != cudaSuccess)
            return mg_error(MG_EIO, "copying %zu bytes from cuda:%d to cuda:%d: %s", n,
                            from.index, to.index, cudaGetErrorString(e));
        return MG_OK;
    }
    MG_TRY(use(to.kind == MG_DEVICE_CUDA ? to : from));
    cudaError_t e = cudaMemcpy(dst, src, n, k);
    if (e != cudaSuccess)
        return mg_error(MG_EIO, "copying %zu bytes %s: %s", n,
                        k == cudaMemcpyDeviceToHost   ? "from the GPU to the host"
                        : k == cudaMemcpyHostToDevice ? "from the host to the GPU"
                                                      : "within the GPU",
                        cudaGetErrorString(e));
#endif
    return MG_OK;
}

/* n bytes of d's memory zeroed, complete on return. */
static mg_status zero_now(mg_device d, void *p, size_t n)
{
    if (host_mem(d)) {
        memset(p, 0, n);
        return MG_OK;
    }
#ifdef MG_HAVE_CUDA
    MG_TRY(use(d));
    cudaError_t e = cudaMemset(p, 0, n);
    if (e != cudaSuccess)
        return mg_error(MG_EIO, "cuda:%d: zeroing %zu bytes: %s", d.index, n,
                        cudaGetErrorString(e));
#endif
    return MG_OK;
}

/* What a copy writes of a sparse allocation holds memory first; what it
 * reads of one that was given back reads as zeros. */
mg_status mg_device_copy(mg_device to, void *dst, mg_device from, const void *src, size_t n)
{
    if (!n) return MG_OK;
    if (to.kind != MG_DEVICE_CPU) MG_TRY(mg__sparse_commit(dst, n));
    for (size_t at = 0, run; at < n; at += run) {
        bool held = true;
        run = from.kind == MG_DEVICE_CPU ? n - at : mg__sparse_run((const char *)src + at, n - at,
                                                                   &held);
        MG_TRY(held ? copy_plain(to, (char *)dst + at, from, (const char *)src + at, run)
                    : zero_now(to, (char *)dst + at, run));
    }
    return MG_OK;
}

void *mg_device_host_alloc(mg_device d, size_t bytes)
{
    if (host_mem(d)) {
        void *p = mg_alloc(bytes ? bytes : 1);
        if (!p) mg_error(MG_ENOMEM, "cannot allocate %zu bytes", bytes);
        return p;
    }
    if (mg_device_check(d)) return NULL;
#ifdef MG_HAVE_CUDA
    void *p = NULL;
    if (use(d)) return NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        mg_error(MG_ENOMEM, "cuda:%d: cannot allocate %zu bytes of page-locked host memory: %s",
                 d.index, bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
#else
    return NULL;
#endif
}

void mg_device_host_free(mg_device d, void *p)
{
    if (!p) return;
    if (host_mem(d)) {
        mg_free(p);
        return;
    }
#ifdef MG_HAVE_CUDA
    cudaFreeHost(p);
#endif
}

mg_status mg_device_host_register(mg_device d, void *p, size_t bytes)
{
    if (host_mem(d) || !bytes) return MG_OK;
    MG_TRY(mg_device_check(d));
#ifdef MG_HAVE_CUDA
    MG_TRY(use(d));
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return mg_error(MG_EIO, "cuda:%d: cannot page-lock %zu bytes of host memory: %s", d.index,
                        bytes, cudaGetErrorString(e));
    }
#endif
    return MG_OK;
}

void mg_device_host_unregister(mg_device d, void *p)
{
    if (host_mem(d) || !p) return;
#ifdef MG_HAVE_CUDA
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
#endif
}

mg_device mg_device_of(const void *p)
{
    mg_device d;
    if (mg__sparse_device(p, &d)) return d;
    if (emu_has(p)) return (mg_device){MG_DEVICE_EMU, 0};
#ifdef MG_HAVE_CUDA
    struct cudaPointerAttributes a;
    if (atomic_load(&cuda_used) && p) {
        if (cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice)
            return (mg_device){MG_DEVICE_CUDA, a.device};
        cudaGetLastError();   /* a host pointer may leave an error behind */
    }
#endif
    return (mg_device){MG_DEVICE_CPU, 0};
}

mg_status mg_device_zero(mg_device d, void *p, size_t bytes)
{
    if (!bytes) return MG_OK;
    if (d.kind != MG_DEVICE_CPU) MG_TRY(mg__sparse_commit(p, bytes));
    if (host_mem(d)) {
        memset(p, 0, bytes);
        return MG_OK;
    }
    mg_dk *k;
    MG_TRY(mg__dk_get(d, &k));
    mg_dk *prev = mg__dk_enter(k);
    mg_dk_zero(p, bytes);
    mg__dk_leave(prev);
    return MG_OK;
}

void mg_device_discard(mg_device d, void *p, size_t bytes)
{
    if (d.kind != MG_DEVICE_CPU && mg__sparse_discard(p, bytes)) return;
    if (host_mem(d)) mg_mem_discard(p, bytes);
}

size_t mg_device_resident(mg_device d, const void *p, size_t bytes)
{
    return d.kind == MG_DEVICE_CPU ? bytes : mg__sparse_resident(p, bytes);
}

mg_status mg_device_set_current(mg_device d)
{
    mg_dk *k;
    MG_TRY(mg__dk_get(d, &k));
    mg__dk_cur = k;
    return MG_OK;
}

mg_device mg_device_current(void) { return mg__dk_device(mg__dk_cur); }

mg_status mg_device_set_tf32(mg_device d, bool on)
{
    mg_dk *k;
    MG_TRY(mg__dk_get(d, &k));
    if (k) mg__dk_set_tf32(k, on);
    return MG_OK;
}

mg_status mg_device_set_bf16(mg_device d, bool on)
{
    mg_dk *k;
    MG_TRY(mg__dk_get(d, &k));
    if (k) mg__dk_set_bf16(k, on);
    return MG_OK;
}

mg_status mg_device_synchronize(mg_device d)
{
    mg_dk *k;
    MG_TRY(mg__dk_get(d, &k));
    if (!k) return MG_OK;
    mg_dk *prev = mg__dk_enter(k);
    mg_dk_sync();
    mg__dk_leave(prev);
    return MG_OK;
}

double mg_device_fp32_peak(mg_device d)
{
    if (d.kind != MG_DEVICE_CUDA || mg_device_check(d)) return 0.0;
#ifdef MG_HAVE_CUDA
    int sms = 0, khz = 0, major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d.index) ||
        cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, d.index) ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d.index) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d.index))
        return 0.0;
    /* FP32 lanes per SM: 64 up to Volta and on the A100 (8.0), 128 since. */
    int lanes = major < 8 || (major == 8 && minor == 0) ? 64 : 128;
    return (double)sms * lanes * 2.0 * khz * 1e3;
#else
    return 0.0;
#endif
}
