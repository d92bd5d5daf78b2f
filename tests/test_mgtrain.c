/* mgtrain end to end: real data, real processes. Bad input, logs and
 * plots, checkpoints and exact resume, --init and --eval-only. */
#include <errno.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "harness.h"
#include "devices.h"
#include "multigrad/checkpoint.h"

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

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
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out;
        int rc = mgt_sh(&out, "%s %s --save %s --epochs 1", bin, bad[i], save);
        CHECK_MSG(rc == 2, "'%s' exited %d: %s", bad[i], rc, out);
        CHECK_MSG(count_lines(out) == 1, "'%s' printed %d lines: %s", bad[i],
                  count_lines(out), out);
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
    CHECK_MSG(rc == 2 && strstr(out, "lr=") && count_lines(out) == 1, "%s", out);
    free(out);
    snprintf(b, sizeof b, "%s/half.st", t);
    CHECK_OK(mg_st_open(b, &fb));
    mg_st_close(fb);
    /* --eval-only of the checkpoint's weights reports the last test accuracy. */
    rc = mgt_sh(&out, "%s --model mlp --eval-only --init %s/full.st", bin, t);
    CHECK_MSG(rc == 0 && strstr(out, "test accuracy"), "%s", out);
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

/* ---- gpt-mini ---------------------------------------------------------- */

/* A gpt-mini small enough for tests: 2 layers, dim 64, 4 heads, context 64,
 * batch 12 (divides among 2, 3 and 4 ranks and workers), 16 validation
 * windows (all 512 the text has take most of a short run under TSan). */
#define GPT_SMALL "--model gpt-mini --layers 2 --dim 64 --heads 4 --ctx 64 --batch 12 " \
                  "--eval-windows 16"

/* |a - b| / |b| over all parameters of two checkpoints (optimizer state
 * left out); *max_rel gets max |a_i - b_i| / max |b|. */
static double ckpt_rel_diff(const char *a, const char *b, double *max_rel)
{
    mg_st_file *fa, *fb;
    CHECK_OK(mg_st_open(a, &fa));
    CHECK_OK(mg_st_open(b, &fb));
    double dn = 0, nn = 0, worst = 0, scale = 0;
    int params = 0;
    for (int i = 0; i < mg_st_count(fb); i++) {
        const mg_st_tensor *y = mg_st_get(fb, i), *x = mg_st_find(fa, y->name);
        if (!strncmp(y->name, "optim.", 6)) continue;
        CHECK_MSG(x && x->nbytes == y->nbytes && x->dtype == MG_ST_F32, "tensor %s", y->name);
        const float *p = (const float *)x->data, *q = (const float *)y->data;
        for (size_t k = 0; k < y->nbytes / 4; k++) {
            dn += ((double)p[k] - q[k]) * ((double)p[k] - q[k]);
            nn += (double)q[k] * q[k];
            worst = fmax(worst, fabs((double)p[k] - q[k]));
            scale = fmax(scale, fabs((double)q[k]));
        }
        params++;
    }
    CHECK_EQ(params, 2 + 12 * 2 + 2);   /* wte, wpe, 12 per block, ln_f */
    mg_st_close(fa);
    mg_st_close(fb);
    *max_rel = worst / scale;
    return sqrt(dn / nn);
}

/* DDP on 2 and 3 ranks and DataParallel with 2 and 3 workers equal one
 * process with the same global batch: 10 AdamW steps with decay groups and
 * clipping, through mgtrain and mgrun, compared on the saved parameters.
 * Only the summation order differs (the ranks' losses are means over
 * their rows, averaged; one process takes the mean over all rows), so
 * the bound is rounding grown over 10 steps: AdamW moves an entry whose
 * gradient is within rounding of zero by up to lr either way, so the
 * vector norm, not the largest entry, is bounded: 1e-4 (seen: 3e-6). */
TEST_T(mgtrain_gpt_ddp_and_dp_equal_one_process, 240)
{
    const char *t = mgt_tmpdir();
    char *out, ref[512], other[512];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ref, sizeof ref, "%s/one.st", t);
    snprintf(other, sizeof other, "%s/other.st", t);
    int rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 10 --eval-every 10 --save %s", bin, ref);
    CHECK_MSG(rc == 0 && strstr(out, "val loss"), "%s", out);
    free(out);
    for (int k = 2; k <= 3; k++)
        for (int ddp = 0; ddp <= 1; ddp++) {
            if (ddp)
                rc = mgt_sh(&out, "%s -n %d %s " GPT_SMALL " --steps 10 --eval-every 10 "
                            "--parallel ddp --save %s", run, k, bin, other);
            else
                rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 10 --eval-every 10 --parallel dp "
                            "--workers %d --save %s", bin, k, other);
            CHECK_MSG(rc == 0, "%s", out);
            free(out);
            double worst, d = ckpt_rel_diff(other, ref, &worst);
            printf("gpt-mini %s %d: |p - ref| / |ref| = %.3g (max entry %.3g)\n",
                   ddp ? "ddp ranks" : "dp workers", k, d, worst);
            CHECK_MSG(d <= 1e-4, "%s %d: parameters differ from one process by %g",
                      ddp ? "ddp ranks" : "dp workers", k, d);
        }
}

/* One process of gpt-mini on the CPU (GPT_SMALL and `args`) saved to
 * `save`: the reference the device runs are compared with. */
static void cpu_reference(const char *bin, const char *args, const char *save)
{
    char *out;
    int rc = mgt_sh(&out, "%s " GPT_SMALL " %s --save %s", bin, args, save);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
}

/* Training on a device (dev: emu, or cuda when there is a GPU) equals
 * one process on the CPU within the DDP test's bound: one process, and
 * DDP on 2, 3 and 4 ranks sharing the device, whose buckets go through
 * the host's collectives. Greedy sampling on the device writes the CPU's
 * text. Checkpoints move between the device and the CPU: 10 steps on one
 * and 10 resumed on the other equal 20 on the CPU. */
static void device_equals_cpu(const char *dev)
{
    const char *t = mgt_tmpdir();
    char *out, ref[512], ref20[512], other[512], half[512];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ref, sizeof ref, "%s/cpu.st", t);
    snprintf(ref20, sizeof ref20, "%s/cpu20.st", t);
    snprintf(other, sizeof other, "%s/dev.st", t);
    snprintf(half, sizeof half, "%s/half.st", t);
    cpu_reference(bin, "--steps 10 --eval-every 10", ref);
    cpu_reference(bin, "--steps 20 --eval-every 10", ref20);
    int rc;
    for (int k = 1; k <= 4; k++) {
        if (mgt_sanitized() && k % 2 == 0) continue;   /* one process and 3 ranks there */
        if (k == 1)
            rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 10 --eval-every 10 --device %s --save %s",
                        bin, dev, other);
        else
            rc = mgt_sh(&out, "%s -n %d %s " GPT_SMALL " --steps 10 --eval-every 10 --device %s "
                        "--parallel ddp --save %s", run, k, bin, dev, other);
        CHECK_MSG(rc == 0 && strstr(out, "device: "), "%s", out);
        free(out);
        double worst, d = ckpt_rel_diff(other, ref, &worst);
        printf("gpt-mini on %s, %d rank(s): |p - cpu| / |cpu| = %.3g (max entry %.3g)\n", dev, k,
               d, worst);
        CHECK_MSG(d <= 1e-4, "%s, %d rank(s): parameters differ from the CPU's by %g", dev, k, d);
    }
    /* ZeRO, pipelines (with data-parallel replicas) and the optimizer
     * offloaded to the host (--offload cpu) with the model on the device, a
     * checkpoint written at step 5 (the model goes through the host and
     * back, the pipeline's tapes are made again). A pipeline's batch of
     * 12 in its 2 micro-batches is one process's --batch 6 --accumulate 2
     * (the rows of --batch 12, summed in another order). */
    char acc[512];
    snprintf(acc, sizeof acc, "%s/cpu-acc.st", t);
    cpu_reference(bin, "--batch 6 --accumulate 2 --steps 10 --eval-every 10", acc);
    static const struct { int n; const char *args; } more[] = {
        {3, "--parallel ddp --zero 3"}, {2, "--mesh pp=2"}, {4, "--mesh pp=2"},
        {2, "--parallel ddp --offload cpu --verbose"},
        {3, "--parallel ddp --zero 2 --offload cpu"},
    };
    for (size_t i = 0; i < sizeof more / sizeof *more; i++) {
        if (mgt_sanitized() && i == 1) continue;   /* pp=2 there: its replicas' case below */
        rc = mgt_sh(&out, "%s -n %d %s " GPT_SMALL " --steps 10 --eval-every 5 --device %s %s "
                    "--save %s", run, more[i].n, bin, dev, more[i].args, other);
        CHECK_MSG(rc == 0 && strstr(out, "device: "), "%s", out);
        if (strstr(more[i].args, "--offload cpu"))
            CHECK_MSG(strstr(out, "state in host memory (--offload cpu)"), "%s", out);
        if (strstr(more[i].args, "--verbose"))   /* what the device holds, per rank */
            CHECK_MSG(strstr(out, "rank 1 device memory now MB parameters") &&
                      strstr(out, "the optimizer's state in host memory"), "%s", out);
        free(out);
        double worst, d = ckpt_rel_diff(other, strstr(more[i].args, "pp=") ? acc : ref, &worst);
        printf("gpt-mini on %s, %d ranks, %s: |p - cpu| / |cpu| = %.3g (max entry %.3g)\n", dev,
               more[i].n, more[i].args, d, worst);
        CHECK_MSG(d <= 1e-4, "%s, %d ranks, %s: parameters differ from the CPU's by %g", dev,
                  more[i].n, more[i].args, d);
    }
    /* --bf16: the GEMMs' operands rounded to bfloat16 move the parameters
     * by bfloat16's rounding, not more (seen: 1.6e-3 on emu) */
    rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 10 --eval-every 10 --device %s --bf16 --save %s",
                bin, dev, other);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    double worst, d = ckpt_rel_diff(other, ref, &worst);
    printf("gpt-mini on %s with --bf16: |p - cpu| / |cpu| = %.3g (max entry %.3g)\n", dev, d,
           worst);
    CHECK_MSG(d > 1e-5 && d <= 1e-2, "--bf16 on %s: parameters differ from the CPU's float "
              "training by %g", dev, d);
    /* The sample at temperature 0 (the most likely byte each time) from
     * the CPU's weights, evaluated on each: one process, and a pipeline
     * of two stages. */
    char *said[3];
    for (int k = 0; k < 3; k++) {
        rc = mgt_sh(&said[k], "%s%s%s " GPT_SMALL " --init %s --eval-only --sample 60 "
                    "--temperature 0 --device %s%s", k == 2 ? run : "", k == 2 ? " -n 2 " : "",
                    bin, ref, k ? dev : "cpu", k == 2 ? " --mesh pp=2" : "");
        CHECK_MSG(rc == 0, "%s", said[k]);
    }
    const char *a0 = strstr(said[0], "sample (");
    for (int k = 1; k < 3; k++) {
        const char *a = strstr(said[k], "sample (");
        CHECK_MSG(a0 && a && !strcmp(a0, a), "the sample on %s%s differs from the CPU's:\n%s\n%s",
                  dev, k == 2 ? " (pipeline)" : "", said[k], said[0]);
    }
    for (int k = 0; k < 3; k++) free(said[k]);
    for (int there = 0; there < 2; there++) {
        const char *a = there ? "cpu" : dev, *b = there ? dev : "cpu";
        rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 10 --eval-every 10 --device %s --save %s", bin,
                    a, half);
        CHECK_MSG(rc == 0, "%s", out);
        free(out);
        rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 20 --eval-every 10 --device %s --resume %s "
                    "--save %s", bin, b, half, other);
        CHECK_MSG(rc == 0, "%s", out);
        free(out);
        double worst, d = ckpt_rel_diff(other, ref20, &worst);
        printf("10 steps on %s, 10 resumed on %s: |p - cpu| / |cpu| = %.3g\n", a, b, d);
        CHECK_MSG(d <= 1e-4, "resumed from %s on %s: parameters differ by %g", a, b, d);
    }
}

