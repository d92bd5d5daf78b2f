/* Which OpenBLAS core (set of GEMM kernels) this process runs, and
 * re-selecting it when OpenBLAS chose wrong.
 *
 * OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels from the
 * CPU's model number when it loads. A model it does not know gets generic
 * kernels: Debian 12's 0.3.21 runs Sapphire/Emerald Rapids Xeons on its
 * SSE3 "Prescott" kernels at a fifth of their speed. So the library reads
 * the CPU's SIMD level itself (core/cpu.c), compares it with the core
 * OpenBLAS chose, and re-selects the core through OpenBLAS's own dynamic
 * initialisation (gotoblas_dynamic_quit/init, which read
 * OPENBLAS_CORETYPE) when the core is not the one measured best for this
 * kind of CPU (the table in mg_blas_core_for). An explicit choice is
 * respected: OPENBLAS_CORETYPE set when the process started, or
 * MG_BLAS_CORE (a core name, or "keep" for whatever OpenBLAS chose).
 * MG_BLAS_MISDETECT=CORE makes the check start from CORE as if OpenBLAS
 * had detected it: the misdetected case on any machine, for tests and
 * for measuring what the fix is worth. Every message names who asked for
 * the core: the environment's OPENBLAS_CORETYPE or MG_BLAS_CORE (mgrun
 * passes them on and sets neither), or multigrad's own choice.
 *
 * OpenBLAS's worker threads: the pthread OpenBLAS starts them when it
 * loads, and the first buffer any thread takes (blas_memory_alloc; each
 * worker takes one as it starts) finishes OpenBLAS's memory set-up, which
 * runs OpenBLAS's own core selection if no core is set at that moment. A
 * worker starting late, inside the re-selection, selected the core
 * OpenBLAS would and the re-selection kept it (issue 30: about one start
 * in 200 on an Emerald Rapids Xeon). So select_core takes a buffer first:
 * that set-up is done before the core is switched off, and no OpenBLAS
 * thread selects a core after it (tests/data/openblas_preload.c makes the
 * late worker certain; bench/blas_starts.sh counts 10,000 starts).
 *
 * Limits: re-selection needs a DYNAMIC_ARCH OpenBLAS (the symbols are
 * weak: another build links and runs, reported as not re-selectable);
 * it runs once, before this library's first GEMM, and changes the BLAS
 * for the whole process. It sets OPENBLAS_CORETYPE for a moment, so a
 * program with threads of its own calls mg_kernels() before starting them
 * (mgtrain does; setenv is not safe against a concurrent getenv). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "multigrad/tensor.h"
#include "tensor/blas.h"

/* OpenBLAS's; weak so that a build without them still links. */
extern char *openblas_get_corename(void) __attribute__((weak));
extern char *openblas_get_config(void) __attribute__((weak));
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));
extern void *blas_memory_alloc(int procpos) __attribute__((weak));
extern void blas_memory_free(void *buffer) __attribute__((weak));

/* OpenBLAS's x86-64 core names and the SIMD level of their SGEMM kernels. */
static const struct { const char *name; mg_simd simd; } cores[] = {
    {"Prescott", MG_SIMD_SSE},      {"Core2", MG_SIMD_SSE},     {"Penryn", MG_SIMD_SSE},
    {"Dunnington", MG_SIMD_SSE},    {"Nehalem", MG_SIMD_SSE},   {"Atom", MG_SIMD_SSE},
    {"Opteron", MG_SIMD_SSE},       {"Opteron_SSE3", MG_SIMD_SSE}, {"Barcelona", MG_SIMD_SSE},
    {"Nano", MG_SIMD_SSE},          {"Bobcat", MG_SIMD_SSE},    {"Sandybridge", MG_SIMD_AVX},
    {"Bulldozer", MG_SIMD_AVX},     {"Piledriver", MG_SIMD_AVX}, {"Steamroller", MG_SIMD_AVX},
    {"Excavator", MG_SIMD_AVX2},    {"Haswell", MG_SIMD_AVX2},  {"Zen", MG_SIMD_AVX2},
    {"SkylakeX", MG_SIMD_AVX512},   {"Cooperlake", MG_SIMD_AVX512},
    {"SapphireRapids", MG_SIMD_AVX512},
};

