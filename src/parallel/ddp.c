/* DistributedDataParallel: one model replica per rank, gradients averaged
 * across the group after every backward, as torch's DDP does.
 *
 * The gradient arena is allocated through the group (mg_group_alloc), so
 * ranks on one host reduce each other's gradients in place. Its units are
 * padded to a multiple of lcm(world size, SIMD width), so every range
 * splits into equal shards. Gradients are grouped into buckets —
 * contiguous ranges of the arena split at unit boundaries, the first
 * closed at 1 MiB and the rest at 25 MiB by default, as PyTorch's — and
 * because the arena is laid out in backward order, units finish in
 * increasing arena order: a unit's post-backward hook starts the async
 * all-reduce of every bucket that is now final, overlapping communication
 * with the rest of backward. mg_ddp_finish
 * launches any bucket that got no gradient this step (so unused parameters
 * never hang a step), waits for all and decompresses where buckets were
 * sent as fp16/bf16.
 *
 * A model on a device keeps its gradients there: each bucket is copied to
 * the group memory when it is launched and back when it is reduced (host
 * staging, as gloo does with CUDA tensors), so ranks that share a GPU
 * reduce through the host's shared memory; a GPU's copies to and from it
 * run at the bus's speed, for it is page-locked for them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"
#include "multigrad/trace.h"

typedef struct {
    size_t lo, hi;          /* float range of the gradient arena */
    mg_work *work;
    bool launched;          /* this step */
    int units, left;        /* over a part's ranges: its units, those not done this step */
    double t_launch;        /* trace clock, us */
} bucket;

struct mg_ddp {
    mg_group *g;
    mg_model *m;
    mg_ddp_options opt;
    float *grads;           /* group memory, arena_size floats */
    size_t n;               /* arena size */
    uint16_t *half;         /* group memory for compressed buckets */
    bucket *b;
    int nb;
    size_t ready;           /* gradients [0, ready) are final this step */
    bool sync;
    const mg_unit_hooks *hooks;   /* installed on the model */
    bool replicas_of_ranges; /* buckets are a part's ranges of the model's own gradients */
    bool staged;            /* the model is on a device: buckets go through grads */
    bool locked;            /* grads page-locked for the device's copies */
    mg_status err;
    mg_ddp_stats stats;
};

mg_ddp_options mg_ddp_defaults(void)
{
    return (mg_ddp_options){.bucket_bytes = 25u << 20, .first_bucket_bytes = 1u << 20,
                            .compress = MG_COMPRESS_NONE};
}

mg_status mg_compress_parse(const char *s, mg_compress *out)
{
    if (!strcmp(s, "none")) *out = MG_COMPRESS_NONE;
    else if (!strcmp(s, "fp16")) *out = MG_COMPRESS_FP16;
    else if (!strcmp(s, "bf16")) *out = MG_COMPRESS_BF16;
    else return mg_error(MG_EINVAL, "unknown compression '%s': use none, fp16 or bf16", s);
    return MG_OK;
}

int mg_buckets(const mg_model *m, size_t first_cap, size_t cap, mg_range *out)
{
    int nu = mg_model_num_units(m), nb = 0;
    size_t lo = 0, n = mg_model_arena_size(m);
    for (int u = nu - 1; u >= 0; u--) {
        size_t ulo, hi;
        mg_model_unit_range(m, u, &ulo, &hi);
        if (hi > lo && (hi - lo) * sizeof(float) >= (nb == 0 ? first_cap : cap)) {
            out[nb++] = (mg_range){lo, hi};
            lo = hi;
        }
    }
    if (lo < n) out[nb++] = (mg_range){lo, n};
    return nb;
}

mg_status mg__range_buckets(const mg_model *m, size_t first_cap, size_t cap, const mg_range *r,
                           int n, mg_range **out, int *nb)
{
    int nu = mg_model_num_units(m), ncut = 0;
    mg_range *whole = calloc((size_t)nu + 1, sizeof *whole);
    size_t *cut = calloc(2 * (size_t)nu + 1, sizeof *cut);
    *out = calloc(((size_t)nu + 1) * (size_t)(n + 2 * nu + 1), sizeof **out);
    *nb = 0;
    if (!whole || !cut || !*out) {
        free(whole);
        free(cut);
        free(*out);
        *out = NULL;
        return mg_error(MG_ENOMEM, "buckets: out of memory");
    }
    for (int u = 0; u < nu; u++) {
        int j = mg_model_unit(m, u).borrows;
        if (j < 0) continue;
        mg_model_unit_range(m, j, &cut[ncut], &cut[ncut + 1]);
        ncut += 2;
    }
    int nw = mg_buckets(m, first_cap, cap, whole);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < nw; k++) {
            size_t lo = r[i].lo > whole[k].lo ? r[i].lo : whole[k].lo;
            size_t hi = r[i].hi < whole[k].hi ? r[i].hi : whole[k].hi;
            while (hi > lo) {   /* split at the first border inside */
                size_t end = hi;
                for (int c = 0; c < ncut; c++)
                    if (cut[c] > lo && cut[c] < end) end = cut[c];
                (*out)[(*nb)++] = (mg_range){lo, end};
                lo = end;
            }
        }
    free(whole);
    free(cut);
    return MG_OK;
}

