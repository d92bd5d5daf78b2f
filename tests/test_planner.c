/* The planner (planner.h, mgplan; issue 33): its memory per rank equals
 * what the strategies count (mg_strategy_memory) after real steps of real
 * ranks, for one process, DDP, ZeRO 1-3, pipelines of each schedule, tp
 * (with sequence parallelism) and meshes of 4 ranks; the seed's rules of
 * thumb come out of its computation on the inputs they speak of; bad
 * input is one line. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"
#include "multigrad/multigrad.h"

static mg_plan_job small_job(void)
{
    mg_plan_job job;
    CHECK_OK(mg_plan_job_defaults("gpt-mini", &job));
    job.gpt.layers = 2;
    job.gpt.dim = 64;
    job.gpt.ctx = 32;
    job.batch = 8;
    job.bucket_mb = 0.04;   /* buckets of about 3 units: ZeRO's walk has work */
    return job;
}

typedef struct {
    mg_plan plan;
    mg_plan_job job;
} memory_case;

/* What the strategy counted against what the planner computes for this
 * rank (evaluating: ZeRO-3's gather for it counted). */
static void compare(const memory_case *mc, mg_trainer *t, int rank, bool evaluated)
{
    mg_memory_stats got = mg_strategy_memory(mg_trainer_strategy(t), mg_trainer_optim(t)), want;
    mg_plan_job job = mc->job;
    job.evaluates = evaluated;
    CHECK_OK(mg_plan_rank_memory(&job, &mc->plan, rank, &want));
    CHECK_MSG(got.params == want.params && got.grads == want.grads && got.optim == want.optim,
              "rank %d of dp=%d,pp=%d,tp=%d zero %d M=%d%s%s: counted %zu %zu %zu, planned %zu "
              "%zu %zu (params, grads, optimizer)", rank, mc->plan.dp, mc->plan.pp, mc->plan.tp,
              mc->plan.zero, mc->plan.micro, mc->plan.offload ? " offload" : "",
              evaluated ? " after evaluating" : "", got.params,
              got.grads, got.optim, want.params, want.grads, want.optim);
    /* The tapes: exact without a pipeline; a pipeline's evaluation may
     * hold more than its schedule does. */
    CHECK_MSG(mc->plan.pp > 1 ? got.activations >= want.activations
                              : got.activations == want.activations,
              "rank %d: activations counted %zu, planned %zu", rank, got.activations,
              want.activations);
}

typedef struct {
    const memory_case *mc;
    mg_trainer *t;
    int rank;
} watch;

/* After the last step, before the evaluation that ends the run. */
static void on_progress(const mg_train_progress *p, void *ud)
{
    watch *w = ud;
    if (p->step == p->steps) compare(w->mc, w->t, w->rank, false);
}

/* A rank of the plan: two training steps through the trainer, compared
 * after them and after the evaluation that ends the run. */
static int rank_memory(int rank, int n, void *arg)
{
    const memory_case *mc = arg;
    if (n > 1) mgt_rank_env(rank, n, atoi(getenv("MGT_PLAN_PORT")));
    mg_train_config c;
    CHECK_OK(mg_train_config_defaults("gpt-mini", &c));
    c.gpt = mc->job.gpt;
    c.batch = mc->job.batch;
    c.bucket_mb = mc->job.bucket_mb;
    c.steps = 2;
    c.eval_every = 2;
    c.eval_windows = 4;
    c.no_eval_on_start = true;
    c.offload_dir = mc->plan.offload ? mgt_tmpdir() : NULL;
    watch w = {mc, NULL, rank};
    c.on_progress = on_progress;
    c.ud = &w;
    char mesh[48];
    mg_plan_apply(&mc->plan, mesh, sizeof mesh, &c);
    CHECK_OK(mg_trainer_create(&c, &w.t));
    CHECK_OK(mg_trainer_run(w.t, NULL));
    compare(mc, w.t, rank, true);
    mg_trainer_destroy(w.t);
    return 0;
}

