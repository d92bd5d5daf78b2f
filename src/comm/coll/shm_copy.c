/* Direct shared-memory data movement for ranks on one host: broadcast,
 * all_gather, gather, scatter, all_to_all. Each has the three forms of
 * shm_proto.h:
 *   small   the whole input goes into the slot region; one wait; every
 *           rank copies what it needs out of the regions
 *   direct  group-memory buffers: readers copy straight from the owner's
 *           buffer (broadcast, all_gather, scatter, all_to_all pull;
 *           gather pushes into the root's buffer), then one more wait so
 *           no rank returns while its buffer is still being read
 *   staged  chunks through the staging buffers, pipelined three deep,
 *           written with the stores mg__shm_op_stage_begin chooses
 * Each byte crosses memory once in the direct form and twice staged.
 * Traffic is the same in every form: what a rank takes of a peer's data
 * (received; the peer counts it sent), counted by copy_traffic.
 * Limits: staged scatter and all_to_all put a piece for every rank in one
 * staging buffer; with more than stage/64 ranks they fall back to the
 * point-to-point algorithms. */
#include "comm/coll/shm_proto.h"

static uint32_t cA(size_t k) { return (uint32_t)(2 + 2 * k); }
static uint32_t cB(size_t k) { return (uint32_t)(3 + 2 * k); }
static size_t minz(size_t a, size_t b) { return a < b ? a : b; }

/* Traffic of m bytes of each rank's data, in whichever form:
 *   broadcast, scatter  the root's data goes to each other rank
 *   gather              each other rank's data goes to the root
 *   all_gather, all_to_all  every rank's data goes to every other rank
 * (for scatter and all_to_all m is one rank's block, not the vector). */
static void copy_traffic(mg__shm_op *x, size_t m)
{
    uint64_t b = m, others = (uint64_t)(x->P - 1);
    int root = x->me == x->o->root;
    switch (x->o->coll) {
    case MG_COLL_BROADCAST: case MG_COLL_SCATTER:
        mg__shm_op_traffic(x, root ? others * b : 0, root ? 0 : b);
        break;
    case MG_COLL_GATHER:
        mg__shm_op_traffic(x, root ? 0 : b, root ? others * b : 0);
        break;
    default:
        mg__shm_op_traffic(x, others * b, others * b);
        break;
    }
}

mg_status mg__shm_broadcast(mg__op *o)
{
    mg__shm_op x;
    MG_TRY(mg__shm_op_begin(&x, o));
    size_t n = o->count * o->es;
    int root = o->root, me = x.me;
    if (n <= x.sm) {
        mg__shm_op_publish(&x, o->rbuf, me == root ? n : 0);
        MG_TRY(mg__shm_op_wait_published(&x));
        if (me != root) memcpy(o->rbuf, mg__shm_op_small(&x, root, n), n);
        copy_traffic(&x, n);
        return MG_OK;
    }
    MG_TRY(mg__shm_op_arrive(&x, me == root ? mg__shm_op_gaddr(&x, o->rbuf, n) : 0, 0));
    uint64_t g = mg__shm_op_hdr(&x, root)->ga[0];
    if (g) {
        copy_traffic(&x, n);
        if (me == root) return mg__shm_op_wait_all(&x, 2);
        memcpy(o->rbuf, mg__shm_op_gptr(&x, root, g), n);
        mg__shm_op_post(&x, 2);
        return MG_OK;
    }
    size_t C = x.stage, nch = (n + C - 1) / C;
    mg__shm_op_stage_begin(&x, n);
    for (size_t k = 0; k < nch; k++) {
        size_t off = k * C, m = minz(C, n - off);
        if (me == root) {
            if (k >= 3) MG_TRY(mg__shm_op_wait_all(&x, cB(k - 3)));
            mg__shm_op_stage_copy(&x, mg__shm_op_stage(&x, me, k), o->rbuf + off, m);
            mg__shm_op_post(&x, cA(k));
        } else {
            MG_TRY(mg__shm_op_wait(&x, root, cA(k)));
            memcpy(o->rbuf + off, mg__shm_op_stage(&x, root, k), m);
            mg__shm_op_post(&x, cB(k));
        }
        copy_traffic(&x, m);
    }
    mg__shm_op_stage_end(&x);
    return MG_OK;
}