static int core_index(const char *name)
{
    for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++)
        if (name && !strcasecmp(name, cores[i].name)) return (int)i;
    return -1;
}

static mg_simd core_simd(const char *name)
{
    int i = core_index(name);
    return i < 0 ? MG_SIMD_NONE : cores[i].simd;
}

/* The core whose SGEMM measured fastest on this kind of CPU, and why
 * (docs/PERFORMANCE.md has the figures). NULL: keep OpenBLAS's choice. */
const char *mg_blas_core_for(const mg_cpu_info *c, const char **why)
{
    const char *unused;
    if (!why) why = &unused;
    bool amd = !strcmp(c->vendor, "AuthenticAMD") || !strcmp(c->vendor, "HygonGenuine");
    switch (c->simd) {
    case MG_SIMD_AMX:
    case MG_SIMD_AVX512:
        if (amd && c->family < 0x1a) {
            /* Zen 4 (family 0x19) runs AVX-512 in 256-bit halves: OpenBLAS
             * 0.3.21's Haswell SGEMM kernels beat its SkylakeX/Cooperlake
             * ones there. */
            *why = "measured fastest on AMD Zen 4 (AVX-512 in 256-bit halves)";
            return "Haswell";
        }
        if (amd) {
            /* Zen 5 (family 0x1a) has full-width AVX-512 units: SkylakeX
             * measured 2x Haswell's SGEMM peak there (233 against 120). */
            *why = "measured fastest on AMD Zen 5 and later (2x Haswell's)";
            return "SkylakeX";
        }
        *why = "measured fastest on Intel CPUs with AVX-512 (2x Haswell's)";
        return "SkylakeX";
    case MG_SIMD_AVX2:
        *why = "the CPU's AVX2+FMA level";
        return amd ? "Zen" : "Haswell";
    case MG_SIMD_AVX:
        *why = "the CPU's AVX level";
        return "Sandybridge";
    default:
        return NULL;
    }
}

static bool can_reselect(void)
{
    return gotoblas_dynamic_init && gotoblas_dynamic_quit && openblas_get_corename &&
           blas_memory_alloc && blas_memory_free;
}

/* Re-run OpenBLAS's dynamic core selection with OPENBLAS_CORETYPE=name for
 * the duration of the call (children do not inherit it). */
