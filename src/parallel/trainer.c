/* The trainer's set-up (train.h): the config checked before any work,
 * joining the job (the launcher, the group, the device, the mesh, the
 * pipeline's micro-batches, a restart), the outputs checked writable, the
 * data loaded and agreed on, the model and the plan (each rank draws only
 * its part), the optimizer and the starting state. Messages name mgtrain's
 * flags, which the config's fields mirror. The loop is train_loop.c. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "multigrad/trace.h"
#include "multigrad/planner.h"
#include "multigrad/train.h"
#include "parallel/ps.h"
#include "train_internal.h"


mg_status mg_train_config_defaults(const char *model, mg_train_config *c)
{
    MG_NEED("mg_train_config_defaults", model);
    MG_NEED("mg_train_config_defaults", c);
    mg_zoo_defaults d;
    MG_TRY(mg_zoo_defaults_of(model, &d));
    *c = (mg_train_config){
        .model = model, .gpt = mg_gpt_defaults(), .text = d.language_model,
        .normalized_input = d.normalized_input, .batch = d.batch, .accumulate = 1,
        .epochs = d.epochs, .steps = d.steps, .optimizer = mg_optim_kind_name(d.optimizer),
        .lr = d.lr, .momentum = d.momentum, .weight_decay = -1,
        .clip_grad = -1, .schedule = "constant", .workers = 2, .bucket_mb = 25,
        .compress = "none", .eval_every = d.eval_every};
    return MG_OK;
}

/* The strategy the flags ask for, and every mistake in them that needs no
 * rank (one line each; every rank finds the same). */
