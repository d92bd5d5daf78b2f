/* libFuzzer target: the checkpoint loader (src/nn/checkpoint.c) and the
 * weights loader on any bytes, into a tiny gpt-mini (1 layer, dim 4,
 * vocabulary 8) with SGD momentum state; a file without a checksum is
 * also loaded signed. A refused file must leave the model and optimizer
 * as they were; an accepted one has counters in range. */
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

static size_t snapshot_bytes(void) { return mg_model_arena_size(model) * sizeof(float); }

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

/* Every loader on path: a refused file leaves model and optimizer as
 * they were, an accepted one has its counters in range. */
static void load_all(const char *path)
{
    mg_ckpt_meta meta;
    snapshot();
    long steps = mg_optim_steps(optim);
    if (mg_checkpoint_load(path, model, optim, &meta) == MG_OK) {
        FUZZ_CHECK(meta.step >= 0 && meta.epoch >= 0 && mg_optim_steps(optim) >= 0);
        FUZZ_CHECK(meta.step < (1L << 53) && meta.epoch < (1L << 53));
        FUZZ_CHECK(meta.optimizer_steps == mg_optim_steps(optim) &&
                   meta.optimizer_steps >= meta.step && meta.optimizer_steps < (1L << 53));
    } else {
        FUZZ_CHECK(unchanged() && mg_optim_steps(optim) == steps && *mg_last_error());
    }
    snapshot();
    if (mg_checkpoint_load(path, model, NULL, NULL)) FUZZ_CHECK(unchanged());
    snapshot();
    if (mg_model_load_weights(path, model, NULL, NULL)) FUZZ_CHECK(unchanged());
}

/* A file without the checksum, given one (as anyone can): mutations
 * almost always break the checksum, so this is how validation past it
 * gets fuzzed. The signed copy is written to /dev/shm (mg_st_write takes
 * a path it renames into). */
static void load_signed(const char *path)
{
    mg_st_file *f;
    if (mg_st_open(path, &f) != MG_OK) return;
    int n = mg_st_count(f), nm = mg_st_meta_count(f);
    mg_st_tensor *t = malloc(sizeof *t * (size_t)(n + 1));
    const char **kv = malloc(sizeof *kv * (size_t)(2 * nm + 1));
    FUZZ_CHECK(t && kv);
    for (int i = 0; i < n; i++) t[i] = *mg_st_get(f, i);
    for (int i = 0; i < nm; i++) kv[2 * i + 1] = mg_st_meta_at(f, i, &kv[2 * i]);
    char signed_path[128];
    snprintf(signed_path, sizeof signed_path, "%s/signed.st", fuzz_dir("checkpoint", NULL, 0));
    if (!mg_st_verified(f) && mg_st_write(signed_path, t, n, kv, nm) == MG_OK)
        load_all(signed_path);
    free(t);
    free(kv);
    mg_st_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!model) setup();
    const char *path = fuzz_file(0, data, size);
    load_all(path);
    load_signed(path);
    return 0;
}
