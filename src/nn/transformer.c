/* The transformer's layers (models.md section D, GPT-2 / nanoGPT): token
 * and position embedding, LayerNorm, GELU, causal self-attention, the
 * pre-LayerNorm block and the language-model head tied to the token
 * embedding; and gpt-mini built from them.
 *
 * Shapes: a sequence is one sample [1, T, d]; every layer works on the
 * n*T rows of the batch, so the per-position linear maps are one GEMM.
 * The embedding reads its input as int32 tokens (mg_model_forward_tokens
 * passes them through the float input pointer unchanged). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "nn/layer.h"

/* Rows of a batch of n samples of shape s (all but the last dimension). */
static size_t rows(const int s[3], int n) { return (size_t)n * s[0] * s[1]; }

/* ---- Embedding ------------------------------------------------------------ */

typedef struct {
    mg_layer base;
    int vocab, ctx, d;
} embed_layer;

static mg_status embed_setup(mg_layer *l, const int in[3], int out[3])
{
    embed_layer *e = (embed_layer *)l;
    if (in[0] != 1 || in[1] != 1 || in[2] != e->ctx)
        return mg_error(MG_EINVAL, "embedding expects %d tokens per sequence but gets %dx%dx%d",
                        e->ctx, in[0], in[1], in[2]);
    out[0] = 1;
    out[1] = e->ctx;
    out[2] = e->d;
    return MG_OK;
}

static void embed_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    embed_layer *e = (embed_layer *)l;
    const int32_t *tok = (const int32_t *)(const void *)x;
    const float *wte = l->p[0].data, *wpe = l->p[1].data;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < e->ctx; t++) {
            int32_t v = tok[(size_t)i * e->ctx + t];
            MG_ASSERT(v >= 0 && v < e->vocab);
            const float *a = wte + (size_t)v * e->d, *b = wpe + (size_t)t * e->d;
            float *o = y + ((size_t)i * e->ctx + t) * e->d;
            for (int j = 0; j < e->d; j++) o[j] = a[j] + b[j];
        }
}

static void embed_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                           float *dy, float *dx, int n)
{
    embed_layer *e = (embed_layer *)l;
    const int32_t *tok = (const int32_t *)(const void *)x;
    float *gte = l->p[0].grad, *gpe = l->p[1].grad;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < e->ctx; t++) {
            const float *g = dy + ((size_t)i * e->ctx + t) * e->d;
            float *a = gte + (size_t)tok[(size_t)i * e->ctx + t] * e->d, *b = gpe + (size_t)t * e->d;
            for (int j = 0; j < e->d; j++) {
                a[j] += g[j];
                b[j] += g[j];
            }
        }
}

static const mg_layer_vt embed_vt = {
    .kind = "embedding", .setup = embed_setup, .sizes = mg__no_sizes,
    .forward = embed_forward, .backward = embed_backward,
};

mg_layer *mg_layer_embedding(int vocab, int ctx, int d)
{
    MG_ASSERT(vocab > 0 && ctx > 0 && d > 0);
    embed_layer *e = (embed_layer *)mg__layer_alloc(sizeof *e, &embed_vt, NULL);
    if (!e) return NULL;
    e->vocab = vocab;
    e->ctx = ctx;
    e->d = d;
    e->base.anonymous = true;
    e->base.need_dx = false;
    mg__layer_param(&e->base, "wte.weight", false, 2, (int[]){vocab, d});
    mg__layer_param(&e->base, "wpe.weight", false, 2, (int[]){ctx, d});
    return &e->base;
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
    out[1] = in[1];
    out[2] = e->vocab;
    return MG_OK;
}

static void head_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    embed_layer *e = (embed_layer *)((head_layer *)l)->embed;
    mg_gemm(false, true, (int)rows(l->in, n), e->vocab, e->d, 1.0f, x, e->d, e->base.p[0].data,
            e->d, 0.0f, y, e->vocab);
}

