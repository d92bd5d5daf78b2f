/* CPU detection and the choice of GEMM kernels: decoding over recorded
 * CPUID register sets of other CPUs, the core chosen for each, and in
 * child processes the misdetected case (MG_BLAS_MISDETECT) fixed, explicit
 * choices (OPENBLAS_CORETYPE, MG_BLAS_CORE) respected and named, and the
 * re-selection holding against an OpenBLAS worker thread that starts late,
 * and a refused core named with who asked for it
 * (tests/data/openblas_preload.c makes both faults certain). */
#include "harness.h"
#include "multigrad/multigrad.h"

/* Register values as each CPU reports them. Zen 4 is this project's
 * development VM (AMD EPYC, family 0x19 model 0x11); the others follow the
 * vendors' documented feature sets of those models. */
static const mg_cpuid_regs zen4 = {
    .vendor = "AuthenticAMD", .brand = "AMD EPYC 9654 96-Core Processor  ", .max_leaf = 0x1c,
    .l1_eax = 0x00a10f11, .l1_ecx = 0xfffa3203, .l1_edx = 0x178bfbff,
    .l7_ebx = 0xf1bf07ab, .l7_ecx = 0x00405fc6, .l7_edx = 0x00000010, .l71_eax = 0x20,
    .xcr0 = 0xe7};
static const mg_cpuid_regs zen5 = {      /* a 2026 development VM: EPYC, family 0x1a model 2 */
    .vendor = "AuthenticAMD", .brand = "AMD EPYC", .max_leaf = 0x1c,
    .l1_eax = 0x00b00f21, .l1_ecx = 0xfffa3203, .l1_edx = 0x178bfbff,
    .l7_ebx = 0xf1bf07ab, .l7_ecx = 0x00405fc6, .l7_edx = 0x00000110, .l71_eax = 0x30,
    .xcr0 = 0xe7};
static const mg_cpuid_regs sapphire_rapids = {
    .vendor = "GenuineIntel", .brand = "Intel(R) Xeon(R) Platinum 8480+", .max_leaf = 0x20,
    .l1_eax = 0x000806f8, .l1_ecx = 0x7ffefbff, .l1_edx = 0xbfebfbff,
    .l7_ebx = 0xf3bfbffb, .l7_ecx = 0x1bc1ffee, .l7_edx = 0xffd54410, .l71_eax = 0x30,
    .xcr0 = 0x602e7};
static const mg_cpuid_regs emerald_rapids = {
    .vendor = "GenuineIntel", .brand = "INTEL(R) XEON(R) PLATINUM 8592+", .max_leaf = 0x20,
    .l1_eax = 0x000c06f2, .l1_ecx = 0x7ffefbff, .l1_edx = 0xbfebfbff,
    .l7_ebx = 0xf3bfbffb, .l7_ecx = 0x1bc1ffee, .l7_edx = 0xffd54410, .l71_eax = 0x30,
    .xcr0 = 0x602e7};
static const mg_cpuid_regs haswell = {   /* AVX2 + FMA, no AVX-512 */
    .vendor = "GenuineIntel", .brand = "Intel(R) Core(TM) i7-4770 CPU @ 3.40GHz",
    .max_leaf = 0xd, .l1_eax = 0x000306c3, .l1_ecx = 0x7ffafbff, .l1_edx = 0xbfebfbff,
    .l7_ebx = 0x000027ab, .xcr0 = 0x7};
static const mg_cpuid_regs zen2 = {      /* AVX2 + FMA, AMD */
    .vendor = "AuthenticAMD", .brand = "AMD EPYC 7742 64-Core Processor", .max_leaf = 0x10,
    .l1_eax = 0x00830f10, .l1_ecx = 0x7ed8320b, .l1_edx = 0x178bfbff,
    .l7_ebx = 0x219c91a9, .xcr0 = 0x7};
