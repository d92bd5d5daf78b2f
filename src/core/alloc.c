/* Aligned allocation: buffers (parameter, gradient and state arenas,
 * activations, workspaces) start on a cache line, MG_ALIGN bytes. */
#include <stdlib.h>
#include <string.h>
#include "multigrad/core.h"

void *mg_alloc(size_t bytes)
{
    void *p = NULL;
    size_t n = (bytes + MG_ALIGN - 1) / MG_ALIGN * MG_ALIGN;
    if (n == 0) n = MG_ALIGN;
    if (posix_memalign(&p, MG_ALIGN, n)) return NULL;
    return p;
}

void *mg_alloc_zero(size_t bytes)
{
    void *p = mg_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void mg_free(void *p) { free(p); }
