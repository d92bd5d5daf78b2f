/* IDX files and small image data sets written at run time (idx_files.h). */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "harness.h"
#include "multigrad/data.h"
#include "idx_files.h"

void mgt_write_bytes(const char *path, const void *data, size_t n, bool gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        CHECK(f != NULL);
        CHECK(n == 0 || gzwrite(f, data, (unsigned)n) == (int)n);
        CHECK(gzclose(f) == Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        CHECK(fwrite(data, 1, n, f) == n);
        CHECK(fclose(f) == 0);
    }
}

size_t mgt_make_idx(uint8_t *buf, uint32_t magic, int ndim, const uint32_t *dims, long extra)
{
    size_t n = 0, size = 1;
    uint32_t words[5] = {magic};
    for (int d = 0; d < ndim; d++) { words[d + 1] = dims[d]; size *= dims[d]; }
    for (int w = 0; w <= ndim; w++)
        for (int b = 3; b >= 0; b--) buf[n++] = (uint8_t)(words[w] >> (8 * b));
    for (size_t i = 0; i < (size_t)((long)size + extra); i++) buf[n++] = (uint8_t)(i * 7 + 3);
    return n;
}

void mgt_make_dataset(const char *dir, const char *split, int n, int h, int w, int nlabels,
                      int bad_label_at)
{
    size_t px = (size_t)n * (size_t)h * (size_t)w;
    uint8_t *buf = malloc(16 + (px > (size_t)nlabels ? px : (size_t)nlabels));
    CHECK(buf != NULL);
    char path[600];
    size_t len = mgt_make_idx(buf, 0x803, 3, (const uint32_t[]){(uint32_t)n, (uint32_t)h,
                              (uint32_t)w}, 0);
    for (size_t i = 0; i < px; i++)
        buf[16 + i] = (uint8_t)((i * 37 + i / ((size_t)h * (size_t)w)) & 0xff);
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, split);
    mgt_write_bytes(path, buf, len, true);
    len = mgt_make_idx(buf, 0x801, 1, (const uint32_t[]){(uint32_t)nlabels}, 0);
    for (int i = 0; i < nlabels; i++) buf[8 + i] = (uint8_t)(i == bad_label_at ? 10 : i % 10);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, split);   /* plain */
    mgt_write_bytes(path, buf, len, false);
    free(buf);
}

/* The first n items of the IDX file src (plain or gzip) as a plain IDX
 * file dst: 0, or -1 after printing why. */
static int cut_idx(const char *src, const char *dst, uint32_t n)
{
    mg_idx idx;
    if (mg_idx_load(src, &idx) != MG_OK) {
        printf("mgtest: %s\n", mg_last_error());
        return -1;
    }
    size_t item = idx.dims[0] ? idx.size / idx.dims[0] : 0;
    if (n > idx.dims[0]) n = idx.dims[0];
    uint8_t head[4 + 4 * 4];
    uint32_t words[5] = {0x800u | (uint32_t)idx.ndim, n, idx.dims[1], idx.dims[2], idx.dims[3]};
    int len = 0;
    for (int w = 0; w <= idx.ndim; w++)
        for (int b = 3; b >= 0; b--) head[len++] = (uint8_t)(words[w] >> (8 * b));
    FILE *f = fopen(dst, "wb");
    int ok = f && fwrite(head, 1, (size_t)len, f) == (size_t)len &&
             fwrite(idx.data, item, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) printf("mgtest: cannot write %s: %s\n", dst, strerror(errno));
    mg_idx_free(&idx);
    return ok ? 0 : -1;
}

int mgt_cut_fashion(const char *src, const char *dst, int n_train, int n_test)
{
    static const char *stems[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                  "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int i = 0; i < 4; i++) {
        char from[600], to[600];
        snprintf(from, sizeof from, "%s/%s.gz", src, stems[i]);
        if (access(from, F_OK) != 0) snprintf(from, sizeof from, "%s/%s", src, stems[i]);
        snprintf(to, sizeof to, "%s/%s", dst, stems[i]);
        if (cut_idx(from, to, (uint32_t)(i < 2 ? n_train : n_test)) != 0) return -1;
    }
    return 0;
}
