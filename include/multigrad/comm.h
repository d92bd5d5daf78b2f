/* multigrad — communication: process groups, collectives, point-to-point.
 *
 * Used the way torch.distributed is used. A group is initialised from the
 * environment torchrun/mgrun set (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, MG_JOB_SECRET) or from an
 * init method ("tcp://host:port", "file:///path") with explicit rank and
 * size. Every collective has a blocking form and an async form returning
 * an mg_work; operations run in issue order on the group's progress
 * thread; buffers given to async work are borrowed until it completes.
 * As with MPI and NCCL, every rank must issue a group's collectives in
 * the same order: a collective is matched by its place in that order
 * (checked: its kind, count and dtype). Calls from several threads on one
 * group are safe, but their order across threads is not defined, so two
 * threads' collectives of one kind and size may pair with each other's on
 * another rank, silently: give each thread a group of its own
 * (mg_group_split) or order the calls yourself.
 *
 * Counts follow NCCL: all_gather/gather take `count` elements per rank
 * (the receive buffer holds count * size); reduce_scatter/scatter give
 * `count` elements to each rank (the send buffer holds count * size);
 * all_to_all sends `count` elements to each peer. Pass the same pointer
 * (or MG_IN_PLACE as sendbuf) for in-place operation.
 *
 * Buffers may be device memory (device.h: a GPU's, or emu's): the group
 * finds them (mg_device_of) and stages them through host memory, as gloo
 * does with CUDA tensors: what a call reads is copied to the host when it
 * is issued, what it writes is copied back before its work completes. A
 * group whose ranks each have a GPU of their own runs its collectives on
 * GPU memory through NCCL instead (mg_group_use_device).
 *
 * This layer knows nothing of tensors beyond (pointer, count, dtype).
 *
 * Environment (read at init): MG_TIMEOUT (seconds, default 300: every wait
 * of an operation has this deadline), MG_PEER_TIMEOUT (seconds, default 15;
 * 0: off: a peer that shows no sign of life — data or heartbeat — for this
 * long while a rank waits on it is declared dead), MG_BACKEND (builtin | mpi),
 * MG_TRANSPORT (auto | tcp: TCP even between ranks on one host), MG_ALGO
 * (auto | ring | rd | tree | shm), MG_SHM_SLOT_KB and MG_SHM_RING_KB
 * (shared-memory sizes), MG_SPIN_US and MG_YIELD_US (how long a wait spins
 * and yields before sleeping), MG_P2P_UNEXPECTED_MB (bound on messages
 * buffered before their receive), MG_STORE_PORT (a launcher serves the
 * store at MASTER_ADDR:MG_STORE_PORT), MG_RUN_ID (separates restarts
 * sharing a launcher's store), MG_SHM_TAG (set by mgrun: see
 * mg_shm_remove_tagged). */
#ifndef MULTIGRAD_COMM_H
#define MULTIGRAD_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "core.h"
#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MG_AVG: the sum divided by the group's size, in the dtype (an integer
 * average is truncated toward zero, as C divides; torch refuses it). */
typedef enum { MG_SUM, MG_PROD, MG_MIN, MG_MAX, MG_AVG, MG_OP_COUNT } mg_op;

const char *mg_op_name(mg_op op);

/* f32 <-> f16/bf16 (round to nearest even), e.g. to compress gradients. */
void mg_convert_from_f32(void *dst, mg_dtype t, const float *src, size_t n);
void mg_convert_to_f32(float *dst, const void *src, mg_dtype t, size_t n);

typedef struct mg_group mg_group;
typedef struct mg_work mg_work;

typedef struct mg_group_options {
    const char *init_method; /* NULL: env:// (MASTER_ADDR, MASTER_PORT) */
    int rank, size;          /* -1: from RANK, WORLD_SIZE (or an MPI launcher's) */
    int local_rank, local_size; /* -1: from LOCAL_RANK/LOCAL_WORLD_SIZE or rendezvous */
    const char *secret;      /* NULL: MG_JOB_SECRET (none: loopback only) */
    const char *backend;     /* NULL: MG_BACKEND, else mpi under an MPI launcher
                                (when built with MPI), else "builtin" */
    double timeout_s;        /* <= 0: MG_TIMEOUT or 300 */
} mg_group_options;

