/* libFuzzer target: the text corpus loader (src/data/text.c) and its
 * batches. The input: a byte whose low 6 bits + 1 are the context T and
 * whose top bit reads the corpus as a directory of two files (split at the
 * next byte's value), then the text. A corpus it accepts must give
 * windows inside it, for training and validation. */
#include "common.h"  /* first: it defines _GNU_SOURCE */
#include <string.h>
#include "multigrad/data.h"

static const char *const names[2] = {"part0", "part1"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dir("text", names, 2);
    if (size < 2) return 0;
    int T = (data[0] & 63) + 1;
    const char *path;
    if (data[0] & 128) {
        size_t cut = data[1] < size - 2 ? data[1] : size - 2;
        fuzz_file(0, data + 2, cut);
        fuzz_file(1, data + 2 + cut, size - 2 - cut);
        path = dir;
    } else {
        path = fuzz_file(0, data + 1, size - 1);
    }
    mg_text *t;
    if (mg_text_open(path, T, &t) != MG_OK) return 0;
    size_t n = mg_text_size(t), ntr = mg_text_train_size(t), nval = mg_text_val_size(t);
    FUZZ_CHECK(ntr + nval == n && ntr >= (size_t)T + 2 && nval >= (size_t)T + 1);
    enum { B = 4 };
    int32_t *x = malloc(sizeof(int32_t) * B * (size_t)T), *y = malloc(sizeof(int32_t) * B * (size_t)T);
    int64_t off[B];
    FUZZ_CHECK(x && y);
    for (uint64_t step = 0; step < 3; step++) {
        int rows = mg_text_batch(t, data[0], step, (int)step * B, B, T, (int)step % 2, 2, x, y);
        FUZZ_CHECK(rows == B / 2);
        mg_text_batch_offsets(data[0], step, ntr, B, T, off);
        for (int i = 0; i < B; i++) FUZZ_CHECK(off[i] >= 0 && (size_t)off[i] + (size_t)T < ntr);
        mg_text_batch_at(t, off, B, T, x, y);
        for (int i = 0; i < B * T; i++) FUZZ_CHECK(x[i] >= 0 && x[i] < 256 && y[i] >= 0 && y[i] < 256);
    }
    int w = mg_text_val_windows(t, T);
    FUZZ_CHECK(w >= 1 && w <= 512);
    for (int first = 0; first < w; first += B) {
        int k = w - first < B ? w - first : B;
        mg_text_val_batch(t, T, first, k, x, y);
    }
    free(x);
    free(y);
    mg_text_close(t);
    return 0;
}