TEST_T(mgtrain_device_emu_and_ddp_sharing_it_equal_cpu, 300) { device_equals_cpu("emu"); }

TEST_T(mgtrain_device_gpu_and_ddp_sharing_it_equal_cpu, 300)
{
    mgt_device(MG_DEVICE_CUDA);   /* skips without a GPU */
    device_equals_cpu("cuda");
}

/* The same through NCCL on a GPU (mg_group_use_device): each rank told it
 * is a host of its own (NCCL_HOSTID), as NCCL refuses two ranks on one
 * GPU of one host; the data-parallel sub-groups of a mesh use it too, and
 * a pipeline's stages send and receive through it (1F1B over pp=2 x
 * dp=2, GPipe over pp=2, interleaved's two rounds in lock-step, and its
 * one group of 3, where what goes round is received early). 10 steps
 * with a checkpoint at step 5 equal one process on the CPU (a pipeline's
 * 2 micro-batches: one process's --batch 6 --accumulate 2). */
TEST_T(mgtrain_device_gpu_through_nccl_equals_cpu, 240)
{
    mgt_nccl_gpu();
    const char *t = mgt_tmpdir();
    char *out, ref[512], acc[512], other[512];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ref, sizeof ref, "%s/cpu.st", t);
    snprintf(acc, sizeof acc, "%s/cpu-acc.st", t);
    snprintf(other, sizeof other, "%s/nccl.st", t);
    cpu_reference(bin, "--steps 10 --eval-every 10", ref);
    cpu_reference(bin, "--batch 6 --accumulate 2 --steps 10 --eval-every 10", acc);
    int rc;
    static const struct { int n; const char *args; } runs[] = {
        {2, "--parallel ddp"}, {3, "--parallel ddp --zero 3"}, {4, "--mesh pp=2 --verbose"},
        {2, "--mesh pp=2 --pp-schedule gpipe --verbose"},
        {2, "--mesh pp=2 --pp-schedule interleaved --chunks 2 --micro-batches 4 --verbose"},
        {2, "--mesh pp=2 --pp-schedule interleaved --chunks 2 --micro-batches 3 --verbose"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        rc = mgt_sh(&out, "MG_NCCL=on %s -n %d sh -c 'NCCL_HOSTID=mgtest$RANK exec \"$0\" \"$@\"' "
                    "%s " GPT_SMALL " --steps 10 --eval-every 5 --device cuda %s --save %s", run,
                    runs[i].n, bin, runs[i].args, other);
        CHECK_MSG(rc == 0 && strstr(out, "collectives on GPU memory: NCCL"), "%s", out);
        /* A pipeline's stages exchange through NCCL's sends and receives:
         * every batch received in device memory on a group through NCCL,
         * interleaved's of two rounds too (in lock-step). */
        const char *pl = strstr(out, " batches of sends and receives received in device memory");
        long on_dev = 0;
        while (pl && pl > out && pl[-1] != '\n') pl--;   /* its line */
        bool counted = pl && sscanf(pl, "%*s rank %*d pipeline: %ld batches", &on_dev) == 1;
        CHECK_MSG(!strstr(runs[i].args, "pp=") ||
                      (counted && on_dev > 0 && strstr(out, "device path: nccl")), "%s", out);
        free(out);
        double worst, d = ckpt_rel_diff(other, strstr(runs[i].args, "pp=") ? acc : ref, &worst);
        printf("gpt-mini through NCCL, %d ranks, %s: |p - cpu| / |cpu| = %.3g (max entry %.3g)\n",
               runs[i].n, runs[i].args, d, worst);
        CHECK_MSG(d <= 1e-4, "NCCL, %d ranks, %s: parameters differ from the CPU's by %g",
                  runs[i].n, runs[i].args, d);
    }
}

/* What a device cannot run yet is refused with one line naming it (a
 * model without device kernels: test_device.c). */
TEST(mgtrain_device_refusals_one_line)
{
    const char *bin = mgt_tool("mgtrain");
    const struct { const char *args, *says; } cases[] = {
        {GPT_SMALL " --steps 2 --device emu --parallel dp", "strategy dp (threads sharing one "
                                                            "model) does not run on a device"},
        {GPT_SMALL " --steps 2 --device gpu", "unknown device 'gpu'"},
        {GPT_SMALL " --steps 2 --device emu --tf32", "--tf32 is for GPUs"},
        {GPT_SMALL " --steps 2 --bf16", "--bf16 is for devices"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out;
        int rc = mgt_sh(&out, "%s %s", bin, cases[i].args);
        CHECK_MSG(rc == 2 && strstr(out, cases[i].says), "%s: rc %d: %s", cases[i].args, rc, out);
        free(out);
    }
    /* Offload to files, in one process too (issue 30 item 7: it was
     * accepted there), before any work. */
    char *out;
    const char *run = mgt_tool("mgrun");
    const char *says = "--offload disk:DIR keeps the optimizer's state in files for a model on "
                       "the CPU; with --device emu give --offload cpu";
    int rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " --steps 2 --device emu --parallel ddp "
                    "--zero 2 --offload disk:%s", run, mgt_tool("mgtrain"), mgt_tmpdir());
    CHECK_MSG(rc != 0 && strstr(out, says), "rc %d: %s", rc, out);
    free(out);
    rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 2 --device emu --offload disk:%s", bin,
                mgt_tmpdir());
    CHECK_MSG(rc == 2 && strstr(out, says) && !strstr(out, "step"), "rc %d: %s", rc, out);
    free(out);
}

/* --recompute trains to the same parameters bit for bit; --print-plan
 * shows the units as DDP on 3 ranks pads them; --mesh takes dp and
 * refuses what is not built yet with one line. */
