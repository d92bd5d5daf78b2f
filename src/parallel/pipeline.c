/* Pipeline parallelism, the pipe, one for every schedule of
 * pipeline_sched.c (its executor: pipeline_exec.c). The model is cut into
 * S = P·V stages at unit boundaries; this rank runs the stages s with
 * s mod P == rank (its V chunks).
 *
 * Parameters: every rank makes the whole model (the same initialisation
 * as one process), keeps its stages' ranges and gives the rest of the
 * arena back (mg_mem_discard). A unit that reads another stage's
 * parameters (gpt's head tied to the embedding) keeps that range too, and
 * after the last backward the two ranks holding it add their gradients
 * (each sends its own, both add: a + b on both sides, the same bits), as
 * Megatron-LM sums the embedding's gradient between its first and last
 * stage. Both then step the same values with the same state.
 *
 * This file: the cut into stages and chunks, making and destroying a
 * pipe, the parameters a rank keeps, and the ties summed after the last
 * backward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/pipeline_internal.h"

mg_group *mg__pipe_group(const mg_pipe *p) { return p->g; }
int mg__pipe_chunks(const mg_pipe *p) { return p->V; }
int mg__pipe_current_chunk(const mg_pipe *p) { return p->cur_chunk; }
bool mg__pipe_has_ties(const mg_pipe *p) { return p->n_ties > 0; }
void mg__pipe_leave_ties(mg_pipe *p) { p->ties_left = true; }
bool mg__pipe_ties_left(const mg_pipe *p) { return p->ties_left; }
mg_model *mg__pipe_model(const mg_pipe *p) { return p->m; }

void mg__pipe_around_backward(mg_pipe *p, void (*before)(void *ud, bool final),
                              mg_status (*after)(void *ud), void *ud)
{
    p->before_backward = before;
    p->after_backward = after;
    p->bb_ud = ud;
}

/* The arena range of units [u0, u1) (units lie in reverse order). */
static mg_range units_range(const mg_model *m, int u0, int u1)
{
    size_t lo, hi, a, b;
    mg_model_unit_range(m, u1 - 1, &lo, &b);
    mg_model_unit_range(m, u0, &a, &hi);
    return (mg_range){lo, hi};
}

double mg_pipe_unit_cost(const mg_model *m, int u)
{
    mg_unit_info ui = mg_model_unit(m, u);
    return ui.flops > 0 ? ui.flops : (double)ui.numel;
}

static int stage_of_unit(const mg_pipe *p, int u)
{
    int s = 0;
    while (u >= p->first[s + 1]) s++;
    return s;
}

int mg__pipe_chunk_of(const mg_pipe *p, int u)
{
    int s = stage_of_unit(p, u);
    return s % p->P == p->rank ? s / p->P : -1;
}

