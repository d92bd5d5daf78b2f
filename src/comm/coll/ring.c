/* Ring algorithms (bandwidth-optimal on point-to-point channels) and the
 * simple pairwise ones the ring family uses where a ring has nothing to
 * offer:
 *   all_reduce      reduce-scatter ring then all-gather ring; the reduce-
 *                   scatter pipelines chunks of MG_COLL_CHUNK bytes so the
 *                   transfer of chunk k+1 overlaps the reduction of chunk k
 *   reduce_scatter  the reduce-scatter ring alone
 *   all_gather      all-gather ring
 *   broadcast       pipelined chain root -> root+1 -> ... (chunked)
 *   reduce          pipelined chain root+1 -> ... -> root (chunked)
 *   gather/scatter  flat: the root exchanges with each peer in turn
 *   all_to_all      pairwise exchange, step s: to r+s, from r-s (or r^s)
 *   barrier         dissemination, ceil(log2 p) rounds
 * Limits: every rank must use the same MG_COLL_CHUNK (chunking decides
 * message sizes). Blocks are cut as evenly as the count allows; empty
 * blocks send nothing. */
#include "comm/coll/algos.h"

static size_t chunk_bytes(const mg__op *o)
{
    size_t c = mg__coll_chunk();
    c -= c % o->es;
    return c ? c : o->es;
}

static size_t minz(size_t a, size_t b) { return a < b ? a : b; }

mg_status mg__ring_all_reduce(mg__op *o)
{
    mg__p2p *p = o->p;
    int P = o->size, r = o->rank, right = (r + 1) % P, left = (r - 1 + P) % P;
    mg__layout L = {.n = o->count, .es = o->es, .p = P, .uniform = 0};
    size_t C = chunk_bytes(o), es = o->es;
    mg_op aop = mg__accop(o->op);
    char *tmp = mg__op_scratch(o, minz(C, mg__lay_len(&L, 0)));
    if (!tmp) return MG_ENOMEM;

    /* Reduce-scatter: at step s send block r-s (ours from sbuf at s = 0,
     * else the one reduced at step s-1) and reduce block r-s-1 into rbuf. */
    for (int s = 0; s < P - 1; s++) {
        int sb = (r - s + P) % P, rb = (r - s - 1 + 2 * P) % P;
        const char *src = s == 0 ? o->sbuf : o->rbuf;
        size_t soff = mg__lay_off(&L, sb), slen = mg__lay_len(&L, sb);
        size_t roff = mg__lay_off(&L, rb), rlen = mg__lay_len(&L, rb);
        for (size_t c = 0; c < slen || c < rlen; c += C) {
            size_t sn = c < slen ? minz(C, slen - c) : 0;
            size_t rn = c < rlen ? minz(C, rlen - c) : 0;
            MG_TRY(mg__sendrecv(p, right, src + soff + c, sn, left, tmp, rn));
            if (rn) mg__reduce3(o->rbuf + roff + c, o->sbuf + roff + c, tmp, rn / es, o->dt, aop);
        }
    }
    int own = (r + 1) % P;
    mg__reduce_finish(o->rbuf + mg__lay_off(&L, own), mg__lay_len(&L, own) / es, o->dt,
                      o->op, P);
    /* All-gather: pass the finished blocks around. */
    for (int s = 0; s < P - 1; s++) {
        int sb = (r + 1 - s + P) % P, rb = (r - s + P) % P;
        MG_TRY(mg__sendrecv(p, right, o->rbuf + mg__lay_off(&L, sb), mg__lay_len(&L, sb),
                            left, o->rbuf + mg__lay_off(&L, rb), mg__lay_len(&L, rb)));
    }
    return MG_OK;
}

