/* Collectives on GPU memory through NCCL (see nccl.h).
 *
 * NCCL is opened at the first use of a GPU's group (dlopen of
 * libnccl.so.2), not linked: a build with the CUDA toolkit and NCCL's
 * header runs where NCCL is missing, its groups staging through the host.
 *
 * - The communicator is non-blocking (ncclConfig_t.blocking = 0): its
 *   set-up and every call are polled against the group's deadline, and a
 *   rank that never joins, or dies, ends in ncclCommAbort and an error
 *   naming the call, not a hang. While a call waits, the group's host
 *   backend watches the peers once a second (backend.h's watch): one
 *   stopped or silent is named within MG_PEER_TIMEOUT.
 * - Calls go on a stream of NCCL's own (non-blocking) that first waits
 *   for an event recorded at issue on the legacy default stream, which
 *   follows every blocking stream's work queued before: the kernels that
 *   wrote the buffers and the zeroing of fresh allocations.
 * - gather, scatter and all_to_all are NCCL's sends and receives in one
 *   ncclGroupStart/End, the rank's own block a device copy.
 * - A batch of sends and receives (mg_batch_isend_irecv) whose buffers
 *   are all on the GPU is one ncclGroupStart/End of ncclSend and ncclRecv
 *   in the batch's order. NCCL matches the messages between two ranks in
 *   the order they were posted, not by tag, and a send ends only with its
 *   receive: the peer must post the same messages in the same order, in
 *   batches (README). Single sends and receives stay staged through the
 *   host, where a send never waits for its receive.
 * - Traffic (mg_group_traffic) counts what the ring algorithms would move
 *   (mg__ring_volume), as the mpi backend does: NCCL does not say. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "comm/nccl.h"
#include "comm/call.h"
#include "comm/coll/coll.h"
#include "multigrad/core.h"

#if defined(MG_HAVE_CUDA) && defined(__has_include)
#if __has_include(<nccl.h>)
#define MG__WITH_NCCL 1
#endif
#endif

/* ---- the plan (pure; every build) ---------------------------------------- */

/* A bus id as cudaDeviceGetPCIBusId writes it: printable, ended within
 * the field ("" for no GPU). */
static bool bus_ok(const char *b, size_t cap)
{
    for (size_t i = 0; i < cap; i++) {
        if (!b[i]) return true;
        if (b[i] < 32 || b[i] > 126) return false;
    }
    return false;
}

bool mg__nccl_plan(const mg__nccl_peer *p, int n, const mg__names *nm, char *why, size_t cap)
{
    char a[128], b[128];
    for (int i = 0; i < n; i++) {
        mg__rank_name(nm, i, NULL, a, sizeof a);
        if (!bus_ok(p[i].bus, sizeof p[i].bus) || (p[i].loaded != 0 && p[i].loaded != 1)) {
            snprintf(why, cap, "%s described itself in a form this build does not know "
                     "(give every rank the same multigrad)", a);
            return false;
        }
        if (!p[i].bus[0]) {
            snprintf(why, cap, "%s's device is not a GPU", a);
            return false;
        }
        if (!p[i].loaded) {
            snprintf(why, cap, "%s cannot load NCCL (libnccl.so.2: install NCCL there, "
                     "or put its directory on LD_LIBRARY_PATH)", a);
            return false;
        }
        if (p[i].version != p[0].version) {
            snprintf(why, cap, "%s has NCCL %d and %s NCCL %d: give every rank one version", a,
                     p[i].version, mg__rank_name(nm, 0, NULL, b, sizeof b), p[0].version);
            return false;
        }
        for (int j = 0; j < i; j++)
            if (p[j].host == p[i].host && !strncmp(p[j].bus, p[i].bus, sizeof p[i].bus)) {
                snprintf(why, cap, "%s and %s share one GPU (%s): NCCL needs a GPU for "
                         "each rank", mg__rank_name(nm, j, NULL, b, sizeof b), a, p[i].bus);
                return false;
            }
    }
    snprintf(why, cap, "every rank has a GPU of its own");
    return true;
}

