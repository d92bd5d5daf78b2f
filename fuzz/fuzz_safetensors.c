/* libFuzzer target: the safetensors reader (src/data/safetensors.c,
 * st_json.c) on any bytes, as a file read whole, as a file left on disk
 * (its header read, the checksum and the tensors' bytes read in pieces)
 * and as a remote file (the header bytes a peer sends, the rest read
 * through a function: a checkpoint only node 0 reaches). A file it
 * accepts must be consistent: every tensor found by its name, its bytes
 * readable (a remote file's reads within the file, and the same bytes as
 * the file's), every metadata key found; on disk it is accepted exactly
 * when read whole is, with the same verification. */
#include "common.h"  /* first: it defines _GNU_SOURCE */
#include <string.h>
#include "multigrad/checkpoint.h"

typedef struct {
    const uint8_t *p;
    size_t n;
} bytes;

static mg_status read_bytes(void *ud, uint64_t off, size_t len, void *dst)
{
    const bytes *b = ud;
    FUZZ_CHECK(off <= b->n && len <= b->n - off);
    memcpy(dst, b->p + off, len);
    return MG_OK;
}

static unsigned check(const mg_st_file *f, const mg_st_file *local)
{
    unsigned sum = 0;
    uint8_t buf[256];
    for (int i = 0; i < mg_st_count(f); i++) {
        const mg_st_tensor *t = mg_st_get(f, i);
        FUZZ_CHECK(mg_st_find(f, t->name) == t);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= 8);
        size_t n = mg_st_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        FUZZ_CHECK(n == t->nbytes && strlen(mg_st_dtype_name(t->dtype)) > 0);
        const mg_st_tensor *l = local ? mg_st_get(local, i) : NULL;
        for (size_t b = 0; b < t->nbytes; b += sizeof buf) {
            size_t k = t->nbytes - b < sizeof buf ? t->nbytes - b : sizeof buf;
            FUZZ_CHECK(mg_st_read(f, t, b, k, buf) == MG_OK);
            if (l) FUZZ_CHECK(!memcmp(buf, (const uint8_t *)l->data + b, k));
            for (size_t j = 0; j < k; j++) sum += buf[j];
        }
    }
    for (int i = 0; i < mg_st_meta_count(f); i++) {
        const char *key, *v = mg_st_meta_at(f, i, &key);
        FUZZ_CHECK(mg_st_meta(f, key) == v);
    }
    (void)mg_st_verified(f);
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mg_st_file *f = NULL, *r, *d = NULL;
    unsigned sum = 0;
    const char *path = fuzz_file(0, data, size);
    if (!mg_st_open(path, &f)) sum += check(f, NULL);
    FUZZ_CHECK(!mg_st_open_on_disk(path, &d) == (f != NULL));
    if (d) {
        FUZZ_CHECK(mg_st_verified(d) == mg_st_verified(f) && mg_st_size(d) == size);
        sum += check(d, f);
        uint8_t last;
        FUZZ_CHECK(!size || !mg_st_pread(d, size - 1, 1, &last));
        FUZZ_CHECK(mg_st_pread(d, size, 1, &last) == MG_EINVAL);
        mg_st_close(d);
    }
    /* Remote: the whole header given (as a peer sends it), or a prefix of
     * the bytes (a header longer than the bytes given must be refused). */
    bytes b = {data, size};
    size_t heads[2] = {size, size / 2};
    for (int k = 0; k < 2; k++) {
        if (mg_st_open_remote("fuzz", data, heads[k], size, false, read_bytes, &b, &r)) continue;
        sum += check(r, f);
        size_t hl;
        FUZZ_CHECK(mg_st_head(r, &hl) && hl <= heads[k] && mg_st_size(r) == size);
        mg_st_close(r);
    }
    mg_st_close(f);
    return (int)(sum & 0);
}
