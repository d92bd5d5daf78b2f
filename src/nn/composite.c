/* Composite layers: Sequential (children in a chain) and Residual
 * (y = branch(x) + shortcut(x), optional ReLU; shortcut NULL = identity).
 * They own their children, keep the children's outputs in their saved
 * memory (backward needs them), and give each child a slice of their own
 * saved memory and the scratch beyond what they use themselves.
 *
 * Sequential's backward passes the gradient between children through the
 * sequence's own dy and dx buffers where they are large enough, and
 * through scratch only where they are not (seq_plan): in gpt-mini that
 * is one activation-sized buffer per sequence instead of two. */
#include "multigrad/trace.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nn/layer.h"

/* ---- Sequential -------------------------------------------------------- */

typedef struct {
    mg_layer base;
    bool *has_params;    /* child i (or its children) has parameters */
    int *gbuf;           /* where child i >= 1 writes its input gradient (G_*) */
    size_t gper[2];      /* floats per image of the two scratch gradient buffers */
} seq_layer;

/* Buffers for the gradient between child i-1 and child i. */
enum { G_DY, G_DX, G_S0, G_S1 };

bool mg__is_sequential(const mg_layer *l) { return strcmp(l->vt->kind, "sequential") == 0; }

static mg_status seq_setup(mg_layer *l, const int in[3], int out[3])
{
    if (l->n_child == 0)
        return mg_error(MG_EINVAL, "sequential '%s' has no layers; give it at least one",
                        l->name);
    int cur[3] = {in[0], in[1], in[2]};
    for (int i = 0; i < l->n_child; i++) {
        mg_layer *ch = l->child[i];
        memcpy(ch->in, cur, sizeof cur);
        MG_TRY(ch->vt->setup(ch, cur, ch->out));
        memcpy(cur, ch->out, sizeof cur);
    }
    memcpy(out, cur, sizeof cur);
    return MG_OK;
}

/* Where each child i >= 1 writes its input gradient (which child i-1
 * reads as its dy): the sequence's dy (a layer may overwrite its dy) or dx
 * (free until child 0 writes it) when large enough, else one of two
 * scratch buffers. A child never writes the buffer it reads, and child 1
 * never writes dx, which child 0 writes while reading child 1's gradient.
 * Every size is per image, so the choice holds for any batch. buf (may be
 * NULL) gets the choices, per the floats per image each scratch buffer
 * needs (0: unused). */
static void seq_plan(const mg_layer *l, int *buf, size_t per[2])
{
    size_t cap_dy = mg__per_image(l->out);
    size_t cap_dx = l->need_dx ? mg__per_image(l->in) : 0;
    per[0] = per[1] = 0;
    int prev = G_DY;
    for (int i = l->n_child - 1; i >= 1; i--) {
        size_t f = mg__per_image(l->child[i - 1]->out);
        int b;
        if (prev != G_DY && f <= cap_dy) b = G_DY;
        else if (prev != G_DX && i > 1 && f <= cap_dx) b = G_DX;
        else b = prev == G_S0 ? G_S1 : G_S0;
        if (b >= G_S0 && f > per[b - G_S0]) per[b - G_S0] = f;
        if (buf) buf[i] = b;
        prev = b;
    }
}

/* Floats of scratch gradient buffer k at batch n, aligned. */
static size_t seq_gfloats(const size_t per[2], int n, int k)
{
    return mg__align((size_t)n * per[k] * sizeof(float)) / sizeof(float);
}

static void seq_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    size_t sv = 0, sc = 0, per[2];
    for (int i = 0; i < l->n_child; i++) {
        const mg_layer *ch = l->child[i];
        size_t a, b;
        ch->vt->sizes(ch, n, &a, &b);
        sv += mg__align(a);
        if (b > sc) sc = b;
        if (i + 1 < l->n_child) sv += mg__align((size_t)n * mg__per_image(ch->out) * sizeof(float));
    }
    seq_plan(l, NULL, per);
    *saved = sv;
    *scratch = seq_gfloats(per, n, 0) + seq_gfloats(per, n, 1) + sc;
}

