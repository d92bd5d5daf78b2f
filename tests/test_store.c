/* Tests of the rendezvous store: operations and deadlines on the TCP and
 * file stores, authentication (no secret, wrong secret, garbage, a valid
 * secret with oversized lengths), loopback-only serving without a secret,
 * and a bounded fuzz of the protocol after which the server still serves. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ifaddrs.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include "harness.h"
#include "multigrad/comm.h"
#include "comm/store/auth.h"
#include "comm/transport/sock.h"

static mg_store_server *serve(const char *secret)
{
    mg_store_server *srv;
    CHECK_OK(mg_store_server_start("127.0.0.1", 0, secret, &srv));
    return srv;
}

static mg_store *connect_to(mg_store_server *srv, const char *secret, double timeout)
{
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", mg_store_server_port(srv));
    mg_store *s;
    CHECK_OK(mg_store_connect(url, secret, timeout, &s));
    return s;
}

static void exercise(mg_store *s)
{
    void *v;
    size_t n;
    CHECK_OK(mg_store_set(s, "alpha", "hello", 5));
    CHECK_OK(mg_store_get(s, "alpha", &v, &n));
    CHECK(n == 5 && !memcmp(v, "hello", 6));
    free(v);
    CHECK_OK(mg_store_set(s, "alpha", "", 0));
    CHECK_OK(mg_store_get(s, "alpha", &v, &n));
    CHECK_EQ(n, 0);
    free(v);
    int64_t r;
    CHECK_OK(mg_store_add(s, "ctr", 5, &r));
    CHECK_EQ(r, 5);
    CHECK_OK(mg_store_add(s, "ctr", -7, &r));
    CHECK_EQ(r, -2);
    CHECK_ERR(mg_store_add(s, "alpha", 1, &r), MG_EFORMAT);
    const char *keys[2] = {"alpha", "ctr"};
    CHECK_OK(mg_store_wait(s, keys, 2, 1.0));
    int existed;
    CHECK_OK(mg_store_delete(s, "alpha", &existed));
    CHECK_EQ(existed, 1);
    CHECK_OK(mg_store_delete(s, "alpha", &existed));
    CHECK_EQ(existed, 0);
    /* Deadlines: a missing key times out on time. */
    double t0 = mg_now();
    CHECK_ERR(mg_store_wait(s, keys, 2, 0.3), MG_ETIMEOUT);
    double dt = mg_now() - t0;
    CHECK(dt >= 0.25 && dt < 2.0);
    t0 = mg_now();
    CHECK_ERR(mg_store_get(s, "never", &v, &n), MG_ETIMEOUT);
    CHECK(mg_now() - t0 < 3.0);
    /* Bounds are checked on the client too. */
    char big[MG_STORE_MAX_KEY + 2];
    memset(big, 'k', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK_ERR(mg_store_set(s, big, "x", 1), MG_EINVAL);
    CHECK_ERR(mg_store_set(s, "", "x", 1), MG_EINVAL);
}

TEST(store_tcp_operations_and_deadlines)
{
    mg_store_server *srv = serve("s3cret");
    mg_store *s = connect_to(srv, "s3cret", 0.5);
    exercise(s);
    /* The store still works after a timed-out wait. */
    CHECK_OK(mg_store_set(s, "after", "1", 1));
    mg_store_destroy(s);
    mg_store_server_stop(srv);
}

/* Rank 2 serves (forking a process that runs threads is unsafe, so the
 * server lives in a rank of its own); rank 0 blocks in get until rank 1
 * sets the key. */
static int get_waits_for_set(int rank, int n, void *arg)
{
    int port = *(int *)arg;
    mg_store_server *srv = NULL;
    if (rank == 2 && mg_store_server_start("127.0.0.1", port, "k", &srv)) return 11;
    mg_store *s;
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    if (mg_store_connect(url, "k", 5, &s)) return 10;
    int rc = 0;
    if (rank == 0) {
        void *v;
        size_t len;
        if (mg_store_get(s, "late", &v, &len) || len != 4 || memcmp(v, "done", 4)) rc = 1;
        else free(v);
        int64_t r;
        if (mg_store_add(s, "arrived", 1, &r)) rc = 2;
        if (mg_store_set(s, "done0", "", 0)) rc = 5;
    } else if (rank == 1) {
        usleep(200000);
        if (mg_store_set(s, "late", "done", 4)) rc = 3;
        const char *k[1] = {"arrived"};
        if (mg_store_wait(s, k, 1, 5)) rc = 4;
        if (mg_store_set(s, "done1", "", 0)) rc = 5;
    } else {
        const char *k[2] = {"done0", "done1"};
        if (mg_store_wait(s, k, 2, 5)) rc = 6;
    }
    if (rc) printf("rank %d: rc %d: %s\n", rank, rc, mg_last_error());
    mg_store_destroy(s);
    mg_store_server_stop(srv);
    return rc;
}

TEST(store_tcp_get_blocks_until_set)
{
    int port = mgt_free_port();
    CHECK_EQ(mgt_fork_ranks(3, get_waits_for_set, &port, 20, NULL), 0);
}

