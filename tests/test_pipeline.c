/* The pipeline strategy: every schedule, at 2 and 4 stages and 1 to 8
 * micro-batches, trains as one process does over the same micro-batches
 * (lenet5 with SGD, gpt with AdamW, the head tied to the embedding across
 * the first and last stage), also with data-parallel replicas of the
 * stages (pp=2 x dp=2) and against PyTorch's gpt-mini values. Ranks are
 * real processes over real transports, trained through the strategy and
 * mg_train_step as mgtrain trains. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "equiv.h"

/* Process rank of P*D as the mesh lays it out (dp fastest, then pp). */
static int pipe_rank(int rank, int procs, void *arg)
{
    const eq_case *c = arg;
    mg_group *g = mgt_join(rank, procs, c->port, NULL, 60);
    CHECK(g);
    char spec[64];
    snprintf(spec, sizeof spec, "pp=%d,dp=%d", c->pp, c->world);
    eq_source src = {.c = c, .world = c->world, .parts = c->accumulate};
    mg_st_file *ref;
    eq_open_data(c, &src, &ref);
    /* Different seeds per rank: rank 0's parameters must reach all. */
    mg_model *m = eq_make_model(c, ref, (uint64_t)rank * 7);
    /* ZeRO's kind lists the pipeline first, then ZeRO over its replicas. */
    mg_strategy_options so =
        mg_strategy_defaults(c->stage ? MG_STRATEGY_ZERO : MG_STRATEGY_PIPELINE);
    so.zero_stage = c->stage;
    so.group = g;
    so.mesh = spec;
    so.offload_dir = c->offload;
    so.offload_window = c->window;
    so.max_batch = c->batch / c->world;
    so.pipe = (mg_pipe_options){.kind = c->pp_kind,
                                .micro_batches = c->pp_m ? c->pp_m : c->accumulate,
                                .chunks = c->chunks, .first = c->first};
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    char want[32];
    snprintf(want, sizeof want, "pipeline%s%.0d", c->stage ? "+zero" : "", c->stage);
    CHECK_MSG(c->world == 1 || c->stage == 0 || !strcmp(mg_strategy_name(s), want),
              "strategy %s, not %s", mg_strategy_name(s), want);
    src.rank = mg_mesh_coord(mg_strategy_mesh(s), MG_MESH_DP);
    /* This rank keeps its stages' parameters only (and a borrowed range). */
    int nr, S;
    const mg_range *r = mg_strategy_ranges(s, &nr);
    const int *cut = mg_pipe_cut(mg_strategy_pipe(s), &S);
    CHECK_EQ(S, c->pp * (c->chunks ? c->chunks : 1));
    size_t kept = 0;
    for (int k = 0; k < nr; k++) kept += r[k].hi - r[k].lo;
    if (c->pp > 1) CHECK(kept < mg_model_arena_size(m));
    CHECK(cut[0] == 0 && cut[S] == mg_model_num_units(m));
    float losses[64];
    float *v = eq_train(c, s, &src, losses);
    if (c->dev.kind != MG_DEVICE_CPU) {   /* on a device too, only its stages' parameters */
        size_t n = mg_model_arena_size(m) * sizeof(float);
        size_t held = mg_device_resident(c->dev, mg_model_params(m), n);
        CHECK_MSG(held <= kept * sizeof(float) + (size_t)nr * 2 * 4096, "%zu of %zu parameter "
                  "bytes held, its stages' %zu", held, n, kept * sizeof(float));
    }
    mg_pipe_stats ps = mg_pipe_get_stats(mg_strategy_pipe(s));
    CHECK_EQ(ps.steps, c->steps);
    CHECK(ps.peak_in_flight >= 1 && ps.busy_us > 0 && ps.busy_us <= ps.step_us);
    CHECK(c->pp == 1 || ps.batches > 0);
    /* The rank's share of the global mean loss (every stage reports it). */
    for (int i = 0; i < c->steps; i++) losses[i] /= (float)(c->world * c->pp);
    eq_write_floats("losses", rank, losses, (size_t)c->steps);
    eq_write_floats("params", rank, v, mg_model_num_params(m));
    int peak = ps.peak_in_flight;
    eq_write_floats("peak", rank, &(float){(float)peak}, 1);
    free(v);
    eq_end_rank(s, m, &src, ref, g);
    return 0;
}

static void run_ranks(eq_case *c)
{
    c->port = mgt_free_port();
    mgt_tmpdir();
    int st[16], procs = c->pp * c->world;
    int failed = mgt_fork_ranks(procs, pipe_rank, c, 180, st);
    CHECK_MSG(failed == 0, "%s pp=%d dp=%d %s M=%d: %d of %d ranks failed", c->model, c->pp,
              c->world, mg_pipe_name(c->pp_kind), c->accumulate, failed, procs);
}

static size_t num_params(const eq_case *c)
{
    mg_model *m = eq_make_model(c, NULL, 0);
    size_t n = mg_model_num_params(m);
    mg_model_destroy(m);
    return n;
}

