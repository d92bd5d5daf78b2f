/* Strategies: an ordered list of components over one model (component.h):
 * making one, what each rank holds, checkpoints, evaluation and
 * generation, counters.
 *
 * A kind (--parallel, --zero, --mesh pp=P) names a list of components
 * (the table below), each after tensor parallelism (which drops itself
 * without tp > 1): none for one process; DataParallel threads; DDP;
 * ZeRO; a pipeline and, over its stages' replicas, DDP; the parameter
 * server's two roles. Under --deterministic the tree of det.c (and, for
 * threads, dp.c's shard driver) sums the gradients in DDP's or ZeRO-1's
 * place (a parameter server's workers their subtrees, its servers the
 * upper levels); each of those drops itself where it has nothing to do. The
 * caller may add its own after them. This file never asks which
 * component it holds: it calls their slots, and where every slot is
 * empty does what one process does.
 *
 * The training step is strategy_step.c's. Checkpoints are logical (names and full shapes, checkpoint.c), written
 * and read by every rank, each its own part, directly or through rank 0
 * (ckpt_io.c). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/strategy_internal.h"
#include "core/strbuf.h"

/* The kinds: a name, what a caller needs to know of it (mg_strategy_traits)
 * and the components it is made of, in order (each drops itself where the
 * mesh gives it nothing to do: the pipeline without pp, DDP over replicas
 * of one, ZeRO over the whole arena with a pipeline and ZeRO over a
 * pipeline's replicas without one). */
static const struct {
    const char *name;
    mg_strategy_kind kind;
    mg_strategy_traits traits;   /* ranks, threads, compresses */
    const mg_component_ops *parts[5];
} kinds[] = {
    {"none", MG_STRATEGY_SINGLE, {false, false, false},
     {&mg__tp_component, &mg__pipe_component, &mg__det_component}},
    {"dp", MG_STRATEGY_DP, {false, true, false},
     {&mg__tp_component, &mg__dp_component, &mg__det_component, &mg__dp_det_component}},
    {"ddp", MG_STRATEGY_DDP, {true, false, true},
     {&mg__tp_component, &mg__pipe_component, &mg__ddp_component, &mg__det_component}},
    {"zero", MG_STRATEGY_ZERO, {true, false, false},
     {&mg__tp_component, &mg__pipe_component, &mg__zero_component, &mg__zero_pipe_component,
      &mg__det_component}},
    {"pipeline", MG_STRATEGY_PIPELINE, {true, false, false},
     {&mg__tp_component, &mg__pipe_component, &mg__ddp_component, &mg__det_component}},
    {"ps", MG_STRATEGY_PS, {true, false, false},
     {&mg__ps_server_component, &mg__ps_worker_component, &mg__det_component}},
};
#define N_KINDS (int)(sizeof kinds / sizeof kinds[0])

mg_strategy_options mg_strategy_defaults(mg_strategy_kind kind)
{
    return (mg_strategy_options){.kind = kind, .max_batch = 1, .workers = 1,
                                 .ps_servers = kind == MG_STRATEGY_PS,   /* refused at 0 */
                                 .ddp = mg_ddp_defaults(), .det_chunks = 2,
                                 .offload_window = (size_t)mg_env_long("MG_OFFLOAD_WINDOW_MB", 1)
                                                   << 20};
}

mg_strategy_traits mg_strategy_kind_traits(mg_strategy_kind k)
{
    for (int i = 0; i < N_KINDS; i++)
        if (kinds[i].kind == k) return kinds[i].traits;
    return (mg_strategy_traits){false, false, false};
}

mg_status mg_strategy_parse(const char *s, mg_strategy_kind *out)
{
    if (!strcmp(s, "single")) s = "none";
    for (int k = 0; k < N_KINDS; k++)
        if (!strcmp(s, kinds[k].name)) {
            *out = kinds[k].kind;
            return MG_OK;
        }
    return mg_error(MG_EINVAL, "unknown strategy '%s': use none, dp, ddp, zero, pipeline or ps",
                    s);
}

