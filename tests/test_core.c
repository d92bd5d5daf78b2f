/* Tests of src/core: errors, the generator and permutations. */
#define _GNU_SOURCE
#include <sched.h>
#include "harness.h"
#include "multigrad/core.h"

TEST(core_error_message)
{
    CHECK_EQ(mg_error(MG_EIO, "cannot open %s", "x.bin"), MG_EIO);
    CHECK(strcmp(mg_last_error(), "cannot open x.bin") == 0);
    CHECK(strcmp(mg_status_name(MG_ETIMEOUT), "MG_ETIMEOUT") == 0);
}

TEST(core_rng_reproducible_and_uniform)
{
    mg_rng a, b;
    mg_rng_init(&a, 42);
    mg_rng_init(&b, 42);
    for (int i = 0; i < 100; i++) CHECK_EQ(mg_rng_u32(&a), mg_rng_u32(&b));
    mg_rng_init(&b, 43);
    int same = 0;
    for (int i = 0; i < 100; i++) same += mg_rng_u32(&a) == mg_rng_u32(&b);
    CHECK(same < 3);
    /* Moments of uniform and normal draws. */
    double s = 0, s2 = 0, ns = 0, ns2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double u = mg_rng_uniform(&a), z = mg_rng_normal(&a);
        CHECK(u >= 0 && u < 1);
        s += u; s2 += u * u; ns += z; ns2 += z * z;
    }
    CHECK_NEAR(s / n, 0.5, 0.01);
    CHECK_NEAR(s2 / n - (s / n) * (s / n), 1.0 / 12, 0.005);
    CHECK_NEAR(ns / n, 0.0, 0.01);
    CHECK_NEAR(ns2 / n, 1.0, 0.02);
}

TEST(core_permutation_is_a_permutation)
{
    int n = 1000;
    int32_t p[1000], q[1000];
    char seen[1000] = {0};
    mg_permutation(7, p, n);
    mg_permutation(7, q, n);
    for (int i = 0; i < n; i++) {
        CHECK(p[i] >= 0 && p[i] < n && !seen[p[i]]);
        seen[p[i]] = 1;
        CHECK_EQ(p[i], q[i]);
    }
    mg_permutation(8, q, n);
    int same = 0;
    for (int i = 0; i < n; i++) same += p[i] == q[i];
    CHECK(same < 20);
}

#include <sys/stat.h>
#include "multigrad/plot.h"

TEST(core_atomic_write_replaces_whole_file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/a.txt", mgt_tmpdir());
    CHECK_OK(mg_write_file_atomic(path, "first", 5));
    CHECK_OK(mg_write_file_atomic(path, "second!", 7));
    size_t n;
    char *s = mgt_slurp(path, &n);
    CHECK(s && n == 7 && memcmp(s, "second!", 7) == 0);
    free(s);
    /* A failing write (directory missing) leaves nothing behind. */
    snprintf(path, sizeof path, "%s/no/such/dir/a.txt", mgt_tmpdir());
    CHECK_ERR(mg_write_file_atomic(path, "x", 1), MG_EIO);
    CHECK(strstr(mg_last_error(), "no/such/dir") != NULL);
}

TEST(core_plot_svg_has_both_panels)
{
    char path[512];
    snprintf(path, sizeof path, "%s/p.svg", mgt_tmpdir());
    double loss[3] = {2.3, 1.0, 0.5}, acc[3] = {0.1, 0.6, 0.8};
    mg_plot_series s[2] = {{"train loss", loss, 0}, {"test acc", acc, 1}};
    const char *titles[2] = {"loss", "accuracy"};
    CHECK_OK(mg_plot_svg(path, "lenet <d2l>", titles, s, 2, 3));
    char *svg = mgt_slurp(path, NULL);
    CHECK(svg && strncmp(svg, "<svg", 4) == 0 && strstr(svg, "</svg>"));
    CHECK(strstr(svg, "lenet &lt;d2l&gt;"));
    CHECK(strstr(svg, "train loss") && strstr(svg, "test acc"));
    int polylines = 0;
    for (char *q = svg; (q = strstr(q, "<polyline")); q++) polylines++;
    CHECK_EQ(polylines, 2);
    free(svg);
}

