/* ZeRO, the Zero Redundancy Optimizer (stages 1-3): data parallelism in
 * which each rank keeps only its shard of the optimizer state (stage 1),
 * of the gradients (stage 2) and of the parameters (stage 3).
 *
 * The shard. The arena is cut into buckets of whole units as DDP's are
 * (units are padded to lcm(world size, SIMD width), so every bucket
 * divides evenly); rank r owns piece r of every bucket. So one
 * reduce-scatter per bucket leaves each rank its piece of the summed
 * gradient in place, and one all-gather per bucket gives every rank the
 * whole bucket of parameters in place: no packing, no copies.
 *
 * The step. Backward launches a bucket's reduce-scatter (summing) from the
 * post-backward hook of its last unit, overlapping the rest of backward,
 * as DDP launches its all-reduce. Stage 1 does it on the last micro-batch
 * only and keeps the whole gradient arena; stages 2 and 3 do it on every
 * micro-batch and then give back the pages of the gradient outside the
 * rank's pieces (they read as zeros again, so the next micro-batch's
 * reduce-scatter adds onto the piece: accumulation needs no other
 * buffer). After the optimizer has stepped its pieces, stages 1 and 2
 * all-gather the parameters. Stage 3 keeps only its pieces of the
 * parameters: each bucket is all-gathered before the forward of its first
 * unit and before the backward of its last (the next bucket's gather is
 * started then, so it overlaps this one's compute), and its pages outside
 * the piece are given back after; the bucket that forward ends with stays
 * for backward, and a bucket whose parameters another unit reads (the
 * embedding a tied head reads) stays from its forward to its backward.
 *
 * Hooks work only inside a training micro-batch. Evaluation, sampling and
 * saving weights under stage 3 run between mg_zero_gather (the whole
 * parameters on every rank, as FSDP's summon_full_params) and
 * mg_zero_release. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/parallel.h"
#include "multigrad/trace.h"

enum { SHARDED, GATHERING, GATHERED };

typedef struct {
    size_t lo, hi;          /* arena range: whole units */
    size_t plo, phi;        /* this rank's piece */
    int first, last;        /* its units in forward order */
    int state;              /* stage 3: parameters SHARDED, GATHERING, GATHERED */
    bool keep;              /* stage 3: another unit reads its parameters */
    mg_work *rs, *ag;       /* reduce-scatter, all-gather in flight */
} zbucket;

struct mg_zero {
    mg_group *g;
    mg_model *m;
    int stage, rank, world;
    size_t n;               /* arena floats */
    zbucket *b;
    int nb;
    int *ub;                /* unit -> bucket (-1: no parameters) */
    int *borrow;            /* unit -> bucket whose parameters it also reads, or -1 */
    mg_range *piece;        /* this rank's pieces, ascending */
    size_t ready;           /* gradients [0, ready) final this micro-batch */
    int next;               /* first bucket whose reduce-scatter is not launched */
    bool active;            /* inside a training micro-batch */
    bool sync;              /* this micro-batch communicates */
    bool gathered_all;      /* between mg_zero_gather and mg_zero_release */
    mg_status err;
    size_t param_bytes, grad_bytes;   /* resident now (counted, not measured) */
    mg_zero_stats stats;
};

mg_status mg_zero_stage_check(int stage)
{
    if (stage < 1 || stage > 3)
        return mg_error(MG_EINVAL, "ZeRO stage %d does not exist: use --zero 1 (optimizer state "
                        "sharded), 2 (and gradients) or 3 (and parameters)", stage);
    return MG_OK;
}

static void note_peak(mg_zero *z)
{
    if (z->param_bytes > z->stats.peak_param_bytes) z->stats.peak_param_bytes = z->param_bytes;
    if (z->grad_bytes > z->stats.peak_grad_bytes) z->stats.peak_grad_bytes = z->grad_bytes;
}

