/* Devices (issue 15): naming them, finding out whether a GPU is there and
 * saying why not, memory round trips, models and convolutions on a device
 * against the CPU, bfloat16 GEMMs and sparse memory. Collectives on
 * device memory are in test_device_collectives.c. Without a GPU (CI has
 * none) the GPU's part skips, saying why; the CPU's and emu's always run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"
#include "devices.h"
#include "multigrad/multigrad.h"
#include "nn/layer.h"
#include "device/dk.h"

TEST(device_names_parse_and_print)
{
    mg_device d;
    char buf[32];
    const char *good[] = {"cpu", "cuda", "cuda:0", "cuda:7", "emu"};
    const char *back[] = {"cpu", "cuda:0", "cuda:0", "cuda:7", "emu"};
    for (int i = 0; i < 5; i++) {
        CHECK_OK(mg_device_parse(good[i], &d));
        mg_device_format(d, buf, sizeof buf);
        CHECK_MSG(!strcmp(buf, back[i]), "%s -> %s", good[i], buf);
    }
    const char *bad[] = {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "cuda:5000", "", "CPU"};
    for (int i = 0; i < 8; i++) {
        CHECK_ERR(mg_device_parse(bad[i], &d), MG_EINVAL);
        CHECK(strstr(mg_last_error(), "give cpu, cuda or cuda:N"));
    }
    CHECK_ERR(mg_device_parse(NULL, &d), MG_EINVAL);
}

TEST(device_cpu_memory_and_copies)
{
    mg_device cpu = {MG_DEVICE_CPU, 0};
    CHECK_OK(mg_device_check(cpu));
    char name[128];
    size_t mem;
    CHECK_OK(mg_device_describe(cpu, name, sizeof name, &mem));
    CHECK(name[0]);
    float *a = mg_device_alloc(cpu, 4096 * sizeof(float)), *b = mg_device_alloc(cpu, 4096 * 4);
    CHECK(a && b);
    for (int i = 0; i < 4096; i++) CHECK(a[i] == 0);   /* zeroed */
    for (int i = 0; i < 4096; i++) a[i] = (float)i;
    CHECK_OK(mg_device_copy(cpu, b, cpu, a, 4096 * sizeof(float)));
    CHECK(!memcmp(a, b, 4096 * sizeof(float)));
    mg_device_free(cpu, a);
    mg_device_free(cpu, b);
}

/* Asking for a GPU where there is none is one clear error, never a crash
 * later: why (no backend, no driver, no GPU) and what to do. */
TEST(device_cuda_absent_is_one_clear_error)
{
    const char *why;
    int n = mg_device_cuda_count(&why);
    mg_device d = {MG_DEVICE_CUDA, 0};
    if (n > 0) {
        d.index = n;   /* one past the last */
        CHECK_ERR(mg_device_check(d), MG_EINVAL);
        CHECK(strstr(mg_last_error(), "this machine has"));
        mgt_skip("%d GPU(s) here: the no-GPU path is for machines without one", n);
    }
    printf("built with CUDA: %s; no GPU: %s\n", mg_device_cuda_built() ? "yes" : "no", why);
    CHECK(why && why[0]);
    CHECK_ERR(mg_device_check(d), MG_EUNSUPPORTED);
    CHECK(strstr(mg_last_error(), "cuda:0") && strstr(mg_last_error(), "--device cpu"));
    CHECK(mg_device_alloc(d, 64) == NULL);
    float x = 1;
    mg_device cpu = {MG_DEVICE_CPU, 0};
    CHECK_ERR(mg_device_copy(d, &x, cpu, &x, sizeof x), MG_EUNSUPPORTED);
}

/* On a GPU: zeroed memory, and bytes that go there and back (host to
 * device, device to device, device to host) unchanged. */
TEST(device_cuda_memory_round_trip)
{
    const char *why;
    int n = mg_device_cuda_count(&why);
    if (!n) mgt_skip("no GPU: %s", why);
    mg_device gpu = {MG_DEVICE_CUDA, 0}, cpu = {MG_DEVICE_CPU, 0};
    char name[256];
    size_t mem;
    CHECK_OK(mg_device_describe(gpu, name, sizeof name, &mem));
    printf("cuda:0: %s, %.1f GB\n", name, mem / 1e9);
    size_t count = (size_t)3 << 20;
    float *h = malloc(count * sizeof *h), *back = malloc(count * sizeof *back);
    CHECK(h && back);
    for (size_t i = 0; i < count; i++) h[i] = (float)i * 0.5f;
    float *d1 = mg_device_alloc(gpu, count * sizeof(float));
    float *d2 = mg_device_alloc(gpu, count * sizeof(float));
    CHECK(d1 && d2);
    CHECK_OK(mg_device_copy(cpu, back, gpu, d1, count * sizeof(float)));
    for (size_t i = 0; i < count; i++) CHECK(back[i] == 0);
    CHECK_OK(mg_device_copy(gpu, d1, cpu, h, count * sizeof(float)));
    CHECK_OK(mg_device_copy(gpu, d2, gpu, d1, count * sizeof(float)));
    CHECK_OK(mg_device_copy(cpu, back, gpu, d2, count * sizeof(float)));
    CHECK(!memcmp(h, back, count * sizeof(float)));
    mg_device_free(gpu, d1);
    mg_device_free(gpu, d2);
    free(h);
    free(back);
}

