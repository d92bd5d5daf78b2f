/* A strategy's component written outside the library, in this one file
 * (component.h): it counts the unit hooks the model calls around its
 * work, the micro-batches, reductions and updates, and the gradient
 * bytes of the units whose backward ran — and changes no number. The
 * line that adds it to a strategy is the options' components list. */
#include "harness.h"
#include "multigrad/multigrad.h"

typedef struct {
    mg_strategy *s;
    mg_model *m;
    long forwards, backwards, micro, last, reduces, updates;
    size_t grad_bytes;
    int launched;   /* DDP's buckets already started when the reductions begin */
} counter;

static void on_pre_forward(void *ud, mg_tape *t, int unit)
{
    (void)t;
    (void)unit;
    ((counter *)ud)->forwards++;
}

static void on_post_backward(void *ud, mg_tape *t, int unit)
{
    counter *c = ud;
    (void)t;
    size_t lo, hi;
    mg_model_unit_range(c->m, unit, &lo, &hi);
    c->backwards++;
    c->grad_bytes += (hi - lo) * sizeof(float);
}

static const mg_unit_hooks count_hooks = {.pre_forward = on_pre_forward,
                                          .post_backward = on_post_backward};

static mg_status count_attach(mg_strategy *s, void **state)
{
    counter *c = calloc(1, sizeof *c);
    if (!c) return mg_error(MG_ENOMEM, "count: out of memory");
    c->s = s;
    c->m = mg_strategy_model(s);
    mg_status st = mg_model_add_hooks(c->m, &count_hooks, c);
    if (st) free(c);
    else *state = c;
    return st;
}

static void count_destroy(void *ud)
{
    counter *c = ud;
    mg_model_remove_hooks(c->m, &count_hooks, c);
    free(c);
}

static void count_begin(void *ud, bool last)
{
    counter *c = ud;
    c->micro++;
    c->last += last;
}

/* The last in the list: its reduction runs first, before DDP's waits. */
static mg_status count_reduce(void *ud)
{
    counter *c = ud;
    mg_ddp *ddp = mg_strategy_ddp(c->s);
    c->reduces++;
    c->launched = ddp ? mg_ddp_launched(ddp) : -1;
    return MG_OK;
}

static mg_status count_update(void *ud)
{
    ((counter *)ud)->updates++;
    return MG_OK;
}

static const mg_component_ops count_ops = {
    .name = "count", .attach = count_attach, .destroy = count_destroy,
    .micro_begin = count_begin, .reduce = count_reduce, .after_update = count_update,
};

enum { STEPS = 3, ACC = 2, BATCH = 8 };

typedef struct {
    const float *x;
    const int32_t *y;
    int n, given;
} feed;

static bool next_batch(void *ud, mg_micro_batch *b)
{
    feed *f = ud;
    *b = (mg_micro_batch){f->x + (size_t)(f->given % ACC) * f->n * 784,
                          f->y + (f->given % ACC) * f->n, f->n, false};
    f->given++;
    return true;
}

/* STEPS steps of ACC micro-batches of lenet5 (DDP over g, or one process),
 * with or without the counter; the parameters after them in *params. */
static void train(mg_group *g, bool with_counter, float **params, counter *seen)
{
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", 0, &m));
    mg_strategy_options so = mg_strategy_defaults(g ? MG_STRATEGY_DDP : MG_STRATEGY_SINGLE);
    so.group = g;
    so.max_batch = BATCH;
    const mg_component_ops *const extra[] = {&count_ops, NULL};
    if (with_counter) so.components = extra;
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    const char *name = !with_counter ? (g ? "ddp" : "single") : (g ? "ddp+count" : "count");
    CHECK_MSG(!strcmp(mg_strategy_name(s), name), "strategy %s, not %s", mg_strategy_name(s),
              name);
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    oc.momentum = 0.9f;
    mg_optim *o;
    CHECK_OK(mg_strategy_optim(s, &oc, &o));
    int rank = g ? mg_group_rank(g) : 0, world = g ? mg_group_size(g) : 1;
    static float x[ACC * 2 * BATCH * 784];
    static int32_t y[ACC * 2 * BATCH];
    for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = (float)((i * 37) % 11) / 11.0f;
    for (size_t i = 0; i < sizeof y / sizeof *y; i++) y[i] = (int32_t)(i % 10);
    /* Rank r takes its share of each global micro-batch of 2 * BATCH. */
    int n = 2 * BATCH / world;
    mg_step_options opt = {.accumulate = ACC, .lr = 0.05f, .clip_grad = 1.0f};
    for (int step = 0; step < STEPS; step++) {
        float xs[ACC * 2 * BATCH * 784];
        int32_t ys[ACC * 2 * BATCH];
        for (int k = 0; k < ACC; k++) {
            memcpy(xs + (size_t)k * n * 784, x + ((size_t)k * 2 * BATCH + rank * n) * 784,
                   sizeof(float) * n * 784);
            memcpy(ys + k * n, y + k * 2 * BATCH + rank * n, sizeof(int32_t) * n);
        }
        feed f = {xs, ys, n, 0};
        mg_step_result r;
        CHECK_OK(mg_train_step(s, o, &opt, next_batch, &f, &r));
        CHECK_EQ(r.micro, ACC);
    }
    if (with_counter) *seen = *(counter *)mg_strategy_part(s, &count_ops);
    CHECK(mg_strategy_part(s, &count_ops) == NULL || with_counter);
    size_t np = mg_model_arena_size(m);
    *params = malloc(np * sizeof(float));
    memcpy(*params, mg_model_params(m), np * sizeof(float));
    mg_optim_destroy(o);
    mg_strategy_destroy(s);
    CHECK_EQ(mg_model_num_hooks(m), 0);
    mg_model_destroy(m);
}

