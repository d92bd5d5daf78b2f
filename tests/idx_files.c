/* IDX files and small image data sets written at run time (idx_files.h). */
#include <zlib.h>
#include "harness.h"
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
