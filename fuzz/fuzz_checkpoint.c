/* libFuzzer target: the checkpoint loader (src/nn/checkpoint.c) and the
 * weights loader on any bytes, into a tiny gpt-mini (1 layer, dim 4,
 * vocabulary 8) with SGD momentum state. A refused file must leave the
 * model and optimizer as they were; an accepted one has counters in range. */
#include "common.h"  /* first: it defines _GNU_SOURCE */
#include <string.h>
#include "multigrad/multigrad.h"

static mg_model *model;
static mg_optim *optim;
static float *saved;     /* parameters and momentum before each input */

static void setup(void)
{
    mg_gpt_config c = {.layers = 1, .dim = 4, .heads = 1, .ctx = 2, .vocab = 8};
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.1f);
    oc.momentum = 0.9f;
    if (mg_model_create_gpt(&c, 0, &model) ||
        mg_optim_create(&oc, mg_model_arena_size(model), &optim)) {
        fprintf(stderr, "fuzz_checkpoint: %s\n", mg_last_error());
        abort();
    }
    saved = malloc(2 * mg_model_arena_size(model) * sizeof(float));
}

static size_t snapshot_bytes(void) { return mg_model_num_params(model) * sizeof(float); }

static void snapshot(void)
{
    memcpy(saved, mg_model_params(model), snapshot_bytes());
    memcpy(saved + mg_model_arena_size(model), mg_optim_state(optim, 0, NULL), snapshot_bytes());
}

static bool unchanged(void)
{
    return !memcmp(saved, mg_model_params(model), snapshot_bytes()) &&
           !memcmp(saved + mg_model_arena_size(model), mg_optim_state(optim, 0, NULL),
                   snapshot_bytes());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!model) setup();
    const char *path = fuzz_file(0, data, size);
    mg_ckpt_meta meta;
    snapshot();
    long steps = mg_optim_steps(optim);
    if (mg_checkpoint_load(path, model, optim, &meta) == MG_OK) {
        FUZZ_CHECK(meta.step >= 0 && meta.epoch >= 0 && mg_optim_steps(optim) >= 0);
        FUZZ_CHECK(meta.step < (1L << 53) && meta.epoch < (1L << 53));
    } else {
        FUZZ_CHECK(unchanged() && mg_optim_steps(optim) == steps && *mg_last_error());
    }
    snapshot();
    if (mg_checkpoint_load(path, model, NULL, NULL)) FUZZ_CHECK(unchanged());
    snapshot();
    if (mg_model_load_weights(path, model, NULL)) FUZZ_CHECK(unchanged());
    return 0;
}
