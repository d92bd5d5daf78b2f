/* Nothing of a job outlives it in /dev/shm (issue 16 item 4): mgrun jobs
 * of 4 ranks (one mgrun, or two mgrun --nnodes 2 on this host: issue 30
 * item 2) are interrupted early — a worker killed with SIGKILL, mgrun
 * given SIGINT, or mgrun killed with SIGKILL — at random moments and at the moment the first
 * shared-memory segment appears (inside the window between a segment's
 * creation and the removal of its name), and no segment of theirs may be
 * left. As root each job gets a /dev/shm of its own, so every segment
 * left is counted; otherwise segments are told apart from those of other
 * jobs on the machine by the creator's pid in their header. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "multigrad/core.h"

/* Where shm.c's segment header keeps its creator's pid: after magic and
 * group id (8 bytes each), rank, size and all_local (4 bytes each). */
#define HDR_PID_OFFSET 28

/* Where the jobs' segments go: as root, a directory of /dev/shm's own
 * that each job sees as /dev/shm (a mount namespace of its own), so that
 * everything in it is the job's; else /dev/shm itself, shared with every
 * other job on the machine. */
static char shm_dir[256] = "/dev/shm";
static bool private_shm;

static void choose_shm_dir(void)
{
    if (geteuid() != 0 || mgt_sh(NULL, "unshare --mount true") != 0) {
        printf("not root, or no unshare: counting only the segments whose header names one of "
               "the job's processes\n");
        return;
    }
    snprintf(shm_dir, sizeof shm_dir, "/dev/shm/mgtest-leak-%d", (int)getpid());
    CHECK(mkdir(shm_dir, 0700) == 0);
    private_shm = true;
}

/* Segments the job left, removed once counted: in a private directory,
 * every one; in /dev/shm, those whose header names one of pids. */
static int count_left(const pid_t *pids, int np)
{
    DIR *d = opendir(shm_dir);
    CHECK(d);
    int left = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "mg-", 3) || e->d_type != DT_REG) continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        int32_t pid = 0;
        (void)!pread(fd, &pid, sizeof pid, HDR_PID_OFFSET);
        close(fd);
        bool ours = private_shm;
        for (int i = 0; i < np; i++) ours = ours || pid == pids[i];
        if (!ours) continue;
        printf("left behind: %s (%s)\n", e->d_name, pid ? "a rank's segment" : "no header yet");
        unlinkat(dirfd(d), e->d_name, 0);
        left++;
    }
    closedir(d);
    return left;
}

/* Until a segment is created in shm_dir, at most timeout_s. */
static void wait_segment(int ino, double timeout_s)
{
    double deadline = mg_now() + timeout_s;
    char buf[4096] __attribute__((aligned(8)));
    while (mg_now() < deadline) {
        struct pollfd p = {.fd = ino, .events = POLLIN};
        if (poll(&p, 1, 10) <= 0) continue;
        ssize_t n = read(ino, buf, sizeof buf);
        for (ssize_t off = 0; off < n;) {
            struct inotify_event *ev = (struct inotify_event *)(buf + off);
            if (ev->len && !strncmp(ev->name, "mg-", 3)) return;
            off += (ssize_t)sizeof *ev + ev->len;
        }
    }
}

enum { KILL_WORKER, INTERRUPT_MGRUN, KILL_MGRUN, N_HOW };

/* mgt_wait_for: no segment named mg-* is left in shm_dir (a killed
 * mgrun's janitor removes them a moment after mgrun is gone). */
static int no_segment(void *unused)
{
    DIR *d = opendir(shm_dir);
    struct dirent *e;
    int any = 0;
    while (d && !any && (e = readdir(d))) any = !strncmp(e->d_name, "mg-", 3);
    if (d) closedir(d);
    return !any;
}

/* A job's processes, from the files its shell and workers write. */
typedef struct {
    int nmgrun, nworker;
    pid_t mgrun[2], worker[16];
    char tag[16][17];          /* each worker's MG_SHM_TAG */
} job_procs;