static int cmp_range(const void *a, const void *b)
{
    const mg_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Every rank of the pipeline must run the same schedule on the same cut:
 * one all-gather of what each was given, and an error naming the first
 * rank that differs from rank 0. */
static mg_status same_plan(mg_pipe *p)
{
    int32_t mine[8 + 4097] = {(int32_t)p->kind, p->P, p->M, p->V, p->S, p->max_batch};
    size_t n = 6 + (size_t)p->S + 1;
    for (int s = 0; s <= p->S; s++) mine[6 + s] = p->first[s];
    int32_t *all = malloc(sizeof *all * n * (size_t)p->P);
    if (!all) return mg_error(MG_ENOMEM, "pipeline: out of memory");
    mg_status st = mg_all_gather(p->g, mine, all, n, MG_I32);
    char a[128], b[128];
    for (int r = 1; r < p->P && !st; r++)
        if (memcmp(all, all + n * (size_t)r, n * sizeof *all))
            st = mg_error(MG_EMISMATCH, "pipeline: %s was given another schedule, micro-batch "
                          "count, batch or cut than %s (%s, %d micro-batches, %d chunks, batch "
                          "%d); give every rank the same", mg_group_rank_name(p->g, r, a, sizeof a),
                          mg_group_rank_name(p->g, 0, b, sizeof b),
                          mg_pipe_name((mg_pipe_kind)all[0]), all[2], all[3], all[5]);
    free(all);
    return st;
}

mg_status mg__pipe_create(mg_group *g, mg_model *m, const mg_pipe_options *o, int max_batch,
                         mg_pipe **out)
{
    *out = NULL;
    int P = mg_group_size(g), V = o->chunks ? o->chunks : 1, nu = mg_model_num_units(m);
    MG_TRY(mg_pipe_check(o->kind, P, o->micro_batches, V));
    int S = P * V;
    if (S > nu)
        return mg_error(MG_EINVAL, "pipeline: %d stages for %s's %d units: a stage is at least "
                        "one unit; use fewer ranks or chunks", S, mg_model_name(m), nu);
    if (max_batch < 1)
        return mg_error(MG_EINVAL, "pipeline: batch size %d must be positive", max_batch);
    mg_pipe *p = calloc(1, sizeof *p);
    if (!p) return mg_error(MG_ENOMEM, "pipeline: out of memory");
    p->g = g;
    p->m = m;
    p->kind = o->kind;
    p->P = P;
    p->M = o->micro_batches;
    p->V = V;
    p->S = S;
    p->rank = mg_group_rank(g);
    p->max_batch = max_batch;
    p->first = calloc((size_t)S + 1, sizeof *p->first);
    p->ch = calloc((size_t)V, sizeof *p->ch);
    double *cost = calloc((size_t)nu, sizeof *cost);
    mg_status st = !p->first || !p->ch || !cost
                       ? mg_error(MG_ENOMEM, "pipeline: out of memory") : MG_OK;
    if (!st && o->first) {
        memcpy(p->first, o->first, sizeof *p->first * ((size_t)S + 1));
        bool ok = p->first[0] == 0 && p->first[S] == nu;
        for (int s = 0; s < S && ok; s++) ok = p->first[s] < p->first[s + 1];
        if (!ok) st = mg_error(MG_EINVAL, "pipeline: the cut does not split %s's %d units "
                               "into %d stages of at least one unit", mg_model_name(m), nu, S);
    } else if (!st) {
        for (int u = 0; u < nu; u++) cost[u] = mg_pipe_unit_cost(m, u);
        st = mg_pipe_balance(cost, nu, S, p->first);
    }
    free(cost);
    if (!st) st = same_plan(p);
    int c, h, w;
    mg_model_input_shape(m, &c, &h, &w);
    p->x_per = (size_t)c * h * w;
    p->y_per = (size_t)mg_model_positions(m);
    size_t M = (size_t)p->M;
    if (!st) {
        p->x = malloc(mg__pipe_fl(M * max_batch * p->x_per));
        p->y = malloc(sizeof *p->y * M * max_batch * p->y_per);
        p->n = calloc(M, sizeof *p->n);
        p->w = calloc(M, sizeof *p->w);
        if (!p->x || !p->y || !p->n || !p->w) st = mg_error(MG_ENOMEM, "pipeline: out of memory");
    }
    for (int k = 0; k < V && !st; k++) {
        chunk *ck = &p->ch[k];
        ck->stage = k * P + p->rank;
        ck->u0 = p->first[ck->stage];
        ck->u1 = p->first[ck->stage + 1];
        ck->in_per = ck->u0 ? mg_model_unit(m, ck->u0 - 1).out_bytes / sizeof(float) : p->x_per;
        ck->out_per = mg_model_unit(m, ck->u1 - 1).out_bytes / sizeof(float);
        ck->mb = calloc(M, sizeof *ck->mb);
        ck->pool = calloc(M, sizeof *ck->pool);
        ck->all = calloc(M, sizeof *ck->all);
        if (!ck->mb || !ck->pool || !ck->all)
            st = mg_error(MG_ENOMEM, "pipeline: out of memory");
        mg_range r = units_range(m, ck->u0, ck->u1);
        if (r.hi > r.lo) p->ranges[p->n_ranges++] = r;
    }
    /* Parameters a unit of this rank borrows from a stage of another
     * rank, and parameters of this rank another rank's unit borrows. */
    for (int u = 0; u < nu && !st; u++) {
        int j = mg_model_unit(m, u).borrows;
        if (j < 0) continue;
        int su = stage_of_unit(p, u) % P, sj = stage_of_unit(p, j) % P;
        if (su == sj || (su != p->rank && sj != p->rank)) continue;
        mg_range r = units_range(m, j, j + 1);
        bool again = false;
        for (int k = 0; k < p->n_ties; k++) again |= p->ties[k].lo == r.lo;
        if (p->n_ties == 8 || again) {
            st = mg_error(MG_EINVAL, "pipeline: %s: at most 8 units may read another rank's "
                          "parameters, and only one each unit's", mg_model_name(m));
            break;
        }
        p->ties[p->n_ties++] = (tie){r.lo, r.hi, su == p->rank ? sj : su, sj == p->rank};
        if (su == p->rank && r.hi > r.lo) p->ranges[p->n_ranges++] = r;
    }
    qsort(p->ranges, (size_t)p->n_ranges, sizeof *p->ranges, cmp_range);
    /* The ranges this rank owns: it counts them in norms and saves them. */
    for (int i = 0; i < p->n_ranges; i++) {
        bool borrowed = false;
        for (int k = 0; k < p->n_ties; k++)
            borrowed |= !p->ties[k].owner && p->ties[k].lo == p->ranges[i].lo;
        if (!borrowed) p->own[p->n_own++] = p->ranges[i];
    }
    /* Stages without parameters (a flatten, a dropout): an empty range,
     * so that the optimizer has one to (not) update. */
    if (!p->n_ranges) p->ranges[p->n_ranges++] = (mg_range){0, 0};
    if (st) {
        mg__pipe_destroy(p);
        return st;
    }
    mg__pipe_release(p);
    *out = p;
    return MG_OK;
}

void mg__pipe_destroy(mg_pipe *p)
{
    if (!p) return;
    mg__pipe_exec_free(p);
    free(p->ch);
    free(p->first);
    free(p->acts);
    free(p->final_b);
    free(p->x);
    free(p->y);
    free(p->n);
    free(p->w);
    free(p);
}

mg_range mg__pipe_chunk_range(const mg_pipe *p, int i)
{
    return units_range(p->m, p->ch[i].u0, p->ch[i].u1);
}

const mg_range *mg__pipe_ranges(const mg_pipe *p, int *n)
{
    *n = p->n_ranges;
    return p->ranges;
}

const int *mg_pipe_cut(const mg_pipe *p, int *stages)
{
    *stages = p->S;
    return p->first;
}

mg_pipe_stats mg_pipe_get_stats(const mg_pipe *p) { return p->stats; }

/* ---- the parameters this rank keeps ------------------------------------- */

static bool kept(const mg_pipe *p, size_t at, size_t *end)
{
    for (int i = 0; i < p->n_ranges; i++)
        if (p->ranges[i].lo <= at && at < p->ranges[i].hi) {
            *end = p->ranges[i].hi;
            return true;
        }
    *end = mg_model_arena_size(p->m);
    for (int i = 0; i < p->n_ranges; i++)
        if (p->ranges[i].lo > at && p->ranges[i].lo < *end) *end = p->ranges[i].lo;
    return false;
}

void mg__pipe_release(mg_pipe *p)
{
    float *w = mg_model_params(p->m);
    size_t n = mg_model_arena_size(p->m), end;
    for (size_t at = 0; at < n; at = end)
        if (!kept(p, at, &end)) mg_device_discard(mg_model_device(p->m), w + at, mg__pipe_fl(end - at));
}

static mg_status gather(mg_pipe *p, bool params)
{
    mg_model *m = p->m;
    float *w = mg_model_params(m), *bf = mg_model_buffers(m);
    for (int s = 0; s < p->S; s++) {
        mg_range r = units_range(m, p->first[s], p->first[s + 1]);
        if (params && r.hi > r.lo)
            MG_TRY(mg_broadcast(p->g, w + r.lo, r.hi - r.lo, MG_F32, s % p->P));
        mg_unit_info a = mg_model_unit(m, p->first[s]);
        size_t blo = a.buf_lo, bhi = a.buf_hi;
        for (int u = p->first[s] + 1; u < p->first[s + 1]; u++) {
            mg_unit_info ui = mg_model_unit(m, u);
            if (ui.buf_hi == ui.buf_lo) continue;
            if (bhi == blo) blo = ui.buf_lo;
            bhi = ui.buf_hi;
        }
        if (bhi > blo) MG_TRY(mg_broadcast(p->g, bf + blo, bhi - blo, MG_F32, s % p->P));
    }
    return MG_OK;
}

mg_status mg__pipe_gather(mg_pipe *p) { return gather(p, true); }
mg_status mg__pipe_gather_buffers(mg_pipe *p) { return gather(p, false); }

/* ---- after the last backward -------------------------------------------- */

mg_status mg__pipe_sum_ties(mg_pipe *p)
{
    float *g = mg_model_grads(p->m);
    mg_device dev = mg_model_device(p->m);
    for (int i = 0; i < p->n_ties; i++) {
        tie *t = &p->ties[i];
        size_t n = t->hi - t->lo;
        float *other = mg_device_alloc(dev, mg__pipe_fl(n));
        if (!other) return mg_error(MG_ENOMEM, "pipeline: out of memory");
        mg_status st = mg_sendrecv(p->g, g + t->lo, n, t->peer, 0x7fff0000 + i, other, n,
                                   t->peer, 0x7fff0000 + i, MG_F32);
        if (st) {
            mg_device_free(dev, other);
            char why[1024], a[128], b[128];
            snprintf(why, sizeof why, "%s", mg_last_error());
            return mg_error(st, "pipeline: summing the gradients of the parameters tied "
                            "across %s and %s: %s", mg_group_rank_name(p->g, p->rank, a, sizeof a),
                            mg_group_rank_name(p->g, t->peer, b, sizeof b), why);
        }
        st = mg_add_into_on(dev, g + t->lo, other, n);
        mg_device_free(dev, other);
        MG_TRY(st);
    }
    return MG_OK;
}

const mg_range *mg__pipe_own_ranges(const mg_pipe *p, int *n)
{
    *n = p->n_own;
    return p->own;
}
