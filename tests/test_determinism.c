/* Tests of bitwise determinism (issue 35): mgtrain --print-hash (a SHA-256
 * of the parameters as logical tensors, whatever plan holds them) and
 * --deterministic (the same bits at any world size). */
#include <openssl/evp.h>
#include "devices.h"
#include "harness.h"
#include "multigrad/multigrad.h"

#define GPT_SMALL "--model gpt-mini --layers 2 --dim 64 --heads 4 --ctx 64 --eval-windows 4"

/* The hex digest of "<what> sha256 <hex>" in out, or "". */
static void digest_of(const char *out, const char *what, char hex[65])
{
    char key[32];
    snprintf(key, sizeof key, "%s sha256 ", what);
    const char *h = out ? strstr(out, key) : NULL;
    hex[0] = 0;
    if (h) sscanf(h + strlen(key), "%64[0-9a-f]", hex);
}

static void hash_of(const char *out, char hex[65]) { digest_of(out, "parameters", hex); }

/* The definition, computed here from a checkpoint file: each parameter
 * of the model in table order, its name and a NUL, its dtype's name and a
 * NUL, its dimension count and dimensions (int64), its bytes. */
static void hash_file(const char *path, const char *const *names, int n, char hex[65])
{
    mg_st_file *f;
    hex[0] = 0;
    CHECK_OK(mg_st_open(path, &f));
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    for (int i = 0; i < n; i++) {
        const mg_st_tensor *x = mg_st_find(f, names[i]);
        CHECK_MSG(x, "%s has no %s", path, names[i]);
        if (!x) break;
        const char *dt = mg_st_dtype_name(x->dtype);
        int64_t dims[9] = {x->ndim};
        for (int d = 0; d < x->ndim; d++) dims[d + 1] = x->shape[d];
        EVP_DigestUpdate(md, names[i], strlen(names[i]) + 1);
        EVP_DigestUpdate(md, dt, strlen(dt) + 1);
        EVP_DigestUpdate(md, dims, sizeof *dims * (size_t)(x->ndim + 1));
        EVP_DigestUpdate(md, x->data, x->nbytes);
    }
    uint8_t d[32];
    unsigned len = 0;
    EVP_DigestFinal_ex(md, d, &len);
    EVP_MD_CTX_free(md);
    mg_st_close(f);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

/* The hash is of the parameters, not of the plan holding them: a model
 * trained 3 steps and saved, read back under one process, DDP, ZeRO-3,
 * tp=2, pp=2, pp=2 x tp=2, a parameter server and DataParallel threads,
 * prints the hash the training printed, which is the definition's hash
 * of the file; one more step changes it. */
TEST_T(print_hash_is_the_same_under_every_plan, 180)
{
    char ck[512], *out, want[65], got[65];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ck, sizeof ck, "%s/h.st", mgt_tmpdir());
    const char *job = GPT_SMALL " --batch 8 --eval-every 3 --no-eval-on-start --quiet";
    int rc = mgt_sh(&out, "%s %s --steps 3 --save %s --print-hash", bin, job, ck);
    hash_of(out, want);
    CHECK_MSG(rc == 0 && want[0], "rc %d: %s", rc, out);
    free(out);
    /* The definition, from the file (gpt-mini's parameters in its order). */
    mg_model *m;
    mg_gpt_config cfg = {.layers = 2, .dim = 64, .heads = 4, .ctx = 64, .vocab = 256};
    CHECK_OK(mg_model_create_gpt(&cfg, 1, &m));
    const char *names[64];
    int n = 0;
    for (int i = 0; m && i < mg_model_num_tensors(m) && n < 64; i++)
        if (!mg_model_tensor(m, i)->is_buffer) names[n++] = mg_model_tensor(m, i)->name;
    hash_file(ck, names, n, got);
    CHECK_MSG(!strcmp(got, want), "the file's hash %s, printed %s", got, want);
    mg_model_destroy(m);
    const char *plans[][2] = {{"", ""}, {"-n 2", "--parallel ddp"},
                              {"-n 2", "--mesh dp=2 --zero 3"}, {"-n 2", "--mesh tp=2"},
                              {"-n 2", "--mesh pp=2"}, {"-n 4", "--mesh pp=2,tp=2"},
                              {"-n 3", "--parallel ps --servers 2"},
                              {"", "--parallel dp --workers 2"}};
    for (size_t i = 0; i < sizeof plans / sizeof *plans; i++) {
        rc = *plans[i][0] ? mgt_sh(&out, "%s %s %s %s --eval-only --resume %s --print-hash %s",
                                   run, plans[i][0], bin, job, ck, plans[i][1])
                          : mgt_sh(&out, "%s %s --eval-only --resume %s --print-hash %s", bin,
                                   job, ck, plans[i][1]);
        hash_of(out, got);
        CHECK_MSG(rc == 0 && !strcmp(got, want), "%s %s: '%s' against '%s': %s", plans[i][0],
                  plans[i][1], got, want, out);
        free(out);
    }
    rc = mgt_sh(&out, "%s %s --steps 4 --resume %s --print-hash", bin, job, ck);
    hash_of(out, got);
    CHECK_MSG(rc == 0 && got[0] && strcmp(got, want), "a step more: %s", out);
    free(out);
}

