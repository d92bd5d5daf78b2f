/* The file store behind "file:///path": an append-only log of records
 * ("R" op:u8 pad:u16 klen:u32 vlen:u32, key, value, mac[32]; op 1 set,
 * 2 delete) in one file on a file system every rank sees. Writers append
 * one whole record per write() under an exclusive flock; readers replay
 * what was appended since their last look under a shared flock. get and
 * wait poll the file (1 ms growing to 20 ms) until their deadline.
 *
 * Like torch's FileStore, the file must not hold another live job's
 * records; the last handle to close deletes it. Nothing in the file is
 * trusted: lengths are bounded like the TCP store's (a corrupt file is an
 * error, not a crash), and each record carries an HMAC-SHA256 with the
 * job secret over its offset and bytes, so a record written by anyone
 * without the secret, or copied from elsewhere in the file, is refused.
 * The file is opened without following a symbolic link, must be a regular
 * file of this user that no one else may write, in a directory that only
 * its owner (or root) may change, or a sticky one such as /tmp. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include "comm/store/auth.h"
#include "comm/store/store.h"
#include "multigrad/core.h"

#define REC 12
#define MAC 32
#define REFS "__mg_file_refs"

typedef struct {
    int fd, dir;
    off_t off;
    mg__kv kv;
    char path[4096];
    const char *name;         /* in path, the file's name in dir */
    char secret[512];
} fstore;

/* The MAC of the record r (header, key, value) to be found at offset: an
 * HMAC over a domain, the offset and the record's SHA-256. */
static void record_mac(const fstore *f, uint64_t offset, const uint8_t *r, size_t n,
                       uint8_t out[MAC])
{
    static const char dom[] = "mg-file-store";
    uint8_t m[sizeof dom + 8 + 32];
    unsigned dl = 32;
    memcpy(m, dom, sizeof dom);
    memcpy(m + sizeof dom, &offset, 8);
    MG_ASSERT(EVP_Digest(r, n, m + sizeof dom + 8, &dl, EVP_sha256(), NULL) == 1 && dl == 32);
    mg__hmac(out, f->secret, m, sizeof m);
}

static mg_status lock(fstore *f, int how)
{
    while (flock(f->fd, how) < 0)
        if (errno != EINTR)
            return mg_error(MG_EIO, "file store %s: flock: %s", f->path, strerror(errno));
    return MG_OK;
}

static void unlock(fstore *f) { (void)flock(f->fd, LOCK_UN); }

/* Replay records appended since the last refresh (caller holds a lock). */
static mg_status refresh(fstore *f)
{
    struct stat st;
    if (fstat(f->fd, &st) < 0) return mg_error(MG_EIO, "file store %s: %s", f->path, strerror(errno));
    if (st.st_size <= f->off) return MG_OK;
    size_t n = (size_t)(st.st_size - f->off);
    uint8_t *buf = malloc(n);
    if (!buf) return mg_error(MG_ENOMEM, "file store: out of memory");
    ssize_t got = pread(f->fd, buf, n, f->off);
    if (got < 0) {
        free(buf);
        return mg_error(MG_EIO, "file store %s: read: %s", f->path, strerror(errno));
    }
    size_t p = 0;
    mg_status s = MG_OK;
    while ((size_t)got - p >= REC) {
        uint32_t kl, vl;
        memcpy(&kl, buf + p + 4, 4);
        memcpy(&vl, buf + p + 8, 4);
        if (buf[p] != 'R' || (buf[p + 1] != 1 && buf[p + 1] != 2) || kl == 0 ||
            kl > MG_STORE_MAX_KEY || vl > MG_STORE_MAX_VALUE) {
            s = mg_error(MG_EFORMAT, "file store %s is corrupt at byte %lld: remove it and "
                         "restart the job", f->path, (long long)(f->off + (off_t)p));
            break;
        }
        size_t len = REC + (size_t)kl + vl;
        if ((size_t)got - p < len + MAC) break; /* not yet complete */
        uint8_t want[MAC];
        record_mac(f, (uint64_t)(f->off + (off_t)p), buf + p, len, want);
        if (CRYPTO_memcmp(want, buf + p + len, MAC)) {
            s = mg_error(MG_EAUTH, "file store %s: the record at byte %lld was not written with "
                         "this job's MG_JOB_SECRET (another job or user wrote to the file): "
                         "remove it, give every rank the same MG_JOB_SECRET and restart",
                         f->path, (long long)(f->off + (off_t)p));
            break;
        }
        const char *key = (const char *)buf + p + REC;
        if (buf[p + 1] == 1) s = mg__kv_set(&f->kv, key, kl, buf + p + REC + kl, vl);
        else mg__kv_del(&f->kv, key, kl);
        if (s) break;
        p += len + MAC;
    }
    f->off += (off_t)p;
    free(buf);
    return s;
}