static void head_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                          float *dy, float *dx, int n)
{
    embed_layer *e = (embed_layer *)((head_layer *)l)->embed;
    int r = (int)rows(l->in, n);
    mg_gemm(true, false, e->vocab, e->d, r, 1.0f, dy, e->vocab, x, e->d, 1.0f, e->base.p[0].grad,
            e->d);
    if (dx)
        mg_gemm(false, false, r, e->d, e->vocab, 1.0f, dy, e->vocab, e->base.p[0].data, e->d,
                0.0f, dx, e->d);
}

static double head_flops(const mg_layer *l)
{
    embed_layer *e = (embed_layer *)((head_layer *)l)->embed;
    return 2.0 * e->d * e->vocab * rows(l->in, 1);
}

/* The model counts the training cost of a layer with need_dx as 3
 * forwards: the head's wte gradient and input gradient are two of them. */
static const mg_layer_vt head_vt = {
    .kind = "tied_head", .setup = head_setup, .sizes = mg__no_sizes,
    .forward = head_forward, .backward = head_backward, .flops = head_flops,
};

mg_layer *mg_layer_tied_head(mg_layer *embedding)
{
    MG_ASSERT(embedding && embedding->vt == &embed_vt);
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
    float *mean, *rstd;   /* in saved */
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

static void ln_bind(mg_layer *l, int n)
{
    ln_layer *f = (ln_layer *)l;
    f->mean = (float *)l->saved;
    f->rstd = (float *)(l->saved + mg__align(rows(l->in, n) * sizeof(float)));
}

static void ln_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    ln_layer *f = (ln_layer *)l;
    mg_layernorm_forward(y, f->mean, f->rstd, x, l->p[0].data, l->p[1].data, rows(l->in, n), f->d,
                         f->eps);
}

static void ln_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y, float *dy,
                        float *dx, int n)
{
    ln_layer *f = (ln_layer *)l;
    mg_layernorm_backward(dx, l->p[0].grad, l->p[1].grad, dy, x, f->mean, f->rstd, l->p[0].data,
                          rows(l->in, n), f->d);
}

static void ln_init(mg_layer *l, mg_rng *r)
{
    for (size_t i = 0; i < l->p[0].numel; i++) l->p[0].data[i] = 1.0f;
    memset(l->p[1].data, 0, l->p[1].numel * sizeof(float));
}

static const mg_layer_vt ln_vt = {
    .kind = "layernorm", .setup = ln_setup, .sizes = ln_sizes, .bind = ln_bind,
    .forward = ln_forward, .backward = ln_backward, .init = ln_init,
};

mg_layer *mg_layer_layernorm(const char *name, int d, float eps)
{
    MG_ASSERT(d > 0 && eps >= 0.0f);
    ln_layer *f = (ln_layer *)mg__layer_alloc(sizeof *f, &ln_vt, name);
    if (!f) return NULL;
    f->d = d;
    f->eps = eps;
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
    .kind = "gelu", .setup = mg__same_setup, .sizes = mg__no_sizes,
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
    *saved = (size_t)n * a->heads * l->in[1] * sizeof(float);   /* log-sum-exp rows */
    *scratch = mg_attention_scratch(l->in[1]);
}

static void attn_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    attn_layer *a = (attn_layer *)l;
    mg_attention_forward(y, (float *)l->saved, x, n, l->in[1], a->d, a->heads, c->scratch);
}

static void attn_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                          float *dy, float *dx, int n)
{
    attn_layer *a = (attn_layer *)l;
    if (dx)
        mg_attention_backward(dx, dy, y, (const float *)l->saved, x, n, l->in[1], a->d, a->heads,
                              c->scratch);
}

/* q k^T and P v: 2 * T * T * d each per sequence, half of it under the
 * causal mask (the kernels skip most of the masked half). */
static double attn_flops(const mg_layer *l)
{
    const attn_layer *a = (const attn_layer *)l;
    return 2.0 * (double)l->in[1] * l->in[1] * a->d;
}

