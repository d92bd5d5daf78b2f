/* Sparse allocations: device memory in granules, each holding memory or
 * given back, as the CPU's arenas are mapped pages that mg_mem_discard
 * gives back and a write faults in again.
 *
 * A GPU's memory is not paged in on demand, so a granule given back must
 * be had again before anything touches it: mg_device_copy does it for
 * what it writes (and reads a given-back granule as zeros), and the
 * strategies copy into what they gather. On a GPU a sparse allocation is
 * reserved address space whose granules (the driver's minimum, 2 MiB)
 * are physical allocations mapped and unmapped there (CUDA's virtual
 * memory management, through the driver library, opened at first use as
 * cuBLAS is). On emu it is mapped host memory in pages, and a page given
 * back is made inaccessible as an unmapped granule is on a GPU: a kernel
 * touching it stops the process, so tests on emu find what a GPU would. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "multigrad/core.h"
#include "device/sparse.h"
#ifdef MG_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>
#endif

typedef struct {
    mg_device dev;
    char *base;
    size_t bytes;          /* reserved: n granules */
    size_t gran, n;
    uint8_t *held;         /* per granule: 1 while it holds memory */
#ifdef MG_HAVE_CUDA
    CUmemGenericAllocationHandle *h;   /* per granule held */
#endif
} sparse;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static sparse **all;
static int n_all, cap_all;
static atomic_int live;    /* n_all, read without the lock */

/* The allocation p points into (mu held), or NULL. */
static sparse *find(const void *p)
{
    for (int i = 0; i < n_all; i++)
        if (all[i]->base <= (const char *)p && (const char *)p < all[i]->base + all[i]->bytes)
            return all[i];
    return NULL;
}

/* ---- a GPU's: CUDA's virtual memory management -------------------------------- */

#ifdef MG_HAVE_CUDA
static struct {
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*free_va)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
    int loaded;            /* 1: there, -1: not */
} vmm;

#define SAME_TYPE(f, p) _Static_assert(__builtin_types_compatible_p(__typeof__(&f), __typeof__(p)), #f)
SAME_TYPE(cuMemAddressReserve, vmm.reserve);
SAME_TYPE(cuMemAddressFree, vmm.free_va);
SAME_TYPE(cuMemCreate, vmm.create);
SAME_TYPE(cuMemRelease, vmm.release);
SAME_TYPE(cuMemMap, vmm.map);
SAME_TYPE(cuMemUnmap, vmm.unmap);
SAME_TYPE(cuMemSetAccess, vmm.set_access);
SAME_TYPE(cuMemGetAllocationGranularity, vmm.granularity);

/* (mu held) */
static bool load_vmm(void)
{
    if (vmm.loaded) return vmm.loaded > 0;
    vmm.loaded = -1;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    *(void **)&vmm.reserve = dlsym(h, "cuMemAddressReserve");
    *(void **)&vmm.free_va = dlsym(h, "cuMemAddressFree");
    *(void **)&vmm.create = dlsym(h, "cuMemCreate");
    *(void **)&vmm.release = dlsym(h, "cuMemRelease");
    *(void **)&vmm.map = dlsym(h, "cuMemMap");
    *(void **)&vmm.unmap = dlsym(h, "cuMemUnmap");
    *(void **)&vmm.set_access = dlsym(h, "cuMemSetAccess");
    *(void **)&vmm.granularity = dlsym(h, "cuMemGetAllocationGranularity");
    if (vmm.reserve && vmm.free_va && vmm.create && vmm.release && vmm.map && vmm.unmap &&
        vmm.set_access && vmm.granularity)
        vmm.loaded = 1;
    return vmm.loaded > 0;
}

static CUmemAllocationProp prop_of(int index)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = index;
    return p;
}

/* Granule g of s holds memory (mu held), zeroed. Any thread may come
 * here (the collectives' copies back run on the group's): the device is
 * made the thread's current one for the driver's calls. */
