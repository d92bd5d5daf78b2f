/* Tests of checkpoints (src/nn/checkpoint.c): checkpoints that
 * round-trip bit-exactly and refuse damaged or mismatched files without
 * touching the model, weights loaded from PyTorch's export, and PyTorch
 * reading what we write. The safetensors format itself is tested in
 * test_safetensors.c. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <unistd.h>
#include "harness.h"
#include "st_files.h"
#include "multigrad/checkpoint.h"

/* ---- checkpoints of models ---- */

/* A few optimizer steps with made-up gradients, so that parameters and
 * optimizer state are all non-trivial. */
static void train_fake(mg_model *m, mg_optim *o, int steps, uint32_t salt)
{
    size_t n = mg_model_arena_size(m);
    float *g = mg_model_grads(m);
    for (int s = 0; s < steps; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = (float)((int)((i * 2654435761u + salt * 40503u + (uint32_t)s * 977u) % 2001)
                           - 1000) * 1e-4f;
        mg_optim_step(o, mg_model_params(m), g, 0.05f);
    }
}

typedef struct { float *params, *buffers, *state[2]; } snapshot;

static snapshot snap(mg_model *m, mg_optim *o)
{
    snapshot s = {0};
    size_t n = mg_model_arena_size(m), nb = mg_model_buffer_size(m);
    s.params = malloc(n * sizeof(float));
    memcpy(s.params, mg_model_params(m), n * sizeof(float));
    s.buffers = malloc(nb * sizeof(float) + 1);
    if (nb) memcpy(s.buffers, mg_model_buffers(m), nb * sizeof(float));
    for (int i = 0; o && i < mg_optim_num_states(o); i++) {
        s.state[i] = malloc(n * sizeof(float));
        memcpy(s.state[i], mg_optim_state(o, i, NULL), n * sizeof(float));
    }
    return s;
}

/* Bit-exact equality of every tensor (not the units' padding) with a
 * snapshot. */
static bool same_as(mg_model *m, mg_optim *o, const snapshot *s)
{
    size_t nb = mg_model_buffer_size(m);
    if (nb && memcmp(s->buffers, mg_model_buffers(m), nb * sizeof(float))) return false;
    for (int t = 0; t < mg_model_num_tensors(m); t++) {
        const mg_param *p = mg_model_tensor(m, t);
        if (p->is_buffer) continue;
        size_t bytes = p->numel * sizeof(float);
        if (memcmp(s->params + p->offset, p->data, bytes)) return false;
        for (int i = 0; o && i < mg_optim_num_states(o); i++)
            if (memcmp(s->state[i] + p->offset, mg_optim_state(o, i, NULL) + p->offset, bytes))
                return false;
    }
    return true;
}

static void free_snap(snapshot *s)
{
    free(s->params);
    free(s->buffers);
    free(s->state[0]);
    free(s->state[1]);
}

static mg_optim *sgd_for(mg_model *m, float momentum)
{
    mg_optim_config c = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    c.momentum = momentum;
    mg_optim *o;
    CHECK_OK(mg_optim_create(&c, mg_model_arena_size(m), &o));
    return o;
}

