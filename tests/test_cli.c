/* The tools' command lines and environment: every number a flag or an
 * MG_* variable takes is checked against its range (one line, exit 2, no
 * work done); one table lists the variables (mgtrain --print-params) and a
 * misspelt one is named; DDP ranks started with different settings stop
 * at once naming the difference; a mistake every rank finds is said once;
 * launchers are told by their variables;
 * each diagnostic line is one write(2), whole, naming its rank and address
 * once. (The README's mpirun lines run in test_mpi.c.)
 * Needs the tools (make -j2 all, or MG_BIN). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "multigrad/comm.h"
#include "multigrad/core.h"

/* ---- numbers out of range ------------------------------------------------- */

TEST(cli_parse_numbers_whole_and_in_range)
{
    long l;
    double d;
    CHECK_OK(mg_parse_long("--n", "42", 1, 100, &l));
    CHECK_EQ(l, 42);
    CHECK_OK(mg_parse_long("--n", "-3", -5, 5, &l));
    CHECK_EQ(l, -3);
    const char *bad_int[] = {"", " 4", "4 ", "4x", "0x10", "1.5", "4294967296", "-1",
                             "99999999999999999999", "abc", "+"};
    for (size_t i = 0; i < sizeof bad_int / sizeof *bad_int; i++) {
        CHECK_ERR(mg_parse_long("--n", bad_int[i], 0, 1024, &l), MG_EINVAL);
        CHECK_MSG(strstr(mg_last_error(), "give an integer from 0 to 1024"), "'%s': %s",
                  bad_int[i], mg_last_error());
    }
    CHECK_ERR(mg_parse_long("--threads", "4294967296", 1, 1024, &l), MG_EINVAL);
    CHECK_MSG(!strcmp(mg_last_error(), "--threads 4294967296 is out of range: give an integer "
                      "from 1 to 1024"), "%s", mg_last_error());
    CHECK_ERR(mg_parse_long("MG_THREADS", "abc", 1, 1024, &l), MG_EINVAL);
    CHECK_MSG(!strcmp(mg_last_error(), "MG_THREADS='abc' is not an integer: give an integer "
                      "from 1 to 1024"), "%s", mg_last_error());

    CHECK_OK(mg_parse_double("--lr", "1e-3", 0, 10, MG_OPEN_LO, &d));
    CHECK_NEAR(d, 1e-3, 0);
    const char *bad_real[] = {"0", "-1", "inf", "-inf", "nan", "1e400", "", " 1", "1,5", "11"};
    for (size_t i = 0; i < sizeof bad_real / sizeof *bad_real; i++)
        CHECK_MSG(mg_parse_double("--lr", bad_real[i], 0, 10, MG_OPEN_LO, &d) == MG_EINVAL,
                  "'%s' accepted", bad_real[i]);
    CHECK_ERR(mg_parse_double("--m", "1", 0, 1, MG_OPEN_HI, &d), MG_EINVAL);
    CHECK_OK(mg_parse_double("--m", "0", 0, 1, MG_OPEN_HI, &d));
}

/* Each bad number: one line naming the flag, exit 2, and no training (the
 * --save file never appears). */
