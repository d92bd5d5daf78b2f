/* ZeRO 1-3 over a pipeline's data-parallel replicas (--mesh pp=P,dp=D
 * --zero K): the replicas of each stage shard what they keep of the
 * stage's ranges, as ZeRO (zero.c) shards the whole arena; a component
 * after the pipeline's (strategy.c), that drops itself without one.
 *
 * The shard. The pipeline's ranges are cut into buckets: DDP's buckets
 * of whole units cut to the ranges, and also at the borders of every
 * unit another unit borrows (the embedding gpt's head reads), so that a
 * tied range is one bucket, the same on the stage that owns it and on
 * the one that borrows it. The plan padded every unit to a multiple of
 * lcm(D, SIMD width), so each bucket splits into D equal pieces; replica
 * r owns piece r of every bucket, and the optimizer keeps the state of
 * the pieces only.
 *
 * The step, as torchtitan runs FSDP under a pipeline schedule: the
 * stage's gradients add up whole in its ranges over the step's
 * micro-batches, and a bucket's reduce-scatter (MG_AVG, as DDP's
 * all-reduce) starts once its units have finished the stage's last
 * backward of the step (the executor marks it), overlapping the rest of
 * that backward; buckets borrowed from another stage go at the end,
 * before the pipeline adds tied gradients across stages (the two ranks
 * of a tie hold the same piece). The optimizer steps the pieces. Then
 * stages 1 and 2 all-gather the parameters; stage 3 gives back the
 * parameters outside its pieces and gathers each bucket again on its
 * first use in the next step (prefetching the one forward needs next),
 * keeping it for the whole step, because every micro-batch of a schedule
 * runs forward and backward through it (reshard_after_forward off).
 * Stages 2 and 3 give back the gradients outside the pieces after the
 * step. So during a step a rank holds its stages' parameters and
 * gradients whole, as without ZeRO, and the optimizer's state of 1/D of
 * them; between steps (evaluation, checkpoints) stage 2 also holds 1/D
 * of the gradients and stage 3 of the parameters.
 *
 * Under --deterministic det.c sums the gradients (its tree, whole in the
 * stage's ranges) and nothing here reduces them; the rest is the same.
 *
 * Limits: the shards stay in memory (no --offload disk); each
 * micro-batch's gradients are not reduced on their own (DeepSpeed
 * refuses ZeRO-2 and 3 with pipelines for that cost). */
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"

typedef struct {
    size_t lo, hi;          /* arena range: whole units of one pipeline range */
    size_t plo, phi;        /* this replica's piece */
    int units, left;        /* its units, those not done with the last backward */
    bool launched;          /* its reduce-scatter, this step */
    bool whole;             /* stage 3: its parameters gathered */
    mg_work *rs, *ag;
} pbucket;

typedef struct {
    mg_group *g;            /* the stage's replicas */
    mg_model *m;
    mg_device dev;
    int stage, rank, world;
    pbucket *b;
    int nb;
    int *ub;                /* unit -> bucket holding its parameters, or -1 */
    mg_range *piece, *own;  /* pieces of every bucket; of the pipeline's own ranges */
    int nown;
    bool sync;              /* this backward is the stage's last of the step */
    bool det;               /* --deterministic: det.c sums the gradients whole */
    bool hooked;
    mg_status err;
} zpipe;

static void keep_err(zpipe *z, mg_status st)
{
    if (st && !z->err) z->err = st;
}

/* Buckets: DDP's over the ranges r (mg__range_buckets), each split into
 * the replicas' pieces. */
static mg_status make_buckets(zpipe *z, const mg_ddp_options *o, const mg_range *r, int n)
{
    mg_model *m = z->m;
    int nu = mg_model_num_units(m), nb;
    mg_range *cut;
    MG_TRY(mg__range_buckets(m, o->first_bucket_bytes, o->bucket_bytes, r, n, &cut, &nb));
    z->b = calloc((size_t)nb + 1, sizeof *z->b);
    z->ub = malloc(sizeof *z->ub * (size_t)(nu ? nu : 1));
    if (!z->b || !z->ub) {
        free(cut);
        return mg_error(MG_ENOMEM, "zero: out of memory for buckets");
    }
    for (z->nb = 0; z->nb < nb; z->nb++)
        z->b[z->nb] = (pbucket){.lo = cut[z->nb].lo, .hi = cut[z->nb].hi};
    free(cut);
    z->piece = calloc((size_t)z->nb + 1, sizeof *z->piece);
    z->own = calloc((size_t)z->nb + 1, sizeof *z->own);
    if (!z->piece || !z->own) return mg_error(MG_ENOMEM, "zero: out of memory for buckets");
    for (int u = 0; u < nu; u++) {
        size_t lo, hi;
        mg_model_unit_range(m, u, &lo, &hi);
        z->ub[u] = -1;
        for (int i = 0; i < z->nb && hi > lo; i++)
            if (lo >= z->b[i].lo && hi <= z->b[i].hi) {
                z->ub[u] = i;
                z->b[i].left = ++z->b[i].units;
            }
    }
    for (int i = 0; i < z->nb; i++) {
        pbucket *b = &z->b[i];
        size_t len = (b->hi - b->lo) / (size_t)z->world;
        MG_ASSERT(len * (size_t)z->world == b->hi - b->lo);
        b->plo = b->lo + (size_t)z->rank * len;
        b->phi = b->plo + len;
        b->whole = true;
        z->piece[i] = (mg_range){b->plo, b->phi};
    }
    return MG_OK;
}

