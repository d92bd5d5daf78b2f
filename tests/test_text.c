/* Tests of src/data/text.c: the default fortunes corpus (size, sha256 and
 * split of Debian 12's package; the package must be installed), batch
 * offsets (range, determinism per (seed, step)), the one-byte shift of
 * targets, ranks' rows r::W against the one-process batch, validation
 * windows, user directories (sorted, hidden and non-regular entries
 * skipped) and single files, and every error: missing, empty, unreadable
 * and vanished files, empty directories, too-short and too-large corpora.
 * Corpora are generated here at run time. */
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include "harness.h"
#include "data/text_internal.h"
#include "multigrad/data.h"

static const char *tmppath(const char *name)
{
    static char path[4][512];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 512, "%s/%s", mgt_tmpdir(), name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot create %s", path);
    CHECK(n == 0 || fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

/* n pseudo-random bytes (every value occurs), seeded. */
static uint8_t *random_bytes(size_t n, uint64_t seed)
{
    uint8_t *b = malloc(n ? n : 1);
    CHECK(b != NULL);
    mg_rng r;
    mg_rng_init(&r, seed);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)mg_rng_u32(&r);
    return b;
}

/* A single-file corpus of n random bytes, opened with context ctx. */
static mg_text *random_corpus(const char *name, size_t n, int ctx, uint8_t **bytes)
{
    uint8_t *b = random_bytes(n, n);
    write_bytes(tmppath(name), b, n);
    mg_text *t;
    CHECK_OK(mg_text_open(tmppath(name), ctx, &t));
    CHECK(mg_text_size(t) == n && memcmp(mg_text_bytes(t), b, n) == 0);
    if (bytes) *bytes = b; else free(b);
    return t;
}

/* mg_last_error() names `path` and holds `needle` (when not NULL). */
static void check_msg(const char *path, const char *needle)
{
    const char *m = mg_last_error();
    printf("%s\n", m);
    CHECK_MSG(strstr(m, path) != NULL, "error does not name %s: %s", path, m);
    CHECK_MSG(!needle || strstr(m, needle), "'%s' lacks '%s'", m, needle);
}

TEST_T(text_default_fortunes_size_sha256_split, 60)
{
    mg_text *t;
    mg_status st = mg_text_open(NULL, 128, &t);
    CHECK_MSG(st == MG_OK, "the default text corpus (Debian's fortunes package) is needed: run "
              "scripts/install-deps.sh (as root). %s: %s", mg_status_name(st), mg_last_error());
    CHECK_EQ(mg_text_num_files(t), MG__TEXT_NUM_DEFAULT);
    CHECK_EQ(mg_text_size(t), 2478275);
    CHECK_EQ(mg_text_train_size(t), 2230447);
    CHECK_EQ(mg_text_val_size(t), 247828);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    CHECK(EVP_Digest(mg_text_bytes(t), mg_text_size(t), md, &mdlen, EVP_sha256(), NULL) == 1);
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    for (unsigned i = 0; i < mdlen; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    CHECK_MSG(strcmp(hex, "2fc106f17c1d1059a2883c69171a75c17df0d426ae6c3de824cca88b787dcc8b")
              == 0, "sha256 %s: not Debian 12's fortunes 1:1.99.1-7.3", hex);
    /* The first bytes are the first file's (art). */
    char path[256];
    snprintf(path, sizeof path, "%s/art", MG__TEXT_DEFAULT_DIR);
    size_t len;
    char *art = mgt_slurp(path, &len);
    CHECK(len == 85327 && memcmp(art, mg_text_bytes(t), len) == 0);
    free(art);

    /* 512 validation windows at T = 128 (and at 64); their contents. */
    CHECK_EQ(mg_text_val_windows(t, 128), 512);
    CHECK_EQ(mg_text_val_windows(t, 64), 512);
    CHECK_EQ(mg_text_val_windows(t, 1024), 242);             /* 247827 / 1024 */
    static int32_t x[4 * 128], y[4 * 128];
    const uint8_t *val = mg_text_bytes(t) + mg_text_train_size(t);
    mg_text_val_batch(t, 128, 508, 4, x, y);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 128; j++) {
            CHECK_EQ(x[i * 128 + j], val[(508 + i) * 128 + j]);
            CHECK_EQ(y[i * 128 + j], val[(508 + i) * 128 + j + 1]);
        }
    mg_text_close(t);
}

TEST(text_batch_offsets_range_and_determinism)
{
    enum { B = 64 };
    int64_t a[B], b[B], c[B];
    const size_t n_trains[] = {2230447, 1000, 130, 129};
    for (int k = 0; k < 4; k++) {
        size_t n = n_trains[k];
        int T = 128;
        bool differ_step = false, differ_seed = false;
        for (uint64_t step = 0; step < 50; step++) {
            mg_text_batch_offsets(7, step, n, B, T, a);
            mg_text_batch_offsets(7, step, n, B, T, b);
            CHECK(memcmp(a, b, sizeof a) == 0);
            for (int i = 0; i < B; i++)
                CHECK_MSG(a[i] >= 0 && a[i] <= (int64_t)(n - T - 1), "offset %lld outside "
                          "[0, %zu]", (long long)a[i], n - T - 1);
            mg_text_batch_offsets(7, step + 1, n, B, T, c);
            differ_step |= memcmp(a, c, sizeof a) != 0;
            mg_text_batch_offsets(8, step, n, B, T, c);
            differ_seed |= memcmp(a, c, sizeof a) != 0;
        }
        CHECK_MSG(differ_step == (n > 129) && differ_seed == (n > 129), "n_train %zu", n);
    }
    /* Another step of the real size gives another batch; the ends of the
     * range are reached and the draws are roughly uniform. */
    mg_text_batch_offsets(0, 0, 2230447, B, 128, a);
    mg_text_batch_offsets(0, 1, 2230447, B, 128, b);
    CHECK(memcmp(a, b, sizeof a) != 0);
    int hist[10] = {0};
    for (uint64_t step = 0; step < 1000; step++) {
        mg_text_batch_offsets(3, step, 138, B, 128, a);      /* offsets 0..9 */
        for (int i = 0; i < B; i++) hist[a[i]]++;
    }
    for (int v = 0; v < 10; v++)
        CHECK_MSG(hist[v] > 6400 * 0.9 && hist[v] < 6400 * 1.1, "offset %d drawn %d times of "
                  "64000", v, hist[v]);
}

TEST(text_batch_shift_ranks_and_offsets)
{
    uint8_t *b;
    enum { T = 16 };
    mg_text *t = random_corpus("c.bin", 5000, T, &b);
    CHECK_EQ(mg_text_train_size(t), 4500);
    const int Bs[] = {12, 13};
    for (int k = 0; k < 2; k++) {
        int B = Bs[k];
        int64_t off[13];
        static int32_t x[13 * T], y[13 * T], xr[13 * T], yr[13 * T];
        for (uint64_t step = 0; step < 5; step++) {
            mg_text_batch_offsets(11, step, mg_text_train_size(t), B, T, off);
            CHECK_EQ(mg_text_batch(t, 11, step, 0, B, T, 0, 1, x, y), B);
            for (int i = 0; i < B; i++)
                for (int j = 0; j < T; j++) {
                    CHECK_EQ(x[i * T + j], b[off[i] + j]);
                    CHECK_EQ(y[i * T + j], b[off[i] + j + 1]);
                    if (j < T - 1) CHECK_EQ(y[i * T + j], x[i * T + j + 1]);
                }
            static int32_t xa[13 * T], ya[13 * T];
            mg_text_batch_at(t, off, B, T, xa, ya);
            CHECK(memcmp(xa, x, sizeof(int32_t) * B * T) == 0);
            CHECK(memcmp(ya, y, sizeof(int32_t) * B * T) == 0);
            /* Ranks r of W: rows r::W, together the one-process batch. */
            for (int W = 2; W <= 3; W++) {
                int total = 0;
                for (int r = 0; r < W; r++) {
                    int rows = mg_text_batch(t, 11, step, 0, B, T, r, W, xr, yr);
                    CHECK_EQ(rows, (B - r + W - 1) / W);
                    for (int i = 0; i < rows; i++) {
                        int g = r + i * W;
                        CHECK(memcmp(xr + i * T, x + g * T, sizeof(int32_t) * T) == 0);
                        CHECK(memcmp(yr + i * T, y + g * T, sizeof(int32_t) * T) == 0);
                    }
                    total += rows;
                }
                CHECK_EQ(total, B);
            }
            /* Micro-batch j of m rows is rows [j m, (j + 1) m) of the same
             * draw, on one rank or split over 2: --accumulate and a
             * pipeline's micro-batches take the global batch's rows. */
            for (int m = 1; m <= 4; m++)
                for (int j = 0; j * m + m <= B; j++)
                    for (int W = 1; W <= 2; W++)
                        for (int r = 0; r < W; r++) {
                            int rows = mg_text_batch(t, 11, step, j * m, m, T, r, W, xr, yr);
                            CHECK_EQ(rows, (m - r + W - 1) / W);
                            for (int i = 0; i < rows; i++)
                                CHECK(memcmp(xr + i * T, x + (j * m + r + i * W) * T,
                                             sizeof(int32_t) * T) == 0);
                        }
        }
    }
    /* The last allowed offset reaches the training split's last byte. */
    int64_t last = (int64_t)mg_text_train_size(t) - T - 1;
    int32_t x[T], y[T];
    mg_text_batch_at(t, &last, 1, T, x, y);
    CHECK_EQ(y[T - 1], b[mg_text_train_size(t) - 1]);
    mg_text_close(t);
    free(b);
}

TEST(text_val_windows_count_and_contents)
{
    uint8_t *b;
    mg_text *t = random_corpus("v.bin", 1000, 8, &b);       /* 900 train, 100 val */
    CHECK_EQ(mg_text_val_size(t), 100);
    CHECK_EQ(mg_text_val_windows(t, 8), 12);                 /* 99 / 8 */
    CHECK_EQ(mg_text_val_windows(t, 9), 11);                 /* 99 / 9: the last ends at 99 */
    CHECK_EQ(mg_text_val_windows(t, 99), 1);
    CHECK_EQ(mg_text_val_windows(t, 100), 0);
    CHECK_EQ(mg_text_val_windows(t, 1), 99);
    int32_t x[11 * 9], y[11 * 9];
    mg_text_val_batch(t, 9, 0, 11, x, y);
    for (int i = 0; i < 11; i++)
        for (int j = 0; j < 9; j++) {
            CHECK_EQ(x[i * 9 + j], b[900 + i * 9 + j]);
            CHECK_EQ(y[i * 9 + j], b[900 + i * 9 + j + 1]);
        }
    mg_text_val_batch(t, 8, 11, 1, x, y);
    CHECK(x[0] == b[988] && y[7] == b[996]);
    mg_text_close(t);
    free(b);
    /* 512 at most. */
    t = random_corpus("w.bin", 100000, 8, NULL);             /* 10000 val bytes */
    CHECK_EQ(mg_text_val_windows(t, 8), 512);
    CHECK_EQ(mg_text_val_windows(t, 32), 312);
    mg_text_close(t);
}

TEST(text_user_directory_sorted_and_single_file)
{
    const char *dir = tmppath("corpus");
    CHECK(mkdir(dir, 0755) == 0);
    /* strcmp order: B < a < a.txt < b < c (a link to a) < e (empty); the
     * hidden file and the subdirectory are skipped. */
    const char *names[] = {"b", "a.txt", "B", "a", ".hidden", "e"};
    const char *texts[] = {"bbbb\n", "a.txt\n", "BIG\n", "aaa\n", "hidden\n", ""};
    char path[600];
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        write_bytes(path, texts[i], strlen(texts[i]));
    }
    snprintf(path, sizeof path, "%s/sub", dir);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s/sub/x", dir);
    write_bytes(path, "sub\n", 4);
    snprintf(path, sizeof path, "%s/c", dir);
    CHECK(symlink("a", path) == 0);
    const char *want = "BIG\naaa\na.txt\nbbbb\naaa\n";
    mg_text *t;
    CHECK_OK(mg_text_open(dir, 1, &t));
    CHECK_EQ(mg_text_num_files(t), 6);
    CHECK_EQ(mg_text_size(t), strlen(want));
    CHECK(memcmp(mg_text_bytes(t), want, strlen(want)) == 0);
    CHECK_EQ(mg_text_train_size(t), 20);                     /* floor(0.9 * 23) */
    CHECK_EQ(mg_text_val_size(t), 3);
    mg_text_close(t);
    /* A trailing slash names the same directory. */
    snprintf(path, sizeof path, "%s/", dir);
    CHECK_OK(mg_text_open(path, 1, &t));
    CHECK_EQ(mg_text_size(t), strlen(want));
    mg_text_close(t);

    /* A single file (hidden names are fine when named). */
    uint8_t *b = random_bytes(3000, 5);
    write_bytes(tmppath(".single"), b, 3000);
    CHECK_OK(mg_text_open(tmppath(".single"), 64, &t));
    CHECK(mg_text_num_files(t) == 1 && mg_text_size(t) == 3000);
    CHECK(mg_text_train_size(t) == 2700 && mg_text_val_size(t) == 300);
    CHECK(memcmp(mg_text_bytes(t), b, 3000) == 0);
    mg_text_close(t);
    mg_text_close(NULL);
    free(b);
}

