/* safetensors files (https://github.com/huggingface/safetensors): u64
 * little-endian header length N, N bytes of JSON
 *   {"__metadata__": {str: str}, NAME: {"dtype": D, "shape": [..],
 *    "data_offsets": [BEGIN, END]}, ...}
 * padded with spaces to a multiple of 8 (as the Hugging Face writer does),
 * then the data, offsets relative to its start.
 *
 * The reader is strict and bounded: the JSON parser (st_json.c) accepts
 * exactly that schema, the header is at most 100 MB as in the reference
 * implementation, and the byte ranges must match dtype and shape, lie in
 * the file, and tile the data exactly (contiguous, no overlap, no slack).
 * mg_st_open reads the whole file into memory; mg_st_open_on_disk only
 * its header, reading the tensors' bytes when asked (and the checksum's
 * in pieces), so that a checkpoint larger than a process's part of it is
 * read without holding it.
 *
 * Integrity: the writer adds the metadata entry "multigrad.crc32", a CRC-32
 * of the contents (tensors by name with dtype, shape and data; metadata by
 * key), which the reader verifies when present; other tools ignore it. So
 * a flipped byte in one of our files is caught even where the JSON still
 * parses (a flip inside the key itself leaves the file unverified, which
 * mg_st_verified reports and checkpoints refuse). Writing is atomic:
 * temporary file in the same directory, fsync, rename, fsync of the
 * directory. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "multigrad/checkpoint.h"
#include "core/strbuf.h"
#include "st_internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define MAX_HEADER 100000000ULL
#define MAX_NDIM MG__ST_MAX_NDIM
#define CRC_KEY "multigrad.crc32"

const char *mg_st_dtype_name(mg_st_dtype d)
{
    MG_ASSERT((unsigned)d < MG_DTYPE_COUNT);
    return mg__dtypes[d].st_name;
}

size_t mg_st_dtype_size(mg_st_dtype d)
{
    MG_ASSERT((unsigned)d < MG_DTYPE_COUNT);
    return mg__dtypes[d].size;
}

/* dtype size * product of shape, or false on overflow. */
static bool tensor_bytes(mg_st_dtype d, int ndim, const int64_t *shape, uint64_t *out)
{
    uint64_t n = mg_st_dtype_size(d);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return false;
        uint64_t s = (uint64_t)shape[i];
        if (s != 0 && n > UINT64_MAX / s) return false;
        n *= s;
    }
    *out = n;
    return true;
}

/* The first of n names that appears twice, or NULL; sorts names in place
 * (n log n: a header may hold a million keys). */
static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char *duplicate(const char **names, size_t n)
{
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(names[i - 1], names[i])) return names[i];
    return NULL;
}

/* Tensor names (of t[0..n)) and metadata keys (keys[0], keys[2], ...; n_meta
 * of them): the first given twice, in *dup with *what "tensor name" or
 * "metadata key"; false when out of memory. */
static bool find_duplicate(const mg_st_tensor *t, int n, const char *const *keys, int n_meta,
                           const char **dup, const char **what)
{
    size_t cap = (size_t)(n > n_meta ? n : n_meta) + 1;
    const char **s = malloc(cap * sizeof *s);
    if (!s) return false;
    for (int i = 0; i < n; i++) s[i] = t[i].name;
    *what = "tensor name";
    if (!(*dup = duplicate(s, (size_t)n))) {
        for (int i = 0; i < n_meta; i++) s[i] = keys[2 * i];
        *what = "metadata key";
        *dup = duplicate(s, (size_t)n_meta);
    }
    free(s);
    return true;
}

/* ---- the checksum (shared by writer and reader) ---- */

typedef struct { const char *key, *value; } kv;

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const mg_st_tensor *const *)a)->name, (*(const mg_st_tensor *const *)b)->name);
}

static int cmp_kv(const void *a, const void *b)
{
    return strcmp(((const kv *)a)->key, ((const kv *)b)->key);
}

static uLong crc_str(uLong crc, const char *s)
{
    return crc32_z(crc, (const Bytef *)s, strlen(s) + 1);
}

/* CRC-32 of the contents: tensors sorted by name (name, dtype, shape,
 * data), then metadata sorted by key, the checksum entry left out.
 * sorted and pairs are scratch arrays (sorted in place). */
