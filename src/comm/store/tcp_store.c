/* The TCP store: a server thread with one poll loop over every client,
 * and a synchronous client.
 *
 * Protocol (little-endian, after mutual authentication, see auth.h):
 *   request  "MGS1" op:u8 flags:u8 pad:u16 klen:u32 vlen:u32 arg:i64, key, value
 *   response "MGS1" status:u8 pad:u8[3] vlen:u32 pad:u32 arg:i64, value
 * op SET(key,value) GET(key; arg = timeout ms) ADD(key; arg = delta)
 * WAIT(value = keys as u16 length + bytes; flags 1 = any; arg = timeout ms)
 * DEL(key). GET and WAIT park the connection until their keys exist or
 * their deadline passes, so one slow client never stalls the others.
 *
 * Every length is checked against the limits in comm.h before anything
 * is allocated; a malformed or oversized request closes that connection
 * and the server goes on. Limits: 1024 connections; one request in flight
 * per connection (clients are synchronous).
 *
 * Strangers need no secret to connect, so connections that have not yet
 * authenticated never keep a rank out: they get a few seconds to
 * authenticate, at most MAX_AUTH_PER_SOURCE of them from one address, and
 * when the table or the file descriptors run out the oldest of them is
 * evicted (told "busy", see auth.h) to make room. With no descriptor to
 * free, a reserve one accepts and closes the newcomer, and failing that
 * the listener rests a moment: the thread never spins on accept. Clients
 * retry a connection closed before authentication, with backoff, until
 * their deadline. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include "comm/store/auth.h"
#include "comm/store/store.h"
#include "comm/transport/sock.h"

enum { OP_SET = 1, OP_GET, OP_ADD, OP_WAIT, OP_DEL };
enum { ST_OK = 0, ST_TIMEOUT = 1, ST_BAD = 2, ST_FULL = 3 };
#define HDR MG__STORE_HDR
#define MAX_CONN 1024
#define MAX_AUTH_PER_SOURCE 128
#define AUTH_SECONDS 10.0
#define ACCEPT_REST 0.1     /* seconds the listener rests when nothing can be accepted */
static const uint8_t MAGIC[4] = {'M', 'G', 'S', '1'};

static void put_hdr(uint8_t *b, uint8_t op_or_status, uint8_t flags, uint32_t klen,
                    uint32_t vlen, int64_t arg)
{
    memcpy(b, MAGIC, 4);
    b[4] = op_or_status;
    b[5] = flags;
    b[6] = b[7] = 0;
    memcpy(b + 8, &klen, 4);
    memcpy(b + 12, &vlen, 4);
    memcpy(b + 16, &arg, 8);
}

/* ======================================================================
 * the protocol, without sockets
 * ====================================================================== */

int mg__store_parse_hdr(const uint8_t h[HDR], mg__store_req *r)
{
    if (memcmp(h, MAGIC, 4)) return -1;
    r->op = h[4];
    r->flags = h[5];
    memcpy(&r->klen, h + 8, 4);
    memcpy(&r->vlen, h + 12, 4);
    memcpy(&r->arg, h + 16, 8);
    if (r->op < OP_SET || r->op > OP_DEL || r->flags > 1) return -1;
    if (r->op == OP_WAIT) {
        if (r->klen != 0 || r->vlen < 3 ||
            r->vlen > MG__STORE_MAX_KEYS_WAIT * (2u + MG_STORE_MAX_KEY)) return -1;
    } else {
        if (r->klen == 0 || r->klen > MG_STORE_MAX_KEY) return -1;
        if (r->op == OP_SET ? r->vlen > MG_STORE_MAX_VALUE : r->vlen != 0) return -1;
    }
    return 0;
}

