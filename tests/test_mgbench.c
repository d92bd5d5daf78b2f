/* Tests of the mgbench tool (builtin backend): it starts its own ranks
 * (-n 2, -n 3) and runs every collective, dtype and op in check mode with
 * #wrong 0 in every row; nccl-tests' columns, sizes and bus-bandwidth
 * factors; buffers from mg_group_alloc, TCP, each algorithm; running
 * under mgrun; --traffic's bytes per rank against the ring's volume and
 * nccl-tests' bus bytes; one clear line and exit status 2 for bad flags.
 * Needs build/bin/mgbench (make -j2 all) or MG_BIN. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "traffic_model.h"
#include "multigrad/comm.h"
#include "multigrad/core.h"

typedef mgt_result result;
#define exit_code mgt_exit_code

/* Runs argv (NULL-terminated; argv[0] a tool name from build/bin), with
 * setup run in the child first (NULL: none), and collects its exit
 * status, stdout and stderr. */
static result *run_tool_set(double timeout, const char *const *argv, void (*setup)(void))
{
    char tool[512];
    snprintf(tool, sizeof tool, "%s", mgt_tool(argv[0]));
    CHECK_MSG(access(tool, X_OK) == 0, "%s not built: run make -j2 all (or set MG_BIN)", tool);
    const char *args[64] = {tool};
    int n = 1;
    for (; argv[n] && n < 63; n++) args[n] = argv[n];
    args[n] = NULL;
    return mgt_exec(timeout, args, setup);
}

static result *run_tool(double timeout, const char *const *argv)
{
    return run_tool_set(timeout, argv, NULL);
}

/* Child set-ups for run_tool_set. */
static void verbose(void) { setenv("MG_VERBOSE", "1", 1); }
static void store_port_left(void) { setenv("MG_STORE_PORT", "1", 1); }

/* One data row of the table. */
typedef struct {
    long long size, count;
    char type[16], op[16];
    int root;
    double us[2], algbw[2], busbw[2];
    long long wrong[2];    /* -1: "--" (no in-place form) */
} row;

/* Parses the table: rows per "# collective" section (or one unnamed
 * section). Fails on a malformed row. Returns the number of rows. */
static int parse_rows(const char *out, const char *section, row *rows, int cap)
{
    int n = 0, in_section = section == NULL;
    const char *line = out;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf - 1 ? len : sizeof buf - 1), line);
        if (section && buf[0] == '#' && buf[1] == ' ' && buf[2] != ' ' &&
            !strchr(buf + 2, ' ') && !strchr(buf + 2, ':'))
            in_section = !strcmp(buf + 2, section);
        if (in_section && buf[0] == ' ') {
            row r = {0};
            char w0[16], t1[16], a1[16], b1[16], w1[16];
            int k = sscanf(buf, "%lld %lld %15s %15s %d %lf %lf %lf %15s %15s %15s %15s %15s",
                           &r.size, &r.count, r.type, r.op, &r.root, &r.us[0], &r.algbw[0],
                           &r.busbw[0], w0, t1, a1, b1, w1);
            CHECK_MSG(k == 13, "malformed row: '%s'", buf);
            r.wrong[0] = strcmp(w0, "--") ? atoll(w0) : -1;
            CHECK_MSG(strcmp(w0, "N/A"), "row without a check: '%s'", buf);
            r.wrong[1] = strcmp(w1, "--") ? atoll(w1) : -1;
            if (strcmp(t1, "--")) {
                r.us[1] = atof(t1);
                r.algbw[1] = atof(a1);
                r.busbw[1] = atof(b1);
            }
            CHECK_MSG(r.wrong[0] == 0 && (r.wrong[1] == 0 || r.wrong[1] == -1),
                      "wrong values in row: '%s'", buf);
            if (n < cap) rows[n] = r;
            n++;
        }
        if (!end) break;
        line = end + 1;
    }
    return n;
}

static const char *colls[] = {"broadcast", "reduce", "all_reduce", "all_gather", "gather",
                              "scatter", "reduce_scatter", "all_to_all", "barrier", "sendrecv"};
#define NCOLLS ((int)(sizeof colls / sizeof *colls))

static row rows[4096];

/* Every collective, dtype and op at sizes 0 B .. 64 KiB, checked; with
 * buffers on a device (emu) when dev is given. */
