/* multigrad — the planner (src/parallel/planner.c, plan_memory.c,
 * plan_time.c; the tool is mgplan): for a model, a global batch and a
 * cluster (ranks per node x nodes, memory per rank, the links within a
 * node and between nodes, a rank's compute rate), every plan mgtrain can
 * run — mesh (dp, pp, tp), ZeRO stage, pipeline schedule and
 * micro-batches (or accumulation), recomputation, sequence parallelism —
 * with the memory each rank holds and the time of a step, ranked.
 *
 * Memory comes from the strategies' own accounting (mg_strategy_memory),
 * computed instead of counted: the model is built as each plan's part
 * without values (MG_SEED_DEFERRED: nothing is allocated but address
 * space), padded and cut as the strategy would, and ZeRO's buckets are
 * walked through a step as its hooks move them. Parameters, gradients
 * and optimizer state equal the counters of a real run; activations are
 * the tapes the run makes.
 *
 * Time is a model: compute from the units' FLOPs at the rank's rate
 * (measured, or given), the collectives from the builtin backend's cost
 * model (mg_coll_time) on the link each dimension's group spans, the
 * pipeline's bubble from its schedule's simulation (mg_pipe_simulate),
 * DDP's all-reduce hidden behind backward where the cores allow, the
 * optimizer's pass over its state at the rank's memory rate.
 *
 * Limits: one model and one dtype (float32) per search; offload to files
 * and DataParallel threads are not searched; tensor parallelism only
 * within the zoo's split layers (gpt, mlp, lenet5, lenet-d2l); the time
 * model knows nothing of kernels slowing as a split makes GEMMs small. */
#ifndef MULTIGRAD_PLANNER_H
#define MULTIGRAD_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include "core.h"
#include "comm.h"
#include "nn.h"
#include "optim.h"
#include "pipeline.h"
#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_plan_cluster {
    int ranks_per_node, nodes;
    int cores;               /* per node; ranks beyond share them (0: one each) */
    double memory;           /* bytes a rank may hold (0: no limit) */
    double flops;            /* a rank's FLOP/s on the model's training step */
    double overhead;         /* seconds a micro-batch's forward and backward of the
                                whole model costs beyond its FLOPs (a rank's
                                stage: its share of the FLOPs of it) */
    double bytes_per_s;      /* a rank's optimizer pass: bytes of state read and written */
    double overlap;          /* the share of backward that hides collectives (0-1) */
    mg_link intra, inter;    /* within a node, between nodes */
} mg_plan_cluster;

typedef struct mg_plan_job {
    const char *model;       /* a zoo name; gpt-mini takes the sizes in gpt */
    mg_gpt_config gpt;
    int batch;               /* samples per optimizer step, all ranks */
    mg_optim_kind optimizer; /* its state per parameter: Adam 2, SGD 1 with momentum */
    float momentum;
    double bucket_mb;        /* DDP and ZeRO bucket cap (0: 25) */
    bool evaluates;          /* the run evaluates: ZeRO-3 gathers every parameter for it */
    /* The search (false: tried): */
    bool no_recompute, no_sequence_parallel, no_zero, no_pipeline, no_tp;
    /* Only plans of these (0, or -1 for the last two: any): */
    int dp, pp, tp, zero, schedule;
} mg_plan_job;
/* The zoo model's batch and optimizer, the defaults above, any plan; a
 * language model evaluates. */
mg_status mg_plan_job_defaults(const char *model, mg_plan_job *out);

/* One plan and what it costs a rank: the largest figures any rank has. */
typedef struct mg_plan {
    int dp, pp, tp;
    int zero;                /* 0: plain replicas (DDP), 1-3 */
    mg_pipe_kind schedule;   /* pp > 1 */
    int chunks;              /* pp > 1: model chunks per rank (interleaved 2) */
    int micro;               /* micro-batches per step: a pipeline's M, else --accumulate */
    int local;               /* samples per rank and micro-batch */
    bool recompute, sequence_parallel;
    mg_memory_stats memory;  /* parameters, gradients, optimizer, activations */
    size_t bytes;            /* their sum */
    /* Seconds per step: computing (recomputation included), the pipeline's
     * idle time, tensor-parallel and pipeline transfers (on the critical
     * path), the data-parallel collectives and what of them backward does
     * not hide, the optimizer, and the step. */
    double compute, bubble, tp_comm, pp_comm, dp_comm, dp_exposed, optimizer, step;
    bool fits;               /* bytes within the cluster's memory */
} mg_plan;