static mg_status make_buckets(mg_ddp *d)
{
    mg_range *r = calloc((size_t)mg_model_num_units(d->m) + 1, sizeof *r);
    d->b = calloc((size_t)mg_model_num_units(d->m) + 1, sizeof *d->b);
    if (!r || !d->b) {
        free(r);
        return mg_error(MG_ENOMEM, "ddp: out of memory for buckets");
    }
    d->nb = mg_buckets(d->m, d->opt.first_bucket_bytes, d->opt.bucket_bytes, r);
    for (int i = 0; i < d->nb; i++) d->b[i] = (bucket){.lo = r[i].lo, .hi = r[i].hi};
    free(r);
    return MG_OK;
}

size_t mg_shard_pad(int world)
{
    size_t a = (size_t)world, b = MG_SIMD_FLOATS;
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return (size_t)world / a * MG_SIMD_FLOATS;
}

/* Copies floats [lo, hi) of the device gradients to the group memory
 * (to_host) or back. */
static mg_status stage(mg_ddp *d, size_t lo, size_t hi, bool to_host)
{
    mg_device cpu = {MG_DEVICE_CPU, 0}, dev = mg_model_device(d->m);
    float *dg = mg_model_grads(d->m) + lo, *hg = d->grads + lo;
    size_t bytes = (hi - lo) * sizeof(float);
    return to_host ? mg_device_copy(cpu, hg, dev, dg, bytes) : mg_device_copy(dev, dg, cpu, hg, bytes);
}

static void launch(mg_ddp *d, bucket *b)
{
    b->launched = true;
    b->t_launch = mg_trace_now();
    if (d->err) return;
    size_t n = b->hi - b->lo;
    mg_status st;
    if (d->replicas_of_ranges) {
        float *g = mg_model_grads(d->m) + b->lo;
        if ((st = mg_all_reduce_async(d->g, g, g, n, MG_F32, MG_AVG, &b->work))) d->err = st;
        return;
    }
    if (d->staged && (st = stage(d, b->lo, b->hi, true))) {
        d->err = st;
        return;
    }
    if (d->opt.compress == MG_COMPRESS_NONE) {
        st = mg_all_reduce_async(d->g, d->grads + b->lo, d->grads + b->lo, n, MG_F32,
                                 MG_AVG, &b->work);
    } else {
        mg_dtype t = d->opt.compress == MG_COMPRESS_FP16 ? MG_F16 : MG_BF16;
        mg_convert_from_f32(d->half + b->lo, t, d->grads + b->lo, n);
        st = mg_all_reduce_async(d->g, d->half + b->lo, d->half + b->lo, n, t, MG_AVG,
                                 &b->work);
    }
    if (st) d->err = st;
}

/* After a unit's backward its gradients are final: launch every bucket
 * that now is. */
static void on_unit_done(void *ud, mg_tape *t, int unit)
{
    mg_ddp *d = ud;
    (void)t;
    if (!d->sync) return;
    size_t lo, hi;
    mg_model_unit_range(d->m, unit, &lo, &hi);
    if (hi > d->ready) d->ready = hi;
    for (int i = 0; i < d->nb && d->b[i].hi <= d->ready; i++)
        if (!d->b[i].launched) launch(d, &d->b[i]);
}

static const mg_unit_hooks ddp_hooks = {.post_backward = on_unit_done};

