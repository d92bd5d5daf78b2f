/* An LD_PRELOAD library for tests/test_kernels.c, compiled by the tests
 * (not part of the build): two faults of OpenBLAS's core selection, made
 * certain in a child process.
 *
 * A late worker (always): the pthread OpenBLAS starts its worker threads
 * when it loads, and each takes a buffer (blas_memory_alloc) as it starts;
 * the first buffer taken in the process finishes OpenBLAS's memory set-up,
 * which runs OpenBLAS's own core selection when no core is set. A worker
 * that starts late, while the program has the core switched off to
 * re-select it (gotoblas_dynamic_quit, then gotoblas_dynamic_init), selects
 * the core OpenBLAS would. Here each worker's first buffer waits until the
 * program first switches the core off; that call then lets the workers
 * take their buffers and waits for them before it returns, and prints one
 * line to stderr: how many workers took their first buffer inside the
 * switch (0: OpenBLAS started none, e.g. on one CPU or with
 * OPENBLAS_NUM_THREADS=1) and how many of them ran OpenBLAS's core
 * selection (gotoblas_dynamic_init with no core set): the fault, which
 * must be 0.
 *
 * A refused core (MGT_OPENBLAS_REFUSE=CORE): a selection asked for CORE
 * through OPENBLAS_CORETYPE lands on Prescott instead, as an OpenBLAS
 * that cannot switch to CORE would.
 *
 * Limits: OpenBLAS's internal symbols (0.3.x, pthread build); a worker
 * waits at most 10 s for the switch. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int switched_off, held, taken, selected;
static __thread int first_done;

static int worker_thread(void) { return getpid() != (pid_t)syscall(SYS_gettid); }

static struct timespec in_10s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += 10;
    return t;
}

void *blas_memory_alloc(int procpos)
{
    static void *(*real)(int);
    if (!real) real = (void *(*)(int))dlsym(RTLD_NEXT, "blas_memory_alloc");
    if (!worker_thread() || first_done) return real(procpos);
    first_done = 1;
    struct timespec t = in_10s();
    pthread_mutex_lock(&mu);
    held++;
    pthread_cond_broadcast(&cv);
    while (!switched_off && pthread_cond_timedwait(&cv, &mu, &t) == 0) {}
    pthread_mutex_unlock(&mu);
    void *p = real(procpos);
    pthread_mutex_lock(&mu);
    taken += switched_off;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return p;
}

void gotoblas_dynamic_init(void)
{
    void (*real)(void) = (void (*)(void))dlsym(RTLD_NEXT, "gotoblas_dynamic_init");
    void **core = (void **)dlsym(RTLD_DEFAULT, "gotoblas");
    if (worker_thread() && core && !*core) __atomic_add_fetch(&selected, 1, __ATOMIC_SEQ_CST);
    const char *refuse = getenv("MGT_OPENBLAS_REFUSE"), *asked = getenv("OPENBLAS_CORETYPE");
    if (refuse && asked && !strcasecmp(refuse, asked)) setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    real();
}

void gotoblas_dynamic_quit(void)
{
    void (*real)(void) = (void (*)(void))dlsym(RTLD_NEXT, "gotoblas_dynamic_quit");
    real();
    pthread_mutex_lock(&mu);
    if (!switched_off) {
        /* OpenBLAS started blas_cpu_number - 1 workers: wait until each
         * holds its first buffer, release them, wait for their buffers. */
        int *cpus = (int *)dlsym(RTLD_DEFAULT, "blas_cpu_number");
        int workers = cpus && *cpus > 1 ? *cpus - 1 : 0;
        struct timespec t = in_10s();
        while (held < workers && pthread_cond_timedwait(&cv, &mu, &t) == 0) {}
        switched_off = 1;
        pthread_cond_broadcast(&cv);
        while (taken < held && pthread_cond_timedwait(&cv, &mu, &t) == 0) {}
        fprintf(stderr, "late-worker shim: %d of %d OpenBLAS worker(s) took their first "
                "buffer with the core switched off; %d selected a core\n", taken, workers,
                __atomic_load_n(&selected, __ATOMIC_SEQ_CST));
    }
    pthread_mutex_unlock(&mu);
}
