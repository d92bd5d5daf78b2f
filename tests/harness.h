/* The multigrad test harness: tests register themselves with TEST(); the
 * runner (tests/main.c) forks each into its own process group with a
 * timeout, so a crash, hang or leaked child in one test cannot take down
 * another. A test fails by calling a CHECK that does not hold (the child
 * exits 1), by crashing, or by running past its timeout. */
#ifndef MG_TEST_HARNESS_H
#define MG_TEST_HARNESS_H

#include <stdbool.h>
#include <sys/types.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/status.h"

typedef void (*mgt_fn)(void);
void mgt_register(const char *name, const char *file, mgt_fn fn, int timeout_s);

#define MGT_REG(name, secs)                                                  \
    static void name(void);                                                  \
    __attribute__((constructor)) static void mgt_reg_##name(void)            \
    { mgt_register(#name, __FILE__, name, secs); }                           \
    static void name(void)

/* TEST(name) { ... }: default timeout 60 s. TEST_T(name, secs) sets it. */
#define TEST(name) MGT_REG(name, 60)
#define TEST_T(name, secs) MGT_REG(name, secs)

void mgt_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

#define CHECK(cond) \
    do { if (!(cond)) mgt_fail(__FILE__, __LINE__, "CHECK(%s)", #cond); } while (0)
#define CHECK_MSG(cond, ...) \
    do { if (!(cond)) mgt_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)
#define CHECK_EQ(a, b)                                                        \
    do { long long mgt_a = (long long)(a), mgt_b = (long long)(b);           \
         if (mgt_a != mgt_b) mgt_fail(__FILE__, __LINE__,                    \
             "CHECK_EQ(%s, %s): %lld != %lld", #a, #b, mgt_a, mgt_b); } while (0)
/* |a-b| <= tol */
#define CHECK_NEAR(a, b, tol)                                                 \
    do { double mgt_a = (double)(a), mgt_b = (double)(b);                    \
         if (!(fabs(mgt_a - mgt_b) <= (tol))) mgt_fail(__FILE__, __LINE__,   \
             "CHECK_NEAR(%s, %s, %g): %.9g vs %.9g", #a, #b, (double)(tol),   \
             mgt_a, mgt_b); } while (0)
/* |a-b| <= rel*max(|a|,|b|) + abs */
#define CHECK_CLOSE(a, b, rel, abs_)                                          \
    do { double mgt_a = (double)(a), mgt_b = (double)(b);                    \
         double mgt_m = fmax(fabs(mgt_a), fabs(mgt_b));                      \
         if (!(fabs(mgt_a - mgt_b) <= (rel) * mgt_m + (abs_)))               \
             mgt_fail(__FILE__, __LINE__, "CHECK_CLOSE(%s, %s): %.9g vs %.9g",\
                      #a, #b, mgt_a, mgt_b); } while (0)
/* The call returns MG_OK; otherwise print mg_last_error(). */
#define CHECK_OK(expr)                                                        \
    do { mg_status mgt_s = (expr);                                           \
         if (mgt_s) mgt_fail(__FILE__, __LINE__, "%s returned %s: %s", #expr, \
                             mg_status_name(mgt_s), mg_last_error()); } while (0)
/* The call fails with the given status. */
#define CHECK_ERR(expr, code)                                                 \
    do { mg_status mgt_s = (expr);                                           \
         if (mgt_s != (code)) mgt_fail(__FILE__, __LINE__,                   \
             "%s returned %s, expected %s (%s)", #expr, mg_status_name(mgt_s),\
             mg_status_name(code), mg_last_error()); } while (0)

/* Skip this test (it is reported as skipped, never as passed), e.g. when
 * an optional peer such as PyTorch is not installed. */
void mgt_skip(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
#define MGT_SKIP_STATUS 77

/* Path of a file shipped in tests/data/. */
const char *mgt_data(const char *name);
/* The Fashion-MNIST directory (MG_DATA or /usr/share/datasets/fashion-mnist),
 * all of it. Under a sanitizer the runner points MG_DATA, which the tools
 * read, at a cut of it (tests/main.c, cut_fashion_for_tools). */
const char *mgt_fashion_dir(void);
/* A fresh empty directory for this test, removed by the runner afterwards. */
const char *mgt_tmpdir(void);
/* Path of a built tool ("mgtrain" -> build/bin/mgtrain), one string per
 * tool for the whole run: several may be held at once. */
const char *mgt_tool(const char *name);

/* Run a shell command (printf-style), stdout and stderr together into
 * *out (malloc'd; may be NULL to discard); returns its exit status, or
 * 128 + N if a signal N killed it. */
int mgt_sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A whole file as a malloc'd string ("" if it cannot be read); *len (may
 * be NULL) gets its size. */
char *mgt_slurp(const char *path, size_t *len);
/* How many times `what` occurs in s, apart ("\n": its lines). */
int mgt_count(const char *s, const char *what);
/* A file into buf (at most cap - 1 bytes, NUL-terminated; "" if it cannot
 * be read). */
void mgt_read_into(const char *path, char *buf, size_t cap);

/* Run a program (argv NULL-terminated; argv[0] a path or a name on PATH)
 * in its own process group, stdout and stderr captured apart; killed and
 * reported as a failure after timeout_s. child_setup (may be NULL) runs in
 * the child before exec. The result is valid until the next call. */
typedef struct mgt_result {
    int status;                       /* as from waitpid */
    char out[1 << 20], err[32768];
} mgt_result;
mgt_result *mgt_exec(double timeout_s, const char *const *argv, void (*child_setup)(void));
/* The same started and not waited for: stdout and stderr into the files
 * out and err, in a process group of its own when own_group; its pid. */
pid_t mgt_spawn(const char *const *argv, const char *out, const char *err, bool own_group,
                void (*child_setup)(void));
/* Exit status, or 128 + N if a signal N killed it. */
int mgt_exit_code(const mgt_result *r);

/* How many times slower this build runs than the plain optimised one: 1,
 * or more under a sanitizer (SAN=thread is the slowest). Deadlines that
 * only guard against a hang are multiplied by it: each test's timeout,
 * mgt_exec's, mgt_fork_ranks' and mgt_wait_for's. A time that a test
 * measures as the product's promise is not. */
double mgt_slow(void);
/* 1 in a sanitizer build (make SAN=...: MG_SANITIZED), else 0. There the
 * longest equivalence tests run a subset of their cases that still takes
 * every code path of the whole set (each schedule, stage, world size and
 * form at least once, fewer repetitions of them), so that the sanitizer
 * suites can run before every landing; the ordinary build runs them all. */
int mgt_sanitized(void);
/* n repetitions (training steps, trials) of a check: n, or a quarter of
 * them (at least 2) in a sanitizer build, which takes the same paths. */
int mgt_reps(int n);
/* Polls cond(arg) every 20 ms until it holds (returns 1) or secs x
 * mgt_slow() have passed (returns 0). */
int mgt_wait_for(int (*cond)(void *arg), void *arg, double secs);

/* A TCP port on 127.0.0.1 that was free a moment ago. */
/* Heap allocations (malloc, calloc, realloc, posix_memalign) of this
 * process so far, every thread (tests/alloc_count.c). */
long mgt_allocs(void);
int mgt_free_port(void);

/* In a forked rank: join a group of n ranks through tcp://127.0.0.1:port
 * (transport: MG_TRANSPORT, or NULL for the default) with a test secret
 * and the given deadline; NULL after printing why on failure. */
/* In a forked rank: set the environment torchrun would (RANK, LOCAL_RANK,
 * WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT). */
void mgt_rank_env(int rank, int n, int port);
struct mg_group;
struct mg_group *mgt_join(int rank, int n, int port, const char *transport, double timeout_s);

/* Fork n processes running fn(rank, n, arg); each child exits with fn's
 * return value (0 = success). Waits for all, at most timeout_s seconds
 * (then kills the rest). Returns the number of ranks that failed; the exit
 * statuses (as from waitpid) go to status[] when it is not NULL. */
int mgt_fork_ranks(int n, int (*fn)(int rank, int n, void *arg), void *arg,
                   double timeout_s, int *status);

#endif
