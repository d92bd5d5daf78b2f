/* Failure tests: a peer killed with SIGKILL (between and during
 * operations) and one stopped with SIGSTOP make the others fail with the
 * right error within the deadline; mismatched collectives are named on
 * every rank without touching memory past the buffers; a failed group
 * fails fast afterwards; in sub-groups (a pp=2,dp=2 mesh, a plain split)
 * every line names ranks by their world rank and mesh coordinates;
 * strangers connecting to a rank's data listener (garbage, wrong secret,
 * wrong group) are turned away while the real peer gets in. Over shared
 * memory and TCP. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "multigrad/comm.h"
#include "multigrad/parallel.h"
#include "comm/builtin.h"
#include "comm/store/auth.h"
#include "comm/transport/sock.h"
#include "comm/transport/tcp.h"

typedef struct {
    int port;
    const char *transport;
    double timeout;
    int variant;
} job;

static job new_job(const char *transport, double timeout, int variant)
{
    return (job){mgt_free_port(), transport, timeout, variant};
}

static mg_group *join_group(int rank, int n, const job *j)
{
    return mgt_join(rank, n, j->port, j->transport, j->timeout);
}

/* ---- a killed peer --------------------------------------------------------- */

static void *die_soon(void *arg)
{
    usleep(*(int *)arg);
    raise(SIGKILL);
    return NULL;
}

static int kill_rank(int rank, int n, void *arg)
{
    const job *j = arg;
    mg_group *g = join_group(rank, n, j);
    if (!g) return 2;
    CHECK_OK(mg_barrier(g));  /* #1 */
    size_t count = (size_t)1 << 22;
    float *x = calloc(count, sizeof *x);
    CHECK(x);
    int victim = j->variant == 2 ? 0 : n - 1; /* rank 0 serves the store */
    if (rank == victim) {
        if (j->variant == 0) raise(SIGKILL);      /* before the operation */
        static int delay = 30000;                 /* or in the middle of a stream of them */
        pthread_t t;
        pthread_create(&t, NULL, die_soon, &delay);
        for (;;) mg_all_reduce(g, MG_IN_PLACE, x, count, MG_F32, MG_SUM);
    }
    double t0 = mg_now();
    mg_status st = MG_OK;
    int ops = 0;
    while (!st) {
        st = mg_all_reduce(g, MG_IN_PLACE, x, count, MG_F32, MG_SUM);
        ops++;
    }
    double dt = mg_now() - t0;
    const char *msg = mg_last_error();
    printf("rank %d after %d ops, %.2f s: %s\n", rank, ops, dt, msg);
    CHECK(st == MG_EPEER);
    char dead[32];
    snprintf(dead, sizeof dead, "rank %d", victim);
    CHECK(strstr(msg, dead));
    CHECK(strstr(msg, "all_reduce #"));
    CHECK(dt < 5); /* detected, not timed out (MG_TIMEOUT is 30 s) */
    /* Later calls fail at once with the same story. */
    t0 = mg_now();
    CHECK_ERR(mg_barrier(g), MG_EPEER);
    CHECK(strstr(mg_last_error(), dead));
    mg_work *w;
    CHECK_ERR(mg_all_reduce_async(g, MG_IN_PLACE, x, 4, MG_F32, MG_SUM, &w), MG_EPEER);
    CHECK(w == NULL);
    CHECK(mg_now() - t0 < 0.5);
    free(x);
    mg_group_destroy(g);
    return 0;
}

static void expect_kill(int n, const char *transport, int variant)
{
    job j = new_job(transport, 30, variant);
    int st[16], victim = variant == 2 ? 0 : n - 1;
    mgt_fork_ranks(n, kill_rank, &j, 40, st);
    for (int r = 0; r < n; r++)
        if (r != victim)
            CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d status %d (%s, "
                      "variant %d)", r, st[r], transport ? transport : "shm", variant);
    CHECK(WIFSIGNALED(st[victim]) && WTERMSIG(st[victim]) == SIGKILL);
}

/* variant 0: killed between operations; 1: during a stream of them;
 * 2: rank 0, which also serves the store, killed during them. */
TEST_T(fault_sigkill_shm, 60) { expect_kill(3, NULL, 0); expect_kill(2, NULL, 1); expect_kill(3, NULL, 2); }
TEST_T(fault_sigkill_tcp, 60) { expect_kill(3, "tcp", 0); expect_kill(3, "tcp", 1); expect_kill(3, "tcp", 2); }

/* ---- ranks of sub-groups named by their world ranks -------------------------------- */

