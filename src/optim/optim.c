/* Optimizer objects: configuration, state arenas (n floats each, 64-byte
 * aligned, zeroed) and the per-step coefficients; the update kernels are
 * in sgd.c and adam.c. A step is begin_step (once) then update over any
 * number of disjoint ranges, so a ZeRO shard or a DDP bucket steps alone;
 * updates of disjoint ranges may run concurrently (they only read the
 * coefficients).
 *
 * Scalars are rounded as torch.optim rounds its Python floats: the user's
 * lr 0.05 is the double 0.05 in PyTorch, so float config values are first
 * taken back to the shortest decimal that round-trips (0.05f -> 0.05) and
 * the per-step coefficients (1 - beta^t, lr / bias correction) are computed
 * in double and rounded to float once. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "multigrad/optim.h"
#include "optim_impl.h"
#include "device/dk.h"

#define MAX_STATES 2
#define NBUF 3   /* offload windows: one read ahead, one updated, one written back */

/* An offload window: floats [a, b) of range k. */
typedef struct { int op, buf, k; size_t a, b; } io_job;
enum { IO_READ, IO_WRITE };

/* Offloaded state: the state arrays in a file (state i at float i * n),
 * the parameters and the gradients of the ranges in others (laid out as
 * a state), streamed through NBUF windows by an I/O thread that reads the
 * next window while the step updates this one and writes the last one
 * back. */
typedef struct offload {
    mg_scratch *ss, *ps, *gs;   /* states, parameters, gradients; any may be NULL */
    size_t win;          /* floats of one array in a window */
    float *buf[NBUF];    /* each: the parameters' window, the gradients', each state's */
    float gscale;        /* the next step's factor of gradients read from gs */
    pthread_t th;
    bool started, quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    io_job q[NBUF + 1];
    unsigned head, tail;   /* jobs done, jobs submitted */
    mg_status err;
    char msg[1024];
} offload;

struct mg_optim {
    mg_optim_config cfg;
    /* The arena ranges the state covers, ascending and disjoint; state of
     * range k is floats [off[k], off[k] + hi - lo) of each state array. */
    int nr;
    mg_range *r;
    size_t *off;
    size_t base, end;    /* the hull: r[0].lo, r[nr - 1].hi */
    size_t n;            /* floats per state: the ranges' total length */
    long steps;
    float lr;                 /* learning rate of the current step */
    int nstates;
    const char *state_names[MAX_STATES];
    bool state_nonneg[MAX_STATES];   /* a mean of squares: never below 0 */
    float *state[MAX_STATES];   /* NULL when offloaded */
    offload *off_;
    mg_device dev;            /* where the state is (mg_optim_to_device) */
    mg_dk *dk;
    /* Parameter groups: segments tiling [0, n), each with its weight decay
     * and that step's coefficients. One segment without groups. */
    int nseg;
    struct seg {
        size_t lo, hi;
        float wd;
        double wd_dec;   /* wd as the decimal the user wrote (see dec) */
        mg__sgd_coef sgd;
        mg__adam_coef adam;
    } *seg;
};

/* The double nearest the shortest decimal that rounds to x (0.9f -> 0.9). */
static double dec(float x)
{
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)x);
        double d = strtod(buf, NULL);
        if ((float)d == x) return d;
    }
    return (double)x;
}

mg_optim_config mg_optim_defaults(mg_optim_kind kind, float lr)
{
    mg_optim_config c = {0};
    c.kind = kind;
    c.lr = lr;
    c.beta1 = 0.9f;
    c.beta2 = 0.999f;
    c.eps = 1e-8f;
    c.weight_decay = kind == MG_OPTIM_ADAMW ? 0.01f : 0.0f;
    return c;
}

static const char *const kind_names[] = {"sgd", "adam", "adamw"};

mg_status mg_optim_parse(const char *name, mg_optim_kind *out)
{
    for (int k = 0; k < 3; k++)
        if (name && strcasecmp(name, kind_names[k]) == 0) {
            *out = (mg_optim_kind)k;
            return MG_OK;
        }
    return mg_error(MG_EINVAL, "unknown optimizer '%s': use sgd, adam or adamw",
                    name ? name : "(null)");
}

