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
 * The step. Backward launches a bucket's reduce-scatter (averaging over
 * the ranks, MG_AVG, as DDP's all-reduce does, so that a rank's piece holds
 * the bits DDP's gradient holds there) from the post-backward hook of its
 * last unit, overlapping the rest of backward, as DDP launches its
 * all-reduce. Stage 1 does it on the last micro-batch
 * only and keeps the whole gradient arena. Stages 2 and 3 never write the
 * arena outside the rank's pieces: before a bucket's backward its
 * gradients are pointed at a buffer of a small pool (a tape's gradient
 * window); the reduce-scatter runs in that buffer on every micro-batch
 * and its result is added into the rank's piece of the arena, then the
 * buffer goes back to the pool (so accumulation adds up in the pieces,
 * and no page is given back and faulted in again every step). After the
 * optimizer has stepped its pieces, stages 1 and 2
 * all-gather the parameters. Stage 3 keeps only its pieces of the
 * parameters: each bucket is all-gathered before the forward of its first
 * unit and before the backward of its last (the next bucket's gather is
 * started then, so it overlaps this one's compute), and its pages outside
 * the piece are given back after; the bucket that forward ends with stays
 * for backward, and a bucket whose parameters another unit reads (the
 * embedding a tied head reads) stays from its forward to its backward.
 *
 * Under --deterministic det.c sums the gradients in its fixed tree instead:
 * no reduce-scatter, no pool windows (the arena written whole), the
 * optimizer still stepping the pieces (sum_elsewhere).
 *
 * Hooks work only inside a training micro-batch. Evaluation, sampling and
 * saving weights under stage 3 run between mg__zero_gather (the whole
 * parameters on every rank, as FSDP's summon_full_params) and
 * mg__zero_release. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"
#include "multigrad/trace.h"

/* Stage 3's parameters of a bucket: SHARDED (only the rank's piece in
 * the arena; with the parameters offloaded, nothing: the piece is in the
 * file), PIECE (offloaded, the piece read into the arena), GATHERING,
 * GATHERED. */
enum { SHARDED, PIECE, GATHERING, GATHERED };

typedef struct {
    size_t lo, hi;          /* arena range: whole units */
    size_t plo, phi;        /* this rank's piece */
    uint64_t at;            /* offloaded: the piece's byte offset in the files */
    double sumsq;           /* offloaded gradients: of the step's final piece */
    int first, last;        /* its units in forward order */
    int state;              /* stage 3: parameters SHARDED, GATHERING, GATHERED */
    bool keep;              /* stage 3: another unit reads its parameters */
    int buf;                /* stages 2-3: its pool buffer this micro-batch, or -1 */
    mg_work *rs, *ag;       /* reduce-scatter, all-gather in flight */
} zbucket;

/* Stages 2-3: buffers for the gradients of buckets in backward or in
 * reduction, one tape gradient window each: GENERAL of the longest
 * bucket's length (the one in backward, one reducing: a third bought no
 * speed on 2 or 4 ranks and cost its memory) and one for a bucket another
 * unit reads (the embedding a tied head reads: held from the head's
 * backward to its own), of its length. MG_ZERO_OVERLAP=0 keeps one
 * general buffer and stage 3 prefetches no bucket: one bucket of
 * parameters and one of gradients in flight, for the least memory
 * (offload), the communication no longer behind the compute. */
#define GENERAL 2
#define SHARED GENERAL
#define POOL (GENERAL + 1)
_Static_assert(POOL <= MG_GRAD_WINDOWS, "a tape window per pool buffer");

struct mg_zero {
    mg_group *g;
    mg_model *m;
    mg_device dev;          /* the model's: of the arenas and the pool */
    int stage, rank, world;
    size_t n;               /* arena floats */
    zbucket *b;
    int nb;
    int *ub;                /* unit -> bucket (-1: no parameters) */
    int *borrow;            /* unit -> bucket whose parameters it also reads, or -1 */
    mg_range *piece;        /* this rank's pieces, ascending */
    float *pool[POOL];      /* SHARED is for the borrowed buckets */
    int pool_owner[POOL];   /* the bucket using it, or -1 */
    int npool;
    bool overlap;           /* prefetch the next bucket, reduce behind backward */
    mg_tape *tape;          /* of the micro-batch's backward */
    bool hooked;
    size_t ready;           /* gradients [0, ready) final this micro-batch */
    int next;               /* first bucket whose reduce-scatter is not launched */
    bool active;            /* inside a training micro-batch */
    bool sync;              /* this micro-batch communicates */
    bool gathered_all;      /* between mg__zero_gather and mg__zero_release */
    mg_scratch *ps;         /* stage 3 offload: the parameter pieces, one after another */
    mg_scratch *gs;         /* stages 2-3 offload: the gradient pieces, the same way */
    int micro;              /* micro-batches since zero_grad */
    bool reduced_elsewhere; /* under --deterministic: det.c sums the gradients whole */
    bool last;              /* this one is the step's last */
    const mg_strategy *s;   /* whose own ranges an offloaded piece's norm counts (NULL: all) */
    mg_status err;
    size_t param_bytes, grad_bytes;   /* resident now (counted, not measured) */
    mg_zero_stats stats;
};

mg_status mg__zero_stage_check(int stage)
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
        b->buf = -1;
        z->piece[i] = (mg_range){b->plo, b->phi};
    }
    return MG_OK;
}

