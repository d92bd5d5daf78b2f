/* The parameter server's worker (ps.c says how the job works): the whole
 * model and no optimizer state. Each step it runs its share of the global
 * batch (the micro-batches as one process would), pushes each server the
 * gradients of its run (their sum over the micro-batches, with how many
 * there were, the version of that run it computed on and, fully
 * asynchronous, the squared norm of their mean, which clips the push on
 * its own) and takes the runs the servers answer with.
 * Limits: a server's failure ends its step with the error (the job
 * stops). */
#include <stdlib.h>
#include <string.h>
#include "parallel/ps.h"

typedef struct {
    ps_job j;
    int me;
    int micro;          /* micro-batches this step */
    long step;
    int64_t *base;      /* per server: the version of its run this worker holds */
    mg_range none;      /* the optimizer's: nothing (the servers step) */
    mg_range whole;     /* the parameters it holds: all */
} ps_worker;

static void worker_destroy(void *c)
{
    ps_worker *w = c;
    mg__ps_job_free(&w->j);
    free(w->base);
    free(w);
}

static mg_status worker_attach(mg_strategy *s, void **state)
{
    MG_TRY(mg__ps_attach_role(s, false, sizeof(ps_worker), state));
    ps_worker *w = *state;
    if (!w) return MG_OK;
    w->me = mg_group_rank(w->j.g);
    w->whole = (mg_range){0, mg_model_arena_size(w->j.m)};
    if (!(w->base = calloc((size_t)w->j.servers, sizeof *w->base))) {
        worker_destroy(w);
        *state = NULL;
        return mg_error(MG_ENOMEM, "ps: out of memory");
    }
    return MG_OK;
}

static const mg_range *worker_ranges(void *c, int *n)
{
    *n = 1;
    return &((ps_worker *)c)->none;
}

/* The workers that remain: the training figures and evaluation sum there. */
static mg_group *worker_batch(void *c) { return mg__ps_workers_now(&((ps_worker *)c)->j); }

static void worker_zero_grad(void *c)
{
    ps_worker *w = c;
    w->micro = 0;
    mg_model_zero_grad(w->j.m);
}

static mg_status worker_micro_end(void *c)
{
    ((ps_worker *)c)->micro++;
    return MG_OK;
}

/* Each server's run of the gradients (summed over the micro-batches);
 * fully asynchronous, with the norm of their mean, which clips each push
 * on its own. */
static mg_status worker_reduce(void *c)
{
    ps_worker *w = c;
    ps_job *j = &w->j;
    const float *g = mg_model_grads(j->m);
    const mg_step_options *so = mg_strategy_step_options(j->s);
    bool clips = j->async && so && so->clip_grad > 0;   /* only clipping reads the norm */
    double sumsq = 0;
    if (clips) {   /* on the gradients' device (the step's reductions run on the host's) */
        mg_device host = mg_device_current();
        MG_TRY(mg_device_set_current(mg_model_device(j->m)));
        sumsq = mg_grad_sumsq(g, w->whole.hi) / ((double)w->micro * w->micro);
        mg_device_set_current(host);
    }
    int64_t head[HEAD_LEN] = {[HEAD_STEP] = w->step, [HEAD_MICRO] = w->micro};
    memcpy(&head[HEAD_SUMSQ], &sumsq, sizeof sumsq);
    /* --deterministic: the borrowed gradients' own tree, to the server
     * of the lender's range. */
    void *det = mg_strategy_part(j->s, &mg__det_component);
    const float *tied = det ? mg__det_tie_root(det) : NULL;
    mg_range tie = tied ? mg__det_tie(det) : (mg_range){0, 0};
    int holder = mg__ps_server_of(j, tie);
    for (int k = 0; k < j->servers; k++) {
        int to = j->workers + k;
        head[HEAD_BASE] = w->base[k];
        MG_TRY(mg_send(j->g, head, HEAD_LEN, MG_I64, to, TAG_HEAD));
        MG_TRY(mg_send(j->g, g + j->run[k].lo, j->run[k].hi - j->run[k].lo, MG_F32, to,
                       TAG_GRADS));
        if (k == holder) MG_TRY(mg_send(j->g, tied, tie.hi - tie.lo, MG_F32, to, TAG_TIE));
    }
    return MG_OK;
}

/* The servers' answers: their runs, of a version the staleness allows
 * for the next step. */
static mg_status worker_after_update(void *c)
{
    ps_worker *w = c;
    ps_job *j = &w->j;
    float *p = mg_model_params(j->m);
    for (int k = 0; k < j->servers; k++) {
        MG_TRY(mg_recv(j->g, &w->base[k], 1, MG_I64, j->workers + k, TAG_VERSION));
        MG_TRY(mg_recv(j->g, p + j->run[k].lo, j->run[k].hi - j->run[k].lo, MG_F32,
                       j->workers + k, TAG_PARAMS));
    }
    w->step++;
    return MG_OK;
}

static mg_status worker_evaluate(void *c, mg_batch_source next, void *ud, mg_step_result *r)
{
    return mg__strategy_forwards(((ps_worker *)c)->j.s, next, ud, r);
}

static const mg_range *worker_params(void *c, int *n)
{
    *n = 1;
    return &((ps_worker *)c)->whole;
}

/* Training: its own share, all along (a worker that left takes its share
 * with it); evaluation: a share among the workers that remain. */
static void worker_share(void *c, bool eval, int *rank, int *size)
{
    ps_worker *w = c;
    mg_group *now = mg__ps_workers_now(&w->j);
    *rank = eval ? mg_group_rank(now) : w->me;
    *size = eval ? mg_group_size(now) : w->j.workers;
}

const mg_component_ops mg__ps_worker_component = {
    .name = "ps-worker",
    .attach = worker_attach,
    .destroy = worker_destroy,
    .ranges = worker_ranges,
    .own_ranges = worker_ranges,
    .param_ranges = worker_params,
    .batch_over = worker_batch,
    .zero_grad = worker_zero_grad,
    .micro_end = worker_micro_end,
    .reduce = worker_reduce,
    .after_update = worker_after_update,
    .evaluate = worker_evaluate,
    .data_share = worker_share,
    .settle = mg__ps_settle,
};
