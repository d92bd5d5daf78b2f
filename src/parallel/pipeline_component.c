/* The pipeline executor (pipeline.c, pipeline_exec.c) as a strategy's component: it
 * drives the step (the schedule's forwards and backwards of every
 * micro-batch), keeps its stages' ranges, adds tied parameters'
 * gradients after the step, and runs evaluation and generation through
 * its stages. Its stages' replicas (a data-parallel dimension of the
 * mesh) are the next component's: DDP over these ranges.
 *
 * Each rank holds only its stages' parameters (the plan gives a model
 * without values only those, one with values rank 0's). With
 * --offload disk:DIR the optimizer's state of its ranges lives in files
 * (the strategy's, as for DDP). */
#include <stdint.h>
#include <stdlib.h>
#include "parallel/internal.h"

static void before_backward(void *s, bool final) { mg_strategy_micro_begin(s, final); }
static mg_status after_backward(void *s) { return mg_strategy_micro_end(s); }

/* Nothing to do without pp > 1 in the mesh. */
static mg_status pipe_attach(mg_strategy *s, void **state)
{
    const mg_strategy_options *o = mg_strategy_options_of(s);
    mg_model *m = mg_strategy_model(s);
    mg_mesh *mesh = mg_strategy_mesh(s);
    if (!mesh || mg_mesh_size(mesh, MG_MESH_PP) == 1) return MG_OK;   /* no pipeline */
    mg_pipe *p = NULL;
    mg_status st = mg_strategy_agree(s, mg__pipe_create(mg_mesh_group(mesh, MG_MESH_PP), m,
                                                       &o->pipe, o->max_batch, &p));
    /* The components after it learn which backward is a stage's last
     * (DDP then starts its replicas' average of the stage's ranges). */
    if (p) mg__pipe_around_backward(p, before_backward, after_backward, s);
    *state = p;
    return st;
}

static void pipe_destroy(void *c) { mg__pipe_destroy(c); }
static const mg_range *pipe_ranges(void *c, int *n) { return mg__pipe_ranges(c, n); }
static const mg_range *pipe_own(void *c, int *n) { return mg__pipe_own_ranges(c, n); }
static mg_group *pipe_group(void *c) { return mg__pipe_group(c); }
/* Tied gradients added after the step (--deterministic adds them itself). */
static mg_status pipe_reduce(void *c)
{
    return mg__pipe_ties_left(c) ? MG_OK : mg__pipe_sum_ties(c);
}
static mg_status pipe_gather(void *c) { return mg__pipe_gather(c); }

/* Only its ranges have gradients (zeroing the whole arena would touch
 * every stage's pages). */
static void pipe_zero_grad(void *c)
{
    int n;
    const mg_range *r = mg__pipe_ranges(c, &n);
    mg_model *m = mg__pipe_model(c);
    for (int k = 0; k < n; k++)
        (void)mg_device_zero(mg_model_device(m), mg_model_grads(m) + r[k].lo,
                             (r[k].hi - r[k].lo) * sizeof(float));
}

static mg_status pipe_step(void *c, mg_batch_source next, void *ud, int max_micro,
                           mg_step_result *r)
{
    return mg__pipe_step(c, next, ud, max_micro, r);
}

static mg_status pipe_release(void *c)
{
    mg__pipe_release(c);
    return MG_OK;
}

/* A checkpoint's buffers (running statistics) come from every stage. */
static mg_status pipe_hold(void *c, bool saving)
{
    return saving ? mg__pipe_gather_buffers(c) : MG_OK;
}

/* M micro-batches at a time through the stages, until next has none. */
static mg_status pipe_evaluate(void *c, mg_batch_source next, void *ud, mg_step_result *r)
{
    for (;;) {
        mg_step_result q = {0};
        MG_TRY(mg__pipe_forward(c, next, ud, INT32_MAX, &q));
        if (!q.micro) return MG_OK;
        r->micro += q.micro;
        r->loss_sum += q.loss_sum;
        r->correct += q.correct;
        r->samples += q.samples;
    }
}

/* Generation: every stage runs each context's forward, the last one has
 * the logits (the others a row of zeros) and its pick goes to all. */
typedef struct {
    mg_pipe *p;
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
    if (mg__pipe_forward(g->p, gen_next, g, 1, &r)) return NULL;
    const float *l = mg__pipe_logits(g->p);
    return l ? l : g->zeros;
}

static mg_status gen_share(void *ud, int32_t *tok)
{
    gen_pipe *g = ud;
    int S;
    mg_pipe_cut(g->p, &S);
    mg_group *pp = mg__pipe_group(g->p);
    return mg_broadcast(pp, tok, 1, MG_I32, (S - 1) % mg_group_size(pp));
}

static mg_status pipe_generate(void *c, const int32_t *prompt, int n_prompt, int n,
                               float temperature, int top_k, uint64_t seed, int32_t *out)
{
    mg_pipe *p = c;
    mg_model *m = mg__pipe_model(p);
    int T = mg_model_positions(m), V = mg_model_classes(m);
    if (T < 2)
        return mg_error(MG_EINVAL, "generate: model %s is not a language model",
                        mg_model_name(m));
    gen_pipe g = {.p = p, .labels = calloc((size_t)T, sizeof(int32_t)),
                  .zeros = calloc((size_t)T * V, sizeof(float))};
    mg_status st = !g.labels || !g.zeros ? mg_error(MG_ENOMEM, "generate: out of memory")
                                         : MG_OK;
    mg_lm_forward f = {gen_forward, gen_share, &g, m, T, V};
    if (!st) st = mg_generate(&f, prompt, n_prompt, n, temperature, top_k, seed, out);
    free(g.labels);
    free(g.zeros);
    return st;
}

/* It holds its ranges, and its tapes' activations. */
static void pipe_memory(void *c, mg_memory_stats *ms)
{
    int n;
    const mg_range *rg = mg__pipe_ranges(c, &n);
    ms->params = 0;
    for (int k = 0; k < n; k++) ms->params += (rg[k].hi - rg[k].lo) * sizeof(float);
    ms->grads = ms->params;
    ms->activations = mg_pipe_get_stats(c).activation_bytes;
}

const mg_component_ops mg__pipe_component = {
    .name = "pipeline", .attach = pipe_attach, .destroy = pipe_destroy,
    .ranges = pipe_ranges, .own_ranges = pipe_own, .shards_over = pipe_group,
    .zero_grad = pipe_zero_grad, .run_step = pipe_step, .reduce = pipe_reduce,
    .hold = pipe_hold, .gather = pipe_gather, .release = pipe_release,
    .evaluate = pipe_evaluate, .generate = pipe_generate, .memory = pipe_memory,
};
