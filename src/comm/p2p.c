/* Frames on the channels: the send/recv/sendrecv the algorithms use, the
 * user's tagged point-to-point messages, and abort notices.
 *
 * Every transfer is a frame: a 64-byte header (transport.h) and its
 * payload. A collective's frames carry its fingerprint; the receiver
 * compares it with its own and checks the length before a byte of payload
 * reaches the caller's buffer, so ranks that disagree get an error naming
 * both calls instead of corrupted memory or a hang. User messages carry
 * their tag; one that arrives before its receive (another tag, or during
 * a collective) is kept in an unexpected list (bounded by
 * MG_P2P_UNEXPECTED_MB, default 512) and matched later in arrival order.
 *
 * A transfer that cannot progress first drains incoming user messages on
 * every link (so two ranks sending each other large messages, or one
 * sending while the other is already in a collective, both complete),
 * then spins briefly (shared memory only) and blocks: futex on this rank's
 * doorbell when only shared memory is involved, poll() when TCP is. After
 * each block it checks the deadline, peers' abort notices, whether the
 * awaited peers showed a sign of life within MG_PEER_TIMEOUT (transport.h)
 * and, on this host, whether their processes still live. While it waits
 * or moves data, this rank beats for its peers (heartbeat frames on TCP
 * channels that are otherwise quiet); heartbeats received are dropped.
 *
 * Traffic (mg_group_traffic): a frame's payload counts as sent when its
 * last byte is written and as received when its last byte is read, user
 * messages and collectives alike; headers, heartbeats and abort notices
 * do not count, nor messages a rank sends itself. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include "comm/builtin.h"
#include "comm/call.h"
#include "comm/transport/sock.h"
#include "multigrad/core.h"

#define HDR ((size_t)sizeof(mg__fp))
#define SLICE 0.1
#define MIXED_SLICE_MS 1

enum { WANT_COLL, WANT_P2P, WANT_ANY };   /* WANT_ANY: a receive from any of a set */

typedef struct {
    int kind, tag;
    uint8_t *buf;
    size_t n;
    bool done;
    int from;             /* done: the peer it came from */
    const mg__req *req;   /* WANT_P2P, WANT_ANY: the receive, for messages */
} want;

typedef struct {
    mg__link *l;
    mg__fp h;
    const uint8_t *buf;
    size_t n, sent;
    bool done;
} txop;

/* How this group's messages name its rank r (names.h). */
static const char *who(const mg__bi *b, int r, char *buf, size_t cap)
{
    return mg__rank_name(&b->g->names, r, NULL, buf, cap);
}

static void link_reset(mg__link *l)
{
    l->hgot = 0;
    l->mode = MG__RX_HEADER;
    l->dst = NULL;
    l->left = 0;
    l->um = NULL;
}

/* A frame that cannot be accepted (mismatch, corruption): the error code
 * is kept for the caller, the message is already recorded. The stream can
 * still carry our abort notice to the peer. */
static int link_fail(mg__link *l, mg_status code)
{
    l->err = code;
    return -1;
}

/* The other peers whose TCP connections have closed too, as ", rank 0,
 * rank 3 (pp 1, dp 1)" (empty if none): when a peer dies, the rank that
 * notices first aborts and closes its links, so others may see that
 * rank's close before the dead one's. */
static void other_losses(mg__bi *b, int except, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = 0;
    for (int p = 0; p < b->g->size; p++) {
        mg__link *l = &b->link[p];
        if (p == except || l->ch.kind != MG__CH_TCP || l->ch.fd < 0) continue;
        struct pollfd pf = {.fd = l->ch.fd, .events = POLLRDHUP};
        if (!l->ch.dead && (poll(&pf, 1, 0) <= 0 || !(pf.revents & (POLLRDHUP | POLLHUP | POLLERR))))
            continue;
        char w[128];
        int k = snprintf(buf + used, cap - used, ", %s", who(b, p, w, sizeof w));
        if (k < 0 || (size_t)k >= cap - used) break;
        used += (size_t)k;
    }
}

/* The transport itself failed: the link is never used again. A peer that
 * failed mid-frame could not send us its reason on the link, so look for
 * the notice it leaves in the store; without one, name the other peers
 * whose connections closed too (the store may have died with rank 0). */
