/* multigrad — parallel training: the distributed sampler (and, joining the
 * numeric core and the communication layer, the training strategies). */
#ifndef MULTIGRAD_PARALLEL_H
#define MULTIGRAD_PARALLEL_H

#include <stdbool.h>
#include <stdint.h>
#include "core.h"
#include "comm.h"
#include "nn.h"
#include "data.h"
#include "checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- distributed sampler ----------------------------------------------
 *
 * As torch.utils.data.DistributedSampler. Epoch e shuffles the whole data
 * set with mg_permutation(seed + e) — the same order on every rank — and
 * rank r takes perm[r::world] (models.md "Batch order"): with a global
 * batch B and local batch B/world, the union of the ranks' k-th local
 * batches is exactly the single-process k-th batch.
 *
 * Every rank gets the same number of indices: without drop_last the order
 * is padded by wrapping around to ceil(n / world) * world entries (a few
 * samples are seen twice per epoch, as in torch); with drop_last it is cut
 * to floor(n / world) * world. Without shuffle the order is 0..n-1. */
typedef struct mg_sampler {
    int n_samples;      /* size of the data set */
    int rank, world;
    bool shuffle, drop_last;
    uint64_t seed;
    int64_t epoch;
    int num_samples;    /* indices per rank and epoch */
    int64_t total_size; /* num_samples * world */
    int32_t *perm;      /* scratch: the epoch's order, n_samples entries */
    int32_t *indices;   /* this rank's indices, num_samples entries */
} mg_sampler;

/* Sets up the sampler at epoch 0. MG_EINVAL for n_samples < 0, world < 1
 * or rank outside [0, world); MG_ENOMEM if the index lists cannot be
 * allocated. */
mg_status mg_sampler_init(mg_sampler *s, int n_samples, int rank, int world,
                          bool shuffle, uint64_t seed, bool drop_last);
void mg_sampler_free(mg_sampler *s);
/* Selects the epoch (call it before each epoch, as in torch, or every
 * epoch reuses the same order). */
void mg_sampler_set_epoch(mg_sampler *s, int64_t epoch);
/* This rank's indices for the current epoch; *n (when not NULL) gets
 * their number. Valid until the next set_epoch or free. */
const int32_t *mg_sampler_indices(const mg_sampler *s, int *n);

/* Sharded evaluation: rank r evaluates [*begin, *end) of n samples. The
 * shards are contiguous, disjoint and cover 0..n-1 without padding (sizes
 * differ by at most one, some may be empty), so correct/total counts summed
 * over ranks are exact. MG_ASSERTs 0 <= rank < world and n >= 0. */
void mg_shard_range(int n, int rank, int world, int *begin, int *end);


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
 * rank r owns piece r of every bucket (mg_zero_pieces), and its optimizer
 * updates exactly those pieces. Backward reduce-scatters each bucket
 * (summing) as soon as its units are done; stages 1 and 2 all-gather the
 * parameters after the optimizer step; stage 3 all-gathers each bucket
 * before its forward and its backward (prefetching the next) and gives the
 * rest back after. The strategy (mg_strategy_create with kind
 * MG_STRATEGY_ZERO) drives it; the functions below are its parts. */
typedef struct mg_zero mg_zero;
/* MG_EINVAL unless 1 <= stage <= 3. */
mg_status mg_zero_stage_check(int stage);
/* Collective: every rank of g with the same model; pads the units to
 * lcm(world, SIMD width) and broadcasts rank 0's parameters. opt: bucket
 * caps (compression is refused). */
mg_status mg_zero_create(mg_group *g, mg_model *m, int stage, const mg_ddp_options *opt,
                         mg_zero **out);
void mg_zero_destroy(mg_zero *z);
int mg_zero_stage(const mg_zero *z);
int mg_zero_num_buckets(const mg_zero *z);
/* This rank's pieces of the arena, ascending (one per bucket). */
const mg_range *mg_zero_pieces(const mg_zero *z, int *n);
/* Zero the gradients this rank holds. */
void mg_zero_zero_grad(mg_zero *z);
/* Around one micro-batch's forward and backward (last: of the step):
 * the hooks gather and reduce between them; end waits for the
 * reductions and returns the first communication error. */