TEST(ckpt_round_trip_lenet5_sgd_bit_exact)
{
    mg_model *a, *b;
    CHECK_OK(mg_model_create("lenet5", 0, &a));
    CHECK_OK(mg_model_create("lenet5", 1, &b));
    mg_optim *oa = sgd_for(a, 0.9f), *ob = sgd_for(b, 0.9f);
    train_fake(a, oa, 3, 1);
    mg_model_set_rng_counter(a, 12345);
    mg_ckpt_meta meta = {.step = 3, .epoch = 1, .seed = 0xfedcba9876543210ull};
    snprintf(meta.hparams, sizeof meta.hparams, "model=lenet5;batch=128;lr=0.05;momentum=0.9");
    const char *p = mgt_tpath("lenet5.ckpt");
    CHECK_OK(mg_checkpoint_save(p, a, oa, &meta));
    CHECK_EQ(mgt_count_tmp_files(), 0);

    snapshot sa = snap(a, oa);
    CHECK(!same_as(b, ob, &sa));
    mg_ckpt_meta got;
    memset(&got, 0x55, sizeof got);
    CHECK_OK(mg_checkpoint_load(p, b, ob, &got));
    CHECK(same_as(b, ob, &sa));
    CHECK_EQ(mg_optim_steps(ob), 3);
    CHECK(mg_model_rng_counter(b) == 12345 && got.rng_counter == 12345);
    CHECK(!strcmp(got.model, "lenet5") && got.step == 3 && got.epoch == 1);
    CHECK(got.seed == 0xfedcba9876543210ull && !strcmp(got.hparams, meta.hparams));

    /* Resuming continues exactly: one more step on each is identical. */
    train_fake(a, oa, 1, 9);
    train_fake(b, ob, 1, 9);
    snapshot sa2 = snap(a, oa);
    CHECK(same_as(b, ob, &sa2));

    /* The file: PyTorch names and shapes, optimizer state, metadata. */
    mg_st_file *f;
    CHECK_OK(mg_st_open(p, &f));
    CHECK_EQ(mg_st_count(f), 20);
    const mg_st_tensor *t = mg_st_find(f, "conv1.weight");
    CHECK(t && t->ndim == 4 && t->shape[0] == 6 && t->shape[1] == 1 && t->shape[3] == 5);
    t = mg_st_find(f, "optim.momentum_buffer.fc1.weight");
    CHECK(t && t->ndim == 2 && t->shape[0] == 120 && t->shape[1] == 400);
    CHECK(!strcmp(mg_st_meta(f, "optimizer"), "sgd"));
    CHECK(strstr(mg_st_meta(f, "optimizer_config"), "momentum=0.9"));
    CHECK(!strcmp(mg_st_meta(f, "format_version"), "1"));
    CHECK(!strcmp(mg_st_meta(f, "parameters"), "conv1.weight,conv1.bias,conv2.weight,"
                  "conv2.bias,fc1.weight,fc1.bias,fc2.weight,fc2.bias,fc3.weight,fc3.bias"));
    mg_st_close(f);

    /* Without an optimizer: parameters only; loading one ignores state. */
    mg_model *c;
    CHECK_OK(mg_model_create("lenet5", 2, &c));
    CHECK_OK(mg_checkpoint_load(p, c, NULL, NULL));
    CHECK_OK(mg_checkpoint_save(mgt_tpath("noopt.ckpt"), a, NULL, NULL));
    CHECK_OK(mg_checkpoint_load(mgt_tpath("noopt.ckpt"), c, NULL, &got));
    CHECK(same_as(c, NULL, &sa2) && got.step == 0 && got.hparams[0] == 0);
    /* A checkpoint is also a state_dict for --init (optimizer state ignored). */
    CHECK_OK(mg_model_init_params(c, 4));
    CHECK(!same_as(c, NULL, &sa2));
    CHECK_OK(mg_model_load_weights(mgt_tpath("noopt.ckpt"), c, NULL, NULL));
    CHECK(same_as(c, NULL, &sa2));
    free_snap(&sa);
    free_snap(&sa2);
    mg_optim_destroy(oa);
    mg_optim_destroy(ob);
    mg_model_destroy(a);
    mg_model_destroy(b);
    mg_model_destroy(c);
}

/* A model with buffers (batch norm), and Adam's two states. */
static mg_model *bn_model(uint64_t seed)
{
    mg_layer *l[] = {
        mg_layer_conv2d("conv", 1, 4, 3, 1, 1, false, MG_POOL_NONE),
        mg_layer_batchnorm2d("bn", 4),
        mg_layer_relu("relu"),
        mg_layer_linear("fc", 4 * 6 * 6, 10, false),
    };
    mg_model *m;
    CHECK_OK(mg_model_create_from("bn-net", mg_layer_sequential(NULL, l, 4), 1, 6, 6, seed, &m));
    return m;
}

TEST(ckpt_round_trip_buffers_and_adam)
{
    mg_model *a = bn_model(0), *b = bn_model(1);
    CHECK(mg_model_buffer_size(a) >= 8);
    for (size_t i = 0; i < mg_model_buffer_size(a); i++)
        mg_model_buffers(a)[i] = 0.25f * (float)i - 1.0f;
    for (int k = 0; k < 2; k++) {
        mg_optim_config c = mg_optim_defaults(k ? MG_OPTIM_ADAMW : MG_OPTIM_ADAM, 1e-3f);
        mg_optim *oa, *ob;
        CHECK_OK(mg_optim_create(&c, mg_model_arena_size(a), &oa));
        CHECK_OK(mg_optim_create(&c, mg_model_arena_size(b), &ob));
        train_fake(a, oa, 4, (uint32_t)k);
        const char *p = mgt_tpath("bn.ckpt");
        CHECK_OK(mg_checkpoint_save(p, a, oa, NULL));
        snapshot sa = snap(a, oa);
        CHECK_OK(mg_checkpoint_load(p, b, ob, NULL));
        CHECK(same_as(b, ob, &sa));
        CHECK_EQ(mg_optim_steps(ob), 4);
        mg_st_file *f;
        CHECK_OK(mg_st_open(p, &f));
        CHECK(mg_st_find(f, "bn.running_mean") && mg_st_find(f, "bn.running_var"));
        CHECK(mg_st_find(f, "optim.exp_avg.conv.weight") &&
              mg_st_find(f, "optim.exp_avg_sq.fc.bias"));
        CHECK(!mg_st_find(f, "optim.exp_avg.bn.running_mean"));
        mg_st_close(f);
        free_snap(&sa);
        mg_optim_destroy(oa);
        mg_optim_destroy(ob);
    }
    mg_model_destroy(a);
    mg_model_destroy(b);
}

