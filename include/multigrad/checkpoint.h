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
    const void *data;   /* little-endian bytes (NULL in a remote file: mg_st_read) */
    size_t nbytes;
    uint64_t offset;    /* read files: where the bytes start within the data */
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
/* A file another process holds (a checkpoint only node 0 can reach): its
 * first len bytes `head` (the length and header: mg_st_head of the
 * holder's copy), its size, and read(ud, off, len, dst), which fetches
 * bytes [off, off + len) of it. The header is checked as mg_st_open
 * checks it; the contents cannot be, so `verified` is what the holder's
 * mg_st_verified said. Its tensors' data are NULL: mg_st_read reads them.
 * `name` names the file in messages. */
typedef mg_status (*mg_st_read_fn)(void *ud, uint64_t off, size_t len, void *dst);
mg_status mg_st_open_remote(const char *name, const void *head, size_t len, uint64_t size,
                            bool verified, mg_st_read_fn read, void *ud, mg_st_file **out);
/* A file left on disk: only its length and header are read into memory
 * (and checked as mg_st_open checks them); the checksum is verified by
 * reading the data once in pieces of 1 MB. The tensors' data are NULL:
 * mg_st_read reads their bytes when asked, so memory does not grow with
 * the file. */
mg_status mg_st_open_on_disk(const char *path, mg_st_file **out);
/* Whether this process checks f's contents (the values a checkpoint
 * reads): a file read whole or on disk, not a remote one. */
bool mg_st_checks_contents(const mg_st_file *f);
/* n bytes of tensor x of f from its byte `from` into dst (a file not in
 * memory through its read function). */
mg_status mg_st_read(const mg_st_file *f, const mg_st_tensor *x, size_t from, size_t n,
                     void *dst);
/* Tensor x's bytes in order, in pieces read into buf (cap bytes, the
 * caller's, for all its tensors), each given to eat (a checksum, a
 * digest), so that memory does not grow with the tensor; eat's failure
 * ends it. */
mg_status mg_st_each_piece(const mg_st_file *f, const mg_st_tensor *x, void *buf, size_t cap,
                           mg_status (*eat)(void *ud, const void *piece, size_t n), void *ud);
/* The file's length and header bytes (*len of them), its size, and its
 * bytes [off, off + len) into dst (MG_EINVAL past its end): what a holder
 * sends. */
const void *mg_st_head(const mg_st_file *f, size_t *len);
uint64_t mg_st_size(const mg_st_file *f);
mg_status mg_st_pread(const mg_st_file *f, uint64_t off, size_t len, void *dst);
/* "F32", ... and the element size in bytes. */
const char *mg_st_dtype_name(mg_st_dtype d);
size_t mg_st_dtype_size(mg_st_dtype d);

/* Training state beyond the arenas. */
typedef struct mg_ckpt_meta {
    char model[32];
    long step;          /* training steps taken */
    long epoch;         /* epochs completed */
    uint64_t seed;
    uint64_t rng_counter; /* dropout stream position: saved from the model
                             (mg_model_rng_counter), restored into it */
    /* The optimizer's steps (Adam's bias correction counts them): one per
     * training step, or under an asynchronous parameter server one per
     * push (each is an update). Saving, 0 takes the optimizer's own
     * (mg_optim_steps); loading, the file's. */
    long optimizer_steps;
    /* Hyper-parameters as "key=value;..." (checked on resume). */
    char hparams[512];
} mg_ckpt_meta;

/* Save parameters, buffers, optimizer state (o may be NULL) and meta (may
 * be NULL: the step is then the optimizer's; meta->model is ignored, the
 * model's name is written; with an optimizer, its steps may not be fewer
 * than meta->step, and the file keeps both, the steps beyond one per
 * training step as "optimizer_extra_steps", which loading checks). Optimizer
 * state is saved as "optim.<state>.<param name>" tensors of the
 * parameter's shape, e.g. optim.momentum_buffer.conv1.weight. A model on
 * a device goes to the host with its optimizer for the file and comes
 * back (so do they for mg_checkpoint_load). */
mg_status mg_checkpoint_save(const char *path, mg_model *m, mg_optim *o,
                             const mg_ckpt_meta *meta);
