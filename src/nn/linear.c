/* Linear layer (torch.nn.Linear, weight [out, in]) with an optional fused
 * ReLU. Any input shape is accepted and read flattened channel-major, so
 * no flatten layer (and no copy) is needed after a convolution. The
 * per-position form (mg_layer_linear_tokens) maps the last dimension of
 * a [c, T, in] input: every position is a row of one GEMM. */
#include "nn/layer.h"

typedef struct {
    mg_layer base;
    int in_f, out_f;
    bool relu;
    bool rows;     /* per position of the last dimension */
} linear_layer;

/* Rows of the GEMM per input. */
static int rows_of(const mg_layer *l)
{
    return ((const linear_layer *)l)->rows ? l->in[0] * l->in[1] : 1;
}

static mg_status linear_setup(mg_layer *l, const int in[3], int out[3])
{
    linear_layer *f = (linear_layer *)l;
    if (f->rows) {
        if (in[2] != f->in_f)
            return mg_error(MG_EINVAL, "linear '%s' expects %d features per position but gets "
                            "%dx%dx%d", l->name, f->in_f, in[0], in[1], in[2]);
        out[0] = in[0];
        out[1] = in[1];
        out[2] = f->out_f;
        return MG_OK;
    }
    if (mg__per_image(in) != (size_t)f->in_f)
        return mg_error(MG_EINVAL, "linear '%s' expects %d inputs but gets %dx%dx%d = %zu",
                        l->name, f->in_f, in[0], in[1], in[2], mg__per_image(in));
    out[0] = f->out_f;
    out[1] = out[2] = 1;
    return MG_OK;
}

static void linear_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    *saved = 0;
    *scratch = 0;
}

static void linear_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    linear_layer *f = (linear_layer *)l;
    mg_linear_forward(y, x, l->p[0].data, l->p[1].data, n * rows_of(l), f->in_f, f->out_f,
                      f->relu);
}

static void linear_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                            float *dy, float *dx, int n)
{
    linear_layer *f = (linear_layer *)l;
    mg_linear_backward(dx, mg__grad(l, c, 0), mg__grad(l, c, 1), dy, y, x, l->p[0].data,
                       n * rows_of(l), f->in_f, f->out_f, f->relu);
}

static double linear_flops(const mg_layer *l)
{
    const linear_layer *f = (const linear_layer *)l;
    return 2.0 * f->in_f * f->out_f * rows_of(l);
}

static const mg_layer_vt linear_vt = {
    .kind = "linear", .on_device = true, .setup = linear_setup, .sizes = linear_sizes,
    .forward = linear_forward, .backward = linear_backward, .flops = linear_flops,
};

mg_layer *mg_layer_linear(const char *name, int in, int out, bool relu)
{
    MG_ASSERT(in > 0 && out > 0);
    linear_layer *f = (linear_layer *)mg__layer_alloc(sizeof *f, &linear_vt, name);
    if (!f) return NULL;
    f->in_f = in;
    f->out_f = out;
    f->relu = relu;
    mg__layer_param(&f->base, "weight", false, 2, (int[]){out, in});
    mg__layer_param(&f->base, "bias", false, 1, (int[]){out});
    return &f->base;
}

mg_layer *mg_layer_linear_tokens(const char *name, int in, int out)
{
    mg_layer *l = mg_layer_linear(name, in, out, false);
    if (l) ((linear_layer *)l)->rows = true;
    return l;
}