/* Rewrite the tensors of checkpoint src into dst through edit(), keeping
 * its metadata: a well-formed file (valid CRC) that is wrong in one way. */
static void rewrite(const char *src, const char *dst, void (*edit)(mg_st_tensor *, int *))
{
    mg_st_file *f;
    CHECK_OK(mg_st_open(src, &f));
    int n = mg_st_count(f), nm = 0;
    mg_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    const char **meta = calloc(2 * (size_t)mg_st_meta_count(f) + 2, sizeof *meta);
    for (int i = 0; i < n; i++) t[i] = *mg_st_get(f, i);
    for (int i = 0; i < mg_st_meta_count(f); i++) {
        const char *k, *v = mg_st_meta_at(f, i, &k);
        if (strcmp(k, "multigrad.crc32") == 0) continue;
        meta[2 * nm] = k;
        meta[2 * nm + 1] = v;
        nm++;
    }
    edit(t, &n);
    CHECK_OK(mg_st_write(dst, t, n, meta, nm));
    free(t);
    free(meta);
    mg_st_close(f);
}

static void drop_fc2_bias(mg_st_tensor *t, int *n)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(t[i].name, "fc2.bias")) { t[i] = t[*n - 1]; (*n)--; return; }
    CHECK(0);
}

static void reshape_conv1(mg_st_tensor *t, int *n)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(t[i].name, "conv1.weight")) {
            t[i].ndim = 2; t[i].shape[0] = 6; t[i].shape[1] = 25;
            return;
        }
    CHECK(0);
}

static void conv1_bias_as_int(mg_st_tensor *t, int *n)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(t[i].name, "conv1.bias")) { t[i].dtype = MG_ST_I32; return; }
    CHECK(0);
}

static void drop_momentum(mg_st_tensor *t, int *n)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(t[i].name, "optim.momentum_buffer.fc3.weight")) {
            t[i] = t[*n - 1]; (*n)--; return;
        }
    CHECK(0);
}

static void extra_tensor(mg_st_tensor *t, int *n)
{
    static float x = 1;
    t[*n] = (mg_st_tensor){"fc4.weight", MG_ST_F32, 1, {1}, &x, 4};
    (*n)++;
}

/* src rewritten to dst with element i of tensor `name` set to v and a
 * valid checksum: what a crafted (or buggy) writer makes. */
static void rewrite_value(const char *src, const char *dst, const char *name, size_t i, float v)
{
    mg_st_file *f;
    CHECK_OK(mg_st_open(src, &f));
    int n = mg_st_count(f), nm = 0, nkeys = mg_st_meta_count(f);
    mg_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    const char **meta = calloc(2 * (size_t)nkeys + 2, sizeof *meta);
    void *changed = NULL;
    for (int k = 0; k < n; k++) {
        t[k] = *mg_st_get(f, k);
        if (strcmp(t[k].name, name)) continue;
        CHECK(t[k].dtype == MG_ST_F32 && i < t[k].nbytes / 4);
        changed = malloc(t[k].nbytes);
        memcpy(changed, t[k].data, t[k].nbytes);
        ((float *)changed)[i] = v;
        t[k].data = changed;
    }
    CHECK_MSG(changed, "no tensor %s", name);
    for (int k = 0; k < nkeys; k++) {
        const char *key, *val = mg_st_meta_at(f, k, &key);
        if (strcmp(key, "multigrad.crc32")) {
            meta[2 * nm] = key;
            meta[2 * nm + 1] = val;
            nm++;
        }
    }
    CHECK_OK(mg_st_write(dst, t, n, meta, nm));
    free(changed);
    free(t);
    free(meta);
    mg_st_close(f);
}

/* Issue 30 item 5: values with a valid checksum that no model or
 * optimizer holds (a NaN weight, a negative exp_avg_sq) trained to a NaN
 * loss; they are refused at load, naming the tensor, model unchanged. */
