/* The in-process group stand-in of coll_mock.h: threads as ranks,
 * rendezvous channels under one mutex (a condition variable per rank),
 * and a shared-memory view over ordinary memory with counters that spin,
 * then sleep. Meant for correctness (and ThreadSanitizer, which sees every
 * handoff), not speed. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "coll_mock.h"
#include "multigrad/core.h"

typedef struct msg {
    struct msg *next;
    const void *buf;
    size_t n;
    int done;
} msg;

typedef struct {
    _Atomic uint64_t v;
    char pad[56];
} counter;

typedef struct rank_state {
    mg__p2p p;
    mg__shm_view shm;
    pthread_cond_t cv;          /* this rank sleeps here */
    mgt_world *w;
    int rank;
    size_t gused;
    mgt_rank_fn fn;
    void *arg;
    int rc;
    pthread_t th;
} rank_state;

struct mgt_world {
    int P;
    double timeout;
    pthread_mutex_t mu;
    msg **head, **tail;         /* channel [from * P + to] */
    rank_state *rs;
    int use_shm;
    size_t slot_bytes, gmem_bytes;
    char *slots, *gmem;
    counter *ctr;
    _Atomic int shm_waiters;
    pthread_cond_t shm_cv;
    long spins;
    int bar_count;
    uint64_t bar_gen;
    long msgs;                  /* under mu */
};