void mg_zero_begin(mg_zero *z, bool last);
mg_status mg_zero_end(mg_zero *z);
/* After the optimizer: stages 1-2 all-gather the parameters. */
mg_status mg_zero_after_step(mg_zero *z);
/* Stage 3: the whole parameters on every rank (evaluation, sampling,
 * saving weights) until mg_zero_release gives back all but the pieces.
 * Collective; nothing for stages 1-2. */
mg_status mg_zero_gather(mg_zero *z);
/* Offloaded parameters: written back to the file from the arena's pieces
 * (which may have been changed since gather or pieces_in), then given back. */
mg_status mg_zero_release(mg_zero *z);
/* Offload (--offload disk:DIR), ZeRO-Offload's split: stages 2-3 keep
 * the gradient pieces in a file in dir (mg_scratch; each micro-batch's
 * reduced piece is added there, the last one's scaled to the mean with
 * its sum of squares kept for clipping, grad_sumsq), and stage 3 the
 * parameter pieces too: nothing of them stays in memory between a
 * bucket's uses, a gather reads the piece first. pieces_in reads every
 * parameter piece into the arena (saving, loading) until release. The
 * files (NULL unless offloaded) are laid out as the optimizer over
 * mg_zero_pieces lays out a state, so the optimizer reads and steps them
 * there (mg_optim_offload). Nothing for stage 1. */
mg_status mg_zero_offload(mg_zero *z, const char *dir);
mg_status mg_zero_pieces_in(mg_zero *z);
mg_scratch *mg_zero_param_store(const mg_zero *z);
mg_scratch *mg_zero_grad_store(const mg_zero *z);
double mg_zero_grad_sumsq(const mg_zero *z);
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

/* ---- language models (lm.c) ----------------------------------------------
 *
 * Validation loss of a language model on a text's validation windows
 * (models.md D: mean cross-entropy over all positions of the first 512
 * windows of T = mg_model_positions(m)), in batches of `batch`. With a
 * group g (may be NULL) it is collective: each rank evaluates a contiguous
 * share of the windows and every rank gets the whole figure. */
mg_status mg_lm_val_loss(mg_model *m, const mg_text *t, int batch, mg_group *g, double *loss);
/* The same through a strategy (collective), on the first n_windows of
 * those windows (0: all; nanoGPT's eval_iters for big models whose
 * evaluation is slow): data-parallel replica `replica` of `replicas` takes
 * its contiguous share of them, evaluated by mg_strategy_evaluate; every
 * rank gets the whole figure. */
typedef struct mg_strategy mg_strategy;
mg_status mg_strategy_lm_val_loss(mg_strategy *s, const mg_text *t, int batch, int replica,
                                  int replicas, int n_windows, double *loss);
/* How many windows that evaluates: mg_text_val_windows, at most max
 * (0: no limit). */
int mg_lm_val_windows(const mg_text *t, int T, int max);

/* Pipeline schedules (below) and the options of the pipeline strategy. */
typedef enum { MG_PIPE_NAIVE, MG_PIPE_GPIPE, MG_PIPE_1F1B, MG_PIPE_INTERLEAVED } mg_pipe_kind;
/* The pipeline strategy's schedule (the executor, pipeline.c, below). */
typedef struct mg_pipe_options {
    mg_pipe_kind kind;
    int micro_batches;   /* M: micro-batches per step */
    int chunks;          /* V (interleaved); 0 means 1 */
    const int *first;    /* S + 1 unit boundaries, or NULL: balanced */
} mg_pipe_options;
typedef struct mg_pipe mg_pipe;
typedef struct mg_mesh mg_mesh;

