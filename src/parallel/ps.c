/* The parameter server (issue 34): `--parallel ps --servers K`. The last K
 * ranks of the job are servers, the others workers.
 *   - A server owns a contiguous run of whole units of the arena, the
 *     runs balanced by their parameters, and the optimizer's state for
 *     them (its ranges); it computes nothing.
 *   - A worker keeps the whole model and no optimizer state: each step it
 *     runs its share of the global batch (the micro-batches as one
 *     process would), pushes each server the gradients of its run (their
 *     sum over the micro-batches, with how many there were) and takes the
 *     server's updated parameters back.
 *   - Update k of a server is the mean of the workers' k-th pushes, taken
 *     as they come (recv from any source, then from that worker) into a
 *     slot per worker and summed in worker order, so its bits do not
 *     depend on arrival; it goes through the strategy's step (the mean
 *     over the micro-batches, clipping over the servers' runs, the
 *     optimizer).
 *   - Bounded staleness S (SSP, Ho et al. 2013): a worker's k-th gradient
 *     is computed on parameters of version k - S or later (the version:
 *     updates applied). A server answers push k with its run as soon as
 *     its version is k + 1 - S or later, so a worker runs at most S steps
 *     ahead of the slowest, and pushes of the next S steps wait in their
 *     slots. S = 0 is synchronous: the numbers are DDP's but for the
 *     order of the sum.
 *   - Fully asynchronous (S unbounded, TensorFlow's first parameter
 *     servers): each push is its own update as it comes (the mean over
 *     its micro-batches, clipped by its own norm, which the worker sends),
 *     and its worker gets the run back at once. A server's trainer step
 *     takes as many pushes as there are workers, so the learning-rate
 *     schedule follows the server's updates / workers; the optimizer
 *     counts the updates (Adam's bias correction, in checkpoints too).
 * Each push says the version of that server's run it was computed on (the
 * version: updates applied): a server counts the pushes and the largest
 * staleness it saw (updates between a worker's pull and its push's
 * update).
 * The job's group carries the pushes and parameters; the workers' group
 * sums the training figures and the servers' the gradient norm.
 * Checkpoints are the strategy's: each server writes its run (its own
 * ranges), rank 0 the rest; every rank reads what it holds.
 * Limits: no exclusion of a dead worker yet; memory for (S + 1) x workers
 * pushes of its run on a server under bounded staleness; no tensor or
 * pipeline parallelism with it; the model's buffers (batch statistics)
 * stay each worker's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"

enum { TAG_HEAD = 0x7073, TAG_GRADS, TAG_VERSION, TAG_PARAMS };   /* "ps" */

/* What the two roles share: the job, who is who, and each server's run. */
typedef struct {
    mg_strategy *s;
    mg_model *m;
    mg_group *g;        /* the job: pushes and parameters */
    mg_group *role;     /* the workers, or the servers */
    int workers, servers, staleness;
    bool async;         /* staleness unbounded: each push its own update */
    mg_range *run;      /* per server: its units' range of the arena */
} ps_job;

/* A push's head: the worker's step, its micro-batches, the version of the
 * server's run it computed on, and (fully asynchronous) the squared norm
 * of its mean gradient, the bits of a double. */
enum { HEAD_STEP, HEAD_MICRO, HEAD_BASE, HEAD_SUMSQ, HEAD_LEN };

/* The arena cut at unit borders into `servers` runs of about equal
 * parameters (the last takes the arena's end). */