TEST(ckpt_refuses_values_no_model_holds)
{
    mg_model *a = bn_model(0), *b = bn_model(1);
    mg_optim_config c = mg_optim_defaults(MG_OPTIM_ADAMW, 1e-3f);
    mg_optim *oa, *ob;
    CHECK_OK(mg_optim_create(&c, mg_model_arena_size(a), &oa));
    CHECK_OK(mg_optim_create(&c, mg_model_arena_size(b), &ob));
    train_fake(a, oa, 2, 1);
    const char *good = mgt_tpath("good.ckpt"), *bad = mgt_tpath("bad.ckpt");
    CHECK_OK(mg_checkpoint_save(good, a, oa, NULL));
    const struct { const char *tensor; size_t at; float v; const char *says; } cases[] = {
        {"fc.weight", 17, NAN, "holds nan at element 17"},
        {"bn.running_var", 2, INFINITY, "holds inf at element 2"},
        {"optim.exp_avg.conv.weight", 0, -INFINITY, "holds -inf"},
        {"optim.exp_avg_sq.fc.bias", 3, -1e-9f, "cannot be negative"},
    };
    snapshot s = snap(b, ob);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        rewrite_value(good, bad, cases[k].tensor, cases[k].at, cases[k].v);
        CHECK_ERR(mg_checkpoint_load(bad, b, ob, NULL), MG_EFORMAT);
        printf("%s\n", mg_last_error());
        CHECK_MSG(strstr(mg_last_error(), cases[k].tensor) && strstr(mg_last_error(), cases[k].says),
                  "%s", mg_last_error());
        CHECK(same_as(b, ob, &s));
    }
    /* A negative first moment is a value Adam holds. */
    rewrite_value(good, bad, "optim.exp_avg.fc.bias", 3, -1e-3f);
    CHECK_OK(mg_checkpoint_load(bad, b, ob, NULL));
    /* Weights alone (--init) are refused the same way. */
    rewrite_value(good, bad, "conv.weight", 5, NAN);
    CHECK_ERR(mg_model_load_weights(bad, b, NULL, NULL), MG_EFORMAT);
    CHECK(strstr(mg_last_error(), "'conv.weight' holds nan at element 5"));
    /* A writer's optimizer took at least one step per training step. */
    mg_ckpt_meta meta = {.step = 5};
    CHECK_ERR(mg_checkpoint_save(bad, a, oa, &meta), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "took 2 steps in 5 training steps"));
    /* More (an asynchronous server's pushes): the file keeps the extra
     * ones, and loading restores the optimizer's count and says it. */
    meta = (mg_ckpt_meta){.step = 1};
    CHECK_OK(mg_checkpoint_save(bad, a, oa, &meta));
    mg_st_file *f;
    CHECK_OK(mg_st_open(bad, &f));
    CHECK(!strcmp(mg_st_meta(f, "optimizer_steps"), "2"));
    CHECK(!strcmp(mg_st_meta(f, "optimizer_extra_steps"), "1"));
    mg_st_close(f);
    mg_ckpt_meta got;
    CHECK_OK(mg_checkpoint_load(bad, b, ob, &got));
    CHECK(got.step == 1 && got.optimizer_steps == 2 && mg_optim_steps(ob) == 2);
    /* ... or a count the caller gives. */
    meta.optimizer_steps = 7;
    CHECK_OK(mg_checkpoint_save(bad, a, oa, &meta));
    CHECK_OK(mg_checkpoint_load(bad, b, ob, &got));
    CHECK(got.step == 1 && got.optimizer_steps == 7 && mg_optim_steps(ob) == 7);
    free_snap(&s);
    mg_optim_destroy(oa);
    mg_optim_destroy(ob);
    mg_model_destroy(a);
    mg_model_destroy(b);
}

/* Issue 30 item 7: weights of a larger model (--layers 2 --init of a
 * 4-layer checkpoint) are refused by default, naming what would be left
 * out, or left out and counted when the caller asks. */
TEST(ckpt_load_weights_says_what_it_leaves_out)
{
    mg_gpt_config big = mg_gpt_defaults(), small = big;
    big.layers = 4;
    small.layers = 2;
    big.dim = small.dim = 32;
    big.heads = small.heads = 2;
    big.ctx = small.ctx = 16;
    mg_model *a, *b;
    CHECK_OK(mg_model_create_gpt(&big, 1, &a));
    CHECK_OK(mg_model_create_gpt(&small, 2, &b));
    mg_optim_config c = mg_optim_defaults(MG_OPTIM_ADAMW, 1e-3f);
    mg_optim *oa;
    CHECK_OK(mg_optim_create(&c, mg_model_arena_size(a), &oa));
    const char *p = mgt_tpath("big.ckpt");
    CHECK_OK(mg_checkpoint_save(p, a, oa, NULL));
    snapshot s = snap(b, NULL);
    CHECK_ERR(mg_model_load_weights(p, b, NULL, NULL), MG_EMISMATCH);
    printf("%s\n", mg_last_error());
    CHECK(strstr(mg_last_error(), "h.2.") && strstr(mg_last_error(), "more") &&
          !strstr(mg_last_error(), "optim."));
    CHECK(same_as(b, NULL, &s));
    int left = -1;
    CHECK_OK(mg_model_load_weights(p, b, NULL, &left));
    int want = 0;
    for (int i = 0; i < mg_model_num_tensors(a); i++)
        want += !strncmp(mg_model_tensor(a, i)->name, "h.2.", 4) ||
                !strncmp(mg_model_tensor(a, i)->name, "h.3.", 4);
    CHECK_EQ(left, want);
    CHECK(!memcmp(mg_model_find(a, "h.1.mlp.c_fc.weight")->data,
                  mg_model_find(b, "h.1.mlp.c_fc.weight")->data,
                  mg_model_find(b, "h.1.mlp.c_fc.weight")->numel * sizeof(float)));
    free_snap(&s);
    mg_optim_destroy(oa);
    mg_model_destroy(a);
    mg_model_destroy(b);
}