/* A raw connection to the server, authenticated with `secret` or not. */
static int raw_conn(int port, const char *secret)
{
    int fd;
    CHECK_OK(mg__sock_connect("127.0.0.1", port, mg_now() + 5, "store", &fd));
    if (secret) CHECK_OK(mg__auth_client(fd, secret, "store", mg_now() + 5, "store"));
    return fd;
}

/* The server closed fd (EOF within a deadline) instead of serving it. */
static int closed_by_server(int fd, double secs)
{
    char buf[256];
    double deadline = mg_now() + secs;
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno == ECONNRESET)) return 1;
        if (mg_now() > deadline) return 0;
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, 50);
    }
}

TEST(store_auth_refuses_strangers)
{
    mg_store_server *srv = serve("right");
    int port = mg_store_server_port(srv);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    mg_store *s;
    /* Wrong secret, and no secret at all. */
    CHECK_ERR(mg_store_connect(url, "wrong", 2, &s), MG_EAUTH);
    CHECK_MSG(strstr(mg_last_error(), "MG_JOB_SECRET"), "message: %s", mg_last_error());
    CHECK_ERR(mg_store_connect(url, "", 2, &s), MG_EAUTH);
    /* Garbage instead of an answer to the challenge. */
    int fd = raw_conn(port, NULL);
    char junk[200];
    memset(junk, 0xA5, sizeof junk);
    CHECK(send(fd, junk, sizeof junk, MSG_NOSIGNAL) > 0);
    CHECK(closed_by_server(fd, 5));
    close(fd);
    /* Valid secret, then a header claiming a 4 GiB value, and one claiming a
     * huge key: refused without allocating. */
    uint8_t h[24] = {'M', 'G', 'S', '1', 1, 0, 0, 0};
    uint32_t kl = 3, vl = 0xFFFFFFFFu;
    memcpy(h + 8, &kl, 4);
    memcpy(h + 12, &vl, 4);
    fd = raw_conn(port, "right");
    CHECK(send(fd, h, sizeof h, MSG_NOSIGNAL) == sizeof h);
    CHECK(closed_by_server(fd, 5));
    close(fd);
    kl = 0x7FFFFFFF;
    vl = 0;
    memcpy(h + 8, &kl, 4);
    memcpy(h + 12, &vl, 4);
    fd = raw_conn(port, "right");
    CHECK(send(fd, h, sizeof h, MSG_NOSIGNAL) == sizeof h);
    CHECK(closed_by_server(fd, 5));
    close(fd);
    /* A silent stranger holding a connection open does not block others. */
    int idle = raw_conn(port, NULL);
    /* The job goes on unaffected. */
    s = connect_to(srv, "right", 2);
    exercise(s);
    mg_store_destroy(s);
    close(idle);
    mg_store_server_stop(srv);
    /* Something else at the address that never speaks (a wrong port), or a
     * store too slow for the deadline: the client cannot tell them apart
     * and names both, with MG_TIMEOUT. */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0 &&
          getsockname(lfd, (struct sockaddr *)&a, &al) == 0);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
    CHECK_ERR(mg_store_connect(url, "right", 0.3, &s), MG_ETIMEOUT);
    const char *e = mg_last_error();
    CHECK_MSG(strstr(e, "no authentication challenge within the deadline") &&
              strstr(e, "wrong port?") && strstr(e, "did not answer in time (a longer MG_TIMEOUT)"),
              "message: %s", e);
    close(lfd);
}

/* A non-loopback IPv4 address of this machine, or 0. */
static int external_ip(char *buf, size_t n)
{
    struct ifaddrs *ifa, *i;
    int found = 0;
    if (getifaddrs(&ifa)) return 0;
    for (i = ifa; i && !found; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)i->ifa_addr;
            if ((ntohl(a->sin_addr.s_addr) >> 24) != 127) {
                inet_ntop(AF_INET, &a->sin_addr, buf, (socklen_t)n);
                found = 1;
            }
        }
    freeifaddrs(ifa);
    return found;
}

TEST(store_without_secret_is_loopback_only)
{
    mg_store_server *srv;
    CHECK_OK(mg_store_server_start(NULL, 0, "", &srv));
    int port = mg_store_server_port(srv);
    char url[128];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    mg_store *s;
    CHECK_OK(mg_store_connect(url, "", 2, &s));
    exercise(s);
    mg_store_destroy(s);
    char ip[64];
    if (!external_ip(ip, sizeof ip)) {
        mg_store_server_stop(srv);
        mgt_skip("no non-loopback IPv4 address to test refusal with");
    }
    /* The client refuses to talk to a non-loopback store without a secret... */
    snprintf(url, sizeof url, "tcp://%s:%d", ip, port);
    CHECK_ERR(mg_store_connect(url, "", 2, &s), MG_EAUTH);
    /* ...and the server closes a non-loopback connection at once. */
    int fd;
    CHECK_OK(mg__sock_connect(ip, port, mg_now() + 2, "store", &fd));
    CHECK(closed_by_server(fd, 3));
    close(fd);
    mg_store_server_stop(srv);
}

