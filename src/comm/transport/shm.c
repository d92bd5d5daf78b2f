/* The shared-memory transport (see shm.h).
 *
 * Segment layout (owner o, every offset fixed so all ranks agree):
 *      0  header (magic, group id, rank, layout) — checked by every mapper
 *    256  hot line, written only by o: posted counter, barrier count,
 *         and o's current fingerprint under a seqlock, so
 *         a peer that reads o's counter reads its fingerprint in the same
 *         cache line: the check costs no extra transfer
 *    384  sleep line: o's "sleeping" flag and doorbell futex
 *    448  heartbeat: a counter o bumps while it lives (transport.h)
 *    512  abort notice (flag, message)
 *   2048  the last 16 fingerprints in full (for messages, and for peers
 *         that fell behind), each under a seqlock
 *   4096  ring indices, 128 B per group rank (tail written by that sender,
 *         head and whether o dropped that sender by o, on separate lines)
 *         ring data, one power-of-two ring per local peer
 *         slot (all-local groups only)
 *
 * Waking: a waiter sets its sleeping flag (seq_cst), reads its doorbell,
 * rechecks its condition and futex-waits on the doorbell; a writer stores
 * its data or counter (seq_cst) and, only if the target's flag is set,
 * bumps the doorbell and wakes it. Either the writer sees the flag or the
 * waiter's recheck sees the data, so no wake-up is lost and the fast path
 * costs one load of a line that rarely changes.
 *
 * Names: /mg-[TAG-]GID-RANK (and -aIDX for group memory), TAG being the
 * MG_SHM_TAG of the rank that made the segment, which each rank tells the
 * others at rendezvous: the ranks of one host may come from several
 * launchers (two mgrun --nnodes on one host), and each launcher removes
 * the names of its own ranks when they end, whatever killed them. A name
 * exists from the segment's creation until every local peer has mapped
 * it; meanwhile SIGTERM, SIGINT and SIGHUP first remove the names of the
 * group's segments on this host — this rank's and its peers', which a
 * SIGKILL may have ended before they could — then do what they did
 * before.
 *
 * Counters only grow (the algorithms derive them from their operation
 * count), so a peer that moved on to a later operation satisfies every
 * wait of an earlier one. Limits: a peer more than 16 operations ahead
 * cannot have its fingerprint checked (it cannot get there without this
 * rank anyway). */
#define _GNU_SOURCE
#include "comm/transport/shm_internal.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "multigrad/core.h"

#define SEG_MAGIC 0x314d454748534d47ull
#define OFF_HOT 256
#define OFF_SLEEP 384
#define OFF_BEAT 448
#define OFF_ABORT 512
#define OFF_HIST 2048
#define OFF_RINGS 4096
#define HIST 16
#define MAX_ABORT 1000
#define CHUNK ((size_t)256 << 10)
#define SLICE 0.1
#define LIVE_EVERY 0.2

typedef struct {
    uint64_t magic, gid;
    int32_t rank, size, all_local, pid;
    uint64_t ring_bytes, slot_bytes, total, ring_off, slot_off;
} seg_hdr;

typedef struct {
    _Atomic uint64_t post;
    _Atomic uint64_t barrier;
    _Atomic uint64_t fp_seq;
    _Atomic uint64_t fp_count;
    _Atomic uint32_t fp_word;
    _Atomic int32_t fp_root;
} hot_line;

typedef struct {
    _Atomic uint32_t sleeping, doorbell;
} sleep_line;

typedef struct {
    _Atomic uint32_t flag;
    char msg[MAX_ABORT];
} abort_area;

typedef struct {
    _Atomic uint64_t seq;
    uint64_t pad[7];
    mg__fp fp;
} hist_rec;

struct mg__ring {
    _Atomic uint64_t tail;
    char pad1[56];
    _Atomic uint64_t head;
    _Atomic uint32_t dropped;   /* the owner took the sender as lost (mg__shm_transport_drop) */
    char pad2[52];
};

_Static_assert(sizeof(seg_hdr) <= OFF_HOT - 0, "header fits");
_Static_assert(sizeof(hot_line) <= 128, "hot line fits");
_Static_assert(sizeof(sleep_line) <= OFF_BEAT - OFF_SLEEP, "sleep line fits");
_Static_assert(OFF_ABORT + sizeof(abort_area) <= OFF_HIST, "abort area fits");
_Static_assert(OFF_HIST + HIST * sizeof(hist_rec) <= OFF_RINGS, "history fits");

