/* IDX files (MNIST, Fashion-MNIST): a big-endian header (magic 0x000008NN:
 * u8 data, NN = 1..4 dimensions; then NN u32 sizes) and row-major u8 data.
 * Plain or gzip, told apart by the gzip magic (zlib reads both). Strict:
 * other element types, sizes over MG_IDX_MAX_BYTES (checked before any
 * allocation), a short file and trailing bytes are all errors, as is a
 * gzip stream that is damaged or fails its CRC. Only regular files are
 * opened (a FIFO is refused, not waited on). The header can be read alone
 * (mg_idx_load_header), so that a data set compares its files' headers
 * before it inflates megabytes of data. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "multigrad/data.h"

#define MG_IDX_MAX_BYTES ((size_t)1 << 30)

/* Reads exactly n bytes; returns the count read (< n at end of file) or -1. */
static long long read_full(gzFile f, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        size_t want = n - got > (1u << 30) ? (1u << 30) : n - got;
        int r = gzread(f, (char *)buf + got, (unsigned)want);
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (long long)got;
}

static mg_status read_error(gzFile f, const char *path, const char *what)
{
    int zerr;
    const char *msg = gzerror(f, &zerr);
    if (zerr == Z_ERRNO)
        return mg_error(MG_EIO, "%s: read error in %s: %s", path, what, strerror(errno));
    return mg_error(MG_EFORMAT, "%s: damaged gzip data (%s): re-download or reinstall "
                    "the file", path, msg);
}

/* The header into out (ndim, dims, size), then the data if body. */
static mg_status idx_read(const char *path, mg_idx *out, bool body)
{
    memset(out, 0, sizeof *out);
    MG_NEED("mg_idx_load", path);
    struct stat sb;
    int fd = mg_open_regular(path, NULL, &sb);
    if (fd < 0) return MG_EIO;
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        close(fd);
        return mg_error(MG_ENOMEM, "cannot read %s: out of memory", path);
    }
    /* zlib's buffer: 256 KiB to read a large file's data, 4 KiB for a
     * header or a small file. */
    unsigned buf = 1u << 12;
    if (body && sb.st_size > (off_t)buf) buf = sb.st_size < (1 << 18) ? (unsigned)sb.st_size : 1u << 18;
    gzbuffer(f, buf);
    mg_status st = MG_OK;
    uint8_t hdr[4 + 4 * 4];
    uint8_t *data = NULL;
    long long r = read_full(f, hdr, 4);
    if (r < 0) { st = read_error(f, path, "the header"); goto done; }
    if (r < 4) {
        st = mg_error(MG_EFORMAT, "%s: %lld bytes, too short for an IDX header: the file is "
                      "truncated or not IDX", path, r);
        goto done;
    }
    unsigned magic = (unsigned)hdr[0] << 24 | (unsigned)hdr[1] << 16 |
                     (unsigned)hdr[2] << 8 | hdr[3];
    if (hdr[0] != 0 || hdr[1] != 0 || hdr[3] < 1 || hdr[3] > 4) {
        st = mg_error(MG_EFORMAT, "%s: bad IDX magic 0x%08x (expected 0x000008NN, NN = 1..4 "
                      "dimensions): not an IDX file, or damaged", path, magic);
        goto done;
    }
    if (hdr[2] != 0x08) {
        st = mg_error(MG_EFORMAT, "%s: IDX element type 0x%02x (magic 0x%08x) is not "
                      "unsigned bytes (0x08): only u8 IDX files (MNIST-style) are read",
                      path, hdr[2], magic);
        goto done;
    }
    int ndim = hdr[3];
    r = read_full(f, hdr + 4, 4 * (size_t)ndim);
    if (r < 0) { st = read_error(f, path, "the header"); goto done; }
    if (r < 4 * ndim) {
        st = mg_error(MG_EFORMAT, "%s: truncated IDX header (%d dimension sizes expected)",
                      path, ndim);
        goto done;
    }
    size_t size = 1;
    for (int d = 0; d < ndim; d++) {
        const uint8_t *b = hdr + 4 + 4 * d;
        out->dims[d] = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
        if (out->dims[d] != 0 && size > MG_IDX_MAX_BYTES / out->dims[d]) {
            st = mg_error(MG_EFORMAT, "%s: IDX dimension %d of size %u makes the data larger "
                          "than %zu bytes: the header is damaged", path, d, out->dims[d],
                          MG_IDX_MAX_BYTES);
            goto done;
        }
        size *= out->dims[d];
    }
    /* A plain file's length is known: check it before allocating. (A gzip
     * stream's is not; its buffer is only committed as data arrives.) */
    size_t want = 4 + 4 * (size_t)ndim + size;
    if (gzdirect(f) && (size_t)sb.st_size != want) {
        if ((size_t)sb.st_size < want)
            st = mg_error(MG_EFORMAT, "%s: truncated: the header announces %zu data bytes, "
                          "the file holds %zu: re-download or reinstall it", path, size,
                          (size_t)sb.st_size - (want - size));
        else
            st = mg_error(MG_EFORMAT, "%s: trailing bytes after the %zu data bytes the header "
                          "announces: the file is damaged or not IDX", path, size);
        goto done;
    }
    if (!body) {
        out->ndim = ndim;
        out->size = size;
        goto done;
    }
    data = mg_alloc(size);
    if (!data) {
        st = mg_error(MG_ENOMEM, "%s: cannot allocate %zu bytes of IDX data", path, size);
        goto done;
    }
    r = read_full(f, data, size);
    if (r < 0) { st = read_error(f, path, "the data"); goto done; }
    if ((size_t)r < size) {
        st = mg_error(MG_EFORMAT, "%s: truncated: the header announces %zu data bytes, the "
                      "file holds %lld: re-download or reinstall it", path, size, r);
        goto done;
    }
    /* One more byte: must be end of file (this also makes zlib check the CRC). */
    uint8_t extra;
    r = read_full(f, &extra, 1);
    if (r < 0) { st = read_error(f, path, "the data"); goto done; }
    if (r > 0) {
        st = mg_error(MG_EFORMAT, "%s: trailing bytes after the %zu data bytes the header "
                      "announces: the file is damaged or not IDX", path, size);
        goto done;
    }
    out->ndim = ndim;
    out->size = size;
    out->data = data;
    data = NULL;
done:
    gzclose(f);
    mg_free(data);
    if (st) memset(out, 0, sizeof *out);
    return st;
}

mg_status mg_idx_load(const char *path, mg_idx *out) { return idx_read(path, out, true); }

mg_status mg_idx_load_header(const char *path, mg_idx *out)
{
    return idx_read(path, out, false);
}

void mg_idx_free(mg_idx *idx)
{
    if (!idx) return;
    mg_free(idx->data);
    memset(idx, 0, sizeof *idx);
}
