/* DataParallel equals one process on the same batches, also when
 * micro-batches accumulate; a batch that cannot be reserved is an error. */
#include <limits.h>
#include <sys/resource.h>
#include "harness.h"
#include "multigrad/multigrad.h"

static double max_rel_diff(const float *a, const float *b, size_t n)
{
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(a[i]));
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]) / (scale + 1e-30));
    return worst;
}

/* DataParallel equals one process on the same batches: each step either
 * one call (micros = 1; the last step a batch that does not divide by the
 * workers) or, as mgtrain --accumulate does it, `micros` calls of `batch`
 * images after one zeroing, scaled by 1/micros — against one forward and
 * backward over the concatenated micro-batches. */
static void dp_equals_single(const char *model, int workers, int batch, int micros, int steps)
{
    mg_dataset *train;
    CHECK_OK(mg_dataset_load(mgt_fashion_dir(), true, &train));
    mg_zoo_defaults d;
    CHECK_OK(mg_zoo_defaults_of(model, &d));
    mg_scaling sc = d.normalized_input ? MG_SCALE_NORMAL : MG_SCALE_UNIT;
    int global = batch * micros;
    mg_model *m;
    CHECK_OK(mg_model_create(model, 0, &m));
    CHECK_OK(mg_model_reserve(m, global));
    mg_dp *dp;
    CHECK_OK(mg_dp_create(model, 0, workers, batch, &dp));
    CHECK_EQ(mg_dp_workers(dp), workers);
    mg_model *m0 = mg_dp_model(dp);
    size_t n = mg_model_arena_size(m);
    CHECK(memcmp(mg_model_params(m), mg_model_params(m0), n * sizeof(float)) == 0);
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    oc.momentum = 0.9f;
    mg_optim *o1, *o2;
    CHECK_OK(mg_optim_create(&oc, n, &o1));
    CHECK_OK(mg_optim_create(&oc, n, &o2));
    float *x = malloc(sizeof(float) * 784 * (size_t)global);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)global), *idx = malloc(sizeof(int32_t) * (size_t)global);
    for (int step = 0; step < steps; step++) {
        int bs = micros == 1 && step == steps - 1 ? batch - 3 : batch, all = bs * micros;
        for (int k = 0; k < all; k++) idx[k] = (step * global + k * 7) % train->n;
        CHECK_OK(mg_dataset_gather(train, idx, all, sc, x, 784 * (size_t)global, y));
        mg_model_zero_grad(m);
        mg_model_forward(m, x, all);
        int c1, c2 = 0;
        float l1 = mg_model_loss(m, y, &c1), l2 = 0;
        mg_model_backward(m);
        mg_model_zero_grad(m0);
        for (int k = 0; k < micros; k++) {
            float l;
            int c;
            CHECK_OK(mg_dp_forward_backward(dp, x + (size_t)k * bs * 784, y + k * bs, bs, &l, &c));
            l2 += l / (float)micros;
            c2 += c;
        }
        float *g0 = mg_model_grads(m0);
        if (micros > 1)
            for (size_t i = 0; i < n; i++) g0[i] *= 1.0f / (float)micros;
        CHECK_CLOSE(l1, l2, 1e-5, 1e-6);
        CHECK_EQ(c1, c2);
        double gd = max_rel_diff(mg_model_grads(m), g0, n);
        CHECK_MSG(gd < 1e-5, "step %d: gradients differ by %g", step, gd);
        mg_optim_step(o1, mg_model_params(m), mg_model_grads(m), 0.05f);
        mg_optim_step(o2, mg_model_params(m0), g0, 0.05f);
    }
    double pd = max_rel_diff(mg_model_params(m), mg_model_params(m0), n);
    CHECK_MSG(pd < 1e-5, "parameters differ by %g after %d steps", pd, steps);
    free(x);
    free(y);
    free(idx);
    mg_optim_destroy(o1);
    mg_optim_destroy(o2);
    mg_dp_destroy(dp);
    mg_model_destroy(m);
    mg_dataset_destroy(train);
}