TEST_T(cli_flag_numbers_out_of_range, 120)
{
    const char *t = mgt_tmpdir();
    struct { const char *tool, *args, *says; } bad[] = {
        {"mgtrain", "--model mlp --epochs 1 --accumulate 4294967296",
         "--accumulate 4294967296 is out of range: give an integer from 1 to 65536"},
        {"mgtrain", "--model mlp --epochs 1 --threads 4294967296",
         "--threads 4294967296 is out of range: give an integer from 1 to 1024"},
        {"mgtrain", "--model mlp --epochs 4294967297", "--epochs 4294967297 is out of range"},
        {"mgtrain", "--model mlp --epochs 1 --batch 99999999999999999999", "--batch"},
        {"mgtrain", "--model mlp --epochs 1 --lr inf", "--lr 'inf' is not a number"},
        {"mgtrain", "--model mlp --epochs 1 --lr 1e400", "--lr 1e400 is out of range"},
        {"mgtrain", "--model mlp --epochs 1 --seed -1", "--seed -1 is out of range"},
        {"mgtrain", "--model mlp --epochs 1 --bucket-mb 1e-12", "--bucket-mb"},
        {"mgtrain", "--model mlp --epochs 1 --momentum 1", "--momentum 1 is out of range"},
        {"mgrun", "--max-restarts 4294967296 touch", "--max-restarts 4294967296 is out of range"},
        {"mgbench", "all_reduce -e 64 -T inf", "-T 'inf' is not a number"},
        {"mgbench", "all_reduce -e 64 -i 4294967296", "-i 4294967296 is out of range"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char tool[512], save[600], *out;
        snprintf(tool, sizeof tool, "%s", mgt_tool(bad[i].tool));
        snprintf(save, sizeof save, "%s/out.%zu", t, i);
        int rc = !strcmp(bad[i].tool, "mgtrain")
                     ? mgt_sh(&out, "%s %s --save %s", tool, bad[i].args, save)
                 : !strcmp(bad[i].tool, "mgrun")
                     ? mgt_sh(&out, "%s %s %s", tool, bad[i].args, save)
                     : mgt_sh(&out, "%s %s", tool, bad[i].args);
        CHECK_MSG(rc == 2 && mgt_count(out, "\n") == 1 &&
                  !strncmp(out, bad[i].tool, strlen(bad[i].tool)) && strstr(out, bad[i].says),
                  "%s %s: exit %d: %s", bad[i].tool, bad[i].args, rc, out);
        CHECK_MSG(access(save, F_OK) != 0, "%s %s did the work", bad[i].tool, bad[i].args);
        free(out);
    }
}

/* ---- the tunables ------------------------------------------------------- */

/* A bad MG_* value: one line naming it and exit 2 from every tool, before
 * any work (the file the command would write never appears). */
TEST_T(cli_tunables_checked_at_start, 120)
{
    const char *t = mgt_tmpdir();
    struct { const char *env, *tool, *args, *says; } bad[] = {
        {"MG_TIMEOUT=-1", "mgtrain", "--model mlp --epochs 1 --save",
         "mgtrain: MG_TIMEOUT=-1 is out of range: give a number from 0.001 to 1e+07"},
        {"MG_THREADS=abc", "mgtrain", "--model mlp --epochs 1 --save",
         "mgtrain: MG_THREADS='abc' is not an integer: give an integer from 1 to 1024"},
        {"MG_ALGO=fast", "mgtrain", "--model mlp --epochs 1 --save", "MG_ALGO='fast'"},
        {"MG_VERBOSE=maybe", "mgtrain", "--model mlp --epochs 1 --save", "MG_VERBOSE='maybe'"},
        {"MG_COLL_CHUNK=12", "mgbench", "-n 2 all_reduce -e 64",
         "mgbench: MG_COLL_CHUNK=12 is out of range"},
        {"MG_GRACE=-5", "mgrun", "-n 1 touch", "mgrun: MG_GRACE=-5 is out of range"},
        {"MG_TIMEOUT=nan", "mgrun", "-n 1 touch", "mgrun: MG_TIMEOUT='nan' is not a number"},
        {"MG_THREADS=0", "mgplan", "--model mlp -n 1 --flops 1e10 --mem-bw 1e10 --flags",
         "mgplan: MG_THREADS=0 is out of range"},   /* it planned regardless (a probe) */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char tool[512], file[600], *out;
        snprintf(tool, sizeof tool, "%s", mgt_tool(bad[i].tool));
        snprintf(file, sizeof file, "%s/out.%zu", t, i);
        /* mgbench's and mgplan's work: what they print */
        int prints = !strcmp(bad[i].tool, "mgbench") || !strcmp(bad[i].tool, "mgplan");
        int rc = mgt_sh(&out, "%s %s %s %s", bad[i].env, tool, bad[i].args, prints ? "" : file);
        CHECK_MSG(rc == 2 && mgt_count(out, "\n") == 1 && strstr(out, bad[i].says) &&
                  !strstr(out, "# mgbench") && !strstr(out, "mgtrain --model"), "%s %s: exit "
                  "%d: %s", bad[i].env, bad[i].tool, rc, out);
        CHECK_MSG(access(file, F_OK) != 0, "%s %s did the work", bad[i].env, bad[i].tool);
        free(out);
    }
}

/* In the library: mg_group_init refuses a bad value; a read that meets
 * one anyway warns once and uses the default. */
TEST(cli_tunables_in_the_library)
{
    mg_group_options o = mg_group_options_default();
    o.rank = 0;
    o.size = 1;
    mg_group *g;
    setenv("MG_TIMEOUT", "abc", 1);
    CHECK_ERR(mg_group_init(&o, &g), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "MG_TIMEOUT='abc'"), "%s", mg_last_error());
    CHECK(mg_env_double("MG_TIMEOUT", 300) == 300);
    setenv("MG_TIMEOUT", "12.5", 1);
    CHECK(mg_env_double("MG_TIMEOUT", 300) == 12.5);
    setenv("MG_KERNELS", "fast", 1);
    CHECK(!strcmp(mg_env_str("MG_KERNELS", "auto"), "auto"));
    CHECK_ERR(mg_tunables_check(), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "give one of auto, generic"), "%s", mg_last_error());
    unsetenv("MG_KERNELS");
    setenv("MG_MPI_CHECK", "yes", 1);
    CHECK_EQ(mg_env_long("MG_MPI_CHECK", 0), 1);
    CHECK_OK(mg_tunables_check());
}