/* World ranks 0..3 as a pp=2,dp=2 mesh (variant 0: rank r is (pp r / 2,
 * dp r % 2)), or split without labels (variant 1), into the groups {0, 2},
 * {1, 3} ("odd": pp in the mesh) and {0, 1}, {2, 3} ("pair": dp). In {1,
 * 3}, world rank 1 is rank 0 and world rank 3 rank 1: no line may call
 * them that. First a mismatched collective in the world group (rank 1
 * broadcasts), then world rank 3 is killed: rank 1 finds out in {1, 3},
 * rank 2 in {2, 3}. */
static int subgroup_rank(int rank, int n, void *arg)
{
    const job *j = arg;
    mg_group *g = join_group(rank, n, j);
    if (!g) return 2;
    mg_mesh *m = NULL;
    mg_group *odd = NULL, *pair = NULL;
    if (j->variant == 0) {
        CHECK_OK(mg_mesh_create(g, "pp=2,dp=2", &m));
        odd = mg_mesh_group(m, MG_MESH_PP);
        pair = mg_mesh_group(m, MG_MESH_DP);
    } else {
        CHECK_OK(mg_group_split(g, rank % 2, rank, &odd));
        CHECK_OK(mg_group_split(g, rank / 2, rank, &pair));
    }
    const char *name[4] = {"rank 0 (pp 0, dp 0)", "rank 1 (pp 0, dp 1)", "rank 2 (pp 1, dp 0)",
                           "rank 3 (pp 1, dp 1)"};
    const char *plain[4] = {"rank 0", "rank 1", "rank 2", "rank 3"};
    if (j->variant == 1) memcpy(name, plain, sizeof name);
    char buf[128], me[160], dead[160];
    snprintf(me, sizeof me, "%s: ", name[rank]);
    /* Over shared memory its pid is named too: "rank 3 (pp 1, dp 1; pid 7, this host)". */
    snprintf(dead, sizeof dead, "%s", name[3]);
    if (!j->transport) snprintf(dead, sizeof dead, j->variant ? "rank 3 (pid " : "%.*s; pid ",
                                (int)strlen(name[3]) - 1, name[3]);
    for (int r = 0; r < 2; r++) {
        CHECK_EQ(mg_group_world_rank(odd, r), 2 * r + rank % 2);
        CHECK(!strcmp(mg_group_rank_name(odd, r, buf, sizeof buf), name[2 * r + rank % 2]));
        CHECK(!strcmp(mg_group_rank_name(pair, r, buf, sizeof buf), name[rank / 2 * 2 + r]));
    }
    CHECK(!strcmp(mg_group_rank_name(g, rank, buf, sizeof buf), name[rank]));

    /* The mismatch: every rank's line begins with its own name and names rank 1. */
    float x[64] = {0};
    mg_status st = rank == 1 ? mg_broadcast(g, x, 64, MG_F32, 0)
                             : mg_all_reduce(g, MG_IN_PLACE, x, 64, MG_F32, MG_SUM);
    const char *msg = mg_last_error();
    printf("rank %d, mismatch: %s\n", rank, msg);
    CHECK(st == MG_EMISMATCH || st == MG_EPEER);
    CHECK_MSG(!strncmp(msg, me, strlen(me)) && strstr(msg, name[1]) && strstr(msg, "broadcast #"),
              "rank %d: '%s' should begin with '%s' and name %s's broadcast", rank, msg, me,
              name[1]);
    /* Everyone past it (through both sub-groups) before rank 3 dies. */
    CHECK_OK(mg_barrier(pair));
    CHECK_OK(mg_barrier(odd));
    if (rank == 3) raise(SIGKILL);
    if (rank == 1 || rank == 2) {
        mg_group *on = rank == 1 ? odd : pair;
        do st = mg_all_reduce(on, MG_IN_PLACE, x, 64, MG_F32, MG_SUM);
        while (!st);
        msg = mg_last_error();
        printf("rank %d, killed peer: %s\n", rank, msg);
        CHECK(st == MG_EPEER);
        CHECK_MSG(!strncmp(msg, me, strlen(me)) && strstr(msg, dead),
                  "rank %d: '%s' should begin with '%s' and name '%s'", rank, msg, me, dead);
    }
    /* No one leaves before ranks 1 and 2 have seen rank 3 die (a rank
     * that left would be the death they see). */
    if (rank < 2) CHECK_OK(mg_barrier(pair));
    if (rank % 2 == 0) CHECK_OK(mg_barrier(odd));
    mg_mesh_destroy(m);
    if (j->variant == 1) {
        mg_group_destroy(odd);
        mg_group_destroy(pair);
    }
    mg_group_destroy(g);
    return 0;
}

