/* mgrun — the multigrad launcher, in the manner of torchrun:
 *   mgrun [options] PROGRAM [ARGS...]
 * starts nproc-per-node workers on this node, each with the environment a
 * process group is initialised from (RANK, WORLD_SIZE, LOCAL_RANK, ...,
 * MASTER_ADDR, MASTER_PORT, MG_STORE_PORT, MG_JOB_SECRET), watches them,
 * and when one fails stops the others (SIGTERM to each worker's process
 * group, SIGKILL after MG_GRACE seconds) and reports who failed and how.
 * With --max-restarts N the whole local job is started again up to N
 * times. Unless they outnumber its CPUs, it binds each worker to an equal
 * share of them (--bind), as Open MPI does. The workers' shared-memory
 * segments carry a tag of this mgrun's (MG_SHM_TAG); once they have
 * exited, for whatever reason, mgrun removes any their ranks left (and a
 * janitor child does, should mgrun itself be killed outright). Node 0's
 * mgrun serves the job's rendezvous store and chooses the workers'
 * MASTER_PORT, which the other nodes read from it (mgrun_rdzv.h).
 *
 * With --elastic a worker killed by a signal, or one that exits with
 * MG_EXIT_LEFT (the others took it as lost and went on), is reported and
 * the others go on (MG_ELASTIC=1 tells them to contain its loss).
 * On a job of several nodes the mgruns share a board in node 0's store
 * (mgrun_board.h): a failure or interruption on one node stops the
 * others' workers at once, and --max-restarts restarts every node's.
 * Limits: it is not torchrun's elastic agent (no re-rendezvous, no new
 * workers).
 * One thread: signals arrive through a self-pipe and everything (worker
 * exits, forwarded output, grace deadlines) is handled in one poll loop.
 * Its command line is mgrun_options.h's. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "multigrad/comm.h"
#include "multigrad/core.h"
#include "multigrad/tensor.h"
#include "mgrun_rdzv.h"
#include "mgrun_board.h"
#include "mgrun_output.h"
#include "mgrun_options.h"

typedef struct {
    int rank;
    pid_t pid;                  /* also its process group */
    bool running, root_failure;
    bool lost;                  /* --elastic: killed by a signal, the others went on */
    int stop_sig;               /* it is stopped (SIGSTOP, a debugger): the signal, else 0 */
    int stopped_by;             /* stopped when the first failure came: the signal */
    int status;                 /* as from waitpid */
    stream out[2];
} worker;

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char c = (unsigned char)sig;
    if (write(sig_pipe[1], &c, 1) < 0) { /* pipe full: a wakeup is pending anyway */ }
    errno = saved;
}

static const int handled_signals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};
#define N_HANDLED (int)(sizeof handled_signals / sizeof *handled_signals)

static const char *sig_name(int sig)
{
    const char *s = sigabbrev_np(sig);
    static char buf[24];
    snprintf(buf, sizeof buf, "SIG%s", s ? s : "?");
    return buf;
}

/* n random bytes in hex (hex has room for 2n + 1). */
static int random_hex(char *hex, size_t n)
{
    unsigned char b[32];
    if (n > sizeof b || (RAND_bytes(b, (int)n) != 1 && getrandom(b, n, 0) != (ssize_t)n))
        return -1;
    for (size_t i = 0; i < n; i++) sprintf(hex + 2 * i, "%02x", b[i]);
    return 0;
}

/* ---- workers ------------------------------------------------------------ */

static void set_env_int(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    setenv(name, buf, 1);
}

/* Local worker i of n gets CPUs [i c / n, (i + 1) c / n) of the c that mgrun
 * may use: a share of its own, which exec keeps. */
static void bind_worker(const options *o, int local)
{
    int lo = (int)((long)local * o->ncpus / o->nproc);
    int hi = (int)((long)(local + 1) * o->ncpus / o->nproc);
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu = 0, k = 0; cpu < CPU_SETSIZE && k < hi; cpu++) {
        if (!CPU_ISSET(cpu, &o->cpus)) continue;
        if (k++ >= lo) CPU_SET(cpu, &set);
    }
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "mgrun: warning: cannot bind local rank %d to its CPUs: %s; it "
                "runs unbound\n", local, strerror(errno));
}