static void read_procs(job_procs *j)
{
    char path[600];
    *j = (job_procs){0};
    snprintf(path, sizeof path, "%s/mgruns", mgt_tmpdir());
    FILE *f = fopen(path, "r");
    while (f && j->nmgrun < 2 && fscanf(f, "%d", &j->mgrun[j->nmgrun]) == 1) j->nmgrun++;
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/workers", mgt_tmpdir());
    f = fopen(path, "r");
    while (f && j->nworker < 16 &&
           fscanf(f, "%d %16s", &j->worker[j->nworker], j->tag[j->nworker]) == 2)
        j->nworker++;
    if (f) fclose(f);
}

/* Starts a job: `nodes` mgruns of nproc workers each running mgbench:
 * one, or two on this host as on two hosts (--nnodes 2, node ranks 0
 * and 1 meeting at 127.0.0.1), in one mount namespace (with its own
 * /dev/shm as root). A shell starts them, writes their pids to
 * DIR/mgruns and, once they have ended, their exit statuses to
 * DIR/status; each worker writes its pid and MG_SHM_TAG to DIR/workers.
 * Returns the shell's pid. */
static pid_t start_job(int nodes, int nproc)
{
    const char *dir = mgt_tmpdir();
    char driver[600], cmd[2048];
    const char *files[] = {"mgruns", "workers", "status"};
    for (int i = 0; i < 3; i++) {
        snprintf(driver, sizeof driver, "%s/%s", dir, files[i]);
        unlink(driver);
    }
    snprintf(driver, sizeof driver, "%s/job.sh", dir);
    FILE *f = fopen(driver, "w");
    CHECK(f);
    /* env --default-signal: a shell starts background commands with SIGINT
     * ignored, and mgrun must get it as from a terminal. */
    fputs("nodes=$1 nproc=$2 port=$3 dir=$4\n"
          "n=0; while [ $n -lt $nodes ]; do\n"
          "  env --default-signal=INT \"$MGRUN\" --nnodes $nodes --node-rank $n "
          "--master-addr 127.0.0.1 --master-port $port -n $nproc --bind none "
          "sh -c 'echo $$ $MG_SHM_TAG >> \"$1/workers\"; "
          "exec \"$MGBENCH\" all_reduce -b 4 -e 64K -i 20 -w 2' sh \"$dir\" &\n"
          "  echo $! >> \"$dir/mgruns\"; n=$((n + 1))\n"
          "done\n"
          "for p in $(cat \"$dir/mgruns\"); do wait $p; echo $? >> \"$dir/status\"; done\n", f);
    fclose(f);
    const char *mgrun = mgt_tool("mgrun");
    int port = mgt_free_port();
    int k = snprintf(cmd, sizeof cmd, "exec ");
    if (private_shm)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k, "unshare --mount sh -c 'mount --bind %s "
                      "/dev/shm && exec \"$@\"' sh ", shm_dir);
    snprintf(cmd + k, sizeof cmd - (size_t)k, "sh %s %d %d %d %s", driver, nodes, nproc, port,
             dir);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        setenv("MG_GRACE", "2", 1);
        /* A node whose peer node ended before joining waits this long:
         * enough for an mgrun to start, if slower under a sanitizer, where
         * the whole of mgt_slow() made the test wait minutes for nothing. */
        char t[32];
        snprintf(t, sizeof t, "%g", 4 * fmin(mgt_slow(), 2));
        setenv("MG_TIMEOUT", t, 1);
        setenv("MG_JOB_SECRET", "multigrad-test-shm-leak", 1);
        setenv("MGRUN", mgrun, 1);
        setenv("MGBENCH", mgt_tool("mgbench"), 1);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits for the job's shell (every mgrun has ended), at most timeout_s. */
static void wait_job(pid_t pid, double timeout_s)
{
    int st;
    double t0 = mg_now();
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (mg_now() - t0 > timeout_s * mgt_slow()) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            CHECK_MSG(0, "mgrun still running %g s after the interruption", timeout_s);
        }
        usleep(5000);
    }
}

