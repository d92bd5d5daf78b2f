/* mgtrain end to end: real data, real processes. Bad input, logs and
 * plots, checkpoints and exact resume, --init and --eval-only, and a
 * straggler. The plans are in test_mgtrain_plans.c, devices in
 * test_mgtrain_device.c, the parameter server in test_mgtrain_ps.c. */
#include <limits.h>
#include <sys/stat.h>
#include "harness.h"
#include "mgtrain_runs.h"
#include "multigrad/checkpoint.h"

TEST_T(mgtrain_bad_input_one_line_and_no_file_touched, 120)
{
    const char *t = mgt_tmpdir(), *bin = mgt_tool("mgtrain");
    char save[512];
    snprintf(save, sizeof save, "%s/keep.st", t);
    FILE *f = fopen(save, "w");
    fputs("precious", f);
    fclose(f);
    const char *bad[] = {
        "--model nope", "--batch 0", "--batch -3", "--epochs 0", "--lr 0", "--lr abc",
        "--optimizer rmsprop", "--data /nonexistent/dir", "--schedule bogus",
        "--momentum 1.5", "--frobnicate", "--eval-only", "--threads 0",
        "--resume /nonexistent.safetensors", "--init /etc/passwd",
        "--eval-only --init w.st --log e.csv",   /* it wrote no log, silently */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out;
        int rc = mgt_sh(&out, "%s %s --save %s --epochs 1", bin, bad[i], save);
        CHECK_MSG(rc == 2, "'%s' exited %d: %s", bad[i], rc, out);
        CHECK_MSG(mgt_count(out, "\n") == 1, "'%s' printed %d lines: %s", bad[i],
                  mgt_count(out, "\n"), out);
        CHECK_MSG(strncmp(out, "mgtrain: ", 9) == 0, "'%s': %s", bad[i], out);
        free(out);
    }
    f = fopen(save, "r");
    char buf[16] = {0};
    CHECK(fgets(buf, sizeof buf, f) && strcmp(buf, "precious") == 0);
    fclose(f);
}

