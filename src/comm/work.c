/* Asynchronous work: each group's queue and progress thread, mg_start /
 * mg_run, mg_work handles, and failure poisoning.
 *
 * Requests run one at a time in issue order. The progress thread runs
 * queued requests; a blocking call finding the queue empty and nothing
 * running runs its request inline on the caller's thread instead, which
 * keeps small blocking collectives free of thread hand-offs (on a 2-core
 * machine a hand-off costs more than the collective). Order is kept
 * because the inline path is only taken when nothing is queued or running.
 *
 * While no request runs, the progress thread ticks the backend every
 * g->tick_s seconds (holding the execution right meanwhile, as a request
 * would): heartbeats keep flowing while the caller computes.
 *
 * A request's error message is recorded on the executing thread; it is
 * copied into the mg_work and re-recorded on the waiting thread. After a
 * failure the group is poisoned: every later request fails at once with
 * the original error. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm/backend.h"
#include "multigrad/trace.h"
#include "comm/call.h"
#include "comm/nccl.h"
#include "multigrad/core.h"

enum { W_QUEUED, W_RUNNING, W_DONE };

struct mg_work {
    mg_group *g;
    mg__req r;
    atomic_int state;
    mg_status st;
    bool heap;
    struct mg_work *next;
    double t_start, t_end;   /* mg_now() when it began and ended executing */
    char msg[1024];
};

static void *progress_main(void *arg);

mg_group *mg__group_new(const mg__backend *be, double timeout)
{
    mg_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->be = be;
    g->timeout = timeout;
    g->nccl_rules = !strcmp(mg_env_str("MG_BATCH_RULES", "host"), "nccl");
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->wake, &ca);
    pthread_cond_init(&g->done, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&g->failed, 0);
    return g;
}

mg_status mg__group_start(mg_group *g)
{
    g->sends = calloc((size_t)g->size, sizeof *g->sends);
    g->recvs = calloc((size_t)g->size, sizeof *g->recvs);
    g->linked = g->nccl_rules ? calloc((size_t)g->size, 1) : NULL;
    if (!g->sends || !g->recvs || (g->nccl_rules && !g->linked))
        return mg_error(MG_ENOMEM, "group: out of memory");
    if (pthread_create(&g->thread, NULL, progress_main, g))
        return mg_error(MG_EIO, "group: cannot start the progress thread");
    g->has_thread = true;
    return MG_OK;
}

void mg__group_free(mg_group *g)
{
    if (!g) return;
    if (g->has_thread) {
        pthread_mutex_lock(&g->mu);
        g->stop = true;
        pthread_cond_broadcast(&g->wake);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
    }
    if (g->impl) g->be->destroy(g);
    mg__nccl_close(g->nccl);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->wake);
    pthread_cond_destroy(&g->done);
    free(g->sends);
    free(g->recvs);
    free(g->linked);
    mg__names_free(&g->names);
    free(g);
}

void mg__group_fail(mg_group *g, mg_status code, const char *msg)
{
    int expect = 0;
    if (!atomic_compare_exchange_strong(&g->failed, &expect, 1)) return;
    g->fail_code = code;
    snprintf(g->fail_msg, sizeof g->fail_msg, "%s", msg);
    atomic_store(&g->failed, 2);
    /* Peers say "rank R (LABEL) failed and aborted the group: ...": R once. */
    const char *why = mg_error_past_rank(g->fail_msg, mg__world_rank(&g->names, g->rank));
    char me[128];
    mg_debug("%s: group failed: %s", mg__rank_name(&g->names, g->rank, NULL, me, sizeof me), why);
    g->be->abort(g, why);
    mg__nccl_abort(g->nccl);
}

static mg_status failed_error(mg_group *g)
{
    /* The message is complete once failed reads 2 (set by the one writer).
     * It names the operation that failed, often the one the caller hears
     * of first (an asynchronous one, or a peer's silence found between
     * operations): "failed earlier" read as another failure (a probe). */
    while (atomic_load(&g->failed) == 1) sched_yield();
    return mg_error(g->fail_code, "%s; the group failed then and cannot be used any more",
                    g->fail_msg);
}

static void make_req(mg_group *g, const mg_call *c, mg__req *r);

