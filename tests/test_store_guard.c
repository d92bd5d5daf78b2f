/* Tests of the store against strangers: idle connections flooding the
 * store, a store out of file descriptors, clients of another user on a
 * job without a secret, and a file store with planted links, forged or
 * replayed records and unsafe directories.
 *
 * The store serves from a child process of its own: the test process
 * stays single-threaded, so it may fork ranks, and the child can be given
 * a small descriptor limit or another user. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include "harness.h"
#include "multigrad/comm.h"
#include "multigrad/core.h"

#define NOBODY 65534
#define PER_SOURCE 128  /* MAX_AUTH_PER_SOURCE in tcp_store.c */

/* Serve a store on 127.0.0.1 from a child (with at most nofile
 * descriptors if nofile > 0, as user uid if uid >= 0); its pid. */
static pid_t serve_in_child(const char *secret, int nofile, int uid, int *port)
{
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t parent = getpid(), pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        if (uid >= 0 && (setgid((gid_t)uid) || setuid((uid_t)uid))) _exit(2);
        struct rlimit rl = {(rlim_t)nofile, (rlim_t)nofile};
        if (nofile > 0 && setrlimit(RLIMIT_NOFILE, &rl)) _exit(3);
        mg_store_server *srv;
        int got = -1;
        if (!mg_store_server_start("127.0.0.1", 0, secret, &srv)) got = mg_store_server_port(srv);
        else printf("store child: %s\n", mg_last_error());
        if (write(p[1], &got, sizeof got) != (ssize_t)sizeof got) _exit(4);
        for (;;) pause();
    }
    close(p[1]);
    *port = -1;
    CHECK(read(p[0], port, sizeof *port) == (ssize_t)sizeof *port && *port > 0);
    close(p[0]);
    return pid;
}

static void stop_child(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void raise_nofile(rlim_t want)
{
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur >= want) return;
    if (rl.rlim_max < want) rl.rlim_max = want;  /* works as root */
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl))
        mgt_skip("needs %lu open files (ulimit -n) and cannot raise the limit", (unsigned long)want);
}

/* Open n idle connections to the store from source address src (any
 * 127/8 address is this host) and wait until the store took each one:
 * sent its challenge, or closed it. */
static void flood(int port, const char *src, int n, int *fds)
{
    struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &from.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    to.sin_port = htons((uint16_t)port);
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(fds[i] >= 0);
        CHECK(bind(fds[i], (struct sockaddr *)&from, sizeof from) == 0);
        CHECK_MSG(connect(fds[i], (struct sockaddr *)&to, sizeof to) == 0, "connection %d from %s: %s",
                  i, src, strerror(errno));
    }
    double deadline = mg_now() + 20;
    for (int i = 0; i < n; i++) {
        struct pollfd p = {fds[i], POLLIN, 0};
        while (poll(&p, 1, 100) == 0)
            CHECK_MSG(mg_now() < deadline, "the store never took connection %d from %s", i, src);
    }
}

/* Whether the store closed fd (everything it sent read, then EOF). */
static int closed_by_store(int fd)
{
    char buf[256];
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k > 0) continue;
        return k == 0 || errno == ECONNRESET;
    }
}

static int join_and_leave(int rank, int n, void *arg)
{
    mg_group *g = mgt_join(rank, n, *(int *)arg, NULL, 30);
    if (!g) return 1;
    mg_group_destroy(g);
    return 0;
}

/* n ranks join through the store at port (served elsewhere); seconds. */
static double time_join(int n, int port)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    setenv("MG_STORE_PORT", p, 1);
    double t0 = mg_now();
    CHECK_EQ(mgt_fork_ranks(n, join_and_leave, &port, 60, NULL), 0);
    unsetenv("MG_STORE_PORT");
    return mg_now() - t0;
}

TEST_T(store_idle_flood_does_not_keep_ranks_out, 120)
{
    enum { SOURCES = 11, EACH = 100, LATE = 200 };
    raise_nofile(4096);
    int port;
    pid_t srv = serve_in_child("multigrad-test", 0, -1, &port);
    /* 1,100 idle connections from 11 addresses: more than the store's
     * 1,024 slots, none over the per-source limit. */
    static int fds[SOURCES * EACH], late[LATE];
    double t0 = mg_now();
    for (int s = 0; s < SOURCES; s++) {
        char src[32];
        snprintf(src, sizeof src, "127.0.0.%d", 2 + s);
        flood(port, src, EACH, fds + s * EACH);
    }
    double flooded = mg_now() - t0;
    /* A job still joins, long before the strangers' 10 s to authenticate
     * would have freed their slots. */
    double dt = time_join(4, port);
    printf("%d idle connections opened in %.2f s; then 4 ranks joined in %.2f s\n",
           SOURCES * EACH, flooded, dt);
    CHECK_MSG(flooded + dt < 8, "joining took %.2f s (after %.2f s of flooding)", dt, flooded);
    /* 200 more from one address: the oldest beyond the per-source limit
     * are evicted, from that address only. */
    flood(port, "127.0.0.20", LATE, late);
    for (int i = 0; i < LATE; i++)
        CHECK_MSG(closed_by_store(late[i]) == (i < LATE - PER_SOURCE),
                  "late connection %d %s", i, i < LATE - PER_SOURCE ? "kept" : "evicted");
    for (int i = 0; i < SOURCES * EACH; i++) close(fds[i]);
    for (int i = 0; i < LATE; i++) close(late[i]);
    stop_child(srv);
}

