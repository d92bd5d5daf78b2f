/* libFuzzer target: the safetensors reader (src/data/safetensors.c,
 * st_json.c) on any bytes. A file it accepts must be consistent: every
 * tensor found by its name, its bytes readable, every metadata key found. */
#include "common.h"  /* first: it defines _GNU_SOURCE */
#include <string.h>
#include "multigrad/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mg_st_file *f;
    if (mg_st_open(fuzz_file(0, data, size), &f)) return 0;
    unsigned sum = 0;
    for (int i = 0; i < mg_st_count(f); i++) {
        const mg_st_tensor *t = mg_st_get(f, i);
        FUZZ_CHECK(mg_st_find(f, t->name) == t);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= 8);
        size_t n = mg_st_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        FUZZ_CHECK(n == t->nbytes && strlen(mg_st_dtype_name(t->dtype)) > 0);
        for (size_t b = 0; b < t->nbytes; b++) sum += ((const uint8_t *)t->data)[b];
    }
    for (int i = 0; i < mg_st_meta_count(f); i++) {
        const char *key, *v = mg_st_meta_at(f, i, &key);
        FUZZ_CHECK(mg_st_meta(f, key) == v);
    }
    (void)mg_st_verified(f);
    mg_st_close(f);
    return (int)(sum & 0);
}
