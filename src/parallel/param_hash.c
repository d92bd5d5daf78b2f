/* The parameters' fingerprint (mgtrain --print-hash): a SHA-256 of the
 * model's parameters as logical tensors, whatever plan holds them, so that
 * two runs of the same training under different world sizes or plans can
 * be compared bit for bit.
 *
 * The strategy writes its parameters as a logical checkpoint (every rank
 * its part: ZeRO's pieces, a pipeline's stages, tensor-parallel shards put
 * back in place) into a temporary file of rank 0's; rank 0 reads it back
 * and hashes each parameter in the model's table order: its name and a
 * NUL, its dtype's name and a NUL, its logical shape (int64 little-endian
 * each, after their count), and its bytes. Buffers (running statistics)
 * are left out: they are each replica's own under data parallelism.
 * Every rank gets the digest.
 * Limits: costs one checkpoint's write and read (in TMPDIR, else /tmp);
 * collective over the job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <openssl/evp.h>
#include "multigrad/checkpoint.h"
#include "parallel/internal.h"

static mg_status digest_piece(void *md, const void *piece, size_t n)
{
    return EVP_DigestUpdate(md, piece, n) == 1
               ? MG_OK : mg_error(MG_ENOMEM, "--print-hash: SHA-256 failed");
}

/* Rank 0: the digest of the parameters in the file at path. */
static mg_status digest_file(mg_model *m, const char *path, uint8_t out[32])
{
    enum { PIECE = 1 << 20 };
    mg_st_file *f;
    MG_TRY(mg_st_open_on_disk(path, &f));
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    uint8_t *b = malloc(PIECE);
    mg_status st = md && b && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1
                       ? MG_OK : mg_error(MG_ENOMEM, "--print-hash: cannot start SHA-256");
    for (int i = 0; !st && i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        if (p->is_buffer) continue;
        const mg_st_tensor *x = mg_st_find(f, p->name);
        if (!x) {
            st = mg_error(MG_EFORMAT, "--print-hash: %s has no tensor %s", path, p->name);
            break;
        }
        const char *dt = mg_st_dtype_name(x->dtype);
        int64_t dims[9] = {x->ndim};
        for (int d = 0; d < x->ndim && d < 8; d++) dims[d + 1] = x->shape[d];
        if (EVP_DigestUpdate(md, p->name, strlen(p->name) + 1) != 1 ||
            EVP_DigestUpdate(md, dt, strlen(dt) + 1) != 1 ||
            EVP_DigestUpdate(md, dims, sizeof *dims * (size_t)(x->ndim + 1)) != 1)
            st = mg_error(MG_ENOMEM, "--print-hash: SHA-256 failed");
        if (!st) st = mg_st_each_piece(f, x, b, PIECE, digest_piece, md);   /* the data */
    }
    unsigned len = 0;
    if (!st && (EVP_DigestFinal_ex(md, out, &len) != 1 || len != 32))
        st = mg_error(MG_ENOMEM, "--print-hash: SHA-256 failed");
    EVP_MD_CTX_free(md);
    free(b);
    mg_st_close(f);
    return st;
}

mg_status mg_strategy_param_hash(mg_strategy *s, uint8_t out[32])
{
    mg_group *g = mg_strategy_group(s);
    bool root = !g || mg_group_rank(g) == 0;
    char path[512] = "";
    mg_status st = MG_OK;
    if (root) {   /* a name of rank 0's, for every rank */
        const char *dir = mg_env_other("TMPDIR");
        snprintf(path, sizeof path, "%s/mg-param-hash-XXXXXX", dir && *dir ? dir : "/tmp");
        int fd = mkstemp(path);
        if (fd < 0) st = mg_error(MG_EIO, "--print-hash: cannot make a file in %s (TMPDIR)",
                                  dir && *dir ? dir : "/tmp");
        else close(fd);
    }
    st = mg_strategy_agree(s, st);
    if (!st && g) st = mg_broadcast(g, path, sizeof path, MG_U8, 0);
    if (!st) st = mg_strategy_save(s, path, NULL, NULL);
    if (!st && root) st = digest_file(mg_strategy_model(s), path, out);
    if (root && *path) unlink(path);
    st = mg_strategy_agree(s, st);
    if (!st && g) st = mg_broadcast(g, out, 32, MG_U8, 0);
    return st;
}