/* ---- Strategies and the training step (strategy.c) ----------------------
 *
 * A strategy owns the job's mesh and how a step turns a batch into
 * forward/backward work and communication, which ranges of the arena
 * this process's optimizer updates (its state arenas are exactly those),
 * and how checkpoints are written and read. It is an ordered list of
 * components (component.h): with pp > 1 in the mesh, the pipeline; then
 * the kind's over the data-parallel dimension — none: one process (or a
 * pipeline without replicas); dp: DataParallel threads on one model; ddp:
 * DistributedDataParallel (its units padded to lcm(dp size, SIMD
 * width)); zero: ZeRO 1-3; pipeline: as ddp. Make the strategy before
 * the optimizer (mg_strategy_optim). */
typedef enum { MG_STRATEGY_SINGLE, MG_STRATEGY_DP, MG_STRATEGY_DDP,
               MG_STRATEGY_ZERO, MG_STRATEGY_PIPELINE } mg_strategy_kind;
/* "none" (or "single") | "dp" | "ddp" | "zero" | "pipeline" */
mg_status mg_strategy_parse(const char *s, mg_strategy_kind *out);

typedef struct mg_strategy_options {
    mg_strategy_kind kind;
    int max_batch;          /* the largest micro-batch this process runs */
    int workers;            /* dp: threads */
    /* The job's group (NULL: one process) and its ranks as a mesh (the
     * --mesh syntax, mg_mesh_parse; NULL: "dp=<all>"): the strategy makes
     * the mesh and its groups (mg_strategy_mesh) and owns them. */
    mg_group *group;
    const char *mesh;
    mg_ddp_options ddp;     /* ddp: buckets, compression; zero: buckets */
    int zero_stage;         /* zero: 1, 2 or 3 */
    /* Offload (--offload disk:DIR): the optimizer state, and under ZeRO
     * stage 3 the parameter pieces, in files in this directory, streamed
     * in windows of offload_window bytes per array (0: MG_OFFLOAD_WINDOW_MB). */
    const char *offload_dir;
    size_t offload_window;
    /* A model on a device (--offload cpu, DeepSpeed's ZeRO-Offload): the
     * optimizer's state stays in host memory and steps there; each step
     * the gradients of this process's ranges come to the host and their
     * parameters go back. Nothing changes for a model on the CPU. */
    bool offload_cpu;
    /* A mesh with pp > 1: the pipeline's schedule (its stages' replicas,
     * a dp dimension, are the kind's: ddp averages them). */
    mg_pipe_options pipe;
    /* Components added after those of kind, in this order (component.h):
     * NULL-terminated, or NULL. */
    const struct mg_component_ops *const *components;
} mg_strategy_options;
mg_strategy_options mg_strategy_defaults(mg_strategy_kind kind);

typedef struct mg_strategy mg_strategy;
/* Collective over the job's group, when there is one: it makes the mesh,
 * and rank 0's parameters reach every rank. The model must outlive the
 * strategy. */
mg_status mg_strategy_create(mg_model *m, const mg_strategy_options *o, mg_strategy **out);
void mg_strategy_destroy(mg_strategy *s);
const char *mg_strategy_name(const mg_strategy *s);
mg_model *mg_strategy_model(const mg_strategy *s);
mg_ddp *mg_strategy_ddp(const mg_strategy *s);   /* NULL unless ddp (or a pipeline's replicas) */
mg_zero *mg_strategy_zero(const mg_strategy *s); /* NULL unless zero */
mg_pipe *mg_strategy_pipe(const mg_strategy *s); /* NULL unless pipeline */
/* The job's mesh (NULL in one process): its groups and this rank's
 * coordinates (the data-parallel one shards the data). */
mg_mesh *mg_strategy_mesh(const mg_strategy *s);
/* The arena ranges this process's optimizer updates (the whole arena, or
 * a ZeRO rank's pieces), ascending. */
const mg_range *mg_strategy_ranges(const mg_strategy *s, int *n);
/* An optimizer whose state covers exactly those ranges (offloaded as the
 * options say). */
mg_status mg_strategy_optim(mg_strategy *s, const mg_optim_config *cfg, mg_optim **out);
/* The whole parameters on this process for evaluation, sampling or
 * export (ZeRO-3 gathers them; collective), until release. */
