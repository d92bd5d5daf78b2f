/* IDX files and small image data sets written at run time (see
 * idx_files.c), for the data tests and the mgtrain tests. */
#ifndef MG_TESTS_IDX_FILES_H
#define MG_TESTS_IDX_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes to a file, plain or gzip (CHECKs every step). */
void mgt_write_bytes(const char *path, const void *data, size_t n, bool gz);
/* An IDX file into buf: magic, dims, then `extra` more or fewer data
 * bytes than the header announces (negative: truncated). Data byte i is
 * i*7+3. Returns its length. */
size_t mgt_make_idx(uint8_t *buf, uint32_t magic, int ndim, const uint32_t *dims, long extra);
/* A data set split in dir ("train" or "t10k"): n images of h x w (gzip)
 * and nlabels labels i % 10 (plain; 10 at bad_label_at, -1 for none). */
void mgt_make_dataset(const char *dir, const char *split, int n, int h, int w, int nlabels,
                      int bad_label_at);
/* The first n_train training and n_test test images and labels of the
 * data set in src written as plain IDX files into dst: 0, or -1 after
 * printing why (for the runner: no CHECK). */
int mgt_cut_fashion(const char *src, const char *dst, int n_train, int n_test);

#endif
