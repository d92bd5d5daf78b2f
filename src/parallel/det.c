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
 * the tree's upper levels (rank r's node and rank r + 2^k's added at
 * level k, by recursive halving and doubling: each of the two adds one
 * half, upper_levels). Every sum in it adds the same two
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
 * shard's gradient copied to the host and the tree summed there. Under
 * tensor parallelism (and without it, so that the bits agree) the model
 * computes what a split cuts in fixed chunks (mg_model_set_fixed_sums,
 * --tp-chunks), and each tp rank's arena is summed over its replicas.
 * Clipping takes the norm in one grouping whatever the plan and tp size
 * (det_norm.c, grad_sumsq), not the ranks' shares summed. Under a pipeline it sums
 * the stage's ranges, each micro-batch's as its backward ends (the
 * executor's after-backward hook), and the stage's replicas form the tree's
 * upper levels; with chunks (the interleaved schedule) a counter for each
 * chunk's range, since its backwards interleave with the other chunks'.
 * A unit that borrows another's parameters (gpt's tied head): a pipeline
 * keeps the two contributions on two stages and adds the two sums after
 * (mg__pipe_sum_ties, here, before the norms), so every other plan keeps
 * the borrower's part apart too (the model's borrowed-gradient window),
 * sums it in a tree of its own and adds it to the lender's after both
 * trees: the same one addition everywhere.
 * A parameter server (--staleness 0): rank r of the job is worker r of W;
 * it sums its shards' subtree and leaves the root undivided in the arena
 * (the borrowed part's root apart, mg__det_tie_root), which it pushes;
 * each server adds the workers' roots in the upper levels, divides by W
 * and adds the two trees' sums (ps_server.c), and here takes the norm over
 * the servers' runs (each unit on one server).
 * Dropout (every random draw) is keyed by the global shard: shard k of a
 * step draws at the step's counter + k whichever rank runs it (each rank
 * starts at + its first shard; DataParallel threads pin theirs), and
 * every rank's counter ends the step at + V.
 * The figures are the same bits too (each shard's loss is, and the sums
 * of such floats in double are exact; evaluation is shared in whole
 * batches, mg_shard_blocks).
 * Limits: not with ZeRO-2/3's disk offload over the data-parallel group
 * (its gradient pieces in files; the optimizer's state alone there is
 * fine), nor a parameter server's staleness or --elastic (refused);
 * tensor parallelism on the CPU only; arena-sized buffers, at most
 * log2(V/W) + 2, on each rank.
 * DataParallel threads (dp.c's deterministic driver) push their shards'
 * gradients in shard order (mg__det_push). */
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"

enum { TAG_NODE = 0x6474, TAG_TIE = 0x6475 };   /* "dt", "du" */

/* A binary counter over some ranges: a pipeline chunk's (whose
 * micro-batches' backwards come in their order), all the rank sums, or
 * the borrowed gradients kept apart. Counters of disjoint arena ranges
 * share the node buffers. */
typedef struct {
    const mg_range *r;
    int nr;
    mg_range own[2];    /* a chunk's range (and the range its borrower reads) */
    float **node;       /* the nodes kept, by slot (in the counter's ranges) */
    int *level;         /* each kept node's level */
    int kept;           /* nodes on the stack (slots 0 .. kept-1, levels decreasing) */
} counter;

/* A tree's buffers: the nodes (depth slots) and a peer's node. */
typedef struct {
    float **node;
    float *peer;
} tree;

typedef struct {
    mg_strategy *s;
    mg_model *m;
    /* A parameter server's job (--parallel ps --staleness 0): a worker
     * keeps its shards' subtree and pushes its root (and the borrowed
     * part's apart); each server sums the workers' roots in the tree's
     * upper levels (ps_server.c) and, here, takes the norm over the
     * servers' runs. */
    bool to_servers;    /* a worker: the servers add the upper levels */
    bool server;        /* a server: only the norm */
    const mg_range *r;  /* the ranges it sums: a pipeline stage's, else the arena */
    int nr;
    mg_range whole;
    mg_pipe *pipe;      /* a pipeline (NULL: none) */
    bool chunked;       /* its chunks: a counter each */
    counter *cn;
    int ncn;
    mg_group *g;        /* the data-parallel ranks (NULL: one process) */
    mg__det_norm *norm; /* the clipping norm's grouping */
    int rank, world, shards;   /* shards: V */
    size_t n;           /* arena floats */
    int depth;          /* slots: log2(V/W) + 1 */
    tree t;             /* the gradients' (arena-sized) */
    mg_device dev;      /* the model's: on a device, the tree is summed on the host */
    float *host;        /* a device's gradient copied out (NULL on the CPU) */
    /* A borrowed unit's gradients (a tied head's) kept apart in one process
     * or a data-parallel group: the borrower's part in `part` (the model's
     * device), summed in a tree of its own and added to the lender's
     * after both trees, as a pipeline adds its stages' (the same bits). */
    mg_range tie;       /* the lender's arena range (empty: no tie kept apart) */
    float *part;        /* this shard's borrowed gradients (hi - lo floats) */
    counter tcn;
    tree tt;
    float *thost;       /* a device's part copied out */
    double sumsq;       /* of the step's summed gradient, over W */
    uint64_t base;      /* the dropout counter at the step's start */
    mg_status err;      /* zero_grad's, told at the next shard's end */
    bool replaces;      /* in DDP's place (the figures, the copies); not beside ZeRO */
} det;

static bool power_of_two(int v) { return v > 0 && !(v & (v - 1)); }

static void tree_free(det *d, tree *t)
{
    for (int i = 0; t->node && i < d->depth; i++) mg_free(t->node[i]);
    free(t->node);
    mg_free(t->peer);
}

static bool tree_alloc(det *d, tree *t, size_t n)
{
    t->node = calloc((size_t)d->depth, sizeof *t->node);
    bool ok = t->node != NULL;
    for (int i = 0; ok && i < d->depth; i++) ok = (t->node[i] = mg_alloc(n * sizeof(float)));
    if (ok && d->g) ok = (t->peer = mg_alloc(n * sizeof(float)));
    return ok;
}

static void det_destroy(void *c)
{
    det *d = c;
    if (d->part) mg_model_set_borrowed_grads(d->m, 0, 0, NULL);
    (void)mg_model_set_fixed_sums(d->m, 0);   /* the model as it was */
    tree_free(d, &d->t);
    tree_free(d, &d->tt);
    for (int i = 0; d->cn && i < d->ncn; i++) free(d->cn[i].level);
    free(d->cn);
    free(d->tcn.level);
    mg__det_norm_destroy(d->norm);
    mg_free(d->host);
    mg_free(d->thost);
    mg_device_free(d->dev, d->part);
    free(d);
}

/* The unit that borrows another's parameters (a tied head), or -1, and
 * the range it borrows (empty: none); two of them are refused (none in
 * the zoo). */
static mg_status find_borrower(mg_model *m, int *unit, mg_range *lent)
{
    *unit = -1;
    *lent = (mg_range){0, 0};
    for (int u = 0; u < mg_model_num_units(m); u++) {
        if (mg_model_unit(m, u).borrows < 0) continue;
        if (*unit >= 0)
            return mg_error(MG_EUNSUPPORTED, "--deterministic: %s has more than one unit that "
                            "borrows another's parameters; one (a tied head) is built",
                            mg_model_name(m));
        *unit = u;
        mg_model_unit_range(m, mg_model_unit(m, u).borrows, &lent->lo, &lent->hi);
    }
    return MG_OK;
}

mg_status mg__det_kept_apart(mg_model *m, mg_range *tie)
{
    int borrower;
    return find_borrower(m, &borrower, tie);
}

/* A parameter server's job: what --deterministic needs of it, and the
 * workers (W). */
static mg_status ps_check(const mg_strategy_options *o, int *W)
{
    if (o->ps_staleness)
        return mg_error(MG_EUNSUPPORTED, "--deterministic with --parallel ps needs --staleness 0: "
                        "a stale step's gradients are computed on whichever version of the "
                        "parameters the servers had when they answered, which timing decides");
    if (o->ps_elastic)
        return mg_error(MG_EUNSUPPORTED, "--deterministic gives one process's bits and --elastic "
                        "goes on without a lost worker's share of the batch: give one of them");
    *W = mg_group_size(o->group) - o->ps_servers;
    return MG_OK;
}

static mg_status det_attach(mg_strategy *s, void **state)
{
    const mg_strategy_options *o = mg_strategy_options_of(s);
    if (!o->det_shards) return MG_OK;
    mg_mesh *mesh = mg_strategy_mesh(s);
    mg_pipe *pipe = mg_strategy_pipe(s);
    /* The optimizer's state in files is the same steps; ZeRO-2/3's
     * gradient (and parameter) pieces in files are not the tree's. Over a
     * pipeline's replicas ZeRO keeps its shards in memory. */
    if (o->offload_dir && o->zero_stage >= 2 && !pipe)
        return mg_error(MG_EUNSUPPORTED, "--deterministic keeps the gradients whole in memory: "
                        "ZeRO-%d's --offload disk puts them in files and is not built with it; "
                        "give --zero 1 (the optimizer's state alone goes to the files) or leave "
                        "out one of them", o->zero_stage);
    bool ps = o->kind == MG_STRATEGY_PS;
    int V = o->det_shards, W = mesh ? mg_mesh_size(mesh, MG_MESH_DP) : 1, borrower;
    if (ps) MG_TRY(ps_check(o, &W));
    if (!power_of_two(V) || V % W)
        return mg_error(MG_EINVAL, "--virtual-shards %d: give a power of two that %d rank(s) "
                        "divide (each rank takes V/W of them)", V, W);
    mg_model *m = mg_strategy_model(s);
    mg_range lent;
    MG_TRY(find_borrower(m, &borrower, &lent));
    bool tp = mesh && mg_mesh_size(mesh, MG_MESH_TP) > 1;
    if (tp && !o->det_chunks)
        return mg_error(MG_EINVAL, "--deterministic under tensor parallelism needs fixed sums: "
                        "give --tp-chunks (mg_strategy_options.det_chunks)");
    /* Every product a tensor-parallel split cuts in fixed chunks, at any
     * tp size (1 too): the same bits as tp = C. On a device (where they
     * are not built) only without tp, so not at all. */
    MG_TRY(mg_model_set_fixed_sums(m, tp || mg_model_device(m).kind == MG_DEVICE_CPU
                                          ? o->det_chunks : 0));
    det *d = calloc(1, sizeof *d);
    if (!d) return mg_error(MG_ENOMEM, "--deterministic: out of memory");
    *state = d;
    d->s = s;
    d->m = m;
    d->n = mg_model_arena_size(m);
    d->dev = mg_model_device(m);
    mg_group *servers;
    const mg_range *run = ps ? mg__ps_server_run(s, &servers) : NULL;
    if (run) {   /* a server: the norm over the servers' runs, on the host */
        d->server = true;
        d->r = run;
        d->nr = 1;
        if (d->dev.kind != MG_DEVICE_CPU && !(d->host = mg_alloc(d->n * sizeof(float))))
            return mg_error(MG_ENOMEM, "--deterministic: out of memory for the gradients");
        return mg__det_norm_create(m, NULL, servers, run, 1, &d->norm);
    }
    d->to_servers = ps;   /* a worker: rank r of the job is worker r */
    d->g = !ps && mesh && W > 1 ? mg_mesh_group(mesh, MG_MESH_DP) : NULL;
    d->rank = ps ? mg_group_rank(o->group) : d->g ? mg_group_rank(d->g) : 0;
    d->world = W;
    d->shards = V;
    d->replaces = o->kind != MG_STRATEGY_ZERO;
    d->whole = (mg_range){0, d->n};
    d->r = pipe ? mg__pipe_ranges(pipe, &d->nr) : &d->whole;
    d->nr = pipe ? d->nr : 1;
    int nown = 1;
    const mg_range *own = pipe ? mg__pipe_own_ranges(pipe, &nown) : &d->whole;
    d->pipe = pipe;
    d->chunked = pipe && mg__pipe_chunks(pipe) > 1;
    d->ncn = d->chunked ? mg__pipe_chunks(pipe) : 1;
    for (int v = V / W; v; v >>= 1) d->depth++;
    d->cn = calloc((size_t)d->ncn, sizeof *d->cn);
    MG_TRY(mg__det_norm_create(m, tp ? mg_mesh_group(mesh, MG_MESH_TP) : NULL,
                               pipe ? mg_mesh_group(mesh, MG_MESH_PP) : NULL, own, nown,
                               &d->norm));
    bool ok = d->cn && tree_alloc(d, &d->t, d->n);
    /* A pipeline keeps a tie's two parts on two stages and adds them after
     * the trees (here, so that the norms see the sum); elsewhere the
     * borrower's part goes into `part`. */
    if (pipe && mg__pipe_has_ties(pipe)) mg__pipe_leave_ties(pipe);
    else if (lent.hi > lent.lo) d->tie = lent;
    for (int i = 0; ok && i < d->ncn; i++) {
        counter *c = &d->cn[i];
        c->node = d->t.node;
        if (d->chunked) {
            c->own[c->nr++] = mg__pipe_chunk_range(pipe, i);
            if (lent.hi > lent.lo && mg__pipe_chunk_of(pipe, borrower) == i)
                c->own[c->nr++] = lent;   /* its borrowed part */
            c->r = c->own;
        } else {
            c->r = d->r;
            c->nr = d->nr;
        }
        ok = (c->level = malloc((size_t)d->depth * sizeof *c->level));
    }
    size_t tn = d->tie.hi - d->tie.lo;
    if (ok && d->dev.kind != MG_DEVICE_CPU) ok = (d->host = mg_alloc(d->n * sizeof(float)));
    if (ok && tn) {
        d->tcn.own[0] = (mg_range){0, tn};
        d->tcn.r = d->tcn.own;
        d->tcn.nr = 1;
        ok = tree_alloc(d, &d->tt, tn) && (d->tcn.level = malloc((size_t)d->depth * sizeof(int))) &&
             (d->part = mg_device_alloc(d->dev, tn * sizeof(float))) &&
             (d->dev.kind == MG_DEVICE_CPU || (d->thost = mg_alloc(tn * sizeof(float))));
        d->tcn.node = d->tt.node;
        if (ok) mg_model_set_borrowed_grads(m, d->tie.lo, d->tie.hi, d->part);
    }
    return ok ? MG_OK
              : mg_error(MG_ENOMEM, "--deterministic: out of memory for %d gradient copies of "
                         "%zu floats", d->depth + (d->g != NULL), d->n);
}

/* In DDP's place: the replicas, over which the figures are summed; beside
 * ZeRO, ZeRO's group says it (its ranks keep their own pieces). */
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

/* The ranges r (nr) between device memory a and host memory h (the same
 * offsets): on the CPU, where h is a, nothing. */
static mg_status host_copy(det *d, const mg_range *r, int nr, float *a, float *h, bool to_host)
{
    mg_device cpu = {MG_DEVICE_CPU, 0};
    for (int k = 0; k < nr && h != a; k++) {
        size_t lo = r[k].lo, bytes = (r[k].hi - lo) * sizeof *a;
        MG_TRY(to_host ? mg_device_copy(cpu, h + lo, d->dev, a + lo, bytes)
                       : mg_device_copy(d->dev, a + lo, cpu, h + lo, bytes));
    }
    return MG_OK;
}

static void det_zero_grad(void *c)
{
    det *d = c;
    if (d->server) return;   /* its run's gradients are the pushes' sum (ps_server.c) */
    for (int i = 0; i < d->ncn; i++) d->cn[i].kept = 0;
    d->tcn.kept = 0;
    /* Dropout keyed by the shard: global shard k draws at base + k (a
     * forward moves the counter on by one), whoever runs it. */
    d->base = mg_model_rng_counter(d->m);
    mg_model_set_rng_counter(d->m, d->base + (uint64_t)(d->rank * (d->shards / d->world)));
    d->err = zero_ranges(d, d->r, d->nr);
    if (!d->err && d->part)
        d->err = mg_device_zero(d->dev, d->part, (d->tie.hi - d->tie.lo) * sizeof(float));
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
    float **node = c->node;
    if (c->kept && c->level[c->kept - 1] == 0) {
        over_ranges(c->r, c->nr, node[c->kept - 1], g, false);   /* left + right */
        level = 1;
        c->kept--;
    } else {
        over_ranges(c->r, c->nr, node[c->kept], g, true);
    }
    while (c->kept && c->level[c->kept - 1] == level) {   /* the left one waits below */
        over_ranges(c->r, c->nr, node[c->kept - 1], node[c->kept], false);
        c->kept--;
        level++;
    }
    if (c->kept >= d->depth) return mg_error(MG_EINVAL, "--deterministic: more shards than "
                                             "V/W in a step");
    c->level[c->kept++] = level;
    return MG_OK;
}

mg_status mg__det_push(void *c, const float *g, const float *part)
{
    det *d = c;
    MG_TRY(push(d, &d->cn[0], g));
    return d->part ? push(d, &d->tcn, part) : MG_OK;
}

mg_range mg__det_tie(const void *c) { return ((const det *)c)->tie; }

const float *mg__det_tie_root(const void *c)
{
    const det *d = c;
    return d->part ? d->tt.node[0] : NULL;
}

/* After a shard's backward (a pipeline chunk's): its gradient into the
 * tree (the borrowed part into its own); those ranges of the arena zeroed
 * for the next shard. */
static mg_status det_micro_end(void *c)
{
    det *d = c;
    MG_TRY(d->err);
    counter *k = &d->cn[d->chunked ? mg__pipe_current_chunk(d->pipe) : 0];
    float *a = mg_model_grads(d->m), *g = d->host ? d->host : a;
    MG_TRY(host_copy(d, k->r, k->nr, a, g, true));
    MG_TRY(push(d, k, g));
    if (d->part) {
        float *p = d->thost ? d->thost : d->part;
        MG_TRY(host_copy(d, d->tcn.r, 1, d->part, p, true));
        MG_TRY(push(d, &d->tcn, p));
        MG_TRY(mg_device_zero(d->dev, d->part, (d->tie.hi - d->tie.lo) * sizeof(float)));
    }
    return zero_ranges(d, k->r, k->nr);
}

/* The tree's upper levels over [lo, hi) of the ranks' roots (W a power
 * of two), by recursive halving and doubling in the tree's order: at
 * level k rank r and its partner r ^ 2^k each keep one half of the part
 * they share and add the other's copy of it (the tree's node r + node
 * r + 2^k; a + b is b + a, so both halves are the tree's bits); the part
 * each rank ends with is divided by W (exact) and the parts are gathered
 * back level by level. Each rank sends and adds about n floats, where a
 * reduce to rank 0 and its broadcast had rank 0 add log2(W) whole nodes
 * alone. */
static mg_status upper_levels(det *d, float *root, float *peer, size_t lo, size_t hi, int tag)
{
    size_t parent[32][2];   /* the part shared at each level */
    int level = 0;
    for (int b = 1; b < d->world; b <<= 1, level++) {
        size_t mid = lo + (hi - lo) / 2;
        bool upper = d->rank & b;
        parent[level][0] = lo;
        parent[level][1] = hi;
        size_t klo = upper ? mid : lo, khi = upper ? hi : mid, glo = upper ? lo : mid;
        MG_TRY(mg_sendrecv(d->g, root + glo, (upper ? mid : hi) - glo, d->rank ^ b, tag,
                           peer + klo, khi - klo, d->rank ^ b, tag, MG_F32));
        mg_add_into(root + klo, peer + klo, khi - klo);
        lo = klo;
        hi = khi;
    }
    mg_grad_scale(root + lo, hi - lo, 1.0f / (float)d->world);
    while (level--) {   /* this rank's part out, its partner's in */
        size_t plo = parent[level][0], phi = parent[level][1], mid = plo + (phi - plo) / 2;
        bool upper = d->rank & (1 << level);
        size_t olo = upper ? plo : mid, ohi = upper ? mid : phi;
        MG_TRY(mg_sendrecv(d->g, root + lo, hi - lo, d->rank ^ (1 << level), tag, root + olo,
                           ohi - olo, d->rank ^ (1 << level), tag, MG_F32));
        lo = plo;
        hi = phi;
    }
    return MG_OK;
}

/* A counter's root (slot 0) whole: checked, then the upper levels across
 * the ranks over ranges r (the root divided by W). */
static mg_status tree_root(det *d, counter *k, tree *t, const mg_range *r, int nr, int tag)
{
    if (k->kept != 1 || (1 << k->level[0]) != d->shards / d->world)
        return mg_error(MG_EINVAL, "--deterministic: a step of %d shard(s) where each rank "
                        "takes %d (the global batch is cut into %d)",
                        k->kept ? 1 << k->level[0] : 0, d->shards / d->world, d->shards);
    k->kept = 0;
    for (int i = 0; d->g && i < nr; i++)
        MG_TRY(upper_levels(d, t->node[0], t->peer, r[i].lo, r[i].hi, tag));
    return MG_OK;
}

/* After the shards: the trees' roots; the borrowed part added to the
 * lender's (a pipeline's stages add theirs: Σh + Σe either way), into the
 * arena. */
static mg_status det_reduce(void *c)
{
    det *d = c;
    const mg_step_options *so = mg_strategy_step_options(d->s);
    bool clip = so && so->clip_grad > 0;   /* only clipping reads the norm */
    if (d->server && clip) {   /* the workers' roots summed into its run (ps_server.c) */
        float *a = mg_model_grads(d->m), *g = d->host ? d->host : a;
        MG_TRY(host_copy(d, d->r, d->nr, a, g, true));
        return mg__det_norm_sumsq(d->norm, g, &d->sumsq);
    }
    if (d->server) return MG_OK;
    for (int i = 0; i < d->ncn; i++)   /* every counter's root is slot 0 (disjoint ranges) */
        MG_TRY(tree_root(d, &d->cn[i], &d->t, d->cn[i].r, d->cn[i].nr, TAG_NODE));
    float *root = d->t.node[0];
    if (d->part) MG_TRY(tree_root(d, &d->tcn, &d->tt, d->tcn.r, 1, TAG_TIE));
    if (d->part && !d->to_servers)   /* a worker pushes the two apart (mg__det_tie_root) */
        mg_add_into(root + d->tie.lo, d->tt.node[0], d->tie.hi - d->tie.lo);
    float *a = mg_model_grads(d->m);
    MG_TRY(host_copy(d, d->r, d->nr, a, root, false));
    mg_model_set_rng_counter(d->m, d->base + (uint64_t)d->shards);   /* the same at any W */
    if (d->to_servers) return MG_OK;   /* the servers take the norm */
    if (d->pipe && mg__pipe_has_ties(d->pipe)) {   /* the stages' parts added, read back */
        MG_TRY(mg__pipe_sum_ties(d->pipe));
        if (clip) MG_TRY(host_copy(d, d->r, d->nr, a, root, true));
    }
    return clip ? mg__det_norm_sumsq(d->norm, root, &d->sumsq) : MG_OK;
}

/* The mean's: the sum's scaled by a power of two squared, exactly. */
static double det_grad_sumsq(void *c, int micro)
{
    return ((det *)c)->sumsq / ((double)micro * micro);
}

static void det_memory(void *c, mg_memory_stats *ms)
{
    det *d = c;
    size_t tn = d->tie.hi - d->tie.lo;
    int copies = d->depth + (d->t.peer != NULL);
    ms->grads += ((size_t)(copies + (d->host != NULL)) * d->n +
                  (d->part ? (size_t)(copies + 1 + (d->thost != NULL)) * tn : 0)) * sizeof(float);
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