static mg_status gpu_hold(sparse *s, size_t g)
{
    if (cudaSetDevice(s->dev.index) != cudaSuccess)
        return mg_error(MG_EIO, "cuda:%d: cannot use it", s->dev.index);
    CUmemAllocationProp p = prop_of(s->dev.index);
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)(s->base + g * s->gran);
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location = p.location;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUmemGenericAllocationHandle h;
    if (vmm.create(&h, s->gran, &p, 0) != CUDA_SUCCESS)
        return mg_error(MG_ENOMEM, "cuda:%d: cannot allocate %zu bytes of its memory",
                        s->dev.index, s->gran);
    if (vmm.map(at, s->gran, 0, h, 0) != CUDA_SUCCESS || vmm.set_access(at, s->gran, &a, 1)) {
        vmm.unmap(at, s->gran);
        vmm.release(h);
        return mg_error(MG_EIO, "cuda:%d: cannot map %zu bytes of its memory", s->dev.index,
                        s->gran);
    }
    s->h[g] = h;
    cudaError_t e = cudaMemset(s->base + g * s->gran, 0, s->gran);
    if (e != cudaSuccess)
        return mg_error(MG_EIO, "cuda:%d: cannot zero its memory: %s", s->dev.index,
                        cudaGetErrorString(e));
    return MG_OK;
}

static void gpu_drop(sparse *s, size_t g)
{
    vmm.unmap((CUdeviceptr)(uintptr_t)(s->base + g * s->gran), s->gran);
    vmm.release(s->h[g]);
}
#endif

/* ---- holding and giving back ------------------------------------------------- */

/* Granules [g0, g1) of s hold memory (mu held). */
static mg_status hold(sparse *s, size_t g0, size_t g1)
{
    for (size_t g = g0; g < g1; g++) {
        if (s->held[g]) continue;
        if (s->dev.kind == MG_DEVICE_EMU) {
            /* Given back with MADV_DONTNEED: it reads as zeros. */
            if (mprotect(s->base + g * s->gran, s->gran, PROT_READ | PROT_WRITE))
                return mg_error(MG_ENOMEM, "emu: cannot map its memory again");
        } else {
#ifdef MG_HAVE_CUDA
            MG_TRY(gpu_hold(s, g));
#endif
        }
        s->held[g] = 1;
    }
    return MG_OK;
}

static void drop(sparse *s, size_t g0, size_t g1)
{
    for (size_t g = g0; g < g1; g++) {
        if (!s->held[g]) continue;
        if (s->dev.kind == MG_DEVICE_EMU) {
            madvise(s->base + g * s->gran, s->gran, MADV_DONTNEED);
            mprotect(s->base + g * s->gran, s->gran, PROT_NONE);
        } else {
#ifdef MG_HAVE_CUDA
            gpu_drop(s, g);
#endif
        }
        s->held[g] = 0;
    }
}

static void destroy(sparse *s)
{
    if (!s) return;
    if (s->base && s->dev.kind == MG_DEVICE_EMU) mg_unmap(s->base, s->bytes);
#ifdef MG_HAVE_CUDA
    if (s->base && s->dev.kind == MG_DEVICE_CUDA) {
        cudaSetDevice(s->dev.index);
        cudaDeviceSynchronize();
        drop(s, 0, s->n);
        vmm.free_va((CUdeviceptr)(uintptr_t)s->base, s->bytes);
    }
    free(s->h);
#endif
    free(s->held);
    free(s);
}

void *mg__sparse_alloc(mg_device d, size_t bytes, bool *fallback)
{
    *fallback = false;
    if (d.kind == MG_DEVICE_CPU) {
        *fallback = true;
        return NULL;
    }
    sparse *s = calloc(1, sizeof *s);
    if (!s) {
        mg_error(MG_ENOMEM, "out of memory");
        return NULL;
    }
    s->dev = d;
    mg_status st = MG_OK;
    pthread_mutex_lock(&mu);
    if (d.kind == MG_DEVICE_EMU) {
        s->gran = (size_t)sysconf(_SC_PAGESIZE);
    } else {
#ifdef MG_HAVE_CUDA
        CUmemAllocationProp p = prop_of(d.index);
        if (!load_vmm() || cudaSetDevice(d.index) != cudaSuccess ||
            vmm.granularity(&s->gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
            !s->gran)
            *fallback = true;
#else
        *fallback = true;
#endif
    }
    if (*fallback) {
        pthread_mutex_unlock(&mu);
        free(s);
        return NULL;
    }
    s->n = (bytes + s->gran - 1) / s->gran;
    if (!s->n) s->n = 1;
    s->bytes = s->n * s->gran;
    s->held = calloc(s->n, 1);
    if (!s->held) st = mg_error(MG_ENOMEM, "out of memory");
    if (!st && d.kind == MG_DEVICE_EMU) {
        s->base = mg_map_zero(s->bytes);
        if (!s->base) st = mg_error(MG_ENOMEM, "emu: cannot allocate %zu bytes", s->bytes);
        else memset(s->held, 1, s->n);
    }
#ifdef MG_HAVE_CUDA
    if (!st && d.kind == MG_DEVICE_CUDA) {
        CUdeviceptr va = 0;
        if (!(s->h = calloc(s->n, sizeof *s->h))) st = mg_error(MG_ENOMEM, "out of memory");
        else if (vmm.reserve(&va, s->bytes, s->gran, 0, 0) != CUDA_SUCCESS)
            st = mg_error(MG_ENOMEM, "cuda:%d: cannot reserve %zu bytes of address space",
                          d.index, s->bytes);
        s->base = (char *)(uintptr_t)va;
        if (!st) st = hold(s, 0, s->n);
    }
#endif
    if (!st && n_all == cap_all) {
        int cap = cap_all ? 2 * cap_all : 16;
        sparse **a = realloc(all, sizeof *a * (size_t)cap);
        if (!a) st = mg_error(MG_ENOMEM, "out of memory");
        else {
            all = a;
            cap_all = cap;
        }
    }
    if (!st) {
        all[n_all++] = s;
        atomic_store(&live, n_all);
    }
    pthread_mutex_unlock(&mu);
    if (st) {
        destroy(s);
        return NULL;
    }
    return s->base;
}

bool mg__sparse_free(void *p)
{
    if (!p || !atomic_load(&live)) return false;
    sparse *s = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_all && !s; i++)
        if (all[i]->base == p) {
            s = all[i];
            all[i] = all[--n_all];
        }
    atomic_store(&live, n_all);
    pthread_mutex_unlock(&mu);
    destroy(s);
    return s != NULL;
}

