/* The Open MPI backend: the group API (comm.h) carried by MPI, for jobs
 * started with mpirun — rank and size come from MPI, not from RANK and
 * WORLD_SIZE. Each request becomes one nonblocking MPI call (MPI_Iallreduce,
 * MPI_Ibcast, ..., MPI_Isend/MPI_Irecv) polled with MPI_Test, so the
 * group's deadline applies to every wait as in the builtin backend.
 *
 * - Dtypes: MPI's own types; f16 and bf16 are 2-byte derived types whose
 *   reductions are user-defined MPI ops running the builtin kernels
 *   (mg__reduce: accumulated in f32). AVG is SUM, then a division.
 * - In place: the conventions of coll.h map onto MPI_IN_PLACE; other
 *   overlapping buffers (which MPI forbids) go through a scratch copy.
 * - Sends are buffered (copied, then MPI_Isend) and complete at once, as
 *   the builtin backend's do, so two ranks may send each other large
 *   messages before receiving; at most MG_P2P_UNEXPECTED_MB (512) MiB are
 *   in flight, beyond which a send waits for earlier ones.
 * - A failed rank sends its message to every peer on a control
 *   communicator; waiting ranks probe it and fail at once naming it.
 * - mg_group_alloc is MPI_Alloc_mem (registered memory on networks that
 *   use it), aligned to 64 bytes.
 * - Sub-groups: MPI_Comm_split.
 * - Traffic (mg_group_traffic): MPI does not say what it moved, so each
 *   completed call counts its algorithmic volume, what the builtin ring
 *   algorithms would move (mg__ring_volume), not what MPI's own
 *   algorithm and transport moved.
 * - MPI_THREAD_MULTIPLE is requested (several groups may run at once);
 *   with only MPI_THREAD_SERIALIZED every MPI call takes one lock.
 *   MPI_Finalize runs at exit (MPI cannot be initialised twice), unless
 *   the program initialised MPI itself.
 *
 * Limits: ranks that call different collectives are not detected unless
 * MG_MPI_CHECK=1 (one extra MPI_Iallgather of the call's fingerprint per
 * collective); otherwise they fail with MPI's error or the deadline. MPI
 * cannot cancel a collective: after a timeout the group is unusable (as
 * every failed group is). Per-rank counts above INT_MAX are split for
 * broadcast, reduce, all_reduce, send and recv, refused for the others.
 * This file: MPI's set-up, collectives, group memory, joining, the
 * vtable; p2p_mpi.c the waits and point-to-point; mpi_be.h what they
 * share. */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "comm/mpi/backend_mpi.h"
#include "comm/mpi/mpi_be.h"
#include "comm/call.h"
#include "comm/coll/coll.h"
#include "comm/transport/transport.h"
#include "multigrad/core.h"

#ifdef MG_HAVE_MPI
#include <mpi.h>

#define SCRATCH_KEEP ((size_t)16 << 20)

/* ---- process-wide MPI state ------------------------------------------- */

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t mg__mpi_call_mu = PTHREAD_MUTEX_INITIALIZER;
int mg__mpi_serialize;
static int ready;
static pid_t init_pid;
static MPI_Datatype ty_f16, ty_bf16;
static MPI_Op half_ops[MG_OP_COUNT];

static int stuck;

void mg__mpi_mark_stuck(void) { __atomic_store_n(&stuck, 1, __ATOMIC_RELAXED); }

/* After a request that never completed, MPI_Finalize waits for a peer
 * that may be stopped for ever: past MG_PEER_TIMEOUT this process leaves
 * without it, and mpirun, seeing a rank end unfinalized, ends the job. */
static void *leave_unfinalized(void *arg)
{
    double secs = *(const double *)arg;
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    nanosleep(&ts, NULL);
    _exit(1);
    return NULL;
}

static void finalize_at_exit(void)
{
    int fin = 0;
    /* A forked child of an MPI process must not finalize its parent's job. */
    if (getpid() != init_pid || MPI_Finalized(&fin) != MPI_SUCCESS || fin) return;
    static double grace;
    pthread_t th;
    grace = mg_env_double("MG_PEER_TIMEOUT", 15);
    if (__atomic_load_n(&stuck, __ATOMIC_RELAXED) &&
        pthread_create(&th, NULL, leave_unfinalized, &grace) == 0)
        pthread_detach(th);
    MPI_Finalize();
}

