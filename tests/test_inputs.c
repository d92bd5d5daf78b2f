/* Hostile input files (issue 16): data sets whose images are not the
 * model's size, checkpoints with crafted counters (checksum recomputed),
 * safetensors headers with very many metadata keys, FIFOs where a file
 * is expected, gzip bombs, and the files training writes (their mode,
 * leftovers of interrupted saves, unwritable paths found before any
 * work). Every bad case must give one clear line and a non-zero status,
 * never a crash or a hang. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "idx_files.h"
#include "multigrad/checkpoint.h"
#include "multigrad/data.h"

/* tmpdir/name (eight rotating buffers). */
static const char *tpath(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *tpath(const char *fmt, ...)
{
    static char path[8][600];
    static int k;
    char name[256], *p = path[k++ % 8];
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
    CHECK_MSG(mgt_count(out, "\n") == 1 && strncmp(out, "mgtrain: ", 9) == 0,
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

/* ---- 2: checkpoints whose counters are out of range ---- */

/* Copy checkpoint src to dst with metadata key set to value (added when
 * absent), the checksum recomputed: what anyone can craft. */
static void craft(const char *src, const char *dst, const char *key, const char *value)
{
    mg_st_file *f;
    CHECK_OK(mg_st_open(src, &f));
    int n = mg_st_count(f), nm = 0, nkeys = mg_st_meta_count(f);
    mg_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    const char **meta = calloc(2 * (size_t)nkeys + 2, sizeof *meta);
    for (int i = 0; i < n; i++) t[i] = *mg_st_get(f, i);
    bool set = false;
    for (int i = 0; i < nkeys; i++) {
        const char *k, *v = mg_st_meta_at(f, i, &k);
        if (!strcmp(k, "multigrad.crc32")) continue;
        if (!strcmp(k, key)) { v = value; set = true; }
        meta[2 * nm] = k;
        meta[2 * nm + 1] = v;
        nm++;
    }
    if (!set) { meta[2 * nm] = key; meta[2 * nm + 1] = value; nm++; }
    CHECK_OK(mg_st_write(dst, t, n, meta, nm));
    free(t);
    free(meta);
    mg_st_close(f);
}

TEST(inputs_checkpoint_counters_out_of_range)
{
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 0, &m));
    mg_optim_config c = mg_optim_defaults(MG_OPTIM_ADAM, 1e-3f);
    mg_optim *o;
    CHECK_OK(mg_optim_create(&c, mg_model_arena_size(m), &o));
    mg_optim_step(o, mg_model_params(m), mg_model_grads(m), 1e-3f);
    mg_ckpt_meta meta = {.step = 1, .epoch = 1};
    const char *good = tpath("good.st"), *bad = tpath("bad.st");
    CHECK_OK(mg_checkpoint_save(good, m, o, &meta));
    const struct { const char *key, *value; } cases[] = {
        {"epoch", "18446744073709551613"},          /* 2^64 - 3: -3 as a long */
        {"step", "18446744073709551568"},           /* 2^64 - 48 */
        {"optimizer_steps", "9223372036854775808"}, /* 2^63: negative as a long */
        {"optimizer_steps", "9007199254740992"},    /* 2^53: not exact as a double */
        {"step", "9007199254740993"},
        {"rng_counter", "18446744073709551615"},    /* 2^64 - 1: README's limit is 2^53 - 1 */
        /* Counters that disagree: the optimizer takes one step per step
         * and the extra ones (Adam's bias correction would silently
         * change with them). */
        {"optimizer_steps", "1000000"},
        {"optimizer_steps", "0"},
        {"optimizer_extra_steps", "3"},
        {"optimizer_extra_steps", "9007199254740992"},
        {"optimizer_extra_steps", "-1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        craft(good, bad, cases[i].key, cases[i].value);
        mg_ckpt_meta got;
        mg_status st = mg_checkpoint_load(bad, m, o, &got);
        CHECK_MSG(st == MG_EFORMAT, "%s = %s: %s (%s, step %ld epoch %ld)", cases[i].key,
                  cases[i].value, mg_status_name(st), mg_last_error(), got.step, got.epoch);
        CHECK_MSG(strstr(mg_last_error(), cases[i].key) && strstr(mg_last_error(), "bad.st"),
                  "%s", mg_last_error());
        printf("%s\n", mg_last_error());
        CHECK_EQ(mg_optim_steps(o), 1);
    }
    /* Extra steps that add up load (an asynchronous server's). */
    craft(good, bad, "optimizer_steps", "4");
    craft(bad, bad, "optimizer_extra_steps", "3");
    CHECK_OK(mg_checkpoint_load(bad, m, o, NULL));
    CHECK_EQ(mg_optim_steps(o), 4);
    /* The largest counters allowed still load. */
    craft(good, bad, "optimizer_steps", "9007199254740991");
    craft(bad, bad, "step", "9007199254740991");
    craft(bad, bad, "rng_counter", "9007199254740991");
    CHECK_OK(mg_checkpoint_load(bad, m, o, NULL));
    CHECK_EQ(mg_optim_steps(o), 9007199254740991L);
    mg_optim_destroy(o);
    mg_model_destroy(m);
}

TEST_T(inputs_mgtrain_resume_crafted_counters, 120)
{
    const char *dir = tpath("data"), *ck = tpath("ck.st"), *bad = tpath("bad.st");
    CHECK(mkdir(dir, 0755) == 0);
    mgt_make_dataset(dir, "train", 64, 28, 28, 64, -1);
    mgt_make_dataset(dir, "t10k", 32, 28, 28, 32, -1);
    char *out, base[1024], flags[1400];
    snprintf(base, sizeof base, "--model mlp --data %s --batch 16 --log %s", dir,
             tpath("log.csv"));
    int rc = mgt_sh(&out, "%s %s --epochs 1 --save %s", mgt_tool("mgtrain"), base, ck);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    /* The file: epoch 2^64 - 3 and a step to match, 2^64 - 12 (-3
     * and -12: 4 steps per epoch), which trained from epoch -2. */
    craft(ck, bad, "epoch", "18446744073709551613");
    craft(bad, bad, "step", "18446744073709551604");
    snprintf(flags, sizeof flags, "%s --epochs 2 --resume %s", base, bad);
    expect_refused(flags, "bad.st", "'step' is 18446744073709551604", NULL);
    craft(ck, bad, "optimizer_steps", "9223372036854775808");
    expect_refused(flags, "bad.st", "optimizer_steps", NULL);
    /* 2^32 epochs, which an int reads as 0: the file covers them all. */
    craft(ck, bad, "epoch", "4294967296");
    craft(bad, bad, "step", "0");
    craft(bad, bad, "optimizer_steps", "0");
    rc = mgt_sh(&out, "%s %s", mgt_tool("mgtrain"), flags);
    CHECK_MSG(rc == 0 && strstr(out, "already covers 4294967296") && !strstr(out, "epoch  1/2"),
              "%s", out);
    /* ... and says there is nothing left, not "raise --epochs", which
     * cannot go past 10^6 (issue 30 item 7). */
    CHECK_MSG(strstr(out, "--epochs goes up to 1000000, so there is nothing left to train") &&
              !strstr(out, "raise --epochs"), "%s", out);
    free(out);
    /* A language model's step past --steps's largest value. */
    const char *gck = tpath("gpt.st"), *gpt = "--model gpt-mini --layers 1 --dim 16 --heads 2 "
                                               "--ctx 16 --batch 4 --eval-windows 2";
    rc = mgt_sh(&out, "%s %s --steps 1 --save %s", mgt_tool("mgtrain"), gpt, gck);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    craft(gck, bad, "step", "2000000000");
    craft(bad, bad, "optimizer_steps", "2000000000");
    rc = mgt_sh(&out, "%s %s --steps 5 --resume %s", mgt_tool("mgtrain"), gpt, bad);
    CHECK_MSG(rc == 0 && strstr(out, "already covers 2000000000 step(s); --steps goes up to "
                                     "1000000000, so there is nothing left to train"), "%s", out);
    free(out);
    /* An epoch the steps do not match. */
    craft(ck, bad, "step", "7");
    craft(bad, bad, "optimizer_steps", "7");
    expect_refused(flags, "step 7", NULL, NULL);
    /* The optimizer's step count is the step's (the file: 10^6
     * with step 4 trained to another validation loss). */
    craft(ck, bad, "optimizer_steps", "1000000");
    expect_refused(flags, "bad.st", "'optimizer_steps' is 1000000 but 'step' is 4", NULL);
}

/* ---- 6: headers with very many metadata keys parse in linear time ---- */

/* A safetensors file at path whose metadata holds n keys "k<i>" (two of
 * them equal if dup), one U8 tensor; returns the header's length. */
static size_t many_keys_file(const char *path, long n, bool dup)
{
    size_t cap = 64 + (size_t)n * 24, len = 0;
    char *h = malloc(cap);
    CHECK(h != NULL);
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{");
    for (long i = 0; i < n; i++)
        len += (size_t)snprintf(h + len, cap - len, "%s\"k%ld\":\"v\"", i ? "," : "",
                                dup && i == n - 1 ? 0 : i);
    len += (size_t)snprintf(h + len, cap - len,
                            "},\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    FILE *f = fopen(path, "wb");
    uint64_t hl = len;
    CHECK(f && fwrite(&hl, 8, 1, f) == 1 && fwrite(h, 1, len, f) == len && fputc(7, f) == 7);
    CHECK(fclose(f) == 0);
    free(h);
    return len;
}

TEST_T(inputs_safetensors_many_metadata_keys_linear, 120)
{
    const char *p = tpath("many.st");
    /* 100,000 keys (1.3 MB of header; 15 s before) and 1,000,000 (14 MB;
     * some 25 minutes before). The bounds leave room for sanitizers and a
     * loaded machine. */
    const long counts[] = {100000, 1000000};
    const double bounds[] = {5, 30};
    for (int k = 0; k < 2; k++) {
        size_t hl = many_keys_file(p, counts[k], false);
        double t0 = mg_now();
        mg_st_file *f;
        CHECK_OK(mg_st_open(p, &f));
        double secs = mg_now() - t0;
        printf("%ld metadata keys (%zu-byte header): %.3f s\n", counts[k], hl, secs);
        CHECK_EQ(mg_st_meta_count(f), counts[k]);
        CHECK(strcmp(mg_st_meta(f, "k77"), "v") == 0 && mg_st_find(f, "x")->nbytes == 1);
        mg_st_close(f);
        CHECK_MSG(secs < bounds[k], "%ld keys took %.1f s", counts[k], secs);
    }
    /* A duplicate among them is still found. */
    many_keys_file(p, 100000, true);
    mg_st_file *f;
    CHECK_ERR(mg_st_open(p, &f), MG_EFORMAT);
    CHECK(strstr(mg_last_error(), "duplicate metadata key 'k0'"));
    /* The writer is linear too: 100,000 keys through mg_st_write. */
    enum { N = 100000 };
    char (*keys)[16] = malloc(N * sizeof *keys);
    const char **kv = malloc(2 * N * sizeof *kv);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "key%d", i);
        kv[2 * i] = keys[i];
        kv[2 * i + 1] = "v";
    }
    uint8_t one = 1;
    mg_st_tensor t = {"x", MG_ST_U8, 1, {1}, &one, 1};
    double t0 = mg_now();
    CHECK_OK(mg_st_write(p, &t, 1, kv, N));
    CHECK_OK(mg_st_open(p, &f));
    double secs = mg_now() - t0;
    printf("wrote and read %d keys: %.3f s\n", N, secs);
    CHECK(mg_st_verified(f) && mg_st_meta_count(f) == N + 1);
    mg_st_close(f);
    CHECK_MSG(secs < 5, "%.1f s", secs);
    snprintf(keys[N - 1], sizeof keys[N - 1], "key0");
    CHECK_ERR(mg_st_write(p, &t, 1, kv, N), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "'key0' given twice"));
    free(keys);
    free(kv);
}

/* ---- 8: the files training writes, FIFOs, gzip bombs ---- */

static unsigned mode_of(const char *path)
{
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    return sb.st_mode & 07777;
}

TEST(inputs_outputs_keep_their_mode_or_honour_the_umask)
{
    const char *p = tpath("out.st");
    /* New files: the umask decides (0644 whatever it was, before). */
    const unsigned masks[] = {027, 077, 002};
    for (int i = 0; i < 3; i++) {
        unlink(p);
        umask(masks[i]);
        CHECK_OK(mg_write_file_atomic(p, "x", 1));
        CHECK_MSG(mode_of(p) == (0666 & ~masks[i]), "umask %03o: mode %03o", masks[i],
                  mode_of(p));
    }
    /* An existing file keeps its mode, whatever the umask. */
    umask(022);
    const unsigned modes[] = {0600, 0664, 0640, 0444};
    for (int i = 0; i < 4; i++) {
        CHECK(chmod(p, modes[i]) == 0);
        CHECK_OK(mg_write_file_atomic(p, "yy", 2));
        CHECK_MSG(mode_of(p) == modes[i], "mode %03o became %03o", modes[i], mode_of(p));
    }
    /* Checkpoints go through the same writer. */
    CHECK(chmod(p, 0600) == 0);
    mg_model *m;
    CHECK_OK(mg_model_create("mlp", 0, &m));
    CHECK_OK(mg_checkpoint_save(p, m, NULL, NULL));
    CHECK_EQ(mode_of(p), 0600);
    mg_model_destroy(m);
}

static bool exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static void touch(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, "partial", 7) == 7 && close(fd) == 0);
}