/* --deterministic: 100 steps of gpt-mini and an epoch of lenet5 (both
 * clipped to a norm of 0.5) end with the same parameters and the same
 * figures (every row's losses and accuracies; gpt-mini's 13 validation
 * windows and lenet5's 10,000 test images shared in whole batches), bit
 * for bit, on 1, 2,
 * 4 and 8 ranks under DDP, under ZeRO-1 (2 ranks), 2 (4) and 3 (2 and
 * 4), and on 3 and 4 DataParallel threads of one process (8 virtual
 * shards; 8 ranks oversubscribe the machine); and through pipelines of
 * 2 stages under GPipe, 1F1B and the interleaved schedule (2 chunks a
 * rank), and of 2 stages x 2 replicas, alone and under ZeRO-3 (gpt-mini's
 * tied head on the last stage, its embedding on the first: every plan
 * adds the head's and the embedding's trees after summing them); and
 * under tensor parallelism (tp=2, alone, with 2 ZeRO-1 replicas and in 2
 * pipeline stages: what the split cuts is computed in 2 fixed chunks on
 * every plan, --tp-chunks' default). */
TEST_T(deterministic_hash_is_the_same_at_1_2_4_8_ranks, 300)
{
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const char *jobs[2] = {
        GPT_SMALL " --batch 16 --steps 100 --eval-every 50 --eval-windows 13 --clip-grad 0.5",
        "--model lenet5 --epochs 1 --clip-grad 0.5"};
    const struct { int ranks; const char *plan; } runs[] = {
        {1, ""}, {2, "--parallel ddp"}, {4, "--parallel ddp"}, {8, "--parallel ddp"},
        {2, "--mesh dp=2 --zero 1"}, {4, "--mesh dp=4 --zero 2"}, {2, "--mesh dp=2 --zero 3"},
        {4, "--mesh dp=4 --zero 3"},
        {1, "--parallel dp --workers 3"}, {1, "--parallel dp --workers 4"},
        {2, "--mesh pp=2 --pp-schedule gpipe"}, {2, "--mesh pp=2 --pp-schedule 1f1b"},
        {2, "--mesh pp=2 --pp-schedule interleaved"},
        {4, "--mesh pp=2,dp=2 --pp-schedule interleaved"},
        {4, "--mesh pp=2,dp=2 --zero 3 --pp-schedule 1f1b"},
        {2, "--mesh tp=2"}, {4, "--mesh dp=2,tp=2 --zero 1"}, {4, "--mesh pp=2,tp=2"}};
    int n_runs = sizeof runs / sizeof *runs;
    for (int j = 0; j < 2; j++) {
        char first[65] = "", got[65], first_fig[65] = "", fig[65];
        for (int k = 0; k < n_runs; k++) {
            int w = runs[k].ranks;
            int rc = w == 1 ? mgt_sh(&out, "%s %s %s --deterministic --print-hash --quiet", bin,
                                     jobs[j], runs[k].plan)
                            : mgt_sh(&out, "%s -n %d %s %s %s --deterministic --print-hash "
                                     "--quiet", run, w, bin, jobs[j], runs[k].plan);
            hash_of(out, got);
            digest_of(out, "figures", fig);
            CHECK_MSG(rc == 0 && got[0] && fig[0], "%d rank(s): rc %d: %s", w, rc, out);
            if (!k) snprintf(first, sizeof first, "%s", got);
            if (!k) snprintf(first_fig, sizeof first_fig, "%s", fig);
            CHECK_MSG(!strcmp(got, first), "%s on %d ranks %s: %s against one rank's %s",
                      jobs[j], w, runs[k].plan, got, first);
            CHECK_MSG(!strcmp(fig, first_fig), "%s on %d ranks %s: figures %s against one "
                      "rank's %s", jobs[j], w, runs[k].plan, fig, first_fig);
            free(out);
        }
    }
}