/* f16/bf16 reductions: MPI hands us (in, inout) with one of our types. */
#define HALF_OP(name, op)                                                        \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt)         \
    {                                                                            \
        mg__reduce(inout, in, (size_t)*len, *dt == ty_f16 ? MG_F16 : MG_BF16, op); \
    }
HALF_OP(half_sum, MG_SUM)
HALF_OP(half_prod, MG_PROD)
HALF_OP(half_min, MG_MIN)
HALF_OP(half_max, MG_MAX)

/* How messages name this rank (names.h): "rank 3 (pp 1, dp 1)". */
const char *mg__mpi_this_rank(mpi_be *m)
{
    return mg__rank_name(&m->g->names, m->g->rank, NULL, m->me, sizeof m->me);
}

/* The request being run (m->what) failed in MPI with rc. */
mg_status mg__mpi_error(mpi_be *m, int rc)
{
    int cls = 0, n = 0;
    MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_TRUNCATE)
        return mg_error(MG_EMISMATCH, "%s on %s: the message is longer than the receive: "
                        "sender and receiver disagree on the count", m->what, mg__mpi_this_rank(m));
    char s[MPI_MAX_ERROR_STRING];
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    return mg_error(MG_EPEER, "%s on %s: %s", m->what, mg__mpi_this_rank(m), s);
}

static mg_status mpi_setup(void)
{
    pthread_mutex_lock(&init_mu);
    mg_status st = MG_OK;
    int inited = 0, provided = MPI_THREAD_SINGLE, fin = 0;
    if (ready) goto out;
    MPI_Finalized(&fin);
    if (fin) {
        st = mg_error(MG_EUNSUPPORTED, "mpi backend: MPI was already finalized in this "
                      "process and cannot be initialised again");
        goto out;
    }
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
            st = mg_error(MG_EIO, "mpi backend: MPI_Init_thread failed (is Open MPI installed "
                          "and the job started with mpirun?)");
            goto out;
        }
        init_pid = getpid();
        atexit(finalize_at_exit);
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        st = mg_error(MG_EUNSUPPORTED, "mpi backend: MPI runs at thread level %d; multigrad "
                      "needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (initialise MPI with "
                      "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let multigrad do it)",
                      provided);
        goto out;
    }
    mg__mpi_serialize = provided < MPI_THREAD_MULTIPLE;
    MPI_Type_contiguous(1, MPI_UINT16_T, &ty_f16);
    MPI_Type_commit(&ty_f16);
    MPI_Type_contiguous(1, MPI_UINT16_T, &ty_bf16);
    MPI_Type_commit(&ty_bf16);
    MPI_Op_create(half_sum, 1, &half_ops[MG_SUM]);
    MPI_Op_create(half_prod, 1, &half_ops[MG_PROD]);
    MPI_Op_create(half_min, 1, &half_ops[MG_MIN]);
    MPI_Op_create(half_max, 1, &half_ops[MG_MAX]);
    half_ops[MG_AVG] = half_ops[MG_SUM];
    ready = 1;
out:
    pthread_mutex_unlock(&init_mu);
    return st;
}

MPI_Datatype mg__mpi_type(mg_dtype t)
{
    switch (t) {
    case MG_F32: return MPI_FLOAT;
    case MG_F64: return MPI_DOUBLE;
    case MG_F16: return ty_f16;
    case MG_BF16: return ty_bf16;
    case MG_I32: return MPI_INT32_T;
    case MG_I64: return MPI_INT64_T;
    case MG_U8: return MPI_UINT8_T;
    default: MG_ASSERT(!"dtype validated by the group"); return MPI_BYTE;
    }
}

static MPI_Op mpi_op(mg_dtype t, mg_op op)
{
    if (t == MG_F16 || t == MG_BF16) return half_ops[op];
    switch (op) {
    case MG_PROD: return MPI_PROD;
    case MG_MIN: return MPI_MIN;
    case MG_MAX: return MPI_MAX;
    default: return MPI_SUM;   /* SUM; AVG divides afterwards */
    }
}

/* ---- collectives -------------------------------------------------------- */

/* "all_reduce #12 (1000 x f32, sum) at train.c:88", as the builtin says it. */
static void describe(const mg__names *nm, const mg__req *r, char *buf, size_t n)
{
    const mg_call *c = &r->c;
    if (c->coll != MG_COLL_SEND && c->coll != MG_COLL_RECV) {
        mg__fp fp;
        mg__fp_make(&fp, c, r->seq, 0);
        mg__fp_describe(&fp, buf, n);
        return;
    }
    mg__call_describe_p2p(c, nm, r->seq, buf, n);
}

