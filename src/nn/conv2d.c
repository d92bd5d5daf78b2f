/* Conv2d layer (torch.nn.Conv2d, weight [out, in, k, k], bias [out]) with
 * an optional fused ReLU and 2x2/2 pool; the kernels are in
 * src/tensor/conv.c. Square kernels, groups 1, dilation 1. */
#include "nn/layer.h"

typedef struct {
    mg_layer base;
    int in_ch, out_ch, k, stride, pad;
    bool relu;
    mg_pool_kind pool;
    mg_conv2d_shape s;
} conv_layer;

static mg_status conv_setup(mg_layer *l, const int in[3], int out[3])
{
    conv_layer *cv = (conv_layer *)l;
    if (in[0] != cv->in_ch ||
        !mg_conv2d_shape_init(&cv->s, in[0], in[1], in[2], cv->out_ch, cv->k, cv->k,
                              cv->stride, cv->pad, cv->relu, cv->pool))
        return mg_error(MG_EINVAL,
                        "conv2d '%s' (%d->%d, %dx%d, stride %d, pad %d%s) does not fit "
                        "input %dx%dx%d",
                        l->name, cv->in_ch, cv->out_ch, cv->k, cv->k, cv->stride, cv->pad,
                        cv->pool != MG_POOL_NONE ? ", 2x2 pool" : "", in[0], in[1], in[2]);
    out[0] = cv->out_ch;
    out[1] = cv->s.ph;
    out[2] = cv->s.pw;
    return MG_OK;
}

static void conv_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    const conv_layer *cv = (const conv_layer *)l;
    *saved = mg_conv2d_saved_bytes(&cv->s) * (size_t)n;
    *scratch = mg_conv2d_workspace(&cv->s, n);
}

static void conv_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    conv_layer *cv = (conv_layer *)l;
    mg_conv2d_forward(y, (uint8_t *)mg__saved(l, c), x, l->p[0].data, l->p[1].data, &cv->s, n,
                      c->scratch);
}

static void conv_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                          float *dy, float *dx, int n)
{
    conv_layer *cv = (conv_layer *)l;
    mg_conv2d_backward(dx, mg__grad(l, c, 0), mg__grad(l, c, 1), dy, y,
                       (const uint8_t *)mg__saved(l, c), x, l->p[0].data, &cv->s, n, c->scratch);
}

static double conv_flops(const mg_layer *l)
{
    const mg_conv2d_shape *s = &((const conv_layer *)l)->s;
    return 2.0 * s->oc * s->c * s->kh * s->kw * s->oh * s->ow;
}

static const mg_layer_vt conv_vt = {
    .kind = "conv2d", .on_device = true, .setup = conv_setup, .sizes = conv_sizes,
    .forward = conv_forward, .backward = conv_backward, .flops = conv_flops,
};

mg_layer *mg_layer_conv2d(const char *name, int in_ch, int out_ch, int k, int stride,
                          int pad, bool relu, mg_pool_kind pool)
{
    MG__LAYER_RULE(in_ch > 0 && out_ch > 0 && k > 0 && stride > 0 && pad >= 0, "conv2d '%s': "
                   "%d -> %d channels, kernel %d, stride %d, padding %d: give channels, kernel "
                   "and stride of 1 or more, padding of 0 or more", name ? name : "", in_ch,
                   out_ch, k, stride, pad);
    conv_layer *cv = (conv_layer *)mg__layer_alloc(sizeof *cv, &conv_vt, name);
    if (!cv) return NULL;
    cv->in_ch = in_ch;
    cv->out_ch = out_ch;
    cv->k = k;
    cv->stride = stride;
    cv->pad = pad;
    cv->relu = relu;
    cv->pool = pool;
    mg__layer_param(&cv->base, "weight", false, 4, (int[]){out_ch, in_ch, k, k});
    mg__layer_param(&cv->base, "bias", false, 1, (int[]){out_ch});
    return &cv->base;
}