mg_status mg_strategy_gather(mg_strategy *s);
mg_status mg_strategy_release(mg_strategy *s);
/* What this process held at most (bytes): parameters, gradients
 * (ZeRO: counted from what is gathered and reduced, buckets in flight
 * included; replicas: the arenas), optimizer state (o may be NULL) and
 * the activations of the model's tape. */
typedef struct mg_memory_stats {
    size_t params, grads, optim, activations;
} mg_memory_stats;
mg_memory_stats mg_strategy_memory(mg_strategy *s, const mg_optim *o);
/* Payload bytes this process sent and received through the strategy's
 * group so far (mg_group_traffic; zeros in one process). */
mg_traffic mg_strategy_traffic(const mg_strategy *s);
/* Sum n values over the data-parallel ranks (metrics); nothing in one
 * process. Collective. */
mg_status mg_strategy_sum(mg_strategy *s, double *v, int n);
/* Rank 0's parameters, buffers and dropout position on every rank (after
 * rank 0 changed them, e.g. loaded weights). Collective. */
mg_status mg_strategy_sync(mg_strategy *s);
/* Checkpoints (checkpoint.h): rank 0 writes or reads, and every rank gets
 * the outcome (rank 0's error message), the state and the metadata.
 * Collective. */
mg_status mg_strategy_save(mg_strategy *s, const char *path, mg_optim *o,
                           const mg_ckpt_meta *meta);
mg_status mg_strategy_load(mg_strategy *s, const char *path, mg_optim *o, mg_ckpt_meta *meta);

/* One micro-batch as the model takes it (images as floats, a language
 * model's int32 tokens; y one label per position); last: the last of the
 * step (e.g. the end of an epoch). A source fills one and returns true,
 * or returns false when it has none. */
typedef struct mg_micro_batch {
    const void *x;
    const int32_t *y;
    int n;
    bool last;
} mg_micro_batch;
typedef bool (*mg_batch_source)(void *ud, mg_micro_batch *out);

typedef struct mg_step_options {
    int accumulate;     /* micro-batches per step (at most) */
    float lr;
    float clip_grad;    /* global gradient-norm clip; 0: none */
} mg_step_options;
typedef struct mg_step_result {
    int micro;          /* micro-batches run (0: the source had none) */
    long samples, correct;
    double loss_sum;    /* sum over samples of their micro-batch's mean loss */
    double grad_norm;   /* before clipping (with clip_grad) */
} mg_step_result;
/* The training step, the same for every strategy: zero the gradients;
 * forward, loss and backward of up to accumulate micro-batches from next
 * (communication on the last only); the mean over them; clipping; the
 * optimizer over the strategy's range. This process's figures in r. */
mg_status mg_train_step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                        mg_batch_source next, void *ud, mg_step_result *r);
/* Evaluation: the forward and loss of every micro-batch from next (until
 * it has none), no gradients, training mode off meanwhile; this process's
 * figures in r (a pipeline's on every stage: its last stage's), to be
 * summed over the data-parallel replicas (mg_strategy_sum). A pipeline
 * runs M micro-batches at a time through its stages; ZeRO-3 gathers the
 * parameters first and gives them back after. Collective where the
 * strategy communicates. */
mg_status mg_strategy_evaluate(mg_strategy *s, mg_batch_source next, void *ud,
                               mg_step_result *r);
/* mg_model_generate through the strategy (collective; every rank gets the
 * tokens): ZeRO-3 gathers the parameters, a pipeline runs each token's
 * forward through its stages, its last stage picks and the others take
 * its token. */
mg_status mg_strategy_generate(mg_strategy *s, const int32_t *prompt, int n_prompt, int n,
                               float temperature, int top_k, uint64_t seed, int32_t *out);

