/* Direct shared-memory reductions for ranks on one host (all_reduce,
 * reduce, reduce_scatter, and the barrier), plus the slot protocol of
 * shm_proto.h they share with shm_copy.c.
 *
 * all_reduce / reduce:
 *   small   every rank copies its input into its slot region, stamps and
 *           posts once, and reduces all regions itself (in rank order, so
 *           every rank gets bit-identical results): one synchronisation.
 *   direct  (every buffer from mg_group_alloc) rank r reduces part r of
 *           the vector reading every peer's input where it lies and writes
 *           the result into every peer's output (the root's, for reduce):
 *           zero copies, two synchronisations. In place works because
 *           part r of every buffer is touched by rank r alone.
 *   staged  (ordinary buffers) chunks of the input pass through the
 *           staging buffers: copy-in of chunk k+1 overlaps the waits of
 *           chunk k; rank r reduces part r of each chunk straight from its
 *           own input and the peers' staging copies into its output and
 *           its staging buffer, from which the peers copy it.
 * reduce_scatter: the same three forms, rank r reducing block r.
 * f16/bf16 accumulate all p inputs in f32 and round once. Vectors of 16
 * MiB and more are written to their outputs with non-temporal stores.
 * Limits: the staged reduce_scatter needs p <= stage/64 (256 ranks with
 * the smallest slot); beyond that it falls back to the ring. */
#include "comm/coll/shm_proto.h"

/* Reductions whose every rank would read more than this many bytes of
 * regions take the staged path even when the input fits a region. */
#define SMALL_READ ((size_t)1 << 20)
/* Out-of-place outputs of vectors at least this large are written with
 * non-temporal stores: their lines are not in any cache, and streaming
 * saves the read-for-ownership of each. In place, the output lines were
 * just read (cached), and streaming them only evicts data the next use
 * would find in cache (measured slower at 16-32 MiB). */
#define NT_BYTES ((size_t)16 << 20)

mg_status mg__shm_op_begin(mg__shm_op *x, mg__op *o)
{
    mg__shm_view *s = o->p->shm;
    MG_ASSERT(s && s->slot_bytes >= MG__SHM_SLOT_MIN);
    int P = o->size;
    size_t ptrs = ((size_t)3 * (size_t)P * sizeof(void *) + 63) & ~(size_t)63;
    char *scr = mg__op_scratch(o, ptrs);
    if (!scr) return MG_ENOMEM;
    x->o = o;
    x->s = s;
    x->me = o->rank;
    x->P = P;
    x->seq = s->coll_seq++;
    x->stream = 0;
    x->tc = -1;
    x->base = (x->seq + 1) << 32;
    size_t sm = s->slot_bytes / 16;
    sm = sm < 4096 ? 4096 : sm > 65536 ? 65536 : sm & ~(size_t)63;
    x->sm = sm;
    x->reg = sm + 128;
    /* Small forms carry count < 2^17 and root < 2^20: the packing is exact. */
    x->shape = (uint64_t)o->count << 32 | (uint64_t)(o->root & 0xfffff) << 12 |
               (uint64_t)o->op << 8 | (uint64_t)o->dt << 4 | (uint64_t)o->coll;
    size_t st = ((s->slot_bytes - 2 * x->reg) / 3) & ~(size_t)4095, cap = mg__shm_chunk_cap();
    x->stage = cap && cap < st ? cap & ~(size_t)63 : st;
    x->slot = (char **)(void *)scr;
    x->src = (const void **)(x->slot + P);
    x->dst = (void **)(x->src + P);
    for (int q = 0; q < P; q++) x->slot[q] = s->slot(s, q);
    return MG_OK;
}

mg_status mg__shm_op_wait_all(mg__shm_op *x, uint32_t v)
{
    for (int d = 1; d < x->P; d++) MG_TRY(mg__shm_op_wait(x, (x->me + d) % x->P, v));
    return MG_OK;
}

mg_status mg__shm_op_arrive(mg__shm_op *x, uint64_t g0, uint64_t g1)
{
    mg__shm_hdr *h = mg__shm_op_hdr(x, x->me);
    h->ga[0] = g0;
    h->ga[1] = g1;
    mg__shm_op_post(x, 1);
    return mg__shm_op_wait_all(x, 1);
}

