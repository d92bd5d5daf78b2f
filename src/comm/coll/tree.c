/* Binomial-tree algorithms (latency-optimal: ceil(log2 p) rounds):
 *   broadcast       root sends the whole buffer down the tree
 *   reduce          partial results flow up the tree to the root
 *   all_reduce      reduce to rank 0, then broadcast
 *   gather/scatter  subtrees' blocks travel up/down (MPICH's binomial
 *                   gather and scatter; a root other than 0 rotates through
 *                   a temporary so blocks stay contiguous)
 *   all_gather      gather to rank 0, then broadcast
 *   reduce_scatter  reduce to rank 0, then scatter
 *   barrier         one-byte tokens up the tree, then down
 * The *_sp cores work on any rank space (src/comm/coll/algos.h), so the
 * recursive-doubling family reuses them on its folded spaces.
 * Limits: whole messages per edge (no chunking): for large buffers the
 * ring and halving-doubling algorithms are the bandwidth-optimal ones. */
#include "comm/coll/algos.h"

static int lowbit(int i) { return i & -i; }

/* Largest power of two below n for member 0, else half of i's low bit:
 * the first (largest) child distance. */
static int top_mask(int i, int n)
{
    if (i) return lowbit(i) >> 1;
    int m = 1;
    while (m * 2 < n) m *= 2;
    return n > 1 ? m : 0;
}

int mg__binomial_subtree_end(int i, int n)
{
    if (!i) return n;
    long e = (long)i + lowbit(i);
    return e < n ? (int)e : n;
}

mg_status mg__binomial_bcast_sp(mg__p2p *p, const mg__space *s, char *buf, size_t n)
{
    int i = s->me;
    if (i > 0) MG_TRY(mg__recv(p, mg__sp_real(s, i - lowbit(i)), buf, n));
    for (int m = top_mask(i, s->n); m >= 1; m >>= 1)
        if (i + m < s->n) MG_TRY(mg__send(p, mg__sp_real(s, i + m), buf, n));
    return MG_OK;
}

mg_status mg__binomial_gather_sp(mg__p2p *p, const mg__space *s, const size_t *moff,
                                 char *buf, size_t base)
{
    int i = s->me, n = s->n;
    for (int m = 1; m < n; m <<= 1) {
        if (i & m) {
            int end = mg__binomial_subtree_end(i, n);
            return mg__send(p, mg__sp_real(s, i - m), buf + moff[i] - base, moff[end] - moff[i]);
        }
        if (i + m < n) {
            int end = mg__binomial_subtree_end(i + m, n);
            MG_TRY(mg__recv(p, mg__sp_real(s, i + m), buf + moff[i + m] - base,
                            moff[end] - moff[i + m]));
        }
    }
    return MG_OK;
}

mg_status mg__binomial_scatter_sp(mg__p2p *p, const mg__space *s, const size_t *moff,
                                  char *buf, size_t base)
{
    int i = s->me, n = s->n;
    if (i > 0) {
        int end = mg__binomial_subtree_end(i, n);
        MG_TRY(mg__recv(p, mg__sp_real(s, i - lowbit(i)), buf + moff[i] - base,
                        moff[end] - moff[i]));
    }
    for (int m = top_mask(i, n); m >= 1; m >>= 1) {
        if (i + m >= n) continue;
        int end = mg__binomial_subtree_end(i + m, n);
        MG_TRY(mg__send(p, mg__sp_real(s, i + m), buf + moff[i + m] - base,
                        moff[end] - moff[i + m]));
    }
    return MG_OK;
}

/* Reduce n bytes to member 0 of s. `in` is this rank's contribution; acc
 * (n bytes; may equal in) takes partial results once a child has sent;
 * tmp receives. *res: where this member's result lies (the root's is acc:
 * the root always has a child). */
static mg_status binomial_reduce(mg__op *o, const mg__space *s, const char *in, char *acc,
                                 char *tmp, size_t n, const char **res)
{
    int i = s->me;
    const char *cur = in;
    mg_op aop = mg__accop(o->op);
    for (int m = 1; m < s->n; m <<= 1) {
        if (i & m) {
            *res = cur;
            return mg__send(o->p, mg__sp_real(s, i - m), cur, n);
        }
        if (i + m < s->n) {
            MG_TRY(mg__recv(o->p, mg__sp_real(s, i + m), tmp, n));
            /* Our subtree's members precede the child's: keep that order. */
            mg__reduce3(acc, cur, tmp, n / o->es, o->dt, aop);
            cur = acc;
        }
    }
    *res = cur;
    return MG_OK;
}

static int has_children(const mg__space *s) { return mg__binomial_subtree_end(s->me, s->n) > s->me + 1; }

mg_status mg__tree_broadcast(mg__op *o)
{
    mg__space s = mg__space_plain(o->size, o->rank, o->root);
    return mg__binomial_bcast_sp(o->p, &s, o->rbuf, o->count * o->es);
}

mg_status mg__tree_reduce(mg__op *o)
{
    mg__space s = mg__space_plain(o->size, o->rank, o->root);
    size_t n = o->count * o->es;
    int root = s.me == 0, inner = has_children(&s);
    char *scr = NULL;
    if (inner && !(scr = mg__op_scratch(o, root ? n : 2 * n))) return MG_ENOMEM;
    const char *res;
    char *acc = root ? o->rbuf : scr ? scr + n : NULL;
    MG_TRY(binomial_reduce(o, &s, o->sbuf, acc, scr, n, &res));
    if (root) mg__reduce_finish(o->rbuf, o->count, o->dt, o->op, o->size);
    return MG_OK;
}