/* ---- device mesh (mesh.c) -------------------------------------------------
 *
 * The ranks of a group as a grid of named dimensions (`--mesh
 * dp=2,pp=2,tp=2`), as Megatron-LM lays them out: tp varies fastest
 * (tensor-parallel neighbours share a host), then dp, then pp, so
 *     rank = tp_i + tp * (dp_i + dp * pp_i).
 * Each dimension has its own sub-group (made with mg_group_split) holding
 * the ranks that differ only in that coordinate, ordered by it: a rank's
 * rank in its dimension-d group is its coordinate d. A dimension of size 1
 * has a 1-rank group. A strategy talks only to its own dimension's group. */
typedef enum { MG_MESH_TP, MG_MESH_DP, MG_MESH_PP, MG_MESH_DIMS } mg_mesh_dim;
/* "tp", "dp", "pp" */
const char *mg_mesh_dim_name(mg_mesh_dim d);
/* Pure: "dp=2", "dp=2,tp=2", "pp=2,dp=2,tp=2" (any order, each at most
 * once) into sizes[] indexed by mg_mesh_dim. A missing tp or pp is 1; a
 * missing dp is world / (tp * pp), as Megatron derives it; the product
 * must be world. Else MG_EINVAL with one line naming the spec, the problem
 * and what to write instead; sizes[] is then left as it was. */
mg_status mg_mesh_parse(const char *spec, int world, int sizes[MG_MESH_DIMS]);
/* "dp=2,pp=1,tp=2": sizes in this fixed order (for logs and plans). */
void mg_mesh_format(const int sizes[MG_MESH_DIMS], char *buf, size_t cap);

typedef struct mg_mesh mg_mesh;
/* Collective over g: every rank parses spec (with g's size as world),
 * the ranks check that they agree (one small all-reduce: a rank whose spec
 * is bad gets MG_EINVAL, the others MG_EMISMATCH, none waits for a
 * timeout) and then make one sub-group per dimension, tp, dp, pp in this
 * order. g must outlive the mesh. */
mg_status mg_mesh_create(mg_group *g, const char *spec, mg_mesh **out);
/* Destroys the sub-groups (not g); NULL is fine. */
void mg_mesh_destroy(mg_mesh *m);
int mg_mesh_size(const mg_mesh *m, mg_mesh_dim d);
/* This rank's coordinate along d: its rank in mg_mesh_group(m, d). */
int mg_mesh_coord(const mg_mesh *m, mg_mesh_dim d);
mg_group *mg_mesh_group(mg_mesh *m, mg_mesh_dim d);
/* mg_mesh_format of the mesh's sizes. */
void mg_mesh_describe(const mg_mesh *m, char *buf, size_t cap);

/* ---- pipeline schedules (schedule.c) ----------------------------------------
 *
 * A schedule is a pure function of (kind, P ranks, M micro-batches, V
 * chunks per rank, rank) to the ordered list of that rank's actions, as
 * torch.distributed.pipelining's IR: F and B of a (virtual) stage and a
 * micro-batch, and, once lowered, the sends and receives between
 * neighbouring stages. The model is cut into S = P·V stages; stage s runs
 * on rank s mod P (Megatron-LM's interleaving; V = 1 for the others).
 * One executor runs any list; a new schedule is one new generator. The
 * text form of an action is "<stage><kind><micro-batch>": 0F3, 1B0,
 * 1RECV_F3, 0SEND_B2. */
/* "naive" | "gpipe" | "1f1b" | "interleaved" */
mg_status mg_pipe_parse(const char *s, mg_pipe_kind *out);
const char *mg_pipe_name(mg_pipe_kind k);

typedef enum { MG_PIPE_F, MG_PIPE_B, MG_PIPE_SEND_F, MG_PIPE_RECV_F, MG_PIPE_SEND_B,
               MG_PIPE_RECV_B } mg_pipe_op;
typedef struct mg_pipe_action {
    int stage;   /* virtual stage: chunk * P + rank */
    mg_pipe_op op;
    int mb;      /* micro-batch */
} mg_pipe_action;

/* MG_EINVAL with a message unless 1 <= P, 1 <= M, 1 <= V, V > 1 only for
 * interleaved, and interleaved has M a multiple of P (Megatron-LM's
 * rounds of P micro-batches). */
