/* The slot protocol shared by the shared-memory algorithms (shm_direct.c,
 * shm_copy.c).
 *
 * Each rank's slot (coll.h) is laid out as
 *   region[0], region[1]   a "tiny" line (stamp, call shape, 48 bytes of
 *                          data), a header line, then `sm` bytes; used by
 *                          operations of even and odd sequence number
 *                          alternately
 *   stage[0..2]            three staging buffers of `stage` bytes
 * Operation k (coll_seq, equal on every rank) posts counter values
 * ((k + 1) << 32) + v, so values only grow (coll.h), and every operation
 * waits for every peer's first post ("arrival") before it returns. Hence:
 *   - a region written at the start of operation k (before any wait) was
 *     last read in operation k - 2, which every reader finished before
 *     arriving at operation k - 1 — and we saw them arrive there;
 *   - staging buffers are written only after this operation's arrival,
 *     when every peer has finished every earlier operation; within an
 *     operation, buffer k % 3 is rewritten only after its readers posted
 *     that they are done with chunk k - 3 (or later).
 * Small operations publish their whole input in the region, stamp the
 * tiny line (release) and post; peers spin briefly on the stamp — when
 * the input fits the tiny line, one cache miss brings both signal and
 * data — and otherwise fall back to the group's wait, which also checks
 * deadlines, dead peers and mismatched calls. Large ones publish group-memory addresses (gaddr) in the
 * region header and, when every buffer involved is group memory, read and
 * write peers' buffers in place ("direct"); otherwise they pipeline chunks
 * through the staging buffers ("staged").
 *
 * Traffic (mg_group_traffic): no channel sees these bytes, so each rank
 * counts them itself, arithmetically (the forms are deterministic, so a
 * rank knows what its peers take from it without asking): what it reads
 * from a peer's region, staging buffer or buffer counts as received, and
 * the peer counts it as sent; what it writes into a peer's buffer counts
 * as sent, and the peer counts it as received. Copies within a rank
 * (into its own region or staging buffer, its own block) do not count. */
#ifndef MG_COMM_COLL_SHM_PROTO_H
#define MG_COMM_COLL_SHM_PROTO_H

#include <stdatomic.h>
#include <stddef.h>
#include "comm/coll/algos.h"

typedef struct {
    uint64_t ga[2];
} mg__shm_hdr;

/* Inputs up to this size travel in the tiny line itself. */
#define MG__SHM_TINY_BYTES 48

typedef struct {
    _Atomic uint64_t stamp;   /* base + 1 once this operation's input is in */
    uint64_t shape;           /* the call (collective, dtype, op, root, count) */
    char data[MG__SHM_TINY_BYTES];
} mg__shm_tiny;

typedef struct {
    mg__op *o;
    mg__shm_view *s;
    int me, P;
    uint64_t seq, base;
    size_t sm, stage, reg;
    uint64_t shape;         /* the call, for the tiny line */
    char **slot;            /* slot[q]: rank q's slot as mapped here */
    const void **src;       /* P pointers of room for the kernels */
    void **dst;             /* P pointers */
    int stream, tc;         /* staging stores streamed; size class (-1: none) */
    double t0;
} mg__shm_op;

/* Start a shared-memory operation: take the sequence number, map slots.
 * Uses the operation's scratch call. */
mg_status mg__shm_op_begin(mg__shm_op *x, mg__op *o);

static inline void mg__shm_op_post(mg__shm_op *x, uint32_t v) { x->s->post(x->s, x->base + v); }
static inline mg_status mg__shm_op_wait(mg__shm_op *x, int q, uint32_t v)
{
    return x->s->wait(x->s, q, x->base + v);
}
/* Wait for every peer's counter to reach v (peers after us first, so
 * that ranks do not all queue on the same one). */
mg_status mg__shm_op_wait_all(mg__shm_op *x, uint32_t v);

static inline mg__shm_tiny *mg__shm_op_tiny(mg__shm_op *x, int q)
{
    return (mg__shm_tiny *)(void *)(x->slot[q] + (x->seq & 1) * x->reg);
}
static inline mg__shm_hdr *mg__shm_op_hdr(mg__shm_op *x, int q)
{
    return (mg__shm_hdr *)(void *)(x->slot[q] + (x->seq & 1) * x->reg + 64);
}
/* Where rank q's small input of n bytes lies. */
static inline char *mg__shm_op_small(mg__shm_op *x, int q, size_t n)
{
    char *r = x->slot[q] + (x->seq & 1) * x->reg;
    return n <= MG__SHM_TINY_BYTES ? r + offsetof(mg__shm_tiny, data) : r + 128;
}
static inline char *mg__shm_op_stage(mg__shm_op *x, int q, size_t k)
{
    return x->slot[q] + 2 * x->reg + (k % 3) * x->stage;
}
/* Group-memory address of [p, p + n) (0: not group memory). */
static inline uint64_t mg__shm_op_gaddr(mg__shm_op *x, const void *p, size_t n)
{
    return p && x->s->gaddr ? x->s->gaddr(x->s, p, n) : 0;
}
static inline char *mg__shm_op_gptr(mg__shm_op *x, int q, uint64_t ga)
{
    return x->s->gptr(x->s, q, ga);
}
/* Publish two group addresses, post arrival (1), wait for every peer's. */
mg_status mg__shm_op_arrive(mg__shm_op *x, uint64_t g0, uint64_t g1);
/* Small form: copy n bytes (src may be NULL when n is 0) to where
 * mg__shm_op_small says, stamp and post arrival (1). */
void mg__shm_op_publish(mg__shm_op *x, const void *src, size_t n);
/* Wait until every peer has published this operation (same call shape). */
mg_status mg__shm_op_wait_published(mg__shm_op *x);

/* Staged forms: choose how this operation of `bytes` writes the staging
 * buffers (sets x->stream: cached or non-temporal stores, whichever has
 * been faster here lately), and, at the end, record what it cost. */
void mg__shm_op_stage_begin(mg__shm_op *x, size_t bytes);
void mg__shm_op_stage_end(mg__shm_op *x);
/* Copy into a staging buffer with the stores chosen. */
static inline void mg__shm_op_stage_copy(mg__shm_op *x, void *dst, const void *src, size_t n)
{
    if (x->stream)
        mg__copy_nt(dst, src, n);
    else
        memcpy(dst, src, n);
}

/* Count payload moved between this rank and its peers (shm_proto.h's top). */
static inline void mg__shm_op_traffic(mg__shm_op *x, uint64_t sent, uint64_t received)
{
    mg__traffic_add(x->o->p->traffic, sent, received);
}

/* Element range [*lo, *lo + *len) of part q when m elements are cut into P
 * parts on cache-line boundaries (so ranks writing neighbouring parts do
 * not share lines). */
void mg__shm_op_part(size_t m, int P, int q, size_t es, size_t *lo, size_t *len);

#endif