/* ---- Models on a device equal the same models on the CPU ------------------ */

typedef struct {
    const char *model;   /* a zoo name; "gpt-odd": 2 layers of 48, 3 heads, T = 37;
                            "layers": every other layer (below) */
    mg_optim_config oc;
    float clip;          /* 0: none */
    int batch;
} dev_case;

static mg_model *case_model(const dev_case *c)
{
    mg_model *m = NULL;
    if (!strcmp(c->model, "gpt-odd")) {
        mg_gpt_config g = mg_gpt_defaults();
        g.layers = 2;
        g.dim = 48;
        g.heads = 3;
        g.ctx = 37;
        CHECK_OK(mg_model_create_gpt(&g, 7, &m));
    } else if (!strcmp(c->model, "layers")) {
        /* Batch norm, separate max and average pools (windows that
         * overlap and that do not), dropout, a residual block with its
         * ReLU, flatten: 1x12x12 -> 6x12x12 -> 6x5x5 -> 6x4x4 -> 10. */
        mg_layer *br[] = {mg_layer_conv2d("c2", 6, 6, 3, 1, 1, false, MG_POOL_NONE),
                          mg_layer_batchnorm2d("bn2", 6)};
        mg_layer *l[] = {mg_layer_conv2d("c1", 1, 6, 3, 1, 1, true, MG_POOL_NONE),
                         mg_layer_batchnorm2d("bn1", 6),
                         mg_layer_maxpool2d("mp", 3, 2),
                         mg_layer_dropout("drop", 0.25f),
                         mg_layer_residual("res", mg_layer_sequential("br", br, 2), NULL, true),
                         mg_layer_avgpool2d("ap", 2, 1),
                         mg_layer_flatten("flat"),
                         mg_layer_linear("fc", 6 * 4 * 4, 10, false)};
        CHECK_OK(mg_model_create_from("layers", mg_layer_sequential(NULL, l, 8), 1, 12, 12, 7,
                                      &m));
    } else {
        CHECK_OK(mg_model_create(c->model, 7, &m));
    }
    CHECK_OK(mg_model_reserve(m, c->batch));
    return m;
}

static void clip(mg_model *m, float max_norm)
{
    CHECK_OK(mg_device_set_current(mg_model_device(m)));
    mg_clip_grad_norm(mg_model_grads(m), mg_model_arena_size(m), max_norm);
    CHECK_OK(mg_device_set_current((mg_device){MG_DEVICE_CPU, 0}));
}

/* Three steps of the case on the CPU and on dev from the same parameters
 * and batches: logits and gradients of the first within 1e-4 of their
 * scale, each loss within 1e-5, the parameters after them within 1e-3
 * (optimizer steps magnify rounding differences, as in test_gpt.c). */