static int link_broken(mg__bi *b, mg__link *l)
{
    l->ch.dead = true;
    l->err = MG_EPEER;
    char keep[1024], lost[512], w[128], *why;
    snprintf(keep, sizeof keep, "%s", mg_last_error());
    if ((why = mg__bi_notice_get(b, l->ch.peer, -1))) {
        mg_error(MG_EPEER, "%s failed and aborted the group: %.850s",
                 who(b, l->ch.peer, w, sizeof w), why);
        free(why);
        return -1;
    }
    /* A peer that took this rank as lost (mg__bi_drop_peer). */
    if ((why = mg__bi_notice_get(b, l->ch.peer, b->g->rank))) {
        l->err = MG_ELEFT;
        mg_error(MG_ELEFT, "%s took this rank as lost and went on without it (it found: "
                 "%.700s)", who(b, l->ch.peer, w, sizeof w), why);
        free(why);
        return -1;
    }
    other_losses(b, l->ch.peer, lost, sizeof lost);
    if (lost[0])
        mg_error(MG_EPEER, "%s; connections closed too: %s (one of these ranks may have "
                 "failed first)", keep, lost + 2);
    else
        mg_error(MG_EPEER, "%s", keep);
    return -1;
}

static void describe_frame_p2p(const mg__bi *b, const mg__fp *h, int peer, char *buf, size_t n)
{
    char file[sizeof h->file + 1];
    memcpy(file, h->file, sizeof h->file);
    file[sizeof h->file] = 0;
    for (char *p = file; *p; p++)
        if (*p < 32 || *p > 126) *p = '?';
    char w[128];
    snprintf(buf, n, "send #%llu from %s (%llu x %s, tag %d, %llu bytes) at %s:%u",
             (unsigned long long)h->seq, who(b, peer, w, sizeof w), (unsigned long long)h->count,
             h->dtype < MG_DTYPE_COUNT ? mg_dtype_name((mg_dtype)h->dtype) : "?", h->root,
             (unsigned long long)h->len, file, h->line);
}

/* Whether send h fits receive r of n bytes: the same bytes and dtype (a
 * float sent was taken as integers, bits reinterpreted; a probe);
 * MG_EMISMATCH naming both when not. */
static mg_status p2p_match(const mg__bi *b, const mg__fp *h, int peer, const mg__req *r,
                           size_t n)
{
    if (h->len == n && h->dtype == (uint8_t)r->c.dtype) return MG_OK;
    char d1[320], d2[320];
    describe_frame_p2p(b, h, peer, d1, sizeof d1);
    mg__call_describe_p2p(&r->c, &b->g->names, r->seq, d2, sizeof d2);
    return mg_error(MG_EMISMATCH, "message %s differ: the %s does not fit this rank's %s; send "
                    "and receive counts and dtypes must match",
                    h->len != n ? "sizes" : "dtypes", d1, d2);
}

/* ---- receiving ---------------------------------------------------------- */

/* The frame header in l->h is complete: decide where its payload goes.
 * w NULL: only draining (user messages are buffered, anything else held).
 * Returns 0 to go on, 1 to stop (held), -1 on error. */
