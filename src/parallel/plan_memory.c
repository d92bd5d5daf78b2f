/* The planner's memory side: what one rank of a plan holds, computed from
 * the strategies' own rules instead of counted. The model is built as the
 * rank's tensor-parallel part without values (MG_SEED_DEFERRED: address
 * space only), padded as the strategy pads it (mg_shard_pad of the dp
 * size) and cut as the pipeline cuts it (mg_pipe_balance of
 * mg_pipe_unit_cost); then
 *   - parameters and gradients: the arena (one process, DDP, tp), the
 *     rank's stage ranges (a pipeline, with or without ZeRO over its
 *     replicas: they are whole during a step), or ZeRO's peaks, found by
 *     walking its buckets through a step as zero.c's hooks move them
 *     (walk() below: the same rules, in the same order);
 *   - the optimizer: its states (Adam 2, SGD with momentum 1) over the
 *     ranges it steps (the arena, the stage's ranges, or ZeRO's pieces:
 *     1/dp of them); offloaded, its windows (mg_optim_offload_bytes);
 *   - offloaded ZeRO 2-3 without a pipeline: the gradient pieces in
 *     files, and under stage 3 the parameter pieces (a bucket is in
 *     memory only while gathered);
 *   - activations: the tapes the run makes (mg_tape_bytes_for), a
 *     pipeline's as many per chunk as its schedule holds in flight, with
 *     their input buffers.
 * The test (test_planner.c) compares every figure but the activations with
 * mg_strategy_memory after real steps; a change to zero.c's bucket rules
 * that walk() does not follow fails it.
 *
 * Limits: ZeRO-3's evaluation gathers every parameter (counted
 * when the job evaluates); a reduction that completes before the next
 * bucket's backward begins would lower ZeRO-2's peak below the walk's
 * (the walk assumes none does, as on every run measured). */
#include <stdlib.h>
#include <string.h>
#include "parallel/planner_internal.h"

mg_status mg__plan_model(const mg_plan_job *job, const mg_plan *p, int tp_rank, mg_model **out)
{
    *out = NULL;
    mg_tp_split split = {p->tp, tp_rank, p->sequence_parallel};
    mg_model *m;
    if (!strcmp(job->model, "gpt-mini")) {
        mg_gpt_config g = job->gpt;
        g.tp = split;
        MG_TRY(mg_model_create_gpt(&g, MG_SEED_DEFERRED, &m));
    } else {
        MG_TRY(mg_model_create_split(job->model, MG_SEED_DEFERRED, split, &m));
    }
    mg_model_set_recompute(m, p->recompute);
    size_t pad = mg_shard_pad(p->dp);
    mg_status st = mg_model_unit_pad(m) % pad ? mg_model_set_unit_pad(m, pad) : MG_OK;
    if (st) mg_model_destroy(m);
    else *out = m;
    return st;
}

mg_status mg__plan_shape_make(const mg_plan_job *job, const mg_plan *p, int tp_rank,
                              mg__plan_shape *out)
{
    *out = (mg__plan_shape){0};
    MG_TRY(mg__plan_model(job, p, tp_rank, &out->m));
    out->n = mg_model_num_units(out->m);
    out->unit = malloc(sizeof *out->unit * (size_t)out->n);
    if (!out->unit) {
        mg__plan_shape_free(out);
        return mg_error(MG_ENOMEM, "planner: out of memory");
    }
    for (int u = 0; u < out->n; u++) out->unit[u] = mg_model_unit(out->m, u);
    return MG_OK;
}

void mg__plan_shape_free(mg__plan_shape *s)
{
    mg_model_destroy(s->m);
    free(s->unit);
    *s = (mg__plan_shape){0};
}

mg_status mg__plan_cut(const mg__plan_shape *s, const mg_plan *p, int *first)
{
    int nu = s->n, S = p->pp * p->chunks;
    if (p->pp == 1) {
        first[0] = 0;
        first[1] = nu;
        return MG_OK;
    }
    if (S > nu)
        return mg_error(MG_EINVAL, "%d stages for %s's %d units", S, mg_model_name(s->m), nu);
    double *cost = malloc(sizeof *cost * (size_t)nu);
    if (!cost) return mg_error(MG_ENOMEM, "planner: out of memory");
    for (int u = 0; u < nu; u++) cost[u] = mg_pipe_unit_cost(s->m, u);
    mg_status st = mg_pipe_balance(cost, nu, S, first);
    free(cost);
    return st;
}

