/* Deterministic data parallelism (--deterministic, issue 35): the same
 * bits at any world size.
 *
 * A step's global batch is cut into V virtual shards of the same size (V
 * a power of two, fixed by the run, not by the world size W, which must
 * divide it), the trainer feeding each rank its V/W consecutive shards as
 * micro-batches of the same rows whatever W is (mg_sampler_init_blocks,
 * the text's rows in order). Each shard's gradient is computed on its own
 * (the arena zeroed before it) and the V gradients are summed in one
 * fixed binary tree: on a rank, its shards' subtree (a binary counter:
 * two nodes of a level become one of the next as soon as both are there,
 * at most log2(V/W) + 1 nodes kept); across ranks, the subtrees' roots in
 * the tree's upper levels (rank r adds rank r + 2^k's node at level k,
 * then rank 0 broadcasts the root). Every sum in it adds the same two
 * numbers at any W, and floating-point addition is commutative, so the
 * sum is the same bits; the mean divides by powers of two only (W, then
 * the strategy's V/W), which is exact. The model's own kernels see the
 * same shapes at any W (a shard's rows), so each shard's gradient is the
 * same bits too.
 *
 * Replaces DDP (which drops itself) for one process and --parallel ddp
 * over a data-parallel mesh; beside ZeRO (any stage, also over a
 * pipeline's replicas) it sums the gradients in ZeRO's place (ZeRO shards
 * the optimizer and gathers the parameters; stages 2-3 keep the gradients
 * whole during the step, as stage 1). A model on a device has each
 * shard's gradient copied to the host and the tree summed there. Clipping
 * takes the norm in one grouping whatever the plan: each unit's sum of
 * squares, added in the units' order (grad_sumsq), not the ranks' shares
 * summed. Under a pipeline it sums
 * the stage's ranges, each micro-batch's as its backward ends (the
 * executor's after-backward hook), and the stage's replicas form the tree's
 * upper levels; with chunks (the interleaved schedule) a counter for each
 * chunk's range, since its backwards interleave with the other chunks'.
 * Limits (this increment): not yet with a unit tied across stages,
 * tensor parallelism, ZeRO's disk offload or a parameter server
 * (refused); the training figures are summed over
 * the ranks as DDP's are (their last bits may follow W; the parameters do
 * not); arena-sized buffers, at most log2(V/W) + 1, on each rank.
 * DataParallel threads (dp.c's deterministic driver) push their shards'
 * gradients in shard order (mg__det_push). */
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"

enum { TAG_NODE = 0x6474 };   /* "dt" */

/* A binary counter over some ranges of the arena: a pipeline chunk's
 * (whose micro-batches' backwards come in their order), or all the rank
 * sums. Counters of disjoint ranges share the node buffers. */
typedef struct {
    const mg_range *r;
    int nr;
    mg_range one;       /* a chunk's range */
    int *level;         /* each kept node's level */
    int kept;           /* nodes on the stack (slots 0 .. kept-1, levels decreasing) */
} counter;

typedef struct {
    mg_strategy *s;
    mg_model *m;
    const mg_range *r;  /* the ranges it sums: a pipeline stage's, else the arena */
    int nr;
    mg_range whole;
    mg_pipe *pipe;      /* with chunks: a counter each */
    counter *cn;
    int ncn;
    mg_group *g;        /* the data-parallel ranks (NULL: one process) */
    mg_group *stages;   /* a pipeline's (NULL: none): the norm's parts */
    double *unit_ss;    /* per unit: the sum of squares of its summed gradient */
    int units;
    int rank, world, shards;   /* shards: V */
    size_t n;           /* arena floats */
    float **node;       /* the subtrees' nodes kept, by slot (each counter in its ranges) */
    int depth;          /* slots: log2(V/W) + 1 */
    float *peer;        /* a peer's node, across ranks */
    mg_device dev;      /* the model's: on a device, the tree is summed on the host */
    float *host;        /* a device's gradient copied out (NULL on the CPU) */
    double sumsq;       /* of the step's summed gradient, over W */
    mg_status err;      /* zero_grad's, told at the next shard's end */
    bool replaces;      /* in DDP's place (the figures, the copies); not beside ZeRO-1 */
} det;