/* NCCL's rules for batches (MG_BATCH_RULES=nccl), on any transport: a
 * batch runs as an ncclGroupStart/End of ncclSend and ncclRecv between
 * GPUs does, a send ending only once its peer has posted the receive, and
 * the messages between two ranks matched in the order posted, not by tag.
 * Starting, a batch tells each rank it receives from the tag of each
 * receive, in order (`posted`, a message of a tag of the library's);
 * ending, it waits for each rank it sent to to have posted the receive,
 * and checks that the k-th receive posted for this rank has the tag of
 * the k-th send. NCCL also connects two ranks lazily, each direction at
 * its first message, and a batch holding such a first message starts
 * none of its operations until the peer has posted the batch holding the
 * other end (`connect`). Where NCCL would deadlock, the ranks wait for
 * the group's deadline (MG_TIMEOUT); where it would cross two messages,
 * the sender fails at once. */
#define POSTED_TAG 0x7ffffffe
#define LINK_TAG(from, to) ((from) < (to) ? 0x7ffffffd : 0x7ffffffc)
#define LINK_SEND 1   /* linked[peer]: this rank to peer connected */
#define LINK_RECV 2   /* peer to this rank */

/* One int32 sent to (tell) or received from the peer under a tag of the
 * library's, on the group's own transport. */
static mg_status note(mg_group *g, bool tell, int peer, int tag, int32_t *v)
{
    mg_call c = {.coll = tell ? MG_COLL_SEND : MG_COLL_RECV, .count = 1, .dtype = MG_I32,
                 .root = peer, .tag = tag, .file = __FILE__, .line = __LINE__};
    if (tell) c.sendbuf = v;
    else c.recvbuf = v;
    mg__req r;
    make_req(g, &c, &r);
    return g->be->run(g, &r);
}

static mg_status posted(mg_group *g, bool tell, int peer, int32_t *tag)
{
    return note(g, tell, peer, POSTED_TAG, tag);
}

static uint8_t link_bit(const mg_call *c) { return c->coll == MG_COLL_SEND ? LINK_SEND : LINK_RECV; }

/* Whether sub-operation i of batch r is the first message of its
 * direction: not linked yet, and none before it in the batch the same. */
static bool first_of_direction(const mg_group *g, const mg__req *r, int i)
{
    const mg_call *c = &r->sub[i].c;
    if (g->linked[c->root] & link_bit(c)) return false;
    for (int k = 0; k < i; k++)
        if (r->sub[k].c.root == c->root && link_bit(&r->sub[k].c) == link_bit(c)) return false;
    return true;
}

/* The directions this batch uses first: each waits for the peer to post
 * the batch with its other end, before any of the batch's operations. */
static mg_status connect(mg_group *g, const mg__req *r)
{
    mg_status st = MG_OK;
    for (int pass = 0; pass < 2 && !st; pass++)
        for (int i = 0; i < r->nsub && !st; i++) {
            if (!first_of_direction(g, r, i)) continue;
            const mg_call *c = &r->sub[i].c;
            bool send = c->coll == MG_COLL_SEND;
            int q = c->root;
            st = note(g, pass == 0, q, send ? LINK_TAG(g->rank, q) : LINK_TAG(q, g->rank),
                      &(int32_t){1});
            if (st != MG_ETIMEOUT) continue;
            char peer[128];
            mg__rank_name(&g->names, q, NULL, peer, sizeof peer);
            st = mg_error(st, "a batch's first %s %s waited %g s (MG_TIMEOUT), under NCCL's "
                          "rules (MG_BATCH_RULES=nccl), for %s to post the batch with its other "
                          "end: NCCL connects two ranks at their first message each way, and "
                          "the batch that holds it waits for the peer's; under NCCL these "
                          "batches would deadlock; let both ranks exchange a first message each "
                          "way in one batch before the others", send ? "send to" : "receive from",
                          peer, g->timeout, peer);
        }
    for (int i = 0; i < r->nsub; i++) g->linked[r->sub[i].c.root] |= link_bit(&r->sub[i].c);
    return st;
}