static uint32_t content_crc(const mg_st_tensor **sorted, int n, kv *pairs, int npairs,
                            const mg_st_tensor *base, const uint32_t *data_crc)
{
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_tensor_name);
    qsort(pairs, (size_t)npairs, sizeof *pairs, cmp_kv);
    uLong crc = crc32_z(0L, Z_NULL, 0);
    char dims[32];
    for (int i = 0; i < n; i++) {
        const mg_st_tensor *t = sorted[i];
        crc = crc_str(crc, t->name);
        crc = crc_str(crc, mg_st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) {
            snprintf(dims, sizeof dims, "%lld,", (long long)t->shape[d]);
            crc = crc32_z(crc, (const Bytef *)dims, strlen(dims));
        }
        crc = crc32_z(crc, (const Bytef *)"", 1);
        if (t->nbytes && data_crc)
            crc = crc32_combine(crc, data_crc[t - base], (z_off_t)t->nbytes);
        else if (t->nbytes)
            crc = crc32_z(crc, t->data, t->nbytes);
    }
    for (int i = 0; i < npairs; i++) {
        if (!strcmp(pairs[i].key, CRC_KEY)) continue;
        crc = crc_str(crc, pairs[i].key);
        crc = crc_str(crc, pairs[i].value);
    }
    return (uint32_t)crc;
}

/* ---- writer ---- */

static void puts_(mg__str *b, const char *s) { mg__str_put(b, s, strlen(s)); }

static mg_status check_write_args(const char *path, const mg_st_tensor *t, int n,
                                  const char *const *meta, int n_meta, bool need_data)
{
    for (int i = 0; i < n; i++) {
        uint64_t nb;
        if (!t[i].name || !t[i].name[0] || !strcmp(t[i].name, "__metadata__"))
            return mg_error(MG_EINVAL, "%s: tensor %d has no usable name", path, i);
        if (!mg__st_utf8(t[i].name))   /* the reader would refuse the file */
            return mg_error(MG_EINVAL, "%s: tensor name '%s' is not UTF-8: give its layers "
                            "UTF-8 names", path, t[i].name);
        if ((unsigned)t[i].dtype >= MG_DTYPE_COUNT || t[i].ndim < 0 || t[i].ndim > MAX_NDIM ||
            !tensor_bytes(t[i].dtype, t[i].ndim, t[i].shape, &nb) || nb != t[i].nbytes ||
            (nb && need_data && !t[i].data))
            return mg_error(MG_EINVAL, "%s: tensor '%s': dtype, shape and %zu data bytes "
                            "disagree", path, t[i].name, t[i].nbytes);
    }
    for (int i = 0; i < n_meta; i++) {
        if (!meta[2 * i] || !meta[2 * i + 1])
            return mg_error(MG_EINVAL, "%s: metadata entry %d is NULL", path, i);
        if (!mg__st_utf8(meta[2 * i]) || !mg__st_utf8(meta[2 * i + 1]))
            return mg_error(MG_EINVAL, "%s: metadata entry '%s' is not UTF-8", path,
                            meta[2 * i]);
        if (!strcmp(meta[2 * i], CRC_KEY))
            return mg_error(MG_EINVAL, "%s: metadata key '%s' is reserved", path, CRC_KEY);
    }
    const char *dup, *what;
    if (!find_duplicate(t, n, meta, n_meta, &dup, &what))
        return mg_error(MG_ENOMEM, "safetensors: out of memory");
    if (dup) return mg_error(MG_EINVAL, "%s: %s '%s' given twice", path, what, dup);
    return MG_OK;
}