TEST(inputs_interrupted_save_leftovers_are_cleaned)
{
    /* A save killed while it writes leaves its temporary file (killed
     * again if the kill fell between a rename and the next save). */
    char p[600], left[600] = "";
    snprintf(p, sizeof p, "%s", tpath("ck.st"));
    for (int attempt = 0; attempt < 5 && !left[0]; attempt++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            size_t n = 64 << 20;
            char *big = calloc(1, n);
            for (;;) mg_write_file_atomic(p, big, n);
        }
        char *out = NULL;
        for (double t0 = mg_now(); mg_now() - t0 < 30; usleep(1000)) {
            free(out);
            mgt_sh(&out, "ls %s | grep -x 'ck.st.tmp.......'", mgt_tmpdir());
            if (*out) break;
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        free(out);
        mgt_sh(&out, "ls %s | grep -x 'ck.st.tmp.......'", mgt_tmpdir());
        if (*out) snprintf(left, sizeof left, "%s/%.*s", mgt_tmpdir(), (int)strcspn(out, "\n"),
                           out);
        free(out);
    }
    CHECK_MSG(left[0], "no temporary file was left");
    /* Look-alikes that are not ours to remove. */
    const char *kept[] = {"ck.st.tmp.keep", "ck.st.tmp.AbC1234", "other.st.tmp.AbC123",
                          "ck.st.tmp.Dir001", "ck.st.tmp.Link01", "ck.st.tmp.Theirs",
                          "ck.st.tmp.Locked"};
    touch(tpath("%s", kept[0]));
    touch(tpath("%s", kept[1]));
    touch(tpath("%s", kept[2]));
    CHECK(mkdir(tpath("%s", kept[3]), 0700) == 0);
    CHECK(symlink(left, tpath("%s", kept[4])) == 0);
    touch(tpath("%s", kept[5]));
    CHECK(chown(tpath("%s", kept[5]), 65534, 65534) == 0 || geteuid() != 0);
    if (geteuid() != 0) unlink(tpath("%s", kept[5]));
    touch(tpath("%s", kept[6]));                /* a live writer holds its lock */
    int lfd = open(tpath("%s", kept[6]), O_RDONLY);
    CHECK(lfd >= 0 && flock(lfd, LOCK_EX) == 0);
    touch(tpath("ck.st.tmp.Stale9"));          /* another leftover of ours */

    CHECK_OK(mg_write_file_atomic(p, "whole", 5));
    CHECK_MSG(!exists(left), "%s left behind", left);
    CHECK(!exists(tpath("ck.st.tmp.Stale9")));
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        CHECK_MSG(exists(tpath("%s", kept[i])) || (i == 5 && geteuid() != 0),
                  "%s was removed", kept[i]);
    close(lfd);
    char *s = mgt_slurp(p, NULL);
    CHECK(strcmp(s, "whole") == 0);
    free(s);
}

