/* Socket helpers (see sock.h). Sockets are non-blocking; waits use poll
 * with the caller's deadline, so nothing here blocks past it. IPv4 and
 * IPv6 both work; SIGPIPE is avoided with MSG_NOSIGNAL. */
#define _GNU_SOURCE
#include "comm/transport/sock.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include "multigrad/core.h"

int mg__poll_ms(double deadline, int cap_ms)
{
    double left = deadline - mg_now();
    if (left <= 0) return 0;
    double ms = left * 1e3 + 0.999;
    return ms > cap_ms ? cap_ms : (int)ms;
}

static void set_flags(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
}

void mg__sock_nodelay(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void mg__sock_keepalive(int fd, double idle_s)
{
    int on = 1, idle = idle_s < 1 ? 1 : idle_s > 86400 ? 86400 : (int)idle_s;
    int intvl = idle / 5 < 1 ? 1 : idle / 5, cnt = 5;
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

static mg_status resolve(const char *host, int port, int passive, struct addrinfo **res,
                         const char *what)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC};
    if (passive) hints.ai_flags = AI_PASSIVE;
    if (port < 0 || port > 65535)
        return mg_error(MG_EINVAL, "%s: port %d is out of range [0, 65535]", what, port);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host && *host ? host : NULL, ps, &hints, res);
    if (rc)
        return mg_error(MG_EINVAL, "%s: cannot resolve address '%s': %s; check the host name",
                        what, host ? host : "", gai_strerror(rc));
    return MG_OK;
}

mg_status mg__sock_listen(const char *host, int port, int *out_fd, int *bound_port)
{
    struct addrinfo *res;
    MG_TRY(resolve(host, port, 1, &res, "listen"));
    /* Prefer IPv4 for the wildcard: it is what peers most often dial. */
    struct addrinfo *pick = res;
    if (!host || !*host)
        for (struct addrinfo *a = res; a; a = a->ai_next)
            if (a->ai_family == AF_INET) { pick = a; break; }
    int fd = socket(pick->ai_family, pick->ai_socktype | SOCK_CLOEXEC, pick->ai_protocol);
    if (fd < 0) {
        freeaddrinfo(res);
        return mg_error(MG_EIO, "socket(): %s", strerror(errno));
    }
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, pick->ai_addr, pick->ai_addrlen) < 0) {
        int e = errno;
        close(fd);
        freeaddrinfo(res);
        if (e == EADDRINUSE)
            return mg_error(MG_EIO, "cannot listen on %s:%d: the port is already in use "
                            "(another job or service holds it); choose another port "
                            "(mgrun --master-port, or MASTER_PORT)", host && *host ? host : "*",
                            port);
        return mg_error(MG_EIO, "cannot bind %s:%d: %s", host && *host ? host : "*", port,
                        strerror(e));
    }
    freeaddrinfo(res);
    if (listen(fd, 512) < 0) {
        int e = errno;
        close(fd);
        return mg_error(MG_EIO, "listen(): %s", strerror(e));
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound_port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                               : ((struct sockaddr_in6 *)&ss)->sin6_port);
    set_flags(fd);
    *out_fd = fd;
    return MG_OK;
}

int mg__sock_accept(int lfd)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            mg__sock_nodelay(fd);
            return fd;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return -1;
    }
}

/* One non-blocking connect attempt; 0 connected, else errno. */
static int try_connect(const struct addrinfo *a, double deadline, int *out)
{
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) return errno;
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc < 0 && errno != EINPROGRESS && errno != EINTR) {
        int e = errno;
        close(fd);
        return e;
    }
    if (rc < 0) {
        for (;;) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int ms = mg__poll_ms(deadline, 1000);
            int n = poll(&p, 1, ms);
            if (n < 0 && errno == EINTR) continue;
            if (n > 0) break;
            if (mg_now() >= deadline) {
                close(fd);
                return ETIMEDOUT;
            }
        }
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err) {
            close(fd);
            return err;
        }
    }
    mg__sock_nodelay(fd);
    *out = fd;
    return 0;
}

mg_status mg__sock_connect(const char *host, int port, double deadline, const char *what,
                           int *out_fd)
{
    struct addrinfo *res;
    MG_TRY(resolve(host, port, 0, &res, what));
    double wait = 0.01;
    int last = 0;
    for (;;) {
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            last = try_connect(a, deadline, out_fd);
            if (!last) {
                freeaddrinfo(res);
                return MG_OK;
            }
        }
        double left = deadline - mg_now();
        if (left <= 0) break;
        /* Refused or unreachable: the peer may simply not be up yet. */
        double nap = wait < left ? wait : left;
        struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
        nanosleep(&ts, NULL);
        wait = wait * 2 > 0.25 ? 0.25 : wait * 2;
    }
    freeaddrinfo(res);
    return mg_error(MG_ETIMEOUT, "cannot reach %s within the deadline: %s; check "
                    "that it is running and that the address and port are right",
                    what, strerror(last ? last : ETIMEDOUT));
}

mg_status mg__sock_wait(int fd, short events, double deadline, const char *what)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, mg__poll_ms(deadline, 1000));
        if (n > 0) return MG_OK;
        if (n < 0 && errno != EINTR) return mg_error(MG_EIO, "%s: poll: %s", what, strerror(errno));
        if (mg_now() >= deadline)
            return mg_error(MG_ETIMEOUT, "%s: timed out", what);
    }
}