mg_optim_config mg__plan_optim(const mg_plan_job *job)
{
    mg_optim_config c = mg_optim_defaults(job->optimizer, 1);
    c.momentum = job->momentum;
    return c;
}

int mg__plan_states(const mg_plan_job *job)
{
    mg_optim_config c = mg__plan_optim(job);
    return mg_optim_states(&c);
}

void mg__plan_buckets(const mg_plan_job *job, size_t *first_cap, size_t *cap)
{
    mg_ddp_options d = mg_ddp_defaults();
    *cap = job->bucket_mb > 0 ? (size_t)(job->bucket_mb * (1 << 20)) : d.bucket_bytes;
    *first_cap = d.first_bucket_bytes < *cap ? d.first_bucket_bytes : *cap;
}

/* ---- ZeRO 1-3 without a pipeline: zero.c's buckets through a step ----- */

enum { SHARDED, GATHERED };
#define GENERAL 2   /* zero.c's pool: two buffers, and one for borrowed buckets */

typedef struct {
    size_t lo, hi, piece;   /* piece: the floats it keeps sharded (offloaded: 0) */
    int first, last, state, buf;
    bool keep;
} wbucket;

typedef struct {
    const mg_unit_info *unit;
    wbucket *b;
    int nb, nu, stage, next;
    int *ub, *borrow;
    int owner[GENERAL + 1];
    size_t params, grads, peak_params, peak_grads, ready;
} walker;

static void note(walker *w)
{
    if (w->params > w->peak_params) w->peak_params = w->params;
    if (w->grads > w->peak_grads) w->peak_grads = w->grads;
}

static void gather(walker *w, int i)
{
    if (i < 0 || i >= w->nb || w->b[i].state == GATHERED) return;
    w->b[i].state = GATHERED;
    w->params += (w->b[i].hi - w->b[i].lo - w->b[i].piece) * sizeof(float);
    note(w);
}

static void shard(walker *w, int i)
{
    if (w->b[i].state == SHARDED) return;
    w->b[i].state = SHARDED;
    w->params -= (w->b[i].hi - w->b[i].lo - w->b[i].piece) * sizeof(float);
}

static void reduce_end(walker *w, int i)
{
    wbucket *b = &w->b[i];
    if (b->buf < 0) return;
    w->owner[b->buf] = -1;
    b->buf = -1;
    w->grads -= (b->hi - b->lo) * sizeof(float);
}

/* A pool buffer for bucket i's gradients; when its kind's are all taken,
 * the reduction launched first is finished. */
static void acquire(walker *w, int i)
{
    if (i < 0 || w->stage < 2 || w->b[i].buf >= 0) return;
    wbucket *b = &w->b[i];
    int k0 = b->keep ? GENERAL : 0, k1 = b->keep ? GENERAL + 1 : GENERAL;
    for (;;) {
        for (int k = k0; k < k1; k++)
            if (w->owner[k] < 0) {
                w->owner[k] = i;
                b->buf = k;
                w->grads += (b->hi - b->lo) * sizeof(float);
                note(w);
                return;
            }
        int oldest = -1;
        for (int k = 0; k < w->next && oldest < 0; k++)
            if (w->b[k].buf >= k0 && w->b[k].buf < k1) oldest = k;
        if (oldest < 0) return;   /* cannot happen: zero.c asserts it */
        reduce_end(w, oldest);
    }
}

static void pre(walker *w, int u, int dir)
{
    if (w->stage < 3) return;
    int i = w->ub[u];
    gather(w, w->borrow[u]);
    if (i < 0) return;
    gather(w, i);
    if (u == (dir < 0 ? w->b[i].first : w->b[i].last)) gather(w, i + dir);
}

