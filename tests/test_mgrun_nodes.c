/* mgrun on several nodes (two or three mgruns --nnodes N on this host, as
 * on N hosts): the environment every node's workers get, and the nodes'
 * board (tools/mgrun_board.h): a failure, a stopped worker, an
 * interruption or a refused node on one node stops the others at once,
 * saying why, where they waited for MG_PEER_TIMEOUT, MG_TIMEOUT or for
 * ever; --max-restarts restarts every node; node 0 keeps the store until
 * a node whose workers end later is done. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"
#include "mgrun_procs.h"
#include "multigrad/core.h"

static mgr_result R, R1, R2;   /* big: not on the stack */

/* Every node hands its workers the same MASTER_PORT, chosen by node 0 and
 * read from its store by the others, and MG_STORE_PORT, the store's. */
TEST_T(mgrun_multinode_env, 30)
{
    setenv("MG_JOB_SECRET", "0123456789abcdef-shared", 1);
    const char *script = "printf '%s %s %s %s %s %s %s %s\\n' \"$RANK\" \"$WORLD_SIZE\" "
                         "\"$LOCAL_RANK\" \"$GROUP_RANK\" \"$MASTER_ADDR\" \"$MG_STORE_PORT\" "
                         "\"$MG_JOB_SECRET\" \"$MASTER_PORT\" > \"$1/env.$RANK\"; "
                         /* as ranks would, wait for the others (node 0 ends its
                          * store when its workers are done) */
                         "while [ $(ls \"$1\" | grep -c '^env') -lt 4 ]; do sleep 0.01; done";
    const char *args[] = {"-n", "2", "sh", "-c", script, "sh", mgt_tmpdir(), NULL};
    int port = mgt_free_port(), worker_port = -1;
    mgr_result *r[2] = {&R, &R1};
    mgr_two_nodes(args, port, r);
    for (int node = 0; node < 2; node++)
        CHECK_MSG(EXITED(r[node], 0), "node %d: status %d: %s", node, r[node]->status,
                  r[node]->err);
    for (int rank = 0; rank < 4; rank++) {
        char path[600], buf[512], expect[256];
        snprintf(path, sizeof path, "%s/env.%d", mgt_tmpdir(), rank);
        mgt_read_into(path, buf, sizeof buf);
        char *last = strrchr(buf, ' ');
        CHECK_MSG(last, "rank %d wrote '%s'", rank, buf);
        int wp = atoi(last + 1);
        if (rank == 0) worker_port = wp;
        CHECK_MSG(wp == worker_port && wp > 0 && wp != port, "rank %d: MASTER_PORT %d (rank 0's "
                  "%d, the store's %d)", rank, wp, worker_port, port);
        snprintf(expect, sizeof expect, "%d 4 %d %d 127.0.0.1 %d 0123456789abcdef-shared %d\n",
                 rank, rank % 2, rank / 2, port, wp);
        CHECK_MSG(strcmp(buf, expect) == 0, "got '%s', expected '%s'", buf, expect);
    }

    /* Without node 0 another node cannot learn MASTER_PORT: one line. */
    setenv("MG_TIMEOUT", "1", 1);
    const char *alone[] = {"--nnodes", "2", "--node-rank", "1", "--master-port", "1", "sh",
                           "-c", "exit 0", NULL};
    double t0 = mg_now();
    mgr_finish("alone", mgr_start("alone", alone), t0, 20, &R);
    CHECK_MSG(EXITED(&R, 1) && mgt_count(R.err, "\n") == 1 &&
              strstr(R.err, "mgrun: node 1 cannot read the workers' MASTER_PORT from node 0's "
                     "rendezvous store at 127.0.0.1:1") &&
              strstr(R.err, "is mgrun --node-rank 0 running there"), "status %d: '%s'",
              R.status, R.err);

    /* Nodes started with another -n: node 1 says so at once (its ranks
     * would have collided with node 0's, and the job waited MG_TIMEOUT),
     * and node 0, told on the board, stops its workers at once too. */
    setenv("MG_TIMEOUT", "30", 1);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", mgt_free_port());
    const char *n0[] = {"--nnodes", "2", "--node-rank", "0", "--master-port", ps, "-n", "2", "sh",
                        "-c", "sleep 60", NULL};
    const char *n1[] = {"--nnodes", "2", "--node-rank", "1", "--master-port", ps, "-n", "1", "sh",
                        "-c", "exit 0", NULL};
    t0 = mg_now();
    pid_t p0 = mgr_start("node0", n0), p1 = mgr_start("node1", n1);
    mgr_finish("node1", p1, t0, 20, &R1);
    mgr_finish("node0", p0, t0, 20, &R);
    CHECK_MSG(EXITED(&R1, 1) && R1.secs < 10 &&
              strstr(R1.err, "mgrun: node 1 was started with -n 1 --nnodes 2, but node 0 with "
                     "-n 2 --nnodes 2: give every node the same -n and --nnodes"),
              "status %d after %.1f s: '%s'", R1.status, R1.secs, R1.err);
    CHECK_MSG(EXITED(&R, 1) && R.secs < 10 &&
              strstr(R.err, "mgrun: node 1: was started with -n 1 --nnodes 2, but node 0 with -n "
                     "2 --nnodes 2: give every node the same -n and --nnodes; stopped the 2 "
                     "worker(s) here"), "node 0: status %d after %.1f s: '%s'", R.status, R.secs,
              R.err);
}

