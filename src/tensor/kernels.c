/* Which kernels this process runs, checked once at first use: the CPU,
 * OpenBLAS's core for GEMM (blas.c checks it and re-selects it when
 * OpenBLAS chose wrong) and the library's own convolution kernels; the
 * lines every tool's --version, --verbose and the benchmark headers
 * print; the SGEMM peaks the benchmarks compare with.
 *
 * Limits: the check runs once per process, before this library's first
 * GEMM (tensor.c calls mg_kernels), and its result is fixed after that. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/tensor.h"
#include "tensor/blas.h"
#include "tensor/conv_impl.h"

static int describe(const mg_kernels_info *k, char *buf, size_t cap, const char *prefix,
                    int threads);

static mg_kernels_info info;
static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;

static void kernels_init(void)
{
    mg_kernels_info *k = &info;
    k->cpu = *mg_cpu();
    mg__blas_check(k);
#ifdef MG__HAVE_AVX512
    k->own = strcmp(mg_env_str("MG_KERNELS", "auto"), "generic") ? MG_SIMD_AVX512 : MG_SIMD_NONE;
#else
    k->own = MG_SIMD_NONE;
#endif
    if (mg_verbose()) {
        /* Threads are not known yet: the first GEMM sets them after this. */
        char lines[1024];
        describe(k, lines, sizeof lines, NULL, -1);
        for (char *l = lines, *e; (e = strchr(l, '\n')); l = e + 1)
            mg_debug("%.*s", (int)(e - l), l);
    }
}

const mg_kernels_info *mg_kernels(void)
{
    pthread_once(&kernels_once, kernels_init);
    return &info;
}

void mg_print_version(const char *tool)
{
    char buf[1024];
    mg_kernels_describe(buf, sizeof buf, NULL);
    printf("%s (multigrad %s)\n%s", tool, MG_VERSION, buf);
    fflush(stdout);
}

/* The lines of mg_kernels_describe; threads < 0 leaves out the last. */
static int describe(const mg_kernels_info *k, char *buf, size_t cap, const char *prefix,
                    int threads)
{
    const mg_cpu_info *c = &k->cpu;
    const char *p = prefix ? prefix : "";
    char det[64] = "", thr[80] = "", below[160] = "";
    if (k->switched) snprintf(det, sizeof det, ", re-selected from %s", k->detected);
    if (k->below)
        snprintf(below, sizeof below, ", below this CPU's %s%s%s", mg_simd_name(c->simd),
                 *k->fix ? ": " : "", k->fix);
    if (threads >= 0)
        snprintf(thr, sizeof thr, "%sthreads: %d BLAS thread(s) per process\n", p, threads);
    return snprintf(buf, cap,
                    "%scpu: %s (%s family %d model %d), %s%s\n"
                    "%sgemm: %s, %s kernels (%s%s): %s%s\n"
                    "%sconv: %s\n%s",
                    p, c->model, c->vendor[0] ? c->vendor : "unknown", c->family, c->model_id,
                    mg_simd_name(c->simd), c->avx512_bf16 ? " with BF16" : "", p, k->blas,
                    k->core, mg_simd_name(k->core_simd), det, k->choice, below, p,
                    k->own == MG_SIMD_AVX512 ? "own AVX-512 kernels"
                    : c->simd >= MG_SIMD_AVX512
                        ? "portable C kernels (AVX-512 kernels not built or MG_KERNELS=generic)"
                        : "portable C kernels",
                    thr);
}

int mg_kernels_describe(char *buf, size_t cap, const char *prefix)
{
    return describe(mg_kernels(), buf, cap, prefix, mg_get_threads());
}

/* GFLOP/s of the best square SGEMM among a few sizes: what one training
 * step could reach if it were nothing but large GEMMs. */
double mg_sgemm_peak(void)
{
    static const int sizes[] = {384, 512, 768, 1024};
    int nmax = 1024;
    float *a = mg_alloc(sizeof(float) * (size_t)nmax * nmax * 3);
    if (!a) return 0;
    float *b = a + (size_t)nmax * nmax, *c = b + (size_t)nmax * nmax;
    for (size_t i = 0; i < (size_t)nmax * nmax * 3; i++) a[i] = (float)(i % 13) * 0.01f;
    double best = 0;
    for (int s = 0; s < 4; s++) {
        int n = sizes[s];
        for (int r = 0; r < 3; r++) {
            int it = 0;
            double t0 = mg_now(), t;
            do {
                mg_gemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
                it++;
            } while ((t = mg_now() - t0) < 0.1);
            double g = 2.0 * n * n * (double)n * it / t / 1e9;
            if (g > best) best = g;
        }
    }
    mg_free(a);
    return best;
}

double mg_device_sgemm_peak(mg_device d)
{
    const int n = 4096;
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = mg_device_alloc(d, bytes), *b = mg_device_alloc(d, bytes);
    float *c = mg_device_alloc(d, bytes);
    mg_device host = mg_device_current();
    double best = 0;
    if (a && b && c && !mg_device_set_current(d)) {
        mg_gemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);   /* warm-up */
        mg_device_synchronize(d);
        for (int i = 0; i < 10; i++) {
            double t0 = mg_now();
            mg_gemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            mg_device_synchronize(d);
            double g = 2.0 * n * n * (double)n / (mg_now() - t0) / 1e9;
            if (g > best) best = g;
        }
        mg_device_set_current(host);
    }
    mg_device_free(d, a);
    mg_device_free(d, b);
    mg_device_free(d, c);
    return best;
}
