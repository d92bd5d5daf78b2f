/* The shared-memory transport: one POSIX shm segment per rank holding
 * its control lines (posted counters, barrier count, fingerprint, sleep
 * flag and doorbell futex, abort notice), one receive ring per local
 * peer, and — when every rank of the group is on this host — the scratch
 * slot of the mg__shm_view (coll.h). Group memory (mg_group_alloc) is one
 * more segment per rank and allocation, mapped by every local peer. */
#ifndef MG_COMM_SHM_H
#define MG_COMM_SHM_H

#include "comm/coll/coll.h"
#include "comm/transport/transport.h"

typedef struct mg__shm_transport mg__shm_transport;

/* The longest MG_SHM_TAG (letters and digits). */
#define MG__SHM_TAG_MAX 16

typedef struct mg__shm_transport_cfg {
    uint64_t gid;
    /* per group rank: "" or its MG_SHM_TAG (checked), in the names of its
     * segments (the ranks of one host may have different ones) */
    const char (*tags)[MG__SHM_TAG_MAX + 1];
    int rank, size;
    const bool *local;     /* per group rank: reached through shm (self included) */
    bool all_local;        /* every rank local: slots and the mg__shm_view */
    size_t ring_bytes;     /* per peer; rounded down to a power of two */
    size_t slot_bytes;
    mg__spin_cfg spin;
    const pid_t *pid;      /* per group rank, for liveness checks */
    const uint64_t *start;
    double peer_timeout;   /* MG_PEER_TIMEOUT (transport.h); 0: off */
    const mg__names *names; /* the group's, to name ranks in messages */
} mg__shm_transport_cfg;

/* Names of segments on this host not yet removed (shm_names.c): keep one
 * in the table the guarded signals unlink, drop it; create a segment of
 * this process's under a name kept from before it exists (fd, or -1 with
 * errno); unlink one and drop its name. */
void mg__shm_name_keep(const char *name);
void mg__shm_name_drop(const char *name);
int mg__shm_named_create(const char *name);
void mg__shm_named_unlink(const char *name);
/* Size a segment just created to bytes, its pages reserved now: tmpfs
 * sizes a file past its room without a word, and the first touch of a
 * page beyond it killed the process with SIGBUS (a probe, under a 64 MB
 * /dev/shm). MG_ENOMEM naming what (for the message) when /dev/shm has no
 * room. */
mg_status mg__shm_named_size(int fd, const char *name, size_t bytes, const char *what);

/* Create and map this rank's segment (named after gid and rank). */
mg_status mg__shm_transport_create(const mg__shm_transport_cfg *cfg, mg__shm_transport **out);
/* Map every local peer's segment, checking what it says about itself. */
mg_status mg__shm_transport_attach(mg__shm_transport *x);
/* Remove this rank's segment name once every peer has mapped it: the
 * memory then lives exactly as long as some process maps it. */
void mg__shm_transport_unlink(mg__shm_transport *x);
void mg__shm_transport_destroy(mg__shm_transport *x);
/* Set up c as the channel to local peer `peer`. */
void mg__shm_transport_chan(mg__shm_transport *x, int peer, mg__chan *c);
/* Channel operations (transport.h dispatches to these). */
ssize_t mg__shm_chan_write(mg__chan *c, const void *a, size_t an, const void *b, size_t bn);
ssize_t mg__shm_chan_read(mg__chan *c, void *buf, size_t n);
bool mg__shm_chan_readable(mg__chan *c);
bool mg__shm_chan_writable(mg__chan *c);
/* Wake `peer` if it sleeps. */
void mg__shm_transport_wake(mg__shm_transport *x, int peer);

/* Start an operation: publish its fingerprint, reset the counter, and
 * set the deadline waits honour. */
void mg__shm_transport_begin(mg__shm_transport *x, const mg__fp *fp, double deadline);
/* For requests that are not collectives (point-to-point): the deadline
 * waits honour. */
void mg__shm_transport_set_deadline(mg__shm_transport *x, double started, double deadline);
/* The mg__shm_view for algorithms (only when all ranks are local). */
mg__shm_view *mg__shm_transport_view(mg__shm_transport *x);

/* Sleep up to slice seconds on this rank's doorbell unless ready(arg). */
void mg__shm_transport_block(mg__shm_transport *x, double slice, bool (*ready)(void *), void *arg);
/* Show this rank's sign of life to its local peers (a counter in its
 * segment; cheap enough for every wait). */
void mg__shm_transport_beat(mg__shm_transport *x);
/* After a block: fail if a local peer aborted, if one of peers[0..n) died
 * or showed no sign of life for the peer timeout (checked every few
 * hundred ms), or if the deadline passed. Beats too. `what` describes the
 * wait for messages; *failed (if not NULL) gets the rank the failure is
 * of, where it is one rank's. */
mg_status mg__shm_transport_check(mg__shm_transport *x, const int *peers, int n, const char *what,
                                  int *failed);
/* First local peer that announced an abort (its message to msg), or -1. */
int mg__shm_transport_aborted(mg__shm_transport *x, char *msg, size_t n);
/* Announce this rank's failure to every local peer and wake them. */
void mg__shm_transport_abort(mg__shm_transport *x, const char *msg);
/* This rank took local peer `peer` as lost (a group that contains peer
 * failures): the peer's waits on this rank fail with MG_ELEFT, and its
 * abort notices are not this rank's concern any more. */
void mg__shm_transport_drop(mg__shm_transport *x, int peer);

/* Group memory: collective among the (all local) ranks, on the executor,
 * inside an operation begun with mg__shm_transport_begin. */
mg_status mg__shm_transport_alloc(mg__shm_transport *x, size_t bytes, void **out);
/* 1 if p came from mg__shm_transport_alloc (and is now unmapped), else 0. */
int mg__shm_transport_free(mg__shm_transport *x, void *p);

/* Shared by the liveness and timeout messages: "rank 3 (pp 1, dp 1; pid
 * 123, this host)". */
void mg__shm_transport_describe_peer(mg__shm_transport *x, int peer, char *buf, size_t n);

#endif
