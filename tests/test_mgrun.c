/* Tests of the mgrun launcher, with sh -c one-liners as workers: the
 * environment each worker gets (on one node and on two), stopping the job
 * when one worker exits non-zero or is killed (and naming it), forwarding
 * SIGTERM/SIGINT, --tag-output, --max-restarts, and one-line errors for
 * bad input; and a PyTorch program as workers, when PyTorch is installed.
 * Needs build/bin/mgrun (make -j2 all) or MG_BIN. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "mgrun_procs.h"
#include "multigrad/core.h"

static pid_t start(const char *const *args) { return mgr_start("mgrun", args); }

static void finish(pid_t pid, double t0, double timeout, mgr_result *r)
{
    mgr_finish("mgrun", pid, t0, timeout, r);
}

static void run(const char *const *args, mgr_result *r)
{
    double t0 = mg_now();
    finish(start(args), t0, 20, r);
}

/* Reads the pid a worker wrote to DIR/pid.RANK, waiting for it. */
static pid_t worker_pid(int rank)
{
    char path[600], buf[32];
    snprintf(path, sizeof path, "%s/pid.%d", mgt_tmpdir(), rank);
    double t0 = mg_now();
    for (;;) {
        mgt_read_into(path, buf, sizeof buf);
        if (strchr(buf, '\n')) return (pid_t)atoi(buf);
        CHECK_MSG(mg_now() - t0 < 10, "worker %d never started", rank);
        usleep(5000);
    }
}

/* The worker has exited and been reaped (by mgrun, before it exited). */
static bool gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

static mgr_result R;   /* big: not on the stack */

TEST_T(mgrun_worker_env, 30)
{
    unsetenv("MG_JOB_SECRET");
    unsetenv("OMP_NUM_THREADS");
    const char *script =
        "read x && exit 9; "   /* stdin is /dev/null */
        "printf '%s %s %s %s %s %s %s %s %s %s %s %s\\n' \"$RANK\" \"$WORLD_SIZE\" "
        "\"$LOCAL_RANK\" \"$LOCAL_WORLD_SIZE\" \"$GROUP_RANK\" \"$NODE_RANK\" "
        "\"$MG_RESTART_COUNT\" \"$MASTER_ADDR\" \"$MASTER_PORT\" \"$MG_JOB_SECRET\" "
        "\"$OMP_NUM_THREADS\" \"$MG_STORE_PORT\" > \"$1/env.$RANK\"";
    char secret0[2][128] = {{0}};
    for (int run_i = 0; run_i < 2; run_i++) {
        const char *args[] = {"-n", "3", "sh", "-c", script, "sh", mgt_tmpdir(), NULL};
        run(args, &R);
        CHECK_MSG(EXITED(&R, 0), "status %d: %s", R.status, R.err);
        int port0 = -1, store0 = -1;
        for (int r = 0; r < 3; r++) {
            char path[600], buf[512], addr[64], secret[128];
            snprintf(path, sizeof path, "%s/env.%d", mgt_tmpdir(), r);
            mgt_read_into(path, buf, sizeof buf);
            int rank, world, local, lworld, group, node, restart, port, omp, store;
            CHECK_EQ(sscanf(buf, "%d %d %d %d %d %d %d %63s %d %127s %d %d", &rank, &world,
                            &local, &lworld, &group, &node, &restart, addr, &port, secret, &omp,
                            &store), 12);
            CHECK_EQ(rank, r);
            CHECK_EQ(world, 3);
            CHECK_EQ(local, r);
            CHECK_EQ(lworld, 3);
            CHECK_EQ(group, 0);
            CHECK_EQ(node, 0);
            CHECK_EQ(restart, 0);
            CHECK_EQ(omp, 1);
            CHECK(strcmp(addr, "127.0.0.1") == 0);
            CHECK(port > 0 && port < 65536);
            /* mgrun's store has a port of its own: MASTER_PORT is free for
             * a program's own rendezvous (issue 30 item 10). */
            CHECK(store > 0 && store < 65536 && store != port);
            if (r == 0) port0 = port, store0 = store;
            CHECK_EQ(port, port0);
            CHECK_EQ(store, store0);
            /* 32 random bytes in hex, the same for every rank. */
            CHECK_EQ(strlen(secret), 64);
            CHECK(strspn(secret, "0123456789abcdef") == 64);
            if (r == 0) snprintf(secret0[run_i], sizeof secret0[run_i], "%s", secret);
            CHECK(strcmp(secret, secret0[run_i]) == 0);
        }
    }
    /* Each job draws its own secret. */
    CHECK(strcmp(secret0[0], secret0[1]) != 0);
}