TEST(dp_lenet5_2_workers_equals_one_process) { dp_equals_single("lenet5", 2, 128, 1, 10); }
TEST(dp_mlp_3_workers_equals_one_process) { dp_equals_single("mlp", 3, 128, 1, 10); }

TEST(dp_lenet5_2_workers_accumulate_3_equals_one_process)
{
    dp_equals_single("lenet5", 2, 32, 3, 6);
}
/* 40 images on 3 workers: replicas of 14, 14 and 12. */
TEST(dp_mlp_3_workers_accumulate_3_equals_one_process)
{
    dp_equals_single("mlp", 3, 40, 3, 6);
}

/* A batch larger than max_batch makes the threads' tapes again; when
 * that fails the call reports it and leaves the gradients as they were. */
TEST(dp_forward_that_cannot_reserve_is_an_error)
{
    enum { B = 16 };
    static float x[B * 784];
    int32_t y[B];
    for (int i = 0; i < B * 784; i++) x[i] = (float)((i * 37) % 255) / 255.0f;
    for (int i = 0; i < B; i++) y[i] = i % 10;
    mg_dp *dp;
    CHECK_OK(mg_dp_create("lenet5", 0, 2, B, &dp));
    mg_model *m0 = mg_dp_model(dp);
    size_t n = mg_model_arena_size(m0);
    float l;
    int c;
    mg_model_zero_grad(m0);
    CHECK_OK(mg_dp_forward_backward(dp, x, y, B, &l, &c));
    float *kept = malloc(n * sizeof(float));
    memcpy(kept, mg_model_grads(m0), n * sizeof(float));
    /* Cap the address space near what is in use, so the reservation below
     * fails also where the kernel overcommits without limit. */
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_AS, &rl) == 0);
    long vm_kb = 0;
    char status[8192];
    mgt_read_into("/proc/self/status", status, sizeof status);
    const char *vm = strstr(status, "VmSize:");
    CHECK(vm && sscanf(vm, "VmSize: %ld", &vm_kb) == 1);
    rlim_t cap = (rlim_t)vm_kb * 1024 + ((rlim_t)8 << 30);
    if (rl.rlim_max == RLIM_INFINITY || cap < rl.rlim_max) rl.rlim_cur = cap;
    CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
    /* Half of INT_MAX images of lenet5 need tens of TB of activations (the
     * size computation does not overflow); x and y are never read, the
     * reservation fails first. */
    CHECK_ERR(mg_dp_forward_backward(dp, x, y, INT_MAX / 2, &l, &c), MG_ENOMEM);
    CHECK_MSG(strstr(mg_last_error(), "DataParallel threads") &&
              strstr(mg_last_error(), "smaller batch"), "%s", mg_last_error());
    CHECK(memcmp(kept, mg_model_grads(m0), n * sizeof(float)) == 0);
    /* Still usable with batches that fit. */
    CHECK_OK(mg_dp_forward_backward(dp, x, y, B, &l, &c));
    free(kept);
    mg_dp_destroy(dp);
}
TEST(dp_one_worker_and_bad_arguments)
{
    mg_dp *dp;
    CHECK_ERR(mg_dp_create("lenet5", 0, 0, 16, &dp), MG_EINVAL);
    CHECK_ERR(mg_dp_create("no-such-model", 0, 2, 16, &dp), MG_EINVAL);
    CHECK_OK(mg_dp_create("mlp", 0, 1, 16, &dp));
    mg_dp_destroy(dp);
    /* A model another strategy already hooks is refused, not raced on. */
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 0, &m));
    static const mg_unit_hooks none = {0};
    CHECK_OK(mg_model_add_hooks(m, &none, NULL));
    CHECK_ERR(mg_dp_wrap(m, 2, 16, &dp), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "unit hooks"));
    mg_model_remove_hooks(m, &none, NULL);
    CHECK_EQ(mg_model_num_hooks(m), 0);
    CHECK_OK(mg_dp_wrap(m, 2, 16, &dp));
    mg_dp_destroy(dp);
    mg_model_destroy(m);
}