/* In the child between fork and exec (mgrun has one thread, so setenv and
 * stdio are safe here). */
static void __attribute__((noreturn))
exec_worker(const options *o, int local, int attempt, pid_t parent,
            const int out_pipe[2], const int err_pipe[2])
{
    setpgid(0, 0);
    /* A launcher killed outright (SIGKILL) takes its workers with it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    for (int i = 0; i < N_HANDLED; i++) signal(handled_signals[i], SIG_DFL);
    signal(SIGPIPE, SIG_DFL);   /* mgrun ignores it; an ignored signal survives exec */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    int null = open("/dev/null", O_RDONLY);
    if (null >= 0 && null != 0) {
        dup2(null, 0);
        close(null);
    }
    if (o->tag_output) {
        dup2(out_pipe[1], 1);
        dup2(err_pipe[1], 2);
    }
    long world = (long)o->nproc * o->nnodes;
    set_env_int("RANK", (long)o->node_rank * o->nproc + local);
    set_env_int("WORLD_SIZE", world);
    set_env_int("LOCAL_RANK", local);
    set_env_int("LOCAL_WORLD_SIZE", o->nproc);
    set_env_int("GROUP_RANK", o->node_rank);
    set_env_int("NODE_RANK", o->node_rank);
    set_env_int("GROUP_WORLD_SIZE", o->nnodes);
    setenv("MASTER_ADDR", o->master_addr, 1);
    /* Node 0's mgrun serves the store; MASTER_PORT is the workers' own
     * (mgrun_rdzv.h). Each attempt rendezvouses under keys of its own. */
    set_env_int("MG_STORE_PORT", o->master_port);
    set_env_int("MASTER_PORT", o->worker_port);
    setenv("MG_JOB_SECRET", o->secret, 1);
    set_env_int("MG_RESTART_COUNT", attempt);
    setenv("MG_SHM_TAG", o->shm_tag, 1);
    set_env_int("MG_RUN_ID", attempt);
    if (o->elastic) setenv("MG_ELASTIC", "1", 1);
    else unsetenv("MG_ELASTIC");
    if (o->bind == BIND_CORE) {
        bind_worker(o, local);
        /* Bound, a worker sees only its own CPUs; the node has these. */
        set_env_int("MG_LOCAL_CPUS", o->ncpus);
    }
    if (o->nproc > 1) {
        /* Ranks, not threads, use the cores (as torchrun does for OMP). */
        setenv("OMP_NUM_THREADS", "1", 0);
        setenv("OPENBLAS_NUM_THREADS", "1", 0);
    }
    execvp(o->prog[0], o->prog);
    fprintf(stderr, "mgrun: cannot run '%s': %s\n", o->prog[0], strerror(errno));
    _exit(127);
}

/* Starts one worker; -1 (with a message) if it could not be started. */
static int spawn(const options *o, worker *w, int local, int attempt)
{
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    char *bufs[2] = {NULL, NULL};
    w->out[0].fd = w->out[1].fd = -1;
    if (o->tag_output) {
        bufs[0] = malloc(LINE_CAP);
        bufs[1] = malloc(LINE_CAP);
        if (!bufs[0] || !bufs[1] || pipe2(out_pipe, O_CLOEXEC) || pipe2(err_pipe, O_CLOEXEC)) {
            fprintf(stderr, "mgrun: cannot start rank %d: %s\n", w->rank,
                    bufs[1] ? strerror(errno) : "out of memory");
            for (int k = 0; k < 2; k++) {
                if (out_pipe[k] >= 0) close(out_pipe[k]);
                if (err_pipe[k] >= 0) close(err_pipe[k]);
                free(bufs[k]);
            }
            return -1;
        }
    }
    /* Signals stay blocked across fork so that none runs mgrun's handler
     * in the child before it has restored the defaults. */
    sigset_t block, old;
    sigemptyset(&block);
    for (int i = 0; i < N_HANDLED; i++) sigaddset(&block, handled_signals[i]);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) exec_worker(o, local, attempt, parent, out_pipe, err_pipe);
    int fork_errno = errno;
    if (pid > 0) setpgid(pid, pid);   /* also done by the child: whichever runs first */
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (o->tag_output) {
        close(out_pipe[1]);
        close(err_pipe[1]);
    }
    if (pid < 0) {
        fprintf(stderr, "mgrun: cannot start rank %d: fork: %s\n", w->rank, strerror(fork_errno));
        if (o->tag_output) {
            close(out_pipe[0]);
            close(err_pipe[0]);
        }
        free(bufs[0]);
        free(bufs[1]);
        return -1;
    }
    w->pid = pid;
    w->running = true;
    if (o->tag_output) {
        int fds[2] = {out_pipe[0], err_pipe[0]};
        for (int k = 0; k < 2; k++) {
            fcntl(fds[k], F_SETFL, O_NONBLOCK);
            w->out[k] = (stream){.fd = fds[k], .out_fd = k + 1, .rank = w->rank, .buf = bufs[k]};
        }
    }
    return 0;
}

