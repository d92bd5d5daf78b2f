/* Files (core.h). Atomic whole-file writes: checkpoints, logs, plots and
 * traces all go through here, so a crash never leaves half a file. The
 * temporary file PATH.tmp.XXXXXX is created with mode 0666 (the umask
 * applies), or the mode of the file it replaces, and stays locked
 * (flock) while it is written: a save removes the leftovers of
 * interrupted saves of the same file, only those no live writer holds
 * (regular files of this user named so). A symbolic link is written
 * through (its target replaced, the link kept). Reading: regular files only,
 * opened without blocking, so a FIFO is refused instead of waited on. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "multigrad/core.h"

#define TMP_SUFFIX ".tmp."
#define TMP_RANDOM 6   /* XXXXXX, as mkstemp */

static const char tmp_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO (named pipe)"
         : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) || S_ISBLK(m) ? "a device" : "a special file";
}

int mg_open_regular(const char *path, const char *how, struct stat *sb)
{
    struct stat own;
    if (!sb) sb = &own;
    if (!how) how = "";
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        mg_error(MG_EIO, "cannot open %s: %s%s%s", path, strerror(errno), *how ? ": " : "", how);
        return -1;
    }
    if (fstat(fd, sb) != 0) {
        mg_error(MG_EIO, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(sb->st_mode)) {
        mg_error(MG_EIO, "%s is %s, not a regular file%s%s", path, file_kind(sb->st_mode),
                 *how ? ": " : "", how);
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);   /* reads of a regular file block as usual */
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

/* dir and base name of path (copies). */
static mg_status split_path(const char *path, char *dir, char *base, size_t cap)
{
    char a[4096], b[4096];
    if (snprintf(a, sizeof a, "%s", path) >= (int)sizeof a || strlen(path) >= cap)
        return mg_error(MG_EINVAL, "%s: path too long", path);
    snprintf(b, sizeof b, "%s", path);
    snprintf(dir, cap, "%s", dirname(a));
    snprintf(base, cap, "%s", basename(b));
    return MG_OK;
}

/* Whether name is base.tmp.XXXXXX. */
static bool is_tmp_of(const char *name, const char *base)
{
    size_t bl = strlen(base), sl = strlen(TMP_SUFFIX);
    if (strncmp(name, base, bl) || strncmp(name + bl, TMP_SUFFIX, sl)) return false;
    const char *r = name + bl + sl;
    return strlen(r) == TMP_RANDOM && strspn(r, tmp_chars) == TMP_RANDOM;
}

/* Removes the leftovers of interrupted saves of path (see the top). */
static void remove_stale_tmp(const char *path)
{
    char dir[4096], base[4096];
    if (split_path(path, dir, base, sizeof dir)) return;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_tmp_of(e->d_name, base)) continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat a, b;
        if (fstat(fd, &a) == 0 && S_ISREG(a.st_mode) && a.st_uid == geteuid() &&
            flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(dirfd(d), e->d_name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
            a.st_ino == b.st_ino && a.st_dev == b.st_dev)
            unlinkat(dirfd(d), e->d_name, 0);
        close(fd);
    }
    closedir(d);
}

/* Creates path.tmp.XXXXXX (name in tmp) with the given mode (less the
 * umask), locked; the descriptor, or -1 with errno set. */
static int create_tmp(const char *path, char *tmp, size_t cap, mode_t mode)
{
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned char r[TMP_RANDOM];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return -1;
        char x[TMP_RANDOM + 1];
        for (int i = 0; i < TMP_RANDOM; i++) x[i] = tmp_chars[r[i] % (sizeof tmp_chars - 1)];
        x[TMP_RANDOM] = 0;
        if (snprintf(tmp, cap, "%s" TMP_SUFFIX "%s", path, x) >= (int)cap) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd >= 0) {
            flock(fd, LOCK_EX);
            return fd;
        }
        if (errno != EEXIST) return -1;
    }
    return -1;
}

static mg_status no_tmp_error(const char *path)
{
    return mg_error(MG_EIO, "cannot create a temporary file next to %s: %s: check that the "
                    "directory exists and is writable", path, strerror(errno));
}