static mg_status cut_runs(ps_job *j)
{
    int nu = mg_model_num_units(j->m), K = j->servers;
    size_t total = mg_model_arena_size(j->m);
    if (nu < K)
        return mg_error(MG_EINVAL, "--servers %d: the model has %d units to split among them; "
                        "give at most %d", K, nu, nu);
    if (!(j->run = calloc((size_t)K, sizeof *j->run)))
        return mg_error(MG_ENOMEM, "ps: out of memory");
    size_t lo = 0;
    int u = 0;
    for (int k = 0; k < K; k++) {
        size_t want = total * (size_t)(k + 1) / (size_t)K, hi = lo;
        /* Whole units up to the share, leaving one for each server after. */
        while (u < nu - (K - 1 - k)) {
            size_t a, b;
            mg_model_unit_range(j->m, u, &a, &b);
            if (hi > lo && b > want && k + 1 < K) break;
            hi = b;
            u++;
        }
        if (k + 1 == K) hi = total;
        j->run[k] = (mg_range){lo, hi};
        lo = hi;
    }
    return MG_OK;
}

/* The job split into workers (color 0) and servers (1), and the servers'
 * runs: collective, on every rank, in each role's attach (every rank
 * finds the same mistakes before it communicates). *mine: the rank's
 * role is `server`. */
static mg_status join(mg_strategy *s, bool server, ps_job *j, bool *mine)
{
    const mg_strategy_options *o = mg_strategy_options_of(s);
    memset(j, 0, sizeof *j);
    j->s = s;
    j->m = mg_strategy_model(s);
    j->g = o->group;
    int world = j->g ? mg_group_size(j->g) : 1, rank = j->g ? mg_group_rank(j->g) : 0;
    j->servers = o->ps_servers;
    j->workers = world - j->servers;
    j->staleness = o->ps_staleness;
    j->async = o->ps_staleness == MG_STALENESS_UNBOUNDED;
    if (!j->g || j->servers < 1 || j->workers < 1)
        return mg_error(MG_EINVAL, "--parallel ps: %d server(s) among %d rank(s) leave no "
                        "worker; give --servers below the ranks", j->servers, world);
    if (!j->async && (o->ps_staleness < 0 || o->ps_staleness > 64))
        return mg_error(MG_EINVAL, "--staleness %d: give 0 (synchronous) to 64, or inf (fully "
                        "asynchronous)", o->ps_staleness);
    /* The runs first: every rank finds the same mistake before the split. */
    MG_TRY(cut_runs(j));
    bool is_server = rank >= j->workers;
    MG_TRY(mg_group_split(j->g, is_server, rank, &j->role));
    *mine = is_server == server;
    if (*mine) mg_group_set_name(j->role, server ? "ps" : "workers");
    return MG_OK;
}

static void job_free(ps_job *j)
{
    mg_group_destroy(j->role);
    free(j->run);
}

/* A role's state (size bytes, its ps_job first) on the ranks of that
 * role; *state stays NULL on the others (the component drops itself). */
static mg_status attach_role(mg_strategy *s, bool server, size_t size, void **state)
{
    ps_job *j = calloc(1, size);
    if (!j) return mg_error(MG_ENOMEM, "ps: out of memory");
    bool mine = false;
    mg_status st = join(s, server, j, &mine);
    if (st || !mine) {
        job_free(j);
        free(j);
        return st;
    }
    *state = j;
    return MG_OK;
}

/* ---- the server ------------------------------------------------------------ */

typedef struct {
    ps_job j;
    int me;             /* this server's index */
    mg_range mine;
    int rounds;         /* staleness + 1: the steps whose pushes can be here
                           (fully asynchronous: none wait) */
    float *slots;       /* per round mod rounds, a push of each worker */
    int *got;           /* per round mod rounds: pushes in */
    int64_t *micro;     /* per round mod rounds: its micro-batches */
    int64_t *due;       /* per worker: the version its answer waits for (-1: none) */
    long version;       /* updates applied */
    long pushes, stalest;
} ps_server;

static float *slot(ps_server *v, int64_t step, int w)
{
    size_t len = v->mine.hi - v->mine.lo;
    return v->slots + ((size_t)(step % v->rounds) * (size_t)v->j.workers + (size_t)w) * len;
}