/* FNV-1a, to name a host in 64 bits. */
static uint64_t fnv(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* As NCCL tells hosts apart: NCCL_HOSTID when set, else the host name and
 * the boot id (two containers of one host are one host). */
static uint64_t host_id(void)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const char *id = mg_env_other("NCCL_HOSTID");
    if (id && *id) return fnv(h, id, strlen(id));
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    h = fnv(h, name, strlen(name));
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        char boot[64] = "";
        if (fgets(boot, sizeof boot, f)) h = fnv(h, boot, strlen(boot));
        fclose(f);
    }
    return h;
}

#ifndef MG__WITH_NCCL

void mg__nccl_me(mg_device d, mg__nccl_peer *me)
{
    (void)d;
    memset(me, 0, sizeof *me);
    me->host = host_id();
}

mg_status mg__nccl_open(mg_group *g, mg_device d, mg__nccl **out)
{
    (void)g, (void)d;
    *out = NULL;
    return mg_error(MG_EUNSUPPORTED, "this build has no NCCL (it needs the CUDA toolkit and "
                    "NCCL's header, nccl.h)");
}

bool mg__nccl_takes(const mg__nccl *n, const mg__req *r, int rank, int size)
{
    (void)n, (void)r, (void)rank, (void)size;
    return false;
}
mg_status mg__nccl_issue(mg__nccl *n, mg__req *r, int rank, int size)
{
    (void)n, (void)r, (void)rank, (void)size;
    return MG_OK;
}
void mg__nccl_release(mg__req *r) { (void)r; }
mg_status mg__nccl_run(mg_group *g, mg__req *r)
{
    (void)g, (void)r;
    return mg_error(MG_EUNSUPPORTED, "this build has no NCCL");
}
void mg__nccl_abort(mg__nccl *n) { (void)n; }
void mg__nccl_close(mg__nccl *n) { (void)n; }

#else /* MG__WITH_NCCL */

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include "device/dk.h"
#include "device/sparse.h"

/* ---- NCCL, opened at first use ----------------------------------------- */

static struct {
    ncclResult_t (*version)(int *);
    ncclResult_t (*unique_id)(ncclUniqueId *);
    ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*abort)(ncclComm_t);
    ncclResult_t (*finalize)(ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
    const char *(*last_error)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
                           ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                   ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
} nc;
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;
static bool nc_ok;
static int nc_version;

