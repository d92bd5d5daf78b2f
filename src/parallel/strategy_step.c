/* The one training step every tool and example runs, whatever the plan
 * (strategy.c makes the plan): zero the gradients; each micro-batch's
 * forward, loss and backward (the components communicate from their unit
 * hooks, on the last micro-batch) — or the first component that drives a
 * whole step runs it (a pipeline's schedule, a parameter server's, the
 * deterministic threads'); the components' reductions; the mean over the
 * micro-batches; clipping to the global norm (each rank's share, summed
 * over the ranks that split the parameters, or the norm a component sums
 * itself); the optimizer over this rank's ranges (--offload cpu: on the
 * host); the components' after_update.
 * Limits: one step at a time per strategy (the step's optimizer and
 * options are the strategy's meanwhile). */
#include <math.h>
#include <string.h>
#include "multigrad/trace.h"
#include "parallel/strategy_internal.h"

/* ---- the training step ------------------------------------------------------ */

void mg_strategy_micro_begin(mg_strategy *s, bool last)
{
    EACH(s, micro_begin) CALL(micro_begin, last);
}

mg_status mg_strategy_micro_end(mg_strategy *s)
{
    mg_status st = MG_OK;
    EACH_BACK(s, micro_end) {
        mg_status e = CALL(micro_end);
        if (!st) st = e;
    }
    return st;
}

/* The model's forward, loss and backward of one micro-batch (or the
 * component's that runs them), between the components' begin and end. */
static mg_status micro(mg_strategy *s, const mg_micro_batch *b, float slow, float *loss,
                       int *correct)
{
    mg_strategy_micro_begin(s, b->last);
    mg_status st = MG_OK;
    double t0 = slow > 1 ? mg_now() : 0;   /* timed only for a straggler on purpose */
    part *p = FIRST(s, run_micro);
    if (p) {
        st = p->ops->run_micro(p->c, b, loss, correct);
    } else if (!mg_model_forward(s->m, (const float *)b->x, b->n)) {
        st = mg__strategy_forward_failed(s->m);
    } else {
        *loss = mg_model_loss(s->m, b->y, correct);
        if (mg__weighed(b)) mg_model_weigh_loss(s->m, b->weight);
        mg_model_backward(s->m);
    }
    if (slow > 1) mg_sleep((slow - 1) * (mg_now() - t0));
    mg_status e = mg_strategy_micro_end(s);
    return st ? st : e;
}

static mg_status finish_step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                             double sumsq, mg_step_result *r);

static mg_status step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                     mg_batch_source next, void *ud, mg_step_result *r)
{
    memset(r, 0, sizeof *r);
    if (!(opt->lr >= 0) || opt->lr == (float)INFINITY || !(opt->clip_grad >= 0) ||
        opt->accumulate < 1 || !(opt->slow >= 0) || opt->slow == (float)INFINITY)
        return mg_error(MG_EINVAL, "mg_train_step: lr %g, clip_grad %g, accumulate %d, slow %g: "
                        "give a finite rate and clip of 0 or more, 1 or more micro-batches and "
                        "a finite slowing of 0 (none) or more", opt->lr, opt->clip_grad,
                        opt->accumulate, opt->slow);
    if (!FIRST(s, zero_grad)) mg_model_zero_grad(s->m);
    EACH(s, zero_grad) CALL(zero_grad);
    part *driver = FIRST(s, run_step);
    if (driver) MG_TRY(driver->ops->run_step(driver->c, next, ud, opt->accumulate, r));
    mg_micro_batch b;
    while (!driver && r->micro < opt->accumulate && mg__next_micro(next, ud, &b)) {
        MG_TRY(mg__micro_check("mg_train_step", &b, s->m));
        if (++r->micro == opt->accumulate) b.last = true;
        float loss = 0;
        int correct = 0;
        MG_TRY(micro(s, &b, opt->slow, &loss, &correct));
        r->loss_sum += (double)loss * b.n;
        r->correct += correct;
        r->samples += b.n;
        if (b.last) break;
    }
    if (r->micro == 0 || r->updated) return MG_OK;
    EACH_BACK(s, reduce) MG_TRY(CALL(reduce));
    return finish_step(s, o, opt, -1, r);
}

/* The step, its optimizer and options known to the components meanwhile
 * (mg_strategy_update, mg_strategy_step_options). */
