/* What each algorithm moves, per rank, worked out step by step from the
 * algorithms' descriptions (docs/algorithms.md, the comments of ring.c,
 * rd.c and shm_direct.c) rather than taken from the library, so that the
 * traffic tests (test_traffic.c, test_mpi.c, test_mgbench.c) compare the
 * counters with an independent account. Bytes; `es` is the element size. */
#ifndef MG_TEST_TRAFFIC_MODEL_H
#define MG_TEST_TRAFFIC_MODEL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t sent, recv;
} tm_vol;

/* Block b of `count` elements cut into p as evenly as possible, the first
 * count % p blocks one longer (the ring's layout). */
static inline uint64_t tm_block(size_t count, int p, int b, size_t es)
{
    size_t q = count / (size_t)p, r = count % (size_t)p;
    return (uint64_t)(q + ((size_t)b < r)) * es;
}

/* Ring all_reduce: p-1 reduce-scatter steps (step s: send block r-s,
 * receive block r-s-1), then p-1 all-gather steps (send block r+1-s,
 * receive block r-s). */
static inline tm_vol tm_ring_all_reduce(size_t count, size_t es, int r, int p)
{
    tm_vol v = {0, 0};
    for (int s = 0; s < p - 1; s++) {
        v.sent += tm_block(count, p, ((r - s) % p + p) % p, es);
        v.recv += tm_block(count, p, ((r - s - 1) % p + p) % p, es);
    }
    for (int s = 0; s < p - 1; s++) {
        v.sent += tm_block(count, p, ((r + 1 - s) % p + p) % p, es);
        v.recv += tm_block(count, p, ((r - s) % p + p) % p, es);
    }
    return v;
}

/* Recursive halving then doubling (p a power of two, the vector cut evenly
 * among the p ranks): in the halving round with partner distance m a rank
 * sends the half of its range it gives up and receives the half it keeps;
 * the doubling rounds send the range it holds and receive its partner's. */
static inline tm_vol tm_rd_halving_all_reduce(size_t count, size_t es, int r, int p)
{
    tm_vol v = {0, 0};
    int lo = 0, hi = p;
    for (int m = p / 2; m >= 1; m /= 2) {
        int klo = r & m ? lo + m : lo, khi = r & m ? hi : lo + m;
        uint64_t keep = 0, all = 0;
        for (int b = lo; b < hi; b++) all += tm_block(count, p, b, es);
        for (int b = klo; b < khi; b++) keep += tm_block(count, p, b, es);
        v.sent += all - keep;
        v.recv += keep;
        lo = klo;
        hi = khi;
    }
    for (int m = 1; m < p; m *= 2) {
        int mine = r & ~(m - 1), theirs = (r ^ m) & ~(m - 1);
        for (int b = 0; b < m; b++) {
            v.sent += tm_block(count, p, mine + b, es);
            v.recv += tm_block(count, p, theirs + b, es);
        }
    }
    return v;
}

/* The shared-memory reductions cut m elements into p parts on 64-byte
 * lines: part q of m. */
static inline uint64_t tm_shm_part(size_t m, int p, int q, size_t es)
{
    size_t al = es >= 64 ? 1 : 64 / es, units = (m + al - 1) / al;
    size_t a = units * (size_t)q / (size_t)p * al, b = units * (size_t)(q + 1) / (size_t)p * al;
    if (a > m) a = m;
    if (b > m) b = m;
    return (uint64_t)(b - a) * es;
}

/* Shared-memory all_reduce (direct: one chunk of `count`; staged: chunks
 * of `chunk` elements): rank r reads its part of every peer's input
 * (received) and writes it into every peer's output (sent), while every
 * peer q reads part q of r's input (r sent) and writes part q of r's
 * output (r received). */
static inline tm_vol tm_shm_all_reduce(size_t count, size_t es, int r, int p, size_t chunk)
{
    tm_vol v = {0, 0};
    for (size_t c0 = 0; c0 < count; c0 += chunk) {
        size_t m = count - c0 < chunk ? count - c0 : chunk;
        uint64_t mine = tm_shm_part(m, p, r, es), all = (uint64_t)m * es;
        v.sent += (uint64_t)(p - 1) * mine + (all - mine);
        v.recv += (uint64_t)(p - 1) * mine + (all - mine);
    }
    return v;
}

/* Shared-memory reduce to `root`, the same parts: rank r reads its part
 * of every input and writes it into the root's output; every other rank
 * reads part r of r's input, and the root's output gets their parts. */
static inline tm_vol tm_shm_reduce(size_t count, size_t es, int r, int p, int root,
                                   size_t chunk)
{
    tm_vol v = {0, 0};
    for (size_t c0 = 0; c0 < count; c0 += chunk) {
        size_t m = count - c0 < chunk ? count - c0 : chunk;
        uint64_t mine = tm_shm_part(m, p, r, es), all = (uint64_t)m * es;
        v.sent += (all - mine) + (r == root ? 0 : mine);
        v.recv += (uint64_t)(p - 1) * mine + (r == root ? all - mine : 0);
    }
    return v;
}

#endif
