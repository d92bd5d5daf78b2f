/* DataParallel equals one process on the same batches. */
#include "harness.h"
#include "multigrad/multigrad.h"

static double max_rel_diff(const float *a, const float *b, size_t n)
{
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(a[i]));
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]) / (scale + 1e-30));
    return worst;
}

static void dp_equals_single(const char *model, int workers, int batch)
{
    mg_dataset *train;
    CHECK_OK(mg_dataset_load(mgt_fashion_dir(), true, &train));
    mg_zoo_defaults d;
    CHECK_OK(mg_zoo_defaults_of(model, &d));
    mg_scaling sc = d.normalized_input ? MG_SCALE_NORMAL : MG_SCALE_UNIT;
    mg_model *m;
    CHECK_OK(mg_model_create(model, 0, &m));
    CHECK_OK(mg_model_reserve(m, batch));
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
    float *x = malloc(sizeof(float) * 784 * (size_t)batch);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)batch), *idx = malloc(sizeof(int32_t) * (size_t)batch);
    for (int step = 0; step < 10; step++) {
        /* An odd last step: a batch that does not divide by the workers. */
        int bs = step == 9 ? batch - 3 : batch;
        for (int k = 0; k < bs; k++) idx[k] = (step * batch + k * 7) % train->n;
        mg_dataset_gather(train, idx, bs, sc, x, y);
        mg_model_zero_grad(m);
        mg_model_forward(m, x, bs);
        int c1, c2;
        float l1 = mg_model_loss(m, y, &c1);
        mg_model_backward(m);
        float l2 = mg_dp_forward_backward(dp, x, y, bs, &c2);
        CHECK_CLOSE(l1, l2, 1e-5, 1e-6);
        CHECK_EQ(c1, c2);
        double gd = max_rel_diff(mg_model_grads(m), mg_model_grads(m0), n);
        CHECK_MSG(gd < 1e-5, "step %d: gradients differ by %g", step, gd);
        mg_optim_step(o1, mg_model_params(m), mg_model_grads(m), 0.05f);
        mg_optim_step(o2, mg_model_params(m0), mg_model_grads(m0), 0.05f);
    }
    double pd = max_rel_diff(mg_model_params(m), mg_model_params(m0), n);
    CHECK_MSG(pd < 1e-5, "parameters differ by %g after 10 steps", pd);
    free(x);
    free(y);
    free(idx);
    mg_optim_destroy(o1);
    mg_optim_destroy(o2);
    mg_dp_destroy(dp);
    mg_model_destroy(m);
    mg_dataset_destroy(train);
}

TEST(dp_lenet5_2_workers_equals_one_process) { dp_equals_single("lenet5", 2, 128); }
TEST(dp_mlp_3_workers_equals_one_process) { dp_equals_single("mlp", 3, 128); }
TEST(dp_one_worker_and_bad_arguments)
{
    mg_dp *dp;
    CHECK_ERR(mg_dp_create("lenet5", 0, 0, 16, &dp), MG_EINVAL);
    CHECK_ERR(mg_dp_create("no-such-model", 0, 2, 16, &dp), MG_EINVAL);
    CHECK_OK(mg_dp_create("mlp", 0, 1, 16, &dp));
    mg_dp_destroy(dp);
}
