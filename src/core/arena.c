/* Aligned allocation and bump arenas. An arena never grows by itself:
 * callers size it once per batch shape, which keeps the training step free
 * of allocation and page faults. */
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

mg_status mg_arena_init(mg_arena *a, size_t cap)
{
    memset(a, 0, sizeof *a);
    a->base = mg_alloc(cap);
    if (!a->base)
        return mg_error(MG_ENOMEM, "arena: cannot allocate %zu bytes", cap);
    a->cap = cap;
    return MG_OK;
}

void mg_arena_free(mg_arena *a)
{
    mg_free(a->base);
    memset(a, 0, sizeof *a);
}

void *mg_arena_push(mg_arena *a, size_t bytes)
{
    size_t off = (a->used + MG_ALIGN - 1) / MG_ALIGN * MG_ALIGN;
    if (off > a->cap || bytes > a->cap - off) return NULL;
    a->used = off + bytes;
    if (a->used > a->peak) a->peak = a->used;
    return a->base + off;
}

void mg_arena_reset(mg_arena *a) { a->used = 0; }