static mg_status check_config(mg_trainer *t)
{
    mg_train_config *c = &t->c;
    /* Fields a program may leave zero. */
    if (!c->schedule) c->schedule = "constant";
    if (!c->compress) c->compress = "none";
    if (!c->accumulate) c->accumulate = 1;
    if (!c->workers) c->workers = 2;
    if (!c->bucket_mb) c->bucket_mb = 25;
    if (!c->eval_every) c->eval_every = (int)(c->steps < INT32_MAX ? c->steps : INT32_MAX);
    if (!c->model)
        return mg_error(MG_EINVAL, "the training config has no model: give its name (a zoo "
                        "model's, or your make's)");
    if (c->threads < 0 || c->threads > 1024)
        return mg_error(MG_EINVAL, "threads %d: give 1 to 1024 BLAS threads, or 0 for "
                        "MG_THREADS (else 1)", c->threads);
    if (!(c->bucket_mb >= 0.001 && c->bucket_mb <= 65536))   /* as mgtrain's --bucket-mb */
        return mg_error(MG_EINVAL, "bucket_mb %g: give 0.001 to 65536 MB a bucket (0: 25)",
                        c->bucket_mb);
    if (c->batch < 1 || c->accumulate < 1 || (c->text ? c->steps < 1 : c->epochs < 1) ||
        !(c->lr > 0) || !c->optimizer)
        return mg_error(MG_EINVAL, "the training config needs a batch, an optimizer, a "
                        "learning rate and %s of at least 1 (mg_train_config_defaults gives "
                        "a zoo model's): it has batch %d, accumulate %d, %s %ld, lr %g, "
                        "optimizer %s", c->text ? "steps" : "epochs", c->batch, c->accumulate,
                        c->text ? "steps" : "epochs", c->text ? c->steps : (long)c->epochs,
                        c->lr, c->optimizer ? c->optimizer : "NULL");
    const float nums[] = {c->lr, c->momentum, c->weight_decay, c->clip_grad, c->beta1, c->beta2};
    const char *names[] = {"lr", "momentum", "weight_decay", "clip_grad", "beta1", "beta2"};
    for (int i = 0; i < 6; i++)   /* negative ones mean the model's; NaN and inf nothing */
        if (!isfinite(nums[i]))
            return mg_error(MG_EINVAL, "the training config's %s is %g: give a finite number",
                            names[i], nums[i]);
    int V = c->det_shards, rows = c->batch * c->accumulate;
    if (V < 0 || (V && (V & (V - 1) || rows % V)))
        return mg_error(MG_EINVAL, "--virtual-shards %d: give a power of two that divides the "
                        "step's %d rows (--batch x --accumulate)", V, rows);
    int C = c->det_chunks;
    if (C < 0 || C > 64 || (C & (C - 1)))
        return mg_error(MG_EINVAL, "--tp-chunks %d: give a power of two from 1 to 64 (each "
                        "tensor-parallel size you compare must divide it)", C);
    if (C && !V)
        return mg_error(MG_EINVAL, "--tp-chunks %d fixes the sums of --deterministic: give "
                        "--deterministic too, or leave it out", C);
    if (V && c->plan_auto)
        return mg_error(MG_EINVAL, "--deterministic fixes the step's micro-batches (its virtual "
                        "shards) and --plan auto chooses them: give one of them");
    /* The flags' kinds: --mesh lays out a job's ranks (its dp dimension
     * DDP's), --zero shards that job's state. */
    if (c->mesh && mg_strategy_kind_traits(c->strategy).threads)
        return mg_error(MG_EINVAL, "--mesh lays out the ranks of a job; --parallel dp is "
                        "threads in one process: give one of them");
    if (c->plan_auto && (c->mesh || c->zero || c->pp_schedule || c->micro_batches || c->chunks ||
                         c->split || c->recompute || c->sequence_parallel || c->accumulate > 1 ||
                         mg_strategy_kind_traits(c->strategy).threads))
        return mg_error(MG_EINVAL, "--plan auto chooses the mesh, --zero, the pipeline's flags, "
                        "--accumulate, --recompute and --sequence-parallel: leave them out, or "
                        "give them and leave out --plan auto");
    mg_launch l = mg_launch_detect();   /* a job's rank, or one process */
    if (c->plan_auto && l.by) c->strategy = MG_STRATEGY_DDP;
    if (c->mesh && !mg_strategy_kind_traits(c->strategy).ranks) c->strategy = MG_STRATEGY_DDP;
    if (c->sequence_parallel && !c->mesh)
        return mg_error(MG_EINVAL, "--sequence-parallel splits the positions over the "
                        "tensor-parallel ranks: give --mesh tp=T with T > 1");
    if ((c->pp_schedule || c->micro_batches || c->chunks || c->split) && !c->mesh)
        return mg_error(MG_EINVAL, "--pp-schedule, --micro-batches, --chunks and --split shape "
                        "a pipeline: give --mesh pp=P");
    if (c->strategy == MG_STRATEGY_PS && (c->mesh || c->zero || c->offload_dir || c->offload_cpu))
        return mg_error(MG_EINVAL, "--parallel ps keeps the optimizer's state on its servers: "
                        "leave out --mesh, --zero and --offload");
    if (c->strategy != MG_STRATEGY_PS && (c->ps_servers || c->ps_staleness || c->elastic))
        return mg_error(MG_EINVAL, "--servers, --staleness and --elastic shape a parameter "
                        "server: give --parallel ps");
    if (c->elastic && mg_env_long("MG_ELASTIC", 0) != 1)
        return mg_error(MG_EINVAL, "--elastic: the launcher stops the job when a worker dies; "
                        "start it with mgrun --elastic, which lets the others go on");
    if (c->strategy == MG_STRATEGY_PS && !c->ps_servers) c->ps_servers = 1;
    if (c->zero) {
        if (!mg_strategy_kind_traits(c->strategy).ranks)
            return mg_error(MG_EINVAL, "--zero %d shards the state of a data-parallel job: give "
                            "it with --parallel ddp or --mesh dp=N", c->zero);
        c->strategy = MG_STRATEGY_ZERO;
    }
    mg_strategy_traits kind = mg_strategy_kind_traits(c->strategy);
    if (!kind.ranks && l.size > 1)   /* else each rank trains a copy, all saving to one file */
        return mg_error(MG_EINVAL, "started as one of %d ranks of a job (%s%s), but --parallel "
                        "%s trains in one process: give --parallel ddp (or --mesh, or "
                        "--parallel ps), or start one process", l.size,
                        l.mpi ? "by " : "WORLD_SIZE set by ", l.mpi ? l.by : "mgrun or torchrun",
                        c->strategy == MG_STRATEGY_DP ? "dp" : "none");
    mg_zoo_defaults d;
    if (c->make && c->make_split)
        return mg_error(MG_EINVAL, "model '%s': make and make_split both given: give one (the "
                        "trainer asks make_split for this rank's tensor-parallel part)",
                        c->model);
    bool own = c->make || c->make_split, zoo = !own && !mg_zoo_defaults_of(c->model, &d);
    if (!own && !zoo) return mg_error(MG_EINVAL, "%s", mg_last_error());
    if (mg_optim_parse(c->optimizer, &t->optim))
        return mg_error(MG_EINVAL, "--optimizer: %s", mg_last_error());
    if (c->weight_decay < 0)
        c->weight_decay = zoo && t->optim == d.optimizer ? d.weight_decay
                        : t->optim == MG_OPTIM_ADAMW ? 0.01f : 0.0f;
    if (c->clip_grad < 0) c->clip_grad = zoo ? d.clip_grad : 0;
    if (c->beta2 > 0 && t->optim == MG_OPTIM_SGD)
        return mg_error(MG_EINVAL, "--betas apply to adam and adamw; this run's optimizer is "
                        "sgd: leave them out or give --optimizer adam or adamw");
    if (!(c->beta2 > 0)) {   /* unset: as weight decay, the model's for its own optimizer */
        c->beta1 = 0.9f;
        c->beta2 = zoo && t->optim == d.optimizer ? d.beta2 : 0.999f;
    }
    if (!(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 < 1))
        return mg_error(MG_EINVAL, "--betas %g,%g: give two numbers in [0, 1), the second "
                        "above 0 (torch.optim.Adam's betas)", c->beta1, c->beta2);
    mg_pipe_kind pk;
    if (!mg_pipe_parse(c->schedule, &pk))
        return mg_error(MG_EINVAL, "--schedule %s: --schedule is the learning-rate schedule; "
                        "the pipeline's is --pp-schedule %s", c->schedule, c->schedule);
    if (mg_schedule_parse(c->schedule, c->lr, &t->sched))
        return mg_error(MG_EINVAL, "--schedule: %s", mg_last_error());
    if (mg_compress_parse(c->compress, &t->compress))
        return mg_error(MG_EINVAL, "--compress: %s", mg_last_error());
    if (t->compress != MG_COMPRESS_NONE && !kind.compresses)
        return mg_error(MG_EINVAL, "--compress %s applies to --parallel ddp without --zero "
                        "(ZeRO reduce-scatters full-precision gradients)", c->compress);
    if (c->resume && c->init) return mg_error(MG_EINVAL, "--resume and --init both set: give one of them");
    if (c->init_partial && !c->init)
        return mg_error(MG_EINVAL, "--init-partial shapes --init: give --init FILE");
    mg_device dev;
    if (c->offload_dir && c->device && !mg_device_parse(c->device, &dev) &&
        dev.kind != MG_DEVICE_CPU)
        return mg_error(MG_EINVAL, "--offload disk:DIR keeps the optimizer's state in files for "
                        "a model on the CPU; with --device %s give --offload cpu (the state in "
                        "host memory)", c->device);
    if (c->slow_factor != 0 && (!(c->slow_factor > 1) || c->slow_factor > 1000 || c->slow_rank < 0))
        return mg_error(MG_EINVAL, "--slow-rank %d:%g: give a rank and a factor above 1 (at most "
                        "1000), e.g. 1:3", c->slow_rank, c->slow_factor);
    if (c->slow_factor != 0 && !kind.ranks)
        return mg_error(MG_EINVAL, "--slow-rank slows one rank of a job: give --parallel ddp or "
                        "--mesh, under mgrun");
    if (c->eval_only && !c->resume && !c->init)
        return mg_error(MG_EINVAL, "--eval-only needs weights: give --init FILE or --resume FILE");
    if (c->eval_only && c->log)   /* it wrote none, silently */
        return mg_error(MG_EINVAL, "--log records training; --eval-only prints its figures "
                        "alone: leave out --log");
    if (kind.threads && c->batch < c->workers)
        return mg_error(MG_EINVAL, "--batch %d is smaller than --workers %d: give each worker "
                        "at least one sample", c->batch, c->workers);
    const mg_gpt_config *g = &c->gpt;
    if (c->text && (g->layers < 1 || g->dim < 1 || g->heads < 1 || g->ctx < 1))
        return mg_error(MG_EINVAL, "gpt: layers %d, dim %d, heads %d, context %d: give each at "
                        "least 1", g->layers, g->dim, g->heads, g->ctx);
    if (c->text && g->vocab < 256)   /* the text's tokens are its bytes */
        return mg_error(MG_EINVAL, "gpt: vocab %d: the text's tokens are its bytes, 0 to 255: "
                        "give at least 256", g->vocab);
    if (c->text && g->dim % g->heads)
        return mg_error(MG_EINVAL, "--dim %d does not divide into --heads %d: give a multiple "
                        "of %d", g->dim, g->heads, g->heads);
    /* --device: cuda without an index is the local rank's GPU. */
    t->dev = (mg_device){MG_DEVICE_CPU, 0};
    if (c->device) {
        if (mg_device_parse(c->device, &t->dev))
            return mg_error(MG_EINVAL, "--device: %s", mg_last_error());
        if (mg_device_check(t->dev))
            return mg_error(MG_EINVAL, "--device %s: %s", c->device, mg_last_error());
        if (t->dev.kind == MG_DEVICE_CUDA && !strcmp(c->device, "cuda"))
            t->dev.index = mg_device_cuda_local();
    }
    if (c->tf32 && t->dev.kind != MG_DEVICE_CUDA)
        return mg_error(MG_EINVAL, "--tf32 is for GPUs: give --device cuda");
    if (c->bf16 && t->dev.kind == MG_DEVICE_CPU)
        return mg_error(MG_EINVAL, "--bf16 is for devices: give --device cuda (or emu)");
    if (c->bf16 && c->tf32)
        return mg_error(MG_EINVAL, "--bf16 and --tf32 are two precisions of the GEMMs: give one");
    return MG_OK;
}

