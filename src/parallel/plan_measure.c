/* The planner on this machine (planner.h): a rank's rates measured on the
 * job's model — the FLOP/s of its training step and a micro-batch's
 * overhead (time = overhead + samples x FLOPs / rate, from two batch
 * sizes), for the whole model and for each tensor-parallel part the
 * search may take (a split model's smaller GEMMs run slower), the rate
 * of writing into the part's arena pages given back (a page fault each:
 * 1 GB/s under this VM's MMU, against 15 GB/s into pages kept), the
 * optimizer's memory rate and the offload files' rate — with as many
 * copies running at once as the node's ranks share its cores, memory and
 * disk; this machine as a cluster; and mgtrain --plan auto's choice.
 *
 * A tensor-parallel part runs with local stand-ins for its collectives
 * (a sum leaves its part, a gather copies it into every slot), so its
 * compute is measured apart from the communication, which the time model
 * adds from the links. Each figure is the median of a rank's steps over
 * a second or more, against a virtual machine's noise.
 *
 * Limits: the rates are the CPU's; a GPU's come as figures (--flops). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/planner_internal.h"

/* ---- local stand-ins for the tensor-parallel collectives ------------------ */

typedef struct {
    int size, rank;
} stand_in;

static mg_status local_all_reduce(void *ud, float *x, size_t n, bool max)
{
    (void)ud, (void)x, (void)n, (void)max;
    return MG_OK;
}

static mg_status local_all_gather(void *ud, const float *in, float *out, size_t n)
{
    const stand_in *s = ud;
    for (int r = 0; r < s->size; r++) memmove(out + (size_t)r * n, in, n * sizeof(float));
    return MG_OK;
}

static mg_status local_reduce_scatter(void *ud, const float *in, float *out, size_t n)
{
    const stand_in *s = ud;
    memmove(out, in + (size_t)s->rank * n, n * sizeof(float));
    return MG_OK;
}

/* ---- one rank's figures ------------------------------------------------------ */

typedef struct {
    const mg_plan_job *job;
    int local, tp;                 /* the largest micro-batch measured; the part */
    mg_group *g;                   /* the part's tp group (its collectives real), or NULL */
    mg_group *all;                 /* the ranks measuring at once (they agree on the sizes
                                      and step counts, so they run together), or NULL */
    int tp_rank;
    double micro_s[MG_PLAN_SIZES]; /* seconds of a micro-batch of 2^k samples */
    double flops;                  /* of a sample's training step */
    double bytes_per_s;            /* the optimizer's */
    double refill_bytes_per_s;     /* into the part's arena's pages given back */
    mg_status st;
    char err[256];
} rates;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The largest of x over g (x alone without g): so the ranks measuring at
 * once decide alike, and start each size together. */
static double agreed(mg_group *g, double x, mg_status *st)
{
    if (g && !*st) *st = mg_all_reduce(g, &x, &x, 1, MG_F64, MG_MAX);
    return x;
}

/* The median seconds of a training step on n samples: one to warm up,
 * then as many as take about secs by its time (2 to 64; the same count on
 * every rank of g). */
static double step_seconds(mg_model *m, mg_group *g, const float *x, const int32_t *y, int n,
                           double secs, mg_status *st)
{
    double t[64];
    int steps = 0;
    for (int i = 0; !*st && i <= steps; i++) {
        double t0 = mg_now();
        if (!mg_model_forward(m, x, n)) *st = mg_error(MG_EINVAL, "planner: %s", mg_last_error());
        if (!*st) {
            mg_model_loss(m, y, NULL);
            mg_model_backward(m);
        }
        if (!*st) *st = mg_model_tp_failure(m);
        double dt = mg_now() - t0;
        if (i == 0) {
            double want = agreed(g, secs / (dt > 1e-6 ? dt : 1e-6), st);
            steps = want < 2 ? 2 : want > 64 ? 64 : (int)want;
        } else {
            t[i - 1] = dt;
        }
    }
    if (*st) return 0;
    qsort(t, (size_t)steps, sizeof *t, cmp_double);
    return t[steps / 2];
}