const char *mg_optim_kind_name(mg_optim_kind kind)
{
    MG_ASSERT(kind >= MG_OPTIM_SGD && kind <= MG_OPTIM_ADAMW);
    return kind_names[kind];
}

static mg_status check_config(const mg_optim_config *c)
{
    if (c->kind < MG_OPTIM_SGD || c->kind > MG_OPTIM_ADAMW)
        return mg_error(MG_EINVAL, "optimizer: unknown kind %d", (int)c->kind);
    if (!(c->lr >= 0.0f) || !isfinite(c->lr))
        return mg_error(MG_EINVAL, "optimizer: learning rate %g must be finite and >= 0",
                        (double)c->lr);
    if (!(c->weight_decay >= 0.0f) || !isfinite(c->weight_decay))
        return mg_error(MG_EINVAL, "optimizer: weight decay %g must be finite and >= 0",
                        (double)c->weight_decay);
    if (c->kind == MG_OPTIM_SGD) {
        if (!(c->momentum >= 0.0f) || !isfinite(c->momentum))
            return mg_error(MG_EINVAL, "sgd: momentum %g must be finite and >= 0",
                            (double)c->momentum);
        if (!(c->dampening >= 0.0f && c->dampening <= 1.0f))
            return mg_error(MG_EINVAL, "sgd: dampening %g must be in [0, 1]",
                            (double)c->dampening);
        if (c->nesterov && (c->momentum <= 0.0f || c->dampening != 0.0f))
            return mg_error(MG_EINVAL,
                            "sgd: Nesterov momentum needs momentum > 0 and dampening 0");
    } else {
        if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f) || !(c->beta2 >= 0.0f && c->beta2 < 1.0f))
            return mg_error(MG_EINVAL, "%s: betas (%g, %g) must be in [0, 1)",
                            kind_names[c->kind], (double)c->beta1, (double)c->beta2);
        if (!(c->eps >= 0.0f) || !isfinite(c->eps))
            return mg_error(MG_EINVAL, "%s: eps %g must be finite and >= 0",
                            kind_names[c->kind], (double)c->eps);
    }
    return MG_OK;
}

/* A state array of `bytes` on dev, zeroed: on the CPU mapped pages that
 * cost nothing until written, so that an optimizer offloaded before its
 * first step never holds its state in memory. */
static float *state_alloc(mg_device dev, size_t bytes)
{
    return dev.kind == MG_DEVICE_CPU ? mg_map_zero(bytes) : mg_device_alloc(dev, bytes);
}

static void state_free(mg_device dev, float *p, size_t bytes)
{
    if (dev.kind == MG_DEVICE_CPU) mg_unmap(p, bytes);
    else mg_device_free(dev, p);
}

static struct seg new_seg(size_t lo, size_t hi, float wd)
{
    return (struct seg){.lo = lo, .hi = hi, .wd = wd, .wd_dec = dec(wd)};
}

mg_status mg_optim_create(const mg_optim_config *cfg, size_t n, mg_optim **out)
{
    return mg_optim_create_range(cfg, 0, n, out);
}

mg_status mg_optim_create_range(const mg_optim_config *cfg, size_t lo, size_t hi, mg_optim **out)
{
    return mg_optim_create_ranges(cfg, &(mg_range){lo, hi}, 1, out);
}