static int claim(mg__bi *b, mg__link *l, want *w)
{
    mg__fp *h = &l->h;
    int peer = l->ch.peer;
    char d1[320], pn[128];
    who(b, peer, pn, sizeof pn);
    const char *bad = mg__frame_check(h);
    if (bad)
        return link_fail(l, mg_error(MG_EFORMAT, "corrupt frame from %s (%s): the stream is "
                                     "out of step (a peer of another version, or memory "
                                     "corruption)", pn, bad));
    if (h->kind == MG__FRAME_BEAT) {
        l->mode = MG__RX_BEAT;
        return 0;
    }
    if (h->kind == MG__FRAME_ABORT) {
        l->mode = MG__RX_ABORT;
        l->dst = (uint8_t *)l->amsg;
        l->left = h->len;
        return 0;
    }
    if (h->kind == MG__FRAME_P2P) {
        if (w && w->kind != WANT_COLL && h->root == w->tag) {
            mg_status st = p2p_match(b, h, peer, w->req, w->n);
            if (st) return link_fail(l, st);
            l->mode = MG__RX_DIRECT;
            l->dst = w->buf;
            l->left = w->n;
            return 0;
        }
        if (h->len > b->umax || b->ubytes + h->len > b->umax)
            return link_fail(l, mg_error(MG_ENOMEM, "too much unreceived point-to-point data from "
                                         "%s (over %zu MiB; MG_P2P_UNEXPECTED_MB): receives "
                                         "are missing or late", pn, b->umax >> 20));
        mg__umsg *um = malloc(sizeof *um + (size_t)h->len);
        if (!um)
            return link_fail(l, mg_error(MG_ENOMEM, "out of memory buffering a message from "
                                         "%s", pn));
        um->next = NULL;
        um->peer = peer;
        um->h = *h;
        b->ubytes += h->len;
        l->um = um;
        l->mode = MG__RX_UNEXP;
        l->dst = um->data;
        l->left = h->len;
        return 0;
    }
    /* A collective's frame: held for its turn when nothing waits on this
     * link in particular. */
    if (!w || w->kind == WANT_ANY) {
        l->mode = MG__RX_HELD;
        return 1;
    }
    if (w->kind == WANT_P2P) {
        mg__fp_describe(h, d1, sizeof d1);
        return link_fail(l, mg_error(MG_EMISMATCH, "%s is in %s while this rank waits for "
                                     "its message with tag %d: a send is missing, or the ranks "
                                     "call operations in different orders", pn, d1, w->tag));
    }
    if (!mg__fp_same(&b->fp, h))
        return link_fail(l, mg__fp_mismatch(&b->g->names, &b->fp, b->g->rank, h, peer));
    if (h->len != w->n)
        return link_fail(l, mg_error(MG_EMISMATCH, "%s sent %llu bytes where this rank "
                                     "expects %zu in the same collective: the ranks run "
                                     "different algorithms (do MG_ALGO or MG_COLL_CHUNK differ "
                                     "between ranks?)", pn, (unsigned long long)h->len, w->n));
    l->mode = MG__RX_DIRECT;
    l->dst = w->buf;
    l->left = w->n;
    return 0;
}

static void unexpected_push(mg__bi *b, mg__umsg *um)
{
    mg__umsg **pp = &b->uhead;
    while (*pp) pp = &(*pp)->next;
    *pp = um;
}

/* Progress receiving on l. Returns 1 if anything moved, 0 if not, -1 on
 * error. With w, stops once w is done; without, drains user messages. */
static int rx_step(mg__bi *b, mg__link *l, want *w)
{
    int prog = 0;
    for (;;) {
        if (l->mode == MG__RX_HEADER) {
            ssize_t k = mg__chan_read(&l->ch, (uint8_t *)&l->h + l->hgot, HDR - l->hgot);
            if (k < 0 && !w && l->ch.eof && l->hgot == 0) {
                /* A peer that finished and closed between frames is no
                 * failure until we need something from it. */
                l->closed = true;
                return prog;
            }
            if (k < 0) return link_broken(b, l);
            if (k == 0) return prog;
            prog = 1;
            l->hgot += (size_t)k;
            if (l->hgot < HDR) continue;
            l->mode = MG__RX_HELD;
        }
        if (l->mode == MG__RX_HELD) {
            int r = claim(b, l, w);
            if (r < 0) return -1;
            if (r > 0) return prog;
        }
        while (l->left) {
            ssize_t k = mg__chan_read(&l->ch, l->dst, l->left);
            if (k < 0) return link_broken(b, l);
            if (k == 0) return prog;
            prog = 1;
            l->dst += k;
            l->left -= (size_t)k;
        }
        int mode = l->mode;
        mg__umsg *um = l->um;
        /* A whole payload from the peer is in: traffic (not headers,
         * heartbeats or abort notices). */
        if (mode == MG__RX_DIRECT || mode == MG__RX_UNEXP)
            mg__traffic_add(&b->g->traffic, 0, l->h.len);
        link_reset(l);
        if (mode == MG__RX_BEAT) continue;
        if (mode == MG__RX_DIRECT) {
            w->done = true;
            w->from = l->ch.peer;
            return 1;
        }
        if (mode == MG__RX_UNEXP) {
            /* Drained while we were busy sending, and it is the one we now
             * wait for: the earliest of its tag, since links are FIFO. */
            if (w && w->kind != WANT_COLL && um->h.root == w->tag) {
                mg_status st = p2p_match(b, &um->h, l->ch.peer, w->req, w->n);
                if (st) {
                    b->ubytes -= um->h.len;
                    free(um);
                    return link_fail(l, st);
                }
                if (w->n) memcpy(w->buf, um->data, w->n);
                b->ubytes -= um->h.len;
                free(um);
                w->done = true;
                w->from = l->ch.peer;
                return 1;
            }
            unexpected_push(b, um);
            continue;
        }
        /* An abort notice. */
        size_t n = l->h.len;
        l->amsg[n] = 0;
        for (size_t i = 0; i < n; i++)
            if (l->amsg[i] < 32 || l->amsg[i] > 126) l->amsg[i] = '?';
        char pn[128];
        return link_fail(l, mg_error(MG_EPEER, "%s failed and aborted the group: %s",
                                     who(b, l->ch.peer, pn, sizeof pn), l->amsg));
    }
}

