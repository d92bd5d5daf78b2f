/* Internal to src/parallel: what its files share and nothing outside
 * uses. */
#ifndef MG_PARALLEL_INTERNAL_H
#define MG_PARALLEL_INTERNAL_H

#include <math.h>
#include "multigrad/component.h"

/* A checkpoint of the job g (ckpt_io.c): every rank writes the pieces of
 * its ranges r (and the buffers where `buffers`) of the one file w lays
 * out at path, directly or through rank 0, which commits it; every rank
 * reads the file at rank 0's path with read (its part: the parameters it
 * holds, its optimizer ranges), directly or through rank 0, which reads
 * and checks it first. Collective; every rank gets the outcome. */
mg_status mg__ckpt_save(mg_group *g, mg_ckpt_writer *w, const char *path, const mg_range *r,
                        int nr, bool buffers);
typedef mg_status (*mg__ckpt_reader)(const mg_st_file *f, const char *path, void *ud);
mg_status mg__ckpt_load(mg_group *g, const char *path, mg__ckpt_reader read, void *ud);

/* Buckets over a component's ranges r (ddp.c): mg_buckets' whole-unit
 * buckets cut to the ranges, and at the borders of every unit another
 * unit borrows, so a tied range is one bucket on the rank that owns it
 * and on the one that borrows it. *out (free it) gets *nb ranges. */
mg_status mg__range_buckets(const mg_model *m, size_t first_cap, size_t cap, const mg_range *r,
                           int n, mg_range **out, int *nb);

/* out (room for na + nb) = the ranges in both a and b (each ascending
 * and disjoint), ascending; returns how many (strategy.c). */
int mg__ranges_intersect(const mg_range *a, int na, const mg_range *b, int nb, mg_range *out);

/* The next micro-batch from a source, the fields it leaves zero (a
 * source of before mg_micro_batch's weight leaves it: 1). */
static inline bool mg__next_micro(mg_batch_source next, void *ud, mg_micro_batch *b)
{
    *b = (mg_micro_batch){0};
    return next(ud, b);
}

/* What a source gave is a micro-batch model m can take: rows, inputs and
 * labels, each label one of m's classes (PyTorch's cross-entropy refuses
 * the others as out of bounds; here they gave a NaN loss), a weight that
 * is a number (MG_EINVAL naming what is not). fn: the call, for the
 * message. */
static inline mg_status mg__micro_check(const char *fn, const mg_micro_batch *b,
                                        const mg_model *m)
{
    if (b->n < 1 || !b->x || !b->y || !(b->weight >= 0) || b->weight == (float)INFINITY)
        return mg_error(MG_EINVAL, "%s: the source gave a micro-batch of %d rows, x %s, y %s, "
                        "weight %g: give 1 or more rows, both arrays, and a weight of 0 (1) or "
                        "more", fn, b->n, b->x ? "given" : "NULL", b->y ? "given" : "NULL",
                        b->weight);
    if (mg_model_vocab(m) && mg_device_of(b->x).kind == MG_DEVICE_CPU &&
        mg_model_check_tokens(m, (const int32_t *)(const void *)b->x, b->n))
        return mg_error(MG_EINVAL, "%s: the source's micro-batch: %s", fn, mg_last_error());
    int classes = mg_model_classes(m), per = mg_model_positions(m);
    for (size_t i = 0; i < (size_t)b->n * per; i++)
        if (b->y[i] < 0 || b->y[i] >= classes)
            return mg_error(MG_EINVAL, "%s: the source gave label %d (row %zu, position %zu of "
                            "%d) where the model has %d classes: give labels 0 to %d", fn,
                            (int)b->y[i], i / per, i % per, per, classes, classes - 1);
    return MG_OK;
}

/* A step or evaluation this rank refused (MG_EINVAL: its source's data,
 * its options) is the job's: the peers' collectives would pair with this
 * rank's next step's, silently off by one (a probe). The job's group is
 * revoked with the message, so every rank's next collective fails naming
 * this rank and why. Returns st. */
mg_status mg__strategy_refused(mg_strategy *s, mg_status st);

/* A micro-batch's weight in its step (mg_micro_batch), where it is not 1. */
static inline bool mg__weighed(const mg_micro_batch *b)
{
    return b->weight > 0 && b->weight != 1;
}

/* The ranges this rank counts in the gradient norm and writes to a
 * checkpoint: every component's own ranges intersected (strategy.c). */
const mg_range *mg__strategy_own_ranges(const mg_strategy *s, int *n);

