/* Internals shared by the collective algorithms (the .c files of
 * src/comm/coll): the normalised operation every algorithm receives,
 * scratch memory, channel wrappers that never issue zero-byte transfers,
 * block layouts, and the "rank space" used by the tree and
 * recursive-doubling algorithms. Not part of the group/algorithm contract
 * (that is coll.h). */
#ifndef MG_COMM_COLL_ALGOS_H
#define MG_COMM_COLL_ALGOS_H

#include <string.h>
#include "comm/coll/coll.h"

/* One operation after coll.c has resolved in-place conventions. */
typedef struct mg__op {
    mg__p2p *p;
    mg_coll coll;
    const char *sbuf;   /* input as this rank sees it (see below) */
    char *rbuf;         /* output */
    size_t count;       /* as in mg_call */
    size_t es;          /* element size in bytes */
    mg_dtype dt;
    mg_op op;
    int root;
    int rank, size;
    /* all_gather/gather: sbuf points at this rank's block (it may equal
     * rbuf + rank * count * es: then it is already in place). scatter at
     * the root: rbuf may equal sbuf + root * count * es. reduce_scatter:
     * rbuf may equal sbuf + rank * count * es. all_reduce/reduce: sbuf may
     * equal rbuf. No other overlap reaches an algorithm. */
} mg__op;

/* Scratch of at least `bytes` for this operation (one call per operation;
 * the memory is reused by later operations). NULL with an error recorded
 * when allocation fails. */
void *mg__op_scratch(mg__op *o, size_t bytes);
/* Scratch holding an offset array moff[0..n] followed by `extra` bytes
 * (64-byte aligned, at *data); counts as the operation's scratch call. */
size_t *mg__moff_scratch(mg__op *o, int n, size_t extra, char **data);
/* Ring chunk in bytes (MG_COLL_CHUNK, default 512 KiB); staging chunk cap
 * for shared memory (MG_SHM_CHUNK, default 0 = as large as the slot). */
size_t mg__coll_chunk(void);
size_t mg__shm_chunk_cap(void);

static inline size_t mg__dtsize(mg_dtype t)
{
    static const size_t sz[MG_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8, 1};
    return (unsigned)t < MG_DTYPE_COUNT ? sz[t] : 0;
}

static inline mg_op mg__accop(mg_op op) { return op == MG_AVG ? MG_SUM : op; }

/* ---- channels --------------------------------------------------------- */

static inline mg_status mg__send(mg__p2p *p, int peer, const void *b, size_t n)
{
    return n ? p->send(p, peer, b, n) : MG_OK;
}
static inline mg_status mg__recv(mg__p2p *p, int peer, void *b, size_t n)
{
    return n ? p->recv(p, peer, b, n) : MG_OK;
}
static inline mg_status mg__sendrecv(mg__p2p *p, int to, const void *sb, size_t sn,
                                     int from, void *rb, size_t rn)
{
    if (!sn) return mg__recv(p, from, rb, rn);
    if (!rn) return p->send(p, to, sb, sn);
    return p->sendrecv(p, to, sb, sn, from, rb, rn);
}

static inline void mg__copy(void *dst, const void *src, size_t n)
{
    if (n && dst != src) memmove(dst, src, n);
}

/* ---- layouts ---------------------------------------------------------- */

/* The vector of n elements cut into p blocks: uniform (every block has
 * `n` elements: n is per block) or balanced (n elements in total, the
 * first n % p blocks one longer). Offsets in bytes. */
typedef struct {
    size_t n, es;
    int p, uniform;
} mg__layout;

static inline size_t mg__lay_off(const mg__layout *L, int b)
{
    if (L->uniform) return (size_t)b * L->n * L->es;
    size_t q = L->n / (size_t)L->p, r = L->n % (size_t)L->p;
    return ((size_t)b * q + ((size_t)b < r ? (size_t)b : r)) * L->es;
}
static inline size_t mg__lay_len(const mg__layout *L, int b)
{
    return mg__lay_off(L, b + 1) - mg__lay_off(L, b);
}

/* ---- rank spaces ------------------------------------------------------ */

/* The ranks an algorithm works among, numbered 0..n-1 ("members"). Real
 * rank of member i: ((i < rem ? 2i : i + rem) + rot) % p — the group
 * rotated so the root is member 0, then "folded" so that n is a power of
 * two: relative ranks 2i and 2i+1 (i < rem) are represented by 2i alone.
 * A plain space (rem 0) has n = p. me is -1 for a rank folded away.
 * Data is cut among members by an offset array moff[0..n] (bytes): member
 * i's part is [moff[i], moff[i+1]). */