/* The table itself: names, defaults within their own ranges. */
TEST(cli_tunables_table_is_consistent)
{
    int n;
    const mg_tunable *p = mg_tunables(&n);
    CHECK(n >= 20);
    for (int i = 0; i < n; i++) {
        CHECK_MSG(!strncmp(p[i].name, "MG_", 3) && p[i].doc && *p[i].doc, "%s", p[i].name);
        CHECK_MSG(mg_tunable_find(p[i].name) == &p[i], "%s twice", p[i].name);
        CHECK_MSG(p[i].min <= p[i].max, "%s", p[i].name);
        CHECK_MSG((p[i].type == MG_TUNE_CHOICE) == (p[i].choices != NULL), "%s", p[i].name);
        if (!p[i].dflt || !*p[i].dflt) continue;
        setenv(p[i].name, p[i].dflt, 1);
        CHECK_MSG(mg_tunables_check() == MG_OK, "%s's default: %s", p[i].name, mg_last_error());
        unsetenv(p[i].name);
    }
}

/* Every MG_* name the sources read, or the scripts use, is a row. */
TEST(cli_every_tunable_read_is_in_the_table)
{
    char *out;
    int rc = mgt_sh(&out, "cd %s/../.. && test -d src && { grep -rhoE 'mg_env_(long|double|"
                    "str)\\(\"MG_[A-Z0-9_]+' src tools tests bench examples | sed 's/.*\"//'; "
                    "grep -rhoE 'MG_[A-Z0-9_]+' --include='*.sh' scripts bench; } | sort -u",
                    mgt_data(""));
    if (rc || !strstr(out, "MG_")) mgt_skip("the sources are not here (%s)", mgt_data(""));
    int names = 0;
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n"), names++)
        CHECK_MSG(mg_tunable_find(l), "%s is read but not in src/core/param.c's table", l);
    CHECK(names >= 20);
    free(out);
    /* No variable is read around the table's file. */
    rc = mgt_sh(&out, "cd %s/../.. && grep -rn 'getenv(' src tools | grep -v src/core/param.c",
                mgt_data(""));
    CHECK_MSG(rc != 0, "%s", out);
    free(out);
}