TEST_T(mgtrain_resume_continues_exactly, 240)
{
    const char *t = mgt_tmpdir(), *bin = mgt_tool("mgtrain");
    char *out;
    /* Two epochs in one go. */
    int rc = mgt_sh(&out, "%s --model mlp --epochs 2 --save %s/full.st --log %s/full.csv",
                 bin, t, t);
    CHECK_MSG(rc == 0, "%s", out);
    CHECK(strstr(out, "epoch  2/2") && strstr(out, "test acc"));
    free(out);
    /* One epoch, then resume for the second. */
    rc = mgt_sh(&out, "%s --model mlp --epochs 1 --save %s/half.st --log %s/half.jsonl",
             bin, t, t);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s --model mlp --epochs 2 --resume %s/half.st --save %s/half.st "
             "--log %s/half.jsonl", bin, t, t, t);
    CHECK_MSG(rc == 0, "%s", out);
    CHECK(strstr(out, "epoch  2/2") && !strstr(out, "epoch  1/2"));
    free(out);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/full.st", t);
    snprintf(b, sizeof b, "%s/half.st", t);
    mg_st_file *fa, *fb;
    CHECK_OK(mg_st_open(a, &fa));
    CHECK_OK(mg_st_open(b, &fb));
    CHECK_EQ(mg_st_count(fa), mg_st_count(fb));
    for (int i = 0; i < mg_st_count(fa); i++) {
        const mg_st_tensor *x = mg_st_get(fa, i), *y = mg_st_find(fb, x->name);
        CHECK_MSG(y && x->nbytes == y->nbytes, "tensor %s", x->name);
        CHECK_MSG(memcmp(x->data, y->data, x->nbytes) == 0,
                  "tensor %s differs after resume", x->name);
    }
    mg_st_close(fa);
    mg_st_close(fb);
    /* Logs: the CSV has a header and 2 rows; the resumed JSON log has both
     * epochs; the plots exist. */
    snprintf(a, sizeof a, "wc -l < %s/full.csv", t);
    rc = mgt_sh(&out, "%s", a);
    CHECK(atoi(out) == 3);
    free(out);
    rc = mgt_sh(&out, "grep -c '\"epoch\":' %s/half.jsonl", t);
    CHECK(atoi(out) == 2);
    free(out);
    struct stat sb;
    snprintf(a, sizeof a, "%s/full.svg", t);
    snprintf(b, sizeof b, "%s/half.svg", t);
    CHECK(stat(a, &sb) == 0 && sb.st_size > 500);
    CHECK(stat(b, &sb) == 0 && sb.st_size > 500);
    /* Resuming with other flags is refused, and the checkpoint survives. */
    rc = mgt_sh(&out, "%s --model mlp --epochs 3 --lr 0.1 --resume %s/half.st --save %s/half.st",
             bin, t, t);
    CHECK_MSG(rc == 2 && strstr(out, "lr=") && mgt_count(out, "\n") == 1, "%s", out);
    free(out);
    /* Another momentum is named too, before the file's momentum buffers
     * are found to have no place in this run (they were named instead). */
    rc = mgt_sh(&out, "%s --model mlp --epochs 3 --momentum 0 --resume %s/half.st", bin, t);
    CHECK_MSG(rc == 2 && strstr(out, "saved with momentum=0.9 but this run has momentum=0") &&
              mgt_count(out, "\n") == 1, "%s", out);
    free(out);
    snprintf(b, sizeof b, "%s/half.st", t);
    CHECK_OK(mg_st_open(b, &fb));
    mg_st_close(fb);
    /* --eval-only of the checkpoint's weights reports the last test accuracy;
     * --eval-only --resume evaluates its model whatever training flags are
     * given (they were refused as another global batch, another lr, found
     * by a probe); another model is refused. */
    rc = mgt_sh(&out, "%s --model mlp --eval-only --init %s/full.st", bin, t);
    CHECK_MSG(rc == 0 && strstr(out, "test accuracy"), "%s", out);
    char *resumed;
    rc = mgt_sh(&resumed, "%s --model mlp --eval-only --resume %s/full.st --batch 50 --lr 0.3 "
                "--momentum 0 --optimizer adamw", bin, t);
    CHECK_MSG(rc == 0 && strcmp(out, resumed) == 0, "%s\nagainst --init's\n%s", resumed, out);
    free(resumed);
    free(out);
    rc = mgt_sh(&out, "%s --model lenet5 --eval-only --resume %s/full.st", bin, t);
    CHECK_MSG(rc == 2 && strstr(out, "saved with model=mlp but this run has model=lenet5") &&
              mgt_count(out, "\n") == 1, "%s", out);
    free(out);
    /* ...and to train on: the model is named, not its other batch (a probe) */
    rc = mgt_sh(&out, "%s --model gpt-mini --steps 2 --resume %s/full.st", bin, t);
    CHECK_MSG(rc == 2 && strstr(out, "saved with model=mlp but this run has model=gpt-mini"),
              "%s", out);
    free(out);
}

/* The whole-process peak a run printed ("peak memory N MB"), or -1. */
static double peak_mb(const char *out)
{
    const char *p = strstr(out, "peak memory ");
    double mb = -1;
    return p && sscanf(p, "peak memory %lf MB", &mb) == 1 ? mb : -1;
}

/* --resume reads each rank's part where the file lies (mg_st_open_on_disk:
 * its header in memory, the checksum read in pieces): a resumed run's
 * whole-process peak is the fresh run's, in one process and in ZeRO-3 over
 * 2 ranks, not that plus a good part of the 44 MB file, as when each rank
 * read the file whole (+28 MB here). The resumed runs end where an
 * uninterrupted one does. */