/* A tiny 28x28 data set in tmpdir/data (made once per test). */
static const char *tiny_data(void)
{
    const char *dir = tpath("data");
    if (!exists(dir)) {
        CHECK(mkdir(dir, 0755) == 0);
        mgt_make_dataset(dir, "train", 64, 28, 28, 64, -1);
        mgt_make_dataset(dir, "t10k", 32, 28, 28, 32, -1);
    }
    return dir;
}

TEST_T(inputs_mgtrain_checks_outputs_before_any_work, 120)
{
    char data[600], flags[2048];
    snprintf(data, sizeof data, "%s", tiny_data());
    CHECK(mkdir(tpath("adir"), 0755) == 0);
    CHECK(mkdir(tpath("plot.svg"), 0755) == 0);
    CHECK(mkfifo(tpath("fifo.csv"), 0600) == 0);
    const struct { const char *flag, *name, *says; } bad[] = {
        {"--save", "nodir/x.st", "nodir/x.st"},
        {"--save", "adir", "directory"},
        {"--log", "nodir/log.csv", "nodir/log.csv"},
        {"--log", "adir", "directory"},
        {"--log", "plot.csv", "plot.svg"},       /* the plot next to it cannot be written */
        {"--log", "fifo.csv", "FIFO"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* Without the check, the run trained an epoch before it found out. */
        snprintf(flags, sizeof flags, "--model mlp --data %s --batch 16 --epochs 2 %s %s",
                 data, bad[i].flag, tpath("%s", bad[i].name));
        expect_refused(flags, bad[i].flag, bad[i].says, NULL);
        snprintf(flags, sizeof flags, "--model gpt-mini --layers 1 --dim 16 --heads 2 --ctx 8 "
                 "--data %s --steps 4 --eval-every 2 %s %s", "README.md",
                 bad[i].flag, tpath("%s", bad[i].name));
        expect_refused(flags, bad[i].flag, bad[i].says, NULL);
    }
    CHECK(!exists(tpath("nodir")));
}

/* A log on a file system that fills mid-run: one line naming --log and
 * the log's own path (it named the temporary file beside it and no flag;
 * a probe), exit status 2; a checkpoint that cannot fit, before training. As root, in a mount namespace of its own with a
 * tmpfs of 8 KiB; skipped otherwise. */
TEST_T(inputs_mgtrain_full_disk_names_the_log, 120)
{
    if (geteuid() != 0 || mgt_sh(NULL, "unshare --mount true") != 0)
        mgt_skip("needs root and unshare (a small file system of the test's own)");
    const char *dir = tpath("small");
    CHECK(mkdir(dir, 0755) == 0);
    char *out;
    int rc = mgt_sh(&out, "unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=8k "
                    "tmpfs %s && %s --model gpt-mini --layers 1 --dim 16 --heads 2 --ctx 8 "
                    "--steps 400 --eval-every 2 --eval-windows 2 --log %s/l.csv'", dir,
                    mgt_tool("mgtrain"), dir);
    CHECK_MSG(rc == 2 && strstr(out, "mgtrain: --log: cannot write ") &&
              strstr(out, "No space left") && !strstr(out, ".tmp.") &&
              !strstr(out, "step   400/400"), "rc %d: %s", rc, out);
    free(out);
    /* A checkpoint that cannot fit is said before training (it was found
     * at the first save) */
    rc = mgt_sh(&out, "unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=8k "
                "tmpfs %s && %s --model gpt-mini --layers 1 --dim 16 --heads 2 --ctx 8 "
                "--steps 400 --eval-every 200 --save %s/ck.st'", dir, mgt_tool("mgtrain"), dir);
    CHECK_MSG(rc == 2 && strstr(out, "its file system has") && !strstr(out, "step "),
              "rc %d: %s", rc, out);
    free(out);
}

/* Another user's file in a sticky directory (/tmp) cannot be replaced: the
 * check made a file beside it and passed, and the run trained until its
 * first save or log row (a probe). As a user other than the file's (root
 * may replace it), so as root through setpriv; skipped without them. */
TEST_T(inputs_mgtrain_refuses_outputs_a_sticky_directory_keeps, 120)
{
    if (geteuid() != 0 || mgt_sh(NULL, "command -v setpriv") != 0)
        mgt_skip("needs root and setpriv (to run mgtrain as nobody beside root's file)");
    if (mgt_sh(NULL, "setpriv --reuid=nobody --regid=nogroup --clear-groups test -x %s",
               mgt_tool("mgtrain")) != 0)
        mgt_skip("user nobody cannot run %s (a directory above it is closed)",
                 mgt_tool("mgtrain"));
    char dir[] = "/tmp/mgtest-sticky-XXXXXX", file[64], *out;
    CHECK(mkdtemp(dir) != NULL);
    CHECK(chmod(dir, 01777) == 0);
    snprintf(file, sizeof file, "%s/ck.st", dir);
    touch(file);
    const char *flags[] = {"--save", "--log"};
    for (int i = 0; i < 2; i++) {
        int rc = mgt_sh(&out, "setpriv --reuid=nobody --regid=nogroup --clear-groups %s --model "
                        "gpt-mini --layers 1 --dim 16 --heads 2 --ctx 8 --steps 4 --eval-every 2 "
                        "%s %s", mgt_tool("mgtrain"), flags[i], file);
        CHECK_MSG(rc == 2 && strstr(out, "belongs to another user in a sticky directory") &&
                  !strstr(out, "step ") && mgt_count(out, "\n") == 1, "%s: rc %d: %s",
                  flags[i], rc, out);
        free(out);
    }
    mgt_sh(NULL, "rm -rf %s", dir);
}

/* The call in a child that must return within 20 s (a FIFO opened for
 * reading blocks until a writer comes, which is never). */
static void within_20s(void (*fn)(void))
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(20);
        fn();
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the call %s",
              WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? "hung on the FIFO"
                                                                 : "failed");
}

