/* A job's checkpoint file, written and read by all its ranks although only
 * rank 0 need reach the path.
 *
 * The file is one logical checkpoint (nn/checkpoint.c): rank 0 creates it
 * under a temporary name, every rank writes the bytes of the pieces it
 * holds, rank 0 writes the header and renames; on resume every rank reads
 * the tensors it needs. Nodes of a cluster often share no filesystem, or
 * mount it elsewhere, so a rank writes and reads directly only when it
 * sees rank 0's very file: rank 0 writes a random token into the new
 * temporary file (saving) or sends the file's header bytes (loading), and
 * a rank sees the file when it reads those bytes back at rank 0's absolute
 * path. The others go through rank 0: it serves them one at a time, after
 * its own part, taking their bytes to write (or sending the bytes they
 * ask for) in pieces of at most RELAY_CHUNK, so no process holds more than
 * one piece beyond its model. The ranks that see the file keep writing
 * their slices in parallel. MG_CKPT_RELAY=always sends every rank through
 * rank 0 (a shared filesystem slow from every node, and the tests);
 * --verbose (mg_debug) says who went which way.
 *
 * Limits: relayed bytes cross rank 0's links one rank after another, and
 * a rank waiting for its turn waits under the group's deadline
 * (MG_TIMEOUT); a rank whose relayed read fails part-way has a partial
 * state, which is why every rank learns the outcome (mg_group_agree) and the
 * job stops on any failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include "parallel/internal.h"
#include "core/strbuf.h"

#define RELAY_CHUNK ((size_t)4 << 20)
#define PATH_CAP 4096
#define TOKEN 16

/* Tags of the relay's messages (no step is in flight during a save). */
enum { TAG_GO = 0x6d67c000, TAG_WRITE, TAG_DATA, TAG_READ, TAG_OK };

/* How a rank takes part: nothing to write, directly, through rank 0. */
enum { NONE, DIRECT, RELAY };

/* The absolute form of path (its directory resolved), or false. */
static bool absolute(const char *path, char *out, size_t cap)
{
    char d[PATH_CAP], b[PATH_CAP], real[PATH_MAX];
    snprintf(d, sizeof d, "%s", path);
    snprintf(b, sizeof b, "%s", path);
    if (!realpath(dirname(d), real)) return false;
    return (size_t)snprintf(out, cap, "%s/%s", real, basename(b)) < cap;
}

static bool relay_forced(void) { return !strcmp(mg_env_str("MG_CKPT_RELAY", "auto"), "always"); }

/* The ranks of `all` (world entries) in mode m, as "0,2-5". */
static void list_ranks(const uint8_t *all, int world, uint8_t m, char *out, size_t cap)
{
    size_t k = 0;
    if (cap) out[0] = 0;
    for (int r = 0; r < world; r++) {
        if (all[r] != m) continue;
        int e = r;
        while (e + 1 < world && all[e + 1] == m) e++;
        k = e > r ? mg__catf(out, cap, k, "%s%d-%d", k ? "," : "", r, e)
                  : mg__catf(out, cap, k, "%s%d", k ? "," : "", r);
        r = e;
    }
}

/* Every rank's way (world bytes) from each one's own; rank 0 says them
 * in --verbose: "ranks 0,2 write directly; rank 1 through rank 0 (...)". */
static mg_status share_modes(mg_group *g, uint8_t mine, uint8_t *all, const char *verb,
                             const char *path)
{
    MG_TRY(mg_all_gather(g, &mine, all, 1, MG_U8));
    if (mg_group_rank(g) != 0 || !mg_verbose()) return MG_OK;
    static const uint8_t order[3] = {DIRECT, RELAY, NONE};
    const char *how[3] = {"no part", "directly", "through rank 0"};
    char line[1024];
    size_t k = 0;
    for (int i = 0; i < 3 && k < sizeof line; i++) {
        uint8_t m = order[i];
        char l[256];
        list_ranks(all, mg_group_size(g), m, l, sizeof l);
        bool one = !strpbrk(l, ",-");
        if (*l)
            k = mg__catf(line, sizeof line, k, "%srank%s %s %s%s %s%s",
                         k ? "; " : "", one ? "" : "s", l, m ? verb : "hold",
                         one ? "s" : "", how[m],
                         m != RELAY ? ""
                         : relay_forced() ? " (MG_CKPT_RELAY=always)"
                         : " (they do not see its file)");
    }
    mg_debug("checkpoint %s: %s", path, line);
    return MG_OK;
}