static bool select_core(const char *name)
{
    if (!can_reselect() || core_index(name) < 0) return false;
    /* OpenBLAS's memory set-up done here, not by a worker starting while
     * the core is switched off (see the top of this file). */
    blas_memory_free(blas_memory_alloc(0));
    const char *cur = mg_env_other("OPENBLAS_CORETYPE");
    char *saved = cur ? strdup(cur) : NULL;
    setenv("OPENBLAS_CORETYPE", name, 1);   /* before the switch: any selection picks name */
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    if (saved) setenv("OPENBLAS_CORETYPE", saved, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    free(saved);
    return !strcasecmp(openblas_get_corename(), name);
}

static void current_core(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", openblas_get_corename ? openblas_get_corename() : "unknown");
}

void mg__blas_check(mg_kernels_info *k)
{
    /* "OpenBLAS 0.3.21 DYNAMIC_ARCH ...": the first two words. */
    const char *cfg = openblas_get_config ? openblas_get_config() : "BLAS";
    int n = 0, words = 0;
    while (cfg[n] && !(cfg[n] == ' ' && ++words == 2)) n++;
    snprintf(k->blas, sizeof k->blas, "%.*s", n, cfg);

    const char *user = mg_env_other("OPENBLAS_CORETYPE");
    const char *misdetect = mg_env_str("MG_BLAS_MISDETECT", NULL);
    const char *want = mg_env_str("MG_BLAS_CORE", "auto");
    if (misdetect) {
        if (!select_core(misdetect))
            mg_log("warning: MG_BLAS_MISDETECT=%s: cannot select that core", misdetect);
        user = NULL;
    }
    current_core(k->detected, sizeof k->detected);
    k->detected_simd = core_simd(k->detected);

    const char *why = NULL, *target = NULL, *best = mg_blas_core_for(&k->cpu, &why);
    /* Who asked for the core: an explicit choice is respected without a
     * warning unless it cannot be had. */
    char asked[96] = "";
    bool by_user = false;
    if (user && !misdetect) {
        by_user = true;
        snprintf(k->why, sizeof k->why, "set by OPENBLAS_CORETYPE=%.24s in the environment", user);
        k->choice = k->why;
        snprintf(k->fix, sizeof k->fix, "unset it to let multigrad choose");
        if (strcasecmp(want, "auto"))   /* said nothing, valid or junk (a probe) */
            mg_log("warning: MG_BLAS_CORE=%s is not used: OPENBLAS_CORETYPE=%s is set, and "
                   "OpenBLAS's own variable wins; unset one of them", want, user);
    } else if (!strcasecmp(want, "keep")) {
        k->choice = "OpenBLAS's choice, kept: MG_BLAS_CORE=keep in the environment";
        snprintf(k->fix, sizeof k->fix, "unset MG_BLAS_CORE to let multigrad choose");
    } else if (strcasecmp(want, "auto") && core_index(want) >= 0) {
        target = want;
        by_user = true;
        snprintf(asked, sizeof asked, "MG_BLAS_CORE=%.24s in the environment", want);
        snprintf(k->fix, sizeof k->fix, "unset MG_BLAS_CORE to let multigrad choose");
    } else {
        if (strcasecmp(want, "auto"))
            mg_log("warning: MG_BLAS_CORE=%s is not an OpenBLAS x86-64 core (Prescott, "
                   "Sandybridge, Haswell, Zen, SkylakeX, Cooperlake, ... or auto, keep); "
                   "using auto", want);
        target = best;
        snprintf(asked, sizeof asked, "multigrad's choice for this CPU, no core set by "
                 "OPENBLAS_CORETYPE or MG_BLAS_CORE");
    }
    bool refused = false;
    if (target && strcasecmp(target, k->detected)) {
        k->switched = select_core(target);
        refused = !k->switched;
    }
    if (refused) {
        /* A core OpenBLAS cannot force falls back to one by CPU features:
         * back to the one it chose. */
        select_core(k->detected);
        snprintf(k->why, sizeof k->why, "cannot re-select %.24s (%s): %s", target, asked,
                 can_reselect() ? "OpenBLAS refused it"
                                : "this OpenBLAS was built without DYNAMIC_ARCH");
        if (!by_user)   /* OpenBLAS loads a core named before the program starts */
            snprintf(k->fix, sizeof k->fix, "OPENBLAS_CORETYPE=%.24s set before the program "
                     "starts makes OpenBLAS load it", target);
        k->choice = k->why;
    } else if (target && by_user) {
        snprintf(k->why, sizeof k->why, "set by %s", asked);
        k->choice = k->why;
    } else if (k->switched) {
        snprintf(k->why, sizeof k->why, "OpenBLAS chose %.24s (%s); %.100s", k->detected,
                 mg_simd_name(k->detected_simd), why);
        k->choice = k->why;
    } else if (target) {
        k->choice = why;
    } else if (!k->choice) {
        k->choice = "OpenBLAS's choice (no better core for this CPU)";
    }
    current_core(k->core, sizeof k->core);
    k->core_simd = core_simd(k->core);
    /* Below the level of the kernels measured best for this CPU. */
    k->below = best && k->core_simd < core_simd(best);
    /* An explicit choice gets no warning on every run (the environment may
     * set it for all programs); --version, --verbose and the benchmark
     * headers say that it is below this CPU. A core asked for and not had
     * is a warning, whoever asked. */
    if (refused || (k->below && !by_user))
        mg_log("warning: GEMM runs on OpenBLAS's %s kernels (%s) on a CPU with %s (%s): %s%s%s",
               k->core, mg_simd_name(k->core_simd), mg_simd_name(k->cpu.simd), k->cpu.model,
               k->choice, *k->fix ? "; " : "", k->fix);
}
