/* Internal to src/parallel: what its files share and nothing outside
 * uses. */
#ifndef MG_PARALLEL_INTERNAL_H
#define MG_PARALLEL_INTERNAL_H

#include "multigrad/component.h"

/* Every rank of g gets the outcome: the first failing rank's status and
 * message, or MG_OK when none failed. Collective. */
mg_status mg__agree(mg_group *g, mg_status st);

/* A checkpoint of the job g (ckpt_io.c): every rank writes the pieces of
 * its ranges r (and the buffers where `buffers`) of the one file w lays
 * out at path, directly or through rank 0, which commits it; every rank
 * reads its model's tensors and o's ranges of the file at rank 0's path.
 * Collective; every rank gets the outcome. */
mg_status mg__ckpt_save(mg_group *g, mg_ckpt_writer *w, const char *path, const mg_range *r,
                        int nr, bool buffers);
mg_status mg__ckpt_load(mg_group *g, const char *path, mg_model *m, mg_optim *o,
                        mg_ckpt_meta *meta);

/* The built-in components (component.h), listed by kind in strategy.c. */
extern const mg_component_ops mg__dp_component, mg__ddp_component, mg__zero_component,
    mg__pipe_component;

/* The pipeline's group (its stages' ranks) and model. */
mg_group *mg__pipe_group(const mg_pipe *p);
mg_model *mg__pipe_model(const mg_pipe *p);
/* fn(ud, final) before each backward the executor runs; final: the last
 * of the step for its stage (its gradients are then final). */
void mg__pipe_before_backward(mg_pipe *p, void (*fn)(void *ud, bool final), void *ud);

#endif