static const mg_cpuid_regs sandy_bridge = {   /* AVX without AVX2/FMA */
    .vendor = "GenuineIntel", .brand = "Intel(R) Core(TM) i7-2600 CPU @ 3.40GHz",
    .max_leaf = 0xd, .l1_eax = 0x000206a7, .l1_ecx = 0x1fbae3ff, .l1_edx = 0xbfebfbff,
    .xcr0 = 0x7};
static const mg_cpuid_regs nehalem = {   /* neither: SSE4.2, no AVX, no XSAVE */
    .vendor = "GenuineIntel", .brand = "Intel(R) Xeon(R) CPU X5570 @ 2.93GHz",
    .max_leaf = 0xb, .l1_eax = 0x000106a5, .l1_ecx = 0x0098e3bd, .l1_edx = 0xbfebfbff};

static mg_cpu_info decode(const mg_cpuid_regs *r)
{
    mg_cpu_info c;
    mg_cpu_decode(r, &c);
    return c;
}

static const char *core_for(const mg_cpuid_regs *r)
{
    mg_cpu_info c = decode(r);
    const char *core = mg_blas_core_for(&c, NULL);
    return core ? core : "(OpenBLAS's)";
}

TEST(cpu_decode_recorded_cpuid_sets)
{
    mg_cpu_info c = decode(&zen4);
    CHECK(!strcmp(c.vendor, "AuthenticAMD"));
    CHECK(!strcmp(c.model, "AMD EPYC 9654 96-Core Processor"));   /* padding trimmed */
    CHECK_EQ(c.family, 0x19);
    CHECK_EQ(c.model_id, 0x11);
    CHECK_EQ(c.simd, MG_SIMD_AVX512);
    CHECK(c.avx512_bf16);

    c = decode(&zen5);
    CHECK_EQ(c.family, 0x1a);
    CHECK_EQ(c.model_id, 2);
    CHECK_EQ(c.simd, MG_SIMD_AVX512);

    c = decode(&sapphire_rapids);
    CHECK_EQ(c.family, 6);
    CHECK_EQ(c.model_id, 0x8f);
    CHECK_EQ(c.stepping, 8);
    CHECK_EQ(c.simd, MG_SIMD_AMX);
    c = decode(&emerald_rapids);
    CHECK_EQ(c.model_id, 0xcf);
    CHECK_EQ(c.simd, MG_SIMD_AMX);

    c = decode(&haswell);
    CHECK_EQ(c.model_id, 0x3c);
    CHECK_EQ(c.simd, MG_SIMD_AVX2);
    CHECK(!c.avx512_bf16);
    c = decode(&zen2);
    CHECK_EQ(c.family, 0x17);
    CHECK_EQ(c.model_id, 0x31);
    CHECK_EQ(c.simd, MG_SIMD_AVX2);
    CHECK_EQ(decode(&sandy_bridge).simd, MG_SIMD_AVX);
    CHECK_EQ(decode(&nehalem).simd, MG_SIMD_SSE);

    /* A level counts only when the OS saves its registers. */
    mg_cpuid_regs r = zen4;
    r.xcr0 = 0x7;                      /* no opmask/ZMM state */
    CHECK_EQ(decode(&r).simd, MG_SIMD_AVX2);
    r.xcr0 = 0x3;                      /* no YMM state either */
    CHECK_EQ(decode(&r).simd, MG_SIMD_SSE);
    r = sapphire_rapids;
    r.xcr0 = 0x2e7;                    /* no AMX tile state */
    CHECK_EQ(decode(&r).simd, MG_SIMD_AVX512);
    r = sapphire_rapids;
    r.l7_ebx &= ~(1u << 30);           /* AVX-512F without BW (Knights Landing style) */
    CHECK_EQ(decode(&r).simd, MG_SIMD_AVX2);
    r = haswell;
    r.max_leaf = 6;                    /* leaf 7 not there: its bits do not count */
    CHECK_EQ(decode(&r).simd, MG_SIMD_AVX);
    mg_cpuid_regs none = {0};
    CHECK_EQ(decode(&none).simd, MG_SIMD_NONE);
    CHECK(!strcmp(decode(&none).model, "unknown CPU"));
}

