/* The transformer's layers (models.md section D, GPT-2 / nanoGPT): token
 * and position embedding, LayerNorm, GELU, causal self-attention, the
 * pre-LayerNorm block and the language-model head tied to the token
 * embedding; and gpt-mini built from them.
 *
 * Shapes: a sequence is one sample [1, T, d]; every layer works on the
 * n*T rows of the batch, so the per-position linear maps are one GEMM.
 * The embedding reads its input as int32 tokens (mg_model_forward_tokens
 * passes them through the float input pointer unchanged).
 *
 * Split for tensor parallelism (mg_gpt_config.tp, Megatron-LM's layout):
 * wte by vocabulary rows (the embedding sums its rows' lookups over the
 * group; the tied head gives this rank's columns of the logits), c_attn
 * and c_fc column-parallel (q, k and v each split, so a rank holds whole
 * heads), both c_proj row-parallel; LayerNorms, wpe and the row-parallel
 * biases whole. With sequence parallelism (tp.sequence) the activations
 * between blocks are 1/T of the positions: the embedding reduce-scatters
 * its sum, the head all-gathers its input, the LayerNorms run on a part
 * (their gradients partial) and the blocks' linears gather and scatter
 * (linear.c). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "nn/layer.h"
#include "device/dk.h"

/* Rows of a batch of n samples of shape s (all but the last dimension). */
static size_t rows(const int s[3], int n) { return (size_t)n * s[0] * s[1]; }

/* ---- Embedding ------------------------------------------------------------ */

typedef struct {
    mg_layer base;
    int vocab, ctx, d;
    int lo, nv;        /* its rows of wte: tokens [lo, lo + nv) (split: a part) */
} embed_layer;

static mg_status embed_setup(mg_layer *l, const int in[3], int out[3])
{
    embed_layer *e = (embed_layer *)l;
    if (in[0] != 1 || in[1] != 1 || in[2] != e->ctx)
        return mg_error(MG_EINVAL, "embedding expects %d tokens per sequence but gets %dx%dx%d",
                        e->ctx, in[0], in[1], in[2]);
    out[0] = 1;
    out[1] = mg__seq_split(l) ? e->ctx / l->tp.size : e->ctx;
    out[2] = e->d;
    return MG_OK;
}

/* Sequence parallelism: the sum of all positions before its scatter,
 * their gradient gathered. */
static void embed_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    const embed_layer *e = (const embed_layer *)l;
    *saved = 0;
    *scratch = mg__seq_split(l) ? (size_t)n * e->ctx * e->d : 0;
}

/* Split: each rank looks up the tokens in its rows (zeros for the
 * others) and rank 0 adds the positions; the sum over the group is one
 * process's wte[tok] + wpe[t], bit for bit (the other terms are zeros). */
static void embed_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    embed_layer *e = (embed_layer *)l;
    const int32_t *tok = (const int32_t *)(const void *)x;   /* checked by the tape's forward */
    float *part = mg__seq_split(l) ? c->scratch : y;
    mg_embedding_forward(part, tok, l->p[0].data, e->lo, e->nv,
                         l->tp.rank == 0 ? l->p[1].data : NULL, n, e->ctx, e->d);
    mg__tp_sum_rows(l, c, part, y, (size_t)n * e->ctx, (size_t)e->d);
}

static void embed_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                           float *dy, float *dx, int n)
{
    embed_layer *e = (embed_layer *)l;
    size_t r = (size_t)n * e->ctx;
    const float *g = mg__tp_all_rows(l, c, dy, r, (size_t)e->d, c->scratch);   /* every position's */
    mg_embedding_backward(mg__grad(l, c, 0), mg__grad(l, c, 1), g,
                          (const int32_t *)(const void *)x, e->lo, e->nv, n, e->ctx, e->d);
}

/* Split: the lookups summed (sequence parallelism: reduce-scattered, the
 * gradient gathered). */
static void embed_tp_floats(const mg_layer *l, double *fwd, double *bwd)
{
    const embed_layer *e = (const embed_layer *)l;
    if (l->tp.size <= 1) return;
    double v = (double)e->ctx * e->d;
    *fwd = mg__seq_split(l) ? v / 2 : v;
    *bwd = mg__seq_split(l) ? v / 2 : 0;
}

static const mg_layer_vt embed_vt = {
    .kind = "embedding", .on_device = true, .setup = embed_setup, .sizes = embed_sizes,
    .forward = embed_forward, .backward = embed_backward, .tp_floats = embed_tp_floats,
};

int mg__embedding_vocab(const mg_layer *l)
{
    return l->vt == &embed_vt ? ((const embed_layer *)l)->vocab : 0;
}