/* The mg__shm_view's operations (defined below). */
static void *v_slot(mg__shm_view *s, int rank);
static mg_status v_barrier(mg__shm_view *s, int phase);
static void v_post(mg__shm_view *s, uint64_t v);
static mg_status v_wait(mg__shm_view *s, int rank, uint64_t v);

static inline hot_line *hot(mg__shm_transport *x, int r)
{
    return (hot_line *)(x->seg[r] + OFF_HOT);
}
static inline sleep_line *slp(mg__shm_transport *x, int r)
{
    return (sleep_line *)(x->seg[r] + OFF_SLEEP);
}
static inline _Atomic uint64_t *beat(mg__shm_transport *x, int r)
{
    return (_Atomic uint64_t *)(x->seg[r] + OFF_BEAT);
}
static inline abort_area *abt(mg__shm_transport *x, int r)
{
    return (abort_area *)(x->seg[r] + OFF_ABORT);
}
static inline hist_rec *hist(mg__shm_transport *x, int r, uint64_t seq)
{
    return (hist_rec *)(x->seg[r] + OFF_HIST) + (seq % HIST);
}
static inline mg__ring *ring(mg__shm_transport *x, int owner, int sender)
{
    return (mg__ring *)(x->seg[owner] + OFF_RINGS) + sender;
}
/* Which of owner's rings carries sender's bytes: senders are numbered
 * among owner's local peers in rank order. */
static uint8_t *ring_data(mg__shm_transport *x, int owner, int sender)
{
    int idx = 0;
    for (int t = 0; t < sender; t++) idx += x->local[t] && t != owner;
    return x->seg[owner] + x->ring_off + (size_t)idx * x->ring_bytes;
}

size_t mg__shm_page_up(size_t n) { return (n + 4095) & ~(size_t)4095; }

static long futex(_Atomic uint32_t *a, int op, uint32_t v, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)a, op, v, ts, NULL, 0);
}

static void layout(mg__shm_transport *x)
{
    int nl = 0;
    for (int r = 0; r < x->size; r++) nl += x->local[r];
    x->ring_off = mg__shm_page_up(OFF_RINGS + sizeof(mg__ring) * (size_t)x->size);
    x->slot_off = mg__shm_page_up(x->ring_off + (size_t)(nl - 1) * x->ring_bytes);
    x->total = x->slot_off + (x->all_local ? mg__shm_page_up(x->slot_bytes) : 0);
}

/* ---- segments ------------------------------------------------------------ */

/* The name of rank's segment. */
static void seg_name(char *buf, size_t n, const mg__shm_transport *x, int rank)
{
    const char *tag = x->tags[rank];
    snprintf(buf, n, "/mg-%s%s%016llx-%d", tag, *tag ? "-" : "", (unsigned long long)x->gid,
             rank);
}

/* Group memory: allocation idx of rank. */
void mg__shm_alloc_name(char *buf, size_t n, const mg__shm_transport *x, int rank, unsigned idx)
{
    seg_name(buf, n, x, rank);
    size_t k = strlen(buf);
    snprintf(buf + k, n - k, "-a%u", idx);
}

/* Guard (or stop guarding) the names of the local peers' segments
 * (idx < 0) or allocations idx: see the top of this file. */
void mg__shm_guard_peers(mg__shm_transport *x, long idx, bool keep)
{
    for (int i = 0; i < x->npeers; i++) {
        char name[80];
        if (idx < 0) seg_name(name, sizeof name, x, x->peers[i]);
        else mg__shm_alloc_name(name, sizeof name, x, x->peers[i], (unsigned)idx);
        if (keep) mg__shm_name_keep(name);
        else mg__shm_name_drop(name);
    }
}