TEST_T(ckpt_refuses_damaged_and_mismatched_files, 60)
{
    mg_model *a, *b, *mlp;
    CHECK_OK(mg_model_create("lenet5", 0, &a));
    CHECK_OK(mg_model_create("lenet5", 1, &b));
    CHECK_OK(mg_model_create("mlp", 0, &mlp));
    mg_optim *oa = sgd_for(a, 0.9f), *ob = sgd_for(b, 0.9f), *om = sgd_for(mlp, 0.9f);
    train_fake(a, oa, 2, 3);
    train_fake(b, ob, 1, 4);
    train_fake(mlp, om, 1, 5);
    const char *p = mgt_tpath("good.ckpt"), *q = mgt_tpath("bad.ckpt");
    CHECK_OK(mg_checkpoint_save(p, a, oa, NULL));
    snapshot sb = snap(b, ob);
    long steps_b = mg_optim_steps(ob);
    uint64_t rng_b = mg_model_rng_counter(b);
#define REFUSED(path, code, needle)                                                  \
    do {                                                                             \
        CHECK_ERR(mg_checkpoint_load(path, b, ob, NULL), code);                      \
        printf("%s\n", mg_last_error());                                             \
        CHECK_MSG(strstr(mg_last_error(), needle), "'%s' lacks '%s'", mg_last_error(), needle); \
        CHECK(same_as(b, ob, &sb) && mg_optim_steps(ob) == steps_b &&                \
              mg_model_rng_counter(b) == rng_b);                                     \
    } while (0)

    /* Truncated anywhere. */
    uint8_t *raw;
    size_t size = mgt_read_all(p, &raw);
    uint64_t hl;
    memcpy(&hl, raw, 8);
    const size_t cuts[] = {0, 7, 8, 8 + hl / 2, 8 + hl, 8 + hl + 1000, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        mgt_write_raw(q, raw, cuts[i]);
        REFUSED(q, MG_EFORMAT, "bad.ckpt");
    }
    /* Any flipped bit in the header (every 3rd byte, to keep it quick). */
    for (size_t i = 0; i < 8 + hl; i += 3) {
        raw[i] ^= 1;
        mgt_write_raw(q, raw, size);
        mg_status st = mg_checkpoint_load(q, b, ob, NULL);
        CHECK_MSG(st != MG_OK, "flip at byte %zu accepted", i);
        CHECK(same_as(b, ob, &sb));
        raw[i] ^= 1;
    }
    /* A flipped byte in the data, said to be damage or an edit (a file
     * edited in PyTorch was called damaged, found by a probe). */
    raw[size - 100] ^= 0x10;
    mgt_write_raw(q, raw, size);
    REFUSED(q, MG_EFORMAT, "checksum mismatch");
    CHECK(strstr(mg_last_error(), "damaged, or edited") &&
          strstr(mg_last_error(), "'multigrad.crc32'"));
    free(raw);

    /* Another model; a plain safetensors file; wrong optimizer. */
    CHECK_OK(mg_checkpoint_save(q, mlp, om, NULL));
    REFUSED(q, MG_EMISMATCH, "model 'mlp'");
    REFUSED(mgt_data("lenet5.safetensors"), MG_EFORMAT, "--init");
    CHECK_OK(mg_checkpoint_save(q, a, NULL, NULL));
    REFUSED(q, MG_EMISMATCH, "no optimizer state");
    mg_optim_config ac = mg_optim_defaults(MG_OPTIM_ADAM, 1e-3f);
    mg_optim *adam;
    CHECK_OK(mg_optim_create(&ac, mg_model_arena_size(a), &adam));
    CHECK_OK(mg_checkpoint_save(q, a, adam, NULL));
    REFUSED(q, MG_EMISMATCH, "adam");
    mg_optim *plain = sgd_for(b, 0);                 /* momentum state it cannot take */
    CHECK_ERR(mg_checkpoint_load(p, b, plain, NULL), MG_EMISMATCH);
    CHECK(strstr(mg_last_error(), "optim.momentum_buffer"));
    CHECK(same_as(b, ob, &sb));

    /* Well-formed files that are wrong in one way. */
    rewrite(p, q, drop_fc2_bias);
    REFUSED(q, MG_EMISMATCH, "'fc2.bias'");
    rewrite(p, q, reshape_conv1);
    REFUSED(q, MG_EMISMATCH, "[6, 25]");
    rewrite(p, q, conv1_bias_as_int);
    REFUSED(q, MG_EMISMATCH, "I32");
    rewrite(p, q, drop_momentum);
    REFUSED(q, MG_EMISMATCH, "optim.momentum_buffer.fc3.weight");
    rewrite(p, q, extra_tensor);
    REFUSED(q, MG_EMISMATCH, "fc4.weight");
    REFUSED(mgt_tpath("missing.ckpt"), MG_EIO, "missing.ckpt");

    /* And the good file still loads. */
    CHECK_OK(mg_checkpoint_load(p, b, ob, NULL));
    snapshot sa = snap(a, oa);
    CHECK(same_as(b, ob, &sa));
    free_snap(&sa);
    free_snap(&sb);
    mg_optim_destroy(oa);
    mg_optim_destroy(ob);
    mg_optim_destroy(om);
    mg_optim_destroy(adam);
    mg_optim_destroy(plain);
    mg_model_destroy(a);
    mg_model_destroy(b);
    mg_model_destroy(mlp);
}