TEST_T(planner_memory_equals_the_strategies_counters, 300)
{
    static const struct {
        int dp, pp, tp, zero, micro;
        mg_pipe_kind kind;
        bool rc, sp, offload;
    } cases[] = {
        {1, 1, 1, 0, 1, MG_PIPE_1F1B, false, false},
        {2, 1, 1, 0, 1, MG_PIPE_1F1B, false, false},
        {2, 1, 1, 1, 2, MG_PIPE_1F1B, false, false},
        {2, 1, 1, 2, 2, MG_PIPE_1F1B, true, false},
        {2, 1, 1, 3, 1, MG_PIPE_1F1B, false, false},
        {2, 1, 1, 3, 2, MG_PIPE_1F1B, false, false},
        {1, 2, 1, 0, 2, MG_PIPE_1F1B, false, false},
        {1, 2, 1, 0, 4, MG_PIPE_GPIPE, false, false},
        {1, 2, 1, 0, 4, MG_PIPE_INTERLEAVED, false, false},
        {1, 1, 2, 0, 1, MG_PIPE_1F1B, false, true},
        {4, 1, 1, 3, 1, MG_PIPE_1F1B, false, false},
        {2, 2, 1, 1, 2, MG_PIPE_1F1B, false, false},
        {2, 1, 2, 2, 1, MG_PIPE_1F1B, true, false},
        {1, 2, 2, 0, 2, MG_PIPE_1F1B, false, false},
        /* --offload disk:DIR: the optimizer's windows; ZeRO 2-3's
         * gradient pieces and ZeRO-3's parameter pieces in files. */
        {1, 1, 1, 0, 1, MG_PIPE_1F1B, false, false, true},
        {2, 1, 1, 1, 2, MG_PIPE_1F1B, false, false, true},
        {2, 1, 1, 2, 2, MG_PIPE_1F1B, false, false, true},
        {2, 1, 1, 3, 1, MG_PIPE_1F1B, false, false, true},
        {2, 1, 1, 3, 2, MG_PIPE_1F1B, true, false, true},
        {2, 2, 1, 1, 2, MG_PIPE_1F1B, false, false, true},
        {1, 1, 2, 0, 1, MG_PIPE_1F1B, false, false, true},
    };
    int n = (int)(sizeof cases / sizeof *cases);
    for (int i = 0; i < n; i++) {
        if (mgt_sanitized() && i % 3) continue;
        memory_case mc = {.job = small_job()};
        mg_plan *p = &mc.plan;
        *p = (mg_plan){.dp = cases[i].dp, .pp = cases[i].pp, .tp = cases[i].tp,
                       .zero = cases[i].zero, .micro = cases[i].micro, .schedule = cases[i].kind,
                       .chunks = cases[i].kind == MG_PIPE_INTERLEAVED ? 2 : 1,
                       .recompute = cases[i].rc, .sequence_parallel = cases[i].sp,
                       .offload = cases[i].offload};
        p->local = mc.job.batch / p->micro / p->dp;
        int world = p->dp * p->pp * p->tp;
        char port[16];
        snprintf(port, sizeof port, "%d", mgt_free_port());
        setenv("MGT_PLAN_PORT", port, 1);
        int failed = mgt_fork_ranks(world, rank_memory, &mc, 120, NULL);
        CHECK_MSG(!failed, "case %d (dp=%d,pp=%d,tp=%d zero %d): %d rank(s) failed", i, p->dp,
                  p->pp, p->tp, p->zero, failed);
    }
}

/* ---- the seed's rules of thumb, computed ---------------------------------- */

/* A GPU cluster of r ranks a node and k nodes: a rank 100 TFLOP/s and 1
 * TB/s, NVLink-class 150 GB/s within a node, gb Gb/s between nodes. */
