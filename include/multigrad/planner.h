/* multigrad — the planner (src/parallel/planner.c, plan_memory.c,
 * plan_time.c, plan_measure.c; the tool is mgplan): for a model, a global batch and a
 * cluster (ranks per node x nodes, memory per rank, the links within a
 * node and between nodes, a rank's compute rate), every plan mgtrain can
 * run — mesh (dp, pp, tp), ZeRO stage, pipeline schedule and
 * micro-batches (or accumulation), recomputation, sequence parallelism,
 * offload to files —
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
 * Time is a model (plan_time.c): a micro-batch's compute as measured on
 * this machine for its size and tensor-parallel part (plan_measure.c,
 * the part's collectives included), or from a rank's FLOP/s when the
 * cluster is given as figures; the collectives from the builtin
 * backend's cost model (mg_coll_time) on the link each dimension's group
 * spans (ZeRO's bucket collectives scaled as measured); the pipeline's bubble from its schedule's simulation
 * (mg_pipe_simulate); what backward hides of DDP's and ZeRO's reductions;
 * the optimizer's pass over its state at the rank's memory rate; with
 * offload, the files' reads and writes at the rate measured in the
 * offload directory.
 *
 * Offload (--offload disk:DIR) is tried for every plan that does not fit
 * without it (it only adds time): the optimizer's state in files, with
 * ZeRO 2-3 without a pipeline its gradient pieces too, and with ZeRO-3
 * its parameter pieces.
 *
 * Limits: one model and one dtype (float32) per search; DataParallel
 * threads and --offload cpu (a device's) are not searched; tensor parallelism only
 * within the zoo's split layers (gpt, mlp, lenet5, lenet-d2l); from
 * figures, every GEMM runs at one rate. */
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

#define MG_PLAN_MEASURED_TP 16
#define MG_PLAN_SIZES 8     /* micro-batches of 1, 2, 4 ... 128 samples */
typedef struct mg_plan_cluster {
    int ranks_per_node, nodes;
    int cores;               /* per node; ranks beyond share them (0: one each) */
    double memory;           /* bytes a rank may hold (0: no limit) */
    double flops;            /* a rank's FLOP/s on the model's training step */
    double overhead;         /* seconds a micro-batch's forward and backward of the
                                whole model costs beyond its FLOPs (a rank's
                                stage: its share of the FLOPs of it) */
    /* Measured: seconds of a training micro-batch (forward and backward)
     * of 2^k samples on a rank's part under tp = i <= MG_PLAN_MEASURED_TP
     * (0: not measured; between sizes the time is interpolated, beyond
     * them it grows in proportion; without any, flops and overhead). */
    double micro_s[MG_PLAN_MEASURED_TP + 1][MG_PLAN_SIZES];
    bool micro_with_tp;      /* a tp part's times include its collectives */
    double bytes_per_s;      /* a rank's optimizer pass: bytes of state read and written */
    /* Measured: bytes a second a rank writes into pages of its part's
     * parameter arena (under tp = i) that it gave back, a page fault each
     * (ZeRO-3's gathers, a pipeline's ZeRO 2-3 gradients; 0: free, as a
     * device's memory). */
    double refill_bytes_per_s[MG_PLAN_MEASURED_TP + 1];
    double disk_bytes_per_s; /* a rank's offload files, bytes read and written a second
                                with the node's ranks at once (0: offload not searched) */
    double overlap;          /* the share of backward that hides collectives (0-1) */
    mg_link intra, inter;    /* within a node, between nodes */
    /* Measured: ZeRO's reduce-scatter and all-gather of a bucket against
     * what the links' all-reduce fit gives for them (0: 1, as modelled). */
    double rs_scale, ag_scale;
} mg_plan_cluster;