/* How this process was started, from the environment: by a launcher that
 * sets RANK and WORLD_SIZE (mgrun, torchrun), or by an MPI launcher (Open
 * MPI's mpirun: OMPI_COMM_WORLD_*; PMIx: PMIX_RANK; PMI: PMI_RANK and
 * PMI_SIZE). `by` names it ("RANK", "mpirun", "PMIx", "PMI"; NULL: no
 * launcher); rank, size and the local ones are -1 where it does not say (or
 * says nonsense: mg_group_init names that). */
typedef struct mg_launch {
    const char *by;
    bool mpi;                /* started by an MPI launcher (whatever sets RANK) */
    int rank, size, local_rank, local_size;
} mg_launch;
mg_launch mg_launch_detect(void);
/* A tool's mistake that every rank of a launched job finds alike (its
 * flags): on a rank other than 0 of a job of more than one, wait for the
 * launcher to end this process once rank 0 has said it and exited (mgrun
 * and mpirun stop the others then), at most MG_PEER_TIMEOUT seconds, so
 * that the job says it once; elsewhere return at once. A tool says it
 * after, in case no launcher ended it. */
void mg_launch_defer_to_rank_0(void);
/* Another rank of the job failed first and says why (MG_ESTOPPED): may
 * this one still say its own line? Under mgrun (or none) it waits for the
 * launcher to end it once that rank has exited, at most MG_PEER_TIMEOUT
 * seconds, and returns true if it was not; started by an MPI launcher
 * itself it returns false at once (mpirun ends the job once every rank
 * has left MPI: this one exits without a word). */
bool mg_launch_defer_to_the_first(void);

/* Options that take everything from the environment. */
mg_group_options mg_group_options_default(void);
/* Join the group (blocking until all ranks arrive or the deadline). */
mg_status mg_group_init(const mg_group_options *opt, mg_group **out);
void mg_group_destroy(mg_group *g);
int mg_group_rank(const mg_group *g);
int mg_group_size(const mg_group *g);
int mg_group_local_rank(const mg_group *g);
int mg_group_local_size(const mg_group *g);
double mg_group_timeout(const mg_group *g);
const char *mg_group_backend(const mg_group *g);

/* Payload bytes this rank moved to / from other ranks of g since it was
 * made, all operations (collectives and point-to-point), whatever the
 * transport. Thread-safe to read while operations run (the two counters
 * are read one after the other, not as one snapshot).
 *
 * A byte of data that leaves this rank's buffers for another rank counts
 * as sent once, one that arrives from another rank as received once;
 * frame headers, heartbeats and synchronisation flags do not count, nor
 * copies within the rank (a message to itself, its own block of a
 * gather). Compressed payloads (e.g. DDP's fp16 buckets) count at the
 * size they travel. The direct shared-memory algorithms, where a rank
 * reads a peer's buffer or writes into a peer's output in place, count
 * as if the bytes had been sent: the reader counts them received and the
 * rank whose memory was read counts them sent; the writer counts them
 * sent and the rank whose memory was written counts them received. So
 * over a group, sent and received totals are equal. Sub-groups from
 * mg_group_split count their own traffic, not their parent's.
 *
 * What an operation moves depends on the algorithm (docs/algorithms.md):
 * a ring all_reduce of n bytes moves about 2n(p-1)/p each way per rank,
 * reduce_scatter and all_gather about n(p-1)/p (n: the whole vector),
 * exactly so where the blocks divide evenly; the small-message forms move
 * more. The mpi backend cannot see MPI's transport: it counts each call's
 * algorithmic volume, what the ring algorithms would move (the chains for
 * broadcast and reduce, flat gather and scatter, pairwise all_to_all). */
typedef struct mg_traffic {
    uint64_t sent, received;
    double seconds;   /* this rank's operations of g executing, peers awaited included */
} mg_traffic;
mg_traffic mg_group_traffic(const mg_group *g);
/* A short name of g for traces (e.g. a mesh dimension's "tp"; at most 15
 * characters, NULL or "": none): with MG_TRACE each operation of g is an
 * event "<name> <operation>" on the communication track (tid 3), from
 * when it began executing to when it ended. Local. */
void mg_group_set_name(mg_group *g, const char *name);

