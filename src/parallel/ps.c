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
 *   - Synchronous (staleness 0): a server waits for every worker's push
 *     of the step and sums them in worker order, whatever order they came
 *     in (recv from any source, then from that worker), so its bits do
 *     not depend on arrival; the mean over the workers goes through the
 *     strategy's step (the mean over the micro-batches, clipping over the
 *     servers' runs, the optimizer), and it sends each worker its run's
 *     parameters. The numbers are DDP's but for the order of the sum.
 * The job's group carries the pushes and parameters; the workers' group
 * sums the training figures and the servers' the gradient norm.
 * Checkpoints are the strategy's: each server writes its run (its own
 * ranges), rank 0 the rest; every rank reads what it holds.
 * Limits (this increment): staleness 0 only (bounded staleness and
 * asynchronous updates and a dead worker's exclusion are the issue's
 * next parts); no tensor or
 * pipeline parallelism with it; the model's buffers (batch statistics)
 * stay each worker's. */
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"

enum { TAG_HEAD = 0x7073, TAG_GRADS, TAG_PARAMS };   /* "ps" */

/* What the two roles share: the job, who is who, and each server's run. */
typedef struct {
    mg_strategy *s;
    mg_model *m;
    mg_group *g;        /* the job: pushes and parameters */
    mg_group *role;     /* the workers, or the servers */
    int workers, servers;
    mg_range *run;      /* per server: its units' range of the arena */
} ps_job;

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

/* The job split into workers (color 0) and servers (1): collective, on
 * every rank, in each role's attach. *mine: the rank's role is `server`. */
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
    if (!j->g || j->servers < 1 || j->workers < 1)
        return mg_error(MG_EINVAL, "--parallel ps: %d server(s) among %d rank(s) leave no "
                        "worker; give --servers below the ranks", j->servers, world);
    if (o->ps_staleness != 0)
        return mg_error(MG_EUNSUPPORTED, "--staleness %d: only synchronous updates (0) are "
                        "built yet", o->ps_staleness);
    bool is_server = rank >= j->workers;
    MG_TRY(mg_group_split(j->g, is_server, rank, &j->role));
    *mine = is_server == server;
    if (*mine) mg_group_set_name(j->role, server ? "ps" : "workers");
    return *mine ? cut_runs(j) : MG_OK;
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
    float *slots;       /* a push of each worker, in worker order */
    long step;
} ps_server;

static void server_destroy(void *c)
{
    ps_server *v = c;
    job_free(&v->j);
    mg_free(v->slots);
    free(v);
}

static mg_status server_attach(mg_strategy *s, void **state)
{
    MG_TRY(attach_role(s, true, sizeof(ps_server), state));
    ps_server *v = *state;
    if (!v) return MG_OK;
    v->me = mg_group_rank(v->j.g) - v->j.workers;
    v->mine = v->j.run[v->me];
    size_t len = v->mine.hi - v->mine.lo;
    v->slots = mg_alloc((size_t)v->j.workers * (len ? len : 1) * sizeof(float));
    if (v->slots) return MG_OK;
    int workers = v->j.workers;
    server_destroy(v);
    *state = NULL;
    return mg_error(MG_ENOMEM, "ps: out of memory for %d pushes", workers);
}

static const mg_range *server_ranges(void *c, int *n)
{
    ps_server *v = c;
    *n = 1;
    return &v->mine;
}

static mg_group *server_shards(void *c) { return ((ps_server *)c)->j.role; }

/* A step: every worker's push, in any order, into its slot; their mean
 * into the gradients of this server's run. The server's source is worker
 * 0's share: it reads (and drops) its micro-batches, so that it knows a
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
    size_t len = v->mine.hi - v->mine.lo;
    int64_t head[2] = {0, 0}, micro = count;
    for (int i = 0; i < j->workers; i++) {
        int from = -1;
        MG_TRY(mg_recv_any(j->g, head, 2, MG_I64, NULL, 0, TAG_HEAD, &from));
        if (from < 0 || from >= j->workers || head[0] != v->step || head[1] != micro)
            return mg_error(MG_EMISMATCH, "ps server %d: a push of step %lld with %lld "
                            "micro-batches from rank %d where step %ld was due", v->me,
                            (long long)head[0], (long long)head[1], from, v->step);
        micro = head[1];
        MG_TRY(mg_recv(j->g, v->slots + (size_t)from * len, len, MG_F32, from, TAG_GRADS));
    }
    float *g = mg_model_grads(j->m) + v->mine.lo, inv = 1.0f / (float)j->workers;
    memcpy(g, v->slots, len * sizeof *g);
    for (int w = 1; w < j->workers; w++) mg_add_into(g, v->slots + (size_t)w * len, len);
    mg_grad_scale(g, len, inv);
    r->micro = (int)micro;
    v->step++;
    return MG_OK;
}

/* The updated run to every worker. */
static mg_status server_after_update(void *c)
{
    ps_server *v = c;
    const float *p = mg_model_params(v->j.m) + v->mine.lo;
    for (int w = 0; w < v->j.workers; w++)
        MG_TRY(mg_send(v->j.g, p, v->mine.hi - v->mine.lo, MG_F32, w, TAG_PARAMS));
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
    mg_range none;      /* the optimizer's: nothing (the servers step) */
    mg_range whole;     /* the parameters it holds: all */
} ps_worker;

static mg_status worker_attach(mg_strategy *s, void **state)
{
    MG_TRY(attach_role(s, false, sizeof(ps_worker), state));
    ps_worker *w = *state;
    if (!w) return MG_OK;
    w->me = mg_group_rank(w->j.g);
    w->whole = (mg_range){0, mg_model_arena_size(w->j.m)};
    return MG_OK;
}

static void worker_destroy(void *c)
{
    ps_worker *w = c;
    job_free(&w->j);
    free(w);
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

/* Each server's run of the gradients (summed over the micro-batches). */
static mg_status worker_reduce(void *c)
{
    ps_worker *w = c;
    ps_job *j = &w->j;
    int64_t head[2] = {w->step, w->micro};
    const float *g = mg_model_grads(j->m);
    for (int k = 0; k < j->servers; k++) {
        int to = j->workers + k;
        MG_TRY(mg_send(j->g, head, 2, MG_I64, to, TAG_HEAD));
        MG_TRY(mg_send(j->g, g + j->run[k].lo, j->run[k].hi - j->run[k].lo, MG_F32, to,
                       TAG_GRADS));
    }
    return MG_OK;
}

/* The servers' updated runs. */
static mg_status worker_after_update(void *c)
{
    ps_worker *w = c;
    ps_job *j = &w->j;
    float *p = mg_model_params(j->m);
    for (int k = 0; k < j->servers; k++)
        MG_TRY(mg_recv(j->g, p + j->run[k].lo, j->run[k].hi - j->run[k].lo, MG_F32,
                       j->workers + k, TAG_PARAMS));
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