/* Buckets of whole units in arena order, closed at the caps as DDP's. */
static mg_status make_buckets(mg_zero *z, size_t first_cap, size_t cap)
{
    int nu = mg_model_num_units(z->m);
    z->b = calloc((size_t)nu + 1, sizeof *z->b);
    z->ub = malloc(sizeof *z->ub * (size_t)(nu ? nu : 1));
    z->borrow = malloc(sizeof *z->borrow * (size_t)(nu ? nu : 1));
    z->piece = calloc((size_t)nu + 1, sizeof *z->piece);
    if (!z->b || !z->ub || !z->borrow || !z->piece)
        return mg_error(MG_ENOMEM, "zero: out of memory for buckets");
    mg_range *r = z->piece;   /* the buckets first, the pieces after */
    z->nb = mg_buckets(z->m, first_cap, cap, r);
    for (int i = 0; i < z->nb; i++) z->b[i] = (zbucket){.lo = r[i].lo, .hi = r[i].hi,
                                                        .first = nu, .last = -1};
    for (int u = 0; u < nu; u++) {
        size_t ulo, hi;
        mg_model_unit_range(z->m, u, &ulo, &hi);
        z->ub[u] = -1;
        for (int i = 0; i < z->nb && hi > ulo; i++)
            if (z->b[i].lo <= ulo && hi <= z->b[i].hi) {
                z->ub[u] = i;
                if (u < z->b[i].first) z->b[i].first = u;
                if (u > z->b[i].last) z->b[i].last = u;
            }
    }
    for (int u = 0; u < nu; u++) {
        int v = mg_model_unit(z->m, u).borrows;
        z->borrow[u] = v >= 0 ? z->ub[v] : -1;
        if (z->borrow[u] >= 0) z->b[z->borrow[u]].keep = true;
    }
    for (int i = 0; i < z->nb; i++) {
        zbucket *b = &z->b[i];
        size_t len = (b->hi - b->lo) / (size_t)z->world;
        MG_ASSERT(len * (size_t)z->world == b->hi - b->lo);
        b->plo = b->lo + (size_t)z->rank * len;
        b->phi = b->plo + len;
        b->state = GATHERED;
        z->piece[i] = (mg_range){b->plo, b->phi};
    }
    return MG_OK;
}

/* ---- stage 3: parameters gathered and given back ----------------------- */

static void gather_start(mg_zero *z, int i)
{
    if (i < 0 || i >= z->nb) return;
    zbucket *b = &z->b[i];
    if (b->state != SHARDED || z->err) return;
    float *p = mg_model_params(z->m);
    mg_status st = mg_all_gather_async(z->g, p + b->plo, p + b->lo, b->phi - b->plo, MG_F32,
                                       &b->ag);
    if (st) z->err = st;
    b->state = GATHERING;
    z->param_bytes += (b->hi - b->lo - (b->phi - b->plo)) * sizeof(float);
    note_peak(z);
}

static void gather_wait(mg_zero *z, int i)
{
    if (i < 0) return;
    zbucket *b = &z->b[i];
    gather_start(z, i);
    if (b->state != GATHERING) return;
    if (b->ag) {
        mg_status st = mg_work_wait(b->ag, -1);
        if (st && !z->err) z->err = st;
        mg_work_free(b->ag);
        b->ag = NULL;
    }
    b->state = GATHERED;
}

/* Give back the bucket's parameters outside this rank's piece. */
static void shard(mg_zero *z, int i)
{
    zbucket *b = &z->b[i];
    if (b->state == GATHERING) gather_wait(z, i);
    if (b->state != GATHERED) return;
    float *p = mg_model_params(z->m);
    mg_mem_discard(p + b->lo, (b->plo - b->lo) * sizeof(float));
    mg_mem_discard(p + b->phi, (b->hi - b->phi) * sizeof(float));
    b->state = SHARDED;
    z->param_bytes -= (b->hi - b->lo - (b->phi - b->plo)) * sizeof(float);
}

/* Before a unit's forward (dir -1: the next bucket is the one below in
 * the arena) or backward (dir +1): its parameters, and those it borrows,
 * gathered; at the bucket's first unit in that direction the next
 * bucket's gather starts, to overlap this one's compute. */
static void pre(mg_zero *z, int u, int dir)
{
    if (!z->active || z->stage < 3) return;
    int i = z->ub[u];
    gather_wait(z, z->borrow[u]);
    if (i < 0) return;
    gather_wait(z, i);
    if (u == (dir < 0 ? z->b[i].first : z->b[i].last)) gather_start(z, i + dir);
}

static void pre_forward(void *ud, mg_tape *t, int u)
{
    (void)t;
    pre(ud, u, -1);
}