/* ---- stage 3: a bucket's parameters gathered, and given back ------------- */

static void gather_start(zpipe *z, int i)
{
    if (i < 0 || i >= z->nb || z->b[i].whole || z->b[i].ag || z->err) return;
    pbucket *b = &z->b[i];
    float *p = mg_model_params(z->m);
    keep_err(z, mg_all_gather_async(z->g, p + b->plo, p + b->lo, b->phi - b->plo, MG_F32,
                                    &b->ag));
}

static void gather_wait(zpipe *z, int i)
{
    if (i < 0 || z->b[i].whole) return;
    pbucket *b = &z->b[i];
    gather_start(z, i);
    if (b->ag) {
        keep_err(z, mg_work_wait(b->ag, -1));
        mg_work_free(b->ag);
        b->ag = NULL;
    }
    b->whole = true;
}

static void shard(zpipe *z, int i)
{
    pbucket *b = &z->b[i];
    if (b->ag) gather_wait(z, i);   /* none may be in flight into it */
    float *p = mg_model_params(z->m);
    mg_device_discard(z->dev, p + b->lo, (b->plo - b->lo) * sizeof(float));
    mg_device_discard(z->dev, p + b->phi, (b->hi - b->phi) * sizeof(float));
    b->whole = false;
}

/* Before a unit runs (forward or backward, training or not): its
 * parameters and those it borrows whole; in forward (the arena's lower
 * buckets come next) the next bucket's gather starts. */
static void before_unit(void *ud, mg_tape *t, int u)
{
    zpipe *z = ud;
    (void)t;
    if (z->stage < 3) return;
    int j = mg_model_unit(z->m, u).borrows;
    if (j >= 0) gather_wait(z, z->ub[j]);
    int i = z->ub[u];
    if (i < 0 || z->b[i].whole) return;
    gather_wait(z, i);
    gather_start(z, i - 1);
}

/* ---- gradients: a reduce-scatter per bucket after the last backward ------ */

static void launch(zpipe *z, pbucket *b)
{
    b->launched = true;
    if (z->err) return;
    float *g = mg_model_grads(z->m);
    keep_err(z, mg_reduce_scatter_async(z->g, g + b->lo, g + b->plo, b->phi - b->plo, MG_F32,
                                        MG_AVG, &b->rs));
}

static void after_backward(void *ud, mg_tape *t, int u)
{
    zpipe *z = ud;
    (void)t;
    int i = z->ub[u];
    if (!z->sync || i < 0) return;
    pbucket *b = &z->b[i];
    if (!b->launched && --b->left == 0) launch(z, b);
}

static const mg_unit_hooks hooks = {.pre_forward = before_unit, .pre_backward = before_unit,
                                    .post_backward = after_backward};

/* ---- the component -------------------------------------------------------- */

static void zp_destroy(void *c)
{
    zpipe *z = c;
    if (!z) return;
    for (int i = 0; i < z->nb; i++) {
        if (z->b[i].rs) mg_work_wait(z->b[i].rs, -1);
        if (z->b[i].ag) mg_work_wait(z->b[i].ag, -1);
        mg_work_free(z->b[i].rs);
        mg_work_free(z->b[i].ag);
    }
    if (z->hooked) mg_model_remove_hooks(z->m, &hooks, z);
    free(z->b);
    free(z->ub);
    free(z->piece);
    free(z->own);
    free(z);
}

/* Every bucket not whole gathered from the pieces. */
static mg_status gather_all(zpipe *z)
{
    for (int i = 0; i < z->nb; i++) gather_start(z, i);
    for (int i = 0; i < z->nb; i++) gather_wait(z, i);
    mg_status st = z->err;
    z->err = MG_OK;
    return st;
}

/* Stage 3: every bucket whole (evaluation, sampling, checkpoints); or
 * back to the pieces. Nothing for stages 1-2. */
static mg_status zp_gather(void *c)
{
    zpipe *z = c;
    return z->stage >= 3 ? gather_all(z) : MG_OK;
}

static mg_status zp_release(void *c)
{
    zpipe *z = c;
    for (int i = 0; i < z->nb && z->stage >= 3; i++) shard(z, i);
    mg_status st = z->err;
    z->err = MG_OK;
    return st;
}

static mg_status zp_hold(void *c, bool saving)
{
    return saving ? MG_OK : zp_gather(c);   /* a checkpoint takes the pieces */
}