typedef struct { int ranks; const char *plan; } plan_run;

/* job (mgtrain's flags, with --print-hash) under each of runs ends with
 * the first one's parameters and figures. */
static void same_hash_under(const char *job, const plan_run *runs, size_t n)
{
    char *out, first[65] = "", got[65], first_fig[65] = "", fig[65];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    for (size_t k = 0; k < n; k++) {
        int rc = mgt_sh(&out, "%s -n %d %s %s %s", run, runs[k].ranks, bin, job, runs[k].plan);
        hash_of(out, got);
        digest_of(out, "figures", fig);
        CHECK_MSG(rc == 0 && got[0] && fig[0], "%d rank(s) %s: rc %d: %s", runs[k].ranks,
                  runs[k].plan, rc, out);
        if (!k) snprintf(first, sizeof first, "%s", got);
        if (!k) snprintf(first_fig, sizeof first_fig, "%s", fig);
        CHECK_MSG(!strcmp(got, first), "%d ranks %s: %s against one rank's %s", runs[k].ranks,
                  runs[k].plan, got, first);
        CHECK_MSG(!strcmp(fig, first_fig), "%d ranks %s: figures %s against one rank's %s",
                  runs[k].ranks, runs[k].plan, fig, first_fig);
        free(out);
    }
}

/* A parameter server (--staleness 0) is one process's bits: each worker
 * sums its virtual shards' subtree and pushes the root, the borrowed
 * gradients' (gpt-mini's tied head) apart, and each server adds the
 * workers' roots in the tree's upper levels and takes the norm over the
 * servers' runs. gpt-mini's 40 clipped steps and lenet5's epoch, on 1, 2
 * and 4 workers of 1 and 2 servers (the embedding, lent to the head, on
 * either server); and a checkpoint of 2 workers x 2 servers at step 20
 * resumes under one process, and one process's under the server, to the
 * bits of the run without a break. */
TEST_T(deterministic_parameter_server_is_one_process_bits, 240)
{
    const plan_run runs[] = {{1, ""}, {2, "--parallel ps"}, {3, "--parallel ps"},
                             {4, "--parallel ps --servers 2"}, {5, "--parallel ps"},
                             {6, "--parallel ps --servers 2"}};
    size_t n = sizeof runs / sizeof *runs;
    same_hash_under(GPT_SMALL " --batch 16 --steps 40 --eval-every 20 --clip-grad 0.5 "
                    "--no-eval-on-start --deterministic --print-hash --quiet", runs, n);
    same_hash_under("--model lenet5 --epochs 1 --clip-grad 0.5 --deterministic --print-hash "
                    "--quiet", runs, n);
    char ck[2][512], *out, want[65], got[65];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const char *job = GPT_SMALL " --batch 16 --eval-every 20 --clip-grad 0.5 --deterministic "
                      "--quiet";
    int rc = mgt_sh(&out, "%s %s --steps 40 --print-hash", bin, job);
    hash_of(out, want);
    CHECK_MSG(rc == 0 && want[0], "%s", out);
    free(out);
    const struct { int ranks; const char *plan; } save[2] = {{4, "--parallel ps --servers 2"},
                                                             {1, ""}},
                                                   resume[2] = {{1, ""}, {3, "--parallel ps"}};
    for (int i = 0; i < 2; i++) {
        snprintf(ck[i], sizeof ck[i], "%s/ps-%d.st", mgt_tmpdir(), i);
        rc = mgt_sh(&out, "%s -n %d %s %s %s --steps 20 --save %s", run, save[i].ranks, bin, job,
                    save[i].plan, ck[i]);
        CHECK_MSG(rc == 0, "saving under %s: %s", save[i].plan, out);
        free(out);
        rc = mgt_sh(&out, "%s -n %d %s %s %s --steps 40 --resume %s --print-hash", run,
                    resume[i].ranks, bin, job, resume[i].plan, ck[i]);
        hash_of(out, got);
        CHECK_MSG(rc == 0 && !strcmp(got, want), "saved under '%s', resumed under '%s': %s "
                  "against %s: %s", save[i].plan, resume[i].plan, got, want, out);
        free(out);
    }
}

