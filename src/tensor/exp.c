/* exp over a row, x[i] = exp(x[i] - c): the attention's softmax rows on
 * the CPU. Compiled with -ffast-math (Makefile), under which
 * glibc declares its vector expf (libmvec, 16 lanes with AVX-512), so the
 * loop vectorises; a scalar expf per element was 7 % of gpt-mini's
 * training step on the CPU. The same call gives the same bits everywhere
 * on one machine; libmvec's expf may differ from the scalar one in the
 * last bit (within 1 ulp, as glibc documents it). */
#include <math.h>
#include "tensor/lanes.h"

void mg__exp_shifted(float *restrict x, int n, float c)
{
    for (int i = 0; i < n; i++) x[i] = expf(x[i] - c);
}
