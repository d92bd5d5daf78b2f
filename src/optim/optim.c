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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "multigrad/optim.h"
#include "optim_impl.h"

#define MAX_STATES 2

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
    float *state[MAX_STATES];
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
    MG_ASSERT(lo <= hi);
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
    if (cfg->kind == MG_OPTIM_SGD) {
        if (cfg->momentum != 0.0f) o->state_names[o->nstates++] = "momentum_buffer";
    } else {
        o->state_names[o->nstates++] = "exp_avg";
        o->state_names[o->nstates++] = "exp_avg_sq";
    }
    for (int i = 0; i < o->nstates; i++) {
        if (n > SIZE_MAX / sizeof(float) || !(o->state[i] = mg_alloc_zero(n * sizeof(float)))) {
            mg_optim_destroy(o);
            return mg_error(MG_ENOMEM, "optimizer: cannot allocate %zu floats of %s state",
                            n, o->state_names[i]);
        }
    }
    *out = o;
    return MG_OK;
}

void mg_optim_destroy(mg_optim *o)
{
    if (!o) return;
    for (int i = 0; i < o->nstates; i++) mg_free(o->state[i]);
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

/* The range holding [lo, hi): its index. */
static int range_of(const mg_optim *o, size_t lo, size_t hi)
{
    int a = 0, b = o->nr - 1;
    while (a < b) {   /* the last range starting at or before lo */
        int mid = (a + b + 1) / 2;
        if (o->r[mid].lo <= lo) a = mid;
        else b = mid - 1;
    }
    MG_ASSERT(o->r[a].lo <= lo && lo <= hi && hi <= o->r[a].hi);
    return a;
}

void mg_optim_update(mg_optim *o, float *params, const float *grads, size_t lo, size_t hi)
{
    MG_ASSERT(o->steps > 0);   /* begin_step first */
    int k = range_of(o, lo, hi);
    float *st[2] = {NULL, NULL};
    for (int i = 0; i < o->nseg && lo < hi; i++) {
        const struct seg *sg = &o->seg[i];
        if (sg->hi <= lo) continue;
        size_t a = lo, b = hi < sg->hi ? hi : sg->hi;
        for (int s = 0; s < o->nstates; s++) st[s] = o->state[s] + o->off[k] + (a - o->r[k].lo);
        if (o->cfg.kind == MG_OPTIM_SGD)
            mg__sgd_update(params + a, grads + a, st[0], b - a, &sg->sgd);
        else
            mg__adam_update(params + a, grads + a, st[0], st[1], b - a, &sg->adam);
        lo = b;
    }
}

void mg_optim_step(mg_optim *o, float *params, const float *grads, float lr)
{
    mg_optim_begin_step(o, lr);
    for (int k = 0; k < o->nr; k++) mg_optim_update(o, params, grads, o->r[k].lo, o->r[k].hi);
}

long mg_optim_steps(const mg_optim *o) { return o->steps; }

int mg_optim_num_ranges(const mg_optim *o) { return o->nr; }
mg_range mg_optim_range_at(const mg_optim *o, int k)
{
    MG_ASSERT(k >= 0 && k < o->nr);
    return o->r[k];
}
size_t mg_optim_size(const mg_optim *o) { return o->n; }
size_t mg_optim_bytes(const mg_optim *o) { return o->n * (size_t)o->nstates * sizeof(float); }

float *mg_optim_state_at(mg_optim *o, int i, size_t lo, size_t hi)
{
    MG_ASSERT(i >= 0 && i < o->nstates);
    int k = range_of(o, lo, hi);
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

double mg_grad_sumsq(const float *g, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

float mg_clip_coef(double norm, float max_norm)
{
    /* torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), at most 1. */
    float coef = (float)(dec(max_norm) / (norm + 1e-6));
    return coef < 1.0f ? coef : 1.0f;
}

void mg_grad_scale(float *g, size_t n, float s)
{
    for (size_t i = 0; i < n; i++) g[i] *= s;
}

double mg_clip_grad_norm(float *g, size_t n, float max_norm)
{
    double norm = sqrt(mg_grad_sumsq(g, n));
    mg_grad_scale(g, n, mg_clip_coef(norm, max_norm));
    return norm;
}