static void *scratch(mpi_be *m, size_t bytes)
{
    if (m->scratch_bytes >= bytes) return m->scratch;
    mg_free(m->scratch);
    m->scratch = mg_alloc(bytes);
    m->scratch_bytes = m->scratch ? bytes : 0;
    if (!m->scratch)
        mg_error(MG_ENOMEM, "%s on %s: cannot allocate %zu bytes for a copy of an "
                 "overlapping buffer", m->what, mg__mpi_this_rank(m), bytes);
    return m->scratch;
}

/* MG_MPI_CHECK: every rank's fingerprint of the call (the builtin
 * backend's frame header, transport.h), compared; a mismatch names both. */
static mg_status check_fingerprints(mpi_be *m, const mg__req *r)
{
    int n = m->g->size, mpi_rc;
    mg__fp mine, *all = calloc((size_t)n, sizeof *all);
    if (!all) return mg_error(MG_ENOMEM, "%s: out of memory", m->what);
    mg__fp_make(&mine, &r->c, r->seq, 0);
    MPI_Request rq;
    mg_status st = MG_OK;
    if (LOCKED(MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                              m->comm, &rq)) != MPI_SUCCESS)
        st = mg__mpi_error(m, mpi_rc);
    if (!st) st = mg__mpi_wait_req(m, &rq, NULL);
    for (int q = 0; !st && q < n; q++)
        if (!mg__fp_same(&mine, &all[q]))
            st = mg__fp_mismatch(&m->g->names, &mine, m->g->rank, &all[q], q);
    free(all);
    return st;
}

/* One MPI call for elements [off, off + n) of an elementwise collective,
 * or the whole of any other. */
static int start_coll(mpi_be *m, const mg_call *c, const void *sb, void *rb, size_t off,
                      size_t n, MPI_Request *rq)
{
    MPI_Datatype dt = mg__mpi_type(c->dtype);
    MPI_Op op = mpi_op(c->dtype, c->op);
    size_t es = mg_dtype_size(c->dtype), b = off * es;
    const char *s = sb == MPI_IN_PLACE ? MPI_IN_PLACE : (const char *)sb + b;
    char *r = rb ? (char *)rb + b : NULL;
    int k = (int)n, mpi_rc;
    switch (c->coll) {
    case MG_COLL_BROADCAST: return LOCKED(MPI_Ibcast(r, k, dt, c->root, m->comm, rq));
    case MG_COLL_REDUCE: return LOCKED(MPI_Ireduce(s, r, k, dt, op, c->root, m->comm, rq));
    case MG_COLL_ALL_REDUCE: return LOCKED(MPI_Iallreduce(s, r, k, dt, op, m->comm, rq));
    case MG_COLL_ALL_GATHER: return LOCKED(MPI_Iallgather(s, k, dt, rb, k, dt, m->comm, rq));
    case MG_COLL_GATHER: return LOCKED(MPI_Igather(s, k, dt, rb, k, dt, c->root, m->comm, rq));
    case MG_COLL_SCATTER: return LOCKED(MPI_Iscatter(sb, k, dt, rb, k, dt, c->root, m->comm, rq));
    case MG_COLL_REDUCE_SCATTER:
        return LOCKED(MPI_Ireduce_scatter_block(s, rb, k, dt, op, m->comm, rq));
    case MG_COLL_ALL_TO_ALL: return LOCKED(MPI_Ialltoall(s, k, dt, rb, k, dt, m->comm, rq));
    case MG_COLL_BARRIER: return LOCKED(MPI_Ibarrier(m->comm, rq));
    default: MG_ASSERT(!"not a collective"); return MPI_ERR_OTHER;
    }
}