/* One job of `nodes` mgruns of 4 / nodes workers, interrupted `how`:
 * after delay_ms, or (delay_ms < 0) when a segment appears. Returns the
 * segments it left. */
static int trial(int nodes, int how, int delay_ms, int ino)
{
    char junk[4096];
    while (read(ino, junk, sizeof junk) > 0) {} /* earlier events */
    pid_t pid = start_job(nodes, 4 / nodes);
    job_procs j;
    double t0 = mg_now();
    do {   /* the shell has started them all */
        usleep(2000);
        read_procs(&j);
        CHECK_MSG(mg_now() - t0 < 10 * mgt_slow(), "the job's mgruns never started");
    } while (j.nmgrun < nodes);
    if (delay_ms >= 0) usleep((useconds_t)delay_ms * 1000);
    else wait_segment(ino, 5 * mgt_slow());
    read_procs(&j);
    if (how == INTERRUPT_MGRUN) kill(j.mgrun[rand() % nodes], SIGINT);
    else if (how == KILL_MGRUN) kill(j.mgrun[rand() % nodes], SIGKILL);
    else if (j.nworker > 0) kill(j.worker[rand() % j.nworker], SIGKILL);
    /* The other node's workers may wait for the first's at rendezvous
     * until MG_TIMEOUT. */
    wait_job(pid, 30);
    read_procs(&j);
    if (how == KILL_MGRUN && private_shm) mgt_wait_for(no_segment, NULL, 2);
    else if (how == KILL_MGRUN) usleep(1000000);   /* other jobs' segments may stay */
    return count_left(j.worker, j.nworker);
}

/* Jobs of `nodes` mgruns interrupted each way `trials` times, half at a
 * random early moment, half inside the window; none may leave a segment. */
static void interrupted_jobs(int nodes, int trials)
{
    choose_shm_dir();
    int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    CHECK(ino >= 0);
    CHECK(inotify_add_watch(ino, shm_dir, IN_CREATE) >= 0);
    srand((unsigned)getpid());
    int left[N_HOW] = {0}, leaky[N_HOW] = {0};
    for (int how = 0; how < N_HOW; how++)
        for (int t = 0; t < trials; t++) {
            int n = trial(nodes, how, t % 2 ? rand() % 300 : -1, ino);
            left[how] += n;
            leaky[how] += n > 0;
        }
    close(ino);
    if (private_shm) rmdir(shm_dir);
    printf("%d node(s): segments left: %d by %d of %d jobs with a SIGKILLed worker, %d by %d of "
           "%d jobs whose mgrun got SIGINT, %d by %d of %d jobs whose mgrun was SIGKILLed\n",
           nodes, left[KILL_WORKER], leaky[KILL_WORKER], trials, left[INTERRUPT_MGRUN],
           leaky[INTERRUPT_MGRUN], trials, left[KILL_MGRUN], leaky[KILL_MGRUN], trials);
    CHECK_EQ(left[KILL_WORKER], 0);
    CHECK_EQ(left[INTERRUPT_MGRUN], 0);
    CHECK_EQ(left[KILL_MGRUN], 0);
}

TEST_T(shm_nothing_left_after_early_interruptions, 240)
{
    interrupted_jobs(1, 20);
}

/* Two mgrun --nnodes 2 on one host (issue 30 item 2): each draws its own
 * MG_SHM_TAG, and the ranks, seeing one host, must find each other's
 * segments through the tags they tell each other at rendezvous. One worker
 * per node, so that any segment at all means the two nodes' ranks talk
 * through shared memory; the job succeeds and leaves nothing. */