/* The pointer types are checked against nccl.h's declarations. */
#define SYM(h, field, name)                                                           \
    do {                                                                              \
        _Static_assert(__builtin_types_compatible_p(__typeof__(nc.field),             \
                                                    __typeof__(&name)), #name);       \
        *(void **)&nc.field = dlsym(h, #name);                                        \
        ok = ok && nc.field;                                                          \
    } while (0)

static void nc_load(void)
{
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        mg_debug("NCCL not loaded: %s", dlerror());
        return;
    }
    bool ok = true;
    SYM(h, version, ncclGetVersion);
    SYM(h, unique_id, ncclGetUniqueId);
    SYM(h, init, ncclCommInitRankConfig);
    SYM(h, async_error, ncclCommGetAsyncError);
    SYM(h, abort, ncclCommAbort);
    SYM(h, finalize, ncclCommFinalize);
    SYM(h, destroy, ncclCommDestroy);
    SYM(h, error_string, ncclGetErrorString);
    SYM(h, last_error, ncclGetLastError);
    SYM(h, all_reduce, ncclAllReduce);
    SYM(h, broadcast, ncclBroadcast);
    SYM(h, reduce, ncclReduce);
    SYM(h, all_gather, ncclAllGather);
    SYM(h, reduce_scatter, ncclReduceScatter);
    SYM(h, send, ncclSend);
    SYM(h, recv, ncclRecv);
    SYM(h, group_start, ncclGroupStart);
    SYM(h, group_end, ncclGroupEnd);
    if (ok && nc.version(&nc_version) == ncclSuccess) {
        nc_ok = true;
        return;
    }
    mg_debug("NCCL not used: libnccl.so.2 lacks the calls of NCCL 2.14 and later");
    dlclose(h);
}

void mg__nccl_me(mg_device d, mg__nccl_peer *me)
{
    memset(me, 0, sizeof *me);
    me->host = host_id();
    if (d.kind != MG_DEVICE_CUDA ||
        cudaDeviceGetPCIBusId(me->bus, (int)sizeof me->bus, d.index) != cudaSuccess)
        me->bus[0] = 0;
    if (!me->bus[0]) return;
    pthread_once(&nc_once, nc_load);
    me->loaded = nc_ok;
    me->version = nc_ok ? nc_version : 0;
}

struct mg__nccl {
    ncclComm_t comm;
    mg_device dev;
    cudaStream_t stream;
    cudaEvent_t done;
    char *tmp;              /* scratch for overlapping buffers (launch) */
    size_t tmp_bytes;
    bool aborted;
};

static const char *nc_error(mg__nccl *n, ncclResult_t rc)
{
    static __thread char buf[512];
    const char *last = n && n->comm ? nc.last_error(n->comm) : NULL;
    snprintf(buf, sizeof buf, "%s%s%s", nc.error_string(rc), last && *last ? ": " : "",
             last ? last : "");
    return buf;
}

/* Sleeps *ns, and twice as long the next time, up to cap. */
static void backoff(long *ns, long cap)
{
    struct timespec ts = {0, *ns};
    nanosleep(&ts, NULL);
    if (*ns < cap) *ns *= 2;
}

/* A call being waited for (mg__nccl_run): while it waits, the group's
 * host backend watches the peers once a second. */
typedef struct waiter {
    mg_group *g;
    const char *what;
    double since, deadline, watch;   /* watch: when next */
    mg_status st;                    /* what the watch found */
} waiter;

/* False once the watch has found a peer stopped or gone (w->st). */
static bool watched(waiter *w, double now)
{
    if (!w || !w->g->be->watch || now < w->watch) return true;
    char waiting[420];
    snprintf(waiting, sizeof waiting, "waiting for %s", w->what);
    w->st = w->g->be->watch(w->g, w->since, waiting);
    w->watch = now + 1;
    return !w->st;
}

/* Waits while n's communicator is busy with a non-blocking call or its
 * set-up (ncclInProgress: a group whose first message to a peer makes
 * the link waits there for the peer), until the deadline, watching the
 * peers when w is given. */
static ncclResult_t settle(mg__nccl *n, double deadline, waiter *w)
{
    ncclResult_t rc = ncclInProgress;
    for (long ns = 20000;; backoff(&ns, 1000000)) {
        if (nc.async_error(n->comm, &rc) != ncclSuccess) return ncclInternalError;
        double now = mg_now();
        if (rc != ncclInProgress || now > deadline) return rc;
        if (!watched(w, now)) return ncclInternalError;
    }
}

void mg__nccl_abort(mg__nccl *n)
{
    if (!n || n->aborted || !n->comm) return;
    n->aborted = true;
    nc.abort(n->comm);
}

void mg__nccl_close(mg__nccl *n)
{
    if (!n) return;
    if (n->comm && !n->aborted) {
        cudaSetDevice(n->dev.index);
        ncclResult_t rc = nc.finalize(n->comm);
        if (rc == ncclInProgress) rc = settle(n, mg_now() + 10, NULL);
        if (rc == ncclSuccess) nc.destroy(n->comm);
        else nc.abort(n->comm);
    }
    cudaFree(n->tmp);
    if (n->done) cudaEventDestroy(n->done);
    if (n->stream) cudaStreamDestroy(n->stream);
    free(n);
}

/* The least of every rank's *v, on every rank (a host all-reduce on g). */
static mg_status agree(mg_group *g, int *v)
{
    int32_t x = *v;
    MG_TRY(mg_all_reduce(g, &x, &x, 1, MG_I32, MG_MIN));
    *v = x;
    return MG_OK;
}

mg_status mg__nccl_open(mg_group *g, mg_device d, mg__nccl **out)
{
    *out = NULL;
    struct { int32_t ok; char why[200]; ncclUniqueId id; } root;
    memset(&root, 0, sizeof root);
    if (g->rank == 0) {
        ncclResult_t rc = nc.unique_id(&root.id);
        root.ok = rc == ncclSuccess;
        if (!root.ok) snprintf(root.why, sizeof root.why, "%.199s", nc_error(NULL, rc));
    }
    MG_TRY(mg_broadcast(g, &root, sizeof root, MG_U8, 0));
    root.why[sizeof root.why - 1] = 0;   /* a peer's words, printed below */
    if (!root.ok)
        return mg_error(MG_EIO, "NCCL: rank 0 could not make the communicator's id: %s",
                        root.why);
    mg__nccl *n = calloc(1, sizeof *n);
    char why[512] = "";
    int ok = n != NULL;
    if (!ok) snprintf(why, sizeof why, "out of memory");
    if (ok) {
        n->dev = d;
        cudaError_t e = cudaSetDevice(d.index);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            ok = 0;
            snprintf(why, sizeof why, "%s", cudaGetErrorString(e));
        }
    }
    if (ok) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t rc = nc.init(&n->comm, g->size, root.id, g->rank, &cfg);
        if (rc != ncclSuccess && rc != ncclInProgress) {
            ok = 0;
            snprintf(why, sizeof why, "%s", nc_error(n, rc));
        }
    }
    /* Every rank has started its part (or says it could not); then every
     * rank's communicator is ready (or one says it is not). */
    int all = ok;
    mg_status st = agree(g, &all);
    if (!st && all) {
        ncclResult_t rc = settle(n, mg_now() + g->timeout, NULL);
        ok = rc == ncclSuccess;
        if (rc == ncclInProgress)
            snprintf(why, sizeof why, "its set-up did not finish within %g s (MG_TIMEOUT): a "
                     "rank did not join", g->timeout);
        else if (!ok)
            snprintf(why, sizeof why, "%s", nc_error(n, rc));
        all = ok;
        st = agree(g, &all);
    }
    if (!st && all) {
        *out = n;
        return MG_OK;
    }
    if (n) {
        mg__nccl_abort(n);
        mg__nccl_close(n);
    }
    if (st) return st;
    if (ok)
        return mg_error(MG_EPEER, "NCCL: another rank could not set up its communicator (its "
                        "own message says why)");
    char me[128];
    return mg_error(MG_EIO, "NCCL on %s (cuda:%d): %s",
                    mg__rank_name(&g->names, g->rank, NULL, me, sizeof me), d.index, why);
}

