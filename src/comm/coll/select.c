/* Algorithm selection from an alpha-beta-gamma cost model: a message costs
 * alpha (latency) plus beta per byte on the wire, and reducing costs gamma
 * per byte. Each family's time for a collective is estimated from the
 * bytes its ranks send in sequence (docs/algorithms.md has the formulas)
 * and the cheapest wins; ties go to the lower-numbered family. The
 * central family (every collective through rank 0) is modelled for
 * mg_coll_time_by but never chosen: its root carries every vector.
 *
 * Constants: TCP (loopback or a LAN) has alpha ~25 us and ~1.2 GB/s per
 * stream; the shared-memory transport carrying point-to-point messages has
 * alpha ~2 us and ~6 GB/s (two copies); the direct shared-memory
 * algorithms pay ~0.4 us per synchronisation and move data at ~8 GB/s
 * (one copy from group memory, two staged). They
 * were measured on the development machine (2-core EPYC VM) and only
 * their ratios matter.
 *
 * Limits: the model ignores oversubscription (more ranks than cores),
 * where every synchronisation costs a context switch; the shared-memory
 * family, which needs the fewest, wins there as well. */
#include <math.h>
#include "comm/coll/algos.h"

typedef struct {
    double a, b, g;   /* s per message, s per byte sent, s per byte reduced */
} model;

static const model TCP = {25e-6, 1.0 / 1.2e9, 1.0 / 8e9};
static const model SHM_P2P = {2e-6, 1.0 / 6e9, 1.0 / 8e9};
static const model SHM_DIRECT = {0.4e-6, 1.0 / 8e9, 1.0 / 8e9};
/* The same as links: the shared-memory one is the point-to-point
 * transport's; the direct family's constants scale with it. */
static const mg_link TCP_LINK = {25e-6, 1.2e9, 8e9, false};
static const mg_link SHM_LINK = {2e-6, 6e9, 8e9, true};

static int ceil_log2(int p)
{
    int l = 0;
    while ((1 << l) < p) l++;
    return l;
}

static int floor_pow2(int p)
{
    int q = 1;
    while (q * 2 <= p) q *= 2;
    return q;
}

/* Recursive doubling vs halving-doubling all_reduce of n bytes. */
static double rd_small(const model *m, double n, int p)
{
    int pp = floor_pow2(p), lg = ceil_log2(pp), fold = pp != p;
    return lg * (m->a + n * m->b + n * m->g) + fold * (2 * m->a + 2 * n * m->b + n * m->g);
}

static double rd_large(const model *m, double n, int p)
{
    int pp = floor_pow2(p), lg = ceil_log2(pp), fold = pp != p;
    double f = (double)(pp - 1) / pp;
    return 2 * lg * m->a + 2 * f * n * m->b + f * n * m->g +
           fold * (2 * m->a + 2 * n * m->b + n * m->g);
}

static const model *p2p_model(const mg__p2p *p) { return p->shm ? &SHM_P2P : &TCP; }

int mg__rd_use_halving(const mg__p2p *p, size_t bytes, size_t count)
{
    const model *m = p2p_model(p);
    if (count < (size_t)floor_pow2(p->size)) return 0;
    return rd_large(m, (double)bytes, p->size) < rd_small(m, (double)bytes, p->size);
}

/* Estimated seconds for family f. n: the vector's bytes (count * es for
 * broadcast, reduce and all_reduce; count * es * p for the others). */
