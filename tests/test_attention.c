/* Causal attention on a device (src/device/attention.cu) against the
 * CPU's kernel (src/tensor/seq.c): the fused kernel at every padded head
 * size (32, 64, 128, and sizes that are not multiples of 16), sequence
 * lengths that leave partial tiles, 4 and 8 query rows a thread, the GEMM
 * path (heads over 128, MG_ATTENTION=gemm), bfloat16 operands in both
 * (the fused path's: its tensor-core kernels, src/device/attention_tc.cu),
 * two runs that agree bit for bit, which path auto takes, and that the
 * precision the buffers were sized for chooses it. On emu
 * (always) and on a GPU (skips without one). */
#include <stdlib.h>
#include "devices.h"

typedef struct {
    int n, T, d, heads;
} att_case;

/* The largest |a - b| over n floats, relative to the largest |b| (at least 1). */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double m = 0, big = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        m = d > m ? d : m;
        big = fabs(b[i]) > big ? fabs(b[i]) : big;
    }
    return m / big;
}

/* y and dqkv of one forward and backward on dev (bf16 GEMMs as asked),
 * the buffers sized for the precision `sized`, into host copies to free. */
static void run_sized(mg_device dev, bool bf16, bool sized, const att_case *c, const float *qkv,
                      const float *dy, float **y_out, float **dx_out)
{
    size_t nx = (size_t)c->n * c->T * 3 * c->d, ny = (size_t)c->n * c->T * c->d;
    bool cpu = dev.kind == MG_DEVICE_CPU;
    CHECK_OK(mg_device_set_current(dev));
    if (!cpu) CHECK_OK(mg_device_set_bf16(dev, sized));
    size_t ns = mg_attention_saved(c->n, c->T, c->d, c->heads);
    size_t nw = mg_attention_scratch(c->n, c->T, c->d, c->heads);
    CHECK(ns == mg_attention_saved_as(c->n, c->T, c->d, c->heads, sized));
    if (!cpu) CHECK_OK(mg_device_set_bf16(dev, bf16));
    float *x = cpu ? (float *)qkv : mgt_on_device(dev, qkv, nx);
    float *g = cpu ? (float *)dy : mgt_on_device(dev, dy, ny);
    float *y = cpu ? calloc(ny, sizeof(float)) : mgt_on_device(dev, NULL, ny);
    float *dx = cpu ? calloc(nx, sizeof(float)) : mgt_on_device(dev, NULL, nx);
    float *s = cpu ? calloc(ns, sizeof(float)) : mgt_on_device(dev, NULL, ns);
    float *w = cpu ? calloc(nw + 1, sizeof(float)) : mgt_on_device(dev, NULL, nw);
    mg_attention_forward_as(y, s, x, c->n, c->T, c->d, c->heads, w, sized);
    mg_attention_backward_as(dx, g, y, s, x, c->n, c->T, c->d, c->heads, w, sized);
    CHECK_OK(mg_device_set_current((mg_device){MG_DEVICE_CPU, 0}));
    if (cpu) {
        *y_out = y;
        *dx_out = dx;
        free(s);
        free(w);
        return;
    }
    *y_out = mgt_device_floats(dev, y, ny);
    *dx_out = mgt_device_floats(dev, dx, nx);
    float *own[] = {x, g, y, dx, s, w};
    for (int i = 0; i < 6; i++) mg_device_free(dev, own[i]);
    CHECK_OK(mg_device_set_bf16(dev, false));
}

/* The same, the buffers sized in the precision the run takes. */
static void run_on(mg_device dev, bool bf16, const att_case *c, const float *qkv, const float *dy,
                   float **y_out, float **dx_out)
{
    run_sized(dev, bf16, bf16, c, qkv, dy, y_out, dx_out);
}

/* y and dqkv on dev within tol of the CPU's (ya, dxa); the host copies
 * into *y, *dx (to free) when they are given, else freed. */
static void check_run(mg_device dev, bool bf16, const att_case *c, const float *qkv,
                      const float *dy, const float *ya, const float *dxa, double tol,
                      const char *what, float **y, float **dx)
{
    size_t nx = (size_t)c->n * c->T * 3 * c->d, ny = (size_t)c->n * c->T * c->d;
    float *yb, *dxb;
    run_on(dev, bf16, c, qkv, dy, &yb, &dxb);
    double ey = rel_diff(yb, ya, ny), ex = rel_diff(dxb, dxa, nx);
    CHECK_MSG(ey < tol && ex < tol, "n %d, T %d, d %d, heads %d, %s: y off by %.3g, dqkv by "
              "%.3g", c->n, c->T, c->d, c->heads, what, ey, ex);
    CHECK_MSG(!bf16 || ey > 1e-5, "%s: bf16 did not round (y off by %.3g)", what, ey);
    if (y) *y = yb, *dx = dxb;
    else free(yb), free(dxb);
}

static bool same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * 4); }