/* Child i's memory, then its output (slot 1 + i), for each child. */
static void seq_bind(mg_layer *l, int n, char **slot)
{
    char *p = slot[l->slot];
    for (int i = 0; i < l->n_child; i++) {
        mg_layer *ch = l->child[i];
        p = mg__bind_child(ch, n, p, slot);
        if (i + 1 < l->n_child) {
            slot[l->slot + 1 + i] = p;
            p += mg__align((size_t)n * mg__per_image(ch->out) * sizeof(float));
        }
    }
}

static void seq_propagate(mg_layer *l)
{
    seq_layer *s = (seq_layer *)l;
    bool before = l->need_dx;
    for (int i = 0; i < l->n_child; i++) {
        mg_layer *ch = l->child[i];
        s->has_params[i] = mg__layer_has_params(ch);
        ch->need_dx = before;
        if (ch->vt->propagate) ch->vt->propagate(ch);
        before = before || s->has_params[i];
    }
    seq_plan(l, s->gbuf, s->gper);
}

/* MG_TRACE: one event per child layer and pass (see trace.h). */
static void trace_layer(const mg_layer *l, const char *pass, double t0)
{
    char name[64];
    snprintf(name, sizeof name, "%s %s", l->name, pass);
    mg_trace_event(name, pass, 0, t0, mg_trace_now());
}

/* The children a call runs: all, or k's range [first, last). */
typedef struct { int a, b; } span;
static span seq_span(const mg_layer *l, const mg__seq_calls *k)
{
    return k && k->last ? (span){k->first, k->last} : (span){0, l->n_child};
}

/* Child i's input and output in a call over children r (x, y: the
 * call's input and output). */
static const float *seq_in(const mg_layer *l, const mg_ctx *c, const float *x, int i, span r)
{
    return i == r.a ? x : (const float *)mg__slot(l, c, i);
}

static float *seq_out(const mg_layer *l, const mg_ctx *c, const float *y, int i, span r)
{
    return i + 1 == r.b ? (float *)y : (float *)mg__slot(l, c, 1 + i);
}

static void seq_child_forward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                              int i, int n, span r)
{
    double t0 = mg_trace_on() ? mg_trace_now() : 0;
    mg_layer *ch = l->child[i];
    ch->vt->forward(ch, c, seq_in(l, c, x, i, r), seq_out(l, c, y, i, r), n);
    if (t0) trace_layer(ch, c->recompute ? "recompute" : "forward", t0);
}

/* The scratch past the two gradient buffers of the whole sequence's
 * plan; a range's call brings its own buffers (k->gbuf). */
static float *seq_scratch(const mg_layer *l, const mg_ctx *c, int n, const mg__seq_calls *k)
{
    const seq_layer *s = (const seq_layer *)l;
    if (k && k->last) return c->scratch;
    return c->scratch + seq_gfloats(s->gper, n, 0) + seq_gfloats(s->gper, n, 1);
}

void mg__seq_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n,
                     const mg__seq_calls *k)
{
    span r = seq_span(l, k);
    mg_ctx cc = *c;
    cc.scratch = seq_scratch(l, c, n, k);
    for (int i = r.a; i < r.b; i++) {
        if (k && k->before) k->before(k->ud, i, false);
        seq_child_forward(l, &cc, x, y, i, n, r);
        if (k && k->after) k->after(k->ud, i, false);
    }
}

static void seq_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    mg__seq_forward(l, c, x, y, n, NULL);
}