/* Bytes a second written into pages of the parameter arena given back,
 * a bucket at a time as ZeRO-3 gathers into them: the arena's own pages
 * (mapped as the model maps it: huge pages where it is large), about
 * 256 MB in all, the same count on every rank of g. */
static double refill_rate(mg_model *m, mg_group *g, double bucket_mb, mg_status *st)
{
    size_t bytes = mg_model_arena_size(m) * sizeof(float);
    size_t cap = (size_t)((bucket_mb > 0 ? bucket_mb : 25) * (1 << 20));
    if (bytes > cap) bytes = cap;
    int reps = (int)agreed(g, (double)(256u << 20) / (double)(bytes ? bytes : 1), st);
    reps = reps < 4 ? 4 : reps > 1024 ? 1024 : reps;
    char *p = (char *)mg_model_params(m);
    memset(p, 0, bytes);
    double t0 = mg_now();
    for (int i = 0; i < reps && !*st; i++) {
        mg_mem_discard(p, bytes);
        memset(p, 1 + i % 64, bytes);
    }
    double t = mg_now() - t0;
    return *st || t <= 0 ? 0 : (double)bytes * reps / t;
}

/* The collectives of a tp part measured with its group's ranks. */
static mg_status group_all_reduce(void *ud, float *x, size_t n, bool max)
{
    return mg_all_reduce(ud, x, x, n, MG_F32, max ? MG_MAX : MG_SUM);
}

static mg_status group_all_gather(void *ud, const float *in, float *out, size_t n)
{
    return mg_all_gather(ud, in, out, n, MG_F32);
}

static mg_status group_reduce_scatter(void *ud, const float *in, float *out, size_t n)
{
    return mg_reduce_scatter(ud, in, out, n, MG_F32, MG_SUM);
}

static void measure_one(rates *r)
{
    const mg_plan_job *job = r->job;
    mg_plan whole = {.dp = 1, .pp = 1, .tp = r->tp, .chunks = 1};
    mg_model *m = NULL;
    mg_status st = mg__plan_model(job, &whole, r->tp_rank, &m);
    stand_in si = {r->tp, 0};
    mg_tp_comm comm = {local_all_reduce, local_all_gather, local_reduce_scatter, &si};
    if (r->g) comm = (mg_tp_comm){group_all_reduce, group_all_gather, group_reduce_scatter, r->g};
    if (!st && r->tp > 1) mg_model_set_tp_comm(m, &comm);
    if (!st) st = mg_model_init_params(m, 1);
    if (m) mg_model_flops(m, NULL, &r->flops);
    int c, h, w, T = m ? mg_model_positions(m) : 1;
    int V = T > 1 ? job->gpt.vocab : m ? mg_model_classes(m) : 1;   /* a split head's too */
    int local = r->local;
    if (m) mg_model_input_shape(m, &c, &h, &w);
    size_t in = m ? (size_t)local * c * h * w : 0;
    float *x = calloc(in ? in : 1, sizeof *x);
    int32_t *y = calloc((size_t)local * T, sizeof *y);
    if (!st && (!x || !y)) st = mg_error(MG_ENOMEM, "planner: out of memory for a batch of %d", local);
    for (size_t i = 0; !st && i < in; i++) {   /* tokens (as floats' bits) or pixels */
        if (T > 1) ((int32_t *)(void *)x)[i] = (int32_t)(i * 7 % (size_t)V);
        else x[i] = (float)(i % 13) / 13.0f;
    }
    for (size_t i = 0; !st && i < (size_t)local * T; i++) y[i] = (int32_t)(i * 5 % (size_t)V);
    /* From the largest size down, so the tape is made once; smaller ones
     * while the part has taken less than 10 s (a large model's: the time
     * model scales the smallest measured down). */
    int top = 0;
    while (top + 1 < MG_PLAN_SIZES && (1 << (top + 1)) <= local) top++;
    double began = mg_now();
    for (int k = top; k >= 0 && !st && (k == top || agreed(r->all, mg_now() - began, &st) < 10);
         k--)
        r->micro_s[k] = step_seconds(m, r->all, x, y, 1 << k, k == top ? 1.0 : 0.4, &st);
    if (!st) r->refill_bytes_per_s = refill_rate(m, r->all, job->bucket_mb, &st);
    /* The optimizer over the whole arena. */
    mg_optim *o = NULL;
    mg_optim_config oc = mg_optim_defaults(job->optimizer, 1e-4f);
    oc.momentum = job->momentum;
    size_t n = m ? mg_model_arena_size(m) : 0;
    int states = mg_optim_states(&oc);
    if (!st && r->tp == 1) st = mg_optim_create(&oc, n, &o);
    double t0 = mg_now();
    for (int k = 0, done = 0; !st && o && k < 50 && (k < 3 || mg_now() - t0 < 0.3); k++) {
        if (k == 1) t0 = mg_now();
        st = mg_optim_step(o, mg_model_params(m), mg_model_grads(m), 1e-4f);
        if (k >= 1) r->bytes_per_s = (double)n * 4 * (3 + 2 * states) * ++done / (mg_now() - t0);
    }
    if (st) snprintf(r->err, sizeof r->err, "%s", mg_last_error());
    r->st = st;
    mg_optim_destroy(o);
    mg_model_destroy(m);
    free(x);
    free(y);
}