mg_status mg_optim_create_ranges(const mg_optim_config *cfg, const mg_range *r, int nr,
                                 mg_optim **out)
{
    *out = NULL;
    MG_TRY(check_config(cfg));
    if (nr < 1) return mg_error(MG_EINVAL, "optimizer: no arena range to update");
    for (int k = 0; k < nr; k++)
        if (r[k].hi < r[k].lo || (k && r[k].lo < r[k - 1].hi))
            return mg_error(MG_EINVAL, "optimizer: range %d [%zu, %zu) is empty-reversed or "
                            "overlaps the one before: ranges must ascend", k, r[k].lo, r[k].hi);
    mg_optim *o = calloc(1, sizeof *o);
    if (!o) return mg_error(MG_ENOMEM, "optimizer: out of memory");
    o->cfg = *cfg;
    o->nr = nr;
    o->r = malloc(sizeof *o->r * (size_t)nr);
    o->off = malloc(sizeof *o->off * (size_t)nr);
    o->seg = calloc(1, sizeof *o->seg);
    if (!o->r || !o->off || !o->seg) {
        mg_optim_destroy(o);
        return mg_error(MG_ENOMEM, "optimizer: out of memory");
    }
    for (int k = 0; k < nr; k++) {
        o->r[k] = r[k];
        o->off[k] = o->n;
        o->n += r[k].hi - r[k].lo;
    }
    o->base = r[0].lo;
    o->end = r[nr - 1].hi;
    size_t n = o->n;
    o->lr = cfg->lr;
    o->nseg = 1;
    o->seg[0] = new_seg(o->base, o->end, cfg->weight_decay);
    o->nstates = mg_optim_states(cfg);
    if (cfg->kind == MG_OPTIM_SGD) {
        o->state_names[0] = "momentum_buffer";
    } else {
        o->state_names[0] = "exp_avg";
        o->state_names[1] = "exp_avg_sq";
        o->state_nonneg[1] = true;
    }
    for (int i = 0; i < o->nstates; i++) {
        if (n > SIZE_MAX / sizeof(float) ||
            !(o->state[i] = state_alloc(o->dev, n * sizeof(float)))) {
            const char *what = o->state_names[i];   /* a string constant: outlives o */
            mg_optim_destroy(o);
            return mg_error(MG_ENOMEM, "optimizer: cannot allocate %zu floats of %s state", n,
                            what);
        }
    }
    *out = o;
    return MG_OK;
}

static void offload_stop(offload *f);

void mg_optim_destroy(mg_optim *o)
{
    if (!o) return;
    offload_stop(o->off_);
    for (int i = 0; i < o->nstates; i++) state_free(o->dev, o->state[i], o->n * sizeof(float));
    free(o->r);
    free(o->off);
    free(o->seg);
    free(o);
}

const mg_optim_config *mg_optim_config_of(const mg_optim *o) { return &o->cfg; }

