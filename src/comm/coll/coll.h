/* The interface between collective algorithms (src/comm/coll) and the group
 * that runs them (src/comm/group.c and the transports).
 *
 * An algorithm sees only a rank, a size and per-peer byte channels
 * (mg__p2p) — never which transport carries them — plus, when every rank
 * of the group is on this host, a shared-memory view (mg__shm_view) for
 * the direct algorithms. Each call runs one whole operation on the group's
 * progress thread; channels are FIFO per ordered pair of ranks, and the
 * group guarantees every rank runs operations in the same order (the
 * fingerprint check rejects ranks that do not).
 *
 * All calls block until done, the peer fails, or p->deadline passes;
 * they return MG_OK or an error already recorded with mg_error(). */
#ifndef MG_COMM_COLL_H
#define MG_COMM_COLL_H

#include "multigrad/comm.h"
#include "comm/names.h"
#include "comm/traffic.h"

typedef struct mg__p2p mg__p2p;
typedef struct mg__shm_view mg__shm_view;

struct mg__p2p {
    int rank, size;
    double deadline;   /* mg_now() seconds */
    void *ctx;         /* the group's */
    /* Send n bytes to peer (returns once buf may be reused). */
    mg_status (*send)(mg__p2p *p, int peer, const void *buf, size_t n);
    /* Receive exactly n bytes from peer. */
    mg_status (*recv)(mg__p2p *p, int peer, void *buf, size_t n);
    /* Send sn bytes to `to` while receiving rn bytes from `from`, making
     * progress on both so that rings and pairwise exchanges never deadlock
     * (to and from may be the same peer; sn or rn may be 0). */
    mg_status (*sendrecv)(mg__p2p *p, int to, const void *sbuf, size_t sn,
                          int from, void *rbuf, size_t rn);
    /* Non-NULL when all ranks of the group share this host's memory (and
     * the group wants the direct algorithms: MG_TRANSPORT=tcp sets NULL). */
    mg__shm_view *shm;
    /* The group's traffic counters (NULL: none). The channels above count
     * what they carry themselves; an algorithm counts only what it moves
     * around them (the direct shared-memory ones: mg__traffic_add). */
    mg__traffic *traffic;
    /* How messages name the group's ranks (names.h; NULL: by their numbers
     * here). */
    const mg__names *names;
    /* Scratch memory the algorithms keep between operations so that a
     * steady stream of collectives allocates nothing. Zero-initialise both
     * fields; call mg__coll_scratch_free(p) when p is no longer used. */
    void *scratch;
    size_t scratch_bytes;
};

/* The algorithms keep these promises about the channels: every send of n
 * bytes is matched by a recv (or the receive half of a sendrecv) of exactly
 * n bytes on the peer, in the same order; zero-byte transfers are never
 * issued (sendrecv may get sn == 0 or rn == 0, never both); they never
 * rely on a send completing before the peer posts its receive. */

/* Recommended slot size (slot_bytes); the algorithms need at least
 * MG__SHM_SLOT_MIN. */
#define MG__SHM_SLOT_BYTES ((size_t)4 << 20)
#define MG__SHM_SLOT_MIN ((size_t)64 << 10)

struct mg__shm_view {
    /* Per-rank scratch slots of `slot_bytes` each (64-byte aligned),
     * mapped in every process of the group: slot(s, r) is rank r's slot as
     * seen here. The slots belong to the algorithms alone; the group never
     * writes them after creating them zeroed. */
    size_t slot_bytes;
    void *(*slot)(mg__shm_view *s, int rank);
    /* If ptr lies in memory from mg_group_alloc, the address of peer's
     * matching allocation (same offset) as mapped here; else NULL.
     * (Equivalent to gptr(s, peer, gaddr(s, ptr)); kept for the group's
     * own use — the algorithms use gaddr/gptr, which let ranks whose
     * buffers lie at different offsets still find one another's.) */
    void *(*peer_ptr)(mg__shm_view *s, int peer, const void *ptr);
    /* Group-memory address of ptr: 0 if [ptr, ptr + bytes) does not lie
     * within one mg_group_alloc allocation of this rank; otherwise a
     * non-zero value that names (allocation, offset) the same way on
     * every rank — allocations are collective, so the k-th allocation of
     * every rank has the same name. */
    uint64_t (*gaddr)(mg__shm_view *s, const void *ptr, size_t bytes);
    /* Rank `rank`'s memory at group-memory address ga as mapped here
     * (for rank == own rank: the caller's own pointer back). */
    void *(*gptr)(mg__shm_view *s, int rank, uint64_t ga);
    /* Barrier among the group's ranks (all local), blocking with the
     * deadline; `phase` lets an algorithm use several per operation. */
    mg_status (*barrier)(mg__shm_view *s, int phase);
    /* A signal counter per rank. post(s, v) sets this rank's counter to v;
     * wait(s, r, v) blocks until rank r's counter is >= v (spinning
     * briefly, then sleeping on a futex), failing with the deadline or
     * when r dies. Counters start at 0 when the group is created and are
     * never reset: the algorithms post ever-growing values (they derive
     * them from coll_seq below), so a rank that has moved on to a later
     * operation still satisfies every wait of the earlier ones. post has
     * release semantics and a successful wait acquire semantics: what a
     * rank wrote to shared memory before post(v) is visible to a rank
     * whose wait(v) returned. */
    void (*post)(mg__shm_view *s, uint64_t v);
    mg_status (*wait)(mg__shm_view *s, int rank, uint64_t v);
    /* Owned by the algorithms (the number of shared-memory operations run
     * so far, equal on every rank): zero-initialise, never touch. */
    uint64_t coll_seq;
    /* Also the algorithms': what the staged forms learned about their
     * stores, per collective and size class (shm_direct.c). */
    struct mg__shm_tune {
        uint64_t runs[MG_COLL_COUNT][8];
        double cost[MG_COLL_COUNT][8][2];
    } tune;
    void *ctx;
};

