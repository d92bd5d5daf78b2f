/* Tests of src/models: the zoo's layers, parameter names, shapes and
 * initialisation as ../shared/models.md defines them; equivalence with
 * PyTorch on lenet5 (tests/data/lenet5.safetensors: same initial weights
 * and batches give the same logits, loss, gradients and parameters after
 * 20 SGD steps); and a short training run that learns Fashion-MNIST. */
#include <unistd.h>
#include "harness.h"
#include "multigrad/nn.h"
#include "multigrad/optim.h"
#include "multigrad/data.h"
#include "multigrad/checkpoint.h"

typedef struct {
    const char *name;
    int shape[4], ndim;
} tspec;

static void check_tensors(const mg_model *m, const tspec *t, int n)
{
    CHECK_EQ(mg_model_num_tensors(m), n);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const mg_param *p = mg_model_tensor(m, i);
        CHECK_MSG(strcmp(p->name, t[i].name) == 0, "tensor %d is %s, expected %s", i, p->name,
                  t[i].name);
        CHECK_EQ(p->ndim, t[i].ndim);
        size_t numel = 1;
        for (int d = 0; d < p->ndim; d++) {
            CHECK_EQ(p->shape[d], t[i].shape[d]);
            numel *= (size_t)t[i].shape[d];
        }
        CHECK_EQ(p->numel, numel);
        total += numel;
    }
    CHECK_EQ(mg_model_num_params(m), total);
}

TEST(models_zoo_definitions)
{
    const char *const *names = mg_model_names();
    CHECK(strcmp(names[0], "mlp") == 0 && strcmp(names[1], "lenet-d2l") == 0 &&
          strcmp(names[2], "lenet5") == 0 && strcmp(names[3], "gpt-mini") == 0 &&
          names[4] == NULL);
    mg_model *m;
    int c, h, w;

    CHECK_OK(mg_model_create("lenet-d2l", 0, &m));
    CHECK(strcmp(mg_model_name(m), "lenet-d2l") == 0);
    tspec d2l[] = {{"conv1.weight", {20, 1, 3, 3}, 4}, {"conv1.bias", {20}, 1},
                   {"conv2.weight", {50, 20, 5, 5}, 4}, {"conv2.bias", {50}, 1},
                   {"fc1.weight", {128, 800}, 2}, {"fc1.bias", {128}, 1},
                   {"fc2.weight", {10, 128}, 2}, {"fc2.bias", {10}, 1}};
    check_tensors(m, d2l, 8);
    CHECK_EQ(mg_model_num_params(m), 129068);
    mg_model_input_shape(m, &c, &h, &w);
    CHECK(c == 1 && h == 28 && w == 28 && mg_model_classes(m) == 10);
    CHECK_EQ(mg_model_buffer_size(m), 0);
    mg_model_destroy(m);

    CHECK_OK(mg_model_create("lenet5", 0, &m));
    tspec l5[] = {{"conv1.weight", {6, 1, 5, 5}, 4}, {"conv1.bias", {6}, 1},
                  {"conv2.weight", {16, 6, 5, 5}, 4}, {"conv2.bias", {16}, 1},
                  {"fc1.weight", {120, 400}, 2}, {"fc1.bias", {120}, 1},
                  {"fc2.weight", {84, 120}, 2}, {"fc2.bias", {84}, 1},
                  {"fc3.weight", {10, 84}, 2}, {"fc3.bias", {10}, 1}};
    check_tensors(m, l5, 10);
    CHECK_EQ(mg_model_num_params(m), 61706);
    mg_model_destroy(m);

    CHECK_OK(mg_model_create("mlp", 0, &m));
    tspec mlp[] = {{"fc1.weight", {512, 784}, 2}, {"fc1.bias", {512}, 1},
                   {"fc2.weight", {256, 512}, 2}, {"fc2.bias", {256}, 1},
                   {"fc3.weight", {10, 256}, 2}, {"fc3.bias", {10}, 1}};
    check_tensors(m, mlp, 6);
    CHECK_EQ(mg_model_num_params(m), 535818);
    mg_model_input_shape(m, &c, &h, &w);
    CHECK(c == 1 && h == 1 && w == 784);
    mg_model_destroy(m);

    mg_zoo_defaults d;
    CHECK_OK(mg_zoo_defaults_of("lenet-d2l", &d));
    CHECK(d.batch == 256 && d.lr == 0.2f && d.momentum == 0.0f && d.epochs == 10 &&
          !d.normalized_input);
    CHECK_OK(mg_zoo_defaults_of("lenet5", &d));
    CHECK(d.batch == 128 && d.lr == 0.05f && d.momentum == 0.9f && d.normalized_input);
    CHECK_OK(mg_zoo_defaults_of("mlp", &d));
    CHECK(d.batch == 128 && d.lr == 0.05f && d.momentum == 0.9f && d.normalized_input &&
          !d.language_model && d.optimizer == MG_OPTIM_SGD && d.clip_grad == 0);
    /* models.md D: AdamW lr 1e-3, betas (0.9, 0.99), decay 0.1, clip 1, batch 32. */
    CHECK_OK(mg_zoo_defaults_of("gpt-mini", &d));
    CHECK(d.language_model && d.batch == 32 && d.lr == 1e-3f && d.optimizer == MG_OPTIM_ADAMW &&
          d.beta2 == 0.99f && d.weight_decay == 0.1f && d.clip_grad == 1.0f && d.steps > 0 &&
          d.epochs == 0);
    CHECK_OK(mg_model_create("gpt-mini", 0, &m));
    CHECK(strcmp(mg_model_name(m), "gpt-mini") == 0 && mg_model_num_params(m) == 842496 &&
          mg_model_positions(m) == 128 && mg_model_classes(m) == 256);
    mg_model_destroy(m);
    CHECK_ERR(mg_zoo_defaults_of("vgg", &d), MG_EINVAL);
    CHECK_ERR(mg_model_create("vgg", 0, &m), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "vgg") && strstr(mg_last_error(), "lenet-d2l"));
}