/* ---- requests ----------------------------------------------------------- */

static bool nc_type(mg_dtype t, ncclDataType_t *o)
{
    switch (t) {
    case MG_F32: *o = ncclFloat32; return true;
    case MG_F64: *o = ncclFloat64; return true;
    case MG_F16: *o = ncclFloat16; return true;
    case MG_BF16: *o = ncclBfloat16; return true;
    case MG_I32: *o = ncclInt32; return true;
    case MG_I64: *o = ncclInt64; return true;
    case MG_U8: *o = ncclUint8; return true;
    default: return false;
    }
}

static ncclRedOp_t nc_op(mg_op op)
{
    switch (op) {
    case MG_PROD: return ncclProd;
    case MG_MIN: return ncclMin;
    case MG_MAX: return ncclMax;
    case MG_AVG: return ncclAvg;
    default: return ncclSum;
    }
}

static bool on_gpu(const mg__nccl *n, const void *p)
{
    mg_device d = mg_device_of(p);
    return d.kind == MG_DEVICE_CUDA && d.index == n->dev.index;
}

/* A batch whose every operation NCCL can run on this GPU. */
static bool takes_batch(const mg__nccl *n, const mg__req *r)
{
    ncclDataType_t t;
    for (int i = 0; i < r->nsub; i++) {
        const mg_call *c = &r->sub[i].c;
        const void *b = c->coll == MG_COLL_SEND ? c->sendbuf : c->recvbuf;
        if (!nc_type(c->dtype, &t) || (c->count && !on_gpu(n, b))) return false;
    }
    return r->nsub > 0;
}

