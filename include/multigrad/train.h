/* multigrad — the trainer: what mgtrain does, as a library. It joins the
 * job (the launcher's variables, the group, the device, the mesh, a resume
 * after mgrun restarted it), checks every input before any work and that
 * the ranks were started alike, builds the model and the plan (each rank
 * only its part), the optimizer (a language model decays only its 2-D
 * parameters) and the starting state (--resume, --init), and runs the loop:
 * image models by epochs over an IDX data set, language models by steps over
 * text, evaluating (test set, validation windows) into a metrics log with
 * its SVG plot and checkpoints, and calling back with progress and every
 * row of figures. A C program gets everything mgtrain does in a few calls:
 *
 *     mg_train_config c;
 *     mg_train_config_defaults("lenet-d2l", &c);   // then set what differs
 *     c.mesh = "pp=2,dp=2"; c.zero = 2;
 *     mg_trainer *t;
 *     if (mg_trainer_create(&c, &t) || mg_trainer_run(t, NULL)) ... mg_last_error()
 *     mg_trainer_destroy(t);
 *
 * A global batch is the same samples however the plan cuts it: images are
 * each epoch's permutation, rank r of the data-parallel ranks taking
 * perm[r::k]; text draws each step's rows once (mg_text_batch) and
 * micro-batch j, of accumulation or a pipeline, takes rows [jB, (j+1)B).
 *
 * Errors come back as a status with one line in mg_last_error() (a failure
 * of a step names the rank and its mesh coordinates); a rank that finds an
 * error the others cannot know of tells them (they fail with "stopping
 * because rank N failed") and leaves first. The trainer never exits. */
#ifndef MULTIGRAD_TRAIN_H
#define MULTIGRAD_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_train_row mg_train_row;
typedef struct mg_train_progress mg_train_progress;

/* A user's model built split for tensor parallelism as tp says (its
 * linears made with mg_layer_linear_split, in column-then-row pairs as
 * Megatron-LM's MLP; the whole model when tp.size is 1). */
typedef mg_status (*mg_model_split_factory)(void *ud, mg_tp_split tp, mg_model **out);