static mg_plan_cluster gpus(int r, int k, double gb, double memory)
{
    mg_plan_cluster cl = {.ranks_per_node = r, .nodes = k, .memory = memory, .flops = 100e12,
                          .bytes_per_s = 1e12, .overlap = 1,
                          .intra = {5e-6, 150e9, 1e12, false}, .inter = {5e-6, gb * 1e9 / 8, 1e12, false}};
    return cl;
}

static mg_plan_job gpt_shape(int layers, int dim, int heads, int ctx, int vocab, int batch)
{
    mg_plan_job job;
    CHECK_OK(mg_plan_job_defaults("gpt-mini", &job));
    job.gpt = (mg_gpt_config){.layers = layers, .dim = dim, .heads = heads, .ctx = ctx,
                              .vocab = vocab};
    job.batch = batch;
    return job;
}

static mg_plan best_of(const mg_plan_job *job, const mg_plan_cluster *cl, int *rule)
{
    mg_plan *all;
    int n;
    CHECK_OK(mg_plan_search(job, cl, &all, &n));
    CHECK(n > 0 && all[0].fits);
    mg_plan b = all[0];
    if (rule) *rule = mg_plan_rule_of_thumb(all, n, cl);
    /* Plain data parallelism: the fastest of its plans does not fit. */
    free(all);
    return b;
}

/* The 85M shape on 4 nodes of 4 with 2 GB a rank, which plain DDP's 16
 * bytes a parameter and its activations exceed: over fast links (400
 * Gb/s) ZeRO over all 16 ranks. */
TEST_T(planner_fast_links_choose_zero, 60)
{
    mg_plan_job job = gpt_shape(12, 768, 12, 1024, 256, 64);
    mg_plan_cluster cl = gpus(4, 4, 400, 2e9);
    int rule;
    mg_plan b = best_of(&job, &cl, &rule);
    CHECK_MSG(b.tp == 1 && b.pp == 1 && b.dp == 16 && b.zero >= 1, "dp=%d,pp=%d,tp=%d zero %d",
              b.dp, b.pp, b.tp, b.zero);
    CHECK(rule >= 0);
    /* DDP does not fit there. */
    mg_plan_job ddp_only = job;
    ddp_only.no_zero = ddp_only.no_pipeline = ddp_only.no_tp = ddp_only.no_recompute = true;
    mg_plan *all;
    int n;
    CHECK_OK(mg_plan_search(&ddp_only, &cl, &all, &n));
    for (int i = 0; i < n; i++) CHECK(!all[i].fits || all[i].micro > 1);
    free(all);
}

/* A 7B shape on 16 nodes of 8 with 14.5 GB a rank: between slow nodes (25
 * Gb/s) tensor parallelism within a node, a pipeline over the nodes and
 * ZeRO-1 over the replicas (Megatron-LM's layout); fast links take fewer
 * stages. */
TEST_T(planner_slow_links_choose_pp_tp_dp_with_zero1, 120)
{
    mg_plan_job job = gpt_shape(32, 4096, 32, 2048, 32000, 256);
    job.optimizer = MG_OPTIM_ADAM;
    mg_plan_cluster slow = gpus(8, 16, 25, 14.5e9), fast = gpus(8, 16, 400, 14.5e9);
    mg_plan s = best_of(&job, &slow, NULL), f = best_of(&job, &fast, NULL);
    CHECK_MSG(s.tp > 1 && s.tp <= 8 && s.pp > 1 && s.dp > 1 && s.zero == 1,
              "slow: dp=%d,pp=%d,tp=%d zero %d", s.dp, s.pp, s.tp, s.zero);
    CHECK_MSG(f.pp < s.pp, "fast: pp=%d, slow: pp=%d", f.pp, s.pp);
}

/* Two layers of width 4096 on 8 ranks of 1.5 GB: one block's parameters,
 * gradients and state exceed what ZeRO-3 or a pipeline leaves a rank, so
 * only tensor parallelism fits, and the reason says so. */
