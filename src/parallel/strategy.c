/* Strategies: how a global batch becomes forward/backward work and
 * communication, which range of the arena this process's optimizer
 * updates, and how checkpoints are written and read — one interface,
 * one small implementation each (single process, DataParallel threads,
 * DDP), and the one training step every tool and example runs.
 *
 * The step: zero the gradients; each micro-batch forward, loss and
 * backward (the strategy communicates from its unit hooks, only on the
 * last micro-batch); finish the communication; the mean over the
 * micro-batches; clip to the global norm; the optimizer over the
 * strategy's range. Checkpoints are logical (names and full shapes,
 * checkpoint.c) and written and read by every rank of a job, each its
 * own part, directly or through rank 0 (ckpt_io.c). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/trace.h"
#include "parallel/internal.h"

typedef struct strategy_vt {
    const char *name;
    /* Forward, loss and backward of one micro-batch, adding its gradient
     * to the model's; `last` of the step. */
    mg_status (*micro)(mg_strategy *s, const mg_micro_batch *b, float *loss, int *correct);
    mg_status (*finish)(mg_strategy *s);   /* optional */
    /* Optional, instead of micro: the forwards and backwards of a whole
     * step (up to max_micro micro-batches from next), r's figures. */
    mg_status (*step)(mg_strategy *s, mg_batch_source next, void *ud, int max_micro,
                      mg_step_result *r);
} strategy_vt;

struct mg_strategy {
    const strategy_vt *vt;
    mg_model *m;
    mg_dp *dp;
    mg_ddp *ddp;
    mg_zero *zero;
    mg_pipe *pipe;
    mg_group *g;
    mg_group *pp, *pdp;  /* pipeline: its group, its stages' data-parallel group */
    int rank, world;
    mg_range whole;   /* the arena: the range of every unsharded strategy */
    char *offload_dir;
    size_t offload_window;
    /* --offload cpu with a model on a device: the host's copies of the
     * parameters and gradients of this process's ranges, the optimizer's
     * (arena-sized mappings: only the ranges are ever touched) */
    bool offload_cpu;
    float *host_p, *host_g;
};

mg_strategy_options mg_strategy_defaults(mg_strategy_kind kind)
{
    return (mg_strategy_options){.kind = kind, .max_batch = 1, .workers = 1,
                                 .ddp = mg_ddp_defaults()};
}

mg_status mg_strategy_parse(const char *s, mg_strategy_kind *out)
{
    if (!strcmp(s, "none") || !strcmp(s, "single")) *out = MG_STRATEGY_SINGLE;
    else if (!strcmp(s, "dp")) *out = MG_STRATEGY_DP;
    else if (!strcmp(s, "ddp")) *out = MG_STRATEGY_DDP;
    else if (!strcmp(s, "zero")) *out = MG_STRATEGY_ZERO;
    else if (!strcmp(s, "pipeline")) *out = MG_STRATEGY_PIPELINE;
    else return mg_error(MG_EINVAL, "unknown strategy '%s': use none, dp, ddp, zero or "
                         "pipeline", s);
    return MG_OK;
}

/* ---- single process, DDP: the model's own tape --------------------------- */

static mg_status model_micro(mg_strategy *s, const mg_micro_batch *b, float *loss, int *correct)
{
    if (s->ddp) mg_ddp_set_sync(s->ddp, b->last);
    if (!mg_model_forward(s->m, (const float *)b->x, b->n)) return MG_ENOMEM;
    *loss = mg_model_loss(s->m, b->y, correct);
    mg_model_backward(s->m);
    return MG_OK;
}

static mg_status ddp_finish(mg_strategy *s) { return mg_ddp_finish(s->ddp); }

static const strategy_vt single_vt = {.name = "single", .micro = model_micro};
static const strategy_vt ddp_vt = {.name = "ddp", .micro = model_micro, .finish = ddp_finish};

/* ---- ZeRO: the hooks communicate between begin and end -------------------- */