/* The whole model's forward and loss of every micro-batch from next,
 * added into r (strategy.c: evaluation where no component runs it). */
mg_status mg__strategy_forwards(mg_strategy *s, mg_batch_source next, void *ud,
                                mg_step_result *r);

/* The built-in components (component.h), listed by kind in strategy.c. */
extern const mg_component_ops mg__tp_component, mg__dp_component, mg__ddp_component,
    mg__zero_component, mg__pipe_component, mg__zero_pipe_component, mg__ps_server_component,
    mg__ps_worker_component, mg__det_component, mg__dp_det_component;

/* --deterministic (det.c): shard gradient g (arena-sized) into the tree
 * of det's state c, the shards of a step in their order, with `part`, the
 * shard's gradients of borrowed parameters kept apart (mg__det_tie's range
 * long; none when that is empty); for a component that runs the shards
 * itself (DataParallel threads, each tape's borrowed gradients into a
 * part of its own: mg_tape_set_borrowed_grads). */
mg_status mg__det_push(void *c, const float *g, const float *part);
mg_range mg__det_tie(const void *c);
/* The range of the parameters a unit borrows (a tied head's lender's),
 * which --deterministic sums apart (empty: none); and, after its reduce,
 * the tree's root of those gradients, on the host (NULL: none kept
 * apart): a parameter server's worker pushes it apart. */
mg_status mg__det_kept_apart(mg_model *m, mg_range *tie);
const float *mg__det_tie_root(const void *c);
/* A parameter server's run of the arena and the servers' group, on a
 * server (ps_server.c); NULL on a worker. */
const mg_range *mg__ps_server_run(mg_strategy *s, mg_group **servers);
/* Its gradient norm in one grouping at any plan and tp size (det_norm.c):
 * the units of own (nown ranges) on this rank, the tp ranks' chunks
 * gathered over tp, the stages' units added over stages (either NULL). */
typedef struct mg__det_norm mg__det_norm;
mg_status mg__det_norm_create(mg_model *m, mg_group *tp, mg_group *stages, const mg_range *own,
                              int nown, mg__det_norm **out);
void mg__det_norm_destroy(mg__det_norm *n);
/* Collective over tp and stages: *sumsq of gradient arena g. */
mg_status mg__det_norm_sumsq(mg__det_norm *n, const float *g, double *sumsq);

/* ---- ZeRO's parts (zero.c), run by its component ---- */
/* MG_EINVAL unless 1 <= stage <= 3. */
mg_status mg__zero_stage_check(int stage);
/* Collective: every rank of g with the same model; pads the units to
 * lcm(world, SIMD width) (the plan makes the parameters the same on
 * every rank). opt: bucket caps (compression is refused). */
mg_status mg__zero_create(mg_group *g, mg_model *m, int stage, const mg_ddp_options *opt,
                         mg_zero **out);
void mg__zero_destroy(mg_zero *z);
int mg__zero_stage(const mg_zero *z);
int mg__zero_num_buckets(const mg_zero *z);
/* This rank's pieces of the arena, ascending (one per bucket). */
const mg_range *mg__zero_pieces(const mg_zero *z, int *n);
/* Zero the gradients this rank holds. */
void mg__zero_zero_grad(mg_zero *z);
/* Around one micro-batch's forward and backward (last: of the step):
 * the hooks gather and reduce between them; end waits for the
 * reductions and returns the first communication error. */
void mg__zero_begin(mg_zero *z, bool last);
mg_status mg__zero_end(mg_zero *z);
/* After the optimizer: stages 1-2 all-gather the parameters. */
mg_status mg__zero_after_step(mg_zero *z);
/* Stage 3: the whole parameters on every rank (evaluation, sampling,
 * saving weights) until mg__zero_release gives back all but the pieces.
 * Collective; nothing for stages 1-2. */
mg_status mg__zero_gather(mg_zero *z);
/* Offloaded parameters: written back to the file from the arena's pieces
 * (which may have been changed since gather or pieces_in), then given back. */
mg_status mg__zero_release(mg_zero *z);
/* Offload (--offload disk:DIR), ZeRO-Offload's split: stages 2-3 keep
 * the gradient pieces in a file in dir (mg_scratch; each micro-batch's
 * reduced piece is added there, the last one's scaled to the mean with
 * its sum of squares kept for clipping, grad_sumsq), and stage 3 the
 * parameter pieces too: nothing of them stays in memory between a
 * bucket's uses, a gather reads the piece first. pieces_in reads every
 * parameter piece into the arena (saving, loading) until release. The
 * files (NULL unless offloaded) are laid out as the optimizer over
 * mg__zero_pieces lays out a state, so the optimizer reads and steps them
 * there (mg_optim_offload). Nothing for stage 1. */