typedef struct mg_train_config {
    /* The model: a zoo name (gpt-mini of the sizes in gpt), or make: a
     * user's model (make it with MG_SEED_DEFERRED and every rank draws
     * only its part from seed; with values, rank 0's are broadcast), named
     * model in checkpoints; text says whether it is a language model. Or
     * make_split instead of make: the user's model, which the trainer then
     * asks for this rank's part of a mesh with tp > 1. */
    const char *model;
    mg_gpt_config gpt;
    mg_model_factory make;
    mg_model_split_factory make_split;
    void *make_ud;   /* for either */
    bool text;
    bool normalized_input;  /* images: (u8/255 - mean)/std (models.md), else u8/255 */
    /* Images: an IDX directory (NULL: MG_DATA, or Fashion-MNIST's);
     * text: a file or a directory of files (NULL: the fortunes corpus). */
    const char *data;
    /* Training: the global batch of a micro-batch (every rank takes
     * batch / dp) and micro-batches per step; epochs (images) or steps
     * (text). */
    int batch, accumulate, epochs;
    long steps;
    const char *optimizer;  /* sgd | adam | adamw */
    float lr, momentum;
    /* Adam's and AdamW's betas, a pair: beta2 0 (unset) takes the model's
     * for its own optimizer, torch's (0.9, 0.999) for another. */
    float beta1, beta2;
    float weight_decay;     /* < 0: the model's for its optimizer (AdamW 0.01) */
    float clip_grad;        /* < 0: the model's; 0: none */
    const char *schedule;   /* mg_schedule_parse's spec */
    uint64_t seed;
    int threads;            /* BLAS threads (0: MG_THREADS, else 1) */
    /* The plan: one process, DataParallel threads (workers), or a job's
     * ranks as mesh (NULL with ddp: dp=<ranks>), ZeRO stage zero on its
     * dp dimension; a pipeline when pp > 1. */
    mg_strategy_kind strategy;
    const char *mesh;
    bool sequence_parallel;            /* with tp > 1 in mesh: Megatron's, a gpt's */
    int zero;
    const char *pp_schedule, *split;   /* NULL: 1f1b, the balanced cut */
    int micro_batches, chunks;         /* 0: the stages; 1 (interleaved 2) */
    int workers;
    double bucket_mb;
    const char *compress;              /* none | fp16 | bf16 (DDP) */
    bool recompute;
    const char *offload_dir;           /* --offload disk:DIR */
    bool offload_cpu;
    /* A straggler on purpose (--slow-rank R:FACTOR): rank slow_rank's
     * forwards and backwards take slow_factor times as long (it sleeps
     * slow_factor - 1 times their time after each micro-batch); the
     * numbers are the same. slow_factor 0: none. Not with a pipeline. */
    int slow_rank;
    float slow_factor;
    /* --parallel ps: the last ps_servers ranks (default 1) serve the
     * parameters; ps_staleness steps a worker may run ahead (0;
     * MG_STALENESS_UNBOUNDED: fully asynchronous). */
    int ps_servers, ps_staleness;
    /* --elastic (with --parallel ps, under mgrun --elastic): a worker that
     * dies leaves the job; the others go on without it. */
    bool elastic;
    /* --deterministic: the step's rows (batch x accumulate) cut into
     * det_shards virtual shards (a power of two the data-parallel ranks
     * divide; 0: off), each a micro-batch of the same rows at any world
     * size, their gradients summed in one fixed tree: the same bits on 1
     * rank or W (det.c). */
    int det_shards;
    /* --tp-chunks: with det_shards, the fixed chunks of every dimension
     * a tensor-parallel split cuts (mg_strategy_options.det_chunks; 0: 2). */
    int det_chunks;
    /* --plan auto: the planner (planner.h) chooses the mesh, ZeRO stage,
     * schedule, micro-batches, recomputation and sequence parallelism for
     * the global batch (batch x accumulate) on the job's ranks, a rank
     * holding at most plan_memory bytes (0: the node's available memory
     * over its ranks); info.plan says which and why. */
    bool plan_auto;
    double plan_memory;
    const char *device;                /* NULL: cpu; cuda, cuda:N, emu */
    bool tf32, bf16;
    /* Evaluation: text every eval_every steps on eval_windows windows
     * (0: all, at most 512), and at step 0 unless no_eval_on_start. */
    int eval_every, eval_windows;
    bool no_eval_on_start;
    /* Files: a checkpoint written after every epoch or evaluation; the
     * training to continue (or weights to start from: init, looked up as
     * init_prefix<name>, init_partial taking those that fit); the metrics
     * log (CSV for .csv, else JSON lines) with its plot (.svg beside it),
     * written by rank 0 (the log given to rank 0 is the job's; another
     * rank's is not read). */
    const char *save, *resume, *init, *init_prefix, *log;
    bool init_partial;
    /* Stop after the plan (plan_only: no optimizer, no state; for printing
     * it); evaluate the starting weights only (eval_only). */
    bool plan_only, eval_only;
    /* More settings every rank must share ("key=value;..."): a tool's own
     * flags, compared with the trainer's before the first collective. */
    const char *settings;
    /* Called on every rank: after each step (progress) and with each row
     * of figures (after an epoch, an evaluation). May be NULL. */
    void (*on_progress)(const mg_train_progress *p, void *ud);
    void (*on_row)(const mg_train_row *r, void *ud);
    void *ud;
} mg_train_config;

/* The zoo model's defaults (models.md: batch, lr, momentum, epochs or
 * steps, optimizer, decay, clip, evaluation) and the rest at mgtrain's
 * defaults: one process, 2 workers, 25 MiB buckets. */
mg_status mg_train_config_defaults(const char *model, mg_train_config *out);

/* One row of figures, summed over the data-parallel ranks (NaN: none). */
struct mg_train_row {
    long epoch, step;                 /* images: epoch 1..; text: epoch 0 */
    double train_loss, train_acc;     /* since the last row */
    double test_loss, test_acc;       /* images */
    double val_loss, val_ppl;         /* text */
    double seconds, per_s, lr;        /* of the training since the last row; images
                                         or tokens per second */
    double elapsed;                   /* seconds since this run's training began, its
                                         evaluations and waits included (NaN: a log
                                         written before the column) */
};

/* Progress within an epoch (or between evaluations). */
struct mg_train_progress {
    long step, steps;          /* text: done and total steps */
    int epoch, epochs;         /* images: this epoch (from 0) and all */
    long done, total;          /* items of this epoch or run, all ranks */
    double per_item;           /* units per item: 1 image, or tokens per step */
    const char *unit;          /* "img" or "tok" */
    double loss;               /* mean train loss so far */
    double started;            /* mg_now() when the items began */
};

typedef struct mg_trainer mg_trainer;
/* The checks mg_trainer_create makes of c before it joins the job (flags
 * that do not go together, a device that is not there), alone: every rank
 * finds the same, so a tool makes them as it reads its flags and says a
 * mistake once (mgtrain: rank 0; the others wait for their launcher). */
mg_status mg_train_config_check(const mg_train_config *c);
/* Join, check, build and load as described above. Collective over the
 * job when the strategy is one of ranks. A mistake the ranks find once
 * joined (alike or not) fails on the first rank that found it with its
 * message, and with MG_ESTOPPED on every other rank (mg_group_agree's
 * MG_AGREE_LEAVE_FIRST): a tool says the one message once. */