/* What the counter saw is what the step did: every unit's forward and
 * backward per micro-batch, each unit's gradients once per backward,
 * the step's last micro-batch marked once, one reduction and one update
 * per step; and the parameters are the same bits as without it. */
static void check_counts(const counter *c, mg_model *m)
{
    long units = mg_model_num_units(m), micro = (long)STEPS * ACC;
    CHECK_EQ(c->micro, micro);
    CHECK_EQ(c->last, STEPS);
    CHECK_EQ(c->reduces, STEPS);
    CHECK_EQ(c->updates, STEPS);
    CHECK_EQ(c->forwards, units * micro);
    CHECK_EQ(c->backwards, units * micro);
    CHECK_EQ(c->grad_bytes, mg_model_arena_size(m) * sizeof(float) * (size_t)micro);
}

static int count_rank(int rank, int world, void *arg)
{
    mg_group *g = mgt_join(rank, world, *(int *)arg, NULL, 30);
    CHECK(g);
    float *plain, *counted;
    counter c;
    train(g, false, &plain, NULL);
    train(g, true, &counted, &c);
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", 0, &m));
    CHECK_OK(mg_model_set_unit_pad(m, mg_shard_pad(world)));
    check_counts(&c, m);
    CHECK(memcmp(plain, counted, mg_model_arena_size(m) * sizeof(float)) == 0);
    mg_model_destroy(m);
    free(plain);
    free(counted);
    mg_group_destroy(g);
    return 0;
}

TEST(component_added_in_one_file_sees_every_hook_and_changes_nothing)
{
    /* One process. */
    float *plain, *counted;
    counter c;
    train(NULL, false, &plain, NULL);
    train(NULL, true, &counted, &c);
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", 0, &m));
    check_counts(&c, m);
    CHECK(memcmp(plain, counted, mg_model_arena_size(m) * sizeof(float)) == 0);
    mg_model_destroy(m);
    free(plain);
    free(counted);
    /* After DDP, on 2 ranks. */
    int port = mgt_free_port(), st[2];
    CHECK_EQ(mgt_fork_ranks(2, count_rank, &port, 60, st), 0);
}

/* In a pipeline (pp=2) with replicas (dp=2): the hooks fire on the
 * stage's units only, the driver marks each backward and its stage's
 * last, and DDP has started every bucket of the stage's ranges before
 * the reductions (during the last backward), none left for the end. */
static int pipe_rank(int rank, int world, void *arg)
{
    mg_group *g = mgt_join(rank, world, *(int *)arg, NULL, 30);
    CHECK(g);
    mg_model *m;
    CHECK_OK(mg_model_create("lenet5", 0, &m));
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_PIPELINE);
    so.group = g;
    so.mesh = "pp=2,dp=2";
    so.max_batch = BATCH;
    so.ddp.first_bucket_bytes = so.ddp.bucket_bytes = 16 << 10;   /* several buckets */
    so.pipe = (mg_pipe_options){.kind = MG_PIPE_1F1B, .micro_batches = ACC};
    const mg_component_ops *const extra[] = {&count_ops, NULL};
    so.components = extra;
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    CHECK_MSG(!strcmp(mg_strategy_name(s), "pipeline+ddp+count"), "%s", mg_strategy_name(s));
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
    mg_optim *o;
    CHECK_OK(mg_strategy_optim(s, &oc, &o));
    static float x[ACC * BATCH * 784];
    static int32_t y[ACC * BATCH];
    for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = (float)((i * 29 + rank) % 13) / 13.0f;
    for (size_t i = 0; i < sizeof y / sizeof *y; i++) y[i] = (int32_t)(i % 10);
    mg_step_options opt = {.accumulate = ACC, .lr = 0.05f};
    counter *c = mg_strategy_part(s, &count_ops);
    mg_ddp *ddp = mg_strategy_ddp(s);
    CHECK(ddp && mg_ddp_num_buckets(ddp) >= 1);
    for (int step = 0; step < STEPS; step++) {
        feed f = {x, y, BATCH, 0};
        mg_step_result r;
        CHECK_OK(mg_train_step(s, o, &opt, next_batch, &f, &r));
        CHECK_EQ(c->launched, mg_ddp_num_buckets(ddp));
    }
    int S, stage = rank / 2;   /* dp varies fastest */
    const int *cut = mg_pipe_cut(mg_strategy_pipe(s), &S);
    long units = 0;
    for (int u = cut[stage]; u < cut[stage + 1]; u++) units++;
    CHECK_EQ(c->micro, (long)STEPS * ACC);   /* one per backward */
    CHECK_EQ(c->last, STEPS);
    CHECK_EQ(c->reduces, STEPS);
    CHECK_EQ(c->forwards, units * STEPS * ACC);
    CHECK_EQ(c->backwards, units * STEPS * ACC);
    mg_optim_destroy(o);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    mg_group_destroy(g);
    return 0;
}