static void server_destroy(void *c)
{
    ps_server *v = c;
    char bound[16] = "none";
    if (!v->j.async) snprintf(bound, sizeof bound, "%d", v->j.staleness);
    mg_debug("ps server %d: %ld pushes in %ld updates, staleness at most %ld (bound %s)", v->me,
             v->pushes, v->version, v->stalest, bound);
    job_free(&v->j);
    mg_free(v->slots);
    free(v->got);
    free(v->micro);
    free(v->due);
    free(v);
}

static mg_status server_attach(mg_strategy *s, void **state)
{
    MG_TRY(attach_role(s, true, sizeof(ps_server), state));
    ps_server *v = *state;
    mg_status st = MG_OK;
    if (v) {
        v->me = mg_group_rank(v->j.g) - v->j.workers;
        v->mine = v->j.run[v->me];
        size_t len = v->mine.hi - v->mine.lo;
        v->rounds = v->j.async ? 1 : v->j.staleness + 1;
        size_t floats = v->j.async ? 1 : (size_t)v->rounds * (size_t)v->j.workers * (len ? len : 1);
        v->slots = mg_alloc(floats * sizeof(float));
        v->got = calloc((size_t)v->rounds, sizeof *v->got);
        v->micro = calloc((size_t)v->rounds, sizeof *v->micro);
        v->due = malloc((size_t)v->j.workers * sizeof *v->due);
        for (int w = 0; v->due && w < v->j.workers; w++) v->due[w] = -1;
        if (!v->slots || !v->got || !v->micro || !v->due)
            st = mg_error(MG_ENOMEM, "ps: out of memory for %d x %d pushes of %zu floats",
                          v->rounds, v->j.workers, len);
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
    MG_TRY(mg_send(v->j.g, &version, 1, MG_I64, w, TAG_VERSION));
    MG_TRY(mg_send(v->j.g, mg_model_params(v->j.m) + v->mine.lo, v->mine.hi - v->mine.lo,
                   MG_F32, w, TAG_PARAMS));
    v->due[w] = -1;
    return MG_OK;
}

/* The next push's head from any worker: *w who, checked against what the
 * server expects of it. */
static mg_status take_head(ps_server *v, int64_t head[HEAD_LEN], int *w)
{
    ps_job *j = &v->j;
    *w = -1;
    MG_TRY(mg_recv_any(j->g, head, HEAD_LEN, MG_I64, NULL, 0, TAG_HEAD, w));
    int64_t step = head[HEAD_STEP], base = head[HEAD_BASE];
    int k = j->async ? 0 : (int)(step % v->rounds);
    bool late = !j->async && (step < v->version || step > v->version + j->staleness ||
                              (v->got[k] && v->micro[k] != head[HEAD_MICRO]));
    if (*w < 0 || *w >= j->workers || late || base > v->version || head[HEAD_MICRO] < 1 ||
        v->due[*w] >= 0)
        return mg_error(MG_EMISMATCH, "ps server %d: rank %d pushed step %lld (%lld micro-batches, "
                        "on version %lld) at version %ld, staleness %d", v->me, *w,
                        (long long)step, (long long)head[HEAD_MICRO], (long long)base,
                        v->version, j->staleness);
    v->pushes++;
    /* Updates between its pull and its update (under a bound, update
     * `step` is the one its push goes into). */
    int64_t stale = (j->async ? v->version : step) - base;
    if (stale > v->stalest) v->stalest = stale;
    return MG_OK;
}

/* One push (bounded staleness) into its slot; its answer now if the
 * version allows. */
static mg_status take_push(ps_server *v)
{
    ps_job *j = &v->j;
    int64_t head[HEAD_LEN];
    int w;
    MG_TRY(take_head(v, head, &w));
    int64_t step = head[HEAD_STEP];
    int k = (int)(step % v->rounds);
    MG_TRY(mg_recv(j->g, slot(v, step, w), v->mine.hi - v->mine.lo, MG_F32, w, TAG_GRADS));
    v->micro[k] = head[HEAD_MICRO];
    v->got[k]++;
    v->due[w] = step + 1 - j->staleness;
    return v->due[w] <= v->version ? answer(v, w) : MG_OK;
}

/* Fully asynchronous: one push straight into the gradients, its own
 * update (clipped by its norm) and the worker's answer after it. */
static mg_status apply_push(ps_server *v, mg_step_result *r)
{
    ps_job *j = &v->j;
    int64_t head[HEAD_LEN];
    int w;
    MG_TRY(take_head(v, head, &w));
    MG_TRY(mg_recv(j->g, mg_model_grads(j->m) + v->mine.lo, v->mine.hi - v->mine.lo, MG_F32, w,
                   TAG_GRADS));
    double sumsq;
    memcpy(&sumsq, &head[HEAD_SUMSQ], sizeof sumsq);
    v->due[w] = v->version + 1;   /* answered by after_update */
    MG_TRY(mg_strategy_update(j->s, (int)head[HEAD_MICRO], sumsq, r));
    r->updates++;
    return MG_OK;
}

/* Update `version`: the workers' pushes of that step, taken as they come
 * (those of the next steps too, into their slots), their mean into the
 * gradients of this server's run. Fully asynchronous: as many pushes as
 * there are workers, whoever sends them, each its own update. The
 * server's source is worker 0's share: it reads (and drops) its
 * micro-batches, so that it knows a step has none (the end of an epoch)
 * as the workers do. */
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
    if (j->async) {
        for (int i = 0; i < j->workers; i++) MG_TRY(apply_push(v, r));
        return MG_OK;
    }
    int k = (int)(v->version % v->rounds);
    while (v->got[k] < j->workers) MG_TRY(take_push(v));
    if (v->micro[k] != count)
        return mg_error(MG_EMISMATCH, "ps server %d: step %ld has %lld micro-batches where "
                        "its data has %d", v->me, v->version, (long long)v->micro[k], count);
    size_t len = v->mine.hi - v->mine.lo;
    float *g = mg_model_grads(j->m) + v->mine.lo;
    memcpy(g, slot(v, v->version, 0), len * sizeof *g);
    for (int w = 1; w < j->workers; w++) mg_add_into(g, slot(v, v->version, w), len);
    mg_grad_scale(g, len, 1.0f / (float)j->workers);
    v->got[k] = 0;
    return MG_OK;
}