TEST_T(mgtrain_resume_does_not_hold_the_file, 180)
{
    const char *g = "--model gpt-mini --layers 2 --dim 384 --heads 4 --ctx 64 --batch 2 "
                    "--eval-windows 1 --no-eval-on-start";
    char ck[512], *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ck, sizeof ck, "%s/resume-memory.st", mgt_tmpdir());
    int rc = mgt_sh(&out, "%s %s --steps 1 --save %s", bin, g, ck);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    struct stat sb;
    CHECK(stat(ck, &sb) == 0 && sb.st_size > 40000000);
    double file = (double)sb.st_size / 1e6;
    const char *how[2] = {"", "--mesh dp=2 --zero 3"};
    for (int k = 0; k < 2; k++) {
        char launch[600];
        snprintf(launch, sizeof launch, "%s%s", k ? run : "", k ? " -n 2 " : "");
        double peak[2];
        char *end[2];
        for (int r = 0; r < 2; r++) {
            rc = mgt_sh(&out, "%s%s %s %s --steps 2%s%s", launch, bin, g, how[k],
                        r ? " --resume " : "", r ? ck : "");
            peak[r] = peak_mb(out);
            const char *f = strstr(out, "final: validation loss");
            CHECK_MSG(rc == 0 && peak[r] > 0 && f, "%s", out);
            end[r] = strndup(f ? f : "", 32);
            free(out);
        }
        printf("%s: peak %.0f MB fresh, %.0f MB resumed (the file %.0f MB)\n",
               k ? "zero3 on 2 ranks" : "one process", peak[0], peak[1], file);
        CHECK_MSG(peak[1] < peak[0] + file / 4, "%s: resumed peak %.0f MB, fresh %.0f MB",
                  k ? how[k] : "one process", peak[1], peak[0]);
        CHECK_MSG(!strcmp(end[0], end[1]), "resumed '%s', uninterrupted '%s'", end[1], end[0]);
        free(end[0]);
        free(end[1]);
    }
}

/* The epoch's train loss from a --log CSV (header, then one row). */
static double csv_train_loss(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *s = mgt_slurp(path, NULL), *row = strchr(s, '\n');
    double loss = -1;
    CHECK_MSG(row && sscanf(row + 1, "%*d,%*d,%lf,", &loss) == 1, "%s: %s", path, s);
    free(s);
    return loss;
}

/* --parallel dp --accumulate trains on every micro-batch: 2 workers and
 * 2 micro-batches of 60 follow one process with batches of 120 (60,000
 * images: 500 whole steps either way) up to rounding, which grows over
 * the epoch to a few 1e-3 of the loss; training on the last micro-batch
 * only is some 10% off. */
TEST_T(mgtrain_dp_accumulate_equals_larger_batch, 240)
{
    const char *t = mgt_tmpdir(), *bin = mgt_tool("mgtrain");
    char *out;
    int rc = mgt_sh(&out, "%s --model mlp --epochs 1 --batch 120 --quiet --log %s/one.csv",
                    bin, t);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s --model mlp --epochs 1 --batch 60 --accumulate 2 --parallel dp "
                "--workers 2 --quiet --log %s/dp.csv", bin, t);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    double one = csv_train_loss(t, "one.csv"), dp = csv_train_loss(t, "dp.csv");
    printf("train loss: batch 120 %.6f, dp 2 x 60 %.6f\n", one, dp);
    CHECK_CLOSE(one, dp, 0.02, 0);
}

/* Resuming at step 5 gives the same bytes as 10 steps in one go (the
 * batches depend only on seed and step); the log keeps its rows; the
 * plot exists; --eval-only and --sample work from the checkpoint. */