TEST_T(cli_print_params_lists_the_table, 30)
{
    setenv("MG_TIMEOUT", "42", 1);
    setenv("MG_JOB_SECRET", "do-not-print-this-secret", 1);
    const char *tool = mgt_tool("mgtrain");
    mgt_result *r = mgt_exec(20, (const char *[]){tool, "--print-params", NULL}, NULL);
    CHECK_MSG(mgt_exit_code(r) == 0 && !r->err[0], "exit %d: %s", mgt_exit_code(r), r->err);
    int n;
    const mg_tunable *p = mg_tunables(&n);
    CHECK_EQ(mgt_count(r->out, "\n"), n + 1);
    for (int i = 0; i < n; i++) {
        char want[128];
        snprintf(want, sizeof want, "\n%s ", p[i].name);
        const char *line = strstr(r->out, want);
        CHECK_MSG(line, "%s missing:\n%s", p[i].name, r->out);
        line += strlen(want);
        while (*line == ' ') line++;
        const char *d = p[i].dflt ? *p[i].dflt ? p[i].dflt : "''" : "-";
        CHECK_MSG(!strncmp(line, d, strlen(d)) && strstr(line, p[i].doc), "%s: %.200s",
                  p[i].name, line);
    }
    CHECK(strstr(strstr(r->out, "\nMG_TIMEOUT "), "[set: 42]\n"));
    CHECK(!strstr(r->out, "do-not-print-this-secret"));
}

/* A misspelt variable is named with the one it probably meant: once, by
 * the launcher, not again by each of its workers. */
TEST_T(cli_unknown_variable_warned_with_closest_name, 60)
{
    setenv("MG_TIMOUT", "5", 1);
    const char *tool = mgt_tool("mgtrain");
    const char *mgrun = mgt_tool("mgrun");
    mgt_result *r = mgt_exec(20, (const char *[]){tool, "--print-params", NULL}, NULL);
    CHECK_EQ(mgt_exit_code(r), 0);
    CHECK_MSG(!strcmp(r->err, "multigrad: warning: MG_TIMOUT is not a multigrad variable; did "
                      "you mean MG_TIMEOUT? (mgtrain --print-params lists them)\n"), "%s",
              r->err);
    setenv("MG_XYZZY_PLUGH", "1", 1);
    r = mgt_exec(30, (const char *[]){mgrun, "-n", "2", tool, "--print-params", NULL}, NULL);
    CHECK_MSG(mgt_exit_code(r) == 0, "exit %d: %s", mgt_exit_code(r), r->err);
    CHECK_MSG(mgt_count(r->err, "MG_TIMOUT") == 1 && mgt_count(r->err, "MG_XYZZY_PLUGH") == 1 &&
              mgt_count(r->err, "\n") == 2, "%s", r->err);
    CHECK(strstr(r->err, "MG_XYZZY_PLUGH is not a multigrad variable (mgtrain"));
}

/* ---- ranks that disagree -------------------------------------------------- */

/* mgrun -n 2 through a script that gives rank 1 other flags: both ranks
 * stop at once (not after a timeout) naming the first difference. */
static void disagree(const char *rank0, const char *rank1, const char *says)
{
    char *out;
    const char *run = mgt_tool("mgrun");
    const char *train = mgt_tool("mgtrain");
    double t0 = mg_now();
    int rc = mgt_sh(&out, "MG_TIMEOUT=60 %s -n 2 sh -c 'if [ $RANK = 1 ]; then exec %s "
                    "--parallel ddp %s; else exec %s --parallel ddp %s; fi'", run, train, rank1,
                    train, rank0);
    double secs = mg_now() - t0;
    CHECK_MSG(rc == 2 && strstr(out, says), "exit %d after %.1f s: %s", rc, secs, out);
    CHECK_MSG(secs < 20, "took %.1f s: %s", secs, out);
    free(out);
}