static mg_status zero_micro(mg_strategy *s, const mg_micro_batch *b, float *loss, int *correct)
{
    mg_zero_begin(s->zero, b->last);
    mg_status st = MG_OK;
    if (!mg_model_forward(s->m, (const float *)b->x, b->n)) st = MG_ENOMEM;
    if (!st) {
        *loss = mg_model_loss(s->m, b->y, correct);
        mg_model_backward(s->m);
    }
    mg_status e = mg_zero_end(s->zero);
    return st ? st : e;
}

static const strategy_vt zero_vt[3] = {
    {.name = "zero1", .micro = zero_micro},
    {.name = "zero2", .micro = zero_micro},
    {.name = "zero3", .micro = zero_micro},
};

/* ---- pipeline: the executor runs the step, then the replicas of each
 * stage average (a sum here, scaled with the mean over micro-batches)
 * and tied parameters add their gradients ------------------------------ */

static mg_status pipe_step(mg_strategy *s, mg_batch_source next, void *ud, int max_micro,
                           mg_step_result *r)
{
    MG_TRY(mg_pipe_step(s->pipe, next, ud, max_micro, r));
    if (!r->micro) return MG_OK;
    float *g = mg_model_grads(s->m);
    int n;
    const mg_range *rg = mg_pipe_ranges(s->pipe, &n);
    double t0 = mg_trace_now();
    for (int k = 0; k < n && s->pdp; k++)
        if (rg[k].hi > rg[k].lo)
            MG_TRY(mg_all_reduce(s->pdp, MG_IN_PLACE, g + rg[k].lo, rg[k].hi - rg[k].lo,
                                 MG_F32, MG_SUM));
    if (s->pdp) mg_trace_event("pipeline data-parallel all-reduce", "allreduce", 1, t0,
                              mg_trace_now());
    return mg_pipe_sum_ties(s->pipe);
}

static const strategy_vt pipe_vt = {.name = "pipeline", .step = pipe_step};

/* ---- DataParallel --------------------------------------------------------- */

static mg_status dp_micro(mg_strategy *s, const mg_micro_batch *b, float *loss, int *correct)
{
    return mg_dp_forward_backward(s->dp, b->x, b->y, b->n, loss, correct);
}

static const strategy_vt dp_vt = {.name = "dp", .micro = dp_micro};

/* ---- the interface -------------------------------------------------------- */

static mg_status agree(mg_strategy *s, mg_status st);

