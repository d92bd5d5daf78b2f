/* Tests of src/data: the IDX reader (good plain and gzip files; truncated,
 * wrong-magic, oversized, trailing and garbage files), data sets (errors
 * naming the file; the real Fashion-MNIST), the input scalings (bit-exact
 * against PyTorch's first batch in tests/data/lenet5.safetensors) and the
 * background loader. Bad files are generated here at run time. */
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include "harness.h"
#include "multigrad/checkpoint.h"
#include "multigrad/data.h"
#include "idx_files.h"

static const char *tmpfile_(const char *name)
{
    static char path[4][512];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 512, "%s/%s", mgt_tmpdir(), name);
    return p;
}

TEST(data_idx_good_plain_and_gzip)
{
    static uint8_t buf[4096];
    const uint32_t dims[3] = {5, 3, 2};
    size_t n = mgt_make_idx(buf, 0x803, 3, dims, 0);
    for (int gz = 0; gz < 2; gz++) {
        const char *p = tmpfile_(gz ? "a.idx.gz" : "a.idx");
        mgt_write_bytes(p, buf, n, gz);
        mg_idx x;
        CHECK_OK(mg_idx_load(p, &x));
        CHECK_EQ(x.ndim, 3);
        CHECK(x.dims[0] == 5 && x.dims[1] == 3 && x.dims[2] == 2);
        CHECK_EQ(x.size, 30);
        for (size_t i = 0; i < 30; i++) CHECK_EQ(x.data[i], (uint8_t)(i * 7 + 3));
        mg_idx_free(&x);
        CHECK(x.data == NULL);
    }
    /* Labels (1 dimension) and the 4-dimension maximum. */
    const uint32_t d1[1] = {7}, d4[4] = {2, 1, 3, 2};
    n = mgt_make_idx(buf, 0x801, 1, d1, 0);
    mgt_write_bytes(tmpfile_("l.idx"), buf, n, false);
    mg_idx x;
    CHECK_OK(mg_idx_load(tmpfile_("l.idx"), &x));
    CHECK(x.ndim == 1 && x.size == 7 && x.data[6] == 45);
    mg_idx_free(&x);
    n = mgt_make_idx(buf, 0x804, 4, d4, 0);
    mgt_write_bytes(tmpfile_("4.idx.gz"), buf, n, true);
    CHECK_OK(mg_idx_load(tmpfile_("4.idx.gz"), &x));
    CHECK(x.ndim == 4 && x.size == 12 && x.dims[3] == 2);
    mg_idx_free(&x);
}

static void expect_bad(const char *name, const void *data, size_t n, bool gz, mg_status code,
                       const char *needle)
{
    const char *p = tmpfile_(name);
    mgt_write_bytes(p, data, n, gz);
    mg_idx x = {.ndim = 9};
    mg_status st = mg_idx_load(p, &x);
    printf("%s: %s\n", name, mg_last_error());
    CHECK_MSG(st == code, "%s: got %s (%s), expected %s", name, mg_status_name(st),
              mg_last_error(), mg_status_name(code));
    CHECK_MSG(strstr(mg_last_error(), p) != NULL, "%s: error does not name the file: %s",
              name, mg_last_error());
    CHECK_MSG(!needle || strstr(mg_last_error(), needle), "%s: '%s' lacks '%s'", name,
              mg_last_error(), needle);
    CHECK(x.data == NULL && x.ndim == 0);
}

