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
 * over a data-parallel mesh; beside ZeRO-1 it sums the gradients in ZeRO's
 * place (ZeRO shards the optimizer and gathers the parameters). Clipping
 * takes the norm of the whole summed gradient every rank holds
 * (grad_sumsq), not the ranks' shares summed. Under a pipeline it sums
 * the stage's ranges, each micro-batch's as its backward ends (the
 * executor's after-backward hook), and the stage's replicas form the tree's
 * upper levels. Limits (this increment): not yet with ZeRO 2-3, the
 * interleaved schedule, a unit tied across stages, clipping over stages,
 * tensor parallelism or a parameter server (refused); the training figures are summed over
 * the ranks as DDP's are (their last bits may follow W; the parameters do
 * not); arena-sized buffers, at most log2(V/W) + 1, on each rank.
 * DataParallel threads (dp.c's deterministic driver) push their shards'
 * gradients in shard order (mg__det_push). */
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"

enum { TAG_NODE = 0x6474 };   /* "dt" */

typedef struct {
    mg_model *m;
    const mg_range *r;  /* the ranges it sums: a pipeline stage's, else the arena */
    int nr;
    mg_range whole;
    mg_group *g;        /* the data-parallel ranks (NULL: one process) */
    int rank, world, shards;   /* shards: V */
    size_t n;           /* arena floats */
    float **node;       /* the subtree's nodes kept, by slot */
    int *level;         /* each kept node's level (-1: free) */
    int depth;          /* slots: log2(V/W) + 1 */
    int kept;           /* nodes on the stack (slots 0 .. kept-1, levels decreasing) */
    float *peer;        /* a peer's node, across ranks */
    double sumsq;       /* of the step's summed gradient, over W */
    bool replaces;      /* in DDP's place (the figures, the copies); not beside ZeRO-1 */
} det;

static bool power_of_two(int v) { return v > 0 && !(v & (v - 1)); }

static void det_destroy(void *c)
{
    det *d = c;
    for (int i = 0; i < d->depth; i++) mg_free(d->node[i]);
    free(d->node);
    free(d->level);
    mg_free(d->peer);
    free(d);
}

static mg_status det_attach(mg_strategy *s, void **state)
{
    const mg_strategy_options *o = mg_strategy_options_of(s);
    if (!o->det_shards) return MG_OK;
    mg_mesh *mesh = mg_strategy_mesh(s);
    mg_pipe *pipe = mg_strategy_pipe(s);
    if (mesh && mg_mesh_size(mesh, MG_MESH_TP) > 1)
        return mg_error(MG_EUNSUPPORTED, "--deterministic: tensor parallelism is not yet built");
    if (pipe && o->kind == MG_STRATEGY_ZERO)
        return mg_error(MG_EUNSUPPORTED, "--deterministic: ZeRO over a pipeline's replicas is "
                        "not yet built");
    if (pipe && (mg__pipe_chunks(pipe) > 1 || mg__pipe_has_ties(pipe)))
        return mg_error(MG_EUNSUPPORTED, "--deterministic: a pipeline of one chunk a rank and "
                        "no tied units (lenet5's) is built; %s not yet",
                        mg__pipe_chunks(pipe) > 1 ? "the interleaved schedule's chunks are"
                                                  : "a unit tied across stages (gpt's head) is");
    int V = o->det_shards, W = mesh ? mg_mesh_size(mesh, MG_MESH_DP) : 1;
    if (!power_of_two(V) || V % W)
        return mg_error(MG_EINVAL, "--virtual-shards %d: give a power of two that %d rank(s) "
                        "divide (each rank takes V/W of them)", V, W);
    det *d = calloc(1, sizeof *d);
    if (!d) return mg_error(MG_ENOMEM, "--deterministic: out of memory");
    d->m = mg_strategy_model(s);
    d->g = mesh && W > 1 ? mg_mesh_group(mesh, MG_MESH_DP) : NULL;
    d->rank = d->g ? mg_group_rank(d->g) : 0;
    d->world = W;
    d->shards = V;
    d->n = mg_model_arena_size(d->m);
    d->replaces = o->kind != MG_STRATEGY_ZERO;
    d->whole = (mg_range){0, d->n};
    d->r = pipe ? mg__pipe_ranges(pipe, &d->nr) : &d->whole;
    if (!pipe) d->nr = 1;
    for (int v = V / W; v; v >>= 1) d->depth++;
    d->node = calloc((size_t)d->depth, sizeof *d->node);
    d->level = malloc((size_t)d->depth * sizeof *d->level);
    bool ok = d->node && d->level;
    for (int i = 0; ok && i < d->depth; i++) ok = (d->node[i] = mg_alloc(d->n * sizeof(float)));
    if (ok && d->g) ok = (d->peer = mg_alloc(d->n * sizeof(float)));
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

/* Its ranges of the gradient arena zeroed (a pipeline's other stages'
 * pages are given back: never touched). */
static void zero_ranges(det *d)
{
    float *g = mg_model_grads(d->m);
    for (int k = 0; k < d->nr; k++)
        memset(g + d->r[k].lo, 0, (d->r[k].hi - d->r[k].lo) * sizeof *g);
}

static void det_zero_grad(void *c)
{
    det *d = c;
    d->kept = 0;
    zero_ranges(d);
}

/* dst[r] += src[r] (copy: =) over the ranges. */
static void over_ranges(const det *d, float *dst, const float *src, bool copy)
{
    for (int k = 0; k < d->nr; k++) {
        size_t lo = d->r[k].lo, n = d->r[k].hi - lo;
        if (copy) memcpy(dst + lo, src + lo, n * sizeof *dst);
        else mg_add_into(dst + lo, src + lo, n);
    }
}

mg_status mg__det_push(void *c, const float *g)
{
    det *d = c;
    int level = 0;
    if (d->kept && d->level[d->kept - 1] == 0) {
        over_ranges(d, d->node[d->kept - 1], g, false);   /* left + right */
        level = 1;
        d->kept--;
    } else {
        over_ranges(d, d->node[d->kept], g, true);
    }
    while (d->kept && d->level[d->kept - 1] == level) {   /* the left one waits below */
        over_ranges(d, d->node[d->kept - 1], d->node[d->kept], false);
        d->kept--;
        level++;
    }
    if (d->kept >= d->depth) return mg_error(MG_EINVAL, "--deterministic: more shards than "
                                             "V/W in a step");
    d->level[d->kept++] = level;
    return MG_OK;
}

/* After a shard's backward: its gradient into the tree; the arena zeroed
 * for the next shard. */
static mg_status det_micro_end(void *c)
{
    det *d = c;
    MG_TRY(mg__det_push(d, mg_model_grads(d->m)));
    zero_ranges(d);
    return MG_OK;
}

/* After the shards: this rank's subtree root, the upper levels across the
 * ranks (rank r adds rank r + 2^k's node at level k), the root broadcast
 * and divided by W (exact), into the arena. */
static mg_status det_reduce(void *c)
{
    det *d = c;
    if (d->kept != 1 || (1 << d->level[0]) != d->shards / d->world)
        return mg_error(MG_EINVAL, "--deterministic: a step of %d shard(s) where each rank "
                        "takes %d (the global batch is cut into %d)", d->kept ? 1 << d->level[0]
                        : 0, d->shards / d->world, d->shards);
    float *root = d->node[0], *g = mg_model_grads(d->m);
    for (int k = 1; d->g && k < d->world; k <<= 1) {
        for (int i = 0; i < d->nr; i++) {
            size_t lo = d->r[i].lo, n = d->r[i].hi - lo;
            if (d->rank & k) MG_TRY(mg_send(d->g, root + lo, n, MG_F32, d->rank - k, TAG_NODE));
            else MG_TRY(mg_recv(d->g, d->peer + lo, n, MG_F32, d->rank + k, TAG_NODE));
        }
        if (d->rank & k) break;
        over_ranges(d, root, d->peer, false);
    }
    d->sumsq = 0;
    for (int i = 0; i < d->nr; i++) {
        size_t lo = d->r[i].lo, n = d->r[i].hi - lo;
        if (d->g) MG_TRY(mg_broadcast(d->g, root + lo, n, MG_F32, 0));
        memcpy(g + lo, root + lo, n * sizeof *g);
        if (d->world > 1) mg_grad_scale(g + lo, n, 1.0f / (float)d->world);
        d->sumsq += mg_grad_sumsq(g + lo, n);
    }
    d->kept = 0;
    return MG_OK;
}

/* The mean's: the sum's scaled by a power of two squared, exactly; a
 * pipeline stage holds only its part (-1: the strategy sums the parts). */
static double det_grad_sumsq(void *c, int micro)
{
    det *d = c;
    return d->r == &d->whole ? d->sumsq / ((double)micro * micro) : -1;
}

static void det_memory(void *c, mg_memory_stats *ms)
{
    det *d = c;
    ms->grads += (size_t)(d->depth + (d->peer != NULL)) * d->n * sizeof(float);
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
