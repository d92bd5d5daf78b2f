/* The parameter server's server (ps.c says how the job works): a run of
 * whole units of the arena and the optimizer's state for it; each of its
 * steps takes the workers' pushes as they come and updates the run:
 *   - bounded staleness S: update k is the mean of the k-th pushes, kept
 *     in a slot per worker and round (pushes of the next S steps wait
 *     there) and summed in a binary tree over the workers (slot w += slot
 *     w + 2^k at level k), so its bits do not depend on arrival; a push is
 *     answered with the run as soon as the server's version allows the
 *     worker's next step; under --deterministic a push also carries the
 *     borrowed gradients' root (a tied head's) where this run holds the
 *     lender's range, summed in the same tree and added after the mean,
 *     as det.c adds its two trees;
 *   - fully asynchronous: each push is its own update as it comes
 *     (mg_strategy_update), answered after it.
 * A step ends when every worker that remains has pushed it (each worker's
 * pushes come in order); a worker that leaves under --elastic is left out
 * from then on, its pushes before kept.
 * Limits: (S + 1) x workers pushes of its run in memory under a bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/ps.h"

typedef struct {
    ps_job j;
    int me;             /* this server's index */
    mg_range mine;
    int rounds;         /* staleness + 1: the steps whose pushes can be here
                           (fully asynchronous: none wait) */
    /* --deterministic: the borrowed gradients (a tied head's), which the
     * workers push apart when this run holds the lender's range (its
     * offset in the run; tn 0: none). */
    size_t tie_at, tn;
    size_t stride;      /* a push's floats: the run's, then tn */
    int *order;         /* per worker: the workers that pushed a step, ascending */
    float *slots;       /* per round mod rounds, a push of each worker */
    int64_t *micro;     /* per round mod rounds: its micro-batches (-1: none in) */
    int64_t *next;      /* per worker: the step of its next push */
    int64_t *due;       /* per worker: the version its answer waits for (-1: none) */
    long step;          /* steps ended */
    long version;       /* updates applied */
    long pushes, stalest;
} ps_server;

static float *slot(ps_server *v, int64_t step, int w)
{
    return v->slots + ((size_t)(step % v->rounds) * (size_t)v->j.workers + (size_t)w) * v->stride;
}

static void server_destroy(void *c)
{
    ps_server *v = c;
    char bound[16] = "none";
    if (!v->j.async) snprintf(bound, sizeof bound, "%d", v->j.staleness);
    mg_debug("ps server %d: %ld pushes in %ld updates, staleness at most %ld (bound %s)", v->me,
             v->pushes, v->version, v->stalest, bound);
    mg__ps_job_free(&v->j);
    mg_free(v->slots);
    free(v->order);
    free(v->micro);
    free(v->next);
    free(v->due);
    free(v);
}

static mg_status server_attach(mg_strategy *s, void **state)
{
    MG_TRY(mg__ps_attach_role(s, true, sizeof(ps_server), state));
    ps_server *v = *state;
    mg_status st = MG_OK;
    if (v) {
        int W = v->j.workers;
        v->me = mg_group_rank(v->j.g) - W;
        v->mine = v->j.run[v->me];
        size_t len = v->mine.hi - v->mine.lo;
        mg_range tie = {0, 0};
        if (mg_strategy_options_of(s)->det_shards && !v->j.async)   /* det.c refuses async */
            st = mg__det_kept_apart(v->j.m, &tie);
        if (mg__ps_server_of(&v->j, tie) == v->me) {
            v->tie_at = tie.lo - v->mine.lo;
            v->tn = tie.hi - tie.lo;
        }
        v->stride = len + v->tn;
        v->rounds = v->j.async ? 1 : v->j.staleness + 1;
        size_t floats = v->j.async ? 1 : (size_t)v->rounds * (size_t)W * v->stride;
        v->slots = mg_alloc((floats ? floats : 1) * sizeof(float));
        v->order = malloc((size_t)W * sizeof *v->order);
        v->micro = malloc((size_t)v->rounds * sizeof *v->micro);
        v->next = calloc((size_t)W, sizeof *v->next);
        v->due = malloc((size_t)W * sizeof *v->due);
        if (!st && (!v->slots || !v->order || !v->micro || !v->next || !v->due))
            st = mg_error(MG_ENOMEM, "ps: out of memory for %d x %d pushes of %zu floats",
                          v->rounds, W, len);
        for (int k = 0; !st && k < v->rounds; k++) v->micro[k] = -1;
        for (int w = 0; !st && w < W; w++) v->due[w] = -1;
    }
    st = mg_strategy_agree(s, st);   /* every rank, both roles: none waits for a failed one */
    if (st && v) {
        server_destroy(v);
        *state = NULL;
    }
    return st;
}