TEST_T(mgtrain_recompute_print_plan_and_mesh, 180)
{
    const char *t = mgt_tmpdir();
    char *out, a[512], b[512];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(a, sizeof a, "%s/plain.st", t);
    snprintf(b, sizeof b, "%s/recomputed.st", t);
    for (int r = 0; r < 2; r++) {
        int rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 4 --eval-every 4 --save %s%s", bin,
                        r ? b : a, r ? " --recompute" : "");
        CHECK_MSG(rc == 0, "%s", out);
        free(out);
    }
    double worst, d = ckpt_rel_diff(b, a, &worst);
    CHECK_MSG(d == 0 && worst == 0, "recomputation changed the parameters by %g", d);

    int rc = mgt_sh(&out, "%s -n 3 %s " GPT_SMALL " --batch 6 --mesh dp=3 --print-plan", run,
                    bin);
    CHECK_MSG(rc == 0 && strstr(out, "strategy ddp on 3 rank(s), mesh dp=3,pp=1,tp=1") &&
              strstr(out, "units padded to 48 floats") && strstr(out, " h.1 ") &&
              strstr(out, "gpt_block") && strstr(out, "A tape for a micro-batch of 2"),
              "%s", out);
    free(out);
    /* Tensor parallelism: a tp that does not divide the heads, and
     * --sequence-parallel without tp, are one line each before any work. */
    rc = mgt_sh(&out, "%s -n 3 %s " GPT_SMALL " --mesh tp=3", run, bin);
    CHECK_MSG(rc != 0 && strstr(out, "--heads 4 does not split over 3 tensor-parallel ranks") &&
              !strstr(out, "step "), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " --sequence-parallel", run, bin);
    CHECK_MSG(rc != 0 && strstr(out, "--sequence-parallel splits the positions") &&
              !strstr(out, "step "), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " --mesh tp=2 --sequence-parallel --print-plan",
                run, bin);
    CHECK_MSG(rc == 0 && strstr(out, "mesh dp=1,pp=1,tp=2") && strstr(out, "tp2"), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s -n 3 %s " GPT_SMALL " --batch 6 --mesh dp=2", run, bin);
    CHECK_MSG(rc != 0 && strstr(out, "has dp*tp*pp = 2 ranks but the job has 3"), "%s", out);
    free(out);
}

/* --mesh pp=P --print-plan: the cut (balanced, or --split), each stage's
 * tape and every rank's schedule with its bubble; pipeline flags in the
 * wrong place are one clear error each. */
TEST_T(mgtrain_pipeline_plan_printed, 120)
{
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    int rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " --mesh pp=2 --micro-batches 4 --print-plan",
                    run, bin);
    CHECK_MSG(rc == 0 && strstr(out, "stage 0 on rank 0: units 0-1 (embedding .. h.0)") &&
              strstr(out, "stage 1 on rank 1: units 2-4 (h.1 .. tied_head)") &&
              strstr(out, "bubble 20.0%") &&
              strstr(out, "rank 0 (at most 2 micro-batch(es) in flight): 0F0 0F1 0B0 0F2 0B1 "
                          "0F3 0B2 0B3") &&
              strstr(out, "a tape of") && !strstr(out, "not built yet"), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " --mesh pp=2 --pp-schedule gpipe --split ln_f "
                "--print-plan", run, bin);
    CHECK_MSG(rc == 0 && strstr(out, "stage 0 on rank 0: units 0-2 (embedding .. h.1)") &&
              strstr(out, "cut as --split gives") && strstr(out, "0F0 0F1 0B0 0B1"), "%s", out);
    free(out);
    struct { const char *args, *want; } bad[] = {
        {"--mesh pp=2 --accumulate 2", "give --micro-batches 2"},
        {"--mesh pp=2 --micro-batches 5", "--batch 12 does not split into --micro-batches 5"},
        {"--mesh pp=2 --compress bf16", "a pipeline's data-parallel replicas"},
        {"--mesh pp=2 --pp-schedule interleaved --micro-batches 1", "fewer than 2 stages"},
        {"--mesh pp=2 --split h.9 --print-plan", "no unit 'h.9'"},
        {"--mesh pp=2 --chunks 2 --print-plan", "--chunks 2 is for --pp-schedule interleaved"},
        {"--mesh pp=2 --pp-schedule zb --print-plan", "naive, gpipe, 1f1b or interleaved"},
        {"--mesh dp=2 --micro-batches 4", "has none: give pp=P"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " %s", run, bin, bad[i].args);
        CHECK_MSG(rc != 0 && strstr(out, bad[i].want), "%s: rc %d: %s", bad[i].args, rc, out);
        free(out);
    }
    rc = mgt_sh(&out, "%s " GPT_SMALL " --pp-schedule gpipe", bin);
    CHECK_MSG(rc != 0 && strstr(out, "give --mesh pp=P"), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s " GPT_SMALL " --schedule 1f1b", bin);
    CHECK_MSG(rc != 0 && strstr(out, "the pipeline's is --pp-schedule 1f1b"), "%s", out);
    free(out);
}

/* ZeRO 1-3 over a pipeline's replicas with the optimizer's state in files
 * (--offload disk) trains as in memory: the same checkpoint bytes after 6
 * steps, on a 2-stage pipeline of 2 replicas. */
TEST_T(mgtrain_pipeline_zero_with_disk_offload_equals_in_memory, 240)
{
    const char *t = mgt_tmpdir();
    char a[512], b[512], dir[512];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(a, sizeof a, "%s/memory.st", t);
    snprintf(b, sizeof b, "%s/disk.st", t);
    snprintf(dir, sizeof dir, "%s/offload", t);
    CHECK(mkdir(dir, 0700) == 0);
    for (int z = 1; z <= 3; z++) {
        char *out;
        for (int k = 0; k < 2; k++) {
            int rc = mgt_sh(&out, "%s -n 4 %s " GPT_SMALL " --mesh pp=2,dp=2 --zero %d --steps 6 "
                            "--eval-every 3 --save %s %s%s", run, bin, z, k ? b : a,
                            k ? "--verbose --offload disk:" : "", k ? dir : "");
            CHECK_MSG(rc == 0 && strstr(out, "pipeline+zero") &&
                      (!k || strstr(out, "rank 3: the optimizer's state of")),
                      "zero %d%s: %s", z, k ? " offloaded" : "", out);
            free(out);
        }
        char *diff;
        int rc = mgt_sh(&diff, "cmp %s %s", a, b);
        CHECK_MSG(rc == 0, "--zero %d: the offloaded run's checkpoint differs: %s", z, diff);
        free(diff);
    }
}

/* Trains GPT_SMALL 2 steps more under each mode in turn (mode[k] on
 * ranks[k] ranks, its flags), resuming from ck (but the first) and saving
 * there; returns how far ck's parameters are from ref's. */
static double train_in_turn(const char *const *mode, const int *ranks, int n, const char *ck,
                            const char *ref)
{
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    for (int k = 0; k < n; k++) {
        char launch[600] = "", resume[600] = "";
        if (ranks[k] > 1) snprintf(launch, sizeof launch, "%s -n %d ", run, ranks[k]);
        if (k) snprintf(resume, sizeof resume, "--resume %s", ck);
        int rc = mgt_sh(&out, "%s%s " GPT_SMALL " %s --steps %d --eval-every 2 --save %s %s",
                        launch, bin, mode[k], 2 * (k + 1), ck, resume);
        CHECK_MSG(rc == 0, "step %d (%s): %s", 2 * (k + 1), mode[k], out);
        free(out);
    }
    double worst, d = ckpt_rel_diff(ck, ref, &worst);
    printf("%d steps, 2 each under", 2 * n);
    for (int k = 0; k < n; k++) printf(" '%s' x%d", mode[k], ranks[k]);
    printf(", vs one process: %.3g (max %.3g)\n", d, worst);
    return d;
}

/* A checkpoint moves freely between strategies and world sizes (it holds
 * tensors by name, whatever the unit padding): 2 steps on 3 DDP ranks,
 * 2 more in one process, 2 on 2 ranks, 2 with DataParallel threads end
 * where 8 steps in one process do, up to the summation order. */
TEST_T(mgtrain_checkpoint_moves_between_strategies, 240)
{
    const char *t = mgt_tmpdir();
    char *out, ref[512], ck[512];
    const char *bin = mgt_tool("mgtrain");
    snprintf(ref, sizeof ref, "%s/straight.st", t);
    snprintf(ck, sizeof ck, "%s/moving.st", t);
    int rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 8 --eval-every 2 --save %s", bin, ref);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    const char *mode[4] = {"--parallel ddp", "", "--parallel ddp", "--parallel dp --workers 3"};
    int ranks[4] = {3, 1, 2, 1};
    double d = train_in_turn(mode, ranks, 4, ck, ref);
    CHECK_MSG(d <= 1e-4, "parameters differ from one process by %g", d);
}

/* A pipeline trains as one process does (--batch B in M micro-batches is
 * one process's --batch B/M --accumulate M: the same printed losses and
 * sample; and both are one process's --batch B, the same rows of text in
 * one micro-batch, within rounding), and
 * its checkpoints move to and from other strategies: 2 steps on a 2-stage
 * 1F1B pipeline, 2 in one process, 2 on an interleaved pipeline of 2 x 2
 * stages with 2 replicas sharded by ZeRO-3, 2 on a 3-stage GPipe end where
 * 8 steps in one process do. */