TEST(blas_core_chosen_per_cpu)
{
    /* Intel with AVX-512: SkylakeX (2x Haswell's SGEMM there); Zen 4's
     * AVX-512 runs in halves: Haswell's kernels measured fastest; Zen 5's
     * is full width: SkylakeX again (2x). */
    CHECK(!strcmp(core_for(&sapphire_rapids), "SkylakeX"));
    CHECK(!strcmp(core_for(&emerald_rapids), "SkylakeX"));
    CHECK(!strcmp(core_for(&zen4), "Haswell"));
    CHECK(!strcmp(core_for(&zen5), "SkylakeX"));
    CHECK(!strcmp(core_for(&haswell), "Haswell"));
    CHECK(!strcmp(core_for(&zen2), "Zen"));
    CHECK(!strcmp(core_for(&sandy_bridge), "Sandybridge"));
    CHECK(!strcmp(core_for(&nehalem), "(OpenBLAS's)"));
    const char *why = NULL;
    mg_cpu_info c = decode(&sapphire_rapids);
    mg_blas_core_for(&c, &why);
    CHECK(why && *why);
}

/* The core this machine should end up with ("Prescott" where the table
 * keeps OpenBLAS's choice, since the runs below start from Prescott). */
static const char *expected_here(void)
{
    const char *core = mg_blas_core_for(mg_cpu(), NULL);
    return core ? core : "Prescott";
}

/* mgrun --version under an environment; returns its output. Not inlined:
 * GCC 12's -Wdangling-pointer then mistakes a pointer into the output for
 * one to its local variable. */
static __attribute__((noinline)) char *version_with(const char *env)
{
    char *out = NULL;
    int rc = mgt_sh(&out, "env -u OPENBLAS_CORETYPE -u MG_BLAS_CORE -u MG_BLAS_MISDETECT "
                          "%s %s --version", env, mgt_tool("mgrun"));
    CHECK_MSG(rc == 0, "mgrun --version with %s exited %d: %s", env, rc, out);
    return out;
}

static bool has(const char *out, const char *what)
{
    return strstr(out, what) != NULL;
}

TEST(blas_misdetected_core_is_reported_and_fixed)
{
    /* A child whose OpenBLAS "detected" the generic SSE3 core, as Debian
     * 12's does on Sapphire Rapids. */
    char *out = version_with("MG_BLAS_MISDETECT=Prescott");
    char want[96];
    snprintf(want, sizeof want, "%s kernels", expected_here());
    CHECK_MSG(has(out, want), "expected '%s' in:\n%s", want, out);
    if (strcmp(expected_here(), "Prescott")) {
        CHECK_MSG(has(out, "re-selected from Prescott") && has(out, "OpenBLAS chose Prescott (SSE)"),
                  "the re-selection is not reported:\n%s", out);
        CHECK_MSG(!has(out, "warning"), "a fixed core still warns:\n%s", out);
    }
    CHECK(has(out, "cpu: ") && has(out, mg_simd_name(mg_cpu()->simd)));
    free(out);

    /* The same in this process: the kernels really switch, and GEMM
     * computes right on them. */
    setenv("MG_BLAS_MISDETECT", "Prescott", 1);
    const mg_kernels_info *k = mg_kernels();
    CHECK(!strcmp(k->detected, "Prescott"));
    CHECK(!strcmp(k->core, expected_here()));
    CHECK_EQ(k->switched, strcmp(expected_here(), "Prescott") != 0);
    CHECK(!k->below);
    float a[3 * 4], b[4 * 5], c[3 * 5];
    for (int i = 0; i < 12; i++) a[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < 20; i++) b[i] = (float)(i % 3) + 0.5f;
    mg_gemm(false, false, 3, 5, 4, 1.0f, a, 4, b, 5, 0.0f, c, 5);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) {
            float s = 0;
            for (int p = 0; p < 4; p++) s += a[i * 4 + p] * b[p * 5 + j];
            CHECK_NEAR(c[i * 5 + j], s, 1e-5);
        }
}

