/* Nothing of a job outlives it in /dev/shm (issue 16 item 4): mgrun jobs
 * of 4 ranks are interrupted early — a worker killed with SIGKILL, mgrun
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

static int read_pids(const char *path, pid_t *pids, int cap)
{
    FILE *f = fopen(path, "r");
    int n = 0, p;
    while (f && n < cap && fscanf(f, "%d", &p) == 1) pids[n++] = p;
    if (f) fclose(f);
    return n;
}

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

/* One job, interrupted `how`: after delay_ms, or (delay_ms < 0) when a
 * segment appears. Returns the segments it left. */
static int trial(int how, int delay_ms, int ino)
{
    char pids_file[600], cmd[2048], mgrun[512], junk[4096];
    snprintf(pids_file, sizeof pids_file, "%s/pids", mgt_tmpdir());
    unlink(pids_file);
    snprintf(mgrun, sizeof mgrun, "%s", mgt_tool("mgrun"));
    int k = snprintf(cmd, sizeof cmd, "exec ");
    if (private_shm)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k, "unshare --mount sh -c 'mount --bind %s "
                      "/dev/shm && exec \"$@\"' sh ", shm_dir);
    snprintf(cmd + k, sizeof cmd - (size_t)k, "%s -n 4 --bind none sh -c 'echo $$ >> %s; exec %s "
             "all_reduce -b 4 -e 64K -i 20 -w 2'", mgrun, pids_file, mgt_tool("mgbench"));
    while (read(ino, junk, sizeof junk) > 0) {} /* earlier events */
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        setenv("MG_GRACE", "2", 1);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* pid is mgrun's: every command before it was exec'd. */
    if (delay_ms >= 0) usleep((useconds_t)delay_ms * 1000);
    else wait_segment(ino, 5 * mgt_slow());
    pid_t pids[16];
    int np = read_pids(pids_file, pids, 16);
    if (how == INTERRUPT_MGRUN) kill(pid, SIGINT);
    else if (how == KILL_MGRUN) kill(pid, SIGKILL);
    else if (np > 0) kill(pids[rand() % np], SIGKILL);
    int st;
    double t0 = mg_now();
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (mg_now() - t0 > 30 * mgt_slow()) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            CHECK_MSG(0, "mgrun still running 30 s after the interruption");
        }
        usleep(5000);
    }
    np = read_pids(pids_file, pids, 16);
    if (how == KILL_MGRUN && private_shm) mgt_wait_for(no_segment, NULL, 2);
    else if (how == KILL_MGRUN) usleep(1000000);   /* other jobs' segments may stay */
    return count_left(pids, np);
}

TEST_T(shm_nothing_left_after_early_interruptions, 240)
{
    choose_shm_dir();
    int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    CHECK(ino >= 0);
    CHECK(inotify_add_watch(ino, shm_dir, IN_CREATE) >= 0);
    srand((unsigned)getpid());
    int left[N_HOW] = {0}, leaky[N_HOW] = {0}, trials = 20;
    for (int how = 0; how < N_HOW; how++)
        for (int t = 0; t < trials; t++) {
            /* Half at a random early moment, half inside the window. */
            int delay = t % 2 ? rand() % 300 : -1;
            int n = trial(how, delay, ino);
            left[how] += n;
            leaky[how] += n > 0;
        }
    close(ino);
    if (private_shm) rmdir(shm_dir);
    printf("segments left: %d by %d of %d jobs with a SIGKILLed worker, %d by %d of %d jobs "
           "whose mgrun got SIGINT, %d by %d of %d jobs whose mgrun was SIGKILLed\n",
           left[KILL_WORKER], leaky[KILL_WORKER], trials, left[INTERRUPT_MGRUN],
           leaky[INTERRUPT_MGRUN], trials, left[KILL_MGRUN], leaky[KILL_MGRUN], trials);
    CHECK_EQ(left[KILL_WORKER], 0);
    CHECK_EQ(left[INTERRUPT_MGRUN], 0);
    CHECK_EQ(left[KILL_MGRUN], 0);
}

/* ---- the workers' own guard, for jobs without mgrun ---------------------------- */

#include "comm/transport/shm.h"

static volatile sig_atomic_t user_handler_ran;
static void user_handler(int sig) { user_handler_ran = sig; }

/* This process's segment of a 2-rank group whose peer never maps it: its
 * name stays until the peer would have, as in a start-up cut short. */
static mg__shm_transport *half_made_group(char *path, size_t n)
{
    bool local[2] = {true, true};
    pid_t pid[2] = {getpid(), getpid()};
    uint64_t start[2] = {0, 0}, gid = ((uint64_t)getpid() << 20) ^ (uint64_t)rand();
    mg__shm_transport_cfg cfg = {.gid = gid, .rank = 0, .size = 2, .local = local,
                                 .all_local = true, .ring_bytes = 4096, .slot_bytes = 4096,
                                 .pid = pid, .start = start, .tag = ""};
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
        mg__shm_transport *x = half_made_group(path, sizeof path);
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
        half_made_group(path, sizeof path);
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