/* After the update: the answers its version now allows. */
static mg_status server_after_update(void *c)
{
    ps_server *v = c;
    v->version++;
    for (int w = 0; w < v->j.workers; w++)
        if (v->due[w] >= 0 && v->due[w] <= v->version) MG_TRY(answer(v, w));
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


static void server_share(void *c, int *rank, int *size)
{
    *rank = 0;   /* the steps of worker 0's share; it takes no data */
    *size = ((ps_server *)c)->j.workers;
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
};

/* ---- the worker -------------------------------------------------------------- */

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
    job_free(&w->j);
    free(w->base);
    free(w);
}

static mg_status worker_attach(mg_strategy *s, void **state)
{
    MG_TRY(attach_role(s, false, sizeof(ps_worker), state));
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

static mg_group *worker_batch(void *c) { return ((ps_worker *)c)->j.role; }

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
    double sumsq = j->async ? mg_grad_sumsq(g, w->whole.hi) / ((double)w->micro * w->micro) : 0;
    int64_t head[HEAD_LEN] = {[HEAD_STEP] = w->step, [HEAD_MICRO] = w->micro};
    memcpy(&head[HEAD_SUMSQ], &sumsq, sizeof sumsq);
    for (int k = 0; k < j->servers; k++) {
        int to = j->workers + k;
        head[HEAD_BASE] = w->base[k];
        MG_TRY(mg_send(j->g, head, HEAD_LEN, MG_I64, to, TAG_HEAD));
        MG_TRY(mg_send(j->g, g + j->run[k].lo, j->run[k].hi - j->run[k].lo, MG_F32, to,
                       TAG_GRADS));
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

static void worker_share(void *c, int *rank, int *size)
{
    ps_worker *w = c;
    *rank = w->me;
    *size = w->j.workers;
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
};