/* ---- making and unmaking ------------------------------------------------- */

static mg_status add_part(mg_strategy *s, const mg_component_ops *ops)
{
    if (s->n == MG_MAX_COMPONENTS)
        return mg_error(MG_EINVAL, "strategy: more than %d components", MG_MAX_COMPONENTS);
    void *c = NULL;
    mg_status st = ops->attach(s, &c);
    if (c) s->part[s->n++] = (part){ops, c};
    return st;
}

static mg_status hold(mg_strategy *s, bool saving);
static const mg_range *param_ranges(const mg_strategy *s, int *n);
static mg_status find_own_ranges(mg_strategy *s);

/* The options every rank must give alike, as numbers, and their names. */
enum { N_ALIKE = 13 };
static const char *const alike_names[N_ALIKE] = {
    "kind", "zero_stage", "ps_servers", "ps_staleness", "ps_elastic", "det_shards",
    "det_chunks", "ddp.bucket_bytes", "ddp.first_bucket_bytes", "ddp.compress",
    "pipe.kind", "pipe.micro_batches", "pipe.chunks"};

/* Every rank of the job made the strategy with the same options (and
 * mesh): one all-gather, then every rank names the first difference from
 * rank 0. Ranks of other kinds waited out MG_TIMEOUT in collectives that
 * did not pair, then said something else (a probe: "ddp: cannot allocate
 * ... group memory"). */
static mg_status same_options(mg_strategy *s, const mg_strategy_options *o)
{
    typedef struct { int64_t v[N_ALIKE]; char mesh[48]; } alike;
    alike me = {{o->kind, o->zero_stage, o->ps_servers, o->ps_staleness, o->ps_elastic,
                 o->det_shards, o->det_chunks, (int64_t)o->ddp.bucket_bytes,
                 (int64_t)o->ddp.first_bucket_bytes, o->ddp.compress, o->pipe.kind,
                 o->pipe.micro_batches, o->pipe.chunks}, ""};
    snprintf(me.mesh, sizeof me.mesh, "%s", o->mesh ? o->mesh : "");
    alike *all = calloc((size_t)s->world, sizeof *all);
    if (!all) return mg_error(MG_ENOMEM, "strategy: out of memory");
    mg_status st = mg_all_gather(s->g, &me, all, sizeof me, MG_U8);
    for (int r = 1; !st && r < s->world; r++) {
        for (int k = 0; k < N_ALIKE && !st; k++)
            if (all[r].v[k] != all[0].v[k])
                st = mg_error(MG_EMISMATCH, "strategy: rank %d was made with %s %lld, rank 0 "
                              "with %lld: give every rank the same options", r, alike_names[k],
                              (long long)all[r].v[k], (long long)all[0].v[k]);
        if (!st && strcmp(all[r].mesh, all[0].mesh))
            st = mg_error(MG_EMISMATCH, "strategy: rank %d was made with mesh '%s', rank 0 with "
                          "'%s': give every rank the same options", r, all[r].mesh, all[0].mesh);
    }
    free(all);
    return st;
}

/* Rank 0's parameters, buffers and dropout counter on every rank: the
 * job's one broadcast of a state, at the start, before any component
 * narrows what a rank holds. */
static mg_status from_rank0(mg_strategy *s)
{
    mg_model *m = s->m;
    MG_TRY(mg_broadcast(s->g, mg_model_params(m), mg_model_arena_size(m), MG_F32, 0));
    if (mg_model_buffer_size(m))
        MG_TRY(mg_broadcast(s->g, mg_model_buffers(m), mg_model_buffer_size(m), MG_F32, 0));
    double c = (double)mg_model_rng_counter(m);
    MG_TRY(mg_broadcast(s->g, &c, 1, MG_F64, 0));
    mg_model_set_rng_counter(m, (uint64_t)c);
    return MG_OK;
}