/* The keys of a WAIT body; -1 if malformed. */
static int wait_keys(const mg__store_req *r, const uint8_t *body, const char **k, size_t *kl)
{
    const uint8_t *p = body + r->klen, *end = p + r->vlen;
    int n = 0;
    while (p < end) {
        if (end - p < 2 || n == MG__STORE_MAX_KEYS_WAIT) return -1;
        uint16_t l;
        memcpy(&l, p, 2);
        p += 2;
        if (l == 0 || l > MG_STORE_MAX_KEY || end - p < l) return -1;
        k[n] = (const char *)p;
        kl[n++] = l;
        p += l;
    }
    return n ? n : -1;
}

int mg__store_apply(mg__kv *kv, const mg__store_req *r, const uint8_t *body, bool expired,
                    mg__store_reply *out)
{
    const char *key = (const char *)body;
    *out = (mg__store_reply){.status = ST_OK};
    switch (r->op) {
    case OP_SET:
        if (mg__kv_set(kv, key, r->klen, body + r->klen, r->vlen)) out->status = ST_FULL;
        return 1;
    case OP_ADD:
        if (mg__kv_add(kv, key, r->klen, r->arg, &out->arg)) out->status = ST_BAD;
        return 1;
    case OP_DEL:
        out->arg = mg__kv_del(kv, key, r->klen);
        return 1;
    case OP_GET: {
        mg__kv_entry *e = mg__kv_find(kv, key, r->klen);
        if (e) {
            out->val = e->val;
            out->vlen = e->vlen;
            return 1;
        }
        break;
    }
    case OP_WAIT: {
        const char *k[MG__STORE_MAX_KEYS_WAIT];
        size_t kl[MG__STORE_MAX_KEYS_WAIT];
        int n = wait_keys(r, body, k, kl), have = 0, first = -1;
        if (n < 0) return -1;
        for (int i = 0; i < n; i++)
            if (mg__kv_find(kv, k[i], kl[i])) {
                have++;
                if (first < 0) first = i;
            }
        bool any = r->flags & 1;
        if (any ? have > 0 : have == n) {
            out->arg = any ? first : 0;
            return 1;
        }
        break;
    }
    default:
        return -1;
    }
    if (!expired) return 0;
    out->status = ST_TIMEOUT;
    return 1;
}

/* ======================================================================
 * server
 * ====================================================================== */

enum { C_AUTH, C_HDR, C_BODY, C_PARKED, C_WRITE };

typedef struct {
    int fd, state;
    uint64_t seq;             /* accept order: the oldest stranger is evicted first */
    uint8_t from[17];         /* source address: family byte, then the address */
    mg__auth_srv auth;
    double deadline;          /* auth, or a parked request's */
    uint8_t hdr[HDR];
    size_t got;
    mg__store_req rq;
    uint8_t *body;            /* key then value */
    size_t body_len;
    uint8_t *out;
    size_t out_len, out_done;
} conn;

struct mg_store_server {
    int lfd, port, wake[2];
    int reserve;              /* a spare descriptor for when the process runs out */
    double listen_after;      /* the listener rests until then */
    uint64_t seq;
    pthread_t thread;
    char secret[512];
    bool loopback_only;
    mg__kv kv;
    conn **c;
    int nc;
};

static void conn_close(mg_store_server *s, int i)
{
    conn *c = s->c[i];
    close(c->fd);
    free(c->body);
    free(c->out);
    free(c);
    s->c[i] = s->c[--s->nc];
}

static void respond(conn *c, const mg__store_reply *r)
{
    free(c->out);
    c->out = malloc(HDR + r->vlen);
    if (!c->out) {
        c->out_len = 0;
        c->state = C_WRITE;
        return;
    }
    put_hdr(c->out, r->status, 0, 0, (uint32_t)r->vlen, r->arg);
    if (r->vlen) memcpy(c->out + HDR, r->val, r->vlen);
    c->out_len = HDR + r->vlen;
    c->out_done = 0;
    c->state = C_WRITE;
}

