/* examples/train_ddp.c — a user-defined model trained with DDP through the
 * training step every strategy shares: `mgrun -n 2 build/examples/train_ddp`.
 * Each rank trains on its shard of Fashion-MNIST; gradients are averaged
 * in backward, so every rank ends as one process with the global batch. */
#include <stdio.h>
#include "multigrad/multigrad.h"

#define CHECK(call) do { if (call) { fprintf(stderr, "train_ddp: %s\n", mg_last_error()); \
                                     return 1; } } while (0)

static bool next(void *loader, mg_micro_batch *b)   /* the step's micro-batches */
{
    b->n = mg_loader_next(loader, (const float **)&b->x, &b->y);
    return b->n > 0;
}

int main(void)
{
    mg_group *g;
    CHECK(mg_group_init(NULL, &g));           /* RANK, WORLD_SIZE, ... from mgrun */
    int rank = mg_group_rank(g), world = mg_group_size(g), local = 128 / world;
    mg_dataset *train;
    CHECK(mg_dataset_load("/usr/share/datasets/fashion-mnist", true, &train));
    mg_layer *layers[] = {mg_layer_conv2d("conv", 1, 8, 5, 1, 2, true, MG_POOL_MAX),
                          mg_layer_linear("hidden", 8 * 14 * 14, 64, true),
                          mg_layer_linear("out", 64, 10, false)};
    mg_model *m;
    CHECK(mg_model_create_from("mine", mg_layer_sequential(NULL, layers, 3), 1, 28, 28, 0, &m));
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_DDP);
    so.group = g;
    so.max_batch = local;
    mg_strategy *s;                           /* broadcasts rank 0's parameters */
    CHECK(mg_strategy_create(m, &so, &s));
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    mg_optim *opt;
    CHECK(mg_strategy_optim(s, &oc, &opt));

    mg_sampler smp;                           /* this rank's perm[rank::world] */
    mg_loader *l;
    CHECK(mg_sampler_init(&smp, train->n, rank, world, true, 0, false) ||
          mg_loader_create(train, local, MG_SCALE_NORMAL, &l));
    int n;                                    /* read after the call that sets it */
    const int32_t *mine = mg_sampler_indices(&smp, &n);
    CHECK(mg_loader_start(l, mine, n, local, 0));
    mg_step_options step = {.accumulate = 1, .lr = 0.05f};
    mg_step_result r;
    double loss = 0;
    int i = 0;
    for (;; i++) {
        CHECK(mg_train_step(s, opt, &step, next, l, &r));   /* an epoch: until no batch */
        if (!r.micro) break;
        loss += r.loss_sum / r.samples;
        if (rank == 0 && i % 100 == 0) printf("step %d loss %.4f\n", i, r.loss_sum / r.samples);
    }
    if (rank == 0) printf("epoch: %d steps, train loss %.4f\n", i, loss / (i ? i : 1));
    mg_loader_destroy(l);
    mg_sampler_free(&smp);
    mg_optim_destroy(opt);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    mg_dataset_destroy(train);
    mg_group_destroy(g);
    return 0;
}