/* A model without values, once the components have said what each rank
 * holds: its part drawn by counter from init_seed (no rank holds more,
 * and the bytes are one process's); offloaded pieces go to their files
 * (hold, release). */
static mg_status draw_values(mg_strategy *s)
{
    mg_status st = hold(s, true);
    int n;
    const mg_range *r = param_ranges(s, &n);
    if (!st) st = mg_model_init_ranges(s->m, s->o.init_seed, r, n);
    mg_status e = mg_strategy_release(s);
    return mg_strategy_agree(s, st ? st : e);
}

mg_status mg_strategy_create(mg_model *m, const mg_strategy_options *o, mg_strategy **out)
{
    *out = NULL;
    if (o->max_batch < 1)
        return mg_error(MG_EINVAL, "strategy: batch size %d must be positive", o->max_batch);
    if (o->offload_cpu && o->offload_dir)
        return mg_error(MG_EINVAL, "offload: give one of --offload cpu (the optimizer in host "
                        "memory) and --offload disk:DIR (in files)");
    if (mg_model_device(m).kind != MG_DEVICE_CPU && o->offload_dir)
        return mg_error(MG_EUNSUPPORTED, "offload to files (--offload disk:DIR) is built for a "
                        "model on the CPU; with a device give --offload cpu, which keeps the "
                        "optimizer's state in host memory");
    int k = 0;
    while (k < N_KINDS && kinds[k].kind != o->kind) k++;
    if (k == N_KINDS) return mg_error(MG_EINVAL, "strategy: unknown kind %d", (int)o->kind);
    bool fresh = !mg_model_has_values(m);
    mg_strategy *s = calloc(1, sizeof *s);
    if (!s) return mg_error(MG_ENOMEM, "strategy: out of memory");
    s->m = m;
    s->o = *o;
    s->g = o->group;
    s->rank = s->g ? mg_group_rank(s->g) : 0;
    s->world = s->g ? mg_group_size(s->g) : 1;
    s->offload_cpu = o->offload_cpu && mg_model_device(m).kind != MG_DEVICE_CPU;
    mg_status st = MG_OK;
    char spec[32];
    snprintf(spec, sizeof spec, "dp=%d", s->world);
    if (s->g) {
        st = same_options(s, o);
        if (!st) st = mg_mesh_create(s->g, o->mesh ? o->mesh : spec, &s->mesh);
    } else if (o->mesh && mg_mesh_parse(o->mesh, 1, (int[MG_MESH_DIMS]){0})) {   /* ignored */
        st = mg_error(MG_EINVAL, "strategy: a mesh without a group is one process's: %s (give "
                      "the job's group)", mg_last_error());
    }
    /* Every unit padded so that any range of whole units splits evenly
     * over the data-parallel ranks (the shards of DDP's and ZeRO's
     * buckets), once, before a component records ranges of the arena. */
    size_t pad = s->mesh ? mg_shard_pad(mg_mesh_size(s->mesh, MG_MESH_DP)) : 1;
    if (!st && mg_model_unit_pad(m) % pad) st = mg_model_set_unit_pad(m, pad);
    s->whole = (mg_range){0, mg_model_arena_size(m)};
    /* A model with values: rank 0's reach every rank before a component
     * keeps its part of them. */
    if (!st && !fresh && s->g) st = from_rank0(s);
    if (o->offload_dir && !(s->offload_dir = strdup(o->offload_dir)))
        st = mg_error(MG_ENOMEM, "strategy: out of memory");
    s->o.offload_dir = s->offload_dir;
    if (!s->o.offload_window)
        s->o.offload_window = mg_strategy_defaults(o->kind).offload_window;
    for (int i = 0; i < 5 && kinds[k].parts[i] && !st; i++) st = add_part(s, kinds[k].parts[i]);
    for (int i = 0; o->components && o->components[i] && !st; i++)
        st = add_part(s, o->components[i]);
    if (!st) st = find_own_ranges(s);
    s->model_tape = !FIRST(s, run_step) && !FIRST(s, run_micro);
    if (!st && s->model_tape) st = mg_model_reserve(m, o->max_batch);
    if (!st && fresh) st = draw_values(s);
    s->o.components = NULL;   /* the caller's, read at attach only */
    s->o.pipe.first = NULL;
    s->o.mesh = NULL;
    if (st) {
        mg_strategy_destroy(s);
        return st;
    }
    size_t len = 0;
    for (int i = 0; i < s->n; i++) {
        const part *p = &s->part[i];
        len = mg__catf(s->name, sizeof s->name, len, "%s%s", i ? "+" : "",
                       p->ops->label ? p->ops->label(p->c) : p->ops->name);
    }
    if (!s->n) snprintf(s->name, sizeof s->name, "single");
    *out = s;
    return MG_OK;
}