/* Answer the request if it can be answered; -1 closes the connection. */
static int answer(mg_store_server *s, conn *c, bool expired)
{
    mg__store_reply r;
    int k = mg__store_apply(&s->kv, &c->rq, c->body, expired, &r);
    if (k > 0) respond(c, &r);
    return k < 0 ? -1 : 0;
}

static void wake_parked(mg_store_server *s)
{
    for (int i = 0; i < s->nc; i++)
        if (s->c[i]->state == C_PARKED) (void)answer(s, s->c[i], false);
}

/* Handle a complete request; -1 closes the connection. */
static int handle(mg_store_server *s, conn *c)
{
    if (c->rq.op == OP_GET || c->rq.op == OP_WAIT) {
        int64_t ms = c->rq.arg < 0 ? 0 : c->rq.arg > 86400000LL ? 86400000LL : c->rq.arg;
        c->deadline = mg_now() + (double)ms * 1e-3;
        c->state = C_PARKED;
        return answer(s, c, false);
    }
    if (answer(s, c, false)) return -1;
    if (c->rq.op != OP_DEL) wake_parked(s);
    return 0;
}

/* Make progress on one connection; -1 closes it. A loop, not recursion:
 * a client may pipeline many requests. */
static int conn_io(mg_store_server *s, conn *c, short revents)
{
    if (revents & (POLLERR | POLLNVAL)) return -1;
    if (c->state == C_AUTH) {
        int r = mg__auth_srv_step(&c->auth, c->fd, s->secret, "store");
        if (r < 0) return -1;
        if (r > 0) c->state = C_HDR;
        return 0;
    }
    for (;;) {
        if (c->state == C_PARKED) return (revents & POLLHUP) ? -1 : 0;
        if (c->state == C_WRITE) {
            while (c->out_done < c->out_len) {
                ssize_t k = send(c->fd, c->out + c->out_done, c->out_len - c->out_done,
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
                if (k > 0) c->out_done += (size_t)k;
                else if (k < 0 && errno == EINTR) continue;
                else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
                else return -1;
            }
            if (!c->out_len) return -1;
            free(c->out);
            free(c->body);
            c->out = c->body = NULL;
            c->got = 0;
            c->state = C_HDR;
        }
        uint8_t *dst;
        size_t want;
        if (c->state == C_HDR) {
            dst = c->hdr + c->got;
            want = HDR - c->got;
        } else {
            dst = c->body + c->got;
            want = c->body_len - c->got;
        }
        if (want) {
            ssize_t k = recv(c->fd, dst, want, MSG_DONTWAIT);
            if (k == 0) return -1;
            if (k < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
                return -1;
            }
            c->got += (size_t)k;
        }
        if (c->state == C_HDR && c->got == HDR) {
            if (mg__store_parse_hdr(c->hdr, &c->rq)) return -1;
            c->body_len = (size_t)c->rq.klen + c->rq.vlen;
            c->body = malloc(c->body_len);
            if (!c->body) return -1;
            c->got = 0;
            c->state = C_BODY;
        } else if (c->state == C_BODY && c->got == c->body_len) {
            if (handle(s, c)) return -1;
        }
    }
}

/* The source address of a connection, as a key for per-source limits
 * (IPv4-mapped IPv6 addresses count as IPv4). */
static void source_of(int fd, uint8_t from[17])
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    memset(from, 0, 17);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0) return;
    if (ss.ss_family == AF_INET) {
        from[0] = 4;
        memcpy(from + 1, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    } else if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        from[0] = IN6_IS_ADDR_V4MAPPED(a) ? 4 : 6;
        if (from[0] == 4) memcpy(from + 1, a->s6_addr + 12, 4);
        else memcpy(from + 1, a->s6_addr, 16);
    }
}

/* Close the oldest connection still authenticating (from that source
 * when `from` is given) to make room; 1 if one was closed. It first gets
 * a last look at what it sent, so a client whose answer is already here
 * is served, not evicted. */