static mg_status run_coll(mpi_be *m, mg__req *r)
{
    const mg_call *c = &r->c;
    if (m->check) MG_TRY(check_fingerprints(m, r));
    int me = m->g->rank, n = m->g->size, root = c->root == me;
    size_t es = c->coll == MG_COLL_BARRIER ? 1 : mg_dtype_size(c->dtype);
    size_t blk = c->count * es, all = blk * (size_t)n;
    if (c->coll != MG_COLL_BARRIER && c->count == 0) return MG_OK;
    int elementwise = c->coll == MG_COLL_BROADCAST || c->coll == MG_COLL_REDUCE ||
                      c->coll == MG_COLL_ALL_REDUCE;
    if (!elementwise && c->count > INT_MAX) {
        r->rejected = true;     /* every rank refuses it alike, before any traffic */
        return mg_error(MG_EUNSUPPORTED, "%s on %s: the mpi backend takes at most %d "
                        "elements per rank for this collective (MPI counts are int); split it",
                        m->what, mg__mpi_this_rank(m), INT_MAX);
    }

    /* In-place forms (coll.h) become MPI_IN_PLACE; other overlaps a copy. */
    const void *sb = c->sendbuf;
    void *rb = c->recvbuf;
    char *final_out = NULL;
    size_t out_bytes = 0;
    switch (c->coll) {
    case MG_COLL_BROADCAST:
        if (root && sb != rb) memmove(rb, sb, blk);
        break;
    case MG_COLL_ALL_REDUCE: case MG_COLL_REDUCE:
        if (c->coll == MG_COLL_REDUCE && !root) break;
        if (sb == rb) {
            sb = MPI_IN_PLACE;
        } else if (mg__overlaps(sb, blk, rb, blk)) {
            void *t = scratch(m, blk);
            if (!t) return MG_ENOMEM;
            memcpy(t, sb, blk);
            sb = t;
        }
        break;
    case MG_COLL_ALL_GATHER: case MG_COLL_GATHER:
        if (c->coll == MG_COLL_GATHER && !root) break;
        if (sb == rb || sb == (char *)rb + (size_t)me * blk) {
            sb = MPI_IN_PLACE;
        } else if (mg__overlaps(sb, blk, rb, all)) {
            void *t = scratch(m, blk);
            if (!t) return MG_ENOMEM;
            memcpy(t, sb, blk);
            sb = t;
        }
        break;
    case MG_COLL_SCATTER:
        if (!root) break;
        if (sb == rb || rb == (const char *)sb + (size_t)me * blk) {
            rb = MPI_IN_PLACE;
        } else if (mg__overlaps(sb, all, rb, blk)) {
            final_out = rb;
            out_bytes = blk;
            if (!(rb = scratch(m, blk))) return MG_ENOMEM;
        }
        break;
    case MG_COLL_REDUCE_SCATTER:
        if (rb == sb) {
            sb = MPI_IN_PLACE;     /* input in rb, result at its start (MPI's form) */
        } else if (mg__overlaps(sb, all, rb, blk)) {
            final_out = rb;        /* e.g. NCCL's form, rb == sb + me * blk */
            out_bytes = blk;
            if (!(rb = scratch(m, blk))) return MG_ENOMEM;
        }
        break;
    case MG_COLL_ALL_TO_ALL:
        if (sb == rb) {
            sb = MPI_IN_PLACE;
        } else if (mg__overlaps(sb, all, rb, all)) {
            void *t = scratch(m, all);
            if (!t) return MG_ENOMEM;
            memcpy(t, sb, all);
            sb = t;
        }
        break;
    default:
        break;
    }

    size_t total = elementwise ? c->count : 1;
    for (size_t off = 0; off < total; off += CHUNK) {
        size_t k = elementwise ? (total - off < CHUNK ? total - off : CHUNK) : c->count;
        MPI_Request rq;
        int rc = start_coll(m, c, sb, rb, elementwise ? off : 0, k, &rq);
        if (rc != MPI_SUCCESS) return mg__mpi_error(m, rc);
        MG_TRY(mg__mpi_wait_req(m, &rq, NULL));
    }
    if (final_out) memcpy(final_out, rb, out_bytes);
    /* AVG was a SUM; every result (at recvbuf in each form) is divided. */
    if (c->op == MG_AVG && (c->coll == MG_COLL_ALL_REDUCE || c->coll == MG_COLL_REDUCE_SCATTER ||
                            (c->coll == MG_COLL_REDUCE && root)))
        mg__reduce_finish(c->recvbuf, c->count, c->dtype, MG_AVG, n);
    if (m->scratch_bytes > SCRATCH_KEEP) {
        mg_free(m->scratch);
        m->scratch = NULL;
        m->scratch_bytes = 0;
    }
    return MG_OK;
}

/* ---- group memory ------------------------------------------------------- */

/* MPI_Alloc_mem's block, 64-byte aligned; the block's start sits just
 * before the pointer handed out. */