/* --mesh pp=P: --batch B is split into its M micro-batches, so from here
 * the run is one process's --batch B/M --accumulate M (the same rows,
 * logs and checkpoints). Under --deterministic the micro-batches are the
 * replica's V/dp virtual shards. */
static mg_status pipeline_config(mg_train_config *c, int P, int dp)
{
    if (strcmp(c->compress, "none"))
        return mg_error(MG_EINVAL, "--compress %s applies to --parallel ddp: a pipeline's "
                        "data-parallel replicas average full-precision gradients", c->compress);
    if (c->accumulate > 1)
        return mg_error(MG_EINVAL, "--accumulate %d with a pipeline: its micro-batches are the "
                        "accumulation; give --micro-batches %d", c->accumulate, c->accumulate);
    mg_pipe_kind k = MG_PIPE_1F1B;
    if (c->pp_schedule && mg_pipe_parse(c->pp_schedule, &k))
        return mg_error(MG_EINVAL, "--pp-schedule: %s", mg_last_error());
    if (!c->chunks) c->chunks = k == MG_PIPE_INTERLEAVED ? 2 : 1;
    bool given = c->micro_batches > 0;
    int shards = c->det_shards ? c->det_shards / dp : 0;
    if (c->det_shards && (c->det_shards % dp || (given && c->micro_batches != shards)))
        return mg_error(MG_EINVAL, "--deterministic: a pipeline's micro-batches are each "
                        "replica's virtual shards, %d / %d: leave out --micro-batches or give "
                        "that", c->det_shards, dp);
    if (!given) c->micro_batches = shards ? shards : P;
    MG_TRY(mg_pipe_check(k, P, c->micro_batches, c->chunks));
    if (c->batch % c->micro_batches)
        return mg_error(MG_EINVAL, "--batch %d does not split into --micro-batches %d%s: give a "
                        "multiple of %d", c->batch, c->micro_batches,
                        given ? "" : " (one per stage unless given)", c->micro_batches);
    c->batch /= c->micro_batches;
    c->accumulate = c->micro_batches;
    return MG_OK;
}