mg_status mg_strategy_create(mg_model *m, const mg_strategy_options *o, mg_strategy **out)
{
    *out = NULL;
    if (o->max_batch < 1)
        return mg_error(MG_EINVAL, "strategy: batch size %d must be positive", o->max_batch);
    if ((o->kind == MG_STRATEGY_DDP || o->kind == MG_STRATEGY_ZERO) && !o->group)
        return mg_error(MG_EINVAL, "strategy %s needs a process group",
                        o->kind == MG_STRATEGY_DDP ? "ddp" : "zero");
    if (o->kind == MG_STRATEGY_PIPELINE && (!o->group || !o->pp_group))
        return mg_error(MG_EINVAL, "strategy pipeline needs the job's group and its pipeline "
                        "group");
    if (o->kind == MG_STRATEGY_PIPELINE && o->offload_dir)
        return mg_error(MG_EINVAL, "offload (--offload) is not built for the pipeline "
                        "strategy; use it with --zero");
    if (o->kind == MG_STRATEGY_ZERO) MG_TRY(mg_zero_stage_check(o->zero_stage));
    if (o->offload_cpu && o->offload_dir)
        return mg_error(MG_EINVAL, "offload: give one of --offload cpu (the optimizer in host "
                        "memory) and --offload disk:DIR (in files)");
    if (mg_model_device(m).kind != MG_DEVICE_CPU && o->offload_dir)
        return mg_error(MG_EUNSUPPORTED, "offload to files (--offload disk:DIR) is built for a "
                        "model on the CPU; with a device give --offload cpu, which keeps the "
                        "optimizer's state in host memory");
    if (mg_model_device(m).kind != MG_DEVICE_CPU && o->kind == MG_STRATEGY_DP)
        return mg_error(MG_EUNSUPPORTED, "strategy dp (threads sharing one model) does not run "
                        "on a device; use ddp, which runs one process per GPU, or --device cpu");
    mg_strategy *s = calloc(1, sizeof *s);
    if (!s) return mg_error(MG_ENOMEM, "strategy: out of memory");
    s->m = m;
    s->world = 1;
    mg_status st = MG_OK;
    switch (o->kind) {
    case MG_STRATEGY_SINGLE:
        s->vt = &single_vt;
        st = mg_model_reserve(m, o->max_batch);
        break;
    case MG_STRATEGY_DP:
        s->vt = &dp_vt;
        st = mg_dp_wrap(m, o->workers, o->max_batch, &s->dp);
        break;
    case MG_STRATEGY_DDP:
        s->vt = &ddp_vt;
        s->g = o->group;
        s->rank = mg_group_rank(o->group);
        s->world = mg_group_size(o->group);
        st = mg_ddp_create(o->group, m, &o->ddp, &s->ddp);
        if (!st) st = mg_model_reserve(m, o->max_batch);
        break;
    case MG_STRATEGY_ZERO:
        s->vt = &zero_vt[o->zero_stage - 1];
        s->g = o->group;
        s->rank = mg_group_rank(o->group);
        s->world = mg_group_size(o->group);
        st = mg_zero_create(o->group, m, o->zero_stage, &o->ddp, &s->zero);
        if (!st) st = mg_model_reserve(m, o->max_batch);
        if (!st && o->offload_dir) st = agree(s, mg_zero_offload(s->zero, o->offload_dir));
        break;
    case MG_STRATEGY_PIPELINE:
        s->vt = &pipe_vt;
        s->g = o->group;
        s->pp = o->pp_group;
        s->pdp = o->dp_group && mg_group_size(o->dp_group) > 1 ? o->dp_group : NULL;
        s->rank = mg_group_rank(o->group);
        s->world = mg_group_size(o->group);
        /* One process's initialisation everywhere, then each keeps its part. */
        st = mg_broadcast(o->group, mg_model_params(m), mg_model_arena_size(m), MG_F32, 0);
        if (!st) st = agree(s, mg_pipe_create(o->pp_group, m, &o->pipe, o->max_batch, &s->pipe));
        break;
    }
    if (!st && o->offload_dir && !(s->offload_dir = strdup(o->offload_dir)))
        st = mg_error(MG_ENOMEM, "strategy: out of memory");
    s->offload_window = o->offload_window ? o->offload_window
                                          : (size_t)mg_env_long("MG_OFFLOAD_WINDOW_MB", 1) << 20;
    s->whole = (mg_range){0, mg_model_arena_size(m)};
    s->offload_cpu = o->offload_cpu && mg_model_device(m).kind != MG_DEVICE_CPU;
    if (st) {
        mg_strategy_destroy(s);
        return st;
    }
    *out = s;
    return MG_OK;
}

void mg_strategy_destroy(mg_strategy *s)
{
    if (!s) return;
    mg_dp_destroy(s->dp);
    mg_ddp_destroy(s->ddp);
    mg_zero_destroy(s->zero);
    mg_pipe_destroy(s->pipe);
    free(s->offload_dir);
    size_t bytes = mg_model_arena_size(s->m) * sizeof(float);
    mg_unmap(s->host_p, bytes);
    mg_unmap(s->host_g, bytes);
    free(s);
}

const char *mg_strategy_name(const mg_strategy *s) { return s->vt->name; }
mg_model *mg_strategy_model(const mg_strategy *s) { return s->m; }
mg_ddp *mg_strategy_ddp(const mg_strategy *s) { return s->ddp; }
mg_zero *mg_strategy_zero(const mg_strategy *s) { return s->zero; }
mg_pipe *mg_strategy_pipe(const mg_strategy *s) { return s->pipe; }

const mg_range *mg_strategy_ranges(const mg_strategy *s, int *n)
{
    if (s->zero) return mg_zero_pieces(s->zero, n);
    if (s->pipe) return mg_pipe_ranges(s->pipe, n);
    *n = 1;
    return &s->whole;
}