TEST_T(shm_two_mgrun_nodes_on_one_host, 60)
{
    choose_shm_dir();
    int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    CHECK(ino >= 0);
    CHECK(inotify_add_watch(ino, shm_dir, IN_CREATE) >= 0);
    pid_t pid = start_job(2, 1);
    /* Collect the names made while the job runs (the queue holds them). */
    char names[256][64];
    int nnames = 0, st;
    char buf[4096] __attribute__((aligned(8)));
    double t0 = mg_now();
    for (bool done = false; !done;) {
        done = waitpid(pid, &st, WNOHANG) == pid;
        CHECK_MSG(done || mg_now() - t0 < 40 * mgt_slow(), "the job did not end");
        ssize_t n;
        while ((n = read(ino, buf, sizeof buf)) > 0)
            for (ssize_t off = 0; off < n;) {
                struct inotify_event *ev = (struct inotify_event *)(buf + off);
                if (ev->len && !strncmp(ev->name, "mg-", 3) && nnames < 256)
                    snprintf(names[nnames++], sizeof names[0], "%s", ev->name);
                off += (ssize_t)sizeof *ev + ev->len;
            }
        if (!done) usleep(5000);
    }
    close(ino);
    char status[64], path[600];
    snprintf(path, sizeof path, "%s/status", mgt_tmpdir());
    mgt_read_into(path, status, sizeof status);
    CHECK_MSG(strcmp(status, "0\n0\n") == 0, "exit statuses of the two mgruns: '%s'", status);
    job_procs j;
    read_procs(&j);
    CHECK_EQ(j.nworker, 2);
    CHECK_MSG(strcmp(j.tag[0], j.tag[1]) != 0, "both nodes have MG_SHM_TAG %s", j.tag[0]);
    printf("tags %s and %s; %d segment name(s) made, the first %s\n", j.tag[0], j.tag[1], nnames,
           nnames ? names[0] : "-");
    /* Each rank made its segment, named with its own node's tag. */
    for (int w = 0; w < 2; w++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "mg-%s-", j.tag[w]);
        bool seen = false;
        for (int i = 0; i < nnames; i++) seen = seen || !strncmp(names[i], prefix, strlen(prefix));
        CHECK_MSG(seen, "no segment named %s*: the ranks did not use shared memory", prefix);
    }
    CHECK_EQ(count_left(j.worker, j.nworker), 0);
    if (private_shm) rmdir(shm_dir);
}

/* The same clean-up guarantees with two mgrun --nnodes 2 on one host,
 * either of which may be the one interrupted. */
TEST_T(shm_nothing_left_after_interrupting_two_mgrun_nodes, 300)
{
    interrupted_jobs(2, 4);
}

/* ---- the workers' own guard, for jobs without mgrun ---------------------------- */

#include "comm/transport/shm.h"

static volatile sig_atomic_t user_handler_ran;
static void user_handler(int sig) { user_handler_ran = sig; }

/* This process's segment of a 2-rank group whose peer (pid `peer`) never
 * maps it: its name stays until the peer would have, as in a start-up cut
 * short. */
static mg__shm_transport *half_made_group(char *path, size_t n, pid_t peer)
{
    bool local[2] = {true, true};
    pid_t pid[2] = {getpid(), peer};
    uint64_t start[2] = {0, 0}, gid = ((uint64_t)getpid() << 20) ^ (uint64_t)rand();
    mg__shm_transport_cfg cfg = {.gid = gid, .rank = 0, .size = 2, .local = local,
                                 .all_local = true, .ring_bytes = 4096, .slot_bytes = 4096,
                                 .pid = pid, .start = start, .tags = (char[2][MG__SHM_TAG_MAX + 1]){""}};
    mg__shm_transport *x;
    CHECK_OK(mg__shm_transport_create(&cfg, &x));
    snprintf(path, n, "/dev/shm/mg-%016llx-0", (unsigned long long)gid);
    CHECK_MSG(access(path, F_OK) == 0, "%s missing", path);
    return x;
}

/* The program's SIGTERM disposition (SIG_IGN or user_handler) applies
 * during start-up too, and is back afterwards. */
static void interrupt_half_made(void (*disposition)(int))
{
    char path[128];
    fflush(stdout);
    pid_t kid = fork();
    CHECK(kid >= 0);
    if (kid == 0) {
        signal(SIGTERM, disposition);
        mg__shm_transport *x = half_made_group(path, sizeof path, getpid());
        raise(SIGTERM);
        /* Ignored, or handled by the program: it goes on. */
        CHECK(user_handler_ran == (disposition == user_handler ? SIGTERM : 0));
        CHECK((access(path, F_OK) == 0) == (disposition == SIG_IGN));
        mg__shm_transport_destroy(x);
        CHECK(access(path, F_OK) != 0);
        /* The program's disposition is back once no name is pending. */
        struct sigaction now;
        sigaction(SIGTERM, NULL, &now);
        CHECK(now.sa_handler == disposition);
        _exit(0);
    }
    int st;
    waitpid(kid, &st, 0);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
}

