/* Counts the heap allocations of the test process (the test binary links
 * with -Wl,--wrap for these four), so a test can check that a training
 * step allocates nothing. */
#include <stdatomic.h>
#include <stddef.h>
#include "harness.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);

static atomic_long allocs;

long mgt_allocs(void) { return atomic_load(&allocs); }

void *__wrap_malloc(size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __real_realloc(p, n);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __real_posix_memalign(p, align, n);
}