/* One micro-batch: forward, backward (the reductions of ready buckets
 * launched, stage 3 resharding them), the end. */
static void micro(walker *w, bool last)
{
    bool sync = w->stage >= 2 || last;
    w->ready = 0;
    w->next = 0;
    for (int u = 0; u < w->nu; u++) {
        pre(w, u, -1);
        int i = w->ub[u];
        if (w->stage >= 3 && i > 0 && u == w->b[i].last && !w->b[i].keep) shard(w, i);
    }
    for (int u = w->nu - 1; u >= 0; u--) {
        acquire(w, w->borrow[u]);
        acquire(w, w->ub[u]);
        pre(w, u, +1);
        if (!sync) continue;
        if (w->unit[u].hi > w->ready) w->ready = w->unit[u].hi;
        while (w->next < w->nb && w->b[w->next].hi <= w->ready) {
            if (w->stage >= 3) shard(w, w->next);
            w->next++;
        }
    }
    if (sync) {
        while (w->next < w->nb) acquire(w, w->next++);
        for (int i = 0; i < w->nb; i++) reduce_end(w, i);
    }
    for (int i = 0; i < w->nb && w->stage >= 3; i++) shard(w, i);
}

/* ZeRO's peaks of parameters and gradients of plan p (its stage, dp ranks
 * and micro-batches); offloaded, the pieces in files are not in memory
 * when a step starts (zero.c's peaks restart there). */
static mg_status walk(const mg__plan_shape *sh, const mg_plan *p, size_t first_cap, size_t cap,
                      bool evaluates, mg_memory_stats *ms)
{
    int nu = sh->n, stage = p->zero, dp = p->dp;
    walker w = {.unit = sh->unit, .nu = nu, .stage = stage};
    mg_range *r = calloc((size_t)nu + 1, sizeof *r);
    w.b = calloc((size_t)nu + 1, sizeof *w.b);
    w.ub = malloc(sizeof *w.ub * (size_t)(nu ? nu : 1));
    w.borrow = malloc(sizeof *w.borrow * (size_t)(nu ? nu : 1));
    mg_status st = !r || !w.b || !w.ub || !w.borrow
                       ? mg_error(MG_ENOMEM, "planner: out of memory") : MG_OK;
    if (!st) {
        w.nb = mg_buckets(sh->m, first_cap, cap, r);
        size_t n = mg_model_arena_size(sh->m), pieces = 0;
        for (int i = 0; i < w.nb; i++) {
            size_t piece = (r[i].hi - r[i].lo) / (size_t)dp;
            w.b[i] = (wbucket){.lo = r[i].lo, .hi = r[i].hi,
                               .piece = mg__plan_params_in_files(p) ? 0 : piece,
                               .first = nu, .last = -1, .state = GATHERED, .buf = -1};
            pieces += piece;
        }
        for (int u = 0; u < nu; u++) {
            size_t lo = sh->unit[u].lo, hi = sh->unit[u].hi;
            w.ub[u] = -1;
            for (int i = 0; i < w.nb && hi > lo; i++)
                if (w.b[i].lo <= lo && hi <= w.b[i].hi) {
                    w.ub[u] = i;
                    if (u < w.b[i].first) w.b[i].first = u;
                    if (u > w.b[i].last) w.b[i].last = u;
                }
        }
        for (int u = 0; u < nu; u++) {
            int v = sh->unit[u].borrows;
            w.borrow[u] = v >= 0 ? w.ub[v] : -1;
            if (w.borrow[u] >= 0) w.b[w.borrow[u]].keep = true;
        }
        for (int k = 0; k <= GENERAL; k++) w.owner[k] = -1;
        w.params = n * sizeof(float);
        w.grads = (stage == 1 ? n : mg__plan_grads_in_files(p) ? 0 : pieces) * sizeof(float);
        for (int i = 0; i < w.nb && stage == 3; i++) shard(&w, i);
        note(&w);
        for (int k = 0; k < p->micro; k++) micro(&w, k == p->micro - 1);
        ms->params = w.peak_params;
        ms->grads = w.peak_grads;
        if (stage == 3 && evaluates && n * sizeof(float) > ms->params)
            ms->params = n * sizeof(float);
    }
    free(r);
    free(w.b);
    free(w.ub);
    free(w.borrow);
    return st;
}

