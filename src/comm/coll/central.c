/* The central family: every collective through one rank, the "parameter
 * device" of synchronous parameter servers (TensorFlow's, Horovod's
 * single-server baseline), as a collective algorithm so that any
 * data-parallel job runs on it (MG_ALGO=central) and it can be measured
 * against the ring and the trees on the same job.
 *   reduce          the root receives every other rank's vector, one at a
 *                   time, and adds them in rank order, ((x0 + x1) + x2) +
 *                   ..., whatever the root: one process's order
 *   all_reduce      reduce to rank 0, then rank 0 sends the result to each
 *                   rank in turn
 *   broadcast       the root sends the buffer to each rank in turn
 *   all_gather      each block to rank 0, then the whole to each rank
 *   reduce_scatter  reduce the whole vector to rank 0, then each rank its
 *                   block
 *   gather, scatter the flat algorithms (ring.c), already central
 *   all_to_all      pairwise (ring.c's: a rank in the middle would only
 *                   double the bytes)
 *   barrier         a byte from each rank to rank 0, then one back to each
 * The root moves p - 1 whole vectors in and p - 1 out, one after another:
 * its time grows with p where the ring's stays flat, which is the
 * trade-off this family is here to show. Never chosen by the cost model:
 * only when asked for.
 * Limits: whole messages, no chunking or pipelining; the root receives in
 * rank order, so a late rank holds up those after it. */
#include "comm/coll/algos.h"

/* The vector of n bytes (elems elements) reduced to `root` in rank order
 * into acc (the root's; acc may equal in only where root is 0). tmp: n
 * bytes the root receives into. */
static mg_status central_reduce(mg__op *o, int root, const char *in, char *acc, char *tmp,
                                size_t n, size_t elems)
{
    mg__p2p *p = o->p;
    if (o->rank != root) return mg__send(p, root, in, n);
    mg_op aop = mg__accop(o->op);
    for (int q = 0; q < o->size; q++) {
        const char *x = in;
        if (q != root) {
            MG_TRY(mg__recv(p, q, q == 0 ? acc : tmp, n));
            x = q == 0 ? acc : tmp;
        }
        if (q == 0) mg__copy(acc, x, n);
        else mg__reduce3(acc, acc, x, elems, o->dt, aop);
    }
    mg__reduce_finish(acc, elems, o->dt, o->op, o->size);
    return MG_OK;
}

/* The root sends buf (n bytes) to every other rank; they receive it. */
static mg_status central_bcast(mg__op *o, int root, char *buf, size_t n)
{
    if (o->rank != root) return mg__recv(o->p, root, buf, n);
    for (int q = 0; q < o->size; q++)
        if (q != root) MG_TRY(mg__send(o->p, q, buf, n));
    return MG_OK;
}

mg_status mg__central_reduce(mg__op *o)
{
    size_t n = o->count * o->es;
    const char *in = o->sbuf;
    char *tmp = NULL;
    if (o->rank == o->root) {
        /* Rank 0's vector comes first into rbuf: the root's own must be
         * kept apart when it is there (in place) and rank 0 is not. */
        int keep = o->root != 0 && o->sbuf == o->rbuf;
        if (!(tmp = mg__op_scratch(o, keep ? 2 * n : n))) return MG_ENOMEM;
        if (keep) {
            memcpy(tmp + n, o->sbuf, n);
            in = tmp + n;
        }
    }
    return central_reduce(o, o->root, in, o->rbuf, tmp, n, o->count);
}

mg_status mg__central_all_reduce(mg__op *o)
{
    size_t n = o->count * o->es;
    char *tmp = NULL;
    if (o->rank == 0 && !(tmp = mg__op_scratch(o, n))) return MG_ENOMEM;
    MG_TRY(central_reduce(o, 0, o->sbuf, o->rbuf, tmp, n, o->count));
    return central_bcast(o, 0, o->rbuf, n);
}

mg_status mg__central_broadcast(mg__op *o)
{
    return central_bcast(o, o->root, o->rbuf, o->count * o->es);
}

mg_status mg__central_all_gather(mg__op *o)
{
    size_t blk = o->count * o->es;
    mg__op g = *o;
    g.root = 0;
    MG_TRY(mg__flat_gather(&g));
    return central_bcast(o, 0, o->rbuf, blk * (size_t)o->size);
}

mg_status mg__central_reduce_scatter(mg__op *o)
{
    size_t blk = o->count * o->es, n = blk * (size_t)o->size;
    if (o->rank != 0) {
        MG_TRY(mg__send(o->p, 0, o->sbuf, n));
        return mg__recv(o->p, 0, o->rbuf, blk);
    }
    char *acc = mg__op_scratch(o, 2 * n);
    if (!acc) return MG_ENOMEM;
    MG_TRY(central_reduce(o, 0, o->sbuf, acc, acc + n, n, o->count * (size_t)o->size));
    for (int q = 1; q < o->size; q++) MG_TRY(mg__send(o->p, q, acc + (size_t)q * blk, blk));
    mg__copy(o->rbuf, acc, blk);
    return MG_OK;
}

mg_status mg__central_barrier(mg__op *o)
{
    char token = 0;
    if (o->rank != 0) {
        MG_TRY(mg__send(o->p, 0, &token, 1));
        return mg__recv(o->p, 0, &token, 1);
    }
    for (int q = 1; q < o->size; q++) MG_TRY(mg__recv(o->p, q, &token, 1));
    for (int q = 1; q < o->size; q++) MG_TRY(mg__send(o->p, q, &token, 1));
    return MG_OK;
}