/* Every rank's parameters equal one process's over the same micro-batches
 * (elementwise within tol of the largest), the losses too; each rank held
 * at most the micro-batches in flight its schedule says. */
static void check_vs_one_process(eq_case c, double tol)
{
    run_ranks(&c);
    float ref_loss[64];
    float *ref = eq_one_process(&c, ref_loss);
    size_t n = num_params(&c);
    float sum[64] = {0};
    mg_pipe_sim sim;
    int V = c.chunks ? c.chunks : 1;
    /* An interleaved step of fewer micro-batches than stages runs naive
     * over the chunks. */
    mg_pipe_kind sk = c.pp_kind == MG_PIPE_INTERLEAVED && c.accumulate < c.pp ? MG_PIPE_NAIVE
                                                                             : c.pp_kind;
    CHECK_OK(mg_pipe_simulate(sk, c.pp, c.accumulate, V, 1, 2, &sim));
    double worst = 0;
    for (int r = 0; r < c.pp * c.world; r++) {
        float *p = eq_read_floats("params", r, n), *l = eq_read_floats("losses", r, (size_t)c.steps);
        float *peak = eq_read_floats("peak", r, 1);
        int stage = r / c.world;
        CHECK_MSG((int)*peak <= sim.peak_in_flight[stage], "%s rank %d (stage %d): %d "
                  "micro-batches in flight, the schedule allows %d", mg_pipe_name(c.pp_kind), r,
                  stage, (int)*peak, sim.peak_in_flight[stage]);
        double d = eq_max_rel(p, ref, n);
        worst = fmax(worst, d);
        CHECK_MSG(d <= tol, "%s pp=%d dp=%d %s M=%d V=%d: rank %d's parameters differ from one "
                  "process's by %g (> %g) after %d steps", c.model, c.pp, c.world,
                  mg_pipe_name(c.pp_kind), c.accumulate, V, r, d, tol, c.steps);
        for (int i = 0; i < c.steps; i++) sum[i] += l[i];
        free(p);
        free(l);
        free(peak);
    }
    for (int i = 0; i < c.steps; i++)
        CHECK_MSG(fabs(sum[i] - ref_loss[i]) <= 1e-5 * ref_loss[i] + 1e-6,
                  "%s %s step %d: loss %.7g, one process %.7g", c.model, mg_pipe_name(c.pp_kind),
                  i, sum[i], ref_loss[i]);
    printf("%s pp=%d dp=%d %-11s M=%d V=%d: equals one process (max rel. difference %.2g)\n",
           c.model, c.pp, c.world, mg_pipe_name(c.pp_kind), c.accumulate, V, worst);
    free(ref);
}

/* Under a sanitizer (mgt_sanitized) a sweep of schedules x stages x
 * micro-batch counts runs each schedule at each stage count once, with the
 * micro-batch counts taking turns over them: every schedule, stage count
 * and count still runs, the executor the same, in a quarter of the time
 * (and lenet5 for 5 steps, not 20). */
static bool sanitized_skips(int P, int k, int V, int M)
{
    if (!mgt_sanitized()) return false;
    static const int Ms[] = {8, 1, 2, 4};
    int want = Ms[(P + k) % 4];
    if (V > 1 && want < P) want = 2 * P;   /* interleaved: at least the stages */
    return M != want;
}

/* lenet5 (5 units) at 2, 3 and 4 stages: naive, GPipe and 1F1B with 1,
 * 2, 4 and 8 micro-batches, interleaved at 2 stages of 2 chunks; its
 * batches by NCCL's rules (MG_BATCH_RULES=nccl), as between GPUs. */
TEST_T(pipeline_lenet5_every_schedule_equals_one_process, 400)
{
    setenv("MG_BATCH_RULES", "nccl", 1);
    const mg_pipe_kind kinds[] = {MG_PIPE_NAIVE, MG_PIPE_GPIPE, MG_PIPE_1F1B,
                                  MG_PIPE_INTERLEAVED};
    for (int P = 2; P <= 4; P++)
        for (int k = 0; k < 4; k++)
            for (int M = 1; M <= 8; M *= 2) {
                int V = kinds[k] == MG_PIPE_INTERLEAVED ? 2 : 1;
                if (P * V > 5 || (V > 1 && M < P) || sanitized_skips(P, k, V, M)) continue;
                eq_case c = {.model = "lenet5", .world = 1, .batch = 16, .accumulate = M,
                             .steps = mgt_reps(20), .pp = P, .pp_kind = kinds[k],
                             .chunks = V};
                check_vs_one_process(c, 1e-5);
            }
}

/* gpt with its head tied to the embedding across the first and last
 * stage: gpt-6 (9 units) at 2, 3 and 4 stages, interleaved up to 4 x 2,
 * also with micro-batches in groups longer than the stages (2 x 2 with
 * M = 5: groups of 3 and 2; 3 x 2 with M = 8: two of 4), where what goes
 * round between the last rank and the first is received before it is
 * used. Its batches run by NCCL's rules (MG_BATCH_RULES=nccl: a send ends
 * only once its receive is posted, messages matched in the order posted),
 * as between GPUs: no schedule deadlocks or crosses two messages. */