TEST_T(mgtrain_gpt_resume_log_eval_and_sample, 180)
{
    const char *t = mgt_tmpdir(), *bin = mgt_tool("mgtrain");
    char *out;
    int rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 10 --eval-every 5 --save %s/full.st", bin, t);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 5 --eval-every 5 --save %s/half.st "
                "--log %s/half.csv", bin, t, t);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 10 --eval-every 5 --resume %s/half.st "
                "--save %s/half.st --log %s/half.csv", bin, t, t, t);
    CHECK_MSG(rc == 0 && strstr(out, "step    10/10") && !strstr(out, "step     5/10"), "%s", out);
    free(out);
    rc = mgt_sh(&out, "cmp %s/full.st %s/half.st", t, t);
    CHECK_MSG(rc == 0, "resumed checkpoint differs: %s", out);
    free(out);
    /* header, step 0, 5, 10 */
    char path[512];
    snprintf(path, sizeof path, "%s/half.csv", t);
    char *csv = mgt_slurp(path, NULL);
    CHECK_MSG(mgt_count(csv, "\n") == 4 && strstr(csv, "step,train_loss,val_loss,val_ppl") &&
              strstr(csv, "\n0,nan,") && strstr(csv, "\n5,") && strstr(csv, "\n10,"), "%s", csv);
    free(csv);
    struct stat sb;
    snprintf(path, sizeof path, "%s/half.svg", t);
    CHECK(stat(path, &sb) == 0 && sb.st_size > 500);
    /* Another head count changes no tensor shape: the flags catch it. */
    rc = mgt_sh(&out, "%s " GPT_SMALL " --heads 2 --steps 20 --resume %s/half.st", bin, t);
    CHECK_MSG(rc == 2 && mgt_count(out, "\n") == 1 && strstr(out, "arch="), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s " GPT_SMALL " --eval-only --init %s/full.st --sample 40 "
                "--temperature 0 --prompt 'Q: '", bin, t);
    CHECK_MSG(rc == 0 && strstr(out, "validation loss") && strstr(out, "perplexity") &&
              strstr(out, "sample (40 bytes"), "%s", out);
    /* Greedy sampling is deterministic. */
    char *again;
    rc = mgt_sh(&again, "%s " GPT_SMALL " --eval-only --init %s/full.st --sample 40 "
                "--temperature 0 --prompt 'Q: '", bin, t);
    CHECK(rc == 0 && strcmp(out, again) == 0);
    free(again);
    /* Under plans where each rank reads only the weights it holds (a
     * pipeline's stages, ZeRO-3's pieces): the same figures and sample. */
    static const char *plans[] = {"--mesh pp=2", "--parallel ddp --zero 3"};
    const char *run = mgt_tool("mgrun");
    for (int k = 0; k < 2; k++) {
        rc = mgt_sh(&again, "%s -n 2 %s " GPT_SMALL " --eval-only --init %s/full.st --sample 40 "
                    "--temperature 0 --prompt 'Q: ' %s", run, bin, t, plans[k]);
        const char *a = strstr(out, "gpt-mini: validation");
        const char *b = strstr(again, "gpt-mini: validation");
        CHECK_MSG(rc == 0 && a && b && !strcmp(a, b), "%s:\n%s\none process:\n%s", plans[k],
                  again, out);
        free(again);
    }
    free(out);
}