/* FLOPs per image: models.md's layer shapes, 2 per multiply-add; a
 * training step adds the weight gradient of every layer and the input
 * gradient of all but the first. */
TEST(models_flops_per_image)
{
    mg_model *m;
    double f, t;
    CHECK_OK(mg_model_create("lenet-d2l", 0, &m));
    mg_model_flops(m, &f, &t);
    double conv1 = 2.0 * 20 * 9 * 26 * 26, conv2 = 2.0 * 50 * 500 * 9 * 9;
    double fc = 2.0 * (800 * 128 + 128 * 10);
    CHECK_NEAR(f, conv1 + conv2 + fc, 0.5);
    CHECK_NEAR(t, 3 * f - conv1, 0.5);      /* 13.26 MFLOP, as the issue counts */
    mg_model_destroy(m);
    CHECK_OK(mg_model_create("mlp", 0, &m));
    mg_model_flops(m, &f, NULL);
    mg_model_flops(m, NULL, &t);
    CHECK_NEAR(f, 2.0 * (784 * 512 + 512 * 256 + 256 * 10), 0.5);
    CHECK_NEAR(t, 3 * f - 2.0 * 784 * 512, 0.5);
    mg_model_destroy(m);
}

TEST(models_initialisation)
{
    /* lenet-d2l: weights N(0, 0.01^2), biases 0. */
    mg_model *m, *m2;
    CHECK_OK(mg_model_create("lenet-d2l", 0, &m));
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        double s = 0, s2 = 0;
        for (size_t k = 0; k < p->numel; k++) {
            s += p->data[k];
            s2 += (double)p->data[k] * p->data[k];
        }
        if (strstr(p->name, "bias")) {
            CHECK(s2 == 0.0);
        } else {
            double sd = sqrt(s2 / p->numel);
            CHECK_MSG(fabs(sd - 0.01) < 0.01 * 4 / sqrt((double)p->numel) + 1e-4,
                      "%s: std %g", p->name, sd);
            CHECK(fabs(s / p->numel) < 0.01 * 5 / sqrt((double)p->numel));
        }
    }
    mg_model_destroy(m);
    /* lenet5 and mlp: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases. */
    const char *names[] = {"lenet5", "mlp"};
    for (int z = 0; z < 2; z++) {
        CHECK_OK(mg_model_create(names[z], 0, &m));
        for (int i = 0; i < mg_model_num_tensors(m); i += 2) {
            const mg_param *wt = mg_model_tensor(m, i), *b = mg_model_tensor(m, i + 1);
            double bound = 1.0 / sqrt((double)(wt->numel / (size_t)wt->shape[0]));
            const mg_param *ps[2] = {wt, b};
            for (int q = 0; q < 2; q++) {
                float lo = 1e9f, hi = -1e9f;
                for (size_t k = 0; k < ps[q]->numel; k++) {
                    CHECK(fabs(ps[q]->data[k]) <= bound * (1 + 1e-6));
                    lo = fminf(lo, ps[q]->data[k]);
                    hi = fmaxf(hi, ps[q]->data[k]);
                }
                /* n draws of U(-b, b) all above -(1 - 42/n) b: probability
                 * (1 - 21/n)^n < e^-21 (2e-9), as for the top. */
                double edge = 1.0 - 42.0 / (double)ps[q]->numel;
                if (ps[q]->numel >= 100)
                    CHECK_MSG(lo < -edge * bound && hi > edge * bound, "%s: %g .. %g, bound %g",
                              ps[q]->name, lo, hi, bound);
            }
        }
        /* Same seed, same parameters; another seed, others; re-init. */
        CHECK_OK(mg_model_create(names[z], 0, &m2));
        size_t n = mg_model_arena_size(m);
        CHECK(memcmp(mg_model_params(m), mg_model_params(m2), n * 4) == 0);
        CHECK_OK(mg_model_init_params(m2, 1));
        CHECK(memcmp(mg_model_params(m), mg_model_params(m2), n * 4) != 0);
        CHECK_OK(mg_model_init_params(m2, 0));
        CHECK(memcmp(mg_model_params(m), mg_model_params(m2), n * 4) == 0);
        mg_model_destroy(m);
        mg_model_destroy(m2);
    }
}