mg_status mg__sock_read_all(int fd, void *buf, size_t n, double deadline, const char *what)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) return mg_error(MG_EPEER, "%s: the connection was closed by the other end", what);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return mg_error(MG_EPEER, "%s: %s", what, strerror(errno));
        MG_TRY(mg__sock_wait(fd, POLLIN, deadline, what));
    }
    return MG_OK;
}

mg_status mg__sock_write_all(int fd, const void *buf, size_t n, double deadline,
                             const char *what)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return mg_error(MG_EPEER, "%s: %s", what, strerror(errno));
        MG_TRY(mg__sock_wait(fd, POLLOUT, deadline, what));
    }
    return MG_OK;
}

static bool sa_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return true;
        if (IN6_IS_ADDR_V4MAPPED(a)) return a->s6_addr[12] == 127;
    }
    return false;
}

bool mg__sock_peer_is_loopback(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0) return false;
    return sa_is_loopback((struct sockaddr *)&ss);
}

/* An address and port in inet_diag's form (IPv4-mapped as IPv4); the
 * family, or 0. */
static int diag_addr(const struct sockaddr_storage *ss, __be16 *port, __be32 addr[4])
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        *port = a->sin_port;
        memcpy(addr, &a->sin_addr, 4);
        return AF_INET;
    }
    if (ss->ss_family != AF_INET6) return 0;
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    *port = a->sin6_port;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
        memcpy(addr, a->sin6_addr.s6_addr + 12, 4);
        return AF_INET;
    }
    memcpy(addr, &a->sin6_addr, 16);
    return AF_INET6;
}

/* One exact-match query to NETLINK_SOCK_DIAG (what ss uses), asking for
 * the socket whose local end is the peer's and remote end is ours. Only
 * an established socket counts: a closed peer's leftover (time-wait)
 * socket reports uid 0. SO_PEERCRED would be simpler, but works on Unix
 * sockets only. */
mg_status mg__sock_peer_uid(int fd, unsigned *uid)
{
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof me, pl = sizeof peer;
    struct {
        struct nlmsghdr nh;
        struct inet_diag_req_v2 r;
    } q = {.nh = {.nlmsg_len = sizeof q, .nlmsg_type = SOCK_DIAG_BY_FAMILY,
                  .nlmsg_flags = NLM_F_REQUEST},
           .r = {.sdiag_protocol = IPPROTO_TCP, .idiag_states = ~0u,
                 .id = {.idiag_cookie = {INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE}}}};
    if (getsockname(fd, (struct sockaddr *)&me, &ml) < 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) < 0)
        return mg_error(MG_EIO, "cannot tell who owns a connection: %s", strerror(errno));
    q.r.sdiag_family = (uint8_t)diag_addr(&peer, &q.r.id.idiag_sport, q.r.id.idiag_src);
    if (!q.r.sdiag_family ||
        diag_addr(&me, &q.r.id.idiag_dport, q.r.id.idiag_dst) != q.r.sdiag_family)
        return mg_error(MG_EIO, "cannot tell who owns a connection: not an IP connection");
    int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0)
        return mg_error(MG_EIO, "cannot tell who owns a connection: netlink sock_diag: %s",
                        strerror(errno));
    struct timeval tv = {1, 0};
    (void)setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    long buf[2048];
    ssize_t n = send(nl, &q, sizeof q, 0);
    if (n == (ssize_t)sizeof q) {
        do n = recv(nl, buf, sizeof buf, 0);
        while (n < 0 && errno == EINTR);
    }
    int e = errno;
    close(nl);
    const struct nlmsghdr *h = (const struct nlmsghdr *)buf;
    if (n < 0 || !NLMSG_OK(h, (size_t)n))
        return mg_error(MG_EIO, "cannot tell who owns a connection: netlink sock_diag: %s",
                        n < 0 ? strerror(e) : "short answer");
    if (h->nlmsg_type == NLMSG_ERROR) {
        const struct nlmsgerr *err = NLMSG_DATA(h);
        return mg_error(MG_EIO, "cannot tell who owns a connection: netlink sock_diag: %s",
                        strerror(-err->error));
    }
    const struct inet_diag_msg *m = NLMSG_DATA(h);
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof *m) ||
        m->idiag_state != 1 /* TCP_ESTABLISHED */)
        return mg_error(MG_EIO, "cannot tell who owns a connection: its other end is gone");
    *uid = m->idiag_uid;
    return MG_OK;
}

bool mg__host_is_loopback(const char *host)
{
    if (!host || !*host) return false;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, NULL, &hints, &res)) return false;
    bool all = true;
    for (struct addrinfo *a = res; a; a = a->ai_next) all = all && sa_is_loopback(a->ai_addr);
    freeaddrinfo(res);
    return all;
}

mg_status mg__sock_local_addr(int fd, char *buf, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
        return mg_error(MG_EIO, "getsockname: %s", strerror(errno));
    int rc = getnameinfo((struct sockaddr *)&ss, sl, buf, (socklen_t)n, NULL, 0, NI_NUMERICHOST);
    if (rc) return mg_error(MG_EIO, "getnameinfo: %s", gai_strerror(rc));
    return MG_OK;
}