/* tp: this rank's rows of wte (vocab must divide). */
static mg_layer *embedding(int vocab, int ctx, int d, mg_tp_split tp)
{
    MG__LAYER_RULE(vocab > 0 && ctx > 0 && d > 0 && (tp.size <= 1 || vocab % tp.size == 0),
                   "embedding: vocabulary %d, %d positions, %d features%s: give 1 or more of "
                   "each%s", vocab, ctx, d, tp.size > 1 ? " over tensor-parallel ranks" : "",
                   tp.size > 1 ? ", a vocabulary tp divides" : "");
    embed_layer *e = (embed_layer *)mg__layer_alloc(sizeof *e, &embed_vt, NULL);
    if (!e) return NULL;
    bool split = tp.size > 1;
    e->vocab = vocab;
    e->ctx = ctx;
    e->d = d;
    e->nv = split ? vocab / tp.size : vocab;
    e->lo = split ? tp.rank * e->nv : 0;
    e->base.anonymous = true;
    e->base.need_dx = false;
    mg__layer_param(&e->base, "wte.weight", false, 2, (int[]){e->nv, d});
    mg__layer_param(&e->base, "wpe.weight", false, 2, (int[]){ctx, d});
    e->base.p[0].place = (mg_placement){0, 1, 0, 1};   /* whole, placed for fixed sums */
    if (split) {
        e->base.tp = tp;
        e->base.p[0].place = (mg_placement){0, tp.size, tp.rank, 1};
    }
    return &e->base;
}

mg_layer *mg_layer_embedding(int vocab, int ctx, int d)
{
    return embedding(vocab, ctx, d, MG_TP_NONE);
}

/* ---- The tied head ------------------------------------------------------- */

typedef struct {
    mg_layer base;
    mg_layer *embed;   /* not owned: wte is its first parameter */
} head_layer;

static mg_status head_setup(mg_layer *l, const int in[3], int out[3])
{
    embed_layer *e = (embed_layer *)((head_layer *)l)->embed;
    if (in[2] != e->d)
        return mg_error(MG_EINVAL, "tied head expects %d features per position but gets %d",
                        e->d, in[2]);
    out[0] = in[0];
    out[1] = mg__seq_split(&e->base) ? in[1] * e->base.tp.size : in[1];
    out[2] = e->nv;
    return MG_OK;
}

/* Sequence parallelism: all positions of its input, gathered (again in
 * the backward), and their gradient before its scatter. */
static void head_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    const embed_layer *e = (const embed_layer *)((const head_layer *)l)->embed;
    *saved = 0;
    *scratch = mg__seq_split(&e->base) ? 2 * rows(l->out, n) * e->d : 0;
    if (e->base.chunks)   /* fixed sums: the input gradient's chunks and the ranks' roots */
        *scratch = (size_t)(e->base.chunks + mg__tp_size(&e->base)) * rows(l->out, n) * e->d;
}

/* Split: this rank's columns of the logits (its rows of wte); the input
 * gradient is summed over the group. */
static void head_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    embed_layer *e = (embed_layer *)((head_layer *)l)->embed;
    size_t r = rows(l->out, n);
    x = mg__tp_all_rows(&e->base, c, x, r, (size_t)e->d, c->scratch);
    int nl = e->base.chunks ? e->base.chunks : 1, vc = e->nv / nl;   /* fixed sums: chunks */
    for (int j = 0; j < nl; j++)
        mg_gemm(false, true, (int)r, vc, e->d, 1.0f, x, e->d,
                e->base.p[0].data + (size_t)j * vc * e->d, e->d, 0.0f, y + j * vc, e->nv);
}

static void head_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                          float *dy, float *dx, int n)
{
    embed_layer *e = (embed_layer *)((head_layer *)l)->embed;
    int r = (int)rows(l->out, n);
    x = mg__tp_all_rows(&e->base, c, x, (size_t)r, (size_t)e->d, c->scratch);
    if (e->base.chunks) {   /* fixed sums: the vocabulary in chunks, dx their tree */
        int nl = e->base.chunks, vc = e->nv / nl;
        float *gw = mg__borrowed_grad(&e->base, c, 0), *parts = c->scratch;
        const float *w = e->base.p[0].data;
        for (int j = 0; j < nl; j++) {
            size_t at = (size_t)j * vc * e->d;
            mg_gemm(true, false, vc, e->d, r, 1.0f, dy + j * vc, e->nv, x, e->d, 1.0f, gw + at,
                    e->d);
            if (dx)
                mg_gemm(false, false, r, e->d, vc, 1.0f, dy + j * vc, e->nv, w + at, e->d, 0.0f,
                        parts + (size_t)j * r * e->d, e->d);
        }
        if (dx) mg__fixed_sum(c, mg__tp_size(&e->base), parts, nl, (size_t)r * e->d, dx);
        return;
    }
    mg_gemm(true, false, e->nv, e->d, r, 1.0f, dy, e->nv, x, e->d, 1.0f,
            mg__borrowed_grad(&e->base, c, 0), e->d);
    if (!dx) return;
    float *dxs = mg__seq_split(&e->base) ? c->scratch + (size_t)r * e->d : dx;
    mg_gemm(false, false, r, e->d, e->nv, 1.0f, dy, e->nv, e->base.p[0].data, e->d, 0.0f, dxs,
            e->d);
    mg__tp_sum_rows(&e->base, c, dxs, dx, (size_t)r, (size_t)e->d);
}