mg_status mg__shm_transport_create(const mg__shm_transport_cfg *cfg, mg__shm_transport **out)
{
    *out = NULL;
    mg__shm_transport *x = calloc(1, sizeof *x);
    if (!x) return mg_error(MG_ENOMEM, "shm: out of memory");
    int n = cfg->size;
    x->rank = cfg->rank;
    x->size = n;
    x->gid = cfg->gid;
    x->all_local = cfg->all_local;
    x->spin = cfg->spin;
    size_t rb = 4096; /* the largest power of two within the budget */
    while (rb * 2 <= cfg->ring_bytes) rb <<= 1;
    x->ring_bytes = rb;
    x->slot_bytes = cfg->slot_bytes;
    x->local = calloc((size_t)n, sizeof *x->local);
    x->pid = calloc((size_t)n, sizeof *x->pid);
    x->start = calloc((size_t)n, sizeof *x->start);
    x->peers = calloc((size_t)n, sizeof *x->peers);
    x->seg = calloc((size_t)n, sizeof *x->seg);
    x->tags = calloc((size_t)n, sizeof *x->tags);
    x->checked = calloc((size_t)n, sizeof *x->checked);
    x->beat_seen = calloc((size_t)n, sizeof *x->beat_seen);
    x->beat_at = calloc((size_t)n, sizeof *x->beat_at);
    x->peer_timeout = cfg->peer_timeout;
    x->names = cfg->names;
    if (!x->local || !x->pid || !x->start || !x->peers || !x->seg || !x->tags || !x->checked ||
        !x->beat_seen || !x->beat_at) {
        mg__shm_transport_destroy(x);
        return mg_error(MG_ENOMEM, "shm: out of memory");
    }
    for (int r = 0; r < n; r++) {
        x->local[r] = cfg->local[r] || r == x->rank;
        x->pid[r] = cfg->pid[r];
        x->start[r] = cfg->start[r];
        MG_ASSERT(strlen(cfg->tags[r]) <= MG__SHM_TAG_MAX);
        strcpy(x->tags[r], cfg->tags[r]);
        if (x->local[r] && r != x->rank) x->peers[x->npeers++] = r;
    }
    layout(x);
    seg_name(x->name, sizeof x->name, x, x->rank);
    mg__shm_guard_peers(x, -1, true);
    int fd = mg__shm_named_create(x->name);
    if (fd < 0) {
        mg_status st = mg_error(MG_EIO, "shm_open(%s): %s; is /dev/shm mounted and writable?",
                                x->name, strerror(errno));
        mg__shm_guard_peers(x, -1, false);
        mg__shm_transport_destroy(x);
        return st;
    }
    mg_status st = mg__shm_named_size(fd, x->name, x->total, "the shared-memory transport");
    if (st) {
        close(fd);
        mg__shm_transport_unlink(x);
        mg__shm_transport_destroy(x);
        return st;
    }
    void *p = mmap(NULL, x->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        st = mg_error(MG_EIO, "mmap of %s: %s", x->name, strerror(errno));
        mg__shm_transport_unlink(x);
        mg__shm_transport_destroy(x);
        return st;
    }
    x->seg[x->rank] = p;
    seg_hdr *h = p;
    *h = (seg_hdr){SEG_MAGIC, x->gid, x->rank, n, x->all_local, (int32_t)getpid(),
                   x->ring_bytes, x->slot_bytes, x->total, x->ring_off, x->slot_off};
    for (uint64_t i = 0; i < HIST; i++) atomic_store(&hist(x, x->rank, i)->seq, UINT64_MAX);
    atomic_store(&hot(x, x->rank)->fp_seq, UINT64_MAX);
    /* Made once: the algorithms keep state (coll_seq) in the view. */
    x->view = (mg__shm_view){.slot_bytes = x->slot_bytes, .slot = v_slot, .peer_ptr = mg__shm_peer_ptr,
                             .gaddr = mg__shm_gaddr, .gptr = mg__shm_gptr, .barrier = v_barrier,
                             .post = v_post, .wait = v_wait, .ctx = x};
    *out = x;
    return MG_OK;
}

