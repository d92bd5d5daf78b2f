/* BatchNorm2d layer (torch.nn.BatchNorm2d(ch), eps 1e-5, momentum 0.1,
 * affine): parameters weight and bias, buffers running_mean and
 * running_var. num_batches_tracked is not kept (momentum is fixed, so
 * PyTorch only counts with it); load_state_dict(strict=False) skips it.
 * The kernels are in src/tensor/batchnorm.c. */
#include "nn/layer.h"

typedef struct {
    mg_layer base;
    int ch;
} bn_layer;

static mg_status bn_setup(mg_layer *l, const int in[3], int out[3])
{
    bn_layer *b = (bn_layer *)l;
    if (in[0] != b->ch)
        return mg_error(MG_EINVAL, "batchnorm2d '%s' has %d channels but its input has %d",
                        l->name, b->ch, in[0]);
    for (int i = 0; i < 3; i++) out[i] = in[i];
    return MG_OK;
}

static void bn_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    *saved = 2 * (size_t)((const bn_layer *)l)->ch * sizeof(float);   /* mean, invstd */
    *scratch = 0;
}

static void bn_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    bn_layer *b = (bn_layer *)l;
    float *mean = (float *)mg__saved(l, c), *invstd = mean + b->ch;
    /* Training updates the running statistics of the context's buffers
     * (a recomputed forward does not: it already did); evaluation reads
     * the model's. */
    float *rm = l->p[2].data, *rv = l->p[3].data;
    if (c->training) {
        rm = c->recompute ? NULL : mg__buffer(l, c, 2);
        rv = c->recompute ? NULL : mg__buffer(l, c, 3);
    }
    mg_batchnorm2d_forward(y, mean, invstd, x, l->p[0].data, l->p[1].data, rm, rv, n, b->ch,
                           l->in[1] * l->in[2], 1e-5f, 0.1f, c->training);
}

static void bn_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                        float *dy, float *dx, int n)
{
    bn_layer *b = (bn_layer *)l;
    const float *mean = (const float *)mg__saved(l, c), *invstd = mean + b->ch;
    mg_batchnorm2d_backward(dx, mg__grad(l, c, 0), mg__grad(l, c, 1), dy, x, mean, invstd,
                            l->p[0].data, n, b->ch, l->in[1] * l->in[2], c->training);
}

static void bn_init(mg_layer *l, const mg_init *c)
{
    static const float value[4] = {1.0f, 0.0f, 0.0f, 1.0f};   /* weight, bias, mean, var */
    for (int i = 0; i < 4; i++) mg__init_fill(c, &l->p[i], MG__FILL_CONST, value[i]);
}

static const mg_layer_vt bn_vt = {
    .kind = "batchnorm2d", .on_device = true, .setup = bn_setup, .sizes = bn_sizes,
    .forward = bn_forward, .backward = bn_backward, .init = bn_init,
};

mg_layer *mg_layer_batchnorm2d(const char *name, int ch)
{
    MG__LAYER_RULE(ch > 0, "batchnorm2d '%s': %d channels: give 1 or more", name ? name : "", ch);
    bn_layer *b = (bn_layer *)mg__layer_alloc(sizeof *b, &bn_vt, name);
    if (!b) return NULL;
    b->ch = ch;
    mg__layer_param(&b->base, "weight", false, 1, (int[]){ch});
    mg__layer_param(&b->base, "bias", false, 1, (int[]){ch});
    mg__layer_param(&b->base, "running_mean", true, 1, (int[]){ch});
    mg__layer_param(&b->base, "running_var", true, 1, (int[]){ch});
    return &b->base;
}