static mg_status build_header(const mg_st_tensor *t, int n, const char *const *meta,
                              int n_meta, const uint32_t *data_crc, mg__str *h)
{
    const mg_st_tensor **sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    kv *pairs = malloc(((size_t)n_meta + 1) * sizeof *pairs);
    if (!sorted || !pairs) {
        free(sorted);
        free(pairs);
        return mg_error(MG_ENOMEM, "safetensors: out of memory");
    }
    for (int i = 0; i < n; i++) sorted[i] = &t[i];
    for (int i = 0; i < n_meta; i++) pairs[i] = (kv){meta[2 * i], meta[2 * i + 1]};
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", content_crc(sorted, n, pairs, n_meta, t, data_crc));
    free(sorted);
    free(pairs);

    char num[64];
    puts_(h, "{\"__metadata__\":{");
    for (int i = 0; i < n_meta; i++) {
        mg__str_json(h, meta[2 * i]);
        puts_(h, ":");
        mg__str_json(h, meta[2 * i + 1]);
        puts_(h, ",");
    }
    mg__str_json(h, CRC_KEY);
    puts_(h, ":");
    mg__str_json(h, crc);
    puts_(h, "}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        puts_(h, ",");
        mg__str_json(h, t[i].name);
        puts_(h, ":{\"dtype\":\"");
        puts_(h, mg_st_dtype_name(t[i].dtype));
        puts_(h, "\",\"shape\":[");
        for (int d = 0; d < t[i].ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
            puts_(h, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + t[i].nbytes));
        puts_(h, num);
        off += t[i].nbytes;
    }
    puts_(h, "}");
    while (h->len % 8) puts_(h, " ");
    if (h->oom) return mg_error(MG_ENOMEM, "safetensors: out of memory for the header");
    if (h->len > MAX_HEADER)
        return mg_error(MG_EINVAL, "safetensors: header of %zu bytes exceeds the format's "
                        "limit of %llu", h->len, MAX_HEADER);
    return MG_OK;
}

mg_status mg_st_write(const char *path, const mg_st_tensor *t, int n,
                      const char *const *meta, int n_meta)
{
    MG_ASSERT(n >= 0 && n_meta >= 0);
    MG_TRY(check_write_args(path, t, n, meta, n_meta, true));
    mg__str h = {0};
    mg_status st = build_header(t, n, meta, n_meta, NULL, &h);
    if (st) { free(h.s); return st; }

    uint8_t len8[8];
    uint64_t hl = h.len;
    memcpy(len8, &hl, 8);
    mg_piece *pc = malloc(sizeof *pc * (size_t)(n + 2));
    if (!pc) {
        free(h.s);
        return mg_error(MG_ENOMEM, "safetensors: out of memory");
    }
    pc[0] = (mg_piece){len8, 8};
    pc[1] = (mg_piece){h.s, h.len};
    for (int i = 0; i < n; i++) pc[i + 2] = (mg_piece){t[i].data, t[i].nbytes};
    st = mg_write_file_atomic_v(path, pc, n + 2);
    free(pc);
    free(h.s);
    return st;
}

mg_status mg_st_header(const mg_st_tensor *t, int n, const char *const *meta, int n_meta,
                       const uint32_t *data_crc, void **out, size_t *len)
{
    MG_ASSERT(n >= 0 && n_meta >= 0);
    *out = NULL;
    MG_TRY(check_write_args("safetensors header", t, n, meta, n_meta, false));
    mg__str h = {0};
    uint32_t *zeros = data_crc ? NULL : calloc((size_t)n + 1, sizeof *zeros);
    if (!data_crc && !zeros) return mg_error(MG_ENOMEM, "safetensors: out of memory");
    mg_status st = build_header(t, n, meta, n_meta, data_crc ? data_crc : zeros, &h);
    free(zeros);
    uint8_t *p = st ? NULL : malloc(h.len + 8);
    if (!st && !p) st = mg_error(MG_ENOMEM, "safetensors: out of memory");
    if (st) {
        free(h.s);
        return st;
    }
    uint64_t hl = h.len;
    memcpy(p, &hl, 8);
    memcpy(p + 8, h.s, h.len);
    free(h.s);
    *out = p;
    *len = h.len + 8;
    return MG_OK;
}