void mg_strategy_destroy(mg_strategy *s)
{
    if (!s) return;
    EACH_BACK(s, destroy) CALL(destroy);
    mg_mesh_destroy(s->mesh);
    free(s->offload_dir);
    size_t bytes = mg_model_arena_size(s->m) * sizeof(float);
    mg_unmap(s->host_p, bytes);
    mg_unmap(s->host_g, bytes);
    free(s->own);
    free(s);
}

const char *mg_strategy_name(const mg_strategy *s) { return s->name; }
mg_model *mg_strategy_model(const mg_strategy *s) { return s->m; }
const mg_strategy_options *mg_strategy_options_of(const mg_strategy *s) { return &s->o; }
mg_mesh *mg_strategy_mesh(const mg_strategy *s) { return s->mesh; }

void *mg_strategy_part(const mg_strategy *s, const mg_component_ops *ops)
{
    for (int i = 0; i < s->n; i++)
        if (s->part[i].ops == ops) return s->part[i].c;
    return NULL;
}

static void share(const mg_strategy *s, bool eval, int *rank, int *size)
{
    part *p = FIRST((mg_strategy *)s, data_share);
    if (p) {
        p->ops->data_share(p->c, eval, rank, size);
        return;
    }
    *rank = s->mesh ? mg_mesh_coord(s->mesh, MG_MESH_DP) : 0;
    *size = s->mesh ? mg_mesh_size(s->mesh, MG_MESH_DP) : 1;
}

void mg_strategy_data_share(const mg_strategy *s, int *rank, int *size)
{
    share(s, false, rank, size);
}

void mg_strategy_eval_share(const mg_strategy *s, int *rank, int *size)
{
    share(s, true, rank, size);
}

mg_group *mg_strategy_group(const mg_strategy *s) { return s->g; }

mg_status mg_strategy_settle(mg_strategy *s, mg_status done, bool *again)
{
    char why[1024] = "";   /* done's message, past the roll calls' own */
    if (done) snprintf(why, sizeof why, "%s", mg_last_error());
    *again = false;
    EACH(s, settle) {
        mg_group *job = NULL;
        bool redo = false;
        MG_TRY(CALL(settle, done != MG_OK, &redo, &job));
        if (job) {
            s->g = job;
            s->rank = mg_group_rank(job);
            s->world = mg_group_size(job);
        }
        *again = *again || redo;
    }
    return *again || !done ? MG_OK : mg_error(done, "%s", why);
}

mg_ddp *mg_strategy_ddp(const mg_strategy *s) { return mg_strategy_part(s, &mg__ddp_component); }
mg_zero *mg_strategy_zero(const mg_strategy *s) { return mg_strategy_part(s, &mg__zero_component); }
mg_pipe *mg_strategy_pipe(const mg_strategy *s) { return mg_strategy_part(s, &mg__pipe_component); }

