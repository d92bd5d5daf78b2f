/* Internal to src/comm: a group's traffic counters (mg_group_traffic in
 * comm.h) and the one helper every place that moves payload between ranks
 * calls.
 *
 * What counts: payload bytes that leave this rank for another rank (sent)
 * and that arrive from another rank (received), once each — never frame
 * headers, heartbeats, abort notices or synchronisation flags, never a
 * copy within the rank. The channels count frames' payloads as they
 * complete (p2p.c); the direct shared-memory algorithms, which move data
 * with plain loads and stores, count arithmetically what each rank reads
 * from and writes into its peers' memory, and what its peers read from and
 * write into its own (shm_direct.c, shm_copy.c); the MPI backend counts the
 * standard (ring) volume of each call, since MPI hides its transport.
 *
 * Besides the bytes, the time this rank's operations of the group took
 * executing (waiting for the peers included): work.c adds each one's.
 *
 * Relaxed atomics: the executing thread adds while any thread may read.
 * The two counters are read apart, not as one snapshot. */
#ifndef MG_COMM_TRAFFIC_H
#define MG_COMM_TRAFFIC_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct mg__traffic {
    _Atomic uint64_t sent, received;
    _Atomic uint64_t busy_ns;   /* this rank's operations executing (work.c) */
} mg__traffic;

/* t may be NULL (nothing counted). */
static inline void mg__traffic_add(mg__traffic *t, uint64_t sent, uint64_t received)
{
    if (!t) return;
    if (sent) atomic_fetch_add_explicit(&t->sent, sent, memory_order_relaxed);
    if (received) atomic_fetch_add_explicit(&t->received, received, memory_order_relaxed);
}

#endif