/* ---- sending ------------------------------------------------------------- */

static int tx_step(mg__bi *b, txop *t)
{
    int prog = 0;
    size_t total = HDR + t->n;
    while (t->sent < total) {
        const uint8_t *a, *c = NULL;
        size_t an, cn = 0;
        if (t->sent < HDR) {
            a = (const uint8_t *)&t->h + t->sent;
            an = HDR - t->sent;
            c = t->buf;
            cn = t->n;
        } else {
            a = t->buf + (t->sent - HDR);
            an = total - t->sent;
        }
        t->l->ch.tx_mid = true;
        ssize_t k = mg__chan_write(&t->l->ch, a, an, c, cn);
        if (k < 0) return link_broken(b, t->l);
        if (k == 0) return prog;
        t->sent += (size_t)k;
        prog = 1;
    }
    t->l->ch.tx_mid = false;
    t->done = true;
    mg__traffic_add(&b->g->traffic, t->n, 0);   /* the payload, not the header */
    return 1;
}

/* ---- driving transfers to completion -------------------------------------- */

typedef struct {
    mg__bi *b;
    txop *t;
    mg__link *rl;
} blockctx;

static bool drainable(mg__bi *b, mg__link *l, mg__link *rl)
{
    return l != rl && !l->ch.dead && !l->closed && l->ch.kind != MG__CH_NONE &&
           l->mode != MG__RX_HELD && l->mode != MG__RX_DIRECT;
}

static bool shm_ready(void *p)
{
    blockctx *c = p;
    mg__bi *b = c->b;
    if (c->t && !c->t->done && c->t->l->ch.kind == MG__CH_SHM && mg__chan_writable(&c->t->l->ch))
        return true;
    if (c->rl && c->rl->ch.kind == MG__CH_SHM && mg__chan_readable(&c->rl->ch)) return true;
    for (int p2 = 0; p2 < b->g->size; p2++) {
        mg__link *l = &b->link[p2];
        if (l->ch.kind == MG__CH_SHM && drainable(b, l, c->rl) && mg__chan_readable(&l->ch))
            return true;
    }
    return false;
}

void mg__bi_beat(mg__bi *b)
{
    double now = mg__now_coarse();
    if (now < b->next_beat) return;
    b->next_beat = now + b->beat_s / 2;
    for (int p = 0; p < b->g->size; p++)
        if (b->link[p].ch.kind == MG__CH_TCP) mg__chan_beat(&b->link[p].ch, now - b->beat_s / 2);
    if (b->shm_transport) mg__shm_transport_beat(b->shm_transport);
}

/* A TCP peer awaited that sent nothing — data or heartbeat — for the peer
 * timeout (counted from the start of this request at the earliest) is
 * dead to us. Bytes queued behind a frame this rank cannot take yet count
 * as a sign of life too. Shared-memory peers: mg__shm_transport_check. */