static mgr_result R1;

/* A PyTorch program under mgrun (issue 30 item 10): its rank 0 serves
 * PyTorch's store at MASTER_PORT, which must be free (mgrun's store is on
 * a port of its own), on one node and on two. */
TEST_T(mgrun_launches_pytorch, 180)
{
    const char *py = "/usr/bin/python3";
    if (mgt_sh(NULL, "%s -c 'import torch.distributed' 2>/dev/null", py) != 0)
        mgt_skip("%s cannot import torch (apt-get install python3-torch)", py);
    char script[600];
    snprintf(script, sizeof script, "%s/train.py", mgt_tmpdir());
    FILE *f = fopen(script, "w");
    CHECK(f);
    fputs("import os, sys, torch, torch.distributed as dist\n"
          "dist.init_process_group('gloo')\n"
          "r, n = dist.get_rank(), dist.get_world_size()\n"
          "t = torch.tensor([float(r + 1)])\n"
          "dist.all_reduce(t)\n"
          "assert t.item() == n * (n + 1) / 2, t.item()\n"
          "dist.barrier()\n"
          "dist.destroy_process_group()\n"
          "open(os.path.join(sys.argv[1], 'torch.%d' % r), 'w').write(\n"
          "    '%d %d %g %s\\n' % (r, n, t.item(), os.environ['MASTER_PORT']))\n", f);
    fclose(f);
    setenv("MG_JOB_SECRET", "0123456789abcdef-torch", 1);
    const char *args[] = {"-n", "2", py, script, mgt_tmpdir(), NULL};
    for (int nodes = 1; nodes <= 2; nodes++) {
        mgr_result *r[2] = {&R, &R1};
        double t0 = mg_now();
        if (nodes == 1) finish(start(args), t0, 60, &R);
        else mgr_two_nodes(args + 2, mgt_free_port(), r);   /* one worker each */
        for (int node = 0; node < nodes; node++)
            CHECK_MSG(EXITED(r[node], 0), "%d node(s): node %d: status %d: %s", nodes, node,
                      r[node]->status, r[node]->err);
        int port0 = -1;
        for (int rank = 0; rank < 2; rank++) {
            char path[600], buf[64];
            snprintf(path, sizeof path, "%s/torch.%d", mgt_tmpdir(), rank);
            mgt_read_into(path, buf, sizeof buf);
            int rr, port;
            double sum;
            CHECK_MSG(sscanf(buf, "%d 2 %lg %d", &rr, &sum, &port) == 3 && rr == rank &&
                      sum == 3, "%d node(s): rank %d wrote '%s'", nodes, rank, buf);
            if (rank == 0) port0 = port;
            CHECK_EQ(port, port0);
            unlink(path);
        }
        printf("%d node(s): PyTorch's all_reduce on 2 ranks gave 3 (MASTER_PORT %d), %.1f s\n",
               nodes, port0, mg_now() - t0);
    }
}

/* Ranks other than `failing` write their pid and sleep; `failing` waits
 * until they have started, then runs `how`. */
static const char *fail_script(char *buf, size_t cap, int n, int failing, const char *how,
                               const char *others)
{
    /* A rank's pid appears once its own set-up (a trap) is done, so the
     * failing rank never acts before the others are ready. */
    snprintf(buf, cap,
             "%s echo $$ > \"$1/pid.$RANK\"; "
             "if [ $RANK = %d ]; then "
             "  i=0; while [ $i -lt %d ]; do "
             "    while [ ! -s \"$1/pid.$i\" ]; do sleep 0.01; done; i=$((i+1)); done; "
             "  %s; fi; "
             "exec sleep 30",
             others, failing, n, how);
    return buf;
}

TEST_T(mgrun_failure_stops_others, 30)
{
    /* A long grace period: the sleepers must end from SIGTERM alone. */
    setenv("MG_GRACE", "20", 1);
    char script[1024];
    fail_script(script, sizeof script, 3, 1, "exit 3", "");
    const char *args[] = {"-n", "3", "sh", "-c", script, "sh", mgt_tmpdir(), NULL};
    run(args, &R);
    CHECK_MSG(EXITED(&R, 3), "status %d: %s", R.status, R.err);
    CHECK(R.secs < 10);
    char expect[128];
    snprintf(expect, sizeof expect, "mgrun: rank 1 (pid %d) exited with status 3; "
             "stopped the other 2 worker(s)\n", (int)worker_pid(1));
    CHECK_MSG(strcmp(R.err, expect) == 0, "stderr: '%s'", R.err);
    for (int r = 0; r < 3; r++) CHECK(gone(worker_pid(r)));
}