/* |a - b| <= rel * max(|a|, |b|) + abs_tol for every element; returns the
 * largest relative error seen (for the message). */
static void check_close_arr(const char *what, const float *a, const float *b, size_t n,
                            double rel, double abs_tol)
{
    for (size_t i = 0; i < n; i++) {
        double m = fmax(fabs(a[i]), fabs(b[i]));
        CHECK_MSG(fabs(a[i] - b[i]) <= rel * m + abs_tol, "%s[%zu]: %.9g vs PyTorch %.9g", what,
                  i, a[i], b[i]);
    }
}

static const float *ref_f32(const mg_st_file *f, const char *name, size_t numel)
{
    const mg_st_tensor *t = mg_st_find(f, name);
    CHECK_MSG(t != NULL, "reference file lacks %s", name);
    CHECK(t->dtype == MG_ST_F32 && t->nbytes == numel * 4);
    return t->data;
}

TEST_T(models_lenet5_matches_pytorch, 120)
{
    mg_st_file *f;
    CHECK_OK(mg_st_open(mgt_data("lenet5.safetensors"), &f));
    mg_dataset *ds;
    if (mg_dataset_load(mgt_fashion_dir(), true, &ds) != MG_OK)
        mgt_skip("Fashion-MNIST not found in %s: %s", mgt_fashion_dir(), mg_last_error());
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", 0, &m));
    char key[96];
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        snprintf(key, sizeof key, "init.%s", p->name);
        memcpy(p->data, ref_f32(f, key, p->numel), p->numel * 4);
    }
    const mg_st_tensor *idx = mg_st_find(f, "steps.indices");
    CHECK(idx && idx->dtype == MG_ST_I32 && idx->nbytes == 20 * 128 * 4);
    const int32_t *steps = idx->data;
    const float *losses = ref_f32(f, "losses", 20);
    float *x = malloc(128 * 784 * 4);
    int32_t y[128];
    /* Step 0: the loader's batch, logits, loss and gradients. */
    CHECK_OK(mg_dataset_gather(ds, steps, 128, MG_SCALE_NORMAL, x, 128 * 784, y));
    check_close_arr("batch0.x", x, ref_f32(f, "batch0.x", 128 * 784), 128 * 784, 1e-6, 1e-6);
    const mg_st_tensor *by = mg_st_find(f, "batch0.y");
    CHECK(by && by->dtype == MG_ST_I32);
    CHECK(memcmp(y, by->data, sizeof y) == 0);
    CHECK_OK(mg_model_reserve(m, 128));
    const float *logits = mg_model_forward(m, x, 128);
    check_close_arr("logits0", logits, ref_f32(f, "logits0", 1280), 1280, 1e-4, 1e-6);
    mg_model_zero_grad(m);
    float loss = mg_model_loss(m, y, NULL);
    CHECK_CLOSE(loss, losses[0], 1e-5, 0);
    mg_model_backward(m);
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        snprintf(key, sizeof key, "grad.%s", p->name);
        /* Gradients summed over 128 images: absolute slack of 1e-4 of the
         * tensor's largest entry for entries that nearly cancel. */
        const float *g = ref_f32(f, key, p->numel);
        double mx = 0;
        for (size_t k = 0; k < p->numel; k++) mx = fmax(mx, fabs(g[k]));
        check_close_arr(key, p->grad, g, p->numel, 1e-4, 1e-4 * mx);
    }
    /* 20 SGD steps (lr 0.05, momentum 0.9), batches from steps.indices. */
    mg_optim_config cfg = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    cfg.momentum = 0.9f;
    mg_optim *o;
    CHECK_OK(mg_optim_create(&cfg, mg_model_arena_size(m), &o));
    mg_optim_step(o, mg_model_params(m), mg_model_grads(m), 0.05f);
    for (int s = 1; s < 20; s++) {
        CHECK_OK(mg_dataset_gather(ds, steps + s * 128, 128, MG_SCALE_NORMAL, x, 128 * 784, y));
        mg_model_zero_grad(m);
        mg_model_forward(m, x, 128);
        loss = mg_model_loss(m, y, NULL);
        CHECK_MSG(fabs(loss - losses[s]) <= 1e-4 * fabs(losses[s]),
                  "step %d: loss %.7f vs PyTorch %.7f", s, loss, losses[s]);
        mg_model_backward(m);
        mg_optim_step(o, mg_model_params(m), mg_model_grads(m), 0.05f);
    }
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        snprintf(key, sizeof key, "final.%s", p->name);
        const float *w = ref_f32(f, key, p->numel);
        double mx = 0;
        for (size_t k = 0; k < p->numel; k++) mx = fmax(mx, fabs(w[k]));
        /* 1e-4 relative to the element or to the tensor's scale: after 20
         * steps an entry near zero, or one whose max-pool window held a
         * near-tie that rounding decided differently, differs by more than
         * 1e-4 of itself (worst seen: 3e-5 of the tensor's largest). */
        check_close_arr(key, p->data, w, p->numel, 1e-4, 1e-4 * mx);
    }
    mg_optim_destroy(o);
    mg_model_destroy(m);
    mg_dataset_destroy(ds);
    mg_st_close(f);
    free(x);
}