mg_status mg_pipe_check(mg_pipe_kind k, int P, int M, int V);
/* The rank's compute actions (F and B only): the generators.
 *   naive:       F0 B0 F1 B1 ...: one micro-batch in the pipe at a time
 *                (with M = 1, the plain layer split). It also takes V > 1
 *                chunks (each micro-batch through all S stages and back),
 *                which mg_pipe_check refuses from users: the executor runs
 *                it for an interleaved step of fewer micro-batches than a
 *                multiple of P.
 *   gpipe:       every F, then every B: M micro-batches in flight.
 *   1f1b:        P-1-rank warm-up forwards, then one F one B, then the
 *                remaining B: at most P-rank in flight (PipeDream-Flush).
 *   interleaved: 1F1B over the rank's V chunks in rounds of P
 *                micro-batches (Megatron-LM): bubble (P-1)/(V·M+P-1).
 * Returns the count (2·M·V), writing at most cap actions. */
int mg_pipe_compute(mg_pipe_kind k, int P, int M, int V, int rank, mg_pipe_action *out, int cap);
/* The same with communication: RECV_F before each F of a stage s > 0,
 * SEND_F after it when s < S-1; RECV_B before each B of s < S-1, SEND_B
 * after it when s > 0. Returns the count, writing at most cap. */
int mg_pipe_lower(mg_pipe_kind k, int P, int M, int V, int rank, mg_pipe_action *out, int cap);
/* "0F3" and so on; the list joined by spaces. */
void mg_pipe_action_str(const mg_pipe_action *a, char *buf, size_t cap);
void mg_pipe_list_str(const mg_pipe_action *a, int n, char *buf, size_t cap);

/* Every rank's lowered list run in lock-step: sends never block, a
 * receive waits for its send, a forward costs tf and a backward tb (on a
 * chunk), messages are free. Since a send, once done, stays done, a list
 * set that completes this way completes under any interleaving of the
 * ranks; one that cannot is a deadlock (MG_EINVAL naming the stuck
 * actions). Also checks that every send has its one receive and every
 * backward follows its forward. */
typedef struct mg_pipe_sim {
    double makespan;       /* time of the last action */
    double busy[64];       /* per rank: time computing */
    double idle_fraction;  /* 1 - mean busy / makespan: the bubble */
    int peak_in_flight[64];/* per rank: forwards not yet backwarded, at most */
    long messages;         /* sends */
} mg_pipe_sim;
mg_status mg_pipe_simulate(mg_pipe_kind k, int P, int M, int V, double tf, double tb,
                           mg_pipe_sim *out);   /* (naive with V > 1 too) */
/* Cutting the model into S stages at unit boundaries (units in forward
 * order): first[s] is stage s's first unit, first[0] = 0, first[S] = n,
 * every stage at least one unit. balance minimises the largest stage's
 * cost (cost[u]: the unit's estimate, e.g. its forward FLOPs); MG_EINVAL
 * when S > n. split_parse takes the user's cut (--split): the names of the
 * units where stages 1 .. S-1 begin, comma-separated, in forward order. */
mg_status mg_pipe_balance(const double *cost, int n, int S, int *first);
mg_status mg_pipe_split_parse(const char *spec, const char *const *names, int n, int S,
                              int *first);

/* The same for any lists: a[r] (n[r] actions) is rank r's, for S stages
 * (stage s on rank s mod P) and M micro-batches: the validator of a
 * hand-written or new schedule. */
mg_status mg_pipe_run(const mg_pipe_action *const *a, const int *n, int P, int S, int M,
                      double tf, double tb, mg_pipe_sim *out);


/* ---- the pipeline executor (pipeline.c) ----------------------------------
 *
 * Runs any schedule above on a group of P ranks (the mesh's pp group):
 * the model is cut into S = P·V stages at unit boundaries (first, or
 * balanced by the units' forward FLOPs), rank r runs stages r, r + P, ...
 * each micro-batch on a tape of its stage's units (mg_tape_create_range),
 * as many tapes as micro-batches in flight. Activations and their
 * gradients travel between neighbouring stages in batches of sends and
 * receives (mg_batch_isend_irecv), tagged by stage and micro-batch; a
 * failed transfer names both stages and the micro-batch. Every rank
 * makes the whole model (one initialisation, as in one process) and
 * keeps only its stages' parameters (plus parameters its units borrow
 * from another rank's: gpt's head tied to the embedding, whose
 * gradients the two ranks add after the last backward). The training
 * strategy MG_STRATEGY_PIPELINE drives it; the functions are its parts. */