/* From now on, a send to or receive from a peer that fails — its
 * process gone, its link broken or closed, silent past MG_PEER_TIMEOUT
 * or the group's deadline — ends that operation alone with MG_EPEER or
 * MG_ETIMEOUT naming the peer (a receive from MG_ANY_SOURCE writes it to
 * *source), and the group goes on with its other ranks: later sends and
 * receives with that peer fail at once, and a collective, which needs
 * every rank, fails the group as before. A parameter server's group
 * contains its workers' failures this way, so one dead or stopped worker
 * neither blocks nor poisons the others. Local; the builtin backend only
 * (MPI ends the job on a dead peer): MG_EUNSUPPORTED elsewhere. */
mg_status mg_group_contain_peer_failures(mg_group *g);
/* A peer that took this rank as lost this way (it was silent past
 * MG_PEER_TIMEOUT, say, and came back) tells it so: this rank's
 * operations with that peer fail with MG_ELEFT, contained as above. A
 * program whose job went on without it exits with MG_EXIT_LEFT, which
 * mgrun --elastic counts as a worker lost, not a failure of the job. */
#define MG_EXIT_LEFT 3

/* As MPI_Comm_split: ranks with the same color form a group, ordered by
 * (key, old rank). color MG_UNDEFINED: *out = NULL. Collective. */
#define MG_UNDEFINED (-1)
mg_status mg_group_split(mg_group *g, int color, int key, mg_group **out);
/* The group of g's ranks but the n_gone in gone (in g's order), made by
 * those ranks alone, as ULFM's MPIX_Comm_shrink: every one of them calls
 * it with the same list, within MG_PEER_TIMEOUT of each other; the ranks
 * left out need not (they may be dead).
 * The ranks that remain go on in the new group after a peer's failure;
 * g itself stays as it is (its sends and receives with the others still
 * work where it contains peer failures). Collective over the ranks that
 * remain, which must have made the same exclusions of g before; the
 * builtin backend only (MG_EUNSUPPORTED elsewhere). */
mg_status mg_group_exclude(mg_group *g, const int *gone, int n_gone, mg_group **out);
/* Ends g on every rank, as ULFM's MPIX_Comm_revoke: from now on this
 * rank's operations on g fail at once, and its peers' (those under way and
 * those to come) fail naming this rank and why. A rank whose collective
 * on g failed needs no call (its failure already ended g); one that gives
 * up on g for a failure elsewhere makes its peers give up too, instead of
 * waiting for it. Local, with no work of g outstanding on this rank; g is
 * still to be destroyed. */
void mg_group_revoke(mg_group *g, const char *why);

/* Names of ranks in messages. Every message of a group that names one of
 * its ranks (the rank speaking, a peer that failed or was waited for)
 * names it by its rank in the world group, the one mg_group_init joined
 * (a sub-group knows its members' world ranks), followed by that rank's
 * label when it has one: "rank 3 (pp 1, dp 1)". Ranks given to and
 * returned by calls (peers, roots, mg_group_rank) stay g's own. */
#define MG_GROUP_LABEL_MAX 47
/* Label this rank in the messages of g and of the groups split from g
 * after this call, e.g. with its coordinates in a mesh ("pp 1, dp 1";
 * NULL or "": none): at most MG_GROUP_LABEL_MAX printable characters,
 * none of them a parenthesis or ';'. Collective over g (it all-gathers
 * the labels), with no work of g outstanding. */
mg_status mg_group_set_label(mg_group *g, const char *label);
/* The world rank of g's rank r. */
int mg_group_world_rank(const mg_group *g, int r);
/* How g's messages name its rank r: "rank 3" or "rank 3 (pp 1, dp 1)".
 * Returns buf. */
const char *mg_group_rank_name(const mg_group *g, int r, char *buf, size_t cap);

/* Collectives on the memory of device d, the device this rank trains on
 * (torch.distributed's "nccl" backend, chosen per group): collective,
 * with no work of g outstanding. When every rank names a GPU of its own
 * (no two on one GPU of one host; hosts told apart as NCCL does, by
 * NCCL_HOSTID when set) and libnccl.so.2 loads on every rank, the group
 * opens an NCCL communicator, and from then on each collective whose
 * buffers lie in that GPU's memory runs through NCCL on a stream of its
 * own, after the GPU work queued before it was issued, in issue order with
 * the group's other calls; every wait has the group's deadline (on a
 * failure the communicator is aborted and the group fails as on any
 * error). NCCL's in-place forms only; sends and receives, barriers, buffers
 * in host memory and other overlaps go through the group's backend,
 * device buffers staged through the host as before. Otherwise (ranks
 * sharing a GPU, as on a one-GPU machine, where NCCL refuses; emu; the CPU)
 * everything stays staged. Sub-groups that mg_group_split makes afterwards
 * choose their own path for the same device. MG_NCCL=auto (default; an
 * NCCL that fails to set up is reported and the host path kept), on (NCCL
 * or an error on every rank) or off (always the host path). Every rank
 * returns the same choice. */
