/* The fork-per-test runner. Each test runs in its own process group, its
 * output captured to a file and shown when it fails (or with -v); tests
 * run N at a time (-j, default 2). Ends with "N passed, N failed" and
 * exits non-zero on any failure.
 *   mgtest [-j N] [-v] [-l] [FILTER...]   (FILTER: substring of name or file) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "harness.h"
#include "idx_files.h"
#include "multigrad/core.h"
#include "multigrad/comm.h"

typedef struct {
    const char *name, *file;
    mgt_fn fn;
    int timeout_s;
} test_case;

static test_case *tests;
static int n_tests, cap_tests;
static char tmpdir_path[256];

void mgt_register(const char *name, const char *file, mgt_fn fn, int timeout_s)
{
    if (n_tests == cap_tests) {
        cap_tests = cap_tests ? 2 * cap_tests : 64;
        tests = realloc(tests, (size_t)cap_tests * sizeof *tests);
        if (!tests) abort();
    }
    tests[n_tests++] = (test_case){name, file, fn, timeout_s};
}

void mgt_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stdout, "%s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fprintf(stdout, "\n");
    fflush(stdout);
    _exit(1);
}

void mgt_skip(const char *fmt, ...)
{
    va_list ap;
    fprintf(stdout, "skipped: ");
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fprintf(stdout, "\n");
    fflush(stdout);
    _exit(MGT_SKIP_STATUS);
}

const char *mgt_data(const char *name)
{
    static _Thread_local char path[512];
    snprintf(path, sizeof path, "%s/%s", mg_env_str("MG_TEST_DATA", "tests/data"), name);
    return path;
}

/* The whole Fashion-MNIST, as MG_DATA named it when the runner started
 * (cut_fashion_for_tools may point MG_DATA elsewhere afterwards). */
static char fashion_dir[4096];

const char *mgt_fashion_dir(void)
{
    if (!fashion_dir[0])
        snprintf(fashion_dir, sizeof fashion_dir, "%s",
                 mg_env_str("MG_DATA", "/usr/share/datasets/fashion-mnist"));
    return fashion_dir;
}

const char *mgt_tmpdir(void)
{
    if (!tmpdir_path[0]) {
        snprintf(tmpdir_path, sizeof tmpdir_path, "/tmp/mgtest.%d.XXXXXX", (int)getpid());
        if (!mkdtemp(tmpdir_path)) mgt_fail(__FILE__, __LINE__, "mkdtemp failed");
    }
    return tmpdir_path;
}

const char *mgt_tool(const char *name)
{
    static _Thread_local struct { char name[64], path[512]; } tool[16];
    int i = 0;
    while (i < 16 && tool[i].name[0] && strcmp(tool[i].name, name)) i++;
    if (i == 16) mgt_fail(__FILE__, __LINE__, "more than 16 tools");
    if (!tool[i].name[0]) {
        snprintf(tool[i].name, sizeof tool[i].name, "%s", name);
        snprintf(tool[i].path, sizeof tool[i].path, "%s/%s", mg_env_str("MG_BIN", "build/bin"),
                 name);
    }
    return tool[i].path;
}

int mgt_sh(char **out, const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n + 6 >= sizeof cmd) mgt_fail(__FILE__, __LINE__, "command too long");
    strcat(cmd, " 2>&1");
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) mgt_fail(__FILE__, __LINE__, "popen: %s", strerror(errno));
    size_t cap = 1 << 16, len = 0, k;
    char *s = malloc(cap);
    while ((k = fread(s + len, 1, cap - len - 1, p)) > 0) {
        len += k;
        if (len + 1 == cap) s = realloc(s, cap *= 2);
    }
    s[len] = 0;
    int st = pclose(p);
    if (out) *out = s;
    else free(s);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int mgt_count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