TEST_T(cli_ddp_ranks_that_disagree_stop_naming_the_difference, 120)
{
    disagree("--model lenet5 --epochs 1", "--model mlp --epochs 1",
             "mgtrain: rank 1 has --model mlp, rank 0 has --model lenet5: start every rank "
             "with the same flags");
    disagree("--model mlp --epochs 1", "--model mlp --epochs 2",
             "rank 1 has --epochs 2, rank 0 has --epochs 1");
    disagree("--model mlp --epochs 1 --bucket-mb 1", "--model mlp --epochs 1",
             "rank 1 has --bucket-mb 25, rank 0 has --bucket-mb 1");
    /* The data too: here gpt-mini's text, of other sizes. */
    const char *t = mgt_tmpdir();
    char a[600], b[600], f0[1400], f1[1400];
    snprintf(a, sizeof a, "%s/a.txt", t);
    snprintf(b, sizeof b, "%s/b.txt", t);
    FILE *fa = fopen(a, "w"), *fb = fopen(b, "w");
    for (int i = 0; i < 400; i++) fprintf(fa, "line %d of some text\n", i);
    for (int i = 0; i < 500; i++) fprintf(fb, "line %d of some text\n", i);
    fclose(fa);
    fclose(fb);
    const char *gpt = "--model gpt-mini --layers 1 --dim 16 --heads 2 --ctx 16 --steps 1";
    snprintf(f0, sizeof f0, "%s --data %s", gpt, a);
    snprintf(f1, sizeof f1, "%s --data %s", gpt, b);
    disagree(f0, f1, "rank 1 has --data with ");
}

/* Issue 30 item 4: every flag the ranks must share is compared before
 * the first collective that depends on it: offload (which stopped with
 * "mismatched collectives"), the sample of a pipeline (which trained, then
 * failed with "rank 0 died"), the prompt (which finished silently), the
 * device's kind, evaluation, and who saves. */
TEST_T(cli_ranks_that_disagree_on_any_shared_flag_stop_before_work, 180)
{
    char off[600], f0[1400], f1[1400];
    snprintf(off, sizeof off, "--model mlp --epochs 1 --zero 2 --offload disk:%s", mgt_tmpdir());
    disagree(off, "--model mlp --epochs 1 --zero 2",
             "rank 1 has --offload none, rank 0 has --offload disk");
    const char *gpt = "--model gpt-mini --layers 2 --dim 16 --heads 2 --ctx 16 --steps 2 "
                      "--mesh pp=2";
    snprintf(f0, sizeof f0, "%s --sample 5", gpt);
    snprintf(f1, sizeof f1, "%s --sample 9", gpt);
    disagree(f0, f1, "rank 1 has --sample 9, rank 0 has --sample 5");
    snprintf(f0, sizeof f0, "%s --sample 5 --prompt \"Q: why\"", gpt);
    snprintf(f1, sizeof f1, "%s --sample 5 --prompt \"Q; how\"", gpt);
    disagree(f0, f1, "rank 1 has --prompt Q\\x3b how, rank 0 has --prompt Q: why");
    snprintf(f1, sizeof f1, "%s --sample 5 --prompt \"Q: why\" --temperature 0", gpt);
    disagree(f0, f1, "rank 1 has --temperature 0, rank 0 has --temperature 0.8");
    snprintf(f0, sizeof f0, "%s --eval-windows 8", gpt);
    disagree(f0, gpt, "rank 1 has --eval-windows 0, rank 0 has --eval-windows 8");
    snprintf(f0, sizeof f0, "%s --device emu", gpt);
    disagree(f0, gpt, "rank 1 has --device cpu, rank 0 has --device emu");
    snprintf(f0, sizeof f0, "%s --save %s/s.st", gpt, mgt_tmpdir());
    disagree(f0, gpt, "rank 1 has --save none, rank 0 has --save given");
    snprintf(f0, sizeof f0, "--model gpt-mini --layers 2 --dim 16 --heads 2 --ctx 16 --steps 2 "
             "--mesh dp=2");
    disagree(gpt, f0, "rank 1 has --mesh dp=2, rank 0 has --mesh pp=2");
}