TEST(planner_one_layer_too_big_chooses_tp)
{
    mg_plan_job job = gpt_shape(2, 4096, 32, 512, 256, 16);
    mg_plan_cluster cl = gpus(8, 1, 400, 1.5e9);
    mg_plan *all;
    int n;
    CHECK_OK(mg_plan_search(&job, &cl, &all, &n));
    CHECK(all[0].fits && all[0].tp > 1);
    for (int i = 0; i < n; i++) CHECK(!all[i].fits || all[i].tp > 1);
    char why[512];
    mg_plan_reason(all, n, &cl, why, sizeof why);
    CHECK_MSG(strstr(why, "only tensor parallelism fits"), "%s", why);
    free(all);
}

/* ---- offload -------------------------------------------------------------- */

/* The 85M shape at context 64 on 2 CPU ranks of 500 MB: nothing fits in
 * memory, so the plans offload (what they hold is the windows, ZeRO's
 * pieces in files), each the twin of a plan that does not fit, and they
 * pay the files' time; without a disk rate or with memory to spare no
 * plan offloads. */
TEST(planner_offloads_only_where_nothing_else_fits)
{
    mg_plan_job job = gpt_shape(12, 768, 12, 64, 256, 8);
    mg_plan_cluster cl = {.ranks_per_node = 2, .nodes = 1, .memory = 500e6, .flops = 5e10,
                          .bytes_per_s = 2e10, .disk_bytes_per_s = 2e9, .overlap = 1,
                          .intra = *mg_link_builtin("shm"), .inter = *mg_link_builtin("tcp")};
    mg_plan *all;
    int n, offloaded = 0;
    CHECK_OK(mg_plan_search(&job, &cl, &all, &n));
    CHECK(all[0].fits && all[0].offload && all[0].offload_io > 0);
    for (int i = 0; i < n; i++) {
        const mg_plan *p = &all[i];
        if (!p->offload) {
            CHECK(!p->fits);
            continue;
        }
        offloaded++;
        int twin = -1;
        for (int j = 0; j < n && twin < 0; j++)
            if (!all[j].offload && all[j].dp == p->dp && all[j].pp == p->pp &&
                all[j].tp == p->tp && all[j].zero == p->zero && all[j].micro == p->micro &&
                all[j].schedule == p->schedule && all[j].recompute == p->recompute &&
                !p->sequence_parallel && !all[j].sequence_parallel)
                twin = j;
        CHECK(twin >= 0 && all[twin].bytes > p->bytes && all[twin].step < p->step);
    }
    CHECK(offloaded > 0);
    char why[512], flags[1024];
    mg_plan_reason(all, n, &cl, why, sizeof why);
    CHECK_MSG(strstr(why, "without offload"), "%s", why);
    mg_plan_flags(&job, &all[0], flags, sizeof flags);
    CHECK_MSG(strstr(flags, " --offload disk:DIR"), "%s", flags);
    job.offload_dir = "/var/tmp/mg";
    mg_plan_flags(&job, &all[0], flags, sizeof flags);
    CHECK_MSG(strstr(flags, " --offload disk:/var/tmp/mg"), "%s", flags);
    free(all);
    /* No rate for the files (or --no-offload): nothing fits. */
    cl.disk_bytes_per_s = 0;
    CHECK_OK(mg_plan_search(&job, &cl, &all, &n));
    CHECK(!all[0].fits && !all[0].offload);
    free(all);
    /* Memory to spare: no plan offloads. */
    cl.disk_bytes_per_s = 2e9;
    cl.memory = 0;
    CHECK_OK(mg_plan_search(&job, &cl, &all, &n));
    for (int i = 0; i < n; i++) CHECK(!all[i].offload);
    free(all);
}

/* ZeRO-3 gathers into pages it gave back, a refill of the bucket's bytes
 * outside the piece at every gather (offloaded, the piece's too); a
 * pipeline's ZeRO-2 gives back and rewrites its gradients once a step;
 * ZeRO-1 and DDP keep their pages. */