static int cmp_range(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* Ranges match dtype x shape, lie in the data and tile it exactly; no
 * name or metadata key appears twice. */
static mg_status check_layout(const char *path, mg_st_file *f, uint64_t *offs, uint64_t dlen)
{
    const uint8_t *data = f->read ? NULL : f->buf + (f->size - dlen);
    for (int i = 0; i < f->n; i++) {
        mg_st_tensor *t = &f->t[i];
        uint64_t nb, b = offs[2 * i], e = offs[2 * i + 1];
        if (!tensor_bytes(t->dtype, t->ndim, t->shape, &nb) || e < b || e - b != nb)
            return mg_error(MG_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] do not "
                            "hold a %s tensor of its shape: the file is damaged", path, t->name,
                            (unsigned long long)b, (unsigned long long)e,
                            mg_st_dtype_name(t->dtype));
        if (e > dlen)
            return mg_error(MG_EFORMAT, "%s: tensor '%s' ends at data byte %llu but the file "
                            "has %llu data bytes: the file is truncated", path, t->name,
                            (unsigned long long)e, (unsigned long long)dlen);
        t->data = f->read ? NULL : data + b;
        t->offset = b;
        t->nbytes = (size_t)nb;
    }
    /* Sort copies of the ranges: contiguous from 0, no overlap, to dlen. */
    uint64_t *r = malloc(((size_t)f->n + 1) * 2 * sizeof *r);
    if (!r) return mg_error(MG_ENOMEM, "safetensors: out of memory");
    if (f->n) memcpy(r, offs, (size_t)f->n * 2 * sizeof *r);
    qsort(r, (size_t)f->n, 2 * sizeof *r, cmp_range);
    uint64_t pos = 0;
    for (int i = 0; i < f->n && pos != UINT64_MAX; i++)
        pos = r[2 * i] == pos ? r[2 * i + 1] : UINT64_MAX;
    free(r);
    if (pos != dlen)
        return mg_error(MG_EFORMAT, "%s: tensor byte ranges %s: the file is damaged", path,
                        pos == UINT64_MAX ? "overlap or leave gaps"
                                          : "do not cover the data (trailing bytes)");
    const char *dup, *what;
    if (!find_duplicate(f->t, f->n, f->meta, f->nmeta, &dup, &what))
        return mg_error(MG_ENOMEM, "safetensors: out of memory");
    if (dup)
        return mg_error(MG_EFORMAT, "%s: duplicate %s '%s': the file is damaged", path, what,
                        dup);
    return MG_OK;
}

static mg_status crc_piece(void *ud, const void *piece, size_t n)
{
    uLong *c = ud;
    *c = crc32_z(*c, piece, n);
    return MG_OK;
}

/* The CRC-32 of each tensor's data of a file not in memory, read in
 * pieces of 1 MB. */
static mg_status data_crcs(const mg_st_file *f, uint32_t *crc)
{
    enum { PIECE = 1 << 20 };
    uint8_t *b = malloc(PIECE);
    mg_status st = b ? MG_OK : mg_error(MG_ENOMEM, "safetensors: out of memory");
    for (int i = 0; i < f->n && !st; i++) {
        uLong c = crc32_z(0L, Z_NULL, 0);
        st = mg_st_each_piece(f, &f->t[i], b, PIECE, crc_piece, &c);
        crc[i] = (uint32_t)c;
    }
    free(b);
    return st;
}

static mg_status verify_crc(const char *path, mg_st_file *f)
{
    const char *want = mg_st_meta(f, CRC_KEY);
    if (!want) return MG_OK;
    const mg_st_tensor **s = malloc(((size_t)f->n + 1) * sizeof *s);
    kv *pairs = malloc(((size_t)f->nmeta + 1) * sizeof *pairs);
    uint32_t *crc = f->read ? malloc(((size_t)f->n + 1) * sizeof *crc) : NULL;
    mg_status st = s && pairs && (crc || !f->read) ? MG_OK
                                                   : mg_error(MG_ENOMEM, "safetensors: out of "
                                                              "memory");
    if (!st && crc) st = data_crcs(f, crc);
    char got[16] = "";
    if (!st) {
        for (int i = 0; i < f->n; i++) s[i] = &f->t[i];
        for (int i = 0; i < f->nmeta; i++) pairs[i] = (kv){f->meta[2 * i], f->meta[2 * i + 1]};
        snprintf(got, sizeof got, "%08x", content_crc(s, f->n, pairs, f->nmeta, f->t, crc));
    }
    free(s);
    free(pairs);
    free(crc);
    if (st) return st;
    if (strcmp(got, want) != 0)
        return mg_error(MG_EFORMAT, "%s: checksum mismatch (stored %.16s, contents %s): the "
                        "file changed after it was written: damaged, or edited (a file edited "
                        "on purpose loads once its metadata has no 'multigrad.crc32')", path,
                        want, got);
    f->verified = true;
    return MG_OK;
}

