/* What the builtin backend's transports share: the frame header (which is
 * also a collective's fingerprint), per-peer byte channels, the spin-then-
 * block waiting policy, and peer liveness checks.
 *
 * Liveness: every rank shows a sign of life to each peer at least every
 * mg__beat_period() — a heartbeat frame on a TCP channel that carried
 * nothing for that long, a counter bumped in its shared-memory segment —
 * from whichever thread holds the group (the executor while an operation
 * waits or moves data, the progress thread while the group is idle, so a
 * rank that computes for minutes still beats). A rank waiting on a peer
 * that showed nothing for MG_PEER_TIMEOUT seconds declares it dead. A
 * stopped process (SIGSTOP), a cut link or a frozen host stop its signs;
 * a slow one does not.
 *
 * A channel is a FIFO byte stream to one peer, carried by a shared-memory
 * ring pair (same host) or a TCP connection. Frames on it are a 64-byte
 * header and `len` bytes of payload. Only the thread executing the
 * group's current operation touches its channels. */
#ifndef MG_COMM_TRANSPORT_H
#define MG_COMM_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "comm/names.h"
#include "multigrad/comm.h"

#define MG__FRAME_MAGIC 0x3146474du /* "MGF1" */
/* The fingerprint's coll for mg_group_alloc (collective, not an mg_coll). */
#define MG__COLL_ALLOC MG_COLL_COUNT
enum { MG__FRAME_COLL = 1, MG__FRAME_P2P = 2, MG__FRAME_ABORT = 3, MG__FRAME_BEAT = 4 };
/* The longest abort notice a frame may carry (its text, without a NUL). */
#define MG__ABORT_MAX 1023

/* Frame header and fingerprint. For a collective: coll, dtype, op, algo,
 * root, seq (the group's collective sequence number) and count identify
 * the call on every rank — fields a collective does not use are zero —
 * and file:line name the caller. For point-to-point: root holds the tag,
 * seq counts messages from this sender to this receiver. */
typedef struct mg__fp {
    uint32_t magic;
    uint8_t kind, coll, dtype, op;
    uint8_t algo, pad[3];
    int32_t root;
    uint64_t seq;
    uint64_t count;
    uint64_t len;
    uint32_t line;
    char file[20];
} mg__fp;
_Static_assert(sizeof(mg__fp) == 64, "frame header is 64 bytes");

/* Checks what can be checked of a received header alone (magic, kind,
 * lengths of abort notices and heartbeats); NULL if it may be claimed,
 * else why not. Pure: the fuzz target (fuzz/fuzz_frame.c) calls it. */
const char *mg__frame_check(const mg__fp *h);

/* Fill a collective's fingerprint from a call (irrelevant fields zeroed). */
void mg__fp_make(mg__fp *fp, const mg_call *c, uint64_t seq, int algo);
/* The fields every rank must agree on are equal. */
bool mg__fp_same(const mg__fp *a, const mg__fp *b);
/* "all_reduce #12 (1000 x f32, sum, algo ring) at train.c:88" */
void mg__fp_describe(const mg__fp *fp, char *buf, size_t n);
/* The error for ranks that disagree: names both calls, and both ranks as
 * nm does. */
mg_status mg__fp_mismatch(const mg__names *nm, const mg__fp *mine, int me, const mg__fp *theirs,
                          int peer);

/* mg_now()'s clock at tick resolution (a few ms) for a fraction of the
 * cost: good enough for deadlines, which every operation sets. */
double mg__now_coarse(void);

/* ---- waiting ---- */
typedef struct mg__spin_cfg {
    double spin_s;   /* busy-wait this long before yielding */
    double yield_s;  /* then sched_yield this long before sleeping */
} mg__spin_cfg;
/* From the number of ranks sharing this host's CPUs: spin when each rank
 * has a core, yield almost at once when oversubscribed. MG_SPIN_US
 * overrides the spin time. */
mg__spin_cfg mg__spin_default(int local_ranks);

/* One waiter's progress through the policy. */
typedef struct mg__spin {
    double t0;
    int iter;
} mg__spin;
/* 0: spin again (after a pause or yield), 1: time to block. */
int mg__spin_step(mg__spin *s, const mg__spin_cfg *cfg);
static inline void mg__spin_reset(mg__spin *s) { s->t0 = 0; s->iter = 0; }
static inline void mg__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---- liveness of peers ---- */
/* MG_PEER_TIMEOUT (seconds, default 15; 0: off, only MG_TIMEOUT applies)
 * is how long a waiting rank hears nothing from a peer before declaring
 * it dead. How often a rank shows a sign of life (heartbeat) for it: */
double mg__beat_period(double peer_timeout);
/* The error for a peer `who` ("rank 1 (pid 7, this host)") that showed no
 * sign of life for `secs` while this rank was `what`; state: what this
 * host can see of its process (an mg__liveness; MG__UNSEEN on another
 * host). */
mg_status mg__peer_silent(const char *who, double secs, const char *what, int state);

/* ---- liveness of a process on this host ---- */
typedef enum { MG__ALIVE, MG__DEAD, MG__STOPPED, MG__UNSEEN } mg__liveness;
/* starttime (from /proc/PID/stat) tells a recycled pid from the peer. */
mg__liveness mg__proc_state(pid_t pid, uint64_t starttime);
uint64_t mg__proc_starttime(pid_t pid);

/* ---- channels ---- */
typedef enum { MG__CH_NONE, MG__CH_SHM, MG__CH_TCP } mg__ch_kind;

typedef struct mg__ring mg__ring;

typedef struct mg__chan {
    mg__ch_kind kind;
    int peer;
    const mg__names *names;                /* the group's, to name the peer */
    /* TCP */
    int fd;
    /* shared memory: tx lives in the peer's segment, rx in ours */
    mg__ring *tx, *rx;
    uint8_t *tx_data, *rx_data;
    size_t cap;
    uint64_t tx_head_seen, rx_tail_seen;  /* cached far-side indices */
    void *shm_transport;                   /* for wake-ups */
    /* liveness (mg__now_coarse() seconds) */
    double last_rx, last_tx;               /* bytes last received / sent */
    int inq_seen;                          /* TCP: unread bytes queued, last seen */
    /* framing state */
    bool tx_mid;                           /* a frame is partly written */
    uint8_t beat_left;                     /* TCP: heartbeat bytes still to send */
    bool dead;                             /* failed; never used again */
    bool eof;                              /* TCP: the peer closed it */
} mg__chan;

/* Write up to an + bn bytes (a then b); returns how many were taken
 * (0 if none fit now), or -1 with the error recorded. */
ssize_t mg__chan_write(mg__chan *c, const void *a, size_t an, const void *b, size_t bn);
/* Read up to n bytes; returns how many (0 if none available), or -1. */
ssize_t mg__chan_read(mg__chan *c, void *buf, size_t n);
/* TCP: a heartbeat frame if the channel is between frames and sent
 * nothing since `before`, or the rest of one partly sent. Failures are
 * left for the next write to report. */
void mg__chan_beat(mg__chan *c, double before);
/* Between frames: an abort notice may be written now. */
static inline bool mg__chan_at_boundary(const mg__chan *c) { return !c->tx_mid && !c->beat_left; }
/* Whether a read or write could make progress now (shm: exact; TCP:
 * always "maybe", use poll). */
bool mg__chan_readable(mg__chan *c);
bool mg__chan_writable(mg__chan *c);

#endif