mg_status mg_strategy_optim(mg_strategy *s, const mg_optim_config *cfg, mg_optim **out)
{
    int n;
    const mg_range *r = mg_strategy_ranges(s, &n);
    MG_TRY(mg_optim_create_ranges(cfg, r, n, out));
    mg_scratch *ps = s->zero ? mg_zero_param_store(s->zero) : NULL;
    mg_scratch *gs = s->zero ? mg_zero_grad_store(s->zero) : NULL;
    mg_status st = MG_OK;
    if (s->offload_dir) {
        st = mg_optim_offload(*out, s->offload_dir, s->offload_window, ps, gs);
    } else if (s->offload_cpu) {   /* the optimizer stays on the host */
        size_t bytes = mg_model_arena_size(s->m) * sizeof(float);
        if (!s->host_p) s->host_p = mg_map_zero(bytes);
        if (!s->host_g) s->host_g = mg_map_zero(bytes);
        if (!s->host_p || !s->host_g)
            st = mg_error(MG_ENOMEM, "--offload cpu: cannot map %zu bytes of host memory", bytes);
    } else {
        st = mg_optim_to_device(*out, mg_model_device(s->m));
    }
    st = agree(s, st);
    if (st) {
        mg_optim_destroy(*out);
        *out = NULL;
    }
    return st;
}

mg_status mg_strategy_gather(mg_strategy *s)
{
    if (s->pipe) return mg_pipe_gather(s->pipe);
    return s->zero ? mg_zero_gather(s->zero) : MG_OK;
}

mg_status mg_strategy_release(mg_strategy *s)
{
    if (s->pipe) mg_pipe_release(s->pipe);
    return s->zero ? mg_zero_release(s->zero) : MG_OK;
}

mg_status mg_strategy_sum(mg_strategy *s, double *v, int n)
{
    /* A pipeline's stages report the same figures: its replicas differ. */
    mg_group *g = s->pipe ? s->pdp : s->g;
    return g ? mg_all_reduce(g, v, v, (size_t)n, MG_F64, MG_SUM) : MG_OK;
}

mg_status mg__agree(mg_group *g, mg_status st)
{
    if (!g) return st;
    int rank = mg_group_rank(g);
    int32_t bad = st ? rank : INT32_MAX;
    MG_TRY(mg_all_reduce(g, &bad, &bad, 1, MG_I32, MG_MIN));
    if (bad == INT32_MAX) return MG_OK;
    struct { int32_t st; char msg[500]; } w = {st, ""};
    if (st) snprintf(w.msg, sizeof w.msg, "%s", mg_last_error());
    MG_TRY(mg_broadcast(g, &w, sizeof w, MG_U8, bad));
    if (rank != bad) return mg_error(w.st, "%s", w.msg);
    return st;
}

static mg_status agree(mg_strategy *s, mg_status st) { return mg__agree(s->g, st); }

mg_status mg_strategy_sync(mg_strategy *s)
{
    if (!s->g) return MG_OK;
    mg_model *m = s->m;
    if (s->zero) MG_TRY(agree(s, mg_zero_pieces_in(s->zero)));
    MG_TRY(mg_broadcast(s->g, mg_model_params(m), mg_model_arena_size(m), MG_F32, 0));
    if (mg_model_buffer_size(m))
        MG_TRY(mg_broadcast(s->g, mg_model_buffers(m), mg_model_buffer_size(m), MG_F32, 0));
    double c = (double)mg_model_rng_counter(m);
    MG_TRY(mg_broadcast(s->g, &c, 1, MG_F64, 0));
    mg_model_set_rng_counter(m, (uint64_t)c);
    return agree(s, mg_strategy_release(s));   /* stage 3 keeps its pieces only */
}

/* The file (ckpt_io.c) takes each rank's pieces: under ZeRO its shard,
 * in a pipeline its stage's ranges from one replica, else rank 0's whole
 * arena; rank 0 writes the buffers (a pipeline's reach it first). */