mg_status mg_train_step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                        mg_batch_source next, void *ud, mg_step_result *r)
{
    s->step_o = o;
    s->step_opt = opt;
    mg_status st = step(s, o, opt, next, ud, r);
    s->step_o = NULL;
    s->step_opt = NULL;
    return mg__strategy_refused(s, st);
}

const mg_step_options *mg_strategy_step_options(const mg_strategy *s) { return s->step_opt; }

mg_status mg_strategy_update(mg_strategy *s, int micro, double sumsq, mg_step_result *r)
{
    if (!s->step_opt || micro < 1)
        return mg_error(MG_EINVAL, "mg_strategy_update: only within a driver's step, for one "
                        "or more micro-batches");
    mg_step_result u = {.micro = micro};
    MG_TRY(finish_step(s, s->step_o, s->step_opt, sumsq, &u));
    r->grad_norm = u.grad_norm;
    return MG_OK;
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

/* Gradients a component keeps outside the arena (offload): already
 * scaled to the mean; *ss gets this rank's sum of their squares. */
static bool kept_elsewhere(mg_strategy *s, double *ss)
{
    bool elsewhere = false;
    *ss = 0;
    EACH(s, grads_elsewhere) if (CALL(grads_elsewhere, ss)) elsewhere = true;
    return elsewhere;
}

/* The norm of every gradient: each rank's share (its own ranges, or ss
 * of those kept elsewhere), summed over the ranks that split them. */
static mg_status grad_norm(mg_strategy *s, bool elsewhere, double ss, double *norm)
{
    int n = s->n_own;
    const mg_range *own = s->own;
    const float *g = mg_model_grads(s->m);
    for (int k = 0; k < n && !elsewhere; k++)
        ss += mg_grad_sumsq(g + own[k].lo, own[k].hi - own[k].lo);
    EACH(s, shards_over) {
        mg_group *over = CALL(shards_over);
        if (over) MG_TRY(mg_all_reduce(over, &ss, &ss, 1, MG_F64, MG_SUM));
    }
    *norm = sqrt(ss);
    return MG_OK;
}

/* The mean over the micro-batches (the components averaged over the
 * ranks), clipping (sumsq >= 0: the norm's square, known) and the
 * optimizer's step over this rank's ranges. */
static mg_status finish_on_device(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                                  double sumsq, mg_step_result *r)
{
    float *g = mg_model_grads(s->m), *p = mg_model_params(s->m);
    int nr;
    const mg_range *rg = mg_strategy_ranges(s, &nr);
    double ss;
    bool elsewhere = kept_elsewhere(s, &ss);   /* then clipped by the optimizer */
    float scale = 1.0f / (float)r->micro;
    for (int k = 0; k < nr && scale != 1.0f && !elsewhere; k++)
        mg_grad_scale(g + rg[k].lo, rg[k].hi - rg[k].lo, scale);
    if (opt->clip_grad > 0) {
        part *whole = FIRST(s, grad_sumsq);   /* a rank that holds the whole gradient */
        if (sumsq < 0 && whole) sumsq = whole->ops->grad_sumsq(whole->c, r->micro);
        if (!(sumsq < 0)) r->grad_norm = sqrt(sumsq);   /* NaN too: computed, not a number */
        else MG_TRY(grad_norm(s, elsewhere, ss, &r->grad_norm));
        float coef = mg_clip_coef(r->grad_norm, opt->clip_grad);
        if (elsewhere) mg_optim_scale_grads(o, coef);
        for (int k = 0; k < nr && !elsewhere; k++)
            mg_grad_scale(g + rg[k].lo, rg[k].hi - rg[k].lo, coef);
    }
    double t0 = mg_trace_now();
    /* The optimizer's ranges are the strategy's (mg_strategy_optim). */
    if (s->offload_cpu) MG_TRY(host_step(s, o, opt->lr, rg, nr));
    else MG_TRY(mg_optim_step(o, p, g, opt->lr));
    mg_trace_event("optimizer", "optimizer", 0, t0, mg_trace_now());
    EACH(s, after_update) MG_TRY(CALL(after_update));
    return MG_OK;
}

/* The gradients are the model's device's: so are the kernels of the rest
 * of the step. */
static mg_status finish_step(mg_strategy *s, mg_optim *o, const mg_step_options *opt,
                             double sumsq, mg_step_result *r)
{
    mg_device host = mg_device_current();
    MG_TRY(mg_device_set_current(mg_model_device(s->m)));
    mg_status st = finish_on_device(s, o, opt, sumsq, r);
    mg_device_set_current(host);
    return st;
}