/* The MLP spends its time in OpenBLAS, which sanitizers do not slow down,
 * so this stays quick in every build; the CNNs' numerics are covered by
 * the PyTorch equivalence and the gradient checks. */
TEST_T(models_short_training_learns, 120)
{
    mg_dataset *train, *test;
    if (mg_dataset_load(mgt_fashion_dir(), true, &train) != MG_OK)
        mgt_skip("Fashion-MNIST not found in %s: %s", mgt_fashion_dir(), mg_last_error());
    CHECK_OK(mg_dataset_load(mgt_fashion_dir(), false, &test));
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 0, &m));
    CHECK_OK(mg_model_reserve(m, 128));
    mg_optim_config cfg = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    cfg.momentum = 0.9f;
    mg_optim *o;
    CHECK_OK(mg_optim_create(&cfg, mg_model_arena_size(m), &o));
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)train->n), y[128];
    float *x = malloc(128 * 784 * 4);
    mg_permutation(0, perm, train->n);
    for (int s = 0; s < 300; s++) {
        CHECK_OK(mg_dataset_gather(train, perm + s * 128, 128, MG_SCALE_NORMAL, x, 128 * 784, y));
        mg_model_zero_grad(m);
        mg_model_forward(m, x, 128);
        mg_model_loss(m, y, NULL);
        mg_model_backward(m);
        mg_optim_step(o, mg_model_params(m), mg_model_grads(m), 0.05f);
    }
    mg_model_set_training(m, false);
    int correct = 0;
    int32_t idx[128];
    for (int i = 0; i < test->n; i += 128) {
        int n = test->n - i < 128 ? test->n - i : 128;
        for (int k = 0; k < n; k++) idx[k] = i + k;
        CHECK_OK(mg_dataset_gather(test, idx, n, MG_SCALE_NORMAL, x, 128 * 784, y));
        int c;
        mg_model_forward(m, x, n);
        mg_model_loss(m, y, &c);
        correct += c;
    }
    double acc = (double)correct / test->n;
    CHECK_MSG(acc > 0.75, "test accuracy after 300 steps: %.4f", acc);
    mg_optim_destroy(o);
    mg_model_destroy(m);
    mg_dataset_destroy(train);
    mg_dataset_destroy(test);
    free(perm);
    free(x);
}