mg_status mg_trainer_create(const mg_train_config *c, mg_trainer **out);
/* Destroys the plan, model, data and group; NULL is fine. */
void mg_trainer_destroy(mg_trainer *t);

typedef struct mg_train_summary {
    long steps_run;
    double seconds;        /* training only: evaluation and saving left out */
    double per_s;          /* images or tokens per second over them */
    /* The first step's seconds (its set-up: memory touched and offload
     * files written for the first time) and the rate over the others
     * (steady; 0 with one step). */
    double first_step_s, steady_per_s;
    mg_train_row last;     /* the last row (all NaN if none) */
} mg_train_summary;
/* Train from the starting state to the config's epochs or steps
 * (nothing when the checkpoint, or a run before, covers them); s may be
 * NULL. */
mg_status mg_trainer_run(mg_trainer *t, mg_train_summary *s);
/* Evaluate the weights now: test_loss/test_acc, or val_loss/val_ppl.
 * Collective: every rank of the job calls it. */
mg_status mg_trainer_evaluate(mg_trainer *t, mg_train_row *r);

/* What the trainer resolved and made. */
typedef struct mg_trainer_info {
    int rank, world;          /* in the job (0, 1 in one process); an elastic job's
                                 among the ranks that remain */
    int dp_rank, dp_size, pp; /* the data-parallel coordinate and ranks; stages */
    mg_tp_split tp;           /* this rank's tensor-parallel part (the mesh's tp) */
    int local;                /* samples per rank and micro-batch */
    bool distributed;         /* one rank of a job */
    bool restarted;           /* resuming after mgrun restarted the job */
    int init_left;            /* init_partial: tensors left out */
    long start_step, start_epoch;   /* where mg_trainer_run starts: the --resume checkpoint's,
                                       then where the last run ended */
    long train_samples, test_samples;   /* images */
    size_t text_bytes, text_train_bytes; /* text */
    int val_windows;          /* text: windows one evaluation takes */
    uint64_t step_sent, step_received;  /* bytes the steps moved, this rank */
    /* ... of them on each dimension of the mesh (tp, dp, pp; mg_mesh_dim),
     * with the time its operations took there */
    mg_traffic step_by_dim[MG_MESH_DIMS];
    long steps_run;           /* by this trainer */
    char collectives[128];    /* on GPUs: "NCCL (why)" or "staged through the host (why)" */
    char plan[1024];          /* --plan auto: its mgtrain flags, and on rank 0 why */
} mg_trainer_info;
mg_trainer_info mg_trainer_get_info(const mg_trainer *t);
/* The config as resolved (defaults, a pipeline's batch split into its
 * micro-batches: batch / micro_batches, accumulate = micro_batches). */
const mg_train_config *mg_trainer_config(const mg_trainer *t);
mg_model *mg_trainer_model(const mg_trainer *t);
mg_strategy *mg_trainer_strategy(const mg_trainer *t);
mg_optim *mg_trainer_optim(const mg_trainer *t);
/* The job's group for collectives (NULL in one process): the ranks that
 * remain, once an elastic job lost some. */
mg_group *mg_trainer_group(const mg_trainer *t);

/* Reports to f. The plan (rank 0; mgtrain --print-plan): every unit's
 * parameters, arena range, FLOPs and bytes kept, the tape of a
 * micro-batch, and a pipeline's cut and every rank's schedule, simulated.
 * The counters (lines starting "prefix: "): with MG_TRACE, how much of
 * DDP's all-reduce backward hid (rank 0); with verbose logging, what this
 * rank held at most and moved per step, what its device holds, its
 * pipeline's bubble as it lived it. */
mg_status mg_trainer_print_plan(const mg_trainer *t, FILE *f);
void mg_trainer_print_counters(const mg_trainer *t, const char *prefix, FILE *f);

/* The figures' fingerprint (mgtrain --print-hash): a SHA-256 of every
 * row this run recorded (rows a resumed run read back from its log, at
 * the log's precision, left out), each row's train loss, train accuracy,
 * test loss, test accuracy and validation loss as IEEE doubles
 * (little-endian), in order. Under --deterministic the same at any world
 * size. Not collective: every rank holds the rows. */
mg_status mg_trainer_figures_hash(const mg_trainer *t, uint8_t out[32]);

/* mg_group_agree(MG_AGREE_LEAVE_FIRST) over the job (one process: st). */
mg_status mg_trainer_agree(mg_trainer *t, mg_status st);

#ifdef __cplusplus
}
#endif
#endif