TEST_T(pipeline_gpt_tied_head_and_interleaved_equal_one_process, 400)
{
    setenv("MG_BATCH_RULES", "nccl", 1);
    /* san: run under a sanitizer too (the tie across 4 stages and across
     * 3 of 2 chunks; the other schedules' ties run in the pp=2 tests). */
    static const struct { int P, M, V; mg_pipe_kind k; bool san; } cases[] = {
        {2, 4, 1, MG_PIPE_1F1B, 0}, {4, 4, 1, MG_PIPE_GPIPE, 1}, {4, 8, 1, MG_PIPE_1F1B, 0},
        {3, 6, 1, MG_PIPE_1F1B, 0}, {2, 4, 2, MG_PIPE_INTERLEAVED, 0},
        {3, 3, 2, MG_PIPE_INTERLEAVED, 1}, {4, 4, 2, MG_PIPE_INTERLEAVED, 0},
        {4, 8, 2, MG_PIPE_INTERLEAVED, 0}, {2, 5, 2, MG_PIPE_INTERLEAVED, 1},
        {3, 8, 2, MG_PIPE_INTERLEAVED, 0}, {2, 1, 1, MG_PIPE_NAIVE, 0},
        {4, 2, 1, MG_PIPE_GPIPE, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (mgt_sanitized() && !cases[i].san) continue;
        eq_case c = {.model = "gpt-6", .world = 1, .batch = GB, .accumulate = cases[i].M,
                     .steps = 5, .pp = cases[i].P, .pp_kind = cases[i].k, .chunks = cases[i].V};
        check_vs_one_process(c, 1e-4);
    }
}

/* Steps cut short (fewer micro-batches than M, as at an epoch's end)
 * train as one process over those micro-batches: interleaved in groups
 * of what is left (3 of 2 stages, 4 of 3), or, with fewer than P, one
 * micro-batch at a time (2 of 4 stages). By NCCL's rules, as above. */
TEST_T(pipeline_short_steps_equal_one_process, 200)
{
    setenv("MG_BATCH_RULES", "nccl", 1);
    static const struct { const char *model; int P, m, acc; mg_pipe_kind k; } cases[] = {
        {"lenet5", 2, 4, 3, MG_PIPE_INTERLEAVED}, {"lenet5", 2, 8, 5, MG_PIPE_1F1B},
        {"gpt-6", 4, 4, 2, MG_PIPE_INTERLEAVED}, {"gpt-6", 3, 6, 4, MG_PIPE_INTERLEAVED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bool lm = cases[i].model[0] == 'g';
        eq_case c = {.model = cases[i].model, .world = 1, .batch = lm ? 2 : 16,
                     .accumulate = cases[i].acc, .steps = 3, .pp = cases[i].P,
                     .pp_kind = cases[i].k, .pp_m = cases[i].m,
                     .chunks = cases[i].k == MG_PIPE_INTERLEAVED ? 2 : 1};
        check_vs_one_process(c, lm ? 1e-4 : 1e-5);
    }
}

/* pp=2 x dp=2: each stage's replicas average their gradients. */
TEST_T(pipeline_pp2_dp2_equals_one_process, 300)
{
    eq_case c = {.model = "lenet5", .world = 2, .batch = 32, .accumulate = 4, .steps = 4,
                 .pp = 2, .pp_kind = MG_PIPE_1F1B};
    check_vs_one_process(c, 1e-5);
    eq_case g = {.model = "gpt-mini", .world = 2, .batch = GB, .accumulate = 2, .steps = 4,
                 .pp = 2, .pp_kind = MG_PIPE_GPIPE};
    check_vs_one_process(g, 1e-4);
}

/* pp=2 x dp=2 under ZeRO 1, 2 and 3 (each stage's replicas shard its
 * optimizer's state, gradients and parameters, zero_pipeline.c): lenet5
 * equals one process, gpt-mini (its head tied to the embedding across the
 * stages) matches PyTorch's 20 reference steps within the one-process
 * test's bounds, on 1F1B, GPipe and interleaved; under stage 3 a
 * checkpoint written, read back and written again is the same bytes.
 * The stages' batches by NCCL's rules (MG_BATCH_RULES=nccl). */
TEST_T(pipeline_pp2_dp2_zero_1_2_3_equal_one_process, 400)
{
    setenv("MG_BATCH_RULES", "nccl", 1);
    const mg_pipe_kind kinds[] = {MG_PIPE_1F1B, MG_PIPE_GPIPE, MG_PIPE_INTERLEAVED};
    for (int stage = 1; stage <= 3; stage++) {
        mg_pipe_kind k = kinds[stage - 1];
        int V = k == MG_PIPE_INTERLEAVED ? 2 : 1;
        eq_case c = {.model = "lenet5", .stage = stage, .world = 2, .batch = 32,
                     .accumulate = 4, .steps = 4, .pp = 2, .pp_kind = k, .chunks = V};
        check_vs_one_process(c, 1e-5);
        /* Under a sanitizer gpt-mini's tied head under stage 3 only. */
        if (mgt_sanitized() && stage < 3) continue;
        char ck[600];
        snprintf(ck, sizeof ck, "%s/zero%d.st", mgt_tmpdir(), stage);
        eq_case g = {.model = "gpt-mini", .stage = stage, .world = 2, .batch = GB / 2,
                     .accumulate = 2, .steps = 20, .pp = 2, .pp_kind = k, .chunks = V,
                     .save = stage == 3 ? ck : NULL};
        run_ranks(&g);
        char what[64];
        snprintf(what, sizeof what, "gpt-mini pp=2 dp=2 zero-%d %s", stage, mg_pipe_name(k));
        eq_match_pytorch(4, what);
    }
}

/* With the optimizer's state in files (--offload disk:DIR, streamed in
 * small windows) a pipeline equals one process: lenet5 on pp=2 for 20
 * steps; gpt-mini on pp=2 for 5 steps (the bounds of the other gpt
 * cases), and for 20 steps the same bits as the pipeline in memory (which
 * matches PyTorch over those 20 steps, pipeline_gpt_mini_every_...);
 * pp=2 x dp=2 with a checkpoint written, read back and written again
 * (the same bytes, eq_train). */
TEST_T(pipeline_with_disk_offload_equals_one_process, 300)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/offload", mgt_tmpdir());
    CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST);
    eq_case c = {.model = "lenet5", .world = 1, .batch = 16, .accumulate = 4,
                 .steps = mgt_reps(20), .pp = 2, .pp_kind = MG_PIPE_1F1B, .offload = dir,
                 .window = 4096};
    check_vs_one_process(c, 1e-5);
    eq_case g = {.model = "gpt-mini", .world = 1, .batch = GB / 2, .accumulate = 2, .steps = 5,
                 .pp = 2, .pp_kind = MG_PIPE_1F1B, .offload = dir, .window = 4096};
    check_vs_one_process(g, 1e-4);
    g.steps = mgt_reps(20);   /* bit for bit: a quarter under a sanitizer */
    size_t n = num_params(&g);
    float *p[2][2], *l[2][2];
    for (int off = 0; off < 2; off++) {
        g.offload = off ? dir : NULL;
        run_ranks(&g);
        for (int r = 0; r < 2; r++) {
            p[off][r] = eq_read_floats("params", r, n);
            l[off][r] = eq_read_floats("losses", r, (size_t)g.steps);
        }
    }
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(!memcmp(p[0][r], p[1][r], n * sizeof(float)) &&
                  !memcmp(l[0][r], l[1][r], (size_t)g.steps * sizeof(float)),
                  "gpt-mini pp=2, 20 steps: rank %d's parameters or losses with offload differ "
                  "from the pipeline in memory", r);
        for (int off = 0; off < 2; off++) {
            free(p[off][r]);
            free(l[off][r]);
        }
    }
    char save[1024];
    snprintf(save, sizeof save, "%s/pp-offload.safetensors", mgt_tmpdir());
    eq_case d = {.model = "gpt-mini", .world = 2, .batch = GB, .accumulate = 2, .steps = 4,
                 .pp = 2, .pp_kind = MG_PIPE_GPIPE, .offload = dir, .window = 4096,
                 .save = save};
    check_vs_one_process(d, 1e-4);
    char again[1100];
    snprintf(again, sizeof again, "%s.again", save);
    CHECK_MSG(eq_same_file(save, again), "pp=2 x dp=2 with offload: the checkpoint read back "
              "and written again differs");
}

