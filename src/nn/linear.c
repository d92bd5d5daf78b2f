/* Linear layer (torch.nn.Linear, weight [out, in]) with an optional fused
 * ReLU. Any input shape is accepted and read flattened channel-major, so
 * no flatten layer (and no copy) is needed after a convolution. The
 * per-position form (mg_layer_linear_tokens) maps the last dimension of
 * a [c, T, in] input: every position is a row of one GEMM.
 *
 * Split for tensor parallelism (Megatron-LM's ColumnParallelLinear and
 * RowParallelLinear): a column-parallel layer holds out/T of the outputs
 * (weight and bias rows) and sums its input gradient over the group; a
 * row-parallel one holds in/T of the inputs (weight columns), sums its
 * output over the group and then adds the whole bias and the ReLU. With
 * sequence parallelism (per-position form only) a column-parallel layer
 * takes 1/T of the positions, all-gathers them (again in its backward,
 * rather than keep them) and reduce-scatters its input gradient; a
 * row-parallel one reduce-scatters its output to 1/T of the positions and
 * all-gathers their gradient, and its bias gradient is partial. The
 * gathered and reduced blocks live in the layer's scratch.
 *
 * Fixed sums (mg_model_set_fixed_sums, --deterministic): every GEMM is
 * cut into the layer's fixed chunks of the split dimension (of each
 * stride block), so each has the same shape at any tp size, and the
 * products over the split dimension (a row-parallel output, a
 * column-parallel input gradient) are summed in one binary tree over the
 * chunks (mg__fixed_sum); a layer placed for a split holds its placement
 * also whole (parts 1), so that one process cuts the same chunks. */
#include <string.h>
#include "nn/layer.h"

typedef struct {
    mg_layer base;
    int in_f, out_f;
    bool relu;
    bool rows;     /* per position of the last dimension */
    mg_tp_role role;   /* split (base.tp): in_f or out_f are this rank's part */
    int stride;        /* blocks of the split dimension (qkv's three) */
} linear_layer;

static bool row_parallel(const mg_layer *l)
{
    return mg__split(l) && ((const linear_layer *)l)->role == MG_TP_ROW;
}

/* Rows of the GEMM per input: its positions (a column-parallel layer's
 * gathered ones under sequence parallelism), or 1. */
static int rows_of(const mg_layer *l)
{
    if (!((const linear_layer *)l)->rows) return 1;
    bool gathers = mg__seq_split(l) && ((const linear_layer *)l)->role == MG_TP_COLUMN;
    return gathers ? l->out[0] * l->out[1] : l->in[0] * l->in[1];
}