static const mg_layer_vt attn_vt = {
    .kind = "attention", .setup = attn_setup, .sizes = attn_sizes,
    .forward = attn_forward, .backward = attn_backward, .flops = attn_flops,
};

mg_layer *mg_layer_attention(const char *name, int d, int heads)
{
    MG_ASSERT(d > 0 && heads > 0 && d % heads == 0);
    attn_layer *a = (attn_layer *)mg__layer_alloc(sizeof *a, &attn_vt, name);
    if (!a) return NULL;
    a->d = d;
    a->heads = heads;
    return &a->base;
}

/* ---- The pre-LayerNorm block --------------------------------------------- */

/* Children: 0 ln_1, 1 attn, 2 ln_2, 3 mlp. Saved beyond the children's:
 * a1 = ln_1(x), at = attn(a1), x1 = x + at, a2 = ln_2(x1), mo = mlp(a2). */
enum { B_A1, B_AT, B_X1, B_A2, B_MO, B_N };

typedef struct {
    mg_layer base;
    float *act[B_N];
    size_t act_floats;   /* one activation at the bound n, aligned */
} block_layer;

static mg_status block_setup(mg_layer *l, const int in[3], int out[3])
{
    int cur[3] = {in[0], in[1], in[2]};
    for (int i = 0; i < l->n_child; i++) {
        mg_layer *ch = l->child[i];
        memcpy(ch->in, cur, sizeof cur);
        MG_TRY(ch->vt->setup(ch, cur, ch->out));
        if (memcmp(ch->out, in, sizeof ch->out) != 0)
            return mg_error(MG_EINVAL, "block '%s': '%s' changes the shape %dx%dx%d",
                            l->name, ch->name, in[0], in[1], in[2]);
    }
    memcpy(out, in, 3 * sizeof(int));
    return MG_OK;
}

static size_t block_act_bytes(const mg_layer *l, int n)
{
    return mg__align((size_t)n * mg__per_image(l->in) * sizeof(float));
}

static void block_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    size_t sv, sc;
    mg__children_sizes(l, n, &sv, &sc);
    size_t act = block_act_bytes(l, n);
    *saved = sv + B_N * act;
    *scratch = 3 * act / sizeof(float) + sc;
}

static void block_bind(mg_layer *l, int n)
{
    block_layer *b = (block_layer *)l;
    char *p = mg__bind_children(l, n);
    size_t act = block_act_bytes(l, n);
    for (int k = 0; k < B_N; k++) b->act[k] = (float *)(p + k * act);
    b->act_floats = act / sizeof(float);
}

static void block_propagate(mg_layer *l)
{
    for (int i = 0; i < l->n_child; i++) {
        l->child[i]->need_dx = i > 0 || l->need_dx;
        if (l->child[i]->vt->propagate) l->child[i]->vt->propagate(l->child[i]);
    }
}

static void add(float *y, const float *a, const float *b, size_t m)
{
    for (size_t i = 0; i < m; i++) y[i] = a[i] + b[i];
}

static void block_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    block_layer *b = (block_layer *)l;
    mg_ctx cc = *c;
    cc.scratch = c->scratch + 3 * b->act_floats;
    size_t m = (size_t)n * mg__per_image(l->in);
    mg_layer **ch = l->child;
    ch[0]->vt->forward(ch[0], &cc, x, b->act[B_A1], n);
    ch[1]->vt->forward(ch[1], &cc, b->act[B_A1], b->act[B_AT], n);
    add(b->act[B_X1], x, b->act[B_AT], m);
    ch[2]->vt->forward(ch[2], &cc, b->act[B_X1], b->act[B_A2], n);
    ch[3]->vt->forward(ch[3], &cc, b->act[B_A2], b->act[B_MO], n);
    add(y, b->act[B_X1], b->act[B_MO], m);
}