TEST(ckpt_failed_save_keeps_previous)
{
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 0, &m));
    mg_optim *o = sgd_for(m, 0.9f);
    train_fake(m, o, 1, 1);
    const char *p = mgt_tpath("prev.ckpt");
    mg_ckpt_meta meta = {.step = 1};
    CHECK_OK(mg_checkpoint_save(p, m, o, &meta));
    snapshot s1 = snap(m, o);
    train_fake(m, o, 1, 2);
    meta.step = 2;
    /* The disk fills up while saving (a file size limit below the ~4 MB). */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim = old;
    lim.rlim_cur = 1 << 20;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    mg_status st = mg_checkpoint_save(p, m, o, &meta);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    CHECK_ERR(st, MG_EIO);
    CHECK_EQ(mgt_count_tmp_files(), 0);
    CHECK_ERR(mg_checkpoint_save(mgt_tpath("nodir/x.ckpt"), m, o, &meta), MG_EIO);
    /* A path that is not a file is never replaced (a FIFO here; as root
     * /dev/full was replaced by a file). */
    const char *fifo = mgt_tpath("fifo");
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_ERR(mg_checkpoint_save(fifo, m, o, &meta), MG_EINVAL);
    struct stat sb;
    CHECK(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode) && strstr(mg_last_error(), "a FIFO"));
    /* The previous checkpoint is intact and loads into a fresh model. */
    mg_model *n;
    CHECK_OK(mg_model_create("mlp", 5, &n));
    mg_optim *on = sgd_for(n, 0.9f);
    mg_ckpt_meta got;
    CHECK_OK(mg_checkpoint_load(p, n, on, &got));
    CHECK(same_as(n, on, &s1) && got.step == 1);
    free_snap(&s1);
    mg_optim_destroy(o);
    mg_optim_destroy(on);
    mg_model_destroy(m);
    mg_model_destroy(n);
}

/* A save through a symbolic link writes the link's target, as torch.save
 * does, and keeps the link (the link was replaced by a file and the
 * target kept the old checkpoint, found by a probe); a dangling link gets
 * its target made. */
TEST(ckpt_save_through_a_symlink_writes_its_target)
{
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 5, &m));
    mg_optim *o = sgd_for(m, 0.9f);
    CHECK(mkdir(mgt_tpath("far"), 0700) == 0 && mkdir(mgt_tpath("run"), 0700) == 0);
    CHECK_OK(mg_checkpoint_save(mgt_tpath("far/ck.st"), m, o, &(mg_ckpt_meta){.epoch = 1}));
    CHECK(symlink("../far/ck.st", mgt_tpath("run/ck.st")) == 0);
    CHECK(symlink("../far/new.st", mgt_tpath("run/new.st")) == 0);   /* dangling */
    for (int k = 0; k < 2; k++) {
        const char *link = mgt_tpath(k ? "run/new.st" : "run/ck.st");
        CHECK_OK(mg_checkpoint_save(link, m, o, &(mg_ckpt_meta){.epoch = 2}));
        struct stat sb;
        CHECK_MSG(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "%s is no longer a link", link);
        mg_ckpt_meta got;
        CHECK_OK(mg_checkpoint_load(mgt_tpath(k ? "far/new.st" : "far/ck.st"), m, o, &got));
        CHECK_EQ(got.epoch, 2);
    }
    CHECK_EQ(mgt_count_tmp_files(), 0);
    mg_optim_destroy(o);
    mg_model_destroy(m);
}

