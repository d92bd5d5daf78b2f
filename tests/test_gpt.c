/* gpt-mini (models.md section D) against PyTorch 1.13's values in
 * tests/data/gpt-mini.safetensors (a copy of ../shared/reference/): T=64,
 * B=8, seed 0. The reference's initial parameters are loaded, so the
 * checks are of the arithmetic, not of the random initialisation.
 *
 * Tolerances: the logits and the gradients are sums of many float
 * products in an order that differs from PyTorch's (OpenBLAS blocks the
 * GEMMs its own way), so an entry is compared against its tensor's scale:
 * |ours - theirs| <= 1e-4 * max|theirs| per entry. After 20 AdamW steps,
 * 1e-3 of the tensor's scale: Adam divides by sqrt(v), which magnifies
 * the rounding differences of entries whose gradients are nearly zero. */
#include <math.h>
#include <stdlib.h>
#include "harness.h"
#include "devices.h"
#include "multigrad/checkpoint.h"
#include "multigrad/data.h"
#include "multigrad/nn.h"
#include "multigrad/optim.h"
#include "multigrad/parallel.h"

enum { T = 64, B = 8 };

static const mg_st_tensor *ref(const mg_st_file *f, const char *name, mg_st_dtype dt,
                               size_t numel)
{
    const mg_st_tensor *t = mg_st_find(f, name);
    CHECK_MSG(t != NULL, "reference file lacks %s", name);
    CHECK_MSG(t->dtype == dt && t->nbytes == numel * 4, "%s: wrong dtype or size", name);
    return t;
}

/* The reference's model with its initial parameters, on dev. */
static mg_model *reference_model(const mg_st_file *f, mg_device dev)
{
    mg_gpt_config g = mg_gpt_defaults();
    g.ctx = T;
    mg_model *m = NULL;
    CHECK_OK(mg_model_create_gpt(&g, 0, &m));
    char key[96];
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        snprintf(key, sizeof key, "init.%s", p->name);
        memcpy(p->data, ref(f, key, MG_ST_F32, p->numel)->data, p->numel * 4);
    }
    CHECK_OK(mg_model_to_device(m, dev));
    CHECK_OK(mg_model_reserve(m, B));
    return m;
}

TEST(gpt_model_definition)
{
    mg_gpt_config g = mg_gpt_defaults();
    mg_model *m;
    CHECK_OK(mg_model_create_gpt(&g, 0, &m));
    CHECK_EQ(mg_model_num_params(m), 842496);
    CHECK_EQ(mg_model_num_tensors(m), 2 + 4 * 12 + 2);
    CHECK(!strcmp(mg_model_tensor(m, 0)->name, "wte.weight"));
    CHECK(!strcmp(mg_model_tensor(m, 1)->name, "wpe.weight"));
    CHECK(!strcmp(mg_model_tensor(m, 2)->name, "h.0.ln_1.weight"));
    CHECK(!strcmp(mg_model_tensor(m, 4)->name, "h.0.attn.c_attn.weight"));
    CHECK(!strcmp(mg_model_tensor(m, 13)->name, "h.0.mlp.c_proj.bias"));
    CHECK(!strcmp(mg_model_tensor(m, 50)->name, "ln_f.weight"));
    CHECK_EQ(mg_model_classes(m), 256);
    CHECK_EQ(mg_model_positions(m), 128);
    /* GPT-2 init: N(0, 0.02^2), residual projections 0.02/sqrt(8). */
    const mg_param *p = mg_model_find(m, "h.1.mlp.c_fc.weight");
    double s2 = 0;
    for (size_t i = 0; i < p->numel; i++) s2 += (double)p->data[i] * p->data[i];
    CHECK_CLOSE(sqrt(s2 / p->numel), 0.02, 0.05, 0);
    p = mg_model_find(m, "h.1.attn.c_proj.weight");
    s2 = 0;
    for (size_t i = 0; i < p->numel; i++) s2 += (double)p->data[i] * p->data[i];
    CHECK_CLOSE(sqrt(s2 / p->numel), 0.02 / sqrt(8.0), 0.05, 0);
    CHECK_EQ(mg_model_find(m, "h.3.ln_2.weight")->data[5], 1.0f);
    CHECK_EQ(mg_model_find(m, "h.3.mlp.c_fc.bias")->data[5], 0.0f);
    /* Decay groups: 2-D tensors only. */
    mg_optim_group gr[64];
    int ng = mg_model_decay_groups(m, 0.1f, gr, 64);
    CHECK(ng > 0 && ng <= 64);
    CHECK_EQ(mg_model_decay_groups(m, 0.1f, NULL, 0), ng);   /* the count alone */
    CHECK_EQ(mg_model_decay_groups(m, 0.1f, gr, 3), ng);     /* a short array */
    size_t decayed = 0, at = 0;
    for (int i = 0; i < ng; i++) {
        CHECK_EQ(gr[i].lo, at);
        at = gr[i].hi;
    }
    CHECK_EQ(at, mg_model_arena_size(m));   /* the groups tile the arena, padding too */
    for (int t = 0; t < mg_model_num_tensors(m); t++) {
        const mg_param *q = mg_model_tensor(m, t);
        int k = 0;
        while (k < ng && gr[k].hi <= q->offset) k++;
        CHECK(k < ng && gr[k].lo <= q->offset && q->offset + q->numel <= gr[k].hi);
        CHECK_EQ(gr[k].weight_decay, q->ndim >= 2 ? 0.1f : 0.0f);
        if (q->ndim >= 2) decayed += q->numel;
    }
    CHECK_EQ(decayed, 256 * 128 + 128 * 128 + 4 * (384 * 128 + 128 * 128 + 512 * 128 * 2));
    mg_model_destroy(m);

    g.ctx = 64;
    CHECK_OK(mg_model_create_gpt(&g, 0, &m));
    CHECK_EQ(mg_model_num_params(m), 834304);
    mg_model_destroy(m);
    g.heads = 3;
    CHECK(mg_model_create_gpt(&g, 0, &m) == MG_EINVAL);
    CHECK(strstr(mg_last_error(), "not divisible"));
}