mg_status mg__shm_transport_attach(mg__shm_transport *x)
{
    for (int i = 0; i < x->npeers; i++) {
        int r = x->peers[i];
        char name[64];
        seg_name(name, sizeof name, x, r);
        int fd = shm_open(name, O_RDWR, 0);
        if (fd < 0) {
            /* The ranks share this host (boot and namespaces), and r made
             * the name and keeps it until every local peer has mapped it. */
            int e = errno;
            char who[160];
            mg__shm_transport_describe_peer(x, r, who, sizeof who);
            return mg_error(MG_EIO, "cannot open the shared memory %s of %s: %s; %s", name, who,
                            strerror(e), e == EACCES
                            ? "the ranks run as different users: run them as one user or set "
                              "MG_TRANSPORT=tcp"
                            : mg__proc_state(x->pid[r], x->start[r]) == MG__DEAD
                            ? "that rank has died"
                            : "its name was removed before this rank could map it (by that "
                              "rank's launcher, or a clean-up of /dev/shm)");
        }
        struct stat st;
        char who[128];
        mg__rank_name(x->names, r, NULL, who, sizeof who);
        if (fstat(fd, &st) < 0 || (size_t)st.st_size != x->total) {
            close(fd);
            return mg_error(MG_EMISMATCH, "%s's shared memory %s has %lld bytes, expected %zu: "
                            "the ranks disagree on MG_SHM_* settings", who, name,
                            (long long)st.st_size, x->total);
        }
        void *p = mmap(NULL, x->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) return mg_error(MG_EIO, "mmap of %s: %s", name, strerror(errno));
        x->seg[r] = p;
        const seg_hdr *h = p;
        if (h->magic != SEG_MAGIC || h->gid != x->gid || h->rank != r || h->size != x->size ||
            h->total != x->total || h->ring_bytes != x->ring_bytes || h->slot_off != x->slot_off)
            return mg_error(MG_EMISMATCH, "%s's shared memory %s does not match this group's "
                            "layout (the ranks disagree on MG_SHM_* settings)", who, name);
    }
    return MG_OK;
}

void mg__shm_transport_unlink(mg__shm_transport *x)
{
    if (x->unlinked) return;
    mg__shm_named_unlink(x->name);
    mg__shm_guard_peers(x, -1, false);
    x->unlinked = true;
}

void mg__shm_transport_destroy(mg__shm_transport *x)
{
    if (!x) return;
    while (x->allocs) mg__shm_transport_free(x, x->allocs->base[x->rank]);
    if (x->seg) {
        if (x->seg[x->rank]) mg__shm_transport_unlink(x);
        for (int r = 0; r < x->size; r++)
            if (x->seg[r]) munmap(x->seg[r], x->total);
    }
    free(x->local);
    free(x->pid);
    free(x->start);
    free(x->peers);
    free(x->seg);
    free(x->tags);
    free(x->checked);
    free(x->beat_seen);
    free(x->beat_at);
    free(x);
}

/* ---- wake-ups, aborts, liveness ----------------------------------------- */

void mg__shm_transport_wake(mg__shm_transport *x, int peer)
{
    sleep_line *s = slp(x, peer);
    if (atomic_load(&s->sleeping)) {
        atomic_fetch_add(&s->doorbell, 1);
        futex(&s->doorbell, FUTEX_WAKE, INT_MAX, NULL);
    }
}

static void wake_peers(mg__shm_transport *x)
{
    for (int i = 0; i < x->npeers; i++) mg__shm_transport_wake(x, x->peers[i]);
}

void mg__shm_transport_block(mg__shm_transport *x, double slice, bool (*ready)(void *), void *arg)
{
    sleep_line *s = slp(x, x->rank);
    atomic_store(&s->sleeping, 1);
    uint32_t d = atomic_load(&s->doorbell);
    if (!ready(arg)) {
        struct timespec ts = {(time_t)slice, (long)((slice - (double)(time_t)slice) * 1e9)};
        futex(&s->doorbell, FUTEX_WAIT, d, &ts);
    }
    atomic_store(&s->sleeping, 0);
}

int mg__shm_transport_aborted(mg__shm_transport *x, char *msg, size_t n)
{
    for (int i = 0; i < x->npeers; i++) {
        abort_area *a = abt(x, x->peers[i]);
        if (atomic_load_explicit(&ring(x, x->rank, x->peers[i])->dropped, memory_order_relaxed))
            continue;   /* gone for this rank, whatever it says */
        if (atomic_load_explicit(&a->flag, memory_order_acquire)) {
            size_t k = strnlen(a->msg, MAX_ABORT - 1);
            if (k >= n) k = n - 1;
            memcpy(msg, a->msg, k);
            msg[k] = 0;
            return x->peers[i];
        }
    }
    return -1;
}

void mg__shm_transport_drop(mg__shm_transport *x, int peer)
{
    atomic_store_explicit(&ring(x, x->rank, peer)->dropped, 1, memory_order_release);
    if (x->local[peer]) mg__shm_transport_wake(x, peer);
}

