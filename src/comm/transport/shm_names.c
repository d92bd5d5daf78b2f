/* Shared-memory names not yet removed (see shm.h): the names of this
 * process's segments and its peers' on this host that exist now are kept
 * in a table, and while there are any, SIGTERM, SIGINT and SIGHUP first
 * unlink them all (unlink is async-signal-safe), then do what they did
 * before (the previous handler, or the default action re-raised), so an
 * interrupted job leaves nothing in /dev/shm. Limits: 64 names at once;
 * SIGKILL leaves them to the launcher (mg_shm_remove_tagged). */
#define _GNU_SOURCE
#include "comm/transport/shm.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define MAX_NAMED 64
#define SHM_DIR "/dev/shm"
static const int guarded[] = {SIGTERM, SIGINT, SIGHUP};
#define NGUARD (int)(sizeof guarded / sizeof *guarded)

static struct {
    pthread_mutex_t mu;
    int count;
    bool installed[NGUARD];
    struct sigaction old[NGUARD];
    _Atomic bool used[MAX_NAMED];
    char path[MAX_NAMED][96];
} named = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Remove the names (unlink is async-signal-safe), then the signal's
 * previous disposition: its handler, or the default action (re-raised:
 * it is delivered when this handler returns). */
static void on_guarded(int sig, siginfo_t *si, void *ctx)
{
    int saved = errno;
    for (int i = 0; i < MAX_NAMED; i++)
        if (atomic_load(&named.used[i])) unlink(named.path[i]);
    for (int k = 0; k < NGUARD; k++) {
        if (guarded[k] != sig) continue;
        struct sigaction *o = &named.old[k];
        if (o->sa_flags & SA_SIGINFO) {
            o->sa_sigaction(sig, si, ctx);
        } else if (o->sa_handler != SIG_DFL && o->sa_handler != SIG_IGN) {
            o->sa_handler(sig);
        } else {
            sigaction(sig, o, NULL);
            raise(sig);
        }
    }
    errno = saved;
}

/* The handler is installed while there are names (caller holds mu). */
static void guard(bool on)
{
    for (int k = 0; k < NGUARD; k++) {
        if (!on) {
            if (named.installed[k]) sigaction(guarded[k], &named.old[k], NULL);
            named.installed[k] = false;
            continue;
        }
        struct sigaction *o = &named.old[k];
        if (sigaction(guarded[k], NULL, o)) continue;
        if (!(o->sa_flags & SA_SIGINFO) && o->sa_handler == SIG_IGN) continue; /* ends nothing */
        struct sigaction sa = {.sa_sigaction = on_guarded,
                               .sa_flags = SA_SIGINFO | (o->sa_flags & SA_RESTART)};
        sigemptyset(&sa.sa_mask);
        named.installed[k] = sigaction(guarded[k], &sa, NULL) == 0;
    }
}

void mg__shm_name_keep(const char *name)
{
    pthread_mutex_lock(&named.mu);
    for (int i = 0; i < MAX_NAMED; i++)
        if (!atomic_load(&named.used[i])) {
            snprintf(named.path[i], sizeof named.path[i], SHM_DIR "%s", name);
            atomic_store(&named.used[i], true);
            if (named.count++ == 0) guard(true);
            break;
        }
    pthread_mutex_unlock(&named.mu);
}

void mg__shm_name_drop(const char *name)
{
    pthread_mutex_lock(&named.mu);
    for (int i = 0; i < MAX_NAMED; i++)
        if (atomic_load(&named.used[i]) && !strcmp(named.path[i] + strlen(SHM_DIR), name)) {
            atomic_store(&named.used[i], false);
            if (--named.count == 0) guard(false);
            break;
        }
    pthread_mutex_unlock(&named.mu);
}

/* Create a segment of its own (fd, or -1 with errno), its name guarded
 * from before it exists: a signal right after creation finds it. */
int mg__shm_named_create(const char *name)
{
    mg__shm_name_keep(name);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        int e = errno;
        mg__shm_name_drop(name);
        errno = e;
    }
    return fd;
}

mg_status mg__shm_named_size(int fd, const char *name, size_t bytes, const char *what)
{
    int e = ftruncate(fd, (off_t)bytes) < 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    if (!e) return MG_OK;
    struct statvfs v;
    char room[64] = "";
    if (!statvfs(SHM_DIR, &v))
        snprintf(room, sizeof room, " (%.1f MB free of %.1f MB)",
                 (double)v.f_bavail * v.f_frsize / 1e6, (double)v.f_blocks * v.f_frsize / 1e6);
    return mg_error(MG_ENOMEM, "%s: cannot reserve %.1f MB of shared memory for %s: %s: "
                    "%s has too little room%s; make it larger (a container: docker run "
                    "--shm-size=1g), or give MG_TRANSPORT=tcp", what, (double)bytes / 1e6, name,
                    strerror(e), SHM_DIR, room);
}

void mg__shm_named_unlink(const char *name)
{
    shm_unlink(name);
    mg__shm_name_drop(name);
}

int mg_shm_remove_tagged(const char *tag)
{
    char prefix[MG__SHM_TAG_MAX + 8];
    int n = snprintf(prefix, sizeof prefix, "mg-%s-", tag), removed = 0;
    DIR *d = n > 4 && (size_t)n < sizeof prefix ? opendir(SHM_DIR) : NULL;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, (size_t)n) && !unlinkat(dirfd(d), e->d_name, 0)) removed++;
    closedir(d);
    return removed;
}
