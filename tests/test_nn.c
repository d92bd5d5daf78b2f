/* Tests of src/nn: finite-difference gradient checks of every layer and the
 * loss, fused versus separate layers, arena layout and the gradient hook,
 * external gradient storage, batch-norm statistics, dropout streams and a
 * training step that neither allocates nor page-faults.
 *
 * Gradient checks wrap the layer in a model with input gradients on and
 * use L = sum(r .* y) for a fixed random r, accumulated in double, and
 * central differences with a small step (1e-3: the truncation error of
 * smooth layers such as batch norm is ~eps^2). ReLU and max pooling have
 * kinks; an entry whose step crosses one is detected (the differences at
 * eps and 2*eps disagree) and skipped, and at most 1 in 8 may be (a wrong
 * but piecewise-linear gradient still fails on the others). */
#include <sys/resource.h>
#include "harness.h"
#include "multigrad/nn.h"

typedef struct {
    mg_model *m;
    int n, in_sz, out_sz;
    float *x, *r;
} gc;

static char gc_what[64];   /* which configuration, for failure messages */

static float urand(mg_rng *g) { return 2.0f * mg_rng_uniform(g) - 1.0f; }

static void gc_init(gc *g, mg_layer *layer, int n, int c, int h, int w, uint64_t seed)
{
    CHECK_OK(mg_model_create_from("gc", layer, c, h, w, seed, &g->m));
    mg_model_set_input_grad(g->m, true);
    CHECK_OK(mg_model_reserve(g->m, n));
    g->n = n;
    g->in_sz = c * h * w;
    g->out_sz = mg_model_classes(g->m);
    g->x = malloc(sizeof(float) * (size_t)n * g->in_sz);
    g->r = malloc(sizeof(float) * (size_t)n * g->out_sz);
    mg_rng rg;
    mg_rng_init(&rg, seed + 1000);
    for (int i = 0; i < n * g->in_sz; i++) g->x[i] = urand(&rg);
    for (int i = 0; i < n * g->out_sz; i++) g->r[i] = urand(&rg);
    /* Parameters of moderate size, so gradients are not tiny. */
    /* ... except batch-norm scales near 1. */
    for (int t = 0; t < mg_model_num_tensors(g->m); t++) {
        const mg_param *q = mg_model_tensor(g->m, t);
        if (q->is_buffer) continue;
        bool bn_scale = strstr(q->name, "bn") && strstr(q->name, "weight");
        for (size_t i = 0; i < q->numel; i++)
            q->data[i] = bn_scale ? 1.0f + 0.3f * urand(&rg) : 0.5f * urand(&rg);
    }
}

static void gc_free(gc *g)
{
    mg_model_destroy(g->m);
    free(g->x);
    free(g->r);
}

static double gc_loss(gc *g)
{
    mg_model_set_rng_counter(g->m, 5);   /* the same dropout mask every time */
    const float *y = mg_model_forward(g->m, g->x, g->n);
    double s = 0.0;
    for (int i = 0; i < g->n * g->out_sz; i++) s += (double)y[i] * g->r[i];
    return s;
}

static double fd_at(gc *g, float *v, double eps)
{
    float old = *v;
    *v = (float)(old + eps);
    double lp = gc_loss(g);
    *v = (float)(old - eps);
    double lm = gc_loss(g);
    *v = old;
    /* The step actually taken in float. */
    return (lp - lm) / ((double)(float)(old + eps) - (double)(float)(old - eps));
}

/* Compare analytic gradients ga[] of values v[] (count n, sampled up to
 * `samples`) with finite differences. Returns entries skipped at kinks. */
static int gc_compare(gc *g, const char *what, float *v, const float *ga, int n,
                      int samples, double eps, double rtol, double scale)
{
    int skipped = 0, step = n > samples ? n / samples : 1;
    for (int i = 0; i < n; i += step) {
        double f1 = fd_at(g, &v[i], eps), f2 = fd_at(g, &v[i], 2 * eps);
        double fd = f1;
        double tol = rtol * (fabs(ga[i]) + 0.05 * scale) + 1e-4;
        if (fabs(f1 - f2) > tol) {
            skipped++;
            continue;
        }
        CHECK_MSG(fabs(ga[i] - fd) <= tol, "%s %s[%d]: analytic %.7g, finite difference %.7g",
                  gc_what, what, i, ga[i], fd);
    }
    return skipped;
}