static mg_status linear_setup(mg_layer *l, const int in[3], int out[3])
{
    linear_layer *f = (linear_layer *)l;
    if (f->rows) {
        if (in[2] != f->in_f)
            return mg_error(MG_EINVAL, "linear '%s' expects %d features per position but gets "
                            "%dx%dx%d", l->name, f->in_f, in[0], in[1], in[2]);
        int T = l->tp.size;
        if (mg__seq_split(l) && f->role == MG_TP_ROW && in[1] % T)
            return mg_error(MG_EINVAL, "linear '%s': %d positions do not split over %d ranks "
                            "(sequence parallelism)", l->name, in[1], T);
        out[0] = in[0];
        out[1] = !mg__seq_split(l) ? in[1] : f->role == MG_TP_COLUMN ? in[1] * T : in[1] / T;
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

/* Sequence parallelism's blocks of all positions: a column-parallel
 * layer's gathered input and its input gradient before the reduction, a
 * row-parallel one's output before it and its gathered gradient. */
static void linear_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    const linear_layer *f = (const linear_layer *)l;
    size_t r = (size_t)n * rows_of(l);
    /* The plain GEMMs keep their operands rounded (bfloat16 GEMMs) */
    *saved = l->chunks ? 0 : mg_linear_kept((int)r, f->in_f, f->out_f);
    *scratch = !mg__seq_split(l) ? 0 : f->role == MG_TP_COLUMN ? 2 * r * f->in_f : r * f->out_f;
    if (l->chunks)   /* the chunks' products and the ranks' gathered roots */
        *scratch = (size_t)(l->chunks + mg__tp_size(l)) * r *
                   (size_t)(f->role == MG_TP_COLUMN ? f->in_f : f->out_f);
}

/* ---- fixed sums: the GEMMs in fixed chunks of the split dimension ------- */

/* Column-parallel: chunk j of stride block s is nc outputs from column
 * s bs + j nc. */
static void fixed_column_forward(const linear_layer *f, const float *x, float *y, size_t r)
{
    int out = f->out_f, in = f->in_f, bs = out / f->stride, nc = bs / f->base.chunks;
    const float *w = f->base.p[0].data;
    memset(y, 0, r * (size_t)out * sizeof *y);   /* once, not each strided block (beta 0) */
    for (int j = 0; j < f->base.chunks; j++)
        for (int s = 0; s < f->stride; s++) {
            int col = s * bs + j * nc;
            mg_gemm(false, true, (int)r, nc, in, 1.0f, x, in, w + (size_t)col * in, in, 1.0f,
                    y + col, out);
        }
    mg_bias_relu(y, f->base.p[1].data, (int)r, out, f->relu);
}

static void fixed_column_backward(linear_layer *f, const mg_ctx *c, const float *x,
                                  const float *y, float *dy, float *dx, size_t r)
{
    mg_layer *l = &f->base;
    int out = f->out_f, in = f->in_f, bs = out / f->stride, nl = l->chunks, nc = bs / nl;
    const float *w = l->p[0].data;
    float *dw = mg__grad(l, c, 0), *parts = c->scratch;
    mg_bias_relu_backward(dy, mg__grad(l, c, 1), y, (int)r, out, f->relu);
    for (int j = 0; j < nl; j++)
        for (int s = 0; s < f->stride; s++) {
            int col = s * bs + j * nc;
            mg_gemm(true, false, nc, in, (int)r, 1.0f, dy + col, out, x, in, 1.0f,
                    dw + (size_t)col * in, in);
            if (dx)
                mg_gemm(false, false, (int)r, in, nc, 1.0f, dy + col, out, w + (size_t)col * in,
                        in, s ? 1.0f : 0.0f, parts + (size_t)j * r * in, in);
        }
    if (dx) mg__fixed_sum(c, mg__tp_size(l), parts, nl, r * (size_t)in, dx);
}

/* Row-parallel: chunk j is kc inputs from column j kc. */
static void fixed_row_forward(linear_layer *f, const mg_ctx *c, const float *x, float *y,
                              size_t r)
{
    mg_layer *l = &f->base;
    int out = f->out_f, in = f->in_f, nl = l->chunks, kc = in / nl;
    const float *w = l->p[0].data;
    float *parts = c->scratch;
    for (int j = 0; j < nl; j++)
        mg_gemm(false, true, (int)r, out, kc, 1.0f, x + j * kc, in, w + j * kc, in, 0.0f,
                parts + (size_t)j * r * out, out);
    mg__fixed_sum(c, mg__tp_size(l), parts, nl, r * (size_t)out, y);
    mg_bias_relu(y, l->p[1].data, (int)r, out, f->relu);
}

static void fixed_row_backward(linear_layer *f, const mg_ctx *c, const float *x,
                               const float *y, float *dy, float *dx, size_t r)
{
    mg_layer *l = &f->base;
    int out = f->out_f, in = f->in_f, nl = l->chunks, kc = in / nl;
    const float *w = l->p[0].data;
    float *dw = mg__grad(l, c, 0);
    mg_bias_relu_backward(dy, mg__grad(l, c, 1), y, (int)r, out, f->relu);
    if (dx) memset(dx, 0, r * (size_t)in * sizeof *dx);   /* once, not each strided block */
    for (int j = 0; j < nl; j++) {
        mg_gemm(true, false, out, kc, (int)r, 1.0f, dy, out, x + j * kc, in, 1.0f, dw + j * kc,
                in);
        if (dx)
            mg_gemm(false, false, (int)r, kc, out, 1.0f, dy, out, w + j * kc, in, 1.0f,
                    dx + j * kc, in);
    }
}

/* Where the plain GEMMs keep their operands rounded: the layer's tape
 * memory, when the tape was sized for it (NULL: round at each use). */
static void *kept_of(const mg_layer *l, const mg_ctx *c)
{
    return c->bf16_kept && !l->chunks && mg__saved(l, c) ? mg__saved(l, c) : NULL;
}

static void linear_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    linear_layer *f = (linear_layer *)l;
    size_t r = (size_t)n * rows_of(l);
    if (l->chunks && f->role == MG_TP_ROW) {
        fixed_row_forward(f, c, x, y, r);
        return;
    }
    if (l->chunks) {
        fixed_column_forward(f, x, y, r);
        return;
    }
    void *kept = kept_of(l, c);
    if (!row_parallel(l)) {   /* whole, or column-parallel: on every position */
        x = mg__tp_all_rows(l, c, x, r, (size_t)f->in_f, c->scratch);
        mg_linear_forward_kept(y, x, l->p[0].data, l->p[1].data, (int)r, f->in_f, f->out_f,
                               f->relu, kept);
        return;
    }
    /* The partial products summed over the group, then bias and ReLU. */
    float *part = mg__seq_split(l) ? c->scratch : y;
    mg_linear_forward_kept(part, x, l->p[0].data, NULL, (int)r, f->in_f, f->out_f, false, kept);
    size_t here = mg__tp_sum_rows(l, c, part, y, r, (size_t)f->out_f);
    mg_bias_relu(y, l->p[1].data, (int)here, f->out_f, f->relu);
}