TEST_T(mgtrain_pipeline_equals_one_process_and_checkpoints_move, 300)
{
    const char *t = mgt_tmpdir();
    char *out, *one, ref[512], ck[512];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ref, sizeof ref, "%s/straight.st", t);
    snprintf(ck, sizeof ck, "%s/moving.st", t);
    int rc = mgt_sh(&one, "%s " GPT_SMALL " --accumulate 2 --steps 8 --eval-every 2 --save %s "
                    "--sample 40", bin, ref);
    CHECK_MSG(rc == 0, "%s", one);
    rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " --batch 24 --micro-batches 2 --mesh pp=2 "
                "--steps 8 --eval-every 2 --sample 40", run, bin);
    CHECK_MSG(rc == 0, "%s", out);
    /* The sample, drawn through the stages, is one process's. */
    const char *sa = strstr(one, "sample ("), *sb = strstr(out, "sample (");
    CHECK_MSG(sa && sb && !strncmp(sa, sb, 60), "one process:\n%s\npipeline:\n%s", one, out);
    /* The same lines from "step 2/8" on but for their times. */
    for (int k = 2; k <= 8; k += 2) {
        char key[32], a[128] = "", b[128] = "";
        snprintf(key, sizeof key, "step %5d/8", k);
        const char *x = strstr(one, key), *y = strstr(out, key);
        CHECK_MSG(x && y, "%s missing", key);
        if (!x || !y) break;
        const char *xe = strstr(x, " s "), *ye = strstr(y, " s ");
        CHECK(xe && ye);
        memcpy(a, x, (size_t)(strstr(x, "ppl") - x));
        memcpy(b, y, (size_t)(strstr(y, "ppl") - y));
        CHECK_MSG(!strcmp(a, b), "pipeline '%s' vs one process '%s'", b, a);
    }
    free(out);
    free(one);
    char whole[512];
    snprintf(whole, sizeof whole, "%s/whole.st", t);
    rc = mgt_sh(&out, "%s " GPT_SMALL " --batch 24 --steps 8 --eval-every 8 --save %s", bin,
                whole);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    double worst, dw = ckpt_rel_diff(whole, ref, &worst);
    printf("--batch 24 against --batch 12 --accumulate 2: %.3g (max entry %.3g)\n", dw, worst);
    CHECK_MSG(dw <= 1e-4, "--batch 24 differs from --batch 12 --accumulate 2 by %g", dw);
    const char *mode[4] = {"--batch 24 --micro-batches 2 --mesh pp=2",
                           "--batch 12 --accumulate 2",
                           "--batch 24 --micro-batches 2 --mesh pp=2,dp=2 --pp-schedule "
                           "interleaved --zero 3",
                           "--batch 24 --micro-batches 2 --mesh pp=3 --pp-schedule gpipe"};
    int ranks[4] = {2, 1, 4, 3};
    double d = train_in_turn(mode, ranks, 4, ck, ref);
    CHECK_MSG(d <= 1e-4, "parameters differ from one process by %g", d);
}

/* ZeRO checkpoints are logical: saved under ZeRO-3 on 4 ranks, resumed
 * under ZeRO-1 on 2, in one process, under ZeRO-2 on 3 ranks and under DDP
 * on 2, the training is the one-process training (within rounding). */
TEST_T(mgtrain_zero_checkpoint_moves_between_stages_and_world_sizes, 300)
{
    const char *t = mgt_tmpdir();
    char *out, ref[512], ck[512];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ref, sizeof ref, "%s/straight.st", t);
    snprintf(ck, sizeof ck, "%s/moving.st", t);
    int rc = mgt_sh(&out, "%s " GPT_SMALL " --steps 10 --eval-every 2 --save %s", bin, ref);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    const char *mode[5] = {"--parallel ddp --zero 3", "--parallel ddp --zero 1", "",
                           "--mesh dp=3 --zero 2", "--parallel ddp"};
    int ranks[5] = {4, 2, 1, 3, 2};
    double worst, d = train_in_turn(mode, ranks, 5, ck, ref);
    CHECK_MSG(d <= 1e-4, "parameters differ from one process by %g", d);
    /* A checkpoint of another shape is refused, the file left as it was. */
    rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " --dim 32 --parallel ddp --zero 3 --steps 12 "
                "--resume %s --save %s", run, bin, ck, ck);
    CHECK_MSG(rc != 0 && strstr(out, "--resume") && strstr(out, "shape"), "%s", out);
    free(out);
    CHECK(ckpt_rel_diff(ck, ref, &worst) == d);
}

/* --zero: one clear line and status 2 for a stage that does not exist,
 * for ZeRO without a job of ranks, with compression. */
/* Each set of flags, on 2 ranks of the mlp, refused with its message
 * (the list ends with NULLs). */
typedef struct {
    const char *args, *want;
} refusal;

static void refused(const refusal *c)
{
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    for (; c->args; c++) {
        int rc = mgt_sh(&out, "%s -n 2 %s --model mlp --epochs 1 %s", run, bin, c->args);
        CHECK_MSG(rc != 0 && strstr(out, c->want), "%s: rc %d: %s", c->args, rc, out);
        free(out);
    }
}

TEST_T(mgtrain_zero_bad_input, 60)
{
    refused((const refusal[]){
        {"--parallel ddp --zero 4", "--zero"},
        {"--zero 2", "--parallel ddp or --mesh dp=N"},
        {"--parallel dp --zero 1", "--parallel ddp or --mesh dp=N"},
        {"--parallel ddp --zero 1 --compress fp16", "without --zero"},
        {NULL, NULL}});
}

/* --offload disk:DIR: the optimizer state (and under ZeRO-3 the
 * parameter shard) in files changes no bit of the training: 6 steps
 * offloaded, and 3 offloaded resumed for 3 more, write the checkpoint 6
 * steps in memory write; DIR is left empty. Bad offload input is one
 * clear error before any work, the previous checkpoint untouched. */
TEST_T(mgtrain_offload_same_as_in_memory, 240)
{
    const char *t = mgt_tmpdir();
    char *out, dir[600], a[600], b[600], c[600];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(dir, sizeof dir, "%s/offload-dir", t);
    CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST);
    const char *mode[3] = {"--parallel ddp --zero 3", "--parallel ddp --zero 1", ""};
    for (int k = 0; k < 3; k++) {
        char launch[600] = "";
        if (*mode[k]) snprintf(launch, sizeof launch, "%s -n 2 ", run);
        snprintf(a, sizeof a, "%s/mem.st", t);
        snprintf(b, sizeof b, "%s/off.st", t);
        snprintf(c, sizeof c, "%s/off-resumed.st", t);
        int rc = mgt_sh(&out, "%s%s " GPT_SMALL " %s --steps 6 --eval-every 3 --save %s", launch,
                        bin, mode[k], a);
        CHECK_MSG(rc == 0, "%s", out);
        free(out);
        rc = mgt_sh(&out, "%s%s " GPT_SMALL " %s --steps 6 --eval-every 3 --save %s --offload "
                    "disk:%s", launch, bin, mode[k], b, dir);
        CHECK_MSG(rc == 0, "%s", out);
        free(out);
        rc = mgt_sh(&out, "%s%s " GPT_SMALL " %s --steps 3 --eval-every 3 --save %s --offload "
                    "disk:%s && %s%s " GPT_SMALL " %s --steps 6 --eval-every 3 --save %s "
                    "--resume %s --offload disk:%s", launch, bin, mode[k], c, dir, launch, bin,
                    mode[k], c, c, dir);
        CHECK_MSG(rc == 0, "%s", out);
        free(out);
        double worst, d = ckpt_rel_diff(b, a, &worst), e = ckpt_rel_diff(c, a, &worst);
        printf("%s: offloaded %.3g, offloaded and resumed %.3g from in memory\n",
               *mode[k] ? mode[k] : "one process", d, e);
        CHECK_MSG(d == 0 && e == 0, "%s: offload changed the parameters by %g (resumed %g)",
                  mode[k], d, e);
        rc = mgt_sh(&out, "ls -A %s | wc -l", dir);
        CHECK_MSG(rc == 0 && atoi(out) == 0, "%s: files left in the offload directory", mode[k]);
        free(out);
    }
    struct { const char *args, *want; } bad[] = {
        {"--offload nvme", "give disk:DIR"},
        {"--offload disk:", "give disk:DIR"},
        {"--offload disk:/nonexistent/dir", "offload directory /nonexistent/dir"},
        {"--offload disk:/etc/hostname", "Not a directory"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " --parallel ddp --zero 3 --steps 8 "
                        "--resume %s --save %s %s", run, bin, a, a, bad[i].args);
        CHECK_MSG(rc != 0 && strstr(out, bad[i].want), "%s: rc %d: %s", bad[i].args, rc, out);
        free(out);
    }
    double worst;
    CHECK_MSG(ckpt_rel_diff(a, b, &worst) == 0, "a failed run changed the checkpoint");
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
    CHECK_MSG(count_lines(csv) == 4 && strstr(csv, "step,train_loss,val_loss,val_ppl") &&
              strstr(csv, "\n0,nan,") && strstr(csv, "\n5,") && strstr(csv, "\n10,"), "%s", csv);
    free(csv);
    struct stat sb;
    snprintf(path, sizeof path, "%s/half.svg", t);
    CHECK(stat(path, &sb) == 0 && sb.st_size > 500);
    /* Another head count changes no tensor shape: the flags catch it. */
    rc = mgt_sh(&out, "%s " GPT_SMALL " --heads 2 --steps 20 --resume %s/half.st", bin, t);
    CHECK_MSG(rc == 2 && count_lines(out) == 1 && strstr(out, "arch="), "%s", out);
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
        const char *a = strstr(out, "gpt-mini: validation"), *b = strstr(again, "gpt-mini: validation");
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
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char flags[1024], *out;
        const char *p = strstr(bad[i].flags, "TINY");
        if (p) snprintf(flags, sizeof flags, "%.*s%s", (int)(p - bad[i].flags), bad[i].flags, tiny);
        else snprintf(flags, sizeof flags, "%s", bad[i].flags);
        int rc = mgt_sh(&out, "%s %s --save %s", bin, flags, save);
        CHECK_MSG(rc == 2 && count_lines(out) == 1 && strncmp(out, "mgtrain: ", 9) == 0 &&
                  strstr(out, bad[i].says), "'%s' exited %d: %s", flags, rc, out);
        free(out);
    }
    char *s = mgt_slurp(save, NULL);
    CHECK(strcmp(s, "precious") == 0);
    free(s);
}

