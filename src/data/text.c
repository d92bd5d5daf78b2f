/* Text corpora for byte-level language models (models.md section D): the
 * default set is 40 files of Debian's fortunes package concatenated in a
 * fixed order (2,478,275 bytes in Debian 12); a directory (its regular
 * files, not hidden, in strcmp order) or a single file can stand in for
 * it. Tokens are the bytes. The first floor(0.9 n) bytes train, the rest
 * validate. A training step's batch starts at offsets drawn by a Philox
 * stream seeded from (seed, step) alone, so any rank, resumed run or
 * reader of the reference file can recompute it; rank r of W takes rows
 * r, r+W, ... of it. Files are listed and stat'ed first (sizes summed and
 * the 2 GiB bound checked before any allocation), then read, each checked
 * against its listed size: a file removed, cut or grown in between is an
 * error naming it. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data/text_internal.h"

#define MG_TEXT_MAX_BYTES ((size_t)1 << 31)

#define HOW_TO_FIX "install Debian's fortunes package: scripts/install-deps.sh, or pass " \
                   "--data DIR|FILE"

const char *const mg__text_default_files[MG__TEXT_NUM_DEFAULT] = {
    "art", "ascii-art", "computers", "cookie", "debian", "definitions", "disclaimer",
    "drugs", "education", "ethnic", "food", "goedel", "humorists", "kids", "knghtbrd",
    "law", "linux", "linuxcookie", "love", "magic", "medicine", "men-women",
    "miscellaneous", "news", "paradoxum", "people", "perl", "pets", "platitudes",
    "politics", "pratchett", "science", "songs-poems", "sports", "startrek", "tao",
    "translate-me", "wisdom", "work", "zippy",
};

struct mg_text {
    uint8_t *data;
    size_t n, n_train, n_val;
    int nfiles;
};

void mg__text_free_list(char **files, int n)
{
    if (!files) return;
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
}

static char *join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static mg_status list_default(const char *dir, char ***files, int *n)
{
    char **f = calloc(MG__TEXT_NUM_DEFAULT, sizeof *f);
    if (!f) return mg_error(MG_ENOMEM, "text corpus: out of memory");
    for (int i = 0; i < MG__TEXT_NUM_DEFAULT; i++) {
        f[i] = join(dir, mg__text_default_files[i]);
        if (!f[i]) {
            mg__text_free_list(f, i);
            return mg_error(MG_ENOMEM, "text corpus: out of memory");
        }
        struct stat sb;
        int rc = stat(f[i], &sb);
        if (rc != 0 || !S_ISREG(sb.st_mode)) {
            mg_status st = mg_error(MG_EIO, "default text corpus: %s: %s: " HOW_TO_FIX, f[i],
                                    rc != 0 ? strerror(errno) : "not a regular file");
            mg__text_free_list(f, i + 1);
            return st;
        }
    }
    *files = f;
    *n = MG__TEXT_NUM_DEFAULT;
    return MG_OK;
}

static mg_status list_dir(const char *path, char ***files, int *n)
{
    DIR *d = opendir(path);
    if (!d)
        return mg_error(MG_EIO, "cannot list the text directory %s: %s: check its permissions, "
                        "or pass --data FILE", path, strerror(errno));
    char **f = NULL;
    int cnt = 0, cap = 0;
    mg_status st = MG_OK;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char *p = join(path, e->d_name);
        if (!p) { st = mg_error(MG_ENOMEM, "text corpus: out of memory"); goto fail; }
        struct stat sb;
        if (stat(p, &sb) != 0) {
            st = mg_error(MG_EIO, "cannot read %s (in the text directory %s): %s: remove it "
                          "or pass --data with other text", p, path, strerror(errno));
            free(p);
            goto fail;
        }
        if (!S_ISREG(sb.st_mode)) { free(p); errno = 0; continue; }
        if (cnt == cap) {
            int nc = cap ? 2 * cap : 64;
            char **g = realloc(f, (size_t)nc * sizeof *g);
            if (!g) {
                free(p);
                st = mg_error(MG_ENOMEM, "text corpus: out of memory");
                goto fail;
            }
            f = g;
            cap = nc;
        }
        f[cnt++] = p;
        errno = 0;
    }
    if (errno) {
        st = mg_error(MG_EIO, "cannot list the text directory %s: %s", path, strerror(errno));
        goto fail;
    }
    closedir(d);
    if (cnt == 0) {
        free(f);
        return mg_error(MG_EINVAL, "the text directory %s holds no files (only regular files "
                        "whose names do not start with '.' are read): put text files in it, "
                        "or pass --data FILE", path);
    }
    qsort(f, (size_t)cnt, sizeof *f, cmp_names);
    *files = f;
    *n = cnt;
    return MG_OK;
fail:
    closedir(d);
    mg__text_free_list(f, cnt);
    return st;
}

mg_status mg__text_list(const char *path, const char *default_dir, char ***files, int *n)
{
    *files = NULL;
    *n = 0;
    if (!path) return list_default(default_dir, files, n);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return mg_error(MG_EIO, "text data %s: %s: " HOW_TO_FIX, path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return list_dir(path, files, n);
    if (!S_ISREG(sb.st_mode))
        return mg_error(MG_EINVAL, "text data %s is neither a regular file nor a directory: "
                        "pass --data DIR|FILE", path);
    char **f = malloc(sizeof *f);
    if (f) f[0] = strdup(path);
    if (!f || !f[0]) {
        free(f);
        return mg_error(MG_ENOMEM, "text corpus: out of memory");
    }
    *files = f;
    *n = 1;
    return MG_OK;
}

/* Reads exactly `size` bytes of path into buf and checks the end of file. */
static mg_status read_file(const char *path, size_t size, bool default_set, uint8_t *buf)
{
    struct stat sb;
    int fd = mg_open_regular(path, default_set ? HOW_TO_FIX : "check that it exists and is "
                             "readable, or pass --data with other text", &sb);
    if (fd < 0) return MG_EIO;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        return mg_error(MG_ENOMEM, "cannot read %s: out of memory", path);
    }
    mg_status st = MG_OK;
    if ((size_t)sb.st_size != size) {
        st = mg_error(MG_EIO, "%s changed while the text corpus was read (%zu bytes, then "
                      "%lld): try again once nothing writes to it", path, size,
                      (long long)sb.st_size);
        goto done;
    }
    size_t got = size ? fread(buf, 1, size, fp) : 0;
    int extra = got == size ? fgetc(fp) : EOF;
    if (ferror(fp)) {
        st = mg_error(MG_EIO, "read error in %s: %s: check the file and the disk, or pass "
                      "--data with other text", path, strerror(errno));
    } else if (got < size || extra != EOF) {
        st = mg_error(MG_EIO, "%s changed while the text corpus was read (%zu bytes, then "
                      "%s): try again once nothing writes to it", path, size,
                      got < size ? "fewer" : "more");
    }