static void block_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                           float *dy, float *dx, int n)
{
    block_layer *b = (block_layer *)l;
    mg_ctx cc = *c;
    float *g0 = c->scratch, *g1 = g0 + b->act_floats, *g2 = g1 + b->act_floats;
    cc.scratch = c->scratch + 3 * b->act_floats;
    size_t m = (size_t)n * mg__per_image(l->in);
    mg_layer **ch = l->child;
    /* y = x1 + mlp(ln_2(x1)): children may overwrite the gradient they get. */
    memcpy(g0, dy, m * sizeof(float));
    ch[3]->vt->backward(ch[3], &cc, b->act[B_A2], b->act[B_MO], g0, g1, n);
    ch[2]->vt->backward(ch[2], &cc, b->act[B_X1], b->act[B_A2], g1, g2, n);
    for (size_t i = 0; i < m; i++) g2[i] += dy[i];                 /* d x1 */
    /* x1 = x + attn(ln_1(x)). */
    memcpy(g0, g2, m * sizeof(float));
    ch[1]->vt->backward(ch[1], &cc, b->act[B_A1], b->act[B_AT], g0, g1, n);
    ch[0]->vt->backward(ch[0], &cc, x, b->act[B_A1], g1, dx, n);
    if (dx)
        for (size_t i = 0; i < m; i++) dx[i] += g2[i];
}

static const mg_layer_vt block_vt = {
    .kind = "gpt_block", .setup = block_setup, .sizes = block_sizes, .bind = block_bind,
    .propagate = block_propagate, .forward = block_forward, .backward = block_backward,
};

mg_layer *mg_layer_gpt_block(const char *name, int d, int heads)
{
    mg_layer *attn[] = {mg_layer_linear_tokens("c_attn", d, 3 * d),
                        mg_layer_attention("core", d, heads),
                        mg_layer_linear_tokens("c_proj", d, d)};
    mg_layer *mlp[] = {mg_layer_linear_tokens("c_fc", d, 4 * d), mg_layer_gelu("gelu"),
                       mg_layer_linear_tokens("c_proj", 4 * d, d)};
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
    return &b->base;
}

/* ---- gpt-mini -------------------------------------------------------------- */

mg_gpt_config mg_gpt_defaults(void)
{
    return (mg_gpt_config){.layers = 4, .dim = 128, .heads = 4, .ctx = 128, .vocab = 256};
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
    mg_layer **blocks = calloc((size_t)g->layers, sizeof *blocks);
    if (!blocks) return mg_error(MG_ENOMEM, "gpt-mini: out of memory");
    for (int i = 0; i < g->layers; i++) {
        blocks[i] = mg_layer_gpt_block(NULL, g->dim, g->heads);
        if (blocks[i]) {
            /* GPT-2: the residual projections get std 0.02/sqrt(2L). */
            float std = 0.02f / sqrtf(2.0f * g->layers);
            mg_layer_set_init(blocks[i], MG_INIT_NORMAL, 0.02f);
            mg_layer_set_init(blocks[i]->child[1]->child[2], MG_INIT_NORMAL, std);
            mg_layer_set_init(blocks[i]->child[3]->child[2], MG_INIT_NORMAL, std);
        }
    }
    mg_layer *embed = mg_layer_embedding(g->vocab, g->ctx, g->dim);
    if (embed) mg_layer_set_init(embed, MG_INIT_NORMAL, 0.02f);
    mg_layer *top[] = {embed, mg_layer_sequential("h", blocks, g->layers),
                       mg_layer_layernorm("ln_f", g->dim, 1e-5f),
                       embed ? mg_layer_tied_head(embed) : NULL};
    free(blocks);
    mg_layer *root = mg_layer_sequential(NULL, top, 4);
    MG_TRY(mg_model_create_from("gpt-mini", root, 1, 1, g->ctx, seed, out));
    mg__model_set_positions(*out, g->ctx);
    return MG_OK;
}