/* On a device (emu here; a GPU's run in test_mgtrain.c) pipelines equal
 * one process on the CPU: the stages' activations and gradients received
 * in device memory (interleaved's two rounds too: in lock-step), the
 * replicas' all-reduce and the tied head's sum through the host.
 * lenet5 at 2, 3 and 4 stages; gpt-6 interleaved with its head tied
 * across ranks, also with M = 5 (groups of 3 and 2: what goes round is
 * received early, into device memory); gpt-mini as pp=2 x dp=2. */
TEST_T(pipeline_on_a_device_equals_one_process_on_the_cpu, 300)
{
    const mg_device emu = {MG_DEVICE_EMU, 0};
    for (int P = 2; P <= 4; P++) {
        eq_case c = {.model = "lenet5", .world = 1, .batch = 16, .accumulate = 4, .steps = 4,
                     .pp = P, .pp_kind = MG_PIPE_1F1B, .dev = emu};
        check_vs_one_process(c, 1e-5);
    }
    for (int M = 4; M <= 5; M++) {
        eq_case c = {.model = "gpt-6", .world = 1, .batch = GB, .accumulate = M, .steps = 3,
                     .pp = 2, .pp_kind = MG_PIPE_INTERLEAVED, .chunks = 2, .dev = emu};
        check_vs_one_process(c, 1e-4);
    }
    eq_case g = {.model = "gpt-mini", .world = 2, .batch = GB, .accumulate = 2, .steps = 3,
                 .pp = 2, .pp_kind = MG_PIPE_GPIPE, .dev = emu};
    check_vs_one_process(g, 1e-4);
}