/* DDP over g without the first broadcast (the plan's, or the caller's). */
static mg_status ddp_setup(mg_group *g, mg_model *m, const mg_ddp_options *opt, mg_ddp **out)
{
    *out = NULL;
    mg_ddp *d = calloc(1, sizeof *d);
    if (!d) return mg_error(MG_ENOMEM, "ddp: out of memory");
    d->g = g;
    d->m = m;
    d->opt = opt ? *opt : mg_ddp_defaults();
    if (d->opt.bucket_bytes == 0 || d->opt.first_bucket_bytes == 0) {
        free(d);
        return mg_error(MG_EINVAL, "ddp: bucket sizes must be positive");
    }
    d->sync = true;
    size_t pad = mg_shard_pad(mg_group_size(g));
    mg_status st = MG_OK;
    if (mg_model_unit_pad(m) % pad) st = mg_model_set_unit_pad(m, pad);
    d->n = mg_model_arena_size(m);
    if (!st) st = make_buckets(d);
    if (!st) {
        d->grads = mg_group_alloc(g, d->n * sizeof(float));
        if (!d->grads)   /* mg_group_alloc said why (/dev/shm's room, a peer) */
            st = mg_error(mg_last_error_code(), "ddp: the gradients' group memory: %s",
                          mg_last_error());
    }
    if (!st && d->opt.compress != MG_COMPRESS_NONE) {
        d->half = mg_group_alloc(g, d->n * sizeof(uint16_t));
        if (!d->half)
            st = mg_error(mg_last_error_code(), "ddp: the compressed buckets' group memory: %s",
                          mg_last_error());
    }
    if (!st) {
        d->staged = mg_model_device(m).kind != MG_DEVICE_CPU;
        if (!d->staged) mg_model_set_grad_storage(m, d->grads);
        /* Without it the copies still work, through the driver's buffers. */
        else if (mg_device_host_register(mg_model_device(m), d->grads, d->n * sizeof(float)))
            mg_debug("ddp: %s; bucket copies go through pageable memory", mg_last_error());
        else d->locked = true;
        st = mg_model_add_hooks(m, &ddp_hooks, d);
        if (!st) d->hooks = &ddp_hooks;
    }
    if (st) {
        mg_ddp_destroy(d);
        return st;
    }
    *out = d;
    return MG_OK;
}

mg_status mg_ddp_create(mg_group *g, mg_model *m, const mg_ddp_options *opt, mg_ddp **out)
{
    MG_TRY(ddp_setup(g, m, opt, out));
    /* Every replica starts from rank 0's parameters and buffers (device
     * memory is staged by the group). */
    mg_status st = mg_broadcast(g, mg_model_params(m), (*out)->n, MG_F32, 0);
    if (!st && mg_model_buffer_size(m))
        st = mg_broadcast(g, mg_model_buffers(m), mg_model_buffer_size(m), MG_F32, 0);
    if (st) {
        mg_ddp_destroy(*out);
        *out = NULL;
    }
    return st;
}

void mg_ddp_destroy(mg_ddp *d)
{
    if (!d) return;
    for (int i = 0; i < d->nb; i++) mg_work_free(d->b[i].work);
    if (d->locked) mg_device_host_unregister(mg_model_device(d->m), d->grads);
    if (d->grads) {
        /* Hand the model back its own memory before the group's goes. */
        mg_model_set_grad_storage(d->m, NULL);
        mg_group_free(d->g, d->grads);
    }
    if (d->hooks) mg_model_remove_hooks(d->m, d->hooks, d);
    if (d->half) mg_group_free(d->g, d->half);
    free(d->b);
    free(d);
}

void mg_ddp_set_sync(mg_ddp *d, bool sync) { d->sync = sync; }

int mg_ddp_num_buckets(const mg_ddp *d) { return d->nb; }
int mg_ddp_launched(const mg_ddp *d)
{
    int n = 0;
    for (int i = 0; i < d->nb; i++) n += d->b[i].launched;
    return n;
}

void mg_ddp_bucket(const mg_ddp *d, int i, size_t *lo, size_t *hi)
{
    MG_ASSERT(i >= 0 && i < d->nb);
    *lo = d->b[i].lo;
    *hi = d->b[i].hi;
}

mg_status mg_ddp_finish(mg_ddp *d)
{
    /* Over a part's ranges every step ends in the average (sync marks
     * only the backwards after which a bucket may start early). */
    if (!d->sync && !d->replicas_of_ranges) return MG_OK;
    /* Buckets whose parameters got no gradient this step go now. */
    for (int i = 0; i < d->nb; i++)
        if (!d->b[i].launched) launch(d, &d->b[i]);
    double t0 = mg_trace_now();
    mg_status st = d->err;
    for (int i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        if (!b->work) continue;
        mg_status s = mg_work_wait(b->work, -1);
        if (!st) st = s;
        double start, end;
        mg_work_times(b->work, &start, &end);
        d->stats.comm_us += (end - start) * 1e6;
        if (mg_trace_on()) {
            char name[32];
            snprintf(name, sizeof name, "allreduce bucket %d", i);
            mg_trace_event(name, "allreduce", 1, b->t_launch, mg_trace_at(end));
        }
        mg_work_free(b->work);
        b->work = NULL;
        if (!st && d->opt.compress != MG_COMPRESS_NONE) {
            mg_dtype t = d->opt.compress == MG_COMPRESS_FP16 ? MG_F16 : MG_BF16;
            mg_convert_to_f32(d->grads + b->lo, d->half + b->lo, t, b->hi - b->lo);
        }
        if (!st && d->staged) st = stage(d, b->lo, b->hi, false);
    }
    for (int i = 0; i < d->nb; i++) {
        d->b[i].launched = false;
        d->b[i].left = d->b[i].units;
    }
    if (d->replicas_of_ranges) d->sync = false;
    double t1 = mg_trace_now();
    d->stats.exposed_us += t1 - t0;
    d->stats.steps++;
    d->ready = 0;
    d->err = MG_OK;
    return st;
}

