/* multigrad — the OpenBLAS core check (blas.c) as kernels.c's report of
 * the kernels in use calls it. */
#ifndef MG_TENSOR_BLAS_H
#define MG_TENSOR_BLAS_H

#include "multigrad/tensor.h"

/* Fills k's blas, detected, core, choice, switched, below and fix from
 * k->cpu, re-selecting OpenBLAS's core where that is the choice, and logs
 * a warning for a core below this CPU that nobody asked for or a core
 * asked for and not had. Once per process, before the first GEMM. */
void mg__blas_check(mg_kernels_info *k);

#endif