TEST(component_in_a_pipeline_and_its_replicas_average_during_the_last_backward)
{
    int port = mgt_free_port(), st[4];
    CHECK_EQ(mgt_fork_ranks(4, pipe_rank, &port, 60, st), 0);
}

/* The composition API's inputs a C program can get wrong, each a status
 * and a line where a probe found a crash, a silent default or the wrong
 * message. */
static mg_status make_nothing(void *ud, mg_model **out)
{
    (void)ud;
    *out = NULL;
    return MG_OK;
}

TEST(component_api_refuses_what_it_cannot_take)
{
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 0, &m));
    /* a mesh without a group was ignored: one process, silently */
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_SINGLE);
    so.max_batch = 4;
    so.mesh = "pp=2";
    mg_strategy *s;
    CHECK_ERR(mg_strategy_create(m, &so, &s), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "a mesh without a group"), "%s", mg_last_error());
    so.mesh = NULL;
    /* a parameter server's defaults: one server (0 was refused), and
     * without a job it says that, not that servers leave no worker */
    mg_strategy_options ps = mg_strategy_defaults(MG_STRATEGY_PS);
    CHECK(ps.ps_servers == 1);
    ps.max_batch = 4;
    CHECK_ERR(mg_strategy_create(m, &ps, &s), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "needs a job of 2 or more ranks"), "%s", mg_last_error());
    CHECK_OK(mg_strategy_create(m, &so, &s));
    /* a step's slowing that is no number, a text that is NULL */
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.1f);
    mg_optim *o;
    CHECK_OK(mg_strategy_optim(s, &oc, &o));
    mg_step_result r;
    CHECK_ERR(mg_train_step(s, o, &(mg_step_options){1, 0.1f, 0, NAN}, NULL, NULL, &r),
              MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "slow nan"), "%s", mg_last_error());
    double loss;
    CHECK_ERR(mg_strategy_lm_val_loss(s, NULL, 4, 0, 1, 0, &loss), MG_EINVAL);
    mg_sampler_free(NULL);
    /* weights alone, loaded with an optimizer: said so, not "damaged" */
    char path[512];
    snprintf(path, sizeof path, "%s/w.st", mgt_tmpdir());
    CHECK_OK(mg_checkpoint_save(path, m, NULL, NULL));
    CHECK_ERR(mg_checkpoint_load(path, m, o, NULL), MG_EMISMATCH);
    CHECK_MSG(strstr(mg_last_error(), "holds no optimizer state"), "%s", mg_last_error());
    CHECK_ERR(mg_check_writable(""), MG_EINVAL);
    mg_dataset *ds;
    CHECK_ERR(mg_dataset_load(NULL, true, &ds), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "dir is NULL"), "%s", mg_last_error());
    mg_optim_destroy(o);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    /* a factory that says MG_OK and makes nothing; buckets of NaN MB */
    mg_train_config c;
    CHECK_OK(mg_train_config_defaults("mlp", &c));
    c.model = "mine";
    c.make = make_nothing;
    c.data = mgt_fashion_dir();
    mg_trainer *t;
    CHECK_ERR(mg_trainer_create(&c, &t), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "returned MG_OK without a model"), "%s", mg_last_error());
    CHECK_OK(mg_train_config_defaults("mlp", &c));
    c.bucket_mb = NAN;
    CHECK_ERR(mg_train_config_check(&c), MG_EINVAL);
    /* the planner: a rank outside the plan, a memory or overlap out of range */
    mg_plan_job job;
    CHECK_OK(mg_plan_job_defaults("mlp", &job));
    mg_plan p = {.dp = 2, .pp = 1, .tp = 1, .micro = 1, .local = 64, .chunks = 1};
    mg_memory_stats ms;
    CHECK_ERR(mg_plan_rank_memory(&job, &p, 99, &ms), MG_EINVAL);
    CHECK_ERR(mg_plan_job_defaults(NULL, &job), MG_EINVAL);
    CHECK_OK(mg_plan_job_defaults("mlp", &job));
    mg_plan_cluster cl = mg_plan_cluster_here(2, 1, 2, 0);
    cl.flops = cl.bytes_per_s = 1e10;
    cl.memory = NAN;   /* marked every plan as not fitting, without a word */
    mg_plan *all;
    int n;
    CHECK_ERR(mg_plan_search(&job, &cl, &all, &n), MG_EINVAL);
    cl.memory = 0;
    cl.overlap = 5;
    CHECK_ERR(mg_plan_search(&job, &cl, &all, &n), MG_EINVAL);
}
