/* The TCP transport (see tcp.h). Connections are set up once per group:
 * ranks dial lower ranks and accept higher ones, so the dial of rank i to
 * rank j < i is answered as soon as j has finished dialling its own lower
 * ranks — no cycle, no deadlock. The accept side is a poll loop over the
 * listener and every half-open connection, each a small state machine
 * (authenticate, then read the introduction), so a stranger that connects
 * and says nothing, or garbage, holds up nobody.
 *
 * Data sockets are non-blocking with TCP_NODELAY; reads and writes take
 * what the kernel gives (partial transfers and EINTR are the caller's
 * loop's business, see p2p.c). Heartbeats are header-only frames sent
 * between frames; one the socket took only in part is finished before the
 * next frame's first byte. TCP keepalive is a backstop for a connection
 * idle both ways (no heartbeats: the group is held by a long request that
 * does not communicate), so a vanished host still shows as an error.
 * No TCP_USER_TIMEOUT: since Linux 5.11 it also closes a connection
 * whose receiver keeps its window shut, and a rank that computes for
 * minutes does exactly that to a peer that sent it a large frame. */
#define _GNU_SOURCE
#include "comm/transport/tcp.h"
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include "comm/store/auth.h"
#include "comm/transport/sock.h"
#include "multigrad/core.h"
#include "core/strbuf.h"

#define INTRO 24
#define ACK 8
#define MAX_PENDING 64
#define AUTH_SECONDS 10.0
static const uint8_t MAGIC[4] = {'M', 'G', 'T', '1'};

mg_status mg__tcp_listen(const char *addr, mg__tcp_listener *l)
{
    return mg__sock_listen(addr, 0, &l->fd, &l->port);
}

void mg__tcp_listener_close(mg__tcp_listener *l)
{
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
}

static void intro(uint8_t *b, uint64_t gid, int from, int to)
{
    memset(b, 0, INTRO);
    memcpy(b, MAGIC, 4);
    memcpy(b + 4, &gid, 8);
    int32_t f = from, t = to;
    memcpy(b + 12, &f, 4);
    memcpy(b + 16, &t, 4);
}

static mg_status dial(const mg__names *nm, uint64_t gid, int rank, int peer, const char *addr,
                      int port, const char *secret, double deadline, int *out)
{
    char what[256], extra[128];
    snprintf(extra, sizeof extra, "data connection to %s:%d", addr, port);
    mg__rank_name(nm, peer, extra, what, sizeof what);
    int fd;
    MG_TRY(mg__sock_connect(addr, port, deadline, what, &fd));
    uint8_t b[INTRO], ack[ACK];
    intro(b, gid, rank, peer);
    mg_status st = mg__auth_client(fd, secret, "data", deadline, what);
    if (!st) st = mg__sock_write_all(fd, b, INTRO, deadline, what);
    if (!st) st = mg__sock_read_all(fd, ack, ACK, deadline, what);
    if (!st && (memcmp(ack, MAGIC, 4) || ack[4] != 1))
        st = mg_error(MG_EPEER, "%s refused the connection (not the same group?)", what);
    if (st) {
        close(fd);
        return st;
    }
    *out = fd;
    return MG_OK;
}

typedef struct {
    int fd, state; /* 0 authenticating, 1 reading the introduction */
    mg__auth_srv auth;
    uint8_t buf[INTRO];
    size_t got;
    double deadline;
} pending;

/* Advance one half-open connection: -1 drop, 0 more, or peer+1 when it
 * introduced itself correctly as an expected, not yet connected peer. */
static int pending_step(pending *p, const char *secret, uint64_t gid, int rank, int size,
                        const bool *need, const int *fds)
{
    if (p->state == 0) {
        int r = mg__auth_srv_step(&p->auth, p->fd, secret, "data");
        if (r < 0) return -1;
        if (r == 0) return 0;
        p->state = 1;
    }
    while (p->got < INTRO) {
        ssize_t k = recv(p->fd, p->buf + p->got, INTRO - p->got, MSG_DONTWAIT);
        if (k > 0) p->got += (size_t)k;
        else if (k < 0 && errno == EINTR) continue;
        else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        else return -1;
    }
    uint64_t g;
    int32_t from, to;
    memcpy(&g, p->buf + 4, 8);
    memcpy(&from, p->buf + 12, 4);
    memcpy(&to, p->buf + 16, 4);
    if (memcmp(p->buf, MAGIC, 4) || g != gid || to != rank || from <= rank || from >= size ||
        !need[from] || fds[from] >= 0)
        return -1;
    uint8_t ack[ACK] = {'M', 'G', 'T', '1', 1};
    if (send(p->fd, ack, ACK, MSG_DONTWAIT | MSG_NOSIGNAL) != ACK) return -1;
    return from + 1;
}