static mg_status nccl_rules_end(mg_group *g, const mg__req *r)
{
    for (int i = 0; i < r->nsub; i++) {
        const mg_call *c = &r->sub[i].c;
        if (c->coll != MG_COLL_SEND) continue;
        int32_t tag = 0;
        mg_status st = posted(g, false, c->root, &tag);
        if (!st && tag == c->tag) continue;
        if (st && st != MG_ETIMEOUT) return st;
        char peer[128];
        mg__rank_name(&g->names, c->root, NULL, peer, sizeof peer);
        if (st)
            return mg_error(st, "a batch's send (tag %d) to %s waited %g s (MG_TIMEOUT), under "
                            "NCCL's rules (MG_BATCH_RULES=nccl), for %s to post its receive: "
                            "under NCCL these batches would deadlock (each waits for a batch "
                            "its peer posts after its own); post the receive in an earlier "
                            "batch, or in the one that matches this", c->tag, peer, g->timeout,
                            peer);
        return mg_error(MG_EINVAL, "a batch's send to %s has tag %d, but the receive %s posted "
                        "for it in that order has tag %d: NCCL matches them in the order "
                        "posted, so under it the two messages would cross (MG_BATCH_RULES=nccl)",
                        peer, c->tag, peer, tag);
    }
    return MG_OK;
}

/* A batch: its sends, then its receives (a send never waits for the
 * peer's receive: builtin drains incoming messages while it sends, MPI
 * buffers them), so a receive posted first cannot hold up a later send
 * on this group and two stages exchanging never wait on each other; by
 * NCCL's rules, as above. */
static mg_status run_batch(mg_group *g, mg__req *r)
{
    mg_status st = g->nccl_rules ? connect(g, r) : MG_OK;
    for (int i = 0; i < r->nsub && !st && g->nccl_rules; i++)
        if (r->sub[i].c.coll == MG_COLL_RECV)
            st = posted(g, true, r->sub[i].c.root, &(int32_t){r->sub[i].c.tag});
    for (int pass = 0; pass < 2 && !st; pass++)
        for (int i = 0; i < r->nsub && !st; i++)
            if ((r->sub[i].c.coll == MG_COLL_SEND) == (pass == 0)) {
                st = g->be->run(g, &r->sub[i]);
                if (st) r->rejected = r->sub[i].rejected;
            }
    return st || !g->nccl_rules ? st : nccl_rules_end(g, r);
}

/* The staged buffers of a request (a batch's operations) back to their
 * device when `copy`, and the host copies freed. */
static mg_status unstage(mg__req *r, bool copy)
{
    mg__nccl_release(r);
    mg_status st = mg__stage_out(r, copy);
    for (int i = 0; i < r->nsub && r->kind == MG__REQ_BATCH; i++) {
        mg_status e = mg__stage_out(&r->sub[i], copy && !st);
        if (!st) st = e;
    }
    return st;
}

/* The time an operation took, in the group's counters and (tracing,
 * a named group) the trace. */
static void account(mg_group *g, const mg__req *r, double t0, double t1)
{
    uint64_t ns = t1 > t0 ? (uint64_t)((t1 - t0) * 1e9) : 0;
    atomic_fetch_add_explicit(&g->traffic.busy_ns, ns, memory_order_relaxed);
    if (!g->trace_name[0] || !mg_trace_on() || r->kind == MG__REQ_FREE) return;
    char name[48];
    snprintf(name, sizeof name, "%s %s", g->trace_name,
             r->kind == MG__REQ_CALL ? mg_coll_name(r->c.coll)
             : r->kind == MG__REQ_BATCH ? "send/recv batch" : "set-up");
    mg_trace_event(name, g->trace_name, 3, mg_trace_at(t0), mg_trace_at(t1));
}

/* Run one request on the calling thread, which holds the execution right. */
static mg_status exec(mg_group *g, mg__req *r)
{
    /* Freeing is local and must work even on a failed group. */
    bool dead = atomic_load(&g->failed) && r->kind != MG__REQ_FREE;
    double t0 = mg_now();
    mg_status st = dead ? failed_error(g)
                   : r->nccl                  ? mg__nccl_run(g, r)
                   : r->kind == MG__REQ_BATCH ? run_batch(g, r)
                                              : g->be->run(g, r);
    account(g, r, t0, mg_now());
    /* A copy to a device that fails is this rank's error alone. */
    mg_status out = unstage(r, !st);
    if (!st && out) {
        st = out;
        r->rejected = true;
    }
    if (r->kind == MG__REQ_BATCH) {
        free(r->sub);
        r->sub = NULL;
    }
    if (dead) return st;
    if (st && !r->rejected && !r->contained) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mg_last_error());
        mg__group_fail(g, st, msg);
        mg_error(st, "%s", msg);
    }
    return st;
}