#include <math.h>
#include "multigrad/planner.h"
#include "multigrad/trace.h"

TEST(core_trace_writes_chrome_json)
{
    char path[512], rpath[512];
    snprintf(path, sizeof path, "%s/t.json", mgt_tmpdir());
    CHECK_OK(mg_trace_open(path, 1, 2));
    CHECK(mg_trace_on());
    double a = mg_trace_now();
    mg_trace_event("conv1.forward", "forward", 0, a, a + 10);
    mg_trace_event("bucket0", "allreduce", 1, a + 5, a + 30);
    CHECK_OK(mg_trace_close());
    CHECK(!mg_trace_on());
    snprintf(rpath, sizeof rpath, "%s/t.rank1.json", mgt_tmpdir());
    char *s = mgt_slurp(rpath, NULL);
    CHECK(s && strstr(s, "\"traceEvents\"") && strstr(s, "\"conv1.forward\""));
    CHECK(strstr(s, "\"ph\":\"X\",\"pid\":1,\"tid\":1"));
    if (system("command -v python3 >/dev/null") == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; d=json.load(open(\"%s\"));"
                 " sys.exit(0 if len(d[\"traceEvents\"])==6 else 1)'", rpath);
        CHECK(system(cmd) == 0);
    }
    free(s);
    /* With no event or one (its buffer was sized by the events and the
     * header overran it; a probe), a name to escape and a time that is no
     * number: valid JSON still. */
    for (int n = 0; n < 2; n++) {
        CHECK_OK(mg_trace_open(path, 0, 1));
        if (n) mg_trace_event("say \"hi\"\\", "compute", 0, NAN, 1);
        CHECK_OK(mg_trace_close());
        s = mgt_slurp(path, NULL);
        CHECK_MSG(s && strstr(s, "\"displayTimeUnit\":\"ms\"}\n") &&
                  (!n || (strstr(s, "\"name\":\"say \\\"hi\\\"\\\\\",") &&
                          strstr(s, "\"ts\":0.000"))), "%d events: %s", n, s ? s : "(none)");
        free(s);
    }
}

/* A plan described into buffers of any size: cut, never past them (it
 * wrote past a short one; a probe). */
TEST(core_plan_descriptions_stay_in_their_buffer)
{
    mg_plan p = {.dp = 2, .pp = 2, .tp = 1, .zero = 1, .schedule = MG_PIPE_1F1B, .micro = 8,
                 .recompute = true, .offload = true};
    mg_plan_job job;
    CHECK_OK(mg_plan_job_defaults("gpt-mini", &job));
    for (size_t cap = 1; cap < 200; cap++) {
        char buf[256];
        memset(buf, 'x', sizeof buf);
        mg_plan_describe(&p, buf, cap);
        CHECK_MSG(strlen(buf) < cap && buf[cap] == 'x', "describe, cap %zu", cap);
        memset(buf, 'x', sizeof buf);
        mg_plan_flags(&job, &p, buf, cap);
        CHECK_MSG(strlen(buf) < cap && buf[cap] == 'x', "flags, cap %zu", cap);
    }
}

TEST(core_local_cpus_from_launcher_or_affinity)
{
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    unsetenv("MG_LOCAL_CPUS");
    CHECK_EQ(mg_local_cpus(), CPU_COUNT(&set));
    /* A launcher that bound us to fewer CPUs says how many the node has. */
    setenv("MG_LOCAL_CPUS", "7", 1);
    CHECK_EQ(mg_local_cpus(), 7);
    setenv("MG_LOCAL_CPUS", "0", 1);   /* nonsense: ignored */
    CHECK_EQ(mg_local_cpus(), CPU_COUNT(&set));
    unsetenv("MG_LOCAL_CPUS");
}