/* Full check: parameters (and buffers untouched) and the input. */
static void gc_run(gc *g, double rtol)
{
    mg_model *m = g->m;
    mg_model_zero_grad(m);
    gc_loss(g);
    mg_model_backward_from(m, g->r);
    size_t np = mg_model_arena_size(m);
    float *ga = malloc(sizeof(float) * np);
    memcpy(ga, mg_model_grads(m), sizeof(float) * np);
    int nin = g->n * g->in_sz;
    float *gx = malloc(sizeof(float) * (size_t)nin);
    memcpy(gx, mg_model_input_grad(m), sizeof(float) * (size_t)nin);
    /* Absolute tolerance relative to the largest gradient of the model
     * (a gradient that is exactly zero, e.g. a bias before batch norm, is
     * still checked against the rounding noise of the others). */
    double scale = 0.0;
    for (size_t i = 0; i < np; i++) scale = fmax(scale, fabs(ga[i]));
    for (int i = 0; i < nin; i++) scale = fmax(scale, fabs(gx[i]));
    int checked = 0, skipped = 0;
    for (int t = 0; t < mg_model_num_tensors(m); t++) {
        const mg_param *q = mg_model_tensor(m, t);
        if (q->is_buffer) continue;
        skipped += gc_compare(g, q->name, q->data, ga + q->offset, (int)q->numel, 40, 1e-3,
                              rtol, scale);
        checked += q->numel < 40 ? (int)q->numel : 40;
    }
    skipped += gc_compare(g, "input", g->x, gx, nin, 80, 1e-3, rtol, scale);
    checked += nin < 80 ? nin : 80;
    CHECK_MSG(skipped * 8 <= checked, "%s %d of %d entries crossed a kink", gc_what, skipped,
              checked);
    free(ga);
    free(gx);
}

TEST(nn_grad_linear)
{
    gc g;
    gc_init(&g, mg_layer_linear("fc", 12, 7, false), 3, 3, 2, 2, 1);
    gc_run(&g, 2e-3);
    gc_free(&g);
    gc_init(&g, mg_layer_linear("fc", 12, 7, true), 3, 1, 1, 12, 2);
    gc_run(&g, 2e-3);
    gc_free(&g);
}

TEST(nn_grad_conv2d_stride_padding)
{
    gc g;
    gc_init(&g, mg_layer_conv2d("conv", 3, 4, 3, 2, 1, false, MG_POOL_NONE), 2, 3, 7, 6, 3);
    gc_run(&g, 2e-3);
    gc_free(&g);
    gc_init(&g, mg_layer_conv2d("conv", 2, 3, 5, 1, 2, false, MG_POOL_NONE), 3, 2, 6, 6, 4);
    gc_run(&g, 2e-3);
    gc_free(&g);
}

TEST(nn_grad_conv2d_fused)
{
    /* A tiny chunk budget makes the batch span several im2col chunks. */
    setenv("MG_CONV_CHUNK_KB", "16", 1);
    mg_pool_kind pools[] = {MG_POOL_NONE, MG_POOL_AVG, MG_POOL_MAX};
    for (int k = 0; k < 3; k++)
        for (int relu = 0; relu < 2; relu++) {
            gc g;
            snprintf(gc_what, sizeof gc_what, "pool %d relu %d:", k, relu);
            /* 9x9 output: the pool drops the last row and column. */
            gc_init(&g, mg_layer_conv2d("conv", 3, 5, 3, 1, 0, relu, pools[k]), 2, 3, 11, 11,
                    10 + k * 2 + relu);
            gc_run(&g, 2e-3);
            gc_free(&g);
            /* One input channel: the direct path (with AVX-512). */
            gc_init(&g, mg_layer_conv2d("conv", 1, 3, 3, 1, 1, relu, pools[k]), 2, 1, 10, 9,
                    20 + k * 2 + relu);
            gc_run(&g, 2e-3);
            gc_free(&g);
        }
}

TEST(nn_grad_relu_pool_flatten)
{
    gc g;
    gc_init(&g, mg_layer_relu("relu"), 3, 2, 5, 5, 20);
    gc_run(&g, 1e-3);
    gc_free(&g);
    gc_init(&g, mg_layer_avgpool2d("pool", 3, 2), 2, 3, 8, 7, 21);
    gc_run(&g, 1e-3);
    gc_free(&g);
    gc_init(&g, mg_layer_maxpool2d("pool", 2, 2), 2, 3, 9, 8, 22);
    gc_run(&g, 1e-3);
    gc_free(&g);
    gc_init(&g, mg_layer_flatten("flat"), 2, 3, 4, 4, 23);
    gc_run(&g, 1e-3);
    gc_free(&g);
}

TEST(nn_grad_dropout_fixed_mask)
{
    gc g;
    gc_init(&g, mg_layer_dropout("drop", 0.3f), 4, 2, 5, 5, 30);
    mg_model_set_dropout_seed(g.m, 99);
    gc_run(&g, 1e-3);
    /* The mask really drops about p of the entries. */
    const float *y = mg_model_forward(g.m, g.x, g.n);
    int zeros = 0;
    for (int i = 0; i < g.n * g.out_sz; i++) {
        zeros += y[i] == 0.0f;
        CHECK(y[i] == 0.0f || fabsf(y[i] - g.x[i] / 0.7f) < 1e-6f);
    }
    CHECK(zeros > 20 && zeros < 100);
    gc_free(&g);
}