bool mg_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!stat(a, &sa) && !stat(b, &sb)) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char ra[PATH_MAX + 256], rb[PATH_MAX + 256];
    const char *p[2] = {a, b};
    char *r[2] = {ra, rb};
    for (int k = 0; k < 2; k++) {
        char dir[PATH_MAX], real[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", p[k]);
        const char *base = strrchr(p[k], '/') ? strrchr(p[k], '/') + 1 : p[k];
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        if (!realpath(slash ? (*dir ? dir : "/") : ".", real)) return false;
        snprintf(r[k], sizeof ra, "%s/%s", real, base);
    }
    return !strcmp(ra, rb);
}

/* The file a write of path replaces: path, or where a symbolic link at
 * path leads (its target, or where a dangling one points), so that a save
 * goes through the link, as torch.save's open() does, instead of
 * replacing the link with a file beside the target. */
static const char *through_links(const char *path, char *buf, size_t cap)
{
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) return path;
    char real[PATH_MAX], link[PATH_MAX], dir[PATH_MAX];
    if (realpath(path, real)) {
        snprintf(buf, cap, "%s", real);
        return buf;
    }
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0) return path;
    link[n] = 0;
    snprintf(dir, sizeof dir, "%s", path);
    int w = link[0] == '/' ? snprintf(buf, cap, "%s", link)
                           : snprintf(buf, cap, "%s/%s", dirname(dir), link);
    return w > 0 && (size_t)w < cap ? buf : path;
}

/* The file a write of path replaces (*file, in buf or path itself) and
 * whether it is there (*sb its stat): MG_EINVAL for no path (a probe:
 * "cannot rename .tmp.X to :") and for a path that is not a file (a FIFO,
 * a device: as root the rename replaced /dev/full itself). */
static mg_status write_target(const char *path, char *buf, size_t cap, const char **file,
                              struct stat *sb, bool *there)
{
    if (!path || !*path)
        return mg_error(MG_EINVAL, "no path (%s): give the path of a file to write",
                        path ? "empty" : "NULL");
    *file = through_links(path, buf, cap);
    *there = stat(*file, sb) == 0;
    if (*there && !S_ISREG(sb->st_mode))
        return mg_error(MG_EINVAL, "%s is %s: give the path of a file to write", path,
                        file_kind(sb->st_mode));
    return MG_OK;
}

mg_status mg_check_writable(const char *path)
{
    char buf[PATH_MAX];
    const char *file = path;
    struct stat sb;
    bool there;
    MG_TRY(write_target(path, buf, sizeof buf, &file, &sb, &there));
    char tmp[4096];
    int fd = create_tmp(file, tmp, sizeof tmp, 0600);
    if (fd < 0) return no_tmp_error(path);
    close(fd);
    unlink(tmp);
    /* A write renames its file over the old one, which a sticky directory
     * (/tmp) refuses for another user's file: found at the first save,
     * after the training before it (a probe). */
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", file);
    const char *dir = dirname(copy);
    struct stat ds;
    uid_t me = geteuid();
    if (there && me != 0 && sb.st_uid != me && stat(dir, &ds) == 0 && (ds.st_mode & S_ISVTX) &&
        ds.st_uid != me)
        return mg_error(MG_EIO, "%s belongs to another user in a sticky directory (%s), which "
                        "refuses to replace it: remove it, or give another path", file, dir);
    return MG_OK;
}

mg_status mg_atomic_begin(const char *path, uint64_t size, char *tmp, size_t cap, int *fd)
{
    *fd = -1;
    char buf[PATH_MAX];
    const char *file = path;
    struct stat old;
    bool keep;
    MG_TRY(write_target(path, buf, sizeof buf, &file, &old, &keep));
    remove_stale_tmp(file);
    /* The mode of the file replaced, else 0666 less the umask. */
    *fd = create_tmp(file, tmp, cap, keep ? old.st_mode & 0777 : 0666);
    if (*fd < 0) return no_tmp_error(path);
    if ((keep && fchmod(*fd, old.st_mode & 0777) != 0) || ftruncate(*fd, (off_t)size) != 0) {
        mg_status st = mg_error(MG_EIO, "cannot make a file of %llu bytes for %s: %s",
                                (unsigned long long)size, path, strerror(errno));
        mg_atomic_abort(tmp, *fd);
        *fd = -1;
        return st;
    }
    return MG_OK;
}