TEST_T(mgrun_killed_worker_named, 30)
{
    /* The others ignore SIGTERM: mgrun must SIGKILL them after the grace. */
    setenv("MG_GRACE", "0.3", 1);
    char script[1024];
    fail_script(script, sizeof script, 2, 0, "kill -9 $$", "trap '' TERM;");
    const char *args[] = {"-n", "2", "sh", "-c", script, "sh", mgt_tmpdir(), NULL};
    run(args, &R);
    CHECK_MSG(EXITED(&R, 128 + SIGKILL), "status %d: %s", R.status, R.err);
    CHECK(R.secs < 10);
    char expect[160];
    snprintf(expect, sizeof expect, "mgrun: rank 0 (pid %d) was killed by signal 9 (SIGKILL); "
             "stopped the other 1 worker(s) (1 with SIGKILL after 0.3 s of SIGTERM)\n",
             (int)worker_pid(0));
    CHECK_MSG(strcmp(R.err, expect) == 0, "stderr: '%s'", R.err);
    CHECK(gone(worker_pid(1)));
}

/* --elastic: a worker killed by a signal does not stop the others (they
 * get MG_ELASTIC=1); mgrun says so at once and at the end, and the job
 * succeeds when the others do. A worker that then exits non-zero still
 * stops the job, and the lost one is named first as its cause. */
TEST_T(mgrun_elastic_goes_on_without_a_killed_worker, 30)
{
    setenv("MG_GRACE", "20", 1);
    for (int then_fails = 0; then_fails < 2; then_fails++) {
        char script[512];
        snprintf(script, sizeof script,
                 "echo $$ > \"$1/pid.$RANK\"; [ \"$MG_ELASTIC\" = 1 ] || exit 5; "
                 "if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 1; "
                 "if [ $RANK = 2 ] && [ %d = 1 ]; then exit 4; fi; sleep 1; exit 0", then_fails);
        const char *args[] = {"--elastic", "-n", "3", "sh", "-c", script, "sh", mgt_tmpdir(),
                              NULL};
        run(args, &R);
        char lost[96], expect[512];
        snprintf(lost, sizeof lost, "rank 1 (pid %d) was killed by signal 9 (SIGKILL)",
                 (int)worker_pid(1));
        if (!then_fails) {
            snprintf(expect, sizeof expect, "mgrun: %s; the other 2 worker(s) go on without it "
                     "(--elastic)\nmgrun: the job went on without the 1 worker(s) it lost "
                     "(--elastic): %s\n", lost, lost);
            CHECK_MSG(EXITED(&R, 0), "status %d: %s", R.status, R.err);
        } else {
            snprintf(expect, sizeof expect, "mgrun: %s; the other 2 worker(s) go on without it "
                     "(--elastic)\nmgrun: %s; then rank 2 (pid %d) exited with status 4; "
                     "stopped the other 1 worker(s)\n", lost, lost, (int)worker_pid(2));
            CHECK_MSG(EXITED(&R, 128 + SIGKILL), "status %d: %s", R.status, R.err);
        }
        CHECK_MSG(strcmp(R.err, expect) == 0, "stderr: '%s'\nexpected '%s'", R.err, expect);
        CHECK(R.secs < 10);
    }
    /* Every worker lost (each told the others went on without it): no
     * worker ended its work, so the job failed (it exited 0). */
    const char *args[] = {"--elastic", "-n", "2", "sh", "-c", "exit 3", NULL};
    run(args, &R);
    CHECK_MSG(EXITED(&R, 3) && strstr(R.err, "mgrun: the job lost every worker (--elastic), "
                                      "none ended its work: rank 0 (pid "), "status %d: %s",
              R.status, R.err);
    /* Every worker killed, one after the other: the last one too is lost,
     * not a failure of its own (a probe found another message than
     * README's). */
    const char *killed[] = {"--elastic", "-n", "2", "sh", "-c", "sleep $RANK; kill -9 $$", NULL};
    run(killed, &R);
    CHECK_MSG(EXITED(&R, 137) && strstr(R.err, "mgrun: the job lost every worker (--elastic), "
                                        "none ended its work: rank 0 (pid "), "status %d: %s",
              R.status, R.err);
}