done:
    fclose(fp);
    return st;
}

mg_status mg__text_load(const char *what, char *const *files, int n, bool default_set,
                        int ctx, mg_text **out)
{
    *out = NULL;
    if (ctx < 1)
        return mg_error(MG_EINVAL, "text corpus %s: context %d must be at least 1", what, ctx);
    size_t *sizes = calloc((size_t)(n > 0 ? n : 1), sizeof *sizes);
    if (!sizes) return mg_error(MG_ENOMEM, "text corpus: out of memory");
    mg_status st = MG_OK;
    uint8_t *data = NULL;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        struct stat sb;
        if (stat(files[i], &sb) != 0) {
            st = mg_error(MG_EIO, "cannot read %s: %s: %s", files[i], strerror(errno),
                          default_set ? HOW_TO_FIX : "check that it exists and is readable, "
                          "or pass --data with other text");
            goto fail;
        }
        if (!S_ISREG(sb.st_mode)) {
            st = mg_error(MG_EIO, "%s is no longer a regular file: pass --data with other "
                          "text", files[i]);
            goto fail;
        }
        if (default_set && sb.st_size == 0) {
            st = mg_error(MG_EFORMAT, "default text corpus: %s is empty: the fortunes package "
                          "is damaged: reinstall it (apt-get install --reinstall fortunes), "
                          "or pass --data DIR|FILE", files[i]);
            goto fail;
        }
        sizes[i] = (size_t)sb.st_size;
        if (sizes[i] > MG_TEXT_MAX_BYTES - total) {
            st = mg_error(MG_EINVAL, "text corpus %s: over the 2 GiB a corpus may hold "
                          "(%zu bytes before %s, which has %zu): pass --data with less text",
                          what, total, files[i], (size_t)sb.st_size);
            goto fail;
        }
        total += sizes[i];
    }
    data = mg_alloc(total ? total : 1);
    if (!data) {
        st = mg_error(MG_ENOMEM, "text corpus %s: cannot allocate %zu bytes", what, total);
        goto fail;
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        st = read_file(files[i], sizes[i], default_set, data + at);
        if (st) goto fail;
        at += sizes[i];
    }
    size_t n_train = total / 10 * 9 + total % 10 * 9 / 10;   /* floor(0.9 n), exactly */
    size_t n_val = total - n_train;
    if (n_train < (size_t)ctx + 2 || n_val < (size_t)ctx + 1) {
        st = mg_error(MG_EINVAL, "text corpus %s: %zu bytes split into %zu training and %zu "
                      "validation bytes, too few for context %d (one training window needs "
                      "%d bytes, one validation window %d): pass a smaller --ctx or more text",
                      what, total, n_train, n_val, ctx, ctx + 2, ctx + 1);
        goto fail;
    }
    mg_text *t = calloc(1, sizeof *t);
    if (!t) { st = mg_error(MG_ENOMEM, "text corpus: out of memory"); goto fail; }
    t->data = data;
    t->n = total;
    t->n_train = n_train;
    t->n_val = n_val;
    t->nfiles = n;
    free(sizes);
    *out = t;
    return MG_OK;