mg_status mg__shm_all_gather(mg__op *o)
{
    mg__shm_op x;
    MG_TRY(mg__shm_op_begin(&x, o));
    int P = x.P, me = x.me;
    size_t blk = o->count * o->es;
    if (blk <= x.sm) {
        mg__shm_op_publish(&x, o->sbuf, blk);
        MG_TRY(mg__shm_op_wait_published(&x));
        for (int q = 0; q < P; q++)
            if (q != me) memcpy(o->rbuf + (size_t)q * blk, mg__shm_op_small(&x, q, blk), blk);
        mg__copy(o->rbuf + (size_t)me * blk, o->sbuf, blk);
        copy_traffic(&x, blk);
        return MG_OK;
    }
    MG_TRY(mg__shm_op_arrive(&x, mg__shm_op_gaddr(&x, o->sbuf, blk), 0));
    mg__copy(o->rbuf + (size_t)me * blk, o->sbuf, blk);
    int direct = 1;
    for (int q = 0; q < P; q++) direct &= mg__shm_op_hdr(&x, q)->ga[0] != 0;
    if (direct) {
        for (int q = 0; q < P; q++)
            if (q != me)
                memcpy(o->rbuf + (size_t)q * blk,
                       mg__shm_op_gptr(&x, q, mg__shm_op_hdr(&x, q)->ga[0]), blk);
        copy_traffic(&x, blk);
        mg__shm_op_post(&x, 2);
        return mg__shm_op_wait_all(&x, 2);
    }
    size_t C = x.stage, nch = (blk + C - 1) / C;
    mg__shm_op_stage_begin(&x, blk * (size_t)P);
    for (size_t k = 0; k < nch; k++) {
        size_t off = k * C, m = minz(C, blk - off);
        if (k >= 3) MG_TRY(mg__shm_op_wait_all(&x, cB(k - 3)));
        mg__shm_op_stage_copy(&x, mg__shm_op_stage(&x, me, k), o->sbuf + off, m);
        mg__shm_op_post(&x, cA(k));
        MG_TRY(mg__shm_op_wait_all(&x, cA(k)));
        for (int q = 0; q < P; q++)
            if (q != me) memcpy(o->rbuf + (size_t)q * blk + off, mg__shm_op_stage(&x, q, k), m);
        copy_traffic(&x, m);
        mg__shm_op_post(&x, cB(k));
    }
    mg__shm_op_stage_end(&x);
    return MG_OK;
}

mg_status mg__shm_gather(mg__op *o)
{
    mg__shm_op x;
    MG_TRY(mg__shm_op_begin(&x, o));
    int P = x.P, me = x.me, root = o->root;
    size_t blk = o->count * o->es, all = blk * (size_t)P;
    if (blk <= x.sm) {
        mg__shm_op_publish(&x, o->sbuf, blk);
        MG_TRY(mg__shm_op_wait_published(&x));
        copy_traffic(&x, blk);
        if (me != root) return MG_OK;
        for (int q = 0; q < P; q++)
            if (q != me) memcpy(o->rbuf + (size_t)q * blk, mg__shm_op_small(&x, q, blk), blk);
        mg__copy(o->rbuf + (size_t)me * blk, o->sbuf, blk);
        return MG_OK;
    }
    MG_TRY(mg__shm_op_arrive(&x, 0, me == root ? mg__shm_op_gaddr(&x, o->rbuf, all) : 0));
    uint64_t g = mg__shm_op_hdr(&x, root)->ga[1];
    if (me == root) mg__copy(o->rbuf + (size_t)me * blk, o->sbuf, blk);
    if (g) {
        /* Push into the root's buffer: the p-1 copies run in parallel. */
        copy_traffic(&x, blk);
        if (me == root) return mg__shm_op_wait_all(&x, 2);
        memcpy(mg__shm_op_gptr(&x, root, g) + (size_t)me * blk, o->sbuf, blk);
        mg__shm_op_post(&x, 2);
        return MG_OK;
    }
    size_t C = x.stage, nch = (blk + C - 1) / C;
    mg__shm_op_stage_begin(&x, all);
    for (size_t k = 0; k < nch; k++) {
        size_t off = k * C, m = minz(C, blk - off);
        if (me != root) {
            if (k >= 3) MG_TRY(mg__shm_op_wait(&x, root, cB(k - 3)));
            mg__shm_op_stage_copy(&x, mg__shm_op_stage(&x, me, k), o->sbuf + off, m);
            mg__shm_op_post(&x, cA(k));
            copy_traffic(&x, m);   /* the root takes it from there */
            continue;
        }
        for (int d = 1; d < P; d++) {
            int q = (me + d) % P;
            MG_TRY(mg__shm_op_wait(&x, q, cA(k)));
            memcpy(o->rbuf + (size_t)q * blk + off, mg__shm_op_stage(&x, q, k), m);
        }
        copy_traffic(&x, m);
        mg__shm_op_post(&x, cB(k));
    }
    mg__shm_op_stage_end(&x);
    return MG_OK;
}