/* gpt-mini's 20 reference steps (8 rows of 64 per step, in M micro-batches)
 * through every schedule at 2 and 4 stages with M = 1, 2, 4, 8 (interleaved:
 * 2 stages of 2 chunks; 4 x 2 would need 8 units, gpt-mini has 7):
 * PyTorch's losses and final parameters within the one-process test's
 * bounds (test_gpt.c). */
TEST_T(pipeline_gpt_mini_every_schedule_matches_pytorch, 600)
{
    const mg_pipe_kind kinds[] = {MG_PIPE_NAIVE, MG_PIPE_GPIPE, MG_PIPE_1F1B,
                                  MG_PIPE_INTERLEAVED};
    for (int P = 2; P <= 4; P += 2)
        for (int k = 0; k < 4; k++)
            for (int M = 1; M <= 8; M *= 2) {
                int V = kinds[k] == MG_PIPE_INTERLEAVED ? 2 : 1;
                if (P * V > 7 || (V > 1 && M < P) || sanitized_skips(P, k, V, M)) continue;
                /* Under a sanitizer each schedule at one stage count:
                 * naive and 1F1B at 4, GPipe and interleaved at 2. */
                if (mgt_sanitized() && P != (k % 2 ? 2 : 4)) continue;
                eq_case c = {.model = "gpt-mini", .world = 1, .batch = GB / M, .accumulate = M,
                             .steps = 20, .pp = P, .pp_kind = kinds[k], .chunks = V};
                run_ranks(&c);
                char what[64];
                snprintf(what, sizeof what, "gpt-mini pp=%d %s M=%d V=%d", P,
                         mg_pipe_name(kinds[k]), M, V);
                eq_match_pytorch(P, what);
            }
}

/* ---- a stage that dies or stops mid-step ------------------------------------ */

/* Rank `rank` of a pipeline over all procs ranks: its group, its data
 * (every micro-batch of the step) and reference, the strategy's options
 * (c's schedule, M = accumulate) and the model (one process's
 * initialisation). */
typedef struct {
    mg_group *g;
    eq_source src;
    mg_st_file *ref;
    mg_strategy_options so;
    char mesh[32];
    mg_model *m;
} stage_rank;

static void one_pipeline_rank(const eq_case *c, int rank, int procs, stage_rank *r)
{
    r->g = mgt_join(rank, procs, c->port, NULL, 30);
    CHECK(r->g);
    r->src = (eq_source){.c = c, .rank = 0, .world = 1, .parts = c->accumulate};
    eq_open_data(c, &r->src, &r->ref);
    r->so = mg_strategy_defaults(MG_STRATEGY_PIPELINE);
    r->so.group = r->g;
    snprintf(r->mesh, sizeof r->mesh, "pp=%d", procs);
    r->so.mesh = r->mesh;
    r->so.max_batch = c->batch;
    r->so.pipe = (mg_pipe_options){.kind = c->pp_kind, .micro_batches = c->accumulate};
    r->m = eq_make_model(c, r->ref, 0);
}

typedef struct {
    eq_case c;
    int victim;     /* the rank that dies (or stops) */
    bool stop;      /* SIGSTOP instead of SIGKILL */
} fault_case;

/* The victim's forwards: at its second step's third unit it goes. */
static void fault_hook(void *ud, mg_tape *t, int unit)
{
    (void)t;
    (void)unit;
    int *calls = ud;
    if (++*calls == 12) raise(calls[1] ? SIGSTOP : SIGKILL);
}

static int fault_rank(int rank, int procs, void *arg)
{
    const fault_case *f = arg;
    const eq_case *c = &f->c;
    stage_rank pr;
    one_pipeline_rank(c, rank, procs, &pr);
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(pr.m, &pr.so, &s));
    int calls[2] = {0, f->stop};
    static const mg_unit_hooks h = {.post_forward = fault_hook};
    if (rank == f->victim) {
        char p[512];
        eq_out_path(p, sizeof p, "victim", 0);
        FILE *pf = fopen(p, "w");
        CHECK(pf && fprintf(pf, "%d\n", (int)getpid()) > 0);
        fclose(pf);
        CHECK_OK(mg_model_add_hooks(pr.m, &h, calls));
    }
    mg_optim *o = eq_make_optim(c, s);
    mg_step_options sto = {.accumulate = c->accumulate, .lr = 0.05f};
    mg_status st = MG_OK;
    double t0 = 0;
    for (int k = 0; k < c->steps && !st; k++) {
        pr.src.step = k;
        pr.src.j = 0;
        mg_step_result r;
        t0 = mg_now();
        st = mg_train_step(s, o, &sto, eq_next, &pr.src, &r);
    }
    double dt = mg_now() - t0;
    const char *msg = mg_last_error();
    printf("rank %d after %.2f s: %s\n", rank, dt, msg);
    CHECK_MSG(st != MG_OK, "rank %d trained on after rank %d %s", rank, f->victim,
              f->stop ? "stopped" : "died");
    /* Within 5 s of the step's start, naming a rank and the pipeline's
     * stage and micro-batch; the victim's neighbours name it. */
    CHECK_MSG(dt < 5, "rank %d took %.1f s to stop", rank, dt);
    CHECK(strstr(msg, "micro-batch") && strstr(msg, "pipeline stage"));
    char dead[32];
    snprintf(dead, sizeof dead, "rank %d", f->victim);
    if (abs(rank - f->victim) == 1) CHECK_MSG(strstr(msg, dead), "%s", msg);
    if (f->stop && rank == 0) {
        char p[512];
        eq_out_path(p, sizeof p, "victim", 0);
        FILE *pf = fopen(p, "r");
        int pid = 0;
        CHECK(pf && fscanf(pf, "%d", &pid) == 1);
        fclose(pf);
        kill(pid, SIGKILL);
    }
    /* The job's group learns it too (and its end need not wait for the
     * victim, as it does after a clean run). */
    CHECK(mg_barrier(pr.g) != MG_OK);
    mg_optim_destroy(o);
    eq_end_rank(s, pr.m, &pr.src, pr.ref, pr.g);
    return 0;
}