TEST_T(mgrun_forwards_sigterm_and_sigint, 30)
{
    setenv("MG_GRACE", "20", 1);
    int sigs[2] = {SIGTERM, SIGINT};
    for (int k = 0; k < 2; k++) {
        char dir[600], pidf[700];
        snprintf(dir, sizeof dir, "%s", mgt_tmpdir());
        for (int r = 0; r < 2; r++) {
            snprintf(pidf, sizeof pidf, "%s/pid.%d", dir, r);
            unlink(pidf);
        }
        const char *args[] = {"-n", "2", "sh", "-c", "echo $$ > \"$1/pid.$RANK\"; exec sleep 30",
                              "sh", dir, NULL};
        double t0 = mg_now();
        pid_t pid = start(args);
        pid_t w0 = worker_pid(0), w1 = worker_pid(1);
        kill(pid, sigs[k]);
        finish(pid, t0, 20, &R);
        CHECK_MSG(EXITED(&R, 128 + sigs[k]), "status %d: %s", R.status, R.err);
        CHECK(R.secs < 10);
        CHECK(strstr(R.err, sigs[k] == SIGTERM ? "stopped by SIGTERM" : "stopped by SIGINT"));
        CHECK(gone(w0) && gone(w1));
    }
}

TEST_T(mgrun_tag_output, 30)
{
    const char *script = "echo \"hello $RANK\"; echo \"oops $RANK\" >&2; printf 'no newline'";
    const char *args[] = {"-n", "2", "--tag-output", "sh", "-c", script, NULL};
    run(args, &R);
    CHECK_MSG(EXITED(&R, 0), "status %d: %s", R.status, R.err);
    CHECK(strstr(R.out, "[0]: hello 0\n") && strstr(R.out, "[1]: hello 1\n"));
    CHECK(strstr(R.out, "[0]: no newline\n") && strstr(R.out, "[1]: no newline\n"));
    CHECK_EQ(mgt_count(R.out, "\n"), 4);
    CHECK(strstr(R.err, "[0]: oops 0\n") && strstr(R.err, "[1]: oops 1\n"));
    CHECK_EQ(mgt_count(R.err, "\n"), 2);

    /* A line longer than mgrun's buffer keeps one prefix. */
    const char *args2[] = {"--tag-output", "sh", "-c",
                           "head -c 100000 /dev/zero | tr '\\0' x; echo; echo end", NULL};
    run(args2, &R);
    CHECK(EXITED(&R, 0));
    CHECK_EQ(strlen(R.out), 5 + 100000 + 1 + 9);
    CHECK(strncmp(R.out, "[0]: xxx", 8) == 0);
    CHECK(strspn(R.out + 5, "x") == 100000);
    CHECK(strcmp(R.out + 5 + 100000, "\n[0]: end\n") == 0);

    /* Without the flag, workers write straight to mgrun's output. */
    const char *args3[] = {"-n", "2", "sh", "-c", "echo plain", NULL};
    run(args3, &R);
    CHECK(EXITED(&R, 0));
    CHECK(strcmp(R.out, "plain\nplain\n") == 0);
}

TEST_T(mgrun_max_restarts, 30)
{
    setenv("MG_GRACE", "0.3", 1);
    /* Rank 1 fails on the first attempt only. */
    const char *script = "echo $MG_RESTART_COUNT >> \"$1/log.$RANK\"; "
                         "if [ $MG_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 3; fi";
    char dir[600], path[700], buf[64];
    snprintf(dir, sizeof dir, "%s", mgt_tmpdir());
    const char *args[] = {"-n", "2", "--max-restarts", "1", "sh", "-c", script, "sh", dir, NULL};
    run(args, &R);
    CHECK_MSG(EXITED(&R, 0), "status %d: %s", R.status, R.err);
    CHECK(strstr(R.err, "exited with status 3"));
    CHECK(strstr(R.err, "restarting all 2 worker(s) (restart 1 of 1)"));
    snprintf(path, sizeof path, "%s/log.1", dir);
    mgt_read_into(path, buf, sizeof buf);
    CHECK(strcmp(buf, "0\n1\n") == 0);

    /* Without restarts the failure is final. */
    unlink(path);
    const char *args2[] = {"-n", "2", "sh", "-c", script, "sh", dir, NULL};
    run(args2, &R);
    CHECK(EXITED(&R, 3));
    mgt_read_into(path, buf, sizeof buf);
    CHECK(strcmp(buf, "0\n") == 0);

    /* Always failing: 1 + N attempts, then the failure's status. */
    unlink(path);
    const char *args3[] = {"--max-restarts", "2", "sh", "-c",
                           "echo $MG_RESTART_COUNT >> \"$1/log.$RANK\"; exit 4", "sh", dir, NULL};
    snprintf(path, sizeof path, "%s/log.0", dir);
    unlink(path);
    run(args3, &R);
    CHECK(EXITED(&R, 4));
    CHECK(strstr(R.err, "giving up after 2 restart(s)"));
    mgt_read_into(path, buf, sizeof buf);
    CHECK(strcmp(buf, "0\n1\n2\n") == 0);
}