static void device_equals_cpu(const dev_case *c, mg_device dev)
{
    mg_model *a = case_model(c), *b = case_model(c);
    CHECK_OK(mg_model_to_device(b, dev));
    CHECK_OK(mg_model_reserve(b, c->batch));
    mg_optim *oa, *ob;
    size_t np = mg_model_arena_size(a);
    CHECK_OK(mg_optim_create(&c->oc, np, &oa));
    CHECK_OK(mg_optim_create(&c->oc, np, &ob));
    CHECK_OK(mg_optim_to_device(ob, dev));
    int ch, h, w;
    mg_model_input_shape(a, &ch, &h, &w);
    bool lm = mg_model_positions(a) > 1;
    size_t in = (size_t)c->batch * ch * h * w, rows = (size_t)c->batch * mg_model_positions(a);
    size_t out = rows * mg_model_classes(a);
    float *x = malloc(in * sizeof(float));
    int32_t *tok = malloc(in * sizeof(int32_t)), *y = malloc(rows * sizeof(int32_t));
    CHECK(x && tok && y);
    mg_rng r;
    mg_rng_init(&r, 11);
    for (int step = 0; step < 3; step++) {
        for (size_t i = 0; i < in; i++) {
            x[i] = mg_rng_normal(&r);
            tok[i] = (int32_t)(mg_rng_u32(&r) % 256);
        }
        for (size_t i = 0; i < rows; i++)
            y[i] = (int32_t)(mg_rng_u32(&r) % (uint32_t)mg_model_classes(a));
        mg_model *ms[2] = {a, b};
        float loss[2];
        for (int k = 0; k < 2; k++) {
            mg_model_zero_grad(ms[k]);
            CHECK(lm ? mg_model_forward_tokens(ms[k], tok, c->batch) != NULL
                     : mg_model_forward(ms[k], x, c->batch) != NULL);
        }
        if (step == 0) {
            float *la = mgt_host_floats(a, mg_tape_logits(mg_model_tape(a)), out), *lb = malloc(out * 4);
            CHECK(lb != NULL);
            mg_tape_logits_to_host(mg_model_tape(b), lb);
            mgt_check_scaled("logits", lb, la, out, 1e-4, "CPU");
            free(la);
            free(lb);
        }
        for (int k = 0; k < 2; k++) {
            loss[k] = mg_model_loss(ms[k], y, NULL);
            mg_model_backward(ms[k]);
        }
        CHECK_MSG(fabsf(loss[1] - loss[0]) <= 1e-5f * fabsf(loss[0]),
                  "%s step %d: loss %.8g on the device, %.8g on the CPU", c->model, step, loss[1],
                  loss[0]);
        if (step == 0) {
            float *gb = mgt_host_floats(b, mg_model_grads(b), np);
            mgt_check_scaled("gradients", gb, mg_model_grads(a), np, 1e-4, "CPU");
            free(gb);
        }
        if (c->clip > 0) {
            clip(a, c->clip);
            clip(b, c->clip);
        }
        CHECK_OK(mg_optim_step(oa, mg_model_params(a), mg_model_grads(a), c->oc.lr));
        CHECK_OK(mg_optim_step(ob, mg_model_params(b), mg_model_grads(b), c->oc.lr));
    }
    float *pb = mgt_host_floats(b, mg_model_params(b), np);
    mgt_check_scaled("parameters after 3 steps", pb, mg_model_params(a), np, 1e-3, "CPU");
    free(pb);
    size_t nb = mg_model_buffer_size(a);   /* batch norm's running statistics */
    if (nb) {
        float *bb = mgt_host_floats(b, mg_model_buffers(b), nb);
        mgt_check_scaled("buffers after 3 steps", bb, mg_model_buffers(a), nb, 1e-5, "CPU");
        free(bb);
    }
    free(x);
    free(tok);
    free(y);
    mg_optim_destroy(oa);
    mg_optim_destroy(ob);
    mg_model_destroy(a);
    mg_model_destroy(b);
}

/* Every kernel of the device path: linear with and without ReLU, the
 * loss over 10 and 256 classes, LayerNorm, GELU, attention with T = 37
 * and 3 heads of 16, the embedding, convolutions with ReLU and max or avg
 * pooling (the lenets), batch norm, separate pools, dropout, a residual
 * block and flatten, SGD (plain, momentum, Nesterov with weight decay and
 * dampening) and AdamW with clipping. */