TEST(nn_grad_batchnorm)
{
    gc g;
    gc_init(&g, mg_layer_batchnorm2d("bn", 3), 4, 3, 3, 3, 40);
    gc_run(&g, 5e-3);
    mg_model_set_training(g.m, false);
    gc_run(&g, 5e-3);
    gc_free(&g);
}

static mg_layer *res_block(bool projection)
{
    mg_layer *b[] = {
        mg_layer_conv2d("conv1", 3, 4, 3, projection ? 2 : 1, 1, false, MG_POOL_NONE),
        mg_layer_batchnorm2d("bn1", 4),
        mg_layer_relu("relu"),
        mg_layer_conv2d("conv2", 4, projection ? 4 : 3, 3, 1, 1, false, MG_POOL_NONE),
        mg_layer_batchnorm2d("bn2", projection ? 4 : 3),
    };
    mg_layer *sc = projection ? mg_layer_conv2d("down", 3, 4, 1, 2, 0, false, MG_POOL_NONE)
                              : NULL;
    return mg_layer_residual("block", mg_layer_sequential("branch", b, 5), sc, true);
}

TEST(nn_grad_residual_block)
{
    for (int proj = 0; proj < 2; proj++) {
        gc g;
        snprintf(gc_what, sizeof gc_what, "projection %d:", proj);
        gc_init(&g, res_block(proj), 3, 3, 6, 6, 50 + proj);
        gc_run(&g, 1e-2);
        gc_free(&g);
    }
}

/* Transformer layers on sequences [1, T, d]. */
TEST(nn_grad_transformer_layers)
{
    gc g;
    snprintf(gc_what, sizeof gc_what, "linear_tokens:");
    gc_init(&g, mg_layer_linear_tokens("fc", 6, 5), 2, 1, 4, 6, 60);
    gc_run(&g, 2e-3);
    gc_free(&g);
    snprintf(gc_what, sizeof gc_what, "layernorm:");
    gc_init(&g, mg_layer_layernorm("ln", 6, 1e-5f), 3, 1, 4, 6, 61);
    gc_run(&g, 5e-3);
    gc_free(&g);
    snprintf(gc_what, sizeof gc_what, "gelu:");
    gc_init(&g, mg_layer_gelu("gelu"), 2, 1, 3, 5, 62);
    gc_run(&g, 2e-3);
    gc_free(&g);
    /* Attention over 37 positions: two query blocks, the second partly
     * masked; 3 heads of 4. */
    snprintf(gc_what, sizeof gc_what, "attention:");
    gc_init(&g, mg_layer_attention("attn", 12, 3), 2, 1, 37, 36, 63);
    gc_run(&g, 5e-3);
    gc_free(&g);
    snprintf(gc_what, sizeof gc_what, "gpt block:");
    gc_init(&g, mg_layer_gpt_block("blk", 8, 2), 2, 1, 5, 8, 64);
    gc_run(&g, 1e-2);
    gc_free(&g);
}

/* The gpt block in slices of two sequences (MG_BLOCK_ROWS 10, T 5): a
 * batch of 3 runs as a full slice and a partial one, each with its
 * LayerNorm statistics, log-sum-exp rows and kept tensors at its offset,
 * and the weight gradients accumulate over both. */
TEST(nn_grad_gpt_block_slices)
{
    setenv("MG_BLOCK_ROWS", "10", 1);
    gc g;
    snprintf(gc_what, sizeof gc_what, "gpt block in slices:");
    gc_init(&g, mg_layer_gpt_block("blk", 8, 2), 3, 1, 5, 8, 65);
    gc_run(&g, 1e-2);
    gc_free(&g);
}

/* The causal mask: changing a later position never changes an earlier
 * output; the same sequence alone and in a batch gives the same output. */
TEST(nn_attention_is_causal)
{
    int T = 40, d = 8;
    mg_model *m;
    CHECK_OK(mg_model_create_from("attn", mg_layer_attention("attn", d, 2), 1, T, 3 * d, 1, &m));
    CHECK_OK(mg_model_reserve(m, 2));
    float *x = malloc(sizeof(float) * 2 * T * 3 * d), *y0 = malloc(sizeof(float) * 2 * T * d);
    mg_rng r;
    mg_rng_init(&r, 7);
    for (int i = 0; i < 2 * T * 3 * d; i++) x[i] = urand(&r);
    memcpy(y0, mg_model_forward(m, x, 2), sizeof(float) * 2 * T * d);
    for (int j = 0; j < 3 * d; j++) x[(size_t)(T + 30) * 3 * d + j] += 1.0f;   /* sample 1, t=30 */
    const float *y1 = mg_model_forward(m, x, 2);
    for (int i = 0; i < 2 * T * d; i++) {
        bool later = i >= (T + 30) * d;
        if (!later) CHECK_MSG(y1[i] == y0[i], "output %d changed by a later position", i);
    }
    bool changed = false;
    for (int i = (T + 30) * d; i < 2 * T * d; i++) changed |= y1[i] != y0[i];
    CHECK(changed);
    const float *y2 = mg_model_forward(m, x, 1);   /* sample 0 alone */
    for (int i = 0; i < T * d; i++) CHECK_NEAR(y2[i], y0[i], 0);
    free(x);
    free(y0);
    mg_model_destroy(m);
}