static mg_status zp_attach(mg_strategy *s, void **state)
{
    mg_pipe *p = mg_strategy_pipe(s);
    if (!p) return MG_OK;   /* zero.c's */
    const mg_strategy_options *o = mg_strategy_options_of(s);
    mg_group *g = mg_mesh_group(mg_strategy_mesh(s), MG_MESH_DP);
    MG_TRY(mg__zero_stage_check(o->zero_stage));
    if (o->ddp.compress != MG_COMPRESS_NONE)
        return mg_error(MG_EINVAL, "ZeRO does not compress gradients: leave out --compress");
    zpipe *z = calloc(1, sizeof *z);
    if (!z) return mg_error(MG_ENOMEM, "zero: out of memory");
    z->g = g;
    z->m = mg_strategy_model(s);
    z->dev = mg_model_device(z->m);
    z->stage = o->zero_stage;
    z->rank = mg_group_rank(g);
    z->world = mg_group_size(g);
    z->det = o->det_shards > 0;
    int n, no;
    const mg_range *r = mg__pipe_ranges(p, &n), *own = mg__pipe_own_ranges(p, &no);
    mg_status st = make_buckets(z, &o->ddp, r, n);
    for (int i = 0; !st && i < z->nb; i++)
        for (int k = 0; k < no; k++)
            if (z->b[i].lo >= own[k].lo && z->b[i].hi <= own[k].hi)
                z->own[z->nown++] = z->piece[i];
    /* The gradients outside the pieces are given back page by page. */
    float *gr = mg_model_grads(z->m);
    for (int i = 0; !st && z->stage >= 2 && z->dev.kind == MG_DEVICE_CPU && i < z->nb; i++) {
        mg_mem_no_huge(gr + z->b[i].lo, (z->b[i].plo - z->b[i].lo) * sizeof(float));
        mg_mem_no_huge(gr + z->b[i].phi, (z->b[i].hi - z->b[i].phi) * sizeof(float));
    }
    if (!st) st = mg_model_add_hooks(z->m, &hooks, z);
    z->hooked = !st;
    if (!st) st = zp_release(z);
    if (st) zp_destroy(z);
    else *state = z;
    return st;
}

static const char *zp_label(void *c)
{
    static const char *const names[3] = {"zero1", "zero2", "zero3"};
    return names[((zpipe *)c)->stage - 1];
}

static const mg_range *zp_ranges(void *c, int *n)
{
    *n = ((zpipe *)c)->nb;
    return ((zpipe *)c)->piece;
}

static const mg_range *zp_own(void *c, int *n)
{
    *n = ((zpipe *)c)->nown;
    return ((zpipe *)c)->own;
}

static mg_group *zp_group(void *c) { return ((zpipe *)c)->g; }

/* Stages 1-2 hold the pipeline's ranges between steps; stage 3 the pieces. */
static const mg_range *zp_params(void *c, int *n)
{
    return ((zpipe *)c)->stage >= 3 ? zp_ranges(c, n) : NULL;
}

static void zp_begin(void *c, bool last) { ((zpipe *)c)->sync = last && !((zpipe *)c)->det; }

/* The buckets not launched yet (borrowed ones, those without a gradient)
 * in order, then every reduction waited for. */
static mg_status zp_reduce(void *c)
{
    zpipe *z = c;
    for (int i = 0; i < z->nb && !z->det; i++)
        if (!z->b[i].launched) launch(z, &z->b[i]);
    float *g = mg_model_grads(z->m);
    for (int i = 0; i < z->nb; i++) {
        pbucket *b = &z->b[i];
        if (b->rs) {
            keep_err(z, mg_work_wait(b->rs, -1));
            mg_work_free(b->rs);
            b->rs = NULL;
        }
        b->launched = false;
        b->left = b->units;
        if (z->stage >= 2) {
            mg_device_discard(z->dev, g + b->lo, (b->plo - b->lo) * sizeof(float));
            mg_device_discard(z->dev, g + b->phi, (b->hi - b->phi) * sizeof(float));
        }
    }
    z->sync = false;
    mg_status st = z->err;
    z->err = MG_OK;
    return st;
}

/* After the optimizer stepped the pieces: stages 1-2 gather them into
 * every replica's ranges; stage 3 keeps them only. */
static mg_status zp_after_update(void *c)
{
    zpipe *z = c;
    if (z->stage >= 3) return zp_release(z);
    for (int i = 0; i < z->nb; i++) z->b[i].whole = false;
    return gather_all(z);
}

const mg_component_ops mg__zero_pipe_component = {
    .name = "zero", .attach = zp_attach, .destroy = zp_destroy, .label = zp_label,
    .ranges = zp_ranges, .own_ranges = zp_own, .param_ranges = zp_params,
    .shards_over = zp_group, .batch_over = zp_group,
    .micro_begin = zp_begin, .reduce = zp_reduce,
    .after_update = zp_after_update,
    .hold = zp_hold, .gather = zp_gather, .release = zp_release,
};
