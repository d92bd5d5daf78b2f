/* Transport-independent pieces (see transport.h): fingerprints and their
 * messages, the spin-then-block policy, process liveness from /proc, and
 * the channel dispatch. */
#define _GNU_SOURCE
#include "comm/transport/transport.h"
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "comm/transport/shm.h"
#include "comm/transport/tcp.h"
#include "multigrad/core.h"

/* ---- fingerprints ---- */

static bool has_op(int c)
{
    return c == MG_COLL_REDUCE || c == MG_COLL_ALL_REDUCE || c == MG_COLL_REDUCE_SCATTER;
}

static bool has_root(int c)
{
    return c == MG_COLL_BROADCAST || c == MG_COLL_REDUCE || c == MG_COLL_GATHER ||
           c == MG_COLL_SCATTER;
}

void mg__fp_make(mg__fp *fp, const mg_call *c, uint64_t seq, int algo)
{
    memset(fp, 0, sizeof *fp);
    fp->magic = MG__FRAME_MAGIC;
    fp->kind = MG__FRAME_COLL;
    fp->coll = (uint8_t)c->coll;
    fp->algo = (uint8_t)algo;
    if (c->coll != MG_COLL_BARRIER) {
        fp->dtype = (uint8_t)c->dtype;
        fp->count = c->count;
    }
    if (has_op(c->coll)) fp->op = (uint8_t)c->op;
    if (has_root(c->coll)) fp->root = c->root;
    fp->seq = seq;
    fp->line = (uint32_t)(c->line > 0 ? c->line : 0);
    if (c->file) {
        const char *b = strrchr(c->file, '/');
        b = b ? b + 1 : c->file;
        size_t n = strlen(b);
        /* Keep the end of a long name: it is the distinctive part. */
        if (n >= sizeof fp->file) b += n - (sizeof fp->file - 1);
        memcpy(fp->file, b, strlen(b) + 1);
    }
}

bool mg__fp_same(const mg__fp *a, const mg__fp *b)
{
    return a->kind == b->kind && a->coll == b->coll && a->dtype == b->dtype && a->op == b->op &&
           a->algo == b->algo && a->root == b->root && a->seq == b->seq && a->count == b->count;
}

void mg__fp_describe(const mg__fp *fp, char *buf, size_t n)
{
    char file[sizeof fp->file + 1];
    memcpy(file, fp->file, sizeof fp->file);
    file[sizeof fp->file] = 0;
    for (char *p = file; *p; p++)
        if (*p < 32 || *p > 126) *p = '?';
    const char *cn = fp->coll < MG_COLL_COUNT ? mg_coll_name((mg_coll)fp->coll)
                   : fp->coll == MG__COLL_ALLOC ? "mg_group_alloc" : "?";
    const char *dn = fp->dtype < MG_DTYPE_COUNT ? mg_dtype_name((mg_dtype)fp->dtype) : "?";
    char extra[64] = "";
    if (has_op(fp->coll))
        snprintf(extra, sizeof extra, ", %s", fp->op < MG_OP_COUNT ? mg_op_name((mg_op)fp->op) : "?");
    else if (has_root(fp->coll))
        snprintf(extra, sizeof extra, ", root %d", fp->root);
    if (fp->coll == MG__COLL_ALLOC)
        snprintf(buf, n, "%s #%llu (%llu bytes)", cn, (unsigned long long)fp->seq,
                 (unsigned long long)fp->count);
    else if (fp->coll == MG_COLL_BARRIER)
        snprintf(buf, n, "%s #%llu at %s:%u", cn, (unsigned long long)fp->seq,
                 *file ? file : "?", fp->line);
    else
        snprintf(buf, n, "%s #%llu (%llu x %s%s) at %s:%u", cn, (unsigned long long)fp->seq,
                 (unsigned long long)fp->count, dn, extra, *file ? file : "?", fp->line);
}

mg_status mg__fp_mismatch(const mg__fp *mine, int me, const mg__fp *theirs, int peer)
{
    char a[160], b[160];
    mg__fp_describe(mine, a, sizeof a);
    mg__fp_describe(theirs, b, sizeof b);
    const char *why = mine->seq != theirs->seq ? "they are at different operations"
                    : mine->coll != theirs->coll ? "different collectives"
                    : mine->count != theirs->count ? "different counts"
                    : mine->dtype != theirs->dtype ? "different dtypes"
                    : mine->op != theirs->op ? "different reduction ops"
                    : mine->root != theirs->root ? "different roots"
                    : "different algorithms (MG_ALGO differs between ranks?)";
    return mg_error(MG_EMISMATCH, "mismatched collectives (%s): rank %d called %s but rank %d "
                    "called %s; every rank must issue the same collectives in the same order",
                    why, me, a, peer, b);
}

/* ---- waiting ---- */

mg__spin_cfg mg__spin_default(int local_ranks)
{
    cpu_set_t set;
    int cpus = 0;
    if (!sched_getaffinity(0, sizeof set, &set)) cpus = CPU_COUNT(&set);
    if (cpus <= 0) cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus <= 0) cpus = 1;
    mg__spin_cfg c;
    if (local_ranks <= cpus) {
        /* A core each: spinning is cheaper than a sleep and a wake-up. */
        c.spin_s = mg_env_double("MG_SPIN_US", 50) * 1e-6;
        c.yield_s = 200e-6;
    } else {
        /* Oversubscribed: the rank we wait for needs this core. */
        c.spin_s = mg_env_double("MG_SPIN_US", 0.5) * 1e-6;
        c.yield_s = 2e-3;
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

bool mg__chan_readable(mg__chan *c)
{
    return c->kind == MG__CH_SHM ? mg__shm_chan_readable(c) : true;
}

bool mg__chan_writable(mg__chan *c)
{
    return c->kind == MG__CH_SHM ? mg__shm_chan_writable(c) : true;
}