/* Logits, loss, gradients and their norm at init, on dev. */
static void matches_pytorch_at_init(mg_device dev)
{
    mg_st_file *f;
    CHECK_OK(mg_st_open(mgt_data("gpt-mini.safetensors"), &f));
    mg_model *m = reference_model(f, dev);
    const int32_t *x = ref(f, "batch0.x", MG_ST_I32, B * T)->data;
    const int32_t *y = ref(f, "batch0.y", MG_ST_I32, B * T)->data;
    CHECK(mg_model_forward_tokens(m, x, B) != NULL);
    float *logits = malloc((size_t)B * T * 256 * sizeof(float));
    CHECK(logits != NULL);
    mg_tape_logits_to_host(mg_model_tape(m), logits);
    mgt_check_scaled("logits0", logits, ref(f, "logits0", MG_ST_F32, B * T * 256)->data,
                 (size_t)B * T * 256, 1e-4, "PyTorch");
    free(logits);
    mg_model_zero_grad(m);
    float loss = mg_model_loss(m, y, NULL);
    const float *losses = ref(f, "losses", MG_ST_F32, 20)->data;
    CHECK_CLOSE(loss, losses[0], 1e-5, 0);
    mg_model_backward(m);
    char key[96];
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        snprintf(key, sizeof key, "grad.%s", p->name);
        float *g = mgt_host_floats(m, p->grad, p->numel);
        mgt_check_scaled(key, g, ref(f, key, MG_ST_F32, p->numel)->data, p->numel, 1e-4, "PyTorch");
        free(g);
    }
    CHECK_OK(mg_device_set_current(dev));
    double norm = sqrt(mg_grad_sumsq(mg_model_grads(m), mg_model_arena_size(m)));
    CHECK_OK(mg_device_set_current((mg_device){MG_DEVICE_CPU, 0}));
    CHECK_CLOSE(norm, *(const float *)ref(f, "grad_norm0", MG_ST_F32, 1)->data, 1e-4, 0);
    mg_model_destroy(m);
    mg_st_close(f);
}

TEST(gpt_matches_pytorch_at_init) { matches_pytorch_at_init(mgt_device(MG_DEVICE_CPU)); }
/* The device code path run on the CPU (device kind emu). */
TEST(gpt_on_emu_device_matches_pytorch_at_init)
{
    matches_pytorch_at_init(mgt_device(MG_DEVICE_EMU));
}
TEST(gpt_on_gpu_matches_pytorch_at_init) { matches_pytorch_at_init(mgt_device(MG_DEVICE_CUDA)); }

/* The validation loss as models.md defines it (mg_lm_val_loss: the first
 * 512 non-overlapping windows, in batches of the training batch). */
static double val_loss(mg_model *m, const mg_text *t)
{
    double v = NAN;
    CHECK_OK(mg_lm_val_loss(m, t, B, NULL, &v));
    return v;
}

/* 20 AdamW steps with clipping on dev, and the validation loss before and
 * after. */