static mg_status read_file(const char *path, mg_st_file *f)
{
    struct stat sb;
    int fd = mg_open_regular(path, NULL, &sb);
    if (fd < 0) return MG_EIO;
    f->size = (size_t)sb.st_size;
    mg_status st = (f->buf = mg_alloc(f->size + 1))
                       ? mg_pread_all(fd, f->buf, f->size, 0, path)
                       : mg_error(MG_ENOMEM, "%s: cannot allocate %zu bytes to read it", path,
                                  f->size);
    close(fd);
    return st;
}

/* The header of f (f->size bytes; f->buf its first head bytes, or all of
 * them): parsed, its layout checked, and where this process checks the
 * contents, its checksum verified. */
static mg_status parse(const char *path, mg_st_file *f, size_t head)
{
    uint64_t *offs = NULL, hlen = 0;
    if (f->size < 8 || head < 8) {
        return mg_error(MG_EFORMAT, "%s: %zu bytes, too short for a safetensors file: it is "
                        "truncated or of another format", path, f->size);
    }
    memcpy(&hlen, f->buf, 8);
    if (hlen > MAX_HEADER || hlen > f->size - 8 || hlen > head - 8) {
        return mg_error(MG_EFORMAT, "%s: header length %llu %s: the file is truncated or not "
                        "safetensors", path, (unsigned long long)hlen,
                        hlen > MAX_HEADER ? "exceeds the 100 MB limit"
                                          : "runs past the end of the file");
    }
    if (!(f->strings = malloc(hlen + 1))) return mg_error(MG_ENOMEM, "%s: out of memory", path);
    size_t errpos;
    const char *err = mg__st_parse_header(f, (const char *)f->buf + 8, (size_t)hlen, &offs,
                                          &errpos);
    mg_status st = MG_OK;
    if (err)
        st = mg_error(MG_EFORMAT, "%s: bad safetensors header: %s at header byte %zu: the "
                      "file is damaged or not safetensors", path, err, errpos);
    if (!st) st = check_layout(path, f, offs, f->size - 8 - hlen);
    f->head = (size_t)hlen + 8;
    if (!st && f->checks) st = verify_crc(path, f);
    free(offs);
    return st;
}

/* A file's mg_st_file, before it is read. */
static mg_st_file *new_file(bool checks)
{
    mg_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        mg_error(MG_ENOMEM, "safetensors: out of memory");
        return NULL;
    }
    f->fd = -1;
    f->checks = checks;
    return f;
}

mg_status mg_st_open(const char *path, mg_st_file **out)
{
    *out = NULL;
    mg_st_file *f = new_file(true);
    if (!f) return MG_ENOMEM;
    mg_status st = read_file(path, f);
    if (!st) st = parse(path, f, f->size);
    if (st) {
        mg_st_close(f);
        return st;
    }
    *out = f;
    return MG_OK;
}

/* Bytes [off, off + len) of a file on disk. */
static mg_status disk_read(void *ud, uint64_t off, size_t len, void *dst)
{
    const mg_st_file *f = ud;
    return mg_pread_all(f->fd, dst, len, off, f->path);
}

mg_status mg_st_open_on_disk(const char *path, mg_st_file **out)
{
    *out = NULL;
    mg_st_file *f = new_file(true);
    if (!f) return MG_ENOMEM;
    if (!(f->path = strdup(path))) {
        mg_st_close(f);
        return mg_error(MG_ENOMEM, "safetensors: out of memory");
    }
    struct stat sb;
    f->fd = mg_open_regular(path, NULL, &sb);
    mg_status st = f->fd < 0 ? MG_EIO : MG_OK;
    f->size = st ? 0 : (size_t)sb.st_size;
    f->read = disk_read;
    f->read_ud = f;
    uint64_t hlen = 0;
    if (!st && f->size >= 8) st = disk_read(f, 0, 8, &hlen);
    /* Only what the header claims, within the file and the limit (parse
     * says what is wrong otherwise). */
    size_t head = !st && f->size >= 8 && hlen <= MAX_HEADER && hlen <= f->size - 8
                      ? (size_t)hlen + 8 : (f->size < 8 ? f->size : 8);
    if (!st && !(f->buf = malloc(head + 1)))
        st = mg_error(MG_ENOMEM, "%s: out of memory for its header", path);
    if (!st) st = disk_read(f, 0, head, f->buf);
    if (!st) st = parse(path, f, head);
    if (st) {
        mg_st_close(f);
        return st;
    }
    *out = f;
    return MG_OK;
}