TEST(data_idx_truncated_and_trailing)
{
    static uint8_t buf[4096];
    const uint32_t dims[3] = {5, 3, 2};
    for (int gz = 0; gz < 2; gz++) {
        size_t n = mgt_make_idx(buf, 0x803, 3, dims, -1);
        expect_bad(gz ? "t1.gz" : "t1", buf, n, gz, MG_EFORMAT, "truncated");
        n = mgt_make_idx(buf, 0x803, 3, dims, 0);
        expect_bad(gz ? "t2.gz" : "t2", buf, 10, gz, MG_EFORMAT, "truncated");  /* in the header */
        expect_bad(gz ? "t3.gz" : "t3", buf, 2, gz, MG_EFORMAT, NULL);
        expect_bad(gz ? "t4.gz" : "t4", buf, 0, gz, MG_EFORMAT, NULL);
        n = mgt_make_idx(buf, 0x803, 3, dims, 1);
        expect_bad(gz ? "t5.gz" : "t5", buf, n, gz, MG_EFORMAT, "trailing");
    }
    /* A gzip stream cut short (its trailer and part of the data gone). */
    size_t n = mgt_make_idx(buf, 0x803, 3, (const uint32_t[]){40, 10, 10}, 0);
    const char *p = tmpfile_("full.gz");
    mgt_write_bytes(p, buf, n, true);
    static uint8_t gzbuf[8192];
    FILE *f = fopen(p, "rb");
    size_t gn = fread(gzbuf, 1, sizeof gzbuf, f);
    fclose(f);
    CHECK(gn > 30);
    expect_bad("cut.gz", gzbuf, gn - 12, false, MG_EFORMAT, NULL);
    /* A flipped byte inside the compressed data: damaged stream or CRC. */
    gzbuf[gn / 2] ^= 0x55;
    expect_bad("flip.gz", gzbuf, gn, false, MG_EFORMAT, NULL);
}

TEST(data_idx_wrong_magic_and_garbage)
{
    static uint8_t buf[4096];
    const uint32_t dims[3] = {5, 3, 2};
    size_t n = mgt_make_idx(buf, 0x903, 3, dims, 0);             /* signed bytes */
    expect_bad("m1", buf, n, false, MG_EFORMAT, "0x09");
    n = mgt_make_idx(buf, 0x0d03, 3, dims, 0);                   /* float32 */
    expect_bad("m2", buf, n, true, MG_EFORMAT, "0x00000d03");
    n = mgt_make_idx(buf, 0x01000803, 3, dims, 0);
    expect_bad("m3", buf, n, false, MG_EFORMAT, "magic");
    n = mgt_make_idx(buf, 0x800, 0, dims, 0);                    /* 0 dimensions */
    expect_bad("m4", buf, n, false, MG_EFORMAT, "magic");
    n = mgt_make_idx(buf, 0x805, 3, dims, 0);                    /* 5 dimensions */
    expect_bad("m5", buf, n, false, MG_EFORMAT, "magic");
    const char text[] = "this is not an IDX file, just some text\n";
    expect_bad("g1", text, sizeof text - 1, false, MG_EFORMAT, NULL);
    for (size_t i = 0; i < 1000; i++) buf[i] = (uint8_t)((i * 2654435761u) >> 13);
    expect_bad("g2", buf, 1000, false, MG_EFORMAT, NULL);
    buf[0] = 0x1f; buf[1] = 0x8b;                            /* gzip magic, then garbage */
    expect_bad("g3", buf, 1000, false, MG_EFORMAT, NULL);
    mg_idx x;
    CHECK_ERR(mg_idx_load(tmpfile_("does-not-exist"), &x), MG_EIO);
    CHECK(strstr(mg_last_error(), "does-not-exist"));
}

TEST(data_idx_oversized_dimensions)
{
    static uint8_t buf[4096];
    /* 4 GiB, 1 GiB + 1 and an overflowing product: refused before any
     * allocation (the file itself is small). */
    const uint32_t d1[2] = {65536, 65536}, d2[3] = {1024, 1024, 1025},
                   d3[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 2};
    size_t n = mgt_make_idx(buf, 0x802, 2, d1, -(long)(65536ull * 65536));
    expect_bad("o1", buf, n, false, MG_EFORMAT, "larger than");
    n = mgt_make_idx(buf, 0x803, 3, d2, -(long)(1024 * 1024 * 1025));
    expect_bad("o2", buf, n, true, MG_EFORMAT, "larger than");
    size_t hdr = 4 + 16;
    n = mgt_make_idx(buf, 0x804, 4, (const uint32_t[]){1, 1, 1, 1}, -1);
    for (int d = 0; d < 4; d++)
        for (int b = 0; b < 4; b++) buf[4 + 4 * d + b] = (uint8_t)(d3[d] >> (8 * (3 - b)));
    CHECK_EQ(n, hdr);
    expect_bad("o3", buf, n, false, MG_EFORMAT, "larger than");
    /* Exactly 1 GiB is allowed by the bound; this one is only truncated. */
    const uint32_t d4[3] = {1024, 1024, 1024};
    n = mgt_make_idx(buf, 0x803, 3, d4, -(long)(1024 * 1024 * 1024));
    expect_bad("o4", buf, n, false, MG_EFORMAT, "truncated");
}

