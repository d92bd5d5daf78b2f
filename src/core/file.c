/* Atomic whole-file writes (core.h): checkpoints, logs, plots and traces
 * all go through here, so a crash never leaves half a file. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "multigrad/core.h"

static mg_status write_all(int fd, const void *data, size_t len, const char *path)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return mg_error(MG_EIO, "cannot write %s: %s", path,
                            w < 0 ? strerror(errno) : "no progress");
        p += w;
        len -= (size_t)w;
    }
    return MG_OK;
}

mg_status mg_write_file_atomic_v(const char *path, const mg_piece *pieces, int n)
{
    char tmp[4096], dir[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
        return mg_error(MG_EINVAL, "%s: path too long", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return mg_error(MG_EIO, "cannot create a temporary file next to %s: %s: check that "
                        "the directory exists and is writable", path, strerror(errno));
    mg_status st = MG_OK;
    for (int i = 0; i < n && !st; i++)
        if (pieces[i].len) st = write_all(fd, pieces[i].data, pieces[i].len, tmp);
    if (!st && (fchmod(fd, 0644) != 0 || fsync(fd) != 0))
        st = mg_error(MG_EIO, "cannot sync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !st) st = mg_error(MG_EIO, "cannot write %s: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = mg_error(MG_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st) {
        unlink(tmp);
        return st;
    }
    /* The rename is durable only once the directory is synced. */
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd < 0 || fsync(dfd) != 0)
        st = mg_error(MG_EIO, "wrote %s but cannot sync its directory: %s", path,
                      strerror(errno));
    if (dfd >= 0) close(dfd);
    return st;
}

mg_status mg_write_file_atomic(const char *path, const void *data, size_t len)
{
    mg_piece p = {data, len};
    return mg_write_file_atomic_v(path, &p, 1);
}