mg_status mg_group_use_device(mg_group *g, mg_device d);
/* "nccl" or "host": the path of g's collectives on device memory; *why
 * (may be NULL) says why in words. */
const char *mg_group_device_path(const mg_group *g, const char **why);

/* The one "ranks agree" check. Collective: every rank learns whether st
 * failed on any (g NULL: st). MG_AGREE_SHARE: every rank gets the first
 * failing rank's status and message. MG_AGREE_LEAVE_FIRST (a tool's
 * input checks, which every rank may find alike): the first failing rank
 * keeps its own; every other rank, failing or not, fails with MG_ESTOPPED,
 * "rank R: stopping because rank F failed (its message says why)". A tool
 * says the one message on rank F and exits; on MG_ESTOPPED it says nothing
 * and lets rank F exit first (mgtrain waits for its launcher to stop it),
 * so that a launcher names rank F as the cause. */
typedef enum { MG_AGREE_SHARE, MG_AGREE_LEAVE_FIRST } mg_agree_mode;
mg_status mg_group_agree(mg_group *g, mg_status st, mg_agree_mode mode);

/* Memory that peers on this host can read directly (shared memory):
 * collectives on it avoid copies. Behaves as ordinary memory otherwise.
 * Collective: every rank calls it with the same size, in the same order
 * (ranks that disagree fail like a mismatched collective). Zeroed; NULL
 * with mg_last_error() on failure. Freeing is local (in order with the
 * queued operations) and works even after the group failed; destroy frees
 * what is left. */
void *mg_group_alloc(mg_group *g, size_t bytes);
void mg_group_free(mg_group *g, void *p);

/* ---- store ------------------------------------------------------------
 * The rendezvous key-value store. Rank 0 serves one over TCP during
 * mg_group_init (unless MG_STORE_PORT says a launcher does); a
 * launcher or test may serve and use one directly. Every connection
 * proves it knows the job secret (HMAC-SHA256 challenge–response); with
 * no secret only loopback clients are accepted. Keys are at most
 * MG_STORE_MAX_KEY bytes, values at most MG_STORE_MAX_VALUE. */
#define MG_STORE_MAX_KEY 1024
#define MG_STORE_MAX_VALUE ((size_t)4 << 20)

typedef struct mg_store mg_store;
typedef struct mg_store_server mg_store_server;

/* Serve on host:port (host NULL: every interface; port 0: a free port)
 * from a thread of this process. secret NULL: MG_JOB_SECRET; "" or unset:
 * none, and then only loopback clients are accepted. */
mg_status mg_store_server_start(const char *host, int port, const char *secret,
                                mg_store_server **out);
int mg_store_server_port(const mg_store_server *s);
/* Stops serving and closes every client connection. Accepts NULL. */
void mg_store_server_stop(mg_store_server *s);

/* For launchers: ranks started with MG_SHM_TAG=tag (up to 16 letters and
 * digits, unique on this host to the ranks this launcher starts) put it in
 * the names of their shared-memory segments; once they have all exited,
 * this removes the names any of them left (a rank killed between creating
 * a segment and its peers mapping it cannot). Returns how many it
 * removed. */
int mg_shm_remove_tagged(const char *tag);

/* Connect to "tcp://host:port" or "file:///path". timeout_s bounds the
 * connection and is the default deadline of get and wait (<= 0: MG_TIMEOUT
 * or 300). secret as for the server. Thread-safe. */
mg_status mg_store_connect(const char *url, const char *secret, double timeout_s,
                           mg_store **out);
void mg_store_destroy(mg_store *s);
mg_status mg_store_set(mg_store *s, const char *key, const void *val, size_t n);
/* Waits until key exists (MG_ETIMEOUT after the store's timeout); *val is
 * malloc'd (free() it) and NUL-terminated after its n bytes. */