void mg__shm_op_publish(mg__shm_op *x, const void *src, size_t n)
{
    mg__shm_tiny *t = mg__shm_op_tiny(x, x->me);
    if (n) memcpy(mg__shm_op_small(x, x->me, n), src, n);
    t->shape = x->shape;
    atomic_store_explicit(&t->stamp, x->base + 1, memory_order_release);
    mg__shm_op_post(x, 1);
}

/* Busy-wait rounds (~25 ns each) on a peer's stamp before the group's
 * wait takes over with its own spin-then-sleep policy. None when ranks
 * outnumber CPUs: the peer we wait for needs this core. */
static int stamp_spins(int P)
{
    static _Atomic int cpus;
    int c = atomic_load_explicit(&cpus, memory_order_relaxed);
    if (!c) {
        c = mg_local_cpus();
        atomic_store_explicit(&cpus, c, memory_order_relaxed);
    }
    return P <= c ? 32 : 0;
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

mg_status mg__shm_op_wait_published(mg__shm_op *x)
{
    uint64_t want = x->base + 1;
    int spins = stamp_spins(x->P);
    for (int d = 1; d < x->P; d++) {
        int q = (x->me + d) % x->P;
        mg__shm_tiny *t = mg__shm_op_tiny(x, q);
        int seen = 0;
        for (int i = 0; i < spins && !seen; i++) {
            if (atomic_load_explicit(&t->stamp, memory_order_acquire) == want)
                seen = 1;
            else
                relax();
        }
        if (seen && t->shape == x->shape) continue;
        /* Not there yet, or a different call: the group's wait sleeps,
         * notices dead peers and names mismatched calls. */
        MG_TRY(mg__shm_op_wait(x, q, 1));
        if (atomic_load_explicit(&t->stamp, memory_order_acquire) == want &&
            t->shape == x->shape)
            continue;
        const mg__names *nm = x->o->p->names;
        char a[128], b[128];
        return mg_error(MG_EMISMATCH, "shared-memory collective: %s runs a different operation "
                        "than %s at the same point (collective, dtype, op, root or count "
                        "differ); every rank must issue the same collectives in the same order",
                        mg__rank_name(nm, q, NULL, a, sizeof a),
                        mg__rank_name(nm, x->me, NULL, b, sizeof b));
    }
    return MG_OK;
}

void mg__shm_op_part(size_t m, int P, int q, size_t es, size_t *lo, size_t *len)
{
    size_t al = es >= 64 ? 1 : 64 / es, units = (m + al - 1) / al;
    size_t a = units * (size_t)q / (size_t)P * al, b = units * (size_t)(q + 1) / (size_t)P * al;
    if (a > m) a = m;
    if (b > m) b = m;
    *lo = a;
    *len = b - a;
}

/* Staging stores: cached or non-temporal. Which is faster depends on
 * where the machine puts the ranks' CPUs, and a virtual machine's vCPUs
 * move. When they share a cache, a peer reads our freshly written lines
 * from it at ~35 GB/s and streaming would only send them through memory
 * (2x slower at 1 MiB); when they do not, rewriting a line the peer has
 * read waits for the peer's copy to be invalidated across the chip (~2.5
 * GB/s, measured on the development VM) and streaming is 4-5x faster.
 * So each rank times its staged operations per collective and size class
 * (a running mean; the first run of each kind, cold, does not count) and
 * uses the cheaper kind, trying the other one now and then: the first four
 * operations of a class alternate, then every 16th tries the one not in
 * use. Exploration follows the class's run count, equal on every rank, so
 * ranks try the same kind together; the choice is each rank's own (it
 * changes no protocol, only how a rank writes its own staging buffers). */
static int tune_class(size_t n)
{
    int c = 0;
    for (size_t b = (size_t)256 << 10; b <= n && c < 7; b *= 4) c++;
    return c;
}

void mg__shm_op_stage_begin(mg__shm_op *x, size_t bytes)
{
    const struct mg__shm_tune *t = &x->s->tune;
    int co = x->o->coll, c = x->tc = tune_class(bytes);
    uint64_t r = t->runs[co][c];
    int best = t->cost[co][c][1] < t->cost[co][c][0];
    x->stream = r < 4 ? (int)(r & 1) : r % 16 == 0 ? !best : best;
    x->t0 = mg_now();
}

void mg__shm_op_stage_end(mg__shm_op *x)
{
    struct mg__shm_tune *t = &x->s->tune;
    int co = x->o->coll, c = x->tc;
    double dt = mg_now() - x->t0, *k = &t->cost[co][c][x->stream];
    if (t->runs[co][c]++ >= 2) *k = *k > 0 ? 0.5 * *k + 0.5 * dt : dt;
}

/* Stage chunk k of our input, all but our own part (which we read in
 * place). */
static void stage_in(mg__shm_op *x, size_t k, size_t C)
{
    mg__op *o = x->o;
    size_t es = o->es, c0 = k * C, m = o->count - c0 < C ? o->count - c0 : C, lo, len;
    mg__shm_op_part(m, x->P, x->me, es, &lo, &len);
    char *st = mg__shm_op_stage(x, x->me, k);
    const char *in = o->sbuf + c0 * es;
    mg__shm_op_stage_copy(x, st, in, lo * es);
    mg__shm_op_stage_copy(x, st + (lo + len) * es, in + (lo + len) * es, (m - lo - len) * es);
}

/* Traffic of m elements of all_reduce (root < 0) or reduce cut into parts,
 * direct or staged alike: this rank reads part `me` of every peer's input
 * and writes its result into every other output (the root's, for reduce);
 * each peer q reads part q of this rank's input and, where this rank has
 * an output, writes part q of it. */
static void count_parts(mg__shm_op *x, size_t m, int root)
{
    size_t es = x->o->es, lo, len;
    int P = x->P, me = x->me, all = root < 0, mine = all || me == root;
    mg__shm_op_part(m, P, me, es, &lo, &len);
    uint64_t L = (uint64_t)len * es, M = (uint64_t)m * es;
    uint64_t outs = all ? (uint64_t)(P - 1) : me == root ? 0 : 1;
    mg__shm_op_traffic(x, L * outs + (M - L), (uint64_t)(P - 1) * L + (mine ? M - L : 0));
}

/* Counter values of chunk k: inputs staged (A), our part reduced (B). */
static uint32_t cA(size_t k) { return (uint32_t)(2 + 2 * k); }
static uint32_t cB(size_t k) { return (uint32_t)(3 + 2 * k); }

static mg_status staged_reduce(mg__shm_op *x, int root)
{
    mg__op *o = x->o;
    size_t es = o->es, C = x->stage / es, nch = (o->count + C - 1) / C;
    int P = x->P, me = x->me, all = root < 0, mine = all || me == root;
    /* A vector larger than the caches goes to recvbuf with non-temporal
     * stores (no read-for-ownership). */
    int nt = o->count * es >= NT_BYTES && o->sbuf != o->rbuf;
    mg__shm_op_stage_begin(x, o->count * es);
    int stream = x->stream;
    stage_in(x, 0, C);
    mg__shm_op_post(x, cA(0));
    for (size_t k = 0; k < nch; k++) {
        size_t c0 = k * C, m = o->count - c0 < C ? o->count - c0 : C, lo, len;
        MG_TRY(mg__shm_op_wait_all(x, cA(k)));
        mg__shm_op_part(m, P, me, es, &lo, &len);
        if (len) {
            for (int q = 0; q < P; q++)
                x->src[q] = q == me ? o->sbuf + (c0 + lo) * es
                                    : mg__shm_op_stage(x, q, k) + lo * es;
            /* Destinations written with cached stores first: the kernel
             * streams a suffix of them (the staging copy when streaming,
             * recvbuf when it is large). */
            int nd = 0, stage = all || me != root, cached;
            if (stream) {
                if (mine) x->dst[nd++] = o->rbuf + (c0 + lo) * es;
                cached = mine && !nt;
                if (stage) x->dst[nd++] = mg__shm_op_stage(x, me, k) + lo * es;
            } else {
                if (stage) x->dst[nd++] = mg__shm_op_stage(x, me, k) + lo * es;
                if (mine) x->dst[nd++] = o->rbuf + (c0 + lo) * es;
                cached = nt && mine ? nd - 1 : nd;
            }
            mg__reduce_multi(x->dst, nd, x->src, P, len, o->dt, o->op, P, cached);
        }
        mg__shm_op_post(x, cB(k));
        if (k + 1 < nch) {
            stage_in(x, k + 1, C);
            mg__shm_op_post(x, cA(k + 1));
        }
        /* Everyone waits here, so that staging buffer (k + 1) % 3 is free
         * when it is refilled in the next round. */
        MG_TRY(mg__shm_op_wait_all(x, cB(k)));
        count_parts(x, m, root);   /* this chunk, cut into its own parts */
        if (!mine) continue;
        for (int q = 0; q < P; q++) {
            if (q == me) continue;
            mg__shm_op_part(m, P, q, es, &lo, &len);
            if (nt)
                mg__copy_nt(o->rbuf + (c0 + lo) * es, mg__shm_op_stage(x, q, k) + lo * es,
                            len * es);
            else
                memcpy(o->rbuf + (c0 + lo) * es, mg__shm_op_stage(x, q, k) + lo * es, len * es);
        }
    }
    mg__shm_op_stage_end(x);
    return MG_OK;
}

/* all_reduce (root < 0) and reduce. */
static mg_status reduce_common(mg__op *o, int root)
{
    mg__shm_op x;
    MG_TRY(mg__shm_op_begin(&x, o));
    size_t n = o->count * o->es, es = o->es;
    int P = x.P, me = x.me, all = root < 0, mine = all || me == root;
    if (n <= x.sm && n * (size_t)P <= SMALL_READ) {
        mg__shm_op_publish(&x, o->sbuf, n);
        MG_TRY(mg__shm_op_wait_published(&x));
        if (mine) {
            for (int q = 0; q < P; q++) x.src[q] = mg__shm_op_small(&x, q, n);
            void *d = o->rbuf;
            mg__reduce_multi(&d, 1, x.src, P, o->count, o->dt, o->op, P, 1);
        }
        /* Every output rank reads every peer's whole input: (p-1)n each way
         * for all_reduce, more than the parts' 2n(p-1)/p, for one wait. */
        uint64_t readers = all ? (uint64_t)(P - 1) : me == root ? 0 : 1;
        mg__shm_op_traffic(&x, readers * n, mine ? (uint64_t)(P - 1) * n : 0);
        return MG_OK;
    }
    MG_TRY(mg__shm_op_arrive(&x, mg__shm_op_gaddr(&x, o->sbuf, n),
                             mine ? mg__shm_op_gaddr(&x, o->rbuf, n) : 0));
    int direct = 1;
    for (int q = 0; q < P; q++) {
        const mg__shm_hdr *h = mg__shm_op_hdr(&x, q);
        if (!h->ga[0] || ((all || q == root) && !h->ga[1])) direct = 0;
    }
    if (!direct) return staged_reduce(&x, root);
    size_t lo, len;
    mg__shm_op_part(o->count, P, me, es, &lo, &len);
    /* Destinations in place first, out of place (streamed when large) last. */
    int nd = 0, nip = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int q = 0; q < P; q++) {
            const mg__shm_hdr *h = mg__shm_op_hdr(&x, q);
            if (!(all || q == root) || (h->ga[0] == h->ga[1]) != (pass == 0)) continue;
            x.dst[nd++] = mg__shm_op_gptr(&x, q, h->ga[1]) + lo * es;
            nip += pass == 0;
        }
    for (int q = 0; q < P; q++)
        x.src[q] = mg__shm_op_gptr(&x, q, mg__shm_op_hdr(&x, q)->ga[0]) + lo * es;
    if (len) mg__reduce_multi(x.dst, nd, x.src, P, len, o->dt, o->op, P, n >= NT_BYTES ? nip : nd);
    count_parts(&x, o->count, root);
    mg__shm_op_post(&x, 2);
    return mg__shm_op_wait_all(&x, 2);
}

