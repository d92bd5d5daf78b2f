/* The backend vtable and the parts of a group every backend shares.
 *
 * The generic layer (group.c, work.c) owns the group's queue and its one
 * progress thread: requests run one at a time, in issue order, either on
 * that thread or — when nothing is queued — inline on the caller's thread
 * (a blocking call then costs no thread hand-off). A backend only
 * executes requests: `builtin` (our store, transports and algorithms) or
 * `mpi` (Open MPI carries everything; it can implement run() with
 * MPI_I* + MPI_Test against the request's deadline, since the layer above
 * only needs run() to return within the group's timeout).
 *
 * A backend's run() executes on whichever thread holds the group's
 * execution right, never two at once, so MPI_THREAD_SERIALIZED suffices.
 * When run() fails the generic layer marks the group failed (later
 * requests fail fast with the same error) and calls abort() once, on the
 * executing thread, so the backend can tell its peers. */
#ifndef MG_COMM_BACKEND_H
#define MG_COMM_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include "multigrad/comm.h"
#include "comm/names.h"
#include "comm/traffic.h"
#include "multigrad/device.h"

typedef enum { MG__REQ_CALL, MG__REQ_SPLIT, MG__REQ_EXCLUDE, MG__REQ_ALLOC, MG__REQ_FREE,
               MG__REQ_BATCH } mg__req_kind;

/* One queued request. */
typedef struct mg__req {
    mg__req_kind kind;
    /* CALL: sendbuf resolved (MG_IN_PLACE -> recvbuf). */
    mg_call c;
    /* Collectives (and SPLIT/ALLOC, which are collective): the group's
     * sequence number, 1, 2, ... — the same on every rank. Send/recv: the
     * number of earlier sends to (receives from) that peer, for messages. */
    uint64_t seq;
    /* SPLIT (color, key), EXCLUDE (gone: ngone ranks of the group) */
    int color, key;
    const int *gone;
    int ngone;
    mg_group **out_group;
    /* ALLOC (bytes -> *out_ptr) and FREE (ptr) */
    size_t bytes;
    void *ptr;
    void **out_ptr;
    /* BATCH (work.c, never seen by a backend): nsub sends and receives,
     * numbered as if issued one by one, run as one request with every
     * send before every receive; owned by the request. */
    struct mg__req *sub;
    int nsub;
    /* Set by run() when it refused the request before any communication
     * (e.g. a receive from itself with nothing sent): the error is the
     * caller's alone and the group stays usable. */
    bool rejected;
    /* Set by run() when a peer's failure ended this send or receive alone
     * (the group contains them): the group stays usable for its others. */
    bool contained;
    /* CALL on device memory (stage.c): the host copies the backend uses. */
    struct mg__stage *stage;
    /* CALL through NCCL (nccl.h): the event of the GPU work before it. */
    void *nccl;
} mg__req;

/* A CALL's buffers in device memory staged through host memory
 * (stage.c): mg__stage_in when it is issued (copies in what it reads and
 * points the call at host memory), mg__stage_out when it has run (copies
 * back what it wrote when `copy`, and frees the host memory). Other
 * requests and host buffers are left alone. */
mg_status mg__stage_in(mg__req *r, int rank, int size);
mg_status mg__stage_out(mg__req *r, bool copy);

typedef struct mg__backend {
    const char *name;
    /* Join the group opt describes: set g->rank, size, local_rank,
     * local_size and impl (g->timeout is already set). */
    mg_status (*init)(mg_group *g, const mg_group_options *opt);
    /* Execute one request. SPLIT creates the sub-group with mg__group_new,
     * fills it as init would (its names with mg__names_sub from the parent
     * ranks mg__split_members finds) and starts it with mg__group_start
     * (or sets *out_group = NULL for MG_UNDEFINED). ALLOC/FREE: group
     * memory. */
    mg_status (*run)(mg_group *g, mg__req *r);
    /* The group failed with msg: tell the peers, best effort and quickly. */
    void (*abort)(mg_group *g, const char *msg);
    /* Optional: called on the progress thread about every g->tick_s
     * seconds while the group is idle (it holds the execution right), so
     * the backend can show its peers that this rank lives while the
     * caller computes. */
    void (*tick)(mg_group *g);
    /* Optional: called about once a second while this rank waits on work
     * the backend does not run (an NCCL call, begun at `since`, which
     * `what` names): beats for this rank, and fails naming the peer when
     * one died, stopped, or showed no sign of life for the peer timeout
     * since then, as the backend's own waits do. */
    mg_status (*watch)(mg_group *g, double since, const char *what);
    /* Release everything; the progress thread has stopped and the queue
     * is empty. */
    void (*destroy)(mg_group *g);
} mg__backend;

struct mg_work;

struct mg_group {
    const mg__backend *be;
    void *impl;
    int rank, size, local_rank, local_size;
    double timeout;
    double tick_s;              /* be->tick's period (0: no ticks) */
    /* the queue (work.c) */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    struct mg_work *head, *tail;
    bool executing, stop, has_thread;
    pthread_t thread;
    uint64_t seq;               /* collectives issued */
    uint64_t *sends, *recvs;    /* per peer: sends / receives issued */
    uint64_t recvs_any;         /* receives from MG_ANY_SOURCE issued */
    atomic_bool contain;        /* mg_group_contain_peer_failures */
    /* payload bytes moved to and from other ranks, and the time its
     * operations took (traffic.h); its name in traces (mg_group_set_name) */
    mg__traffic traffic;
    char trace_name[16];
    /* how messages name the ranks (names.h): set by a backend's split for
     * its sub-groups, labels by mg_group_set_label */
    mg__names names;
    /* collectives on device memory (mg_group_use_device): the device
     * named, whether named, NCCL's communicator (NULL: staged through the
     * host) and why that path */
    mg_device dev;
    bool dev_named;
    struct mg__nccl *nccl;
    char dev_why[256];
    bool nccl_rules;            /* MG_BATCH_RULES=nccl: batches run by NCCL's rules (work.c) */
    uint8_t *linked;            /* by those rules, per peer: the directions connected */
    /* failure */
    atomic_int failed;
    mg_status fail_code;
    char fail_msg[1024];
};

/* A group with its queue initialised; the backend fills in the rest. */
mg_group *mg__group_new(const mg__backend *be, double timeout);
/* Once rank and size are known: start the progress thread. */
mg_status mg__group_start(mg_group *g);
/* Stop the thread (after the queue drains), call be->destroy, free. */
void mg__group_free(mg_group *g);
/* Mark the group failed (first failure wins) and call be->abort. */
void mg__group_fail(mg_group *g, mg_status code, const char *msg);

/* Run a request (any kind) in order and wait for it. */
mg_status mg__run_req(mg_group *g, mg__req *r);

/* Backends by name ("builtin", "mpi"); NULL if not built. */
const mg__backend *mg__backend_find(const char *name);
extern const mg__backend mg__backend_builtin;

/* rank, size etc. as given or from the environment (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE), validated. For backends that do not get
 * them from elsewhere. */
mg_status mg__resolve_ranks(const mg_group_options *opt, int *rank, int *size,
                            int *local_rank, int *local_size);

#endif