static int by_lo(const void *a, const void *b)
{
    const mg_optim_group *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

mg_status mg_optim_set_groups(mg_optim *o, const mg_optim_group *groups, int n)
{
    if (n < 0 || n > (1 << 20))
        return mg_error(MG_EINVAL, "optimizer: %d parameter groups", n);
    mg_optim_group *g = malloc(sizeof *g * (size_t)(n ? n : 1));
    struct seg *seg = calloc((size_t)(2 * n + 1), sizeof *seg);
    if (!g || !seg) {
        free(g);
        free(seg);
        return mg_error(MG_ENOMEM, "optimizer: out of memory for %d parameter groups", n);
    }
    if (n) memcpy(g, groups, sizeof *g * (size_t)n);
    qsort(g, (size_t)n, sizeof *g, by_lo);
    int ns = 0;
    size_t at = o->base, end = o->end;
    for (int i = 0; i < n; i++) {
        if (g[i].hi <= o->base || g[i].lo >= end) continue;   /* outside the range */
        if (g[i].lo < o->base) g[i].lo = o->base;
        if (g[i].hi > end) g[i].hi = end;
        if (g[i].lo < at || g[i].hi < g[i].lo ||
            !(g[i].weight_decay >= 0.0f) || !isfinite(g[i].weight_decay)) {
            mg_error(MG_EINVAL, "optimizer: parameter group [%zu, %zu) with weight decay %g "
                     "overlaps another or has a bad decay", g[i].lo, g[i].hi,
                     (double)g[i].weight_decay);
            free(g);
            free(seg);
            return MG_EINVAL;
        }
        if (g[i].lo > at) seg[ns++] = new_seg(at, g[i].lo, o->cfg.weight_decay);
        if (g[i].hi > g[i].lo) seg[ns++] = new_seg(g[i].lo, g[i].hi, g[i].weight_decay);
        at = g[i].hi;
    }
    if (at < end || ns == 0) seg[ns++] = new_seg(at, end, o->cfg.weight_decay);
    free(g);
    free(o->seg);
    o->seg = seg;
    o->nseg = ns;
    return MG_OK;
}

/* The step's coefficients: computed once, then each segment takes them
 * with its own weight decay. */
void mg_optim_begin_step(mg_optim *o, float lr)
{
    const mg_optim_config *c = &o->cfg;
    o->steps++;
    o->lr = lr;
    double lrd = dec(lr);
    mg__sgd_coef sgd = {0};
    mg__adam_coef adam = {0};
    if (c->kind == MG_OPTIM_SGD) {
        sgd = (mg__sgd_coef){
            .neg_lr = (float)-lrd,
            .mu = c->momentum,
            .one_minus_damp = (float)(1.0 - dec(c->dampening)),
            .nesterov = c->nesterov,
            .first = o->steps == 1,
        };
    } else {
        double b1 = dec(c->beta1), b2 = dec(c->beta2), t = (double)o->steps;
        double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        adam = (mg__adam_coef){
            .beta1 = c->beta1,
            .one_minus_beta1 = (float)(1.0 - b1),
            .beta2 = c->beta2,
            .one_minus_beta2 = (float)(1.0 - b2),
            .eps = c->eps,
            .neg_step_size = (float)-(lrd / bc1),
            .bc2_sqrt = (float)sqrt(bc2),
            .decay = 1.0f,
        };
    }
    for (int i = 0; i < o->nseg; i++) {
        struct seg *sg = &o->seg[i];
        sg->sgd = sgd;
        sg->adam = adam;
        if (c->kind == MG_OPTIM_SGD) sg->sgd.wd = sg->wd;
        else if (c->kind == MG_OPTIM_ADAM) sg->adam.wd = sg->wd;
        else sg->adam.decay = (float)(1.0 - lrd * sg->wd_dec);
    }
}

/* The range holding [lo, hi): its index; -1 and MG_EINVAL naming fn when
 * none holds it. */
static int range_of(const mg_optim *o, size_t lo, size_t hi, const char *fn)
{
    int a = 0, b = o->nr - 1;
    while (a < b) {   /* the last range starting at or before lo */
        int mid = (a + b + 1) / 2;
        if (o->r[mid].lo <= lo) a = mid;
        else b = mid - 1;
    }
    if (o->r[a].lo <= lo && lo <= hi && hi <= o->r[a].hi) return a;
    mg_error(MG_EINVAL, "%s: floats [%zu, %zu) lie in none of the optimizer's %d range(s) (the "
             "first [%zu, %zu)): give a part of one", fn, lo, hi, o->nr, o->r[0].lo, o->r[0].hi);
    return -1;
}

/* Update floats [a, b) of range k, given where parameter, gradient and
 * each state of float a are: each weight-decay segment steps with its own
 * coefficients. */
static void apply(const mg_optim *o, size_t a, size_t b, float *p, const float *g,
                  float *const st[MAX_STATES])
{
    size_t a0 = a;
    for (int i = 0; i < o->nseg && a < b; i++) {
        const struct seg *sg = &o->seg[i];
        if (sg->hi <= a) continue;
        size_t e = b < sg->hi ? b : sg->hi, d = a - a0;
        if (o->cfg.kind == MG_OPTIM_SGD)
            mg__sgd_update(p + d, g + d, st[0] ? st[0] + d : NULL, e - a, &sg->sgd);
        else
            mg__adam_update(p + d, g + d, st[0] + d, st[1] + d, e - a, &sg->adam);
        a = e;
    }
}

static mg_status stream(mg_optim *o, float *params, const float *grads, size_t lo, size_t hi);

mg_status mg_optim_update(mg_optim *o, float *params, const float *grads, size_t lo, size_t hi)
{
    if (o->steps <= 0)
        return mg_error(MG_EINVAL, "mg_optim_update: no step begun: call mg_optim_begin_step "
                        "first");
    int k = range_of(o, lo, hi, "mg_optim_update");
    if (k < 0) return MG_EINVAL;
    if (o->off_) return stream(o, params, grads, lo, hi);
    float *st[MAX_STATES] = {NULL, NULL};
    for (int s = 0; s < o->nstates; s++) st[s] = o->state[s] + o->off[k] + (lo - o->r[k].lo);
    mg_dk *prev = mg__dk_enter(o->dk);
    apply(o, lo, hi, params + lo, grads + lo, st);
    mg__dk_leave(prev);
    return MG_OK;
}

mg_status mg_optim_to_device(mg_optim *o, mg_device dev)
{
    if (dev.kind == o->dev.kind && dev.index == o->dev.index) return MG_OK;
    if (o->off_)
        return mg_error(MG_EUNSUPPORTED, "optimizer: offloaded state does not move to a device");
    mg_dk *dk;
    MG_TRY(mg__dk_get(dev, &dk));
    float *st[MAX_STATES] = {NULL, NULL};
    mg_status e = MG_OK;
    for (int i = 0; i < o->nstates && !e; i++) {
        st[i] = state_alloc(dev, o->n * sizeof(float));
        e = st[i] ? mg_device_copy(dev, st[i], o->dev, o->state[i], o->n * sizeof(float))
                  : mg_error(MG_ENOMEM, "optimizer: cannot allocate %zu floats of %s state on "
                             "the device", o->n, o->state_names[i]);
    }
    for (int i = 0; i < o->nstates; i++) {
        float *drop = e ? st[i] : o->state[i];
        state_free(e ? dev : o->dev, drop, o->n * sizeof(float));
        if (!e) o->state[i] = st[i];
    }
    if (e) return e;
    o->dev = dev;
    o->dk = dk;
    return MG_OK;
}

mg_device mg_optim_device(const mg_optim *o) { return o->dev; }

mg_status mg_optim_step(mg_optim *o, float *params, const float *grads, float lr)
{
    mg_optim_begin_step(o, lr);
    if (o->off_) return stream(o, params, grads, o->base, o->end);
    for (int k = 0; k < o->nr; k++) mg_optim_update(o, params, grads, o->r[k].lo, o->r[k].hi);
    return MG_OK;
}

/* ---- offload ---------------------------------------------------------------- */

/* Byte offset in a store of float x of range k: of the parameters
 * (state -1) or of state s. */
static uint64_t store_off(const mg_optim *o, int k, size_t x, int s)
{
    return ((uint64_t)(s < 0 ? 0 : s) * o->n + o->off[k] + (x - o->r[k].lo)) * sizeof(float);
}

/* Read or write one window's parameters and states. */
static mg_status window_io(mg_optim *o, const io_job *j)
{
    offload *f = o->off_;
    size_t len = (j->b - j->a) * sizeof(float);
    float *buf = f->buf[j->buf];
    uint64_t at = store_off(o, j->k, j->a, -1);
    if (f->ps)
        MG_TRY(j->op == IO_READ ? mg_scratch_read(f->ps, buf, len, at)
                                : mg_scratch_write(f->ps, buf, len, at));
    if (f->gs && j->op == IO_READ) MG_TRY(mg_scratch_read(f->gs, buf + f->win, len, at));
    for (int s = 0; f->ss && s < o->nstates; s++) {
        float *w = buf + (size_t)(2 + s) * f->win;
        uint64_t at = store_off(o, j->k, j->a, s);
        MG_TRY(j->op == IO_READ ? mg_scratch_read(f->ss, w, len, at)
                                : mg_scratch_write(f->ss, w, len, at));
    }
    return MG_OK;
}

static void *io_thread(void *arg)
{
    mg_optim *o = arg;
    offload *f = o->off_;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (f->head == f->tail && !f->quit) pthread_cond_wait(&f->cv, &f->mu);
        if (f->head == f->tail) break;
        io_job j = f->q[f->head % (NBUF + 1)];
        bool skip = f->err != MG_OK;
        pthread_mutex_unlock(&f->mu);
        mg_status st = skip ? MG_OK : window_io(o, &j);
        pthread_mutex_lock(&f->mu);
        if (st && !f->err) {
            f->err = st;
            snprintf(f->msg, sizeof f->msg, "%s", mg_last_error());
        }
        f->head++;
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* Queue a job; its sequence number. */
static unsigned submit(offload *f, io_job j)
{
    pthread_mutex_lock(&f->mu);
    while (f->tail - f->head >= NBUF + 1) pthread_cond_wait(&f->cv, &f->mu);
    unsigned seq = f->tail++;
    f->q[seq % (NBUF + 1)] = j;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return seq;
}

/* Wait until job seq is done; the first error of any job so far. */
static mg_status wait_job(offload *f, unsigned seq)
{
    pthread_mutex_lock(&f->mu);
    while ((int)(f->head - seq) <= 0) pthread_cond_wait(&f->cv, &f->mu);
    mg_status st = f->err;
    pthread_mutex_unlock(&f->mu);
    return st;
}

/* The windows of [lo, hi) in range order: the j-th into *w; false past
 * the last. */
static bool window_at(const mg_optim *o, size_t lo, size_t hi, size_t j, io_job *w)
{
    for (int k = 0; k < o->nr; k++) {
        size_t a = o->r[k].lo > lo ? o->r[k].lo : lo, b = o->r[k].hi < hi ? o->r[k].hi : hi;
        if (a >= b) continue;
        size_t nw = (b - a + o->off_->win - 1) / o->off_->win;
        if (j < nw) {
            a += j * o->off_->win;
            *w = (io_job){.k = k, .a = a, .b = b - a > o->off_->win ? a + o->off_->win : b};
            return true;
        }
        j -= nw;
    }
    return false;
}

/* An offloaded update of [lo, hi): window j + 1 is read while j is
 * updated and j - 1 written back (the queue runs in order, so a buffer is
 * read again only after its last window is written). */
static mg_status stream(mg_optim *o, float *params, const float *grads, size_t lo, size_t hi)
{
    offload *f = o->off_;
    io_job w[NBUF];
    unsigned rd[NBUF] = {0}, last = 0;
    bool any = false;
    size_t j = 0;
    mg_status st = MG_OK;
    for (size_t r = 0; r < 2 && window_at(o, lo, hi, r, &w[r % NBUF]); r++) {
        w[r % NBUF].op = IO_READ;
        w[r % NBUF].buf = (int)(r % NBUF);
        rd[r % NBUF] = last = submit(f, w[r % NBUF]);
        any = true;
    }
    for (; any && !st && window_at(o, lo, hi, j, &w[j % NBUF]); j++) {
        io_job *x = &w[j % NBUF];
        if ((st = wait_job(f, rd[j % NBUF]))) break;
        float *buf = f->buf[j % NBUF], *st_[MAX_STATES] = {NULL, NULL};
        for (int s = 0; s < o->nstates; s++)
            st_[s] = f->ss ? buf + (size_t)(2 + s) * f->win
                           : o->state[s] + o->off[x->k] + (x->a - o->r[x->k].lo);
        float *gw = buf + f->win;
        if (f->gs && f->gscale != 1.0f) mg_grad_scale(gw, x->b - x->a, f->gscale);
        apply(o, x->a, x->b, f->ps ? buf : params + x->a, f->gs ? gw : grads + x->a, st_);
        x->op = IO_WRITE;
        x->buf = (int)(j % NBUF);
        last = submit(f, *x);
        io_job *y = &w[(j + 2) % NBUF];
        if (window_at(o, lo, hi, j + 2, y)) {
            y->op = IO_READ;
            y->buf = (int)((j + 2) % NBUF);
            rd[(j + 2) % NBUF] = last = submit(f, *y);
        }
    }
    if (any) {
        mg_status e = wait_job(f, last);
        if (!st) st = e;
    }
    f->gscale = 1.0f;
    if (st) {
        pthread_mutex_lock(&f->mu);
        st = mg_error(f->err ? f->err : st, "%s", f->err ? f->msg : mg_last_error());
        pthread_mutex_unlock(&f->mu);
    }
    return st;
}

static void offload_stop(offload *f)
{
    if (!f) return;
    if (f->started) {
        pthread_mutex_lock(&f->mu);
        f->quit = true;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->th, NULL);
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->cv);
    }
    for (int b = 0; b < NBUF; b++) mg_free(f->buf[b]);
    mg_scratch_destroy(f->ss);
    free(f);
}