static mg_status galloc(mpi_be *m, mg__req *r)
{
    void *base = NULL;
    int mpi_rc;
    size_t bytes = r->bytes + MG_ALIGN + sizeof(void *);
    if (bytes > (size_t)PTRDIFF_MAX ||
        LOCKED(MPI_Alloc_mem((MPI_Aint)bytes, MPI_INFO_NULL, &base)) != MPI_SUCCESS || !base) {
        r->rejected = true;     /* local memory: the group stays usable */
        return mg_error(MG_ENOMEM, "mg_group_alloc: MPI_Alloc_mem cannot allocate %zu bytes "
                        "on %s", r->bytes, mg__mpi_this_rank(m));
    }
    uintptr_t p = ((uintptr_t)base + sizeof(void *) + MG_ALIGN - 1) & ~(uintptr_t)(MG_ALIGN - 1);
    ((void **)p)[-1] = base;
    memset((void *)p, 0, r->bytes);
    *r->out_ptr = (void *)p;
    return MG_OK;
}

static mg_status gfree(mpi_be *m, mg__req *r)
{
    int mpi_rc;
    void *base = ((void **)r->ptr)[-1];
    LOCKED(MPI_Free_mem(base));
    return MG_OK;
}

/* ---- joining ------------------------------------------------------------ */

/* Ranks on this host, from every rank's processor name. */
static mg_status local_ranks(mpi_be *m, MPI_Comm comm, int rank, int size, int *lr, int *ls)
{
    char *names = calloc((size_t)size, MPI_MAX_PROCESSOR_NAME);
    char mine[MPI_MAX_PROCESSOR_NAME] = "";
    int len = 0, mpi_rc;
    if (!names) return mg_error(MG_ENOMEM, "mpi backend: out of memory");
    MPI_Get_processor_name(mine, &len);
    MPI_Request rq;
    mg_status st = MG_OK;
    if (LOCKED(MPI_Iallgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names,
                              MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm, &rq)) != MPI_SUCCESS)
        st = mg__mpi_error(m, mpi_rc);
    if (!st) st = mg__mpi_wait_req(m, &rq, NULL);
    *lr = 0;
    *ls = 0;
    for (int q = 0; !st && q < size; q++) {
        const char *nm = names + (size_t)q * MPI_MAX_PROCESSOR_NAME;
        if (strncmp(nm, mine, MPI_MAX_PROCESSOR_NAME)) continue;
        if (q < rank) ++*lr;
        ++*ls;
    }
    free(names);
    return st;
}

/* comm becomes the group's (errors returned, not fatal) with a control
 * communicator beside it; rank, size and local ranks are filled in. */
static mg_status attach(mpi_be *m, MPI_Comm comm)
{
    mg_group *g = m->g;
    int mpi_rc;
    m->comm = comm;
    LOCKED(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN));
    LOCKED(MPI_Comm_rank(m->comm, &g->rank));
    LOCKED(MPI_Comm_size(m->comm, &g->size));
    MPI_Request rq;
    MPI_Comm ctl;
    /* The new handle is usable (and probed) only once the idup completes. */
    if (LOCKED(MPI_Comm_idup(m->comm, &ctl, &rq)) != MPI_SUCCESS)
        return mg__mpi_error(m, mpi_rc);
    MG_TRY(mg__mpi_wait_req(m, &rq, NULL));
    m->ctl = ctl;
    LOCKED(MPI_Comm_set_errhandler(m->ctl, MPI_ERRORS_RETURN));
    MG_TRY(local_ranks(m, m->comm, g->rank, g->size, &g->local_rank, &g->local_size));
    m->spin = mg__spin_default(g->local_size);
    m->check = mg_env_long("MG_MPI_CHECK", 0) != 0;
    m->pend_max = (size_t)mg_env_long("MG_P2P_UNEXPECTED_MB", 512) << 20;
    return MG_OK;
}

static mpi_be *be_new(mg_group *g)
{
    mpi_be *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    m->comm = m->ctl = MPI_COMM_NULL;
    g->impl = m;
    return m;
}