mg_status mg_store_get(mg_store *s, const char *key, void **val, size_t *n);
/* Adds delta to the integer value of key (absent: 0); *result may be NULL. */
mg_status mg_store_add(mg_store *s, const char *key, int64_t delta, int64_t *result);
/* Waits until every key exists; timeout_s < 0: the store's timeout. */
mg_status mg_store_wait(mg_store *s, const char *const *keys, int n, double timeout_s);
/* *existed (may be NULL) is 1 if the key was there. */
mg_status mg_store_delete(mg_store *s, const char *key, int *existed);

/* ---- operations ------------------------------------------------------ */

typedef enum {
    MG_COLL_BROADCAST, MG_COLL_REDUCE, MG_COLL_ALL_REDUCE, MG_COLL_ALL_GATHER,
    MG_COLL_GATHER, MG_COLL_SCATTER, MG_COLL_REDUCE_SCATTER, MG_COLL_ALL_TO_ALL,
    MG_COLL_BARRIER, MG_COLL_SEND, MG_COLL_RECV, MG_COLL_COUNT
} mg_coll;
const char *mg_coll_name(mg_coll c);

/* The cost model the builtin backend chooses its algorithms by
 * (src/comm/coll/select.c, docs/algorithms.md): a message costs latency
 * plus its bytes over bandwidth, and reducing costs bytes over reduce.
 * shared_memory: the ranks share a host, so the one-copy shared-memory
 * family is open to them. */
typedef struct mg_link {
    double latency;        /* seconds per message */
    double bandwidth;      /* bytes per second, one direction */
    double reduce;         /* bytes per second summed */
    bool shared_memory;
} mg_link;
/* The figures select.c assumes: "tcp" (loopback or a LAN), "shm" (ranks
 * on one host); NULL for another name. */
const mg_link *mg_link_builtin(const char *transport);
/* Estimated seconds of collective c over p ranks on link l, by the
 * cheapest algorithm (the one the builtin backend would choose): bytes is
 * the whole vector (count x element size for broadcast, reduce and
 * all_reduce; the gathered vector for all_gather and reduce_scatter);
 * MG_COLL_SEND is one message of bytes. 0 for p = 1. */
double mg_coll_time(mg_coll c, double bytes, int p, const mg_link *l);
/* The same by the family MG_ALGO names ("ring", "rd", "tree", "shm",
 * "central"; "auto": mg_coll_time): central, every collective through
 * rank 0, is the one the builtin backend never chooses itself. -1 for an
 * unknown name, or shm on a link without shared memory. */
double mg_coll_time_by(const char *algo, mg_coll c, double bytes, int p, const mg_link *l);
/* The latency and bandwidth that make mg_coll_time(c, ., p, l) give the
 * times measured for a small and a large message (t1 seconds for n1
 * bytes, t2 for n2 > n1), fitted into *l (its reduce rate and
 * shared_memory kept). */
void mg_link_fit(mg_coll c, int p, double n1, double t1, double n2, double t2, mg_link *l);

#define MG_IN_PLACE ((const void *)1)

/* One operation, as every rank describes it. The caller's file:line is part
 * of the fingerprint checked across ranks. */
typedef struct mg_call {
    mg_coll coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    mg_dtype dtype;
    mg_op op;
    int root;        /* root for rooted collectives; peer for send/recv
                        (a receive: MG_ANY_SOURCE, one of `from`) */
    int tag;         /* send/recv */
    /* A receive from MG_ANY_SOURCE: the nfrom ranks it takes a message
     * from (NULL: every rank), and where it writes the rank the message
     * came from (or, when it fails on one, that peer's rank; NULL: not
     * written). */
    const int *from;
    int nfrom;
    int *source;
    const char *file; /* the call's place, for messages (the macros fill it) */
    int line;
} mg_call;

/* Start an operation; *work completes it. A bad argument (MG_EINVAL) or a
 * group that failed earlier returns the error at once with *work = NULL.
 * Every wait inside an operation has the group's deadline; a dead peer, a
 * mismatched collective or a timeout fails the operation on every rank
 * with a message naming the rank, the operation and its sequence number,
 * and the group is then unusable (later calls fail fast, same error) —
 * except a peer's failure in a send or receive of a group that contains
 * them (mg_group_contain_peer_failures). */
mg_status mg_start(mg_group *g, const mg_call *c, mg_work **work);
/* Start and wait (runs on the calling thread when nothing is queued). */
mg_status mg_run(mg_group *g, const mg_call *c);

