/* Test helpers for models on devices and their numbers (test_device.c,
 * test_gpt.c). */
#ifndef MGT_DEVICES_H
#define MGT_DEVICES_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "multigrad/multigrad.h"

/* The device of a test: the CPU, emu (always there) or cuda:0, which
 * skips without a GPU, saying why. A child process asks, so that the
 * test's own process has not started the CUDA driver, which the ranks it
 * forks could not use then. */
static inline mg_device mgt_device(mg_device_kind kind)
{
    if (kind != MG_DEVICE_CUDA) return (mg_device){kind, 0};
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        const char *why = "";
        char ok = mg_device_cuda_count(&why) ? 1 : 0;
        if (write(fd[1], &ok, 1) != 1 || (!ok && write(fd[1], why, strlen(why)) < 0)) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    char said[512] = "";
    size_t n = 0;
    for (ssize_t k; n < sizeof said - 1 && (k = read(fd[0], said + n, sizeof said - 1 - n)) > 0;)
        n += (size_t)k;
    close(fd[0]);
    said[n] = 0;
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_MSG(n >= 1, "the child asking for a GPU said nothing");
    if (said[0] != 1) mgt_skip("no GPU: %s", said + 1);
    return (mg_device){kind, 0};
}

/* Whether libnccl.so.2 loads here, asked in a child (as mgt_device asks
 * for the GPU): the NCCL tests skip without it. */
static inline bool mgt_nccl_loads(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL) ? 0 : 1);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
    return WEXITSTATUS(status) == 0;
}

/* cuda:0 for a test of NCCL's path: skips, saying why, without a GPU or
 * without NCCL. */
static inline mg_device mgt_nccl_gpu(void)
{
    mg_device d = mgt_device(MG_DEVICE_CUDA);
    if (!mgt_nccl_loads()) mgt_skip("no NCCL here (libnccl.so.2 does not load)");
    return d;
}

/* In a forked rank: NCCL refuses two ranks on one GPU of one host; told
 * they are on hosts of their own, it runs them (through its network
 * transport over loopback), so one GPU tests the NCCL path. MG_NCCL=on:
 * NCCL or an error. */
static inline void mgt_nccl_host_of_its_own(int r)
{
    char host[32];
    snprintf(host, sizeof host, "mgtest-host-%d", r);
    setenv("NCCL_HOSTID", host, 1);
    setenv("MG_NCCL", "on", 1);
}

/* n floats of d's memory at p in a host copy to free. */
static inline float *mgt_device_floats(mg_device d, const float *p, size_t n)
{
    float *h = (float *)malloc(n * sizeof(float));
    CHECK(h != NULL);
    CHECK_OK(mg_device_copy((mg_device){MG_DEVICE_CPU, 0}, h, d, p, n * sizeof(float)));
    return h;
}

/* n floats of m's memory (on its device) in a host copy to free. */
static inline float *mgt_host_floats(const mg_model *m, const float *p, size_t n)
{
    return mgt_device_floats(mg_model_device(m), p, n);
}

/* Memory on d for n floats (and a few bytes more), holding h's when h is
 * not NULL (else zeros); mg_device_free it. */
static inline float *mgt_on_device(mg_device d, const float *h, size_t n)
{
    float *p = (float *)mg_device_alloc(d, n * sizeof(float) + 4);
    CHECK(p != NULL);
    if (h) CHECK_OK(mg_device_copy(d, p, (mg_device){MG_DEVICE_CPU, 0}, h, n * sizeof(float)));
    return p;
}

/* max |a - b| over max |b| (NaN counts as the largest error), checked
 * against tol; `ref` names where b comes from. Returns it. */
static inline double mgt_check_scaled(const char *what, const float *a, const float *b, size_t n,
                                      double tol, const char *ref)
{
    double mx = 0.0, err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(b[i]));
        if (!(fabs(a[i] - b[i]) <= err)) {
            err = fabs(a[i] - b[i]);
            worst = i;
        }
    }
    double rel = mx > 0 ? err / mx : err;
    CHECK_MSG(rel <= tol, "%s: error %.3g of the tensor's scale %.3g (entry %zu: %.9g vs %s "
              "%.9g)", what, rel, mx, worst, a[worst], ref, b[worst]);
    return rel;
}

#endif
