/* Internal to the shared-memory transport: its state, shared by shm.c
 * (segments, rings, wake-ups, liveness, the view's counters and
 * barriers) and shm_alloc.c (group memory: collective allocations every
 * local rank maps, and the addresses the direct algorithms use in them). */
#ifndef MG_COMM_TRANSPORT_SHM_INTERNAL_H
#define MG_COMM_TRANSPORT_SHM_INTERNAL_H

#include "comm/transport/shm.h"
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct galloc {
    struct galloc *next;
    size_t bytes;       /* as asked (ranges are checked against it) */
    size_t mapped;      /* page-rounded */
    unsigned idx;       /* the same on every rank: allocations are collective */
    uint8_t **base;   /* per rank */
} galloc;

struct mg__shm_transport {
    int rank, size;
    uint64_t gid;
    char (*tags)[MG__SHM_TAG_MAX + 1]; /* per rank: its MG_SHM_TAG, in its names */
    bool all_local;
    bool *local;
    pid_t *pid;
    uint64_t *start;
    int *peers, npeers;        /* local peers, self excluded */
    uint8_t **seg;
    size_t total, ring_bytes, slot_bytes, ring_off, slot_off;
    char name[64];
    bool unlinked;
    mg__spin_cfg spin;
    /* the current operation */
    mg__fp fp;
    uint64_t seq, nbar;
    uint64_t *checked;         /* per rank: seq whose fingerprint matched */
    double deadline, started, next_live;
    double peer_timeout;       /* MG_PEER_TIMEOUT; 0: off */
    const mg__names *names;    /* the group's, for messages */
    uint64_t *beat_seen;       /* per rank: its heartbeat counter, last read... */
    double *beat_at;           /* ...and when it was seen to change */
    mg__shm_view view;
    galloc *allocs;
    unsigned nalloc;
};

/* n rounded up to whole pages. */
size_t mg__shm_page_up(size_t n);
/* The name of rank's allocation idx (its segment's name, then -aIDX). */
void mg__shm_alloc_name(char *buf, size_t n, const mg__shm_transport *x, int rank, unsigned idx);
/* Guard (or stop guarding) the names of the local peers' segments
 * (idx < 0) or allocations idx: see the top of shm.c. */
void mg__shm_guard_peers(mg__shm_transport *x, long idx, bool keep);
/* The view's group-memory operations (shm_alloc.c): a peer's address of
 * this rank's group memory, and group-memory addresses that every rank
 * resolves to its own mapping. */
void *mg__shm_peer_ptr(mg__shm_view *s, int peer, const void *ptr);
uint64_t mg__shm_gaddr(mg__shm_view *s, const void *ptr, size_t bytes);
void *mg__shm_gptr(mg__shm_view *s, int rank, uint64_t ga);

#endif