mg_status mg__ring_reduce_scatter(mg__op *o)
{
    mg__p2p *p = o->p;
    int P = o->size, r = o->rank, right = (r + 1) % P, left = (r - 1 + P) % P;
    size_t es = o->es, blk = o->count * es, C = minz(chunk_bytes(o), blk);
    mg_op aop = mg__accop(o->op);
    /* Partial sums alternate between two block buffers; the last step
     * lands in rbuf. rbuf serves as one of the two unless it is our own
     * input block (in place), which must survive until that last step. */
    int rbuf_free = o->rbuf != o->sbuf + (size_t)r * blk;
    char *scr = mg__op_scratch(o, C + (rbuf_free ? 1 : 2) * blk);
    if (!scr) return MG_ENOMEM;
    char *tmp = scr, *acc[2] = {rbuf_free ? o->rbuf : scr + C + blk, scr + C};
    const char *prev = NULL;
    for (int s = 0; s < P - 1; s++) {
        int sb = (r - 1 - s + P) % P, rb = (r - 2 - s + 2 * P) % P;
        const char *src = s == 0 ? o->sbuf + (size_t)sb * blk : prev;
        char *dst = s == P - 2 ? o->rbuf : acc[(P - 2 - s) % 2];
        for (size_t c = 0; c < blk; c += C) {
            size_t n = minz(C, blk - c);
            MG_TRY(mg__sendrecv(p, right, src + c, n, left, tmp, n));
            mg__reduce3(dst + c, o->sbuf + (size_t)rb * blk + c, tmp, n / es, o->dt, aop);
        }
        prev = dst;
    }
    mg__reduce_finish(o->rbuf, o->count, o->dt, o->op, P);
    return MG_OK;
}

mg_status mg__ring_all_gather(mg__op *o)
{
    mg__p2p *p = o->p;
    int P = o->size, r = o->rank, right = (r + 1) % P, left = (r - 1 + P) % P;
    size_t blk = o->count * o->es;
    mg__copy(o->rbuf + (size_t)r * blk, o->sbuf, blk);
    for (int s = 0; s < P - 1; s++) {
        int sb = (r - s + P) % P, rb = (r - s - 1 + 2 * P) % P;
        MG_TRY(mg__sendrecv(p, right, o->rbuf + (size_t)sb * blk, blk,
                            left, o->rbuf + (size_t)rb * blk, blk));
    }
    return MG_OK;
}

mg_status mg__ring_broadcast(mg__op *o)
{
    mg__p2p *p = o->p;
    int P = o->size, r = o->rank, next = (r + 1) % P, prev = (r - 1 + P) % P;
    int pos = (r - o->root + P) % P;
    size_t n = o->count * o->es, C = chunk_bytes(o);
    char *b = o->rbuf;
    if (pos == 0) {
        for (size_t c = 0; c < n; c += C) MG_TRY(mg__send(p, next, b + c, minz(C, n - c)));
    } else if (pos == P - 1) {
        for (size_t c = 0; c < n; c += C) MG_TRY(mg__recv(p, prev, b + c, minz(C, n - c)));
    } else {
        /* Forward chunk k-1 while receiving chunk k. */
        MG_TRY(mg__recv(p, prev, b, minz(C, n)));
        size_t last = 0;
        for (size_t c = C; c < n; c += C) {
            MG_TRY(mg__sendrecv(p, next, b + last, C, prev, b + c, minz(C, n - c)));
            last = c;
        }
        MG_TRY(mg__send(p, next, b + last, minz(C, n - last)));
    }
    return MG_OK;
}

mg_status mg__ring_reduce(mg__op *o)
{
    mg__p2p *p = o->p;
    int P = o->size, r = o->rank, next = (r + 1) % P, prev = (r - 1 + P) % P;
    int pos = (r - o->root - 1 + 2 * P) % P;   /* root+1 starts, root ends */
    size_t n = o->count * o->es, es = o->es, C = minz(chunk_bytes(o), n);
    mg_op aop = mg__accop(o->op);
    if (pos == 0) {
        for (size_t c = 0; c < n; c += C) MG_TRY(mg__send(p, next, o->sbuf + c, minz(C, n - c)));
        return MG_OK;
    }
    char *t = mg__op_scratch(o, pos == P - 1 ? C : 2 * C);
    if (!t) return MG_ENOMEM;
    if (pos == P - 1) {
        for (size_t c = 0; c < n; c += C) {
            size_t m = minz(C, n - c);
            MG_TRY(mg__recv(p, prev, t, m));
            mg__reduce3(o->rbuf + c, o->sbuf + c, t, m / es, o->dt, aop);
        }
        mg__reduce_finish(o->rbuf, o->count, o->dt, o->op, P);
        return MG_OK;
    }
    /* Middle of the chain: forward partial chunk k-1 while receiving k. */
    char *tb[2] = {t, t + C};
    MG_TRY(mg__recv(p, prev, tb[0], minz(C, n)));
    mg__reduce3(tb[0], o->sbuf, tb[0], minz(C, n) / es, o->dt, aop);
    size_t last = 0;
    int k = 0;
    for (size_t c = C; c < n; c += C) {
        size_t m = minz(C, n - c);
        MG_TRY(mg__sendrecv(p, next, tb[k], C, prev, tb[k ^ 1], m));
        k ^= 1;
        mg__reduce3(tb[k], o->sbuf + c, tb[k], m / es, o->dt, aop);
        last = c;
    }
    return mg__send(p, next, tb[k], minz(C, n - last));
}