TEST(data_dataset_errors_name_file_and_fix)
{
    const char *dir = mgt_tmpdir();
    mg_dataset *ds = (mg_dataset *)1;
    CHECK_ERR(mg_dataset_load("/nonexistent/fashion", true, &ds), MG_EIO);
    CHECK(ds == NULL);
    CHECK(strstr(mg_last_error(), "/nonexistent/fashion") && strstr(mg_last_error(), "--data"));
    CHECK_ERR(mg_dataset_load(dir, true, &ds), MG_EIO);
    CHECK(strstr(mg_last_error(), "train-images-idx3-ubyte") &&
          strstr(mg_last_error(), "dataset-fashion-mnist"));

    mgt_make_dataset(dir, "train", 12, 4, 3, 12, -1);
    CHECK_OK(mg_dataset_load(dir, true, &ds));
    CHECK(ds->n == 12 && ds->h == 4 && ds->w == 3 && ds->labels[11] == 1);
    mg_dataset_destroy(ds);
    CHECK_ERR(mg_dataset_load(dir, false, &ds), MG_EIO);      /* no t10k files */
    CHECK(strstr(mg_last_error(), "t10k-images-idx3-ubyte"));

    mgt_make_dataset(dir, "t10k", 12, 4, 3, 11, -1);              /* counts disagree */
    CHECK_ERR(mg_dataset_load(dir, false, &ds), MG_EFORMAT);
    CHECK(strstr(mg_last_error(), "t10k-labels-idx1-ubyte") && strstr(mg_last_error(), "12"));
    CHECK_ERR(mg_dataset_load_shape(dir, false, &ds), MG_EFORMAT);   /* the headers: the same */
    CHECK(strstr(mg_last_error(), "t10k-labels-idx1-ubyte") && strstr(mg_last_error(), "12"));
    mgt_make_dataset(dir, "t10k", 12, 4, 3, 12, 5);               /* label 10 */
    CHECK_ERR(mg_dataset_load(dir, false, &ds), MG_EFORMAT);
    CHECK(strstr(mg_last_error(), "label 10"));
    /* The shape alone (a parameter server's): n, h, w; nothing inflated,
     * so a label out of range is not seen; the model's input is checked. */
    CHECK_OK(mg_dataset_load_shape(dir, false, &ds));
    CHECK(ds->n == 12 && ds->h == 4 && ds->w == 3 && !ds->images && !ds->labels);
    CHECK_OK(mg_dataset_check_input(ds, "m", 1, 4, 3, 10));
    CHECK_ERR(mg_dataset_check_input(ds, "m", 1, 28, 28, 10), MG_EMISMATCH);
    mg_dataset_destroy(ds);
    CHECK_ERR(mg_dataset_load_shape("/nonexistent/fashion", true, &ds), MG_EIO);
    mg_dataset_destroy(NULL);
}