mg_status mg__tcp_connect_peers(mg__tcp_listener *l, const mg__names *nm, uint64_t gid, int rank,
                                int size, const bool *need, char (*addr)[64], const int *port,
                                const char *secret, double deadline, int *fds)
{
    int expect = 0;
    for (int p = 0; p < size; p++) {
        fds[p] = -1;
        expect += need[p] && p > rank;
    }
    for (int p = 0; p < rank; p++)
        if (need[p]) MG_TRY(dial(nm, gid, rank, p, addr[p], port[p], secret, deadline, &fds[p]));
    bool loopback_only = !*secret;
    pending pend[MAX_PENDING];
    int np = 0;
    struct pollfd pf[MAX_PENDING + 1];
    while (expect > 0) {
        pf[0] = (struct pollfd){.fd = l->fd, .events = POLLIN};
        for (int i = 0; i < np; i++) pf[i + 1] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int n = poll(pf, (nfds_t)np + 1, mg__poll_ms(deadline, 200));
        if (n < 0 && errno != EINTR) return mg_error(MG_EIO, "poll: %s", strerror(errno));
        double now = mg_now();
        for (int i = np - 1; i >= 0; i--) {
            int r = pf[i + 1].revents || now > pend[i].deadline
                ? pending_step(&pend[i], secret, gid, rank, size, need, fds) : 0;
            if (r == 0 && now > pend[i].deadline) r = -1;
            if (r > 0) {
                fds[r - 1] = pend[i].fd;
                expect--;
            } else if (r < 0) {
                close(pend[i].fd);
            }
            if (r) pend[i] = pend[--np];
        }
        if (pf[0].revents & POLLIN) {
            int fd;
            while ((fd = mg__sock_accept(l->fd)) >= 0) {
                if (np == MAX_PENDING || (loopback_only && !mg__sock_peer_is_loopback(fd)) ||
                    mg__auth_srv_begin(&pend[np].auth, fd)) {
                    close(fd);
                    continue;
                }
                pend[np].fd = fd;
                pend[np].state = 0;
                pend[np].got = 0;
                pend[np].deadline = now + AUTH_SECONDS;
                np++;
            }
        }
        if (expect > 0 && mg_now() >= deadline) {
            char missing[256] = "";
            size_t m = 0;
            for (int p = rank + 1; p < size && m + 12 < sizeof missing; p++)
                if (need[p] && fds[p] < 0)
                    m = mg__catf(missing, sizeof missing, m, " %d",
                                 mg__world_rank(nm, p));
            for (int i = 0; i < np; i++) close(pend[i].fd);
            return mg_error(MG_ETIMEOUT, "timed out waiting for data connections from rank(s)%s: "
                            "are they running, with the same MG_JOB_SECRET, and can they reach "
                            "this host (firewall)?", missing);
        }
    }
    for (int i = 0; i < np; i++) close(pend[i].fd);
    return MG_OK;
}

void mg__tcp_chan(int fd, int peer, double peer_timeout, mg__chan *c)
{
    memset(c, 0, sizeof *c);
    c->kind = MG__CH_TCP;
    c->peer = peer;
    c->fd = fd;
    c->last_rx = c->last_tx = mg__now_coarse();
    if (peer_timeout > 0) mg__sock_keepalive(fd, peer_timeout);
}

static ssize_t chan_failed(mg__chan *c)
{
    char who[128];
    mg_error(MG_EPEER, "the connection to %s failed (%s): it exited, crashed or aborted",
             mg__rank_name(c->names, c->peer, NULL, who, sizeof who), strerror(errno));
    return -1;
}

static const mg__fp beat_frame = {.magic = MG__FRAME_MAGIC, .kind = MG__FRAME_BEAT};

/* Send what is left of a heartbeat: 0 when nothing is, 1 when some still
 * is (the socket is full), -1 on error (errno set). */
static int beat_flush(mg__chan *c)
{
    while (c->beat_left) {
        const uint8_t *p = (const uint8_t *)&beat_frame + sizeof beat_frame - c->beat_left;
        ssize_t k = send(c->fd, p, c->beat_left, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            c->beat_left = (uint8_t)(c->beat_left - k);
            c->last_tx = mg__now_coarse();
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            return -1;
        } else {
            return 1;
        }
    }
    return 0;
}

void mg__tcp_chan_beat(mg__chan *c, double before)
{
    if (c->dead || c->eof || c->fd < 0) return;
    if (!c->beat_left) {
        if (c->tx_mid || c->last_tx > before) return;
        c->beat_left = sizeof beat_frame;
    }
    (void)beat_flush(c);
}

ssize_t mg__tcp_chan_write(mg__chan *c, const void *a, size_t an, const void *b, size_t bn)
{
    int r = beat_flush(c);
    if (r) return r > 0 ? 0 : chan_failed(c);
    struct iovec iov[2];
    int n = 0;
    if (an) iov[n++] = (struct iovec){(void *)a, an};
    if (bn) iov[n++] = (struct iovec){(void *)b, bn};
    if (!n) return 0;
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    for (;;) {
        ssize_t k = sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) c->last_tx = mg__now_coarse();
        if (k >= 0) return k;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return chan_failed(c);
    }
}

ssize_t mg__tcp_chan_read(mg__chan *c, void *buf, size_t n)
{
    for (;;) {
        ssize_t k = recv(c->fd, buf, n, MSG_DONTWAIT);
        if (k > 0) {
            c->last_rx = mg__now_coarse();
            return k;
        }
        if (k == 0) {
            c->eof = true;
            char who[128];
            mg_error(MG_EPEER, "%s closed its connection: it exited, crashed or aborted",
                     mg__rank_name(c->names, c->peer, NULL, who, sizeof who));
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return chan_failed(c);
    }
}
