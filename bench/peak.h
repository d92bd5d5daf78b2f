/* The benchmarks' peak: the CPU's best SGEMM with the kernels and threads
 * in use (mg_sgemm_peak), or a GPU's float32 GEMM measured with cuBLAS
 * (mg_device_sgemm_peak, in the precision set for its GEMMs) beside its
 * nominal float32 peak. Prints a "# ..." header
 * line and returns GFLOP/s, or -1 after printing why the device cannot
 * be used. */
#ifndef MG_BENCH_PEAK_H
#define MG_BENCH_PEAK_H

#include <stdio.h>
#include "multigrad/multigrad.h"

static double bench_peak(const char *prog, mg_device dev)
{
    if (dev.kind != MG_DEVICE_CUDA) {
        double peak = mg_sgemm_peak();
        printf("# SGEMM peak: %.1f GFLOP/s (best square GEMM, 384..1024, these kernels and "
               "threads)\n", peak);
        return peak;
    }
    char name[128];
    size_t mem;
    if (mg_device_describe(dev, name, sizeof name, &mem)) {
        fprintf(stderr, "%s: %s\n", prog, mg_last_error());
        return -1;
    }
    double peak = mg_device_sgemm_peak(dev);
    printf("# device: %s, %.1f GB; float32 peak %.1f TFLOP/s nominal; GEMM 4096^3 measured "
           "%.1f TFLOP/s (cuBLAS in the GEMMs' precision: float32 without TF32, or bfloat16 "
           "operands with --bf16)\n", name, mem / 1e9, mg_device_fp32_peak(dev) / 1e12,
           peak / 1e3);
    return peak;
}

#endif
