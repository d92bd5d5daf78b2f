/* examples/train_ddp.c — the smallest complete DDP training program with
 * libmultigrad: run it as `mgrun -n 2 build/examples/train_ddp`.
 * Each rank trains lenet5 on its shard of Fashion-MNIST; gradients are
 * averaged across ranks during backward, so every rank ends with the same
 * parameters as one process with the global batch would. */
#include <stdio.h>
#include <stdlib.h>
#include "multigrad/multigrad.h"

#define CHECK(call) do { if (call) { fprintf(stderr, "train_ddp: %s\n", mg_last_error()); \
                                     return 1; } } while (0)

int main(void)
{
    mg_group *g;
    CHECK(mg_group_init(NULL, &g));          /* RANK, WORLD_SIZE, ... from mgrun */
    int rank = mg_group_rank(g), world = mg_group_size(g);
    int global_batch = 128, local = global_batch / world;

    mg_dataset *train;
    CHECK(mg_dataset_load("/usr/share/datasets/fashion-mnist", true, &train));
    mg_model *m;
    CHECK(mg_model_create("lenet5", 0, &m));
    CHECK(mg_model_reserve(m, local));
    mg_ddp *ddp;                              /* broadcasts rank 0's parameters */
    CHECK(mg_ddp_create(g, m, NULL, &ddp));
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    oc.momentum = 0.9f;
    mg_optim *opt;
    CHECK(mg_optim_create(&oc, mg_model_arena_size(m), &opt));

    mg_sampler s;                             /* this rank's perm[rank::world] */
    CHECK(mg_sampler_init(&s, train->n, rank, world, true, 0, false));
    mg_loader *l;
    CHECK(mg_loader_create(train, local, MG_SCALE_NORMAL, &l));
    int n;
    const int32_t *order = mg_sampler_indices(&s, &n);
    mg_loader_start(l, order, n, local, 0);
    const float *x;
    const int32_t *y;
    int bs, step = 0;
    while ((bs = mg_loader_next(l, &x, &y)) > 0) {
        mg_model_zero_grad(m);
        CHECK(!mg_model_forward(m, x, bs));  /* NULL: the batch could not be reserved */
        float loss = mg_model_loss(m, y, NULL);
        mg_model_backward(m);               /* buckets all-reduce as they finish */
        CHECK(mg_ddp_finish(ddp));          /* wait: gradients are averaged */
        mg_optim_step(opt, mg_model_params(m), mg_model_grads(m), 0.05f);
        if (rank == 0 && step++ % 100 == 0) printf("step %d loss %.4f\n", step, loss);
    }
    mg_loader_destroy(l);
    mg_sampler_free(&s);
    mg_optim_destroy(opt);
    mg_ddp_destroy(ddp);
    mg_model_destroy(m);
    mg_dataset_destroy(train);
    mg_group_destroy(g);
    return 0;
}