/* A mistake every rank of a job finds alike is said once, by rank 0 (a
 * flag that does not parse, the flags' checks, the mesh, the batch, the
 * strategy's refusal, the data, a pipeline's split, a checkpoint that is
 * not there; mgbench's and mgplan's flags): the other ranks stop without
 * a word (MG_ESTOPPED) and wait for mgrun, which stops them as soon as
 * rank 0 exits; it names rank 0.
 * Each line printed once, before, when every rank said it (1 to 4 copies). */
TEST_T(cli_a_mistake_every_rank_finds_is_said_once, 120)
{
    char *out;
    const char *run = mgt_tool("mgrun");
    const char *train = mgt_tool("mgtrain");
    const struct { int n; const char *args, *says; } cases[] = {
        {4, "--model gpt-mini --epochs 1 --parallel ddp", "gpt-mini trains by steps"},
        {4, "--model lenet5 --tp-chunks 2 --parallel ddp", "fixes the sums of --deterministic"},
        {4, "--model lenet5 --mesh dp=3", "has dp*tp*pp = 3 ranks but the job has 4"},
        {4, "--model lenet5 --parallel ps", "--batch 128 does not divide among 3"},
        {3, "--model lenet5 --parallel ps --staleness 2 --deterministic", "needs --staleness 0"},
        {3, "--model lenet5 --parallel ddp --batch 4 --accumulate 3",
         "or --batch 6 --accumulate 2 (the same step)"},
        {4, "--model lenet5 --parallel ddp --data /nonexistent", "data directory '/nonexistent'"},
        {4, "--model lenet5 --mesh pp=2 --split foo", "--split: no unit 'foo'"},
        {4, "--model lenet5 --parallel ddp --resume /nonexistent.st", "--resume: cannot open"},
        {3, "--model mlp", "started as one of 3 ranks of a job"},   /* each trained a copy */
        {4, "--model lenet5 --mesh pp=2,dp=2 --zero 2 --offload disk:/nonexistent",
         "offload directory /nonexistent: cannot make a file"},   /* each rank checks its own */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double t0 = mg_now();
        int rc = mgt_sh(&out, "MG_PEER_TIMEOUT=30 %s -n %d %s %s --epochs 1", run, cases[i].n,
                        train, cases[i].args);
        double secs = mg_now() - t0;
        char stopped[64];
        snprintf(stopped, sizeof stopped, "stopped the other %d worker(s)", cases[i].n - 1);
        CHECK_MSG(rc == 2 && mgt_count(out, cases[i].says) == 1 &&
                  mgt_count(out, "mgtrain: ") == 1 && mgt_count(out, "\n") == 2 &&
                  strstr(out, "mgrun: rank 0 (pid ") && strstr(out, stopped),
                  "%s: exit %d: %s", cases[i].args, rc, out);
        CHECK_MSG(secs < 10, "%s: %.1f s (the silent ranks waited out MG_PEER_TIMEOUT): %s",
                  cases[i].args, secs, out);
        free(out);
    }
    /* The other tools' flags too (mg_launch_defer_to_rank_0). */
    const char *tools[] = {"mgbench", "mgplan"};
    for (int i = 0; i < 2; i++) {
        double t0 = mg_now();
        int rc = mgt_sh(&out, "MG_PEER_TIMEOUT=30 %s -n 4 %s --bogus", run, mgt_tool(tools[i]));
        char says[32];
        snprintf(says, sizeof says, "%s: ", tools[i]);
        CHECK_MSG(rc == 2 && mgt_count(out, says) == 1 && mgt_count(out, "'--bogus'") == 1 &&
                  strstr(out, "mgrun: rank 0 (pid ") && mg_now() - t0 < 10, "%s: exit %d: %s",
                  tools[i], rc, out);
        free(out);
    }
}

/* Issue 30 item 4: an empty prompt is refused before training (it was
 * refused after training and saving). */