TEST(shm_sigterm_during_start_up_removes_names)
{
    srand((unsigned)getpid());
    /* The default action: the process ends, its name with it. */
    char path[128];
    fflush(stdout);
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t kid = fork();
    CHECK(kid >= 0);
    if (kid == 0) {
        signal(SIGTERM, SIG_DFL);
        half_made_group(path, sizeof path, getpid());
        if (write(p[1], path, sizeof path) != (ssize_t)sizeof path) _exit(3);
        raise(SIGTERM);
        _exit(4);
    }
    close(p[1]);
    CHECK(read(p[0], path, sizeof path) == (ssize_t)sizeof path);
    close(p[0]);
    int st;
    waitpid(kid, &st, 0);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "status %d", st);
    CHECK_MSG(access(path, F_OK) != 0, "%s left behind", path);
    interrupt_half_made(user_handler);
    interrupt_half_made(SIG_IGN);
}

/* A peer's segment that is not there (issue 30 item 2: it was the other
 * launcher's tag) is explained by what can cause it on one host, not by
 * containers (ranks in different ones are told apart at rendezvous). */
TEST(shm_missing_peer_segment_explained)
{
    srand((unsigned)getpid());
    fflush(stdout);
    pid_t dead = fork();
    CHECK(dead >= 0);
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    struct { pid_t peer; const char *says; } cases[] = {
        {getpid(), "its name was removed before this rank could map it"},
        {dead, "that rank has died"},
    };
    for (int i = 0; i < 2; i++) {
        char path[128];
        mg__shm_transport *x = half_made_group(path, sizeof path, cases[i].peer);
        CHECK_ERR(mg__shm_transport_attach(x), MG_EIO);
        const char *e = mg_last_error();
        printf("%s\n", e);
        CHECK_MSG(strstr(e, "cannot open the shared memory /mg-") && strstr(e, "of rank 1 (pid ") && strstr(e, cases[i].says) &&
                  !strstr(e, "containers"), "case %d: %s", i, e);
        mg__shm_transport_destroy(x);
        CHECK(access(path, F_OK) != 0);
    }
}

/* A /dev/shm too small for the job (Docker's default is 64 MB): tmpfs
 * sized the segments without a word and the first touch of a page past
 * its room killed every worker with SIGBUS (a probe). Now each segment's
 * pages are reserved when it is made: one line naming /dev/shm and the
 * way out, exit status 2, at once. In a mount namespace of its own, as
 * root; skipped otherwise. */
TEST_T(shm_too_small_dev_shm_is_said_not_sigbus, 120)
{
    if (geteuid() != 0 || mgt_sh(NULL, "unshare --mount true") != 0)
        mgt_skip("needs root and unshare (a /dev/shm of the test's own)");
    const char *sizes[] = {"4m", "12m"};   /* no segment fits; one rank's does */
    for (int i = 0; i < 2; i++) {
        char *out;
        int rc = mgt_sh(&out, "unshare --mount --propagation private sh -c 'mount -t tmpfs -o "
                        "size=%s tmpfs /dev/shm && %s -n 2 %s --model gpt-mini --parallel ddp "
                        "--steps 1 --eval-every 1 --eval-windows 1 --no-eval-on-start'", sizes[i],
                        mgt_tool("mgrun"), mgt_tool("mgtrain"));
        CHECK_MSG(rc == 2 && strstr(out, "/dev/shm has too little room") &&
                  strstr(out, "MG_TRANSPORT=tcp") && !strstr(out, "SIGBUS"), "size=%s: rc %d: %s",
                  sizes[i], rc, out);
        free(out);
    }
}
