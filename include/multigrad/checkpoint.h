/* multigrad — safetensors files and training checkpoints.
 *
 * safetensors: u64 little-endian header length, a JSON header naming each
 * tensor's dtype, shape and byte range (plus "__metadata__", string to
 * string), then the raw little-endian data. PyTorch and the Hugging Face
 * tools read what we write, and we read what they write.
 *
 * Checkpoints hold parameters (named as in models.md, so PyTorch's
 * load_state_dict takes them), buffers, optimizer state and metadata.
 * Writing is atomic: temporary file, fsync, rename, fsync of the directory. */
#ifndef MULTIGRAD_CHECKPOINT_H
#define MULTIGRAD_CHECKPOINT_H

#include <stdint.h>
#include "nn.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The element types (core.h's) under the names this API has always had. */
typedef enum { MG_ST_F32 = MG_F32, MG_ST_F64 = MG_F64, MG_ST_F16 = MG_F16,
               MG_ST_BF16 = MG_BF16, MG_ST_I32 = MG_I32, MG_ST_I64 = MG_I64,
               MG_ST_U8 = MG_U8 } mg_st_dtype;

typedef struct mg_st_tensor {
    const char *name;
    mg_st_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;   /* little-endian bytes */
    size_t nbytes;
} mg_st_tensor;

/* Write tensors and metadata (n_meta key/value pairs: meta[2i], meta[2i+1])
 * atomically to path: on any error the previous file at path is intact and
 * no temporary file is left. Data is laid out in the order given; the
 * header is padded with spaces to a multiple of 8 bytes. */
mg_status mg_st_write(const char *path, const mg_st_tensor *t, int n,
                      const char *const *meta, int n_meta);

/* For a file written in parts (by several processes): the bytes before
 * the data (length and header) of a file of these tensors (their data may
 * be NULL) and metadata, with the checksum made from data_crc[i], the
 * CRC-32 (zlib's crc32) of tensor i's data bytes. Its length does not
 * depend on the CRCs; tensor i's data starts at *len plus the bytes of the
 * tensors before it. *out is malloc'd. */
mg_status mg_st_header(const mg_st_tensor *t, int n, const char *const *meta, int n_meta,
                       const uint32_t *data_crc, void **out, size_t *len);

typedef struct mg_st_file mg_st_file;
/* Read and validate a whole file (header JSON, dtypes, shapes, byte ranges
 * in bounds, non-overlapping, covering the data). */
mg_status mg_st_open(const char *path, mg_st_file **out);
void mg_st_close(mg_st_file *f);
int mg_st_count(const mg_st_file *f);
const mg_st_tensor *mg_st_get(const mg_st_file *f, int i);
const mg_st_tensor *mg_st_find(const mg_st_file *f, const char *name);
/* A __metadata__ value, or NULL. */
const char *mg_st_meta(const mg_st_file *f, const char *key);
/* All metadata: count, and the i-th value (its key in *key). */
int mg_st_meta_count(const mg_st_file *f);
const char *mg_st_meta_at(const mg_st_file *f, int i, const char **key);
/* mg_st_write adds the metadata entry "multigrad.crc32" (a CRC-32 of the
 * tensors and the other metadata); mg_st_open verifies it when present and
 * fails on a mismatch. True if the file carried one (so it was verified). */
bool mg_st_verified(const mg_st_file *f);
/* "F32", ... and the element size in bytes. */
const char *mg_st_dtype_name(mg_st_dtype d);
size_t mg_st_dtype_size(mg_st_dtype d);

/* Training state beyond the arenas. */
typedef struct mg_ckpt_meta {
    char model[32];
    long step;          /* optimizer steps taken */
    long epoch;         /* epochs completed */
    uint64_t seed;
    uint64_t rng_counter; /* dropout stream position: saved from the model
                             (mg_model_rng_counter), restored into it */
    /* Hyper-parameters as "key=value;..." (checked on resume). */
    char hparams[512];
} mg_ckpt_meta;

/* Save parameters, buffers, optimizer state (o may be NULL) and meta (may
 * be NULL; meta->model is ignored, the model's name is written). Optimizer
 * state is saved as "optim.<state>.<param name>" tensors of the
 * parameter's shape, e.g. optim.momentum_buffer.conv1.weight. A model on
 * a device goes to the host with its optimizer for the file and comes
 * back (so do they for mg_checkpoint_load). */
mg_status mg_checkpoint_save(const char *path, mg_model *m, mg_optim *o,
                             const mg_ckpt_meta *meta);
/* A checkpoint written by several processes into one file, each its own
 * byte ranges (a sharded strategy's ranks, each its pieces of the arena):
 * every process makes the same writer (the layout: tensors, offsets, file
 * size) from the same model shape, optimizer kind and meta; one creates
 * the file (mg_atomic_begin with mg_ckpt_writer_size); each writes the
 * parameters and optimizer state of its arena ranges r (the optimizer must
 * hold their state), and the buffers where `buffers`, getting the CRC of
 * every piece it wrote; the creator, with every process's pieces, writes
 * the header (refusing bytes nobody or two processes wrote) and commits.
 * mg_checkpoint_save is this with one process writing everything. The
 * writer reads the model and optimizer in host memory. */
typedef struct mg_ckpt_writer mg_ckpt_writer;
typedef struct mg_ckpt_piece {
    int32_t tensor;     /* index in the file's table */
    uint32_t crc;       /* CRC-32 of the piece's bytes */
    uint64_t off, len;  /* bytes within the tensor's data */
} mg_ckpt_piece;
mg_status mg_ckpt_writer_create(mg_model *m, mg_optim *o, const mg_ckpt_meta *meta,
                                mg_ckpt_writer **out);
void mg_ckpt_writer_destroy(mg_ckpt_writer *w);
uint64_t mg_ckpt_writer_size(const mg_ckpt_writer *w);
/* *out (malloc'd, *np entries) gets the pieces written. */
mg_status mg_ckpt_write_part(mg_ckpt_writer *w, int fd, const char *path, const mg_range *r,
                             int nr, bool buffers, mg_ckpt_piece **out, int *np);
/* Sorts pc. */
mg_status mg_ckpt_write_header(mg_ckpt_writer *w, int fd, const char *path, mg_ckpt_piece *pc,
                               int n);
/* A model on a device and its optimizer in host memory for a file's
 * writer or reader: begin moves both to the host, was[] getting where
 * each was; end brings each back there and returns st, or the error of
 * bringing them back (mg_checkpoint_save and _load do both). */
mg_status mg_ckpt_host_begin(mg_model *m, mg_optim *o, mg_device was[2]);
mg_status mg_ckpt_host_end(mg_model *m, mg_optim *o, const mg_device was[2], mg_status st);

/* Load into m (and o if not NULL: the state of o's ranges, so a shard
 * reads its part of a checkpoint any world size wrote). Refuses a file of another model, with
 * missing or mis-shaped tensors, damaged, or with a step, epoch or
 * optimizer step count over 2^53 - 1, with a clear error; on error m and
 * o are unchanged. meta may be NULL. */
mg_status mg_checkpoint_load(const char *path, mg_model *m, mg_optim *o,
                             mg_ckpt_meta *meta);
/* Load only parameters (and buffers if present) from any safetensors file
 * named as PyTorch's state_dict (e.g. exported from PyTorch); `prefix`
 * (may be NULL) is prepended to each name looked up ("init."). A model on
 * a device gets them through host copies. */
mg_status mg_model_load_weights(const char *path, mg_model *m, const char *prefix);

#ifdef __cplusplus
}
#endif
#endif