mg_status mg_st_open_remote(const char *name, const void *head, size_t len, uint64_t size,
                            bool verified, mg_st_read_fn read, void *ud, mg_st_file **out)
{
    *out = NULL;
    mg_st_file *f = new_file(false);
    if (!f) return MG_ENOMEM;
    if (!(f->buf = malloc(len + 1))) {
        free(f);
        return mg_error(MG_ENOMEM, "safetensors: out of memory");
    }
    memcpy(f->buf, head, len);
    f->size = (size_t)size;
    f->read = read;
    f->read_ud = ud;
    mg_status st = size != (size_t)size ? mg_error(MG_EFORMAT, "%s: too large", name)
                                        : parse(name, f, len);
    if (st) {
        mg_st_close(f);
        return st;
    }
    f->verified = verified;
    *out = f;
    return MG_OK;
}

const void *mg_st_head(const mg_st_file *f, size_t *len)
{
    *len = f->head;
    return f->buf;
}

uint64_t mg_st_size(const mg_st_file *f) { return f->size; }

mg_status mg_st_pread(const mg_st_file *f, uint64_t off, size_t len, void *dst)
{
    if (off > f->size || len > f->size - off)
        return mg_error(MG_EINVAL, "safetensors: bytes %llu-%llu are past the file's %zu",
                        (unsigned long long)off, (unsigned long long)(off + len), f->size);
    if (f->read) return f->read(f->read_ud, off, len, dst);
    memcpy(dst, f->buf + off, len);
    return MG_OK;
}

mg_status mg_st_read(const mg_st_file *f, const mg_st_tensor *x, size_t from, size_t n,
                     void *dst)
{
    MG_ASSERT(from <= x->nbytes && n <= x->nbytes - from);
    if (!f->read) {
        memcpy(dst, (const uint8_t *)x->data + from, n);
        return MG_OK;
    }
    return f->read(f->read_ud, f->head + x->offset + from, n, dst);
}

mg_status mg_st_each_piece(const mg_st_file *f, const mg_st_tensor *x, void *buf, size_t cap,
                           mg_status (*eat)(void *ud, const void *piece, size_t n), void *ud)
{
    MG_ASSERT(cap > 0);
    mg_status st = MG_OK;
    for (size_t at = 0, k; at < x->nbytes && !st; at += k) {
        k = x->nbytes - at < cap ? x->nbytes - at : cap;
        st = mg_st_read(f, x, at, k, buf);
        if (!st) st = eat(ud, buf, k);
    }
    return st;
}

void mg_st_close(mg_st_file *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    if (f->read) free(f->buf);
    else mg_free(f->buf);
    free(f->strings);
    free(f->t);
    free(f->meta);
    free(f);
}

int mg_st_count(const mg_st_file *f) { return f->n; }

const mg_st_tensor *mg_st_get(const mg_st_file *f, int i)
{
    MG_ASSERT(i >= 0 && i < f->n);
    return &f->t[i];
}

const mg_st_tensor *mg_st_find(const mg_st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

const char *mg_st_meta(const mg_st_file *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

int mg_st_meta_count(const mg_st_file *f) { return f->nmeta; }

const char *mg_st_meta_at(const mg_st_file *f, int i, const char **key)
{
    MG_ASSERT(i >= 0 && i < f->nmeta);
    if (key) *key = f->meta[2 * i];
    return f->meta[2 * i + 1];
}

bool mg_st_verified(const mg_st_file *f) { return f->verified; }
bool mg_st_checks_contents(const mg_st_file *f) { return f->checks; }
