/* The planner's search (planner.h): every plan of a job on a cluster —
 * the meshes dp x pp x tp of the world, ZeRO 0-3, the pipeline schedules
 * with their micro-batch counts (or accumulation without a pipeline),
 * recomputation and sequence parallelism, and offload to files for those
 * that do not fit without it — its memory per rank
 * (plan_memory.c) and time per step (plan_time.c), ranked; why the first
 * is the one; its mgtrain flags; this machine's rates.
 *
 * The search tries micro-batch counts of 1, 2, 4 and 8 per pipeline stage
 * (or accumulation steps) and those that give a rank 1, 2, 4 or 8
 * samples a micro-batch, tp up to the model's heads (or its split
 * layer's width), pp up to its units, interleaving with 2 chunks. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/planner_internal.h"
#include "core/strbuf.h"

mg_status mg_plan_job_defaults(const char *model, mg_plan_job *out)
{
    mg_zoo_defaults z;
    MG_NEED("mg_plan_job_defaults", model);
    MG_TRY(mg_zoo_defaults_of(model, &z));
    *out = (mg_plan_job){.model = model, .gpt = mg_gpt_defaults(), .batch = z.batch,
                         .optimizer = z.optimizer, .momentum = z.momentum, .bucket_mb = 25,
                         .evaluates = z.language_model, .zero = -1, .schedule = -1,
                         .offload_window = mg_strategy_defaults(MG_STRATEGY_DDP).offload_window};
    return MG_OK;
}

/* ---- one plan ---------------------------------------------------------------- */

/* Its figures on shape s (its model): the memory of every pipeline rank
 * (the largest kept), the time. */
static mg_status cost(const mg_plan_job *job, const mg_plan_cluster *cl,
                      const mg__plan_shape *s, mg_plan *p)
{
    int S = p->pp * p->chunks;
    int *first = malloc(sizeof *first * ((size_t)S + 1));
    size_t *floats = malloc(sizeof *floats * (size_t)p->pp);
    mg_status st = first && floats ? mg__plan_cut(s, p, first)
                                   : mg_error(MG_ENOMEM, "planner: out of memory");
    p->bytes = 0;
    for (int r = 0; r < p->pp && !st; r++) {
        mg_memory_stats ms;
        st = mg__plan_memory(job, p, s, first, r, &ms);
        size_t all = ms.params + ms.grads + ms.optim + ms.activations;
        floats[r] = p->pp > 1 ? ms.params / sizeof(float) : mg_model_arena_size(s->m);
        if (!st && all > p->bytes) {
            p->bytes = all;
            p->memory = ms;
        }
    }
    if (!st) st = mg__plan_time(job, cl, s, first, floats, p);
    p->fits = cl->memory <= 0 || (double)p->bytes <= cl->memory;
    free(first);
    free(floats);
    return st;
}

mg_status mg_plan_rank_memory(const mg_plan_job *job, const mg_plan *p, int rank,
                              mg_memory_stats *out)
{
    int world = p->dp * p->pp * p->tp;
    if (rank < 0 || rank >= world)
        return mg_error(MG_EINVAL, "planner: rank %d of a plan of %d ranks: give 0 to %d", rank,
                        world, world - 1);
    mg__plan_shape s;
    MG_TRY(mg__plan_shape_make(job, p, rank % p->tp, &s));
    int *first = malloc(sizeof *first * ((size_t)(p->pp * p->chunks) + 1));
    mg_status st = first ? mg__plan_cut(&s, p, first)
                         : mg_error(MG_ENOMEM, "planner: out of memory");
    if (!st) st = mg__plan_memory(job, p, &s, first, rank / (p->tp * p->dp), out);
    free(first);
    mg__plan_shape_free(&s);
    return st;
}

/* ---- the search ------------------------------------------------------------- */

typedef struct {
    mg_plan *all;
    int n, cap;
} list;

