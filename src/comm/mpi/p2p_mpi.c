/* The Open MPI backend's waits and point-to-point (backend_mpi.c says
 * how the backend works): polling a request until it completes, a peer's
 * failure notice arrives or the deadline passes; sends buffered (copied,
 * then MPI_Isend, at most MG_P2P_UNEXPECTED_MB in flight) so that two
 * ranks may send each other before receiving; receives, from one rank or
 * from any of a set (probed in turn). Only in builds with MPI.
 * Limits: a receive from any source polls with MPI_Iprobe (no blocking
 * wait on several sources at once). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "comm/mpi/mpi_be.h"
#include "multigrad/core.h"

#ifdef MG_HAVE_MPI

/* ---- waiting ---------------------------------------------------------- */

/* A peer's failure notice, if one has arrived. */
static mg_status check_abort(mpi_be *m)
{
    int flag = 0, mpi_rc;
    MPI_Status s;
    if (m->ctl == MPI_COMM_NULL) return MG_OK;   /* still joining */
    if (LOCKED(MPI_Iprobe(MPI_ANY_SOURCE, TAG_ABORT, m->ctl, &flag, &s)) != MPI_SUCCESS || !flag)
        return MG_OK;
    char msg[1024] = "";
    int n = 0;
    MPI_Get_count(&s, MPI_CHAR, &n);
    if (n < 0 || n > (int)sizeof msg - 1) n = (int)sizeof msg - 1;
    LOCKED(MPI_Recv(msg, n, MPI_CHAR, s.MPI_SOURCE, TAG_ABORT, m->ctl, MPI_STATUS_IGNORE));
    msg[n] = 0;
    char who[128];
    return mg_error(MG_EPEER, "%s on %s: %s failed: %s", m->what, mg__mpi_this_rank(m),
                    mg__rank_name(&m->g->names, s.MPI_SOURCE, NULL, who, sizeof who), msg);
}

/* A polling loop's waits: spin a while, then sleep in growing steps,
 * looking for abort notices; past the deadline, MG_ETIMEOUT (the
 * message from why, e.g. "did not complete"). */
typedef struct {
    mg__spin sp;
    long sleep_ns;
    double next_probe;
} poller;

static poller poller_start(void)
{
    poller p = {.sleep_ns = 20000};
    mg__spin_reset(&p.sp);
    return p;
}

static mg_status poller_idle(mpi_be *m, poller *p, const char *why)
{
    if (!mg__spin_step(&p->sp, &m->spin)) return MG_OK;
    double now = mg_now();
    if (now > p->next_probe) {
        MG_TRY(check_abort(m));
        p->next_probe = now + 0.01;
    }
    if (now > m->deadline) {
        mg__mpi_mark_stuck();
        return mg_error(MG_ETIMEOUT, "%s on %s %s within %g s (MG_TIMEOUT): a peer is dead or "
                        "stuck, or the ranks called different operations (MG_MPI_CHECK=1 names "
                        "them)", m->what, mg__mpi_this_rank(m), why, m->g->timeout);
    }
    struct timespec ts = {0, p->sleep_ns};
    nanosleep(&ts, NULL);
    if (p->sleep_ns < 1000000) p->sleep_ns *= 2;
    return MG_OK;
}

/* Polls rq until it completes, a peer reports failure, or the deadline. */
mg_status mg__mpi_wait_req(mpi_be *m, MPI_Request *rq, MPI_Status *status)
{
    poller p = poller_start();
    for (;;) {
        int flag = 0, mpi_rc;
        MPI_Status s;
        if (LOCKED(MPI_Test(rq, &flag, &s)) != MPI_SUCCESS) return mg__mpi_error(m, mpi_rc);
        if (flag) {
            if (status) *status = s;
            return MG_OK;
        }
        MG_TRY(poller_idle(m, &p, "did not complete"));
    }
}

/* ---- buffered sends ---------------------------------------------------- */

/* Completes buffered sends: the finished ones, or (block) all of them up to
 * `keep` bytes in flight. */