static mg_status save_on_host(mg_strategy *s, const char *path, mg_optim *o,
                              const mg_ckpt_meta *meta)
{
    if (!s->g) return mg_checkpoint_save(path, s->m, o, meta);
    if (s->zero) MG_TRY(agree(s, mg_zero_pieces_in(s->zero)));
    if (s->pipe) MG_TRY(agree(s, mg_pipe_gather_buffers(s->pipe)));
    int nr = 0;
    const mg_range *r = NULL;
    if (s->zero) r = mg_strategy_ranges(s, &nr);
    else if (s->pipe && (!s->pdp || mg_group_rank(s->pdp) == 0))   /* one replica of each stage */
        r = mg_pipe_own_ranges(s->pipe, &nr);
    else if (!s->pipe && s->rank == 0) r = mg_strategy_ranges(s, &nr);
    mg_ckpt_writer *w;
    mg_status st = agree(s, mg_ckpt_writer_create(s->m, o, meta, &w));
    if (!st) st = mg__ckpt_save(s->g, w, path, r, nr, s->rank == 0);
    mg_ckpt_writer_destroy(w);
    mg_status e = agree(s, mg_strategy_release(s));
    return st ? st : e;
}

/* Every rank reads the parameters and the optimizer state of its own
 * ranges: the file is logical, so any world size and stage reads it. */
static mg_status load_on_host(mg_strategy *s, const char *path, mg_optim *o,
                              mg_ckpt_meta *meta)
{
    mg_status st = s->zero ? agree(s, mg_zero_pieces_in(s->zero)) : MG_OK;
    if (!st) st = s->g ? mg__ckpt_load(s->g, path, s->m, o, meta)
                       : mg_checkpoint_load(path, s->m, o, meta);
    mg_status e = agree(s, mg_strategy_release(s));
    return st ? st : e;
}

/* Checkpoints are written from and read into host memory: a model on a
 * device goes there with its optimizer for the file, and each comes back
 * to where it was (an optimizer offloaded to the host stays there). */
mg_status mg_strategy_save(mg_strategy *s, const char *path, mg_optim *o,
                           const mg_ckpt_meta *meta)
{
    mg_device was[2];
    MG_TRY(mg_ckpt_host_begin(s->m, o, was));
    return mg_ckpt_host_end(s->m, o, was, save_on_host(s, path, o, meta));
}

mg_status mg_strategy_load(mg_strategy *s, const char *path, mg_optim *o, mg_ckpt_meta *meta)
{
    mg_device was[2];
    MG_TRY(mg_ckpt_host_begin(s->m, o, was));
    return mg_ckpt_host_end(s->m, o, was, load_on_host(s, path, o, meta));
}

/* ---- evaluation and generation ------------------------------------------ */

mg_status mg_strategy_evaluate(mg_strategy *s, mg_batch_source next, void *ud,
                               mg_step_result *r)
{
    memset(r, 0, sizeof *r);
    mg_model *m = s->m;
    bool training = mg_model_training(m);
    mg_model_set_training(m, false);
    mg_status st = s->pipe ? MG_OK : mg_strategy_gather(s);
    mg_micro_batch b;
    for (int more = 1; !st && more;) {
        mg_step_result q = {0};
        if (s->pipe) {   /* M micro-batches at a time through the stages */
            st = mg_pipe_forward(s->pipe, next, ud, INT32_MAX, &q);
        } else if ((q.micro = next(ud, &b))) {
            int c = 0;
            if (!mg_model_forward(m, (const float *)b.x, b.n)) st = MG_ENOMEM;
            else q.loss_sum = (double)mg_model_loss(m, b.y, &c) * b.n;
            q.correct = c;
            q.samples = b.n;
        }
        more = q.micro;
        r->micro += q.micro;
        r->loss_sum += q.loss_sum;
        r->correct += q.correct;
        r->samples += q.samples;
    }
    mg_model_set_training(m, training);
    mg_status e = s->pipe ? MG_OK : mg_strategy_release(s);
    return st ? st : e;
}

/* A pipeline's forward of one context: every stage runs it, the last one
 * has the logits (the others a row of zeros, whose pick its replaces). */
typedef struct {
    mg_strategy *s;
    const int32_t *ctx;
    int32_t *labels;
    float *zeros;
    int given;
} gen_pipe;

static bool gen_next(void *ud, mg_micro_batch *b)
{
    gen_pipe *g = ud;
    if (g->given++) return false;
    *b = (mg_micro_batch){.x = g->ctx, .y = g->labels, .n = 1};
    return true;
}

static const float *gen_forward(void *ud, const int32_t *ctx)
{
    gen_pipe *g = ud;
    g->ctx = ctx;
    g->given = 0;
    mg_step_result r;
    if (mg_pipe_forward(g->s->pipe, gen_next, g, 1, &r)) return NULL;
    const float *l = mg_pipe_logits(g->s->pipe);
    return l ? l : g->zeros;
}