/* ---- stage 3: parameters gathered and given back ----------------------- */

/* Offloaded: bucket i's piece read from the file into the arena. */
static void piece_in(mg_zero *z, int i)
{
    zbucket *b = &z->b[i];
    if (!z->ps || b->state != SHARDED) return;
    float *p = mg_model_params(z->m);
    mg_status st = mg_scratch_read(z->ps, p + b->plo, (b->phi - b->plo) * sizeof(float), b->at);
    if (st && !z->err) z->err = st;
    b->state = PIECE;
    z->param_bytes += (b->phi - b->plo) * sizeof(float);
    note_peak(z);
}

static void gather_start(mg_zero *z, int i)
{
    if (i < 0 || i >= z->nb) return;
    zbucket *b = &z->b[i];
    piece_in(z, i);
    if ((b->state != SHARDED && b->state != PIECE) || z->err) return;
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

/* Give back the bucket's parameters outside this rank's piece; offloaded,
 * the piece too, written to the file first when `save` (the arena's
 * piece may have been changed: loaded, broadcast). */
static void shard(mg_zero *z, int i, bool save)
{
    zbucket *b = &z->b[i];
    if (b->state == GATHERING) gather_wait(z, i);
    if (b->state == SHARDED) return;
    float *p = mg_model_params(z->m);
    size_t piece = (b->phi - b->plo) * sizeof(float);
    if (b->state == GATHERED) z->param_bytes -= (b->hi - b->lo) * sizeof(float) - piece;
    if (z->ps) {
        mg_status st = save ? mg_scratch_write(z->ps, p + b->plo, piece, b->at) : MG_OK;
        if (st && !z->err) z->err = st;
        mg_mem_discard(p + b->lo, (b->hi - b->lo) * sizeof(float));
        z->param_bytes -= piece;
    } else {
        mg_device_discard(z->dev, p + b->lo, (b->plo - b->lo) * sizeof(float));
        mg_device_discard(z->dev, p + b->phi, (b->hi - b->phi) * sizeof(float));
    }
    b->state = SHARDED;
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
    if (z->overlap && u == (dir < 0 ? z->b[i].first : z->b[i].last)) gather_start(z, i + dir);
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
    if (i > 0 && u == z->b[i].last && !z->b[i].keep) shard(z, i, false);
}

/* ---- gradients: reduce-scatter, and keep the rank's piece --------------- */

static size_t piece_len(const zbucket *b) { return b->phi - b->plo; }

static void reduce_start(mg_zero *z, zbucket *b)
{
    if (z->err) return;
    float *src = mg_model_grads(z->m) + b->lo, *dst = mg_model_grads(z->m) + b->plo;
    if (b->buf >= 0) {
        src = z->pool[b->buf];
        dst = src + (b->plo - b->lo);
        if (z->tape) mg_tape_set_grad_window(z->tape, b->buf, 0, 0, NULL);
    }
    mg_status st = mg_reduce_scatter_async(z->g, src, dst, piece_len(b), MG_F32, MG_AVG, &b->rs);
    if (st) z->err = st;
}

/* The sum of squares of a piece's gradient g over the strategy's own
 * ranges in it, as the norm of gradients in memory counts them: a tensor
 * every tp rank holds whole counts on one of them. */
static double own_sumsq(const mg_zero *z, const zbucket *b, const float *g)
{
    int n = 1;
    const mg_range whole = {b->plo, b->phi};
    const mg_range *own = z->s ? mg__strategy_own_ranges(z->s, &n) : &whole;
    double ss = 0;
    for (int k = 0; k < n; k++) {
        size_t lo = own[k].lo > b->plo ? own[k].lo : b->plo;
        size_t hi = own[k].hi < b->phi ? own[k].hi : b->phi;
        if (lo < hi) ss += mg_grad_sumsq(g + (lo - b->plo), hi - lo);
    }
    return ss;
}

/* Offloaded gradients: the file's piece plus this micro-batch's r
 * (the sum computed in the part of b's pool buffer the piece does not
 * use, exactly as the arena would add it); on the step's last
 * micro-batch scaled to the mean over the micro-batches (the reduce-scatter
 * averaged over the ranks) and its sum of squares kept, as the training
 * step does with a piece in memory. */
static void grads_to_file(mg_zero *z, zbucket *b, const float *r)
{
    size_t len = piece_len(b);
    float *buf = z->pool[b->buf], *acc = b->plo == b->lo ? buf + len : buf;
    mg_status st = MG_OK;
    if (z->micro > 1) st = mg_scratch_read(z->gs, acc, len * sizeof(float), b->at);
    else memset(acc, 0, len * sizeof(float));
    for (size_t k = 0; k < len; k++) acc[k] += r[k];
    if (z->last) {
        float scale = 1.0f / (float)z->micro;
        if (scale != 1.0f) mg_grad_scale(acc, len, scale);
        b->sumsq = own_sumsq(z, b, acc);
    }
    if (!st) st = mg_scratch_write(z->gs, acc, len * sizeof(float), b->at);
    if (st && !z->err) z->err = st;
}

/* g += r, n floats of the model's device. */
static void add_into(mg_zero *z, float *g, const float *r, size_t n)
{
    mg_status st = mg_add_into_on(z->dev, g, r, n);
    if (st && !z->err) z->err = st;
}

/* Wait for bucket b's reduce-scatter; with a pool buffer, add its piece
 * into the arena's and give the buffer back. */
static void reduce_end(mg_zero *z, zbucket *b)
{
    if (b->rs) {
        mg_status st = mg_work_wait(b->rs, -1);
        if (st && !z->err) z->err = st;
        mg_work_free(b->rs);
        b->rs = NULL;
    }
    if (b->buf < 0) return;
    const float *r = z->pool[b->buf] + (b->plo - b->lo);
    if (z->gs) {
        grads_to_file(z, b, r);
    } else {
        add_into(z, mg_model_grads(z->m) + b->plo, r, piece_len(b));
    }
    z->pool_owner[b->buf] = -1;
    b->buf = -1;
    z->grad_bytes -= (b->hi - b->lo) * sizeof(float);
}

/* Stages 2-3: a zeroed pool buffer for bucket i's gradients, pointed to
 * by the tape; when all are taken, the oldest reduction is waited for. */
static void acquire(mg_zero *z, mg_tape *t, int i)
{
    if (i < 0 || z->stage < 2 || z->reduced_elsewhere || z->b[i].buf >= 0) return;
    zbucket *b = &z->b[i];
    for (;;) {
        int k0 = b->keep ? SHARED : 0, k1 = b->keep ? SHARED + 1 : SHARED;
        for (int k = k0; k < k1; k++)
            if (z->pool_owner[k] == -1) {
                z->pool_owner[k] = i;
                b->buf = k;
                mg_status st = mg_device_zero(z->dev, z->pool[k], (b->hi - b->lo) * sizeof(float));
                if (st && !z->err) z->err = st;
                if (t) mg_tape_set_grad_window(t, k, b->lo, b->hi, z->pool[k]);
                z->grad_bytes += (b->hi - b->lo) * sizeof(float);
                note_peak(z);
                return;
            }
        /* Every buffer is in use: finish the reduction launched first. */
        int oldest = -1;
        for (int k = 0; k < z->next && oldest < 0; k++)
            if (z->b[k].buf >= k0 && z->b[k].buf < k1) oldest = k;
        /* Backward holds at most one bucket of each kind unreduced. */
        MG_ASSERT(oldest >= 0);
        reduce_end(z, &z->b[oldest]);
    }
}

static void pre_backward(void *ud, mg_tape *t, int u)
{
    mg_zero *z = ud;
    if (!z->active) return;
    z->tape = t;
    acquire(z, t, z->borrow[u]);
    acquire(z, t, z->ub[u]);
    pre(z, u, +1);
}

static void post_backward(void *ud, mg_tape *t, int u)
{
    mg_zero *z = ud;
    (void)t;
    if (!z->active || (!z->sync && z->stage < 3)) return;
    size_t lo, hi;
    mg_model_unit_range(z->m, u, &lo, &hi);
    if (hi > z->ready) z->ready = hi;
    while (z->next < z->nb && z->b[z->next].hi <= z->ready) {
        zbucket *b = &z->b[z->next++];
        if (z->sync) reduce_start(z, b);
        if (z->stage >= 3) shard(z, (int)(b - z->b), false);
    }
    /* Reductions that finished give their buffers back now. */
    for (int k = 0; k < z->next && z->stage >= 2; k++)
        if (z->b[k].rs && mg_work_test(z->b[k].rs)) reduce_end(z, &z->b[k]);
}

static const mg_unit_hooks zero_hooks = {.pre_forward = pre_forward,
                                         .post_forward = post_forward,
                                         .pre_backward = pre_backward,
                                         .post_backward = post_backward};

/* ---- the interface ------------------------------------------------------- */

/* Stages 2-3 on a device: the gradient arena outside the pieces given
 * back (on the CPU those pages are never written, so never there; a
 * device's arena is allocated whole, and again after a checkpoint moved
 * it). Nothing to do costs nothing. */
static void grads_outside_pieces_back(mg_zero *z)
{
    if (z->dev.kind == MG_DEVICE_CPU || z->stage < 2) return;
    float *g = mg_model_grads(z->m);
    for (int i = 0; i < z->nb; i++) {
        mg_device_discard(z->dev, g + z->b[i].lo, (z->b[i].plo - z->b[i].lo) * sizeof(float));
        mg_device_discard(z->dev, g + z->b[i].phi, (z->b[i].hi - z->b[i].phi) * sizeof(float));
    }
}

mg_status mg__zero_create(mg_group *g, mg_model *m, int stage, const mg_ddp_options *opt,
                         mg_zero **out)
{
    *out = NULL;
    MG_TRY(mg__zero_stage_check(stage));
    mg_ddp_options o = opt ? *opt : mg_ddp_defaults();
    if (o.compress != MG_COMPRESS_NONE)
        return mg_error(MG_EINVAL, "ZeRO does not compress gradients: leave out --compress");
    mg_zero *z = calloc(1, sizeof *z);
    if (!z) return mg_error(MG_ENOMEM, "zero: out of memory");
    z->g = g;
    z->m = m;
    z->dev = mg_model_device(m);
    z->stage = stage;
    z->rank = mg_group_rank(g);
    z->world = mg_group_size(g);
    size_t pad = mg_shard_pad(z->world);
    mg_status st = MG_OK;
    if (mg_model_unit_pad(m) % pad) st = mg_model_set_unit_pad(m, pad);
    z->n = mg_model_arena_size(m);
    if (!st) st = make_buckets(z, o.first_bucket_bytes, o.bucket_bytes);
    size_t longest[2] = {0, 0};   /* of the other buckets, of the borrowed ones */
    for (int i = 0; !st && i < z->nb; i++) {
        size_t *l = &longest[z->b[i].keep];
        if (z->b[i].hi - z->b[i].lo > *l) *l = z->b[i].hi - z->b[i].lo;
    }
    z->overlap = mg_env_long("MG_ZERO_OVERLAP", 1) != 0;
    for (int k = 0; !st && stage >= 2 && k < POOL; k++, z->npool++) {
        size_t len = longest[k == SHARED];
        z->pool_owner[k] = -1;
        if (k > 0 && k < SHARED && !z->overlap) {
            z->pool_owner[k] = -2;   /* not there */
            continue;
        }
        if (len && !(z->pool[k] = mg_device_alloc(z->dev, len * sizeof(float))))
            st = mg_error(MG_ENOMEM, "zero: cannot allocate %zu bytes for a gradient bucket",
                          len * sizeof(float));
    }
    /* Stages 2-3 write only the pieces of the gradient arena: no huge
     * page may spill a piece's writes into the rest. */
    for (int i = 0; !st && stage >= 2 && z->dev.kind == MG_DEVICE_CPU && i < z->nb; i++) {
        float *g = mg_model_grads(m);
        mg_mem_no_huge(g + z->b[i].lo, (z->b[i].plo - z->b[i].lo) * sizeof(float));
        mg_mem_no_huge(g + z->b[i].phi, (z->b[i].hi - z->b[i].phi) * sizeof(float));
    }
    if (!st) st = mg_model_add_hooks(m, &zero_hooks, z);
    if (st) {
        z->hooked = false;
        mg__zero_destroy(z);
        return st;
    }
    z->hooked = true;
    z->param_bytes = z->n * sizeof(float);
    z->grad_bytes = stage == 1 ? z->n * sizeof(float) : 0;
    for (int i = 0; i < z->nb && stage >= 2; i++)
        z->grad_bytes += (z->b[i].phi - z->b[i].plo) * sizeof(float);
    if (stage == 3) mg__zero_release(z);
    grads_outside_pieces_back(z);
    note_peak(z);
    *out = z;
    return MG_OK;
}

void mg__zero_destroy(mg_zero *z)
{
    if (!z) return;
    for (int i = 0; i < z->nb; i++) {
        mg_work_free(z->b[i].rs);
        mg_work_free(z->b[i].ag);
    }
    if (z->hooked) mg_model_remove_hooks(z->m, &zero_hooks, z);
    mg_scratch_destroy(z->ps);
    mg_scratch_destroy(z->gs);
    for (int k = 0; k < z->npool; k++) mg_device_free(z->dev, z->pool[k]);
    free(z->b);
    free(z->ub);
    free(z->borrow);
    free(z->piece);
    free(z);
}

int mg__zero_stage(const mg_zero *z) { return z->stage; }

/* Under --deterministic det.c sums each shard's gradient whole in its
 * tree: stages 2-3 give up their gradient windows (the arena is written
 * whole, as stage 1's) and reduce nothing; the optimizer still steps the
 * pieces, and stage 3 still gathers the parameters bucket by bucket. */
static void sum_elsewhere(mg_zero *z)
{
    z->reduced_elsewhere = true;
    for (int k = 0; k < z->npool; k++) {
        mg_device_free(z->dev, z->pool[k]);
        z->pool[k] = NULL;
    }
    z->grad_bytes = z->n * sizeof(float);
    note_peak(z);
}

const mg_range *mg__zero_pieces(const mg_zero *z, int *n)
{
    *n = z->nb;
    return z->piece;
}

int mg__zero_num_buckets(const mg_zero *z) { return z->nb; }

void mg__zero_zero_grad(mg_zero *z)
{
    float *gr = mg_model_grads(z->m);
    z->micro = 0;
    grads_outside_pieces_back(z);
    if (z->gs) return;   /* the first micro-batch writes the file */
    if (z->stage == 1) {
        mg_model_zero_grad(z->m);
        return;
    }
    /* Outside the pieces the arena is never written. */
    for (int i = 0; i < z->nb; i++) {
        mg_status st = mg_device_zero(z->dev, gr + z->b[i].plo,
                                      (z->b[i].phi - z->b[i].plo) * sizeof(float));
        if (st && !z->err) z->err = st;
    }
}

void mg__zero_begin(mg_zero *z, bool last)
{
    z->active = true;
    z->micro++;
    z->last = last;
    z->sync = (z->stage >= 2 || last) && !z->reduced_elsewhere;
    z->ready = 0;
    z->next = 0;
}

mg_status mg__zero_end(mg_zero *z)
{
    z->active = false;
    if (z->sync) {
        /* Buckets whose units got no gradient go now, in order. */
        while (z->next < z->nb) {
            acquire(z, NULL, z->next);
            reduce_start(z, &z->b[z->next++]);
        }
        for (int i = 0; i < z->nb; i++) reduce_end(z, &z->b[i]);
    }
    for (int k = 0; z->tape && k < MG_GRAD_WINDOWS; k++)
        mg_tape_set_grad_window(z->tape, k, 0, 0, NULL);
    z->tape = NULL;
    for (int i = 0; i < z->nb && z->stage >= 3; i++) shard(z, i, false);
    mg_status st = z->err;
    z->err = MG_OK;
    return st;
}

mg_status mg__zero_after_step(mg_zero *z)
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

mg_status mg__zero_gather(mg_zero *z)
{
    if (z->stage < 3) return MG_OK;
    for (int i = 0; i < z->nb; i++) gather_start(z, i);
    for (int i = 0; i < z->nb; i++) gather_wait(z, i);
    z->gathered_all = true;
    mg_status st = z->err;
    z->err = MG_OK;
    return st;
}

mg_status mg__zero_release(mg_zero *z)
{
    if (z->stage < 3) return MG_OK;
    for (int i = 0; i < z->nb; i++) shard(z, i, true);
    z->gathered_all = false;
    mg_status st = z->err;
    z->err = MG_OK;
    return st;
}

mg_status mg__zero_pieces_in(mg_zero *z)
{
    for (int i = 0; i < z->nb && z->ps; i++) piece_in(z, i);
    mg_status st = z->err;
    z->err = MG_OK;
    return st;
}

mg_status mg__zero_offload(mg_zero *z, const char *dir)
{
    if (z->dev.kind != MG_DEVICE_CPU)
        return mg_error(MG_EUNSUPPORTED, "ZeRO offload (--offload) moves host memory to files; "
                        "it is not built for a model on a device: leave out --offload or use "
                        "--device cpu");
    if (z->stage < 2 || z->gs) return MG_OK;
    uint64_t at = 0;
    for (int i = 0; i < z->nb; i++) {
        z->b[i].at = at;
        at += (z->b[i].phi - z->b[i].plo) * sizeof(float);
    }
    MG_TRY(mg_scratch_create(dir, at, "gradient shard", &z->gs));
    float *g = mg_model_grads(z->m);
    for (int i = 0; i < z->nb; i++) {
        mg_mem_discard(g + z->b[i].plo, (z->b[i].phi - z->b[i].plo) * sizeof(float));
        z->grad_bytes -= (z->b[i].phi - z->b[i].plo) * sizeof(float);
    }
    if (z->stage >= 3) {
        MG_TRY(mg_scratch_create(dir, at, "parameter shard", &z->ps));
        /* The pieces in the arena go to the file. */
        for (int i = 0; i < z->nb; i++) {
            shard(z, i, false);
            z->b[i].state = PIECE;
        }
        MG_TRY(mg__zero_release(z));
    }
    /* The peaks from here on. */
    z->stats.peak_param_bytes = z->param_bytes;
    z->stats.peak_grad_bytes = z->grad_bytes;
    return MG_OK;
}

mg_scratch *mg__zero_param_store(const mg_zero *z) { return z->ps; }
mg_scratch *mg__zero_grad_store(const mg_zero *z) { return z->gs; }

double mg__zero_grad_sumsq(const mg_zero *z)
{
    double ss = 0;
    for (int i = 0; i < z->nb; i++) ss += z->b[i].sumsq;
    return ss;
}

mg_zero_stats mg_zero_get_stats(const mg_zero *z)
{
    mg_zero_stats r = z->stats;
    r.param_bytes = z->param_bytes;
    r.grad_bytes = z->grad_bytes;
    return r;
}

/* ---- as a strategy's component: over the data-parallel group ------------
 * (over a pipeline's replicas: zero_pipeline.c) */

static mg_status zero_attach(mg_strategy *s, void **state)
{
    const mg_strategy_options *o = mg_strategy_options_of(s);
    mg_mesh *mesh = mg_strategy_mesh(s);
    if (!mesh) return mg_error(MG_EINVAL, "strategy zero needs a process group");
    if (mg_strategy_pipe(s)) return MG_OK;   /* zero_pipeline.c's */
    mg_group *g = mg_mesh_group(mesh, MG_MESH_DP);
    mg_zero *z;
    MG_TRY(mg__zero_create(g, mg_strategy_model(s), o->zero_stage, &o->ddp, &z));
    if (o->det_shards) sum_elsewhere(z);
    z->s = s;
    mg_status st = o->offload_dir ? mg_strategy_agree(s, mg__zero_offload(z, o->offload_dir))
                                  : MG_OK;
    if (st) mg__zero_destroy(z);
    else *state = z;
    return st;
}

static void zero_destroy(void *c) { mg__zero_destroy(c); }

static const char *zero_label(void *c)
{
    static const char *const names[3] = {"zero1", "zero2", "zero3"};
    return names[((mg_zero *)c)->stage - 1];
}

static const mg_range *zero_ranges(void *c, int *n) { return mg__zero_pieces(c, n); }

/* Stages 1-2 hold every parameter between steps; stage 3 its pieces. */
static const mg_range *zero_params(void *c, int *n)
{
    return ((mg_zero *)c)->stage >= 3 ? mg__zero_pieces(c, n) : NULL;
}
static mg_group *zero_group(void *c) { return ((mg_zero *)c)->g; }
static void zero_zero_grad(void *c) { mg__zero_zero_grad(c); }
static void zero_begin(void *c, bool last) { mg__zero_begin(c, last); }
static mg_status zero_end(void *c) { return mg__zero_end(c); }
static mg_status zero_after(void *c) { return mg__zero_after_step(c); }
static mg_status zero_gather(void *c) { return mg__zero_gather(c); }
static mg_status zero_release(void *c) { return mg__zero_release(c); }

static mg_status zero_hold(void *c, bool saving)
{
    (void)saving;
    return mg__zero_pieces_in(c);
}

static bool zero_grads_elsewhere(void *c, double *sumsq)
{
    mg_zero *z = c;
    if (!z->gs) return false;
    *sumsq += mg__zero_grad_sumsq(z);
    return true;
}

static void zero_offload(void *c, mg_scratch **params, mg_scratch **grads)
{
    mg_zero *z = c;
    *params = z->ps;
    *grads = z->gs;
}

static void zero_memory(void *c, mg_memory_stats *ms)
{
    mg_zero_stats z = mg_zero_get_stats(c);
    ms->params = z.peak_param_bytes;
    ms->grads = z.peak_grad_bytes;
}

const mg_component_ops mg__zero_component = {
    .name = "zero", .attach = zero_attach, .destroy = zero_destroy, .label = zero_label,
    .ranges = zero_ranges, .param_ranges = zero_params, .shards_over = zero_group,
    .batch_over = zero_group,
    .zero_grad = zero_zero_grad, .micro_begin = zero_begin, .micro_end = zero_end,
    .grads_elsewhere = zero_grads_elsewhere, .after_update = zero_after,
    .hold = zero_hold, .gather = zero_gather, .release = zero_release,
    .offload = zero_offload, .memory = zero_memory,
};