char *mgt_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *s = NULL;
    long n = 0;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        s = malloc((size_t)n + 1);
        if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    }
    if (f) fclose(f);
    if (!s) { s = malloc(1); n = 0; }
    s[n] = 0;
    if (len) *len = (size_t)n;
    return s;
}

void mgt_read_into(const char *path, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

double mgt_slow(void)
{
#if defined(__SANITIZE_THREAD__)
    return 8;
#elif defined(__SANITIZE_ADDRESS__)
    return 3;
#elif defined(MG_SANITIZED)
    return 2;
#else
    return 1;
#endif
}

int mgt_sanitized(void)
{
#ifdef MG_SANITIZED
    return 1;
#else
    return 0;
#endif
}

int mgt_reps(int n)
{
    return mgt_sanitized() && n > 8 ? n / 4 : mgt_sanitized() && n > 2 ? 2 : n;
}

int mgt_wait_for(int (*cond)(void *), void *arg, double secs)
{
    double deadline = mg_now() + secs * mgt_slow();
    while (!cond(arg)) {
        if (mg_now() > deadline) return 0;
        usleep(20000);
    }
    return 1;
}

pid_t mgt_spawn(const char *const *argv, const char *out, const char *err, bool own_group,
                void (*child_setup)(void))
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) mgt_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0) _exit(126);
        dup2(o, 1);
        dup2(e, 2);
        if (own_group) setpgid(0, 0);
        if (child_setup) child_setup();
        execvp(argv[0], (char *const *)argv);
        _exit(126);
    }
    return pid;
}

mgt_result *mgt_exec(double timeout_s, const char *const *argv, void (*child_setup)(void))
{
    timeout_s *= mgt_slow();
    static mgt_result r;
    char out[600], err[600];
    snprintf(out, sizeof out, "%s/exec.out", mgt_tmpdir());
    snprintf(err, sizeof err, "%s/exec.err", mgt_tmpdir());
    pid_t pid = mgt_spawn(argv, out, err, true, child_setup);
    double t0 = mg_now();
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (mg_now() - t0 > timeout_s) {
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            mgt_read_into(err, r.err, sizeof r.err);
            mgt_fail(__FILE__, __LINE__, "%s still running after %g s; stderr: %s", argv[0],
                     timeout_s, r.err);
        }
        usleep(2000);
    }
    r.status = st;
    mgt_read_into(out, r.out, sizeof r.out);
    mgt_read_into(err, r.err, sizeof r.err);
    return &r;
}

int mgt_exit_code(const mgt_result *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : 128 + WTERMSIG(r->status);
}

/* Ports are drawn at random below the kernel's ephemeral range (32768 and
 * up), where launchers and tools get theirs by binding port 0: a test's
 * port can then be taken between its choice and its use only by another
 * test drawing the same one of 12,000 at the same moment. */
int mgt_free_port(void)
{
    static _Thread_local unsigned seed;
    if (!seed) seed = (unsigned)getpid() ^ (unsigned)(mg_now() * 1e6);
    for (int tries = 0; tries < 1000; tries++) {
        int port = 20000 + (int)(rand_r(&seed) % 12000);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (fd < 0) break;
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) return port;
    }
    mgt_fail(__FILE__, __LINE__, "cannot find a free port: %s", strerror(errno));
}

void mgt_rank_env(int rank, int n, int port)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%d", rank);
    setenv("RANK", buf, 1);
    setenv("LOCAL_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", n);
    setenv("WORLD_SIZE", buf, 1);
    setenv("LOCAL_WORLD_SIZE", buf, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(buf, sizeof buf, "%d", port);
    setenv("MASTER_PORT", buf, 1);
}

struct mg_group *mgt_join(int rank, int n, int port, const char *transport, double timeout_s)
{
    if (transport) setenv("MG_TRANSPORT", transport, 1);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    mg_group_options o = mg_group_options_default();
    o.init_method = url;
    o.rank = rank;
    o.size = n;
    o.secret = "multigrad-test";
    o.timeout_s = timeout_s;
    mg_group *g;
    if (mg_group_init(&o, &g)) {
        printf("rank %d: init failed: %s\n", rank, mg_last_error());
        return NULL;
    }
    return g;
}