static void post_forward(void *ud, mg_tape *t, int u)
{
    mg_zero *z = ud;
    (void)t;
    if (!z->active || z->stage < 3) return;
    int i = z->ub[u];
    /* The bucket forward ends with is the one backward starts with. */
    if (i > 0 && u == z->b[i].last && !z->b[i].keep) shard(z, i);
}

static void pre_backward(void *ud, mg_tape *t, int u)
{
    (void)t;
    pre(ud, u, +1);
}

/* ---- gradients: reduce-scatter, and give the rest back ------------------- */

static void reduce_start(mg_zero *z, zbucket *b)
{
    if (z->err) return;
    float *gr = mg_model_grads(z->m);
    mg_status st = mg_reduce_scatter_async(z->g, gr + b->lo, gr + b->plo, b->phi - b->plo,
                                           MG_F32, MG_SUM, &b->rs);
    if (st) z->err = st;
}

/* Wait for bucket b's reduce-scatter; stages 2 and 3 then give back its
 * gradient outside the piece. */
static void reduce_end(mg_zero *z, zbucket *b)
{
    if (!b->rs) return;
    mg_status st = mg_work_wait(b->rs, -1);
    if (st && !z->err) z->err = st;
    mg_work_free(b->rs);
    b->rs = NULL;
    if (z->stage >= 2) {
        float *gr = mg_model_grads(z->m);
        mg_mem_discard(gr + b->lo, (b->plo - b->lo) * sizeof(float));
        mg_mem_discard(gr + b->phi, (b->hi - b->phi) * sizeof(float));
        z->grad_bytes -= (b->hi - b->lo - (b->phi - b->plo)) * sizeof(float);
    }
}

static void post_backward(void *ud, mg_tape *t, int u)
{
    mg_zero *z = ud;
    (void)t;
    if (!z->active) return;
    int i = z->ub[u];
    if (i >= 0 && z->stage >= 2 && u == z->b[i].last) {
        /* The bucket's gradient becomes resident as its backward writes. */
        z->grad_bytes += (z->b[i].hi - z->b[i].lo - (z->b[i].phi - z->b[i].plo)) * sizeof(float);
        note_peak(z);
    }
    if (!z->sync) return;
    size_t lo, hi;
    mg_model_unit_range(z->m, u, &lo, &hi);
    if (hi > z->ready) z->ready = hi;
    while (z->next < z->nb && z->b[z->next].hi <= z->ready) {
        zbucket *b = &z->b[z->next++];
        reduce_start(z, b);
        if (z->stage >= 3) shard(z, (int)(b - z->b));
    }
    /* Reductions that finished give their memory back now. */
    for (int k = 0; k < z->next && z->stage >= 2; k++)
        if (z->b[k].rs && mg_work_test(z->b[k].rs)) reduce_end(z, &z->b[k]);
}

static const mg_unit_hooks zero_hooks = {.pre_forward = pre_forward,
                                         .post_forward = post_forward,
                                         .pre_backward = pre_backward,
                                         .post_backward = post_backward};

/* ---- the interface ------------------------------------------------------- */

mg_status mg_zero_create(mg_group *g, mg_model *m, int stage, const mg_ddp_options *opt,
                         mg_zero **out)
{
    *out = NULL;
    MG_TRY(mg_zero_stage_check(stage));
    mg_ddp_options o = opt ? *opt : mg_ddp_defaults();
    if (o.compress != MG_COMPRESS_NONE)
        return mg_error(MG_EINVAL, "ZeRO does not compress gradients: leave out --compress");
    mg_zero *z = calloc(1, sizeof *z);
    if (!z) return mg_error(MG_ENOMEM, "zero: out of memory");
    z->g = g;
    z->m = m;
    z->stage = stage;
    z->rank = mg_group_rank(g);
    z->world = mg_group_size(g);
    size_t pad = mg_shard_pad(z->world);
    mg_status st = MG_OK;
    if (mg_model_unit_pad(m) % pad) st = mg_model_set_unit_pad(m, pad);
    z->n = mg_model_arena_size(m);
    if (!st) st = make_buckets(z, o.first_bucket_bytes, o.bucket_bytes);
    /* Every rank starts from rank 0's parameters and buffers. */
    if (!st) st = mg_broadcast(g, mg_model_params(m), z->n, MG_F32, 0);
    if (!st && mg_model_buffer_size(m))
        st = mg_broadcast(g, mg_model_buffers(m), mg_model_buffer_size(m), MG_F32, 0);
    if (!st) st = mg_model_add_hooks(m, &zero_hooks, z);
    if (st) {
        free(z->b);
        free(z->ub);
        free(z->borrow);
        free(z->piece);
        free(z);
        return st;
    }
    z->param_bytes = z->n * sizeof(float);
    z->grad_bytes = stage == 1 ? z->n * sizeof(float) : 0;
    for (int i = 0; i < z->nb && stage >= 2; i++)
        z->grad_bytes += (z->b[i].phi - z->b[i].plo) * sizeof(float);
    if (stage == 3) mg_zero_release(z);
    note_peak(z);
    *out = z;
    return MG_OK;
}