TEST(nn_grad_softmax_xent)
{
    int n = 5, k = 7;
    float z[35], d[35];
    int32_t y[5] = {0, 6, 3, 3, 1};
    mg_rng r;
    mg_rng_init(&r, 60);
    for (int i = 0; i < n * k; i++) z[i] = 3.0f * urand(&r);
    int correct;
    float loss = mg_softmax_xent(z, y, n, k, d, &correct);
    /* Reference in double. */
    double ref = 0.0;
    int hits = 0;
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        int arg = 0;
        for (int j = 0; j < k; j++) {
            s += exp(z[i * k + j]);
            if (z[i * k + j] > z[i * k + arg]) arg = j;
        }
        ref += log(s) - z[i * k + y[i]];
        hits += arg == y[i];
    }
    CHECK_NEAR(loss, ref / n, 1e-6);
    CHECK_EQ(correct, hits);
    for (int i = 0; i < n * k; i++) {
        float old = z[i];
        double e = 1e-2;
        z[i] = (float)(old + e);
        double lp = mg_softmax_xent(z, y, n, k, NULL, NULL);
        z[i] = (float)(old - e);
        double lm = mg_softmax_xent(z, y, n, k, NULL, NULL);
        z[i] = old;
        CHECK_NEAR(d[i], (lp - lm) / (2 * e), 2e-4);
    }
    /* Stable for huge logits. */
    float big[3] = {1000.0f, -1000.0f, 999.0f};
    int32_t yb = 2;
    float lb = mg_softmax_xent(big, &yb, 1, 3, d, NULL);
    CHECK_NEAR(lb, 1.0 + log1p(exp(-1.0)), 1e-5);
    CHECK(isfinite(d[0]) && isfinite(d[1]) && isfinite(d[2]));
}

/* The fused conv+ReLU+pool layer equals the three separate layers. */
TEST(nn_fused_equals_separate)
{
    mg_pool_kind kinds[] = {MG_POOL_AVG, MG_POOL_MAX};
    for (int k = 0; k < 2; k++) {
        mg_model *a, *b;
        CHECK_OK(mg_model_create_from(
            "fused", mg_layer_conv2d("c", 2, 4, 3, 1, 1, true, kinds[k]), 2, 9, 9, 7, &a));
        mg_layer *sep[] = {
            mg_layer_conv2d("c", 2, 4, 3, 1, 1, false, MG_POOL_NONE),
            mg_layer_relu("r"),
            k == 0 ? mg_layer_avgpool2d("p", 2, 2) : mg_layer_maxpool2d("p", 2, 2),
        };
        CHECK_OK(mg_model_create_from("sep", mg_layer_sequential(NULL, sep, 3), 2, 9, 9, 7, &b));
        CHECK_EQ(mg_model_classes(a), 4 * 4 * 4);
        CHECK_EQ(mg_model_classes(b), 4 * 4 * 4);
        mg_model_set_input_grad(a, true);
        mg_model_set_input_grad(b, true);
        CHECK_EQ(mg_model_num_params(a), mg_model_num_params(b));
        memcpy(mg_model_params(b), mg_model_params(a), sizeof(float) * mg_model_num_params(a));
        float x[3 * 2 * 81], r[3 * 64];
        mg_rng g;
        mg_rng_init(&g, 8);
        for (int i = 0; i < 3 * 2 * 81; i++) x[i] = urand(&g);
        for (int i = 0; i < 3 * 64; i++) r[i] = urand(&g);
        const float *ya = mg_model_forward(a, x, 3), *yb = mg_model_forward(b, x, 3);
        for (int i = 0; i < 3 * 64; i++) CHECK_NEAR(ya[i], yb[i], 1e-6);
        mg_model_zero_grad(a);
        mg_model_zero_grad(b);
        mg_model_backward_from(a, r);
        mg_model_backward_from(b, r);
        for (size_t i = 0; i < mg_model_num_params(a); i++)
            CHECK_NEAR(mg_model_grads(a)[i], mg_model_grads(b)[i], 1e-5);
        for (int i = 0; i < 3 * 2 * 81; i++)
            CHECK_NEAR(mg_model_input_grad(a)[i], mg_model_input_grad(b)[i], 1e-6);
        mg_model_destroy(a);
        mg_model_destroy(b);
    }
}