/* CPU seconds the process has used (user + system). */
static double cpu_of(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    mgt_read_into(path, buf, sizeof buf);
    const char *p = strrchr(buf, ')');
    CHECK(p);
    unsigned long ut = 0, st = 0;
    /* After the name: state, then fields 4..13, then utime and stime. */
    CHECK(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

TEST_T(store_out_of_descriptors_does_not_spin, 90)
{
    enum { IDLE = 150 };
    int port;
    pid_t srv = serve_in_child("multigrad-test", 64, -1, &port);
    /* More idle connections than the store may open files. */
    static int fds[IDLE];
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    for (int i = 0; i < IDLE; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(fds[i] >= 0 && connect(fds[i], (struct sockaddr *)&to, sizeof to) == 0);
    }
    usleep(500 * 1000);
    double c0 = cpu_of(srv), t0 = mg_now();
    sleep(2);
    double cpu = (cpu_of(srv) - c0) / (mg_now() - t0);
    double dt = time_join(2, port);
    printf("store limited to 64 files, %d idle connections: %.1f%% of a core; 2 ranks joined "
           "in %.2f s\n", IDLE, 100 * cpu, dt);
    CHECK_MSG(cpu < 0.15, "the store used %.0f%% of a core while out of descriptors", 100 * cpu);
    CHECK_MSG(dt < 8, "joining took %.2f s", dt);
    for (int i = 0; i < IDLE; i++) close(fds[i]);
    stop_child(srv);
}

/* Fork a client that connects to the store at port (as user uid if
 * uid >= 0) and, once in, sets a key; its exit code: 0 in, else 10 + the
 * status of the failure. */
static pid_t client_in_child(int port, const char *secret, int uid, double timeout)
{
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid) return pid;
    for (int fd = 3; fd < 1024; fd++) close(fd); /* the parent's connections */
    if (uid >= 0 && (setgid((gid_t)uid) || setuid((uid_t)uid))) _exit(9);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    mg_store *s;
    double t0 = mg_now();
    mg_status st = mg_store_connect(url, secret, timeout, &s);
    printf("client (uid %d) after %.2f s: %s: %s\n", (int)geteuid(), mg_now() - t0,
           mg_status_name(st), st ? mg_last_error() : "connected");
    if (!st) st = mg_store_set(s, "poison", "1", 1);
    fflush(stdout);
    _exit(st ? 10 + st : 0);
}

static int exit_code(pid_t pid)
{
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

TEST_T(store_client_retries_a_full_store_then_says_why, 90)
{
    enum { MAX = 64 };
    int port;
    pid_t srv = serve_in_child("multigrad-test", 24, -1, &port);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    /* Fill every descriptor the store has with clients of the job: nothing
     * can be evicted, and a newcomer is turned away. */
    mg_store *s[MAX];
    int n = 0;
    mg_status st = MG_OK;
    double t0 = 0;
    while (n < MAX && !st) {
        t0 = mg_now();
        st = mg_store_connect(url, "multigrad-test", 1.0, &s[n]);
        if (!st) n++;
    }
    double dt = mg_now() - t0;
    CHECK_MSG(n > 4 && n < MAX, "%d clients fit in a store limited to 24 files", n);
    printf("%d clients fill the store; the next: %s\n", n, mg_last_error());
    /* It kept trying until its deadline, then said why. */
    CHECK_ERR(st, MG_ETIMEOUT);
    CHECK_MSG(dt > 0.9 && dt < 5, "gave up after %.2f s", dt);
    CHECK_MSG(strstr(mg_last_error(), "turned this rank away") &&
                  strstr(mg_last_error(), "ulimit -n"), "message: %s", mg_last_error());
    /* A client that keeps trying gets in once a place frees up. */
    pid_t late = client_in_child(port, "multigrad-test", -1, 20);
    usleep(500 * 1000);
    mg_store_destroy(s[--n]);
    CHECK_EQ(exit_code(late), 0);
    while (n) mg_store_destroy(s[--n]);
    stop_child(srv);
}

TEST(store_without_secret_refuses_other_users)
{
    if (geteuid() != 0) mgt_skip("needs root to run a client as another user (uid %d)", NOBODY);
    unsetenv("MG_JOB_SECRET");
    int port;
    pid_t srv = serve_in_child("", 0, -1, &port);
    /* A stranger is refused at once, and writes nothing. */
    double t0 = mg_now();
    CHECK_EQ(exit_code(client_in_child(port, "", NOBODY, 5)), 10 + MG_EAUTH);
    CHECK_MSG(mg_now() - t0 < 3, "refused after %.2f s", mg_now() - t0);
    /* The owner still joins, and finds nothing the stranger wrote. */
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    mg_store *s;
    CHECK_OK(mg_store_connect(url, "", 0.3, &s));
    void *v;
    size_t n;
    CHECK_ERR(mg_store_get(s, "poison", &v, &n), MG_ETIMEOUT);
    mg_store_destroy(s);
    stop_child(srv);
    /* The other way: a store served by another user is not trusted. */
    srv = serve_in_child("", 0, NOBODY, &port);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    CHECK_ERR(mg_store_connect(url, "", 5, &s), MG_EAUTH);
    printf("store of another user: %s\n", mg_last_error());
    CHECK_MSG(strstr(mg_last_error(), "another user"), "message: %s", mg_last_error());
    stop_child(srv);
}

static void write_file(const char *path, const void *data, size_t n, int flags)
{
    int fd = open(path, O_WRONLY | O_CREAT | flags, 0600);
    CHECK(fd >= 0 && write(fd, data, n) == (ssize_t)n);
    close(fd);
}

TEST(store_file_refuses_links_forgeries_and_unsafe_places)
{
    char dir[512], path[600], url[700], victim[600];
    snprintf(dir, sizeof dir, "%s/fs", mgt_tmpdir());
    CHECK(mkdir(dir, 0700) == 0);
    mg_store *s;
    /* A link planted where the store goes is not followed, whether it
     * points at a file of ours or nowhere yet. */
    snprintf(victim, sizeof victim, "%s/victim", dir);
    write_file(victim, "precious", 8, O_TRUNC);
    snprintf(path, sizeof path, "%s/store", dir);
    snprintf(url, sizeof url, "file://%s", path);
    CHECK(symlink(victim, path) == 0);
    CHECK_ERR(mg_store_connect(url, "job", 1, &s), MG_EAUTH);
    CHECK_MSG(strstr(mg_last_error(), "symbolic link"), "message: %s", mg_last_error());
    size_t len;
    char *content = mgt_slurp(victim, &len);
    CHECK(len == 8 && !memcmp(content, "precious", 8));
    free(content);
    CHECK(unlink(path) == 0);
    snprintf(victim, sizeof victim, "%s/created-by-link", dir);
    CHECK(symlink(victim, path) == 0);
    CHECK_ERR(mg_store_connect(url, "job", 1, &s), MG_EAUTH);
    struct stat st;
    CHECK(lstat(victim, &st) < 0);
    CHECK(unlink(path) == 0);

    /* A record forged without the job's secret is refused... */
    CHECK_OK(mg_store_connect(url, "job", 0.5, &s));
    CHECK_OK(mg_store_set(s, "k", "good", 4));
    uint8_t rec[12 + 8 + 32] = {'R', 1, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 'e', 'v', 'i', 'l',
                                'b', 'a', 'd', '!'};
    write_file(path, rec, sizeof rec, O_APPEND);
    void *v;
    CHECK_ERR(mg_store_get(s, "evil", &v, &len), MG_EAUTH);
    CHECK_MSG(strstr(mg_last_error(), "MG_JOB_SECRET"), "message: %s", mg_last_error());
    mg_store_destroy(s);
    CHECK(unlink(path) == 0);
    /* ...and so are genuine records replayed at another place, and a job
     * with another secret. */
    CHECK_OK(mg_store_connect(url, "job", 0.5, &s));
    CHECK_OK(mg_store_set(s, "k", "v1", 2));
    char *log = mgt_slurp(path, &len);
    write_file(path, log, len, O_APPEND);
    free(log);
    CHECK_ERR(mg_store_get(s, "k", &v, &len), MG_EAUTH);
    mg_store *other;
    CHECK_ERR(mg_store_connect(url, "another-job", 0.5, &other), MG_EAUTH);
    mg_store_destroy(s);
    CHECK(unlink(path) == 0);

    /* A directory others may change (not sticky) is refused; a sticky one,
     * such as /tmp, is fine. */
    CHECK(chmod(dir, 0777) == 0);
    CHECK_ERR(mg_store_connect(url, "job", 0.5, &s), MG_EAUTH);
    CHECK_MSG(strstr(mg_last_error(), "another user"), "message: %s", mg_last_error());
    CHECK(chmod(dir, 01777) == 0);
    CHECK_OK(mg_store_connect(url, "job", 0.5, &s));
    mg_store_destroy(s);
    /* A file someone else planted (or may write) is refused. */
    write_file(path, "", 0, O_TRUNC);
    CHECK(chmod(path, 0622) == 0);
    CHECK_ERR(mg_store_connect(url, "job", 0.5, &s), MG_EAUTH);
    CHECK(chmod(path, 0600) == 0);
    if (geteuid() == 0) {
        CHECK(chown(path, NOBODY, NOBODY) == 0);
        CHECK_ERR(mg_store_connect(url, "job", 0.5, &s), MG_EAUTH);
    }
}