void mg__shm_transport_abort(mg__shm_transport *x, const char *msg)
{
    abort_area *a = abt(x, x->rank);
    if (atomic_load(&a->flag)) return;
    snprintf(a->msg, MAX_ABORT, "%s", msg);
    atomic_store_explicit(&a->flag, 1, memory_order_release);
    for (int i = 0; i < x->npeers; i++) {
        sleep_line *s = slp(x, x->peers[i]);
        atomic_fetch_add(&s->doorbell, 1);
        futex(&s->doorbell, FUTEX_WAKE, INT_MAX, NULL);
    }
}

void mg__shm_transport_describe_peer(mg__shm_transport *x, int peer, char *buf, size_t n)
{
    char extra[64];
    snprintf(extra, sizeof extra, "pid %d, this host", (int)x->pid[peer]);
    mg__rank_name(x->names, peer, extra, buf, n);
}

void mg__shm_transport_beat(mg__shm_transport *x)
{
    atomic_fetch_add_explicit(beat(x, x->rank), 1, memory_order_relaxed);
}

/* Peer p's heartbeat has not moved for the peer timeout, counted from the
 * start of this operation at the earliest. */
static bool silent(mg__shm_transport *x, int p, double now)
{
    uint64_t b = atomic_load_explicit(beat(x, p), memory_order_relaxed);
    if (b != x->beat_seen[p]) {
        x->beat_seen[p] = b;
        x->beat_at[p] = now;
    }
    double since = x->beat_at[p] > x->started ? x->beat_at[p] : x->started;
    return x->peer_timeout > 0 && now - since > x->peer_timeout;
}

mg_status mg__shm_transport_check(mg__shm_transport *x, const int *peers, int n, const char *what,
                                  int *failed)
{
    char msg[MAX_ABORT], who[160];
    for (int i = 0; i < n; i++) {
        int p = peers[i];
        if (!x->local[p] || p == x->rank ||
            !atomic_load_explicit(&ring(x, p, x->rank)->dropped, memory_order_acquire))
            continue;
        if (failed) *failed = p;
        return mg_error(MG_ELEFT, "%s took this rank as lost (silent past MG_PEER_TIMEOUT, or "
                        "its link failed) and went on without it, while this rank was %s",
                        mg__rank_name(x->names, p, NULL, who, sizeof who), what);
    }
    int r = mg__shm_transport_aborted(x, msg, sizeof msg);
    if (r >= 0 && failed) *failed = r;
    if (r >= 0)
        return mg_error(MG_EPEER, "%s failed and aborted the group: %s",
                        mg__rank_name(x->names, r, NULL, who, sizeof who), msg);
    mg__shm_transport_beat(x);
    double now = mg_now();
    bool late = now >= x->deadline;
    if (now >= x->next_live || late) {
        x->next_live = now + LIVE_EVERY;
        for (int i = 0; i < n; i++) {
            int p = peers[i];
            if (!x->local[p] || p == x->rank) continue;
            mg__liveness l = mg__proc_state(x->pid[p], x->start[p]);
            mg__shm_transport_describe_peer(x, p, who, sizeof who);
            if (failed && (l == MG__DEAD || silent(x, p, now) || late)) *failed = p;
            if (l == MG__DEAD)
                return mg_error(MG_EPEER, "%s died (its process is gone) while this rank was %s",
                                who, what);
            if (silent(x, p, now)) return mg__peer_silent(who, x->peer_timeout, what, l);
            if (late)
                return mg_error(MG_ETIMEOUT, "timed out after %.1f s %s: %s is %s", now - x->started,
                                what, who, l == MG__STOPPED
                                ? "stopped (SIGSTOP or a debugger); resume it or raise MG_TIMEOUT"
                                : "alive but did not respond (hung, busy, or in another "
                                  "operation); raise MG_TIMEOUT if it is just slow");
        }
    }
    if (late)
        return mg_error(MG_ETIMEOUT, "timed out after %.1f s %s", now - x->started, what);
    return MG_OK;
}

/* ---- channels ------------------------------------------------------------ */

void mg__shm_transport_chan(mg__shm_transport *x, int peer, mg__chan *c)
{
    memset(c, 0, sizeof *c);
    c->kind = MG__CH_SHM;
    c->peer = peer;
    c->fd = -1;
    c->tx = ring(x, peer, x->rank);
    c->rx = ring(x, x->rank, peer);
    c->tx_data = ring_data(x, peer, x->rank);
    c->rx_data = ring_data(x, x->rank, peer);
    c->cap = x->ring_bytes;
    c->shm_transport = x;
}

