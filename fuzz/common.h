/* Shared by the fuzz targets (fuzz/fuzz_<name>.c, see fuzz/README.md). */
#ifndef MG_FUZZ_COMMON_H
#define MG_FUZZ_COMMON_H

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* For loaders that take a path: files that never touch a disk, memfds
 * reached through /proc/self/fd/N. fuzz_path(slot) is slot's path (the
 * same on every call); fuzz_file(slot, ...) rewrites the file with the
 * bytes and returns its path. */
static inline const char *fuzz_path(int slot)
{
    static int fd[4] = {-1, -1, -1, -1};
    static char path[4][64];
    if (fd[slot] < 0) {
        fd[slot] = memfd_create("mg-fuzz", MFD_CLOEXEC);
        if (fd[slot] < 0) { perror("memfd_create"); abort(); }
        snprintf(path[slot], sizeof path[slot], "/proc/self/fd/%d", fd[slot]);
    }
    return path[slot];
}

static inline const char *fuzz_file(int slot, const uint8_t *data, size_t size)
{
    const char *path = fuzz_path(slot);
    int fd = atoi(path + strlen("/proc/self/fd/"));
    if (ftruncate(fd, 0) != 0) { perror("ftruncate"); abort(); }
    for (size_t at = 0; at < size;) {
        ssize_t w = pwrite(fd, data + at, size - at, (off_t)at);
        if (w <= 0) { perror("pwrite"); abort(); }
        at += (size_t)w;
    }
    return path;
}

/* For loaders that take a directory: /dev/shm/mg-fuzz-<tag>-<pid> (made
 * on the first call, removed at exit, and by the next run if a crash
 * left it) holding links names[i] to the files of slots i = 0..n-1.
 * Returns its path. */
static char fuzz_dir_path[64];

static inline void fuzz_rm_rf(const char *path)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd)) {}
}

static inline void fuzz_dir_remove(void) { fuzz_rm_rf(fuzz_dir_path); }

/* Directories of fuzz runs that are gone. */
static inline void fuzz_dir_remove_stale(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *dash = strrchr(e->d_name, '-');
        int pid = dash ? atoi(dash + 1) : 0;
        if (strncmp(e->d_name, "mg-fuzz-", 8) || pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[300];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        fuzz_rm_rf(path);
    }
    if (d) closedir(d);
}

static inline const char *fuzz_dir(const char *tag, const char *const *names, int n)
{
    if (fuzz_dir_path[0]) return fuzz_dir_path;
    fuzz_dir_remove_stale();
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "/dev/shm/mg-fuzz-%s-%d", tag, (int)getpid());
    if (mkdir(fuzz_dir_path, 0700) != 0 && errno != EEXIST) { perror(fuzz_dir_path); abort(); }
    for (int i = 0; i < n; i++) {
        char link[160];
        snprintf(link, sizeof link, "%s/%s", fuzz_dir_path, names[i]);
        unlink(link);
        if (symlink(fuzz_path(i), link) != 0) { perror(link); abort(); }
    }
    atexit(fuzz_dir_remove);
    return fuzz_dir_path;
}

/* Fail loudly (libFuzzer reports the abort as a crash, with the input). */
#define FUZZ_CHECK(cond) \
    do { if (!(cond)) { fprintf(stderr, "FUZZ_CHECK(%s) failed at %s:%d\n", #cond, \
                                __FILE__, __LINE__); abort(); } } while (0)

#endif