TEST(cli_empty_prompt_is_refused_before_work)
{
    char *out;
    int rc = mgt_sh(&out, "%s --model gpt-mini --layers 1 --dim 16 --heads 2 --ctx 16 "
                    "--steps 1 --sample 10 --prompt '' --save %s/p.st", mgt_tool("mgtrain"),
                    mgt_tmpdir());
    CHECK_MSG(rc == 2 && strstr(out, "--prompt is empty") && !strstr(out, "step"), "%s", out);
    free(out);
    char p[700];
    snprintf(p, sizeof p, "%s/p.st", mgt_tmpdir());
    CHECK(access(p, F_OK) != 0);
}

/* ---- diagnostics ------------------------------------------------------------ */

/* Runs argv with stderr on a SOCK_SEQPACKET socket, where each write(2)
 * arrives as one packet; returns how many, each checked to be one whole
 * line starting with prefix. */
static int stderr_writes(const char *const *argv, const char *prefix)
{
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(sv[1], 2);
        close(sv[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(sv[1]);
    int n = 0;
    char buf[8192];
    ssize_t k;
    while ((k = recv(sv[0], buf, sizeof buf - 1, 0)) > 0) {
        buf[k] = 0;
        CHECK_MSG(!strncmp(buf, prefix, strlen(prefix)) && strchr(buf, '\n') == buf + k - 1,
                  "%s: write %d is not one line starting '%s': '%s'", argv[0], n + 1, prefix,
                  buf);
        n++;
    }
    close(sv[0]);
    int st;
    waitpid(pid, &st, 0);
    return n;
}

TEST_T(cli_each_diagnostic_line_is_one_write, 60)
{
    const char *train = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    const char *bench = mgt_tool("mgbench");
    CHECK_EQ(stderr_writes((const char *[]){train, "--threads", "abc", NULL}, "mgtrain: "), 1);
    CHECK_EQ(stderr_writes((const char *[]){run, "-n", "0", "true", NULL}, "mgrun: "), 1);
    CHECK_EQ(stderr_writes((const char *[]){bench, "-n", "0", "all_reduce", NULL}, "mgbench: "), 1);
    setenv("MG_TIMOUT", "5", 1);   /* a library warning */
    CHECK_EQ(stderr_writes((const char *[]){train, "--print-params", NULL}, "multigrad: "), 1);
}

/* Starts mgrun -n 4 mgtrain (DDP) with stderr to a file, each worker
 * writing its pid to DIR/pid.RANK; returns mgrun's pid. */
static pid_t start_job(const char *dir, const char *err)
{
    char script[2048];
    snprintf(script, sizeof script, "echo $$ > %s/pid.$RANK; exec %s --model mlp --parallel ddp "
             "--epochs 50", dir, mgt_tool("mgtrain"));
    const char *run = mgt_tool("mgrun");
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600), null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(e, 2);
        execl(run, run, "-n", "4", "sh", "-c", script, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* A 4-rank job whose rank 2 is stopped: the others fail on their
 * deadline, each with whole lines that name their rank once, and mgrun's
 * summary names rank 2, the cause, first. */
TEST_T(cli_four_rank_failure_lines_whole_and_cause_named, 120)
{
    const char *t = mgt_tmpdir();
    char err[600], pidf[600], buf[32];
    snprintf(err, sizeof err, "%s/job.err", t);
    setenv("MG_TIMEOUT", "5", 1);
    setenv("MG_GRACE", "5", 1);
    pid_t job = start_job(t, err);
    pid_t pids[4];
    for (int r = 0; r < 4; r++) {
        snprintf(pidf, sizeof pidf, "%s/pid.%d", t, r);
        double t0 = mg_now();
        for (buf[0] = 0; !strchr(buf, '\n'); usleep(10000)) {
            mgt_read_into(pidf, buf, sizeof buf);
            CHECK_MSG(mg_now() - t0 < 30, "rank %d never started", r);
        }
        pids[r] = (pid_t)atoi(buf);
    }
    /* In the middle of training: a few seconds into it. */
    sleep(3);
    CHECK(kill(pids[2], SIGSTOP) == 0);
    int st;
    double t0 = mg_now();
    while (waitpid(job, &st, WNOHANG) == 0) {
        if (mg_now() - t0 > 60) {
            kill(job, SIGKILL);
            kill(pids[2], SIGKILL);
            CHECK_MSG(0, "the job still runs 60 s after rank 2 stopped");
        }
        usleep(20000);
    }
    char *text = mgt_slurp(err, NULL);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) != 0, "status %d: %s", st, text);
    int n = 0, ours = 0;
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n"), n++) {
        const char *pre[] = {"mgtrain: ", "mgrun: ", "multigrad: "};
        int k = 0;
        while (k < 3 && strncmp(l, pre[k], strlen(pre[k]))) k++;
        CHECK_MSG(k < 3, "line %d does not start with a tool's name: '%s'", n + 1, l);
        for (int j = 0; j < 3; j++)
            CHECK_MSG(mgt_count(l, pre[j]) == (j == k), "line %d: '%s'", n + 1, l);
        for (int r = 0; r < 4; r++) {
            char me[32];
            snprintf(me, sizeof me, "rank %d: ", r);
            CHECK_MSG(mgt_count(l, me) <= 1, "line %d names rank %d twice: '%s'", n + 1, r, l);
        }
        ours += k == 0;
        if (!strncmp(l, "mgrun: ", 7) && strstr(l, "was stopped")) {
            char want[96];
            snprintf(want, sizeof want, "mgrun: rank 2 (pid %d) was stopped by signal %d "
                     "(SIGSTOP); then rank ", (int)pids[2], SIGSTOP);
            CHECK_MSG(!strncmp(l, want, strlen(want)), "summary: '%s'", l);
        }
    }
    CHECK_MSG(ours >= 1 && strstr(mgt_slurp(err, NULL), "was stopped by signal"), "%s",
              mgt_slurp(err, NULL));
    free(text);
    for (int r = 0; r < 4; r++) CHECK(kill(pids[r], 0) != 0);
}