/* ---- saving ---------------------------------------------------------------- */

/* A relaying rank's writes: (offset, length) then the bytes, a piece at a
 * time, to rank 0; (0, 0) ends them (relay_end). */
static mg_status relay_write(void *group, const void *data, size_t len, uint64_t off)
{
    mg_group *g = group;
    for (size_t at = 0, k; at < len; at += k) {
        k = len - at < RELAY_CHUNK ? len - at : RELAY_CHUNK;
        uint64_t h[2] = {off + at, k};
        MG_TRY(mg_send(g, h, sizeof h, MG_U8, 0, TAG_WRITE));
        MG_TRY(mg_send(g, (const uint8_t *)data + at, k, MG_U8, 0, TAG_DATA));
    }
    return MG_OK;
}

static mg_status relay_end(mg_group *g, int tag)
{
    uint64_t h[2] = {0, 0};
    return mg_send(g, h, sizeof h, MG_U8, 0, tag);
}

/* Rank 0 writes rank q's bytes until its (0, 0): all of them, even after a
 * failure (q sends on; the first error is kept). */
static mg_status serve_writes(mg_group *g, int q, int fd, const char *tmp, uint64_t size,
                              uint8_t *buf)
{
    MG_TRY(mg_send(g, &q, 1, MG_I32, q, TAG_GO));
    mg_status st = MG_OK;
    for (;;) {
        uint64_t h[2];
        MG_TRY(mg_recv(g, h, sizeof h, MG_U8, q, TAG_WRITE));
        if (!h[1]) return st;
        char who[128];
        mg_group_rank_name(g, q, who, sizeof who);
        if (h[1] > RELAY_CHUNK)
            return mg_error(MG_EFORMAT, "checkpoint %s: %s sent a piece of %llu bytes, over %zu",
                            tmp, who, (unsigned long long)h[1], RELAY_CHUNK);
        MG_TRY(mg_recv(g, buf, h[1], MG_U8, q, TAG_DATA));
        if (!st && (h[0] > size || h[1] > size - h[0]))
            st = mg_error(MG_EFORMAT, "checkpoint %s: %s wrote past its end", tmp, who);
        if (!st) st = mg_pwrite_all(fd, buf, h[1], h[0], tmp);
    }
}

/* Rank 0 made the temporary file (fd, tmp) and wrote TOKEN random bytes
 * at its start; the others, with something to write, open it if they see
 * it. */
typedef struct {
    char path[PATH_CAP];
    uint8_t token[TOKEN];
} probe;

static uint8_t see_save(const probe *p, bool has, int *fd)
{
    *fd = -1;
    if (!has) return NONE;
    if (relay_forced() || !p->path[0]) return RELAY;
    uint8_t got[TOKEN];
    *fd = open(p->path, O_RDWR | O_CLOEXEC);
    if (*fd >= 0 && pread(*fd, got, TOKEN, 0) == TOKEN && !memcmp(got, p->token, TOKEN))
        return DIRECT;
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return RELAY;
}