static bool succeeded(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }

static int exit_code(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Why the job failed, rather than a consequence of it (a worker lost
 * under --elastic, when the others then failed, is one). */
static bool is_cause(const worker *w)
{
    return w->stopped_by || w->lost || (w->root_failure && WIFSIGNALED(w->status));
}

static void describe(char *buf, size_t cap, const worker *w)
{
    if (w->stopped_by)
        snprintf(buf, cap, "rank %d (pid %d) was stopped by signal %d (%s)", w->rank,
                 (int)w->pid, w->stopped_by, sig_name(w->stopped_by));
    else if (WIFEXITED(w->status) && w->lost)
        snprintf(buf, cap, "rank %d (pid %d) left the job (exit status %d: the others took it "
                 "as lost and went on)", w->rank, (int)w->pid, WEXITSTATUS(w->status));
    else if (WIFEXITED(w->status))
        snprintf(buf, cap, "rank %d (pid %d) exited with status %d", w->rank,
                 (int)w->pid, WEXITSTATUS(w->status));
    else
        snprintf(buf, cap, "rank %d (pid %d) was killed by signal %d (%s)%s", w->rank,
                 (int)w->pid, WTERMSIG(w->status), sig_name(WTERMSIG(w->status)),
                 WCOREDUMP(w->status) ? ", core dumped" : "");
}

/* ---- one attempt -------------------------------------------------------- */

typedef struct {
    int nw;
    worker *w;
    int running;
    bool stopping, killed;
    int stop_sig;               /* the signal the stop sent */
    double deadline;            /* SIGKILL then, while stopping */
    int stopped;                /* workers still running when the stop began */
    int interrupted;            /* the signal that stopped mgrun, or 0 */
    int n_root;                 /* failures that started the stop */
    int first_root;             /* index of the first one */
    int n_killed;               /* workers that needed SIGKILL */
    int nodes;                  /* the job's (--nnodes) */
} job;

static void signal_all(job *j, int sig)
{
    for (int i = 0; i < j->nw; i++)
        if (j->w[i].running && kill(-j->w[i].pid, sig) != 0 && errno == ESRCH)
            kill(j->w[i].pid, sig);   /* not yet its own group leader */
}

static void begin_stop(job *j, int sig, double grace)
{
    j->stopped = j->running;
    j->stopping = true;
    j->stop_sig = sig;
    j->deadline = mg_now() + grace;
    signal_all(j, sig);
    /* A stopped worker acts on the signal only once it runs again. */
    for (int i = 0; i < j->nw; i++)
        if (j->w[i].running && j->w[i].stop_sig) kill(-j->w[i].pid, SIGCONT);
}

static void reap(job *j, double grace, bool elastic)
{
    int st;
    pid_t pid;
    bool new_failure = false;
    while ((pid = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED)) > 0) {
        for (int i = 0; i < j->nw; i++) {
            worker *w = &j->w[i];
            if (!w->running || w->pid != pid) continue;
            if (WIFSTOPPED(st) || WIFCONTINUED(st)) {
                w->stop_sig = WIFSTOPPED(st) ? WSTOPSIG(st) : 0;
                continue;
            }
            w->running = false;
            w->status = st;
            j->running--;
            /* Lost: killed while others run or after others were lost (the
             * last of a job that lost every worker), or told that the others
             * went on without it (whenever it ends). */
            bool left = WIFEXITED(st) && WEXITSTATUS(st) == MG_EXIT_LEFT, lost_before = false;
            for (int k = 0; k < j->nw; k++) lost_before |= j->w[k].lost;
            if (elastic && !j->stopping &&
                ((WIFSIGNALED(st) && (j->running > 0 || lost_before)) || left)) {
                w->lost = true;
                char d[160];
                describe(d, sizeof d, w);
                if (j->running > 0)
                    fprintf(stderr, "mgrun: %s; the other %d worker(s)%s go on without it "
                            "(--elastic)\n", d, j->running, j->nodes > 1 ? " of this node" : "");
                else
                    fprintf(stderr, "mgrun: %s, after the others ended (--elastic)\n", d);
                continue;
            }
            /* Killed during the stop by another signal than the stop's
             * (before mgrun's own SIGKILL): it died of something else,
             * a moment before the failure mgrun reaped first (a killed
             * worker's peer can see its links close before mgrun sees
             * its death), so it is a cause too. */
            bool killed_meanwhile = j->stopping && !j->killed && !j->interrupted &&
                                    WIFSIGNALED(st) && WTERMSIG(st) != j->stop_sig;
            if (!succeeded(st) && (!j->stopping || killed_meanwhile)) {
                w->root_failure = true;
                if (j->n_root++ == 0) j->first_root = i;
                if (killed_meanwhile) j->stopped--;
                else new_failure = true;
            }
        }
    }
    if (!new_failure) return;
    /* A worker stopped when the others fail is why they fail (their
     * collectives wait for it until their deadline). */
    for (int i = 0; i < j->nw; i++) j->w[i].stopped_by = j->w[i].running ? j->w[i].stop_sig : 0;
    begin_stop(j, SIGTERM, grace);
}