/* Floats of one array in a window of an optimizer of n floats: the
 * window's bytes in whole SIMD blocks, at most n's. */
static size_t window_floats(size_t n, size_t window_bytes)
{
    size_t win = window_bytes / sizeof(float);
    win = win < MG_SIMD_FLOATS ? MG_SIMD_FLOATS : win / MG_SIMD_FLOATS * MG_SIMD_FLOATS;
    win = win < n ? win : (n + MG_SIMD_FLOATS - 1) / MG_SIMD_FLOATS * MG_SIMD_FLOATS;
    return win ? win : MG_SIMD_FLOATS;
}

/* The windows' bytes: NBUF buffers of the parameters', the gradients'
 * and each state's window. */
static size_t windows_bytes(int states, size_t win)
{
    return NBUF * (size_t)(2 + states) * win * sizeof(float);
}

size_t mg_optim_offload_bytes(const mg_optim_config *cfg, size_t n, size_t window_bytes)
{
    return windows_bytes(mg_optim_states(cfg), window_floats(n, window_bytes));
}

mg_status mg_optim_offload(mg_optim *o, const char *dir, size_t window_bytes, mg_scratch *params,
                           mg_scratch *grads)
{
    MG_ASSERT(!o->off_);
    if (!dir && !params && !grads) return MG_OK;
    offload *f = calloc(1, sizeof *f);
    if (!f) return mg_error(MG_ENOMEM, "optimizer offload: out of memory");
    f->win = window_floats(o->n, window_bytes);
    f->ps = params;
    f->gs = grads;
    f->gscale = 1.0f;
    mg_status st = MG_OK;
    for (int i = 0; i < 2 && !st; i++) {
        mg_scratch *x = i ? grads : params;
        if (x && mg_scratch_size(x) < (uint64_t)o->n * sizeof(float))
            st = mg_error(MG_EINVAL, "optimizer offload: the %s file holds %llu bytes, the "
                          "optimizer's ranges %zu", i ? "gradient" : "parameter",
                          (unsigned long long)mg_scratch_size(x), o->n * sizeof(float));
    }
    if (!st && dir && o->nstates)
        st = mg_scratch_create(dir, (uint64_t)o->n * (uint64_t)o->nstates * sizeof(float),
                             "optimizer state", &f->ss);
    /* What a stepped optimizer holds goes into the file; a new one's
     * zeros are the reserved file's. */
    for (int s = 0; !st && f->ss && o->steps > 0 && s < o->nstates; s++)
        st = mg_scratch_write(f->ss, o->state[s], o->n * sizeof(float),
                            (uint64_t)s * o->n * sizeof(float));
    size_t one = windows_bytes(o->nstates, f->win) / NBUF;
    for (int b = 0; !st && b < NBUF; b++)
        if (!(f->buf[b] = mg_alloc(one)))
            st = mg_error(MG_ENOMEM, "optimizer offload: cannot allocate a window of %zu bytes",
                          one);
    if (!st) {
        pthread_mutex_init(&f->mu, NULL);
        pthread_cond_init(&f->cv, NULL);
        o->off_ = f;
        if (pthread_create(&f->th, NULL, io_thread, o) != 0) {
            o->off_ = NULL;
            pthread_mutex_destroy(&f->mu);
            pthread_cond_destroy(&f->cv);
            st = mg_error(MG_EIO, "optimizer offload: cannot start the I/O thread");
        } else {
            f->started = true;
        }
    }
    if (st) {
        f->ps = f->gs = NULL;   /* the caller's */
        offload_stop(f);
        o->off_ = NULL;
        return st;
    }
    if (f->ss)
        for (int s = 0; s < o->nstates; s++) {
            state_free(o->dev, o->state[s], o->n * sizeof(float));
            o->state[s] = NULL;
        }
    return MG_OK;
}