static double head_flops(const mg_layer *l)
{
    embed_layer *e = (embed_layer *)((head_layer *)l)->embed;
    return 2.0 * e->d * e->nv * rows(l->out, 1);
}

static const mg_layer *head_borrows(const mg_layer *l) { return ((const head_layer *)l)->embed; }

/* Split: the input gradient summed (sequence parallelism: the input
 * gathered in forward and again in backward, the gradient
 * reduce-scattered). */
static void head_tp_floats(const mg_layer *l, double *fwd, double *bwd)
{
    const embed_layer *e = (const embed_layer *)((const head_layer *)l)->embed;
    if (e->base.tp.size <= 1) return;
    double v = (double)rows(l->out, 1) * e->d, dx = l->need_dx ? v : 0;
    bool seq = mg__seq_split(&e->base);
    *fwd = seq ? v / 2 : 0;
    *bwd = seq ? dx / 2 + v / 2 : dx;
}

/* The model counts the training cost of a layer with need_dx as 3
 * forwards: the head's wte gradient and input gradient are two of them. */
static const mg_layer_vt head_vt = {
    .kind = "tied_head", .on_device = true, .setup = head_setup, .sizes = head_sizes,
    .forward = head_forward, .backward = head_backward, .flops = head_flops,
    .borrows = head_borrows, .tp_floats = head_tp_floats,
};

mg_layer *mg_layer_tied_head(mg_layer *embedding)
{
    MG__LAYER_RULE(embedding && embedding->vt == &embed_vt, "tied_head: give it the model's "
                   "embedding layer (mg_layer_embedding)");
    head_layer *h = (head_layer *)mg__layer_alloc(sizeof *h, &head_vt, NULL);
    if (!h) return NULL;
    h->embed = embedding;
    h->base.anonymous = true;
    return &h->base;
}

/* ---- LayerNorm ----------------------------------------------------------- */

typedef struct {
    mg_layer base;
    int d;
    float eps;
} ln_layer;

static mg_status ln_setup(mg_layer *l, const int in[3], int out[3])
{
    ln_layer *f = (ln_layer *)l;
    if (in[2] != f->d)
        return mg_error(MG_EINVAL, "layernorm '%s' normalises %d features but gets %dx%dx%d",
                        l->name, f->d, in[0], in[1], in[2]);
    return mg__same_setup(l, in, out);
}

static void ln_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    *saved = 2 * mg__align(rows(l->in, n) * sizeof(float));
    *scratch = 0;
}

/* Slot 0: the rows' means; slot 1: their 1/std. */
static void ln_bind(mg_layer *l, int n, char **slot)
{
    slot[l->slot + 1] = slot[l->slot] + mg__align(rows(l->in, n) * sizeof(float));
}

/* Forward and backward of rows [r0, r0 + nr) of the batch: their mean and
 * rstd live at those rows of the saved statistics. The gpt block runs
 * slices of its batch through these and recomputes a forward in its
 * backward (the same arithmetic, so the same statistics) rather than
 * keep the output. */
static void ln_rows_forward(mg_layer *l, const mg_ctx *c, float *y, const float *x, size_t r0,
                            size_t nr)
{
    ln_layer *f = (ln_layer *)l;
    float *mean = (float *)mg__slot(l, c, 0), *rstd = (float *)mg__slot(l, c, 1);
    mg_layernorm_forward(y, mean + r0, rstd + r0, x, l->p[0].data, l->p[1].data, nr, f->d,
                         f->eps);
}

static void ln_rows_backward(mg_layer *l, const mg_ctx *c, float *dx, const float *dy,
                             const float *x, size_t r0, size_t nr)
{
    ln_layer *f = (ln_layer *)l;
    const float *mean = (float *)mg__slot(l, c, 0), *rstd = (float *)mg__slot(l, c, 1);
    mg_layernorm_backward(dx, mg__grad(l, c, 0), mg__grad(l, c, 1), dy, x, mean + r0, rstd + r0,
                          l->p[0].data, nr, f->d);
}

static void ln_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    ln_rows_forward(l, c, y, x, 0, rows(l->in, n));
}

static void ln_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y, float *dy,
                        float *dx, int n)
{
    ln_rows_backward(l, c, dx, dy, x, 0, rows(l->in, n));
}