static void load_fifos(void)
{
    const char *fifo = tpath("fifo");
    mg_st_file *f;
    CHECK_ERR(mg_st_open(fifo, &f), MG_EIO);
    CHECK(strstr(mg_last_error(), "FIFO") && strstr(mg_last_error(), fifo));
    mg_idx x;
    CHECK_ERR(mg_idx_load(fifo, &x), MG_EIO);
    CHECK(strstr(mg_last_error(), "FIFO") && strstr(mg_last_error(), fifo));
    mg_dataset *ds;
    CHECK_ERR(mg_dataset_load(tpath("fdata"), true, &ds), MG_EIO);
    CHECK(strstr(mg_last_error(), "FIFO") && strstr(mg_last_error(), "train-labels"));
}

TEST_T(inputs_fifos_are_refused_not_waited_for, 120)
{
    CHECK(mkfifo(tpath("fifo"), 0600) == 0);
    CHECK(mkdir(tpath("fdata"), 0755) == 0);
    mgt_make_dataset(tpath("fdata"), "train", 8, 28, 28, 8, -1);
    CHECK(unlink(tpath("fdata/train-labels-idx1-ubyte")) == 0);
    CHECK(mkfifo(tpath("fdata/train-labels-idx1-ubyte"), 0600) == 0);
    within_20s(load_fifos);
    /* And through mgtrain: a checkpoint, weights, a data set. */
    char flags[2048], fifo[600], fdata[600];
    snprintf(fifo, sizeof fifo, "%s", tpath("fifo"));
    snprintf(fdata, sizeof fdata, "%s", tpath("fdata"));
    const char *cases[][2] = {{"--resume", fifo}, {"--init", fifo}, {"--data", fdata}};
    for (int i = 0; i < 3; i++) {
        snprintf(flags, sizeof flags, "--model mlp --epochs 1 --batch 16 %s %s", cases[i][0],
                 cases[i][1]);
        const char *argv[16] = {mgt_tool("mgtrain"), "--model", "mlp", "--epochs", "1",
                                cases[i][0], cases[i][1], NULL};
        mgt_result *r = mgt_exec(30, argv, NULL);
        CHECK_MSG(mgt_exit_code(r) == 2 && strstr(r->err, "FIFO") && mgt_count(r->err, "\n") == 1,
                  "%s: exit %d: %s", flags, mgt_exit_code(r), r->err);
    }
}