/* A stage killed (or stopped: found silent after MG_PEER_TIMEOUT, here
 * 2 s) in the middle of a step: every other stage's step fails within
 * 5 s, the neighbours naming it, all naming a stage and micro-batch. */
TEST_T(pipeline_stage_dying_or_stopping_mid_step_stops_every_stage, 120)
{
    for (int stop = 0; stop < 2; stop++)
        for (int victim = 1; victim <= 2; victim++) {
            fault_case f = {.c = {.model = "lenet5", .world = 1, .batch = 16, .accumulate = 4,
                                  .steps = 4, .pp = 3, .pp_kind = MG_PIPE_1F1B},
                            .victim = victim, .stop = stop};
            f.c.port = mgt_free_port();
            mgt_tmpdir();   /* one for every rank */
            if (stop) setenv("MG_PEER_TIMEOUT", "2", 1);
            int st[3];
            mgt_fork_ranks(3, fault_rank, &f, 60, st);
            unsetenv("MG_PEER_TIMEOUT");
            for (int r = 0; r < 3; r++)
                if (r != victim)
                    CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "%s rank %d: rank "
                              "%d status %d", stop ? "stopped" : "killed", victim, r, st[r]);
            CHECK(WIFSIGNALED(st[victim]) && WTERMSIG(st[victim]) == SIGKILL);
        }
}

/* ---- stages that disagree --------------------------------------------------- */

typedef struct {
    eq_case c;
    int variant;   /* 0: rank 1 given another micro-batch count; 1: rank 1's micro-batches
                    * one sample short */
} mismatch_case;

static bool short_next(void *ud, mg_micro_batch *b)
{
    if (!eq_next(ud, b)) return false;
    b->n--;
    return true;
}

static int mismatch_rank(int rank, int procs, void *arg)
{
    const mismatch_case *mc = arg;
    const eq_case *c = &mc->c;
    stage_rank pr;
    one_pipeline_rank(c, rank, procs, &pr);
    if (mc->variant == 0 && rank == 1) pr.so.pipe.micro_batches *= 2;
    mg_strategy *s;
    mg_status st = mg_strategy_create(pr.m, &pr.so, &s);
    if (mc->variant == 0) {
        printf("rank %d: %s\n", rank, mg_last_error());
        CHECK(st == MG_EMISMATCH);
        CHECK(strstr(mg_last_error(), "rank 1 was made with pipe.micro_batches 4, rank 0 with 2"));
    } else {
        CHECK_OK(st);
        mg_optim *o = eq_make_optim(c, s);
        mg_step_options sto = {.accumulate = c->accumulate, .lr = 0.05f};
        mg_step_result r;
        double t0 = mg_now();
        st = mg_train_step(s, o, &sto, rank == 1 ? short_next : eq_next, &pr.src, &r);
        printf("rank %d after %.2f s: %s\n", rank, mg_now() - t0, mg_last_error());
        /* Found at the first transfer, named by both stages. */
        CHECK(st != MG_OK && mg_now() - t0 < 5);
        CHECK(strstr(mg_last_error(), "micro-batch 0") &&
              strstr(mg_last_error(), rank == 0 ? "pipeline stage 0 on rank 0"
                                                : "pipeline stage 1 on rank 1") &&
              strstr(mg_last_error(), rank == 0 ? "stage 1 on rank 1" : "stage 0 on rank 0"));
        mg_optim_destroy(o);
        eq_end_rank(s, NULL, NULL, NULL, NULL);
    }
    eq_end_rank(NULL, pr.m, &pr.src, pr.ref, pr.g);
    return 0;
}

/* Stages given other schedules are refused before any step, naming the
 * rank; stages whose micro-batches differ in shape fail at the first
 * transfer, each naming both stages and the micro-batch. */