static void linear_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                            float *dy, float *dx, int n)
{
    linear_layer *f = (linear_layer *)l;
    size_t r = (size_t)n * rows_of(l), in = (size_t)f->in_f;
    float *dw = mg__grad(l, c, 0), *db = mg__grad(l, c, 1);
    if (l->chunks && f->role == MG_TP_ROW) {
        fixed_row_backward(f, c, x, y, dy, dx, r);
        return;
    }
    if (l->chunks) {
        fixed_column_backward(f, c, x, y, dy, dx, r);
        return;
    }
    if (!row_parallel(l)) {   /* column-parallel: the input gathered again, its gradient summed */
        x = mg__tp_all_rows(l, c, x, r, in, c->scratch);
        float *dxs = dx && mg__seq_split(l) ? c->scratch + r * in : dx;
        mg_linear_backward_kept(dxs, dw, db, dy, y, x, l->p[0].data, (int)r, f->in_f, f->out_f,
                                f->relu, kept_of(l, c));
        if (dx) mg__tp_sum_rows(l, c, dxs, dx, r, in);
        return;
    }
    /* Row-parallel: this rank's positions (all of them but with sequence
     * parallelism) give the ReLU's mask and the bias gradient; all
     * positions the weight and input gradients. */
    size_t here = mg__seq_split(l) ? r / (size_t)l->tp.size : r;
    mg_bias_relu_backward(dy, db, y, (int)here, f->out_f, f->relu);
    /* (mg_linear_backward writes dy only to mask it, which relu false skips) */
    float *dya = (float *)mg__tp_all_rows(l, c, dy, r, (size_t)f->out_f, c->scratch);
    mg_linear_backward_kept(dx, dw, NULL, dya, NULL, x, l->p[0].data, (int)r, f->in_f, f->out_f,
                            false, kept_of(l, c));
}

/* Megatron's regions: a column-parallel layer's input gradient is summed
 * (sequence parallelism: its input gathered in forward and again in
 * backward, its gradient reduce-scattered); a row-parallel layer's output
 * is summed (reduce-scattered, its gradient gathered). */
static void linear_tp_floats(const mg_layer *l, double *fwd, double *bwd)
{
    const linear_layer *f = (const linear_layer *)l;
    if (!mg__split(l)) return;
    double rows = rows_of(l), in = rows * f->in_f, out = rows * f->out_f;
    bool seq = mg__seq_split(l);
    if (f->role == MG_TP_COLUMN) {
        *fwd = seq ? in / 2 : 0;
        *bwd = (l->need_dx ? (seq ? in / 2 : in) : 0) + (seq ? in / 2 : 0);
    } else {
        *fwd = seq ? out / 2 : out;
        *bwd = seq ? out / 2 : 0;
    }
}

static double linear_flops(const mg_layer *l)
{
    const linear_layer *f = (const linear_layer *)l;
    return 2.0 * f->in_f * f->out_f * rows_of(l);
}

static const mg_layer_vt linear_vt = {
    .kind = "linear", .on_device = true, .setup = linear_setup, .sizes = linear_sizes,
    .forward = linear_forward, .backward = linear_backward, .flops = linear_flops,
    .tp_floats = linear_tp_floats,
};

mg_layer *mg_layer_linear(const char *name, int in, int out, bool relu)
{
    MG__LAYER_RULE(in > 0 && out > 0, "linear '%s': %d inputs and %d outputs: give 1 or more of "
                   "each", name ? name : "", in, out);
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
    mg_layer *l = mg__layer_linear_split(name, in, out, false, true, MG_TP_COLUMN, MG_TP_NONE, 1);
    if (l) l->p[0].place = l->p[1].place = MG_WHOLE;   /* never split */
    return l;
}

mg_layer *mg__layer_linear_split(const char *name, int in, int out, bool relu, bool rows,
                                 mg_tp_role role, mg_tp_split tp, int stride)
{
    bool split = tp.size > 1, col = role == MG_TP_COLUMN;
    MG__LAYER_RULE(!split || (col ? out : in) % (tp.size * stride) == 0, "linear '%s': its %d "
                   "%s do not split over %d tensor-parallel ranks: give sizes tp divides",
                   name ? name : "", col ? out : in, col ? "outputs" : "inputs", tp.size);
    int li = split && !col ? in / tp.size : in, lo = split && col ? out / tp.size : out;
    mg_layer *l = mg_layer_linear(name, li, lo, relu);
    if (!l) return NULL;
    linear_layer *f = (linear_layer *)l;
    f->rows = rows;
    f->role = role;
    f->stride = col ? stride : 1;
    /* Placed also whole (parts 1): fixed sums cut what a split would. */
    l->p[0].place = (mg_placement){col ? 0 : 1, 1, 0, col ? stride : 1};
    if (col) l->p[1].place = (mg_placement){0, 1, 0, stride};
    if (split) {
        l->tp = tp;
        l->tp.sequence = tp.sequence && rows;
        mg_placement pl = {col ? 0 : 1, tp.size, tp.rank, col ? stride : 1};
        l->p[0].place = pl;
        if (col) l->p[1].place = (mg_placement){0, tp.size, tp.rank, stride};
        else l->p[1].grad_partial = l->tp.sequence;
    }
    return l;
}

mg_layer *mg_layer_linear_split(const char *name, int in, int out, bool relu, mg_tp_role role,
                                mg_tp_split tp)
{
    return mg__layer_linear_split(name, in, out, relu, false, role, tp, 1);
}