/* Issue 30 item 3: a checkpoint moves between plans of the same global
 * batch (batch x accumulate; a pipeline's --batch split into its
 * micro-batches): one process's --batch 24 resumes as a pipeline of 2
 * stages with no --batch change (it was refused: "saved with batch=24
 * but this run has batch=12"); another global batch is refused, named. */
TEST_T(mgtrain_pipeline_resumes_a_checkpoint_of_the_same_global_batch, 180)
{
    const char *t = mgt_tmpdir();
    char *out, ck[512];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ck, sizeof ck, "%s/single.st", t);
    const char *gpt = "--model gpt-mini --layers 2 --dim 32 --heads 2 --ctx 32 --eval-windows 4";
    int rc = mgt_sh(&out, "%s %s --batch 24 --steps 2 --eval-every 2 --save %s", bin, gpt, ck);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s -n 2 %s %s --batch 24 --mesh pp=2 --steps 4 --eval-every 2 "
                "--resume %s", run, bin, gpt, ck);
    CHECK_MSG(rc == 0 && strstr(out, "step     4/4"), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s %s --batch 12 --accumulate 2 --steps 4 --eval-every 2 --resume %s",
                bin, gpt, ck);
    CHECK_MSG(rc == 0 && strstr(out, "step     4/4"), "%s", out);
    free(out);
    rc = mgt_sh(&out, "%s -n 2 %s %s --batch 12 --mesh pp=2 --steps 4 --resume %s", run, bin,
                gpt, ck);
    CHECK_MSG(rc != 0 && strstr(out, "saved with a global batch of 24 (--batch x --accumulate) "
                                     "but this run's is 12"), "%s", out);
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
    refused((const refusal[]){
        {"--parallel ddp --slow-rank 1:1", "above 1"},
        {"--parallel ddp --slow-rank one:2", "RANK:FACTOR"},
        {"--parallel ddp --slow-rank 2:3", "ranks 0 to 1"},
        {"--slow-rank 0:2", "--parallel ddp"},
        {"--mesh pp=2 --slow-rank 1:2", "pipeline"},
        {NULL, NULL}});
}

/* ---- the parameter server (issue 34) --------------------------------------- */

/* The train and validation losses of every row of a gpt-mini --log CSV
 * (step, train_loss, val_loss, ...): up to cap rows into tl, vl. */
static int csv_losses(const char *path, double *tl, double *vl, int cap)
{
    char *s = mgt_slurp(path, NULL), *line = s ? strchr(s, '\n') : NULL;
    int n = 0;
    while (line && *++line && n < cap) {
        if (sscanf(line, "%*d,%lf,%lf,", &tl[n], &vl[n]) == 2) n++;
        line = strchr(line, '\n');
    }
    free(s);
    return n;
}

/* The start of a worker's shell command under mgrun: rank `rank` runs
 * `then` (shell; $$ is the worker) in the background once the row of
 * step or epoch `row` is in `log`; the command goes on with "exec ...". */
static const char *once_row(char *buf, size_t cap, int rank, int row, const char *log,
                            const char *then)
{
    snprintf(buf, cap, "if [ $RANK = %d ]; then (while ! grep -q ^%d, %s 2>/dev/null; do sleep "
             "0.02; done; %s) & fi;", rank, row, log, then);
    return buf;
}

/* --parallel ps, synchronous: W workers and K servers train as DDP on W
 * ranks (one process for W = 1) with the same global batch: the losses of
 * 20 steps agree within 1e-4 relative (the servers sum the pushes in
 * worker order, DDP's ring in its own), at 2, 3 and 4 ranks, one server
 * and two. Mistakes are one line. */