bool mg__nccl_takes(const mg__nccl *n, const mg__req *r, int rank, int size)
{
    if (n && r->kind == MG__REQ_BATCH) return takes_batch(n, r);
    if (!n || r->kind != MG__REQ_CALL) return false;
    const mg_call *c = &r->c;
    ncclDataType_t t;
    if (c->coll == MG_COLL_BARRIER || c->coll == MG_COLL_SEND || c->coll == MG_COLL_RECV ||
        !nc_type(c->dtype, &t))
        return false;
    size_t sn, rn;
    mg__call_spans(c, rank, size, &sn, &rn);
    return (sn || rn) && (!sn || on_gpu(n, c->sendbuf)) && (!rn || on_gpu(n, c->recvbuf));
}

/* Granules of sparse memory given back hold memory again before NCCL
 * touches them: zeros, as a staged copy would read them. */
static mg_status commit_spans(const mg_call *c, int rank, int size)
{
    size_t sn, rn;
    mg__call_spans(c, rank, size, &sn, &rn);
    if (sn && mg__sparse_resident(c->sendbuf, sn) < sn)
        MG_TRY(mg__sparse_commit((void *)c->sendbuf, sn));
    if (rn) MG_TRY(mg__sparse_commit(c->recvbuf, rn));
    return MG_OK;
}

mg_status mg__nccl_issue(mg__nccl *n, mg__req *r, int rank, int size)
{
    bool batch = r->kind == MG__REQ_BATCH;
    for (int i = 0; i < (batch ? r->nsub : 1); i++)
        MG_TRY(commit_spans(batch ? &r->sub[i].c : &r->c, rank, size));
    cudaError_t e = cudaSetDevice(n->dev.index);
    cudaEvent_t ev = NULL;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, cudaStreamLegacy);
    if (e != cudaSuccess) {
        if (ev) cudaEventDestroy(ev);
        return mg_error(MG_EIO, "%s on cuda:%d: cannot mark the work queued before it: %s",
                        batch ? "batch_isend_irecv" : mg_coll_name(r->c.coll), n->dev.index,
                        cudaGetErrorString(e));
    }
    r->nccl = ev;
    return MG_OK;
}

void mg__nccl_release(mg__req *r)
{
    if (r->nccl) cudaEventDestroy((cudaEvent_t)r->nccl);
    r->nccl = NULL;
}

/* n's device scratch of at least `bytes` (kept for the next call). */
static char *scratch(mg__nccl *n, size_t bytes)
{
    if (n->tmp_bytes < bytes) {
        cudaFree(n->tmp);
        n->tmp_bytes = 0;
        if (cudaMalloc((void **)&n->tmp, bytes) != cudaSuccess) return n->tmp = NULL;
        n->tmp_bytes = bytes;
    }
    return n->tmp;
}

/* Queues c on n's stream and waits until NCCL has queued it (a
 * non-blocking communicator may still be doing so on return of the call).
 * In-place forms and overlapping buffers are resolved as for the host
 * algorithms (mg__call_resolve): an input that overlaps the output is
 * copied to scratch first, an output that overlaps the input is written
 * to scratch and copied after. gather, scatter and all_to_all are sends
 * and receives in one group, the rank's own block a copy. MG_AVG is
 * NCCL's sum, then the division of comm/coll/reduce.c on the device
 * (NCCL's own average multiplies each input by 1/size: other roundings). */