TEST(text_errors_name_the_path_and_fix)
{
    mg_text *t = (mg_text *)1;
    /* A missing --data path. */
    CHECK_ERR(mg_text_open("/nonexistent/corpus.txt", 8, &t), MG_EIO);
    CHECK(t == NULL);
    check_msg("/nonexistent/corpus.txt", "scripts/install-deps.sh");
    CHECK(strstr(mg_last_error(), "--data DIR|FILE"));
    CHECK_ERR(mg_text_open("/dev/null", 8, &t), MG_EINVAL);  /* not a file or directory */
    check_msg("/dev/null", "--data");

    /* The default set in a directory missing a file, or with an empty one. */
    const char *dd = tmppath("fortunes");
    CHECK(mkdir(dd, 0755) == 0);
    char path[600];
    for (int i = 0; i < MG__TEXT_NUM_DEFAULT; i++) {
        if (i == 17) continue;                               /* linuxcookie */
        snprintf(path, sizeof path, "%s/%s", dd, mg__text_default_files[i]);
        write_bytes(path, "%\nA fortune.\n", 13);
    }
    char **files = (char **)1;
    int n = -1;
    CHECK_ERR(mg__text_list(NULL, dd, &files, &n), MG_EIO);
    CHECK(files == NULL && n == 0);
    snprintf(path, sizeof path, "%s/linuxcookie", dd);
    check_msg(path, "install Debian's fortunes package: scripts/install-deps.sh, or pass "
              "--data DIR|FILE");
    write_bytes(path, "", 0);
    CHECK_OK(mg__text_list(NULL, dd, &files, &n));
    CHECK_EQ(n, MG__TEXT_NUM_DEFAULT);
    CHECK_ERR(mg__text_load(dd, files, n, true, 8, &t), MG_EFORMAT);
    check_msg(path, "empty");
    write_bytes(path, "%\nAnother one.\n", 15);
    CHECK_OK(mg__text_load(dd, files, n, true, 8, &t));
    CHECK_EQ(mg_text_size(t), 39 * 13 + 15);
    mg_text_close(t);

    /* A file listed, then removed before it is read. */
    snprintf(path, sizeof path, "%s/%s", dd, mg__text_default_files[5]);
    CHECK(unlink(path) == 0);
    CHECK_ERR(mg__text_load(dd, files, n, true, 8, &t), MG_EIO);
    check_msg(path, "No such file");
    CHECK(t == NULL);
    mg__text_free_list(files, n);
    CHECK_OK(mg__text_list(dd, NULL, &files, &n));           /* as a user directory */
    CHECK_EQ(n, MG__TEXT_NUM_DEFAULT - 1);
    CHECK(unlink(files[3]) == 0);
    CHECK_ERR(mg__text_load(dd, files, n, false, 8, &t), MG_EIO);
    check_msg(files[3], "No such file");
    mg__text_free_list(files, n);

    /* A directory without files (hidden ones and subdirectories only). */
    const char *ed = tmppath("empty");
    CHECK(mkdir(ed, 0755) == 0);
    snprintf(path, sizeof path, "%s/.hidden", ed);
    write_bytes(path, "hidden text\n", 12);
    snprintf(path, sizeof path, "%s/sub", ed);
    CHECK(mkdir(path, 0755) == 0);
    CHECK_ERR(mg_text_open(ed, 8, &t), MG_EINVAL);
    check_msg(ed, "no files");

    /* Unreadable: a read error (/proc/self/mem at address 0), a dangling
     * link, and (unless root, who reads anyway) a file without permission. */
    CHECK_ERR(mg_text_open("/proc/self/mem", 8, &t), MG_EIO);
    check_msg("/proc/self/mem", "read error");
    const char *ud = tmppath("unreadable");
    CHECK(mkdir(ud, 0755) == 0);
    snprintf(path, sizeof path, "%s/gone", ud);
    CHECK(symlink("/nonexistent/target", path) == 0);
    CHECK_ERR(mg_text_open(ud, 8, &t), MG_EIO);
    check_msg(path, NULL);
    if (geteuid() != 0) {
        write_bytes(tmppath("secret"), "0123456789012345678901234567890123456789", 40);
        CHECK(chmod(tmppath("secret"), 0) == 0);
        CHECK_ERR(mg_text_open(tmppath("secret"), 8, &t), MG_EIO);
        check_msg(tmppath("secret"), "Permission denied");
    }

    /* Too short for one window: training split (n_train < T + 2), then
     * validation split (n_val < T + 1). 100 bytes: 90 train, 10 val. */
    uint8_t *b = random_bytes(100, 1);
    write_bytes(tmppath("short"), b, 100);
    CHECK_OK(mg_text_open(tmppath("short"), 9, &t));         /* 90 >= 11, 10 >= 10 */
    mg_text_close(t);
    CHECK_ERR(mg_text_open(tmppath("short"), 10, &t), MG_EINVAL);
    check_msg(tmppath("short"), "smaller --ctx or more text");
    CHECK(strstr(mg_last_error(), "90 training") && strstr(mg_last_error(), "10 validation"));
    write_bytes(tmppath("short"), b, 20);                     /* 18 train, 2 val */
    CHECK_ERR(mg_text_open(tmppath("short"), 17, &t), MG_EINVAL);
    check_msg(tmppath("short"), "--ctx");
    CHECK_OK(mg_text_open(tmppath("short"), 1, &t));
    mg_text_close(t);
    write_bytes(tmppath("short"), b, 0);
    CHECK_ERR(mg_text_open(tmppath("short"), 1, &t), MG_EINVAL);
    check_msg(tmppath("short"), "0 bytes");
    CHECK_ERR(mg_text_open(tmppath("short"), 0, &t), MG_EINVAL);
    check_msg(tmppath("short"), "context 0");
    free(b);

    /* Over 2 GiB (a sparse file: refused before anything is allocated). */
    const char *big = tmppath("big");
    int fd = open(big, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, ((off_t)1 << 31) + 1) == 0);
    close(fd);
    CHECK_ERR(mg_text_open(big, 128, &t), MG_EINVAL);
    check_msg(big, "2 GiB");
    CHECK(t == NULL);
}