static void models_equal_cpu(mg_device dev)
{
    mg_optim_config plain = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    mg_optim_config mom = plain, nest = plain, damp = plain;
    mom.momentum = 0.9f;
    nest.momentum = 0.9f;
    nest.nesterov = true;
    nest.weight_decay = 1e-3f;
    damp.momentum = 0.8f;
    damp.dampening = 0.3f;
    damp.weight_decay = 1e-3f;
    mg_optim_config adamw = mg_optim_defaults(MG_OPTIM_ADAMW, 1e-3f);
    adamw.weight_decay = 0.1f;
    const dev_case cases[] = {
        {"mlp", plain, 0, 13}, {"mlp", mom, 0, 13}, {"mlp", nest, 0, 13}, {"mlp", damp, 0, 13},
        {"gpt-odd", adamw, 1.0f, 5}, {"gpt-odd", mom, 0.5f, 3},
        {"lenet5", nest, 0, 7},  {"lenet-d2l", plain, 0, 9}, {"layers", mom, 0, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) device_equals_cpu(&cases[i], dev);
}

TEST_T(device_emu_models_equal_cpu, 120) { models_equal_cpu((mg_device){MG_DEVICE_EMU, 0}); }

TEST_T(device_gpu_models_equal_cpu, 120) { models_equal_cpu(mgt_device(MG_DEVICE_CUDA)); }

/* A tape made while the GPU still has work queued gets its input. Its
 * feed's buffers are zeroed on the default stream, behind that work, and
 * its first copy runs on the feed's own stream, which must wait for the
 * zeros: else they land after the copy and the forward reads zeros (a
 * pipeline's parameters were 2-7 % off on an H200 until it did). Here
 * 0.3 s of GEMMs are queued first, so the copy would win every time. */
TEST_T(device_gpu_tape_made_behind_queued_work_gets_its_input, 120)
{
    mg_device d = mgt_device(MG_DEVICE_CUDA), cpu = {MG_DEVICE_CPU, 0};
    mg_gpt_config g = mg_gpt_defaults();
    g.layers = 2;
    g.dim = 64;
    g.heads = 4;
    g.ctx = 32;
    mg_model *a, *b;
    CHECK_OK(mg_model_create_gpt(&g, 7, &a));
    CHECK_OK(mg_model_create_gpt(&g, 7, &b));
    CHECK_OK(mg_model_to_device(b, d));
    enum { B = 4, N = 4096 };
    int32_t tok[B * 32];
    for (int i = 0; i < B * 32; i++) tok[i] = (i * 37 + 11) % 256;
    mg_tape *ta, *tb;
    CHECK_OK(mg_tape_create(a, B, &ta));
    CHECK(mg_tape_forward_tokens(ta, tok, B) != NULL);
    float *m = mgt_on_device(d, NULL, (size_t)N * N), *c = mgt_on_device(d, NULL, (size_t)N * N);
    CHECK_OK(mg_device_set_current(d));
    for (int i = 0; i < 100; i++) mg_gemm(false, false, N, N, N, 1.0f, m, N, m, N, 0.0f, c, N);
    CHECK_OK(mg_device_set_current(cpu));
    CHECK_OK(mg_tape_create(b, B, &tb));
    CHECK(mg_tape_forward_tokens(tb, tok, B) != NULL);
    size_t out = (size_t)B * 32 * mg_model_classes(a);
    float *lb = malloc(out * sizeof(float));
    CHECK(lb != NULL);
    mg_tape_logits_to_host(tb, lb);
    mgt_check_scaled("logits", lb, mg_tape_logits(ta), out, 1e-4, "CPU");
    free(lb);
    mg_device_free(d, m);
    mg_device_free(d, c);
    mg_tape_destroy(ta);
    mg_tape_destroy(tb);
    mg_model_destroy(a);
    mg_model_destroy(b);
}

/* A layer without device kernels (every layer of the library has them:
 * this one is the test's, its loops on the host) is refused at the move,
 * naming it; the model stays usable on the CPU. */
static void square_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n)
{
    (void)c;
    for (size_t i = 0; i < (size_t)n * l->in[0] * l->in[1] * l->in[2]; i++) y[i] = x[i] * x[i];
}

static void square_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                            float *dy, float *dx, int n)
{
    (void)c, (void)y;
    for (size_t i = 0; dx && i < (size_t)n * l->in[0] * l->in[1] * l->in[2]; i++)
        dx[i] = 2 * x[i] * dy[i];
}

static const mg_layer_vt square_vt = {.kind = "square", .setup = mg__same_setup,
                                      .sizes = mg__no_sizes, .forward = square_forward,
                                      .backward = square_backward};

TEST(device_model_without_kernels_is_one_clear_error)
{
    mg_layer *l[] = {mg_layer_conv2d("conv", 1, 4, 3, 1, 0, true, MG_POOL_NONE),
                     mg__layer_alloc(sizeof(mg_layer), &square_vt, "sq"),
                     mg_layer_linear("fc", 4 * 26 * 26, 10, false)};
    mg_model *m;
    CHECK_OK(mg_model_create_from("convsq", mg_layer_sequential(NULL, l, 3), 1, 28, 28, 1, &m));
    CHECK_ERR(mg_model_to_device(m, (mg_device){MG_DEVICE_EMU, 0}), MG_EUNSUPPORTED);
    CHECK(strstr(mg_last_error(), "'sq' (square)") && strstr(mg_last_error(), "--device cpu"));
    CHECK(mg_model_device(m).kind == MG_DEVICE_CPU);
    float x[28 * 28] = {0};
    CHECK(mg_model_forward(m, x, 1) != NULL);
    mg_model_destroy(m);
}

/* Offload to files with a model on a device is refused by every
 * strategy, one process too (issue 30 item 7), with the way out. */
TEST(device_offload_to_files_is_refused_for_every_strategy)
{
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 0, &m));
    CHECK_OK(mg_model_to_device(m, (mg_device){MG_DEVICE_EMU, 0}));
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_SINGLE);
    so.offload_dir = mgt_tmpdir();
    mg_strategy *s = NULL;
    CHECK_ERR(mg_strategy_create(m, &so, &s), MG_EUNSUPPORTED);
    CHECK(!s && strstr(mg_last_error(), "--offload cpu"));
    mg_model_destroy(m);
}