typedef struct mg_plan_job {
    const char *model;       /* a zoo name; gpt-mini takes the sizes in gpt */
    mg_gpt_config gpt;
    int batch;               /* samples per optimizer step, all ranks */
    mg_optim_kind optimizer; /* its state per parameter: Adam 2, SGD 1 with momentum */
    float momentum;
    double bucket_mb;        /* DDP and ZeRO bucket cap (0: 25) */
    bool evaluates;          /* the run evaluates: ZeRO-3 gathers every parameter for it */
    /* Offload: the directory of the files (mgtrain's --offload disk:DIR;
     * NULL: "DIR" in the flags, not measured) and the bytes of a window
     * of one array (mg_strategy_defaults': MG_OFFLOAD_WINDOW_MB). */
    const char *offload_dir;
    size_t offload_window;
    /* The search (false: tried): */
    bool no_recompute, no_sequence_parallel, no_zero, no_pipeline, no_tp, no_offload;
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
    bool offload;            /* --offload disk:DIR */
    mg_memory_stats memory;  /* parameters, gradients, optimizer, activations */
    size_t bytes;            /* their sum */
    /* Seconds per step: computing (recomputation included), the pipeline's
     * idle time, tensor-parallel and pipeline transfers (on the critical
     * path), the data-parallel collectives (with ZeRO's refills of pages
     * it gave back) and what of them backward does not hide, the optimizer, the offload files' reads and writes that
     * nothing hides, and the step. */
    double compute, bubble, tp_comm, pp_comm, dp_comm, dp_exposed, optimizer, offload_io, step;
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
/* Plain data parallelism (DDP, or one process): the whole model on every
 * rank, without ZeRO, recomputation or offload. */
bool mg_plan_is_plain(const mg_plan *p);
/* "dp=2,pp=2,tp=1 zero1 1f1b M=8 recompute sp offload": the plan in one phrase. */
void mg_plan_describe(const mg_plan *p, char *buf, size_t cap);
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
 * 32 --micro-batches 4 ..."), the model's size flags included; offload
 * in the job's directory ("DIR" without one). */
void mg_plan_flags(const mg_plan_job *job, const mg_plan *p, char *buf, size_t cap);
/* The same into a trainer's config (mesh, zero, schedule, micro-batches,
 * batch and accumulation, recomputation, sequence parallelism, strategy,
 * offload: the config's offload_dir is kept only when the plan offloads);
 * mesh points into storage of at least 48 bytes the caller keeps. */
void mg_plan_apply(const mg_plan *p, char *mesh, size_t mesh_cap, mg_train_config *c);

/* This machine as a cluster of ranks_per_node x nodes ranks: its cores
 * (0: mg_local_cpus), the builtin backend's links (shared memory within the
 * node, TCP between nodes), the share of backward that hides collectives
 * (what cores beyond the ranks leave: min(1, cores / ranks - 1)), memory
 * a rank may hold (0: what the node has available over its ranks); the
 * rates are left to mg_plan_measure, the links to mg_plan_measure_links. */
mg_plan_cluster mg_plan_cluster_here(int ranks_per_node, int nodes, int cores, double memory);
/* The job's link, measured: all-reduces of 4 KiB and 4 MiB over g (the
 * slowest rank's mean of 20), fitted (mg_link_fit) into cl's link within
 * the node, or between nodes when cl has several; and a reduce-scatter
 * and an all-gather of a bucket (DDP's default cap) against that fit, into
 * rs_scale and ag_scale (out of cache, a reduce-scatter of 16 MiB ran 3x
 * slower a byte than of 4 MiB here). Collective. */
mg_status mg_plan_measure_links(mg_group *g, mg_plan_cluster *cl);
/* The job of a trainer's config: its model, global batch (batch x
 * accumulate), optimizer and buckets; it evaluates; offload is searched
 * when the config gives a directory for it (--offload disk:DIR). */
mg_status mg_plan_job_of(const mg_train_config *c, mg_plan_job *out);
/* The fastest plan that fits (mgtrain --plan auto's), and why in buf;
 * MG_EINVAL with the reason as the message when nothing fits. */
mg_status mg_plan_choose(const mg_plan_job *job, const mg_plan_cluster *cl, mg_plan *out,
                         char *why, size_t cap);

/* This machine's rates for the job's model (plan_measure.c), in this
 * process: the seconds of a training micro-batch of 1, 2, 4 ... samples
 * (single-threaded, as mgtrain runs a rank) up to the most a rank's
 * micro-batch holds (the global batch over cl's ranks, 1 to 16, times tp,
 * at most 128; smaller sizes while a part has taken under 10 s), for the
 * whole model and each tensor-parallel part of up to MG_PLAN_MEASURED_TP
 * ranks the search may take on cl's ranks (its collectives replaced by
 * local stand-ins); the whole model's FLOP/s and overhead (time =
 * overhead + samples x FLOPs / rate, from its two largest sizes); its
 * optimizer's bytes per second. */
mg_status mg_plan_measure(const mg_plan_job *job, mg_plan_cluster *cl);
/* The same on every rank of g at once (as the node's ranks will share its
 * cores and memory in training; they agree on the sizes and step counts,
 * so they run each size together), each tp part with the ranks of its tp
 * group and its collectives real (micro_with_tp: their time, waits for
 * the slowest rank included, is in micro_s), the job's link
 * (mg_plan_measure_links) and, when the job searches offload in a
 * directory, the files' rate there (mg_plan_measure_disk, the ranks at
 * once); every rank gets the slowest rank's figures, which a synchronous
 * step goes at. Collective. */
mg_status mg_plan_measure_job(mg_group *g, const mg_plan_job *job, mg_plan_cluster *cl);
/* The rate offloaded state moves at through files in dir (mg_scratch,
 * in windows of `window` bytes as the optimizer streams them): a file of
 * 128 MiB (at least 32 windows) written once, then written and read
 * again, timed; into cl->disk_bytes_per_s. */
mg_status mg_plan_measure_disk(const char *dir, size_t window, mg_plan_cluster *cl);

#ifdef __cplusplus
}
#endif
#endif