/* The optimizer's state in files (--offload disk:DIR) takes the same
 * steps: gpt-mini's parameters after 20 clipped steps are one process's
 * bits in memory with it in one process, under DDP and ZeRO-1 at 2 and 4
 * ranks, and over 2 pipeline stages x 2 ZeRO-3 replicas (whose shards
 * stay in memory). */
TEST_T(deterministic_with_the_optimizer_in_files_is_the_same_bits, 180)
{
    const char *t = mgt_tmpdir();
    char off[4][600];
    const char *plans[4] = {"", "--parallel ddp", "--mesh dp=4 --zero 1",
                            "--mesh pp=2,dp=2 --zero 3"};
    for (int k = 0; k < 4; k++)
        snprintf(off[k], sizeof off[k], "%s --offload disk:%s", plans[k], t);
    const plan_run runs[] = {{1, ""}, {1, off[0]}, {2, off[1]}, {2, "--mesh dp=2 --zero 1"},
                             {4, off[2]}, {4, off[3]}};
    same_hash_under(GPT_SMALL " --batch 16 --steps 20 --clip-grad 0.5 --no-eval-on-start "
                    "--deterministic --print-hash --quiet", runs,
                    sizeof runs / sizeof *runs);
}

/* --tp-chunks 4: gpt-mini on tp=4 and on 2 tp ranks x 2 replicas gives
 * one process's bits when every run cuts the splits in 4 chunks. */
TEST_T(deterministic_tp_4_equals_one_process_with_4_chunks, 120)
{
    const char *job = GPT_SMALL " --batch 16 --steps 20 --eval-every 20 --no-eval-on-start "
                      "--clip-grad 0.5 --deterministic --tp-chunks 4 --print-hash --quiet";
    const plan_run runs[] = {
        {1, ""}, {4, "--mesh tp=4"}, {4, "--mesh dp=2,tp=2"}};
    same_hash_under(job, runs, sizeof runs / sizeof *runs);
}

/* A model on a device (emu: the GPU code path on the host; a GPU, the
 * ranks sharing it) sums the tree on the host, each shard's gradient
 * copied out: the same bits at 1, 2 and 4 ranks, under DDP, ZeRO 2 and 3,
 * a pipeline of 2 stages and a parameter server's 2 workers (not the CPU's
 * bits: other kernels). */
static void same_hash_on(const char *dev)
{
    char job[512];
    snprintf(job, sizeof job, GPT_SMALL " --batch 16 --steps 10 --eval-every 10 "
             "--no-eval-on-start --clip-grad 0.5 --device %s --deterministic --print-hash "
             "--quiet", dev);
    const plan_run runs[] = {
        {1, ""}, {2, "--parallel ddp"}, {2, "--mesh dp=2 --zero 3"}, {4, "--mesh dp=4 --zero 2"},
        {2, "--mesh pp=2"}, {3, "--parallel ps"}};
    same_hash_under(job, runs, sizeof runs / sizeof *runs);
}

TEST_T(deterministic_on_a_device_is_the_same_at_1_2_4_ranks, 120) { same_hash_on("emu"); }

TEST_T(deterministic_on_a_gpu_is_the_same_at_1_2_4_ranks, 300)
{
    mgt_device(MG_DEVICE_CUDA);   /* skips without a GPU */
    same_hash_on("cuda");
}

/* A checkpoint taken at 4 ranks resumes at 2 (and at 1) to the bits of
 * one rank's uninterrupted run: 25 + 25 steps of gpt-mini, 1 + 1 epochs
 * of lenet5. */
TEST_T(deterministic_checkpoint_at_4_ranks_resumes_at_2_to_the_same_bits, 300)
{
    char ck[512], *out, want[65], got[65];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ck, sizeof ck, "%s/half.st", mgt_tmpdir());
    const struct { const char *job, *half, *whole; } cases[] = {
        {GPT_SMALL " --batch 16 --eval-every 25 --no-eval-on-start", "--steps 25", "--steps 50"},
        {"--model lenet5", "--epochs 1", "--epochs 2"}};
    for (int i = 0; i < 2; i++) {
        const char *job = cases[i].job;
        int rc = mgt_sh(&out, "%s %s %s --deterministic --print-hash --quiet", bin, job,
                        cases[i].whole);
        hash_of(out, want);
        CHECK_MSG(rc == 0 && want[0], "%s", out);
        free(out);
        rc = mgt_sh(&out, "%s -n 4 %s %s %s --parallel ddp --deterministic --quiet --save %s",
                    run, bin, job, cases[i].half, ck);
        CHECK_MSG(rc == 0, "%s", out);
        free(out);
        for (int w = 1; w <= 2; w++) {
            rc = mgt_sh(&out, "%s -n %d %s %s %s --parallel ddp --deterministic --print-hash "
                        "--quiet --resume %s", run, w, bin, job, cases[i].whole, ck);
            hash_of(out, got);
            CHECK_MSG(rc == 0 && !strcmp(got, want), "%s resumed at %d: %s against %s: %s", job,
                      w, got, want, out);
            free(out);
        }
    }
}