mg_status mg__shm_scatter(mg__op *o)
{
    mg__shm_op x;
    MG_TRY(mg__shm_op_begin(&x, o));
    int P = x.P, me = x.me, root = o->root;
    size_t blk = o->count * o->es, all = blk * (size_t)P;
    if (all <= x.sm) {
        mg__shm_op_publish(&x, o->sbuf, me == root ? all : 0);
        MG_TRY(mg__shm_op_wait_published(&x));
        if (me == root)
            mg__copy(o->rbuf, o->sbuf + (size_t)me * blk, blk);
        else
            memcpy(o->rbuf, mg__shm_op_small(&x, root, all) + (size_t)me * blk, blk);
        copy_traffic(&x, blk);
        return MG_OK;
    }
    MG_TRY(mg__shm_op_arrive(&x, me == root ? mg__shm_op_gaddr(&x, o->sbuf, all) : 0, 0));
    uint64_t g = mg__shm_op_hdr(&x, root)->ga[0];
    if (me == root) mg__copy(o->rbuf, o->sbuf + (size_t)me * blk, blk);
    if (g) {
        copy_traffic(&x, blk);
        if (me == root) return mg__shm_op_wait_all(&x, 2);
        memcpy(o->rbuf, mg__shm_op_gptr(&x, root, g) + (size_t)me * blk, blk);
        mg__shm_op_post(&x, 2);
        return MG_OK;
    }
    size_t C = (x.stage / (size_t)P) & ~(size_t)63;
    if (!C) return mg__flat_scatter(o);   /* same on every rank */
    size_t nch = (blk + C - 1) / C;
    mg__shm_op_stage_begin(&x, all);
    for (size_t k = 0; k < nch; k++) {
        size_t off = k * C, m = minz(C, blk - off);
        if (me == root) {
            if (k >= 3) MG_TRY(mg__shm_op_wait_all(&x, cB(k - 3)));
            char *st = mg__shm_op_stage(&x, me, k);
            for (int q = 0; q < P; q++)
                if (q != me)
                    mg__shm_op_stage_copy(&x, st + (size_t)q * C, o->sbuf + (size_t)q * blk + off,
                                          m);
            mg__shm_op_post(&x, cA(k));
        } else {
            MG_TRY(mg__shm_op_wait(&x, root, cA(k)));
            memcpy(o->rbuf + off, mg__shm_op_stage(&x, root, k) + (size_t)me * C, m);
            mg__shm_op_post(&x, cB(k));
        }
        copy_traffic(&x, m);
    }
    mg__shm_op_stage_end(&x);
    return MG_OK;
}

mg_status mg__shm_all_to_all(mg__op *o)
{
    mg__shm_op x;
    MG_TRY(mg__shm_op_begin(&x, o));
    int P = x.P, me = x.me;
    size_t blk = o->count * o->es, all = blk * (size_t)P;
    if (all <= x.sm) {
        mg__shm_op_publish(&x, o->sbuf, all);
        MG_TRY(mg__shm_op_wait_published(&x));
        for (int q = 0; q < P; q++)
            memcpy(o->rbuf + (size_t)q * blk, mg__shm_op_small(&x, q, all) + (size_t)me * blk, blk);
        copy_traffic(&x, blk);   /* its own block came from its own region */
        return MG_OK;
    }
    MG_TRY(mg__shm_op_arrive(&x, mg__shm_op_gaddr(&x, o->sbuf, all), 0));
    memcpy(o->rbuf + (size_t)me * blk, o->sbuf + (size_t)me * blk, blk);
    int direct = 1;
    for (int q = 0; q < P; q++) direct &= mg__shm_op_hdr(&x, q)->ga[0] != 0;
    if (direct) {
        for (int q = 0; q < P; q++)
            if (q != me)
                memcpy(o->rbuf + (size_t)q * blk,
                       mg__shm_op_gptr(&x, q, mg__shm_op_hdr(&x, q)->ga[0]) + (size_t)me * blk,
                       blk);
        copy_traffic(&x, blk);
        mg__shm_op_post(&x, 2);
        return mg__shm_op_wait_all(&x, 2);
    }
    size_t C = (x.stage / (size_t)P) & ~(size_t)63;
    if (!C) return mg__pairwise_all_to_all(o, 0);   /* same on every rank */
    size_t nch = (blk + C - 1) / C;
    mg__shm_op_stage_begin(&x, all);
    for (size_t k = 0; k < nch; k++) {
        size_t off = k * C, m = minz(C, blk - off);
        if (k >= 3) MG_TRY(mg__shm_op_wait_all(&x, cB(k - 3)));
        char *st = mg__shm_op_stage(&x, me, k);
        for (int q = 0; q < P; q++)
            if (q != me)
                mg__shm_op_stage_copy(&x, st + (size_t)q * C, o->sbuf + (size_t)q * blk + off, m);
        mg__shm_op_post(&x, cA(k));
        MG_TRY(mg__shm_op_wait_all(&x, cA(k)));
        for (int q = 0; q < P; q++)
            if (q != me)
                memcpy(o->rbuf + (size_t)q * blk + off,
                       mg__shm_op_stage(&x, q, k) + (size_t)me * C, m);
        copy_traffic(&x, m);
        mg__shm_op_post(&x, cB(k));
    }
    mg__shm_op_stage_end(&x);
    return MG_OK;
}