/* Wait up to timeout_s seconds (< 0: until the operation completes, which
 * its own deadline, the group's timeout, guarantees). Returns the
 * operation's status; MG_ETIMEOUT if it has not completed (it goes on).
 * Completed work may be waited for, tested and freed even after the
 * group is destroyed (destroy completes all queued work first). */
mg_status mg_work_wait(mg_work *w, double timeout_s);
/* 1 if complete (successfully or not), else 0. */
int mg_work_test(mg_work *w);
/* When a completed operation began and ended executing (mg_now() clock);
 * for profiling, e.g. how much communication overlapped computation. */
void mg_work_times(const mg_work *w, double *start, double *end);
/* Free a work handle (NULL is fine); waits for the operation first if it
 * is pending. */
void mg_work_free(mg_work *w);

/* The call of a macro below, with its place. In C++ (20, or 17 with GNU
 * designated initializers) a temporary that lives to the end of the
 * statement: a compound literal's address is C only. */
#ifdef __cplusplus
static inline const mg_call *mg__call_here(const mg_call &c) { return &c; }
/* (g++ -Wextra warns of the fields a call leaves out, which are zero as
 * in C: -Wno-missing-field-initializers.) */
#define MG__CALL(...) mg__call_here(mg_call{ __VA_ARGS__, .file = __FILE__, .line = __LINE__ })
#else
#define MG__CALL(...) (&(mg_call){ __VA_ARGS__, .file = __FILE__, .line = __LINE__ })
#endif

/* Blocking forms. */
#define mg_broadcast(g, buf_, count_, dtype_, root_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_BROADCAST, .sendbuf = (buf_), .recvbuf = (buf_), \
                       .count = (count_), .dtype = (dtype_), .root = (root_)))
#define mg_reduce(g, sbuf_, rbuf_, count_, dtype_, op_, root_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_REDUCE, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                       .count = (count_), .dtype = (dtype_), .op = (op_), .root = (root_)))
#define mg_all_reduce(g, sbuf_, rbuf_, count_, dtype_, op_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_ALL_REDUCE, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                       .count = (count_), .dtype = (dtype_), .op = (op_)))
#define mg_all_gather(g, sbuf_, rbuf_, count_, dtype_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_ALL_GATHER, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                       .count = (count_), .dtype = (dtype_)))
#define mg_gather(g, sbuf_, rbuf_, count_, dtype_, root_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_GATHER, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                       .count = (count_), .dtype = (dtype_), .root = (root_)))
#define mg_scatter(g, sbuf_, rbuf_, count_, dtype_, root_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_SCATTER, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                       .count = (count_), .dtype = (dtype_), .root = (root_)))
#define mg_reduce_scatter(g, sbuf_, rbuf_, count_, dtype_, op_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_REDUCE_SCATTER, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                       .count = (count_), .dtype = (dtype_), .op = (op_)))
#define mg_all_to_all(g, sbuf_, rbuf_, count_, dtype_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_ALL_TO_ALL, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                       .count = (count_), .dtype = (dtype_)))
#define mg_barrier(g) mg_run(g, MG__CALL(.coll = MG_COLL_BARRIER))
#define mg_send(g, buf_, count_, dtype_, peer_, tag_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_SEND, .sendbuf = (buf_), .count = (count_), \
                       .dtype = (dtype_), .root = (peer_), .tag = (tag_)))
/* Receive the first message with tag from any of the nfrom ranks in
 * `from` (NULL: any rank), as a parameter server takes whichever worker
 * pushes first (gloo's recv from a set of ranks, MPI_ANY_SOURCE): the
 * earliest already arrived, else whichever arrives first; *source (if
 * not NULL) gets its rank. Counts and dtypes must match as for mg_recv.
 * Collectives' frames from ranks still in an earlier operation wait
 * their turn. Not in batches (mg_batch_isend_irecv). */
#define MG_ANY_SOURCE (-2)
#define mg_recv_any(g, buf_, count_, dtype_, from_, nfrom_, tag_, source_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_RECV, .recvbuf = (buf_), .count = (count_), \
                       .dtype = (dtype_), .root = MG_ANY_SOURCE, .tag = (tag_), \
                       .from = (from_), .nfrom = (nfrom_), .source = (source_)))
#define mg_irecv_any(g, buf_, count_, dtype_, from_, nfrom_, tag_, source_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_RECV, .recvbuf = (buf_), .count = (count_), \
                         .dtype = (dtype_), .root = MG_ANY_SOURCE, .tag = (tag_), \
                         .from = (from_), .nfrom = (nfrom_), .source = (source_)), w)
