/* multigrad — the data-parallel strategies: DistributedDataParallel
 * (ddp.c), ZeRO's counters (zero.c) and DataParallel threads (dp.c). A
 * strategy (plan.h) runs them as its components; a program may also use
 * DDP and DataParallel on their own, as here. */
#ifndef MULTIGRAD_STRATEGIES_H
#define MULTIGRAD_STRATEGIES_H

#include <stdbool.h>
#include <stdint.h>
#include "core.h"
#include "comm.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- DistributedDataParallel (ddp.c) -----------------------------------
 *
 * One replica per rank, as torch's DistributedDataParallel. At creation
 * rank 0's parameters and buffers are broadcast; the gradient arena moves
 * to group memory (mg_group_alloc) so ranks on one host reduce each
 * other's gradients in place. Gradients are grouped into buckets —
 * contiguous arena ranges split at tensor boundaries, the first capped at
 * first_bucket_bytes (1 MiB) and the others at bucket_bytes (25 MiB) — and
 * each bucket's async all-reduce starts from the model's backward hook as
 * soon as its last gradient is final, overlapping the rest of backward.
 * mg_ddp_finish() waits for all (launching any bucket whose parameters
 * received no gradient this step) and leaves averaged gradients.
 *
 * A step: zero_grad, forward, loss, backward, mg_ddp_finish, optimizer.
 * Gradient accumulation: mg_ddp_set_sync(d, false) for the first N-1
 * micro-batches (no communication, like no_sync()), true for the last. */
typedef enum { MG_COMPRESS_NONE, MG_COMPRESS_FP16, MG_COMPRESS_BF16 } mg_compress;
/* "none" | "fp16" | "bf16" */
mg_status mg_compress_parse(const char *s, mg_compress *out);

typedef struct mg_ddp_options {
    size_t bucket_bytes;        /* default 25 MiB */
    size_t first_bucket_bytes;  /* default 1 MiB */
    mg_compress compress;       /* communication hook: buckets sent as fp16/bf16 */
} mg_ddp_options;
mg_ddp_options mg_ddp_defaults(void);

typedef struct mg_ddp mg_ddp;
/* Collective: every rank of g calls it with the same model. */
mg_status mg_ddp_create(mg_group *g, mg_model *m, const mg_ddp_options *opt, mg_ddp **out);
/* Gives the model back ordinary gradient memory; collective. */
void mg_ddp_destroy(mg_ddp *d);
void mg_ddp_set_sync(mg_ddp *d, bool sync);
mg_status mg_ddp_finish(mg_ddp *d);
int mg_ddp_num_buckets(const mg_ddp *d);
/* Buckets whose all-reduce has started this step. */
int mg_ddp_launched(const mg_ddp *d);
void mg_ddp_bucket(const mg_ddp *d, int i, size_t *lo, size_t *hi);

/* Communication accounting, summed over synchronised steps. */
typedef struct mg_ddp_stats {
    long steps;
    double comm_us;     /* all-reduce time, launch to completion */
    double exposed_us;  /* time mg_ddp_finish waited: not hidden by backward */
} mg_ddp_stats;
mg_ddp_stats mg_ddp_get_stats(const mg_ddp *d);

/* The buckets of a model: ranges of whole units in arena order (the
 * order backward finishes them), the first closed once it holds
 * first_cap bytes and the others at cap, the last ending at the arena's
 * end. out has room for num_units + 1; returns their number. */
int mg_buckets(const mg_model *m, size_t first_cap, size_t cap, mg_range *out);
/* lcm(world, MG_SIMD_FLOATS): the unit pad that cuts every unit (and so
 * every bucket) into world equal, aligned shards. */
size_t mg_shard_pad(int world);

/* ---- ZeRO (zero.c) ----------------------------------------------------------
 *
 * The Zero Redundancy Optimizer over a data-parallel group: stage 1 shards
 * the optimizer state, stage 2 also the gradients, stage 3 also the
 * parameters. The arena is cut into buckets of whole units (DDP's caps);
 * rank r owns piece r of every bucket (internal.h), and its optimizer
 * updates exactly those pieces. Backward reduce-scatters each bucket
 * (summing) as soon as its units are done; stages 1 and 2 all-gather the
 * parameters after the optimizer step; stage 3 all-gathers each bucket
 * before its forward and its backward (prefetching the next) and gives the
 * rest back after. A strategy (plan.h) runs it as a component; its parts are internal
 * (src/parallel/internal.h). */
typedef struct mg_zero mg_zero;
/* Bytes of parameters and gradients this rank holds now (between steps:
 * what it keeps) and held at most, counted from what is gathered and
 * reduced (buckets in flight included). */
typedef struct mg_zero_stats {
    size_t param_bytes, grad_bytes;
    size_t peak_param_bytes, peak_grad_bytes;
} mg_zero_stats;
mg_zero_stats mg_zero_get_stats(const mg_zero *z);


/* ---- DataParallel (dp.c) ------------------------------------------------
 *
 * One process, `workers` threads on one model, as torch.nn.DataParallel:
 * scatter the batch in contiguous chunks, apply the model in parallel (each
 * thread forward, loss and backward on its own tape into its own gradient
 * arena), gather the loss and reduce the gradients onto the model's, each
 * weighted by its share of the batch — so one step equals one process on
 * the whole batch. Threads share the parameters; batch-norm running
 * statistics are the first thread's, as torch keeps device 0's. The
 * optimizer steps the model. */
typedef struct mg_dp mg_dp;
/* Wraps the caller's model (which must outlive it and have no unit hooks)
 * for batches up to max_batch. */
mg_status mg_dp_wrap(mg_model *m, int workers, int max_batch, mg_dp **out);
/* A zoo model made for it (destroyed with it). */
mg_status mg_dp_create(const char *model, uint64_t seed, int workers, int max_batch,
                       mg_dp **out);
/* A model made by `make` (e.g. a gpt-mini of other sizes through
 * mg_model_create_gpt), destroyed with it. */
typedef mg_status (*mg_model_factory)(void *ud, mg_model **out);
mg_status mg_dp_create_with(mg_model_factory make, void *ud, int workers, int max_batch,
                            mg_dp **out);
void mg_dp_destroy(mg_dp *dp);
mg_model *mg_dp_model(mg_dp *dp);
int mg_dp_workers(const mg_dp *dp);
/* Scatter, apply, gather, reduce: adds the gradients of the mean loss
 * over the batch (the threads' gradients, each weighted by its share of
 * the batch) to the model's gradient arena, as mg_model_backward
 * accumulates into a model's. So a step is: mg_model_zero_grad, then one
 * call per micro-batch — N calls with batches of B leave the sum of N
 * batch-mean gradients, exactly as N forward/backward passes in one
 * process; scale by 1/N for the mean over the N*B images — then the
 * optimizer. x is the batch as the model takes it (images as floats, a
 * language model's int32 tokens [batch, T]; y then has T labels per
 * sequence). *loss (may be NULL) gets the mean loss over the batch,
 * *correct (may be NULL) the argmax hits. A batch larger than max_batch
 * makes the threads' tapes again (MG_ENOMEM if that fails, the gradients
 * then left as they were). */
mg_status mg_dp_forward_backward(mg_dp *dp, const void *x, const int32_t *y, int batch,
                                 float *loss, int *correct);

#ifdef __cplusplus
}
#endif
#endif
