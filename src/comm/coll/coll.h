/* The interface between collective algorithms (src/comm/coll) and the group
 * that runs them (src/comm/group.c and the transports).
 *
 * An algorithm sees only a rank, a size and per-peer byte channels
 * (mg__p2p) — never which transport carries them — plus, when every rank
 * of the group is on this host, a shared-memory view (mg__shm) for the
 * direct algorithms. Each call runs one whole operation on the group's
 * progress thread; channels are FIFO per ordered pair of ranks, and the
 * group guarantees every rank runs operations in the same order (the
 * fingerprint check rejects ranks that do not).
 *
 * All calls block until done, the peer fails, or p->deadline passes;
 * they return MG_OK or an error already recorded with mg_error(). */
#ifndef MG_COMM_COLL_H
#define MG_COMM_COLL_H

#include "multigrad/comm.h"

typedef struct mg__p2p mg__p2p;
typedef struct mg__shm mg__shm;

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
    /* Non-NULL when all ranks of the group share this host's memory. */
    mg__shm *shm;
};

struct mg__shm {
    /* Per-rank scratch slots of `slot_bytes` each, mapped in every process
     * of the group: slot(s, r) is rank r's slot as seen here. */
    size_t slot_bytes;
    void *(*slot)(mg__shm *s, int rank);
    /* If ptr lies in memory from mg_group_alloc, the address of peer's
     * matching allocation (same offset) as mapped here; else NULL. */
    void *(*peer_ptr)(mg__shm *s, int peer, const void *ptr);
    /* Barrier among the group's ranks (all local), blocking with the
     * deadline; `phase` lets an algorithm use several per operation. */
    mg_status (*barrier)(mg__shm *s, int phase);
    /* Signal counter per rank for pipelined algorithms: post(s, v) sets
     * this rank's counter to v; wait(s, r, v) blocks until rank r's counter
     * is >= v (spinning briefly, then sleeping on a futex). Counters are
     * reset to 0 at the start of every operation. */
    void (*post)(mg__shm *s, uint64_t v);
    mg_status (*wait)(mg__shm *s, int rank, uint64_t v);
    void *ctx;
};

/* The algorithms. */
typedef enum {
    MG_ALGO_AUTO,
    MG_ALGO_RING,       /* chunked, pipelined ring */
    MG_ALGO_RD,         /* recursive doubling / halving-doubling */
    MG_ALGO_TREE,       /* binomial trees */
    MG_ALGO_SHM,        /* direct shared memory, all ranks on one host */
    MG_ALGO_COUNT
} mg__algo;

const char *mg__algo_name(mg__algo a);
/* "ring" | "rd" | "tree" | "shm" | "auto"; -1 if unknown. */
int mg__algo_parse(const char *name);

/* Run one operation (any mg_coll but SEND/RECV, which the group carries
 * itself). count/dtype/op/root as in mg_call; sendbuf already resolved
 * (never MG_IN_PLACE: the group passes recvbuf for in place, as sendbuf ==
 * recvbuf). algo MG_ALGO_AUTO lets select.c choose from its cost model. */
mg_status mg__coll_run(mg__p2p *p, const mg_call *c, mg__algo algo);

/* select.c: the algorithm for an operation given size and whether shm is
 * available. Never returns MG_ALGO_AUTO. */
mg__algo mg__coll_select(const mg__p2p *p, const mg_call *c);

/* reduce.c: dst[i] = dst[i] (op) src[i] for n elements; f16/bf16 are
 * accumulated in f32. AVG reduces as SUM; mg__reduce_finish divides. */
void mg__reduce(void *dst, const void *src, size_t n, mg_dtype t, mg_op op);
/* dst[i] = a[i] (op) b[i] */
void mg__reduce3(void *dst, const void *a, const void *b, size_t n, mg_dtype t, mg_op op);
/* For MG_AVG: divide by size; no-op for other ops. */
void mg__reduce_finish(void *buf, size_t n, mg_dtype t, mg_op op, int size);

#endif