/* Which launcher started a process, from its variables. */
TEST(cli_launcher_detected_from_its_variables)
{
    const char *all[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                         "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                         "PMI_SIZE"};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) unsetenv(all[i]);
    mg_launch l = mg_launch_detect();
    CHECK(!l.by && !l.mpi && l.rank == -1 && l.size == -1);
    setenv("PMI_RANK", "1", 1);
    setenv("PMI_SIZE", "3", 1);
    l = mg_launch_detect();
    CHECK(l.by && !strcmp(l.by, "PMI") && l.mpi && l.rank == 1 && l.size == 3);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    l = mg_launch_detect();
    CHECK(!strcmp(l.by, "mpirun") && l.rank == 2 && l.size == 4);
    /* RANK and WORLD_SIZE, when set, are the job's (mgrun under mpirun). */
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    l = mg_launch_detect();
    CHECK(!strcmp(l.by, "RANK") && l.mpi && l.rank == 0 && l.size == 1);
    /* Without RANK, a group takes its rank and size from the MPI launcher:
     * here the builtin backend, which still needs a rendezvous. */
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    setenv("MG_BACKEND", "builtin", 1);
    mg_group *g;
    CHECK_ERR(mg_group_init(NULL, &g), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "MG_BACKEND=builtin under mpirun needs a rendezvous: "
                     "mpirun -x MASTER_ADDR=HOST"), "%s", mg_last_error());
}

/* A rank that cannot reach the rendezvous names the address once. */
TEST_T(cli_unreachable_store_named_once, 60)
{
    int port = mgt_free_port();
    char *out, addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    int rc = mgt_sh(&out, "RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d "
                    "MG_TIMEOUT=1 %s --model mlp --parallel ddp", port, mgt_tool("mgtrain"));
    CHECK_MSG(rc == 2 && mgt_count(out, "\n") == 1 && strstr(out, "cannot reach the store at ") &&
              mgt_count(out, addr) == 1 && mgt_count(out, "mgtrain: ") == 1, "exit %d: %s", rc,
              out);
    free(out);
}
