/* Recursive doubling and halving-doubling (Rabenseifner, Thakur et al.),
 * latency-optimal in rounds and, for large messages, bandwidth-optimal:
 *   all_reduce      small: recursive doubling (log2 p exchanges of the
 *                   whole vector); large: recursive-halving reduce-scatter
 *                   then recursive-doubling all-gather
 *   reduce_scatter  recursive halving
 *   all_gather      recursive doubling
 *   broadcast       small: binomial tree; large: binomial scatter then
 *                   recursive-doubling all-gather (van de Geijn)
 *   reduce          small: binomial tree; large: recursive halving then
 *                   binomial gather to the root
 * World sizes that are not a power of two are folded first (MPICH's
 * scheme): among the first 2*rem relative ranks (rem = p - 2^floor(log2
 * p)), each odd rank hands its data to the even rank below and sits out;
 * the even rank returns the result at the end. Partners always combine
 * (lower ranks' data) op (higher ranks' data), so every rank computes
 * bit-identical results. gather/scatter use the binomial trees and
 * all_to_all the pairwise exchange (XOR partners when p is a power of two);
 * see coll.c. */
#include "comm/coll/algos.h"

/* The rank paired with this one by the fold (relative ranks 2i, 2i+1). */
static int fold_partner(const mg__space *s, int rank)
{
    int rel = (rank - s->rot + s->p) % s->p;
    return ((rel ^ 1) + s->rot) % s->p;
}

/* Byte offset of member i when count elements are cut evenly among n. */
static size_t even_off(size_t count, int n, int i, size_t es)
{
    size_t q = count / (size_t)n, r = count % (size_t)n;
    return ((size_t)i * q + ((size_t)i < r ? (size_t)i : r)) * es;
}

/* Recursive halving among the members: afterwards member me holds the
 * reduction of its part in acc (at moff offsets). src is this member's
 * whole input for the first round (it may be acc); tmp has room for the
 * largest part received (the first half). */
static mg_status rs_core(mg__op *o, const mg__space *s, const size_t *moff, const char *src,
                         char *acc, char *tmp)
{
    int me = s->me, lo = 0, hi = s->n;
    mg_op aop = mg__accop(o->op);
    for (int m = s->n / 2; m >= 1; m >>= 1) {
        int v = me ^ m, q = mg__sp_real(s, v);
        int klo = me & m ? lo + m : lo, khi = me & m ? hi : lo + m;
        int glo = me & m ? lo : lo + m, ghi = me & m ? lo + m : hi;
        size_t kb = moff[khi] - moff[klo];
        MG_TRY(mg__sendrecv(o->p, q, src + moff[glo], moff[ghi] - moff[glo], q, tmp, kb));
        if (kb) {
            if (me < v)
                mg__reduce3(acc + moff[klo], src + moff[klo], tmp, kb / o->es, o->dt, aop);
            else
                mg__reduce3(acc + moff[klo], tmp, src + moff[klo], kb / o->es, o->dt, aop);
        }
        src = acc;
        lo = klo;
        hi = khi;
    }
    return MG_OK;
}

/* Recursive doubling all-gather among the members, in place in buf. */
static mg_status ag_core(mg__op *o, const mg__space *s, const size_t *moff, char *buf)
{
    int me = s->me;
    for (int m = 1; m < s->n; m <<= 1) {
        int v = me ^ m, q = mg__sp_real(s, v);
        int lo = me & ~(m - 1), plo = v & ~(m - 1);
        MG_TRY(mg__sendrecv(o->p, q, buf + moff[lo], moff[lo + m] - moff[lo],
                            q, buf + moff[plo], moff[plo + m] - moff[plo]));
    }
    return MG_OK;
}

mg_status mg__rd_all_reduce(mg__op *o)
{
    mg__p2p *p = o->p;
    size_t n = o->count * o->es, es = o->es;
    mg__space s = mg__space_fold(o->size, o->rank, 0);
    if (s.me < 0) {
        int q = fold_partner(&s, o->rank);
        MG_TRY(mg__send(p, q, o->sbuf, n));
        return mg__recv(p, q, o->rbuf, n);
    }
    int lead = s.me < s.rem, halving = mg__rd_use_halving(p, n, o->count);
    int partner = lead ? fold_partner(&s, o->rank) : -1;
    size_t tmpb = lead || !halving ? n : even_off(o->count, s.n, s.n / 2, es);
    char *tmp;
    size_t *moff = mg__moff_scratch(o, halving ? s.n : 0, tmpb, &tmp);
    if (!moff) return MG_ENOMEM;
    mg_op aop = mg__accop(o->op);
    const char *src = o->sbuf;
    if (lead) {
        MG_TRY(mg__recv(p, partner, tmp, n));
        mg__reduce3(o->rbuf, o->sbuf, tmp, o->count, o->dt, aop);
        src = o->rbuf;
    }
    if (!halving) {
        for (int m = 1; m < s.n; m <<= 1) {
            int v = s.me ^ m, q = mg__sp_real(&s, v);
            MG_TRY(mg__sendrecv(p, q, src, n, q, tmp, n));
            if (s.me < v)
                mg__reduce3(o->rbuf, src, tmp, o->count, o->dt, aop);
            else
                mg__reduce3(o->rbuf, tmp, src, o->count, o->dt, aop);
            src = o->rbuf;
        }
        mg__reduce_finish(o->rbuf, o->count, o->dt, o->op, o->size);
    } else {
        mg__moff_even(moff, s.n, o->count, es);
        MG_TRY(rs_core(o, &s, moff, src, o->rbuf, tmp));
        mg__reduce_finish(o->rbuf + moff[s.me], (moff[s.me + 1] - moff[s.me]) / es, o->dt,
                          o->op, o->size);
        MG_TRY(ag_core(o, &s, moff, o->rbuf));
    }
    return lead ? mg__send(p, partner, o->rbuf, n) : MG_OK;
}

