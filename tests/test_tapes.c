/* Tapes, units and the training step: several tapes in flight on one
 * model, recomputation bit for bit, the step through every strategy in
 * one process, and no allocation after the first step. */
#include <string.h>
#include "harness.h"
#include "multigrad/multigrad.h"

/* A small gpt-mini and an image model with dropout and batch norm: the
 * state a forward draws (dropout masks) and updates (running statistics). */
static mg_model *small_gpt(uint64_t seed)
{
    mg_gpt_config c = {.layers = 2, .dim = 32, .heads = 2, .ctx = 16, .vocab = 64};
    mg_model *m;
    CHECK_OK(mg_model_create_gpt(&c, seed, &m));
    return m;
}

static mg_model *drop_bn(uint64_t seed)
{
    mg_layer *block[] = {mg_layer_conv2d("conv", 1, 4, 3, 1, 1, true, MG_POOL_MAX),
                         mg_layer_batchnorm2d("bn", 4)};
    mg_layer *l[] = {mg_layer_sequential("features", block, 2), mg_layer_flatten("flat"),
                     mg_layer_dropout("drop", 0.3f), mg_layer_linear("fc", 4 * 4 * 4, 5, false)};
    mg_model *m;
    CHECK_OK(mg_model_create_from("drop-bn", mg_layer_sequential(NULL, l, 4), 1, 8, 8, seed, &m));
    mg_model_set_dropout_seed(m, 99);
    return m;
}

typedef struct {
    int n, in;           /* samples per micro-batch, input floats per sample */
    int labels;          /* per sample */
    float x[4][9 * 28 * 28];
    int32_t y[4][8 * 16];
} batches;

/* Four micro-batches for model m: tokens or images with labels. */
static void fill(batches *b, mg_model *m, int n)
{
    int c, h, w;
    mg_model_input_shape(m, &c, &h, &w);
    b->n = n;
    b->in = c * h * w;
    b->labels = mg_model_positions(m);
    bool lm = b->labels > 1;
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < n * b->in; i++) {
            unsigned v = (unsigned)(i * 2654435761u + (unsigned)k * 97u);
            if (lm) ((int32_t *)b->x[k])[i] = (int32_t)(v % 64u);
            else b->x[k][i] = (float)(v % 1000u) / 500.0f - 1.0f;
        }
        for (int i = 0; i < n * b->labels; i++)
            b->y[k][i] = (int32_t)(((unsigned)i * 7u + (unsigned)k) %
                                   (unsigned)mg_model_classes(m));
    }
}

static bool same(const float *a, const float *b, size_t n)
{
    return !memcmp(a, b, n * sizeof(float));
}

/* Forwards of several micro-batches held at once, then their backwards,
 * give what one at a time gives — bit for bit. */
static void several_tapes(mg_model *(*make)(uint64_t), int n)
{
    mg_model *a = make(1), *b = make(1);
    static batches bt;
    fill(&bt, a, n);
    size_t na = mg_model_arena_size(a), out = (size_t)n * mg_model_positions(a) *
                                               (size_t)mg_model_classes(a);
    mg_tape *t[3];
    for (int k = 0; k < 3; k++) CHECK_OK(mg_tape_create(a, n, &t[k]));
    float *logits0 = malloc(out * sizeof(float));
    mg_model_zero_grad(a);
    for (int k = 0; k < 3; k++) {
        CHECK(mg_tape_forward(t[k], bt.x[k], n) != NULL);
        if (k == 0) memcpy(logits0, mg_tape_logits(t[0]), out * sizeof(float));
    }
    CHECK(same(logits0, mg_tape_logits(t[0]), out));   /* untouched by the others */
    for (int k = 0; k < 3; k++) {
        mg_tape_loss(t[k], bt.y[k], NULL);
        mg_tape_backward(t[k]);
    }
    mg_model_zero_grad(b);
    CHECK_OK(mg_model_reserve(b, n));
    for (int k = 0; k < 3; k++) {
        CHECK(mg_model_forward(b, bt.x[k], n) != NULL);
        if (k == 0) CHECK(same(logits0, mg_tape_logits(mg_model_tape(b)), out));
        mg_model_loss(b, bt.y[k], NULL);
        mg_model_backward(b);
    }
    CHECK_MSG(same(mg_model_grads(a), mg_model_grads(b), na), "%s: gradients differ",
              mg_model_name(a));
    CHECK(same(mg_model_buffers(a), mg_model_buffers(b), mg_model_buffer_size(a)));
    CHECK_EQ(mg_model_rng_counter(a), mg_model_rng_counter(b));
    for (int k = 0; k < 3; k++) mg_tape_destroy(t[k]);
    free(logits0);
    mg_model_destroy(a);
    mg_model_destroy(b);
}