/* len bytes at byte off written (wr) or read whole, in pieces of at most
 * 1 GiB, retried when a signal cuts one short. */
static mg_status at_offset(int fd, char *p, size_t len, uint64_t off, bool wr, const char *path)
{
    while (len > 0) {
        size_t n = len > (1u << 30) ? (1u << 30) : len;
        ssize_t r = wr ? pwrite(fd, p, n, (off_t)off) : pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            return mg_error(MG_EIO, "cannot %s %s at byte %llu: %s%s", wr ? "write" : "read",
                            path, (unsigned long long)off,
                            e ? strerror(e) : wr ? "no progress" : "it ends there (it was "
                            "shortened)", e == ENOSPC || e == EFBIG || e == EDQUOT
                                ? ": free space on that file system or give another path"
                                : "");
        }
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return MG_OK;
}

mg_status mg_pwrite_all(int fd, const void *data, size_t len, uint64_t off, const char *path)
{
    return at_offset(fd, (char *)data, len, off, true, path);
}

mg_status mg_pread_all(int fd, void *data, size_t len, uint64_t off, const char *path)
{
    return at_offset(fd, data, len, off, false, path);
}

mg_status mg_atomic_commit(const char *path, const char *tmp, int fd)
{
    char buf[PATH_MAX];
    const char *file = through_links(path, buf, sizeof buf);
    mg_status st = MG_OK;
    /* Messages name the file the caller gave (the temporary one beside it
     * is gone once this fails). */
    if (fsync(fd) != 0) st = mg_error(MG_EIO, "cannot sync %s: %s", path, strerror(errno));
    if (!st && rename(tmp, file) != 0)
        st = mg_error(MG_EIO, "cannot replace %s with the file written beside it: %s", file,
                      strerror(errno));
    if (st) unlink(tmp);
    if (close(fd) != 0 && !st) st = mg_error(MG_EIO, "cannot write %s: %s", path, strerror(errno));
    if (st) return st;
    /* The rename is durable only once the directory is synced. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", file);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd < 0 || fsync(dfd) != 0)
        st = mg_error(MG_EIO, "wrote %s but cannot sync its directory: %s", path,
                      strerror(errno));
    if (dfd >= 0) close(dfd);
    return st;
}

void mg_atomic_abort(const char *tmp, int fd)
{
    unlink(tmp);
    close(fd);
}

mg_status mg_write_file_atomic_v(const char *path, const mg_piece *pieces, int n)
{
    char tmp[4096];
    uint64_t size = 0, off = 0;
    for (int i = 0; i < n; i++) size += pieces[i].len;
    int fd;
    MG_TRY(mg_atomic_begin(path, size, tmp, sizeof tmp, &fd));
    mg_status st = MG_OK;
    for (int i = 0; i < n && !st; i++) {
        if (pieces[i].len) st = mg_pwrite_all(fd, pieces[i].data, pieces[i].len, off, path);
        off += pieces[i].len;
    }
    if (st) {
        mg_atomic_abort(tmp, fd);
        return st;
    }
    return mg_atomic_commit(path, tmp, fd);
}

mg_status mg_write_file_atomic(const char *path, const void *data, size_t len)
{
    mg_piece p = {data, len};
    return mg_write_file_atomic_v(path, &p, 1);
}

uint32_t mg_crc32(const void *data, size_t len)
{
    return (uint32_t)crc32_z(0L, data ? data : Z_NULL, data ? len : 0);
}

uint32_t mg_crc32_combine(uint32_t a, uint32_t b, uint64_t len_b)
{
    return (uint32_t)crc32_combine(a, b, (z_off_t)len_b);
}