/* ---- a pipeline stage ------------------------------------------------------ */

/* The floats of units [a, b) (the arena runs the other way). */
static size_t units_floats(const mg__plan_shape *s, int a, int b)
{
    return s->unit[a].hi - s->unit[b - 1].lo;
}

/* The tapes a chunk of rank `rank` holds at most: as the executor takes
 * them, each from the receive of its input (its forward on stage 0) to
 * its backward, over the schedule's lowered list. */
static mg_status in_flight(const mg_plan *p, int rank, int *per_chunk)
{
    int n = mg_pipe_lower(p->schedule, p->pp, p->micro, p->chunks, rank, NULL, 0);
    mg_pipe_action *a = malloc(sizeof *a * (size_t)(n ? n : 1));
    if (!a) return mg_error(MG_ENOMEM, "planner: out of memory");
    mg_pipe_lower(p->schedule, p->pp, p->micro, p->chunks, rank, a, n);
    for (int k = 0; k < p->chunks; k++) {
        int now = 0, most = 0;
        for (int i = 0; i < n; i++) {
            if (a[i].stage / p->pp != k) continue;
            now += mg_pipe_held_change(&a[i]);
            if (now > most) most = now;
        }
        per_chunk[k] = most;
    }
    free(a);
    return MG_OK;
}

static mg_status pipeline_memory(const mg__plan_shape *sh, const int *first, const mg_plan *p,
                                 int rank, mg_memory_stats *ms)
{
    int S = p->pp * p->chunks, held[64];
    MG_TRY(in_flight(p, rank, held));
    size_t floats = 0, act = 0;
    for (int k = 0; k < p->chunks; k++) {
        int s = k * p->pp + rank, u0 = first[s], u1 = first[s + 1];
        floats += units_floats(sh, u0, u1);
        size_t in = s ? sh->unit[u0 - 1].out_bytes * (size_t)p->local : 0;
        act += (size_t)held[k] * (mg_tape_bytes_for(sh->m, p->local, u0, u1) + in);
    }
    /* Parameters a unit of this rank reads from another rank's stage. */
    for (int u = 0; u < sh->n; u++) {
        int j = sh->unit[u].borrows, su = 0, sj = 0;
        if (j < 0) continue;
        for (int s = 0; s < S; s++) {
            if (first[s] <= u && u < first[s + 1]) su = s % p->pp;
            if (first[s] <= j && j < first[s + 1]) sj = s % p->pp;
        }
        if (su == rank && sj != rank) floats += units_floats(sh, j, j + 1);
    }
    ms->params = ms->grads = floats * sizeof(float);
    ms->activations = act;
    return MG_OK;
}

mg_status mg__plan_memory(const mg_plan_job *job, const mg_plan *p, const mg__plan_shape *s,
                          const int *first, int pp_rank, mg_memory_stats *ms)
{
    memset(ms, 0, sizeof *ms);
    size_t first_cap, cap, optim_floats;
    mg__plan_buckets(job, &first_cap, &cap);
    if (p->pp > 1) {
        MG_TRY(pipeline_memory(s, first, p, pp_rank, ms));
        optim_floats = ms->params / sizeof(float) / (size_t)(p->zero ? p->dp : 1);
    } else {
        size_t n = mg_model_arena_size(s->m);
        ms->params = ms->grads = n * sizeof(float);
        ms->activations = mg_tape_bytes_for(s->m, p->local, 0, s->n);
        optim_floats = p->zero ? n / (size_t)p->dp : n;
        if (p->zero) MG_TRY(walk(s, p, first_cap, cap, job->evaluates, ms));
    }
    mg_optim_config oc = mg__plan_optim(job);
    ms->optim = p->offload ? mg_optim_offload_bytes(&oc, optim_floats, job->offload_window)
                           : optim_floats * (size_t)mg_optim_states(&oc) * sizeof(float);
    return MG_OK;
}
