/* examples/train_mesh.c — a model of your own, trained by the library's
 * trainer (train.h) under any plan:
 *
 *     build/examples/train_mesh                            one process
 *     mgrun -n 4 build/examples/train_mesh pp=2,dp=2 2     a pipeline of 2
 *         stages, each on 2 replicas that shard its state with ZeRO-2
 *     mgrun -n 4 build/examples/train_mesh dp=2,tp=2       its linears split
 *         over 2 ranks (Megatron-LM's column and row), on 2 replicas
 *
 * Arguments: the mesh (as mgtrain's --mesh), the ZeRO stage (0: none), the
 * epochs (default 1) and a checkpoint file, written after every epoch and
 * resumed from when it exists, under whatever plan wrote it. The trainer
 * joins the job, has each rank build only its part of the model, loads
 * Fashion-MNIST (MG_DATA, or the system's), trains and evaluates on the
 * test set after every epoch. Every plan trains as one process does: the
 * same global batch of 64 is the same images. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "multigrad/multigrad.h"

/* The model: conv and max-pool, a linear with ReLU, a linear; made without values so that
 * each rank draws only the parameters it holds. Under tensor parallelism (tp.size > 1) this
 * rank's part: the hidden linear's outputs split (column), the last one's inputs (row, its
 * outputs summed over the tp ranks); the convolution whole. */
static mg_status make_model(void *ud, mg_tp_split tp, mg_model **out)
{
    (void)ud;
    mg_layer *layers[] = {mg_layer_conv2d("conv", 1, 8, 5, 1, 2, true, MG_POOL_MAX),
                          mg_layer_linear_split("hidden", 8 * 14 * 14, 64, true, MG_TP_COLUMN, tp),
                          mg_layer_linear_split("out", 64, 10, false, MG_TP_ROW, tp)};
    return mg_model_create_from("mine", mg_layer_sequential(NULL, layers, 3), 1, 28, 28,
                                MG_SEED_DEFERRED, out);
}

static void print_row(const mg_train_row *r, void *ud)
{
    if (*(const int *)ud == 0)   /* rank 0 prints */
        printf("epoch %ld: train loss %.6f, test loss %.6f, test accuracy %.2f%%\n", r->epoch,
               r->train_loss, r->test_loss, 100 * r->test_acc);
}

int main(int argc, char **argv)
{
    int rank = atoi(getenv("RANK") ? getenv("RANK") : "0");
    mg_train_config c = {
        .model = "mine", .make_split = make_model, .normalized_input = true,
        .batch = 64, .epochs = argc > 3 ? atoi(argv[3]) : 1,
        .optimizer = "sgd", .lr = 0.05f, .momentum = 0.9f,
        .mesh = argc > 1 && *argv[1] ? argv[1] : NULL,   /* a job's ranks as a mesh */
        .zero = argc > 2 ? atoi(argv[2]) : 0,    /* ZeRO over its dp dimension */
        .save = argc > 4 ? argv[4] : NULL,
        .resume = argc > 4 && access(argv[4], R_OK) == 0 ? argv[4] : NULL,
        .on_row = print_row, .ud = &rank};
    mg_trainer *t = NULL;
    mg_train_summary s;
    mg_status st = mg_trainer_create(&c, &t);
    if (!st) st = mg_trainer_run(t, &s);
    if (st) {
        /* A mistake every rank finds (a mesh that does not fit the job) is
         * said by the rank that found it first; the others stay quiet. */
        if (st != MG_ESTOPPED || mg_launch_defer_to_the_first())
            fprintf(stderr, "train_mesh: %s\n", mg_last_error());
        mg_trainer_destroy(t);
        return 1;
    }
    if (rank == 0)
        printf("%s: %ld steps in %.1f s, %.0f images/s\n", mg_strategy_name(mg_trainer_strategy(t)),
               s.steps_run, s.seconds, s.per_s);
    mg_trainer_destroy(t);
    return 0;
}