TEST(tapes_several_in_flight_equal_one_at_a_time)
{
    several_tapes(small_gpt, 3);
    several_tapes(drop_bn, 6);
}

/* Borrowed gradients kept apart: with the model's window set, the tied
 * head's part of the embedding's gradient goes to the buffer and the
 * arena keeps the embedding's own; they add up to the usual gradient (to
 * rounding: the usual one adds the parts row by row), the rest of the
 * arena is the same bits, and a tape with its own gradient arena does
 * not take the model's window. */
TEST(tapes_borrowed_gradients_kept_apart)
{
    mg_model *m = small_gpt(5);
    static batches bt;
    fill(&bt, m, 2);
    size_t n = mg_model_arena_size(m), lo = 0, hi = 0;
    for (int u = 0; u < mg_model_num_units(m); u++)
        if (mg_model_unit(m, u).borrows >= 0)
            mg_model_unit_range(m, mg_model_unit(m, u).borrows, &lo, &hi);
    CHECK(hi > lo);
    float *whole = malloc(n * sizeof(float)), *part = calloc(hi - lo, sizeof(float));
    float *own = calloc(n, sizeof(float));
    mg_model_zero_grad(m);
    CHECK(mg_model_forward(m, bt.x[0], 2) != NULL);
    mg_model_loss(m, bt.y[0], NULL);
    mg_model_backward(m);
    memcpy(whole, mg_model_grads(m), n * sizeof(float));
    mg_model_set_borrowed_grads(m, lo, hi, part);
    mg_model_zero_grad(m);
    CHECK(mg_model_forward(m, bt.x[0], 2) != NULL);
    mg_model_loss(m, bt.y[0], NULL);
    mg_model_backward(m);
    const float *g = mg_model_grads(m);
    CHECK(same(g, whole, lo) && same(g + hi, whole + hi, n - hi));
    double err = 0, size = 0, head = 0;
    for (size_t i = lo; i < hi; i++) {
        double d = (double)g[i] + part[i - lo] - whole[i];
        err += d * d;
        size += (double)whole[i] * whole[i];
        head += (double)part[i - lo] * part[i - lo];
    }
    CHECK_MSG(head > 0 && err <= 1e-10 * size, "head part %g, error %g of %g", head, err, size);
    /* A tape of its own arena: the usual sum, the window untouched. */
    mg_tape *t;
    CHECK_OK(mg_tape_create(m, 2, &t));
    mg_tape_set_grads(t, own);
    memset(part, 0, (hi - lo) * sizeof(float));
    CHECK(mg_tape_forward(t, bt.x[0], 2) != NULL);
    mg_tape_loss(t, bt.y[0], NULL);
    mg_tape_backward(t);
    CHECK(same(own, whole, n));
    for (size_t i = 0; i < hi - lo; i++) CHECK(part[i] == 0);
    mg_tape_destroy(t);
    mg_model_set_borrowed_grads(m, 0, 0, NULL);
    free(whole);
    free(part);
    free(own);
    mg_model_destroy(m);
}

/* Three SGD steps with and without recomputation: the same gradients,
 * parameters and running statistics, bit for bit, on less memory. */