mg_status mg__mpi_reap_sends(mpi_be *m, int block, size_t keep)
{
    while (m->sends) {
        pend *p = m->sends;
        int flag = 0, mpi_rc;
        if (block && m->pend_bytes > keep) {
            /* Messages name the request that waits, not the earlier send. */
            MG_TRY(mg__mpi_wait_req(m, &p->rq, NULL));
            flag = 1;
        } else if (LOCKED(MPI_Test(&p->rq, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) {
            return mg__mpi_error(m, mpi_rc);
        }
        if (!flag) break;    /* sends to one peer complete in order; stop at the first */
        m->sends = p->next;
        if (!m->sends) m->sends_tail = NULL;
        m->pend_bytes -= p->bytes;
        free(p->copy);
        free(p);
    }
    return MG_OK;
}

mg_status mg__mpi_send(mpi_be *m, const mg_call *c)
{
    size_t es = mg_dtype_size(c->dtype), bytes = c->count * es;
    /* Room first, so memory in flight stays bounded. */
    MG_TRY(mg__mpi_reap_sends(m, 1, bytes < m->pend_max ? m->pend_max - bytes : 0));
    for (size_t off = 0; off < c->count || off == 0; off += CHUNK) {
        size_t n = c->count - off < CHUNK ? c->count - off : CHUNK;
        pend *p = calloc(1, sizeof *p);
        void *copy = p ? malloc(n ? n * es : 1) : NULL;
        if (!copy) {
            free(p);
            return mg_error(MG_ENOMEM, "%s on %s: cannot buffer %zu bytes", m->what, mg__mpi_this_rank(m),
                            n * es);
        }
        if (n) memcpy(copy, (const char *)c->sendbuf + off * es, n * es);
        int mpi_rc;
        if (LOCKED(MPI_Isend(copy, (int)n, mg__mpi_type(c->dtype), c->root, c->tag, m->comm,
                             &p->rq)) != MPI_SUCCESS) {
            free(copy);
            free(p);
            return mg__mpi_error(m, mpi_rc);
        }
        *p = (pend){.rq = p->rq, .copy = copy, .bytes = n * es, .peer = c->root, .tag = c->tag};
        if (m->sends_tail) m->sends_tail->next = p;
        else m->sends = p;
        m->sends_tail = p;
        m->pend_bytes += p->bytes;
        if (c->count - off <= CHUNK) break;
    }
    return mg__mpi_reap_sends(m, 0, 0);
}

/* A receive from any of the call's set (or every rank): the first rank
 * with a message of its tag waiting, probed in turn until the deadline. */
static mg_status probe_any(mpi_be *m, const mg_call *c, int *src)
{
    poller p = poller_start();
    for (;;) {
        int flag = 0, mpi_rc;
        MPI_Status s;
        if (!c->from) {
            if (LOCKED(MPI_Iprobe(MPI_ANY_SOURCE, c->tag, m->comm, &flag, &s)) != MPI_SUCCESS)
                return mg__mpi_error(m, mpi_rc);
            if (flag) {
                *src = s.MPI_SOURCE;
                return MG_OK;
            }
        }
        for (int i = 0; c->from && i < c->nfrom; i++) {
            if (LOCKED(MPI_Iprobe(c->from[i], c->tag, m->comm, &flag, MPI_STATUS_IGNORE)) !=
                MPI_SUCCESS)
                return mg__mpi_error(m, mpi_rc);
            if (flag) {
                *src = c->from[i];
                return MG_OK;
            }
        }
        MG_TRY(poller_idle(m, &p, "got no message from any of its ranks"));
    }
}

mg_status mg__mpi_recv(mpi_be *m, mg__req *r)
{
    mg_call one = r->c;
    const mg_call *c = &one;
    size_t es = mg_dtype_size(c->dtype);
    if (c->root == MG_ANY_SOURCE) {
        MG_TRY(probe_any(m, c, &one.root));
        if (c->source) *c->source = one.root;
    }
    if (c->root == m->g->rank) {
        /* From itself: only what it sent itself already can ever come. */
        int flag = 0, mpi_rc;
        LOCKED(MPI_Iprobe(c->root, c->tag, m->comm, &flag, MPI_STATUS_IGNORE));
        if (!flag) {
            r->rejected = true;
            return mg_error(MG_EINVAL, "%s on %s: a receive from this rank itself with no "
                            "message sent to itself (tag %d) would wait forever; send first",
                            m->what, mg__mpi_this_rank(m), c->tag);
        }
    }
    for (size_t off = 0; off < c->count || off == 0; off += CHUNK) {
        size_t n = c->count - off < CHUNK ? c->count - off : CHUNK;
        MPI_Request rq;
        MPI_Status s;
        int mpi_rc, got = -1;
        if (LOCKED(MPI_Irecv((char *)c->recvbuf + off * es, (int)n, mg__mpi_type(c->dtype), c->root,
                             c->tag, m->comm, &rq)) != MPI_SUCCESS)
            return mg__mpi_error(m, mpi_rc);
        MG_TRY(mg__mpi_wait_req(m, &rq, &s));
        MPI_Get_count(&s, mg__mpi_type(c->dtype), &got);
        if (got != (int)n)
            return mg_error(MG_EMISMATCH, "%s on %s: the message has %d elements, the "
                            "receive expects %zu: sender and receiver disagree on the count",
                            m->what, mg__mpi_this_rank(m), got, n);
        if (c->count - off <= CHUNK) break;
    }
    MG_TRY(mg__mpi_reap_sends(m, 0, 0));
    return MG_OK;
}

#endif /* MG_HAVE_MPI */
