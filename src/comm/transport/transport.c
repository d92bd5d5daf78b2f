/* Transport-independent pieces (see transport.h): the coarse clock, the
 * spin-then-block policy, process liveness from /proc, and the channel
 * dispatch. Fingerprints are in fingerprint.c. */
#define _GNU_SOURCE
#include "comm/transport/transport.h"
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "comm/transport/shm.h"
#include "comm/transport/tcp.h"
#include "multigrad/core.h"

double mg__now_coarse(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- waiting ---- */

mg__spin_cfg mg__spin_default(int local_ranks)
{
    mg__spin_cfg c;
    if (local_ranks <= mg_local_cpus()) {
        /* A core each: spinning is cheaper than a sleep and a wake-up. */
        c.spin_s = mg_env_double("MG_SPIN_US", 50) * 1e-6;
        c.yield_s = mg_env_double("MG_YIELD_US", 200) * 1e-6;
    } else {
        /* Oversubscribed: the rank we wait for needs this core. */
        c.spin_s = mg_env_double("MG_SPIN_US", 0) * 1e-6;
        c.yield_s = mg_env_double("MG_YIELD_US", 2000) * 1e-6;
    }
    return c;
}

int mg__spin_step(mg__spin *s, const mg__spin_cfg *cfg)
{
    if (s->iter++ == 0) s->t0 = mg_now();
    double el = mg_now() - s->t0;
    if (el < cfg->spin_s) {
        for (int i = 0; i < 8; i++) mg__cpu_relax();
        return 0;
    }
    if (el < cfg->spin_s + cfg->yield_s) {
        sched_yield();
        return 0;
    }
    return 1;
}

/* ---- liveness ---- */

double mg__beat_period(double peer_timeout)
{
    /* Several beats per timeout: a late or lost one is no alarm. */
    double p = peer_timeout / 8;
    return p <= 0 || p > 1 ? 1 : p < 0.05 ? 0.05 : p;
}

static int read_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return -1;
    p += 2;
    *state = *p;
    /* starttime is the 20th field after the command name. */
    for (int f = 1; f < 20 && p; f++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    *start = p ? strtoull(p, NULL, 10) : 0;
    return 0;
}

uint64_t mg__proc_starttime(pid_t pid)
{
    char st;
    uint64_t start = 0;
    return read_stat(pid, &st, &start) ? 0 : start;
}

mg_status mg__peer_silent(const char *who, double secs, const char *what, int state)
{
    const char *why = state == MG__STOPPED
        ? "it is stopped (SIGSTOP or a debugger); resume or end it"
        : state == MG__UNSEEN ? "it is stopped, cut off from this host (network partition) or "
                                "badly overloaded"
        : "its process runs but does not beat: frozen or starved of CPU";
    return mg_error(MG_EPEER, "%s sent nothing for %.0f s while this rank was %s: %s "
                    "(MG_PEER_TIMEOUT=%g)", who, secs, what, why, secs);
}

mg__liveness mg__proc_state(pid_t pid, uint64_t starttime)
{
    if (pid <= 0) return MG__ALIVE;
    if (kill(pid, 0) < 0 && errno == ESRCH) return MG__DEAD;
    char st;
    uint64_t start;
    if (read_stat(pid, &st, &start)) return MG__DEAD;
    if (starttime && start != starttime) return MG__DEAD; /* pid reused */
    if (st == 'Z' || st == 'X' || st == 'x') return MG__DEAD;
    if (st == 'T' || st == 't') return MG__STOPPED;
    return MG__ALIVE;
}

/* ---- channels ---- */

ssize_t mg__chan_write(mg__chan *c, const void *a, size_t an, const void *b, size_t bn)
{
    return c->kind == MG__CH_SHM ? mg__shm_chan_write(c, a, an, b, bn)
                                 : mg__tcp_chan_write(c, a, an, b, bn);
}

ssize_t mg__chan_read(mg__chan *c, void *buf, size_t n)
{
    return c->kind == MG__CH_SHM ? mg__shm_chan_read(c, buf, n) : mg__tcp_chan_read(c, buf, n);
}

void mg__chan_beat(mg__chan *c, double before)
{
    if (c->kind == MG__CH_TCP) mg__tcp_chan_beat(c, before);
}

bool mg__chan_readable(mg__chan *c)
{
    return c->kind == MG__CH_SHM ? mg__shm_chan_readable(c) : true;
}

bool mg__chan_writable(mg__chan *c)
{
    return c->kind == MG__CH_SHM ? mg__shm_chan_writable(c) : true;
}