static void recompute_same(mg_model *a, mg_model *b, int n)
{
    static batches bt;
    fill(&bt, a, n);
    mg_model_set_recompute(b, true);
    CHECK(mg_model_recompute(b) && !mg_model_recompute(a));
    mg_tape *ta, *tb;
    CHECK_OK(mg_tape_create(a, n, &ta));
    CHECK_OK(mg_tape_create(b, n, &tb));
    printf("%s: tape %.2f MB, recomputing %.2f MB\n", mg_model_name(a), mg_tape_bytes(ta) / 1e6,
           mg_tape_bytes(tb) / 1e6);
    CHECK(mg_tape_bytes(tb) < mg_tape_bytes(ta));
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.1f);
    oc.momentum = 0.9f;
    mg_optim *oa, *ob;
    size_t na = mg_model_arena_size(a);
    CHECK_OK(mg_optim_create(&oc, na, &oa));
    CHECK_OK(mg_optim_create(&oc, na, &ob));
    for (int s = 0; s < 3; s++) {
        mg_model *m[2] = {a, b};
        mg_tape *t[2] = {ta, tb};
        mg_optim *o[2] = {oa, ob};
        float loss[2];
        for (int i = 0; i < 2; i++) {
            mg_model_zero_grad(m[i]);
            CHECK(mg_tape_forward(t[i], bt.x[s], n) != NULL);
            loss[i] = mg_tape_loss(t[i], bt.y[s], NULL);
            mg_tape_backward(t[i]);
        }
        CHECK(loss[0] == loss[1]);
        CHECK_MSG(same(mg_model_grads(a), mg_model_grads(b), na), "%s step %d: gradients differ",
                  mg_model_name(a), s);
        for (int i = 0; i < 2; i++)
            mg_optim_step(o[i], mg_model_params(m[i]), mg_model_grads(m[i]), 0.1f);
    }
    CHECK(same(mg_model_params(a), mg_model_params(b), na));
    CHECK(same(mg_model_buffers(a), mg_model_buffers(b), mg_model_buffer_size(a)));
    mg_tape_destroy(ta);
    mg_tape_destroy(tb);
    mg_optim_destroy(oa);
    mg_optim_destroy(ob);
    mg_model_destroy(a);
    mg_model_destroy(b);
}

TEST(tapes_recompute_is_bit_identical)
{
    recompute_same(small_gpt(3), small_gpt(3), 4);
    recompute_same(drop_bn(3), drop_bn(3), 8);
    mg_model *a, *b;
    CHECK_OK(mg_model_create("lenet-d2l", 5, &a));
    CHECK_OK(mg_model_create("lenet-d2l", 5, &b));
    recompute_same(a, b, 2);
}

/* A batch larger than the tape is refused with a message, never run on
 * memory of the wrong size. */
TEST(tapes_batch_larger_than_tape_is_refused)
{
    mg_model *m = small_gpt(0);
    mg_tape *t;
    CHECK_OK(mg_tape_create(m, 2, &t));
    static batches bt;
    fill(&bt, m, 3);
    CHECK(mg_tape_forward(t, bt.x[0], 3) == NULL);
    CHECK(strstr(mg_last_error(), "does not fit a tape made for 2"));
    CHECK(mg_tape_forward(t, bt.x[0], 2) != NULL);
    CHECK_ERR(mg_tape_create(m, 0, &t), MG_EINVAL);
    mg_tape_destroy(t);
    mg_model_destroy(m);
}

typedef struct {
    batches *b;
    int k, micro;
} feed;

static bool next_batch(void *ud, mg_micro_batch *out)
{
    feed *f = ud;
    if (f->k >= f->micro) return false;
    int k = f->k++;
    *out = (mg_micro_batch){f->b->x[k], f->b->y[k], f->b->n, false};
    return true;
}