/* A node that never joins is named by node 0 when it gives up waiting
 * for it (the probe saw only "1 of 2 nodes ended", and status 0 when node
 * 0's workers did not wait for the others): at MG_TIMEOUT when node 0's
 * workers succeeded (status 1: the job did not run whole), at once when
 * they failed (their status). */
TEST_T(mgrun_nodes_a_node_that_never_joins_is_named, 30)
{
    setenv("MG_JOB_SECRET", "0123456789abcdef-shared", 1);
    setenv("MG_TIMEOUT", "2", 1);
    const char *workers[] = {"exit 0", "exit 3"};
    for (int k = 0; k < 2; k++) {
        char port[16];
        snprintf(port, sizeof port, "%d", mgt_free_port());
        const char *n0[] = {"--nnodes", "2", "--node-rank", "0", "--master-port", port, "-n",
                            "1", "sh", "-c", workers[k], NULL};
        double t0 = mg_now();
        mgr_finish("node0", mgr_start("node0", n0), t0, 20, &R);
        CHECK_MSG(EXITED(&R, k ? 3 : 1) && R.secs < 10 &&
                  strstr(R.err, "mgrun: node 1 of 2 never joined the job: no mgrun with "
                         "--node-rank 1 reached this node's rendezvous store"),
                  "%s: status %d after %.1f s: '%s'", workers[k], R.status, R.secs, R.err);
    }
    unsetenv("MG_TIMEOUT");
}

/* Starts mgrun node `node` of nnodes at 127.0.0.1:port with -n 1 and
 * `script` as the worker (sh -c SCRIPT sh DIR), as NAME. */
static pid_t start_node(const char *name, int node, int nnodes, const char *port,
                        const char *script, const char *extra)
{
    char nr[8], nn[8];
    snprintf(nr, sizeof nr, "%d", node);
    snprintf(nn, sizeof nn, "%d", nnodes);
    const char *argv[] = {"--nnodes", nn, "--node-rank", nr, "--master-addr", "127.0.0.1",
                          "--master-port", port, "--max-restarts", extra ? extra : "0", "sh",
                          "-c", script, "sh", mgt_tmpdir(), NULL};
    return mgr_start(name, argv);
}

/* A worker that fails, or is stopped, on one node ends the job on the
 * other at once, named there: node 1's mgrun waited for ever for its
 * stopped worker once node 0's had failed on it (found by a probe), and a
 * node's workers waited MG_PEER_TIMEOUT to lose the failed one. */
