/* mgtrain's plans end to end, each against one process with the same
 * global batch: DDP and DataParallel, meshes and pipelines (their cuts
 * printed), ZeRO 1-3 and the optimizer's state in files, --recompute, and
 * checkpoints that move between them. */
#include <errno.h>
#include <sys/stat.h>
#include "harness.h"
#include "mgtrain_runs.h"

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
            double worst, d = mgt_ckpt_rel_diff(other, ref, &worst);
            printf("gpt-mini %s %d: |p - ref| / |ref| = %.3g (max entry %.3g)\n",
                   ddp ? "ddp ranks" : "dp workers", k, d, worst);
            CHECK_MSG(d <= 1e-4, "%s %d: parameters differ from one process by %g",
                      ddp ? "ddp ranks" : "dp workers", k, d);
        }
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
    double worst, d = mgt_ckpt_rel_diff(b, a, &worst);
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
    double worst, d = mgt_ckpt_rel_diff(ck, ref, &worst);
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
    double worst, dw = mgt_ckpt_rel_diff(whole, ref, &worst);
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
    /* A checkpoint of another shape is refused naming the flag that
     * differs (before the tensors of another shape are read), the file
     * left as it was. */
    rc = mgt_sh(&out, "%s -n 2 %s " GPT_SMALL " --dim 32 --parallel ddp --zero 3 --steps 12 "
                "--resume %s --save %s", run, bin, ck, ck);
    CHECK_MSG(rc != 0 && strstr(out, "saved with arch=L2,d64,h4,T64 but this run has "
                                "arch=L2,d32,h4,T64"), "%s", out);
    free(out);
    CHECK(mgt_ckpt_rel_diff(ck, ref, &worst) == d);
}

/* --zero: one clear line and status 2 for a stage that does not exist,
 * for ZeRO without a job of ranks, with compression. */
TEST_T(mgtrain_zero_bad_input, 60)
{
    mgt_refused((const mgt_refusal[]){
        {"--parallel ddp --zero 4", "--zero"},
        {"--zero 2", "--parallel ddp or --mesh dp=N"},
        {"--parallel dp --zero 1", "--parallel ddp or --mesh dp=N"},
        {"--parallel ddp --zero 1 --compress fp16", "without --zero"},
        {NULL, NULL}});
}

/* --offload disk:DIR: the optimizer state (and under ZeRO-3 the
 * parameter shard, under ZeRO 2-3 the gradients) in files changes no bit
 * of the training, gradient clipping included: 6 steps
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
    /* dp x tp under ZeRO-2 too: its offloaded pieces' norm counted the
     * tensors every tp rank holds on each of them (found by a probe; gpt-
     * mini clips) */
    const char *mode[4] = {"--parallel ddp --zero 3", "--parallel ddp --zero 1", "",
                           "--mesh dp=2,tp=2 --zero 2"};
    for (int k = 0; k < 4; k++) {
        char launch[600] = "";
        if (*mode[k]) snprintf(launch, sizeof launch, "%s -n %d ", run, k == 3 ? 4 : 2);
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
        double worst, d = mgt_ckpt_rel_diff(b, a, &worst), e = mgt_ckpt_rel_diff(c, a, &worst);
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
    CHECK_MSG(mgt_ckpt_rel_diff(a, b, &worst) == 0, "a failed run changed the checkpoint");
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

/* An epoch whose last step is short (1,000 images in steps of 128: the
 * last 104) trains as one process's --batch 128 under every way of
 * cutting a step: accumulation (64 + 40), DataParallel threads, a
 * pipeline's micro-batches (2: 64 + 40; 4: 32 + 32 + 32 + 8), DDP over 2
 * ranks with accumulation (each rank 32 + 20) and ZeRO-2: each
 * micro-batch's mean weighs by its rows (mg_micro_batch's weight), so the
 * step's gradient is the mean over its rows. The epoch's figures agree to
 * rounding (seen: 1e-6); the mean of the micro-batches' means was 3% off
 * the test loss. */
TEST_T(mgtrain_a_short_last_step_is_one_batch_under_every_cut, 180)
{
    const char *t = mgt_tmpdir(), *bin = mgt_tool("mgtrain"), *run = mgt_tool("mgrun");
    const char *data = mgt_fashion_cut(1000, 512);
    const struct { int ranks; const char *flags; } how[] = {
        {1, "--batch 128"}, {1, "--batch 64 --accumulate 2"},
        {1, "--batch 64 --accumulate 2 --parallel dp --workers 2"},
        {2, "--batch 128 --mesh pp=2"}, {2, "--batch 128 --mesh pp=2 --micro-batches 4"},
        {2, "--batch 64 --accumulate 2 --parallel ddp"}, {2, "--batch 128 --parallel ddp --zero 2"},
    };
    double ref[2] = {0, 0};
    for (size_t k = 0; k < sizeof how / sizeof how[0]; k++) {
        char *out, launch[600] = "", log[600];
        if (how[k].ranks > 1) snprintf(launch, sizeof launch, "%s -n %d ", run, how[k].ranks);
        snprintf(log, sizeof log, "%s/short%zu.csv", t, k);
        int rc = mgt_sh(&out, "%s%s --model mlp --data %s --epochs 1 %s --quiet --log %s", launch,
                        bin, data, how[k].flags, log);
        CHECK_MSG(rc == 0, "%s: %s", how[k].flags, out);
        free(out);
        char *csv = mgt_slurp(log, NULL), *row = strchr(csv, '\n');
        double train = 0, test = 0;
        CHECK_MSG(row && sscanf(row + 1, "%*d,%*d,%lf,%*f,%lf,", &train, &test) == 2, "%s", csv);
        free(csv);
        printf("%-52s train loss %.6f, test loss %.6f\n", how[k].flags, train, test);
        if (!k) ref[0] = train, ref[1] = test;
        CHECK_MSG(fabs(train - ref[0]) <= 1e-5 * ref[0] && fabs(test - ref[1]) <= 1e-5 * ref[1],
                  "%s: train loss %.6f, test loss %.6f; one process %.6f, %.6f", how[k].flags,
                  train, test, ref[0], ref[1]);
    }
}