void mg__seq_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                      float *dy, float *dx, int n, const mg__seq_calls *k)
{
    seq_layer *s = (seq_layer *)l;
    span r = seq_span(l, k);
    mg_ctx cc = *c, rc;
    size_t g0 = seq_gfloats(s->gper, n, 0);
    float *bufs[] = {dy, dx, c->scratch, c->scratch + g0};
    cc.scratch = seq_scratch(l, c, n, k);
    rc = cc;
    rc.recompute = true;
    float *cur = dy;
    for (int i = r.b - 1; i >= r.a; i--) {
        mg_layer *ch = l->child[i];
        if (!ch->need_dx && !s->has_params[i]) break;
        if (k && k->before) k->before(k->ud, i, true);
        if (k && k->recompute && k->rerun[i]) seq_child_forward(l, &rc, x, y, i, n, r);
        float *dxo = NULL;
        /* A range alternates its two buffers: child i never writes the
         * one it reads (child i + 1's). */
        if (ch->need_dx)
            dxo = i == r.a ? dx : k && k->last ? k->gbuf[(r.b - 1 - i) & 1] : bufs[s->gbuf[i]];
        MG_ASSERT(i == r.a || dxo || !ch->need_dx);   /* the plan uses dx only under need_dx */
        double t0 = mg_trace_on() ? mg_trace_now() : 0;
        ch->vt->backward(ch, &cc, seq_in(l, c, x, i, r), seq_out(l, c, y, i, r), cur, dxo, n);
        if (t0) trace_layer(ch, "backward", t0);
        if (k && k->after) k->after(k->ud, i, true);
        if (!dxo) break;
        cur = dxo;
    }
}

static void seq_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                         float *dy, float *dx, int n)
{
    mg__seq_backward(l, c, x, y, dy, dx, n, NULL);
}

static void seq_destroy(mg_layer *l)
{
    seq_layer *s = (seq_layer *)l;
    free(s->has_params);
    free(s->gbuf);
}

static const mg_layer_vt seq_vt = {
    .kind = "sequential", .on_device = true, .setup = seq_setup, .sizes = seq_sizes, .bind = seq_bind,
    .propagate = seq_propagate, .forward = seq_forward, .backward = seq_backward,
    .destroy = seq_destroy,
};

mg_layer *mg_layer_sequential(const char *name, mg_layer *const *children, int n)
{
    bool ok = n >= 0;
    for (int i = 0; ok && i < n; i++) ok = children[i] != NULL;
    seq_layer *s = ok ? (seq_layer *)mg__layer_alloc(sizeof *s, &seq_vt, name) : NULL;
    if (s) {
        s->has_params = calloc((size_t)(n ? n : 1), sizeof *s->has_params);
        s->gbuf = calloc((size_t)(n ? n : 1), sizeof *s->gbuf);
        s->base.child = calloc((size_t)(n ? n : 1), sizeof *s->base.child);
        if (!s->has_params || !s->gbuf || !s->base.child) {
            free(s->has_params);
            free(s->gbuf);
            free(s->base.child);
            free(s);
            s = NULL;
        }
    }
    if (!s) {
        for (int i = 0; i < n; i++) mg_layer_destroy(children[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        s->base.child[i] = children[i];
        if (!children[i]->name[0] && !children[i]->anonymous) snprintf(children[i]->name, sizeof children[i]->name, "%d", i);
    }
    s->base.n_child = n;
    s->base.n_slots = n > 1 ? n : 1;
    return &s->base;
}

/* ---- Residual ---------------------------------------------------------- */

typedef struct {
    mg_layer base;
    bool relu;
} res_layer;

static mg_status res_setup(mg_layer *l, const int in[3], int out[3])
{
    mg_layer *b = l->child[0];
    memcpy(b->in, in, sizeof b->in);
    MG_TRY(b->vt->setup(b, in, b->out));
    const int *so = in;
    if (l->n_child > 1) {
        mg_layer *s = l->child[1];
        memcpy(s->in, in, sizeof s->in);
        MG_TRY(s->vt->setup(s, in, s->out));
        so = s->out;
    }
    if (memcmp(b->out, so, sizeof b->out) != 0)
        return mg_error(MG_EINVAL,
                        "residual '%s': branch output %dx%dx%d differs from shortcut "
                        "output %dx%dx%d; add a projection shortcut (1x1 conv)",
                        l->name, b->out[0], b->out[1], b->out[2], so[0], so[1], so[2]);
    memcpy(out, b->out, sizeof b->out);
    return MG_OK;
}

static void res_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    size_t sv, sc;
    mg__children_sizes(l, n, &sv, &sc);
    size_t out = mg__align((size_t)n * mg__per_image(l->out) * sizeof(float));
    size_t in = mg__align((size_t)n * mg__per_image(l->in) * sizeof(float));
    sv += out * (size_t)l->n_child;
    *saved = sv;
    *scratch = (out + in) / sizeof(float) + sc;
}

/* Floats of n outputs or inputs, aligned. */
static size_t res_floats(const int s[3], int n)
{
    return mg__align((size_t)n * mg__per_image(s) * sizeof(float)) / sizeof(float);
}

/* Slots 1 and 2: the branch's and the shortcut's outputs. */
static void res_bind(mg_layer *l, int n, char **slot)
{
    char *p = mg__bind_children(l, n, slot);
    slot[l->slot + 1] = p;
    slot[l->slot + 2] = l->n_child > 1 ? p + res_floats(l->out, n) * sizeof(float) : NULL;
}

static void res_propagate(mg_layer *l)
{
    for (int i = 0; i < l->n_child; i++) {
        l->child[i]->need_dx = l->need_dx;
        if (l->child[i]->vt->propagate) l->child[i]->vt->propagate(l->child[i]);
    }
}

static void res_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    res_layer *r = (res_layer *)l;
    mg_ctx cc = *c;
    cc.scratch = c->scratch + res_floats(l->out, n) + res_floats(l->in, n);
    size_t m = (size_t)n * mg__per_image(l->out);
    float *bo = (float *)mg__slot(l, c, 1);
    l->child[0]->vt->forward(l->child[0], &cc, x, bo, n);
    const float *so = x;
    if (l->n_child > 1) {
        so = (float *)mg__slot(l, c, 2);
        l->child[1]->vt->forward(l->child[1], &cc, x, (float *)so, n);
    }
    /* y = bo + so, ReLU'd: the tensor kernels, so it runs on a device. */
    mg_copy_floats(y, bo, m);
    mg_add_into(y, so, m);
    if (r->relu) mg_relu_forward(y, y, m);
}

