/* multigrad — the components a parallel strategy is made of.
 *
 * A strategy (mg_strategy, parallel.h) is an ordered list of components
 * over one model: tensor parallelism (with tp > 1 in the mesh: the
 * group's collectives for a model built split), the pipeline (which
 * drives the step when there is one), then the data-parallel sharding or
 * replication (DataParallel threads,
 * DDP, ZeRO 1-3), then any the caller adds (mg_strategy_options
 * .components). The strategy never asks which component it holds: it
 * calls each one's slots below, in list order (reductions and releases in
 * reverse order, innermost first), and a slot left NULL means "nothing to
 * do here" or "the strategy's default". A new strategy is one file that
 * fills an mg_component_ops and one line that lists it (strategy.c's
 * table, or a caller's options).
 *
 * Limits: a component sees the plan through the mg_strategy_* accessors
 * (model, options, the ranges the components before it left this rank);
 * at most MG_MAX_COMPONENTS per strategy. */
#ifndef MULTIGRAD_COMPONENT_H
#define MULTIGRAD_COMPONENT_H

#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_MAX_COMPONENTS 8

typedef struct mg_component_ops {
    const char *name;
    /* Makes the component for strategy s (collective where it
     * communicates; a failure on one rank should reach all, mg_strategy_agree).
     * *state is the component's own; leaving it NULL with MG_OK drops the
     * component (nothing to do in this plan, e.g. replicas of one). */
    mg_status (*attach)(mg_strategy *s, void **state);
    void (*destroy)(void *c);
    /* Its name in mg_strategy_name (default: name), e.g. "zero2". */
    const char *(*label)(void *c);

    /* ---- what this rank holds -------------------------------------------
     * ranges: the arena ranges this rank keeps and steps, ascending (the
     * last component with the slot decides; without any, the whole arena).
     * own_ranges: those of them it counts in the gradient norm and writes
     * to a checkpoint (default: ranges; NULL: all of them); a rank's own
     * are the intersection of every component's (a tp rank's split tensors
     * within its ZeRO pieces). */
    const mg_range *(*ranges)(void *c, int *n);
    const mg_range *(*own_ranges)(void *c, int *n);
    /* The ranges whose parameters this rank holds between steps, when
     * they are not its ranges: NULL for those the components before it
     * hold (ZeRO 1-2 shard only the optimizer's state). A model made
     * without values (MG_SEED_DEFERRED) gets values there only. */
    const mg_range *(*param_ranges)(void *c, int *n);
    /* The ranks across which this component splits the parameters (each
     * holds its part: the norm's sum of squares is summed over them), the
     * ranks that hold copies of the same part (only the first of them
     * writes it to a checkpoint), and the ranks across which it splits the
     * batch (the training figures are summed over them). NULL: none. */
    mg_group *(*shards_over)(void *c);
    mg_group *(*replicas_over)(void *c);
    mg_group *(*batch_over)(void *c);
    /* The share of the global batch this rank's data is: share `rank` of
     * `size` (the first component with the slot decides; without any, the
     * mesh's dp coordinate and size). A rank that trains on no data (a
     * parameter server) names the share whose steps it keeps pace with.
     * eval: the share of an evaluation's data (an elastic job's spreads
     * over the ranks that remain). */
    void (*data_share)(void *c, bool eval, int *rank, int *size);

    /* ---- the step ----------------------------------------------------------
     * zero_grad: zeroes the gradients it keeps; with any component's
     * zero_grad the strategy leaves the model's arena alone (the default
     * zeroes it), so one that keeps its gradients in the arena zeroes it.
     * run_step: the forwards and backwards of a whole step (the first
     * component with it drives, e.g. a pipeline schedule); else run_micro
     * replaces the model's forward, loss and backward of one micro-batch
     * (e.g. threads). Around each micro-batch, micro_begin (list order;
     * last: the step's last; a driver calls it before each backward it
     * runs, mg_strategy_micro_begin) and micro_end (reverse order). reduce: after
     * the micro-batches, the gradients this rank steps made final (reverse
     * order). grads_elsewhere: gradients kept outside the arena (offload),
     * already scaled to the mean; true with *sumsq their share of the
     * norm, and clipping goes to the optimizer (mg_optim_scale_grads);
     * grad_sumsq (below) the norm where a component sums it itself.
     * after_update: after the optimizer (e.g. ZeRO 1-2's all-gather). */
    void (*zero_grad)(void *c);
    mg_status (*run_step)(void *c, mg_batch_source next, void *ud, int max_micro,
                          mg_step_result *r);
    mg_status (*run_micro)(void *c, const mg_micro_batch *b, float *loss, int *correct);
    void (*micro_begin)(void *c, bool last);
    mg_status (*micro_end)(void *c);
    mg_status (*reduce)(void *c);
    bool (*grads_elsewhere)(void *c, double *sumsq);
    /* The squared norm of the mean gradient over `micro` micro-batches,
     * summed in one grouping whatever the plan (the deterministic tree's:
     * by units): clipping takes it instead of summing the ranks' shares
     * (whose grouping follows the world size). */
    double (*grad_sumsq)(void *c, int micro);
    mg_status (*after_update)(void *c);

    /* ---- state ---------------------------------------------------------------
     * hold: this rank's own ranges present in the arena, and (saving) what
     * a checkpoint needs besides them, e.g. a pipeline's buffers; undone by
     * release. gather: the whole parameters on this rank (evaluation,
     * export), until release. offload: the files holding the parameter
     * and gradient pieces, for the optimizer to step in place (NULL: in
     * memory). */
    mg_status (*hold)(void *c, bool saving);
    mg_status (*gather)(void *c);
    mg_status (*release)(void *c);
    void (*offload)(void *c, mg_scratch **params, mg_scratch **grads);

    /* ---- evaluation and generation (default: gather, the model's forward,
     * release; the first component with the slot runs it instead) -------- */
    mg_status (*evaluate)(void *c, mg_batch_source next, void *ud, mg_step_result *r);
    mg_status (*generate)(void *c, const int32_t *prompt, int n_prompt, int n,
                          float temperature, int top_k, uint64_t seed, int32_t *out);
    /* Corrects the strategy's memory figures to what it holds. */
    void (*memory)(void *c, mg_memory_stats *ms);

    /* ---- between steps ------------------------------------------------------
     * settle: on every rank, before the job's collectives between steps
     * (the training figures, evaluation, the log, checkpoints) and again
     * after them (failed: they failed on this rank): a component whose
     * ranks may leave the job (an elastic parameter server's workers)
     * agrees with the others which remain; when some have left since,
     * *job is the group of those that remain (the component's), which the
     * job's collectives use from then on (mg_strategy_group). After
     * collectives that failed on some rank because one left amid them,
     * *again: every rank that remains does them again, over *job; when
     * they failed otherwise, an error on the ranks where they worked. */
    mg_status (*settle)(void *c, bool failed, bool *again, mg_group **job);
} mg_component_ops;