/* A checkpoint written by several processes into one file, each its own
 * byte ranges (a sharded strategy's ranks, each its pieces of the arena):
 * every process makes the same writer (the layout: tensors, offsets, file
 * size) from the same model shape, optimizer kind and meta, the same
 * optimizer steps and model dropout position (the header's numbers place
 * the tensors: mg_strategy_save agrees them first); one creates
 * the file (mg_atomic_begin with mg_ckpt_writer_size); each writes the
 * parameters and optimizer state of its arena ranges r (the optimizer must
 * hold their state), and the buffers where `buffers`, getting the CRC of
 * every piece it wrote; the creator, with every process's pieces, writes
 * the header (refusing bytes nobody or two processes wrote) and commits.
 * mg_checkpoint_save is this with one process writing everything. The
 * writer reads the model and optimizer in host memory. */
typedef struct mg_ckpt_writer mg_ckpt_writer;
/* Where a writer's bytes go: the file fd (path names it in messages), or
 * when write is set, write(ud, data, len, off) (another process writes
 * them: a job whose other nodes cannot reach the file). */
typedef struct mg_ckpt_sink {
    int fd;
    const char *path;
    mg_status (*write)(void *ud, const void *data, size_t len, uint64_t off);
    void *ud;
} mg_ckpt_sink;
typedef struct mg_ckpt_piece {
    int32_t tensor;     /* index in the file's table */
    uint32_t crc;       /* CRC-32 of the piece's bytes */
    uint64_t off, len;  /* bytes within the tensor's data */
} mg_ckpt_piece;
mg_status mg_ckpt_writer_create(mg_model *m, mg_optim *o, const mg_ckpt_meta *meta,
                                mg_ckpt_writer **out);
void mg_ckpt_writer_destroy(mg_ckpt_writer *w);
uint64_t mg_ckpt_writer_size(const mg_ckpt_writer *w);
/* *pieces (malloc'd, *np entries) gets the pieces written. */
mg_status mg_ckpt_write_part(mg_ckpt_writer *w, const mg_ckpt_sink *out, const mg_range *r,
                             int nr, bool buffers, mg_ckpt_piece **pieces, int *np);
/* Sorts pc. */
mg_status mg_ckpt_write_header(mg_ckpt_writer *w, const mg_ckpt_sink *out, mg_ckpt_piece *pc,
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
 * optimizer step count or RNG position over 2^53 - 1, whose optimizer step
 * count is not its
 * step, or with values no model or optimizer holds (not finite; Adam's
 * exp_avg_sq below 0), with a clear error; on error m and o are unchanged.
 * meta may be NULL. */
mg_status mg_checkpoint_load(const char *path, mg_model *m, mg_optim *o,
                             mg_ckpt_meta *meta);
/* mg_checkpoint_load from a file already open (mg_st_open,
 * mg_st_open_on_disk, or mg_st_open_remote: one only another process can
 * reach; mg_checkpoint_load itself opens it on disk); path names it
 * in messages. The model and optimizer are in host memory. Only the
 * parameters inside the arena ranges r are read (a rank's part: its
 * stages, its ZeRO-3 pieces; r NULL: all), and the buffers. */
mg_status mg_checkpoint_load_st(const mg_st_file *f, const char *path, mg_model *m, mg_optim *o,
                                const mg_range *r, int nr, mg_ckpt_meta *meta);
/* Load only parameters (and buffers if present) from any safetensors file
 * named as PyTorch's state_dict (e.g. exported from PyTorch); `prefix`
 * (may be NULL) is prepended to each name looked up ("init."). Values
 * must be finite. Tensors of the file under the prefix that the model has
 * no place for (a model of more layers) are refused, as PyTorch's strict
 * load_state_dict refuses them, when n_left_out is NULL; else they are
 * left out and *n_left_out counts them. A multigrad checkpoint's
 * optimizer state is always left out. A model on a device gets them
 * through host copies. */
mg_status mg_model_load_weights(const char *path, mg_model *m, const char *prefix,
                                int *n_left_out);
/* The same from a file already open (mg_st_open, mg_st_open_on_disk,
 * mg_st_open_remote), reading only the parameters inside the arena ranges
 * r (NULL: all), and the buffers; every tensor is checked whatever r. */
mg_status mg_model_load_weights_st(const mg_st_file *f, const char *path, mg_model *m,
                                   const char *prefix, const mg_range *r, int nr,
                                   int *n_left_out);

#ifdef __cplusplus
}
#endif
#endif