TEST_T(data_fashion_mnist_sizes_labels_and_scaling, 60)
{
    mg_dataset *tr, *te;
    double t0 = mg_now();
    CHECK_OK(mg_dataset_load(mgt_fashion_dir(), true, &tr));
    CHECK_OK(mg_dataset_load(mgt_fashion_dir(), false, &te));
    printf("loaded Fashion-MNIST in %.2f s\n", mg_now() - t0);
    CHECK(tr->n == 60000 && tr->h == 28 && tr->w == 28);
    CHECK(te->n == 10000 && te->h == 28 && te->w == 28);
    const uint8_t l0[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, t0l[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
    CHECK(memcmp(tr->labels, l0, 10) == 0 && memcmp(te->labels, t0l, 10) == 0);
    long s = 0;
    for (int i = 0; i < 784; i++) s += tr->images[i];
    CHECK_EQ(s, 76247);                                       /* sum of image 0's pixels */

    /* PyTorch's preprocessed first batch of lenet5 (indices steps.indices[0]). */
    mg_st_file *ref;
    CHECK_OK(mg_st_open(mgt_data("lenet5.safetensors"), &ref));
    const mg_st_tensor *ind = mg_st_find(ref, "steps.indices"), *bx = mg_st_find(ref, "batch0.x"),
                       *by = mg_st_find(ref, "batch0.y");
    CHECK(ind && bx && by && ind->dtype == MG_ST_I32 && bx->nbytes == 128 * 784 * 4);
    static int32_t idx[128], y[128], yref[128];
    static float x[128 * 784], xref[128 * 784];
    memcpy(idx, ind->data, sizeof idx);
    memcpy(xref, bx->data, sizeof xref);
    memcpy(yref, by->data, sizeof yref);
    CHECK_OK(mg_dataset_gather(tr, idx, 128, MG_SCALE_NORMAL, x, 128 * 784, y));
    CHECK(memcmp(y, yref, sizeof y) == 0);
    int diff = 0;
    for (int i = 0; i < 128 * 784; i++) diff += memcmp(&x[i], &xref[i], 4) != 0;
    CHECK_MSG(diff == 0, "%d of %d inputs differ from PyTorch's bits", diff, 128 * 784);
    mg_st_close(ref);

    /* Unit scaling: u8 / 255 exactly. */
    CHECK_OK(mg_dataset_gather(te, (const int32_t[]){0, 9999}, 2, MG_SCALE_UNIT, x, 2 * 784, NULL));
    for (int i = 0; i < 784; i++) {
        CHECK(x[i] == (float)te->images[i] / 255.0f);
        CHECK(x[784 + i] == (float)te->images[9999 * 784 + i] / 255.0f);
    }
    mg_dataset_destroy(tr);
    mg_dataset_destroy(te);
}

/* The loader hands out exactly the gathered batches, in order, with the
 * short last batch, honouring skip, across epochs and early restarts. */
static void check_epoch(mg_loader *l, const mg_dataset *ds, const int32_t *order, int n,
                        int batch, int skip, mg_scaling sc)
{
    static float want[64 * 12];
    static int32_t wy[64];
    CHECK_OK(mg_loader_start(l, order, n, batch, skip));
    int nb = (n + batch - 1) / batch;
    for (int k = skip; k < nb; k++) {
        const float *x;
        const int32_t *y;
        int cnt = mg_loader_next(l, &x, &y);
        int exp = n - k * batch < batch ? n - k * batch : batch;
        CHECK_MSG(cnt == exp, "batch %d: %d images, expected %d", k, cnt, exp);
        CHECK_OK(mg_dataset_gather(ds, order + k * batch, cnt, sc, want, 64 * 12, wy));
        CHECK(memcmp(x, want, (size_t)cnt * 12 * sizeof(float)) == 0);
        CHECK(memcmp(y, wy, (size_t)cnt * sizeof(int32_t)) == 0);
    }
    const float *x;
    const int32_t *y;
    CHECK_EQ(mg_loader_next(l, &x, &y), 0);
    CHECK_EQ(mg_loader_next(l, &x, &y), 0);
}

TEST(data_loader_yields_gathered_batches)
{
    const char *dir = mgt_tmpdir();
    mgt_make_dataset(dir, "train", 50, 4, 3, 50, -1);
    mg_dataset *ds;
    CHECK_OK(mg_dataset_load(dir, true, &ds));
    int32_t order[50];
    mg_loader *l;
    CHECK_ERR(mg_loader_create(ds, 0, MG_SCALE_UNIT, &l), MG_EINVAL);
    CHECK_OK(mg_loader_create(ds, 16, MG_SCALE_NORMAL, &l));
    const float *x;
    const int32_t *y;
    CHECK_EQ(mg_loader_next(l, &x, &y), 0);                  /* no epoch started */
    for (int e = 0; e < 4; e++) {
        mg_permutation((uint64_t)e, order, 50);
        check_epoch(l, ds, order, 50, 16, 0, MG_SCALE_NORMAL);    /* 16,16,16,2 */
        check_epoch(l, ds, order, 50, 7, 0, MG_SCALE_NORMAL);     /* 7 x 7 + 1 */
        check_epoch(l, ds, order, 48, 16, 0, MG_SCALE_NORMAL);    /* no short batch */
        check_epoch(l, ds, order, 50, 16, 2, MG_SCALE_NORMAL);    /* resume at batch 2 */
        check_epoch(l, ds, order, 50, 16, 4, MG_SCALE_NORMAL);    /* skip all */
        check_epoch(l, ds, order, 50, 16, 9, MG_SCALE_NORMAL);
        check_epoch(l, ds, order, 0, 16, 0, MG_SCALE_NORMAL);     /* empty epoch */
    }
    /* Restart before the epoch is drained (one batch held, one ready). */
    mg_permutation(7, order, 50);
    CHECK_OK(mg_loader_start(l, order, 50, 5, 0));
    CHECK_EQ(mg_loader_next(l, &x, &y), 5);
    check_epoch(l, ds, order, 50, 5, 3, MG_SCALE_NORMAL);
    /* An index outside the data set, batches the loader cannot hold: said
     * to the caller (the loader's thread stopped the process; a probe). */
    int32_t bad[3] = {0, 1, 0};
    bad[1] = ds->n;
    CHECK_ERR(mg_loader_start(l, bad, 3, 5, 0), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "index 1 of the epoch's order is"), "%s", mg_last_error());
    CHECK_ERR(mg_loader_start(l, order, 50, 17, 0), MG_EINVAL);
    CHECK_ERR(mg_loader_start(l, order, 50, 0, 0), MG_EINVAL);
    CHECK_ERR(mg_loader_start(l, NULL, 5, 5, 0), MG_EINVAL);
    CHECK_OK(mg_loader_start(l, order, 50, 5, 0));           /* and destroy mid-epoch */
    mg_loader_destroy(l);
    mg_loader_destroy(NULL);

    CHECK_OK(mg_loader_create(ds, 64, MG_SCALE_UNIT, &l));
    check_epoch(l, ds, order, 50, 64, 0, MG_SCALE_UNIT);      /* one short batch */
    mg_loader_destroy(l);
    mg_dataset_destroy(ds);
}

/* A real epoch through the loader, checked against gather, with the
 * caller "training" (touching the batch) while the next one is assembled. */
TEST_T(data_loader_fashion_epoch, 60)
{
    mg_dataset *ds;
    CHECK_OK(mg_dataset_load(mgt_fashion_dir(), false, &ds));
    static int32_t order[10000], wy[128];
    static float want[128 * 784];
    mg_permutation(3, order, ds->n);
    mg_loader *l;
    CHECK_OK(mg_loader_create(ds, 128, MG_SCALE_NORMAL, &l));
    CHECK_OK(mg_loader_start(l, order, ds->n, 128, 0));
    const float *x;
    const int32_t *y;
    int k = 0, cnt, total = 0;
    while ((cnt = mg_loader_next(l, &x, &y)) > 0) {
        CHECK_OK(mg_dataset_gather(ds, order + k * 128, cnt, MG_SCALE_NORMAL, want, 128 * 784, wy));
        CHECK(memcmp(x, want, (size_t)cnt * 784 * sizeof(float)) == 0);
        CHECK(memcmp(y, wy, (size_t)cnt * sizeof(int32_t)) == 0);
        total += cnt;
        k++;
    }
    CHECK_EQ(k, 79);                                          /* 78 x 128 + 16 */
    CHECK_EQ(total, 10000);
    mg_loader_destroy(l);
    mg_dataset_destroy(ds);
}