typedef struct {
    mg_model *m;
    int calls;
    int unit[32];
    char kind[32];    /* 'f', 'F', 'b', 'B': pre/post forward, pre/post backward */
} hook_log;

static void log_call(void *ud, int unit, char kind)
{
    hook_log *h = ud;
    if (h->calls < 32) {
        h->unit[h->calls] = unit;
        h->kind[h->calls] = kind;
    }
    h->calls++;
}
static void log_pre_f(void *ud, mg_tape *t, int u) { log_call(ud, u, 'f'); }
static void log_post_f(void *ud, mg_tape *t, int u) { log_call(ud, u, 'F'); }
static void log_pre_b(void *ud, mg_tape *t, int u) { log_call(ud, u, 'b'); }
static void log_post_b(void *ud, mg_tape *t, int u) { log_call(ud, u, 'B'); }
static const mg_unit_hooks log_hooks = {log_pre_f, log_post_f, log_pre_b, log_post_b};

/* Units tile the arena in reverse order, each padded to the unit pad, and
 * every tensor lies inside its unit's range; padding stays zero. */
static void check_unit_layout(mg_model *m, size_t pad)
{
    size_t at = 0;
    int nu = mg_model_num_units(m);
    for (int u = nu - 1; u >= 0; u--) {
        mg_unit_info ui = mg_model_unit(m, u);
        CHECK_EQ(ui.lo, at);
        CHECK_EQ((ui.hi - ui.lo) % pad, 0);
        CHECK(ui.hi - ui.lo >= ui.numel && ui.hi - ui.lo < ui.numel + pad);
        at = ui.hi;
    }
    CHECK(at == mg_model_arena_size(m) || (at == 0 && mg_model_arena_size(m) == pad));
    size_t used = 0;
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *t = mg_model_tensor(m, i);
        if (t->is_buffer) continue;
        used += t->numel;
        bool inside = false;
        for (int u = 0; u < nu; u++) {
            mg_unit_info ui = mg_model_unit(m, u);
            inside = inside || (t->offset >= ui.lo && t->offset + t->numel <= ui.lo + ui.numel);
        }
        CHECK(inside);
        CHECK(t->data == mg_model_params(m) + t->offset);
        CHECK(t->grad == mg_model_grads(m) + t->offset);
    }
    CHECK_EQ(used, mg_model_num_params(m));
    for (int u = 0; u < nu; u++) {
        mg_unit_info ui = mg_model_unit(m, u);
        for (size_t i = ui.lo + ui.numel; i < ui.hi; i++)
            CHECK(mg_model_params(m)[i] == 0.0f && mg_model_grads(m)[i] == 0.0f);
    }
}