static void ln_init(mg_layer *l, const mg_init *c)
{
    mg__init_fill(c, &l->p[0], MG__FILL_CONST, 1.0f);
    mg__init_fill(c, &l->p[1], MG__FILL_CONST, 0.0f);
}

static const mg_layer_vt ln_vt = {
    .kind = "layernorm", .on_device = true, .setup = ln_setup, .sizes = ln_sizes, .bind = ln_bind,
    .forward = ln_forward, .backward = ln_backward, .init = ln_init,
};

mg_layer *mg_layer_layernorm(const char *name, int d, float eps)
{
    MG__LAYER_RULE(d > 0 && eps >= 0.0f, "layernorm '%s': %d features, eps %g: give 1 or more "
                   "features and eps of 0 or more", name ? name : "", d, eps);
    ln_layer *f = (ln_layer *)mg__layer_alloc(sizeof *f, &ln_vt, name);
    if (!f) return NULL;
    f->d = d;
    f->eps = eps;
    f->base.n_slots = 2;
    mg__layer_param(&f->base, "weight", false, 1, (int[]){d});
    mg__layer_param(&f->base, "bias", false, 1, (int[]){d});
    return &f->base;
}

/* ---- GELU ---------------------------------------------------------------- */

static void gelu_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    mg_gelu_forward(y, x, (size_t)n * mg__per_image(l->in));
}

static void gelu_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                          float *dy, float *dx, int n)
{
    if (dx) mg_gelu_backward(dx, dy, x, (size_t)n * mg__per_image(l->in));
}

static const mg_layer_vt gelu_vt = {
    .kind = "gelu", .on_device = true, .setup = mg__same_setup, .sizes = mg__no_sizes,
    .forward = gelu_forward, .backward = gelu_backward,
};

mg_layer *mg_layer_gelu(const char *name) { return mg__layer_alloc(sizeof(mg_layer), &gelu_vt, name); }

/* ---- Causal self-attention ----------------------------------------------- */

typedef struct {
    mg_layer base;
    int d, heads;
} attn_layer;

static mg_status attn_setup(mg_layer *l, const int in[3], int out[3])
{
    attn_layer *a = (attn_layer *)l;
    if (in[0] != 1 || in[2] != 3 * a->d)
        return mg_error(MG_EINVAL, "attention '%s' expects [1, T, %d] (q, k, v) but gets "
                        "%dx%dx%d", l->name, 3 * a->d, in[0], in[1], in[2]);
    out[0] = 1;
    out[1] = in[1];
    out[2] = a->d;
    return MG_OK;
}

static void attn_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    const attn_layer *a = (const attn_layer *)l;
    *saved = mg_attention_saved(n, l->in[1], a->d, a->heads) * sizeof(float);
    *scratch = mg_attention_scratch(n, l->in[1], a->d, a->heads);
}

/* Sequences [i0, i0 + n) of the batch: what the forward keeps for them
 * is at that offset of the saved memory (the gpt block runs slices). */
static float *attn_lse(mg_layer *l, const mg_ctx *c, int i0)
{
    const attn_layer *a = (const attn_layer *)l;
    return (float *)mg__saved(l, c) +
           mg_attention_saved_as(i0, l->in[1], a->d, a->heads, c->bf16_kept);
}

static void attn_seqs_forward(mg_layer *l, const mg_ctx *c, float *y, const float *x, int i0,
                              int n, float *ws)
{
    attn_layer *a = (attn_layer *)l;
    mg_attention_forward_as(y, attn_lse(l, c, i0), x, n, l->in[1], a->d, a->heads, ws,
                            c->bf16_kept);
}

static void attn_seqs_backward(mg_layer *l, const mg_ctx *c, float *dx, const float *dy,
                               const float *y, const float *x, int i0, int n, float *ws)
{
    attn_layer *a = (attn_layer *)l;
    mg_attention_backward_as(dx, dy, y, attn_lse(l, c, i0), x, n, l->in[1], a->d, a->heads, ws,
                             c->bf16_kept);
}

static void attn_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    attn_seqs_forward(l, c, y, x, 0, n, c->scratch);
}

static void attn_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                          float *dy, float *dx, int n)
{
    if (dx) attn_seqs_backward(l, c, dx, dy, y, x, 0, n, c->scratch);
}

/* q k^T and P v: 2 * T * T * d each per sequence, half of it under the
 * causal mask (the kernels skip most of the masked half). */
static double attn_flops(const mg_layer *l)
{
    const attn_layer *a = (const attn_layer *)l;
    return 2.0 * (double)l->in[1] * l->in[1] * a->d;
}

static const mg_layer_vt attn_vt = {
    .kind = "attention", .on_device = true, .setup = attn_setup, .sizes = attn_sizes,
    .forward = attn_forward, .backward = attn_backward, .flops = attn_flops,
};