static void expect_subgroup_names(const char *transport, int variant)
{
    job j = new_job(transport, 30, variant);
    int st[4];
    mgt_fork_ranks(4, subgroup_rank, &j, 40, st);
    for (int r = 0; r < 3; r++)
        CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d status %d (%s, variant "
                  "%d)", r, st[r], transport ? transport : "shm", variant);
    CHECK(WIFSIGNALED(st[3]) && WTERMSIG(st[3]) == SIGKILL);
}

TEST_T(fault_subgroup_lines_name_world_ranks_and_coordinates, 90)
{
    expect_subgroup_names(NULL, 0);
    expect_subgroup_names("tcp", 0);
    expect_subgroup_names(NULL, 1);
}

/* ---- a stopped peer ------------------------------------------------------------ */

static int stop_rank(int rank, int n, void *arg)
{
    const job *j = arg;
    mg_group *g = join_group(rank, n, j);
    if (!g) return 2;
    CHECK_OK(mg_barrier(g));
    if (rank == 1) raise(SIGSTOP);
    int32_t v = rank;
    mg_work *w;
    double t0 = mg_now();
    CHECK_OK(mg_all_reduce_async(g, MG_IN_PLACE, &v, 1, MG_I32, MG_SUM, &w));
    mg_status st = mg_work_wait(w, -1);
    double dt = mg_now() - t0;
    const char *msg = mg_last_error();
    printf("rank %d after %.2f s: %s\n", rank, dt, msg);
    CHECK(st == MG_ETIMEOUT || st == MG_EPEER);
    CHECK(strstr(msg, "rank 1"));
    CHECK(strstr(msg, "all_reduce #2"));
    if (rank == 0 || st == MG_ETIMEOUT) CHECK(strstr(msg, "stopped"));
    CHECK(dt >= j->timeout * 0.9 && dt < j->timeout + 3);
    mg_work_free(w);
    /* Done with it: the harness must not wait for a stopped process. */
    mg__bi *b = g->impl;
    if (rank == 0) kill(b->info[1].pid, SIGKILL);
    mg_group_destroy(g);
    return 0;
}

static void expect_stop(int n, const char *transport)
{
    job j = new_job(transport, 1.5, 0);
    int st[8];
    mgt_fork_ranks(n, stop_rank, &j, 30, st);
    for (int r = 0; r < n; r++)
        if (r != 1)
            CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d status %d (%s)", r,
                      st[r], transport ? transport : "shm");
    CHECK(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
}

TEST_T(fault_sigstop_shm, 60) { expect_stop(2, NULL); expect_stop(3, NULL); }
TEST_T(fault_sigstop_tcp, 60) { expect_stop(2, "tcp"); }

/* ---- mismatched collectives -------------------------------------------------------- */

static int mismatch_rank(int rank, int n, void *arg)
{
    const job *j = arg;
    mg_group *g = join_group(rank, n, j);
    if (!g) return 2;
    CHECK_OK(mg_barrier(g));
    /* Buffers with guards on both sides: nothing may be written outside. */
    size_t count = j->variant == 0 ? 1000 : (size_t)(rank + 1) * 300000;
    float *mem = malloc((count + 32) * sizeof *mem), *x = mem + 16;
    CHECK(mem);
    for (size_t i = 0; i < count + 32; i++) mem[i] = -3;
    for (size_t i = 0; i < count; i++) x[i] = (float)rank;
    double t0 = mg_now();
    mg_status st;
    if (j->variant == 0 && rank == 1)
        st = mg_broadcast(g, x, count, MG_F32, 0);
    else
        st = mg_all_reduce(g, MG_IN_PLACE, x, count, MG_F32, MG_SUM);
    const char *msg = mg_last_error();
    printf("rank %d: %s\n", rank, msg);
    CHECK(st == MG_EMISMATCH || st == MG_EPEER);
    if (j->variant == 0) {
        CHECK(strstr(msg, "all_reduce #2"));
        CHECK(strstr(msg, "broadcast #2"));
    } else {
        CHECK(strstr(msg, "different counts"));
    }
    CHECK(strstr(msg, "test_faults.c:"));
    CHECK_MSG(mg_now() - t0 < 5, "took %.2f s: %s", mg_now() - t0, mg_last_error());
    for (size_t i = 0; i < 16; i++) CHECK(mem[i] == -3 && mem[count + 16 + i] == -3);
    CHECK(mg_barrier(g) == st);
    free(mem);
    mg_group_destroy(g);
    return 0;
}