TEST(blas_explicit_core_is_respected)
{
    bool slow = mg_cpu()->simd >= MG_SIMD_AVX;   /* Prescott is below this CPU */
    char *out = version_with("OPENBLAS_CORETYPE=Prescott");
    CHECK_MSG(has(out, "Prescott kernels") &&
              has(out, "set by OPENBLAS_CORETYPE=Prescott in the environment"), "%s", out);
    CHECK_MSG(!has(out, "re-selected"), "%s", out);
    /* Respected, but not silently: the slow kernels are named where the
     * kernels are reported, not warned about on every run. */
    if (slow) CHECK_MSG(has(out, "below this CPU's"), "%s", out);
    CHECK_MSG(!has(out, "warning"), "%s", out);
    free(out);

    out = version_with("MG_BLAS_CORE=Prescott");
    CHECK_MSG(has(out, "Prescott kernels") &&
              has(out, "set by MG_BLAS_CORE=Prescott in the environment"), "%s", out);
    if (slow) CHECK_MSG(has(out, "unset MG_BLAS_CORE to let multigrad choose"), "%s", out);
    free(out);

    /* A core asked for and not had is a warning naming who asked, and
     * OpenBLAS's own core stays: 0.3.21 has no SapphireRapids core. */
    if (!strcmp(mg_kernels()->blas, "OpenBLAS 0.3.21")) {
        out = version_with("MG_BLAS_CORE=SapphireRapids");
        CHECK_MSG(has(out, "warning: GEMM runs on OpenBLAS's") &&
                  has(out, "cannot re-select SapphireRapids (MG_BLAS_CORE=SapphireRapids in the "
                           "environment): OpenBLAS refused it"), "%s", out);
        /* OpenBLAS's own choice in a child started as this one is (this
         * process may have been given OPENBLAS_CORETYPE): what it keeps. */
        char *kept = version_with("MG_BLAS_CORE=keep"), want[64] = "";
        const char *at = strstr(kept, "gemm: ");
        at = at ? strstr(at, ", ") : NULL;
        if (at) sscanf(at + 2, "%40s", want);
        strcat(want, " kernels");
        CHECK_MSG(strlen(want) > 8 && has(out, want), "expected OpenBLAS's own '%s' in:\n%s",
                  want, out);
        free(kept);
        free(out);
    }

    /* keep: whatever OpenBLAS chose, even the misdetected core. */
    out = version_with("MG_BLAS_MISDETECT=Prescott MG_BLAS_CORE=keep");
    CHECK_MSG(has(out, "Prescott kernels") && has(out, "MG_BLAS_CORE=keep"), "%s", out);
    free(out);

    /* A name OpenBLAS does not know: one warning, then the automatic choice. */
    out = version_with("MG_BLAS_CORE=NoSuchCore");
    CHECK_MSG(has(out, "MG_BLAS_CORE=NoSuchCore is not an OpenBLAS x86-64 core"), "%s", out);
    char want[96];
    const char *core = mg_blas_core_for(mg_cpu(), NULL);
    snprintf(want, sizeof want, "%s kernels", core ? core : "");
    CHECK_MSG(has(out, want), "expected '%s' in:\n%s", want, out);
    free(out);
}

/* The preload library (tests/data/openblas_preload.c) built in this
 * test's directory, and the environment that loads it into a child: the
 * worker threads on (OPENBLAS_NUM_THREADS unset), past ASan's check that
 * its runtime comes first. */
