/* Liveness (transport.h, issue 16 item 9): a stopped peer is named within
 * MG_PEER_TIMEOUT (15 s by default) instead of the whole MG_TIMEOUT; a
 * rank that computes for several peer timeouts without communicating is
 * never declared dead (its progress thread beats for it), also when a
 * peer's large frame fills its socket buffers; a peer stopped for a few
 * seconds (a flap) is survived. Over shared memory and TCP. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "multigrad/comm.h"
#include "comm/builtin.h"

enum { STOPPED, COMPUTES, FLAPS };

typedef struct {
    int port, mode;
    const char *transport;
    double pause;   /* COMPUTES: seconds rank 1 computes; FLAPS: seconds it is stopped */
} job;

/* Each rank's environment: the defaults unless the test sets otherwise. */
static void defaults(const char *peer_timeout)
{
    unsetenv("MG_TIMEOUT");
    if (peer_timeout) setenv("MG_PEER_TIMEOUT", peer_timeout, 1);
    else unsetenv("MG_PEER_TIMEOUT");
}

static void fill(float *x, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(rank + 1) * (float)(i % 7);
}

/* Sum over n ranks of fill(): sum_r (r + 1) * (i % 7). */
static int check_sum(const float *x, size_t n, int ranks)
{
    float k = (float)(ranks * (ranks + 1) / 2);
    for (size_t i = 0; i < n; i++)
        if (x[i] != k * (float)(i % 7)) return 0;
    return 1;
}

typedef struct {
    pid_t pid;
    double secs;
} flap;

/* Stop a peer for a while, as a cable pulled and plugged back would. */
static void *stop_for_a_while(void *arg)
{
    flap *f = arg;
    kill(f->pid, SIGSTOP);
    usleep((useconds_t)(f->secs * 1e6));
    kill(f->pid, SIGCONT);
    return NULL;
}

static int live_rank(int rank, int n, void *arg)
{
    const job *j = arg;
    mg_group *g = mgt_join(rank, n, j->port, j->transport, 0);
    if (!g) return 2;
    CHECK_EQ(mg_group_timeout(g), 300); /* the default: not what detects */
    CHECK_OK(mg_barrier(g));
    /* Larger than the socket buffers: a computing rank's window fills. */
    size_t count = j->mode == COMPUTES ? (size_t)4 << 20 : 1000;
    float *x = malloc(count * sizeof *x);
    CHECK(x);
    mg__bi *b = g->impl;
    if (j->mode == STOPPED && rank == 1) raise(SIGSTOP);
    flap f = {b->info[1].pid, j->pause};
    pthread_t t;
    if (j->mode == FLAPS && rank == 0) pthread_create(&t, NULL, stop_for_a_while, &f);
    double start = mg_now();
    for (int round = 0; round < 3; round++) {
        if (j->mode == COMPUTES && rank == 1 && round == 1)
            usleep((useconds_t)(j->pause * 1e6)); /* computing, not communicating */
        fill(x, count, rank);
        double t0 = mg_now();
        mg_work *w;
        /* The waiting ranks' progress threads run the operation. */
        CHECK_OK(mg_all_reduce_async(g, MG_IN_PLACE, x, count, MG_F32, MG_SUM, &w));
        mg_status st = mg_work_wait(w, -1);
        double dt = mg_now() - t0;
        mg_work_free(w);
        if (j->mode == STOPPED) {
            const char *msg = mg_last_error();
            printf("rank %d after %.2f s: %s\n", rank, dt, msg);
            CHECK(st == MG_EPEER);
            CHECK_MSG(strstr(msg, "rank 1") && strstr(msg, "sent nothing for 15 s"), "%s", msg);
            if (rank == 0) CHECK_MSG(strstr(msg, "stopped (SIGSTOP"), "%s", msg);
            CHECK_MSG(dt > 10 && dt < 20, "detected after %.2f s", dt);
            if (rank == 0) kill(b->info[1].pid, SIGKILL);
            break;
        }
        CHECK_MSG(!st, "rank %d, round %d, after %.2f s: %s", rank, round, dt, mg_last_error());
        CHECK(check_sum(x, count, n));
    }
    if (j->mode == FLAPS && rank == 0) {
        pthread_join(t, NULL);
        /* The collectives waited through the flap (not all before it). */
        CHECK_MSG(mg_now() - start > j->pause * 0.8, "done in %.2f s", mg_now() - start);
    }
    free(x);
    mg_group_destroy(g);
    return 0;
}

static void run_job(int n, const char *transport, int mode, double pause, double limit)
{
    job j = {mgt_free_port(), mode, transport, pause};
    int st[8];
    mgt_fork_ranks(n, live_rank, &j, limit, st);
    for (int r = 0; r < n; r++) {
        if (mode == STOPPED && r == 1) {
            CHECK_MSG(WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL, "stopped rank: %d", st[r]);
            continue;
        }
        CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d status %d (%s)", r, st[r],
                  transport ? transport : "shm");
    }
}

/* Default settings: detected after MG_PEER_TIMEOUT (15 s), not MG_TIMEOUT (300 s). */
TEST_T(liveness_stopped_rank_named_within_20s_shm, 60)
{
    defaults(NULL);
    run_job(3, NULL, STOPPED, 0, 45);
}

TEST_T(liveness_stopped_rank_named_within_20s_tcp, 60)
{
    defaults(NULL);
    run_job(2, "tcp", STOPPED, 0, 45);
}

/* Rank 1 computes for three peer timeouts between two collectives. */
TEST_T(liveness_computing_rank_is_not_dead_shm, 60)
{
    defaults("4");
    run_job(2, NULL, COMPUTES, 12, 50);
}

TEST_T(liveness_computing_rank_is_not_dead_tcp, 60)
{
    defaults("4");
    run_job(2, "tcp", COMPUTES, 12, 50);
}

/* Default settings: a peer gone for 3 s is waited for. */
TEST_T(liveness_flap_of_3s_is_survived, 60)
{
    defaults(NULL);
    run_job(2, "tcp", FLAPS, 3, 40);
    run_job(2, NULL, FLAPS, 3, 40);
}