static void copy_in(uint8_t *ring_base, size_t cap, uint64_t pos, const uint8_t *src, size_t n)
{
    size_t off = (size_t)(pos & (cap - 1)), first = cap - off < n ? cap - off : n;
    memcpy(ring_base + off, src, first);
    if (n > first) memcpy(ring_base, src + first, n - first);
}

static void copy_out(uint8_t *dst, const uint8_t *ring_base, size_t cap, uint64_t pos, size_t n)
{
    size_t off = (size_t)(pos & (cap - 1)), first = cap - off < n ? cap - off : n;
    memcpy(dst, ring_base + off, first);
    if (n > first) memcpy(dst + first, ring_base, n - first);
}

ssize_t mg__shm_chan_write(mg__chan *c, const void *a, size_t an, const void *b, size_t bn)
{
    uint64_t tail = atomic_load_explicit(&c->tx->tail, memory_order_relaxed);
    size_t space = c->cap - (size_t)(tail - c->tx_head_seen);
    if (space == 0) {
        c->tx_head_seen = atomic_load_explicit(&c->tx->head, memory_order_acquire);
        space = c->cap - (size_t)(tail - c->tx_head_seen);
        if (space == 0) return 0;
    }
    size_t k = an + bn < space ? an + bn : space;
    if (k > CHUNK) k = CHUNK;
    size_t ka = k < an ? k : an;
    if (ka) copy_in(c->tx_data, c->cap, tail, a, ka);
    if (k > ka) copy_in(c->tx_data, c->cap, tail + ka, b, k - ka);
    atomic_store(&c->tx->tail, tail + k);
    mg__shm_transport_wake(c->shm_transport, c->peer);
    return (ssize_t)k;
}

ssize_t mg__shm_chan_read(mg__chan *c, void *buf, size_t n)
{
    uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_relaxed);
    size_t avail = (size_t)(c->rx_tail_seen - head);
    if (avail == 0) {
        c->rx_tail_seen = atomic_load_explicit(&c->rx->tail, memory_order_acquire);
        avail = (size_t)(c->rx_tail_seen - head);
        if (avail == 0) return 0;
    }
    size_t k = n < avail ? n : avail;
    if (k > CHUNK) k = CHUNK;
    copy_out(buf, c->rx_data, c->cap, head, k);
    atomic_store(&c->rx->head, head + k);
    mg__shm_transport_wake(c->shm_transport, c->peer);
    return (ssize_t)k;
}

bool mg__shm_chan_readable(mg__chan *c)
{
    uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_relaxed);
    return atomic_load(&c->rx->tail) != head;
}

bool mg__shm_chan_writable(mg__chan *c)
{
    uint64_t tail = atomic_load_explicit(&c->tx->tail, memory_order_relaxed);
    return tail - atomic_load(&c->tx->head) < c->cap;
}

/* ---- the mg__shm_view ---------------------------------------------------- */

static uint32_t fp_word(const mg__fp *f)
{
    return (uint32_t)f->coll | (uint32_t)f->dtype << 8 | (uint32_t)f->op << 16 |
           (uint32_t)f->algo << 24;
}

