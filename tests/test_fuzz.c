/* The fuzz targets' smoke test: every fuzz/fuzz_<name>.c, built by `make
 * fuzz` into $MG_FUZZ_BIN (default build-fuzz/fuzz/), runs over its seed
 * corpus tests/fuzz/<name>/ (crash regressions in its regress/ included)
 * for a few seconds; a crash, leak, sanitizer report or timeout fails
 * the test, naming the input libFuzzer saved (in build-fuzz/artifacts/). Skipped, with a message,
 * when no target is built (clang is not installed). */
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include "harness.h"
#include "multigrad/core.h"

#define SECONDS_EACH 3

TEST_T(fuzz_targets_smoke, 600)
{
    const char *bin = mg_env_str("MG_FUZZ_BIN", "build-fuzz/fuzz");
    glob_t g;
    CHECK_MSG(glob("fuzz/fuzz_*.c", 0, NULL, &g) == 0 && g.gl_pathc > 0,
              "no fuzz/fuzz_*.c: run the tests from the repository's root");
    int built = 0;
    char path[512];
    for (size_t i = 0; i < g.gl_pathc; i++) {
        snprintf(path, sizeof path, "%s/%.*s", bin, (int)strcspn(g.gl_pathv[i] + 5, "."),
                 g.gl_pathv[i] + 5);
        built += access(path, X_OK) == 0;
    }
    if (!built) {
        globfree(&g);
        mgt_skip("no fuzz target is built in %s: 'make fuzz' builds them (it needs clang; "
                 "'make test' builds them when clang is installed)", bin);
    }
    char artifacts[512];
    snprintf(artifacts, sizeof artifacts, "%s/../artifacts", bin);
    mkdir(artifacts, 0755);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char name[128], seeds[256], corpus[600];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(g.gl_pathv[i] + 10, "."),
                 g.gl_pathv[i] + 10);
        snprintf(path, sizeof path, "%s/fuzz_%s", bin, name);
        CHECK_MSG(access(path, X_OK) == 0, "%s is not built (others are): run make fuzz", path);
        snprintf(seeds, sizeof seeds, "tests/fuzz/%s", name);
        struct stat sb;
        CHECK_MSG(stat(seeds, &sb) == 0 && S_ISDIR(sb.st_mode),
                  "fuzz target %s has no seed corpus %s/", name, seeds);
        /* libFuzzer adds what it finds to the first directory: a scratch one. */
        snprintf(corpus, sizeof corpus, "%s/%s", mgt_tmpdir(), name);
        CHECK(mkdir(corpus, 0700) == 0);
        char *out;
        double t0 = mg_now();
        int rc = mgt_sh(&out, "%s -max_total_time=%d -timeout=20 -rss_limit_mb=4096 "
                        "-print_final_stats=1 -artifact_prefix=%s/ %s %s", path, SECONDS_EACH,
                        artifacts, corpus, seeds);
        const char *runs = strstr(out, "stat::number_of_executed_units:");
        printf("fuzz_%s: %.1f s, %ld inputs, exit %d\n", name, mg_now() - t0,
               runs ? atol(runs + 31) : -1L, rc);
        if (rc != 0) {
            size_t n = strlen(out);
            printf("%s\n", n > 6000 ? out + n - 6000 : out);
        }
        CHECK_MSG(rc == 0 && runs, "fuzz_%s failed (exit %d): the input is saved in %s/ "
                  "(once fixed, copy it to %s/regress/)", name, rc, artifacts, seeds);
        free(out);
    }
    globfree(&g);
}