TEST(nn_arena_layout_and_hook_order)
{
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", 0, &m));
    const char *names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                           "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                           "fc3.weight", "fc3.bias"};
    size_t numel[] = {150, 6, 2400, 16, 48000, 120, 10080, 84, 840, 10};
    CHECK_EQ(mg_model_num_tensors(m), 10);
    CHECK_EQ(mg_model_num_units(m), 5);
    CHECK_EQ(mg_model_unit_pad(m), MG_SIMD_FLOATS);
    /* Backward order: fc3 first; each layer weight then bias; a unit's
     * range rounded up to the pad. */
    size_t off = 0;
    for (int i = 9; i >= 0; i -= 2) {
        const mg_param *w = mg_model_tensor(m, i - 1), *b = mg_model_tensor(m, i);
        CHECK(strcmp(w->name, names[i - 1]) == 0 && strcmp(b->name, names[i]) == 0);
        CHECK_EQ(w->numel, numel[i - 1]);
        CHECK_EQ(b->numel, numel[i]);
        CHECK_EQ(w->offset, off);
        CHECK_EQ(b->offset, off + w->numel);
        CHECK(!w->is_buffer && !b->is_buffer);
        mg_unit_info ui = mg_model_unit(m, i / 2);
        size_t nl = strlen(ui.name);   /* "fc3" of "fc3.bias" */
        CHECK(nl > 0 && strncmp(ui.name, names[i], nl) == 0 && names[i][nl] == '.');
        CHECK_EQ(ui.lo, off);
        CHECK_EQ(ui.numel, w->numel + b->numel);
        off = (off + w->numel + b->numel + 15) / 16 * 16;
        CHECK_EQ(ui.hi, off);
    }
    const mg_param *cw = mg_model_find(m, "conv1.weight");
    CHECK(cw && cw->ndim == 4 && cw->shape[0] == 6 && cw->shape[1] == 1 &&
          cw->shape[2] == 5 && cw->shape[3] == 5);
    CHECK(mg_model_find(m, "conv9.weight") == NULL);
    CHECK_EQ(mg_model_num_params(m), 61706);
    CHECK_EQ(mg_model_arena_size(m), off);
    check_unit_layout(m, MG_SIMD_FLOATS);
    /* Hooks: around each unit, forward in order, backward in reverse. */
    hook_log h = {.m = m};
    CHECK_OK(mg_model_add_hooks(m, &log_hooks, &h));
    float x[2 * 784];
    int32_t y[2] = {1, 7};
    for (int i = 0; i < 2 * 784; i++) x[i] = (float)((i * 37) % 101) / 101.0f;
    mg_model_forward(m, x, 2);
    mg_model_loss(m, y, NULL);
    mg_model_zero_grad(m);
    mg_model_backward(m);
    CHECK_EQ(h.calls, 20);
    for (int i = 0; i < 5; i++) {
        CHECK(h.unit[2 * i] == i && h.kind[2 * i] == 'f');
        CHECK(h.unit[2 * i + 1] == i && h.kind[2 * i + 1] == 'F');
        CHECK(h.unit[10 + 2 * i] == 4 - i && h.kind[10 + 2 * i] == 'b');
        CHECK(h.unit[11 + 2 * i] == 4 - i && h.kind[11 + 2 * i] == 'B');
    }
    /* A pad for 13 ranks: the same parameters by name, every range splits
     * into 13 equal shards of whole SIMD vectors. */
    size_t n0 = mg_model_arena_size(m);
    float *before = malloc(n0 * sizeof(float));
    memcpy(before, mg_model_params(m), n0 * sizeof(float));
    size_t old_off[10];
    for (int i = 0; i < 10; i++) old_off[i] = mg_model_tensor(m, i)->offset;
    CHECK_OK(mg_model_set_unit_pad(m, 13 * 16));
    check_unit_layout(m, 13 * 16);
    for (int i = 0; i < 10; i++) {
        const mg_param *t = mg_model_tensor(m, i);
        CHECK(memcmp(t->data, before + old_off[i], t->numel * sizeof(float)) == 0);
    }
    free(before);
    mg_model_destroy(m);
}

/* Nested Sequentials open up into units at any depth, with the tensor
 * names of the tree. */
TEST(nn_units_at_any_depth)
{
    mg_layer *inner[] = {mg_layer_linear("a", 8, 8, true), mg_layer_linear("b", 8, 8, true)};
    mg_layer *mid[] = {mg_layer_sequential("inner", inner, 2), mg_layer_relu("act")};
    mg_layer *top[] = {mg_layer_sequential("mid", mid, 2), mg_layer_linear("out", 8, 3, false)};
    mg_model *m;
    CHECK_OK(mg_model_create_from("nested", mg_layer_sequential(NULL, top, 2), 1, 1, 8, 1, &m));
    CHECK_EQ(mg_model_num_units(m), 4);
    const char *want[] = {"mid.inner.a", "mid.inner.b", "mid.act", "out"};
    for (int u = 0; u < 4; u++) CHECK(strcmp(mg_model_unit(m, u).name, want[u]) == 0);
    CHECK(mg_model_find(m, "mid.inner.b.weight") != NULL);
    CHECK_EQ(mg_model_unit(m, 2).numel, 0);
    check_unit_layout(m, MG_SIMD_FLOATS);
    hook_log h = {.m = m};
    CHECK_OK(mg_model_add_hooks(m, &log_hooks, &h));
    CHECK_EQ(mg_model_num_hooks(m), 1);
    float x[2 * 8] = {0.5f, -1, 2, 0.25f, 1, -0.5f, 3, 1, 0, 1, 2, 3, -1, -2, 0.5f, 0.75f};
    int32_t y[2] = {0, 2};
    mg_model_forward(m, x, 2);
    mg_model_loss(m, y, NULL);
    mg_model_backward(m);
    /* Backward: out, act, b, a (unit 0 needs no input gradient). */
    CHECK_EQ(h.calls, 16);
    for (int i = 0; i < 4; i++) CHECK(h.unit[8 + 2 * i] == 3 - i && h.kind[9 + 2 * i] == 'B');
    mg_model_destroy(m);
}

