/* bench/xcore.c — how fast one CPU can rewrite memory another CPU has just
 * read: the figure that decides how shared-memory collectives on
 * ordinary (malloc'd) buffers should write their staging buffers.
 *
 * Two processes pinned to CPUs 0 and 1 share a buffer of 680 KiB (half a
 * staging chunk). Round after round the writer copies fresh data into it
 * with ordinary stores and the reader copies it out. On a machine whose
 * two CPUs share a cache the writer's copy runs at memory-copy speed
 * (~10 GB/s on the development VM); when the CPUs do not share one (a
 * virtual machine's vCPUs are moved by the host), every line the writer
 * rewrites must first be taken back from the other CPU and the copy drops
 * to ~2.5 GB/s. bench/vs_mpi.sh prints this figure with its results, so
 * that tables measured in either state can be told apart.
 *
 *   build/bench/xcore [KiB] [rounds]     (default 680 2000)
 *
 * Prints one line: "xcore: writer GB/s, reader GB/s". */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    (void)sched_setaffinity(0, sizeof s, &s);   /* best effort: 1-CPU machines */
}

int main(int argc, char **argv)
{
    long kib = argc > 1 ? atol(argv[1]) : 680, rounds = argc > 2 ? atol(argv[2]) : 2000;
    if (kib <= 0 || kib > (1L << 20) || rounds <= 0 || rounds > 1000000) {
        fprintf(stderr, "usage: xcore [KiB (1..1048576)] [rounds (1..1000000)]\n");
        return 2;
    }
    size_t n = (size_t)kib << 10;
    char *sh = mmap(NULL, n + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("xcore: mmap");
        return 1;
    }
    _Atomic long *turn = (_Atomic long *)(void *)(sh + n);
    double *reader_s = (double *)(void *)(sh + n + 64);
    char *src = malloc(n), *dst = malloc(n);
    if (!src || !dst) {
        fprintf(stderr, "xcore: out of memory\n");
        return 1;
    }
    memset(src, 3, n);
    memset(dst, 4, n);
    memset(sh, 0, n);
    pid_t pid = fork();
    if (pid < 0) {
        perror("xcore: fork");
        return 1;
    }
    if (pid == 0) {
        pin(1);
        double t = 0;
        for (long i = 0; i < rounds; i++) {
            while (atomic_load(turn) != 2 * i + 1) sched_yield();
            double a = now();
            memcpy(dst, sh, n);
            t += now() - a;
            atomic_store(turn, 2 * i + 2);
        }
        *reader_s = t;
        _exit(0);
    }
    pin(0);
    double w = 0;
    for (long i = 0; i < rounds; i++) {
        src[0] = (char)i;
        double a = now();
        memcpy(sh, src, n);
        w += now() - a;
        atomic_store(turn, 2 * i + 1);
        while (atomic_load(turn) != 2 * i + 2) sched_yield();
    }
    int st;
    waitpid(pid, &st, 0);
    double bytes = (double)n * (double)rounds;
    printf("xcore: writer %.2f GB/s, reader %.2f GB/s (%ld KiB x %ld rounds, CPUs 0 and 1)\n",
           bytes / w / 1e9, bytes / *reader_s / 1e9, kib, rounds);
    return 0;
}