/* What the environment or options say the world is must agree with MPI. */
static mg_status check_world(const mg_group_options *opt, int rank, int size)
{
    const char *ws = mg_env_other("WORLD_SIZE"), *rs = mg_env_other("RANK");
    int want_size = opt->size >= 0 ? opt->size : ws && *ws ? atoi(ws) : -1;
    int want_rank = opt->rank >= 0 ? opt->rank : rs && *rs ? atoi(rs) : -1;
    if (want_size > 1 && size == 1)
        return mg_error(MG_EINVAL, "mpi backend: this process is a lone MPI process (a "
                        "singleton) but the job has %d ranks: start it with mpirun -n %d, "
                        "or use MG_BACKEND=builtin under mgrun", want_size, want_size);
    if (want_size >= 0 && want_size != size)
        return mg_error(MG_EINVAL, "mpi backend: the world size is %d by MPI but %d by %s",
                        size, want_size, opt->size >= 0 ? "the options" : "WORLD_SIZE");
    if (want_rank >= 0 && want_rank != rank)
        return mg_error(MG_EINVAL, "mpi backend: this process is rank %d by MPI but %d by %s",
                        rank, want_rank, opt->rank >= 0 ? "the options" : "RANK");
    return MG_OK;
}

static mg_status be_init(mg_group *g, const mg_group_options *opt)
{
    /* Started by another launcher (mgrun) each process would MPI_Init as a
     * world of its own: refuse before initialising MPI at all. */
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited && !mg_launch_detect().mpi)
        MG_TRY(check_world(opt, 0, 1));
    MG_TRY(mpi_setup());
    int rank = 0, size = 1, mpi_rc;
    LOCKED(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    LOCKED(MPI_Comm_size(MPI_COMM_WORLD, &size));
    MG_TRY(check_world(opt, rank, size));
    mpi_be *m = be_new(g);
    if (!m) return mg_error(MG_ENOMEM, "mpi backend: out of memory");
    snprintf(m->what, sizeof m->what, "joining the group (MPI_Comm_idup of MPI_COMM_WORLD)");
    m->spin = mg__spin_default(size);
    m->deadline = mg_now() + g->timeout;
    MPI_Comm comm;
    MPI_Request rq;
    if (LOCKED(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &rq)) != MPI_SUCCESS)
        return mg__mpi_error(m, mpi_rc);
    /* MPI_COMM_WORLD's handler aborts the job; ours reports. */
    MG_TRY(mg__mpi_wait_req(m, &rq, NULL));
    MG_TRY(attach(m, comm));
    if (opt->init_method)
        mg_debug("mpi backend: init_method '%s' ignored: MPI does the rendezvous",
                 opt->init_method);
    return MG_OK;
}

static mg_status split(mpi_be *m, mg__req *r)
{
    mg_group *g = m->g;
    int n = g->size, mpi_rc;
    int mine[2] = {r->color, r->key}, *all = calloc((size_t)n * 2, sizeof *all);
    if (!all) return mg_error(MG_ENOMEM, "mg_group_split: out of memory");
    /* Everyone present first (with the deadline): MPI_Comm_split blocks. */
    MPI_Request rq;
    mg_status st = MG_OK;
    if (LOCKED(MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, m->comm, &rq)) != MPI_SUCCESS)
        st = mg__mpi_error(m, mpi_rc);
    if (!st) st = mg__mpi_wait_req(m, &rq, NULL);
    MPI_Comm nc = MPI_COMM_NULL;
    if (!st && LOCKED(MPI_Comm_split(m->comm, r->color == MG_UNDEFINED ? MPI_UNDEFINED : r->color,
                                     r->key, &nc)) != MPI_SUCCESS)
        st = mg__mpi_error(m, mpi_rc);
    if (st || nc == MPI_COMM_NULL) {
        free(all);
        return st;
    }
    /* Its members' names from the parent's (MPI_Comm_split orders them as
     * mg__split_members does). */
    mg__names names = {0};
    int *members = malloc(sizeof *members * (size_t)n);
    st = !members ? mg_error(MG_ENOMEM, "mg_group_split: out of memory")
                  : mg__names_sub(&names, &g->names, members,
                                  mg__split_members(all, n, r->color, members));
    free(all);
    free(members);
    mg_group *sub = st ? NULL : mg__group_new(&mg__backend_mpi, g->timeout);
    mpi_be *sm = sub ? be_new(sub) : NULL;
    if (!sm) {
        mg__group_free(sub);
        mg__names_free(&names);
        LOCKED(MPI_Comm_free(&nc));
        return st ? st : mg_error(MG_ENOMEM, "mg_group_split: out of memory");
    }
    sub->names = names;
    snprintf(sm->what, sizeof sm->what, "mg_group_split (color %d)", r->color);
    sm->spin = m->spin;
    sm->deadline = m->deadline;
    st = attach(sm, nc);
    if (!st) st = mg__group_start(sub);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mg_last_error());
        mg__group_free(sub);
        return mg_error(st, "mg_group_split: %s", msg);
    }
    *r->out_group = sub;
    return MG_OK;
}