TEST_T(store_protocol_fuzz, 60)
{
    mg_store_server *srv = serve("fz");
    int port = mg_store_server_port(srv);
    mg_rng r;
    mg_rng_init(&r, 1234);
    mg_store *good = connect_to(srv, "fz", 2);
    uint8_t buf[4096];
    for (int it = 0; it < 3000; it++) {
        int fd = raw_conn(port, (it % 4) ? "fz" : NULL);
        int frames = 1 + (int)mg_rng_below(&r, 4);
        for (int f = 0; f < frames; f++) {
            size_t n = 1 + mg_rng_below(&r, 64);
            for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)mg_rng_u32(&r);
            /* Mostly plausible headers with random fields and bodies. */
            if (mg_rng_below(&r, 3)) {
                memcpy(buf, "MGS1", 4);
                buf[4] = (uint8_t)mg_rng_below(&r, 7);
                buf[5] = (uint8_t)mg_rng_below(&r, 3);
                uint32_t kl = mg_rng_below(&r, 3) ? mg_rng_below(&r, 40) : mg_rng_u32(&r);
                uint32_t vl = mg_rng_below(&r, 3) ? mg_rng_below(&r, 40) : mg_rng_u32(&r);
                int64_t arg = (int64_t)mg_rng_below(&r, 20) - 5;
                memcpy(buf + 8, &kl, 4);
                memcpy(buf + 12, &vl, 4);
                memcpy(buf + 16, &arg, 8);
                if (n < 24) n = 24 + mg_rng_below(&r, 40);
            }
            if (send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) break;
        }
        close(fd);
        if (it % 500 == 0) {
            CHECK_OK(mg_store_set(good, "probe", "ok", 2));
            void *v;
            size_t len;
            CHECK_OK(mg_store_get(good, "probe", &v, &len));
            CHECK(len == 2);
            free(v);
        }
    }
    exercise(good);
    mg_store_destroy(good);
    mg_store_server_stop(srv);
}

static int file_ranks(int rank, int n, void *arg)
{
    mg_store *s;
    if (mg_store_connect(arg, NULL, 5, &s)) return 10;
    int rc = 0;
    char key[32];
    snprintf(key, sizeof key, "r%d", rank);
    if (mg_store_set(s, key, &rank, sizeof rank)) rc = 1;
    int64_t v;
    if (mg_store_add(s, "count", 1, &v)) rc = 2;
    const char *keys[3] = {"r0", "r1", "r2"};
    if (mg_store_wait(s, keys, n, 5)) rc = 3;
    for (int i = 0; i < n && !rc; i++) {
        void *val;
        size_t len;
        snprintf(key, sizeof key, "r%d", i);
        if (mg_store_get(s, key, &val, &len) || len != sizeof(int) || *(int *)val != i) rc = 4;
        free(val);
    }
    const char *ck[1] = {"count"};
    if (mg_store_wait(s, ck, 1, 5)) rc = 5;
    mg_store_destroy(s);
    return rc;
}

TEST(store_file_operations_across_processes)
{
    char path[512], url[600];
    snprintf(path, sizeof path, "%s/store", mgt_tmpdir());
    snprintf(url, sizeof url, "file://%s", path);
    mg_store *s;
    CHECK_OK(mg_store_connect(url, NULL, 0.3, &s));
    exercise(s);
    mg_store_destroy(s);
    struct stat st;
    CHECK(stat(path, &st) < 0); /* the last handle removed the file */
    CHECK_EQ(mgt_fork_ranks(3, file_ranks, url, 30, NULL), 0);
    CHECK_ERR(mg_store_connect("file:///nonexistent-dir/x", NULL, 1, &s), MG_EIO);
    CHECK_ERR(mg_store_connect("udp://x:1", NULL, 1, &s), MG_EINVAL);
    CHECK_ERR(mg_store_connect("tcp://nohostport", NULL, 1, &s), MG_EINVAL);
}

TEST(store_unreachable_and_wrong_service)
{
    /* Nothing listens: a clear error within the deadline. */
    int lfd, port;
    CHECK_OK(mg__sock_listen("127.0.0.1", 0, &lfd, &port));
    close(lfd);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    mg_store *s;
    double t0 = mg_now();
    CHECK_ERR(mg_store_connect(url, "x", 0.5, &s), MG_ETIMEOUT);
    CHECK_MSG(mg_now() - t0 < 3, "took %.2f s: %s", mg_now() - t0, mg_last_error());
    CHECK_MSG(strstr(mg_last_error(), "cannot reach"), "message: %s", mg_last_error());
    /* Something listens but never speaks: no hang past the deadline. */
    CHECK_OK(mg__sock_listen("127.0.0.1", 0, &lfd, &port));
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    t0 = mg_now();
    CHECK_ERR(mg_store_connect(url, "x", 0.5, &s), MG_ETIMEOUT);
    CHECK_MSG(mg_now() - t0 < 3, "took %.2f s: %s", mg_now() - t0, mg_last_error());
    close(lfd);
}