typedef struct {
    int n, rem, rot, p, me;
} mg__space;

static inline int mg__sp_real(const mg__space *s, int i)
{
    return ((i < s->rem ? 2 * i : i + s->rem) + s->rot) % s->p;
}
/* The first of the p blocks member i stands for. */
static inline int mg__sp_bfirst(const mg__space *s, int i)
{
    return i < s->rem ? 2 * i : i + s->rem;
}
mg__space mg__space_plain(int p, int rank, int rot);
mg__space mg__space_fold(int p, int rank, int rot);
/* moff for `count` elements cut evenly among the members. */
void mg__moff_even(size_t *moff, int n, size_t count, size_t es);
/* moff for p blocks of blk bytes, member i owning its bfirst blocks. */
void mg__moff_blocks(size_t *moff, const mg__space *s, size_t blk);

/* ---- algorithms --------------------------------------------------------- */

/* ring.c */
mg_status mg__ring_all_reduce(mg__op *o);
mg_status mg__ring_reduce_scatter(mg__op *o);
mg_status mg__ring_all_gather(mg__op *o);
mg_status mg__ring_broadcast(mg__op *o);
mg_status mg__ring_reduce(mg__op *o);
mg_status mg__flat_gather(mg__op *o);
mg_status mg__flat_scatter(mg__op *o);
mg_status mg__pairwise_all_to_all(mg__op *o, int use_xor);
mg_status mg__dissemination_barrier(mg__op *o);

/* tree.c; the *_sp cores work on a rank space and layout (see rd.c). */
mg_status mg__tree_broadcast(mg__op *o);
mg_status mg__tree_reduce(mg__op *o);
mg_status mg__tree_all_reduce(mg__op *o);
mg_status mg__tree_gather(mg__op *o);
mg_status mg__tree_scatter(mg__op *o);
mg_status mg__tree_all_gather(mg__op *o);
mg_status mg__tree_reduce_scatter(mg__op *o);
mg_status mg__tree_barrier(mg__op *o);
/* Binomial trees over a space. buf holds the data from byte offset
 * `base` of the cut described by moff (base 0: the whole vector). */
mg_status mg__binomial_bcast_sp(mg__p2p *p, const mg__space *s, char *buf, size_t n);
/* Gather to member 0: member i starts with its own part in place and ends
 * having sent its subtree's parts (member 0 ends with all). */
mg_status mg__binomial_gather_sp(mg__p2p *p, const mg__space *s, const size_t *moff,
                                 char *buf, size_t base);
/* Scatter from member 0 (which holds all): member i ends with its
 * subtree's parts, its own first. */
mg_status mg__binomial_scatter_sp(mg__p2p *p, const mg__space *s, const size_t *moff,
                                  char *buf, size_t base);
/* Subtree of member i in a binomial tree over n members: [i, end). */
int mg__binomial_subtree_end(int i, int n);

/* rd.c */
mg_status mg__rd_all_reduce(mg__op *o);
mg_status mg__rd_reduce_scatter(mg__op *o);
mg_status mg__rd_all_gather(mg__op *o);
mg_status mg__rd_broadcast(mg__op *o);
mg_status mg__rd_reduce(mg__op *o);

/* shm_direct.c (reductions) and shm_copy.c (data movement). */
mg_status mg__shm_all_reduce(mg__op *o);
mg_status mg__shm_reduce(mg__op *o);
mg_status mg__shm_reduce_scatter(mg__op *o);
mg_status mg__shm_broadcast(mg__op *o);
mg_status mg__shm_all_gather(mg__op *o);
mg_status mg__shm_gather(mg__op *o);
mg_status mg__shm_scatter(mg__op *o);
mg_status mg__shm_all_to_all(mg__op *o);
mg_status mg__shm_barrier(mg__op *o);

/* central.c */
mg_status mg__central_reduce(mg__op *o);
mg_status mg__central_all_reduce(mg__op *o);
mg_status mg__central_broadcast(mg__op *o);
mg_status mg__central_all_gather(mg__op *o);
mg_status mg__central_reduce_scatter(mg__op *o);
mg_status mg__central_barrier(mg__op *o);

/* select.c: whether the rd family treats a message of `bytes` as large
 * (all_reduce: halving-doubling rather than recursive doubling; broadcast:
 * scatter + all-gather rather than a binomial tree; reduce: reduce-scatter
 * + gather rather than a binomial tree), by the selector's cost model. */
int mg__rd_use_halving(const mg__p2p *p, size_t bytes, size_t count);

#endif