static ncclResult_t launch(mg__nccl *n, const mg_call *c, int rank, int size, waiter *w)
{
    ncclDataType_t t = ncclFloat32;
    nc_type(c->dtype, &t);
    ncclRedOp_t op = c->op == MG_AVG ? ncclSum : nc_op(c->op);
    ncclComm_t m = n->comm;
    cudaStream_t s = n->stream;
    size_t cnt = c->count, b = cnt * mg_dtype_size(c->dtype);
    const char *sb;
    char *rb, *final = NULL;
    bool root = c->root == rank;
    mg_coll k = c->coll;
    size_t in, out;
    mg__call_resolve(c, rank, size, &sb, &rb, &in, &out);
    char *tmp = in || out ? scratch(n, in + out) : NULL;
    if ((in || out) && !tmp) return ncclSystemError;
    if (in && cudaMemcpyAsync(tmp, sb, in, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return ncclUnhandledCudaError;
    if (in) sb = tmp;
    if (out) final = rb, rb = tmp;
    ncclResult_t rc = ncclSuccess;
    switch (k) {
    case MG_COLL_ALL_REDUCE: rc = nc.all_reduce(sb, rb, cnt, t, op, m, s); break;
    case MG_COLL_REDUCE: rc = nc.reduce(sb, rb, cnt, t, op, c->root, m, s); break;
    case MG_COLL_ALL_GATHER: rc = nc.all_gather(sb, rb, cnt, t, m, s); break;
    case MG_COLL_REDUCE_SCATTER: rc = nc.reduce_scatter(sb, rb, cnt, t, op, m, s); break;
    case MG_COLL_BROADCAST:
        if (root && sb != rb && cudaMemcpyAsync(rb, sb, b, cudaMemcpyDeviceToDevice, s))
            return ncclUnhandledCudaError;
        rc = nc.broadcast(rb, rb, cnt, t, c->root, m, s);
        break;
    default: {
        bool a2a = k == MG_COLL_ALL_TO_ALL, gather = k == MG_COLL_GATHER;
        rc = nc.group_start();
        for (int q = 0; q < size && rc == ncclSuccess; q++) {
            /* what this rank sends to q, and where it receives q's */
            const char *to = a2a      ? sb + (size_t)q * b
                             : gather ? (q == c->root ? sb : NULL)
                                      : (root ? sb + (size_t)q * b : NULL);
            char *from = a2a      ? rb + (size_t)q * b
                         : gather ? (root ? rb + (size_t)q * b : NULL)
                                  : (q == c->root ? rb : NULL);
            if (q == rank) {
                if (to && from && to != from &&
                    cudaMemcpyAsync(from, to, b, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
                    rc = ncclUnhandledCudaError;
                continue;
            }
            if (to) rc = nc.send(to, cnt, t, q, m, s);
            if (from && rc == ncclSuccess) rc = nc.recv(from, cnt, t, q, m, s);
        }
        ncclResult_t end = nc.group_end();
        if (rc == ncclSuccess) rc = end;
    }
    }
    if (rc == ncclInProgress) rc = settle(n, w->deadline, w);
    if (rc != ncclSuccess) return rc;
    if (final && cudaMemcpyAsync(final, rb, out, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return ncclUnhandledCudaError;
    if (final) rb = final;
    bool wrote = k == MG_COLL_ALL_REDUCE || k == MG_COLL_REDUCE_SCATTER ||
                 (k == MG_COLL_REDUCE && root);
    if (c->op == MG_AVG && size > 1 && wrote && mg__dk_divide_async(rb, cnt, c->dtype, size, s))
        return ncclUnhandledCudaError;
    return ncclSuccess;
}

/* A batch's sends and receives in one group, in the batch's order. */
static ncclResult_t launch_batch(mg__nccl *n, const mg__req *r, waiter *w)
{
    ncclResult_t rc = nc.group_start();
    for (int i = 0; i < r->nsub && rc == ncclSuccess; i++) {
        const mg_call *c = &r->sub[i].c;
        ncclDataType_t t = ncclFloat32;
        nc_type(c->dtype, &t);
        if (!c->count) continue;
        if (c->coll == MG_COLL_SEND)
            rc = nc.send(c->sendbuf, c->count, t, c->root, n->comm, n->stream);
        else
            rc = nc.recv(c->recvbuf, c->count, t, c->root, n->comm, n->stream);
    }
    ncclResult_t end = nc.group_end();
    if (rc == ncclSuccess) rc = end;
    return rc == ncclInProgress ? settle(n, w->deadline, w) : rc;
}

/* What r is, for messages: a collective, or a batch by its first
 * operation. */
static void describe(const mg_group *g, const mg__req *r, char *what, size_t cap)
{
    char me[128], peer[128];
    mg__rank_name(&g->names, g->rank, NULL, me, sizeof me);
    const mg_call *c = r->kind == MG__REQ_BATCH ? &r->sub[0].c : &r->c;
    if (r->kind != MG__REQ_BATCH) {
        snprintf(what, cap, "%s #%llu (%zu x %s) on %s through NCCL", mg_coll_name(c->coll),
                 (unsigned long long)r->seq, c->count, mg_dtype_name(c->dtype), me);
        return;
    }
    mg__rank_name(&g->names, c->root, NULL, peer, sizeof peer);
    snprintf(what, cap, "a batch of %d sends and receives (the first %s %zu x %s %s %s) on %s "
             "through NCCL", r->nsub, c->coll == MG_COLL_SEND ? "sending" : "receiving",
             c->count, mg_dtype_name(c->dtype), c->coll == MG_COLL_SEND ? "to" : "from", peer,
             me);
}

mg_status mg__nccl_run(mg_group *g, mg__req *r)
{
    mg__nccl *n = g->nccl;
    char what[400];
    describe(g, r, what, sizeof what);
    double since = mg_now();
    waiter w = {g, what, since, since + g->timeout, since + 1, MG_OK};
    cudaError_t e = cudaSetDevice(n->dev.index);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(n->stream, (cudaEvent_t)r->nccl, 0);
    if (e != cudaSuccess)
        return mg_error(MG_EIO, "%s: cuda:%d: %s", what, n->dev.index, cudaGetErrorString(e));
    ncclResult_t rc = r->kind == MG__REQ_BATCH ? launch_batch(n, r, &w)
                                               : launch(n, &r->c, g->rank, g->size, &w);
    if (rc == ncclSuccess && cudaEventRecord(n->done, n->stream) != cudaSuccess)
        rc = ncclUnhandledCudaError;
    for (long ns = 2000; rc == ncclSuccess; backoff(&ns, 64000)) {
        e = cudaEventQuery(n->done);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady)
            return mg_error(MG_EIO, "%s: cuda:%d: %s", what, n->dev.index, cudaGetErrorString(e));
        if (nc.async_error(n->comm, &rc) != ncclSuccess) rc = ncclInternalError;
        double now = mg_now();
        if (rc == ncclSuccess && now > w.deadline)
            return mg_error(MG_ETIMEOUT, "%s did not finish within %g s (MG_TIMEOUT): a rank "
                            "did not issue it, or died (NCCL does not say which)", what,
                            g->timeout);
        /* NCCL cannot tell a stopped peer from a slow one: the host path's
         * beats and /proc can, within MG_PEER_TIMEOUT. */
        if (rc == ncclSuccess && !watched(&w, now)) return w.st;
    }
    if (w.st) return w.st;
    if (rc == ncclInProgress)
        return mg_error(MG_ETIMEOUT, "%s was not queued within %g s (MG_TIMEOUT): its first "
                        "message to a peer waits for the peer's batch with the other end "
                        "(README: NCCL connects ranks at their first message each way)", what,
                        g->timeout);
    if (rc != ncclSuccess) return mg_error(MG_EPEER, "%s: %s", what, nc_error(n, rc));
    uint64_t sent = 0, received = 0;
    if (r->kind == MG__REQ_BATCH)
        for (int i = 0; i < r->nsub; i++) {
            const mg_call *c = &r->sub[i].c;
            *(c->coll == MG_COLL_SEND ? &sent : &received) += c->count * mg_dtype_size(c->dtype);
        }
    else
        mg__ring_volume(&r->c, g->rank, g->size, &sent, &received);
    mg__traffic_add(&g->traffic, sent, received);
    return MG_OK;
}

#endif /* MG__WITH_NCCL */