static double cost(mg__algo f, mg_coll c, double n, int p, const model *m)
{
    int lg = ceil_log2(p), pp = floor_pow2(p), lgp = ceil_log2(pp), fold = pp != p;
    double f1 = (double)(p - 1) / p, fp = (double)(pp - 1) / pp;
    double A = m->a, B = m->b, G = m->g;
    double chunk = (double)mg__coll_chunk(), k = n > chunk ? n / chunk : 1, cn = n < chunk ? n : chunk;
    double tree_bcast = lg * (A + n * B), tree_reduce = lg * (A + n * (B + G));
    switch (f) {
    case MG_ALGO_RING:
        switch (c) {
        case MG_COLL_ALL_REDUCE: return 2 * (p - 1) * A + 2 * f1 * n * B + f1 * n * G;
        case MG_COLL_REDUCE_SCATTER: return (p - 1) * A + f1 * n * (B + G);
        case MG_COLL_BROADCAST: return (p - 2 + k) * (A + cn * B);
        case MG_COLL_REDUCE: return (p - 2 + k) * (A + cn * (B + G));
        case MG_COLL_BARRIER: return lg * A;
        default: return (p - 1) * A + f1 * n * B;   /* all_gather, gather, scatter, all_to_all */
        }
    case MG_ALGO_RD:
        switch (c) {
        case MG_COLL_ALL_REDUCE: {
            double s = rd_small(m, n, p), l = rd_large(m, n, p);
            return s < l ? s : l;
        }
        case MG_COLL_REDUCE_SCATTER:
            return lgp * A + fp * n * (B + G) + fold * (2 * A + n * (B + G));
        case MG_COLL_ALL_GATHER: return lgp * A + fp * n * B + fold * (2 * A + (n / p + n) * B);
        case MG_COLL_BROADCAST: {
            double l = 2 * lgp * A + 2 * fp * n * B + fold * (A + n * B);
            return l < tree_bcast ? l : tree_bcast;
        }
        case MG_COLL_REDUCE: {
            double l = 2 * lgp * A + 2 * fp * n * B + fp * n * G + fold * (A + n * (B + G));
            return l < tree_reduce ? l : tree_reduce;
        }
        case MG_COLL_GATHER: case MG_COLL_SCATTER: return lg * A + f1 * n * B;
        case MG_COLL_BARRIER: return lg * A;
        default: return (p - 1) * A + f1 * n * B;
        }
    case MG_ALGO_TREE:
        switch (c) {
        case MG_COLL_BROADCAST: return tree_bcast;
        case MG_COLL_REDUCE: return tree_reduce;
        case MG_COLL_ALL_REDUCE: return tree_reduce + tree_bcast;
        case MG_COLL_GATHER: case MG_COLL_SCATTER: return lg * A + f1 * n * B;
        case MG_COLL_ALL_GATHER: return lg * A + f1 * n * B + tree_bcast;
        case MG_COLL_REDUCE_SCATTER: return tree_reduce + lg * A + f1 * n * B;
        case MG_COLL_BARRIER: return 2 * lg * A;
        default: return (p - 1) * A + f1 * n * B;
        }
    case MG_ALGO_CENTRAL: {
        /* The root takes the p - 1 vectors in turn (reducing each), then
         * sends the whole to each; gather and scatter are ring's flat ones. */
        double in = (p - 1) * (A + n * B), out = (p - 1) * (A + n * B);
        switch (c) {
        case MG_COLL_ALL_REDUCE: return in + (p - 1) * n * G + out;
        case MG_COLL_REDUCE: return in + (p - 1) * n * G;
        case MG_COLL_BROADCAST: return out;
        case MG_COLL_ALL_GATHER: return (p - 1) * A + f1 * n * B + out;
        case MG_COLL_REDUCE_SCATTER: return in + (p - 1) * n * G + (p - 1) * A + f1 * n * B;
        case MG_COLL_BARRIER: return 2 * (p - 1) * A;
        default: return (p - 1) * A + f1 * n * B;   /* gather, scatter, all_to_all */
        }
    }
    case MG_ALGO_SHM: {
        /* Two synchronisations (plus about two per staged chunk) and the
         * ring's bytes per rank, copied at memory speed. */
        double syncs = 2 + 2 * (n / (1 << 20));
        switch (c) {
        case MG_COLL_ALL_REDUCE: return syncs * A + 2 * f1 * n * B + f1 * n * G;
        case MG_COLL_REDUCE: return syncs * A + n * B + f1 * n * G;
        case MG_COLL_REDUCE_SCATTER: return syncs * A + f1 * n * (B + G);
        case MG_COLL_BROADCAST: return syncs * A + n * B;
        case MG_COLL_BARRIER: return A;
        default: return syncs * A + f1 * n * B;
        }
    }
    default:
        return 1e30;
    }
}

const mg_link *mg_link_builtin(const char *transport)
{
    if (transport && !strcmp(transport, "tcp")) return &TCP_LINK;
    if (transport && !strcmp(transport, "shm")) return &SHM_LINK;
    return NULL;
}

/* Seconds of c by family f on link l (-1: shm without shared memory). */
static double family_time(mg__algo f, mg_coll c, double bytes, int p, const mg_link *l)
{
    if (p <= 1) return 0;
    model m = {l->latency, 1 / l->bandwidth, 1 / l->reduce};
    if (c == MG_COLL_SEND || c == MG_COLL_RECV) return m.a + bytes * m.b;
    if (f == MG_ALGO_SHM) {
        if (!l->shared_memory) return -1;
        /* One copy instead of the transport's two, a fifth of its
         * synchronisation (SHM_DIRECT against SHM_P2P). */
        m.a *= SHM_DIRECT.a / SHM_P2P.a;
        m.b *= SHM_DIRECT.b / SHM_P2P.b;
    }
    return cost(f, c, bytes, p, &m);
}

double mg_coll_time(mg_coll c, double bytes, int p, const mg_link *l)
{
    double best = 1e300;
    for (int f = MG_ALGO_RING; f < MG_ALGO_CENTRAL; f++) {
        double t = family_time((mg__algo)f, c, bytes, p, l);
        if (t >= 0 && t < best) best = t;
    }
    return best;
}

double mg_coll_time_by(const char *algo, mg_coll c, double bytes, int p, const mg_link *l)
{
    int f = mg__algo_parse(algo);
    if (f < 0) return -1;
    return f == MG_ALGO_AUTO ? mg_coll_time(c, bytes, p, l)
                             : family_time((mg__algo)f, c, bytes, p, l);
}

void mg_link_fit(mg_coll c, int p, double n1, double t1, double n2, double t2, mg_link *l)
{
    if (p <= 1 || !(t1 > 0) || !(t2 > t1) || !(n2 > n1)) return;
    /* The latency sets the small time, the bandwidth the large one: each
     * scaled in turn to its measurement. */
    for (int k = 0; k < 40; k++) {
        l->latency *= t1 / mg_coll_time(c, n1, p, l);
        double bw = l->bandwidth;
        l->bandwidth *= mg_coll_time(c, n2, p, l) / t2;
        if (!(l->bandwidth > 0) || !isfinite(l->bandwidth)) l->bandwidth = bw;
    }
}

mg__algo mg__coll_select(const mg__p2p *p, const mg_call *c)
{
    int P = p->size;
    double n = (double)c->count * (double)mg__dtsize(c->dtype);
    if (c->coll != MG_COLL_BROADCAST && c->coll != MG_COLL_REDUCE &&
        c->coll != MG_COLL_ALL_REDUCE)
        n *= P;
    mg__algo best = MG_ALGO_RING;
    double best_t = 1e300;
    for (int f = MG_ALGO_RING; f < MG_ALGO_CENTRAL; f++) {
        if (f == MG_ALGO_SHM && !p->shm) continue;
        double t = cost((mg__algo)f, c->coll, n, P, f == MG_ALGO_SHM ? &SHM_DIRECT : p2p_model(p));
        if (t < best_t) {
            best_t = t;
            best = (mg__algo)f;
        }
    }
    return best;
}