/* The last component that narrows them decides, else the whole arena. */
const mg_range *mg_strategy_ranges(const mg_strategy *s, int *n)
{
    for (int i = s->n - 1; i >= 0; i--)
        if (s->part[i].ops->ranges) return s->part[i].ops->ranges(s->part[i].c, n);
    *n = 1;
    return &s->whole;
}

/* The parameters this rank holds between steps (component.h). */
static const mg_range *param_ranges(const mg_strategy *s, int *n)
{
    for (int i = s->n - 1; i >= 0; i--) {
        const part *p = &s->part[i];
        if (p->ops->param_ranges) {
            const mg_range *r = p->ops->param_ranges(p->c, n);
            if (r) return r;
        } else if (p->ops->ranges) {
            return p->ops->ranges(p->c, n);
        }
    }
    *n = 1;
    return &s->whole;
}

const mg_range *mg__strategy_own_ranges(const mg_strategy *s, int *n)
{
    *n = s->n_own;
    return s->own;
}

/* The ranges every component counts as this rank's (its own_ranges, else
 * its ranges): their intersection, e.g. a tp rank's split tensors within
 * a ZeRO rank's pieces of a pipeline stage. Ascending lists, so one merge
 * per component. */
static mg_status find_own_ranges(mg_strategy *s)
{
    s->own = malloc(sizeof *s->own);
    if (!s->own) return mg_error(MG_ENOMEM, "strategy: out of memory");
    s->own[0] = s->whole;
    s->n_own = 1;
    for (int i = 0; i < s->n; i++) {
        const part *p = &s->part[i];
        int nb;
        const mg_range *b = p->ops->own_ranges ? p->ops->own_ranges(p->c, &nb)
                          : p->ops->ranges ? p->ops->ranges(p->c, &nb) : NULL;
        if (!b) continue;
        mg_range *r = malloc(sizeof *r * (size_t)(s->n_own + nb + 1));
        if (!r) return mg_error(MG_ENOMEM, "strategy: out of memory");
        int n = mg__ranges_intersect(s->own, s->n_own, b, nb, r);
        free(s->own);
        s->own = r;
        s->n_own = n;
    }
    return MG_OK;
}

int mg__ranges_intersect(const mg_range *a, int na, const mg_range *b, int nb, mg_range *out)
{
    int n = 0;
    for (int x = 0, y = 0; x < na && y < nb;) {
        size_t lo = a[x].lo > b[y].lo ? a[x].lo : b[y].lo;
        size_t hi = a[x].hi < b[y].hi ? a[x].hi : b[y].hi;
        if (lo < hi) out[n++] = (mg_range){lo, hi};
        if (a[x].hi < b[y].hi) x++;
        else y++;
    }
    return n;
}

mg_status mg_strategy_optim(mg_strategy *s, const mg_optim_config *cfg, mg_optim **out)
{
    int n;
    const mg_range *r = mg_strategy_ranges(s, &n);
    MG_TRY(mg_optim_create_ranges(cfg, r, n, out));
    mg_scratch *ps = NULL, *gs = NULL;
    EACH(s, offload) CALL(offload, &ps, &gs);
    mg_status st = MG_OK;
    if (s->offload_dir) {
        st = mg_optim_offload(*out, s->offload_dir, s->o.offload_window, ps, gs);
        if (!st)
            mg_debug("rank %d: the optimizer's state of %d range(s)%s in files in %s", s->rank,
                     n, ps ? ", and the parameter pieces," : "", s->offload_dir);
    } else if (s->offload_cpu) {   /* the optimizer stays on the host */
        size_t bytes = mg_model_arena_size(s->m) * sizeof(float);
        if (!s->host_p) s->host_p = mg_map_zero(bytes);
        if (!s->host_g) s->host_g = mg_map_zero(bytes);
        if (!s->host_p || !s->host_g)
            st = mg_error(MG_ENOMEM, "--offload cpu: cannot map %zu bytes of host memory", bytes);
    } else {
        st = mg_optim_to_device(*out, mg_model_device(s->m));
    }
    st = mg_strategy_agree(s, st);
    if (st) {
        mg_optim_destroy(*out);
        *out = NULL;
    }
    return st;
}