static void abs_time(struct timespec *ts, double from_now)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    double t = (double)ts->tv_sec + 1e-9 * (double)ts->tv_nsec + (from_now > 1e9 ? 1e9 : from_now);
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

/* Wait for work (caller holds g->mu), ticking the backend while idle. */
static void idle_wait(mg_group *g, double *next_tick)
{
    if (!g->be->tick || g->tick_s <= 0 || atomic_load(&g->failed)) {
        pthread_cond_wait(&g->wake, &g->mu);
        return;
    }
    double now = mg_now();
    if (now < *next_tick) {
        struct timespec ts;
        abs_time(&ts, *next_tick - now);
        pthread_cond_timedwait(&g->wake, &g->mu, &ts);
        return;
    }
    *next_tick = now + g->tick_s;
    if (g->executing || g->head) return;
    g->executing = true;
    pthread_mutex_unlock(&g->mu);
    g->be->tick(g);
    pthread_mutex_lock(&g->mu);
    g->executing = false;
}

static void *progress_main(void *arg)
{
    mg_group *g = arg;
    double next_tick = 0;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!(g->head && !g->executing) && !(g->stop && !g->head)) idle_wait(g, &next_tick);
        if (!g->head) break; /* stop requested and nothing left */
        struct mg_work *w = g->head;
        g->head = w->next;
        if (!g->head) g->tail = NULL;
        g->executing = true;
        atomic_store(&w->state, W_RUNNING);
        pthread_mutex_unlock(&g->mu);
        w->t_start = mg_now();
        mg_status st = exec(g, &w->r);
        w->t_end = mg_now();
        if (st) snprintf(w->msg, sizeof w->msg, "%s", mg_last_error());
        pthread_mutex_lock(&g->mu);
        g->executing = false;
        w->st = st;
        atomic_store_explicit(&w->state, W_DONE, memory_order_release);
        pthread_cond_broadcast(&g->done);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* ---- issue --------------------------------------------------------------- */

static void make_req(mg_group *g, const mg_call *c, mg__req *r)
{
    memset(r, 0, sizeof *r);
    r->kind = MG__REQ_CALL;
    r->c = *c;
    if (r->c.sendbuf == MG_IN_PLACE) r->c.sendbuf = r->c.recvbuf;
}

/* Number the request (caller holds g->mu): issue order defines it. */
static void number(mg_group *g, mg__req *r)
{
    if (r->kind == MG__REQ_FREE) return; /* local: not numbered */
    if (r->kind == MG__REQ_BATCH) {      /* point-to-point: each its own number */
        for (int i = 0; i < r->nsub; i++) number(g, &r->sub[i]);
        return;
    }
    if (r->kind == MG__REQ_CALL && r->c.coll == MG_COLL_SEND) r->seq = g->sends[r->c.root]++;
    else if (r->kind == MG__REQ_CALL && r->c.coll == MG_COLL_RECV)
        r->seq = r->c.root == MG_ANY_SOURCE ? ++g->recvs_any : g->recvs[r->c.root]++;
    else r->seq = ++g->seq;
}

static void enqueue(mg_group *g, struct mg_work *w)
{
    number(g, &w->r);
    w->next = NULL;
    if (g->tail) g->tail->next = w;
    else g->head = w;
    g->tail = w;
    pthread_cond_signal(&g->wake);
}

static mg_status wait_done(struct mg_work *w, double timeout);

/* Run a request to completion, inline when the group is idle. */
static mg_status run_req(mg_group *g, mg__req *r)
{
    if (atomic_load(&g->failed) && r->kind != MG__REQ_FREE) {
        unstage(r, false);
        return failed_error(g);
    }
    pthread_mutex_lock(&g->mu);
    if (!g->head && !g->executing) {
        g->executing = true;
        number(g, r);
        pthread_mutex_unlock(&g->mu);
        mg_status st = exec(g, r);
        pthread_mutex_lock(&g->mu);
        g->executing = false;
        if (g->head) pthread_cond_signal(&g->wake);
        pthread_mutex_unlock(&g->mu);
        return st;
    }
    struct mg_work w = {.g = g, .r = *r};
    atomic_init(&w.state, W_QUEUED);
    enqueue(g, &w);
    pthread_mutex_unlock(&g->mu);
    return wait_done(&w, 1e30);
}