/* --plan auto: every rank measures its copy of the model at once (as
 * the node's ranks will run) and the link (mg_plan_measure_job), rank 0
 * chooses and every rank takes its choice. */
static mg_status choose_plan(mg_trainer *t)
{
    mg_train_config *c = &t->c;
    int world = t->g ? mg_group_size(t->g) : 1, local = t->g ? mg_group_local_size(t->g) : 1;
    mg_plan_job job;
    MG_TRY(mg_plan_job_of(c, &job));
    mg_plan_cluster cl = mg_plan_cluster_here(local, world / local, 0, c->plan_memory);
    mg_status st = t->g ? mg_plan_measure_job(t->g, &job, &cl) : mg_plan_measure(&job, &cl);
    if (st && t->g) return mg__train_step_error(t);
    char why[480] = "";   /* with the flags, within info.plan */
    mg_plan p = {0};
    if (!st && t->info.rank == 0) {
        st = mg_plan_choose(&job, &cl, &p, why, sizeof why);
        if (st) st = mg_error(st, "--plan auto: %s", mg_last_error());
    }
    MG_TRY(mg_group_agree(t->g, st, MG_AGREE_SHARE));   /* said once by join_job's agreement */
    /* The ranks run one program: the plan goes as its bytes. */
    if (t->g && mg_broadcast(t->g, &p, sizeof p, MG_U8, 0)) return mg__train_step_error(t);
    char flags[512];
    mg_plan_flags(&job, &p, flags, sizeof flags);
    /* The command as this job was launched: under mpirun, mpirun's. */
    bool mpi = mg_launch_detect().mpi && !strncmp(flags, "mgrun ", 6);
    snprintf(t->info.plan, sizeof t->info.plan, "%s%s%s%s", mpi ? "mpirun " : "",
             mpi ? flags + 6 : flags, *why ? "; because " : "", why);
    mg_plan_apply(&p, t->plan_mesh, sizeof t->plan_mesh, c);
    return MG_OK;
}

mg_status mg__train_agreed(mg_trainer *t, mg_status st)
{
    if (!t->g) return st;
    char why[1024] = "";
    if (st) snprintf(why, sizeof why, "%s", mg_last_error());
    mg_status a = mg_trainer_agree(t, st);
    /* The agreement failed itself (a peer lost): this rank's own says why. */
    return st && a != st && a != MG_ESTOPPED ? mg_error(st, "%s", why) : a;
}

static mg_status shape_job(mg_trainer *t);

/* One rank of a job: the launcher's group, then its shape (agreed). */
static mg_status join_job(mg_trainer *t)
{
    mg_train_config *c = &t->c;
    mg_trainer_info *in = &t->info;
    if (!mg_launch_detect().by) {
        const char *what = c->mesh ? "--mesh" : c->strategy == MG_STRATEGY_PS ? "--parallel ps"
                                                                              : "--parallel ddp";
        return mg_error(MG_EINVAL, "%s needs a launcher: run it as 'mgrun -n N mgtrain %s ...' "
                        "(or under mpirun)", what, c->mesh ? "--mesh dp=N" : what);
    }
    MG_TRY(mg_group_init(NULL, &t->g));
    in->distributed = true;
    in->rank = mg_group_rank(t->g);
    in->world = mg_group_size(t->g);
    return mg__train_agreed(t, shape_job(t));
}

/* The settings agreed before any other collective, collectives on the
 * device, the mesh's shape. Its collectives come first: after them every
 * rank makes the same checks, so that every rank ends here. */