TEST_T(mgrun_nodes_a_failure_elsewhere_stops_this_node_at_once, 60)
{
    setenv("MG_JOB_SECRET", "0123456789abcdef-shared", 1);
    setenv("MG_GRACE", "1", 1);
    char port[16];
    /* Rank 1 (node 1) stops itself; rank 0 (node 0) then fails. */
    snprintf(port, sizeof port, "%d", mgt_free_port());
    const char *stop = "if [ $RANK = 1 ]; then kill -STOP $$; fi; sleep 1; exit 3";
    double t0 = mg_now();
    pid_t p1 = start_node("node1", 1, 2, port, stop, NULL), p0 = start_node("node0", 0, 2, port,
                                                                             stop, NULL);
    mgr_finish("node0", p0, t0, 30, &R);
    mgr_finish("node1", p1, t0, 30, &R1);
    CHECK_MSG(EXITED(&R, 3) && EXITED(&R1, 3) && R1.secs < 10 &&
              strstr(R1.err, "mgrun: node 0: rank 0 (pid ") &&
              strstr(R1.err, "exited with status 3; stopped the 1 worker(s) here, of which rank "
                     "1 (pid ") && strstr(R1.err, "was stopped by signal 19 (SIGSTOP)"),
              "node 0: %d %s\nnode 1: %d after %.1f s: %s", R.status, R.err, R1.status, R1.secs,
              R1.err);
    /* Rank 1 fails at once; node 0's worker would sleep a minute. */
    snprintf(port, sizeof port, "%d", mgt_free_port());
    const char *fail = "if [ $RANK = 1 ]; then exit 7; fi; sleep 60";
    t0 = mg_now();
    p0 = start_node("node0", 0, 2, port, fail, NULL);
    p1 = start_node("node1", 1, 2, port, fail, NULL);
    mgr_finish("node0", p0, t0, 30, &R);
    mgr_finish("node1", p1, t0, 30, &R1);
    CHECK_MSG(EXITED(&R, 7) && EXITED(&R1, 7) && R.secs < 10 &&
              strstr(R.err, "mgrun: node 1: rank 1 (pid ") &&
              strstr(R.err, "exited with status 7; stopped the 1 worker(s) here"),
              "node 0: %d after %.1f s: %s", R.status, R.secs, R.err);
}

/* --max-restarts restarts the workers of every node when one node's
 * fail, at once (node 0's waited in their group's set-up for MG_TIMEOUT
 * before they failed and restarted, found by a probe); an interruption
 * of one node's mgrun stops every node without a restart. */
TEST_T(mgrun_nodes_restart_together_and_stop_together, 60)
{
    setenv("MG_JOB_SECRET", "0123456789abcdef-shared", 1);
    setenv("MG_GRACE", "1", 1);
    char port[16], dir[600];
    snprintf(dir, sizeof dir, "%s", mgt_tmpdir());
    snprintf(port, sizeof port, "%d", mgt_free_port());
    /* rank 1 fails once rank 0 has begun (else node 0 may stop its worker
     * before it wrote its first line: seen under TSan with -j2) */
    const char *flaky = "echo $MG_RESTART_COUNT >> \"$1/log.$RANK\"; "
                        "if [ $RANK = 1 ] && [ $MG_RESTART_COUNT = 0 ]; then "
                        "while [ ! -s \"$1/log.0\" ]; do sleep 0.01; done; exit 7; fi; "
                        "if [ $MG_RESTART_COUNT = 0 ]; then sleep 60; fi";
    double t0 = mg_now();
    pid_t p0 = start_node("node0", 0, 2, port, flaky, "1");
    pid_t p1 = start_node("node1", 1, 2, port, flaky, "1");
    mgr_finish("node0", p0, t0, 30, &R);
    mgr_finish("node1", p1, t0, 30, &R1);
    char path[700], log0[64], log1[64];
    snprintf(path, sizeof path, "%s/log.0", dir);
    mgt_read_into(path, log0, sizeof log0);
    snprintf(path, sizeof path, "%s/log.1", dir);
    mgt_read_into(path, log1, sizeof log1);
    CHECK_MSG(EXITED(&R, 0) && EXITED(&R1, 0) && R.secs < 10 && !strcmp(log0, "0\n1\n") &&
              !strcmp(log1, "0\n1\n") && strstr(R.err, "restarting all 1 worker(s)"),
              "node 0: %d after %.1f s: %s (log %s)\nnode 1: %d: %s (log %s)", R.status, R.secs,
              R.err, log0, R1.status, R1.err, log1);
    /* SIGINT to node 1's mgrun: node 0 stops, and does not restart. */
    snprintf(port, sizeof port, "%d", mgt_free_port());
    const char *wait = "echo $$ > \"$1/pid.$RANK\"; sleep 60";
    t0 = mg_now();
    p0 = start_node("node0", 0, 2, port, wait, "3");
    p1 = start_node("node1", 1, 2, port, wait, "3");
    for (int rank = 0; rank < 2; rank++) {   /* both workers run */
        char b[16] = "";
        snprintf(path, sizeof path, "%s/pid.%d", dir, rank);
        for (; !*b && mg_now() - t0 < 20 * mgt_slow(); usleep(20000))
            mgt_read_into(path, b, sizeof b);
    }
    kill(p1, SIGINT);
    mgr_finish("node0", p0, t0, 30, &R);
    mgr_finish("node1", p1, t0, 30, &R1);
    CHECK_MSG(EXITED(&R, 130) && EXITED(&R1, 130) && R.secs < 15 &&
              strstr(R.err, "mgrun: node 1: its mgrun was stopped by SIGINT; stopped the 1 "
                     "worker(s) here") && !strstr(R.err, "restarting"),
              "node 0: %d after %.1f s: %s\nnode 1: %d: %s", R.status, R.secs, R.err, R1.status,
              R1.err);
}