/* For components: the options the strategy was made with (the caller's
 * pointers it reads only at creation, mesh, components and pipe.first,
 * are NULL by then: mg_strategy_mesh has the mesh), and every rank of its
 * job learning the first failure of any (collective over the job's group;
 * st as it is in one process). */
const mg_strategy_options *mg_strategy_options_of(const mg_strategy *s);
mg_status mg_strategy_agree(mg_strategy *s, mg_status st);
/* For a component that drives the step (run_step): before a backward of
 * a micro-batch, every component's micro_begin (last: the last backward
 * of the step over the units it runs, whose gradients are then final). */
void mg_strategy_micro_begin(mg_strategy *s, bool last);
/* After it: every component's micro_end (reverse order); the first error. */
mg_status mg_strategy_micro_end(mg_strategy *s);
/* For a component that drives the step and applies more than one update
 * in it (a parameter server taking each push as its own): the gradients
 * in the arena, sums over `micro` micro-batches, through the rest of the
 * step as mg_train_step takes them (the mean, clipping to the global norm,
 * the optimizer with the step's learning rate, every component's
 * after_update). sumsq >= 0: the squared global norm of the mean
 * gradient, known to the caller (a push's, from the worker that holds all
 * of it), instead of summing it over the ranks. Only within run_step; a
 * driver that applies its step's updates this way sets r->updated. */
mg_status mg_strategy_update(mg_strategy *s, int micro, double sumsq, mg_step_result *r);
/* Within mg_train_step, its options (e.g. whether it clips); NULL
 * outside. */
const mg_step_options *mg_strategy_step_options(const mg_strategy *s);
/* The state of this strategy's component made from ops (NULL: none). */
void *mg_strategy_part(const mg_strategy *s, const mg_component_ops *ops);

#ifdef __cplusplus
}
#endif
#endif