static const mg_plan *find(const mg_plan *all, int n, int pp, int zero, int micro, bool offload)
{
    for (int i = 0; i < n; i++)
        if (all[i].dp == 2 && all[i].pp == pp && all[i].tp == 1 && all[i].zero == zero &&
            all[i].micro == micro &&
            all[i].offload == offload && !all[i].recompute && !all[i].sequence_parallel &&
            (pp == 1 || all[i].schedule == MG_PIPE_1F1B))
            return &all[i];
    return NULL;
}

TEST(planner_counts_zero_refilling_pages_given_back)
{
    mg_plan_job job = gpt_shape(12, 768, 12, 64, 256, 16);
    mg_plan_cluster cl = {.ranks_per_node = 2, .nodes = 1, .flops = 5e10, .bytes_per_s = 2e10,
                          .disk_bytes_per_s = 2e9, .memory = 500e6, .overlap = 0,
                          .intra = *mg_link_builtin("shm"), .inter = *mg_link_builtin("tcp")};
    mg_model *m;
    CHECK_OK(mg_model_create_gpt(&job.gpt, 1, &m));
    double G = 4.0 * (double)mg_model_arena_size(m), R = 1e9;
    mg_model_destroy(m);
    mg_plan *a, *b;
    int na, nb;
    CHECK_OK(mg_plan_search(&job, &cl, &a, &na));
    cl.refill_bytes_per_s[1] = R;
    CHECK_OK(mg_plan_search(&job, &cl, &b, &nb));
    struct { int pp, zero, micro; bool offload; double refilled; } want[] = {
        {1, 3, 1, false, 2 * G / 2}, {1, 3, 2, false, 4 * G / 2}, {1, 3, 2, true, 4 * G},
        {1, 1, 1, false, 0},         {1, 0, 2, false, 0},
    };
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        const mg_plan *x = find(a, na, want[k].pp, want[k].zero, want[k].micro, want[k].offload);
        const mg_plan *y = find(b, nb, want[k].pp, want[k].zero, want[k].micro, want[k].offload);
        CHECK_MSG(x && y, "case %zu: no such plan", k);
        if (!x || !y) continue;
        double added = y->dp_comm - x->dp_comm, expect = want[k].refilled / R;
        CHECK_MSG(fabs(added - expect) <= 1e-9 * (1 + expect), "case %zu: %.6f s added, %.6f s expected",
                  k, added, expect);
        CHECK_MSG(fabs((y->step - x->step) - (y->dp_exposed - x->dp_exposed)) < 1e-9,
                  "case %zu: the step grows by what is exposed", k);
    }
    free(a);
    free(b);
    /* A pipeline's stage: its gradients once a step, the stage's floats
     * outside the piece. */
    cl.ranks_per_node = 4;
    cl.memory = 0;
    cl.refill_bytes_per_s[1] = 0;
    CHECK_OK(mg_plan_search(&job, &cl, &a, &na));
    cl.refill_bytes_per_s[1] = R;
    CHECK_OK(mg_plan_search(&job, &cl, &b, &nb));
    const mg_plan *x = find(a, na, 2, 2, 4, false), *y = find(b, nb, 2, 2, 4, false);
    CHECK(x && y && y->dp_comm > x->dp_comm && y->dp_comm - x->dp_comm < G / 2 / R);
    free(a);
    free(b);
}

/* ---- mgplan -------------------------------------------------------------- */

static const char *sim = "--flops 1e12 --mem-bw 1e11";