static bool power_of_two(int v) { return v > 0 && !(v & (v - 1)); }

static void det_destroy(void *c)
{
    det *d = c;
    for (int i = 0; i < d->depth; i++) mg_free(d->node[i]);
    free(d->node);
    for (int i = 0; d->cn && i < d->ncn; i++) free(d->cn[i].level);
    free(d->cn);
    free(d->unit_ss);
    mg_free(d->peer);
    mg_free(d->host);
    free(d);
}

static mg_status det_attach(mg_strategy *s, void **state)
{
    const mg_strategy_options *o = mg_strategy_options_of(s);
    if (!o->det_shards) return MG_OK;
    mg_mesh *mesh = mg_strategy_mesh(s);
    mg_pipe *pipe = mg_strategy_pipe(s);
    if (o->kind == MG_STRATEGY_PS)
        return mg_error(MG_EUNSUPPORTED, "--deterministic: one process, --parallel dp and ddp, "
                        "ZeRO and pipelines are built; --parallel ps is not yet");
    if (o->offload_dir)
        return mg_error(MG_EUNSUPPORTED, "--deterministic keeps the gradients whole in memory: "
                        "ZeRO's --offload is not built with it; leave out one of them");
    if (mesh && mg_mesh_size(mesh, MG_MESH_TP) > 1)
        return mg_error(MG_EUNSUPPORTED, "--deterministic: tensor parallelism is not yet built");
    if (pipe && mg__pipe_has_ties(pipe))
        return mg_error(MG_EUNSUPPORTED, "--deterministic: a pipeline without tied units "
                        "(lenet5's) is built; a unit tied across stages (gpt's head) is not yet");
    int V = o->det_shards, W = mesh ? mg_mesh_size(mesh, MG_MESH_DP) : 1;
    if (!power_of_two(V) || V % W)
        return mg_error(MG_EINVAL, "--virtual-shards %d: give a power of two that %d rank(s) "
                        "divide (each rank takes V/W of them)", V, W);
    det *d = calloc(1, sizeof *d);
    if (!d) return mg_error(MG_ENOMEM, "--deterministic: out of memory");
    d->s = s;
    d->m = mg_strategy_model(s);
    d->g = mesh && W > 1 ? mg_mesh_group(mesh, MG_MESH_DP) : NULL;
    d->rank = d->g ? mg_group_rank(d->g) : 0;
    d->world = W;
    d->shards = V;
    d->n = mg_model_arena_size(d->m);
    d->replaces = o->kind != MG_STRATEGY_ZERO;
    d->dev = mg_model_device(d->m);
    d->whole = (mg_range){0, d->n};
    d->r = pipe ? mg__pipe_ranges(pipe, &d->nr) : &d->whole;
    if (!pipe) d->nr = 1;
    d->pipe = pipe && mg__pipe_chunks(pipe) > 1 ? pipe : NULL;
    d->stages = pipe ? mg_mesh_group(mesh, MG_MESH_PP) : NULL;
    d->units = mg_model_num_units(d->m);
    d->ncn = d->pipe ? mg__pipe_chunks(pipe) : 1;
    for (int v = V / W; v; v >>= 1) d->depth++;
    d->node = calloc((size_t)d->depth, sizeof *d->node);
    d->cn = calloc((size_t)d->ncn, sizeof *d->cn);
    d->unit_ss = calloc((size_t)d->units, sizeof *d->unit_ss);
    bool ok = d->node && d->cn && d->unit_ss;
    for (int i = 0; ok && i < d->ncn; i++) {
        counter *c = &d->cn[i];
        if (d->pipe) {
            c->one = mg__pipe_chunk_range(pipe, i);
            c->r = &c->one;
            c->nr = 1;
        } else {
            c->r = d->r;
            c->nr = d->nr;
        }
        ok = (c->level = malloc((size_t)d->depth * sizeof *c->level));
    }
    for (int i = 0; ok && i < d->depth; i++) ok = (d->node[i] = mg_alloc(d->n * sizeof(float)));
    if (ok && d->g) ok = (d->peer = mg_alloc(d->n * sizeof(float)));
    if (ok && d->dev.kind != MG_DEVICE_CPU) ok = (d->host = mg_alloc(d->n * sizeof(float)));
    *state = d;
    return ok ? MG_OK
              : mg_error(MG_ENOMEM, "--deterministic: out of memory for %d gradient copies of "
                         "%zu floats", d->depth + (d->g != NULL), d->n);
}