/* The whole model's FLOP/s and overhead (for figures and printing), from
 * its two largest measured sizes (flops: a sample's training step). */
static void rates_of_sizes(double flops, mg_plan_cluster *cl)
{
    const double *t = cl->micro_s[1];
    int k = MG_PLAN_SIZES - 1;
    while (k >= 0 && t[k] <= 0) k--;
    if (k < 0) return;
    double n1 = 1 << k, per = t[k] / n1;
    if (k > 0 && t[k - 1] > 0 && t[k] > t[k - 1]) per = (t[k] - t[k - 1]) / (n1 / 2);
    cl->flops = flops / per;
    cl->overhead = t[k] > per * n1 ? t[k] - per * n1 : 0;
}

/* Every part the search may take on cl's ranks: the whole model, and each
 * tp part the model splits into (a rank's micro-batch: the global batch
 * over the ranks, 1 to 16 samples, times tp, at most 128). With g, on
 * every rank of g at once, each tp part with the ranks of its tp group
 * (g split by rank / tp), its collectives real; without, alone, with
 * local stand-ins. */
static mg_status measure_parts(mg_group *g, const mg_plan_job *job, mg_plan_cluster *cl)
{
    mg_set_threads(1);
    int world = cl->ranks_per_node * cl->nodes, rank = g ? mg_group_rank(g) : 0;
    int local = job->batch / world < 1 ? 1 : job->batch / world > 16 ? 16 : job->batch / world;
    int ranks = g ? mg_group_size(g) : world;
    double flops = 0;
    for (int tp = 1; tp <= MG_PLAN_MEASURED_TP && tp <= ranks; tp++) {
        mg_plan split = {.dp = 1, .pp = 1, .tp = tp, .chunks = 1};
        mg_model *m;
        if (ranks % tp || (tp > 1 && job->no_tp) || (job->tp && tp > 1 && tp != job->tp) ||
            mg__plan_model(job, &split, 0, &m))
            continue;   /* the model does not split so */
        mg_model_destroy(m);
        int most = local * tp < 1 << (MG_PLAN_SIZES - 1) ? local * tp : 1 << (MG_PLAN_SIZES - 1);
        rates r = {.job = job, .local = most, .tp = tp, .tp_rank = g ? rank % tp : 0, .all = g};
        mg_status st = g && tp > 1 ? mg_group_split(g, rank / tp, rank % tp, &r.g) : MG_OK;
        if (!st) measure_one(&r);
        mg_group_destroy(r.g);
        if (!st && r.st) st = mg_error(r.st, "%s", r.err);
        if (g) MG_TRY(mg_group_agree(g, st, MG_AGREE_SHARE));
        MG_TRY(st);
        memcpy(cl->micro_s[tp], r.micro_s, sizeof r.micro_s);
        cl->refill_bytes_per_s[tp] = r.refill_bytes_per_s;
        if (tp == 1) {
            cl->bytes_per_s = r.bytes_per_s;
            flops = r.flops;
        }
    }
    /* A synchronous step goes at its slowest rank's pace (ranks sharing
     * cores measure apart by 40% here): every rank gets the slowest
     * figures. */
    if (g) {
        enum { R = MG_PLAN_MEASURED_TP + 1, K = 1 + R + R * MG_PLAN_SIZES };
        double v[K] = {-cl->bytes_per_s};
        for (int i = 0; i < R; i++) v[1 + i] = -cl->refill_bytes_per_s[i];
        memcpy(v + 1 + R, cl->micro_s, sizeof cl->micro_s);
        MG_TRY(mg_all_reduce(g, v, v, K, MG_F64, MG_MAX));
        cl->bytes_per_s = -v[0];
        for (int i = 0; i < R; i++) cl->refill_bytes_per_s[i] = -v[1 + i];
        memcpy(cl->micro_s, v + 1 + R, sizeof cl->micro_s);
    }
    rates_of_sizes(flops, cl);
    return MG_OK;
}