mg_layer *mg_layer_attention(const char *name, int d, int heads)
{
    MG__LAYER_RULE(d > 0 && heads > 0 && d % heads == 0, "attention '%s': %d features in %d "
                   "heads: give heads that divide the features", name ? name : "", d, heads);
    attn_layer *a = (attn_layer *)mg__layer_alloc(sizeof *a, &attn_vt, name);
    if (!a) return NULL;
    a->d = d;
    a->heads = heads;
    return &a->base;
}

/* ---- The pre-LayerNorm block --------------------------------------------- */

/* A LayerNorm run on 1/T of the positions (sequence parallelism): its
 * gradients are partial sums over the group. */
static mg_layer *mark_partial(mg_layer *ln)
{
    if (ln)
        for (int i = 0; i < ln->n_params; i++) ln->p[i].grad_partial = true;
    return ln;
}

/* x1 = x + attn(ln_1(x)); y = x1 + mlp(ln_2(x1)). The children are ln_1,
 * attn (a Sequential of c_attn, the attention core and c_proj), ln_2 and
 * mlp (c_fc, GELU, c_proj), as PyTorch's module tree names them; the block
 * runs their layers itself so that it decides what outlives the forward
 * (as llm.c's CUDA trainer does when told to recompute GELU and LayerNorm):
 *   kept     qkv (3d per position), the attention output (d), x1 (d) and
 *            c_fc's output (4d), plus the LayerNorm statistics and the
 *            attention's log-sum-exp rows: 9d floats per position
 *            (keeping every layer's output would take 17d);
 *   redone   both LayerNorm outputs and the GELU output, recomputed in the
 *            backward from what is kept (a row normalisation and one exp
 *            per element, beside the GEMMs' 36 d^2 multiply-adds per
 *            position; the GELU recomputation also gives its derivative,
 *            so the backward still takes one exp per element);
 *   dropped  the two branch outputs, added into the residual stream as
 *            they are made.
 * The block's input x is kept by the caller (the previous layer's output).
 *
 * The batch runs in slices of whole sequences (about MG_BLOCK_ROWS
 * positions, default 512; read at set-up): the temporaries (LayerNorm and
 * GELU outputs, the gradients inside the block) are slice-sized, shared by
 * all blocks through the scratch, and stay in cache between the GEMMs that
 * make and use them. Weight gradients accumulate over the slices. */
enum { L_LN1, L_QKV, L_ATT, L_PROJ, L_LN2, L_FC, L_GELU, L_FCPROJ, L_N };   /* layers run */
enum { K_QKV, K_ATT, K_X1, K_FC, K_N };                                      /* kept */
enum { S_A, S_G, S_D, S_P, S_N };                                            /* per slice */

/* Split over T tensor-parallel ranks, a rank keeps qkv, the attention
 * output and c_fc's output of its heads and columns only (3d/T, d/T,
 * 4d/T) and the whole x1 (d); the whole batch is one slice, so the block
 * makes exactly two all-reduces in forward and two in backward. */
typedef struct {
    mg_layer base;
    mg_layer *leaf[L_N];   /* the children's layers, in forward order */
    int slice_max;         /* sequences per slice, from MG_BLOCK_ROWS */
    int tp;                /* tensor-parallel ranks (1: whole) */
    /* Floats per position of each kept tensor and slice temporary (A: a
     * LayerNorm output or a d-wide gradient; G, D, P: the GELU output, its
     * derivative and the 4d/T-wide gradients; dqkv fits in G, c_fc's
     * input gradient in D). */
    size_t keep_w[K_N], tmp_w[S_N];
} block_layer;

static mg_status block_setup(mg_layer *l, const int in[3], int out[3])
{
    block_layer *b = (block_layer *)l;
    int cur[3] = {in[0], in[1], in[2]};
    for (int i = 0; i < l->n_child; i++) {
        mg_layer *ch = l->child[i];
        memcpy(ch->in, cur, sizeof cur);
        MG_TRY(ch->vt->setup(ch, cur, ch->out));
        if (memcmp(ch->out, in, sizeof ch->out) != 0)
            return mg_error(MG_EINVAL, "block '%s': '%s' changes the shape %dx%dx%d",
                            l->name, ch->name, in[0], in[1], in[2]);
    }
    long seqs = mg_env_long("MG_BLOCK_ROWS", 512) / in[1];
    b->slice_max = seqs < 1 ? 1 : seqs > INT_MAX ? INT_MAX : (int)seqs;
    memcpy(out, in, 3 * sizeof(int));
    return MG_OK;
}

/* Bytes of kept tensor k at batch n, aligned. */
static size_t keep_bytes(const mg_layer *l, int n, int k)
{
    return mg__align(rows(l->in, n) * ((const block_layer *)l)->keep_w[k] * sizeof(float));
}