/* The CPUs a worker may run on, from the line "RANK: CPU...; LOCAL_CPUS"
 * its script prints (in one write, so lines do not interleave). */
static void worker_cpus(const char *out, int rank, cpu_set_t *set)
{
    CPU_ZERO(set);
    char key[16];
    snprintf(key, sizeof key, "%d:", rank);
    const char *p = strstr(out, key);
    CHECK_MSG(p, "no line of rank %d in '%s'", rank, out);
    p += strlen(key);
    while (*p && *p != ';') {
        char *end;
        long c = strtol(p, &end, 10);
        if (end == p) break;
        CPU_SET((int)c, set);
        p = end;
    }
}

TEST_T(mgrun_binds_workers_to_cpus, 30)
{
    cpu_set_t all;
    CHECK(sched_getaffinity(0, sizeof all, &all) == 0);
    int ncpu = CPU_COUNT(&all);
    /* Each worker prints the CPUs it may run on (from /proc) and the
     * node's CPU count mgrun told it. */
    const char *script = "c=$(grep Cpus_allowed_list /proc/self/status | cut -f2 | "
                         "awk -F, '{for (i = 1; i <= NF; i++) { split($i, r, \"-\"); "
                         "hi = r[2] == \"\" ? r[1] : r[2]; for (c = r[1]; c <= hi; c++) "
                         "printf \" %d\", c } }'); echo \"$RANK:$c; ${MG_LOCAL_CPUS:-unset}\"";
    char n[16];
    snprintf(n, sizeof n, "%d", ncpu < 2 ? 1 : 2);
    const char *args[] = {"-n", n, "sh", "-c", script, NULL};
    run(args, &R);
    CHECK_MSG(EXITED(&R, 0), "status %d: %s", R.status, R.err);
    if (ncpu >= 2) {
        /* Default (auto): two workers, each its own half of the CPUs. */
        cpu_set_t a, b, both;
        worker_cpus(R.out, 0, &a);
        worker_cpus(R.out, 1, &b);
        CPU_AND(&both, &a, &b);
        CHECK_MSG(CPU_COUNT(&both) == 0, "workers share CPUs: %s", R.out);
        CHECK_EQ(CPU_COUNT(&a), ncpu / 2);
        CHECK_EQ(CPU_COUNT(&b), ncpu - ncpu / 2);
        CPU_OR(&both, &a, &b);
        CHECK(CPU_EQUAL(&both, &all));
        char want[64];
        snprintf(want, sizeof want, "; %d\n", ncpu);
        CHECK_MSG(strstr(R.out, want), "MG_LOCAL_CPUS not %d: %s", ncpu, R.out);
    }
    /* --bind none, and more workers than CPUs under auto: unbound. */
    char over[16];
    snprintf(over, sizeof over, "%d", ncpu + 1);
    const char *none[] = {"--bind", "none", "-n", "2", "sh", "-c", script, NULL};
    const char *oversub[] = {"-n", over, "sh", "-c", script, NULL};
    const char *const *cases[] = {none, oversub};
    for (int k = 0; k < 2; k++) {
        run(cases[k], &R);
        CHECK_MSG(EXITED(&R, 0), "case %d: status %d: %s", k, R.status, R.err);
        cpu_set_t a;
        worker_cpus(R.out, 1, &a);
        CHECK_MSG(CPU_EQUAL(&a, &all), "case %d: worker 1 bound: %s", k, R.out);
        int unset = 0;
        for (const char *q = R.out; (q = strstr(q, "; unset\n")); q++) unset++;
        CHECK_MSG(unset == (k ? ncpu + 1 : 2), "case %d: MG_LOCAL_CPUS set: %s", k, R.out);
    }
}