/* The innermost sharding is undone first (ZeRO's pieces of a stage's
 * ranges, before the pipeline shares its stages) and made again last. */
mg_status mg_strategy_gather(mg_strategy *s)
{
    EACH_BACK(s, gather) MG_TRY(CALL(gather));
    return MG_OK;
}

mg_status mg_strategy_release(mg_strategy *s)
{
    mg_status st = MG_OK;
    EACH(s, release) {
        mg_status e = CALL(release);
        if (!st) st = e;
    }
    return st;
}

mg_status mg_strategy_sum(mg_strategy *s, double *v, int n)
{
    EACH(s, batch_over) {
        mg_group *g = CALL(batch_over);
        if (g) MG_TRY(mg_all_reduce(g, v, v, (size_t)n, MG_F64, MG_SUM));
    }
    return MG_OK;
}

mg_status mg_strategy_agree(mg_strategy *s, mg_status st)
{
    return mg_group_agree(s->g, st, MG_AGREE_SHARE);
}

/* Every component's own ranges in the arena (and, saving, what else a
 * checkpoint needs), agreed over the job. */
static mg_status hold(mg_strategy *s, bool saving)
{
    mg_status st = MG_OK;
    EACH(s, hold) if (!st) st = CALL(hold, saving);
    return mg_strategy_agree(s, st);
}

/* Does this rank write its own ranges? Only the first of each set of
 * copies. */
static bool writes_its_ranges(mg_strategy *s)
{
    EACH(s, replicas_over) {
        mg_group *g = CALL(replicas_over);
        if (g && mg_group_rank(g) != 0) return false;
    }
    return s->rank == 0 || FIRST(s, shards_over);
}

/* The file (ckpt_io.c) takes each rank's own ranges (one copy of each);
 * rank 0 writes the buffers. Every rank lays the file out alike (the
 * header's numbers place each tensor), so the numbers that can differ
 * between ranks are agreed first:
 *   - the optimizer's steps (an asynchronous parameter server counts its
 *     pushes, and its servers can differ by the pushes of a worker lost
 *     amid them; its workers count one per step);
 *   - the dropout stream's position, which a rank that runs no forward
 *     pass (a parameter server) takes from the others, as it would from
 *     the file on resume;
 *   - without meta, the step: the optimizer's, the fewest any rank took
 *     (a worker's, one per step; with meta, every rank's is the same). */
static mg_status save_on_host(mg_strategy *s, const char *path, mg_optim *o,
                              const mg_ckpt_meta *meta)
{
    if (!s->g) return mg_checkpoint_save(path, s->m, o, meta);
    mg_ckpt_meta agreed = meta ? *meta : (mg_ckpt_meta){.step = o ? mg_optim_steps(o) : 0};
    /* The most of each: the optimizer's steps, the position, the step
     * negated (its fewest). */
    int64_t most[3] = {!o ? 0 : agreed.optimizer_steps ? agreed.optimizer_steps
                                                        : mg_optim_steps(o),
                       (int64_t)mg_model_rng_counter(s->m), -(int64_t)agreed.step};
    MG_TRY(mg_all_reduce(s->g, most, most, 3, MG_I64, MG_MAX));
    agreed.optimizer_steps = (long)most[0];
    mg_model_set_rng_counter(s->m, (uint64_t)most[1]);
    agreed.step = (long)-most[2];   /* without meta, the fewest steps (a server's are pushes) */
    MG_TRY(hold(s, true));
    int nr = 0;
    const mg_range *r = writes_its_ranges(s) ? mg__strategy_own_ranges(s, &nr) : NULL;
    mg_ckpt_writer *w;
    mg_status st = mg_strategy_agree(s, mg_ckpt_writer_create(s->m, o, &agreed, &w));
    int64_t size[2] = {0, 0};   /* the layout's size, and its negation: the same on every rank */
    if (!st) size[0] = (int64_t)mg_ckpt_writer_size(w), size[1] = -size[0];
    if (!st) st = mg_all_reduce(s->g, size, size, 2, MG_I64, MG_MAX);
    if (!st && size[0] != -size[1])
        st = mg_error(MG_EMISMATCH, "checkpoint %s: the ranks laid the file out differently "
                      "(%lld to %lld bytes): their header's numbers differ", path,
                      (long long)-size[1], (long long)size[0]);
    if (!st) st = mg__ckpt_save(s->g, w, path, r, nr, s->rank == 0);
    mg_ckpt_writer_destroy(w);
    mg_status e = mg_strategy_agree(s, mg_strategy_release(s));
    return st ? st : e;
}