static mg_status shape_job(mg_trainer *t)
{
    mg_train_config *c = &t->c;
    mg_trainer_info *in = &t->info;
    /* Ranks that disagree on a setting that shapes the collectives or the
     * numbers are told which, instead of failing later. */
    char settings[2048];
    MG_TRY(mg__train_settings(t, settings, sizeof settings));
    MG_TRY(mg__train_same_on_every_rank(t, settings));
    if (c->plan_auto) MG_TRY(choose_plan(t));
    /* On GPUs the group's collectives go through NCCL when every rank has
     * its own, else through the host; the mesh's groups follow. */
    if (t->dev.kind == MG_DEVICE_CUDA) {
        if (mg_group_use_device(t->g, t->dev))
            return mg_error(MG_EINVAL, "--device %s: %s", c->device, mg_last_error());
        const char *why, *path = mg_group_device_path(t->g, &why);
        snprintf(in->collectives, sizeof in->collectives, "%s (%s)",
                 strcmp(path, "nccl") ? "staged through the host" : "NCCL", why);
    }
    /* The mesh itself is the strategy's; every rank has the same spec, so
     * every rank finds the same mistakes in it here. */
    char spec[32];
    int size[MG_MESH_DIMS];
    snprintf(spec, sizeof spec, "dp=%d", in->world);
    if (mg_mesh_parse(c->mesh ? c->mesh : spec, in->world, size))
        return mg_error(MG_EINVAL, "--mesh: %s", mg_last_error());
    if (size[MG_MESH_PP] == 1 && (c->pp_schedule || c->micro_batches || c->chunks || c->split))
        return mg_error(MG_EINVAL, "--pp-schedule, --micro-batches, --chunks and --split plan a "
                        "pipeline, and --mesh %s has none: give pp=P", c->mesh);
    /* The mesh's layout (mesh.h): tp varies fastest. */
    in->tp = (mg_tp_split){size[MG_MESH_TP], in->rank % size[MG_MESH_TP], c->sequence_parallel};
    if (c->sequence_parallel && in->tp.size == 1)
        return mg_error(MG_EINVAL, "--sequence-parallel splits the positions over the "
                        "tensor-parallel ranks, and --mesh %s has none: give tp=T with T > 1",
                        c->mesh);
    if (in->tp.size > 1 && c->make)
        return mg_error(MG_EINVAL, "--mesh %s: tensor parallelism needs the model built split, "
                        "and make builds it whole: give make_split (its linears made with "
                        "mg_layer_linear_split), or tp=1", c->mesh);
    in->dp_size = size[MG_MESH_DP];
    if (c->strategy == MG_STRATEGY_PS) {   /* the batch is the workers' */
        if (c->ps_servers >= in->world)
            return mg_error(MG_EINVAL, "--servers %d among %d ranks leaves no worker: give at "
                            "most %d", c->ps_servers, in->world, in->world - 1);
        in->dp_size = in->world - c->ps_servers;
    }
    in->pp = size[MG_MESH_PP];
    if (in->pp > 1) MG_TRY(pipeline_config(c, in->pp, in->dp_size));
    if (c->slow_factor > 0 && in->pp > 1)
        return mg_error(MG_EINVAL, "--slow-rank slows a data-parallel rank's micro-batches; the "
                        "pipeline's schedule runs its own: leave out --slow-rank or pp=%d", in->pp);
    if (c->slow_factor > 0 && c->slow_rank >= in->world)
        return mg_error(MG_EINVAL, "--slow-rank %d:%g: the job has ranks 0 to %d", c->slow_rank,
                        c->slow_factor, in->world - 1);
    int V = c->det_shards;
    bool ps = c->strategy == MG_STRATEGY_PS;
    int micro = in->pp > 1 ? c->accumulate : 1;   /* a pipeline's --batch: its micro-batches' */
    /* The same step's rows in accumulation steps that divide (a probe:
     * --batch 4 --accumulate 3 on 3 ranks was refused with no way out). */
    int rows = c->batch * c->accumulate, a = micro > 1 ? 0 : c->accumulate;
    while (a > 0 && (rows % a || (rows / a) % in->dp_size)) a--;
    char keep[96] = "";
    if (a > 0 && a != c->accumulate)
        snprintf(keep, sizeof keep, ", or --batch %d --accumulate %d (the same step)", rows / a,
                 a);
    mg_status st = c->batch % in->dp_size
        ? mg_error(MG_EINVAL, "--batch %d does not divide among %d data-parallel ranks%s: use "
                   "a multiple of %d (--batch is the global batch)%s", c->batch * micro,
                   in->dp_size, micro > 1 ? " in each micro-batch" : "", in->dp_size * micro,
                   keep)
        : V && in->dp_size & (in->dp_size - 1)   /* no power of two V divides (a probe) */
        ? mg_error(MG_EINVAL, "--deterministic: %d %s cannot share the step's virtual shards, a "
                   "power of two (each takes V/ranks of them): give a power of two of them (%s)",
                   in->dp_size, ps ? "workers" : "data-parallel ranks",
                   ps ? "-n: the workers and --servers" : "--mesh dp=N with the other ranks in "
                   "pp or tp")
        : V && V % in->dp_size   /* a power of two dividing the rows: check_config */
        ? mg_error(MG_EINVAL, "--virtual-shards %d: the %d data-parallel rank(s) must divide it "
                   "(each takes V/ranks of the shards)", V, in->dp_size)
        : MG_OK;
    return st;
}

mg_status mg_trainer_agree(mg_trainer *t, mg_status st)
{
    return mg_group_agree(mg_trainer_group(t), st, MG_AGREE_LEAVE_FIRST);
}

/* The files rank 0 writes (the checkpoint, the log and the plot beside
 * it) can be written, and none is another of them or a file the run
 * reads (a --log named g.svg was overwritten by its own plot; --data
 * corpus.txt --log corpus.txt, the training text): found before any work,
 * not after the first epoch. A --save may be the --resume or --init file. */
static mg_status check_outputs(mg_trainer *t)
{
    const mg_train_config *c = &t->c;
    char plot[4096] = "";
    if (c->log) mg__log_plot_path(c->log, plot, sizeof plot);
    const char *flag[6] = {"--save", "--log", "--log (its plot)", "--data", "--init",
                           "--resume"};
    const char *path[6] = {c->save, c->log, c->log ? plot : NULL, c->data, c->init, c->resume};
    mg_status st = MG_OK;
    for (int i = 0; i < 3 && t->info.rank == 0 && !c->eval_only && !st; i++)
        for (int j = i + 1; j < 6 && path[i] && !st; j++)
            if (path[j] && !(i == 0 && j >= 4) && mg_same_file(path[i], path[j]))
                st = mg_error(MG_EINVAL, "%s %s is also the %s%s: give them different files",
                              flag[i], path[i], flag[j], j < 3 ? "" : " file this run reads");
    for (int i = 0; i < 3 && t->info.rank == 0 && !c->eval_only && !st; i++)
        if (path[i] && mg_check_writable(path[i]))
            st = mg_error(MG_EINVAL, "%s: %s", flag[i], mg_last_error());
    if (!st && c->offload_dir && !c->eval_only) {   /* each rank's own, said once */
        mg_scratch *s;
        st = mg_scratch_create(c->offload_dir, 0, "optimizer state", &s);
        mg_scratch_destroy(s);
    }
    return mg_trainer_agree(t, st);
}