/* The algorithms. */
typedef enum {
    MG_ALGO_AUTO,
    MG_ALGO_RING,       /* chunked, pipelined ring */
    MG_ALGO_RD,         /* recursive doubling / halving-doubling */
    MG_ALGO_TREE,       /* binomial trees */
    MG_ALGO_SHM,        /* direct shared memory, all ranks on one host */
    MG_ALGO_CENTRAL,    /* through rank 0 (the root): only when asked for */
    MG_ALGO_COUNT
} mg__algo;

const char *mg__algo_name(mg__algo a);
/* "ring" | "rd" | "tree" | "shm" | "central" | "auto"; -1 if unknown. */
int mg__algo_parse(const char *name);
/* The algorithm MG_ALGO forces (MG_ALGO_AUTO: none), read once. */
mg__algo mg__algo_forced(void);

/* Run one operation (any mg_coll but SEND/RECV, which the group carries
 * itself), its arguments checked by the group (mg__call_check in
 * comm/call.h). count/dtype/op/root as in mg_call; sendbuf already resolved
 * (never MG_IN_PLACE: the group passes recvbuf for in place, as sendbuf ==
 * recvbuf). algo MG_ALGO_AUTO lets select.c choose from its cost model
 * (MG_ALGO in the environment forces one); an algorithm that cannot run
 * the call (shm without shared memory) falls back to the model's choice.
 *
 * In-place conventions (docs/algorithms.md): all_gather and gather take
 * sendbuf == recvbuf (MPI) or sendbuf == recvbuf + rank * count (NCCL) to
 * mean the rank's block is already in place; scatter at the root takes
 * sendbuf == recvbuf or recvbuf == sendbuf + root * count; reduce_scatter
 * takes recvbuf == sendbuf (result at the start) or recvbuf == sendbuf +
 * rank * count. Non-roots of reduce never write recvbuf; non-roots of
 * scatter never read sendbuf. */
mg_status mg__coll_run(mg__p2p *p, const mg_call *c, mg__algo algo);

/* The payload bytes rank `rank` of `size` sends and receives in call c by
 * the ring family's algorithms (ring.c): the reduce-scatter + all-gather
 * ring with balanced blocks for all_reduce, rings for reduce_scatter and
 * all_gather, chains for broadcast and reduce, flat gather and scatter,
 * the pairwise all_to_all; a barrier moves none; a send or receive its
 * message, unless to or from itself. The "standard" volume the mpi
 * backend counts as its traffic (MPI hides what it really moves). */
void mg__ring_volume(const mg_call *c, int rank, int size, uint64_t *sent, uint64_t *received);

/* Release p->scratch. */
void mg__coll_scratch_free(mg__p2p *p);

/* select.c: the algorithm for an operation given size and whether shm is
 * available. Never returns MG_ALGO_AUTO. */
mg__algo mg__coll_select(const mg__p2p *p, const mg_call *c);

/* reduce.c: dst[i] = dst[i] (op) src[i] for n elements; f16/bf16 are
 * accumulated in f32. AVG reduces as SUM; mg__reduce_finish divides.
 * Integer SUM and PROD wrap around (two's complement). */
void mg__reduce(void *dst, const void *src, size_t n, mg_dtype t, mg_op op);
/* dst[i] = a[i] (op) b[i]; dst may be a or b, but must not otherwise
 * overlap them. */
void mg__reduce3(void *dst, const void *a, const void *b, size_t n, mg_dtype t, mg_op op);
/* For MG_AVG: divide by size (floating types: true division; integers:
 * C division, truncating toward zero); no-op for other ops. */
void mg__reduce_finish(void *buf, size_t n, mg_dtype t, mg_op op, int size);
/* dst[j] = src[0] (op) src[1] (op) ... (op) src[ns-1], in that order, for
 * each of the nd destinations; f16/bf16 are accumulated in f32 and rounded
 * once. For MG_AVG the result is divided by avg_div. A destination may be
 * one of the sources; otherwise none may overlap. Destinations j >=
 * nt_from are written with non-temporal stores (results not read again
 * soon; nt_from = nd for none). */
void mg__reduce_multi(void *const *dst, int nd, const void *const *src, int ns,
                      size_t n, mg_dtype t, mg_op op, int avg_div, int nt_from);
/* memcpy with non-temporal stores (for copies larger than the caches). */
void mg__copy_nt(void *dst, const void *src, size_t n);

#endif