static int evict(mg_store_server *s, const uint8_t *from)
{
    for (;;) {
        int v = -1;
        for (int i = 0; i < s->nc; i++) {
            const conn *c = s->c[i];
            if (c->state == C_AUTH && (!from || !memcmp(c->from, from, sizeof c->from)) &&
                (v < 0 || c->seq < s->c[v]->seq))
                v = i;
        }
        if (v < 0) return 0;
        conn *c = s->c[v];
        int r = mg__auth_srv_step(&c->auth, c->fd, s->secret, "store");
        if (r > 0) {
            c->state = C_HDR;
            continue;
        }
        if (r == 0) mg__auth_srv_busy(c->fd);
        conn_close(s, v);
        return 1;
    }
}

/* Take a new connection. Room is made by evicting a stranger when its
 * source has too many, the table is full, or (short_fd) the process is out
 * of descriptors; failing that the newcomer is turned away. */
static void admit(mg_store_server *s, int fd, bool short_fd)
{
    if (s->loopback_only && !mg__sock_peer_is_loopback(fd)) {
        close(fd);
        return;
    }
    uint8_t from[17];
    source_of(fd, from);
    int same = 0;
    for (int i = 0; i < s->nc; i++)
        same += s->c[i]->state == C_AUTH && !memcmp(s->c[i]->from, from, sizeof from);
    bool room = (same >= MAX_AUTH_PER_SOURCE && evict(s, from)) ||
                (s->nc < MAX_CONN && !short_fd) || evict(s, NULL);
    conn *c = room ? calloc(1, sizeof *c) : NULL;
    if (!c || mg__auth_srv_begin(&c->auth, fd)) {
        free(c);
        close(fd);
        return;
    }
    c->fd = fd;
    c->state = C_AUTH;
    c->seq = s->seq++;
    memcpy(c->from, from, sizeof from);
    c->deadline = mg_now() + AUTH_SECONDS;
    s->c[s->nc++] = c;
}

/* Accept every pending connection. Out of descriptors (accept fails so
 * even with none pending), the reserve one takes the newcomer and a
 * stranger is evicted to give the reserve its place back; without a
 * reserve the listener rests a moment instead of spinning. */
static void accept_all(mg_store_server *s)
{
    for (;;) {
        int fd = mg__sock_accept(s->lfd);
        if (fd >= 0) {
            admit(s, fd, false);
            continue;
        }
        if (errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM) return;
        if (s->reserve >= 0) {
            close(s->reserve);
            fd = mg__sock_accept(s->lfd);
            if (fd >= 0) admit(s, fd, true);
            s->reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (fd >= 0 && s->reserve >= 0) continue;
            if (fd < 0 && s->reserve >= 0) return; /* nothing was pending */
        }
        s->reserve = s->reserve >= 0 ? s->reserve : open("/dev/null", O_RDONLY | O_CLOEXEC);
        s->listen_after = mg_now() + ACCEPT_REST;
        return;
    }
}