mg_status mg__rd_reduce_scatter(mg__op *o)
{
    mg__p2p *p = o->p;
    int r = o->rank;
    size_t blk = o->count * o->es, all = blk * (size_t)o->size;
    mg__space s = mg__space_fold(o->size, r, 0);
    if (s.me < 0) {
        int q = fold_partner(&s, r);
        MG_TRY(mg__send(p, q, o->sbuf, all));
        return mg__recv(p, q, o->rbuf, blk);
    }
    int lead = s.me < s.rem;
    char *acc;
    size_t *moff = mg__moff_scratch(o, s.n, 2 * all, &acc);
    if (!moff) return MG_ENOMEM;
    char *tmp = acc + all;
    mg__moff_blocks(moff, &s, blk);
    const char *src = o->sbuf;
    if (lead) {
        MG_TRY(mg__recv(p, r + 1, tmp, all));
        mg__reduce3(acc, o->sbuf, tmp, o->count * (size_t)o->size, o->dt, mg__accop(o->op));
        src = acc;
    }
    MG_TRY(rs_core(o, &s, moff, src, acc, tmp));
    size_t part = moff[s.me + 1] - moff[s.me];
    mg__reduce_finish(acc + moff[s.me], part / o->es, o->dt, o->op, o->size);
    memcpy(o->rbuf, acc + (size_t)r * blk, blk);
    return lead ? mg__send(p, r + 1, acc + (size_t)(r + 1) * blk, blk) : MG_OK;
}

mg_status mg__rd_all_gather(mg__op *o)
{
    mg__p2p *p = o->p;
    int r = o->rank;
    size_t blk = o->count * o->es, all = blk * (size_t)o->size;
    mg__space s = mg__space_fold(o->size, r, 0);
    mg__copy(o->rbuf + (size_t)r * blk, o->sbuf, blk);
    if (s.me < 0) {
        int q = fold_partner(&s, r);
        MG_TRY(mg__send(p, q, o->rbuf + (size_t)r * blk, blk));
        return mg__recv(p, q, o->rbuf, all);
    }
    int lead = s.me < s.rem;
    char *unused;
    size_t *moff = mg__moff_scratch(o, s.n, 0, &unused);
    if (!moff) return MG_ENOMEM;
    mg__moff_blocks(moff, &s, blk);
    if (lead) MG_TRY(mg__recv(p, r + 1, o->rbuf + (size_t)(r + 1) * blk, blk));
    MG_TRY(ag_core(o, &s, moff, o->rbuf));
    return lead ? mg__send(p, r + 1, o->rbuf, all) : MG_OK;
}

mg_status mg__rd_broadcast(mg__op *o)
{
    mg__p2p *p = o->p;
    size_t n = o->count * o->es;
    if (!mg__rd_use_halving(p, n, o->count)) return mg__tree_broadcast(o);
    mg__space s = mg__space_fold(o->size, o->rank, o->root);
    if (s.me < 0) return mg__recv(p, fold_partner(&s, o->rank), o->rbuf, n);
    char *unused;
    size_t *moff = mg__moff_scratch(o, s.n, 0, &unused);
    if (!moff) return MG_ENOMEM;
    mg__moff_even(moff, s.n, o->count, o->es);
    MG_TRY(mg__binomial_scatter_sp(p, &s, moff, o->rbuf, 0));
    MG_TRY(ag_core(o, &s, moff, o->rbuf));
    return s.me < s.rem ? mg__send(p, fold_partner(&s, o->rank), o->rbuf, n) : MG_OK;
}

mg_status mg__rd_reduce(mg__op *o)
{
    mg__p2p *p = o->p;
    size_t n = o->count * o->es, es = o->es;
    if (!mg__rd_use_halving(p, n, o->count)) return mg__tree_reduce(o);
    mg__space s = mg__space_fold(o->size, o->rank, o->root);
    if (s.me < 0) return mg__send(p, fold_partner(&s, o->rank), o->sbuf, n);
    int lead = s.me < s.rem, root = s.me == 0;
    size_t tmpb = lead ? n : even_off(o->count, s.n, s.n / 2, es);
    char *data;
    size_t *moff = mg__moff_scratch(o, s.n, tmpb + (root ? 0 : n), &data);
    if (!moff) return MG_ENOMEM;
    char *tmp = data, *acc = root ? o->rbuf : data + tmpb;
    mg__moff_even(moff, s.n, o->count, es);
    const char *src = o->sbuf;
    if (lead) {
        MG_TRY(mg__recv(p, fold_partner(&s, o->rank), tmp, n));
        mg__reduce3(acc, o->sbuf, tmp, o->count, o->dt, mg__accop(o->op));
        src = acc;
    }
    MG_TRY(rs_core(o, &s, moff, src, acc, tmp));
    mg__reduce_finish(acc + moff[s.me], (moff[s.me + 1] - moff[s.me]) / es, o->dt, o->op,
                      o->size);
    return mg__binomial_gather_sp(p, &s, moff, acc, 0);
}