/* Convolutions of every kind the layer takes (pool none, avg and max;
 * ReLU or not; stride 1 and 2; padding; odd sizes whose pool drops an
 * edge) on dev against the CPU's kernels: output and every gradient
 * within 1e-5 of their scale. */
static void back(float *h, mg_device d, const float *p, size_t n)
{
    CHECK_OK(mg_device_copy((mg_device){MG_DEVICE_CPU, 0}, h, d, p, n * sizeof(float)));
}

static void convs_equal_cpu(mg_device dev)
{
    const struct { int c, h, w, oc, k, stride, pad; bool relu; mg_pool_kind pool; } cs[] = {
        {1, 28, 28, 6, 5, 1, 2, true, MG_POOL_MAX},  {20, 13, 13, 50, 5, 1, 0, true, MG_POOL_AVG},
        {3, 11, 9, 4, 3, 2, 1, false, MG_POOL_NONE}, {2, 10, 10, 5, 3, 1, 1, true, MG_POOL_NONE},
        {3, 9, 11, 4, 2, 1, 0, false, MG_POOL_MAX},  {2, 12, 7, 3, 3, 2, 2, false, MG_POOL_AVG},
    };
    mg_device cpu = {MG_DEVICE_CPU, 0};
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        const int n = 3;
        mg_conv2d_shape s;
        CHECK(mg_conv2d_shape_init(&s, cs[t].c, cs[t].h, cs[t].w, cs[t].oc, cs[t].k, cs[t].k,
                                   cs[t].stride, cs[t].pad, cs[t].relu, cs[t].pool));
        size_t nx = (size_t)n * s.c * s.h * s.w, nw = (size_t)s.oc * s.c * s.kh * s.kw;
        size_t ny = (size_t)n * s.oc * s.ph * s.pw;
        float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc(s.oc * 4), *dy = malloc(ny * 4);
        float *h[2][4];   /* CPU, device: y, dx, dw, db */
        for (int k = 0; k < 2; k++) {
            h[k][0] = malloc(ny * 4);
            h[k][1] = malloc(nx * 4);
            h[k][2] = calloc(nw, 4);
            h[k][3] = calloc(s.oc, 4);
        }
        mg_rng r;
        mg_rng_init(&r, 5 + t);
        for (size_t i = 0; i < nx; i++) x[i] = mg_rng_normal(&r);
        for (size_t i = 0; i < nw; i++) w[i] = 0.3f * mg_rng_normal(&r);
        for (int i = 0; i < s.oc; i++) b[i] = 0.1f * mg_rng_normal(&r);
        for (size_t i = 0; i < ny; i++) dy[i] = mg_rng_normal(&r);
        /* The CPU. */
        uint8_t *sv = malloc(mg_conv2d_saved_bytes(&s) * n + 1);
        float *ws = malloc(mg_conv2d_workspace(&s, n) * 4), *dy2 = malloc(ny * 4);
        memcpy(dy2, dy, ny * 4);
        mg_conv2d_forward(h[0][0], sv, x, w, b, &s, n, ws);
        mg_conv2d_backward(h[0][1], h[0][2], h[0][3], dy2, h[0][0], sv, x, w, &s, n, ws);
        /* The device. */
        CHECK_OK(mg_device_set_current(dev));
        size_t svb = mg_conv2d_saved_bytes(&s) * n, wsf = mg_conv2d_workspace(&s, n);
        float *dx_ = mgt_on_device(dev, x, nx), *dw_ = mgt_on_device(dev, w, nw), *db_ = mgt_on_device(dev, b, s.oc);
        float *ddy = mgt_on_device(dev, dy, ny), *dyo = mgt_on_device(dev, NULL, ny), *dgx = mgt_on_device(dev, NULL, nx);
        float *dgw = mgt_on_device(dev, h[1][2], nw), *dgb = mgt_on_device(dev, h[1][3], s.oc), *dws = mgt_on_device(dev, NULL, wsf);
        uint8_t *dsv = mg_device_alloc(dev, svb + 1);
        CHECK(dsv != NULL);
        mg_conv2d_forward(dyo, dsv, dx_, dw_, db_, &s, n, dws);
        mg_conv2d_backward(dgx, dgw, dgb, ddy, dyo, dsv, dx_, dw_, &s, n, dws);
        back(h[1][0], dev, dyo, ny);
        back(h[1][1], dev, dgx, nx);
        back(h[1][2], dev, dgw, nw);
        back(h[1][3], dev, dgb, s.oc);
        CHECK_OK(mg_device_set_current(cpu));
        const char *what[4] = {"output", "input gradient", "weight gradient", "bias gradient"};
        size_t len[4] = {ny, nx, nw, (size_t)s.oc};
        for (int k = 0; k < 4; k++) {
            char name[96];
            snprintf(name, sizeof name, "conv %zu: %s", t, what[k]);
            mgt_check_scaled(name, h[1][k], h[0][k], len[k], 1e-5, "CPU");
        }
        float *dev_mem[] = {dx_, dw_, db_, ddy, dyo, dgx, dgw, dgb, dws, (float *)dsv};
        for (size_t i = 0; i < sizeof dev_mem / sizeof *dev_mem; i++) mg_device_free(dev, dev_mem[i]);
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 4; j++) free(h[k][j]);
        free(x), free(w), free(b), free(dy), free(dy2), free(sv), free(ws);
    }
}