static void check_all(const char *n, const char *dev)
{
    result *r = run_tool(60, (const char *[]){"mgbench", "-n", n, "all", "-d", "all", "-o", "all",
                                              "-b", "1", "-e", "64K", "-f", "9", "-i", "2", "-w",
                                              "1", "-c", "1", dev ? "--device" : NULL, dev, NULL});
    CHECK_MSG(exit_code(r) == 0, "mgbench exited %d: %s", exit_code(r), r->err);
    CHECK_MSG(strstr(r->out, "# Out of bounds values : 0 OK"), "no OK footer:\n%s", r->out);
    CHECK(strstr(r->out, "# Avg bus bandwidth"));
    for (int c = 0; c < NCOLLS; c++) {
        int k = parse_rows(r->out, colls[c], rows, 4096);
        /* sizes 1 9 81 729 6561 59049: 6 per dtype (and op for reductions) */
        int want = !strcmp(colls[c], "barrier") ? 1 :
                   !strcmp(colls[c], "reduce") || !strcmp(colls[c], "all_reduce") ||
                   !strcmp(colls[c], "reduce_scatter") ? 6 * 7 * 5 : 6 * 7;
        CHECK_MSG(k == want, "%s: %d rows, expected %d", colls[c], k, want);
    }
    if (dev) CHECK_MSG(strstr(r->out, "buffers emu (staged through the host)"), "%s", r->out);
}

TEST_T(mgbench_two_ranks_all_collectives_exact, 90) { check_all("2", NULL); }
TEST_T(mgbench_three_ranks_all_collectives_exact, 90) { check_all("3", NULL); }
TEST_T(mgbench_device_buffers_all_collectives_exact, 90) { check_all("3", "emu"); }

/* nccl-tests' conventions: sizes are whole buffers (per-rank count times
 * ranks for the gathers and scatters), busbw = algbw * factor. */
TEST_T(mgbench_columns_follow_nccl_tests, 60)
{
    result *r = run_tool(60, (const char *[]){"mgbench", "-n", "3", "all_reduce", "all_gather",
                                              "broadcast", "reduce_scatter", "all_to_all",
                                              "-b", "1M", "-e", "1M", "-i", "3", "-w", "1",
                                              "-r", "2", NULL});
    CHECK_MSG(exit_code(r) == 0, "mgbench exited %d: %s", exit_code(r), r->err);
    CHECK(strstr(r->out, "ranks 3"));
    CHECK(strstr(r->out, "#wrong"));
    CHECK(strstr(r->out, "algbw"));
    CHECK(strstr(r->out, "busbw"));
    struct { const char *name; double factor; long long size, count; const char *op; int root; }
    want[] = {
        {"all_reduce", 4.0 / 3, 1 << 20, 1 << 18, "sum", -1},
        {"all_gather", 2.0 / 3, 3 * 87381 * 4, 3 * 87381, "none", -1},
        {"broadcast", 1.0, 1 << 20, 1 << 18, "none", 2},
        {"reduce_scatter", 2.0 / 3, 3 * 87381 * 4, 3 * 87381, "sum", -1},
        {"all_to_all", 2.0 / 3, 3 * 87381 * 4, 3 * 87381, "none", -1},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        CHECK_EQ(parse_rows(r->out, want[i].name, rows, 4096), 1);
        row *w = &rows[0];
        CHECK_EQ(w->size, want[i].size);
        CHECK_EQ(w->count, want[i].count);
        CHECK(!strcmp(w->type, "f32"));
        CHECK_MSG(!strcmp(w->op, want[i].op), "%s: op %s", want[i].name, w->op);
        CHECK_EQ(w->root, want[i].root);
        for (int p = 0; p < 2; p++) {
            CHECK(w->us[p] > 0);
            /* The table has two decimals: allow that rounding. */
            CHECK_NEAR(w->algbw[p], (double)w->size / (w->us[p] * 1e3),
                       0.006 + 0.002 * w->algbw[p]);
            CHECK_NEAR(w->busbw[p], w->algbw[p] * want[i].factor, 0.012);
        }
    }
}

/* The options that change how it runs still give exact results. */
/* --traffic: the last three columns (sent, received, bus) of the one row
 * of a section (NULL: of a table of one collective). */
static void traffic_cols(const char *out, const char *section, double v[3])
{
    CHECK_EQ(parse_rows(out, section, rows, 4096), 1);
    char head[64];
    snprintf(head, sizeof head, "\n# %s\n", section ? section : "");
    const char *p = section ? strstr(out, head) : strstr(out, "\n ");
    CHECK_MSG(p, "no row for %s", section ? section : "the collective");
    if (section) p = strchr(p + 1, '\n');
    const char *end = strchr(p + 1, '\n');
    CHECK(end);
    /* The row's last three numbers. */
    const char *q = end;
    for (int k = 2; k >= 0; k--) {
        while (q > p && q[-1] == ' ') q--;
        while (q > p && q[-1] != ' ') q--;
        v[k] = atof(q);
    }
}