TEST_T(mgtrain_gpt_bad_input_one_line, 120)
{
    const char *t = mgt_tmpdir(), *bin = mgt_tool("mgtrain");
    char tiny[512], save[512];
    snprintf(tiny, sizeof tiny, "%s/tiny.txt", t);
    snprintf(save, sizeof save, "%s/keep.st", t);
    FILE *f = fopen(tiny, "w");
    fputs("too short for a window\n", f);
    fclose(f);
    f = fopen(save, "w");
    fputs("precious", f);
    fclose(f);
    struct { const char *flags, *says; } bad[] = {
        {"--model gpt-mini --epochs 2", "--steps"},
        {"--model lenet5 --steps 3", "gpt-mini"},
        {"--model lenet5 --sample 10", "gpt-mini"},
        {"--model gpt-mini --dim 30 --heads 4", "--heads"},
        {"--model gpt-mini --steps 0", "--steps"},
        {"--model gpt-mini --ctx 1", "--ctx"},
        {"--model gpt-mini --data /nonexistent/text", "/nonexistent/text"},
        {"--model gpt-mini --ctx 64 --data TINY", "tiny.txt"},
        {"--model gpt-mini --batch 3 --parallel dp --workers 4", "--workers"},
        {"--model gpt-mini --betas 0.9", "B1,B2"},
        {"--model gpt-mini --betas 0.9,1", "--betas (B2) 1"},
        {"--model gpt-mini --betas -0.1,0.9", "--betas (B1) -0.1"},
        {"--model gpt-mini --optimizer sgd --betas 0.9,0.95", "adam and adamw"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char flags[1024], *out;
        const char *p = strstr(bad[i].flags, "TINY");
        if (p) snprintf(flags, sizeof flags, "%.*s%s", (int)(p - bad[i].flags), bad[i].flags, tiny);
        else snprintf(flags, sizeof flags, "%s", bad[i].flags);
        int rc = mgt_sh(&out, "%s %s --save %s", bin, flags, save);
        CHECK_MSG(rc == 2 && mgt_count(out, "\n") == 1 && strncmp(out, "mgtrain: ", 9) == 0 &&
                  strstr(out, bad[i].says), "'%s' exited %d: %s", flags, rc, out);
        free(out);
    }
    char *s = mgt_slurp(save, NULL);
    CHECK(strcmp(s, "precious") == 0);
    free(s);
}

/* The optimizer config a checkpoint recorded ("...;beta2=0.999;..."). */
static bool saved_optimizer_has(const char *path, const char *what)
{
    mg_st_file *f;
    if (mg_st_open(path, &f)) return false;
    const char *cfg = mg_st_meta(f, "optimizer_config");
    bool has = cfg && strstr(cfg, what);
    mg_st_close(f);
    return has;
}

/* Adam's betas are torch's (0.9, 0.999) unless given, also for gpt-mini
 * when its optimizer is not its own AdamW (its beta2 0.99 stayed, found
 * by a probe against torch), and --betas sets them; a resume with other
 * betas is refused. */
TEST_T(mgtrain_adam_betas_are_torch_s_unless_given, 120)
{
    const char *t = mgt_tmpdir(), *bin = mgt_tool("mgtrain");
    const char *tiny = "--model gpt-mini --layers 1 --dim 16 --heads 2 --ctx 16 --batch 2 "
                       "--eval-every 2 --eval-windows 2 --quiet";
    struct { const char *flags, *has; } runs[] = {
        {"", "beta1=0.9;beta2=0.99;"},
        {"--optimizer adam", "beta1=0.9;beta2=0.999;"},
        {"--betas 0.8,0.95", "beta1=0.8;beta2=0.95;"},
        {"--optimizer adam --betas 0,0.5", "beta1=0;beta2=0.5;"},
    };
    char path[512], *out;
    snprintf(path, sizeof path, "%s/g.st", t);
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        int rc = mgt_sh(&out, "%s %s --steps 2 %s --save %s", bin, tiny, runs[i].flags, path);
        CHECK_MSG(rc == 0 && saved_optimizer_has(path, runs[i].has), "'%s': %s", runs[i].flags,
                  out);
        free(out);
    }
    int rc = mgt_sh(&out, "%s %s --steps 4 --optimizer adam --betas 0,0.6 --resume %s", bin, tiny,
                    path);
    CHECK_MSG(rc == 2 && strstr(out, "saved with betas=0,0.5 but this run has betas=0,0.6"), "%s",
              out);
    free(out);
}

/* Issue 30 items 7 and 8: --init of a larger model's weights is refused
 * naming what would be left out, and --init-partial takes the rest
 * saying so; --eval-windows and --no-eval-on-start bound evaluation (the
 * 85M shape spent 4 minutes on each of 512 windows' evaluations). */