/* What a rank reads of a file: its part (the parameters it holds, its
 * optimizer ranges) of a checkpoint, or of weights (--init). */
typedef struct {
    mg_model *m;
    mg_optim *o;
    const mg_range *r;
    int nr;
    mg_ckpt_meta *meta;
    const char *prefix;   /* weights */
    int *left;
} part_reader;

static mg_status read_checkpoint(const mg_st_file *f, const char *path, void *ud)
{
    part_reader *p = ud;
    return mg_checkpoint_load_st(f, path, p->m, p->o, p->r, p->nr, p->meta);
}

static mg_status read_weights(const mg_st_file *f, const char *path, void *ud)
{
    part_reader *p = ud;
    return mg_model_load_weights_st(f, path, p->m, p->prefix, p->r, p->nr, p->left);
}

/* Every rank reads its part: the file is logical, so any world size and
 * stage reads it, and no rank touches more of the model than it holds. */
static mg_status load_part(mg_strategy *s, const char *path, mg__ckpt_reader read,
                           part_reader *p)
{
    mg_status st = hold(s, false);
    p->m = s->m;
    p->r = param_ranges(s, &p->nr);
    if (!st) st = s->g ? mg__ckpt_load(s->g, path, read, p) : MG_OK;
    if (!st && !s->g) {   /* one process: the whole file is its part */
        mg_st_file *f;
        st = mg_st_open_on_disk(path, &f);
        if (!st) st = read(f, path, p);
        mg_st_close(f);
    }
    mg_status e = mg_strategy_agree(s, mg_strategy_release(s));
    return st ? st : e;
}

static mg_status load_on_host(mg_strategy *s, const char *path, mg_optim *o,
                              mg_ckpt_meta *meta)
{
    return load_part(s, path, read_checkpoint, &(part_reader){.o = o, .meta = meta});
}

mg_status mg_strategy_load_weights(mg_strategy *s, const char *path, const char *prefix,
                                   int *n_left_out)
{
    if (n_left_out) *n_left_out = 0;
    return load_part(s, path, read_weights, &(part_reader){.prefix = prefix, .left = n_left_out});
}

/* Checkpoints are written from and read into host memory: a model on a
 * device goes there with its optimizer for the file, and each comes back
 * to where it was (an optimizer offloaded to the host stays there). */
mg_status mg_strategy_save(mg_strategy *s, const char *path, mg_optim *o,
                           const mg_ckpt_meta *meta)
{
    mg_device was[2];
    MG_TRY(mg_ckpt_host_begin(s->m, o, was));
    return mg_ckpt_host_end(s->m, o, was, save_on_host(s, path, o, meta));
}

mg_status mg_strategy_load(mg_strategy *s, const char *path, mg_optim *o, mg_ckpt_meta *meta)
{
    mg_device was[2];
    MG_TRY(mg_ckpt_host_begin(s->m, o, was));
    return mg_ckpt_host_end(s->m, o, was, load_on_host(s, path, o, meta));
}

/* ---- evaluation and generation ------------------------------------------ */

mg_status mg__strategy_forward_failed(mg_model *m)
{
    mg_status st = mg_model_tp_failure(m);
    return st ? st : MG_ENOMEM;
}

