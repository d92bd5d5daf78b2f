/* Internal to src/data: the safetensors file object shared by
 * safetensors.c (framing, layout checks, CRC, writer) and st_json.c (the
 * header parser). */
#ifndef MG_ST_INTERNAL_H
#define MG_ST_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include "core/dtype.h"
#include "multigrad/checkpoint.h"

#define MG__ST_MAX_NDIM 8

struct mg_st_file {
    uint8_t *buf;          /* the whole file (on disk or remote: its first head bytes) */
    size_t size, head;     /* bytes in the file, before its data */
    mg_st_read_fn read;    /* the bytes of a file not in buf (on disk, remote), or NULL */
    void *read_ud;
    int fd;                /* a file on disk (mg_st_open_on_disk), else -1 */
    char *path;            /* its path, for messages */
    bool checks;           /* this process checks the contents (not another's) */
    char *strings;         /* decoded names, keys and values */
    mg_st_tensor *t;
    int n, cap;
    const char **meta;     /* key, value pairs */
    int nmeta, metacap;
    bool verified;
};

/* s is valid UTF-8 (what the reader takes in a header's strings). */
bool mg__st_utf8(const char *s);

/* Parses the header JSON [json, json + len) into f->t (names, dtypes,
 * shapes; offsets into *offs as [begin, end] pairs) and f->meta, decoding
 * strings into f->strings (len + 1 bytes). Returns NULL, or what is wrong
 * with *errpos its byte offset. */
const char *mg__st_parse_header(mg_st_file *f, const char *json, size_t len, uint64_t **offs,
                                size_t *errpos);

#endif
