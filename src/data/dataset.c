/* Image-classification data sets from a directory of IDX files
 * ({train,t10k}-{images-idx3,labels-idx1}-ubyte, gzip or plain), kept as
 * u8 in memory (47 MB for Fashion-MNIST's training set), and the gather
 * that scales a batch to float. The scalings are computed exactly as
 * PyTorch's x/255 then (x - 0.2860)/0.3530 on float tensors (two float
 * operations each, no reciprocal), through a 256-entry table, so batches
 * match PyTorch's bit for bit. Labels must be < 10 (the zoo's classes). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "multigrad/data.h"

#define NUM_CLASSES 10

/* dir/<stem>.gz if it exists, else dir/<stem>; false if neither. */
static bool find_file(const char *dir, const char *stem, char *path, size_t cap)
{
    struct stat sb;
    snprintf(path, cap, "%s/%s.gz", dir, stem);
    if (stat(path, &sb) == 0) return true;
    snprintf(path, cap, "%s/%s", dir, stem);
    return stat(path, &sb) == 0;
}

#define HOW_TO_FIX "install the data set (scripts/install-deps.sh installs the Debian " \
                   "package dataset-fashion-mnist) or pass --data DIR (or set MG_DATA)"

/* Images [n, h, w] and one label per image. */
static mg_status check_pair(const char *ipath, const char *lpath, const mg_idx *im,
                            const mg_idx *lb)
{
    if (im->ndim != 3 || im->dims[0] == 0 || im->dims[1] == 0 || im->dims[2] == 0 ||
        im->dims[0] > (uint32_t)INT32_MAX)
        return mg_error(MG_EFORMAT, "%s: expected images as 3 non-empty dimensions "
                        "[n, h, w], found %d dimensions", ipath, im->ndim);
    if (lb->ndim != 1 || lb->dims[0] != im->dims[0])
        return mg_error(MG_EFORMAT, "%s: expected %u labels (one per image of %s), found %s "
                        "[%u]: the files do not belong together", lpath, im->dims[0], ipath,
                        lb->ndim == 1 ? "" : "a multi-dimensional array", lb->dims[0]);
    return MG_OK;
}

/* The data set (whole: its bytes too, else its shape alone). */
static mg_status load(const char *dir, bool train, bool whole, mg_dataset **out)
{
    MG_NEED("mg_dataset_load", out);
    *out = NULL;
    MG_NEED("mg_dataset_load", dir);   /* it said "data directory (null): Bad address" */
    const char *split = train ? "train" : "t10k";
    char stem[64], ipath[4096], lpath[4096];
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return mg_error(MG_EIO, "data directory %s: %s: " HOW_TO_FIX, dir,
                        stat(dir, &sb) != 0 ? strerror(errno) : "not a directory");
    snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", split);
    if (!find_file(dir, stem, ipath, sizeof ipath))
        return mg_error(MG_EIO, "no %s[.gz] in %s: " HOW_TO_FIX, stem, dir);
    snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", split);
    if (!find_file(dir, stem, lpath, sizeof lpath))
        return mg_error(MG_EIO, "no %s[.gz] in %s: " HOW_TO_FIX, stem, dir);

    /* The headers first: files that do not belong together are refused
     * before megabytes of data are inflated. */
    mg_idx im, lb;
    MG_TRY(mg_idx_load_header(ipath, &im));
    MG_TRY(mg_idx_load_header(lpath, &lb));
    MG_TRY(check_pair(ipath, lpath, &im, &lb));
    mg_status st = MG_OK;
    if (whole) {
        MG_TRY(mg_idx_load(ipath, &im));
        st = mg_idx_load(lpath, &lb);
        if (!st) st = check_pair(ipath, lpath, &im, &lb);   /* a file may have changed since */
        if (st) goto fail;
    }
    for (size_t i = 0; whole && i < lb.size; i++)
        if (lb.data[i] >= NUM_CLASSES) {
            st = mg_error(MG_EFORMAT, "%s: label %u of image %zu is not a class 0..%d",
                          lpath, lb.data[i], i, NUM_CLASSES - 1);
            goto fail;
        }
    mg_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) { st = mg_error(MG_ENOMEM, "data set: out of memory"); goto fail; }
    ds->n = (int)im.dims[0];
    ds->h = (int)im.dims[1];
    ds->w = (int)im.dims[2];
    ds->images = im.data;
    ds->labels = lb.data;
    if (!(ds->path = strdup(ipath))) {
        free(ds);
        st = mg_error(MG_ENOMEM, "data set: out of memory");
        goto fail;
    }
    *out = ds;
    return MG_OK;
fail:
    mg_idx_free(&im);
    mg_idx_free(&lb);
    return st;
}

mg_status mg_dataset_load(const char *dir, bool train, mg_dataset **out)
{
    return load(dir, train, true, out);
}

mg_status mg_dataset_load_shape(const char *dir, bool train, mg_dataset **out)
{
    return load(dir, train, false, out);
}

void mg_dataset_destroy(mg_dataset *ds)
{
    if (!ds) return;
    mg_free(ds->images);
    mg_free(ds->labels);
    free(ds->path);
    free(ds);
}

static void scale_table(mg_scaling scaling, float lut[256])
{
    for (int v = 0; v < 256; v++) {
        float x = (float)v / 255.0f;
        lut[v] = scaling == MG_SCALE_NORMAL ? (x - 0.2860f) / 0.3530f : x;
    }
}

mg_status mg_dataset_check_input(const mg_dataset *ds, const char *model, int c, int h, int w,
                                 int classes)
{
    bool image = c == 1 && h == ds->h && w == ds->w;
    bool flat = c == 1 && h == 1 && (long)w == (long)ds->h * ds->w;
    if (!image && !flat)
        return mg_error(MG_EMISMATCH, "data set %s has %dx%d images but model %s takes "
                        "%dx%dx%d inputs (%d pixel%s per image): give --data a directory of "
                        "images of that size (Fashion-MNIST and MNIST are 28x28), or another "
                        "--model", ds->path, ds->h, ds->w, model, c, h, w, c * h * w,
                        c * h * w == 1 ? "" : "s");
    for (int i = 0; ds->labels && i < ds->n; i++)
        if (ds->labels[i] >= classes)
            return mg_error(MG_EMISMATCH, "data set %s: label %u of image %d is not one of "
                            "model %s's %d classes", ds->path, ds->labels[i], i, model, classes);
    return MG_OK;
}

mg_status mg_dataset_gather(const mg_dataset *ds, const int32_t *idx, int n,
                            mg_scaling scaling, float *x, size_t x_len, int32_t *y)
{
    MG_ASSERT(scaling == MG_SCALE_UNIT || scaling == MG_SCALE_NORMAL);
    MG_ASSERT(ds->images);   /* not a shape alone */
    size_t hw = (size_t)ds->h * (size_t)ds->w;
    if (n < 0 || (size_t)n > x_len / hw)
        return mg_error(MG_EINVAL, "gather: %d images of %dx%d from %s do not fit in %zu "
                        "floats", n, ds->h, ds->w, ds->path, x_len);
    for (int i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= ds->n)
            return mg_error(MG_EINVAL, "gather: index %d is out of the %d images of %s",
                            idx[i], ds->n, ds->path);
    float lut[256];
    scale_table(scaling, lut);
    for (int i = 0; i < n; i++) {
        const uint8_t *src = ds->images + (size_t)idx[i] * hw;
        float *dst = x + (size_t)i * hw;
        for (size_t j = 0; j < hw; j++) dst[j] = lut[src[j]];
        if (y) y[i] = ds->labels[idx[i]];
    }
    return MG_OK;
}
