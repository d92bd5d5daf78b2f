/* Parameter-free layers: ReLU, average and max pooling (k x k, stride s,
 * floor mode), flatten, and inverted dropout whose mask is a pure function
 * of (seed, layer, step), so a run (or a resumed run) draws the same masks.
 * The zoo fuses ReLU and pooling into its convolutions; these layers serve
 * other architectures and are tested against the fused path. */
#include <string.h>
#include "nn/layer.h"

/* ---- ReLU ---- */

static void relu_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    mg_relu_forward(y, x, (size_t)n * mg__per_image(l->in));
}

static void relu_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                          float *dy, float *dx, int n)
{
    if (dx) mg_relu_backward(dx, dy, y, (size_t)n * mg__per_image(l->in));
}

static const mg_layer_vt relu_vt = {
    .kind = "relu", .on_device = true, .setup = mg__same_setup, .sizes = mg__no_sizes,
    .forward = relu_forward, .backward = relu_backward,
};

mg_layer *mg_layer_relu(const char *name) { return mg__layer_alloc(sizeof(mg_layer), &relu_vt, name); }

/* ---- Pooling ---- */

typedef struct {
    mg_layer base;
    int k, s;
} pool_layer;

static mg_status pool_setup(mg_layer *l, const int in[3], int out[3])
{
    pool_layer *p = (pool_layer *)l;
    if (in[1] < p->k || in[2] < p->k)
        return mg_error(MG_EINVAL, "pool '%s' (%dx%d) is larger than its input %dx%d",
                        l->name, p->k, p->k, in[1], in[2]);
    out[0] = in[0];
    out[1] = (in[1] - p->k) / p->s + 1;
    out[2] = (in[2] - p->k) / p->s + 1;
    return MG_OK;
}

static void avgpool_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    pool_layer *p = (pool_layer *)l;
    mg_avgpool2d_forward(y, x, n * l->in[0], l->in[1], l->in[2], p->k, p->s);
}

static void avgpool_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                             float *dy, float *dx, int n)
{
    pool_layer *p = (pool_layer *)l;
    if (dx) mg_avgpool2d_backward(dx, dy, n * l->in[0], l->in[1], l->in[2], p->k, p->s);
}

static const mg_layer_vt avgpool_vt = {
    .kind = "avgpool2d", .on_device = true, .setup = pool_setup, .sizes = mg__no_sizes,
    .forward = avgpool_forward, .backward = avgpool_backward,
};

static void maxpool_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    *saved = (size_t)n * mg__per_image(l->out) * sizeof(int32_t);
    *scratch = 0;
}

static void maxpool_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    pool_layer *p = (pool_layer *)l;
    mg_maxpool2d_forward(y, (int32_t *)mg__saved(l, c), x, n * l->in[0], l->in[1], l->in[2], p->k,
                         p->s);
}

static void maxpool_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                             float *dy, float *dx, int n)
{
    pool_layer *p = (pool_layer *)l;
    if (dx)
        mg_maxpool2d_backward(dx, dy, (const int32_t *)mg__saved(l, c), n * l->in[0], l->in[1],
                              l->in[2], p->k, p->s);
}

static const mg_layer_vt maxpool_vt = {
    .kind = "maxpool2d", .on_device = true, .setup = pool_setup, .sizes = maxpool_sizes,
    .forward = maxpool_forward, .backward = maxpool_backward,
};

static mg_layer *pool_new(const char *name, int k, int s, const mg_layer_vt *vt)
{
    MG__LAYER_RULE(k > 0 && s > 0, "%s '%s': kernel %d, stride %d: give 1 or more of each",
                   vt->kind, name ? name : "", k, s);
    pool_layer *p = (pool_layer *)mg__layer_alloc(sizeof *p, vt, name);
    if (!p) return NULL;
    p->k = k;
    p->s = s;
    return &p->base;
}

mg_layer *mg_layer_avgpool2d(const char *name, int k, int stride)
{
    return pool_new(name, k, stride, &avgpool_vt);
}

mg_layer *mg_layer_maxpool2d(const char *name, int k, int stride)
{
    return pool_new(name, k, stride, &maxpool_vt);
}

/* ---- Flatten ---- */

static mg_status flatten_setup(mg_layer *l, const int in[3], int out[3])
{
    out[0] = (int)mg__per_image(in);
    out[1] = out[2] = 1;
    return MG_OK;
}

static void copy_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    mg_copy_floats(y, x, (size_t)n * mg__per_image(l->in));
}

static void copy_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                          float *dy, float *dx, int n)
{
    if (dx) mg_copy_floats(dx, dy, (size_t)n * mg__per_image(l->in));
}

static const mg_layer_vt flatten_vt = {
    .kind = "flatten", .on_device = true, .setup = flatten_setup, .sizes = mg__no_sizes,
    .forward = copy_forward, .backward = copy_backward,
};

mg_layer *mg_layer_flatten(const char *name)
{
    return mg__layer_alloc(sizeof(mg_layer), &flatten_vt, name);
}

/* ---- Dropout ---- */

typedef struct {
    mg_layer base;
    float p;
} dropout_layer;

static void dropout_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    *saved = (size_t)n * mg__per_image(l->in);
    *scratch = 0;
}

/* Each dropout layer draws from its own stream; each training step from
 * its own 2^32-block window of it. */
static uint64_t dropout_stream(const mg_layer *l, uint64_t seed)
{
    return seed ^ ((uint64_t)(l->id + 1) * 0x9E3779B97F4A7C15ull);
}

static void dropout_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    dropout_layer *d = (dropout_layer *)l;
    size_t m = (size_t)n * mg__per_image(l->in);
    if (!c->training || d->p == 0.0f) {
        mg_copy_floats(y, x, m);
        return;
    }
    uint8_t *keep = (uint8_t *)mg__saved(l, c);
    mg_dropout_mask(keep, m, d->p, dropout_stream(l, c->dropout_seed), c->step << 32);
    mg_dropout_apply(y, x, keep, m, d->p);
}

static void dropout_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                             float *dy, float *dx, int n)
{
    dropout_layer *d = (dropout_layer *)l;
    size_t m = (size_t)n * mg__per_image(l->in);
    if (!dx) return;
    if (!c->training || d->p == 0.0f)
        mg_copy_floats(dx, dy, m);
    else
        mg_dropout_apply(dx, dy, (const uint8_t *)mg__saved(l, c), m, d->p);
}

static const mg_layer_vt dropout_vt = {
    .kind = "dropout", .on_device = true, .setup = mg__same_setup, .sizes = dropout_sizes,
    .forward = dropout_forward, .backward = dropout_backward,
};

mg_layer *mg_layer_dropout(const char *name, float p)
{
    MG__LAYER_RULE(p >= 0.0f && p < 1.0f, "dropout '%s': p %g: give 0 <= p < 1",
                   name ? name : "", p);
    dropout_layer *d = (dropout_layer *)mg__layer_alloc(sizeof *d, &dropout_vt, name);
    if (!d) return NULL;
    d->p = p;
    return &d->base;
}