TEST_T(mgtrain_init_partial_and_evaluation_flags, 180)
{
    const char *t = mgt_tmpdir();
    char *out, ck[512];
    const char *bin = mgt_tool("mgtrain");
    snprintf(ck, sizeof ck, "%s/four.st", t);
    const char *gpt = "--model gpt-mini --dim 32 --heads 2 --ctx 32 --batch 8";
    int rc = mgt_sh(&out, "%s %s --layers 4 --steps 2 --eval-every 2 --eval-windows 4 "
                    "--no-eval-on-start --save %s", bin, gpt, ck);
    CHECK_MSG(rc == 0 && !strstr(out, "step     0/2") && strstr(out, "step     2/2"), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s %s --layers 2 --init %s --eval-only", bin, gpt, ck);
    CHECK_MSG(rc == 2 && strstr(out, "h.2.") && strstr(out, "give --init-partial"), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s %s --layers 2 --init %s --init-partial --eval-only --eval-windows 3",
                bin, gpt, ck);
    CHECK_MSG(rc == 0 && strstr(out, "left out 24 tensor(s)") &&
              strstr(out, "(3 windows of 32 bytes)"), "%s", out);
    free(out);
    /* Flags of language models only, and --init-partial without --init. */
    rc = mgt_sh(&out, "%s --model mlp --eval-windows 3", bin);
    CHECK_MSG(rc == 2 && strstr(out, "--eval-windows"), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s %s --init-partial", bin, gpt);
    CHECK_MSG(rc == 2 && strstr(out, "--init-partial shapes --init"), "%s", out);
    free(out);
}

/* Issue 30 item 1 on one host: with MG_CKPT_RELAY=always every rank's
 * part goes through rank 0 (saving: its bytes to rank 0, which writes
 * them; resuming: its part from rank 0), and the files are byte for byte
 * those every rank writes and reads directly: ZeRO-3 with its offloaded
 * optimizer state streamed from files on 3 ranks, ZeRO-1 on 2, and a
 * pipeline with replicas (pp=2 x dp=2). (Across hosts that see no shared
 * filesystem: test_netns.c.) */
TEST_T(mgtrain_checkpoints_through_rank_0_are_byte_for_byte, 180)
{
    const char *t = mgt_tmpdir();
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const char *gpt = "--model gpt-mini --layers 2 --dim 32 --heads 2 --ctx 32 --batch 12 "
                      "--eval-every 2 --eval-windows 4 --no-eval-on-start --verbose";
    char off[600];
    snprintf(off, sizeof off, "--parallel ddp --zero 3 --offload disk:%s", t);
    const struct { const char *flags; int n; } jobs[] = {
        {off, 3}, {"--parallel ddp --zero 1", 2}, {"--mesh pp=2,dp=2", 4}};
    for (size_t k = 0; k < sizeof jobs / sizeof jobs[0]; k++) {
        char *out, a[600], b[600], a4[600], b4[600];
        snprintf(a, sizeof a, "%s/direct.st", t);
        snprintf(b, sizeof b, "%s/relayed.st", t);
        snprintf(a4, sizeof a4, "%s/direct4.st", t);
        snprintf(b4, sizeof b4, "%s/relayed4.st", t);
        for (int relay = 0; relay < 2; relay++) {
            int rc = mgt_sh(&out, "%s %s -n %d %s %s %s --steps 2 --save %s", relay ?
                            "MG_CKPT_RELAY=always" : "", run, jobs[k].n, bin, gpt,
                            jobs[k].flags, relay ? b : a);
            CHECK_MSG(rc == 0 && (!relay || strstr(out, "through rank 0 (MG_CKPT_RELAY=always)")),
                      "%s: %s", jobs[k].flags, out);
            free(out);
            rc = mgt_sh(&out, "%s %s -n %d %s %s %s --steps 4 --resume %s --save %s", relay ?
                        "MG_CKPT_RELAY=always" : "", run, jobs[k].n, bin, gpt, jobs[k].flags,
                        relay ? b : a, relay ? b4 : a4);
            CHECK_MSG(rc == 0 && strstr(out, relay ? "rank 0 reads directly; rank"
                                                   : "read directly"),
                      "%s: %s", jobs[k].flags, out);
            free(out);
        }
        CHECK_MSG(mgt_sh(&out, "cmp %s %s && cmp %s %s", a, b, a4, b4) == 0, "%s: %s",
                  jobs[k].flags, out);
        free(out);
        printf("%s on %d ranks: through rank 0 byte for byte as directly\n", jobs[k].flags,
               jobs[k].n);
    }
}

/* --slow-rank R:F (issue 34): a straggler on purpose. Rank 1 of a DDP job
 * slowed 4x changes no number (the same validation loss, digit for digit)
 * and the whole job waits for it; the header says so. Bad values, a rank
 * outside the job, one process and a pipeline are one line each. */
static double final_seconds(const char *out, char *loss, size_t cap)
{
    const char *f = strstr(out, "final: validation loss ");
    if (!f) return -1;
    snprintf(loss, cap, "%.6s", f + 23);
    const char *s = strstr(f, " s training");
    while (s && s > f && s[-1] != ' ') s--;
    return s ? atof(s) : -1;
}

TEST_T(mgtrain_slow_rank_waits_and_changes_nothing, 180)
{
    char *out, loss[2][16];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const char *job = "--model gpt-mini --parallel ddp --batch 16 --steps 8 --eval-every 100 "
                      "--no-eval-on-start --eval-windows 2";
    double secs[2];
    const char *extra[2] = {"", "--slow-rank 1:4"};
    for (int k = 0; k < 2; k++) {
        int rc = mgt_sh(&out, "%s -n 2 %s %s %s", run, bin, job, extra[k]);
        CHECK_MSG(rc == 0, "%s: rc %d: %s", extra[k], rc, out);
        secs[k] = final_seconds(out, loss[k], sizeof loss[k]);
        CHECK_MSG(secs[k] > 0, "%s", out);
        if (k) CHECK_MSG(strstr(out, "rank 1 is a straggler on purpose"), "%s", out);
        free(out);
    }
    CHECK_MSG(!strcmp(loss[0], loss[1]), "loss %s against %s", loss[0], loss[1]);
    CHECK_MSG(secs[1] > 2 * secs[0], "%.2f s slowed against %.2f s", secs[1], secs[0]);
    mgt_refused((const mgt_refusal[]){
        {"--parallel ddp --slow-rank 1:1", "above 1"},
        {"--parallel ddp --slow-rank one:2", "RANK:FACTOR"},
        {"--parallel ddp --slow-rank 2:3", "ranks 0 to 1"},
        {"--slow-rank 0:2", "--parallel ddp"},
        {"--mesh pp=2 --slow-rank 1:2", "pipeline"},
        {NULL, NULL}});
}

/* Training that diverges stops at the end of the epoch (or evaluation
 * interval) whose training loss is not a finite number, said once with
 * what to do, status 2: the row goes to the log, and the checkpoint of
 * the last good epoch is kept, not overwritten with NaN parameters (which
 * a resume would refuse). The same under DDP and a parameter server,
 * whose server has no loss of its own. Here 1,024 images (8 steps of 128
 * an epoch) and a learning rate multiplied by 1e7 after the first epoch. */
TEST_T(mgtrain_diverged_training_stops_keeping_the_last_checkpoint, 120)
{
    const char *t = mgt_tmpdir(), *bin = mgt_tool("mgtrain"), *run = mgt_tool("mgrun");
    const char *data = mgt_fashion_cut(1024, 256);
    const char *how[3][2] = {{"", ""}, {"-n 2", "--parallel ddp"}, {"-n 3", "--parallel ps"}};
    for (int k = 0; k < 3; k++) {
        char *out, launch[600] = "";
        if (k) snprintf(launch, sizeof launch, "%s %s ", run, how[k][0]);
        int rc = mgt_sh(&out, "%s%s --model mlp --data %s --epochs 3 --schedule step:8:1e7 %s "
                        "--quiet --save %s/div%d.st --log %s/div%d.csv", launch, bin, data,
                        how[k][1], t, k, t, k);
        CHECK_MSG(rc == 2 && mgt_count(out, "training diverged") == 1 &&
                  strstr(out, "training loss of steps 9 to 16 is ") &&
                  strstr(out, "keeps step 8: lower --lr"), "%s: rc %d: %s", how[k][1], rc, out);
        free(out);
        char path[600];
        snprintf(path, sizeof path, "%s/div%d.st", t, k);
        mg_st_file *f;
        CHECK_OK(mg_st_open(path, &f));
        const char *step = mg_st_meta(f, "step");
        CHECK_MSG(step && atol(step) == 8, "%s: the checkpoint is of step %s", how[k][1], step);
        mg_st_close(f);
        snprintf(path, sizeof path, "%s/div%d.csv", t, k);
        char *log = mgt_slurp(path, NULL);
        CHECK_MSG(mgt_count(log, "\n") == 3 && strstr(log, "\n2,16,nan,"), "%s", log);
        free(log);
    }
}

/* An output that is another output or a file the run reads is refused
 * before any work, the file untouched (found by a probe: a --log named
 * g.svg was overwritten by its own plot, --data corpus.txt --log
 * corpus.txt overwrote the training text, --init w.st --log w.st the
 * weights). A --save may be the --resume file (that is resuming). */
TEST_T(mgtrain_outputs_that_are_inputs_or_each_other_are_refused, 60)
{
    const char *t = mgt_tmpdir();
    char bin[PATH_MAX];   /* absolute: the runs start in the test's directory */
    CHECK(realpath(mgt_tool("mgtrain"), bin));
    char corpus[600], weights[600];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", t);
    snprintf(weights, sizeof weights, "%s/w.st", t);
    FILE *f = fopen(corpus, "w");
    CHECK(f);
    for (int i = 0; i < 400; i++) fprintf(f, "line %d of a corpus that must survive.\n", i);
    fclose(f);
    char *out, *before = mgt_slurp(corpus, NULL);
    int rc = mgt_sh(&out, "cd %s && %s --model mlp --epochs 1 --save w.st --quiet", t, bin);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    const char *gpt = "--model gpt-mini --layers 1 --dim 32 --heads 2 --ctx 16 --batch 4 --steps 2";
    const struct { const char *args, *says; } cases[] = {
        {"--model mlp --epochs 1 --log g.svg", "--log g.svg is also the --log (its plot)"},
        {"--model mlp --epochs 1 --log a.csv --save a.svg", "--save a.svg is also the --log (its"},
        {"--model mlp --epochs 1 --log same --save same", "--save same is also the --log:"},
        {"--model mlp --epochs 1 --init w.st --log ./w.st", "is also the --init file this run"},
        {"--data corpus.txt --log corpus.txt", "--log corpus.txt is also the --data file"},
        {"--data corpus.txt --save corpus.txt", "--save corpus.txt is also the --data file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        rc = mgt_sh(&out, "cd %s && %s %s %s", t, bin, i < 4 ? "" : gpt, cases[i].args);
        CHECK_MSG(rc == 2 && mgt_count(out, "\n") == 1 && strstr(out, cases[i].says),
                  "%s: rc %d: %s", cases[i].args, rc, out);
        free(out);
    }
    char *after = mgt_slurp(corpus, NULL);
    CHECK(!strcmp(before, after));
    mg_st_file *w;
    CHECK_OK(mg_st_open(weights, &w));   /* still the checkpoint */
    mg_st_close(w);
    rc = mgt_sh(&out, "cd %s && %s --model mlp --epochs 2 --resume w.st --save w.st --quiet", t,
                bin);
    CHECK_MSG(rc == 0, "resume into the same file: %s", out);
    free(out);
    free(before);
    free(after);
}

/* A --save that fails amid training (its directory removed) is said
 * once, by rank 0, on every plan's ranks alike (each of 3 ranks said it). */
TEST_T(mgtrain_a_save_that_fails_amid_training_is_said_once, 120)
{
    const char *t = mgt_tmpdir();
    char run[PATH_MAX], bin[PATH_MAX], *out;   /* absolute: the run starts in t */
    CHECK(realpath(mgt_tool("mgrun"), run) && realpath(mgt_tool("mgtrain"), bin));
    int rc = mgt_sh(&out, "cd %s && mkdir d && (MG_PEER_TIMEOUT=30 %s -n 3 %s " GPT_SMALL
                    " --steps 2000 --eval-every 4 --parallel ddp --save d/ck.st --quiet "
                    "> out 2>&1; echo $? > rc) & cd %s && for i in $(seq 1200); do "
                    "[ -f d/ck.st ] && break; sleep 0.05; done; while [ -d d ]; do rm -rf d 2>/dev/null; "
                    "done; wait; cat out; cat rc",
                    t, run, bin, t);
    printf("%s", out);
    CHECK_MSG(rc == 0 && mgt_count(out, "mgtrain: --save: ") == 1 &&
              strstr(out, "mgrun: rank 0 (pid ") && strstr(out, "\n2\n"), "%s", out);
    free(out);
}
