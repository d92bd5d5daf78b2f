/* mgtrain on a device (emu always, a GPU when there is one, through the
 * host's collectives and through NCCL) against one process on the CPU,
 * and what a device refuses. */
#include "harness.h"
#include "devices.h"
#include "mgtrain_runs.h"

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
        double worst, d = mgt_ckpt_rel_diff(other, ref, &worst);
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
        double worst, d = mgt_ckpt_rel_diff(other, strstr(more[i].args, "pp=") ? acc : ref, &worst);
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
    double worst, d = mgt_ckpt_rel_diff(other, ref, &worst);
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
        double worst, d = mgt_ckpt_rel_diff(other, ref20, &worst);
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
        double worst, d = mgt_ckpt_rel_diff(other, strstr(runs[i].args, "pp=") ? acc : ref, &worst);
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