/* ---- the vtable ------------------------------------------------------------ */

static mg_status be_run(mg_group *g, mg__req *r)
{
    mpi_be *m = g->impl;
    m->deadline = mg_now() + g->timeout;
    mg_status st;
    switch (r->kind) {
    case MG__REQ_SPLIT:
        snprintf(m->what, sizeof m->what, "mg_group_split #%llu", (unsigned long long)r->seq);
        st = split(m, r);
        break;
    case MG__REQ_ALLOC: return galloc(m, r);
    case MG__REQ_FREE: return gfree(m, r);
    case MG__REQ_EXCLUDE: MG_ASSERT(!"refused by mg_group_exclude"); return MG_EUNSUPPORTED;
    default:
        describe(&g->names, r, m->what, sizeof m->what);
        if (r->c.coll == MG_COLL_SEND) st = mg__mpi_send(m, &r->c);
        else if (r->c.coll == MG_COLL_RECV) st = mg__mpi_recv(m, r);
        else st = run_coll(m, r);
        if (!st) st = mg__mpi_reap_sends(m, 0, 0);
        if (!st) {
            /* MPI hides what it moves: count the call's standard volume. */
            uint64_t sent, received;
            mg__ring_volume(&r->c, g->rank, g->size, &sent, &received);
            mg__traffic_add(&g->traffic, sent, received);
        }
        break;
    }
    return st;
}

static void be_abort(mg_group *g, const char *msg)
{
    mpi_be *m = g->impl;
    if (!m || m->ctl == MPI_COMM_NULL || m->notice_rq) return;
    snprintf(m->notice, sizeof m->notice, "%s", msg);
    int len = (int)strlen(m->notice), mpi_rc;
    m->notice_rq = calloc((size_t)g->size, sizeof *m->notice_rq);
    if (!m->notice_rq) return;
    /* Best effort and without waiting: the notice is small (sent eagerly);
     * destroy checks it left. */
    for (int q = 0; q < g->size; q++)
        if (q != g->rank &&
            LOCKED(MPI_Isend(m->notice, len, MPI_CHAR, q, TAG_ABORT, m->ctl,
                             &m->notice_rq[m->nnotice])) == MPI_SUCCESS)
            m->nnotice++;
}

/* Whether the failure notices have gone (waiting up to a second). */
static int notices_sent(mpi_be *m)
{
    double until = mg_now() + 1;
    int done = 0, mpi_rc;
    while (m->nnotice) {
        LOCKED(MPI_Testall(m->nnotice, m->notice_rq, &done, MPI_STATUSES_IGNORE));
        if (done || mg_now() > until) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return !m->nnotice || done;
}

static void be_destroy(mg_group *g)
{
    mpi_be *m = g->impl;
    if (!m) return;
    int failed = atomic_load(&g->failed) != 0, mpi_rc;
    /* Deliver what was sent before leaving; after a failure, do not wait. */
    m->deadline = mg_now() + (failed ? 0 : g->timeout < 10 ? g->timeout : 10);
    snprintf(m->what, sizeof m->what, "mg_group_destroy");
    if (!failed && mg__mpi_reap_sends(m, 1, 0))
        mg_debug("mg_group_destroy: %s", mg_last_error());
    while (m->sends) {
        /* Never completed: MPI may still read the copy, so it is not freed. */
        pend *p = m->sends;
        m->sends = p->next;
        free(p);
    }
    int gone = notices_sent(m);
    if (m->ctl != MPI_COMM_NULL) LOCKED(MPI_Comm_free(&m->ctl));
    if (m->comm != MPI_COMM_NULL) LOCKED(MPI_Comm_free(&m->comm));
    mg_free(m->scratch);
    g->impl = NULL;
    /* A notice MPI still reads from keeps its memory (a failed group only). */
    if (!gone) return;
    free(m->notice_rq);
    free(m);
}

const mg__backend mg__backend_mpi = {
    .name = "mpi", .init = be_init, .run = be_run, .abort = be_abort, .destroy = be_destroy,
};

#endif /* MG_HAVE_MPI */