mg_status mg__run_req(mg_group *g, mg__req *r) { return run_req(g, r); }

/* At issue: a call on device memory goes to NCCL when the group has it
 * and NCCL can take the call, else its device buffers are staged
 * through host memory. */
static mg_status route(mg_group *g, mg__req *r)
{
    if (mg__nccl_takes(g->nccl, r, g->rank, g->size))
        return mg__nccl_issue(g->nccl, r, g->rank, g->size);
    return mg__stage_in(r, g->rank, g->size);
}

mg_status mg_run(mg_group *g, const mg_call *c)
{
    MG_NEED(mg_coll_name(c->coll), g);
    MG_TRY(mg__call_check(c, &g->names, g->rank, g->size));
    mg__req r;
    make_req(g, c, &r);
    MG_TRY(route(g, &r));
    return run_req(g, &r);
}

/* Freed works wait here for the next mg_start, so that a training step's
 * all-reduces allocate nothing once the first step has run. Process-wide
 * (a work may outlive its group) and bounded. */
#define POOL_MAX 64
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mg_work *pool;
static int pool_n;

static struct mg_work *work_new(void)
{
    pthread_mutex_lock(&pool_mu);
    struct mg_work *w = pool;
    if (w) {
        pool = w->next;
        pool_n--;
    }
    pthread_mutex_unlock(&pool_mu);
    if (!w) return calloc(1, sizeof *w);
    memset(w, 0, sizeof *w);
    return w;
}