TEST(device_emu_convolutions_equal_cpu) { convs_equal_cpu(mgt_device(MG_DEVICE_EMU)); }
TEST(device_gpu_convolutions_equal_cpu) { convs_equal_cpu(mgt_device(MG_DEVICE_CUDA)); }

/* ---- bfloat16 GEMMs (mg_device_set_bf16) --------------------------------- */

/* With bf16 on, a GEMM on d is the CPU's GEMM of the operands rounded to
 * bfloat16 (within float sums' rounding: exactly on emu, whose GEMM is the
 * CPU's), and differs from the float GEMM by bfloat16's rounding; off
 * again, it is the float GEMM. Every transpose, and alpha and beta. */
static void bf16_gemm(mg_device d)
{
    enum { M = 37, N = 53, K = 301 };
    mg_rng r;
    mg_rng_init(&r, 5);
    float a[M * K], b[K * N], ra[M * K], rb[K * N], c0[M * N];
    for (int i = 0; i < M * K; i++) a[i] = mg_rng_uniform(&r) * 2 - 1;
    for (int i = 0; i < K * N; i++) b[i] = mg_rng_uniform(&r) * 2 - 1;
    for (int i = 0; i < M * K; i++) ra[i] = mg_bf16_to_f32(mg_f32_to_bf16(a[i]));
    for (int i = 0; i < K * N; i++) rb[i] = mg_bf16_to_f32(mg_f32_to_bf16(b[i]));
    for (int i = 0; i < M * N; i++) c0[i] = mg_rng_uniform(&r);
    float *da = mgt_on_device(d, a, M * K), *db = mgt_on_device(d, b, K * N);
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int lda = ta ? M : K, ldb = tb ? K : N;
        float want[M * N], plain[M * N];
        memcpy(want, c0, sizeof want);
        memcpy(plain, c0, sizeof plain);
        mg_gemm(ta, tb, M, N, K, 0.5f, ra, lda, rb, ldb, 2.0f, want, N);
        mg_gemm(ta, tb, M, N, K, 0.5f, a, lda, b, ldb, 2.0f, plain, N);
        for (int on = 1; on >= 0; on--) {
            float *dc = mgt_on_device(d, c0, M * N);
            CHECK_OK(mg_device_set_bf16(d, on));
            mg_device host = mg_device_current();
            CHECK_OK(mg_device_set_current(d));
            mg_gemm(ta, tb, M, N, K, 0.5f, da, lda, db, ldb, 2.0f, dc, N);
            mg_device_set_current(host);
            float *got = mgt_device_floats(d, dc, M * N);
            double e = mgt_check_scaled(on ? "bf16 gemm" : "float gemm", got, on ? want : plain,
                                        M * N, d.kind == MG_DEVICE_EMU ? 0 : 1e-5,
                                        on ? "the CPU's on rounded operands" : "the CPU's");
            if (on) {   /* and bfloat16's rounding is there to see */
                double off = 0, mx = 0;
                for (int i = 0; i < M * N; i++) {
                    off = fmax(off, fabs(got[i] - plain[i]));
                    mx = fmax(mx, fabs(plain[i]));
                }
                CHECK_MSG(off > 1e-4 * mx, "ta %d tb %d: bf16 GEMM within %.3g of the float one",
                          ta, tb, off / mx);
                printf("ta %d tb %d: bf16 vs rounded operands %.2g, vs float %.2g\n", ta, tb, e,
                       off / mx);
            }
            free(got);
            mg_device_free(d, dc);
        }
    }
    mg_device_free(d, da);
    mg_device_free(d, db);
}