mg_status mg__flat_gather(mg__op *o)
{
    mg__p2p *p = o->p;
    size_t blk = o->count * o->es;
    if (o->rank != o->root) return mg__send(p, o->root, o->sbuf, blk);
    mg__copy(o->rbuf + (size_t)o->root * blk, o->sbuf, blk);
    for (int s = 1; s < o->size; s++) {
        int q = (o->root + s) % o->size;
        MG_TRY(mg__recv(p, q, o->rbuf + (size_t)q * blk, blk));
    }
    return MG_OK;
}

mg_status mg__flat_scatter(mg__op *o)
{
    mg__p2p *p = o->p;
    size_t blk = o->count * o->es;
    if (o->rank != o->root) return mg__recv(p, o->root, o->rbuf, blk);
    for (int s = 1; s < o->size; s++) {
        int q = (o->root + s) % o->size;
        MG_TRY(mg__send(p, q, o->sbuf + (size_t)q * blk, blk));
    }
    mg__copy(o->rbuf, o->sbuf + (size_t)o->root * blk, blk);
    return MG_OK;
}

mg_status mg__pairwise_all_to_all(mg__op *o, int use_xor)
{
    mg__p2p *p = o->p;
    int P = o->size, r = o->rank;
    size_t blk = o->count * o->es;
    if (P & (P - 1)) use_xor = 0;
    mg__copy(o->rbuf + (size_t)r * blk, o->sbuf + (size_t)r * blk, blk);
    for (int s = 1; s < P; s++) {
        int to = use_xor ? r ^ s : (r + s) % P, from = use_xor ? r ^ s : (r - s + P) % P;
        MG_TRY(mg__sendrecv(p, to, o->sbuf + (size_t)to * blk, blk,
                            from, o->rbuf + (size_t)from * blk, blk));
    }
    return MG_OK;
}

mg_status mg__dissemination_barrier(mg__op *o)
{
    mg__p2p *p = o->p;
    int P = o->size, r = o->rank;
    unsigned char out = 1, in = 0;
    for (int d = 1; d < P; d <<= 1)
        MG_TRY(mg__sendrecv(p, (r + d) % P, &out, 1, (r - d + P) % P, &in, 1));
    return MG_OK;
}

void mg__ring_volume(const mg_call *c, int rank, int size, uint64_t *sent, uint64_t *received)
{
    uint64_t P = (uint64_t)size, n = (uint64_t)c->count * mg__dtsize(c->dtype);
    int root = c->root;
    *sent = *received = 0;
    if (c->coll == MG_COLL_SEND || c->coll == MG_COLL_RECV) {
        if (root != rank) *(c->coll == MG_COLL_SEND ? sent : received) = n;
        return;
    }
    if (size < 2 || c->coll == MG_COLL_BARRIER) return;
    switch (c->coll) {
    case MG_COLL_ALL_REDUCE: {
        /* Reduce-scatter sends every block but r+1 and receives every one
         * but r; the all-gather sends every one but r+2, receives all but
         * r+1. */
        mg__layout L = {.n = c->count, .es = mg__dtsize(c->dtype), .p = size, .uniform = 0};
        uint64_t l0 = mg__lay_len(&L, rank), l1 = mg__lay_len(&L, (rank + 1) % size),
                 l2 = mg__lay_len(&L, (rank + 2) % size);
        *sent = 2 * n - l1 - l2;
        *received = 2 * n - l0 - l1;
        break;
    }
    case MG_COLL_BROADCAST: {
        int pos = (rank - root + size) % size;   /* root first, root-1 last */
        *sent = pos < size - 1 ? n : 0;
        *received = pos > 0 ? n : 0;
        break;
    }
    case MG_COLL_REDUCE: {
        int pos = (rank - root - 1 + 2 * size) % size;   /* root+1 first, root last */
        *sent = pos < size - 1 ? n : 0;
        *received = pos > 0 ? n : 0;
        break;
    }
    case MG_COLL_GATHER:
        *sent = rank == root ? 0 : n;
        *received = rank == root ? (P - 1) * n : 0;
        break;
    case MG_COLL_SCATTER:
        *sent = rank == root ? (P - 1) * n : 0;
        *received = rank == root ? 0 : n;
        break;
    default:   /* all_gather, reduce_scatter, all_to_all: n per rank, per peer */
        *sent = *received = (P - 1) * n;
        break;
    }
}