TEST(nn_grad_storage_moves)
{
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 3, &m));
    size_t n = mg_model_arena_size(m);
    float x[4 * 784];
    int32_t y[4] = {0, 1, 2, 3};
    for (int i = 0; i < 4 * 784; i++) x[i] = (float)(i % 13) / 13.0f;
    mg_model_zero_grad(m);
    mg_model_forward(m, x, 4);
    mg_model_loss(m, y, NULL);
    mg_model_backward(m);
    float *ref = malloc(n * sizeof(float)), *ext = calloc(n, sizeof(float));
    memcpy(ref, mg_model_grads(m), n * sizeof(float));
    mg_model_set_grad_storage(m, ext);
    CHECK(mg_model_grads(m) == ext);
    CHECK(mg_model_find(m, "fc1.weight")->grad == ext + mg_model_find(m, "fc1.weight")->offset);
    CHECK(memcmp(ext, ref, n * sizeof(float)) == 0);   /* copied */
    /* A second backward accumulates in the new storage. */
    mg_model_forward(m, x, 4);
    mg_model_loss(m, y, NULL);
    mg_model_backward(m);
    for (size_t i = 0; i < mg_model_num_params(m); i += 97) CHECK_NEAR(ext[i], 2 * ref[i], 1e-6);
    mg_model_destroy(m);
    free(ref);
    free(ext);
}