static void on_user_signal(job *j, int sig, double grace)
{
    if (j->interrupted) {
        fprintf(stderr, "mgrun: %s again; killing the workers\n", sig_name(sig));
        j->n_killed = j->running;
        signal_all(j, SIGKILL);
        j->killed = true;
        return;
    }
    j->interrupted = sig;
    if (j->stopping) {
        signal_all(j, sig);
        return;
    }
    begin_stop(j, sig, grace);
}

/* Runs the workers until all have exited; returns mgrun's exit status.
 * *may_restart: the job failed on its own (not interrupted, not mgrun's
 * own trouble), so --max-restarts applies. On a job of several nodes it
 * reads the board meanwhile, stopping the workers on another node's
 * failure, and posts its own (mgrun_board.h). */
static int run_attempt(const options *o, int attempt, bool *may_restart, board *b)
{
    *may_restart = false;
    size_t nfd = 1 + 2 * (size_t)o->nproc;
    job j = {.nw = o->nproc, .nodes = o->nnodes};
    j.w = calloc((size_t)o->nproc, sizeof *j.w);
    struct pollfd *pfd = calloc(nfd, sizeof *pfd);
    stream **ps = calloc(nfd, sizeof *ps);
    if (!j.w || !pfd || !ps) {
        fprintf(stderr, "mgrun: out of memory\n");
        free(j.w);
        free(pfd);
        free(ps);
        return 1;
    }
    int rc = 0;
    board_post_t elsewhere;
    bool stopped_from_elsewhere = false, posted = false;
    for (int i = 0; i < o->nproc; i++) {
        j.w[i].rank = o->node_rank * o->nproc + i;
        if (spawn(o, &j.w[i], i, attempt) != 0) {
            rc = 1;
            begin_stop(&j, SIGTERM, o->grace);
            break;
        }
        j.running++;
    }
    mg_debug("mgrun attempt %d: %d worker(s), ranks %d..%d of %d, store %s:%d, MASTER_PORT %d",
             attempt, o->nproc, o->node_rank * o->nproc, (o->node_rank + 1) * o->nproc - 1,
             o->nproc * o->nnodes, o->master_addr, o->master_port, o->worker_port);

    while (j.running > 0) {
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        for (int i = 0; i < j.nw; i++)
            for (int k = 0; k < 2; k++)
                if (j.w[i].out[k].fd >= 0) {
                    ps[np] = &j.w[i].out[k];
                    pfd[np++] = (struct pollfd){.fd = j.w[i].out[k].fd, .events = POLLIN};
                }
        int timeout = -1;
        if (j.stopping && !j.killed) {
            double left = j.deadline - mg_now();
            timeout = left <= 0 ? 0 : (int)(left * 1000) + 1;
        } else if (b->on) {   /* the board's next read */
            double left = b->checked + BOARD_POLL_S - mg_now();
            timeout = left <= 0 ? 0 : (int)(left * 1000) + 1;
        }
        int n = poll(pfd, (nfds_t)np, timeout);
        if (n < 0 && errno != EINTR) {
            /* Cannot watch the workers any more: end the job rather than hang. */
            fprintf(stderr, "mgrun: poll: %s; killing the workers\n", strerror(errno));
            signal_all(&j, SIGKILL);
            j.killed = true;
            rc = 1;
        }
        if (n > 0 && (pfd[0].revents & POLLIN)) {
            unsigned char sigs[64];
            ssize_t r;
            while ((r = read(sig_pipe[0], sigs, sizeof sigs)) > 0)
                for (ssize_t k = 0; k < r; k++)
                    if (sigs[k] != SIGCHLD) on_user_signal(&j, sigs[k], o->grace);
        }
        for (int k = 1; n > 0 && k < np; k++)
            if (pfd[k].revents && !pump(ps[k], 4)) close_stream(ps[k]);
        reap(&j, o->grace, o->elastic);
        if (b->on && !j.stopping && j.running > 0 && mg_now() >= b->checked + BOARD_POLL_S &&
            board_read(b, attempt, &elsewhere)) {
            stopped_from_elsewhere = true;
            for (int i = 0; i < j.nw; i++)   /* a stopped one is the likely cause */
                j.w[i].stopped_by = j.w[i].running ? j.w[i].stop_sig : 0;
            begin_stop(&j, SIGTERM, o->grace);
        }
        if (b->on && !posted && !stopped_from_elsewhere && (j.n_root || j.interrupted)) {
            /* this node's failure or interruption, at once, for the others (a
             * restart then follows each node's policy; an interruption stops
             * every node) */
            char d[160];
            const worker *w = &j.w[j.first_root];
            if (j.interrupted) snprintf(d, sizeof d, "its mgrun was stopped by %s",
                                        sig_name(j.interrupted));
            else describe(d, sizeof d, w);
            board_post(b, attempt, j.interrupted ? 128 + j.interrupted : exit_code(w->status),
                       j.interrupted != 0, d);
            posted = true;
        }
        if (j.stopping && !j.killed && j.running > 0 && mg_now() >= j.deadline) {
            j.n_killed = j.running;
            signal_all(&j, SIGKILL);
            j.killed = true;
        }
    }
    /* Everything a worker wrote before it exited is in its pipe now; a
     * child it left behind may hold the pipe open (and keep writing), so
     * read what is there, without waiting for EOF. */
    for (int i = 0; i < j.nw; i++)
        for (int k = 0; k < 2; k++)
            if (j.w[i].out[k].fd >= 0) {
                stream *s = &j.w[i].out[k];
                if (pump(s, 4096) && (s->len > 0 || s->mid_line)) {
                    emit(s, s->buf, s->len, true);
                    out_flush(s->out_fd);
                }
                close_stream(s);
            }

    char *msg = NULL;
    size_t msg_len = 0;
    FILE *m = open_memstream(&msg, &msg_len);
    if (m && j.n_root > 0) {
        /* The cause first: a worker killed by a signal, or stopped, when the
         * others failed; then those that failed after it (their timeouts and
         * lost peers follow from it). Without one, the failures in order. */
        bool any_cause = false;
        int code_from = j.first_root;
        for (int i = 0; i < j.nw; i++) any_cause |= is_cause(&j.w[i]);
        fprintf(m, "mgrun: ");
        for (int i = 0, k = 0; i < j.nw; i++) {
            const worker *w = &j.w[i];
            if (any_cause ? !is_cause(w) : !w->root_failure) continue;
            char d[160];
            describe(d, sizeof d, w);
            fprintf(m, "%s%s", k++ ? ", " : "", d);
            if (k == 1 && (w->root_failure || w->lost)) code_from = i;
        }
        for (int i = 0, k = 0; any_cause && i < j.nw; i++) {
            if (!j.w[i].root_failure || is_cause(&j.w[i])) continue;
            char d[160];
            describe(d, sizeof d, &j.w[i]);
            fprintf(m, "%s%s", k++ ? ", " : "; then ", d);
        }
        if (j.stopped > 0)
            fprintf(m, "; stopped the other %d worker(s)", j.stopped);
        else if (j.nw > 1)
            fprintf(m, "; no other worker was running");
        if (j.n_killed > 0 && !j.interrupted)
            fprintf(m, " (%d with SIGKILL after %g s of SIGTERM)", j.n_killed, o->grace);
        fprintf(m, "\n");
        rc = exit_code(j.w[code_from].status);
        *may_restart = rc != 0 && !j.interrupted;
    }
    int n_lost = 0, first_lost = -1;
    for (int i = 0; i < j.nw; i++)
        if (j.w[i].lost && n_lost++ == 0) first_lost = i;
    bool none_left = n_lost == j.nw;   /* no worker ended its work: the job failed */
    if (m && n_lost && !j.n_root && !j.interrupted) {
        if (none_left)
            fprintf(m, "mgrun: the job lost every worker (--elastic), none ended its work:");
        else
            fprintf(m, "mgrun: the job went on without the %d worker(s) it lost (--elastic):",
                    n_lost);
        for (int i = 0, k = 0; i < j.nw; i++) {
            if (!j.w[i].lost) continue;
            char d[160];
            describe(d, sizeof d, &j.w[i]);
            fprintf(m, "%s %s", k++ ? "," : "", d);
        }
        fprintf(m, "\n");
        if (none_left) {
            rc = exit_code(j.w[first_lost].status);
            *may_restart = true;
        }
    }
    if (m && j.interrupted) {
        fprintf(m, "mgrun: stopped by %s; forwarded it to %d running worker(s)",
                sig_name(j.interrupted), j.stopped);
        if (j.n_killed) fprintf(m, "; killed %d", j.n_killed);
        fprintf(m, "\n");
        rc = 128 + j.interrupted;
    }
    if (m && stopped_from_elsewhere && !j.interrupted) {
        fprintf(m, "mgrun: %s; stopped the %d worker(s) here", elsewhere.why, j.stopped);
        for (int i = 0; i < j.nw; i++) {
            char d[160];
            if (!j.w[i].stopped_by) continue;
            describe(d, sizeof d, &j.w[i]);
            fprintf(m, ", of which %s", d);
        }
        fprintf(m, "\n");
        if (!j.n_root) {
            rc = elsewhere.rc ? elsewhere.rc : 1;
            *may_restart = !elsewhere.fatal;
        }
    }
    if (m) fclose(m);
    if (msg_len) write_out(2, msg, msg_len);
    free(msg);
    free(j.w);
    free(pfd);
    free(ps);
    return rc;
}