/* The data: text is open already; images are loaded, and both are the
 * same on every rank. A parameter server takes no data: it loads the
 * images' shape alone, to count the batches of its steps. */
static mg_status load_data(mg_trainer *t)
{
    const mg_train_config *c = &t->c;
    char data[128];
    bool counts = c->strategy == MG_STRATEGY_PS &&
                  mg__ps_is_server(t->info.rank, t->info.world, c->ps_servers);
    mg_status (*load)(const char *, bool, mg_dataset **) =
        counts ? mg_dataset_load_shape : mg_dataset_load;
    if (c->text) {
        snprintf(data, sizeof data, "data=with %zu bytes", mg_text_size(t->text));
        t->info.text_bytes = mg_text_size(t->text);
        t->info.text_train_bytes = mg_text_train_size(t->text);
    } else {
        mg_status st = c->eval_only ? MG_OK : load(c->data, true, &t->train);
        MG_TRY(mg__train_agreed(t, st ? st : load(c->data, false, &t->test)));
        if (counts)
            mg_debug("rank %d, a parameter server: the data set's shape alone (%d and %d "
                     "images counted, not loaded)", t->info.rank, t->train ? t->train->n : 0,
                     t->test->n);
        t->info.train_samples = t->train ? t->train->n : 0;
        t->info.test_samples = t->test->n;
        snprintf(data, sizeof data, "data=with %ld+%ld images of %dx%d", t->info.train_samples,
                 t->info.test_samples, t->test->h, t->test->w);
    }
    return mg__train_same_on_every_rank(t, data);
}

/* The model without values (each rank draws its part), on its device. */
static mg_status make_model(mg_trainer *t)
{
    const mg_train_config *c = &t->c;
    mg_gpt_config g = c->gpt;
    g.tp = t->info.tp;
    if (c->make_split) MG_TRY(c->make_split(c->make_ud, t->info.tp, &t->m));
    else if (c->make) MG_TRY(c->make(c->make_ud, &t->m));
    else if (c->text) MG_TRY(mg_model_create_gpt(&g, MG_SEED_DEFERRED, &t->m));
    else MG_TRY(mg_model_create_split(c->model, MG_SEED_DEFERRED, t->info.tp, &t->m));
    if (!t->m)   /* a make that said MG_OK and made nothing: a segfault (a probe) */
        return mg_error(MG_EINVAL, "the config's make for '%s' returned MG_OK without a model: "
                        "set *out, or return the status that says why not", c->model);
    mg_model_set_recompute(t->m, c->recompute);
    if (mg_model_to_device(t->m, t->dev))
        return mg_error(MG_EINVAL, "--device %s: %s", c->device, mg_last_error());
    if (c->tf32 && mg_device_set_tf32(t->dev, true))
        return mg_error(MG_EINVAL, "--tf32: %s", mg_last_error());
    if (c->bf16 && mg_device_set_bf16(t->dev, true))
        return mg_error(MG_EINVAL, "--bf16: %s", mg_last_error());
    return MG_OK;
}

/* The strategy over the model: its mesh, buckets, ZeRO stage, offload and
 * the pipeline's schedule and cut. */
static mg_status make_plan(mg_trainer *t)
{
    const mg_train_config *c = &t->c;
    mg_strategy_options so = mg_strategy_defaults(c->strategy);
    so.max_batch = mg_strategy_kind_traits(c->strategy).threads ? c->batch : t->info.local;
    so.workers = c->workers;
    so.group = t->g;
    so.mesh = c->mesh;
    so.ddp.bucket_bytes = (size_t)(c->bucket_mb * (1 << 20));
    if (so.ddp.first_bucket_bytes > so.ddp.bucket_bytes)
        so.ddp.first_bucket_bytes = so.ddp.bucket_bytes;
    so.ddp.compress = t->compress;
    so.zero_stage = c->zero;
    so.ps_servers = c->ps_servers;
    so.ps_staleness = c->ps_staleness;
    so.ps_elastic = c->elastic;
    so.det_shards = c->det_shards;
    so.det_chunks = c->det_chunks ? c->det_chunks : 2;
    so.init_seed = c->seed;
    so.offload_dir = c->offload_dir;
    so.offload_cpu = c->offload_cpu;
    if (t->info.pp > 1) {
        so.pipe.kind = MG_PIPE_1F1B;
        if (c->pp_schedule) mg_pipe_parse(c->pp_schedule, &so.pipe.kind);   /* checked */
        so.pipe.micro_batches = c->micro_batches;
        so.pipe.chunks = c->chunks;
        if (c->split) {
            int nu = mg_model_num_units(t->m), S = t->info.pp * c->chunks;
            const char **names = malloc(sizeof *names * (size_t)nu);
            if (!names) return mg_error(MG_ENOMEM, "out of memory");
            for (int u = 0; u < nu; u++) names[u] = mg_model_unit(t->m, u).name;
            mg_status st = mg_pipe_split_parse(c->split, names, nu, S, t->first);
            free(names);
            MG_TRY(mg__train_agreed(t, st));
            so.pipe.first = t->first;
        }
    }
    MG_TRY(mg__train_agreed(t, mg_strategy_create(t->m, &so, &t->s)));   /* it shares its failures */
    t->mesh = mg_strategy_mesh(t->s);
    mg_strategy_data_share(t->s, &t->info.dp_rank, &t->info.dp_size);
    return MG_OK;
}

/* The optimizer over the strategy's ranges; a language model decays only
 * its 2-D parameters (models.md D). */
