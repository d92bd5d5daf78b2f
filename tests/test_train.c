/* A short real training run through the library: lenet5 on Fashion-MNIST
 * for 300 SGD steps (models.md's settings) must beat 75% test accuracy. */
#include "harness.h"
#include "multigrad/multigrad.h"

TEST_T(train_lenet5_300_steps_beats_75_percent, 180)
{
    mg_dataset *train, *test;
    CHECK_OK(mg_dataset_load(mgt_fashion_dir(), true, &train));
    CHECK_OK(mg_dataset_load(mgt_fashion_dir(), false, &test));
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", 0, &m));
    mg_zoo_defaults d;
    CHECK_OK(mg_zoo_defaults_of("lenet5", &d));
    CHECK_OK(mg_model_reserve(m, d.batch));
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, d.lr);
    oc.momentum = d.momentum;
    mg_optim *o;
    CHECK_OK(mg_optim_create(&oc, mg_model_arena_size(m), &o));
    mg_loader *l;
    CHECK_OK(mg_loader_create(train, d.batch, MG_SCALE_NORMAL, &l));
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)train->n);
    mg_permutation(0, perm, train->n);
    mg_loader_start(l, perm, train->n, d.batch, 0);
    const float *x;
    const int32_t *y;
    int bs, steps = 0;
    float first = 0, loss = 0;
    while (steps < 300 && (bs = mg_loader_next(l, &x, &y)) > 0) {
        mg_model_zero_grad(m);
        mg_model_forward(m, x, bs);
        loss = mg_model_loss(m, y, NULL);
        if (steps == 0) first = loss;
        mg_model_backward(m);
        mg_optim_step(o, mg_model_params(m), mg_model_grads(m), d.lr);
        steps++;
    }
    CHECK_EQ(steps, 300);
    CHECK_MSG(loss < first * 0.5f, "loss went from %g to %g", first, loss);
    /* Evaluate on all 10,000 test images. */
    float *xb = malloc(sizeof(float) * 784 * (size_t)d.batch);
    int32_t *yb = malloc(sizeof(int32_t) * (size_t)d.batch), idx[1024];
    long correct = 0;
    mg_model_set_training(m, false);
    for (int i = 0; i < test->n; i += d.batch) {
        int n = test->n - i < d.batch ? test->n - i : d.batch;
        for (int k = 0; k < n; k++) idx[k] = i + k;
        mg_dataset_gather(test, idx, n, MG_SCALE_NORMAL, xb, yb);
        mg_model_forward(m, xb, n);
        int c;
        mg_model_loss(m, yb, &c);
        correct += c;
    }
    double acc = (double)correct / test->n;
    printf("test accuracy after 300 steps: %.2f%%\n", 100 * acc);
    CHECK_MSG(acc > 0.75, "test accuracy %.4f after 300 steps", acc);
    free(xb);
    free(yb);
    free(perm);
    mg_loader_destroy(l);
    mg_optim_destroy(o);
    mg_model_destroy(m);
    mg_dataset_destroy(train);
    mg_dataset_destroy(test);
}