static mg_status check_silence(mg__bi *b, const int *peers, int n, const char *what, int *failed)
{
    if (b->peer_timeout <= 0) return MG_OK;
    double now = mg__now_coarse(), start = b->deadline - b->g->timeout;
    for (int i = 0; i < n; i++) {
        mg__chan *c = &b->link[peers[i]].ch;
        double since = c->last_rx > start ? c->last_rx : start;
        if (c->kind != MG__CH_TCP || now - since <= b->peer_timeout) continue;
        int inq = 0;
        if (ioctl(c->fd, FIONREAD, &inq) == 0 && inq != c->inq_seen) {
            c->inq_seen = inq;
            c->last_rx = now;
            continue;
        }
        const mg__rinfo *it = &b->info[peers[i]];
        char extra[200], pn[320];
        int state = MG__UNSEEN;
        if (!strcmp(b->info[b->g->rank].hostkey, it->hostkey)) {
            snprintf(extra, sizeof extra, "pid %d, this host", (int)it->pid);
            state = mg__proc_state(it->pid, it->start);
        } else {
            snprintf(extra, sizeof extra, "host %s, %s:%d", it->host, it->addr, (int)it->port);
        }
        mg__rank_name(&b->g->names, peers[i], extra, pn, sizeof pn);
        if (failed) *failed = peers[i];
        return mg__peer_silent(pn, b->peer_timeout, what, state);
    }
    return MG_OK;
}

mg_status mg__bi_watch(mg_group *g, double since, const char *what)
{
    mg__bi *b = g->impl;
    mg__bi_beat(b);
    int *peers = malloc(sizeof(int) * (size_t)g->size), n = 0;
    if (!peers) return MG_OK;   /* checked again in a second */
    for (int p = 0; p < g->size; p++)
        if (p != g->rank) peers[n++] = p;
    b->deadline = since + g->timeout;
    mg_status st = MG_OK;
    if (b->shm_transport) {
        mg__shm_transport_set_deadline(b->shm_transport, since, b->deadline);
        st = mg__shm_transport_check(b->shm_transport, peers, n, what, NULL);
    }
    if (!st) st = check_silence(b, peers, n, what, NULL);
    free(peers);
    return st;
}

/* Nothing moved: wait a little (spin, then block) and check for failures
 * of the peers awaited: t's and rl's, or (a receive from any source) the
 * set's; *failed (if not NULL) names the one that failed. */
static mg_status block(mg__bi *b, txop *t, mg__link *rl, const bool *any, mg__spin *sp,
                       const char *what, int *failed)
{
    bool tcp = (t && !t->done && t->l->ch.kind == MG__CH_TCP) || (rl && rl->ch.kind == MG__CH_TCP);
    bool shm = (t && !t->done && t->l->ch.kind == MG__CH_SHM) || (rl && rl->ch.kind == MG__CH_SHM);
    int n = b->g->size, npeers = 0, peers[n + 2];
    if (t && !t->done) peers[npeers++] = t->l->ch.peer;
    if (rl) peers[npeers++] = rl->ch.peer;
    for (int p = 0; any && p < n; p++) {
        if (!any[p] || p == b->g->rank) continue;
        peers[npeers++] = p;
        tcp = tcp || b->link[p].ch.kind == MG__CH_TCP;
        shm = shm || b->link[p].ch.kind == MG__CH_SHM;
    }
    if (shm && !mg__spin_step(sp, &b->spin)) return MG_OK;
    struct pollfd pf[n + 1];
    int np = 0;
    if (tcp || (b->shm_transport == NULL)) {
        for (int p = 0; p < n; p++) {
            mg__link *l = &b->link[p];
            if (l->ch.kind != MG__CH_TCP || l->ch.dead) continue;
            short ev = 0;
            if (t && !t->done && t->l == l) ev |= POLLOUT;
            if (l == rl || drainable(b, l, rl)) ev |= POLLIN;
            if (ev) pf[np++] = (struct pollfd){.fd = l->ch.fd, .events = ev};
        }
        int ms = shm ? MIXED_SLICE_MS : mg__poll_ms(b->deadline, (int)(SLICE * 1000));
        if (poll(pf, (nfds_t)np, ms) < 0 && errno != EINTR)
            return mg_error(MG_EIO, "poll: %s", strerror(errno));
    } else {
        blockctx c = {b, t, rl};
        mg__shm_transport_block(b->shm_transport, SLICE, shm_ready, &c);
        /* What a peer sent before it exited is read before its death is
         * noticed: a rank that finished its last send and left is not a
         * failure of this wait. */
        if (shm_ready(&c)) return MG_OK;
    }
    if (b->shm_transport)
        MG_TRY(mg__shm_transport_check(b->shm_transport, peers, npeers, what, failed));
    MG_TRY(check_silence(b, peers, npeers, what, failed));
    if (mg_now() < b->deadline) return MG_OK;
    if (any)
        return mg_error(MG_ETIMEOUT, "timed out after %.1f s %s: none of them sent one; raise "
                        "MG_TIMEOUT if they are just slow", b->g->timeout, what);
    /* A peer on this host can be asked how it is. */
    int p = peers[npeers - 1];
    const mg__rinfo *me = &b->info[b->g->rank], *it = &b->info[p];
    const char *how = "it may be stopped, hung, unreachable or in another operation";
    if (!strcmp(me->hostkey, it->hostkey)) {
        mg__liveness lv = mg__proc_state(it->pid, it->start);
        how = lv == MG__STOPPED ? "it is stopped (SIGSTOP or a debugger); resume it"
            : lv == MG__DEAD ? "its process is gone"
            : "it is alive but did not respond (hung, busy, or in another operation)";
    }
    char extra[200], pn[320];
    snprintf(extra, sizeof extra, "pid %d, host %s", (int)it->pid, it->host);
    return mg_error(MG_ETIMEOUT, "timed out after %.1f s %s: %s: %s; raise MG_TIMEOUT if it is "
                    "just slow", b->g->timeout, what,
                    mg__rank_name(&b->g->names, p, extra, pn, sizeof pn), how);
}