/* Collective over g: the ranks check that they were given the same
 * schedule, counts, batch and cut (MG_EMISMATCH naming a rank that was
 * not). max_batch: the largest micro-batch. */
mg_status mg_pipe_create(mg_group *g, mg_model *m, const mg_pipe_options *o, int max_batch,
                         mg_pipe **out);
void mg_pipe_destroy(mg_pipe *p);
/* The cut: S + 1 unit boundaries (*stages gets S). */
const int *mg_pipe_cut(const mg_pipe *p, int *stages);
/* The arena ranges this rank keeps and steps, ascending: at most one per
 * chunk and 8 borrowed. */
#define MG_PIPE_MAX_RANGES (64 + 8)
const mg_range *mg_pipe_ranges(const mg_pipe *p, int *n);
/* Those of them this rank owns, not empty: without the parameters it
 * borrows from another rank (which that rank counts in the norm and
 * writes to a checkpoint). */
const mg_range *mg_pipe_own_ranges(const mg_pipe *p, int *n);
/* A unit's cost as the balanced cut weighs it: its forward FLOPs (its
 * parameters when it has none, e.g. an embedding). */
double mg_pipe_unit_cost(const mg_model *m, int u);
/* One step's forwards and backwards: up to min(max_micro, M) micro-
 * batches from next (every rank of the pipeline draws the same; the first
 * stage reads their inputs, the last their labels), run as the schedule
 * says, gradients summed into the model's arena. r gets the count and
 * the last stage's loss sum, hits and samples, on every rank
 * (collective). A step with fewer micro-batches (an epoch's end) runs the
 * schedule for that count. */
mg_status mg_pipe_step(mg_pipe *p, mg_batch_source next, void *ud, int max_micro,
                       mg_step_result *r);
/* The same forwards without backwards (evaluation, generation: no
 * gradient, nothing held after): GPipe's order of forwards (interleaved's
 * under interleaved), the model's training mode as it is (dropout draws
 * only in training). The last stage's logits of its last micro-batch
 * stay in mg_pipe_logits (NULL on the other ranks) until the next run:
 * host memory (a copy, of a model on a device). */
mg_status mg_pipe_forward(mg_pipe *p, mg_batch_source next, void *ud, int max_micro,
                          mg_step_result *r);
const float *mg_pipe_logits(mg_pipe *p);
/* After the step: the two ranks holding tied parameters add their
 * gradients. */
mg_status mg_pipe_sum_ties(mg_pipe *p);
/* The sum of squares of this rank's gradients, borrowed ones left to
 * their owner (sum it over the group for the global norm). */
double mg_pipe_grad_sumsq(const mg_pipe *p);
/* Every stage's parameters and buffers on every rank (evaluation,
 * sampling, saving; collective), until release gives back all but this
 * rank's. */
mg_status mg_pipe_gather(mg_pipe *p);
void mg_pipe_release(mg_pipe *p);
/* Every stage's buffers (running statistics) on every rank: what a
 * checkpoint needs besides each rank's own ranges. Collective. */
mg_status mg_pipe_gather_buffers(mg_pipe *p);
typedef struct mg_pipe_stats {
    long steps;
    /* Summed over steps: computing forwards and backwards, and from the
     * step's start until every stage finished it. */
    double busy_us, step_us;
    int peak_in_flight;         /* micro-batches held at once, at most */
    size_t activation_bytes;    /* their tapes and inputs, at most */
} mg_pipe_stats;
mg_pipe_stats mg_pipe_get_stats(const mg_pipe *p);

#ifdef __cplusplus
}
#endif
#endif