TEST(ckpt_load_weights_from_pytorch_export)
{
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", 3, &m));
    mg_st_file *ref;
    CHECK_OK(mg_st_open(mgt_data("lenet5.safetensors"), &ref));
    CHECK_OK(mg_model_load_weights(mgt_data("lenet5.safetensors"), m, "init.", NULL));
    char name[128];
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        snprintf(name, sizeof name, "init.%s", p->name);
        const mg_st_tensor *t = mg_st_find(ref, name);
        CHECK(t && t->nbytes == p->numel * 4 && memcmp(t->data, p->data, t->nbytes) == 0);
    }
    CHECK_OK(mg_model_load_weights(mgt_data("lenet5.safetensors"), m, "final.", NULL));
    CHECK(memcmp(mg_st_find(ref, "final.fc3.bias")->data, mg_model_find(m, "fc3.bias")->data,
                 40) == 0);
    /* Without the prefix nothing matches: refused, model unchanged. */
    snapshot s = snap(m, NULL);
    CHECK_ERR(mg_model_load_weights(mgt_data("lenet5.safetensors"), m, NULL, NULL), MG_EMISMATCH);
    CHECK(strstr(mg_last_error(), "'conv1.weight'"));
    mg_model *mlp;
    CHECK_OK(mg_model_create("mlp", 0, &mlp));
    CHECK_ERR(mg_model_load_weights(mgt_data("lenet5.safetensors"), mlp, "init.", NULL), MG_EMISMATCH);
    CHECK(strstr(mg_last_error(), "shape"));
    CHECK(same_as(m, NULL, &s));

    /* F64, F16 and BF16 exports are converted to float. */
    int nt = mg_model_num_tensors(m);
    mg_st_tensor *t = calloc((size_t)nt, sizeof *t);
    double *d64[16];
    uint16_t *bf[16];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < nt; i++) {
            const mg_param *p = mg_model_tensor(m, i);
            t[i] = (mg_st_tensor){p->name, pass ? MG_ST_BF16 : MG_ST_F64, p->ndim, {0}, NULL,
                                  p->numel * (pass ? 2 : 8)};
            for (int dd = 0; dd < p->ndim; dd++) t[i].shape[dd] = p->shape[dd];
            d64[i] = malloc(p->numel * 8);
            bf[i] = malloc(p->numel * 2);
            for (size_t j = 0; j < p->numel; j++) {
                d64[i][j] = (double)p->data[j] * 0.5 + 1e-12;
                uint32_t bits;
                memcpy(&bits, &p->data[j], 4);
                bf[i][j] = (uint16_t)(bits >> 16);
            }
            t[i].data = pass ? (void *)bf[i] : (void *)d64[i];
        }
        CHECK_OK(mg_st_write(mgt_tpath("conv.st"), t, nt, NULL, 0));
        mg_model *c;
        CHECK_OK(mg_model_create("lenet5", 9, &c));
        CHECK_OK(mg_model_load_weights(mgt_tpath("conv.st"), c, "", NULL));
        for (int i = 0; i < nt; i++) {
            const mg_param *p = mg_model_tensor(c, i);
            for (size_t j = 0; j < p->numel; j++) {
                uint32_t bits = (uint32_t)bf[i][j] << 16;
                float want;
                memcpy(&want, &bits, 4);
                if (!pass) want = (float)d64[i][j];
                CHECK(memcmp(&p->data[j], &want, 4) == 0);
            }
            free(d64[i]);
            free(bf[i]);
        }
        mg_model_destroy(c);
    }
    /* F16: exact values including a subnormal and the largest finite
     * (infinity is refused: ckpt_refuses_values_no_model_holds). */
    mg_model *c;
    CHECK_OK(mg_model_create("lenet5", 9, &c));
    for (int i = 0; i < nt; i++) {
        const mg_param *p = mg_model_tensor(c, i);
        uint16_t *h = calloc(p->numel, 2);
        const uint16_t pat[6] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x3555, 0x8400};
        for (size_t j = 0; j < p->numel; j++) h[j] = pat[j % 6];
        t[i].dtype = MG_ST_F16;
        t[i].nbytes = p->numel * 2;
        t[i].data = h;
    }
    CHECK_OK(mg_st_write(mgt_tpath("f16.st"), t, nt, NULL, 0));
    for (int i = 0; i < nt; i++) free((void *)t[i].data);
    CHECK_OK(mg_model_load_weights(mgt_tpath("f16.st"), c, NULL, NULL));
    const float *w = mg_model_find(c, "fc1.weight")->data;
    CHECK(w[0] == 1.0f && w[1] == -2.0f && w[2] == 0x1p-24f && w[3] == 65504.0f);
    CHECK(w[4] == 0x1.554p-2f && w[5] == -0x1p-14f);
    mg_model_destroy(c);
    free(t);
    free_snap(&s);
    mg_st_close(ref);
    mg_model_destroy(m);
    mg_model_destroy(mlp);
}