static mg_status gen_share(void *ud, int32_t *tok)
{
    gen_pipe *g = ud;
    int S;
    mg_pipe_cut(g->s->pipe, &S);
    return mg_broadcast(g->s->pp, tok, 1, MG_I32, (S - 1) % mg_group_size(g->s->pp));
}

mg_status mg_strategy_generate(mg_strategy *s, const int32_t *prompt, int n_prompt, int n,
                               float temperature, int top_k, uint64_t seed, int32_t *out)
{
    mg_model *m = s->m;
    if (!s->pipe) {
        MG_TRY(mg_strategy_gather(s));
        mg_status st = mg_model_generate(m, prompt, n_prompt, n, temperature, top_k, seed, out);
        mg_status e = mg_strategy_release(s);
        return st ? st : e;
    }
    int T = mg_model_positions(m), V = mg_model_classes(m);
    if (T < 2)
        return mg_error(MG_EINVAL, "generate: model %s is not a language model",
                        mg_model_name(m));
    gen_pipe g = {.s = s, .labels = calloc((size_t)T, sizeof(int32_t)),
                  .zeros = calloc((size_t)T * V, sizeof(float))};
    mg_status st = !g.labels || !g.zeros ? mg_error(MG_ENOMEM, "generate: out of memory")
                                         : MG_OK;
    mg_lm_forward f = {gen_forward, gen_share, &g, m, T, V};
    if (!st) st = mg_generate(&f, prompt, n_prompt, n, temperature, top_k, seed, out);
    free(g.labels);
    free(g.zeros);
    return st;
}

/* ---- counters -------------------------------------------------------------- */

mg_memory_stats mg_strategy_memory(mg_strategy *s, const mg_optim *o)
{
    size_t arena = mg_model_arena_size(s->m) * sizeof(float);
    mg_memory_stats r = {.params = arena, .grads = arena};
    if (s->zero) {
        mg_zero_stats z = mg_zero_get_stats(s->zero);
        r.params = z.peak_param_bytes;
        r.grads = z.peak_grad_bytes;
    }
    if (o) r.optim = mg_optim_bytes(o);
    mg_tape *t = s->dp || s->pipe ? NULL : mg_model_tape(s->m);
    r.activations = t ? mg_tape_bytes(t) : 0;
    if (s->pipe) {
        int n;
        const mg_range *rg = mg_pipe_ranges(s->pipe, &n);
        r.params = 0;
        for (int k = 0; k < n; k++) r.params += (rg[k].hi - rg[k].lo) * sizeof(float);
        r.grads = r.params;
        r.activations = mg_pipe_get_stats(s->pipe).activation_bytes;
    }
    return r;
}

mg_traffic mg_strategy_traffic(const mg_strategy *s)
{
    mg_traffic t = s->g ? mg_group_traffic(s->g) : (mg_traffic){0, 0};
    mg_group *sub[2] = {s->pp, s->pdp};
    for (int i = 0; i < 2 && s->pipe; i++)
        if (sub[i]) {
            mg_traffic u = mg_group_traffic(sub[i]);
            t.sent += u.sent;
            t.received += u.received;
        }
    return t;
}

/* ---- the training step ------------------------------------------------------ */

static mg_status finish_step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                             mg_step_result *r);

mg_status mg_train_step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                        mg_batch_source next, void *ud, mg_step_result *r)
{
    mg_model *m = s->m;
    memset(r, 0, sizeof *r);
    if (s->zero) mg_zero_zero_grad(s->zero);
    else mg_model_zero_grad(m);
    mg_micro_batch b;
    if (s->vt->step) MG_TRY(s->vt->step(s, next, ud, opt->accumulate, r));
    while (!s->vt->step && r->micro < opt->accumulate && next(ud, &b)) {
        if (++r->micro == opt->accumulate) b.last = true;
        float loss = 0;
        int correct = 0;
        MG_TRY(s->vt->micro(s, &b, &loss, &correct));
        r->loss_sum += (double)loss * b.n;
        r->correct += correct;
        r->samples += b.n;
        if (b.last) break;
    }
    if (r->micro == 0) return MG_OK;
    if (s->vt->finish) MG_TRY(s->vt->finish(s));
    /* The gradients are the model's device's: so are the kernels below. */
    mg_device host = mg_device_current();
    MG_TRY(mg_device_set_current(mg_model_device(m)));
    mg_status st = finish_step(s, o, opt, r);
    mg_device_set_current(host);
    return st;
}