/* One step of `accumulate` micro-batches through strategy kind. */
static void step_with(mg_model *m, mg_strategy_kind kind, batches *b, int accumulate,
                      mg_strategy **s, mg_optim **o, mg_step_result *r)
{
    if (!*s) {
        mg_strategy_options so = mg_strategy_defaults(kind);
        so.max_batch = b->n;
        so.workers = 3;
        CHECK_OK(mg_strategy_create(m, &so, s));
        mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
        oc.momentum = 0.9f;
        CHECK_OK(mg_strategy_optim(*s, &oc, o));
    }
    feed f = {b, 0, accumulate};
    mg_step_options opt = {.accumulate = accumulate, .lr = 0.05f, .clip_grad = 1.0f};
    CHECK_OK(mg_train_step(*s, *o, &opt, next_batch, &f, r));
    CHECK_EQ(r->micro, accumulate);
}

static mg_model *lenet5(uint64_t seed)
{
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", seed, &m));
    return m;
}

/* The step through DataParallel (3 threads on one model) equals the
 * single-process step with and without accumulation (models without
 * batch norm and dropout, whose statistics and masks are per thread as in
 * torch); after the first step neither allocates. */
TEST(tapes_train_step_dp_equals_single_and_allocates_nothing)
{
    mg_model *(*make[])(uint64_t) = {small_gpt, lenet5};
    int n[] = {6, 8};
    for (int z = 0; z < 2; z++)
        for (int acc = 1; acc <= 2; acc++) {
            static batches b;
            mg_model *m[2] = {make[z](7), make[z](7)};
            fill(&b, m[0], n[z]);
            mg_strategy *s[2] = {NULL, NULL};
            mg_optim *o[2] = {NULL, NULL};
            mg_strategy_kind kind[2] = {MG_STRATEGY_SINGLE, MG_STRATEGY_DP};
            for (int step = 0; step < 3; step++)
                for (int i = 0; i < 2; i++) {
                    mg_step_result r;
                    long before = mgt_allocs();
                    step_with(m[i], kind[i], &b, acc, &s[i], &o[i], &r);
                    if (step > 0)
                        CHECK_MSG(mgt_allocs() == before, "%s, %s: %ld allocations in step %d",
                                  mg_model_name(m[i]), mg_strategy_name(s[i]),
                                  mgt_allocs() - before, step);
                }
            size_t na = mg_model_num_params(m[0]);
            float *va = malloc(na * sizeof(float)), *vb = malloc(na * sizeof(float));
            mg_model_to_vector(m[0], mg_model_params(m[0]), va);
            mg_model_to_vector(m[1], mg_model_params(m[1]), vb);
            double worst = 0;
            for (size_t i = 0; i < na; i++) worst = fmax(worst, fabs((double)va[i] - vb[i]));
            printf("%s accumulate %d: dp vs single, largest difference %.3g\n",
                   mg_model_name(m[0]), acc, worst);
            CHECK_MSG(worst <= 1e-5, "dp differs from one process by %g", worst);
            for (int i = 0; i < 2; i++) {
                mg_optim_destroy(o[i]);
                mg_strategy_destroy(s[i]);
                mg_model_destroy(m[i]);
            }
            free(va);
            free(vb);
        }
}

/* A model run as stages: tapes of unit ranges chained (each stage's output
 * the next one's input, each stage's input gradient the previous one's
 * output gradient) give the whole tape's logits, loss, gradients and
 * running statistics bit for bit, recomputing or not. cut: the stages' first units, then the number of units. */