static const char *preload_env(char *env, size_t cap)
{
    char so[512], *cc_out = NULL;
    snprintf(so, sizeof so, "%s/openblas_preload.so", mgt_tmpdir());
    if (mgt_sh(&cc_out, "${CC:-cc} -shared -fPIC -O1 -o %s %s -ldl -pthread", so,
               mgt_data("openblas_preload.c")) != 0)
        mgt_skip("cannot build the preload library: %s", cc_out);
    free(cc_out);
    snprintf(env, cap, "-u OPENBLAS_NUM_THREADS LD_PRELOAD=%s "
             "ASAN_OPTIONS=\"$ASAN_OPTIONS:verify_asan_link_order=0\"", so);
    return env;
}

/* The preload library's line: workers that took their first buffer inside
 * the switch, workers OpenBLAS started, and core selections they ran. */
static bool shim_counts(const char *out, int *taken, int *workers, int *selected)
{
    const char *line = strstr(out, "late-worker shim: ");
    return line && sscanf(line, "late-worker shim: %d of %d OpenBLAS worker(s) took their first "
                                "buffer with the core switched off; %d selected",
                          taken, workers, selected) == 3;
}

/* The pthread OpenBLAS starts worker threads when it loads; the first
 * buffer one of them takes finishes OpenBLAS's memory set-up, which runs
 * OpenBLAS's own core selection when no core is set. A worker that
 * started late, while the core was switched off to be re-selected, chose
 * OpenBLAS's core and the re-selection kept it: one start in about 200
 * (issue 30). Here every worker takes its first buffer inside the switch. */
TEST(blas_reselection_holds_against_a_late_openblas_worker)
{
    /* A core OpenBLAS did not choose itself: it is re-selected. */
    const char *target = strcmp(mg_kernels()->detected, "Prescott") ? "Prescott" : "Sandybridge";
    char env[1024], pre[768];
    snprintf(env, sizeof env, "%s MG_BLAS_CORE=%s", preload_env(pre, sizeof pre), target);
    char *out = version_with(env);
    int taken = -1, workers = -1, selected = -1;
    CHECK_MSG(shim_counts(out, &taken, &workers, &selected), "%s", out);
    if (workers == 0) {
        free(out);
        mgt_skip("OpenBLAS started no worker threads here (one CPU)");
    }
    CHECK_MSG(taken == workers, "the workers did not start inside the switch:\n%s", out);
    CHECK_MSG(selected == 0, "an OpenBLAS worker selected a core during the re-selection:\n%s", out);
    char want[96];
    snprintf(want, sizeof want, "%s kernels (", target);
    CHECK_MSG(has(out, want) && has(out, "re-selected from") && !has(out, "warning"), "%s", out);
    free(out);
}

/* The case: multigrad's own choice refused, neither variable set.
 * The warning says so, and what would get the core, not "unset
 * OPENBLAS_CORETYPE / MG_BLAS_CORE". */
TEST(blas_refused_core_is_a_warning_naming_who_asked)
{
    const char *target = mg_blas_core_for(mg_cpu(), NULL);
    if (!target) mgt_skip("multigrad keeps OpenBLAS's choice on this CPU: nothing to refuse");
    char env[1024], pre[768];
    snprintf(env, sizeof env, "%s MGT_OPENBLAS_REFUSE=%s MG_BLAS_MISDETECT=Prescott",
             preload_env(pre, sizeof pre), target);
    char *out = version_with(env);
    char want[400];
    snprintf(want, sizeof want, "warning: GEMM runs on OpenBLAS's Prescott kernels (SSE) on a CPU "
             "with %s (%s): cannot re-select %s (multigrad's choice for this CPU, no core set by "
             "OPENBLAS_CORETYPE or MG_BLAS_CORE): OpenBLAS refused it; OPENBLAS_CORETYPE=%s set "
             "before the program starts makes OpenBLAS load it", mg_simd_name(mg_cpu()->simd),
             mg_cpu()->model, target, target);
    CHECK_MSG(has(out, want), "expected '%s' in:\n%s", want, out);
    CHECK_MSG(has(out, "gemm: ") && has(out, "Prescott kernels (SSE): cannot re-select"), "%s", out);
    CHECK_MSG(!has(out, "unset"), "%s", out);
    free(out);
}