/* --offload cpu: the ranges' gradients and parameters to the host, the
 * optimizer's step there, the parameters back. */
static mg_status host_step(mg_strategy *s, mg_optim *o, float lr, const mg_range *rg, int nr)
{
    mg_model *m = s->m;
    mg_device dev = mg_model_device(m), cpu = {MG_DEVICE_CPU, 0};
    for (int k = 0; k < nr; k++) {
        size_t lo = rg[k].lo, bytes = (rg[k].hi - lo) * sizeof(float);
        MG_TRY(mg_device_copy(cpu, s->host_g + lo, dev, mg_model_grads(m) + lo, bytes));
        MG_TRY(mg_device_copy(cpu, s->host_p + lo, dev, mg_model_params(m) + lo, bytes));
    }
    MG_TRY(mg_optim_step(o, s->host_p, s->host_g, lr));
    for (int k = 0; k < nr; k++) {
        size_t lo = rg[k].lo, bytes = (rg[k].hi - lo) * sizeof(float);
        MG_TRY(mg_device_copy(dev, mg_model_params(m) + lo, cpu, s->host_p + lo, bytes));
    }
    return MG_OK;
}

/* Scaling, clipping and the optimizer's step after the micro-batches. */
static mg_status finish_step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                             mg_step_result *r)
{
    mg_model *m = s->m;
    float *g = mg_model_grads(m), *p = mg_model_params(m);
    int nr;
    const mg_range *rg = mg_strategy_ranges(s, &nr);
    /* Offloaded gradients were scaled on their way to the file, their
     * sum of squares kept; the clip factor goes to the optimizer. */
    bool in_file = s->zero && mg_zero_grad_store(s->zero);
    /* DDP's all-reduce and ZeRO's reduce-scatter averaged over the ranks;
     * a pipeline's replicas summed. */
    float scale = 1.0f / (float)r->micro;
    if (s->pipe && s->pdp) scale /= (float)mg_group_size(s->pdp);
    for (int k = 0; k < nr && scale != 1.0f && !in_file; k++)
        mg_grad_scale(g + rg[k].lo, rg[k].hi - rg[k].lo, scale);
    if (opt->clip_grad > 0) {
        /* The norm over every gradient: a sharded strategy's pieces are
         * summed over the ranks; a replica holds them all. */
        double ss = in_file ? mg_zero_grad_sumsq(s->zero) : s->pipe ? mg_pipe_grad_sumsq(s->pipe)
                                                                     : 0;
        for (int k = 0; k < nr && !in_file && !s->pipe; k++)
            ss += mg_grad_sumsq(g + rg[k].lo, rg[k].hi - rg[k].lo);
        if (s->zero) MG_TRY(mg_all_reduce(s->g, &ss, &ss, 1, MG_F64, MG_SUM));
        if (s->pipe) MG_TRY(mg_all_reduce(s->pp, &ss, &ss, 1, MG_F64, MG_SUM));
        r->grad_norm = sqrt(ss);
        float coef = mg_clip_coef(r->grad_norm, opt->clip_grad);
        if (in_file) mg_optim_scale_grads(o, coef);
        for (int k = 0; k < nr && !in_file; k++)
            mg_grad_scale(g + rg[k].lo, rg[k].hi - rg[k].lo, coef);
    }
    double t0 = mg_trace_now();
    /* The optimizer's ranges are the strategy's (mg_strategy_optim). */
    if (s->offload_cpu) MG_TRY(host_step(s, o, opt->lr, rg, nr));
    else MG_TRY(mg_optim_step(o, p, g, opt->lr));
    mg_trace_event("optimizer", "optimizer", 0, t0, mg_trace_now());
    return s->zero ? mg_zero_after_step(s->zero) : MG_OK;
}