/* A linear's backward with bf16 on rounds dY once for its two GEMMs
 * (weight and input gradients), and X and W once each; given what its
 * forward kept, dY alone: the gradients equal the CPU's on rounded
 * operands (exactly on emu), the bias gradient the float sum of dY's
 * columns (no GEMM: no rounding). */
static void bf16_linear_backward(mg_device d)
{
    enum { N = 29, IN = 71, OUT = 45 };
    mg_rng r;
    mg_rng_init(&r, 9);
    static float x[N * IN], w[OUT * IN], dy[N * OUT], y[N * OUT];
    static float rx[N * IN], rw[OUT * IN], rdy[N * OUT];
    float *h[] = {x, w, dy, y}, *rh[] = {rx, rw, rdy, NULL};
    size_t len[] = {N * IN, OUT * IN, N * OUT, N * OUT};
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < len[k]; i++) {
            h[k][i] = mg_rng_uniform(&r) * 2 - 1;
            if (rh[k]) rh[k][i] = mg_bf16_to_f32(mg_f32_to_bf16(h[k][i]));
        }
    /* the CPU on rounded operands, ReLU's mask from y applied first */
    float wdw[OUT * IN] = {0}, wdb[OUT] = {0}, wdx[N * IN];
    for (int i = 0; i < N * OUT; i++) rdy[i] = y[i] > 0.0f ? rdy[i] : 0.0f;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OUT; j++) wdb[j] += y[i * OUT + j] > 0.0f ? dy[i * OUT + j] : 0.0f;
    mg_gemm(true, false, OUT, IN, N, 1.0f, rdy, OUT, rx, IN, 1.0f, wdw, IN);
    mg_gemm(false, false, N, IN, OUT, 1.0f, rdy, OUT, rw, IN, 0.0f, wdx, IN);
    float *dx_ = mgt_on_device(d, x, N * IN), *dw_ = mgt_on_device(d, w, OUT * IN);
    float *ddy = mgt_on_device(d, dy, N * OUT), *dyv = mgt_on_device(d, y, N * OUT);
    float *gx = mgt_on_device(d, NULL, N * IN), *gw = mgt_on_device(d, NULL, OUT * IN);
    float *gb = mgt_on_device(d, NULL, OUT);
    CHECK_OK(mg_device_set_bf16(d, true));
    mg_device host = mg_device_current();
    CHECK_OK(mg_device_set_current(d));
    size_t before = mg__dk_bf16_rounded();
    mg_linear_backward(gx, gw, gb, ddy, dyv, dx_, dw_, N, IN, OUT, true);
    size_t rounded = mg__dk_bf16_rounded() - before;
    mg_device_set_current(host);
    CHECK_OK(mg_device_set_bf16(d, false));
    CHECK_MSG(rounded == (size_t)N * OUT + N * IN + OUT * IN,
              "rounded %zu elements: dY once (%d), X and W", rounded, N * OUT);
    float *got[] = {mgt_device_floats(d, gb, OUT), mgt_device_floats(d, gw, OUT * IN),
                    mgt_device_floats(d, gx, N * IN)};
    const float *want[] = {wdb, wdw, wdx};
    const char *what[] = {"bias gradient", "weight gradient", "input gradient"};
    size_t n[] = {OUT, OUT * IN, N * IN};
    /* (the bias gradient's sums in another order: float's rounding) */
    for (int k = 0; k < 3; k++) {
        mgt_check_scaled(what[k], got[k], want[k], n[k], d.kind == MG_DEVICE_EMU && k ? 0 : 1e-5,
                         "the CPU's on rounded operands");
        free(got[k]);
    }
    /* Kept by the forward (mg_linear_forward_kept): X and W rounded there,
     * once; the backward rounds dY alone, to the same
     * gradients (dY is masked already: masking again changes nothing). */
    CHECK_OK(mg_device_set_bf16(d, true));
    CHECK_OK(mg_device_set_current(d));
    size_t kb = mg_linear_kept(N, IN, OUT);
    CHECK_MSG(kb >= (size_t)(N * IN + OUT * IN) * 2, "kept %zu bytes", kb);
    void *kept = mg_device_alloc(d, kb);
    float *yk = mgt_on_device(d, NULL, N * OUT), *gxk = mgt_on_device(d, NULL, N * IN);
    float *gwk = mgt_on_device(d, NULL, OUT * IN), *gbk = mgt_on_device(d, NULL, OUT);
    before = mg__dk_bf16_rounded();
    mg_linear_forward_kept(yk, dx_, dw_, NULL, N, IN, OUT, false, kept);
    size_t fwd = mg__dk_bf16_rounded() - before;
    mg_linear_backward_kept(gxk, gwk, gbk, ddy, dyv, dx_, dw_, N, IN, OUT, true, kept);
    size_t bwd = mg__dk_bf16_rounded() - before - fwd;
    mg_device_set_current(host);
    CHECK_OK(mg_device_set_bf16(d, false));
    CHECK_MSG(fwd == (size_t)N * IN + OUT * IN && bwd == (size_t)N * OUT,
              "kept: the forward rounded %zu elements (X and W: %d), the backward %zu (dY: %d)",
              fwd, N * IN + OUT * IN, bwd, N * OUT);
    float *kgot[] = {mgt_device_floats(d, gbk, OUT), mgt_device_floats(d, gwk, OUT * IN),
                     mgt_device_floats(d, gxk, N * IN)};
    for (int k = 0; k < 3; k++) {
        mgt_check_scaled(what[k], kgot[k], want[k], n[k], d.kind == MG_DEVICE_EMU && k ? 0 : 1e-5,
                         "the CPU's on rounded operands, kept by the forward");
        free(kgot[k]);
    }
    float *own[] = {dx_, dw_, ddy, dyv, gx, gw, gb, yk, gxk, gwk, gbk};
    for (int k = 0; k < 11; k++) mg_device_free(d, own[k]);
    mg_device_free(d, kept);
}

