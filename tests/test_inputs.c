/* Hostile input files (issue 16): data sets whose images are not the
 * model's size, checkpoints with crafted counters (checksum recomputed),
 * safetensors headers with very many metadata keys, FIFOs where a file
 * is expected, gzip bombs, and the files training writes (their mode,
 * leftovers of interrupted saves, unwritable paths found before any
 * work). Every bad case must give one clear line and a non-zero status,
 * never a crash or a hang. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <sys/stat.h>
#include "harness.h"
#include "idx_files.h"
#include "multigrad/checkpoint.h"
#include "multigrad/data.h"

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* tmpdir/name (four rotating buffers). */
static const char *tpath(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *tpath(const char *fmt, ...)
{
    static char path[4][600];
    static int k;
    char name[256], *p = path[k++ % 4];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(p, 600, "%s/%s", mgt_tmpdir(), name);
    return p;
}

/* mgtrain with these flags must exit 2 with one "mgtrain: " line holding
 * each of the needles (up to 3, NULL-terminated); returns the output. */
static void expect_refused(const char *flags, const char *n1, const char *n2, const char *n3)
{
    char *out;
    int rc = mgt_sh(&out, "%s %s", mgt_tool("mgtrain"), flags);
    CHECK_MSG(rc == 2, "'%s' exited %d: %s", flags, rc, out);
    CHECK_MSG(count_lines(out) == 1 && strncmp(out, "mgtrain: ", 9) == 0,
              "'%s' printed: %s", flags, out);
    const char *needles[] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        CHECK_MSG(!needles[i] || strstr(out, needles[i]), "'%s': '%s' lacks '%s'", flags, out,
                  needles[i]);
    printf("%s\n", out);
    free(out);
}

/* ---- 1: images of another size than the model's input ---- */

TEST_T(inputs_mgtrain_refuses_images_of_another_size, 120)
{
    const int sizes[][2] = {{30, 30}, {20, 20}, {1, 1}, {28, 27}};
    char flags[1024];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int h = sizes[i][0], w = sizes[i][1];
        const char *dir = tpath("d%dx%d", h, w);
        CHECK(mkdir(dir, 0755) == 0);
        mgt_make_dataset(dir, "train", 64, h, w, 64, -1);
        mgt_make_dataset(dir, "t10k", 32, h, w, 32, -1);
        char geo[32];
        snprintf(geo, sizeof geo, "%dx%d", h, w);
        snprintf(flags, sizeof flags, "--model lenet-d2l --data %s --epochs 1 --batch 16", dir);
        expect_refused(flags, geo, "lenet-d2l", "1x28x28");
        snprintf(flags, sizeof flags, "--model mlp --data %s --epochs 1 --batch 16", dir);
        expect_refused(flags, geo, "mlp", "784");
        /* Evaluation alone gathers the test set too. */
        snprintf(flags, sizeof flags, "--model lenet5 --data %s --eval-only --init %s --init-prefix init.", dir,
                 mgt_data("lenet5.safetensors"));
        expect_refused(flags, geo, "lenet5", NULL);
    }
    /* 28x28 images train. */
    const char *dir = tpath("d28x28");
    CHECK(mkdir(dir, 0755) == 0);
    mgt_make_dataset(dir, "train", 64, 28, 28, 64, -1);
    mgt_make_dataset(dir, "t10k", 32, 28, 28, 32, -1);
    char *out;
    int rc = mgt_sh(&out, "%s --model lenet-d2l --data %s --epochs 1 --batch 16",
                    mgt_tool("mgtrain"), dir);
    CHECK_MSG(rc == 0 && strstr(out, "test acc"), "%s", out);
    free(out);
}

TEST(inputs_gather_refuses_a_short_buffer)
{
    const char *dir = mgt_tmpdir();
    mgt_make_dataset(dir, "train", 8, 5, 4, 8, -1);
    mg_dataset *ds;
    CHECK_OK(mg_dataset_load(dir, true, &ds));
    float x[3 * 20 + 1];
    int32_t y[3];
    const int32_t idx[3] = {7, 0, 3}, bad[2] = {1, 8};
    x[60] = -7;
    CHECK_OK(mg_dataset_gather(ds, idx, 3, MG_SCALE_UNIT, x, 60, y));
    CHECK(x[60] == -7 && y[0] == 7 && y[2] == 3 && x[20] == ds->images[0] / 255.0f);
    /* A buffer one image short, or one float short: nothing written. */
    x[0] = x[40] = -1;
    CHECK_ERR(mg_dataset_gather(ds, idx, 3, MG_SCALE_UNIT, x, 59, y), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "5x4") && strstr(mg_last_error(), "59"));
    CHECK(x[0] == -1 && x[40] == -1 && x[60] == -7);
    CHECK_ERR(mg_dataset_gather(ds, idx, 3, MG_SCALE_UNIT, x, 40, NULL), MG_EINVAL);
    CHECK_ERR(mg_dataset_gather(ds, bad, 2, MG_SCALE_UNIT, x, 60, y), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "index 8"));
    CHECK(x[0] == -1);
    /* The input-shape check names both sides. */
    CHECK_OK(mg_dataset_check_input(ds, "tiny", 1, 5, 4, 10));
    CHECK_OK(mg_dataset_check_input(ds, "flat", 1, 1, 20, 10));
    CHECK_ERR(mg_dataset_check_input(ds, "lenet-d2l", 1, 28, 28, 10), MG_EMISMATCH);
    CHECK(strstr(mg_last_error(), "5x4") && strstr(mg_last_error(), "1x28x28") &&
          strstr(mg_last_error(), "lenet-d2l") && strstr(mg_last_error(), dir));
    CHECK_ERR(mg_dataset_check_input(ds, "three", 3, 5, 4, 10), MG_EMISMATCH);
    CHECK_ERR(mg_dataset_check_input(ds, "binary", 1, 5, 4, 2), MG_EMISMATCH);
    CHECK(strstr(mg_last_error(), "label 2") && strstr(mg_last_error(), "2 classes"));
    mg_dataset_destroy(ds);
}