#define mg_recv(g, buf_, count_, dtype_, peer_, tag_) \
    mg_run(g, MG__CALL(.coll = MG_COLL_RECV, .recvbuf = (buf_), .count = (count_), \
                       .dtype = (dtype_), .root = (peer_), .tag = (tag_)))

/* Async forms: the same arguments and a trailing mg_work **. */
#define mg_broadcast_async(g, buf_, count_, dtype_, root_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_BROADCAST, .sendbuf = (buf_), .recvbuf = (buf_), \
                         .count = (count_), .dtype = (dtype_), .root = (root_)), w)
#define mg_all_reduce_async(g, sbuf_, rbuf_, count_, dtype_, op_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_ALL_REDUCE, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                         .count = (count_), .dtype = (dtype_), .op = (op_)), w)
#define mg_reduce_scatter_async(g, sbuf_, rbuf_, count_, dtype_, op_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_REDUCE_SCATTER, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                         .count = (count_), .dtype = (dtype_), .op = (op_)), w)
#define mg_all_gather_async(g, sbuf_, rbuf_, count_, dtype_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_ALL_GATHER, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                         .count = (count_), .dtype = (dtype_)), w)
#define mg_reduce_async(g, sbuf_, rbuf_, count_, dtype_, op_, root_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_REDUCE, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                         .count = (count_), .dtype = (dtype_), .op = (op_), .root = (root_)), w)
#define mg_gather_async(g, sbuf_, rbuf_, count_, dtype_, root_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_GATHER, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                         .count = (count_), .dtype = (dtype_), .root = (root_)), w)
#define mg_scatter_async(g, sbuf_, rbuf_, count_, dtype_, root_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_SCATTER, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                         .count = (count_), .dtype = (dtype_), .root = (root_)), w)
#define mg_all_to_all_async(g, sbuf_, rbuf_, count_, dtype_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_ALL_TO_ALL, .sendbuf = (sbuf_), .recvbuf = (rbuf_), \
                         .count = (count_), .dtype = (dtype_)), w)
#define mg_barrier_async(g, w) mg_start(g, MG__CALL(.coll = MG_COLL_BARRIER), w)
#define mg_isend(g, buf_, count_, dtype_, peer_, tag_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_SEND, .sendbuf = (buf_), .count = (count_), \
                         .dtype = (dtype_), .root = (peer_), .tag = (tag_)), w)
#define mg_irecv(g, buf_, count_, dtype_, peer_, tag_, w) \
    mg_start(g, MG__CALL(.coll = MG_COLL_RECV, .recvbuf = (buf_), .count = (count_), \
                         .dtype = (dtype_), .root = (peer_), .tag = (tag_)), w)

/* Point-to-point operations posted together, as torch's
 * batch_isend_irecv: one request on the group whose sends all start
 * before its receives whatever their order in ops, so a receive listed
 * first never holds up a later send and two ranks (pipeline stages)
 * exchanging with each other never wait on each other. Each operation is
 * numbered and matched (peer and tag, sizes checked) as mg_isend/mg_irecv
 * would be; *w completes when all have. */
typedef struct mg_p2p_op {
    mg_coll coll;      /* MG_COLL_SEND or MG_COLL_RECV */
    void *buf;         /* sent from, or received into */
    size_t count;
    mg_dtype dtype;
    int peer, tag;
} mg_p2p_op;
mg_status mg__batch(mg_group *g, const mg_p2p_op *ops, int n, const char *file, int line,
                    mg_work **w);
#define mg_batch_isend_irecv(g, ops, n, w) mg__batch(g, ops, n, __FILE__, __LINE__, w)
/* Send scount elements to `to` and receive rcount from `from` at once
 * (MPI_Sendrecv): blocking, one batch of the two. */
mg_status mg__sendrecv_user(mg_group *g, const void *sbuf, size_t scount, int to, int stag,
                       void *rbuf, size_t rcount, int from, int rtag, mg_dtype dtype,
                       const char *file, int line);
#define mg_sendrecv(g, sbuf, scount, to, stag, rbuf, rcount, from, rtag, dtype)            \
    mg__sendrecv_user(g, sbuf, scount, to, stag, rbuf, rcount, from, rtag, dtype, __FILE__, __LINE__)

#ifdef __cplusplus
}
#endif
#endif
