/* multigrad — data: IDX files (MNIST, Fashion-MNIST; plain or gzip), data
 * sets kept as u8 in memory, input scaling, and a loader that assembles
 * the next batch on a background thread while the current one trains. */
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
 * short file or trailing bytes are MG_EFORMAT). Errors name the file. */
mg_status mg_idx_load(const char *path, mg_idx *out);
void mg_idx_free(mg_idx *idx);

/* The two input scalings of models.md. */
typedef enum {
    MG_SCALE_UNIT,    /* u8 / 255 */
    MG_SCALE_NORMAL   /* (u8 / 255 - 0.2860) / 0.3530 */
} mg_scaling;

typedef struct mg_dataset {
    int n;             /* images */
    int h, w;          /* 28 x 28 */
    uint8_t *images;   /* n * h * w */
    uint8_t *labels;   /* n */
} mg_dataset;
/* Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from dir (the
 * .gz file is preferred when both exist) and checks that images and labels
 * agree and labels are < 10. Callers default dir to
 * /usr/share/datasets/fashion-mnist; errors say how to install the data
 * set or pass --data DIR. */
mg_status mg_dataset_load(const char *dir, bool train, mg_dataset **out);
void mg_dataset_destroy(mg_dataset *ds);
/* Gather images idx[0..n) into x (float, scaled; n*h*w floats) and labels
 * into y (may be NULL). The scaling is computed in float exactly as
 * PyTorch's x/255 and (x/255 - 0.2860)/0.3530, so batches match bit for bit. */
void mg_dataset_gather(const mg_dataset *ds, const int32_t *idx, int n,
                       mg_scaling scaling, float *x, int32_t *y);

/* Background loader: batches of an index order, assembled one ahead on
 * its own thread (double buffering). One consumer thread. */
typedef struct mg_loader mg_loader;
mg_status mg_loader_create(const mg_dataset *ds, int max_batch, mg_scaling scaling,
                           mg_loader **out);
void mg_loader_destroy(mg_loader *l);
/* Start an epoch over order[0..n) in batches of `batch` (the last one
 * short). order is borrowed until the epoch ends. Skips the first `skip`
 * batches (resuming mid-epoch). */
void mg_loader_start(mg_loader *l, const int32_t *order, int n, int batch, int skip);
/* The next batch: returns its size (0 at the end of the epoch); x and y
 * stay valid until the next call. */
int mg_loader_next(mg_loader *l, const float **x, const int32_t **y);

#ifdef __cplusplus
}
#endif
#endif