static void attention_equals_cpu(mg_device dev)
{
    const att_case cases[] = {
        {2, 37, 48, 3},    /* head 16 (padded to 32), one partial tile */
        {3, 130, 128, 2},  /* head 64, three tiles, the last of 2 rows */
        {1, 64, 256, 2},   /* head 128, exactly one tile */
        {2, 100, 40, 2},   /* head 20: padded columns */
        {1, 70, 96, 3},    /* head 32 */
        {1, 600, 64, 2},   /* over 512 positions: fused by default */
        {2, 33, 320, 2},   /* head 160: the GEMM path always */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const att_case *c = &cases[k];
        size_t nx = (size_t)c->n * c->T * 3 * c->d, ny = (size_t)c->n * c->T * c->d;
        float *qkv = malloc(nx * sizeof(float)), *dy = malloc(ny * sizeof(float));
        mg_rng r;
        mg_rng_init(&r, 100 + k);
        for (size_t i = 0; i < nx; i++) qkv[i] = 2.0f * mg_rng_normal(&r);
        for (size_t i = 0; i < ny; i++) dy[i] = mg_rng_normal(&r);
        float *ya, *dxa, *yf, *dxf, *yg, *dxg, *y, *dx;
        run_on((mg_device){MG_DEVICE_CPU, 0}, false, c, qkv, dy, &ya, &dxa);
        /* the fused kernel, 4 query rows a thread (256 threads a block) */
        setenv("MG_ATTENTION", "fused", 1);
        check_run(dev, false, c, qkv, dy, ya, dxa, 2e-5, "fused", &yf, &dxf);
        /* the same again: the same bits (no atomics, a fixed order) */
        run_on(dev, false, c, qkv, dy, &y, &dx);
        CHECK(same(y, yf, ny) && same(dx, dxf, nx));
        free(y), free(dx);
        setenv("MG_ATTENTION_ROWS", "8", 1);
        check_run(dev, false, c, qkv, dy, ya, dxa, 2e-5, "fused, 8 rows a thread", NULL, NULL);
        unsetenv("MG_ATTENTION_ROWS");
        /* bfloat16 operands (the tensor-core kernels): within bfloat16's
         * rounding of the CPU's float, and the same bits again */
        float *yt, *dxt, *ygt, *dxgt;
        check_run(dev, true, c, qkv, dy, ya, dxa, 3e-2, "fused, bf16", &yt, &dxt);
        run_on(dev, true, c, qkv, dy, &y, &dx);
        CHECK(same(y, yt, ny) && same(dx, dxt, nx));
        free(y), free(dx);
        /* the batched GEMMs' path */
        setenv("MG_ATTENTION", "gemm", 1);
        check_run(dev, false, c, qkv, dy, ya, dxa, 2e-5, "GEMMs", &yg, &dxg);
        check_run(dev, true, c, qkv, dy, ya, dxa, 3e-2, "GEMMs, bf16", &ygt, &dxgt);
        /* auto: in float32 the GEMMs up to 512 positions, the fused kernel
         * above; in bfloat16 the fused path at any length */
        unsetenv("MG_ATTENTION");
        run_on(dev, false, c, qkv, dy, &y, &dx);
        bool wide = c->d / c->heads > 128, gemm = c->T <= 512 || wide;
        CHECK_MSG(same(y, gemm ? yg : yf, ny) && same(dx, gemm ? dxg : dxf, nx),
                  "T %d, head %d: auto is not the %s path", c->T, c->d / c->heads,
                  gemm ? "GEMM" : "fused");
        free(y), free(dx);
        run_on(dev, true, c, qkv, dy, &y, &dx);
        CHECK_MSG(same(y, wide ? ygt : yt, ny) && same(dx, wide ? dxgt : dxt, nx),
                  "T %d, head %d, bf16: auto is not the %s path", c->T, c->d / c->heads,
                  wide ? "GEMM" : "fused");
        free(y), free(dx);
        /* the path follows the precision the buffers were sized for: sized
         * in bfloat16 and run in float32, the float fused kernel (in the
         * bfloat16 path's room); sized in float32 and run in bfloat16, the
         * float32 choice in bfloat16 */
        run_sized(dev, false, true, c, qkv, dy, &y, &dx);
        CHECK_MSG(same(y, wide ? yg : yf, ny) && same(dx, wide ? dxg : dxf, nx),
                  "T %d, head %d, sized for bf16, run in float32: not the %s path", c->T,
                  c->d / c->heads, wide ? "GEMM" : "fused");
        free(y), free(dx);
        run_sized(dev, true, false, c, qkv, dy, &y, &dx);
        CHECK_MSG(same(y, gemm ? ygt : yt, ny) && same(dx, gemm ? dxgt : dxt, nx),
                  "T %d, head %d, sized for float32, run in bf16: not the %s path", c->T,
                  c->d / c->heads, gemm ? "GEMM" : "fused");
        free(y), free(dx), free(yf), free(dxf), free(yg), free(dxg);
        free(yt), free(dxt), free(ygt), free(dxgt);
        free(ya), free(dxa), free(qkv), free(dy);
    }
}

TEST_T(attention_emu_equals_cpu, 120) { attention_equals_cpu((mg_device){MG_DEVICE_EMU, 0}); }

TEST_T(attention_gpu_equals_cpu, 120) { attention_equals_cpu(mgt_device(MG_DEVICE_CUDA)); }