static void work_release(struct mg_work *w)
{
    pthread_mutex_lock(&pool_mu);
    if (pool_n < POOL_MAX) {
        w->next = pool;
        pool = w;
        pool_n++;
        w = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    free(w);
}

mg_status mg_start(mg_group *g, const mg_call *c, mg_work **out)
{
    MG_NEED(mg_coll_name(c->coll), out);
    *out = NULL;
    MG_NEED(mg_coll_name(c->coll), g);
    MG_TRY(mg__call_check(c, &g->names, g->rank, g->size));
    if (atomic_load(&g->failed)) return failed_error(g);
    struct mg_work *w = work_new();
    if (!w) return mg_error(MG_ENOMEM, "mg_start: out of memory");
    w->g = g;
    w->heap = true;
    make_req(g, c, &w->r);
    mg_status st = route(g, &w->r);
    if (st) {
        work_release(w);
        return st;
    }
    atomic_init(&w->state, W_QUEUED);
    pthread_mutex_lock(&g->mu);
    enqueue(g, w);
    pthread_mutex_unlock(&g->mu);
    *out = w;
    return MG_OK;
}

mg_status mg__batch(mg_group *g, const mg_p2p_op *ops, int n, const char *file, int line,
                    mg_work **out)
{
    *out = NULL;
    if (n < 0 || (n > 0 && !ops))
        return mg_error(MG_EINVAL, "batch_isend_irecv: %d operations at %p", n, (const void *)ops);
    mg__req *sub = calloc((size_t)(n ? n : 1), sizeof *sub);
    if (!sub) return mg_error(MG_ENOMEM, "batch_isend_irecv: out of memory");
    for (int i = 0; i < n; i++) {
        mg_call c = {.coll = ops[i].coll, .count = ops[i].count, .dtype = ops[i].dtype,
                     .root = ops[i].peer, .tag = ops[i].tag, .file = file, .line = line};
        if (c.coll == MG_COLL_SEND) c.sendbuf = ops[i].buf;
        else c.recvbuf = ops[i].buf;
        mg_status st = c.coll != MG_COLL_SEND && c.coll != MG_COLL_RECV
                           ? mg_error(MG_EINVAL, "batch_isend_irecv: operation %d is %s, not a "
                                      "send or a receive", i, mg_coll_name(c.coll))
                       : c.root == MG_ANY_SOURCE
                           ? mg_error(MG_EINVAL, "batch_isend_irecv: operation %d receives from "
                                      "any source, which a batch cannot hold (use mg_irecv_any)", i)
                           : mg__call_check(&c, &g->names, g->rank, g->size);
        if (st) {
            free(sub);
            return st;
        }
        make_req(g, &c, &sub[i]);
    }
    mg__req batch = {.kind = MG__REQ_BATCH, .sub = sub, .nsub = n};
    /* Every operation on this GPU: one NCCL group; else each staged. */
    mg_status st = MG_OK;
    if (mg__nccl_takes(g->nccl, &batch, g->rank, g->size))
        st = mg__nccl_issue(g->nccl, &batch, g->rank, g->size);
    else
        for (int i = 0; i < n && !st; i++) st = mg__stage_in(&sub[i], g->rank, g->size);
    if (st) {
        unstage(&batch, false);
        free(sub);
        return st;
    }
    if (atomic_load(&g->failed)) {
        unstage(&batch, false);
        free(sub);
        return failed_error(g);
    }
    struct mg_work *w = work_new();
    if (!w) {
        unstage(&batch, false);
        free(sub);
        return mg_error(MG_ENOMEM, "batch_isend_irecv: out of memory");
    }
    w->g = g;
    w->heap = true;
    w->r = batch;
    atomic_init(&w->state, W_QUEUED);
    pthread_mutex_lock(&g->mu);
    enqueue(g, w);
    pthread_mutex_unlock(&g->mu);
    *out = w;
    return MG_OK;
}

mg_status mg__sendrecv_user(mg_group *g, const void *sbuf, size_t scount, int to, int stag,
                       void *rbuf, size_t rcount, int from, int rtag, mg_dtype dtype,
                       const char *file, int line)
{
    mg_p2p_op op[2] = {
        {MG_COLL_SEND, (void *)sbuf, scount, dtype, to, stag},
        {MG_COLL_RECV, rbuf, rcount, dtype, from, rtag},
    };
    mg_work *w;
    MG_TRY(mg__batch(g, op, 2, file, line, &w));
    mg_status st = mg_work_wait(w, -1);
    mg_work_free(w);
    return st;
}

static mg_status wait_done(struct mg_work *w, double timeout)
{
    if (atomic_load_explicit(&w->state, memory_order_acquire) != W_DONE) {
        mg_group *g = w->g;
        struct timespec ts;
        abs_time(&ts, timeout);
        pthread_mutex_lock(&g->mu);
        int rc = 0;
        while (atomic_load(&w->state) != W_DONE && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&g->done, &g->mu, &ts);
        bool done = atomic_load(&w->state) == W_DONE;
        pthread_mutex_unlock(&g->mu);
        if (!done) {
            char d[64] = "";
            if (w->r.kind == MG__REQ_CALL)
                snprintf(d, sizeof d, "%s ", mg_coll_name(w->r.c.coll));
            return mg_error(MG_ETIMEOUT, "mg_work_wait: the %soperation did not complete within "
                            "%.3g s (it goes on; wait again or raise the timeout)", d, timeout);
        }
    }
    if (w->st) mg_error(w->st, "%s", w->msg);
    return w->st;
}

void mg_work_times(const mg_work *w, double *start, double *end)
{
    MG_ASSERT(atomic_load_explicit(&w->state, memory_order_acquire) == W_DONE);
    *start = w->t_start;
    *end = w->t_end;
}

mg_status mg_work_wait(mg_work *w, double timeout_s)
{
    if (!w) return mg_error(MG_EINVAL, "mg_work_wait: NULL work");
    if (isnan(timeout_s))   /* it made the wait's deadline an invalid time: a spin */
        return mg_error(MG_EINVAL, "mg_work_wait: the timeout is NaN: give seconds, or a "
                        "negative number to wait without one");
    return wait_done(w, timeout_s < 0 ? 1e30 : timeout_s);
}

int mg_work_test(mg_work *w)
{
    return w && atomic_load_explicit(&w->state, memory_order_acquire) == W_DONE;
}

void mg_work_free(mg_work *w)
{
    if (!w) return;
    if (atomic_load_explicit(&w->state, memory_order_acquire) != W_DONE) {
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", mg_last_error());
        wait_done(w, 1e30);
        mg_error(MG_OK, "%s", keep);
    }
    MG_ASSERT(w->heap);
    work_release(w);
}