mg_status mg__strategy_forwards(mg_strategy *s, mg_batch_source next, void *ud,
                                mg_step_result *r)
{
    mg_micro_batch b;
    while (mg__next_micro(next, ud, &b)) {
        MG_TRY(mg__micro_check("mg_strategy_evaluate", &b, s->m));
        int c = 0;
        if (!mg_model_forward(s->m, (const float *)b.x, b.n)) return mg__strategy_forward_failed(s->m);
        r->loss_sum += (double)mg_model_loss(s->m, b.y, &c) * b.n;
        r->micro++;
        r->correct += c;
        r->samples += b.n;
    }
    return MG_OK;
}

mg_status mg__strategy_refused(mg_strategy *s, mg_status st)
{
    mg_group *g = mg_strategy_group(s);
    if (st != MG_EINVAL || !g || mg_group_size(g) < 2) return st;
    char why[1024];
    snprintf(why, sizeof why, "%s", mg_last_error());
    mg_group_revoke(g, why);
    /* and the mesh's, which the components' collectives run on */
    for (int d = 0; s->mesh && d < MG_MESH_DIMS; d++) {
        mg_group *sub = mg_mesh_group(s->mesh, (mg_mesh_dim)d);
        if (sub && sub != g && mg_group_size(sub) > 1) mg_group_revoke(sub, why);
    }
    return mg_error(st, "%s", why);
}

mg_status mg_strategy_evaluate(mg_strategy *s, mg_batch_source next, void *ud,
                               mg_step_result *r)
{
    memset(r, 0, sizeof *r);
    mg_model *m = s->m;
    bool training = mg_model_training(m);
    mg_model_set_training(m, false);
    /* A component that evaluates runs each rank's part (the others hold
     * theirs for it); otherwise every rank runs the whole model. */
    part *p = FIRST(s, evaluate);
    mg_status st = p ? hold(s, false) : mg_strategy_gather(s);
    if (p && !st) st = p->ops->evaluate(p->c, next, ud, r);
    if (!p && !st) st = mg__strategy_forwards(s, next, ud, r);
    mg_model_set_training(m, training);
    mg_status e = mg_strategy_release(s);
    return mg__strategy_refused(s, st ? st : e);
}

mg_status mg_strategy_generate(mg_strategy *s, const int32_t *prompt, int n_prompt, int n,
                               float temperature, int top_k, uint64_t seed, int32_t *out)
{
    part *p = FIRST(s, generate);
    MG_TRY(p ? hold(s, false) : mg_strategy_gather(s));
    mg_status st = p ? p->ops->generate(p->c, prompt, n_prompt, n, temperature, top_k, seed, out)
                     : mg_model_generate(s->m, prompt, n_prompt, n, temperature, top_k, seed, out);
    mg_status e = mg_strategy_release(s);
    return st ? st : e;
}

/* ---- counters -------------------------------------------------------------- */

mg_memory_stats mg_strategy_memory(mg_strategy *s, const mg_optim *o)
{
    size_t arena = mg_model_arena_size(s->m) * sizeof(float);
    mg_memory_stats r = {.params = arena, .grads = arena};
    if (o) r.optim = mg_optim_bytes(o);
    mg_tape *t = s->model_tape ? mg_model_tape(s->m) : NULL;
    r.activations = t ? mg_tape_bytes(t) : 0;
    EACH(s, memory) CALL(memory, &r);
    return r;
}

mg_traffic mg_strategy_traffic(const mg_strategy *s)
{
    mg_traffic t = s->g ? mg_group_traffic(s->g) : (mg_traffic){0, 0};
    for (int d = 0; d < MG_MESH_DIMS && s->mesh; d++) {
        mg_traffic u = mg_group_traffic(mg_mesh_group(s->mesh, (mg_mesh_dim)d));
        t.sent += u.sent;
        t.received += u.received;
    }
    return t;
}