void mg__shm_transport_begin(mg__shm_transport *x, const mg__fp *fp, double deadline)
{
    mg__shm_transport_beat(x);
    x->fp = *fp;
    x->seq = fp->seq;
    x->deadline = deadline;
    x->started = mg__now_coarse();
    hist_rec *h = hist(x, x->rank, fp->seq);
    atomic_store_explicit(&h->seq, UINT64_MAX, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    h->fp = *fp;
    atomic_store_explicit(&h->seq, fp->seq, memory_order_release);
    hot_line *m = hot(x, x->rank);
    atomic_store_explicit(&m->fp_seq, UINT64_MAX, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&m->fp_word, fp_word(fp), memory_order_relaxed);
    atomic_store_explicit(&m->fp_count, fp->count, memory_order_relaxed);
    atomic_store_explicit(&m->fp_root, fp->root, memory_order_relaxed);
    atomic_store_explicit(&m->fp_seq, fp->seq, memory_order_release);
}

void mg__shm_transport_set_deadline(mg__shm_transport *x, double started, double deadline)
{
    x->deadline = deadline;
    x->started = started;
}

/* Peer r has reached this operation (or passed it): check that it is the
 * same operation. Seqlocks guard against reading a fingerprint the peer is
 * overwriting; a peer too far ahead is not checked. */
static mg_status fp_check(mg__shm_transport *x, int r)
{
    if (x->checked[r] == x->seq) return MG_OK;
    hot_line *h = hot(x, r);
    uint64_t s1 = atomic_load_explicit(&h->fp_seq, memory_order_acquire);
    if (s1 == x->seq) {
        uint32_t w = atomic_load_explicit(&h->fp_word, memory_order_relaxed);
        uint64_t cnt = atomic_load_explicit(&h->fp_count, memory_order_relaxed);
        int32_t root = atomic_load_explicit(&h->fp_root, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&h->fp_seq, memory_order_relaxed) == s1) {
            if (w == fp_word(&x->fp) && cnt == x->fp.count && root == x->fp.root) {
                x->checked[r] = x->seq;
                return MG_OK;
            }
        }
    }
    /* Mismatch, or the peer moved on: consult its history. */
    hist_rec *hr = hist(x, r, x->seq);
    uint64_t h1 = atomic_load_explicit(&hr->seq, memory_order_acquire);
    mg__fp theirs = hr->fp;
    atomic_thread_fence(memory_order_acquire);
    uint64_t h2 = atomic_load_explicit(&hr->seq, memory_order_relaxed);
    if (h1 != x->seq || h2 != h1) return MG_OK; /* too far ahead to tell */
    if (mg__fp_same(&x->fp, &theirs)) {
        x->checked[r] = x->seq;
        return MG_OK;
    }
    return mg__fp_mismatch(x->names, &x->fp, x->rank, &theirs, r);
}

typedef struct {
    mg__shm_transport *x;
    int r;
    uint64_t v;
} wait_arg;

static bool post_reached(void *p)
{
    wait_arg *a = p;
    return atomic_load_explicit(&hot(a->x, a->r)->post, memory_order_acquire) >= a->v;
}

static bool barrier_reached(void *p)
{
    wait_arg *a = p;
    return atomic_load(&hot(a->x, a->r)->barrier) >= a->v;
}

static mg_status wait_for(mg__shm_transport *x, bool (*cond)(void *), wait_arg *a, const char *what)
{
    mg__spin sp = {0};
    char msg[320];
    while (!cond(a)) {
        if (!mg__spin_step(&sp, &x->spin)) continue;
        mg__shm_transport_block(x, SLICE, cond, a);
        if (cond(a)) break;
        /* A peer in another operation may never post what we wait for:
         * its fingerprint tells, long before the deadline. */
        MG_TRY(fp_check(x, a->r));
        char who[256];
        snprintf(msg, sizeof msg, "waiting for %s", mg__rank_name(x->names, a->r, what, who,
                                                                   sizeof who));
        mg_status st = mg__shm_transport_check(x, &a->r, 1, msg, NULL);
        /* The peer may have posted what we wait for and exited since
         * cond was read (its last operation done, its process gone):
         * read it once more before calling it dead. */
        if (st && !cond(a)) return st;
        if (st) break;
    }
    return fp_check(x, a->r);
}

static void *v_slot(mg__shm_view *s, int rank)
{
    mg__shm_transport *x = s->ctx;
    MG_ASSERT(rank >= 0 && rank < x->size);
    return x->seg[rank] + x->slot_off;
}

static mg_status v_barrier(mg__shm_view *s, int phase)
{
    mg__shm_transport *x = s->ctx;
    x->nbar++;
    atomic_store(&hot(x, x->rank)->barrier, x->nbar);
    wake_peers(x);
    for (int i = 0; i < x->npeers; i++) {
        wait_arg a = {x, x->peers[i], x->nbar};
        char what[48];
        snprintf(what, sizeof what, "barrier phase %d", phase);
        MG_TRY(wait_for(x, barrier_reached, &a, what));
    }
    return MG_OK;
}

static void v_post(mg__shm_view *s, uint64_t v)
{
    mg__shm_transport *x = s->ctx;
    atomic_store(&hot(x, x->rank)->post, v);
    wake_peers(x);
}

static mg_status v_wait(mg__shm_view *s, int rank, uint64_t v)
{
    mg__shm_transport *x = s->ctx;
    wait_arg a = {x, rank, v};
    if (post_reached(&a)) return fp_check(x, rank);
    return wait_for(x, post_reached, &a, "its posted counter");
}

mg__shm_view *mg__shm_transport_view(mg__shm_transport *x)
{
    return x && x->all_local ? &x->view : NULL;
}