/* A signal other than SIGCHLD came (SIGINT, SIGTERM, SIGHUP to mgrun). */
static bool signalled(void)
{
    unsigned char sigs[64];
    ssize_t r;
    bool any = false;
    while ((r = read(sig_pipe[0], sigs, sizeof sigs)) > 0)
        for (ssize_t k = 0; k < r; k++) any |= sigs[k] != SIGCHLD;
    return any;
}

/* A janitor for a launcher killed outright (SIGKILL): a child in a session
 * of its own that waits for EOF on a pipe only mgrun writes to (the kernel
 * closes it however mgrun ends), then removes the job's shared-memory
 * names, those its workers (killed by their parent-death signal) were
 * creating. A second pass covers a worker the signal reaches a moment
 * after the pipe closes. Best effort: without it, mgrun's own clean-up
 * still runs whenever mgrun lives to see its workers end. */
static void start_janitor(const char *tag)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[1]);
        setsid();
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++) dup2(null, fd);
        char c;
        while (read(fds[0], &c, 1) < 0 && errno == EINTR) {}
        for (int pass = 0; pass < 2; pass++) {
            mg_shm_remove_tagged(tag);
            usleep(200000);
        }
        _exit(0);
    }
    close(fds[0]);   /* fds[1] stays open in mgrun alone (close-on-exec) */
}