bool mg_optim_offloaded(const mg_optim *o) { return o->off_ && o->off_->ss; }

void mg_optim_scale_grads(mg_optim *o, float coef)
{
    MG_ASSERT(o->off_ && o->off_->gs);
    o->off_->gscale = coef;
}

/* Copy state s (-1: the parameters in the parameter file) of [lo, hi),
 * which lies in one range, out of the optimizer or into it. */
static mg_status copy_state_(mg_optim *o, int s, size_t lo, size_t hi, float *buf, bool in)
{
    offload *f = o->off_;
    mg_scratch *store = !f ? NULL : s < 0 ? f->ps : f->ss;
    if (s < -1 || s >= o->nstates || (s < 0 && !store))
        return mg_error(MG_EINVAL, "optimizer state %d: it has %d (-1: the parameters, only "
                        "when offloaded)", s, o->nstates);
    int k = range_of(o, lo, hi, in ? "mg_optim_write_state" : "mg_optim_read_state");
    if (k < 0) return MG_EINVAL;
    size_t len = (hi - lo) * sizeof(float);
    if (store) {
        uint64_t at = store_off(o, k, lo, s);
        return in ? mg_scratch_write(store, buf, len, at) : mg_scratch_read(store, buf, len, at);
    }
    float *x = o->state[s] + o->off[k] + (lo - o->r[k].lo);
    memcpy(in ? x : buf, in ? buf : x, len);
    return MG_OK;
}