/* Floats of temporary k for slices of `seqs` sequences, aligned. */
static size_t tmp_floats(const mg_layer *l, int seqs, int k)
{
    size_t w = ((const block_layer *)l)->tmp_w[k];
    return mg__align(rows(l->in, seqs) * w * sizeof(float)) / sizeof(float);
}

/* On a device the whole batch is one slice: its kernels want large GEMMs
 * rather than cache-sized ones; split, each slice would communicate. */
static int slice_at(const block_layer *b, int n)
{
    return !mg__dk_cur && b->tp == 1 && b->slice_max < n ? b->slice_max : n;
}

static void block_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    const block_layer *b = (const block_layer *)l;
    size_t sv = 0, sc = 0, tmp = 0;
    for (int i = 0; i < L_N; i++) {
        size_t a, c;
        b->leaf[i]->vt->sizes(b->leaf[i], n, &a, &c);
        sv += mg__align(a);
        if (c > sc) sc = c;
    }
    for (int k = 0; k < K_N; k++) sv += keep_bytes(l, n, k);
    for (int k = 0; k < S_N; k++) tmp += tmp_floats(l, slice_at(b, n), k);
    *saved = sv;
    *scratch = tmp + sc;
}

/* Slot 1 + k: kept tensor k. */
static void block_bind(mg_layer *l, int n, char **slot)
{
    block_layer *b = (block_layer *)l;
    char *p = slot[l->slot];
    for (int i = 0; i < L_N; i++) p = mg__bind_child(b->leaf[i], n, p, slot);
    for (int k = 0; k < K_N; k++) {
        slot[l->slot + 1 + k] = p;
        p += keep_bytes(l, n, k);
    }
}

static void block_propagate(mg_layer *l)
{
    for (int i = 0; i < l->n_child; i++) {
        l->child[i]->need_dx = i > 0 || l->need_dx;
        if (l->child[i]->vt->propagate) l->child[i]->vt->propagate(l->child[i]);
    }
}

/* The slice temporaries (slices of a batch of n) at the start of the
 * scratch; *cc gets the rest, for the layers. */
static void block_tmps(const block_layer *b, const mg_ctx *c, int n, float *t[S_N], mg_ctx *cc)
{
    float *p = c->scratch;
    for (int k = 0; k < S_N; k++) {
        t[k] = p;
        p += tmp_floats(&b->base, slice_at(b, n), k);
    }
    *cc = *c;
    cc->scratch = p;
}

/* The slice of sequences starting at i0 (at most a slice of n): returns
 * its sequence count, its first row *r0 and row count *nr (T rows per
 * sequence), and the kept tensors at its rows. */
static int block_slice(const block_layer *b, const mg_ctx *c, int i0, int n, int T, size_t *r0,
                       size_t *nr, float *kp[K_N])
{
    int s = slice_at(b, n), k = n - i0 < s ? n - i0 : s;
    *r0 = (size_t)i0 * T;
    *nr = (size_t)k * T;
    for (int j = 0; j < K_N; j++)
        kp[j] = (float *)mg__slot(&b->base, c, 1 + j) + *r0 * b->keep_w[j];
    return k;
}

static void block_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    block_layer *b = (block_layer *)l;
    mg_ctx cc;
    float *t[S_N], *kp[K_N];
    block_tmps(b, c, n, t, &cc);
    mg_layer **f = b->leaf;
    int T = l->in[1], d = l->in[2];
    for (int i0 = 0, k; i0 < n; i0 += k) {
        size_t r0, nr;
        k = block_slice(b, c, i0, n, T, &r0, &nr, kp);
        const float *xs = x + r0 * d;
        float *ys = y + r0 * d;
        ln_rows_forward(f[L_LN1], c, t[S_A], xs, r0, nr);
        f[L_QKV]->vt->forward(f[L_QKV], &cc, t[S_A], kp[K_QKV], k);
        attn_seqs_forward(f[L_ATT], c, kp[K_ATT], kp[K_QKV], i0, k, cc.scratch);
        f[L_PROJ]->vt->forward(f[L_PROJ], &cc, kp[K_ATT], kp[K_X1], k);
        mg_add_into(kp[K_X1], xs, nr * d);
        ln_rows_forward(f[L_LN2], c, t[S_A], kp[K_X1], r0, nr);
        f[L_FC]->vt->forward(f[L_FC], &cc, t[S_A], kp[K_FC], k);
        f[L_GELU]->vt->forward(f[L_GELU], &cc, kp[K_FC], t[S_G], k);
        f[L_FCPROJ]->vt->forward(f[L_FCPROJ], &cc, t[S_G], ys, k);
        mg_add_into(ys, kp[K_X1], nr * d);
    }
}