mg_status mg__ckpt_save(mg_group *g, mg_ckpt_writer *w, const char *path, const mg_range *r,
                        int nr, bool buffers)
{
    int rank = mg_group_rank(g), world = mg_group_size(g);
    char tmp[PATH_CAP] = "";
    int fd = -1;
    probe p = {{0}};
    uint8_t *modes = calloc((size_t)world, 1), *buf = rank == 0 ? malloc(RELAY_CHUNK) : NULL;
    mg_status st = !modes || (rank == 0 && !buf)
                       ? mg_error(MG_ENOMEM, "checkpoint %s: out of memory", path) : MG_OK;
    if (rank == 0 && !st) {
        st = mg_atomic_begin(path, mg_ckpt_writer_size(w), tmp, sizeof tmp, &fd);
        if (!st && (getrandom(p.token, TOKEN, 0) != TOKEN ||
                    mg_pwrite_all(fd, p.token, TOKEN, 0, tmp) || fdatasync(fd) != 0))
            st = mg_error(MG_EIO, "checkpoint %s: cannot write %s: %s", path, tmp,
                          strerror(errno));
        if (!st && !absolute(tmp, p.path, sizeof p.path)) p.path[0] = 0;   /* all relay */
    }
    st = mg_group_agree(g, st, MG_AGREE_SHARE);
    if (!st) st = mg_broadcast(g, &p, sizeof p, MG_U8, 0);
    uint8_t mine = rank == 0 ? DIRECT : NONE;
    if (!st && rank != 0) mine = see_save(&p, nr > 0 || buffers, &fd);
    if (!st) st = share_modes(g, mine, modes, "write", path);
    /* Write: directly, or through rank 0 when it says go; rank 0 its own
     * part, then the relaying ranks' one after another. */
    mg_ckpt_piece *pc = NULL;
    int np = 0;
    if (!st && mine != NONE) {
        mg_ckpt_sink out = {.fd = fd, .path = rank == 0 ? tmp : p.path};
        if (mine == RELAY) {
            int32_t go;
            st = mg_recv(g, &go, 1, MG_I32, 0, TAG_GO);
            out = (mg_ckpt_sink){.path = path, .write = relay_write, .ud = g};
        }
        if (!st) {
            st = mg_ckpt_write_part(w, &out, r, nr, buffers, &pc, &np);
            if (mine == RELAY) {   /* the end, whatever happened */
                mg_status e = relay_end(g, TAG_WRITE);
                st = st ? st : e;
            }
        }
        char me[128];
        if (!st && mine == DIRECT && rank != 0 && fsync(fd) != 0)
            st = mg_error(MG_EIO, "%s cannot sync %s: %s",
                          mg_group_rank_name(g, rank, me, sizeof me), p.path, strerror(errno));
    }
    if (rank != 0 && fd >= 0) close(fd);
    for (int q = 1; q < world && rank == 0 && fd >= 0; q++)
        if (modes[q] == RELAY) {
            mg_status e = serve_writes(g, q, fd, tmp, mg_ckpt_writer_size(w), buf);
            st = st ? st : e;
        }
    free(buf);
    free(modes);
    st = mg_group_agree(g, st, MG_AGREE_SHARE);
    /* Rank 0 gets every rank's pieces: the counts, then as many as the
     * most any rank has; writes the header and renames. */
    int32_t most = np;
    if (!st) st = mg_all_reduce(g, &most, &most, 1, MG_I32, MG_MAX);
    mg_ckpt_piece *all = NULL;
    if (!st) {
        mg_ckpt_piece *each = calloc((size_t)most + 1, sizeof *each);
        all = calloc((size_t)most * (size_t)world + 1, sizeof *all);
        if (!each || !all) st = mg_error(MG_ENOMEM, "checkpoint %s: out of memory", path);
        for (int i = 0; i < most && !st; i++) each[i] = i < np ? pc[i] : (mg_ckpt_piece){-1};
        if (!st) st = mg_all_gather(g, each, all, (size_t)most * sizeof *each, MG_U8);
        free(each);
    }
    free(pc);
    if (!st && rank == 0) {
        int n = 0;
        for (int i = 0; i < most * world; i++)
            if (all[i].tensor >= 0) all[n++] = all[i];
        mg_ckpt_sink out = {.fd = fd, .path = tmp};
        st = mg_ckpt_write_header(w, &out, all, n);
    }
    free(all);
    if (rank == 0 && fd >= 0) st = st ? (mg_atomic_abort(tmp, fd), st)
                                      : mg_atomic_commit(path, tmp, fd);
    return mg_group_agree(g, st, MG_AGREE_SHARE);
}

/* ---- loading --------------------------------------------------------------- */

/* A relaying rank's reads: (offset, length) to rank 0, its answer, then
 * the bytes, a piece at a time; (0, 0) ends them (relay_end). */
static mg_status relay_read(void *group, uint64_t off, size_t len, void *dst)
{
    mg_group *g = group;
    for (size_t at = 0, k; at < len; at += k) {
        k = len - at < RELAY_CHUNK ? len - at : RELAY_CHUNK;
        uint64_t h[2] = {off + at, k};
        int32_t ok;
        MG_TRY(mg_send(g, h, sizeof h, MG_U8, 0, TAG_READ));
        MG_TRY(mg_recv(g, &ok, 1, MG_I32, 0, TAG_OK));
        if (!ok)
            return mg_error(MG_EFORMAT, "checkpoint: rank 0 has no bytes %llu-%llu of its file",
                            (unsigned long long)(off + at), (unsigned long long)(off + at + k));
        MG_TRY(mg_recv(g, (uint8_t *)dst + at, k, MG_U8, 0, TAG_DATA));
    }
    return MG_OK;
}