mg_status mg_optim_read_state(mg_optim *o, int s, size_t lo, size_t hi, float *dst)
{
    return copy_state_(o, s, lo, hi, dst, false);
}

mg_status mg_optim_write_state(mg_optim *o, int s, size_t lo, size_t hi, const float *src)
{
    return copy_state_(o, s, lo, hi, (float *)src, true);
}

long mg_optim_steps(const mg_optim *o) { return o->steps; }

int mg_optim_num_ranges(const mg_optim *o) { return o->nr; }
mg_range mg_optim_range_at(const mg_optim *o, int k)
{
    MG_ASSERT(k >= 0 && k < o->nr);
    return o->r[k];
}
int mg_optim_states(const mg_optim_config *cfg)
{
    return cfg->kind != MG_OPTIM_SGD ? 2 : cfg->momentum != 0.0f;
}

size_t mg_optim_size(const mg_optim *o) { return o->n; }
size_t mg_optim_bytes(const mg_optim *o)
{
    if (!o->off_) return o->n * (size_t)o->nstates * sizeof(float);
    /* The windows, and the states the file does not hold. */
    return windows_bytes(o->nstates, o->off_->win) +
           (o->off_->ss ? 0 : o->n * (size_t)o->nstates * sizeof(float));
}

float *mg_optim_state_at(mg_optim *o, int i, size_t lo, size_t hi)
{
    MG_ASSERT(i >= 0 && i < o->nstates && o->state[i]);
    int k = range_of(o, lo, hi, "mg_optim_state_at");
    if (k < 0) return NULL;
    return o->state[i] + o->off[k] + (lo - o->r[k].lo);
}