/* The job searches offload in a directory: its files' rate. */
static mg_status measure_files(const mg_plan_job *job, mg_plan_cluster *cl)
{
    return job->offload_dir && !job->no_offload
               ? mg_plan_measure_disk(job->offload_dir, job->offload_window, cl)
               : MG_OK;
}

mg_status mg_plan_measure(const mg_plan_job *job, mg_plan_cluster *cl)
{
    MG_TRY(measure_parts(NULL, job, cl));
    return measure_files(job, cl);
}

/* ---- the job's links ---------------------------------------------------------- */

/* The slowest rank's mean seconds of 20 runs (after 5) of collective c
 * of a vector of `floats` over g; reduce-scatter and all-gather in place,
 * the rank's piece inside the vector, as ZeRO runs them. */
static double coll_seconds(mg_group *g, mg_coll c, float *buf, size_t floats, mg_status *st)
{
    size_t piece = floats / (size_t)mg_group_size(g);
    float *mine = buf + (size_t)mg_group_rank(g) * piece;
    double t = 0;
    for (int i = 0; i < 25 && !*st; i++) {
        if (i == 5) t = mg_now();
        switch (c) {
        case MG_COLL_REDUCE_SCATTER:
            *st = mg_reduce_scatter(g, buf, mine, piece, MG_F32, MG_AVG);
            break;
        case MG_COLL_ALL_GATHER:
            *st = mg_all_gather(g, mine, buf, piece, MG_F32);
            break;
        default:
            *st = mg_all_reduce(g, buf, buf, floats, MG_F32, MG_SUM);
        }
    }
    t = (mg_now() - t) / 20;
    if (!*st) *st = mg_all_reduce(g, &t, &t, 1, MG_F64, MG_MAX);
    return t;
}

mg_status mg_plan_measure_links(mg_group *g, mg_plan_cluster *cl)
{
    int p = mg_group_size(g);
    if (p < 2) return MG_OK;
    size_t bucket = mg_ddp_defaults().bucket_bytes / sizeof(float) / (size_t)p * (size_t)p;
    float *buf = calloc(bucket, sizeof *buf);
    /* Every rank runs the collectives, or none does. */
    mg_status st = mg_group_agree(g, buf ? MG_OK : mg_error(MG_ENOMEM, "planner: out of memory"),
                                  MG_AGREE_SHARE);
    double small = coll_seconds(g, MG_COLL_ALL_REDUCE, buf, 1024, &st);
    double large = coll_seconds(g, MG_COLL_ALL_REDUCE, buf, 1 << 20, &st);
    mg_link *l = cl->nodes > 1 ? &cl->inter : &cl->intra;
    if (!st) mg_link_fit(MG_COLL_ALL_REDUCE, p, 4096.0, small, 4.0 * (1 << 20), large, l);
    /* ZeRO's collectives of a bucket against the fit (their bytes: the
     * whole bucket, as the time model counts them). */
    double rs = coll_seconds(g, MG_COLL_REDUCE_SCATTER, buf, bucket, &st);
    double ag = coll_seconds(g, MG_COLL_ALL_GATHER, buf, bucket, &st);
    if (!st) {
        cl->rs_scale = rs / mg_coll_time(MG_COLL_REDUCE_SCATTER, 4.0 * bucket, p, l);
        cl->ag_scale = ag / mg_coll_time(MG_COLL_ALL_GATHER, 4.0 * bucket, p, l);
    }
    free(buf);
    return st;
}

