/* libFuzzer target: the IDX reader (src/data/idx.c), plain and gzip, and
 * data sets built from two IDX files (src/data/dataset.c), with the
 * input-shape check and a gather. The input: a flags byte (bit 0: gzip the
 * images, bit 1: gzip the labels, bits 2-7: which images to gather), two
 * bytes of little-endian length L, L bytes of the images file, the rest
 * the labels file. Raw gzip inputs reach the reader through bit 0 = 0. */
#include "common.h"  /* first: it defines _GNU_SOURCE */
#include <string.h>
#include <zlib.h>
#include "multigrad/data.h"

static const char *const names[2] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"};

/* data as slot's file, gzip-compressed when gz. */
static void put(int slot, const uint8_t *data, size_t size, bool gz)
{
    if (!gz) { fuzz_file(slot, data, size); return; }
    uLongf n = compressBound(size) + 32;
    uint8_t *z = malloc(n);
    z_stream s = {0};
    FUZZ_CHECK(z && deflateInit2(&s, 1, Z_DEFLATED, 16 + 9, 1, Z_DEFAULT_STRATEGY) == Z_OK);
    s.next_in = (Bytef *)data;
    s.avail_in = (uInt)size;
    s.next_out = z;
    s.avail_out = (uInt)n;
    FUZZ_CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
    fuzz_file(slot, z, s.total_out);
    deflateEnd(&s);
    free(z);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dir("idx", names, 2);
    if (size < 3) return 0;
    unsigned flags = data[0];
    size_t len = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    if (len > size) len = size;
    put(0, data, len, flags & 1);
    put(1, data + len, size - len, flags & 2);

    char ipath[128];
    snprintf(ipath, sizeof ipath, "%s/train-images-idx3-ubyte", dir);
    mg_idx x;
    if (mg_idx_load_header(ipath, &x) == MG_OK) FUZZ_CHECK(x.data == NULL && x.ndim >= 1);
    if (mg_idx_load(ipath, &x) == MG_OK) {
        size_t n = 1;
        for (int d = 0; d < x.ndim; d++) n *= x.dims[d];
        FUZZ_CHECK(n == x.size && (n == 0 || x.data));
        if (n) { volatile uint8_t last = x.data[n - 1]; (void)last; }
        mg_idx_free(&x);
    }
    mg_dataset *ds;
    if (mg_dataset_load(dir, true, &ds) != MG_OK) return 0;
    FUZZ_CHECK(ds->n > 0 && ds->h > 0 && ds->w > 0);
    FUZZ_CHECK(mg_dataset_check_input(ds, "fuzz", 1, ds->h, ds->w, 10) == MG_OK);
    (void)mg_dataset_check_input(ds, "fuzz", 1, 28, 28, 10);
    size_t img = (size_t)ds->h * (size_t)ds->w;
    float *buf = malloc(4 * img * sizeof(float));
    int32_t idx[4], y[4];
    for (int i = 0; i < 4; i++) idx[i] = (int32_t)((flags >> 2) * (unsigned)(i + 1) % (unsigned)ds->n);
    FUZZ_CHECK(buf && mg_dataset_gather(ds, idx, 4, MG_SCALE_NORMAL, buf, 4 * img, y) == MG_OK);
    FUZZ_CHECK(mg_dataset_gather(ds, idx, 4, MG_SCALE_UNIT, buf, 4 * img - 1, y) == MG_EINVAL);
    idx[3] = ds->n;
    FUZZ_CHECK(mg_dataset_gather(ds, idx, 4, MG_SCALE_UNIT, buf, 4 * img, y) == MG_EINVAL);
    for (int i = 0; i < 3; i++) FUZZ_CHECK(y[i] >= 0 && y[i] < 10);
    free(buf);
    mg_dataset_destroy(ds);
    return 0;
}