int main(int argc, char **argv)
{
    options o;
    parse_args(argc, argv, &o);
    /* The secret: every connection of the job proves it knows it. */
    if ((!o.secret[0] && random_hex(o.secret, 32) != 0) || random_hex(o.shm_tag, 8) != 0) {
        fprintf(stderr, "mgrun: cannot draw random bytes (job secret, shared-memory tag): %s\n",
                strerror(errno));
        return 1;
    }
    start_janitor(o.shm_tag);
    signal(SIGPIPE, SIG_IGN);
    /* Before mgrun handles signals: until its workers run, one ends it. */
    pid_t store = 0;
    char shape[64];
    snprintf(shape, sizeof shape, "-n %d --nnodes %d", o.nproc, o.nnodes);
    if (o.node_rank == 0 && o.nnodes > 1 && !rdzv_is_local(o.master_addr))
        fprintf(stderr, "mgrun: warning: --master-addr %s is not an address of this host, but "
                "node 0 serves the job's store there: the other nodes and this node's workers "
                "reach it only if %s leads here (give node 0's own address)\n", o.master_addr,
                o.master_addr);
    if (o.node_rank == 0 &&
        (store = rdzv_serve(o.master_addr, o.master_port, o.secret, shape, &o.master_port,
                            &o.worker_port)) < 0) {
        return 1;   /* its process said why */
    }
    char url[300], refused[200];
    rdzv_url(url, sizeof url, o.node_rank == 0 && !rdzv_loopback(o.master_addr) ? "127.0.0.1"
                                                                               : o.master_addr,
             o.master_port);
    board b = {0};
    if (o.node_rank > 0 &&
        (o.worker_port = rdzv_worker_port(o.node_rank, o.master_addr, o.master_port,
                                          o.secret, shape, refused, sizeof refused)) < 0) {
        if (*refused && board_open(&b, url, o.secret, o.node_rank, o.nnodes, o.shm_tag)) {
            board_post(&b, 0, 1, true, refused);
            board_done(&b, 0);
            board_close(&b);
        }
        return 1;
    }
    if (o.nnodes > 1 && (!board_open(&b, url, o.secret, o.node_rank, o.nnodes, o.shm_tag) ||
                         !board_join(&b))) {
        board_close(&b);
        if (store > 0) kill(store, SIGKILL), waitpid(store, NULL, 0);
        return 1;
    }
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        fprintf(stderr, "mgrun: pipe: %s\n", strerror(errno));
        return 1;
    }
    /* SIGCHLD also when a worker is stopped or continued (reap notes it). */
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_HANDLED; i++) sigaction(handled_signals[i], &sa, NULL);
    int rc, attempt;
    for (attempt = 0;; attempt++) {
        bool may_restart;
        rc = run_attempt(&o, attempt, &may_restart, &b);
        board_done(&b, attempt);
        int left = mg_shm_remove_tagged(o.shm_tag);
        if (left)
            mg_debug("mgrun: removed %d shared-memory segment name(s) the workers left", left);
        if (rc == 0 || !may_restart) break;
        if (attempt >= o.max_restarts) {
            if (o.max_restarts > 0)
                fprintf(stderr, "mgrun: giving up after %d restart(s)\n", o.max_restarts);
            break;
        }
        fprintf(stderr, "mgrun: restarting all %d worker(s) (restart %d of %d)\n",
                o.nproc, attempt + 1, o.max_restarts);
    }
    if (store > 0) {   /* the store stays until every node is done (mgrun_board.h) */
        double wait = rc ? 4 * BOARD_POLL_S : mg_env_double("MG_TIMEOUT", 300);
        rc = board_wait_done(&b, attempt, rc, wait, signalled);
        kill(store, SIGKILL);
        waitpid(store, NULL, 0);
    }
    board_close(&b);
    return rc;
}