TEST(device_emu_bf16_linear_backward_rounds_dy_once)
{
    bf16_linear_backward(mgt_device(MG_DEVICE_EMU));
}
TEST(device_gpu_bf16_linear_backward_rounds_dy_once)
{
    bf16_linear_backward(mgt_device(MG_DEVICE_CUDA));
}

TEST(device_emu_bf16_gemms_round_their_operands) { bf16_gemm(mgt_device(MG_DEVICE_EMU)); }
TEST(device_gpu_bf16_gemms_round_their_operands) { bf16_gemm(mgt_device(MG_DEVICE_CUDA)); }

/* ---- sparse memory (mg_device_alloc_sparse) ------------------------------- */

/* Granules given back: resident memory falls, copies read them as zeros
 * and writing them (a copy, mg_device_zero) has them again; what was kept
 * keeps its values. On emu a page given back is inaccessible, as a GPU's
 * unmapped granule is (a kernel touching it would stop the test). */
static void sparse_memory(mg_device d)
{
    enum { N = 3 << 20 };   /* floats: 12 MiB, several of a GPU's granules */
    mg_device cpu = {MG_DEVICE_CPU, 0};
    float *h = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    float *p = mg_device_alloc_sparse(d, N * sizeof(float));
    CHECK(h && back && p);
    CHECK(mg_device_of(p + N / 2).kind == d.kind);
    size_t all = N * sizeof(float);
    if (mg_device_resident(d, p, all) != all) mgt_skip("no sparse memory here (a driver without "
                                                       "virtual memory management)");
    for (size_t i = 0; i < N; i++) h[i] = (float)(i % 1000) + 1;
    CHECK_OK(mg_device_copy(d, p, cpu, h, all));
    size_t lo = N / 4, hi = 3 * (size_t)N / 4;
    mg_device_discard(d, p + lo, (hi - lo) * sizeof(float));
    size_t held = mg_device_resident(d, p, all);
    CHECK_MSG(held < all - (hi - lo) * sizeof(float) / 2, "%zu of %zu bytes held after giving "
              "back half", held, all);
    CHECK_OK(mg_device_copy(cpu, back, d, p, all));
    size_t zeros = 0;
    for (size_t i = 0; i < N; i++) {
        if (i < lo || i >= hi) CHECK(back[i] == h[i]);
        else CHECK(back[i] == h[i] || back[i] == 0);
        zeros += back[i] == 0;
    }
    CHECK_EQ(zeros * sizeof(float), all - held);
    /* Written again: held again, with the values written. */
    CHECK_OK(mg_device_copy(d, p + lo, cpu, h + lo, (hi - lo) / 2 * sizeof(float)));
    CHECK_OK(mg_device_zero(d, p + lo + (hi - lo) / 2, (hi - lo) / 2 * sizeof(float)));
    CHECK_EQ(mg_device_resident(d, p, all), all);
    CHECK_OK(mg_device_copy(cpu, back, d, p, all));
    for (size_t i = 0; i < N; i++)
        CHECK(back[i] == (i >= lo + (hi - lo) / 2 && i < hi ? 0 : h[i]));
    mg_device_free(d, p);
    free(h);
    free(back);
}

TEST(device_emu_sparse_memory_gives_back_and_comes_back)
{
    sparse_memory(mgt_device(MG_DEVICE_EMU));
}
TEST(device_gpu_sparse_memory_gives_back_and_comes_back)
{
    sparse_memory(mgt_device(MG_DEVICE_CUDA));
}