static void matches_pytorch_after_20_steps(mg_device dev)
{
    mg_text *t;
    if (mg_text_open(NULL, T, &t) != MG_OK)
        CHECK_MSG(false, "the fortunes corpus is missing (scripts/install-deps.sh): %s",
                  mg_last_error());
    mg_st_file *f;
    CHECK_OK(mg_st_open(mgt_data("gpt-mini.safetensors"), &f));
    mg_model *m = reference_model(f, dev);
    CHECK_CLOSE(val_loss(m, t), *(const float *)ref(f, "val_loss0", MG_ST_F32, 1)->data, 1e-5, 0);

    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_ADAMW, 1e-3f);
    oc.beta2 = 0.99f;
    oc.weight_decay = 0.1f;
    mg_optim *o;
    CHECK_OK(mg_optim_create(&oc, mg_model_arena_size(m), &o));
    mg_optim_group gr[128];
    int ng = mg_model_decay_groups(m, 0.1f, gr, 128);
    CHECK(ng <= 128);
    CHECK_OK(mg_optim_set_groups(o, gr, ng));
    CHECK_OK(mg_optim_to_device(o, dev));

    const int32_t *offs = ref(f, "steps.offsets", MG_ST_I32, 20 * B)->data;
    const float *losses = ref(f, "losses", MG_ST_F32, 20)->data;
    int32_t x[B * T], y[B * T];
    size_t np = mg_model_arena_size(m);
    for (int s = 0; s < 20; s++) {
        int64_t o64[B];
        for (int i = 0; i < B; i++) o64[i] = offs[s * B + i];
        mg_text_batch_at(t, o64, B, T, x, y);
        mg_model_zero_grad(m);
        CHECK(mg_model_forward_tokens(m, x, B) != NULL);
        float loss = mg_model_loss(m, y, NULL);
        CHECK_MSG(fabs(loss - losses[s]) <= 1e-4 * losses[s], "step %d: loss %.7g vs PyTorch %.7g",
                  s, loss, losses[s]);
        mg_model_backward(m);
        CHECK_OK(mg_device_set_current(dev));   /* the gradients are dev's */
        double norm = mg_clip_grad_norm(mg_model_grads(m), np, 1.0f);
        CHECK_OK(mg_device_set_current((mg_device){MG_DEVICE_CPU, 0}));
        if (s == 0)
            CHECK_CLOSE(norm, *(const float *)ref(f, "grad_norm0", MG_ST_F32, 1)->data, 1e-4, 0);
        mg_optim_step(o, mg_model_params(m), mg_model_grads(m), 1e-3f);
    }
    char key[96];
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        snprintf(key, sizeof key, "final.%s", p->name);
        float *h = mgt_host_floats(m, p->data, p->numel);
        mgt_check_scaled(key, h, ref(f, key, MG_ST_F32, p->numel)->data, p->numel, 1e-3, "PyTorch");
        free(h);
    }
    CHECK_CLOSE(val_loss(m, t), *(const float *)ref(f, "val_loss20", MG_ST_F32, 1)->data, 1e-4, 0);
    mg_optim_destroy(o);
    mg_model_destroy(m);
    mg_st_close(f);
    mg_text_close(t);
}

TEST_T(gpt_matches_pytorch_after_20_adamw_steps, 120)
{
    matches_pytorch_after_20_steps(mgt_device(MG_DEVICE_CPU));
}
TEST_T(gpt_on_emu_device_matches_pytorch_after_20_adamw_steps, 240)
{
    matches_pytorch_after_20_steps(mgt_device(MG_DEVICE_EMU));
}
TEST_T(gpt_on_gpu_matches_pytorch_after_20_adamw_steps, 120)
{
    matches_pytorch_after_20_steps(mgt_device(MG_DEVICE_CUDA));
}
/* The same with the fused attention kernel, which auto keeps for
 * sequences over 512 positions (src/device/attention.cu). */
TEST_T(gpt_on_emu_device_with_fused_attention_matches_pytorch, 240)
{
    setenv("MG_ATTENTION", "fused", 1);
    matches_pytorch_after_20_steps(mgt_device(MG_DEVICE_EMU));
}
TEST_T(gpt_on_gpu_with_fused_attention_matches_pytorch, 120)
{
    setenv("MG_ATTENTION", "fused", 1);
    matches_pytorch_after_20_steps(mgt_device(MG_DEVICE_CUDA));
}

/* Generation: at temperature 0 each token is the argmax of the last
 * position's logits of the context so far (checked by forwarding the
 * growing sequence, also past T where the context slides); top-k 1 is the
 * same at any temperature; sampling is reproducible by seed and stays in
 * the top k; a token outside the vocabulary, a temperature that is no
 * number or negative, n < 0 and NULL arrays are refused. */
