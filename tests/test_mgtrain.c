/* mgtrain end to end: real data, real processes. Bad input, logs and
 * plots, checkpoints and exact resume, --init and --eval-only. */
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "harness.h"
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