TEST(mgplan_recommends_a_command_that_mgtrain_takes)
{
    char *out = NULL;
    int rc = mgt_sh(&out, "%s --model gpt-mini -n 2 %s --flags", mgt_tool("mgplan"), sim);
    CHECK_MSG(rc == 0 && strstr(out, "mgrun -n 2 mgtrain --model gpt-mini") &&
              strstr(out, "--mesh dp="), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s --model lenet-d2l -n 4 %s --memory 1G --top 3", mgt_tool("mgplan"), sim);
    CHECK_MSG(rc == 0 && strstr(out, "recommended: mgrun -n 4 mgtrain --model lenet-d2l") &&
              strstr(out, "because "), "%s", out);
    free(out);
    /* Figures under 10 MB have decimals in every reason ("0 of 0 MB"; a probe) */
    rc = mgt_sh(&out, "%s --model gpt-mini --layers 3 --dim 32 --heads 4 --ctx 32 --batch 12 "
                "--optimizer sgd -n 6 --memory 0.5M --top 3 %s", mgt_tool("mgplan"), sim);
    CHECK_MSG(rc == 0 && strstr(out, "only tensor parallelism fits") &&
              strstr(out, " of 0.50 MB)"), "%s", out);
    free(out);
}

TEST(mgplan_bad_input_is_one_line)
{
    static const struct { const char *args, *says; } cases[] = {
        {"--model resnet -n 2", "unknown model 'resnet'"},
        {"--model gpt-mini -n 2 --memory 1M", "nothing fits in 1.0 MB"},
        {"--model gpt-mini", "give the ranks"},
        {"--model gpt-mini -n 0", "-n 0 is out of range"},
        {"--model gpt-mini -n 2 --memory lots", "is not a size"},
        {"--model gpt-mini -n 2 --batch 3 --no-tp --no-pipeline --no-zero", "divides"},
        /* it blamed the batch */
        {"--model lenet5 -n 6 --mesh pp=6", "pp=6: lenet5 has 5 units, and a pipeline's stage"},
        /* found by a probe: --layers was ignored, an unknown model with
         * --verify was said to train by epochs, MB figures that read the
         * same were said to differ */
        {"--model mlp -n 2 --layers 7", "apply to gpt-mini, not mlp"},
        {"--model foo -n 2 --verify", "unknown model 'foo'"},
        {"--model gpt-mini -n 2 --memory 8M", "nothing fits in 8.0 MB"},
        /* a tp the heads do not split over was blamed on the batch */
        {"--model gpt-mini -n 3 --mesh tp=3", "--heads 4 does not split over 3"},
        /* offload hints that changed nothing: --offload disk:DIR */
        {"--model gpt-mini -n 2 --memory 8M --no-offload", "(leave out --no-offload)"},
        {"--model gpt-mini -n 2 --memory 8M", "(give --disk-bw: with --flops"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = NULL;
        int rc = mgt_sh(&out, "%s %s %s", mgt_tool("mgplan"), cases[i].args, sim);
        CHECK_MSG(rc == 2 && strstr(out, cases[i].says) && mgt_count(out, "\n") == 1,
                  "%s: rc %d: %s",
                  cases[i].args, rc, out);
        free(out);
    }
    /* ...and said before measuring the machine, which took minutes */
    char *out = NULL;
    int rc = mgt_sh(&out, "%s --model gpt-mini -n 3 --mesh tp=3", mgt_tool("mgplan"));
    CHECK_MSG(rc == 2 && strstr(out, "does not split") && mgt_count(out, "\n") == 1, "rc %d: %s",
              rc, out);
    free(out);
}

/* Two nodes of this host: the link between them is measured through TCP
 * by a probe of its own (which once failed on its arguments). */
TEST_T(mgplan_measures_the_link_between_nodes, 120)
{
    char *out = NULL;
    int rc = mgt_sh(&out, "%s --model gpt-mini --layers 2 --dim 64 --ctx 32 --batch 8 "
                    "--ranks-per-node 2 --nodes 2 --top 1", mgt_tool("mgplan"));
    CHECK_MSG(rc == 0 && strstr(out, "(measured)") && strstr(out, "recommended: "), "rc %d: %s",
              rc, out);
    free(out);
}

/* --verify runs the plans it predicts for and prints both figures. */
TEST_T(mgplan_verify_runs_the_plans, 240)
{
    char *out = NULL;
    int rc = mgt_sh(&out, "%s --model gpt-mini --layers 2 --dim 64 --ctx 32 --batch 8 -n 2 "
                    "--verify --verify-top 2 --verify-steps 3", mgt_tool("mgplan"));
    const char *v = strstr(out, "\nverify: ");
    int rows = 0;
    for (const char *c = v ? strchr(v + 1, '\n') : NULL; c && (c = strchr(c + 1, '\n'));)
        rows += c[1] != 0;
    CHECK_MSG(rc == 0 && v && !strstr(out, "failed") && rows >= 2, "rc %d, %d rows: %s", rc,
              rows, out);
    free(out);
}

/* mgtrain --plan auto asks the planner, says what it chose and trains
 * with it; with the plan's flags given too it refuses, one line. */
TEST_T(mgtrain_plan_auto_takes_the_planners_choice, 240)
{
    char *out = NULL;
    const char *run = mgt_tool("mgrun");
    int rc = mgt_sh(&out, "%s -n 2 %s --model gpt-mini --layers 2 --dim 64 --ctx 32 --batch 8 "
                    "--plan auto --plan-memory 2 --steps 2 --eval-every 2 --eval-windows 2",
                    run, mgt_tool("mgtrain"));
    CHECK_MSG(rc == 0 && strstr(out, "plan auto: mgrun -n 2 mgtrain --model gpt-mini") &&
              strstr(out, "because ") && strstr(out, "final: validation loss"), "rc %d: %s",
              rc, out);
    free(out);
    rc = mgt_sh(&out, "%s --model gpt-mini --plan auto --zero 1 --steps 2", mgt_tool("mgtrain"));
    CHECK_MSG(rc == 2 && strstr(out, "--plan auto chooses"), "rc %d: %s", rc, out);
    free(out);
}

/* With --offload disk:DIR and a rank's memory that no plan fits in
 * without offload (12.6M parameters: 100 MB a rank under tp=2 or pp=2,
 * more under ZeRO with its gathers), --plan auto offloads into DIR. */
TEST_T(mgtrain_plan_auto_offloads_where_nothing_else_fits, 240)
{
    char *out = NULL;
    const char *run = mgt_tool("mgrun");
    int rc = mgt_sh(&out, "%s -n 2 %s --model gpt-mini --layers 4 --dim 512 --heads 4 --ctx 32 "
                    "--batch 2 --plan auto --plan-memory 85 --offload disk:%s --steps 2 "
                    "--eval-every 2 --eval-windows 2", run, mgt_tool("mgtrain"), mgt_tmpdir());
    CHECK_MSG(rc == 0 && strstr(out, "plan auto: mgrun -n 2 mgtrain") &&
              strstr(out, " --offload disk:") && strstr(out, "without offload") &&
              strstr(out, "final: validation loss"), "rc %d: %s", rc, out);
    free(out);
}

/* The cost model the planner and the algorithm selection share: nothing
 * for one rank, more for more bytes; a link fitted to two of its own
 * times comes back. */
TEST(coll_time_and_link_fit)
{
    mg_link l = {5e-6, 2e9, 8e9, true};
    CHECK(mg_coll_time(MG_COLL_ALL_REDUCE, 1 << 20, 1, &l) == 0);
    double t1 = mg_coll_time(MG_COLL_ALL_REDUCE, 4096, 4, &l);
    double t2 = mg_coll_time(MG_COLL_ALL_REDUCE, 4 << 20, 4, &l);
    CHECK(t1 > 0 && t2 > t1);
    CHECK_CLOSE(mg_coll_time(MG_COLL_SEND, 1e6, 2, &l), 5e-6 + 1e6 / 2e9, 1e-12, 0);
    mg_link fit = *mg_link_builtin("shm");
    fit.reduce = l.reduce;
    mg_link_fit(MG_COLL_ALL_REDUCE, 4, 4096, t1, 4 << 20, t2, &fit);
    CHECK_CLOSE(fit.latency, l.latency, 0.01, 0);
    CHECK_CLOSE(fit.bandwidth, l.bandwidth, 0.01, 0);
    CHECK(mg_link_builtin("tcp") && !mg_link_builtin("carrier pigeon"));
}