TEST_T(mgrun_bad_input, 30)
{
    char marker[600], noexec[600], touch[700];
    snprintf(marker, sizeof marker, "%s/ran", mgt_tmpdir());
    snprintf(noexec, sizeof noexec, "%s/script.sh", mgt_tmpdir());
    snprintf(touch, sizeof touch, "touch '%s'", marker);
    FILE *f = fopen(noexec, "w");
    CHECK(f);
    fputs("#!/bin/sh\ntrue\n", f);
    fclose(f);
    chmod(noexec, 0644);
    char nointerp[600];   /* its #! interpreter missing: execvp's ENOENT named the script */
    snprintf(nointerp, sizeof nointerp, "%s/nointerp.sh", mgt_tmpdir());
    CHECK((f = fopen(nointerp, "w")) != NULL);
    fputs("#! /no/such/interpreter -e\ntrue\n", f);
    fclose(f);
    chmod(nointerp, 0755);
    unsetenv("MG_JOB_SECRET");
    struct { const char *args[12]; const char *says; } cases[] = {
        {{"--bogus", "sh", "-c", touch}, "unknown or ambiguous option '--bogus'"},
        {{"-x", "sh", "-c", touch}, "unknown option '-x'"},
        {{"-n", "0", "sh", "-c", touch},
         "--nproc-per-node 0 is out of range: give an integer from 1 to 4096"},
        {{"-n", "two", "sh", "-c", touch}, "'two' is not an integer"},
        {{"-n"}, "option '-n' needs a value"},
        {{"-n", "2"}, "no program to run"},
        {{"no-such-program-mg"}, "cannot run 'no-such-program-mg': not found in PATH"},
        {{noexec}, "Permission denied"},
        {{nointerp}, "nointerp.sh': its interpreter /no/such/interpreter (its #! line): No such"},
        {{"--nnodes", "2", "--node-rank", "2", "--master-port", "29500", "sh", "-c", touch},
         "--node-rank 2 is out of range for --nnodes 2"},
        {{"--nnodes", "2", "sh", "-c", touch}, "needs --master-port"},
        {{"--nnodes", "2", "--master-port", "29500", "sh", "-c", touch}, "needs MG_JOB_SECRET"},
        {{"--master-port", "70000", "sh", "-c", touch},
         "--master-port 70000 is out of range: give an integer from 1 to 65535"},
        {{"--bind", "socket", "sh", "-c", touch}, "--bind: unknown mode 'socket'"},
        {{"--bind", "core", "-n", "4096", "sh", "-c", touch}, "use fewer workers or --bind none"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run(cases[i].args, &R);
        CHECK_MSG(EXITED(&R, 2), "case %zu: status %d", i, R.status);
        CHECK_MSG(mgt_count(R.err, "\n") == 1 && strncmp(R.err, "mgrun: ", 7) == 0 &&
                  strstr(R.err, cases[i].says), "case %zu: stderr '%s'", i, R.err);
        CHECK_MSG(access(marker, F_OK) != 0, "case %zu: a worker ran", i);
    }
    setenv("MG_JOB_SECRET", "short", 1);
    const char *args[] = {"sh", "-c", touch, NULL};
    run(args, &R);
    CHECK(EXITED(&R, 2) && strstr(R.err, "MG_JOB_SECRET must have 16"));
    const char *help[] = {"--help", NULL};
    run(help, &R);
    CHECK(EXITED(&R, 0) && strncmp(R.out, "usage: mgrun", 12) == 0);
    /* Options after PROGRAM belong to it. */
    unsetenv("MG_JOB_SECRET");
    const char *theirs[] = {"sh", "-c", "echo \"$1\"", "sh", "--help", NULL};
    run(theirs, &R);
    CHECK(EXITED(&R, 0) && strcmp(R.out, "--help\n") == 0);
}

/* A process's state letter from /proc (R, S, T stopped, Z zombie), or 0. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    mgt_read_into(path, buf, sizeof buf);
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

static void wait_state(pid_t pid, char state)
{
    double t0 = mg_now();
    while (proc_state(pid) != state) {
        CHECK_MSG(mg_now() - t0 < 10, "pid %d never reached state %c", (int)pid, state);
        usleep(2000);
    }
}

/* A stopped worker (SIGSTOP, a debugger) is why the others fail (in a job,
 * on their deadline): the summary names it first and the failure after it,
 * and SIGCONT lets it act on the SIGTERM at once, without the grace. */
TEST_T(mgrun_summary_names_stopped_worker_as_cause, 30)
{
    setenv("MG_GRACE", "20", 1);
    const char *script =
        "echo $$ > \"$1/pid.$RANK\"; "
        "if [ $RANK = 1 ]; then kill -STOP $$; fi; "
        "if [ $RANK = 0 ]; then while [ ! -s \"$1/pid.1\" ] || [ ! -s \"$1/pid.2\" ]; do "
        "  sleep 0.01; done; "   /* every worker has started (a loaded machine is slow to) */
        "  while ! grep -q '^State:.*stopped' /proc/$(cat \"$1/pid.1\")/status; do sleep 0.01; "
        "  done; exit 1; fi; "
        "exec sleep 30";
    const char *args[] = {"-n", "3", "sh", "-c", script, "sh", mgt_tmpdir(), NULL};
    run(args, &R);
    CHECK_MSG(EXITED(&R, 1), "status %d: %s", R.status, R.err);
    CHECK_MSG(R.secs < 10, "%.1f s", R.secs);
    char expect[256];
    snprintf(expect, sizeof expect, "mgrun: rank 1 (pid %d) was stopped by signal %d (SIGSTOP); "
             "then rank 0 (pid %d) exited with status 1; stopped the other 2 worker(s)\n",
             (int)worker_pid(1), SIGSTOP, (int)worker_pid(0));
    CHECK_MSG(strcmp(R.err, expect) == 0, "stderr: '%s'", R.err);
    for (int r = 0; r < 3; r++) CHECK(gone(worker_pid(r)));
}

/* A worker killed by a signal is the cause even when mgrun finds another
 * one gone at the same moment (it failed on losing the first): mgrun is
 * stopped while rank 0 kills rank 1 and exits. */
TEST_T(mgrun_summary_names_killed_worker_as_cause, 30)
{
    setenv("MG_GRACE", "20", 1);
    const char *script =
        "echo $$ > \"$1/pid.$RANK\"; "
        "if [ $RANK = 0 ]; then while [ ! -e \"$1/go\" ]; do sleep 0.01; done; "
        "  kill -9 $(cat \"$1/pid.1\"); exit 1; fi; "
        "exec sleep 30";
    const char *args[] = {"-n", "3", "sh", "-c", script, "sh", mgt_tmpdir(), NULL};
    double t0 = mg_now();
    pid_t pid = start(args);
    pid_t w[3];
    for (int r = 0; r < 3; r++) w[r] = worker_pid(r);
    CHECK(kill(pid, SIGSTOP) == 0);
    wait_state(pid, 'T');
    char go[600];
    snprintf(go, sizeof go, "%s/go", mgt_tmpdir());
    close(open(go, O_WRONLY | O_CREAT, 0600));
    wait_state(w[0], 'Z');
    wait_state(w[1], 'Z');
    CHECK(kill(pid, SIGCONT) == 0);
    finish(pid, t0, 20, &R);
    CHECK_MSG(EXITED(&R, 128 + SIGKILL), "status %d: %s", R.status, R.err);
    char expect[256];
    snprintf(expect, sizeof expect, "mgrun: rank 1 (pid %d) was killed by signal 9 (SIGKILL); "
             "then rank 0 (pid %d) exited with status 1; stopped the other 1 worker(s)\n",
             (int)w[1], (int)w[0]);
    CHECK_MSG(strcmp(R.err, expect) == 0, "stderr: '%s'", R.err);
    CHECK(gone(w[2]));
}

/* A --master-port another process holds: one line naming the flag, status
 * 1 (it was two lines, the second a vaguer copy of the first). */
TEST(mgrun_master_port_in_use_is_one_line)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0 &&
          getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    char port[16], says[64];
    snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
    snprintf(says, sizeof says, "on --master-port %s: ", port);
    const char *args[] = {"--master-port", port, "-n", "1", "true", NULL};
    run(args, &R);
    close(fd);
    CHECK_MSG(EXITED(&R, 1) && mgt_count(R.err, "\n") == 1 && strstr(R.err, says) &&
              strstr(R.err, "already in use"), "status %d: '%s'", R.status, R.err);
}