int mgt_fork_ranks(int n, int (*fn)(int, int, void *), void *arg,
                   double timeout_s, int *status)
{
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0) mgt_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
        if (pids[r] == 0) {
            int rc = fn(r, n, arg);
            fflush(stdout);
            _exit(rc);
        }
    }
    int failed = 0, left = n;
    double deadline = mg_now() + timeout_s * mgt_slow();
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < n; r++)
                if (pids[r] == p) {
                    pids[r] = 0;
                    left--;
                    if (status) status[r] = st;
                    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
                }
            continue;
        }
        if (mg_now() > deadline) {
            for (int r = 0; r < n; r++)
                if (pids[r]) {
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], status ? &status[r] : NULL, 0);
                    failed++;
                }
            break;
        }
        usleep(2000);
    }
    free(pids);
    return failed;
}

/* ---- runner ------------------------------------------------------------ */

typedef struct {
    int idx;
    pid_t pid;
    double start;
    char out[256];
} running;

static void rm_rf(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) { /* best effort */ }
}

/* Under a sanitizer the tools a test starts (mgtrain, through MG_DATA)
 * train and evaluate on the first MGT_CUT_TRAIN training and MGT_CUT_TEST
 * test images of Fashion-MNIST, written once into cut_dir: every epoch,
 * checkpoint and launch still runs, on a fifth of the images. Tests that
 * load the data set themselves keep the whole of it (mgt_fashion_dir),
 * as PyTorch's reference batches index all 60,000 images. */
#define MGT_CUT_TRAIN 12000
#define MGT_CUT_TEST 2000
static char cut_dir[256];

static void cut_fashion_for_tools(void)
{
    const char *full = mgt_fashion_dir();
    snprintf(cut_dir, sizeof cut_dir, "/tmp/mgtest-data.%d.XXXXXX", (int)getpid());
    if (!mkdtemp(cut_dir)) {
        cut_dir[0] = 0;
        return;
    }
    if (mgt_cut_fashion(full, cut_dir, MGT_CUT_TRAIN, MGT_CUT_TEST) != 0) {
        printf("mgtest: the tools keep the whole of %s\n", full);
        rm_rf(cut_dir);
        cut_dir[0] = 0;
        return;
    }
    setenv("MG_DATA", cut_dir, 1);
    printf("mgtest: sanitizer build: the tools train on the first %d and test on the first "
           "%d images of %s (MG_DATA=%s)\n", MGT_CUT_TRAIN, MGT_CUT_TEST, full, cut_dir);
}

static pid_t launch(int i, running *r)
{
    snprintf(r->out, sizeof r->out, "/tmp/mgtest-out.%d.%d", (int)getpid(), i);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(r->out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setvbuf(stdout, NULL, _IOLBF, 0);
        signal(SIGPIPE, SIG_IGN);
        tests[i].fn();
        fflush(stdout);
        if (tmpdir_path[0]) rm_rf(tmpdir_path);
        _exit(0);
    }
    setpgid(pid, pid);
    r->idx = i;
    r->pid = pid;
    r->start = mg_now();
    return pid;
}

static void show_output(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f) && n++ < 200) printf("    | %s", line);
    fclose(f);
}

static int matches(const test_case *t, int argc, char **argv, int first)
{
    if (first >= argc) return 1;
    for (int a = first; a < argc; a++)
        if (strstr(t->name, argv[a]) || strstr(t->file, argv[a])) return 1;
    return 0;
}

/* Some tests make an allocation fail on purpose (a batch too large to
 * reserve) and expect the library's error: under the sanitizers malloc
 * returns NULL then, as in the ordinary build, instead of aborting. */