TEST_T(mgbench_traffic_columns, 60)
{
    /* Four ranks, ring over TCP, sizes that divide evenly: every rank
     * moves exactly the bytes busbw assumes. */
    result *r = run_tool(60, (const char *[]){"mgbench", "-n", "4", "all_reduce",
                                              "reduce_scatter", "all_gather", "-b", "4M", "-e",
                                              "4M", "-i", "2", "-w", "0", "-t", "-a", "ring",
                                              "--traffic", NULL});
    CHECK_MSG(exit_code(r) == 0, "mgbench exited %d: %s", exit_code(r), r->err);
    CHECK(strstr(r->out, "(size*busf)"));
    const char *names[] = {"all_reduce", "reduce_scatter", "all_gather"};
    double bus[] = {2.0 * 3 / 4 * (4 << 20), 3.0 / 4 * (4 << 20), 3.0 / 4 * (4 << 20)};
    for (int i = 0; i < 3; i++) {
        double v[3];
        traffic_cols(r->out, names[i], v);
        CHECK_MSG(v[0] == bus[i] && v[1] == bus[i] && v[2] == bus[i],
                  "%s: sent %.0f received %.0f bus %.0f, want %.0f", names[i], v[0], v[1], v[2],
                  bus[i]);
    }
    /* Three ranks over shared-memory channels: blocks of 2^20 floats are
     * uneven, and the most any rank moves is the ring's largest share. */
    r = run_tool(60, (const char *[]){"mgbench", "-n", "3", "all_reduce", "-b", "4M", "-e", "4M",
                                      "-i", "2", "-w", "0", "-a", "ring", "--traffic", NULL});
    CHECK_MSG(exit_code(r) == 0, "mgbench exited %d: %s", exit_code(r), r->err);
    double v[3];
    traffic_cols(r->out, NULL, v);
    tm_vol most = {0, 0};
    for (int k = 0; k < 3; k++) {
        tm_vol t = tm_ring_all_reduce((size_t)1 << 20, 4, k, 3);
        if (t.sent > most.sent) most.sent = t.sent;
        if (t.recv > most.recv) most.recv = t.recv;
    }
    CHECK_MSG(v[0] == (double)most.sent && v[1] == (double)most.recv,
              "sent %.0f received %.0f, the ring's most %llu %llu", v[0], v[1],
              (unsigned long long)most.sent, (unsigned long long)most.recv);
    CHECK_NEAR(v[2], 4.0 / 3 * (4 << 20), 0.5);
}

/* --model-time: the cost model's time for the row by the algorithm run,
 * the last column; central's the larger at four ranks over TCP. */
TEST_T(mgbench_model_time_column, 60)
{
    double model[2];
    const char *algos[] = {"ring", "central"};
    for (int a = 0; a < 2; a++) {
        result *r = run_tool(60, (const char *[]){"mgbench", "-n", "4", "all_reduce", "-b", "4M",
                                                  "-e", "4M", "-i", "2", "-w", "0", "-t", "-a",
                                                  algos[a], "--model-time", NULL});
        CHECK_MSG(exit_code(r) == 0, "mgbench exited %d: %s", exit_code(r), r->err);
        CHECK(strstr(r->out, " model"));
        const char *row = strstr(r->out, "4194304       1048576");
        CHECK_MSG(row, "%s", r->out);
        if (!row) return;
        const char *eol = strchr(row + 1, '\n'), *last = eol;
        while (last > row && last[-1] != ' ') last--;
        model[a] = atof(last);
        const mg_link *l = mg_link_builtin("tcp");
        double want = mg_coll_time_by(algos[a], MG_COLL_ALL_REDUCE, 4 << 20, 4, l) * 1e6;
        CHECK_MSG(fabs(model[a] - want) <= 0.05 + 1e-6 * want, "%s: %.1f us, the model %.1f",
                  algos[a], model[a], want);
    }
    CHECK(model[1] > 3 * model[0]);
    /* shm where the ranks share no memory (TCP): the model has no time for
     * it (N/A, not -1e6 us), and the collectives' fall-back to the model's
     * choice is said under MG_VERBOSE, as docs/algorithms.md says */
    result *r = run_tool_set(60, (const char *[]){"mgbench", "-n", "2", "all_reduce", "-b", "4K",
                                                  "-e", "4K", "-i", "2", "-w", "0", "-t", "-a",
                                                  "shm", "--model-time", "-c", "1", NULL},
                             verbose);
    CHECK_MSG(exit_code(r) == 0 && strstr(r->out, "# Out of bounds values : 0 OK"), "%s%s",
              r->out, r->err);
    const char *row = strstr(r->out, "\n        4096");
    CHECK_MSG(row && strstr(row, "N/A\n") && !strstr(r->out, "-1000000"), "%s", r->out);
    CHECK_MSG(strstr(r->err, "MG_ALGO=shm: the ranks of this group do not share memory"), "%s",
              r->err);
}