/* In DDP's place: the replicas, over which the figures are summed; beside
 * ZeRO-1, ZeRO's group says it (its ranks keep their own pieces). */
static mg_group *det_group(void *c)
{
    det *d = c;
    return d->replaces ? d->g : NULL;
}

/* The ranges r (nr) of the gradient arena zeroed (a pipeline's other
 * stages' pages are given back: never touched). */
static mg_status zero_ranges(det *d, const mg_range *r, int nr)
{
    float *g = mg_model_grads(d->m);
    for (int k = 0; k < nr; k++)
        MG_TRY(mg_device_zero(d->dev, g + r[k].lo, (r[k].hi - r[k].lo) * sizeof *g));
    return MG_OK;
}

/* The ranges r (nr) between the arena and host memory h (the same
 * offsets): on the CPU, h is the arena. */
static mg_status arena_copy(det *d, const mg_range *r, int nr, float *h, bool to_host)
{
    mg_device cpu = {MG_DEVICE_CPU, 0};
    float *g = mg_model_grads(d->m);
    for (int k = 0; k < nr && h != g; k++) {
        size_t lo = r[k].lo, bytes = (r[k].hi - lo) * sizeof *g;
        MG_TRY(to_host ? mg_device_copy(cpu, h + lo, d->dev, g + lo, bytes)
                       : mg_device_copy(d->dev, g + lo, cpu, h + lo, bytes));
    }
    return MG_OK;
}

static void det_zero_grad(void *c)
{
    det *d = c;
    for (int i = 0; i < d->ncn; i++) d->cn[i].kept = 0;
    d->err = zero_ranges(d, d->r, d->nr);
}

/* dst[r] += src[r] (copy: =) over the ranges r (nr). */
static void over_ranges(const mg_range *r, int nr, float *dst, const float *src, bool copy)
{
    for (int k = 0; k < nr; k++) {
        size_t lo = r[k].lo, n = r[k].hi - lo;
        if (copy) memcpy(dst + lo, src + lo, n * sizeof *dst);
        else mg_add_into(dst + lo, src + lo, n);
    }
}

/* Gradient g of counter c's ranges onto its stack as a node of level 0,
 * the nodes of a level paired into the next as they come. */
static mg_status push(det *d, counter *c, const float *g)
{
    int level = 0;
    if (c->kept && c->level[c->kept - 1] == 0) {
        over_ranges(c->r, c->nr, d->node[c->kept - 1], g, false);   /* left + right */
        level = 1;
        c->kept--;
    } else {
        over_ranges(c->r, c->nr, d->node[c->kept], g, true);
    }
    while (c->kept && c->level[c->kept - 1] == level) {   /* the left one waits below */
        over_ranges(c->r, c->nr, d->node[c->kept - 1], d->node[c->kept], false);
        c->kept--;
        level++;
    }
    if (c->kept >= d->depth) return mg_error(MG_EINVAL, "--deterministic: more shards than "
                                             "V/W in a step");
    c->level[c->kept++] = level;
    return MG_OK;
}

mg_status mg__det_push(void *c, const float *g)
{
    det *d = c;
    return push(d, &d->cn[0], g);
}

/* After a shard's backward (a pipeline chunk's): its gradient into the
 * tree; those ranges of the arena zeroed for the next shard. */
static mg_status det_micro_end(void *c)
{
    det *d = c;
    counter *k = &d->cn[d->pipe ? mg__pipe_current_chunk(d->pipe) : 0];
    float *g = d->host ? d->host : mg_model_grads(d->m);
    MG_TRY(d->err);
    MG_TRY(arena_copy(d, k->r, k->nr, g, true));
    MG_TRY(push(d, k, g));
    return zero_ranges(d, k->r, k->nr);
}

