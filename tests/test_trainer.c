/* The trainer as a library (train.h, issue 31 item 5): in this process, a
 * language model's loop calls back per step and per evaluation, writes
 * its log and checkpoint and resumes from them as one run; a config
 * missing what it needs comes back as one line, not an exit; and the
 * example program trains a model of its own under a pipeline with ZeRO-2
 * replicas as one process does. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include "harness.h"
#include "idx_files.h"
#include "multigrad/multigrad.h"

typedef struct {
    int progress, rows;
    long last_step;
    double last_val;
} seen;

static void on_progress(const mg_train_progress *p, void *ud)
{
    seen *s = ud;
    s->progress++;
    CHECK_EQ(p->done, p->step - (p->step > 4 ? 4 : 0));
    CHECK(strcmp(p->unit, "tok") == 0 && isfinite(p->loss));
}

static void on_row(const mg_train_row *r, void *ud)
{
    seen *s = ud;
    s->rows++;
    s->last_step = r->step;
    s->last_val = r->val_loss;
    CHECK(isfinite(r->val_loss) && fabs(r->val_ppl - exp(r->val_loss)) < 1e-9 * r->val_ppl);
    CHECK(r->step == 0 ? isnan(r->train_loss) : isfinite(r->train_loss) && r->per_s > 0);
}

static mg_train_config small_gpt(seen *s, const char *dir, char *ck, char *log)
{
    mg_train_config c;
    CHECK_OK(mg_train_config_defaults("gpt-mini", &c));
    c.gpt.layers = 2;
    c.gpt.dim = 64;
    c.gpt.ctx = 64;
    c.batch = 12;
    c.eval_windows = 16;
    c.steps = 4;
    c.eval_every = 2;
    snprintf(ck, 512, "%s/t.st", dir);
    snprintf(log, 512, "%s/t.csv", dir);
    c.save = ck;
    c.log = log;
    c.on_progress = on_progress;
    c.on_row = on_row;
    c.ud = s;
    return c;
}

/* An image model's epochs: the steps counted are the batches (it counted
 * the empty call that ends an epoch as one more; a probe). */
TEST_T(trainer_counts_the_steps_of_epochs, 60)
{
    const char *dir = mgt_tmpdir();
    CHECK_EQ(mgt_cut_fashion(mgt_fashion_dir(), dir, 100, 20), 0);
    mg_train_config c;
    CHECK_OK(mg_train_config_defaults("mlp", &c));
    c.data = dir;
    c.batch = 32;   /* 32, 32, 32, 4 */
    c.epochs = 2;
    mg_trainer *t;
    mg_train_summary sum;
    CHECK_OK(mg_trainer_create(&c, &t));
    CHECK_OK(mg_trainer_run(t, &sum));
    CHECK_MSG(sum.steps_run == 8, "%ld steps", sum.steps_run);
    mg_trainer_destroy(t);
}

TEST_T(trainer_loop_calls_back_logs_and_resumes, 120)
{
    const char *dir = mgt_tmpdir();
    char ck[512], log[512];
    seen s = {0};
    mg_train_config c = small_gpt(&s, dir, ck, log);
    mg_trainer *t;
    mg_train_summary sum;
    CHECK_OK(mg_trainer_create(&c, &t));
    CHECK_OK(mg_trainer_run(t, &sum));
    /* Evaluations at steps 0, 2 and 4; a progress call per step. */
    CHECK_EQ(s.rows, 3);
    CHECK_EQ(s.progress, 4);
    CHECK_EQ(sum.steps_run, 4);
    CHECK(sum.last.step == 4 && sum.last.val_loss == s.last_val && sum.per_s > 0);
    mg_trainer_destroy(t);
    /* Resumed to 6 steps: one more evaluation, the log goes on. */
    c.resume = ck;
    c.steps = 6;
    s = (seen){0};
    CHECK_OK(mg_trainer_create(&c, &t));
    CHECK_EQ(mg_trainer_get_info(t).start_step, 4);
    CHECK_OK(mg_trainer_run(t, &sum));
    CHECK(s.rows == 1 && s.last_step == 6 && sum.steps_run == 2);
    /* A second run of the trainer has nothing left: it trained and
     * logged the steps again (found by a probe). */
    CHECK_OK(mg_trainer_run(t, &sum));
    CHECK(s.rows == 1 && sum.steps_run == 0 && mg_trainer_get_info(t).start_step == 6);
    mg_trainer_destroy(t);
    char text[4096] = "";
    FILE *f = fopen(log, "r");
    CHECK(f != NULL);
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    CHECK_MSG(lines == 5 && !strncmp(text, "step,train_loss,val_loss", 24) &&
              strstr(text, "\n6,"), "%s", text);
    /* A checkpoint of another global batch is refused, one line. */
    c.batch = 24;
    CHECK(mg_trainer_create(&c, &t) == MG_EMISMATCH);
    CHECK_MSG(strstr(mg_last_error(), "global batch of 12"), "%s", mg_last_error());
}