/* ---- the offload files ---------------------------------------------------- */

mg_status mg_plan_measure_disk(const char *dir, size_t window, mg_plan_cluster *cl)
{
    if (!window) return mg_error(MG_EINVAL, "planner: an offload window of 0 bytes");
    /* 128 MiB, beyond any cache (32 MiB, the size of an L3, went 1.6x
     * faster a byte than the optimizer streams its state), or 32 windows. */
    size_t n = ((128u << 20) + window - 1) / window;
    if (n < 32) n = 32;
    mg_scratch *f;
    MG_TRY(mg_scratch_create(dir, (uint64_t)n * window, "planner's disk probe", &f));
    char *buf = mg_alloc(window);
    mg_status st = buf ? MG_OK : mg_error(MG_ENOMEM, "planner: out of memory");
    if (buf) memset(buf, 1, window);
    double t0 = 0;
    /* A pass to write the file once, then one written and read, timed. */
    for (int pass = 0; pass < 3 && !st; pass++) {
        if (pass == 1) t0 = mg_now();
        for (size_t i = 0; i < n && !st; i++)
            st = pass < 2 ? mg_scratch_write(f, buf, window, (uint64_t)i * window)
                          : mg_scratch_read(f, buf, window, (uint64_t)i * window);
    }
    if (!st) cl->disk_bytes_per_s = 2.0 * (double)n * (double)window / (mg_now() - t0);
    mg_free(buf);
    mg_scratch_destroy(f);
    return st;
}

mg_status mg_plan_measure_job(mg_group *g, const mg_plan_job *job, mg_plan_cluster *cl)
{
    MG_TRY(measure_parts(g, job, cl));
    cl->micro_with_tp = true;
    /* The files at once, as the node's ranks would stream them. */
    MG_TRY(mg_group_agree(g, measure_files(job, cl), MG_AGREE_SHARE));
    double slowest = -cl->disk_bytes_per_s;
    MG_TRY(mg_all_reduce(g, &slowest, &slowest, 1, MG_F64, MG_MAX));
    cl->disk_bytes_per_s = -slowest;
    return mg_plan_measure_links(g, cl);
}

/* ---- this machine, and mgtrain --plan auto ------------------------------------ */

/* What the node has available (MemAvailable), in bytes; 0 if unknown. */
static double available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

mg_plan_cluster mg_plan_cluster_here(int ranks_per_node, int nodes, int cores, double memory)
{
    mg_plan_cluster cl = {.ranks_per_node = ranks_per_node, .nodes = nodes,
                          .memory = memory > 0 ? memory : available() / ranks_per_node,
                          .cores = cores > 0 ? cores : mg_local_cpus(), .intra = *mg_link_builtin("shm"),
                          .inter = *mg_link_builtin("tcp")};
    double spare = (double)cl.cores / ranks_per_node - 1;
    cl.overlap = spare < 0 ? 0 : spare > 1 ? 1 : spare;
    return cl;
}

mg_status mg_plan_job_of(const mg_train_config *c, mg_plan_job *out)
{
    MG_TRY(mg_plan_job_defaults(c->model, out));
    out->gpt = c->gpt;
    out->batch = c->batch * c->accumulate;
    MG_TRY(mg_optim_parse(c->optimizer, &out->optimizer));
    out->momentum = c->momentum;
    out->bucket_mb = c->bucket_mb;
    out->evaluates = true;
    out->offload_dir = c->offload_dir;
    out->no_offload = !c->offload_dir;
    return MG_OK;
}

mg_status mg_plan_choose(const mg_plan_job *job, const mg_plan_cluster *cl, mg_plan *out,
                         char *why, size_t cap)
{
    mg_plan *all;
    int n;
    MG_TRY(mg_plan_search(job, cl, &all, &n));
    mg_plan_reason(all, n, cl, why, cap);
    mg_status st = all[0].fits ? MG_OK : mg_error(MG_EINVAL, "%s", why);
    *out = all[0];
    free(all);
    return st;
}