mg_status mg__shm_all_reduce(mg__op *o) { return reduce_common(o, -1); }
mg_status mg__shm_reduce(mg__op *o) { return reduce_common(o, o->root); }

mg_status mg__shm_reduce_scatter(mg__op *o)
{
    int P = o->size, me = o->rank;
    size_t es = o->es, blk = o->count * es, all = blk * (size_t)P;
    /* Staging holds one piece of every block; pieces are whole lines. */
    size_t al = es >= 64 ? 1 : 64 / es;
    mg__shm_op x;
    MG_TRY(mg__shm_op_begin(&x, o));
    size_t C = x.stage / (size_t)P / es / al * al;
    if (all <= x.sm && all <= SMALL_READ) {
        mg__shm_op_publish(&x, o->sbuf, all);
        MG_TRY(mg__shm_op_wait_published(&x));
        for (int q = 0; q < P; q++) x.src[q] = mg__shm_op_small(&x, q, all) + (size_t)me * blk;
        void *d = o->rbuf;
        mg__reduce_multi(&d, 1, x.src, P, o->count, o->dt, o->op, P, 1);
        /* Block me of every peer's input in; block q of ours read by q. */
        mg__shm_op_traffic(&x, (uint64_t)(P - 1) * blk, (uint64_t)(P - 1) * blk);
        return MG_OK;
    }
    MG_TRY(mg__shm_op_arrive(&x, mg__shm_op_gaddr(&x, o->sbuf, all), 0));
    int direct = 1;
    for (int q = 0; q < P; q++) direct &= mg__shm_op_hdr(&x, q)->ga[0] != 0;
    if (direct) {
        for (int q = 0; q < P; q++)
            x.src[q] = mg__shm_op_gptr(&x, q, mg__shm_op_hdr(&x, q)->ga[0]) + (size_t)me * blk;
        void *d = o->rbuf;
        mg__reduce_multi(&d, 1, x.src, P, o->count, o->dt, o->op, P, 1);
        mg__shm_op_traffic(&x, (uint64_t)(P - 1) * blk, (uint64_t)(P - 1) * blk);
        mg__shm_op_post(&x, 2);
        return mg__shm_op_wait_all(&x, 2);
    }
    if (!C) {
        /* Too many ranks for the staging buffers: every rank sees the
         * same sizes, so every rank takes this branch. */
        return mg__ring_reduce_scatter(o);
    }
    size_t nch = (o->count + C - 1) / C;
    mg__shm_op_stage_begin(&x, all);
    for (size_t k = 0; k < nch; k++) {
        size_t c0 = k * C, m = o->count - c0 < C ? o->count - c0 : C;
        /* Buffer k % 3 was last read in chunk k - 3, before B(k-3). */
        if (k >= 3) MG_TRY(mg__shm_op_wait_all(&x, cB(k - 3)));
        char *st = mg__shm_op_stage(&x, me, k);
        for (int q = 0; q < P; q++)
            if (q != me)
                mg__shm_op_stage_copy(&x, st + (size_t)q * C * es,
                                      o->sbuf + (size_t)q * blk + c0 * es, m * es);
        mg__shm_op_post(&x, cA(k));
        MG_TRY(mg__shm_op_wait_all(&x, cA(k)));
        for (int q = 0; q < P; q++)
            x.src[q] = q == me ? o->sbuf + (size_t)me * blk + c0 * es
                               : mg__shm_op_stage(&x, q, k) + (size_t)me * C * es;
        void *d = o->rbuf + c0 * es;
        mg__reduce_multi(&d, 1, x.src, P, m, o->dt, o->op, P, 1);
        mg__shm_op_traffic(&x, (uint64_t)(P - 1) * m * es, (uint64_t)(P - 1) * m * es);
        mg__shm_op_post(&x, cB(k));
    }
    mg__shm_op_stage_end(&x);
    return MG_OK;
}

mg_status mg__shm_barrier(mg__op *o)
{
    mg__shm_op x;
    MG_TRY(mg__shm_op_begin(&x, o));
    mg__shm_op_publish(&x, NULL, 0);
    return mg__shm_op_wait_published(&x);
}