/* A job mgbench starts itself (-n) meets at its own rank 0, whatever
 * store a launcher left in the environment (MG_STORE_PORT: the ranks
 * waited for a store at port 1 until MG_TIMEOUT). */
TEST_T(mgbench_own_job_ignores_a_launchers_store, 60)
{
    result *r = run_tool_set(60, (const char *[]){"mgbench", "-n", "2", "all_reduce", "-e", "8",
                                                  "-i", "1", "-T", "20", NULL},
                             store_port_left);
    CHECK_MSG(exit_code(r) == 0 && strstr(r->out, "# Out of bounds values : 0 OK"),
              "exit %d: %s", exit_code(r), r->err);
}

TEST_T(mgbench_variants_exact, 90)
{
    const char *variants[][3] = {
        {"--group-alloc", NULL, NULL}, {"-t", NULL, NULL}, {"-a", "ring", NULL},
        {"-a", "rd", NULL}, {"-a", "tree", NULL}, {"-a", "shm", "--group-alloc"},
        {"-a", "central", NULL},
    };
    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        const char *argv[32] = {"mgbench", "-n", "3", "all_reduce", "all_gather", "reduce_scatter",
                                "broadcast", "-b", "1000", "-e", "300K", "-f", "17", "-i", "2",
                                "-w", "0", "-d", "bf16"};
        int k = 19;
        for (int j = 0; j < 3 && variants[v][j]; j++) argv[k++] = variants[v][j];
        argv[k] = NULL;
        result *r = run_tool(60, argv);
        CHECK_MSG(exit_code(r) == 0, "%s %s: exit %d: %s", variants[v][0],
                  variants[v][1] ? variants[v][1] : "", exit_code(r), r->err);
        CHECK_MSG(strstr(r->out, "# Out of bounds values : 0 OK"), "%s", r->out);
        CHECK_EQ(parse_rows(r->out, "all_reduce", rows, 4096), 3);
        if (!strcmp(variants[v][0], "--group-alloc"))
            CHECK(strstr(r->out, "buffers mg_group_alloc"));
        if (!strcmp(variants[v][0], "-t")) CHECK(strstr(r->out, "transport tcp"));
    }
    /* Linear steps (nccl-tests' -i, here --stepbytes) and one rank. */
    result *r = run_tool(30, (const char *[]){"mgbench", "all_reduce", "sendrecv", "-b", "0",
                                              "-e", "3000", "--stepbytes", "1000", "-i", "1",
                                              NULL});
    CHECK_MSG(exit_code(r) == 2, "sendrecv on one rank: exit %d", exit_code(r));
    r = run_tool(30, (const char *[]){"mgbench", "all_reduce", "-b", "0", "-e", "3000",
                                      "--stepbytes", "1000", "-i", "1", NULL});
    CHECK_MSG(exit_code(r) == 0, "exit %d: %s", exit_code(r), r->err);
    CHECK_EQ(parse_rows(r->out, NULL, rows, 4096), 4);
    CHECK_EQ(rows[3].size, 3000);
}

/* Under a launcher it is one rank of the launcher's job. */
TEST_T(mgbench_under_mgrun, 60)
{
    const char *mgrun = mgt_tool("mgrun");
    if (access(mgrun, X_OK)) mgt_skip("%s not built", mgrun);
    const char *bench = mgt_tool("mgbench");
    result *r = run_tool(60, (const char *[]){"mgrun", "-n", "2", bench, "all_reduce", "gather",
                                              "-b", "4", "-e", "4K", "-f", "32", NULL});
    CHECK_MSG(exit_code(r) == 0, "exit %d: %s", exit_code(r), r->err);
    CHECK(strstr(r->out, "ranks 2"));
    CHECK_EQ(parse_rows(r->out, "all_reduce", rows, 4096), 3);
    CHECK(strstr(r->out, "# Out of bounds values : 0 OK"));
    /* Only rank 0 prints the table. */
    CHECK(!strstr(strstr(r->out, "# mgbench") + 1, "# mgbench"));
    /* -n must agree with the launcher. */
    r = run_tool(60, (const char *[]){"mgrun", "-n", "2", bench, "-n", "3", "all_reduce", NULL});
    CHECK(exit_code(r) != 0);
    CHECK_MSG(strstr(r->err, "-n 3, but the launcher started 2 ranks"), "%s", r->err);
}