/* Every plan of the job on the cluster, fitting or not, ranked: those
 * that fit by step time, then the others by bytes. *out (free it) gets
 * *n of them. MG_EINVAL, one line, for a job or cluster that is wrong
 * (an unknown model, a batch or world size no mesh divides). */
mg_status mg_plan_search(const mg_plan_job *job, const mg_plan_cluster *cl, mg_plan **out,
                         int *n);
/* The plan's figures for one rank of it (mesh coordinates from the rank
 * number as the mesh lays them out), memory exact as mg_strategy_memory
 * counts it (the test compares them): for checks and --verify. */
mg_status mg_plan_rank_memory(const mg_plan_job *job, const mg_plan *p, int rank,
                              mg_memory_stats *out);
/* Why the first plan is the one: a line naming the constraint that
 * decided (memory, the links, the bubble...), given the ranked list. */
void mg_plan_reason(const mg_plan *ranked, int n, const mg_plan_cluster *cl, char *buf,
                    size_t cap);
/* The seed's rules of thumb applied to the ranked plans (the fastest
 * plan of the kind each names that fits): on one node, or across nodes
 * whose links are fast (100 Gb/s or more), plain data parallelism while
 * it fits, else ZeRO (its lowest stage that fits), else a pipeline, else
 * tensor parallelism; across slow links, tensor parallelism over a
 * node's ranks, a pipeline over the nodes and ZeRO-1 over the replicas
 * (the fewest stages that fit). Its index in ranked, or -1 when no plan
 * of that kind fits. */
int mg_plan_rule_of_thumb(const mg_plan *ranked, int n, const mg_plan_cluster *cl);
/* mgtrain's flags for the plan ("--mesh dp=2,pp=2,tp=1 --zero 1 --batch
 * 32 --micro-batches 4 ..."), the model's size flags included. */
void mg_plan_flags(const mg_plan_job *job, const mg_plan *p, char *buf, size_t cap);
/* The same into a trainer's config (mesh, zero, schedule, micro-batches,
 * batch and accumulation, recomputation, sequence parallelism, strategy);
 * mesh points into storage of at least 48 bytes the caller keeps. */
void mg_plan_apply(const mg_plan *p, char *mesh, size_t mesh_cap, mg_train_config *c);

/* This machine as a cluster of ranks_per_node x nodes ranks: its cores
 * (mg_local_cpus), the builtin backend's links (shared memory within the
 * node, TCP between nodes), the share of backward that hides collectives
 * (what cores beyond the ranks leave: min(1, cores / ranks - 1)), memory
 * as given (bytes a rank; 0: no limit); the rates are left to
 * mg_plan_measure. */
mg_plan_cluster mg_plan_cluster_here(int ranks_per_node, int nodes, double memory);
/* The plan of mgtrain --plan auto: the job of a trainer's config (its
 * model, global batch = batch x accumulate, optimizer, buckets) on this
 * machine's ranks_per_node x nodes ranks, rates measured with as many
 * ranks at once as the node's cores hold, memory a rank may hold (0: what
 * the node has available, shared by its ranks): the fastest that fits in
 * *out and why in buf. MG_EINVAL, one line, when nothing fits. */
mg_status mg_plan_for(const mg_train_config *c, int ranks_per_node, int nodes, double memory,
                      mg_plan *out, char *why, size_t cap);

/* This machine's rates for the job's model: a rank's FLOP/s and the
 * overhead of a micro-batch, from training steps of micro-batches of
 * `local` samples and of a quarter of them (single-threaded, as mgtrain
 * runs a rank: time = overhead + samples x FLOPs / rate), and its
 * optimizer's bytes per second, with `ranks` of them running at once (as
 * many as a node's ranks share its cores and memory; each its own model,
 * at most 64); *cl's flops, overhead and bytes_per_s are set. */
mg_status mg_plan_measure(const mg_plan_job *job, int local, int ranks, mg_plan_cluster *cl);

#ifdef __cplusplus
}
#endif
#endif