mg_status mg__tree_all_reduce(mg__op *o)
{
    mg__space s = mg__space_plain(o->size, o->rank, 0);
    size_t n = o->count * o->es;
    char *tmp = NULL;
    if (has_children(&s) && !(tmp = mg__op_scratch(o, n))) return MG_ENOMEM;
    const char *res;
    MG_TRY(binomial_reduce(o, &s, o->sbuf, o->rbuf, tmp, n, &res));
    if (s.me == 0) mg__reduce_finish(o->rbuf, o->count, o->dt, o->op, o->size);
    return mg__binomial_bcast_sp(o->p, &s, o->rbuf, n);
}

mg_status mg__tree_gather(mg__op *o)
{
    int P = o->size;
    mg__space s = mg__space_plain(P, o->rank, o->root);
    size_t blk = o->count * o->es;
    int i = s.me, end = mg__binomial_subtree_end(i, P);
    if (i && end == i + 1)   /* a leaf sends its block straight from sbuf */
        return mg__send(o->p, mg__sp_real(&s, i - lowbit(i)), o->sbuf, blk);
    int direct = i == 0 && o->root == 0;   /* gather straight into rbuf */
    char *data;
    size_t *moff = mg__moff_scratch(o, P, direct ? 0 : (size_t)(end - i) * blk, &data);
    if (!moff) return MG_ENOMEM;
    for (int k = 0; k <= P; k++) moff[k] = (size_t)k * blk;
    char *buf = direct ? o->rbuf : data;
    size_t base = moff[i];
    mg__copy(buf + moff[i] - base, o->sbuf, blk);
    MG_TRY(mg__binomial_gather_sp(o->p, &s, moff, buf, base));
    if (i == 0 && !direct) {
        /* Relative block b is rank (b + root) % P's. */
        size_t head = (size_t)(P - o->root) * blk;
        memcpy(o->rbuf + (size_t)o->root * blk, data, head);
        memcpy(o->rbuf, data + head, (size_t)o->root * blk);
    }
    return MG_OK;
}

mg_status mg__tree_scatter(mg__op *o)
{
    int P = o->size;
    mg__space s = mg__space_plain(P, o->rank, o->root);
    size_t blk = o->count * o->es;
    int i = s.me, end = mg__binomial_subtree_end(i, P);
    if (i && end == i + 1)
        return mg__recv(o->p, mg__sp_real(&s, i - lowbit(i)), o->rbuf, blk);
    int direct = i == 0 && o->root == 0;   /* scatter straight from sbuf */
    char *data;
    size_t *moff = mg__moff_scratch(o, P, direct ? 0 : (size_t)(end - i) * blk, &data);
    if (!moff) return MG_ENOMEM;
    for (int k = 0; k <= P; k++) moff[k] = (size_t)k * blk;
    char *buf = direct ? (char *)(uintptr_t)o->sbuf : data;   /* the root only reads */
    if (i == 0 && !direct) {
        size_t head = (size_t)(P - o->root) * blk;
        memcpy(data, o->sbuf + (size_t)o->root * blk, head);
        memcpy(data + head, o->sbuf, (size_t)o->root * blk);
    }
    MG_TRY(mg__binomial_scatter_sp(o->p, &s, moff, buf, moff[i]));
    mg__copy(o->rbuf, buf, blk);
    return MG_OK;
}

mg_status mg__tree_all_gather(mg__op *o)
{
    int P = o->size;
    mg__space s = mg__space_plain(P, o->rank, 0);
    size_t blk = o->count * o->es;
    char *data;
    size_t *moff = mg__moff_scratch(o, P, 0, &data);
    if (!moff) return MG_ENOMEM;
    for (int k = 0; k <= P; k++) moff[k] = (size_t)k * blk;
    mg__copy(o->rbuf + (size_t)o->rank * blk, o->sbuf, blk);
    MG_TRY(mg__binomial_gather_sp(o->p, &s, moff, o->rbuf, 0));
    return mg__binomial_bcast_sp(o->p, &s, o->rbuf, (size_t)P * blk);
}

mg_status mg__tree_reduce_scatter(mg__op *o)
{
    int P = o->size;
    mg__space s = mg__space_plain(P, o->rank, 0);
    size_t blk = o->count * o->es, all = blk * (size_t)P;
    char *data;
    size_t *moff = mg__moff_scratch(o, P, 2 * all, &data);
    if (!moff) return MG_ENOMEM;
    for (int k = 0; k <= P; k++) moff[k] = (size_t)k * blk;
    char *acc = data, *tmp = data + all;
    const char *res;
    MG_TRY(binomial_reduce(o, &s, o->sbuf, acc, tmp, all, &res));
    /* Scatter the reduced vector; acc now holds our subtree's part. */
    MG_TRY(mg__binomial_scatter_sp(o->p, &s, moff, acc, s.me ? moff[s.me] : 0));
    memcpy(o->rbuf, acc, blk);   /* our own block leads our part */
    mg__reduce_finish(o->rbuf, o->count, o->dt, o->op, P);
    return MG_OK;
}

mg_status mg__tree_barrier(mg__op *o)
{
    mg__space s = mg__space_plain(o->size, o->rank, 0);
    unsigned char tok = 1;
    int i = s.me;
    for (int m = 1; m < s.n; m <<= 1) {
        if (i & m) {
            MG_TRY(mg__send(o->p, mg__sp_real(&s, i - m), &tok, 1));
            break;
        }
        if (i + m < s.n) MG_TRY(mg__recv(o->p, mg__sp_real(&s, i + m), &tok, 1));
    }
    return mg__binomial_bcast_sp(o->p, &s, (char *)&tok, 1);
}