static void expect_mismatch(int n, const char *transport, int variant)
{
    job j = new_job(transport, 20, variant);
    int bad = mgt_fork_ranks(n, mismatch_rank, &j, 40, NULL);
    CHECK_MSG(bad == 0, "%d ranks failed (%s, variant %d)", bad, transport ? transport : "shm",
              variant);
}

TEST_T(fault_mismatched_collectives_shm, 60)
{
    expect_mismatch(2, NULL, 0);
    expect_mismatch(3, NULL, 0);
    expect_mismatch(2, NULL, 1);
    expect_mismatch(4, NULL, 1);
}

TEST_T(fault_mismatched_collectives_tcp, 60)
{
    expect_mismatch(2, "tcp", 0);
    expect_mismatch(3, "tcp", 1);
}

/* ---- mismatched group memory -------------------------------------------------------- */

static int alloc_mismatch_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg);
    if (!g) return 2;
    void *p = mg_group_alloc(g, rank == 1 ? 8192 : 4096);
    CHECK(p == NULL);
    CHECK_MSG(strstr(mg_last_error(), "mg_group_alloc"), "message: %s", mg_last_error());
    CHECK_MSG(strstr(mg_last_error(), "different counts"), "message: %s", mg_last_error());
    CHECK(mg_barrier(g) != MG_OK);
    mg_group_destroy(g);
    return 0;
}

TEST(fault_mismatched_group_alloc)
{
    job j = new_job(NULL, 10, 0);
    CHECK_EQ(mgt_fork_ranks(2, alloc_mismatch_rank, &j, 30, NULL), 0);
}

/* ---- strangers at a rank's data listener --------------------------------------------- */

typedef struct {
    int port;
    uint64_t gid;
    mg_status st;
} dialer;

static void *real_peer(void *arg)
{
    dialer *d = arg;
    usleep(100000); /* let the strangers queue up first */
    bool need[2] = {true, false};
    char addr[2][64] = {"127.0.0.1", ""};
    int port[2] = {d->port, 0}, fds[2];
    mg__tcp_listener none = {.fd = -1};
    d->st = mg__tcp_connect_peers(&none, NULL, d->gid, 1, 2, need, addr, port, "right", mg_now() + 5, fds);
    if (!d->st) close(fds[0]);
    return NULL;
}

TEST(fault_strangers_at_data_listener)
{
    mg__tcp_listener l;
    CHECK_OK(mg__tcp_listen("127.0.0.1", &l));
    int fd[5];
    /* Garbage, silence, a wrong secret, and the right secret for the wrong group. */
    for (int i = 0; i < 4; i++) CHECK_OK(mg__sock_connect("127.0.0.1", l.port, mg_now() + 2, "t", &fd[i]));
    char junk[100];
    memset(junk, 0x5a, sizeof junk);
    CHECK(send(fd[0], junk, sizeof junk, MSG_NOSIGNAL) == sizeof junk);
    dialer d = {l.port, 0x1234, -1};
    pthread_t t;
    pthread_create(&t, NULL, real_peer, &d);
    bool need[2] = {false, true};
    char addr[2][64] = {"", ""};
    int port[2] = {0, 0}, fds[2];
    double t0 = mg_now();
    /* The strangers are answered while the accept loop runs; do the wrong
     * ones from here once it has sent its challenges. */
    pid_t kid = fork();
    if (kid == 0) {
        CHECK(mg__auth_client(fd[2], "wrong", "data", mg_now() + 3, "t") == MG_EAUTH);
        CHECK_OK(mg__auth_client(fd[3], "right", "data", mg_now() + 3, "t"));
        uint8_t intro[24] = {'M', 'G', 'T', '1'};
        uint64_t gid = 0x9999;
        int32_t from = 1, to = 0;
        memcpy(intro + 4, &gid, 8);
        memcpy(intro + 12, &from, 4);
        memcpy(intro + 16, &to, 4);
        CHECK(send(fd[3], intro, sizeof intro, MSG_NOSIGNAL) == sizeof intro);
        char c;
        CHECK(recv(fd[3], &c, 1, 0) <= 0); /* dropped without an answer */
        _exit(0);
    }
    CHECK_OK(mg__tcp_connect_peers(&l, NULL, 0x1234, 0, 2, need, addr, port, "right", mg_now() + 5, fds));
    CHECK_MSG(mg_now() - t0 < 3, "took %.2f s: %s", mg_now() - t0, mg_last_error());
    pthread_join(t, NULL);
    CHECK_OK(d.st);
    int st;
    waitpid(kid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(fds[1]);
    for (int i = 0; i < 4; i++) close(fd[i]);
    mg__tcp_listener_close(&l);
}