static mg_status unit_norms(det *d, const float *g);

/* After the shards: this rank's subtree root, the upper levels across the
 * ranks (rank r adds rank r + 2^k's node at level k), the root broadcast
 * and divided by W (exact), into the arena. */
static mg_status det_reduce(void *c)
{
    det *d = c;
    for (int i = 0; i < d->ncn; i++) {
        counter *k = &d->cn[i];
        if (k->kept != 1 || (1 << k->level[0]) != d->shards / d->world)
            return mg_error(MG_EINVAL, "--deterministic: a step of %d shard(s) where each rank "
                            "takes %d (the global batch is cut into %d)",
                            k->kept ? 1 << k->level[0] : 0, d->shards / d->world, d->shards);
        k->kept = 0;
    }
    float *root = d->node[0];   /* every counter's root: slot 0 */
    for (int k = 1; d->g && k < d->world; k <<= 1) {
        for (int i = 0; i < d->nr; i++) {
            size_t lo = d->r[i].lo, n = d->r[i].hi - lo;
            if (d->rank & k) MG_TRY(mg_send(d->g, root + lo, n, MG_F32, d->rank - k, TAG_NODE));
            else MG_TRY(mg_recv(d->g, d->peer + lo, n, MG_F32, d->rank + k, TAG_NODE));
        }
        if (d->rank & k) break;
        over_ranges(d->r, d->nr, root, d->peer, false);
    }
    for (int i = 0; i < d->nr; i++) {
        size_t lo = d->r[i].lo, n = d->r[i].hi - lo;
        if (d->g) MG_TRY(mg_broadcast(d->g, root + lo, n, MG_F32, 0));
        if (d->world > 1) mg_grad_scale(root + lo, n, 1.0f / (float)d->world);
    }
    MG_TRY(arena_copy(d, d->r, d->nr, root, false));
    const mg_step_options *so = mg_strategy_step_options(d->s);
    return so && so->clip_grad > 0 ? unit_norms(d, root) : MG_OK;   /* only clipping reads it */
}

/* The norm's square in one grouping for every plan: each unit's sum of
 * squares (a stage's units on its ranks, the others' added as zeros over
 * the pipeline: exact), then the units' in their order. */
static mg_status unit_norms(det *d, const float *g)
{
    memset(d->unit_ss, 0, (size_t)d->units * sizeof *d->unit_ss);
    for (int u = 0; u < d->units; u++) {
        size_t lo, hi;
        mg_model_unit_range(d->m, u, &lo, &hi);
        for (int i = 0; i < d->nr; i++)
            if (lo >= d->r[i].lo && hi <= d->r[i].hi) d->unit_ss[u] = mg_grad_sumsq(g + lo, hi - lo);
    }
    if (d->stages)
        MG_TRY(mg_all_reduce(d->stages, d->unit_ss, d->unit_ss, (size_t)d->units, MG_F64, MG_SUM));
    d->sumsq = 0;
    for (int u = 0; u < d->units; u++) d->sumsq += d->unit_ss[u];
    return MG_OK;
}

/* The mean's: the sum's scaled by a power of two squared, exactly. */
static double det_grad_sumsq(void *c, int micro)
{
    return ((det *)c)->sumsq / ((double)micro * micro);
}

static void det_memory(void *c, mg_memory_stats *ms)
{
    det *d = c;
    ms->grads += (size_t)(d->depth + (d->peer != NULL) + (d->host != NULL)) * d->n * sizeof(float);
}

const mg_component_ops mg__det_component = {
    .name = "det",
    .attach = det_attach,
    .destroy = det_destroy,
    .replicas_over = det_group,
    .batch_over = det_group,
    .zero_grad = det_zero_grad,
    .micro_end = det_micro_end,
    .reduce = det_reduce,
    .grad_sumsq = det_grad_sumsq,
    .memory = det_memory,
};