static mg_status make_optimizer(mg_trainer *t)
{
    const mg_train_config *c = &t->c;
    mg_optim_config oc = mg_optim_defaults(t->optim, c->lr);
    oc.momentum = c->momentum;
    oc.weight_decay = c->weight_decay;
    if (t->optim != MG_OPTIM_SGD) oc.beta1 = c->beta1, oc.beta2 = c->beta2;
    MG_TRY(mg_strategy_optim(t->s, &oc, &t->opt));
    if (!c->text) return MG_OK;
    int n = mg_model_decay_groups(t->m, c->weight_decay, NULL, 0);
    mg_optim_group *g = malloc(sizeof *g * (size_t)n);
    if (!g) return mg_error(MG_ENOMEM, "out of memory");
    mg_model_decay_groups(t->m, c->weight_decay, g, n);
    mg_status st = mg_optim_set_groups(t->opt, g, n);
    free(g);
    return st;
}

/* Room for the checkpoint where --save writes it, at least rank 0's
 * parameters and their optimizer state (the file holds the whole model):
 * a file system with less was found at the first save, after the
 * training before it (a probe). Said only where it cannot fit. */
static mg_status check_room(mg_trainer *t)
{
    const mg_train_config *c = &t->c;
    if (t->info.rank || !c->save || c->eval_only) return MG_OK;
    double need = 4.0 * (double)mg_model_num_params(t->m) * (1 + mg_optim_num_states(t->opt));
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", c->save);
    char *slash = strrchr(dir, '/');
    if (slash) slash[slash == dir] = 0;   /* its directory ("/" for "/ck.st") */
    struct statvfs v;
    if (statvfs(slash ? dir : ".", &v) || (double)v.f_bavail * v.f_frsize >= need) return MG_OK;
    return mg_error(MG_EIO, "--save %s: its file system has %.1f MB free, and the checkpoint "
                    "takes at least %.1f MB (the parameters and the optimizer's state): free "
                    "space there or give another path", c->save,
                    (double)v.f_bavail * v.f_frsize / 1e6, need / 1e6);
}

/* Rank 0 reads the --resume file's hyper-parameters first: a run of
 * other ones is told which differs (momentum 0 against 0.9), not that
 * the file holds a tensor (the momentum) this run has no place for. A
 * file it cannot read is left to the load, which says why. */
static mg_status resume_fits(mg_trainer *t)
{
    mg_st_file *f;
    if (t->info.rank || mg_st_open_on_disk(t->c.resume, &f)) return MG_OK;
    const char *hp = mg_st_meta(f, "hparams");
    mg_status st = hp ? mg__train_resume_check(hp, t->hp, t->c.resume, t->c.eval_only) : MG_OK;
    mg_st_close(f);
    return st;
}

/* The starting state: --resume or --init, every rank reading its part. */
static mg_status start_state(mg_trainer *t)
{
    const mg_train_config *c = &t->c;
    mg_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    if (c->resume && c->eval_only) {   /* its model alone: as PyTorch's model.load_state_dict */
        MG_TRY(mg__train_agreed(t, resume_fits(t)));
        if (mg_strategy_load_weights(t->s, c->resume, NULL, NULL))
            return mg_error(MG_EINVAL, "--resume: %s", mg_last_error());
    } else if (c->resume) {
        MG_TRY(mg__train_agreed(t, resume_fits(t)));
        if (mg_strategy_load(t->s, c->resume, t->opt, &meta))
            return mg_error(MG_EINVAL, "--resume: %s", mg_last_error());
        MG_TRY(mg__train_resume_check(meta.hparams, t->hp, c->resume, false));
    } else if (c->init) {   /* every rank reads the weights it holds */
        if (mg_strategy_load_weights(t->s, c->init, c->init_prefix,
                                     c->init_partial ? &t->info.init_left : NULL))
            return mg_error(MG_EINVAL, "--init: %s%s", mg_last_error(),
                            strstr(mg_last_error(), "no place") ? "; give --init-partial to "
                            "start from the tensors that fit" : "");
    }
    t->info.start_step = meta.step;
    t->info.start_epoch = meta.epoch;
    return MG_OK;
}

/* Image models: the data sets' images and labels fit the model (others
 * would overrun its batches), and a checkpoint ends an epoch of this
 * batch. */
static mg_status check_images(mg_trainer *t)
{
    const mg_train_config *c = &t->c;
    int ch, h, w;
    mg_model_input_shape(t->m, &ch, &h, &w);
    const mg_dataset *sets[2] = {t->train, t->test};
    mg_status st = MG_OK;
    for (int i = 0; i < 2 && !st; i++)
        if (sets[i]) st = mg_dataset_check_input(sets[i], mg_model_name(t->m), ch, h, w,
                                                 mg_model_classes(t->m));
    MG_TRY(mg__train_agreed(t, st));
    if (!t->train || t->info.start_epoch >= c->epochs) return MG_OK;
    long rows = (long)c->batch * c->accumulate;   /* --deterministic: whole global batches */
    long n_local = c->det_shards ? (t->train->n + rows - 1) / rows * (rows / t->info.dp_size)
                 : (t->train->n - t->info.dp_rank + t->info.dp_size - 1) / t->info.dp_size;
    long micro = (n_local + t->info.local - 1) / t->info.local;
    t->steps_per_epoch = (micro + t->leaves - 1) / t->leaves;
    if (t->info.start_step != t->info.start_epoch * t->steps_per_epoch)   /* on every rank */
        return mg__train_agreed(t, mg_error(MG_EINVAL, "%s: step %ld is not the end of epoch "
                                  "%ld of these %ld training images with --batch %d "
                                  "--accumulate %d (%ld steps an epoch): resume on the data "
                                  "it was trained on", c->resume, t->info.start_step,
                                  t->info.start_epoch, (long)t->train->n, c->batch,
                                  c->accumulate, t->steps_per_epoch));
    return MG_OK;
}