static mg_status append(fstore *f, int op, const char *key, const void *val, size_t vl)
{
    size_t kl = strlen(key);
    if (kl == 0 || kl > MG_STORE_MAX_KEY || vl > MG_STORE_MAX_VALUE)
        return mg_error(MG_EINVAL, "file store: key length %zu or value length %zu out of bounds",
                        kl, vl);
    size_t n = REC + kl + vl + MAC;
    struct stat st;
    if (fstat(f->fd, &st) < 0) return mg_error(MG_EIO, "file store %s: %s", f->path, strerror(errno));
    uint8_t *r = malloc(n);
    if (!r) return mg_error(MG_ENOMEM, "file store: out of memory");
    uint32_t k32 = (uint32_t)kl, v32 = (uint32_t)vl;
    r[0] = 'R';
    r[1] = (uint8_t)op;
    r[2] = r[3] = 0;
    memcpy(r + 4, &k32, 4);
    memcpy(r + 8, &v32, 4);
    memcpy(r + REC, key, kl);
    if (vl) memcpy(r + REC + kl, val, vl);
    /* Appends happen under the exclusive lock: this record lands at the end. */
    record_mac(f, (uint64_t)st.st_size, r, n - MAC, r + n - MAC);
    ssize_t w;
    do w = write(f->fd, r, n);
    while (w < 0 && errno == EINTR);
    free(r);
    if (w != (ssize_t)n)
        return mg_error(MG_EIO, "file store %s: write failed: %s", f->path,
                        w < 0 ? strerror(errno) : "short write (disk full?)");
    return MG_OK;
}

static mg_status f_set(void *impl, const char *key, const void *val, size_t n, double within)
{
    fstore *f = impl;
    MG_TRY(lock(f, LOCK_EX));
    mg_status s = append(f, 1, key, val, n);
    unlock(f);
    return s;
}

static mg_status f_add(void *impl, const char *key, int64_t delta, int64_t *out)
{
    fstore *f = impl;
    MG_TRY(lock(f, LOCK_EX));
    mg_status s = refresh(f);
    if (!s) s = mg__kv_add(&f->kv, key, strlen(key), delta, out);
    if (!s) {
        mg__kv_entry *e = mg__kv_find(&f->kv, key, strlen(key));
        s = append(f, 1, key, e->val, e->vlen);
    }
    unlock(f);
    return s;
}

static mg_status f_del(void *impl, const char *key, int *existed)
{
    fstore *f = impl;
    MG_TRY(lock(f, LOCK_EX));
    mg_status s = refresh(f);
    if (!s) {
        *existed = mg__kv_find(&f->kv, key, strlen(key)) != NULL;
        s = append(f, 2, key, NULL, 0);
    }
    unlock(f);
    return s;
}

static void nap(double *wait)
{
    struct timespec ts = {0, (long)(*wait * 1e9)};
    nanosleep(&ts, NULL);
    *wait = *wait * 2 > 0.02 ? 0.02 : *wait * 2;
}

static mg_status f_wait(void *impl, const char *const *keys, int n, int any, double timeout,
                        int *index)
{
    fstore *f = impl;
    double deadline = mg_now() + timeout, w = 0.001;
    for (;;) {
        MG_TRY(lock(f, LOCK_SH));
        mg_status s = refresh(f);
        unlock(f);
        if (s) return s;
        int have = 0, first = -1;
        for (int i = 0; i < n; i++)
            if (mg__kv_find(&f->kv, keys[i], strlen(keys[i]))) {
                have++;
                if (first < 0) first = i;
            }
        if (any ? have > 0 : have == n) {
            if (index) *index = any ? first : 0;
            return MG_OK;
        }
        if (mg_now() >= deadline)
            return mg_error(MG_ETIMEOUT, "file store %s: waited %.1f s for key '%s'%s", f->path,
                            timeout, keys[0], n > 1 ? " and others" : "");
        nap(&w);
    }
}

static mg_status f_get(void *impl, const char *key, double timeout, double within, void **val,
                       size_t *n)
{
    fstore *f = impl;
    const char *keys[1] = {key};
    MG_TRY(f_wait(impl, keys, 1, 0, timeout, NULL));
    mg__kv_entry *e = mg__kv_find(&f->kv, key, strlen(key));
    MG_ASSERT(e);
    *val = malloc(e->vlen + 1);
    if (!*val) return mg_error(MG_ENOMEM, "file store: out of memory");
    memcpy(*val, e->val, e->vlen);
    ((char *)*val)[e->vlen] = 0;
    *n = e->vlen;
    return MG_OK;
}