/* Per slice, in the slice's rows: dy is overwritten (the layer contract
 * allows it) and serves for d(attention output) and d(ln_1 output). The
 * linear layers have no ReLU, so their backward does not read their
 * output (NULL). */
static void block_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                           float *dy, float *dx, int n)
{
    block_layer *b = (block_layer *)l;
    mg_ctx cc;
    float *t[S_N], *kp[K_N];
    block_tmps(b, c, n, t, &cc);
    float *A = t[S_A], *G = t[S_G], *D = t[S_D], *P = t[S_P];
    mg_layer **f = b->leaf;
    int T = l->in[1], d = l->in[2];
    size_t fc = b->keep_w[K_FC];
    for (int i0 = 0, k; i0 < n; i0 += k) {
        size_t r0, nr;
        k = block_slice(b, c, i0, n, T, &r0, &nr, kp);
        const float *xs = x + r0 * d;
        float *dys = dy + r0 * d, *dxs = dx ? dx + r0 * d : NULL;
        /* y = x1 + c_proj(gelu(c_fc(ln_2(x1)))). */
        mg_gelu_forward_deriv(G, P, kp[K_FC], nr * fc);            /* G = gelu, P = gelu' */
        f[L_FCPROJ]->vt->backward(f[L_FCPROJ], &cc, G, NULL, dys, D, k);
        mg_mul(G, D, P, nr * fc);                                      /* d c_fc output */
        ln_rows_forward(f[L_LN2], c, A, kp[K_X1], r0, nr);              /* ln_2(x1) again */
        f[L_FC]->vt->backward(f[L_FC], &cc, A, NULL, G, D, k);
        ln_rows_backward(f[L_LN2], c, A, D, kp[K_X1], r0, nr);
        mg_add_into(A, dys, nr * d);                                        /* A = d x1 */
        /* x1 = x + c_proj(attention(c_attn(ln_1(x)))). */
        f[L_PROJ]->vt->backward(f[L_PROJ], &cc, kp[K_ATT], NULL, A, dys, k);
        attn_seqs_backward(f[L_ATT], c, G, dys, kp[K_ATT], kp[K_QKV], i0, k, cc.scratch);
        ln_rows_forward(f[L_LN1], c, D, xs, r0, nr);                     /* ln_1(x) again */
        f[L_QKV]->vt->backward(f[L_QKV], &cc, D, NULL, G, dys, k);
        ln_rows_backward(f[L_LN1], c, dxs, dys, xs, r0, nr);
        if (dxs) mg_add_into(dxs, A, nr * d);
    }
}

static const mg_layer_vt block_vt = {
    .kind = "gpt_block", .on_device = true, .setup = block_setup, .sizes = block_sizes, .bind = block_bind,
    .propagate = block_propagate, .forward = block_forward, .backward = block_backward,
};

/* tp: this rank's heads and columns (heads must divide). */
static mg_layer *gpt_block(const char *name, int d, int heads, mg_tp_split tp)
{
    int T = tp.size > 1 ? tp.size : 1;
    MG_ASSERT(heads % T == 0 && d % heads == 0);
    mg_layer *attn[] = {mg__layer_linear_split("c_attn", d, 3 * d, false, true, MG_TP_COLUMN, tp, 3),
                        mg_layer_attention("core", d / T, heads / T),
                        mg__layer_linear_split("c_proj", d, d, false, true, MG_TP_ROW, tp, 1)};
    mg_layer *mlp[] = {mg__layer_linear_split("c_fc", d, 4 * d, false, true, MG_TP_COLUMN, tp, 1),
                       mg_layer_gelu("gelu"),
                       mg__layer_linear_split("c_proj", 4 * d, d, false, true, MG_TP_ROW, tp, 1)};
    mg_layer *kids[] = {mg_layer_layernorm("ln_1", d, 1e-5f), mg_layer_sequential("attn", attn, 3),
                        mg_layer_layernorm("ln_2", d, 1e-5f), mg_layer_sequential("mlp", mlp, 3)};
    block_layer *b = (block_layer *)mg__layer_alloc(sizeof *b, &block_vt, name);
    mg_layer **child = calloc(4, sizeof *child);
    bool ok = b && child;
    for (int i = 0; i < 4; i++) ok = ok && kids[i];
    if (!ok) {
        for (int i = 0; i < 4; i++) mg_layer_destroy(kids[i]);
        free(child);
        free(b);
        return NULL;
    }
    memcpy(child, kids, sizeof kids);
    b->base.child = child;
    b->base.n_child = 4;
    b->base.n_slots = 1 + K_N;
    mg_layer *leaf[L_N] = {kids[0], attn[0], attn[1], attn[2], kids[2], mlp[0], mlp[1], mlp[2]};
    memcpy(b->leaf, leaf, sizeof leaf);
    b->tp = T;
    /* Per input position: with sequence parallelism a rank has 1/T of
     * the block's positions but all of them inside attention and MLP. */
    size_t part = (size_t)(d / T) * (tp.sequence ? (size_t)T : 1), dw = (size_t)d;
    size_t keep[K_N] = {3 * part, part, dw, 4 * part};
    size_t tmp[S_N] = {dw, 4 * part, 4 * part > dw ? 4 * part : dw, 4 * part};
    for (int i = 0; tp.sequence && i < 4; i += 2) mark_partial(kids[i]);
    memcpy(b->keep_w, keep, sizeof keep);
    memcpy(b->tmp_w, tmp, sizeof tmp);
    return &b->base;
}

