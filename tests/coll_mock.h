/* An in-process stand-in for the group, for testing the collective
 * algorithms (src/comm/coll) without processes or transports: a "world" of
 * threads, one per rank, joined by the mg__p2p and mg__shm_view interfaces
 * of src/comm/coll/coll.h.
 *
 * The channels are strict: a send completes only when the peer has taken
 * the message (rendezvous, the least buffering any transport offers), a
 * receive must ask for exactly the length that was sent, and zero-byte
 * transfers are refused — so an algorithm that relies on buffering or
 * mismatches sizes fails here. The shared-memory view has per-rank slots,
 * per-rank "group memory" arenas (gaddr/gptr), and counters that check
 * they only ever grow. */
#ifndef MG_TESTS_COLL_MOCK_H
#define MG_TESTS_COLL_MOCK_H

#include "comm/coll/coll.h"

typedef struct mgt_world mgt_world;

/* size ranks; shm: provide the shared-memory view (slot_bytes per slot,
 * gmem_bytes of group memory per rank); timeout_s: each operation's
 * deadline. */
mgt_world *mgt_world_create(int size, int shm, size_t slot_bytes, size_t gmem_bytes,
                            double timeout_s);
void mgt_world_destroy(mgt_world *w);

typedef int (*mgt_rank_fn)(mgt_world *w, int rank, mg__p2p *p, void *arg);
/* Run fn on every rank (one thread each); returns the number of ranks
 * whose fn returned non-zero. */
int mgt_world_run(mgt_world *w, mgt_rank_fn fn, void *arg);

/* Run one operation with a fresh deadline. */
mg_status mgt_coll(mg__p2p *p, const mg_call *c, mg__algo algo);

/* Group memory of rank `rank` (bump allocation, 64-byte aligned; every
 * rank must allocate the same sizes in the same order for the buffers to
 * match); NULL when the arena is full. mgt_greset frees them all. */
void *mgt_galloc(mgt_world *w, int rank, size_t bytes);
void mgt_greset(mgt_world *w, int rank);

/* Busy-wait iterations before a shared-memory wait sleeps (default: long
 * when there are no more ranks than CPUs, short otherwise). */
void mgt_world_set_spin(mgt_world *w, long spins);

/* Messages sent so far by all ranks (a sendrecv counts as one). */
long mgt_world_msgs(mgt_world *w);

#endif