static const mg_range *server_ranges(void *c, int *n)
{
    ps_server *v = c;
    *n = 1;
    return &v->mine;
}

static mg_group *server_shards(void *c) { return ((ps_server *)c)->j.role; }

/* Worker w's answer: this server's version and run. */
static mg_status answer(ps_server *v, int w)
{
    int64_t version = v->version;
    v->due[w] = -1;
    MG_TRY(mg_send(v->j.g, &version, 1, MG_I64, w, TAG_VERSION));
    return mg_send(v->j.g, mg_model_params(v->j.m) + v->mine.lo, v->mine.hi - v->mine.lo,
                   MG_F32, w, TAG_PARAMS);
}

/* A push's head from worker w, checked against what the server expects
 * of it: its next step, within the bound, on a version the server had. */
static mg_status check_head(ps_server *v, const int64_t head[HEAD_LEN], int w)
{
    ps_job *j = &v->j;
    int64_t step = head[HEAD_STEP], base = head[HEAD_BASE];
    int64_t micro = j->async ? -1 : v->micro[step % v->rounds];
    bool late = !j->async && (step < v->version || step > v->version + j->staleness ||
                              (micro >= 0 && micro != head[HEAD_MICRO]));
    if (w < 0 || w >= j->workers || step != v->next[w] || late || base > v->version ||
        head[HEAD_MICRO] < 1 || v->due[w] >= 0)
        return mg_error(MG_EMISMATCH, "ps server %d: rank %d pushed step %lld (%lld micro-batches, "
                        "on version %lld) at version %ld, staleness %d", v->me, w,
                        (long long)step, (long long)head[HEAD_MICRO], (long long)base,
                        v->version, j->staleness);
    /* Updates between its pull and its update (under a bound, update
     * `step` is the one its push goes into). */
    int64_t stale = (j->async ? v->version : step) - base;
    if (stale > v->stalest) v->stalest = stale;
    return MG_OK;
}

/* The next push from any worker that remains (*w: who, also when it
 * failed). Under a bound, into its slot, answered now if the version
 * allows; fully asynchronous, into the gradients as its own update
 * (clipped by its own norm), answered after it. */
static mg_status take_push(ps_server *v, mg_step_result *r, int *w)
{
    ps_job *j = &v->j;
    int64_t head[HEAD_LEN];
    *w = -1;
    MG_TRY(mg_recv_any(j->g, head, HEAD_LEN, MG_I64, j->live, j->n_live, TAG_HEAD, w));
    MG_TRY(check_head(v, head, *w));
    int64_t step = head[HEAD_STEP];
    float *into = j->async ? mg_model_grads(j->m) + v->mine.lo : slot(v, step, *w);
    size_t len = v->mine.hi - v->mine.lo;
    MG_TRY(mg_recv(j->g, into, len, MG_F32, *w, TAG_GRADS));
    if (v->tn) MG_TRY(mg_recv(j->g, into + len, v->tn, MG_F32, *w, TAG_TIE));
    v->next[*w] = step + 1;
    v->pushes++;
    if (j->async) {
        double sumsq;
        memcpy(&sumsq, &head[HEAD_SUMSQ], sizeof sumsq);
        v->due[*w] = v->version + 1;   /* answered by after_update */
        return mg_strategy_update(j->s, (int)head[HEAD_MICRO], sumsq, r);
    }
    v->micro[step % v->rounds] = head[HEAD_MICRO];
    v->due[*w] = step + 1 - j->staleness;
    return v->due[*w] <= v->version ? answer(v, *w) : MG_OK;
}

/* Has every worker that remains pushed step k? */
static bool step_in(const ps_server *v, long k)
{
    for (int i = 0; i < v->j.n_live; i++)
        if (v->next[v->j.live[i]] <= k) return false;
    return true;
}