TEST(inputs_idx_headers_are_compared_before_the_data_is_read)
{
    /* A gzip image file whose header announces 1 GiB (1024 images of
     * 1024x1024) over 1 MB of data, and 10 labels: refused on the headers,
     * before any image data is inflated. */
    const char *dir = mgt_tmpdir();
    const uint32_t dims[3] = {1024, 1024, 1024};
    size_t body = 1 << 20;
    uint8_t *buf = calloc(1, 16 + body);
    mgt_make_idx(buf, 0x803, 3, dims, -(long)(1024L * 1024 * 1024));
    mgt_write_bytes(tpath("train-images-idx3-ubyte.gz"), buf, 16 + body, true);
    free(buf);
    uint8_t lb[8 + 10];
    mgt_write_bytes(tpath("train-labels-idx1-ubyte"), lb,
                    mgt_make_idx(lb, 0x801, 1, (const uint32_t[]){10}, 0), false);
    mg_dataset *ds;
    CHECK_ERR(mg_dataset_load(dir, true, &ds), MG_EFORMAT);
    printf("%s\n", mg_last_error());
    CHECK_MSG(strstr(mg_last_error(), "expected 1024 labels") &&
              strstr(mg_last_error(), "train-labels"), "%s", mg_last_error());
    /* The header alone. */
    mg_idx h;
    CHECK_OK(mg_idx_load_header(tpath("train-images-idx3-ubyte.gz"), &h));
    CHECK(h.ndim == 3 && h.dims[0] == 1024 && h.size == 1u << 30 && h.data == NULL);
}