static void describe_wait(const mg__bi *b, txop *t, mg__link *rl, char *buf, size_t n)
{
    char to[128], from[128];
    if (t && !t->done) who(b, t->l->ch.peer, to, sizeof to);
    if (rl) who(b, rl->ch.peer, from, sizeof from);
    if (t && !t->done && rl) snprintf(buf, n, "sending to %s and receiving from %s", to, from);
    else if (t && !t->done) snprintf(buf, n, "sending to %s", to);
    else snprintf(buf, n, "waiting for data from %s", rl ? from : "no rank");
}

/* Complete t (if any) and the receive w on rl (if any). */
static mg_status drive(mg__bi *b, txop *t, mg__link *rl, want *w)
{
    mg__spin sp = {0};
    char what[300], pn[128];
    for (;;) {
        int prog = 0, r;
        mg__bi_beat(b);
        if (t && !t->done) {
            if (t->l->ch.dead)
                return mg_error(MG_EPEER, "the link to %s failed earlier",
                                who(b, t->l->ch.peer, pn, sizeof pn));
            if ((r = tx_step(b, t)) < 0) return t->l->err;
            prog |= r;
        }
        if (rl && !w->done) {
            if (rl->ch.dead)
                return mg_error(MG_EPEER, "the link to %s failed earlier",
                                who(b, rl->ch.peer, pn, sizeof pn));
            if (rl->closed)
                return mg_error(MG_EPEER, "%s closed its connection: it exited, crashed or "
                                "aborted", who(b, rl->ch.peer, pn, sizeof pn));
            if ((r = rx_step(b, rl, w)) < 0) return rl->err;
            prog |= r;
        }
        bool tx_done = !t || t->done, rx_done = !rl || w->done;
        if (tx_done && rx_done) return MG_OK;
        if (rx_done) rl = NULL;
        if (prog) {
            mg__spin_reset(&sp);
            continue;
        }
        /* Stuck: take in user messages from everyone (they may be what
         * keeps the peer from reading ours). */
        for (int p = 0; p < b->g->size; p++) {
            mg__link *l = &b->link[p];
            if (!drainable(b, l, rl)) continue;
            if ((r = rx_step(b, l, NULL)) < 0) {
                /* Another peer's failure: in a group that contains them, that
                 * peer's alone (dropped; this operation goes on). */
                if (!atomic_load(&b->g->contain)) return l->err;
                mg__bi_drop_peer(b, p, mg_last_error());
                continue;
            }
            prog |= r;
        }
        if (prog) continue;
        describe_wait(b, t, rl, what, sizeof what);
        MG_TRY(block(b, t, rl, NULL, &sp, what, NULL));
    }
}

/* ---- the algorithms' channels (coll.h) --------------------------------------- */

static mg_status cb_send(mg__p2p *p, int peer, const void *buf, size_t n)
{
    mg__bi *b = p->ctx;
    MG_ASSERT(peer >= 0 && peer < p->size && peer != p->rank);
    txop t = {.l = &b->link[peer], .h = b->fp, .buf = buf, .n = n};
    t.h.len = n;
    return drive(b, &t, NULL, NULL);
}