static void res_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                         float *dy, float *dx, int n)
{
    res_layer *r = (res_layer *)l;
    mg_ctx cc = *c;
    float *dy2 = c->scratch, *tmp = c->scratch + res_floats(l->out, n);
    cc.scratch = tmp + res_floats(l->in, n);
    size_t m = (size_t)n * mg__per_image(l->out);
    if (r->relu) mg_relu_backward(dy, dy, y, m);
    /* The branch may overwrite dy; the shortcut needs it too. */
    mg_copy_floats(dy2, dy, m);
    mg_layer *b = l->child[0];
    if (dx || mg__layer_has_params(b))
        b->vt->backward(b, &cc, x, (float *)mg__slot(l, c, 1), dy, dx, n);
    if (l->n_child > 1) {
        mg_layer *s = l->child[1];
        if (dx || mg__layer_has_params(s)) {
            s->vt->backward(s, &cc, x, (float *)mg__slot(l, c, 2), dy2, dx ? tmp : NULL, n);
            size_t mi = (size_t)n * mg__per_image(l->in);
            if (dx) mg_add_into(dx, tmp, mi);
        }
    } else if (dx) {
        mg_add_into(dx, dy2, m);
    }
}

static const mg_layer_vt res_vt = {
    .kind = "residual", .on_device = true, .setup = res_setup, .sizes = res_sizes, .bind = res_bind,
    .propagate = res_propagate, .forward = res_forward, .backward = res_backward,
};

mg_layer *mg_layer_residual(const char *name, mg_layer *branch, mg_layer *shortcut,
                            bool relu)
{
    res_layer *r = branch ? (res_layer *)mg__layer_alloc(sizeof *r, &res_vt, name) : NULL;
    if (r) r->base.child = calloc(2, sizeof *r->base.child);
    if (!r || !r->base.child) {
        if (r) free(r);
        mg_layer_destroy(branch);
        mg_layer_destroy(shortcut);
        return NULL;
    }
    r->relu = relu;
    r->base.n_slots = 3;
    r->base.child[0] = branch;
    if (!branch->name[0]) snprintf(branch->name, sizeof branch->name, "branch");
    r->base.n_child = 1;
    if (shortcut) {
        r->base.child[1] = shortcut;
        if (!shortcut->name[0]) snprintf(shortcut->name, sizeof shortcut->name, "shortcut");
        r->base.n_child = 2;
    }
    return &r->base;
}