static mg_status serve_reads(mg_group *g, int q, const mg_st_file *f)
{
    uint8_t *b = malloc(RELAY_CHUNK);
    mg_status st = b ? MG_OK : mg_error(MG_ENOMEM, "checkpoint: out of memory");
    for (uint64_t h[2]; !st;) {
        if ((st = mg_recv(g, h, sizeof h, MG_U8, q, TAG_READ)) || !h[1]) break;
        int32_t ok = h[1] <= RELAY_CHUNK && !mg_st_pread(f, h[0], (size_t)h[1], b);
        st = mg_send(g, &ok, 1, MG_I32, q, TAG_OK);
        if (!st && ok) st = mg_send(g, b, (size_t)h[1], MG_U8, q, TAG_DATA);
    }
    free(b);
    return st;
}

typedef struct {
    char path[PATH_CAP];
    uint64_t size, head;
    int32_t verified;
} described;

/* The file at rank 0's absolute path, open, if it is rank 0's (the same
 * size and header bytes) and its checks pass here too; else NULL. */
static mg_st_file *see_load(const described *d, const uint8_t *head)
{
    if (relay_forced() || !d->path[0]) return NULL;
    struct stat sb;
    int fd = open(d->path, O_RDONLY | O_CLOEXEC);
    bool same = fd >= 0 && fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == d->size;
    uint8_t *mine = same ? malloc(d->head) : NULL;
    same = mine && pread(fd, mine, d->head, 0) == (ssize_t)d->head && !memcmp(mine, head, d->head);
    free(mine);
    if (fd >= 0) close(fd);
    mg_st_file *f = NULL;
    if (same && mg_st_open_on_disk(d->path, &f)) f = NULL;
    return f;
}

mg_status mg__ckpt_load(mg_group *g, const char *path, mg__ckpt_reader read, void *ud)
{
    int rank = mg_group_rank(g), world = mg_group_size(g);
    described d = {{0}};
    mg_st_file *f = NULL;
    mg_status st = MG_OK;
    /* Rank 0 checks the whole file first, reading it in pieces, and reads
     * its part (the others trust its checks of what they fetch). */
    if (rank == 0) {
        st = mg_st_open_on_disk(path, &f);
        if (!st) st = read(f, path, ud);
        if (!st) {
            size_t hl;
            mg_st_head(f, &hl);
            d = (described){.size = mg_st_size(f), .head = hl, .verified = mg_st_verified(f)};
            if (!absolute(path, d.path, sizeof d.path)) d.path[0] = 0;
        }
    }
    st = mg_group_agree(g, st, MG_AGREE_SHARE);
    if (!st) st = mg_broadcast(g, &d, sizeof d, MG_U8, 0);
    uint8_t *head = NULL, *modes = calloc((size_t)world, 1);
    if (!st && (!modes || !(head = malloc(d.head))))
        st = mg_error(MG_ENOMEM, "checkpoint %s: out of memory", path);
    st = mg_group_agree(g, st, MG_AGREE_SHARE);
    if (!st && rank == 0) memcpy(head, mg_st_head(f, &(size_t){0}), d.head);
    if (!st) st = mg_broadcast(g, head, d.head, MG_U8, 0);
    uint8_t mine = DIRECT;
    mg_st_file *mf = NULL;
    if (!st && rank != 0) mine = (mf = see_load(&d, head)) ? DIRECT : RELAY;
    if (!st) st = share_modes(g, mine, modes, "read", path);
    if (!st && rank != 0) {
        if (mine == RELAY)
            st = mg_st_open_remote(path, head, d.head, d.size, d.verified, relay_read, g, &mf);
        if (!st) st = read(mf, path, ud);
        if (mine == RELAY) {   /* the end, whatever happened */
            mg_status e = relay_end(g, TAG_READ);
            st = st ? st : e;
        }
    }
    for (int q = 1; q < world && !st && rank == 0; q++)
        if (modes[q] == RELAY) st = serve_reads(g, q, f);
    mg_st_close(mf);
    mg_st_close(f);
    free(head);
    free(modes);
    return mg_group_agree(g, st, MG_AGREE_SHARE);
}