static mg_status never_whole(void *ud, mg_model **out)
{
    (void)ud;
    (void)out;
    return mg_error(MG_EINVAL, "not called");
}

static mg_status never_split(void *ud, mg_tp_split tp, mg_model **out)
{
    (void)tp;
    return never_whole(ud, out);
}

TEST(trainer_config_mistakes_come_back_as_one_line)
{
    static const struct { const char *what, *msg; } cases[] = {
        {"no batch", "needs a batch"},
        {"optimizer", "--optimizer"},
        {"resume and init", "--resume and --init both set"},
        {"pipeline flags", "give --mesh pp=P"},
        {"two factories", "make and make_split both given"},
        {"threads", "threads -3: give 1 to 1024"},   /* it aborted in mg_set_threads */
        {"no model", "has no model"},
        {"no heads", "heads 0"},                    /* a division by zero */
        {"small vocab", "vocab 100: the text's tokens are its bytes"},   /* aborted in run */
        {"lr nan", "lr nan, optimizer sgd"},        /* the message said no values */
        {"momentum inf", "momentum is inf"},
        {"beta2 1.5", "--betas 0.9,1.5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mg_train_config c;
        CHECK_OK(mg_train_config_defaults(i == 7 || i == 8 ? "gpt-mini" : "mlp", &c));
        if (i == 0) c.batch = 0;
        if (i == 1) c.optimizer = "adagrad";
        if (i == 2) c.resume = c.init = "x.st";
        if (i == 3) c.micro_batches = 2;
        if (i == 4) c.make = never_whole, c.make_split = never_split;
        if (i == 5) c.threads = -3;
        if (i == 6) c.model = NULL;
        if (i == 7) c.gpt.heads = 0;
        if (i == 8) c.gpt.vocab = 100;
        if (i == 9) c.lr = NAN;
        if (i == 10) c.momentum = INFINITY;
        if (i == 11) c.optimizer = "adam", c.beta1 = 0.9f, c.beta2 = 1.5f;
        mg_trainer *t = (mg_trainer *)1;
        mg_status st = mg_trainer_create(&c, &t);
        CHECK_MSG(st == MG_EINVAL && t == NULL && strstr(mg_last_error(), cases[i].msg) &&
                  !strchr(mg_last_error(), '\n'), "%s: %s", cases[i].what, mg_last_error());
    }
    mg_train_config c;
    CHECK(mg_train_config_defaults("resnet", &c) == MG_EINVAL);
}

/* A NULL where the library needs a pointer is MG_EINVAL naming it, not a
 * crash (found by a probe: each of these was a SIGSEGV). */
TEST(library_calls_refuse_a_null_pointer_naming_it)
{
    mg_train_config c;
    mg_trainer *t;
    mg_group *g;
    mg_mesh *m;
    float v = 1;
    mg_work *w;
    CHECK_OK(mg_train_config_defaults("mlp", &c));
    struct { mg_status st; const char *says; } got[] = {
        {mg_train_config_defaults("mlp", NULL), "mg_train_config_defaults: c is NULL"},
        {mg_train_config_defaults(NULL, &c), "mg_train_config_defaults: model is NULL"},
        {mg_train_config_check(NULL), "mg_train_config_check: c is NULL"},
        {mg_trainer_create(NULL, &t), "mg_trainer_create: c is NULL"},
        {mg_trainer_create(&c, NULL), "mg_trainer_create: out is NULL"},
        {mg_trainer_run(NULL, NULL), "mg_trainer_run: t is NULL"},
        {mg_trainer_evaluate(NULL, NULL), "mg_trainer_evaluate: t is NULL"},
        {mg_group_init(NULL, NULL), "mg_group_init: out is NULL"},
        {mg_group_split(NULL, 0, 0, &g), "mg_group_split: g is NULL"},
        {mg_group_split(NULL, 0, 0, NULL), "mg_group_split: out is NULL"},
        {mg_all_reduce(NULL, &v, &v, 1, MG_F32, MG_SUM), "all_reduce: g is NULL"},
        {mg_all_reduce_async(NULL, &v, &v, 1, MG_F32, MG_SUM, &w), "all_reduce: g is NULL"},
        {mg_all_reduce_async(NULL, &v, &v, 1, MG_F32, MG_SUM, NULL), "all_reduce: out is NULL"},
        {mg_mesh_create(NULL, "dp=1", &m), "mg_mesh_create: g is NULL"},
        {mg_mesh_create(NULL, "dp=1", NULL), "mg_mesh_create: out is NULL"},
    };
    for (size_t i = 0; i < sizeof got / sizeof *got; i++)
        CHECK_MSG(got[i].st == MG_EINVAL, "case %zu (%s): %s", i, got[i].says,
                  mg_status_name(got[i].st));
    /* The messages, each call again on its own (the last error is one) */
    CHECK(mg_trainer_create(&c, NULL) == MG_EINVAL &&
          !strcmp(mg_last_error(), "mg_trainer_create: out is NULL"));
    CHECK(mg_all_reduce(NULL, &v, &v, 1, MG_F32, MG_SUM) == MG_EINVAL &&
          strstr(mg_last_error(), "all_reduce: g is NULL"));
}

/* examples/allreduce.c and examples/train_ddp.c run as README says:
 * every rank gets the sum; DDP on 2 ranks trains an epoch of
 * Fashion-MNIST (469 steps of 128). train_ddp trained nothing and exited
 * 0: it passed the sampler's count to the loader in the call that set it
 * (found by a probe; nothing ran the examples). */
TEST_T(examples_allreduce_and_train_ddp_run_as_written, 180)
{
    char ar[PATH_MAX], ddp[PATH_MAX], run[PATH_MAX];
    CHECK(realpath(mgt_tool("../examples/allreduce"), ar) &&
          realpath(mgt_tool("../examples/train_ddp"), ddp) && realpath(mgt_tool("mgrun"), run));
    char *out;
    int rc = mgt_sh(&out, "%s -n 3 %s", run, ar);
    CHECK_MSG(rc == 0 && mgt_count(out, "sum 3 (expected 3), token 42") == 3, "%s", out);
    free(out);
    rc = mgt_sh(&out, "cd %s && %s -n 2 %s", mgt_tmpdir(), run, ddp);
    double loss = 0;
    const char *p = strstr(out, "epoch: 469 steps, train loss ");
    CHECK_MSG(rc == 0 && p && sscanf(p, "epoch: 469 steps, train loss %lf", &loss) == 1 &&
              loss > 0.2 && loss < 0.9, "%s", out);
    free(out);
}

/* examples/train_mesh.c: one process, a 2-stage pipeline of ZeRO-2
 * replicas on 4 ranks and the model split over 2 tensor-parallel ranks
 * (its make_split: the hidden linear column-parallel, the last row-
 * parallel) train the same epoch. Over 900 steps of momentum SGD (189
 * under a sanitizer) the orders of summation part by rounding, so their
 * figures agree closely, not bit for bit (the plans' exact equivalence is
 * test_pipeline.c's, test_zero.c's and test_tp.c's): the epoch's train
 * loss, a mean over all its steps, within 1%, and the last weights' test
 * accuracy within a point and test loss within 10% (they part most:
 * 5.8% for tp=2 over ASan's 189 steps, 2.8% over 939). Its checkpoint
 * goes on under ZeRO-3 on 2 ranks, and then split over 4. */
TEST_T(trainer_example_trains_its_model_under_a_mesh, 300)
{
    char ex[PATH_MAX], run[PATH_MAX];   /* absolute: the runs start in the test's directory */
    CHECK(realpath(mgt_tool("../examples/train_mesh"), ex) && realpath(mgt_tool("mgrun"), run));
    char *out[3];
    double acc[3] = {0}, loss[3] = {0}, train[3] = {0};
    int rc = mgt_sh(&out[0], "cd %s && %s", mgt_tmpdir(), ex);
    CHECK_MSG(rc == 0, "%s", out[0]);
    rc = mgt_sh(&out[1], "cd %s && %s -n 4 %s pp=2,dp=2 2 1 ck.st", mgt_tmpdir(), run, ex);
    CHECK_MSG(rc == 0 && strstr(out[1], "pipeline+zero2: "), "%s", out[1]);
    rc = mgt_sh(&out[2], "cd %s && %s -n 2 %s tp=2", mgt_tmpdir(), run, ex);
    CHECK_MSG(rc == 0 && strstr(out[2], "tp2: "), "%s", out[2]);
    for (int k = 0; k < 3; k++) {
        const char *p = strstr(out[k], "train loss ");
        CHECK_MSG(p && sscanf(p, "train loss %lf, test loss %lf, test accuracy %lf", &train[k],
                              &loss[k], &acc[k]) == 3, "%s", out[k]);
    }
    printf("one process: train loss %.4f, test loss %.4f, accuracy %.2f%%; pp=2,dp=2 ZeRO-2: "
           "%.4f, %.4f, %.2f%%; tp=2: %.4f, %.4f, %.2f%%\n", train[0], loss[0], acc[0],
           train[1], loss[1], acc[1], train[2], loss[2], acc[2]);
    for (int k = 1; k < 3; k++)
        CHECK_MSG(acc[0] > 80 && fabs(train[0] - train[k]) < 0.01 * train[0] &&
                  fabs(acc[0] - acc[k]) < 1 && fabs(loss[0] - loss[k]) < 0.1 * loss[0],
                  "one process:\n%s\nthe mesh:\n%s", out[0], out[k]);
    for (int k = 0; k < 3; k++) free(out[k]);
    /* Its checkpoint goes on under ZeRO-3 on 2 ranks (epoch 2 only), and
     * that one's split over 4 tensor-parallel ranks (epoch 3 only). */
    char *one;
    rc = mgt_sh(&one, "cd %s && %s -n 2 %s dp=2 3 2 ck.st", mgt_tmpdir(), run, ex);
    CHECK_MSG(rc == 0 && strstr(one, "epoch 2: ") && !strstr(one, "epoch 1: ") &&
              strstr(one, "zero3: "), "%s", one);
    free(one);
    rc = mgt_sh(&one, "cd %s && %s -n 4 %s tp=4 0 3 ck.st", mgt_tmpdir(), run, ex);
    CHECK_MSG(rc == 0 && strstr(one, "epoch 3: ") && !strstr(one, "epoch 2: ") &&
              strstr(one, "tp4: "), "%s", one);
    free(one);
    /* A mesh that does not fit the job is said once, by the rank that
     * found it first (the others get MG_ESTOPPED and stay quiet). */
    rc = mgt_sh(&one, "cd %s && %s -n 3 %s dp=2", mgt_tmpdir(), run, ex);
    CHECK_MSG(rc != 0 && mgt_count(one, "train_mesh: ") == 1 && strstr(one, "dp*tp*pp = 2"),
              "%s", one);
    free(one);
}

/* mg_train_step with a source of its own: a micro-batch no model can take
 * (no rows, no inputs or labels, a label that is not a class, a weight
 * that is no number) and a rate or clip that is not a number are
 * MG_EINVAL, not an abort, a segfault or NaN parameters (found by a
 * probe), and nothing is trained; evaluation refuses such labels too. */
typedef struct {
    mg_micro_batch b;
    float x[2 * 784];
    int32_t y[2];
} one_batch;

static bool give_one(void *ud, mg_micro_batch *out)
{
    *out = ((one_batch *)ud)->b;
    return true;
}

TEST(train_step_refuses_what_no_model_can_take)
{
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 0, &m));
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_SINGLE);
    so.max_batch = 2;
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    mg_optim *o;
    CHECK_OK(mg_strategy_optim(s, &oc, &o));
    size_t n = mg_model_arena_size(m);
    float *before = malloc(n * sizeof *before);
    memcpy(before, mg_model_params(m), n * sizeof *before);
    static one_batch d;
    mg_micro_batch good = {d.x, d.y, 2, true, 0};
    static const int32_t past[2] = {9, 10}, below[2] = {-1, 0};
    struct { mg_micro_batch b; mg_step_options opt; const char *says; } cases[] = {
        {{d.x, d.y, 0, true, 0}, {1, 0.05f, 0, 1}, "of 0 rows"},
        {{NULL, d.y, 2, true, 0}, {1, 0.05f, 0, 1}, "x NULL"},
        {{d.x, NULL, 2, true, 0}, {1, 0.05f, 0, 1}, "y NULL"},
        {{d.x, d.y, 2, true, INFINITY}, {1, 0.05f, 0, 1}, "weight inf"},
        {{d.x, past, 2, true, 0}, {1, 0.05f, 0, 1}, "label 10 (row 1, position 0 of 1)"},
        {{d.x, below, 2, true, 0}, {1, 0.05f, 0, 1}, "label -1 (row 0"},
        {good, {1, NAN, 0, 1}, "lr nan"},
        {good, {1, 0.05f, NAN, 1}, "clip_grad nan"},
        {good, {0, 0.05f, 0, 1}, "accumulate 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        d.b = cases[i].b;
        mg_step_result r;
        CHECK_ERR(mg_train_step(s, o, &cases[i].opt, give_one, &d, &r), MG_EINVAL);
        CHECK_MSG(strstr(mg_last_error(), cases[i].says), "case %zu: %s", i, mg_last_error());
    }
    CHECK(memcmp(before, mg_model_params(m), n * sizeof *before) == 0);
    d.b = (mg_micro_batch){d.x, past, 2, true, 0};
    mg_step_result e;
    CHECK_ERR(mg_strategy_evaluate(s, give_one, &d, &e), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "mg_strategy_evaluate: the source gave label 10"), "%s",
              mg_last_error());
    d.b = good;   /* and a good one trains */
    mg_step_result r;
    CHECK_OK(mg_train_step(s, o, &(mg_step_options){1, 0.05f, 0, 1}, give_one, &d, &r));
    CHECK(r.micro == 1 && r.samples == 2);
    free(before);
    mg_optim_destroy(o);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    /* A language model's token outside the vocabulary: an assertion that
     * stopped the process (a probe), now MG_EINVAL naming it. */
    mg_gpt_config g = {.layers = 1, .dim = 16, .heads = 2, .ctx = 4, .vocab = 256};
    CHECK_OK(mg_model_create_gpt(&g, 0, &m));
    CHECK_OK(mg_strategy_create(m, &so, &s));
    CHECK_OK(mg_strategy_optim(s, &oc, &o));
    static const int32_t tok[8] = {1, 2, 3, 4, 5, 256, 7, 8}, next[8] = {0};
    d.b = (mg_micro_batch){(const float *)(const void *)tok, next, 2, true, 0};
    CHECK_ERR(mg_train_step(s, o, &(mg_step_options){1, 0.05f, 0, 1}, give_one, &d, &r),
              MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "mg_train_step: the source's micro-batch: model 'gpt-mini': "
                     "token 256 (row 1, position 1 of 4) is outside the vocabulary [0, 256)"),
              "%s", mg_last_error());
    CHECK_ERR(mg_strategy_evaluate(s, give_one, &d, &e), MG_EINVAL);
    mg_optim_destroy(o);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
}