/* PyTorch reads our checkpoint: load_state_dict(strict=True) takes the
 * parameters as they are, the momentum buffers load into torch.optim.SGD,
 * and the forward of a fixed input matches ours. */
static const char *py_script =
    "import json, struct, sys\n"
    "import torch, torch.nn as nn, torch.nn.functional as F\n"
    "torch.set_num_threads(1)\n"
    "raw = open(sys.argv[1], 'rb').read()\n"
    "n = struct.unpack('<Q', raw[:8])[0]\n"
    "hdr = json.loads(raw[8:8 + n]); meta = hdr.pop('__metadata__'); data = raw[8 + n:]\n"
    "def tensor(k):\n"
    "    e = hdr[k]; b, t = e['data_offsets']; assert e['dtype'] == 'F32'\n"
    "    return torch.frombuffer(bytearray(data[b:t]), dtype=torch.float32).reshape(e['shape'])\n"
    "class LeNet5(nn.Module):\n"
    "    def __init__(s):\n"
    "        super().__init__()\n"
    "        s.conv1 = nn.Conv2d(1, 6, 5, padding=2); s.conv2 = nn.Conv2d(6, 16, 5)\n"
    "        s.fc1 = nn.Linear(400, 120); s.fc2 = nn.Linear(120, 84); s.fc3 = nn.Linear(84, 10)\n"
    "    def forward(s, x):\n"
    "        x = F.max_pool2d(F.relu(s.conv1(x)), 2); x = F.max_pool2d(F.relu(s.conv2(x)), 2)\n"
    "        x = x.flatten(1); x = F.relu(s.fc1(x)); x = F.relu(s.fc2(x)); return s.fc3(x)\n"
    "m = LeNet5()\n"
    "sd = {k: tensor(k) for k in hdr if not k.startswith('optim.')}\n"
    "m.load_state_dict(sd, strict=True)\n"
    "opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)\n"
    "names = meta['parameters'].split(',')\n"
    "st = opt.state_dict()\n"
    "st['state'] = {i: {'momentum_buffer': tensor('optim.momentum_buffer.' + k)}\n"
    "               for i, k in enumerate(names)}\n"
    "opt.load_state_dict(st)\n"
    "assert meta['model'] == 'lenet5' and meta['optimizer'] == 'sgd'\n"
    "x = (torch.arange(2 * 784, dtype=torch.float32).reshape(2, 1, 28, 28) % 17) / 8 - 1\n"
    "with torch.no_grad(): y = m(x)\n"
    "print(' '.join('%.9g' % v for v in y.flatten().tolist()))\n"
    "b = opt.state[m.fc1.weight]['momentum_buffer']\n"
    "print('%.17g %.17g' % (b.double().sum().item(), m.conv2.weight.double().sum().item()))\n";

TEST_T(ckpt_pytorch_loads_our_checkpoint, 120)
{
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        mgt_skip("/usr/bin/python3 cannot import torch");
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", 0, &m));
    mg_optim *o = sgd_for(m, 0.9f);
    train_fake(m, o, 2, 7);
    const char *ck = mgt_tpath("interop.ckpt"), *py = mgt_tpath("load.py");
    CHECK_OK(mg_checkpoint_save(ck, m, o, NULL));
    FILE *f = fopen(py, "w");
    CHECK(f && fputs(py_script, f) >= 0 && fclose(f) == 0);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s", py, ck);
    FILE *pp = popen(cmd, "r");
    CHECK(pp != NULL);
    double y[20], bsum, wsum;
    for (int i = 0; i < 20; i++) CHECK(fscanf(pp, "%lf", &y[i]) == 1);
    CHECK(fscanf(pp, "%lf %lf", &bsum, &wsum) == 2);
    CHECK_EQ(pclose(pp), 0);

    static float x[2 * 784];
    for (int i = 0; i < 2 * 784; i++) x[i] = (float)(i % 17) / 8 - 1;
    CHECK_OK(mg_model_reserve(m, 2));
    const float *logits = mg_model_forward(m, x, 2);
    for (int i = 0; i < 20; i++) CHECK_CLOSE(logits[i], y[i], 1e-5, 1e-6);
    const mg_param *fc1 = mg_model_find(m, "fc1.weight"), *c2 = mg_model_find(m, "conv2.weight");
    const float *buf = mg_optim_state(o, 0, NULL) + fc1->offset;
    double bs = 0, ws = 0;
    for (size_t i = 0; i < fc1->numel; i++) bs += buf[i];
    for (size_t i = 0; i < c2->numel; i++) ws += c2->data[i];
    CHECK_CLOSE(bs, bsum, 1e-9, 1e-9);
    CHECK_CLOSE(ws, wsum, 1e-9, 1e-9);
    mg_optim_destroy(o);
    mg_model_destroy(m);
}