static void cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* Wait on cv until woken or the deadline; ETIMEDOUT after it. */
static int cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline)
{
    struct timespec ts;
    double s = deadline < 0 ? 0 : deadline;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    return pthread_cond_timedwait(cv, mu, &ts);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- channels --------------------------------------------------------- */

static void enqueue(mgt_world *w, int from, int to, msg *m)
{
    int c = from * w->P + to;
    w->msgs++;
    m->next = NULL;
    if (w->tail[c]) w->tail[c]->next = m; else w->head[c] = m;
    w->tail[c] = m;
    pthread_cond_signal(&w->rs[to].cv);
}

static void unlink_msg(mgt_world *w, int from, int to, msg *m)
{
    int c = from * w->P + to;
    msg **pp = &w->head[c], *prev = NULL;
    while (*pp && *pp != m) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = m->next;
    if (w->tail[c] == m) w->tail[c] = prev;
}

/* Take the next message from `from` into buf (mu held). */
static mg_status take(rank_state *me, int from, void *buf, size_t n)
{
    mgt_world *w = me->w;
    int c = from * w->P + me->rank;
    while (!w->head[c]) {
        if (cond_wait_until(&me->cv, &w->mu, me->p.deadline) == ETIMEDOUT && !w->head[c])
            return mg_error(MG_ETIMEOUT, "mock: rank %d timed out receiving %zu bytes from %d",
                            me->rank, n, from);
    }
    msg *m = w->head[c];
    mg_status st = MG_OK;
    if (m->n != n)
        st = mg_error(MG_EMISMATCH, "mock: rank %d expected %zu bytes from %d, got %zu",
                      me->rank, n, from, m->n);
    else
        memcpy(buf, m->buf, n);
    unlink_msg(w, from, me->rank, m);
    m->done = 1;
    pthread_cond_signal(&w->rs[from].cv);
    return st;
}

/* Wait until our message to `to` was taken (mu held). */
static mg_status await_sent(rank_state *me, int to, msg *m)
{
    mgt_world *w = me->w;
    while (!m->done) {
        if (cond_wait_until(&me->cv, &w->mu, me->p.deadline) == ETIMEDOUT && !m->done) {
            unlink_msg(w, me->rank, to, m);
            return mg_error(MG_ETIMEOUT, "mock: rank %d timed out sending %zu bytes to %d",
                            me->rank, m->n, to);
        }
    }
    return MG_OK;
}

static void check_peer(rank_state *me, int peer, size_t n)
{
    MG_ASSERT(peer >= 0 && peer < me->w->P && peer != me->rank);
    MG_ASSERT(n > 0);   /* coll.h: zero-byte transfers are never issued */
}

static mg_status m_send(mg__p2p *p, int peer, const void *buf, size_t n)
{
    rank_state *me = p->ctx;
    check_peer(me, peer, n);
    msg m = {.buf = buf, .n = n};
    pthread_mutex_lock(&me->w->mu);
    enqueue(me->w, me->rank, peer, &m);
    mg_status st = await_sent(me, peer, &m);
    pthread_mutex_unlock(&me->w->mu);
    return st;
}

static mg_status m_recv(mg__p2p *p, int peer, void *buf, size_t n)
{
    rank_state *me = p->ctx;
    check_peer(me, peer, n);
    pthread_mutex_lock(&me->w->mu);
    mg_status st = take(me, peer, buf, n);
    pthread_mutex_unlock(&me->w->mu);
    return st;
}

static mg_status m_sendrecv(mg__p2p *p, int to, const void *sbuf, size_t sn, int from,
                            void *rbuf, size_t rn)
{
    rank_state *me = p->ctx;
    check_peer(me, to, sn);
    check_peer(me, from, rn);
    msg m = {.buf = sbuf, .n = sn};
    pthread_mutex_lock(&me->w->mu);
    enqueue(me->w, me->rank, to, &m);
    mg_status st = take(me, from, rbuf, rn);
    mg_status st2 = await_sent(me, to, &m);
    pthread_mutex_unlock(&me->w->mu);
    return st ? st : st2;
}

/* ---- shared memory ------------------------------------------------------ */

static void *m_slot(mg__shm_view *s, int rank)
{
    rank_state *me = s->ctx;
    MG_ASSERT(rank >= 0 && rank < me->w->P);
    return me->w->slots + (size_t)rank * me->w->slot_bytes;
}

static uint64_t m_gaddr(mg__shm_view *s, const void *ptr, size_t bytes)
{
    rank_state *me = s->ctx;
    mgt_world *w = me->w;
    const char *g = w->gmem + (size_t)me->rank * w->gmem_bytes, *c = ptr;
    if (c < g || c >= g + w->gmem_bytes || bytes > (size_t)(g + w->gmem_bytes - c)) return 0;
    return (uint64_t)(c - g) + 1;
}

static void *m_gptr(mg__shm_view *s, int rank, uint64_t ga)
{
    rank_state *me = s->ctx;
    mgt_world *w = me->w;
    MG_ASSERT(ga >= 1 && ga - 1 < w->gmem_bytes && rank >= 0 && rank < w->P);
    return w->gmem + (size_t)rank * w->gmem_bytes + (ga - 1);
}

static void *m_peer_ptr(mg__shm_view *s, int peer, const void *ptr)
{
    uint64_t ga = m_gaddr(s, ptr, 1);
    return ga ? m_gptr(s, peer, ga) : NULL;
}

static mg_status m_barrier(mg__shm_view *s, int phase)
{
    rank_state *me = s->ctx;
    mgt_world *w = me->w;
    (void)phase;
    pthread_mutex_lock(&w->mu);
    uint64_t gen = w->bar_gen;
    if (++w->bar_count == w->P) {
        w->bar_count = 0;
        w->bar_gen++;
        pthread_cond_broadcast(&w->shm_cv);
    }
    while (w->bar_gen == gen) {
        if (cond_wait_until(&w->shm_cv, &w->mu, me->p.deadline) == ETIMEDOUT &&
            w->bar_gen == gen) {
            pthread_mutex_unlock(&w->mu);
            return mg_error(MG_ETIMEOUT, "mock: barrier timed out on rank %d", me->rank);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return MG_OK;
}

static void m_post(mg__shm_view *s, uint64_t v)
{
    rank_state *me = s->ctx;
    mgt_world *w = me->w;
    _Atomic uint64_t *c = &w->ctr[me->rank].v;
    MG_ASSERT(v >= atomic_load_explicit(c, memory_order_relaxed));   /* coll.h: only grows */
    atomic_store(c, v);
    if (atomic_load(&w->shm_waiters)) {
        pthread_mutex_lock(&w->mu);
        pthread_cond_broadcast(&w->shm_cv);
        pthread_mutex_unlock(&w->mu);
    }
}

static mg_status m_wait(mg__shm_view *s, int rank, uint64_t v)
{
    rank_state *me = s->ctx;
    mgt_world *w = me->w;
    MG_ASSERT(rank >= 0 && rank < w->P && rank != me->rank);
    _Atomic uint64_t *c = &w->ctr[rank].v;
    for (long i = 0; i < w->spins; i++) {
        if (atomic_load_explicit(c, memory_order_acquire) >= v) return MG_OK;
        cpu_relax();
    }
    mg_status st = MG_OK;
    pthread_mutex_lock(&w->mu);
    atomic_fetch_add(&w->shm_waiters, 1);
    while (atomic_load(c) < v) {
        if (cond_wait_until(&w->shm_cv, &w->mu, me->p.deadline) == ETIMEDOUT && atomic_load(c) < v) {
            st = mg_error(MG_ETIMEOUT, "mock: rank %d timed out waiting for rank %d's counter "
                          "to reach %#llx (it is %#llx)", me->rank, rank,
                          (unsigned long long)v, (unsigned long long)atomic_load(c));
            break;
        }
    }
    atomic_fetch_sub(&w->shm_waiters, 1);
    pthread_mutex_unlock(&w->mu);
    return st;
}

/* ---- world -------------------------------------------------------------- */

mgt_world *mgt_world_create(int size, int shm, size_t slot_bytes, size_t gmem_bytes,
                            double timeout_s)
{
    mgt_world *w = calloc(1, sizeof *w);
    MG_ASSERT(w && size >= 1);
    w->P = size;
    w->timeout = timeout_s;
    pthread_mutex_init(&w->mu, NULL);
    cond_init(&w->shm_cv);
    w->head = calloc((size_t)size * size, sizeof *w->head);
    w->tail = calloc((size_t)size * size, sizeof *w->tail);
    w->rs = calloc((size_t)size, sizeof *w->rs);
    MG_ASSERT(w->head && w->tail && w->rs);
    w->use_shm = shm;
    w->slot_bytes = slot_bytes;
    w->gmem_bytes = (gmem_bytes + 63) & ~(size_t)63;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    w->spins = size <= ncpu ? 200000 : 50;
    if (shm) {
        w->slots = mg_alloc_zero((size_t)size * slot_bytes);
        w->gmem = mg_alloc_zero((size_t)size * w->gmem_bytes + 64);
        w->ctr = mg_alloc_zero((size_t)size * sizeof(counter));
        MG_ASSERT(w->slots && w->gmem && w->ctr);
    }
    for (int r = 0; r < size; r++) {
        rank_state *rs = &w->rs[r];
        rs->w = w;
        rs->rank = r;
        cond_init(&rs->cv);
        rs->p = (mg__p2p){.rank = r, .size = size, .ctx = rs, .send = m_send, .recv = m_recv,
                          .sendrecv = m_sendrecv, .shm = shm ? &rs->shm : NULL};
        rs->shm = (mg__shm_view){.slot_bytes = slot_bytes, .slot = m_slot,
                                 .peer_ptr = m_peer_ptr, .gaddr = m_gaddr, .gptr = m_gptr,
                                 .barrier = m_barrier, .post = m_post, .wait = m_wait,
                                 .ctx = rs};
    }
    return w;
}

void mgt_world_destroy(mgt_world *w)
{
    if (!w) return;
    for (int r = 0; r < w->P; r++) {
        mg__coll_scratch_free(&w->rs[r].p);
        pthread_cond_destroy(&w->rs[r].cv);
    }
    mg_free(w->slots);
    mg_free(w->gmem);
    mg_free(w->ctr);
    pthread_cond_destroy(&w->shm_cv);
    pthread_mutex_destroy(&w->mu);
    free(w->head);
    free(w->tail);
    free(w->rs);
    free(w);
}

void mgt_world_set_spin(mgt_world *w, long spins) { w->spins = spins; }

long mgt_world_msgs(mgt_world *w)
{
    pthread_mutex_lock(&w->mu);
    long n = w->msgs;
    pthread_mutex_unlock(&w->mu);
    return n;
}

static void *rank_main(void *arg)
{
    rank_state *rs = arg;
    rs->p.deadline = mg_now() + rs->w->timeout;
    rs->rc = rs->fn(rs->w, rs->rank, &rs->p, rs->arg);
    return NULL;
}

int mgt_world_run(mgt_world *w, mgt_rank_fn fn, void *arg)
{
    for (int r = 0; r < w->P; r++) {
        w->rs[r].fn = fn;
        w->rs[r].arg = arg;
        MG_ASSERT(pthread_create(&w->rs[r].th, NULL, rank_main, &w->rs[r]) == 0);
    }
    int failed = 0;
    for (int r = 0; r < w->P; r++) {
        pthread_join(w->rs[r].th, NULL);
        failed += w->rs[r].rc != 0;
    }
    return failed;
}

mg_status mgt_coll(mg__p2p *p, const mg_call *c, mg__algo algo)
{
    rank_state *rs = p->ctx;
    p->deadline = mg_now() + rs->w->timeout;
    return mg__coll_run(p, c, algo);
}

void *mgt_galloc(mgt_world *w, int rank, size_t bytes)
{
    rank_state *rs = &w->rs[rank];
    size_t b = (bytes + 63) & ~(size_t)63;
    if (!w->gmem || rs->gused + b > w->gmem_bytes) return NULL;
    void *p = w->gmem + (size_t)rank * w->gmem_bytes + rs->gused;
    rs->gused += b;
    return p;
}

void mgt_greset(mgt_world *w, int rank) { w->rs[rank].gused = 0; }