mg_status mg__zero_offload(mg_zero *z, const char *dir);
mg_status mg__zero_pieces_in(mg_zero *z);
mg_scratch *mg__zero_param_store(const mg_zero *z);
mg_scratch *mg__zero_grad_store(const mg_zero *z);
double mg__zero_grad_sumsq(const mg_zero *z);

/* ---- the pipeline's parts (pipeline.c, pipeline_exec.c), run by its component */
/* Collective over g: the ranks check that they were given the same
 * schedule, counts, batch and cut (MG_EMISMATCH naming a rank that was
 * not). max_batch: the largest micro-batch. */
mg_status mg__pipe_create(mg_group *g, mg_model *m, const mg_pipe_options *o, int max_batch,
                         mg_pipe **out);
void mg__pipe_destroy(mg_pipe *p);
/* The arena ranges this rank keeps and steps, ascending: at most one per
 * chunk and 8 borrowed. */
#define MG_PIPE_MAX_RANGES (64 + 8)
const mg_range *mg__pipe_ranges(const mg_pipe *p, int *n);
/* Those of them this rank owns, not empty: without the parameters it
 * borrows from another rank (which that rank counts in the norm and
 * writes to a checkpoint). */
const mg_range *mg__pipe_own_ranges(const mg_pipe *p, int *n);
/* One step's forwards and backwards: up to min(max_micro, M) micro-
 * batches from next (every rank of the pipeline draws the same; the first
 * stage reads their inputs, the last their labels), run as the schedule
 * says, gradients summed into the model's arena. r gets the count and
 * the last stage's loss sum, hits and samples, on every rank
 * (collective). A step with fewer micro-batches (an epoch's end) runs the
 * schedule for that count. */
mg_status mg__pipe_step(mg_pipe *p, mg_batch_source next, void *ud, int max_micro,
                       mg_step_result *r);
/* The same forwards without backwards (evaluation, generation: no
 * gradient, nothing held after): GPipe's order of forwards (interleaved's
 * under interleaved), the model's training mode as it is (dropout draws
 * only in training). The last stage's logits of its last micro-batch
 * stay in mg__pipe_logits (NULL on the other ranks) until the next run:
 * host memory (a copy, of a model on a device). */
mg_status mg__pipe_forward(mg_pipe *p, mg_batch_source next, void *ud, int max_micro,
                          mg_step_result *r);
const float *mg__pipe_logits(mg_pipe *p);
/* After the step: the two ranks holding tied parameters add their
 * gradients. */
mg_status mg__pipe_sum_ties(mg_pipe *p);
/* Every stage's parameters and buffers on every rank (evaluation,
 * sampling, saving; collective), until release gives back all but this
 * rank's. */
mg_status mg__pipe_gather(mg_pipe *p);
void mg__pipe_release(mg_pipe *p);
/* Every stage's buffers (running statistics) on every rank: what a
 * checkpoint needs besides each rank's own ranges. Collective. */
mg_status mg__pipe_gather_buffers(mg_pipe *p);
/* The pipeline's group (its stages' ranks) and model. */
mg_group *mg__pipe_group(const mg_pipe *p);
mg_model *mg__pipe_model(const mg_pipe *p);
/* before(ud, final) before each backward the executor runs (final: the
 * last of the step for its stage, whose gradients are then final), and
 * after(ud) after it (an error ends the step). */
void mg__pipe_around_backward(mg_pipe *p, void (*before)(void *ud, bool final),
                              mg_status (*after)(void *ud), void *ud);
/* Its chunks (virtual stages) on each rank, and whether two of its ranks
 * share a range (a tied unit). */
int mg__pipe_chunks(const mg_pipe *p);
/* Chunk i's arena range, and the chunk of the backward an after(ud)
 * follows. */
mg_range mg__pipe_chunk_range(const mg_pipe *p, int i);
int mg__pipe_current_chunk(const mg_pipe *p);
bool mg__pipe_has_ties(const mg_pipe *p);
/* The local chunk that runs unit u, or -1 (another rank's). */
int mg__pipe_chunk_of(const mg_pipe *p, int u);
/* The tied gradients are added by the caller (--deterministic, after its
 * tree, mg__pipe_sum_ties), not by the component's reduce. */
void mg__pipe_leave_ties(mg_pipe *p);
bool mg__pipe_ties_left(const mg_pipe *p);

#endif