/* The text, or the image data set's directory. */
static mg_status open_data(mg_trainer *t)
{
    mg_train_config *c = &t->c;
    if (c->text) return mg_text_open(c->data, c->gpt.ctx, &t->text);
    if (!c->data) c->data = mg_env_str("MG_DATA", "/usr/share/datasets/fashion-mnist");
    struct stat sb;
    if (stat(c->data, &sb) || !S_ISDIR(sb.st_mode))
        return mg_error(MG_EIO, "data directory '%s' not found: install the "
                        "dataset-fashion-mnist package (scripts/install-deps.sh) or pass "
                        "--data DIR (or set MG_DATA)", c->data);
    return MG_OK;
}

static mg_status create(mg_trainer *t)
{
    mg_train_config *c = &t->c;
    MG_TRY(check_config(t));
    t->info.world = t->info.dp_size = t->info.pp = 1;
    if (mg_strategy_kind_traits(c->strategy).ranks) MG_TRY(join_job(t));
    else if (c->plan_auto) MG_TRY(choose_plan(t));
    MG_TRY(mg__train_agreed(t, open_data(t)));
    mg_trace_open(NULL, t->info.rank, t->info.world);
    mg_set_threads(c->threads ? c->threads : (int)mg_env_long("MG_THREADS", 1));
    /* After mgrun restarted the job: resume from the last save. Rank 0's
     * file decides (the other nodes may not see it). */
    int32_t restart = !c->resume && c->save && mg_env_long("MG_RESTART_COUNT", 0) > 0 &&
                      t->info.rank == 0 && access(c->save, R_OK) == 0;
    if (t->g && mg_broadcast(t->g, &restart, 1, MG_I32, 0)) return mg__train_step_error(t);
    if (restart) c->resume = c->save;
    t->info.restarted = restart;
    MG_TRY(check_outputs(t));
    MG_TRY(load_data(t));
    t->info.local = c->batch / t->info.dp_size;   /* samples per rank and micro-batch */
    t->leaves = c->accumulate;
    if (c->det_shards) {   /* a virtual shard's rows each, V/W of them */
        t->info.local = c->batch * c->accumulate / c->det_shards;
        t->leaves = c->det_shards / t->info.dp_size;
    }
    MG_TRY(mg__train_agreed(t, make_model(t)));
    MG_TRY(make_plan(t));
    if (c->plan_only) return MG_OK;
    MG_TRY(make_optimizer(t));
    MG_TRY(mg_trainer_agree(t, check_room(t)));
    mg__train_hparams(c, t->hp, sizeof t->hp);
    MG_TRY(mg__train_agreed(t, start_state(t)));
    if (c->text) t->info.val_windows = mg_lm_val_windows(t->text, c->gpt.ctx, c->eval_windows);
    else MG_TRY(check_images(t));
    t->log.text = c->text;
    if (c->log && c->resume && t->info.rank == 0)
        MG_TRY(mg__log_read(c->log, &t->log,
                            (double)(c->text ? t->info.start_step : t->info.start_epoch)));
    t->log.read = t->log.n;
    return MG_OK;
}

mg_status mg_train_config_check(const mg_train_config *c)
{
    MG_NEED("mg_train_config_check", c);
    mg_trainer *t = calloc(1, sizeof *t);
    if (!t) return mg_error(MG_ENOMEM, "out of memory for the trainer");
    t->c = *c;
    mg_status st = check_config(t);
    free(t);
    return st;
}

mg_status mg_trainer_create(const mg_train_config *c, mg_trainer **out)
{
    MG_NEED("mg_trainer_create", out);
    *out = NULL;
    MG_NEED("mg_trainer_create", c);
    mg_trainer *t = calloc(1, sizeof *t);
    if (!t) return mg_error(MG_ENOMEM, "out of memory for the trainer");
    t->c = *c;
    mg_status st = create(t);
    if (st) {
        mg_trainer_destroy(t);
        return st;
    }
    *out = t;
    return MG_OK;
}

void mg_trainer_destroy(mg_trainer *t)
{
    if (!t) return;
    mg_optim_destroy(t->opt);
    mg_strategy_destroy(t->s);
    mg_model_destroy(t->m);
    mg_dataset_destroy(t->train);
    mg_dataset_destroy(t->test);
    mg_text_close(t->text);
    free(t->log.rows);
    mg_free(t->xb);
    mg_free(t->yb);
    mg_free(t->ib);
    if (mg_trace_close()) mg_log("trace: %s", mg_last_error());
    mg_group_destroy(t->g);
    free(t);
}

mg_trainer_info mg_trainer_get_info(const mg_trainer *t) { return t->info; }
const mg_train_config *mg_trainer_config(const mg_trainer *t) { return &t->c; }
mg_model *mg_trainer_model(const mg_trainer *t) { return t->m; }
mg_strategy *mg_trainer_strategy(const mg_trainer *t) { return t->s; }
mg_optim *mg_trainer_optim(const mg_trainer *t) { return t->opt; }
mg_group *mg_trainer_group(const mg_trainer *t)
{
    return t->s ? mg_strategy_group(t->s) : t->g;
}