/* One step: the workers' pushes as they come, until every worker that
 * remains has pushed this one. Under a bound, update `version`: the mean
 * of the step's pushes into the gradients of this server's run (the
 * strategy's step goes on from there). The server's source is worker 0's
 * share, counted (the trainer loads an image data set's shape alone for
 * a server: its micro-batches come without data), so that it knows a
 * step has none (the end of an epoch) as the workers do. */
static mg_status server_run_step(void *c, mg_batch_source next, void *ud, int max_micro,
                                 mg_step_result *r)
{
    ps_server *v = c;
    ps_job *j = &v->j;
    mg_micro_batch b;
    int count = 0;
    while (count < max_micro && next(ud, &b))
        if (++count && b.last) break;
    if (!count) return MG_OK;
    r->micro = count;
    while (!step_in(v, v->step)) {
        int w;
        mg_status st = take_push(v, r, &w);
        MG_TRY(mg__ps_lost(j, w, st));
    }
    v->step++;
    if (j->async) {
        r->updated = true;   /* its pushes' updates, if any came in this step, were the step */
        return MG_OK;
    }
    int64_t k = v->version % v->rounds;
    if (v->micro[k] != count)
        return mg_error(MG_EMISMATCH, "ps server %d: step %ld has %lld micro-batches where "
                        "its data has %d", v->me, v->version, (long long)v->micro[k], count);
    int n = 0;
    for (int w = 0; w < j->workers; w++)   /* those that pushed it */
        if (v->next[w] > v->version) v->order[n++] = w;
    /* The binary tree over them: slot i += slot i + b, level b = 1, 2, 4 ... */
    for (int b = 1; b < n; b <<= 1)
        for (int i = 0; i + b < n; i += 2 * b)
            mg_add_into(slot(v, v->version, v->order[i]), slot(v, v->version, v->order[i + b]),
                        v->stride);
    size_t len = v->mine.hi - v->mine.lo;
    float *root = slot(v, v->version, v->order[0]);
    mg_grad_scale(root, v->stride, 1.0f / (float)n);
    if (v->tn) mg_add_into(root + v->tie_at, root + len, v->tn);   /* the two trees' sum */
    v->micro[k] = -1;
    mg_device cpu = {MG_DEVICE_CPU, 0};   /* into the gradients (on the model's device) */
    return mg_device_copy(mg_model_device(j->m), mg_model_grads(j->m) + v->mine.lo, cpu, root,
                          len * sizeof *root);
}

/* After an update: the answers its version now allows (a worker that
 * cannot take its answer has left, under --elastic). */
static mg_status server_after_update(void *c)
{
    ps_server *v = c;
    ps_job *j = &v->j;
    v->version++;
    for (int w = 0; w < j->workers; w++)
        if (!j->gone[w] && v->due[w] >= 0 && v->due[w] <= v->version)
            MG_TRY(mg__ps_lost(j, w, answer(v, w)));
    return MG_OK;
}

/* A server holds only its run: it evaluates nothing (the workers do,
 * through the same slot, so that both roles take the same path); it reads
 * its source to the end, as a rank that evaluated would. */
static mg_status server_evaluate(void *c, mg_batch_source next, void *ud, mg_step_result *r)
{
    (void)c, (void)r;
    mg_micro_batch b;
    while (next(ud, &b)) {}
    return MG_OK;
}

static void server_share(void *c, bool eval, int *rank, int *size)
{
    (void)eval;
    *rank = 0;   /* the steps of worker 0's share, counted: it takes no data */
    *size = ((ps_server *)c)->j.workers;
}

const mg_range *mg__ps_server_run(mg_strategy *s, mg_group **servers)
{
    ps_server *v = mg_strategy_part(s, &mg__ps_server_component);
    if (!v) return NULL;
    *servers = v->j.role;
    return &v->mine;
}

const mg_component_ops mg__ps_server_component = {
    .name = "ps-server",
    .attach = server_attach,
    .destroy = server_destroy,
    .ranges = server_ranges,
    .shards_over = server_shards,
    .run_step = server_run_step,
    .after_update = server_after_update,
    .evaluate = server_evaluate,
    .data_share = server_share,
    .settle = mg__ps_settle,
};
