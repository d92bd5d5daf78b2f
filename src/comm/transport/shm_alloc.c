/* Group memory of the shared-memory transport (mg_group_alloc): a
 * collective allocation is one shared segment per local rank, named
 * /mg-...-aIDX after its rank's segment, which every local peer maps, so
 * the direct algorithms (coll/shm_direct.c) read and write their peers'
 * buffers in place. The names exist only while the ranks map them (between
 * two barriers), guarded against signals as the segments are (shm.c).
 * Addresses: a pointer into this rank's allocation maps to a peer's by
 * its offset; a group-memory address, (allocation index + 1) << 40 |
 * offset, is the same on every rank.
 *
 * Limits: all ranks of the group on this host (mg__shm_view); an
 * allocation is found by walking the list (a few per group). */
#define _GNU_SOURCE
#include "comm/transport/shm_internal.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "multigrad/core.h"

void *mg__shm_peer_ptr(mg__shm_view *s, int peer, const void *ptr)
{
    mg__shm_transport *x = s->ctx;
    const uint8_t *p = ptr;
    for (galloc *a = x->allocs; a; a = a->next) {
        const uint8_t *mine = a->base[x->rank];
        if (p >= mine && p < mine + a->bytes) return a->base[peer] + (p - mine);
    }
    return NULL;
}

/* Group-memory addresses: (allocation index + 1) << 40 | offset. */
#define GA_SHIFT 40

uint64_t mg__shm_gaddr(mg__shm_view *s, const void *ptr, size_t bytes)
{
    mg__shm_transport *x = s->ctx;
    const uint8_t *p = ptr;
    for (galloc *a = x->allocs; a; a = a->next) {
        const uint8_t *mine = a->base[x->rank];
        if (p >= mine && p < mine + a->bytes && bytes <= (size_t)(mine + a->bytes - p))
            return ((uint64_t)a->idx + 1) << GA_SHIFT | (uint64_t)(p - mine);
    }
    return 0;
}

void *mg__shm_gptr(mg__shm_view *s, int rank, uint64_t ga)
{
    mg__shm_transport *x = s->ctx;
    MG_ASSERT(ga && rank >= 0 && rank < x->size);
    unsigned idx = (unsigned)(ga >> GA_SHIFT) - 1;
    size_t off = (size_t)(ga & (((uint64_t)1 << GA_SHIFT) - 1));
    for (galloc *a = x->allocs; a; a = a->next)
        if (a->idx == idx) {
            MG_ASSERT(off < a->mapped);
            return a->base[rank] + off;
        }
    MG_ASSERT(!"group-memory address of no live allocation");
    return NULL;
}

static void galloc_unmap(mg__shm_transport *x, galloc *a)
{
    for (int r = 0; r < x->size; r++)
        if (a->base[r]) munmap(a->base[r], a->mapped);
    free(a->base);
    free(a);
}

mg_status mg__shm_transport_alloc(mg__shm_transport *x, size_t bytes, void **out)
{
    MG_ASSERT(x->all_local);
    *out = NULL;
    galloc *a = calloc(1, sizeof *a);
    if (a) a->base = calloc((size_t)x->size, sizeof *a->base);
    if (!a || !a->base) {
        free(a);
        return mg_error(MG_ENOMEM, "mg_group_alloc: out of memory");
    }
    a->bytes = bytes;
    a->mapped = mg__shm_page_up(bytes ? bytes : 1);
    unsigned idx = a->idx = x->nalloc++;
    char name[80];
    mg__shm_alloc_name(name, sizeof name, x, x->rank, idx);
    mg_status st = MG_OK;
    mg__shm_guard_peers(x, idx, true);
    int fd = mg__shm_named_create(name);
    if (fd < 0) {
        st = mg_error(MG_EIO, "mg_group_alloc: shm_open(%s): %s", name, strerror(errno));
    } else {
        st = mg__shm_named_size(fd, name, a->mapped, "mg_group_alloc");
        void *p = st ? MAP_FAILED : mmap(NULL, a->mapped, PROT_READ | PROT_WRITE,
                                         MAP_SHARED | MAP_POPULATE, fd, 0);
        close(fd);
        if (!st && p == MAP_FAILED)
            st = mg_error(MG_ENOMEM, "mg_group_alloc: mmap of %zu bytes: %s", a->mapped,
                          strerror(errno));
        if (!st) a->base[x->rank] = p;
    }
    /* Every rank has created its segment (and agrees on the size: the
     * barrier checks the fingerprint) before anyone maps its peers'. */
    if (!st) st = x->view.barrier(&x->view, 0);
    for (int i = 0; !st && i < x->npeers; i++) {
        int r = x->peers[i];
        char pn[80];
        mg__shm_alloc_name(pn, sizeof pn, x, r, idx);
        int pfd = shm_open(pn, O_RDWR, 0);
        struct stat sb;
        if (pfd < 0 || fstat(pfd, &sb) < 0 || (size_t)sb.st_size != a->mapped) {
            char who[128];
            st = mg_error(MG_EMISMATCH, "mg_group_alloc: %s's allocation %s is missing or of "
                          "another size", mg__rank_name(x->names, r, NULL, who, sizeof who), pn);
        } else {
            void *p = mmap(NULL, a->mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                           pfd, 0);
            if (p == MAP_FAILED) st = mg_error(MG_ENOMEM, "mg_group_alloc: mmap: %s", strerror(errno));
            else a->base[r] = p;
        }
        if (pfd >= 0) close(pfd);
    }
    if (!st) st = x->view.barrier(&x->view, 1);
    if (fd >= 0) mg__shm_named_unlink(name);
    mg__shm_guard_peers(x, idx, false);
    if (st) {
        galloc_unmap(x, a);
        return st;
    }
    a->next = x->allocs;
    x->allocs = a;
    *out = a->base[x->rank];
    return MG_OK;
}

int mg__shm_transport_free(mg__shm_transport *x, void *p)
{
    for (galloc **pp = &x->allocs; *pp; pp = &(*pp)->next)
        if ((*pp)->base[x->rank] == p) {
            galloc *a = *pp;
            *pp = a->next;
            galloc_unmap(x, a);
            return 1;
        }
    return 0;
}