static void f_close(void *impl)
{
    fstore *f = impl;
    int64_t left = 1;
    if (!lock(f, LOCK_EX)) {
        if (!refresh(f) && !mg__kv_add(&f->kv, REFS, strlen(REFS), -1, &left)) {
            mg__kv_entry *e = mg__kv_find(&f->kv, REFS, strlen(REFS));
            if (left <= 0) unlinkat(f->dir, f->name, 0);
            else (void)append(f, 1, REFS, e->val, e->vlen);
        }
        unlock(f);
    }
    close(f->fd);
    close(f->dir);
    mg__kv_free(&f->kv);
    free(f);
}

static const mg__store_vt file_vt = {f_set, f_get, f_add, f_wait, f_del, f_close, NULL};

/* Open the store's directory and check that no other user can swap
 * files in it. */
static mg_status open_dir(fstore *f)
{
    char *slash = strrchr(f->path, '/'), dir[sizeof f->path];
    f->name = slash ? slash + 1 : f->path;
    if (!slash) strcpy(dir, ".");
    else if (slash == f->path) strcpy(dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - f->path), f->path);
    if (!*f->name)
        return mg_error(MG_EINVAL, "file store: '%s' names a directory; give a file path "
                        "(file:///dir/name)", f->path);
    f->dir = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f->dir < 0)
        return mg_error(MG_EIO, "file store: cannot open the directory %s: %s; it must exist and "
                        "be writable by every rank", dir, strerror(errno));
    struct stat st;
    if (fstat(f->dir, &st) < 0)
        return mg_error(MG_EIO, "file store: %s: %s", dir, strerror(errno));
    if ((st.st_uid != geteuid() && st.st_uid != 0) ||
        ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)))
        return mg_error(MG_EAUTH, "file store: the directory %s can be changed by another user "
                        "(owner uid %u, mode %03o): they could replace the store file; use a "
                        "directory of your own (or a sticky one such as /tmp)", dir,
                        (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
    return MG_OK;
}

static mg_status open_file(fstore *f)
{
    f->fd = openat(f->dir, f->name, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW |
                   O_NONBLOCK, 0600);
    if (f->fd < 0 && errno == ELOOP)
        return mg_error(MG_EAUTH, "file store: %s is a symbolic link: the store never follows "
                        "one (someone may be redirecting it); remove it", f->path);
    if (f->fd < 0)
        return mg_error(MG_EIO, "file store: cannot open %s: %s; the directory must exist and "
                        "be writable by every rank", f->path, strerror(errno));
    struct stat st;
    if (fstat(f->fd, &st) < 0)
        return mg_error(MG_EIO, "file store: %s: %s", f->path, strerror(errno));
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
        return mg_error(MG_EAUTH, "file store: %s is not a private regular file of this user "
                        "(owner uid %u, mode %03o): another user may have planted it; remove "
                        "it", f->path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
    int fl = fcntl(f->fd, F_GETFL);
    if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
        return mg_error(MG_EIO, "file store: %s: %s", f->path, strerror(errno));
    return MG_OK;
}

mg_status mg__file_store_open(const char *path, const char *secret, double timeout,
                              mg_store *s)
{
    const char *sec = mg__secret(secret);
    if (!*path || strlen(path) >= sizeof ((fstore *)0)->path)
        return mg_error(MG_EINVAL, "file store: bad path '%s' (use file:///absolute/path)", path);
    if (strlen(sec) >= sizeof ((fstore *)0)->secret)
        return mg_error(MG_EINVAL, "MG_JOB_SECRET is longer than %zu bytes",
                        sizeof ((fstore *)0)->secret - 1);
    fstore *f = calloc(1, sizeof *f);
    if (!f) return mg_error(MG_ENOMEM, "file store: out of memory");
    strcpy(f->path, path);
    strcpy(f->secret, sec);
    f->fd = f->dir = -1;
    mg__kv_init(&f->kv);
    int64_t r;
    mg_status st = open_dir(f);
    if (!st) st = open_file(f);
    if (!st) st = f_add(f, REFS, 1, &r);
    if (st) {
        if (f->fd >= 0) close(f->fd);
        if (f->dir >= 0) close(f->dir);
        mg__kv_free(&f->kv);
        free(f);
        return st;
    }
    s->vt = &file_vt;
    s->impl = f;
    return MG_OK;
}