/* What --deterministic cannot do yet, or cannot do at all, is one line
 * before any work. */
TEST_T(deterministic_bad_input, 120)
{
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const struct { const char *ranks, *args, *want; } cases[] = {
        {"", "--virtual-shards 6", "power of two"},
        {"", "--virtual-shards 256", "divides the step's 128 rows"},
        {"", "--deterministic --plan auto", "give one of them"},
        /* it sent the user to --virtual-shards, which no value fits (a probe) */
        {"-n 3", "--parallel ddp --batch 120 --deterministic",
         "3 data-parallel ranks cannot share the step's virtual shards"},
        {"-n 4", "--parallel ddp --deterministic --virtual-shards 2", "rank(s) must divide it"},
        {"-n 2", "--mesh dp=2 --zero 3 --offload disk:/tmp --deterministic",
         "ZeRO-3's --offload disk puts them in files"},
        {"-n 2", "--mesh tp=2 --deterministic --tp-chunks 1", "tensor-parallel size 2 divides"},
        {"-n 2", "--mesh tp=2 --deterministic --device emu", "built for a model on the CPU"},
        {"", "--tp-chunks 2", "give --deterministic too"},
        {"", "--deterministic --tp-chunks 3", "a power of two from 1 to 64"},
        {"", "--deterministic --tp-chunks 64", "do not cut into 64 chunks"},
        {"-n 2", "--mesh pp=2 --micro-batches 4 --deterministic", "leave out --micro-batches"},
        {"-n 3", "--parallel ps --staleness 2 --deterministic", "needs --staleness 0"},
        {"-n 3 --elastic", "--parallel ps --elastic --deterministic", "give one of them"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = *cases[i].ranks
                     ? mgt_sh(&out, "%s %s %s --model lenet5 --epochs 1 %s", run, cases[i].ranks,
                              bin, cases[i].args)
                     : mgt_sh(&out, "%s --model lenet5 --epochs 1 %s", bin, cases[i].args);
        CHECK_MSG(rc != 0 && strstr(out, cases[i].want) && !strstr(out, "epoch  1/1"),
                  "%s: rc %d: %s", cases[i].args, rc, out);
        free(out);
    }
}

/* Dropout keyed by the global shard (the C API: no zoo model has
 * dropout): a convolution, dropout p = 0.5 and a linear layer, 3 steps of
 * 8 virtual shards of 4 rows, on one process, DDP over 2 and 4 forked
 * ranks, 3 DataParallel threads and a parameter server's 2 and 4
 * workers: the same parameters, bit for bit,
 * because shard k draws its mask at the step's counter + k whoever runs
 * it, and every rank's counter ends the step at + 8. */
enum { DROP_V = 8, DROP_ROWS = 4, DROP_STEPS = 3 };

static mg_model *dropout_model(void)
{
    mg_layer *l[] = {mg_layer_conv2d("conv", 1, 4, 3, 1, 1, true, MG_POOL_MAX),
                     mg_layer_flatten("flat"), mg_layer_dropout("drop", 0.5f),
                     mg_layer_linear("fc", 4 * 4 * 4, 5, false)};
    mg_model *m;
    CHECK_OK(mg_model_create_from("drop", mg_layer_sequential(NULL, l, 4), 1, 8, 8, 7, &m));
    mg_model_set_dropout_seed(m, 99);
    return m;
}

typedef struct {
    int step, first, k, n;   /* this rank's shards: first .. first + n - 1 */
    float x[DROP_ROWS * 64];
    int32_t y[DROP_ROWS];
} drop_feed;

static bool drop_next(void *ud, mg_micro_batch *b)
{
    drop_feed *f = ud;
    if (f->k == f->n) return false;
    int shard = f->first + f->k++;
    for (int r = 0; r < DROP_ROWS; r++) {
        unsigned row = (unsigned)(f->step * DROP_V * DROP_ROWS + shard * DROP_ROWS + r);
        for (int i = 0; i < 64; i++)
            f->x[r * 64 + i] = (float)((row * 131u + (unsigned)i * 7u) % 17u) / 17.0f;
        f->y[r] = (int32_t)(row % 5u);
    }
    *b = (mg_micro_batch){f->x, f->y, DROP_ROWS, f->k == f->n};
    return true;
}

/* world 0: 3 DataParallel threads; ps: a parameter server on the last
 * rank, the others its workers. */
typedef struct { int port, world; bool ps; } drop_run;

static int dropout_rank(int rank, int ranks, void *arg)
{
    const drop_run *run = arg;
    int world = run->world;
    CHECK_EQ(ranks, world > 1 ? world : 1);
    mg_group *g = world > 1 ? mgt_join(rank, world, run->port, NULL, 20) : NULL;
    CHECK(world <= 1 || g);
    mg_model *m = dropout_model();
    mg_strategy_options so = mg_strategy_defaults(run->ps       ? MG_STRATEGY_PS
                                                  : world > 1   ? MG_STRATEGY_DDP
                                                  : world == 0  ? MG_STRATEGY_DP
                                                                : MG_STRATEGY_SINGLE);
    so.group = g;
    so.workers = 3;
    so.ps_servers = 1;
    so.max_batch = DROP_ROWS;
    so.det_shards = DROP_V;
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.1f);
    mg_optim *o;
    CHECK_OK(mg_strategy_optim(s, &oc, &o));
    int W = world > 1 ? world - run->ps : 1;   /* a server counts worker 0's shards */
    mg_step_options opt = {.accumulate = DROP_V / W, .lr = 0.1f};
    for (int step = 0; step < DROP_STEPS; step++) {
        drop_feed f = {.step = step, .first = rank < W ? rank * (DROP_V / W) : 0,
                       .n = DROP_V / W};
        mg_step_result r;
        CHECK_OK(mg_train_step(s, o, &opt, drop_next, &f, &r));
    }
    if (rank == 0) {
        char p[512];
        snprintf(p, sizeof p, "%s/drop-%d%s.bin", mgt_tmpdir(), world, run->ps ? "ps" : "");
        FILE *fp = fopen(p, "wb");   /* each tensor's values (the arena's padding is the plan's) */
        CHECK(fp);
        for (int i = 0; fp && i < mg_model_num_tensors(m); i++) {
            const mg_param *t = mg_model_tensor(m, i);
            if (!t->is_buffer)
                CHECK(fwrite(mg_model_params(m) + t->offset, sizeof(float), t->numel, fp) ==
                      t->numel);
        }
        if (fp) fclose(fp);
    }
    mg_optim_destroy(o);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    mg_group_destroy(g);
    return 0;
}

