/* The builtin backend's state, shared by builtin.c (rendezvous, set-up,
 * split, group memory, teardown) and p2p.c (frames on the channels). */
#ifndef MG_COMM_BUILTIN_H
#define MG_COMM_BUILTIN_H

#include "comm/backend.h"
#include "comm/coll/coll.h"
#include "comm/store/store.h"
#include "comm/transport/shm.h"
#include "comm/transport/tcp.h"

/* What each rank tells the others at rendezvous. */
typedef struct mg__rinfo {
    uint32_t magic, version;
    int32_t rank, size;
    int32_t pid, port;
    uint64_t start, gid;
    int32_t force_tcp, env_local_rank, env_local_size;
    int32_t shm_size[3];     /* MG_SHM_CHUNK, _RING_KB, _SLOT_KB as used: ranks must agree */
    char hostkey[128], host[64], addr[64];
    char shm_tag[MG__SHM_TAG_MAX + 1]; /* in the names of its shared memory */
} mg__rinfo;

/* A point-to-point message that arrived before its receive. */
typedef struct mg__umsg {
    struct mg__umsg *next;
    int peer;
    mg__fp h;
    uint8_t data[];
} mg__umsg;

enum { MG__RX_HEADER, MG__RX_HELD, MG__RX_DIRECT, MG__RX_UNEXP, MG__RX_ABORT, MG__RX_BEAT };

/* One peer: its channel and the frame being received from it. */
typedef struct mg__link {
    mg__chan ch;
    mg__fp h;          /* header of the frame being received */
    size_t hgot;       /* header bytes so far */
    int mode;          /* MG__RX_* */
    uint8_t *dst;      /* where the payload goes */
    size_t left;       /* payload bytes still to come */
    mg__umsg *um;
    mg_status err;     /* why the link failed */
    bool closed;       /* the peer closed it between frames */
    char amsg[MG__ABORT_MAX + 1]; /* an abort notice's text */
} mg__link;

typedef struct mg__bi {
    mg_group *g;
    mg_store *store;
    char prefix[800];
    char secret[512];
    char shm_tag[MG__SHM_TAG_MAX + 1]; /* MG_SHM_TAG: in shared-memory names */
    bool world;              /* the group that joined the store first */
    uint64_t gid;
    bool force_tcp;
    bool said_no_shm;        /* MG_ALGO=shm's fall-back logged (MG_VERBOSE) */
    mg__rinfo *info;         /* per rank */
    mg__link *link;          /* per rank; link[rank] unused */
    mg__shm_transport *shm_transport; /* NULL without local peers */
    mg__p2p p2p;             /* what the algorithms see */
    mg__spin_cfg spin;
    int host_ranks;          /* ranks of the whole job on this host (spin policy) */
    mg__fp fp;               /* the collective being run */
    mg_call sel_call;        /* the last call select.c was asked about... */
    int sel_algo;            /* ...and its answer (steady training loops repeat calls) */
    double deadline;         /* of the request being run */
    double peer_timeout;     /* MG_PEER_TIMEOUT (transport.h); 0: off */
    double beat_s, next_beat; /* heartbeat period; when the next is due */
    mg__umsg *uhead;         /* unexpected messages, arrival order */
    size_t ubytes, umax;
    int nsplit, nexclude;
    int any_next;            /* recv_any's links are read from here round (fairness) */
    void **plain;            /* group memory that is ordinary memory */
    int nplain;
} mg__bi;

/* p2p.c */
void mg__p2p_init(mg__bi *b);
/* Point-to-point requests (send/recv with tags). */
mg_status mg__bi_send(mg__bi *b, const mg__req *r);
mg_status mg__bi_recv(mg__bi *b, const mg__req *r);
/* A receive from MG_ANY_SOURCE (the call's set, or every rank): *peer gets
 * the sender, or the rank of the set that failed (-1: none did). */
mg_status mg__bi_recv_any(mg__bi *b, const mg__req *r, int *peer);
/* A peer whose failure the group contains, for `why`: its link is never
 * used again (a TCP one is shut, which the peer sees); should the peer
 * come back, its operations with this rank fail with MG_ELEFT (a flag in
 * this rank's shared memory, a record in the store). */
void mg__bi_drop_peer(mg__bi *b, int peer, const char *why);
/* Notices in the store for a peer that sees its link to this rank close
 * before it could be told on the link: this rank's abort (to < 0) or its
 * drop of rank to, written before the link closes; get: rank from's
 * message (NUL-terminated, to free), or NULL. */
void mg__bi_notice_put(mg__bi *b, int to, const char *msg);
char *mg__bi_notice_get(mg__bi *b, int from, int to);
/* Tell TCP peers we failed: an abort frame where the stream is at a frame
 * boundary, else a shutdown. */
void mg__bi_abort_links(mg__bi *b, const char *msg);
/* Orderly close of the TCP links: shutdown, drain to EOF (bounded). */
void mg__bi_close_links(mg__bi *b, double deadline);
void mg__bi_free_unexpected(mg__bi *b);
/* Show this rank's sign of life to its peers when one is due (heartbeat
 * frames on quiet TCP channels, the shared-memory counter). Called by
 * the thread that holds the group: often, it costs a clock read. */
void mg__bi_beat(mg__bi *b);
/* The backend's watch (backend.h): every peer checked, local ones through
 * the shared-memory transport's beats and /proc, TCP ones by what they
 * sent, from `since` on (p2p.c). */
mg_status mg__bi_watch(mg_group *g, double since, const char *what);

#endif