fail:
    free(sizes);
    mg_free(data);
    return st;
}

mg_status mg_text_open(const char *path, int ctx, mg_text **out)
{
    *out = NULL;
    char **files;
    int n;
    MG_TRY(mg__text_list(path, MG__TEXT_DEFAULT_DIR, &files, &n));
    mg_status st = mg__text_load(path ? path : MG__TEXT_DEFAULT_DIR, files, n, !path, ctx, out);
    mg__text_free_list(files, n);
    return st;
}

void mg_text_close(mg_text *t)
{
    if (!t) return;
    mg_free(t->data);
    free(t);
}

size_t mg_text_size(const mg_text *t) { return t->n; }
size_t mg_text_train_size(const mg_text *t) { return t->n_train; }
size_t mg_text_val_size(const mg_text *t) { return t->n_val; }
const uint8_t *mg_text_bytes(const mg_text *t) { return t->data; }
int mg_text_num_files(const mg_text *t) { return t->nfiles; }

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Step `step`'s stream: a pure function of (seed, step). */
static void step_rng(mg_rng *r, uint64_t seed, uint64_t step, size_t n_train, int T)
{
    MG_ASSERT(T >= 1 && n_train > (size_t)T && n_train - (size_t)T <= UINT32_MAX);
    mg_rng_init(r, splitmix64(splitmix64(seed) + step));
}

void mg_text_batch_offsets(uint64_t seed, uint64_t step, size_t n_train, int B, int T,
                           int64_t *offsets)
{
    mg_rng r;
    step_rng(&r, seed, step, n_train, T);
    for (int i = 0; i < B; i++)
        offsets[i] = mg_rng_below(&r, (uint32_t)(n_train - (size_t)T));
}

static void window(const uint8_t *src, int T, int32_t *x, int32_t *y)
{
    for (int j = 0; j < T; j++) {
        x[j] = src[j];
        y[j] = src[j + 1];
    }
}

int mg_text_batch(const mg_text *t, uint64_t seed, uint64_t step, int first, int B, int T,
                  int rank, int world, int32_t *x, int32_t *y)
{
    MG_ASSERT(first >= 0 && B >= 0 && world >= 1 && rank >= 0 && rank < world);
    mg_rng r;
    step_rng(&r, seed, step, t->n_train, T);
    uint32_t span = (uint32_t)(t->n_train - (size_t)T);
    for (int i = 0; i < first; i++) mg_rng_below(&r, span);   /* earlier micro-batches' rows */
    int rows = 0;
    for (int i = 0; i < B; i++) {
        uint32_t o = mg_rng_below(&r, span);
        if (i % world != rank) continue;
        window(t->data + o, T, x + (size_t)rows * T, y + (size_t)rows * T);
        rows++;
    }
    return rows;
}

void mg_text_batch_at(const mg_text *t, const int64_t *offsets, int n, int T, int32_t *x,
                      int32_t *y)
{
    MG_ASSERT(T >= 1);
    for (int i = 0; i < n; i++) {
        MG_ASSERT(offsets[i] >= 0 && (size_t)offsets[i] + (size_t)T < t->n_train);
        window(t->data + offsets[i], T, x + (size_t)i * T, y + (size_t)i * T);
    }
}

int mg_text_val_windows(const mg_text *t, int T)
{
    MG_ASSERT(T >= 1);
    size_t w = t->n_val ? (t->n_val - 1) / (size_t)T : 0;
    return w < 512 ? (int)w : 512;
}

void mg_text_val_batch(const mg_text *t, int T, int first, int n, int32_t *x, int32_t *y)
{
    MG_ASSERT(first >= 0 && n >= 0 && first + n <= mg_text_val_windows(t, T));
    const uint8_t *val = t->data + t->n_train;
    for (int i = 0; i < n; i++)
        window(val + (size_t)(first + i) * T, T, x + (size_t)i * T, y + (size_t)i * T);
}