static mg_status cb_recv(mg__p2p *p, int peer, void *buf, size_t n)
{
    mg__bi *b = p->ctx;
    MG_ASSERT(peer >= 0 && peer < p->size && peer != p->rank);
    want w = {.kind = WANT_COLL, .buf = buf, .n = n};
    return drive(b, NULL, &b->link[peer], &w);
}

static mg_status cb_sendrecv(mg__p2p *p, int to, const void *sbuf, size_t sn, int from,
                             void *rbuf, size_t rn)
{
    mg__bi *b = p->ctx;
    MG_ASSERT(to >= 0 && to < p->size && to != p->rank);
    MG_ASSERT(from >= 0 && from < p->size && from != p->rank);
    txop t = {.l = &b->link[to], .h = b->fp, .buf = sbuf, .n = sn};
    t.h.len = sn;
    want w = {.kind = WANT_COLL, .buf = rbuf, .n = rn};
    return drive(b, &t, &b->link[from], &w);
}

void mg__p2p_init(mg__bi *b)
{
    b->p2p.rank = b->g->rank;
    b->p2p.size = b->g->size;
    b->p2p.ctx = b;
    b->p2p.send = cb_send;
    b->p2p.recv = cb_recv;
    b->p2p.sendrecv = cb_sendrecv;
    b->p2p.traffic = &b->g->traffic;
    b->p2p.names = &b->g->names;
    b->umax = (size_t)mg_env_long("MG_P2P_UNEXPECTED_MB", 512) << 20;
    for (int p = 0; p < b->g->size; p++) link_reset(&b->link[p]);
}

/* ---- user point-to-point ------------------------------------------------------ */

static void p2p_header(mg__fp *h, const mg__req *r, size_t len)
{
    mg_call c = r->c;
    c.coll = MG_COLL_SEND;
    mg__fp_make(h, &c, r->seq, 0);
    h->kind = MG__FRAME_P2P;
    h->dtype = (uint8_t)r->c.dtype;
    h->count = r->c.count;
    h->root = r->c.tag;
    h->len = len;
}

mg_status mg__bi_send(mg__bi *b, const mg__req *r)
{
    int peer = r->c.root;
    size_t n = r->c.count * mg_dtype_size(r->c.dtype);
    if (peer == b->g->rank) {
        /* To oneself: straight into the unexpected list. */
        if (b->ubytes + n > b->umax)
            return mg_error(MG_ENOMEM, "too much unreceived data sent to this rank itself (over "
                            "%zu MiB; MG_P2P_UNEXPECTED_MB)", b->umax >> 20);
        mg__umsg *um = malloc(sizeof *um + n);
        if (!um) return mg_error(MG_ENOMEM, "out of memory buffering a message to itself");
        um->next = NULL;
        um->peer = peer;
        p2p_header(&um->h, r, n);
        if (n) memcpy(um->data, r->c.sendbuf, n);
        b->ubytes += n;
        unexpected_push(b, um);
        return MG_OK;
    }
    txop t = {.l = &b->link[peer], .buf = r->c.sendbuf, .n = n};
    p2p_header(&t.h, r, n);
    return drive(b, &t, NULL, NULL);
}

/* The earliest message of r's tag already here from a rank of the set in
 * (NULL: from r's peer), into r's buffer (n bytes); 1 when there was one
 * (*peer: its sender), -1 on a size that does not fit, else 0. */
static int take_unexpected(mg__bi *b, const mg__req *r, const bool *in, size_t n, int *peer)
{
    for (mg__umsg **pp = &b->uhead; *pp; pp = &(*pp)->next) {
        mg__umsg *um = *pp;
        if (!(in ? in[um->peer] : um->peer == r->c.root) || um->h.root != r->c.tag) continue;
        *peer = um->peer;
        if (p2p_match(b, &um->h, um->peer, r, n)) return -1;
        if (n) memcpy(r->c.recvbuf, um->data, n);
        *pp = um->next;
        b->ubytes -= n;
        free(um);
        return 1;
    }
    return 0;
}

/* A receive from this rank itself that nothing sent before: refused, the
 * caller's error alone (the group stays usable). */
static mg_status nothing_from_itself(const mg__req *r)
{
    ((mg__req *)r)->rejected = true;
    return mg_error(MG_EINVAL, "a receive from this rank itself with tag %d has no matching send "
                    "issued before it", r->c.tag);
}