static void *server_main(void *arg)
{
    mg_store_server *s = arg;
    struct pollfd *pf = malloc((MAX_CONN + 2) * sizeof *pf);
    if (!pf) return NULL;
    for (;;) {
        double now = mg_now(), next = now + 1.0;
        bool listening = now >= s->listen_after;
        if (!listening) next = s->listen_after;
        pf[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pf[1] = (struct pollfd){.fd = s->lfd, .events = listening ? POLLIN : 0};
        for (int i = 0; i < s->nc; i++) {
            conn *c = s->c[i];
            pf[i + 2] = (struct pollfd){.fd = c->fd,
                                        .events = c->state == C_WRITE ? POLLOUT :
                                                  c->state == C_PARKED ? 0 : POLLIN};
            if ((c->state == C_AUTH || c->state == C_PARKED) && c->deadline < next)
                next = c->deadline;
        }
        int nfds = s->nc + 2;
        int n = poll(pf, (nfds_t)nfds, mg__poll_ms(next, 1000));
        if (n < 0 && errno != EINTR) break;
        if (pf[0].revents) break;
        now = mg_now();
        /* Walk backwards: conn_close moves the last connection into slot i. */
        for (int i = nfds - 3; i >= 0; i--) {
            conn *c = s->c[i];
            int r = 0;
            if (pf[i + 2].revents) r = conn_io(s, c, pf[i + 2].revents);
            if (!r && c->state == C_AUTH && now > c->deadline) r = -1;
            if (!r && c->state == C_PARKED && now >= c->deadline) {
                r = answer(s, c, true);
                if (!r) r = conn_io(s, c, 0);
            }
            if (r) conn_close(s, i);
        }
        if (pf[1].revents & POLLIN) accept_all(s);
    }
    free(pf);
    return NULL;
}

mg_status mg_store_server_start(const char *host, int port, const char *secret,
                                mg_store_server **out)
{
    *out = NULL;
    mg_store_server *s = calloc(1, sizeof *s);
    if (!s) return mg_error(MG_ENOMEM, "store server: out of memory");
    const char *sec = mg__secret(secret);
    if (strlen(sec) >= sizeof s->secret) {
        free(s);
        return mg_error(MG_EINVAL, "MG_JOB_SECRET is longer than %zu bytes", sizeof s->secret - 1);
    }
    strcpy(s->secret, sec);
    s->loopback_only = !*sec;
    s->reserve = -1;
    s->c = calloc(MAX_CONN, sizeof *s->c);
    mg__kv_init(&s->kv);
    mg_status st = s->c ? MG_OK : mg_error(MG_ENOMEM, "store server: out of memory");
    if (!st) st = mg__sock_listen(host, port, &s->lfd, &s->port);
    if (st) {
        free(s->c);
        free(s);
        return st;
    }
    s->reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) || pthread_create(&s->thread, NULL, server_main, s)) {
        close(s->lfd);
        if (s->reserve >= 0) close(s->reserve);
        free(s->c);
        free(s);
        return mg_error(MG_EIO, "store server: cannot start its thread");
    }
    mg_debug("store: serving on %s:%d%s", host && *host ? host : "*", s->port,
             s->loopback_only ? " (no secret: clients of this user on this host only)" : "");
    *out = s;
    return MG_OK;
}

int mg_store_server_port(const mg_store_server *s) { return s->port; }