static mg_status add(list *l, const mg_plan *p)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        mg_plan *a = realloc(l->all, sizeof *a * (size_t)cap);
        if (!a) return mg_error(MG_ENOMEM, "planner: out of memory");
        l->all = a;
        l->cap = cap;
    }
    l->all[l->n++] = *p;
    return MG_OK;
}

static bool is_gpt(const mg_plan_job *job) { return !strcmp(job->model, "gpt-mini"); }

static bool offloads(const mg_plan_job *job, const mg_plan_cluster *cl)
{
    return !job->no_offload && cl->disk_bytes_per_s > 0;
}

/* Those that fit by time, the others by bytes. Times within the same 1%
 * are one (the model is no finer): the simpler plan first (no offload, a
 * lower ZeRO stage, no recomputation, fewer micro-batches, no sequence
 * parallelism, less tp, fewer stages), then the smaller. */
static long bucket(double t) { return t > 0 ? lround(floor(log(t) / log(1.01))) : LONG_MIN; }

static int cmp_plans(const void *a, const void *b)
{
    const mg_plan *x = a, *y = b;
    if (x->fits != y->fits) return x->fits ? -1 : 1;
    if (!x->fits) return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
    long u = bucket(x->step), v = bucket(y->step);
    if (u != v) return u < v ? -1 : 1;
    int d[] = {x->offload - y->offload, x->zero - y->zero, x->recompute - y->recompute,
               x->micro - y->micro, x->sequence_parallel - y->sequence_parallel,
               x->tp - y->tp, x->pp - y->pp, (int)x->schedule - (int)y->schedule};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        if (d[i]) return d[i];
    return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

/* The pipeline schedules and micro-batch counts of a mesh, or the
 * accumulation steps without a pipeline, on its shape. */
static mg_status micro_batches(const mg_plan_job *job, const mg_plan_cluster *cl,
                               const mg__plan_shape *s, mg_plan p, list *out)
{
    int units = s->n;
    static const mg_pipe_kind kinds[] = {MG_PIPE_GPIPE, MG_PIPE_1F1B, MG_PIPE_INTERLEAVED};
    int nk = p.pp > 1 ? 3 : 1;
    for (int k = 0; k < nk; k++) {
        p.schedule = p.pp > 1 ? kinds[k] : MG_PIPE_1F1B;
        p.chunks = p.schedule == MG_PIPE_INTERLEAVED ? 2 : 1;
        if (p.pp * p.chunks > units) continue;
        if (job->schedule >= 0 && p.pp > 1 && (int)p.schedule != job->schedule) continue;
        /* 1, 2, 4 or 8 micro-batches a stage, and those that give a rank
         * 1, 2, 4 or 8 samples (Megatron's micro-batch size). */
        int m[8], nm = 0;
        for (int f = 1; f <= 8; f *= 2) {
            m[nm++] = f * p.pp;
            m[nm++] = job->batch % (p.dp * f) ? 0 : job->batch / (p.dp * f);
        }
        for (int i = 0; i < nm; i++) {
            bool again = false;
            for (int j = 0; j < i; j++) again |= m[j] == m[i];
            p.micro = m[i];
            if (again || p.micro < 1 || job->batch % p.micro || (job->batch / p.micro) % p.dp)
                continue;
            if (p.pp > 1 && mg_pipe_check(p.schedule, p.pp, p.micro, p.chunks)) continue;
            p.local = job->batch / p.micro / p.dp;
            p.offload = false;
            MG_TRY(cost(job, cl, s, &p));
            MG_TRY(add(out, &p));
            /* Offload only adds time: tried where nothing else fits
             * (not with sequence parallelism, which keeps its partial
             * gradients in the arena: the trainer refuses the pair). */
            if (!p.fits && offloads(job, cl) && !p.sequence_parallel) {
                p.offload = true;
                MG_TRY(cost(job, cl, s, &p));
                MG_TRY(add(out, &p));
            }
        }
    }
    return MG_OK;
}

static mg_status check_inputs(const mg_plan_job *job, const mg_plan_cluster *cl)
{
    if (!job->model || (!is_gpt(job) && mg_zoo_defaults_of(job->model, &(mg_zoo_defaults){0})))
        return mg_error(MG_EINVAL, "unknown model '%s': give one of the zoo's (mgtrain --help "
                        "lists them)", job->model ? job->model : "(none)");
    if (job->batch < 1)
        return mg_error(MG_EINVAL, "batch %d: give the samples of a step, at least 1", job->batch);
    if (cl->ranks_per_node < 1 || cl->nodes < 1)
        return mg_error(MG_EINVAL, "%d ranks per node on %d nodes: give at least one of each",
                        cl->ranks_per_node, cl->nodes);
    if (!(cl->memory >= 0) || cl->memory == INFINITY || !(cl->overlap >= 0 && cl->overlap <= 1))
        return mg_error(MG_EINVAL, "a rank's memory %g bytes, overlap %g: give memory of 0 (no "
                        "limit) or more, and an overlap from 0 to 1", cl->memory, cl->overlap);
    if (!(cl->flops > 0) || !(cl->bytes_per_s > 0))
        return mg_error(MG_EINVAL, "the planner needs a rank's FLOP/s and optimizer bytes/s "
                        "(measure them with mg_plan_measure, or give them)");
    const mg_link *l[2] = {&cl->intra, &cl->inter};
    for (int i = 0; i < 2; i++)
        if (!(l[i]->bandwidth > 0) || !(l[i]->reduce > 0) || l[i]->latency < 0)
            return mg_error(MG_EINVAL, "the %s link needs a positive bandwidth and a latency of "
                            "0 or more", i ? "between-node" : "within-node");
    return MG_OK;
}

mg_status mg_plan_search(const mg_plan_job *job, const mg_plan_cluster *cl, mg_plan **out,
                         int *n)
{
    *out = NULL;
    *n = 0;
    MG_TRY(check_inputs(job, cl));
    int world = cl->ranks_per_node * cl->nodes;
    list l = {0};
    mg_status st = MG_OK;
    int units = 0;   /* of a pipeline that asked for more stages than units (0: none) */
    for (int tp = 1; tp <= world && !st; tp++) {
        if (world % tp || (tp > 1 && job->no_tp) || (job->tp && tp != job->tp)) continue;
        for (int seq = 0; seq <= (tp > 1 && is_gpt(job) && !job->no_sequence_parallel) && !st;
             seq++)
            for (int pp = 1; pp <= world / tp && !st; pp++) {
                int dp = world / tp / pp;
                if ((world / tp) % pp || (pp > 1 && job->no_pipeline) || (job->pp && pp != job->pp) ||
                    (job->dp && dp != job->dp))
                    continue;
                /* The model of this tp, sp, dp and recomputation, once for
                 * every ZeRO stage, schedule and micro-batch count; a tp the
                 * model does not split over has none. */
                for (int rc = 0; rc <= !job->no_recompute && !st; rc++) {
                    mg_plan p = {.dp = dp, .pp = pp, .tp = tp, .recompute = rc,
                                 .sequence_parallel = seq};
                    mg__plan_shape s;
                    if (mg__plan_shape_make(job, &p, 0, &s)) {
                        /* The whole model, or the tp asked for: its
                         * message names why (a probe found tp=3 of 4
                         * heads blamed on the batch). */
                        if (tp == 1 || job->tp == tp) st = MG_EINVAL;
                        break;
                    }
                    if (pp > s.n) units = s.n;
                    for (p.zero = 0; p.zero <= (dp > 1 && !job->no_zero ? 3 : 0) && !st; p.zero++)
                        if (pp <= s.n && (job->zero < 0 || p.zero == job->zero))
                            st = micro_batches(job, cl, &s, p, &l);
                    mg__plan_shape_free(&s);
                }
            }
    }
    if (!st && !l.n && units && job->pp)
        st = mg_error(MG_EINVAL, "pp=%d: %s has %d units, and a pipeline's stage is at least "
                      "one: give pp=%d or fewer", job->pp, job->model, units, units);
    else if (!st && !l.n)
        st = mg_error(MG_EINVAL, "no plan of %d ranks%s takes the batch of %d: give a batch "
                      "that a data-parallel size divides (a multiple of %d runs every mesh)%s",
                      world, job->dp || job->pp || job->tp || job->zero >= 0 ? " as asked" : "",
                      job->batch, world, job->dp || job->pp || job->tp || job->zero >= 0
                      ? ", or ask for less (--mesh, --zero, --pp-schedule)" : "");
    if (st) {
        free(l.all);
        return st;
    }
    qsort(l.all, (size_t)l.n, sizeof *l.all, cmp_plans);
    *out = l.all;
    *n = l.n;
    return MG_OK;
}

/* ---- what to tell the user --------------------------------------------------- */

bool mg_plan_is_plain(const mg_plan *p)
{
    return p->tp == 1 && p->pp == 1 && !p->zero && !p->recompute && !p->offload;
}

void mg_plan_describe(const mg_plan *p, char *buf, size_t cap)
{
    size_t len = mg__catf(buf, cap, 0, "dp=%d,pp=%d,tp=%d", p->dp, p->pp, p->tp);
    if (p->zero) len = mg__catf(buf, cap, len, " zero%d", p->zero);
    else if (p->dp > 1) len = mg__catf(buf, cap, len, " ddp");
    if (p->pp > 1)
        len = mg__catf(buf, cap, len, " %s M=%d", mg_pipe_name(p->schedule),
                       p->micro);
    else if (p->micro > 1)
        len = mg__catf(buf, cap, len, " accumulate %d", p->micro);
    if (p->recompute) len = mg__catf(buf, cap, len, " recompute");
    if (p->sequence_parallel) len = mg__catf(buf, cap, len, " sp");
    if (p->offload) mg__catf(buf, cap, len, " offload");
}

/* Decimals that tell MB figures a and b apart (up to 3): "needs 8 MB,
 * over the 8 MB" said nothing (a probe). */
static int mb_digits(double a, double b)
{
    int d = 0;
    while (d < 3 && fabs(round(a * pow(10, d)) - round(b * pow(10, d))) < 0.5) d++;
    /* and two figures of the smaller below 10 MB: "0 of 0 MB" said nothing */
    double s = fmin(fabs(a), fabs(b));
    int small = s >= 10 || s == 0 ? 0 : s >= 1 ? 1 : s >= 0.1 ? 2 : 3;
    return d > small ? d : small;
}

void mg_plan_reason(const mg_plan *ranked, int n, const mg_plan_cluster *cl, char *buf,
                    size_t cap)
{
    const mg_plan *best = &ranked[0], *ddp = NULL, *tp1 = NULL;
    bool untried = true;   /* no plan without tp was searched */
    for (int i = 0; i < n; i++) {
        const mg_plan *p = &ranked[i];
        if (mg_plan_is_plain(p) && (!ddp || p->micro < ddp->micro)) ddp = p;
        if (p->tp == 1 && p->fits && !tp1) tp1 = p;
        untried &= p->tp > 1;
    }
    char b[128], d[128];
    mg_plan_describe(best, b, sizeof b);
    double mb = 1e6;
    if (!best->fits) {
        bool offloads = false;
        for (int i = 0; i < n; i++) offloads |= ranked[i].offload;
        int k = mb_digits(cl->memory / mb, best->bytes / mb);
        snprintf(buf, cap, "memory: nothing fits in %.*f MB a rank; the smallest plan (%s) "
                 "needs %.*f MB: give more ranks or memory%s", k, cl->memory / mb, b, k,
                 best->bytes / mb, offloads ? "" : ", or search with offload to files");
        return;
    }
    bool only_tp = !tp1 && !untried && best->tp > 1;
    int k = mb_digits(best->bytes / mb, cl->memory > 0 ? cl->memory / mb : best->bytes / mb);
    if (best->offload) {
        snprintf(buf, cap, "memory: nothing fits in %.*f MB a rank without offload%s; %s holds "
                 "%.*f MB in memory and moves the rest through files (%.1f ms of a %.1f ms "
                 "step)", k, cl->memory / mb, only_tp ? " and tensor parallelism" : "", b, k,
                 best->bytes / mb, best->offload_io * 1e3, best->step * 1e3);
        return;
    }
    if (only_tp) {
        snprintf(buf, cap, "memory: only tensor parallelism fits (%s, %.*f of %.*f MB): without "
                 "it a rank holds too much of a layer (its parameters, or its activations)", b,
                 k, best->bytes / mb, k, cl->memory / mb);
        return;
    }
    if (ddp && ddp == best) {
        snprintf(buf, cap, "time: plain data parallelism fits (%.*f MB a rank) and no plan is "
                 "faster by 1%% or more in the model (%.1f ms a step, %.1f ms of it exposed "
                 "all-reduce)", k, best->bytes / mb, best->step * 1e3, best->dp_exposed * 1e3);
        return;
    }
    if (ddp && !ddp->fits) {
        k = mb_digits(ddp->bytes / mb, cl->memory / mb);
        snprintf(buf, cap, "memory: plain data parallelism needs %.*f MB a rank, over the %.*f "
                 "MB; the fastest plan that fits is %s (%.*f MB, %.1f ms a step; within 1%%, "
                 "the simplest)", k, ddp->bytes / mb, k, cl->memory / mb, b, k, best->bytes / mb,
                 best->step * 1e3);
        return;
    }
    if (!ddp) {
        snprintf(buf, cap, "time: %s is the fastest plan (%.1f ms a step; within 1%%, the "
                 "simplest)", b, best->step * 1e3);
        return;
    }
    mg_plan_describe(ddp, d, sizeof d);
    if (ddp->step <= best->step * 1.02) {
        k = mb_digits(best->bytes / mb, ddp->bytes / mb);
        snprintf(buf, cap, "time: %s and plain data parallelism (%s) are as fast within the "
                 "model's 2%% (%.1f and %.1f ms a step); %s holds %.*f MB a rank against %.*f",
                 b, d, best->step * 1e3, ddp->step * 1e3, b, k, best->bytes / mb, k,
                 ddp->bytes / mb);
        return;
    }
    const char *why = ddp->dp_exposed > ddp->compute * 0.25
                          ? "its gradients' all-reduce over the data-parallel links"
                          : ddp->optimizer > ddp->compute * 0.25 ? "its optimizer's whole pass"
                                                                 : "its compute";
    snprintf(buf, cap, "time: %s takes %.1f ms a step against plain data parallelism's %.1f ms "
             "(%s, %.1f ms exposed communication), which loses on %s", b, best->step * 1e3,
             ddp->step * 1e3, d, ddp->dp_exposed * 1e3, why);
}

/* The fastest fitting plan with kind k (below), or -1. */
enum { PLAIN, ZERO_STAGE, NO_TP, ANY };
static int fastest(const mg_plan *r, int n, int k, int arg)
{
    for (int i = 0; i < n; i++) {
        const mg_plan *p = &r[i];
        if (!p->fits || (p->offload && k != ANY)) continue;
        bool whole = p->tp == 1 && p->pp == 1;
        if ((k == PLAIN && mg_plan_is_plain(p)) ||
            (k == ZERO_STAGE && whole && p->zero == arg) || (k == NO_TP && p->tp == 1) ||
            k == ANY)
            return i;
    }
    return -1;
}

int mg_plan_rule_of_thumb(const mg_plan *ranked, int n, const mg_plan_cluster *cl)
{
    if (cl->nodes > 1 && cl->inter.bandwidth < 100e9 / 8) {
        int tp = 0;   /* the largest tp a node holds that some plan has */
        for (int i = 0; i < n; i++)
            if (ranked[i].tp <= cl->ranks_per_node && ranked[i].tp > tp) tp = ranked[i].tp;
        int best = -1;   /* the fewest stages, then the fastest */
        for (int i = 0; i < n; i++)
            if (ranked[i].fits && !ranked[i].offload && ranked[i].tp == tp && ranked[i].pp > 1 &&
                ranked[i].zero == (ranked[i].dp > 1) && (best < 0 || ranked[i].pp < ranked[best].pp))
                best = i;
        return best;
    }
    int i = fastest(ranked, n, PLAIN, 0);
    for (int z = 1; z <= 3 && i < 0; z++) i = fastest(ranked, n, ZERO_STAGE, z);
    if (i < 0) i = fastest(ranked, n, NO_TP, 0);
    return i >= 0 ? i : fastest(ranked, n, ANY, 0);
}

void mg_plan_flags(const mg_plan_job *job, const mg_plan *p, char *buf, size_t cap)
{
    int world = p->dp * p->pp * p->tp;
    size_t len = 0;
    if (world > 1) len = mg__catf(buf, cap, len, "mgrun -n %d ", world);
    len = mg__catf(buf, cap, len, "mgtrain --model %s", job->model);
    if (is_gpt(job))
        len = mg__catf(buf, cap, len, " --layers %d --dim %d --heads %d --ctx %d",
                       job->gpt.layers, job->gpt.dim, job->gpt.heads, job->gpt.ctx);
    if (world > 1)
        len = mg__catf(buf, cap, len, " --mesh dp=%d,pp=%d,tp=%d", p->dp, p->pp,
                       p->tp);
    if (p->zero) len = mg__catf(buf, cap, len, " --zero %d", p->zero);
    if (p->pp > 1) {
        len = mg__catf(buf, cap, len, " --batch %d --pp-schedule %s "
                       "--micro-batches %d", job->batch, mg_pipe_name(p->schedule), p->micro);
    } else {
        len = mg__catf(buf, cap, len, " --batch %d", job->batch / p->micro);
        if (p->micro > 1)
            len = mg__catf(buf, cap, len, " --accumulate %d", p->micro);
    }
    /* The model's optimizer is mgtrain's default: another is said (a model
     * of the caller's has none, and no message is left behind for it). */
    bool zoo = false;
    for (const char *const *n = mg_model_names(); *n && !zoo; n++) zoo = !strcmp(*n, job->model);
    mg_plan_job d;
    if (zoo && !mg_plan_job_defaults(job->model, &d) && d.optimizer != job->optimizer)
        len = mg__catf(buf, cap, len, " --optimizer %s",
                       mg_optim_kind_name(job->optimizer));
    if (p->recompute) len = mg__catf(buf, cap, len, " --recompute");
    if (p->sequence_parallel) len = mg__catf(buf, cap, len, " --sequence-parallel");
    if (p->offload)
        mg__catf(buf, cap, len, " --offload disk:%s",
                 job->offload_dir ? job->offload_dir : "DIR");
}

void mg_plan_apply(const mg_plan *p, char *mesh, size_t mesh_cap, mg_train_config *c)
{
    int world = p->dp * p->pp * p->tp, batch = c->batch * c->accumulate;
    snprintf(mesh, mesh_cap, "dp=%d,pp=%d,tp=%d", p->dp, p->pp, p->tp);
    c->strategy = world > 1 ? MG_STRATEGY_DDP : MG_STRATEGY_SINGLE;
    c->mesh = world > 1 ? mesh : NULL;
    c->zero = p->zero;
    c->recompute = p->recompute;
    c->sequence_parallel = p->sequence_parallel;
    c->pp_schedule = p->pp > 1 ? mg_pipe_name(p->schedule) : NULL;
    c->micro_batches = p->pp > 1 ? p->micro : 0;
    c->chunks = p->pp > 1 ? p->chunks : 0;
    c->batch = p->pp > 1 ? batch : batch / p->micro;
    c->accumulate = p->pp > 1 ? 1 : p->micro;
    if (!p->offload) c->offload_dir = NULL;
}