TEST(gpt_generate_greedy_topk_and_seeded)
{
    mg_gpt_config g = {.layers = 1, .dim = 32, .heads = 2, .ctx = 8, .vocab = 256};
    mg_model *m;
    CHECK_OK(mg_model_create_gpt(&g, 3, &m));
    int32_t prompt[3] = {'a', 'b', 'c'}, out[12], topk1[12], s1[12], s2[12];
    CHECK_OK(mg_model_generate(m, prompt, 3, 12, 0.0f, 0, 0, out));
    int32_t seq[15];
    memcpy(seq, prompt, sizeof prompt);
    memcpy(seq + 3, out, sizeof out);
    for (int k = 0; k < 12; k++) {
        int len = 3 + k, start = len > g.ctx ? len - g.ctx : 0, n = len - start;
        int32_t ctx[8] = {0};
        memcpy(ctx, seq + start, sizeof(int32_t) * (size_t)n);
        const float *z = mg_model_forward_tokens(m, ctx, 1) + (size_t)(n - 1) * 256;
        int best = 0;
        for (int i = 1; i < 256; i++)
            if (z[i] > z[best]) best = i;
        CHECK_MSG(out[k] == best, "token %d: %d, argmax %d", k, out[k], best);
    }
    CHECK_OK(mg_model_generate(m, prompt, 3, 12, 1.5f, 1, 7, topk1));
    CHECK(memcmp(out, topk1, sizeof out) == 0);
    CHECK_OK(mg_model_generate(m, prompt, 3, 12, 1.0f, 5, 42, s1));
    CHECK_OK(mg_model_generate(m, prompt, 3, 12, 1.0f, 5, 42, s2));
    CHECK(memcmp(s1, s2, sizeof s1) == 0);
    /* the first sampled token is among the 5 largest logits after the prompt */
    int32_t ctx[8] = {'a', 'b', 'c'};
    const float *z = mg_model_forward_tokens(m, ctx, 1) + 2 * 256;
    int above = 0;
    for (int i = 0; i < 256; i++) above += z[i] > z[s1[0]];
    CHECK_MSG(above < 5, "sampled token %d has %d larger logits (top-k 5)", s1[0], above);
    int32_t bad[1] = {256};
    CHECK_ERR(mg_model_generate(m, bad, 1, 4, 1.0f, 0, 0, out), MG_EINVAL);
    CHECK_ERR(mg_model_generate(m, prompt, 0, 4, 1.0f, 0, 0, out), MG_EINVAL);
    /* parameters no generation can take (a probe), and training mode kept */
    CHECK_ERR(mg_model_generate(m, prompt, 3, 4, NAN, 0, 0, out), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "temperature nan"));
    CHECK_ERR(mg_model_generate(m, prompt, 3, 4, -1.0f, 0, 0, out), MG_EINVAL);
    CHECK_ERR(mg_model_generate(m, prompt, 3, -1, 1.0f, 0, 0, out), MG_EINVAL);
    CHECK_ERR(mg_model_generate(m, prompt, 3, 4, 1.0f, 0, 0, NULL), MG_EINVAL);
    CHECK_ERR(mg_model_generate(m, NULL, 3, 4, 1.0f, 0, 0, out), MG_EINVAL);
    CHECK_OK(mg_model_generate(m, prompt, 3, 0, 1.0f, 0, 0, NULL));
    mg_model_set_training(m, false);
    CHECK_OK(mg_model_generate(m, prompt, 3, 2, 1.0f, 0, 0, out));
    CHECK(!mg_model_training(m));
    /* The forward itself: a token outside the vocabulary and a batch of 0
     * stopped the process (a probe); an image model read tokens as floats. */
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, -3};
    CHECK(!mg_model_forward_tokens(m, toks, 1));
    CHECK_MSG(strstr(mg_last_error(), "token -3 (row 0, position 7 of 8) is outside the "
                     "vocabulary [0, 256)"), "%s", mg_last_error());
    CHECK(!mg_model_forward_tokens(m, toks, 0));
    CHECK(mg_model_vocab(m) == 256);
    mg_model *img;
    CHECK_OK(mg_model_create("mlp", 0, &img));
    CHECK(mg_model_vocab(img) == 0);
    CHECK(!mg_model_forward_tokens(img, toks, 1));
    CHECK_MSG(strstr(mg_last_error(), "takes floats, not tokens"), "%s", mg_last_error());
    CHECK(!mg_model_forward(img, NULL, 0));
    mg_model_destroy(img);
    mg_model_destroy(m);
}
