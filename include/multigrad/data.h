/* multigrad — data: IDX files (MNIST, Fashion-MNIST; plain or gzip), data
 * sets kept as u8 in memory, input scaling, a loader that assembles
 * the next batch on a background thread while the current one trains, and
 * byte-level text corpora for language models. */
#ifndef MULTIGRAD_DATA_H
#define MULTIGRAD_DATA_H

#include <stdint.h>
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An IDX file: u8 data with up to 4 dimensions. */
typedef struct mg_idx {
    int ndim;
    uint32_t dims[4];
    size_t size;       /* product of dims */
    uint8_t *data;
} mg_idx;
/* Reads plain or gzip IDX; checks the magic (0x000008NN: u8 data, NN = 1..4
 * dimensions), the dimensions (at most 1 GiB of data, refused before any
 * allocation) and that the data length matches the header exactly (a
 * short file or trailing bytes are MG_EFORMAT). Only regular files are
 * read (a FIFO is MG_EIO, not waited on). Errors name the file. */
mg_status mg_idx_load(const char *path, mg_idx *out);
/* The header alone, checked as above (a plain file's length too): ndim,
 * dims and size; data NULL. */
mg_status mg_idx_load_header(const char *path, mg_idx *out);
void mg_idx_free(mg_idx *idx);

/* The two input scalings of models.md. */
typedef enum {
    MG_SCALE_UNIT,    /* u8 / 255 */
    MG_SCALE_NORMAL   /* (u8 / 255 - 0.2860) / 0.3530 */
} mg_scaling;

typedef struct mg_dataset {
    int n;             /* images */
    int h, w;          /* 28 x 28 */
    uint8_t *images;   /* n * h * w (NULL: the shape alone, mg_dataset_load_shape) */
    uint8_t *labels;   /* n (NULL likewise) */
    char *path;        /* the images file (for messages) */
} mg_dataset;
/* Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from dir (the
 * .gz file is preferred when both exist) and checks that images and labels
 * agree and labels are < 10. Callers default dir to
 * /usr/share/datasets/fashion-mnist; errors say how to install the data
 * set or pass --data DIR. */
mg_status mg_dataset_load(const char *dir, bool train, mg_dataset **out);
/* The same files' shape alone: n, h and w from their headers, checked as
 * mg_dataset_load checks them, images and labels NULL (nothing inflated):
 * for a rank that only counts the batches, as a parameter server does.
 * mg_dataset_gather must not be called on it. */
mg_status mg_dataset_load_shape(const char *dir, bool train, mg_dataset **out);
void mg_dataset_destroy(mg_dataset *ds);
/* Whether a model whose input is c x h x w floats per image (an MLP:
 * 1 x 1 x h*w) and which tells `classes` classes apart can take the data
 * set's images and labels; MG_EMISMATCH names both sides otherwise. */
mg_status mg_dataset_check_input(const mg_dataset *ds, const char *model, int c, int h, int w,
                                 int classes);
/* Gather images idx[0..n) into x (float, scaled; x_len floats, at least
 * n*h*w) and labels into y (may be NULL). The scaling is computed in float
 * exactly as PyTorch's x/255 and (x/255 - 0.2860)/0.3530, so batches match
 * bit for bit. A short x or an index out of range is MG_EINVAL, nothing
 * written. */
mg_status mg_dataset_gather(const mg_dataset *ds, const int32_t *idx, int n,
                            mg_scaling scaling, float *x, size_t x_len, int32_t *y);

/* Background loader: batches of an index order, assembled one ahead on
 * its own thread (double buffering). One consumer thread. The data set
 * must be loaded with its images (not mg_dataset_load_shape). */
typedef struct mg_loader mg_loader;
mg_status mg_loader_create(const mg_dataset *ds, int max_batch, mg_scaling scaling,
                           mg_loader **out);
void mg_loader_destroy(mg_loader *l);
/* Start an epoch over order[0..n) in batches of `batch` (the last one
 * short). order is borrowed until the epoch ends. Skips the first `skip`
 * batches (resuming mid-epoch). MG_EINVAL, nothing started, for an index
 * outside the data set, a batch of 0 or over the loader's max_batch, or a
 * negative n or skip. */
mg_status mg_loader_start(mg_loader *l, const int32_t *order, int n, int batch, int skip);
/* The next batch: returns its size (0 at the end of the epoch); x and y
 * stay valid until the next call. */
int mg_loader_next(mg_loader *l, const float **x, const int32_t **y);

/* Text corpora for byte-level language models (models.md section D):
 * tokens are bytes (vocabulary 256), written as int32; the first
 * floor(0.9 n) bytes train, the rest validate. The default corpus is 40
 * files of Debian's fortunes package (/usr/share/games/fortunes, fixed
 * order, 2,478,275 bytes in Debian 12). Corpora over 2 GiB are refused. */
typedef struct mg_text mg_text;
/* path NULL: the default fortunes set; a directory: its regular files (not
 * hidden; symbolic links followed), sorted by name (strcmp); a file: that
 * file. ctx: the context T the corpus must hold one window of (training
 * split >= T + 2 bytes, validation >= T + 1). Errors name the file or
 * path and the fix (install fortunes, --data, a smaller --ctx). */
mg_status mg_text_open(const char *path, int ctx, mg_text **out);
void mg_text_close(mg_text *t);
size_t mg_text_size(const mg_text *t);        /* total bytes */
size_t mg_text_train_size(const mg_text *t);
size_t mg_text_val_size(const mg_text *t);
const uint8_t *mg_text_bytes(const mg_text *t); /* the whole corpus; train = [0, train_size), val after it */
int mg_text_num_files(const mg_text *t);
/* Start offsets (into the training split) of the global batch of step
 * `step`: B values uniform in [0, n_train - T - 1], drawn by a stream that
 * depends only on (seed, step). */
void mg_text_batch_offsets(uint64_t seed, uint64_t step, size_t n_train, int B, int T,
                           int64_t *offsets);
/* Rows [first, first + B) of step `step`'s global batch (the stream's
 * draws first .. first + B - 1), rank `rank` of `world`'s share of them
 * (rows first + rank, first + rank + world, ...: B/world when divisible;
 * returns the count) as int32 tokens x [rows, T] = train[o : o+T] and
 * targets y [rows, T] = train[o+1 : o+T+1]. A step's micro-batch j of B
 * rows is first = j * B, so a global batch is the same rows however it is
 * cut into micro-batches (--accumulate, a pipeline's) and ranks. */
int mg_text_batch(const mg_text *t, uint64_t seed, uint64_t step, int first, int B, int T,
                  int rank, int world, int32_t *x, int32_t *y);
/* Same from explicit offsets (the reference file gives PyTorch's
 * offsets): n sequences. */
void mg_text_batch_at(const mg_text *t, const int64_t *offsets, int n, int T, int32_t *x,
                      int32_t *y);
/* Validation windows for context T: min(512, floor((n_val - 1) / T)),
 * window i at offset i*T of the validation split; and window rows
 * [first, first+n) as x/y ([n, T] each). */
int mg_text_val_windows(const mg_text *t, int T);
void mg_text_val_batch(const mg_text *t, int T, int first, int n, int32_t *x, int32_t *y);

#ifdef __cplusplus
}
#endif
#endif