static void stages_equal_whole(mg_model *(*make)(uint64_t), int n, const int *cut, int S,
                               bool recompute)
{
    mg_model *a = make(4), *b = make(4);
    mg_model_set_recompute(a, recompute);
    mg_model_set_recompute(b, recompute);
    static batches bt;
    fill(&bt, a, n);
    size_t na = mg_model_arena_size(a);
    mg_tape *whole, *st[4];
    CHECK_OK(mg_tape_create(a, n, &whole));
    size_t sum = 0;
    for (int s = 0; s < S; s++) {
        CHECK_OK(mg_tape_create_range(b, n, cut[s], cut[s + 1], &st[s]));
        int f, l;
        size_t in, out;
        mg_tape_range(st[s], &f, &l, &in, &out);
        CHECK(f == cut[s] && l == cut[s + 1] && in > 0 && out > 0);
        sum += mg_tape_bytes(st[s]);
    }
    printf("%s (%d stages%s): whole tape %.3f MB, stages %.3f MB together\n", mg_model_name(a),
           S, recompute ? ", recomputing" : "", mg_tape_bytes(whole) / 1e6, sum / 1e6);
    for (int k = 0; k < 2; k++) {
        mg_model_zero_grad(a);
        mg_model_zero_grad(b);
        mg_tape_pin_step(whole, 7 + k);
        CHECK(mg_tape_forward(whole, bt.x[k], n) != NULL);
        float la = mg_tape_loss(whole, bt.y[k], NULL);
        mg_tape_backward(whole);
        const float *x = bt.x[k];
        for (int s = 0; s < S; s++) {
            mg_tape_pin_step(st[s], 7 + k);
            CHECK((x = mg_tape_forward(st[s], x, n)) != NULL);
        }
        size_t out = (size_t)n * mg_model_positions(a) * (size_t)mg_model_classes(a);
        CHECK(same(mg_tape_logits(whole), mg_tape_logits(st[S - 1]), out));
        float lb = mg_tape_loss(st[S - 1], bt.y[k], NULL);
        CHECK(la == lb);
        mg_tape_backward(st[S - 1]);
        /* The second step writes each stage's output gradient into its
         * tape first (mg_tape_output_grad), as a pipeline receives it. */
        for (int s = S - 2; s >= 0; s--) {
            const float *dout = mg_tape_input_grad(st[s + 1]);
            if (k == 1) {
                size_t per;
                mg_tape_range(st[s], NULL, NULL, NULL, &per);
                memcpy(mg_tape_output_grad(st[s]), dout, per * (size_t)n * sizeof(float));
                dout = mg_tape_output_grad(st[s]);
            }
            mg_tape_backward_from(st[s], dout);
        }
        CHECK(mg_tape_input_grad(st[0]) == NULL);
        CHECK_MSG(same(mg_model_grads(a), mg_model_grads(b), na), "%s: gradients differ",
                  mg_model_name(a));
        CHECK(same(mg_model_buffers(a), mg_model_buffers(b), mg_model_buffer_size(a)));
    }
    for (int s = 0; s < S; s++) mg_tape_destroy(st[s]);
    mg_tape_destroy(whole);
    mg_model_destroy(a);
    mg_model_destroy(b);
}

TEST(tapes_stages_chained_equal_the_whole_tape)
{
    /* gpt: wte, h.0, h.1, ln_f, head (tied to wte across the cut). */
    int g2[] = {0, 2, 5}, g3[] = {0, 1, 3, 5}, g4[] = {0, 1, 2, 4, 5};
    int d2[] = {0, 1, 5}, d3[] = {0, 2, 4, 5};   /* conv, bn, flat, drop, fc */
    for (int r = 0; r < 2; r++) {
        stages_equal_whole(small_gpt, 3, g2, 2, r);
        stages_equal_whole(small_gpt, 3, g3, 3, r);
        stages_equal_whole(small_gpt, 2, g4, 4, r);
        stages_equal_whole(drop_bn, 5, d2, 2, r);
        stages_equal_whole(drop_bn, 5, d3, 3, r);
    }
    mg_model *l = lenet5(0);
    int nu = mg_model_num_units(l);
    mg_model_destroy(l);
    int e2[] = {0, nu / 2, nu}, e4[] = {0, 1, nu / 2, nu - 1, nu};
    stages_equal_whole(lenet5, 4, e2, 2, false);
    stages_equal_whole(lenet5, 4, e4, 4, true);
    mg_model *m = small_gpt(0);
    mg_tape *t;
    CHECK_ERR(mg_tape_create_range(m, 2, 3, 3, &t), MG_EINVAL);
    CHECK_ERR(mg_tape_create_range(m, 2, 0, 6, &t), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "not a range"));
    mg_model_destroy(m);
}