void mg_store_server_stop(mg_store_server *s)
{
    if (!s) return;
    char b = 1;
    if (write(s->wake[1], &b, 1) < 0) { /* the pipe is never full: one byte */ }
    pthread_join(s->thread, NULL);
    /* Replies already decided still go out (best effort, no waiting). */
    for (int i = 0; i < s->nc; i++) {
        conn *c = s->c[i];
        if (c->state == C_WRITE && c->out_done < c->out_len)
            (void)!send(c->fd, c->out + c->out_done, c->out_len - c->out_done,
                        MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    while (s->nc) conn_close(s, s->nc - 1);
    close(s->lfd);
    if (s->reserve >= 0) close(s->reserve);
    close(s->wake[0]);
    close(s->wake[1]);
    mg__kv_free(&s->kv);
    free(s->c);
    free(s);
}

/* ======================================================================
 * client
 * ====================================================================== */

typedef struct {
    int fd;
    bool broken;
    char what[300];
    double timeout;
} client;

static mg_status request(client *c, uint8_t op, uint8_t flags, const char *key,
                         const void *val, size_t vlen, int64_t arg, double reply_within,
                         uint8_t *status, void **rval, size_t *rlen, int64_t *rarg)
{
    if (c->broken)
        return mg_error(MG_EPEER, "%s: the connection failed earlier; the store is unusable", c->what);
    size_t kl = key ? strlen(key) : 0;
    if ((key && (kl == 0 || kl > MG_STORE_MAX_KEY)) || vlen > MG_STORE_MAX_VALUE)
        return mg_error(MG_EINVAL, "store: key length %zu or value length %zu out of bounds "
                        "(key 1..%d, value <= %zu bytes)", kl, vlen, MG_STORE_MAX_KEY,
                        MG_STORE_MAX_VALUE);
    uint8_t h[HDR];
    put_hdr(h, op, flags, (uint32_t)kl, (uint32_t)vlen, arg);
    double deadline = mg_now() + reply_within;
    mg_status s = mg__sock_write_all(c->fd, h, HDR, deadline, c->what);
    if (!s && kl) s = mg__sock_write_all(c->fd, key, kl, deadline, c->what);
    if (!s && vlen) s = mg__sock_write_all(c->fd, val, vlen, deadline, c->what);
    if (!s) s = mg__sock_read_all(c->fd, h, HDR, deadline, c->what);
    uint32_t rl = 0;
    if (!s) {
        memcpy(&rl, h + 12, 4);
        memcpy(rarg, h + 16, 8);
        *status = h[4];
        if (memcmp(h, MAGIC, 4) || rl > MG_STORE_MAX_VALUE || *status > ST_FULL)
            s = mg_error(MG_EFORMAT, "%s sent a malformed reply", c->what);
    }
    void *v = NULL;
    if (!s) {
        v = malloc((size_t)rl + 1);
        if (!v) s = mg_error(MG_ENOMEM, "store: out of memory");
        else s = mg__sock_read_all(c->fd, v, rl, deadline, c->what);
    }
    if (s) {
        free(v);
        c->broken = true;
        return s;
    }
    ((char *)v)[rl] = 0;
    if (rval) {
        *rval = v;
        *rlen = rl;
    } else {
        free(v);
    }
    return MG_OK;
}

static double ms_of(double t) { return t < 0 ? 0 : t * 1e3; }

static mg_status c_set(void *impl, const char *key, const void *val, size_t n, double within)
{
    client *c = impl;
    uint8_t st = ST_BAD;
    int64_t a = 0;
    MG_TRY(request(c, OP_SET, 0, key, val, n, 0, within, &st, NULL, NULL, &a));
    if (st == ST_FULL) return mg_error(MG_ENOMEM, "%s is full: cannot set '%s'", c->what, key);
    return MG_OK;
}

static mg_status c_get(void *impl, const char *key, double timeout, double within, void **val,
                       size_t *n)
{
    client *c = impl;
    uint8_t st = ST_BAD;
    int64_t a = 0;
    MG_TRY(request(c, OP_GET, 0, key, NULL, 0, (int64_t)ms_of(timeout), timeout + within,
                   &st, val, n, &a));
    if (st == ST_OK) return MG_OK;
    free(*val);
    *val = NULL;
    return mg_error(MG_ETIMEOUT, "%s: key '%s' did not appear within %.1f s", c->what, key, timeout);
}

static mg_status c_add(void *impl, const char *key, int64_t delta, int64_t *out)
{
    client *c = impl;
    uint8_t st = ST_BAD;
    MG_TRY(request(c, OP_ADD, 0, key, NULL, 0, delta, c->timeout, &st, NULL, NULL, out));
    if (st != ST_OK)
        return mg_error(MG_EFORMAT, "%s: cannot add to '%s': its value is not an integer",
                        c->what, key);
    return MG_OK;
}

static mg_status c_wait(void *impl, const char *const *keys, int n, int any, double timeout,
                        int *index)
{
    client *c = impl;
    if (n <= 0 || n > MG__STORE_MAX_KEYS_WAIT)
        return mg_error(MG_EINVAL, "store wait: %d keys (1..%d allowed)", n, MG__STORE_MAX_KEYS_WAIT);
    uint8_t buf[MG__STORE_MAX_KEYS_WAIT * (2 + MG_STORE_MAX_KEY)];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(keys[i]);
        if (l == 0 || l > MG_STORE_MAX_KEY)
            return mg_error(MG_EINVAL, "store wait: key length %zu out of bounds", l);
        uint16_t l16 = (uint16_t)l;
        memcpy(buf + len, &l16, 2);
        memcpy(buf + len + 2, keys[i], l);
        len += 2 + l;
    }
    uint8_t st = ST_BAD;
    int64_t a = 0;
    MG_TRY(request(c, OP_WAIT, any ? 1 : 0, NULL, buf, len, (int64_t)ms_of(timeout),
                   timeout + c->timeout, &st, NULL, NULL, &a));
    if (st != ST_OK)
        return mg_error(MG_ETIMEOUT, "%s: waited %.1f s for key '%s'%s", c->what, timeout,
                        keys[0], n > 1 ? " and others" : "");
    if (index) *index = (int)a;
    return MG_OK;
}

static mg_status c_del(void *impl, const char *key, int *existed)
{
    client *c = impl;
    uint8_t st = ST_BAD;
    int64_t a = 0;
    MG_TRY(request(c, OP_DEL, 0, key, NULL, 0, 0, c->timeout, &st, NULL, NULL, &a));
    if (existed) *existed = (int)a;
    return MG_OK;
}

static void c_close(void *impl)
{
    client *c = impl;
    close(c->fd);
    free(c);
}

static mg_status c_local_addr(void *impl, char *buf, size_t n)
{
    return mg__sock_local_addr(((client *)impl)->fd, buf, n);
}

static const mg__store_vt tcp_vt = {c_set, c_get, c_add, c_wait, c_del, c_close, c_local_addr};

/* Sleep about `nap` seconds (jittered so that ranks turned away together
 * do not come back together), never past deadline. */
static void back_off(double nap, double deadline)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    nap *= 0.5 + (double)(ts.tv_nsec % 1000) / 1000.0;
    double left = deadline - mg_now();
    if (nap > left) nap = left;
    if (nap <= 0) return;
    ts.tv_sec = (time_t)nap;
    ts.tv_nsec = (long)((nap - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

mg_status mg__tcp_store_open(const char *host, int port, const char *secret, double timeout,
                             mg_store *s)
{
    const char *sec = mg__secret(secret);
    if (!*sec && !mg__host_is_loopback(host))
        return mg_error(MG_EAUTH, "the store at %s:%d is not on a loopback address and no "
                        "MG_JOB_SECRET is set: set the same MG_JOB_SECRET on every rank (a "
                        "launcher such as mgrun does this)", host, port);
    client *c = calloc(1, sizeof *c);
    if (!c) return mg_error(MG_ENOMEM, "store: out of memory");
    snprintf(c->what, sizeof c->what, "the store at %s:%d", host, port);
    c->timeout = timeout;
    double t0 = mg_now(), deadline = t0 + timeout, nap = 0.01;
    mg_status st;
    /* A connection closed before authentication is a store that is busy
     * (flooded, out of descriptors), not a refusal: try again. */
    for (int busy = 0;;) {
        st = mg__sock_connect(host, port, deadline, c->what, &c->fd);
        if (!st) {
            st = mg__auth_client(c->fd, sec, "store", deadline, c->what);
            if (st) close(c->fd);
        }
        if (st == MG_EPEER) busy++;
        else if (st != MG_ETIMEOUT || !busy) break;
        back_off(nap, deadline);
        nap = nap * 2 > 1.0 ? 1.0 : nap * 2;
        if (mg_now() >= deadline) {
            st = mg_error(MG_ETIMEOUT, "%s turned this rank away %d times in %.1f s before it "
                          "could authenticate: the store is flooded with connections or out of "
                          "file descriptors; look for other processes connecting to port %d "
                          "(ss -tnp) or raise the store's open-file limit (ulimit -n)",
                          c->what, busy, mg_now() - t0, port);
            break;
        }
    }
    if (st) {
        free(c);
        return st;
    }
    s->vt = &tcp_vt;
    s->impl = c;
    return MG_OK;
}
