/* multigrad — the plan of a parallel job: the ranks as a mesh (mesh.c),
 * the strategy — an ordered list of components over it (strategy.c,
 * component.h) — with its training step, checkpoints, evaluation and
 * generation, and language models' validation (lm.c). */
#ifndef MULTIGRAD_PLAN_H
#define MULTIGRAD_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include "core.h"
#include "comm.h"
#include "nn.h"
#include "data.h"
#include "checkpoint.h"
#include "strategies.h"
#include "pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* ---- Strategies and the training step (strategy.c) ----------------------
 *
 * A strategy owns the job's mesh and how a step turns a batch into
 * forward/backward work and communication, which ranges of the arena
 * this process's optimizer updates (its state arenas are exactly those),
 * and how checkpoints are written and read. It is an ordered list of
 * components (component.h): with tp > 1 in the mesh, tensor parallelism
 * (the model must be built as this rank's part: mg_tp_split); with pp > 1,
 * the pipeline; then
 * the kind's over the data-parallel dimension — none: one process (or a
 * pipeline without replicas); dp: DataParallel threads on one model; ddp:
 * DistributedDataParallel (its units padded to lcm(dp size, SIMD
 * width)); zero: ZeRO 1-3; pipeline: as ddp. Make the strategy before
 * the optimizer (mg_strategy_optim). */
typedef enum { MG_STRATEGY_SINGLE, MG_STRATEGY_DP, MG_STRATEGY_DDP,
               MG_STRATEGY_ZERO, MG_STRATEGY_PIPELINE, MG_STRATEGY_PS } mg_strategy_kind;
/* A parameter server's staleness without a bound (--staleness inf). */
#define MG_STALENESS_UNBOUNDED (-1)
/* "none" (or "single") | "dp" | "ddp" | "zero" | "pipeline" | "ps" */
mg_status mg_strategy_parse(const char *s, mg_strategy_kind *out);
/* What a caller needs to know of a kind, so that it never asks which
 * kind it holds: its components talk over a job's ranks (a group is
 * needed); threads of one process split each micro-batch (max_batch is
 * the whole batch); DDP's gradient compression applies. */
typedef struct mg_strategy_traits {
    bool ranks, threads, compresses;
} mg_strategy_traits;
mg_strategy_traits mg_strategy_kind_traits(mg_strategy_kind k);

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
    /* ps: the last ps_servers ranks serve the parameters (each a run of
     * whole units and its optimizer state), the others compute (ps.c);
     * ps_staleness: how many steps a worker may run ahead of the slowest
     * (0: synchronous; MG_STALENESS_UNBOUNDED: fully asynchronous, each
     * push its own update); ps_elastic: a worker that fails leaves the
     * job and the others go on (the builtin backend's containment). */
    int ps_servers, ps_staleness;
    bool ps_elastic;
    /* --deterministic: the global batch's virtual shards V (a power of two
     * the data-parallel ranks divide; 0: off): each shard's gradient on
     * its own, all summed in one binary tree, dropout keyed by the
     * shard, the same bits at any world size and plan (det.c; a caller
     * feeding its own micro-batches gives rank r the shards r V/W ..
     * (r+1) V/W - 1 in order, accumulate = V/W). */
    int det_shards;
    /* With det_shards: the fixed chunks of every dimension a tensor-
     * parallel split cuts (mg_model_set_fixed_sums), a power of two that
     * the tp size divides, at most 64: runs that share it give the same
     * bits under any plan, tp included (defaults: 2; 0: off, no tp). */
    int det_chunks;
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
    /* A model made with MG_SEED_DEFERRED: each rank draws the values of
     * the parameters it holds from this seed (mg_model_init_ranges), the
     * same bytes as one process's mg_model_create(..., init_seed). */
    uint64_t init_seed;
} mg_strategy_options;
mg_strategy_options mg_strategy_defaults(mg_strategy_kind kind);

typedef struct mg_strategy mg_strategy;
/* Collective over the job's group, when there is one: it makes the mesh
 * and every rank starts from the same parameters: a model without values
 * (MG_SEED_DEFERRED) gets on each rank only those it holds, drawn from
 * init_seed, so no rank ever holds the whole model; one with values gets
 * rank 0's. The model must outlive the strategy. */
mg_status mg_strategy_create(mg_model *m, const mg_strategy_options *o, mg_strategy **out);
void mg_strategy_destroy(mg_strategy *s);
const char *mg_strategy_name(const mg_strategy *s);
/* The share of the global batch this rank's data is (component.h's
 * data_share; without one, the mesh's dp coordinate and size). */
void mg_strategy_data_share(const mg_strategy *s, int *rank, int *size);
/* The share of an evaluation's data this rank takes: the data share,
 * spread over the ranks that remain once some left (an elastic job). */
void mg_strategy_eval_share(const mg_strategy *s, int *rank, int *size);
/* Between steps, around the job's collectives (figures, evaluation, the
 * log, checkpoints): every component agrees which ranks remain (an
 * elastic parameter server's roll call). Call it before them with done
 * MG_OK, and after them with how they ended on this rank: when a rank
 * left amid them, *again comes back true on every rank that remains, to
 * do them again over those (mg_strategy_group); else done comes back,
 * its message kept, or an error where they worked here but failed on
 * another rank. Collective over the job; for the other plans it returns
 * done at once. */
