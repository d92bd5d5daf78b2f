/* Scratch files for offloaded state (ZeRO-Infinity's NVMe offload, on a
 * file system): a file private to the user, unlinked as soon as it is
 * made so that it goes with the process however the process ends, its
 * whole size reserved up front so that a full disk is one clear error at
 * the start and not a crash in the middle of training. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "multigrad/core.h"

struct mg_scratch {
    int fd;
    uint64_t bytes;
    char what[64];
    char label[4200];   /* the file, for messages */
};

static mg_status dir_error(const char *dir, const char *what, int err)
{
    const char *fix = err == ENOENT || err == ENOTDIR ? "create it or give another directory"
                      : err == EACCES || err == EPERM || err == EROFS
                          ? "give a directory this user can write"
                          : "give another directory";
    return mg_error(MG_EIO, "offload directory %s: cannot make a file for the %s there: %s: %s",
                    dir, what, strerror(err), fix);
}

mg_status mg_scratch_create(const char *dir, uint64_t bytes, const char *what, mg_scratch **out)
{
    *out = NULL;
    struct stat sb;
    if (!dir || !*dir) return mg_error(MG_EINVAL, "offload: no directory given (disk:DIR)");
    if (stat(dir, &sb) != 0) return dir_error(dir, what, errno);
    if (!S_ISDIR(sb.st_mode)) return dir_error(dir, what, ENOTDIR);
    mg_scratch *s = calloc(1, sizeof *s);
    if (!s) return mg_error(MG_ENOMEM, "offload: out of memory");
    s->bytes = bytes;
    snprintf(s->what, sizeof s->what, "%s", what);
    snprintf(s->label, sizeof s->label, "the %s's file in the offload directory %s", what, dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/multigrad-offload-XXXXXX", dir);
    mode_t old = umask(077);   /* mkstemp makes 0600; no wider whatever the umask */
    s->fd = mkostemp(path, O_CLOEXEC);
    umask(old);
    if (s->fd < 0) {
        mg_status st = dir_error(dir, what, errno);
        free(s);
        return st;
    }
    unlink(path);   /* gone when the last descriptor closes */
    int err = bytes ? posix_fallocate(s->fd, 0, (off_t)bytes) : 0;
    if (err == EINVAL || err == EOPNOTSUPP) err = ftruncate(s->fd, (off_t)bytes) ? errno : 0;
    if (err) {
        mg_status st = mg_error(MG_EIO, "offload directory %s: cannot reserve %.1f MB for the "
                                "%s: %s: %s", dir, (double)bytes / 1e6, what, strerror(err),
                                err == ENOSPC || err == EFBIG || err == EDQUOT
                                    ? "free space there or give a directory on a larger disk"
                                    : "give another directory");
        mg_scratch_destroy(s);
        return st;
    }
    *out = s;
    return MG_OK;
}

void mg_scratch_destroy(mg_scratch *s)
{
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    free(s);
}

uint64_t mg_scratch_size(const mg_scratch *s) { return s->bytes; }

static mg_status io(mg_scratch *s, void *buf, size_t len, uint64_t off, bool wr)
{
    if (off > s->bytes || len > s->bytes - off)
        return mg_error(MG_EINVAL, "offload: %s of %zu bytes at %llu is outside the %s file "
                        "(%llu bytes)", wr ? "write" : "read", len, (unsigned long long)off,
                        s->what, (unsigned long long)s->bytes);
    return wr ? mg_pwrite_all(s->fd, buf, len, off, s->label)
              : mg_pread_all(s->fd, buf, len, off, s->label);
}

mg_status mg_scratch_read(mg_scratch *s, void *dst, size_t len, uint64_t off)
{
    return io(s, dst, len, off, false);
}

mg_status mg_scratch_write(mg_scratch *s, const void *src, size_t len, uint64_t off)
{
    return io(s, (void *)src, len, off, true);
}