TEST(mgbench_help)
{
    result *r = run_tool(10, (const char *[]){"mgbench", "--help", NULL});
    CHECK_EQ(exit_code(r), 0);
    CHECK(strstr(r->out, "usage: mgbench"));
    CHECK(strstr(r->out, "--iters"));
    CHECK(strstr(r->out, "--backend"));
}

/* Bad flags: one line naming the problem, exit status 2, no table. */
TEST(mgbench_bad_flags)
{
    const char *cases[][8] = {
        {"all_reduce", "--bogus", NULL},
        {"all_reduce", "-d", "f17", NULL},
        {"all_reduce", "-o", "mean", NULL},
        {"allreduc", NULL},
        {"-n", "0", "all_reduce", NULL},
        {"-n", "two", "all_reduce", NULL},
        {"all_reduce", "-b", "1M", "-e", "1K", NULL},
        {"all_reduce", "-b", "12Q", NULL},
        {"all_reduce", "-f", "0.5", NULL},
        {"all_reduce", "-c", "2", NULL},
        {"all_reduce", "-a", "fast", NULL},
        {"all_reduce", "--backend", "nccl", NULL},
        {"all_reduce", "-i", NULL},
        {"-n", "2", NULL},
        {"-n", "2", "broadcast", "-r", "5", NULL},
        {"all_reduce", "--device", "gpu", NULL},
        {"all_reduce", "--device", "emu", "--group-alloc", NULL},
        {"all_reduce", "--device", "emu", "--model-time", NULL},
    };
    const char *needle[] = {"--bogus", "f17", "mean", "allreduc", "-n", "two", "larger",
                            "12Q", "0.5", "-c", "fast", "nccl", "needs a value",
                            "no collective", "-r 5", "unknown device 'gpu'", "--group-alloc",
                            "--model-time"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *argv[12] = {"mgbench"};
        int k = 1;
        for (int j = 0; cases[i][j]; j++) argv[k++] = cases[i][j];
        argv[k] = NULL;
        result *r = run_tool(30, argv);
        CHECK_MSG(exit_code(r) == 2, "case %zu: exit %d (stderr: %s)", i, exit_code(r), r->err);
        char *nl = strchr(r->err, '\n');
        CHECK_MSG(nl && nl[1] == 0, "case %zu: not one line: '%s'", i, r->err);
        CHECK_MSG(!strncmp(r->err, "mgbench: ", 9), "case %zu: '%s'", i, r->err);
        CHECK_MSG(strstr(r->err, needle[i]), "case %zu: '%s' does not name '%s'", i, r->err,
                  needle[i]);
        CHECK_MSG(!strstr(r->out, "Out of bounds"), "case %zu printed a table", i);
    }
}

/* Where the machine cannot give what a flag asks of every rank (a GPU
 * without one, buffers too large for its memory), one line by rank 0 and
 * status 2: each of 3 ranks said it, with status 1 (found by a probe). */
TEST_T(mgbench_what_no_rank_can_have_is_said_once, 60)
{
    const char *gpu[] = {"mgbench", "-n", "3", "all_reduce", "--device", "cuda", "-b", "4",
                         "-e", "4", NULL};
    const char *huge[] = {"mgbench", "-n", "3", "all_reduce", "-b", "1000G", "-e", "1000G",
                          NULL};
    const char *const *cases[2] = {huge, gpu};
    const char *says[2] = {"-e 1073741824000: cannot allocate", "--device: cuda:0: "};
    /* Under a sanitizer too the allocation fails rather than abort */
    const char *san[2] = {"ASAN_OPTIONS", "TSAN_OPTIONS"};
    for (int i = 0; i < 2; i++) {
        char opt[1024];
        snprintf(opt, sizeof opt, "%s:allocator_may_return_null=1",
                 getenv(san[i]) ? getenv(san[i]) : "");
        setenv(san[i], opt, 1);
    }
    for (int i = 0; i < 2; i++) {
        result *r = run_tool(30, cases[i]);
        if (i == 1 && exit_code(r) == 0) {   /* there is a GPU: the rest was checked */
            printf("a GPU is here: --device cuda ran\n");
            break;
        }
        CHECK_MSG(exit_code(r) == 2 && mgt_count(r->err, "\n") == 1 &&
                  strstr(r->err, says[i]), "%s: exit %d: '%s'", says[i], exit_code(r), r->err);
    }
}