/* Node 0 keeps the job's store until every node is done: a node whose
 * worker ends after node 0's does not lose its store (and is not stopped
 * for it); a second mgrun of one node rank is refused, and the job stops
 * (every node waited MG_TIMEOUT for a group that could not form). */
TEST_T(mgrun_nodes_end_together_and_refuse_a_second_node_rank, 60)
{
    setenv("MG_JOB_SECRET", "0123456789abcdef-shared", 1);
    setenv("MG_GRACE", "1", 1);
    char port[16], path[700], done[16];
    snprintf(port, sizeof port, "%d", mgt_free_port());
    const char *late = "if [ $RANK = 1 ]; then sleep 2; echo ok > \"$1/done\"; fi";
    double t0 = mg_now();
    pid_t p0 = start_node("node0", 0, 2, port, late, NULL);
    pid_t p1 = start_node("node1", 1, 2, port, late, NULL);
    mgr_finish("node0", p0, t0, 30, &R);
    mgr_finish("node1", p1, t0, 30, &R1);
    snprintf(path, sizeof path, "%s/done", mgt_tmpdir());
    mgt_read_into(path, done, sizeof done);
    CHECK_MSG(EXITED(&R, 0) && EXITED(&R1, 0) && R.secs > 1.5 && !strcmp(done, "ok\n"),
              "node 0: %d after %.1f s: %s\nnode 1: %d: %s", R.status, R.secs, R.err,
              R1.status, R1.err);
    snprintf(port, sizeof port, "%d", mgt_free_port());
    t0 = mg_now();
    p0 = start_node("node0", 0, 3, port, "sleep 60", NULL);
    p1 = start_node("node1", 1, 3, port, "sleep 60", NULL);
    usleep(500000);
    pid_t p2 = start_node("node1b", 1, 3, port, "sleep 60", NULL);
    mgr_finish("node1b", p2, t0, 30, &R2);
    mgr_finish("node0", p0, t0, 30, &R);
    mgr_finish("node1", p1, t0, 30, &R1);
    CHECK_MSG(EXITED(&R2, 1) && strstr(R2.err, "mgrun: another mgrun joined the job as "
                                       "--node-rank 1 first"), "second node 1: %s", R2.err);
    for (int k = 0; k < 2; k++) {
        mgr_result *r = k ? &R1 : &R;
        CHECK_MSG(EXITED(r, 1) && r->secs < 10 &&
                  strstr(r->err, "node 1: a second mgrun was started as --node-rank 1"),
                  "node %d: %d after %.1f s: %s", k, r->status, r->secs, r->err);
    }
}