TEST_T(pipeline_stages_that_disagree_are_named, 60)
{
    for (int v = 0; v < 2; v++) {
        mismatch_case mc = {.c = {.model = "lenet5", .world = 1, .batch = 4, .accumulate = 2,
                                  .steps = 1, .pp = 2},
                            .variant = v};
        mc.c.port = mgt_free_port();
        mgt_tmpdir();
        int st[2];
        CHECK_EQ(mgt_fork_ranks(2, mismatch_rank, &mc, 40, st), 0);
    }
}

/* ---- evaluation and sampling through the stages ------------------------------ */

typedef struct {
    eq_case c;
    float val;
    int32_t gen[24];
} eval_case;

static void eval_and_sample(mg_strategy *s, const eq_source *src, float *val, int32_t *gen)
{
    double v;
    CHECK_OK(mg_strategy_lm_val_loss(s, src->text, 3, 0, 1, 0, &v));
    *val = (float)v;
    const int32_t prompt[3] = {'T', 'h', 'e'};
    CHECK_OK(mg_strategy_generate(s, prompt, 3, 24, 0.8f, 20, 5, gen));
}

static int eval_rank(int rank, int procs, void *arg)
{
    eval_case *ec = arg;
    const eq_case *c = &ec->c;
    mg_group *g = mgt_join(rank, procs, c->port, NULL, 60);
    CHECK(g);
    eq_source src = {.c = c, .world = 1, .parts = c->accumulate};
    mg_st_file *ref;
    eq_open_data(c, &src, &ref);
    mg_model *m = eq_make_model(c, ref, (uint64_t)rank * 7);
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_PIPELINE);
    char mesh[32];
    snprintf(mesh, sizeof mesh, "pp=%d", procs);
    so.group = g;
    so.mesh = mesh;
    so.max_batch = 3;
    so.pipe = (mg_pipe_options){.kind = c->pp_kind, .micro_batches = c->accumulate,
                                .chunks = c->chunks};
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    float val;
    int32_t gen[24];
    eval_and_sample(s, &src, &val, gen);
    CHECK(mg_model_training(m));   /* left as it was */
    eq_write_floats("val", rank, &val, 1);
    eq_write_floats("gen", rank, (const float *)gen, 24);
    eq_end_rank(s, m, &src, ref, g);
    return 0;
}

/* The validation loss and a sample drawn through the stages (the last
 * stage picks each token, the others take it) are one process's; the
 * forwards' batches by NCCL's rules, as above. */
TEST_T(pipeline_evaluates_and_samples_as_one_process, 120)
{
    setenv("MG_BATCH_RULES", "nccl", 1);
    eq_case one = {.model = "gpt-6", .world = 1, .batch = 3, .accumulate = 1};
    eq_source src = {.c = &one, .world = 1, .parts = 1};
    mg_st_file *ref;
    eq_open_data(&one, &src, &ref);
    mg_model *m = eq_make_model(&one, ref, 0);
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_SINGLE);
    so.max_batch = 3;
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    float val;
    int32_t gen[24];
    eval_and_sample(s, &src, &val, gen);
    eq_end_rank(s, m, &src, ref, NULL);
    static const struct { int P, M, V; mg_pipe_kind k; } cases[] = {
        {2, 2, 1, MG_PIPE_1F1B}, {3, 4, 1, MG_PIPE_GPIPE}, {2, 4, 2, MG_PIPE_INTERLEAVED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        eval_case ec = {.c = {.model = "gpt-6", .world = 1, .batch = 3,
                              .accumulate = cases[i].M, .pp = cases[i].P,
                              .pp_kind = cases[i].k, .chunks = cases[i].V}};
        ec.c.port = mgt_free_port();
        mgt_tmpdir();
        int st[4];
        CHECK_EQ(mgt_fork_ranks(cases[i].P, eval_rank, &ec, 60, st), 0);
        for (int r = 0; r < cases[i].P; r++) {
            float *v = eq_read_floats("val", r, 1), *t = eq_read_floats("gen", r, 24);
            CHECK_MSG(fabsf(*v - val) <= 1e-6f * val, "%s P=%d rank %d: validation loss %.7g, "
                      "one process %.7g", mg_pipe_name(cases[i].k), cases[i].P, r, *v, val);
            CHECK_MSG(!memcmp(t, gen, sizeof gen), "%s P=%d rank %d: another sample",
                      mg_pipe_name(cases[i].k), cases[i].P, r);
            free(v);
            free(t);
        }
        printf("gpt-6 %s P=%d M=%d: validation loss %.6f and a 24-token sample as one process\n",
               mg_pipe_name(cases[i].k), cases[i].P, cases[i].M, val);
    }
}

/* ---- batch norm and dropout across stages -------------------------------------- */

/* conv, batch norm, dropout and two linear layers: running statistics
 * (buffers) and dropout masks on different stages. */