TEST_T(deterministic_dropout_is_keyed_by_the_global_shard, 120)
{
    mgt_tmpdir();   /* created here, so the forked ranks share it */
    drop_run runs[] = {{0, 1, false}, {0, 0, false}, {0, 2, false}, {0, 4, false},
                       {0, 3, true}, {0, 5, true}};
    int nr = sizeof runs / sizeof *runs;
    char *first = NULL;
    size_t n0 = 0;
    for (int i = 0; i < nr; i++) {
        runs[i].port = mgt_free_port();
        CHECK_EQ(mgt_fork_ranks(runs[i].world > 1 ? runs[i].world : 1, dropout_rank, &runs[i],
                                60, NULL), 0);
    }
    for (int i = 0; i < nr; i++) {
        char p[512];
        size_t n;
        snprintf(p, sizeof p, "%s/drop-%d%s.bin", mgt_tmpdir(), runs[i].world,
                 runs[i].ps ? "ps" : "");
        char *got = mgt_slurp(p, &n);
        CHECK_MSG(got && n > 0, "%s missing", p);
        if (!first) {
            first = got;
            n0 = n;
            continue;
        }
        CHECK_MSG(n == n0 && !memcmp(got, first, n), "world %d%s (0: 3 threads) differs from "
                  "one process's parameters", runs[i].world, runs[i].ps ? " (ps)" : "");
        free(got);
    }
    free(first);
}