bool mg__sparse_device(const void *p, mg_device *d)
{
    if (!atomic_load(&live)) return false;
    pthread_mutex_lock(&mu);
    sparse *s = find(p);
    if (s) *d = s->dev;
    pthread_mutex_unlock(&mu);
    return s != NULL;
}

bool mg__sparse_discard(void *p, size_t n)
{
    if (!atomic_load(&live)) return false;
    pthread_mutex_lock(&mu);
    sparse *s = find(p);
    if (s && n) {
        size_t at = (size_t)((char *)p - s->base), end = at + n;
        if (end > s->bytes) end = s->bytes;
        size_t g0 = (at + s->gran - 1) / s->gran, g1 = end / s->gran, any = 0;
        for (size_t g = g0; g < g1; g++) any |= s->held[g];
#ifdef MG_HAVE_CUDA
        /* Nothing queued may touch what goes. */
        if (any && s->dev.kind == MG_DEVICE_CUDA && cudaSetDevice(s->dev.index) == cudaSuccess)
            cudaDeviceSynchronize();
#endif
        if (any) drop(s, g0, g1);
    }
    pthread_mutex_unlock(&mu);
    return s != NULL;
}

mg_status mg__sparse_commit(void *p, size_t n)
{
    if (!atomic_load(&live) || !n) return MG_OK;
    pthread_mutex_lock(&mu);
    sparse *s = find(p);
    mg_status st = MG_OK;
    if (s) {
        size_t at = (size_t)((char *)p - s->base), end = at + n;
        if (end > s->bytes) end = s->bytes;
        st = hold(s, at / s->gran, (end + s->gran - 1) / s->gran);
    }
    pthread_mutex_unlock(&mu);
    return st;
}

size_t mg__sparse_run(const void *p, size_t n, bool *held)
{
    *held = true;
    if (!atomic_load(&live) || !n) return n;
    pthread_mutex_lock(&mu);
    sparse *s = find(p);
    size_t run = n;
    if (s) {
        size_t at = (size_t)((const char *)p - s->base), g = at / s->gran;
        *held = s->held[g];
        size_t end = (g + 1) * s->gran;
        while (end < s->bytes && end - at < n && s->held[end / s->gran] == *held) end += s->gran;
        run = end - at < n ? end - at : n;
    }
    pthread_mutex_unlock(&mu);
    return run;
}

size_t mg__sparse_resident(const void *p, size_t n)
{
    if (!atomic_load(&live) || !n) return n;
    pthread_mutex_lock(&mu);
    sparse *s = find(p);
    size_t r = n;
    if (s) {
        size_t at = (size_t)((const char *)p - s->base), end = at + n;
        if (end > s->bytes) end = s->bytes;
        r = 0;
        for (size_t g = at / s->gran; g * s->gran < end; g++) {
            size_t lo = g * s->gran > at ? g * s->gran : at;
            size_t hi = (g + 1) * s->gran < end ? (g + 1) * s->gran : end;
            if (s->held[g]) r += hi - lo;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}