mg_ddp_stats mg_ddp_get_stats(const mg_ddp *d) { return d->stats; }

/* ---- as a strategy's component ------------------------------------------
 *
 * Over the whole arena: the DDP above. Over the ranges a component before
 * it left this rank (a pipeline's stages): their replicas average those
 * ranges of the model's own gradients. The buckets are DDP's cut to the
 * ranges (mg__range_buckets); the driver says which backward is a
 * stage's last of the step (micro_begin), and a bucket's all-reduce starts once every unit in it
 * has finished that backward, overlapping the rest of it (and the other
 * chunks'); the rest (ranges borrowed from another stage) go at the end. */

static void on_range_unit_done(void *ud, mg_tape *t, int unit)
{
    mg_ddp *d = ud;
    (void)t;
    size_t lo, hi;
    mg_model_unit_range(d->m, unit, &lo, &hi);
    if (!d->sync || hi == lo) return;
    for (int i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        if (lo >= b->lo && hi <= b->hi && !b->launched && --b->left == 0) launch(d, b);
    }
}

static const mg_unit_hooks range_hooks = {.post_backward = on_range_unit_done};

static mg_status create_on_ranges(mg_group *g, mg_model *m, const mg_ddp_options *opt,
                                  const mg_range *r, int n, mg_ddp **out)
{
    mg_range *cut;
    int nb, nu = mg_model_num_units(m);
    MG_TRY(mg__range_buckets(m, opt->first_bucket_bytes, opt->bucket_bytes, r, n, &cut, &nb));
    mg_ddp *d = calloc(1, sizeof *d);
    if (d) d->b = calloc((size_t)nb + 1, sizeof *d->b);
    if (!d || !d->b) {
        if (d) free(d->b);
        free(d);
        free(cut);
        return mg_error(MG_ENOMEM, "ddp: out of memory");
    }
    d->g = g;
    d->m = m;
    d->opt = *opt;
    d->n = mg_model_arena_size(m);
    d->replicas_of_ranges = true;   /* sync: not until the driver marks a last backward */
    for (d->nb = 0; d->nb < nb; d->nb++) d->b[d->nb] = (bucket){.lo = cut[d->nb].lo, .hi = cut[d->nb].hi};
    free(cut);
    for (int u = 0; u < nu; u++) {
        size_t lo, hi;
        mg_model_unit_range(m, u, &lo, &hi);
        for (int i = 0; i < d->nb && hi > lo; i++)
            if (lo >= d->b[i].lo && hi <= d->b[i].hi) d->b[i].left = ++d->b[i].units;
    }
    mg_status st = mg_model_add_hooks(m, &range_hooks, d);
    if (st) {
        mg_ddp_destroy(d);
        return st;
    }
    d->hooks = &range_hooks;
    *out = d;
    return MG_OK;
}

static mg_status ddp_attach(mg_strategy *s, void **state)
{
    const mg_strategy_options *o = mg_strategy_options_of(s);
    mg_model *m = mg_strategy_model(s);
    mg_mesh *mesh = mg_strategy_mesh(s);
    if (!mesh) return mg_error(MG_EINVAL, "strategy ddp needs a process group");
    if (o->det_shards) return MG_OK;   /* the deterministic component sums instead */
    mg_group *g = mg_mesh_group(mesh, MG_MESH_DP);
    int n;
    const mg_range *r = mg_strategy_ranges(s, &n);
    /* Replicas of one: nothing to average (a mesh of tp only, or a part
     * of a pipeline); a job of one rank keeps its DDP. */
    if (mg_group_size(g) == 1 && mg_group_size(mg_strategy_options_of(s)->group) > 1)
        return MG_OK;
    if (n == 1 && r[0].lo == 0 && r[0].hi == mg_model_arena_size(m))
        return ddp_setup(g, m, &o->ddp, (mg_ddp **)state);   /* the plan starts the values */
    if (mg_group_size(g) == 1) return MG_OK;   /* a part without replicas */
    return create_on_ranges(g, m, &o->ddp, r, n, (mg_ddp **)state);
}

static void ddp_destroy(void *c) { mg_ddp_destroy(c); }
static void ddp_begin(void *c, bool last) { mg_ddp_set_sync(c, last); }
static mg_status ddp_reduce(void *c) { return mg_ddp_finish(c); }
static mg_group *ddp_group(void *c) { return ((mg_ddp *)c)->g; }

const mg_component_ops mg__ddp_component = {
    .name = "ddp", .attach = ddp_attach, .destroy = ddp_destroy,
    .replicas_over = ddp_group, .batch_over = ddp_group,
    .micro_begin = ddp_begin, .reduce = ddp_reduce,
};
