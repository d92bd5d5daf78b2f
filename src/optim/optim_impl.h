/* Internal to src/optim: the per-step coefficients of each optimizer and
 * the update kernels (sgd.c, adam.c) that optim.c dispatches to. The
 * coefficients are computed once per step in double and rounded to float
 * the way torch.optim's Python scalars reach its float kernels. */
#ifndef MG_OPTIM_IMPL_H
#define MG_OPTIM_IMPL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct mg__sgd_coef {
    float neg_lr;        /* -lr */
    float wd;            /* weight decay added to the gradient (0: none) */
    float mu;            /* momentum (0: no buffer) */
    float one_minus_damp;
    bool nesterov;
    bool first;          /* first step: the buffer is a copy of the gradient */
} mg__sgd_coef;

typedef struct mg__adam_coef {
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    float neg_step_size;  /* -lr / (1 - beta1^t) */
    float bc2_sqrt;       /* sqrt(1 - beta2^t) */
    float wd;             /* Adam: added to the gradient (0: none) */
    float decay;          /* AdamW: p *= 1 - lr*wd (1: none) */
} mg__adam_coef;

void mg__sgd_update(float *p, const float *g, float *buf, size_t n, const mg__sgd_coef *c);
void mg__adam_update(float *p, const float *g, float *m, float *v, size_t n,
                     const mg__adam_coef *c);

#endif