mg_status mg_strategy_settle(mg_strategy *s, mg_status done, bool *again);
/* The job's group for its collectives now: the options' group, or the
 * group of the ranks that remain once some left (NULL: one process). */
mg_group *mg_strategy_group(const mg_strategy *s);
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
/* Checkpoints (checkpoint.h): one logical file, every rank writing and
 * reading its part (the parameters it holds, its optimizer ranges),
 * directly or through rank 0, which commits the file or checks it first;
 * every rank gets the outcome, its state and the metadata. Collective. */
/* A SHA-256 of the parameters as logical tensors (names, shapes, bytes,
 * in the model's order; buffers left out), whatever plan holds them, in
 * out on every rank (param_hash.c). Collective. */
mg_status mg_strategy_param_hash(mg_strategy *s, uint8_t out[32]);
mg_status mg_strategy_save(mg_strategy *s, const char *path, mg_optim *o,
                           const mg_ckpt_meta *meta);
mg_status mg_strategy_load(mg_strategy *s, const char *path, mg_optim *o, mg_ckpt_meta *meta);
/* Weights (mg_model_load_weights: a state_dict, e.g. PyTorch's, names
 * looked up as prefix<name>; n_left_out NULL refuses tensors the model has
 * no place for, else counts them): rank 0 checks the whole file, every
 * rank reads the parameters it holds, directly or through rank 0.
 * Collective. */
mg_status mg_strategy_load_weights(mg_strategy *s, const char *path, const char *prefix,
                                   int *n_left_out);

/* One micro-batch as the model takes it (images as floats, a language
 * model's int32 tokens; y one label per position); last: the last of the
 * step (e.g. the end of an epoch). A source fills one and returns true,
 * or returns false when it has none.
 * weight: its mean loss's share of the step, times the step's number of
 * micro-batches K (0 is 1: a step of K micro-batches of the same rows).
 * A step whose micro-batches differ in rows (an epoch's short last step:
 * 64 rows as 48 + 16) gives each K n / N of the step's N rows, so that
 * the step's gradient is the mean over its rows, as one batch of them
 * would give, not the mean of the micro-batches' means. */
typedef struct mg_micro_batch {
    const void *x;
    const int32_t *y;
    int n;
    bool last;
    float weight;
} mg_micro_batch;
typedef bool (*mg_batch_source)(void *ud, mg_micro_batch *out);

typedef struct mg_step_options {
    int accumulate;     /* micro-batches per step (at most) */
    float lr;
    float clip_grad;    /* global gradient-norm clip; 0: none */
    float slow;         /* > 1: this rank's forwards and backwards take that many times as
                           long (a straggler on purpose: it sleeps after each micro-batch) */
} mg_step_options;
typedef struct mg_step_result {
    int micro;          /* micro-batches run (0: the source had none) */
    bool updated;       /* a driving component applied the step's updates itself
                           (mg_strategy_update: a parameter server's, one per push) */
    long samples, correct;
    double loss_sum;    /* sum over samples of their micro-batch's mean loss */
    double grad_norm;   /* before clipping (with clip_grad) */
} mg_step_result;
/* The training step, the same for every strategy: zero the gradients;
 * forward, loss and backward of up to accumulate micro-batches from next
 * (communication on the last only); the mean over them; clipping; the
 * optimizer over the strategy's range. This process's figures in r.
 * MG_EINVAL, the parameters unchanged, for a micro-batch no model can take: no
 * rows, x or y NULL, a label outside 0 .. mg_model_classes - 1, a token
 * outside the vocabulary, a weight that is no number; and for a rate, clip
 * or accumulate out of range. Collective: in a job such a refusal revokes
 * the job's group (mg_group_revoke), so every rank's next collective fails
 * naming this rank and why, instead of pairing with this rank's next step. */
mg_status mg_train_step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                        mg_batch_source next, void *ud, mg_step_result *r);
/* Evaluation: the forward and loss of every micro-batch from next (until
 * it has none), no gradients, training mode off meanwhile; this process's
 * figures in r (a pipeline's on every stage: its last stage's), to be
 * summed over the data-parallel replicas (mg_strategy_sum). A pipeline
 * runs M micro-batches at a time through its stages; ZeRO-3 gathers the
 * parameters first and gives them back after. Collective where the
 * strategy communicates. Labels and tokens are checked as mg_train_step's,
 * and a refusal revokes the job's group as its does. */
mg_status mg_strategy_evaluate(mg_strategy *s, mg_batch_source next, void *ud,
                               mg_step_result *r);
/* mg_model_generate through the strategy (collective; every rank gets the
 * tokens): ZeRO-3 gathers the parameters, a pipeline runs each token's
 * forward through its stages, its last stage picks and the others take
 * its token. */
mg_status mg_strategy_generate(mg_strategy *s, const int32_t *prompt, int n_prompt, int n,
                               float temperature, int top_k, uint64_t seed, int32_t *out);

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
mg_status mg_strategy_lm_val_loss(mg_strategy *s, const mg_text *t, int batch, int replica,
                                  int replicas, int n_windows, double *loss);
/* How many windows that evaluates: mg_text_val_windows, at most max
 * (0: no limit). */
int mg_lm_val_windows(const mg_text *t, int T, int max);

#ifdef __cplusplus
}
#endif
#endif