TEST_T(mgtrain_ps_synchronous_equals_ddp, 300)
{
    const char *t = mgt_tmpdir();
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const char *job = GPT_SMALL " --steps 20 --eval-every 5 --no-eval-on-start --quiet";
    struct { int workers, servers; } cases[] = {{1, 1}, {2, 1}, {2, 2}, {3, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int W = cases[i].workers, K = cases[i].servers;
        char ref[512], ps[512];
        snprintf(ref, sizeof ref, "%s/ref%d.csv", t, W);
        snprintf(ps, sizeof ps, "%s/ps%d_%d.csv", t, W, K);
        int rc = W == 1 ? mgt_sh(&out, "%s %s --log %s", bin, job, ref)
                        : mgt_sh(&out, "%s -n %d %s %s --parallel ddp --log %s", run, W, bin, job, ref);
        CHECK_MSG(rc == 0, "reference on %d: %s", W, out);
        free(out);
        rc = mgt_sh(&out, "%s -n %d %s %s --parallel ps --servers %d --log %s", run, W + K, bin,
                    job, K, ps);
        CHECK_MSG(rc == 0, "ps %d+%d: %s", W, K, out);
        free(out);
        double a[2][8], b[2][8];
        int na = csv_losses(ref, a[0], a[1], 8), nb = csv_losses(ps, b[0], b[1], 8);
        CHECK_MSG(na == 4 && nb == 4, "%d and %d rows", na, nb);
        for (int r = 0; r < na && r < nb; r++)
            for (int k = 0; k < 2; k++)
                CHECK_MSG(fabs(a[k][r] - b[k][r]) <= 1e-4 * fabs(a[k][r]),
                          "%d workers, %d servers, row %d: %s loss %.6f against %.6f", W, K, r,
                          k ? "validation" : "train", b[k][r], a[k][r]);
    }
    refused((const refusal[]){
        {"--parallel ps --servers 2", "no worker"},
        {"--parallel ps --staleness 65", "--staleness"},
        {"--parallel ps --staleness forever", "inf (fully asynchronous)"},
        {"--parallel ddp --servers 1", "--parallel ps"},
        {"--parallel ps --zero 1", "--zero"},
        {NULL, NULL}});
    /* More servers than the model has units: every rank says so at once. */
    double t0 = mg_now();
    int rc = mgt_sh(&out, "%s -n 5 %s --model mlp --epochs 1 --parallel ps --servers 4", run, bin);
    CHECK_MSG(rc != 0 && strstr(out, "has 3 units") && mg_now() - t0 < 20, "rc %d: %s", rc, out);
    free(out);
}

static void final_val(const char *out, char *buf, size_t cap);

/* 3 workers, worker 1 3x slower, under --staleness `stale` (and
 * --clip-grad 0.5) with one server and two: each server's report
 * (MG_VERBOSE) says it applied all 3 x 20 pushes, in `updates` updates,
 * with a staleness from 1 to `most` and the bound `stale` ("none" for
 * inf); the final validation loss within 10% of DDP's on 3 ranks (or,
 * `below_ok`, anywhere below). */
static void ps_straggler_runs(const char *stale, int updates, int most, bool below_ok)
{
    char *out, ddp[128], got[128];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const char *job = GPT_SMALL " --steps 20 --eval-every 20 --no-eval-on-start --clip-grad 0.5";
    int rc = mgt_sh(&out, "%s -n 3 %s %s --parallel ddp", run, bin, job);
    CHECK_MSG(rc == 0, "%s", out);
    final_val(out, ddp, sizeof ddp);
    free(out);
    double ref = atof(ddp + strlen("final: validation loss "));
    const char *bound = strcmp(stale, "inf") ? stale : "none";
    for (int servers = 1; servers <= 2; servers++) {
        rc = mgt_sh(&out, "MG_VERBOSE=1 %s -n %d %s %s --parallel ps --servers %d --staleness %s "
                    "--slow-rank 1:3", run, 3 + servers, bin, job, servers, stale);
        CHECK_MSG(rc == 0, "%s", out);
        int seen = 0;
        for (const char *l = strstr(out, "ps server "); l; l = strstr(l + 1, "ps server ")) {
            int who, pushes, applied, stalest;
            char said[16];
            if (sscanf(l, "ps server %d: %d pushes in %d updates, staleness at most %d (bound "
                       "%15[^)])", &who, &pushes, &applied, &stalest, said) != 5)
                continue;
            seen++;
            CHECK_MSG(pushes == 3 * 20 && applied == updates && !strcmp(said, bound) &&
                      stalest <= most && stalest >= 1, "--staleness %s, server %d: %d pushes, "
                      "%d updates, staleness %d (bound %s)", stale, who, pushes, applied,
                      stalest, said);
        }
        CHECK_MSG(seen == servers, "%d server lines: %s", seen, out);
        final_val(out, got, sizeof got);
        double loss = atof(got + strlen("final: validation loss "));
        CHECK_MSG(got[0] && loss < 1.1 * ref && (below_ok || loss > 0.9 * ref),
                  "--staleness %s: %s against DDP's %s", stale, got, ddp);
        free(out);
    }
}

/* Bounded staleness (S = 3) with a straggler: every push is applied once
 * (workers x steps pushes in steps updates, none lost when they come at
 * once), the staleness the servers saw is within the bound and above 0,
 * and the training still learns as DDP's does. */
TEST_T(mgtrain_ps_bounded_staleness_counts_every_push, 240)
{
    ps_straggler_runs("3", 20, 3, false);
}

/* Fully asynchronous (--staleness inf): each push is its own update.
 * One worker is then one process, clipping included (its norm travels
 * with the push), with one server and two. With the straggler: every
 * push applied once as its own update, some on parameters other workers
 * had moved on, and the training learns (three times DDP's updates, each
 * of a third of its batch). */
TEST_T(mgtrain_ps_asynchronous_applies_each_push_as_an_update, 240)
{
    char *out, want[128], got[128];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const char *job = GPT_SMALL " --steps 20 --eval-every 20 --no-eval-on-start --clip-grad 0.5";
    int rc = mgt_sh(&out, "%s %s", bin, job);
    CHECK_MSG(rc == 0, "%s", out);
    final_val(out, want, sizeof want);
    free(out);
    for (int servers = 1; servers <= 2; servers++) {
        rc = mgt_sh(&out, "%s -n %d %s %s --parallel ps --servers %d --staleness inf", run,
                    1 + servers, bin, job, servers);
        final_val(out, got, sizeof got);
        CHECK_MSG(rc == 0 && want[0] && !strcmp(got, want) && strstr(out, "fully asynchronous"),
                  "one worker, %d server(s): '%s' against one process's '%s': %s", servers, got,
                  want, out);
        free(out);
    }
    ps_straggler_runs("inf", 3 * 20, 1000, true);
}

/* A checkpoint's metadata number `key` (-1: none). */
static long ckpt_count(const char *path, const char *key)
{
    mg_st_file *f;
    if (mg_st_open(path, &f)) return -1;
    const char *v = mg_st_meta(f, key);
    long n = v ? atol(v) : -1;
    mg_st_close(f);
    return n;
}

/* Checkpoints of a fully asynchronous server hold every update: with one
 * worker, 5 steps saved and resumed to 10 are 10 steps digit for digit;
 * with 3 workers on 2 servers, 6 steps are 18 optimizer steps (12 of them
 * extra), which a resume under DDP goes on counting (2 more steps: 20),
 * and under the server again (2 more steps of 3 pushes: 24). */
TEST_T(mgtrain_ps_asynchronous_checkpoints_hold_every_update, 240)
{
    const char *t = mgt_tmpdir();
    char *out, want[128], got[128], ck[512], ck2[512];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(ck, sizeof ck, "%s/async.st", t);
    snprintf(ck2, sizeof ck2, "%s/again.st", t);
    const char *job = GPT_SMALL " --eval-every 5 --no-eval-on-start --parallel ps "
                      "--staleness inf";
    int rc = mgt_sh(&out, "%s -n 2 %s %s --steps 10", run, bin, job);
    CHECK_MSG(rc == 0, "%s", out);
    final_val(out, want, sizeof want);
    free(out);
    rc = mgt_sh(&out, "%s -n 2 %s %s --steps 5 --save %s", run, bin, job, ck);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    CHECK_EQ(ckpt_count(ck, "optimizer_steps"), 5);
    rc = mgt_sh(&out, "%s -n 2 %s %s --steps 10 --resume %s", run, bin, job, ck);
    final_val(out, got, sizeof got);
    CHECK_MSG(rc == 0 && want[0] && !strcmp(got, want), "'%s' against '%s': %s", got, want, out);
    free(out);

    job = GPT_SMALL " --eval-every 2 --no-eval-on-start";
    rc = mgt_sh(&out, "MG_VERBOSE=1 %s -n 5 %s %s --steps 6 --parallel ps --servers 2 "
                "--staleness inf --save %s", run, bin, job, ck);
    CHECK_MSG(rc == 0, "%s", out);
    /* The servers' runs are balanced by their parameters (the units lie
     * in the arena last first: server 0 used to get them all). */
    double mb[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        char who[32];
        snprintf(who, sizeof who, "rank %d ps-server: ", 3 + k);
        const char *l = strstr(out, who), *sent = l ? strstr(l, "per step MB sent ") : NULL;
        if (sent) mb[k] = atof(sent + strlen("per step MB sent "));
    }
    CHECK_MSG(mb[0] > 0 && mb[1] > 0 && mb[0] < 2 * mb[1] && mb[1] < 2 * mb[0],
              "the servers' traffic per step: %.3f and %.3f MB: %s", mb[0], mb[1], out);
    free(out);
    CHECK_EQ(ckpt_count(ck, "step"), 6);
    CHECK_EQ(ckpt_count(ck, "optimizer_steps"), 18);
    CHECK_EQ(ckpt_count(ck, "optimizer_extra_steps"), 12);
    rc = mgt_sh(&out, "%s -n 2 %s %s --steps 8 --parallel ddp --resume %s --save %s", run, bin,
                job, ck, ck2);
    CHECK_MSG(rc == 0 && strstr(out, "final: validation loss"), "%s", out);
    free(out);
    CHECK_EQ(ckpt_count(ck2, "optimizer_steps"), 20);
    CHECK_EQ(ckpt_count(ck2, "optimizer_extra_steps"), 12);
    rc = mgt_sh(&out, "%s -n 4 %s %s --steps 8 --parallel ps --staleness inf --resume %s "
                "--save %s", run, bin, job, ck, ck2);
    CHECK_MSG(rc == 0 && strstr(out, "final: validation loss"), "%s", out);
    free(out);
    CHECK_EQ(ckpt_count(ck2, "optimizer_steps"), 24);
}

/* The final line's validation loss and perplexity ("validation loss 4.5895,
 * perplexity 98.44"), or "" */
static void final_val(const char *out, char *buf, size_t cap)
{
    const char *f = strstr(out, "final: validation loss ");
    const char *e = f ? strstr(f, ", perplexity ") : NULL;
    e = e ? strchr(e + 13, ',') : NULL;
    snprintf(buf, cap, "%.*s", f && e ? (int)(e - f) : 0, f ? f : "");
}

/* The servers' checkpoints are logical: 5 steps under the parameter server
 * resume under DDP, and 5 under DDP under the parameter server with two
 * servers, each to the loss of 10 steps under DDP, digit for digit. */
TEST_T(mgtrain_ps_checkpoints_move_to_ddp_and_back, 180)
{
    const char *t = mgt_tmpdir();
    char *out, want[128], got[128];
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const char *job = GPT_SMALL " --eval-every 5 --no-eval-on-start";
    const char *legs[][2] = {{"-n 3", "--parallel ps"}, {"-n 2", "--parallel ddp"},
                             {"-n 2", "--parallel ddp"}, {"-n 4", "--parallel ps --servers 2"}};
    int rc = mgt_sh(&out, "%s -n 2 %s %s --steps 10 --parallel ddp", run, bin, job);
    CHECK_MSG(rc == 0, "%s", out);
    final_val(out, want, sizeof want);
    free(out);
    CHECK(want[0]);
    for (int k = 0; k < 4; k += 2) {
        char ck[512];
        snprintf(ck, sizeof ck, "%s/leg%d.st", t, k);
        rc = mgt_sh(&out, "%s %s %s %s --steps 5 %s --save %s", run, legs[k][0], bin, job,
                    legs[k][1], ck);
        CHECK_MSG(rc == 0, "%s", out);
        free(out);
        rc = mgt_sh(&out, "%s %s %s %s --steps 10 %s --resume %s", run, legs[k + 1][0], bin, job,
                    legs[k + 1][1], ck);
        CHECK_MSG(rc == 0, "%s", out);
        final_val(out, got, sizeof got);
        CHECK_MSG(!strcmp(got, want), "%s then %s: '%s' against '%s'", legs[k][1],
                  legs[k + 1][1], got, want);
        free(out);
    }
}

/* An image model under --parallel ps (2 workers, 1 server, one epoch of
 * mlp): the server loads the data set's shape alone and counts its steps'
 * batches from it (MG_VERBOSE says so, and its report holds no data where
 * each worker's holds the images), and the figures are DDP's on the 2
 * workers. With the whole data set (55 MB; the sanitizer builds train on
 * a cut of it) the server's peak RSS is below each worker's (before: above,
 * with the images and a loader of its own). */
TEST_T(mgtrain_ps_server_counts_images_without_loading_them, 120)
{
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    double loss[2] = {0, 0};
    for (int ps = 0; ps < 2; ps++) {
        int rc = mgt_sh(&out, "MG_VERBOSE=1 %s -n %d %s --model mlp --epochs 1 --parallel %s",
                        run, ps ? 3 : 2, bin, ps ? "ps" : "ddp");
        const char *f = strstr(out, "final: test accuracy");
        const char *tl = f ? strstr(f, "test loss ") : NULL;
        CHECK_MSG(rc == 0 && tl && sscanf(tl, "test loss %lf", &loss[ps]) == 1, "%s", out);
        if (ps) {
            CHECK_MSG(strstr(out, "rank 2, a parameter server: the data set's shape alone"),
                      "%s", out);
            double rss[3] = {-1, -1, -1}, data[3] = {-1, -1, -1};
            for (const char *l = strstr(out, "mgtrain: rank "); l;
                 l = strstr(l + 1, "mgtrain: rank ")) {
                int r;
                const char *d = strstr(l, " data "), *p = strstr(l, "peak RSS "),
                           *end = strchr(l, '\n');
                if (sscanf(l, "mgtrain: rank %d", &r) != 1 || r < 0 || r > 2 || !d || !p ||
                    !end || p > end)
                    continue;
                data[r] = atof(d + strlen(" data "));
                rss[r] = atof(p + strlen("peak RSS "));
            }
            printf("MB: data %.1f, %.1f and %.1f; peak RSS %.1f, %.1f and %.1f (workers, "
                   "server)\n", data[0], data[1], data[2], rss[0], rss[1], rss[2]);
            CHECK_MSG(data[0] > 0 && data[1] > 0 && data[2] == 0 && rss[2] > 0, "%s", out);
            if (data[0] > 50)
                CHECK_MSG(rss[2] < rss[0] && rss[2] < rss[1], "%s", out);
        }
        free(out);
    }
    CHECK_MSG(fabs(loss[1] - loss[0]) <= 1e-3 * loss[0], "ps: test loss %.4f, ddp %.4f", loss[1],
              loss[0]);
}

/* A killed worker or server of a parameter server's job is named within
 * seconds and the job stops (mgrun's doing; --elastic, where the others
 * go on without a worker, is to come). */
TEST_T(mgtrain_ps_killed_rank_stops_the_job_naming_it, 120)
{
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    for (int victim = 1; victim <= 2; victim++) {   /* a worker, then the server */
        double t0 = mg_now();
        int rc = mgt_sh(&out, "%s -n 3 sh -c 'if [ $RANK = %d ]; then (sleep 2; kill -9 $$) & "
                        "fi; exec %s --model gpt-mini --batch 16 --steps 2000 --eval-every 10000 "
                        "--no-eval-on-start --parallel ps'", run, victim, bin);
        double dt = mg_now() - t0;
        char want[64];
        snprintf(want, sizeof want, "rank %d (pid ", victim);
        CHECK_MSG(rc != 0 && strstr(out, want) && strstr(out, "SIGKILL") && dt < 30,
                  "victim %d: rc %d after %.1f s: %s", victim, rc, dt, out);
        free(out);
    }
}

/* --elastic, under mgrun --elastic: a worker killed once training runs
 * (a quarter of its first 20 steps' time after their row is in the log:
 * amid the next steps; the next test kills one amid the job's collectives
 * that end an evaluation) leaves the job and the others go on
 * to the end: the servers say whom they lost and how many go on, mgrun
 * that the job went without it, and the log has every row. Worker 1 of a
 * synchronous job (every push before its death and after it applied, in
 * one update per step); worker 0, the one that wrote the log and printed,
 * of a fully asynchronous job with two servers (the first worker that
 * remains takes both over). Each saves a checkpoint every row: the last
 * opens (its checksum holds) with the most updates a server applied. A
 * server killed still stops the job, named; under --max-restarts the job
 * restarts from its checkpoint. */
TEST_T(mgtrain_ps_elastic_goes_on_without_a_killed_worker, 300)
{
    const char *t = mgt_tmpdir();
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    struct { int victim, servers; const char *plan; } cases[] = {
        {1, 1, "--parallel ps"}, {0, 2, "--parallel ps --servers 2 --staleness inf"},
        {3, 1, "--parallel ps"}};
    for (int i = 0; i < 3; i++) {
        int v = cases[i].victim, ranks = 3 + cases[i].servers;
        bool server = v >= 3;
        char log[512];
        snprintf(log, sizeof log, "%s/elastic%d.csv", t, i);
        char then[1024], when[2048];
        snprintf(then, sizeof then, "sleep $(awk -F, \"/^20,/ {print \\$5 / 4}\" %s); kill -9 $$",
                 log);
        double t0 = mg_now();
        int rc = mgt_sh(&out, "MG_VERBOSE=1 %s --elastic -n %d sh -c '%s exec %s --model gpt-mini "
                        "--batch 12 --steps 100 --eval-every 20 --eval-windows 4 "
                        "--no-eval-on-start %s --elastic --log %s --save %s/elastic%d.st'", run,
                        ranks, once_row(when, sizeof when, v, 20, log, then), bin, cases[i].plan,
                        log, t, i);
        char lost[64], lost_by[96];
        snprintf(lost, sizeof lost, "rank %d (pid ", v);
        snprintf(lost_by, sizeof lost_by, "lost rank %d: rank %d (pid ", v, v);
        if (server) {   /* the job stops, the server named as the cause */
            const char *cause = strstr(out, "; then rank ");
            CHECK_MSG(rc == 128 + 9 && cause && strstr(out, lost) < cause &&
                      mg_now() - t0 < 60, "rc %d after %.1f s: %s", rc, mg_now() - t0, out);
            free(out);
            continue;
        }
        CHECK_MSG(rc == 0 && strstr(out, lost_by) && strstr(out, "2 of 3 workers go on") &&
                  strstr(out, "mgrun: the job went on without the 1 worker(s) it lost") &&
                  strstr(out, "final: validation loss"), "victim %d: rc %d: %s", v, rc, out);
        double tl[8], vl[8];
        CHECK_MSG(csv_losses(log, tl, vl, 8) == 5 && vl[4] < vl[0], "victim %d: the log %s", v,
                  log);
        /* Synchronous: each of the 100 updates took the pushes of the
         * workers alive then (3 before the death, 2 after). */
        int pushes = 0, updates = 0;
        const char *l = strstr(out, "ps server 0: ");
        if (l) sscanf(l, "ps server 0: %d pushes in %d updates", &pushes, &updates);
        if (!cases[i].plan[13])
            CHECK_MSG(updates == 100 && pushes > 2 * 100 && pushes < 3 * 100,
                      "%d pushes in %d updates: %s", pushes, updates, out);
        else
            CHECK_MSG(updates == pushes && pushes > 2 * 100 && pushes < 3 * 100,
                      "%d pushes in %d updates: %s", pushes, updates, out);
        /* The checkpoint's optimizer steps: the most a server took (a
         * fully asynchronous one's count its pushes, and the servers'
         * can differ by the pushes of the worker lost amid them). */
        int most = 0, seen = 0;
        for (l = strstr(out, "ps server "); l; l = strstr(l + 1, "ps server ")) {
            int who;
            if (sscanf(l, "ps server %d: %d pushes in %d updates", &who, &pushes, &updates) != 3)
                continue;
            seen++;
            most = updates > most ? updates : most;
        }
        char ck[512];
        snprintf(ck, sizeof ck, "%s/elastic%d.st", t, i);
        long step = ckpt_count(ck, "step");   /* -1: the file did not open (its checks) */
        CHECK_MSG(seen == cases[i].servers && step == 100 &&
                  ckpt_count(ck, "optimizer_steps") == most &&
                  ckpt_count(ck, "optimizer_extra_steps") == most - 100, "%s: step %ld (%s), "
                  "optimizer steps %ld, %ld extra; the servers' most updates %d",
                  cases[i].plan, step, step < 0 ? mg_last_error() : "",
                  ckpt_count(ck, "optimizer_steps"), ckpt_count(ck, "optimizer_extra_steps"),
                  most);
        free(out);
    }
    /* The server killed again, under mgrun --max-restarts 1: the job
     * restarts from its last checkpoint (fully asynchronous: its count of
     * updates saved) and runs to its end. */
    char log[512], ck[512], when[2048];
    snprintf(log, sizeof log, "%s/restart.csv", t);
    snprintf(ck, sizeof ck, "%s/restart.st", t);
    int rc = mgt_sh(&out, "%s --elastic --max-restarts 1 -n 4 sh -c '%s exec %s --model gpt-mini "
                    "--batch 12 --steps 60 --eval-every 20 --eval-windows 4 --no-eval-on-start "
                    "--parallel ps --staleness inf --elastic --log %s --save %s'", run,
                    once_row(when, sizeof when, 3, 20, log,
                             "sleep 0.3; [ \"$MG_RESTART_COUNT\" = 0 ] && kill -9 $$"),
                    bin, log, ck);
    double tl[8], vl[8];
    CHECK_MSG(rc == 0 && strstr(out, "restarting all 4 worker(s)") &&
              strstr(out, "resuming from") && strstr(out, "final: validation loss") &&
              csv_losses(log, tl, vl, 8) == 3 && ckpt_count(ck, "step") == 60 &&
              ckpt_count(ck, "optimizer_steps") > 60, "rc %d: %s", rc, out);
    free(out);
    refused((const refusal[]){
        {"--parallel ddp --elastic", "--parallel ps"},
        {"--parallel ps --elastic", "mgrun --elastic"},
        {NULL, NULL}});
}

/* --elastic: a worker lost amid the job's collectives between steps (the
 * training figures' sum, evaluation, the log, a checkpoint): every rank
 * that remains does them again over the ranks that remain, and the job
 * runs to its end with every row in the log once. The evaluations (256
 * windows after every step) take most of the job's time, and a signal
 * sent half their time (measured from the log) after the step that
 * follows the second row lands amid them most times, in any build; a
 * run where
 * it landed amid steps instead (no line says they were done again) is
 * run again with another delay, up to 3 times.
 *   - Worker 1 killed, with --save: the others do them again without it.
 *   - Worker 0, which writes the log and checkpoints, stopped (SIGSTOP)
 *     past MG_PEER_TIMEOUT, so that the others' collectives fail, and
 *     resumed before the roll call gives it up: done again by all 3. */
TEST_T(mgtrain_ps_elastic_does_the_collectives_a_worker_left_again, 300)
{
    const char *t = mgt_tmpdir();
    char log[512], ck[512], *out = NULL;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(log, sizeof log, "%s/amid.csv", t);
    snprintf(ck, sizeof ck, "%s/amid.mgc", t);
    const double into[] = {0.5, 0.3, 0.7};   /* of the collectives' time */
    for (int stop = 0; stop < 2; stop++) {
        const char *want = stop ? "failed on rank 0 while every worker remains: done again"
                                : "as a worker left amid them: the 2 worker(s) that remain do "
                                  "them again";
        bool hit = false;
        for (int a = 0; a < 3 && !hit; a++) {
            /* Once row 2 is in the log: row 2's step time, then `into` of
             * the collectives' time (rows 1 to 2's elapsed time, less the
             * step's): in any build, amid the third's. */
            char then[1024], when[2048];
            snprintf(then, sizeof then, "sleep $(awk -F, \"/^1,/ {e = \\$8} /^2,/ {s = \\$5; "
                     "c = \\$8 - e - s} END {print s + c * %.2f}\" %s); %s", into[a], log,
                     stop ? "kill -STOP $$; sleep 4.5; kill -CONT $$" : "kill -9 $$");
            remove(log);
            free(out);
            int rc = mgt_sh(&out, "MG_PEER_TIMEOUT=3 MG_VERBOSE=1 %s --elastic -n 4 sh -c '%s "
                            "exec %s --model gpt-mini --batch 12 --steps 8 --eval-every 1 "
                            "--eval-windows 256 --no-eval-on-start --parallel ps --elastic --log "
                            "%s --save %s'", run, once_row(when, sizeof when, stop ? 0 : 1, 2, log,
                            then), bin, log, ck);
            hit = strstr(out, want) != NULL;
            printf("%s, %.0f%% into the collectives: %s\n", stop ? "stopped" : "killed",
                   100 * into[a], hit ? "amid them" : "amid steps");
            if (!hit && !stop)   /* killed amid steps: the others go on too */
                CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
            if (!hit) continue;
            CHECK_MSG(rc == 0 && strstr(out, "final: validation loss"), "rc %d: %s", rc, out);
            double tl[10], vl[10];
            CHECK_MSG(csv_losses(log, tl, vl, 10) == 8 && vl[7] < vl[0], "the log %s: %s", log,
                      out);
            char *csv = mgt_slurp(log, NULL), *line = csv ? strchr(csv, '\n') : NULL;
            for (int step = 1; step <= 8; step++) {   /* each row once, in order */
                CHECK_MSG(line && atoi(line + 1) == step, "row %d: %s", step, csv);
                line = line ? strchr(line + 1, '\n') : NULL;
            }
            free(csv);
            if (!stop)
                CHECK_MSG(strstr(out, "2 of 3 workers go on") &&
                          strstr(out, "mgrun: the job went on without the 1 worker(s) it lost"),
                          "%s", out);
        }
        CHECK_MSG(hit, "3 runs, and the signal landed amid steps each time: %s", out);
    }
    free(out);
    /* The checkpoint of the last run, written after the collectives were
     * done again, resumes. */
    int rc = mgt_sh(&out, "%s -n 4 %s --model gpt-mini --batch 12 --steps 10 --eval-every 2 "
                    "--eval-windows 4 --parallel ps --resume %s", run, bin, ck);
    CHECK_MSG(rc == 0 && strstr(out, "step    10/10"), "rc %d: %s", rc, out);
    free(out);
}

/* --elastic: a worker stopped (SIGSTOP) amid steps (a quarter of 10
 * steps' time after their row) for longer than MG_PEER_TIMEOUT (3 s
 * against 2 s) is taken as lost by the server, and the others go on;
 * resumed, it learns so at its next exchange with the server and exits
 * with MG_EXIT_LEFT, which mgrun counts as a worker lost:
 * the job runs to its end with exit status 0, over shared memory and TCP
 * (before: over TCP the worker read the server's closed link as its death
 * and mgrun stopped the job; over shared memory it waited for the
 * server's answer to the end and the job exited 2). */
TEST_T(mgtrain_ps_elastic_worker_taken_as_lost_leaves_when_it_comes_back, 300)
{
    char log[512], *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(log, sizeof log, "%s/back.csv", mgt_tmpdir());
    const char *transports[2] = {"shm", "tcp"};
    char when[2048];
    once_row(when, sizeof when, 1, 10, log, "sleep 0.25; kill -STOP $$; sleep 3; kill -CONT $$");
    for (int t = 0; t < 2; t++) {
        remove(log);
        int rc = mgt_sh(&out, "MG_TRANSPORT=%s MG_PEER_TIMEOUT=2 %s --elastic -n 4 sh -c '%s exec "
                        "%s --model gpt-mini --batch 12 --steps 80 --eval-every 10 "
                        "--eval-windows 4 --no-eval-on-start --parallel ps --elastic --log %s'",
                        transports[t], run, when, bin, log);
        const char *left = strstr(out, "rank 1: "), *lost = strstr(out, "mgrun: rank 1 (pid ");
        CHECK_MSG(rc == 0 && strstr(out, "lost rank 1: rank 1 (pid ") && left &&
                  strstr(left, "rank 3 took this rank as lost") && lost &&
                  strstr(lost, "left the job (exit status 3") &&
                  strstr(out, "final: validation loss"), "%s: rc %d: %s", transports[t], rc, out);
        double tl[10], vl[10];
        CHECK_MSG(csv_losses(log, tl, vl, 10) == 8, "%s: the log %s", transports[t], log);
        free(out);
    }
}

/* A worker stopped (SIGSTOP) for 2 s (or 6 steps' time, if longer) under
 * staleness 3, once training runs (its first evaluation in the log): the
 * others go on up to the bound (the server saw staleness 3, never more),
 * the job does not fail, and once the worker goes on every push is
 * applied. */
TEST_T(mgtrain_ps_stopped_worker_holds_the_others_only_at_the_bound, 300)
{
    char log[512], *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    snprintf(log, sizeof log, "%s/stopped.csv", mgt_tmpdir());
    int steps = 60;
    /* Stopped for 2 s, or 6 steps' time where steps are slower (the
     * sanitizer builds): long enough for the others to reach the bound,
     * and at most 10 s, within MG_PEER_TIMEOUT. */
    char then[1024], when[2048];
    snprintf(then, sizeof then, "kill -STOP $$; sleep $(awk -F, \"/^10,/ {t = \\$5 * 0.6; print "
             "(t < 2 ? 2 : t > 10 ? 10 : t)}\" %s); kill -CONT $$", log);
    int rc = mgt_sh(&out, "MG_VERBOSE=1 %s -n 3 sh -c '%s exec %s --model gpt-mini --batch 16 "
                    "--steps %d --eval-every 10 --no-eval-on-start --eval-windows 2 --parallel "
                    "ps --staleness 3 --log %s'", run, once_row(when, sizeof when, 1, 10, log,
                    then), bin, steps, log);
    const char *l = strstr(out, "ps server 0: ");
    int pushes = 0, updates = 0, stalest = -1;
    if (l) sscanf(l, "ps server 0: %d pushes in %d updates, staleness at most %d", &pushes,
                  &updates, &stalest);
    CHECK_MSG(rc == 0 && pushes == 2 * steps && updates == steps && stalest == 3, "rc %d: %s",
              rc, out);
    free(out);
}