mg_status mg__bi_recv(mg__bi *b, const mg__req *r)
{
    int peer = r->c.root;
    size_t n = r->c.count * mg_dtype_size(r->c.dtype);
    int k = take_unexpected(b, r, NULL, n, &peer);
    if (k) return k > 0 ? MG_OK : MG_EMISMATCH;
    if (peer == b->g->rank) return nothing_from_itself(r);
    want w = {.kind = WANT_P2P, .tag = r->c.tag, .buf = r->c.recvbuf, .n = n, .req = r};
    return drive(b, NULL, &b->link[peer], &w);
}

/* A receive from any rank of the set, in[p]: the earliest message of its
 * tag already here, else whichever link delivers one first (a link that
 * starts one is then followed to its end); other links' user messages are
 * drained meanwhile and collectives' frames held for their turn. *peer:
 * the sender, or the rank of the set that failed (-1: none). */
static mg_status recv_any(mg__bi *b, const mg__req *r, const bool *in, size_t n, int *peer)
{
    int me = b->g->rank, P = b->g->size, k = take_unexpected(b, r, in, n, peer);
    if (k) return k > 0 ? MG_OK : MG_EMISMATCH;
    *peer = -1;
    bool others = false;
    for (int p = 0; p < P; p++) others = others || (in[p] && p != me);
    if (!others) return nothing_from_itself(r);
    want w = {.kind = WANT_ANY, .tag = r->c.tag, .buf = r->c.recvbuf, .n = n, .from = -1, .req = r};
    mg__spin sp = {0};
    char what[200], pn[128];
    snprintf(what, sizeof what, "waiting for a message with tag %d from any of %s", r->c.tag,
             r->c.from ? "a set of ranks" : "the ranks");
    for (;;) {
        int prog = 0;
        mg__bi_beat(b);
        /* From the link after the last one taken, round: senders that are
         * always ready do not starve those behind them. */
        for (int i = 0, p = b->any_next % P; i < P; i++, p = (p + 1) % P) {
            mg__link *l = &b->link[p];
            if (p == me) continue;
            if (!in[p]) {   /* others' messages: drained, so no sender is kept waiting */
                if (!drainable(b, l, NULL)) continue;
                if ((k = rx_step(b, l, NULL)) < 0) {
                    *peer = p;
                    return l->err;
                }
                prog |= k;
                continue;
            }
            *peer = p;
            if (l->ch.dead)
                return mg_error(MG_EPEER, "the link to %s failed earlier", who(b, p, pn, sizeof pn));
            if (l->closed)
                return mg_error(MG_EPEER, "%s closed its connection: it exited, crashed or "
                                "aborted", who(b, p, pn, sizeof pn));
            if (l->mode == MG__RX_HELD) continue;   /* a collective's frame: its turn comes */
            if ((k = rx_step(b, l, &w)) < 0) return l->err;
            prog |= k;
            if (w.done || l->mode == MG__RX_DIRECT) b->any_next = p + 1;
            if (w.done) return MG_OK;
            if (l->mode == MG__RX_DIRECT) return drive(b, NULL, l, &w);   /* it is this one */
        }
        *peer = -1;
        if (prog) {
            mg__spin_reset(&sp);
            continue;
        }
        MG_TRY(block(b, NULL, NULL, in, &sp, what, peer));
    }
}

mg_status mg__bi_recv_any(mg__bi *b, const mg__req *r, int *peer)
{
    int P = b->g->size;
    bool *in = calloc((size_t)P, sizeof *in);
    if (!in) {
        ((mg__req *)r)->rejected = true;
        return mg_error(MG_ENOMEM, "recv from any source: out of memory");
    }
    for (int i = 0; i < (r->c.from ? r->c.nfrom : P); i++) in[r->c.from ? r->c.from[i] : i] = true;
    mg_status st = recv_any(b, r, in, r->c.count * mg_dtype_size(r->c.dtype), peer);
    free(in);
    return st;
}

void mg__bi_free_unexpected(mg__bi *b)
{
    while (b->uhead) {
        mg__umsg *u = b->uhead;
        b->uhead = u->next;
        free(u);
    }
    for (int p = 0; b->link && p < b->g->size; p++) {
        free(b->link[p].um);
        b->link[p].um = NULL;
    }
    b->ubytes = 0;
}
