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
 * checkpoint.c): rank 0 of a DDP job writes and reads, and every rank
 * learns the outcome and the state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/parallel.h"
#include "multigrad/trace.h"

typedef struct strategy_vt {
    const char *name;
    /* Forward, loss and backward of one micro-batch, adding its gradient
     * to the model's; `last` of the step. */
    mg_status (*micro)(mg_strategy *s, const mg_micro_batch *b, float *loss, int *correct);
    mg_status (*finish)(mg_strategy *s);   /* optional */
} strategy_vt;

struct mg_strategy {
    const strategy_vt *vt;
    mg_model *m;
    mg_dp *dp;
    mg_ddp *ddp;
    mg_group *g;
    int rank;
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
    else return mg_error(MG_EINVAL, "unknown strategy '%s': use none, dp or ddp", s);
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

/* ---- DataParallel --------------------------------------------------------- */

static mg_status dp_micro(mg_strategy *s, const mg_micro_batch *b, float *loss, int *correct)
{
    return mg_dp_forward_backward(s->dp, b->x, b->y, b->n, loss, correct);
}

static const strategy_vt dp_vt = {.name = "dp", .micro = dp_micro};

/* ---- the interface -------------------------------------------------------- */

mg_status mg_strategy_create(mg_model *m, const mg_strategy_options *o, mg_strategy **out)
{
    *out = NULL;
    if (o->max_batch < 1)
        return mg_error(MG_EINVAL, "strategy: batch size %d must be positive", o->max_batch);
    if (o->kind == MG_STRATEGY_DDP && !o->group)
        return mg_error(MG_EINVAL, "strategy ddp needs a process group");
    mg_strategy *s = calloc(1, sizeof *s);
    if (!s) return mg_error(MG_ENOMEM, "strategy: out of memory");
    s->m = m;
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
        st = mg_ddp_create(o->group, m, &o->ddp, &s->ddp);
        if (!st) st = mg_model_reserve(m, o->max_batch);
        break;
    }
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
    free(s);
}

const char *mg_strategy_name(const mg_strategy *s) { return s->vt->name; }
mg_model *mg_strategy_model(const mg_strategy *s) { return s->m; }
mg_ddp *mg_strategy_ddp(const mg_strategy *s) { return s->ddp; }

void mg_strategy_range(const mg_strategy *s, size_t *lo, size_t *hi)
{
    *lo = 0;   /* every strategy so far keeps whole replicas */
    *hi = mg_model_arena_size(s->m);
}

mg_status mg_strategy_optim(mg_strategy *s, const mg_optim_config *cfg, mg_optim **out)
{
    size_t lo, hi;
    mg_strategy_range(s, &lo, &hi);
    return mg_optim_create_range(cfg, lo, hi, out);
}

mg_status mg_strategy_sum(mg_strategy *s, double *v, int n)
{
    return s->g ? mg_all_reduce(s->g, v, v, (size_t)n, MG_F64, MG_SUM) : MG_OK;
}

/* Every rank gets rank 0's outcome: its status and message. */
static mg_status agree(mg_strategy *s, mg_status st)
{
    if (!s->g) return st;
    struct { int32_t st; char msg[500]; } w = {st, ""};
    if (st) snprintf(w.msg, sizeof w.msg, "%s", mg_last_error());
    MG_TRY(mg_broadcast(s->g, &w, sizeof w, MG_U8, 0));
    if (w.st && s->rank != 0) return mg_error(w.st, "%s", w.msg);
    return w.st;
}

mg_status mg_strategy_sync(mg_strategy *s)
{
    if (!s->g) return MG_OK;
    mg_model *m = s->m;
    MG_TRY(mg_broadcast(s->g, mg_model_params(m), mg_model_arena_size(m), MG_F32, 0));
    if (mg_model_buffer_size(m))
        MG_TRY(mg_broadcast(s->g, mg_model_buffers(m), mg_model_buffer_size(m), MG_F32, 0));
    double c = (double)mg_model_rng_counter(m);
    MG_TRY(mg_broadcast(s->g, &c, 1, MG_F64, 0));
    mg_model_set_rng_counter(m, (uint64_t)c);
    return MG_OK;
}

mg_status mg_strategy_save(mg_strategy *s, const char *path, mg_optim *o,
                           const mg_ckpt_meta *meta)
{
    mg_status st = s->rank == 0 ? mg_checkpoint_save(path, s->m, o, meta) : MG_OK;
    return agree(s, st);
}

mg_status mg_strategy_load(mg_strategy *s, const char *path, mg_optim *o, mg_ckpt_meta *meta)
{
    mg_status st = s->rank == 0 ? mg_checkpoint_load(path, s->m, o, meta) : MG_OK;
    MG_TRY(agree(s, st));
    if (!s->g) return MG_OK;
    MG_TRY(mg_strategy_sync(s));
    MG_TRY(mg_broadcast(s->g, meta, sizeof *meta, MG_U8, 0));
    if (!o) return MG_OK;
    size_t lo, hi;
    mg_optim_range(o, &lo, &hi);
    for (int i = 0; i < mg_optim_num_states(o); i++)
        MG_TRY(mg_broadcast(s->g, mg_optim_state(o, i, NULL), hi - lo, MG_F32, 0));
    mg_optim_set_steps(o, meta->step);
    return MG_OK;
}

/* ---- the training step ------------------------------------------------------ */

mg_status mg_train_step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                        mg_batch_source next, void *ud, mg_step_result *r)
{
    mg_model *m = s->m;
    memset(r, 0, sizeof *r);
    mg_model_zero_grad(m);
    mg_micro_batch b;
    while (r->micro < opt->accumulate && next(ud, &b)) {
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
    float *g = mg_model_grads(m);
    size_t lo, hi;
    mg_strategy_range(s, &lo, &hi);
    if (r->micro > 1) mg_grad_scale(g + lo, hi - lo, 1.0f / (float)r->micro);
    /* After the all-reduce every rank holds the whole averaged gradient,
     * so the local norm is the global one. */
    if (opt->clip_grad > 0) r->grad_norm = mg_clip_grad_norm(g + lo, hi - lo, opt->clip_grad);
    double t0 = mg_trace_now();
    mg_optim_begin_step(o, opt->lr);
    mg_optim_update(o, mg_model_params(m), g, lo, hi);
    mg_trace_event("optimizer", "optimizer", 0, t0, mg_trace_now());
    return MG_OK;
}