void mg_zero_destroy(mg_zero *z)
{
    if (!z) return;
    for (int i = 0; i < z->nb; i++) {
        mg_work_free(z->b[i].rs);
        mg_work_free(z->b[i].ag);
    }
    mg_model_remove_hooks(z->m, &zero_hooks, z);
    free(z->b);
    free(z->ub);
    free(z->borrow);
    free(z->piece);
    free(z);
}

int mg_zero_stage(const mg_zero *z) { return z->stage; }

const mg_range *mg_zero_pieces(const mg_zero *z, int *n)
{
    *n = z->nb;
    return z->piece;
}

int mg_zero_num_buckets(const mg_zero *z) { return z->nb; }

void mg_zero_zero_grad(mg_zero *z)
{
    float *gr = mg_model_grads(z->m);
    if (z->stage == 1) {
        memset(gr, 0, z->n * sizeof(float));
        return;
    }
    /* Outside the pieces the gradient was given back, so it reads zero. */
    for (int i = 0; i < z->nb; i++)
        memset(gr + z->b[i].plo, 0, (z->b[i].phi - z->b[i].plo) * sizeof(float));
}

void mg_zero_begin(mg_zero *z, bool last)
{
    z->active = true;
    z->sync = z->stage >= 2 || last;
    z->ready = 0;
    z->next = 0;
}

mg_status mg_zero_end(mg_zero *z)
{
    z->active = false;
    if (z->sync) {
        /* Buckets whose units got no gradient go now, in order. */
        while (z->next < z->nb) {
            zbucket *b = &z->b[z->next++];
            if (z->stage >= 2) {
                z->grad_bytes += (b->hi - b->lo - (b->phi - b->plo)) * sizeof(float);
                note_peak(z);
            }
            reduce_start(z, b);
        }
        for (int i = 0; i < z->nb; i++) reduce_end(z, &z->b[i]);
    }
    for (int i = 0; i < z->nb && z->stage >= 3; i++) shard(z, i);
    mg_status st = z->err;
    z->err = MG_OK;
    return st;
}

mg_status mg_zero_after_step(mg_zero *z)
{
    if (z->stage >= 3) return MG_OK;
    float *p = mg_model_params(z->m);
    double t0 = mg_trace_now();
    for (int i = 0; i < z->nb; i++) {
        zbucket *b = &z->b[i];
        MG_TRY(mg_all_gather_async(z->g, p + b->plo, p + b->lo, b->phi - b->plo, MG_F32, &b->ag));
    }
    mg_status st = MG_OK;
    for (int i = 0; i < z->nb; i++) {
        mg_status s = mg_work_wait(z->b[i].ag, -1);
        if (!st) st = s;
        mg_work_free(z->b[i].ag);
        z->b[i].ag = NULL;
    }
    mg_trace_event("allgather parameters", "allgather", 1, t0, mg_trace_now());
    return st;
}

mg_status mg_zero_gather(mg_zero *z)
{
    if (z->stage < 3) return MG_OK;
    for (int i = 0; i < z->nb; i++) gather_start(z, i);
    for (int i = 0; i < z->nb; i++) gather_wait(z, i);
    z->gathered_all = true;
    mg_status st = z->err;
    z->err = MG_OK;
    return st;
}

void mg_zero_release(mg_zero *z)
{
    if (z->stage < 3) return;
    for (int i = 0; i < z->nb; i++) shard(z, i);
    z->gathered_all = false;
}

mg_zero_stats mg_zero_get_stats(const mg_zero *z)
{
    mg_zero_stats r = z->stats;
    r.param_bytes = z->param_bytes;
    r.grad_bytes = z->grad_bytes;
    return r;
}