void mg_optim_set_steps(mg_optim *o, long steps)
{
    MG_ASSERT(steps >= 0);
    o->steps = steps;
}

int mg_optim_num_states(const mg_optim *o) { return o->nstates; }

float *mg_optim_state(mg_optim *o, int i, const char **name)
{
    MG_ASSERT(i >= 0 && i < o->nstates);
    if (name) *name = o->state_names[i];
    return o->state[i];
}

bool mg_optim_state_nonnegative(const mg_optim *o, int i)
{
    MG_ASSERT(i >= 0 && i < o->nstates);
    return o->state_nonneg[i];
}

double mg_grad_sumsq(const float *g, size_t n)
{
    if (mg__dk_cur) return mg_dk_sumsq(g, n);
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

float mg_clip_coef(double norm, float max_norm)
{
    /* torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), at most 1;
     * a norm that is NaN makes every gradient NaN, as torch's clamp does
     * (1 would apply the step's other gradients unclipped). The norm is a
     * double: gradients whose float norm would overflow are clipped, where
     * torch's float32 norm is inf and zeroes them. */
    float coef = (float)(dec(max_norm) / (norm + 1e-6));
    return coef >= 1.0f ? 1.0f : coef;
}

void mg_grad_scale(float *g, size_t n, float s)
{
    if (mg__dk_cur) {
        mg_dk_scale(g, n, s);
        return;
    }
    for (size_t i = 0; i < n; i++) g[i] *= s;
}

double mg_clip_grad_norm(float *g, size_t n, float max_norm)
{
    double norm = sqrt(mg_grad_sumsq(g, n));
    mg_grad_scale(g, n, mg_clip_coef(norm, max_norm));
    return norm;
}
