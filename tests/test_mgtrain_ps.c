/* mgtrain's parameter server end to end (issue 34): synchronous as DDP,
 * bounded and unbounded staleness, its checkpoints, an image model's
 * server, a killed rank, and --elastic's lost and stopped workers. */
#include "harness.h"
#include "mgtrain_runs.h"
#include "multigrad/checkpoint.h"

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
                        : mgt_sh(&out, "%s -n %d %s %s --parallel ddp --log %s", run, W, bin, job,
                                 ref);
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
    mgt_refused((const mgt_refusal[]){
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
    mgt_refused((const mgt_refusal[]){
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