mg_layer *mg_layer_gpt_block(const char *name, int d, int heads)
{
    return gpt_block(name, d, heads, MG_TP_NONE);
}

/* ---- gpt-mini -------------------------------------------------------------- */

mg_gpt_config mg_gpt_defaults(void)
{
    return (mg_gpt_config){.layers = 4, .dim = 128, .heads = 4, .ctx = 128, .vocab = 256,
                           .tp = MG_TP_NONE};
}

mg_status mg_model_create_gpt(const mg_gpt_config *g, uint64_t seed, mg_model **out)
{
    *out = NULL;
    if (g->layers <= 0 || g->dim <= 0 || g->heads <= 0 || g->ctx <= 0 || g->vocab <= 0 ||
        g->layers > 1000 || g->dim > 65536 || g->ctx > 65536 || g->vocab > 1 << 24)
        return mg_error(MG_EINVAL, "gpt-mini: sizes must be positive (layers %d, dim %d, heads "
                        "%d, ctx %d, vocab %d)", g->layers, g->dim, g->heads, g->ctx, g->vocab);
    if (g->dim % g->heads)
        return mg_error(MG_EINVAL, "gpt-mini: --dim %d is not divisible by --heads %d; choose "
                        "a head count that divides the width", g->dim, g->heads);
    mg_tp_split tp = g->tp.size > 1 ? g->tp : MG_TP_NONE;
    if (tp.rank < 0 || tp.rank >= tp.size)
        return mg_error(MG_EINVAL, "gpt-mini: tensor-parallel part %d of %d does not exist",
                        tp.rank, tp.size);
    if (tp.sequence && g->ctx % tp.size)
        return mg_error(MG_EINVAL, "gpt-mini: sequence parallelism splits the %d positions of "
                        "a sequence over %d tensor-parallel ranks: give a tp that divides the "
                        "context", g->ctx, tp.size);
    if (g->heads % tp.size || g->vocab % tp.size)
        return mg_error(MG_EINVAL, "gpt-mini: %s %d does not split over %d tensor-parallel "
                        "ranks: each holds whole heads and an equal part of the vocabulary, so "
                        "give a tp that divides both --heads %d and the vocabulary %d",
                        g->heads % tp.size ? "--heads" : "the vocabulary",
                        g->heads % tp.size ? g->heads : g->vocab, tp.size, g->heads, g->vocab);
    mg_layer **blocks = calloc((size_t)g->layers, sizeof *blocks);
    if (!blocks) return mg_error(MG_ENOMEM, "gpt-mini: out of memory");
    for (int i = 0; i < g->layers; i++) {
        blocks[i] = gpt_block(NULL, g->dim, g->heads, tp);
        if (blocks[i]) {
            /* GPT-2: the residual projections get std 0.02/sqrt(2L). */
            float std = 0.02f / sqrtf(2.0f * g->layers);
            mg_layer_set_init(blocks[i], MG_INIT_NORMAL, 0.02f);
            mg_layer_set_init(blocks[i]->child[1]->child[2], MG_INIT_NORMAL, std);
            mg_layer_set_init(blocks[i]->child[3]->child[2], MG_INIT_NORMAL, std);
        }
    }
    mg_layer *embed = embedding(g->vocab, g->ctx, g->dim, tp);
    if (embed) mg_layer_set_init(embed, MG_INIT_NORMAL, 0.02f);
    mg_layer *top[] = {embed, mg_layer_sequential("h", blocks, g->layers),
                       tp.sequence ? mark_partial(mg_layer_layernorm("ln_f", g->dim, 1e-5f))
                                   : mg_layer_layernorm("ln_f", g->dim, 1e-5f),
                       embed ? mg_layer_tied_head(embed) : NULL};
    free(blocks);
    mg_layer *root = mg_layer_sequential(NULL, top, 4);
    MG_TRY(mg_model_create_from("gpt-mini", root, 1, 1, g->ctx, seed, out));
    mg__model_set_positions(*out, g->ctx);
    mg__model_set_vocab_split(*out);
    return MG_OK;
}