#ifdef __SANITIZE_ADDRESS__
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
#endif
#ifdef __SANITIZE_THREAD__
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "allocator_may_return_null=1"; }
#endif

int main(int argc, char **argv)
{
    int jobs = (int)mg_env_long("MG_TEST_JOBS", 2), verbose = 0, list = 0, opt;
    while ((opt = getopt(argc, argv, "j:vlh")) != -1) {
        switch (opt) {
        case 'j': jobs = atoi(optarg); break;
        case 'v': verbose = 1; break;
        case 'l': list = 1; break;
        default:
            printf("usage: mgtest [-j N] [-v] [-l] [FILTER...]\n"
                   "  runs every registered test (or those whose name or file\n"
                   "  contains a FILTER) each in its own process, N at a time.\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    if (jobs < 1) jobs = 1;
    int *sel = calloc((size_t)n_tests + 1, sizeof *sel), n_sel = 0;
    for (int i = 0; i < n_tests; i++)
        if (matches(&tests[i], argc, argv, optind)) sel[n_sel++] = i;
    if (list) {
        for (int k = 0; k < n_sel; k++) printf("%s  (%s)\n", tests[sel[k]].name, tests[sel[k]].file);
        free(sel);
        return 0;
    }
    if (mgt_sanitized()) cut_fashion_for_tools();
    running *run = calloc((size_t)jobs, sizeof *run);
    int next = 0, active = 0, passed = 0, failed = 0, skipped = 0;
    double t0 = mg_now();
    while (next < n_sel || active > 0) {
        while (active < jobs && next < n_sel) {
            for (int s = 0; s < jobs; s++)
                if (run[s].pid == 0) {
                    if (launch(sel[next], &run[s]) < 0) {
                        printf("FAIL %s: fork failed\n", tests[sel[next]].name);
                        failed++;
                    } else {
                        active++;
                    }
                    next++;
                    break;
                }
        }
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p <= 0) {
            double now = mg_now();
            for (int s = 0; s < jobs; s++) {
                if (run[s].pid && now - run[s].start > tests[run[s].idx].timeout_s * mgt_slow()) {
                    kill(-run[s].pid, SIGKILL);
                    waitpid(run[s].pid, &st, 0);
                    test_case *t = &tests[run[s].idx];
                    printf("FAIL %s (%s): timed out after %g s\n", t->name, t->file,
                           t->timeout_s * mgt_slow());
                    show_output(run[s].out);
                    unlink(run[s].out);
                    run[s].pid = 0;
                    active--;
                    failed++;
                }
            }
            usleep(1000);
            continue;
        }
        for (int s = 0; s < jobs; s++) {
            if (run[s].pid != p) continue;
            /* Reap any stray children the test left in its group. */
            kill(-p, SIGKILL);
            test_case *t = &tests[run[s].idx];
            double secs = mg_now() - run[s].start;
            int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
            if (WIFEXITED(st) && WEXITSTATUS(st) == MGT_SKIP_STATUS) {
                skipped++;
                printf("SKIP %s\n", t->name);
                show_output(run[s].out);
            } else if (ok) {
                passed++;
                printf("PASS %s (%.2fs)\n", t->name, secs);
                if (verbose) show_output(run[s].out);
            } else {
                failed++;
                if (WIFSIGNALED(st))
                    printf("FAIL %s (%s): killed by signal %d (%s)\n", t->name, t->file,
                           WTERMSIG(st), strsignal(WTERMSIG(st)));
                else
                    printf("FAIL %s (%s): exit status %d\n", t->name, t->file, WEXITSTATUS(st));
                show_output(run[s].out);
            }
            fflush(stdout);
            unlink(run[s].out);
            run[s].pid = 0;
            active--;
        }
    }
    free(sel);
    free(run);
    free(tests);
    if (cut_dir[0]) rm_rf(cut_dir);
    printf("ran %d tests in %.1f s\n", n_sel, mg_now() - t0);
    if (skipped)
        printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    else
        printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