static mg_model *bn_model(uint64_t seed, mg_device dev)
{
    mg_layer *l[] = {mg_layer_conv2d("conv", 1, 4, 3, 1, 1, true, MG_POOL_MAX),
                     mg_layer_batchnorm2d("bn", 4), mg_layer_flatten("flat"),
                     mg_layer_dropout("drop", 0.3f), mg_layer_linear("fc1", 64, 16, true),
                     mg_layer_batchnorm2d("bn2", 16), mg_layer_linear("fc2", 16, 5, false)};
    mg_model *m;
    CHECK_OK(mg_model_create_from("bn-drop", mg_layer_sequential(NULL, l, 7), 1, 8, 8, seed, &m));
    mg_model_set_dropout_seed(m, 99);
    if (dev.kind != MG_DEVICE_CPU) CHECK_OK(mg_model_to_device(m, dev));
    return m;
}

typedef struct {
    float x[4][6 * 64];
    int32_t y[4][6];
    int j;
} bn_source;

static bool bn_next(void *ud, mg_micro_batch *b)
{
    bn_source *s = ud;
    if (s->j == 4) return false;
    *b = (mg_micro_batch){s->x[s->j], s->y[s->j], 6, false};
    s->j++;
    return true;
}

/* 3 SGD steps of 4 micro-batches, then the checkpoint at path. */
static void bn_train(mg_strategy *s, const char *path)
{
    static bn_source src;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 6 * 64; i++) {
            src.x[k][i] = (float)((unsigned)(i * 2654435761u + (unsigned)k * 97u) % 1000u) / 500.0f - 1;
            if (i < 6) src.y[k][i] = (i * 3 + k) % 5;
        }
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.1f);
    oc.momentum = 0.9f;
    mg_optim *o;
    CHECK_OK(mg_strategy_optim(s, &oc, &o));
    mg_step_options so = {.accumulate = 4, .lr = 0.1f};
    for (int step = 0; step < 3; step++) {
        src.j = 0;
        mg_step_result r;
        CHECK_OK(mg_train_step(s, o, &so, bn_next, &src, &r));
        CHECK_EQ(r.samples, 24);
    }
    CHECK_OK(mg_strategy_save(s, path, o, NULL));
    mg_optim_destroy(o);
}

static void bn_path(char *p, size_t cap, const char *what)
{
    snprintf(p, cap, "%s/%s.st", mgt_tmpdir(), what);
}

static int bn_rank(int rank, int procs, void *arg)
{
    const eq_case *c = arg;
    mg_group *g = mgt_join(rank, procs, c->port, NULL, 60);
    CHECK(g);
    mg_model *m = bn_model((uint64_t)rank + 5, c->dev);
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_PIPELINE);
    char mesh[32];
    snprintf(mesh, sizeof mesh, "pp=%d", procs);
    so.group = g;
    so.mesh = mesh;
    so.max_batch = 6;
    so.pipe = (mg_pipe_options){.kind = c->pp_kind, .micro_batches = 4, .chunks = c->chunks};
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    char p[512];
    bn_path(p, sizeof p, "bn-pipeline");
    bn_train(s, p);
    eq_end_rank(s, m, NULL, NULL, g);
    return 0;
}

static bool same_bytes(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    for (int x, y; same;) {
        x = fgetc(fa);
        y = fgetc(fb);
        same = x == y;
        if (x == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* Running statistics on several stages (saved by the stage that holds
 * them) and dropout masks drawn on a stage as one process draws them:
 * the checkpoint after 3 steps is one process's, byte for byte; on a
 * device (emu) one process's on that device. */
static void bn_checkpoints(mg_device dev, int ncases)
{
    char one[512], pipe[512];
    bn_path(one, sizeof one, "bn-one");
    bn_path(pipe, sizeof pipe, "bn-pipeline");
    mg_model *m = bn_model(5, dev);
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_SINGLE);
    so.max_batch = 6;
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    bn_train(s, one);
    eq_end_rank(s, m, NULL, NULL, NULL);
    static const struct { int P, V; mg_pipe_kind k; } cases[] = {
        {2, 1, MG_PIPE_1F1B}, {3, 1, MG_PIPE_GPIPE}, {2, 2, MG_PIPE_INTERLEAVED},
        {4, 1, MG_PIPE_1F1B},
    };
    for (int i = 0; i < ncases; i++) {
        eq_case c = {.pp = cases[i].P, .pp_kind = cases[i].k, .chunks = cases[i].V,
                     .port = mgt_free_port(), .dev = dev};
        int st[4];
        CHECK_EQ(mgt_fork_ranks(c.pp, bn_rank, &c, 60, st), 0);
        CHECK_MSG(same_bytes(one, pipe), "%s P=%d: the checkpoint differs from one process's",
                  mg_pipe_name(c.pp_kind), c.pp);
    }
}

TEST_T(pipeline_batch_norm_and_dropout_checkpoint_is_one_process, 120)
{
    bn_checkpoints((mg_device){MG_DEVICE_CPU, 0}, 4);
}

TEST_T(pipeline_batch_norm_and_dropout_on_a_device_checkpoint_is_one_process, 120)
{
    bn_checkpoints((mg_device){MG_DEVICE_EMU, 0}, 3);
}