TEST(nn_batchnorm_running_stats)
{
    mg_model *m;
    CHECK_OK(mg_model_create_from("bn", mg_layer_batchnorm2d("bn", 2), 2, 1, 2, 0, &m));
    CHECK_EQ(mg_model_buffer_size(m), 4);
    const mg_param *rm = mg_model_find(m, "bn.running_mean"), *rv = mg_model_find(m, "bn.running_var");
    CHECK(rm && rv && rm->is_buffer && rv->is_buffer && rm->grad == NULL);
    CHECK(rv->data[0] == 1.0f && rm->data[0] == 0.0f);
    CHECK(mg_model_find(m, "bn.weight")->data[1] == 1.0f);
    /* Two images, channel 0 = {1,2},{3,4}; channel 1 = {0,0},{2,2}. */
    float x[8] = {1, 2, 0, 0, 3, 4, 2, 2};
    const float *y = mg_model_forward(m, x, 2);
    /* Channel 0: mean 2.5, biased var 1.25, unbiased 5/3. */
    double is = 1.0 / sqrt(1.25 + 1e-5);
    CHECK_NEAR(y[0], (1 - 2.5) * is, 1e-5);
    CHECK_NEAR(y[5], (4 - 2.5) * is, 1e-5);
    CHECK_NEAR(rm->data[0], 0.25, 1e-6);
    CHECK_NEAR(rv->data[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-6);
    CHECK_NEAR(rm->data[1], 0.1, 1e-6);
    CHECK_NEAR(rv->data[1], 0.9 + 0.1 * 4.0 / 3.0, 1e-6);
    /* Eval mode uses (and keeps) the running statistics. */
    mg_model_set_training(m, false);
    y = mg_model_forward(m, x, 2);
    CHECK_NEAR(y[0], (1 - 0.25) / sqrt(0.9 + 0.5 / 3.0 + 1e-5), 1e-5);
    CHECK_NEAR(rm->data[0], 0.25, 1e-7);
    mg_model_destroy(m);
}

TEST(nn_dropout_streams)
{
    uint8_t a[4000], b[4000];
    mg_dropout_mask(a, 4000, 0.25f, 1, 0);
    mg_dropout_mask(b, 4000, 0.25f, 1, 0);
    CHECK(memcmp(a, b, 4000) == 0);
    int kept = 0;
    for (int i = 0; i < 4000; i++) kept += a[i];
    CHECK(kept > 2850 && kept < 3150);
    mg_dropout_mask(b, 4000, 0.25f, 1, (uint64_t)1 << 32);
    CHECK(memcmp(a, b, 4000) != 0);
    /* Training forwards advance the stream; eval passes x through. */
    mg_model *m;
    CHECK_OK(mg_model_create_from("d", mg_layer_dropout("drop", 0.5f), 1, 1, 64, 0, &m));
    mg_model_set_dropout_seed(m, 5);
    float x[64], y1[64];
    for (int i = 0; i < 64; i++) x[i] = 1.0f + i;
    memcpy(y1, mg_model_forward(m, x, 1), sizeof y1);
    CHECK_EQ(mg_model_rng_counter(m), 1);
    const float *y2 = mg_model_forward(m, x, 1);
    CHECK(memcmp(y1, y2, sizeof y1) != 0);
    mg_model_set_rng_counter(m, 0);
    CHECK(memcmp(y1, mg_model_forward(m, x, 1), sizeof y1) == 0);
    mg_model_set_training(m, false);
    CHECK(memcmp(x, mg_model_forward(m, x, 1), sizeof x) == 0);
    CHECK_EQ(mg_model_rng_counter(m), 1);
    mg_model_destroy(m);
}

TEST(nn_step_without_page_faults)
{
    mg_model *m;
    CHECK_OK(mg_model_create("lenet-d2l", 0, &m));
    CHECK_OK(mg_model_reserve(m, 64));
    float *x = malloc(64 * 784 * sizeof(float));
    int32_t y[64];
    for (int i = 0; i < 64 * 784; i++) x[i] = (float)(i % 255) / 255.0f;
    for (int i = 0; i < 64; i++) y[i] = i % 10;
    for (int it = 0; it < 2; it++) {   /* warm up OpenBLAS's buffers */
        mg_model_zero_grad(m);
        mg_model_forward(m, x, 64);
        mg_model_loss(m, y, NULL);
        mg_model_backward(m);
    }
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    for (int it = 0; it < 3; it++) {
        mg_model_zero_grad(m);
        mg_model_forward(m, x, it == 1 ? 33 : 64);   /* a short batch too */
        mg_model_loss(m, y, NULL);
        mg_model_backward(m);
    }
    getrusage(RUSAGE_SELF, &b);
    CHECK_MSG(b.ru_minflt - a.ru_minflt < 4, "%ld page faults in 3 steps",
              b.ru_minflt - a.ru_minflt);
    free(x);
    mg_model_destroy(m);
}

TEST(nn_bad_shapes_rejected)
{
    mg_model *m = NULL;
    CHECK_ERR(mg_model_create_from("bad", mg_layer_linear("fc", 10, 3, false), 1, 1, 9, 0, &m),
              MG_EINVAL);
    CHECK(m == NULL && strstr(mg_last_error(), "fc"));
    CHECK_ERR(mg_model_create_from("bad", mg_layer_conv2d("c", 1, 2, 5, 1, 0, false,
                                                          MG_POOL_NONE), 1, 3, 3, 0, &m),
              MG_EINVAL);
    CHECK_ERR(mg_model_create_from("bad", mg_layer_conv2d("c", 2, 2, 3, 1, 0, false,
                                                          MG_POOL_NONE), 1, 8, 8, 0, &m),
              MG_EINVAL);
    mg_layer *b[] = {mg_layer_linear("a", 4, 5, true)};
    CHECK_ERR(mg_model_create_from("bad", mg_layer_residual("res", mg_layer_sequential("br", b, 1),
                                                            NULL, false), 1, 1, 4, 0, &m),
              MG_EINVAL);
    CHECK(strstr(mg_last_error(), "shortcut"));
    /* Two layers of one name: said at creation (it was at the first save) */
    mg_layer *twins[] = {mg_layer_linear("a", 4, 4, true), mg_layer_linear("a", 4, 2, true)};
    CHECK_ERR(mg_model_create_from("twins", mg_layer_sequential(NULL, twins, 2), 1, 1, 4, 0, &m),
              MG_EINVAL);
    CHECK(m == NULL && strstr(mg_last_error(), "two tensors are named 'a."));
    CHECK_ERR(mg_model_create("resnet-9000", 0, &m), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "lenet5"));
    /* Sizes that break a constructor's rule stopped the process (a probe):
     * NULL and MG_EINVAL, and the message passes up through composites to
     * the model. */
#define REFUSED(made, says)                                                   \
    do {                                                                      \
        mg_layer *l_ = (made);                                                \
        CHECK_MSG(!l_ && mg_last_error_code() == MG_EINVAL &&                 \
                  strstr(mg_last_error(), says), "%s: %s", #made, mg_last_error()); \
    } while (0)
    REFUSED(mg_layer_linear("fc", -1, 3, false), "linear 'fc': -1 inputs");
    REFUSED(mg_layer_conv2d("c", 1, 2, 0, 1, 0, false, MG_POOL_NONE), "conv2d 'c'");
    REFUSED(mg_layer_attention("at", 30, 4), "30 features in 4 heads");
    REFUSED(mg_layer_dropout("d", 1.5f), "p 1.5");
    REFUSED(mg_layer_maxpool2d("p", 0, 2), "maxpool2d 'p'");
    REFUSED(mg_layer_batchnorm2d("bn", 0), "0 channels");
    REFUSED(mg_layer_layernorm("ln", 0, 1e-5f), "layernorm 'ln'");
    REFUSED(mg_layer_embedding(0, 4, 8), "embedding: vocabulary 0");
    REFUSED(mg_layer_tied_head(NULL), "tied_head");
    REFUSED(mg_layer_linear_split("s", 4, 3, false, MG_TP_COLUMN, (mg_tp_split){.size = 2}),
            "its 3 outputs do not split");
#undef REFUSED
    mg_layer *inner[] = {mg_layer_linear("a", 4, 4, true), mg_layer_dropout("d", -0.5f)};
    CHECK_ERR(mg_model_create_from("net", mg_layer_sequential(NULL, inner, 2), 1, 1, 4, 0, &m),
              MG_EINVAL);
    CHECK_MSG(m == NULL && strstr(mg_last_error(), "model 'net': no root layer (dropout 'd': p "
                                  "-0.5"), "%s", mg_last_error());
}
