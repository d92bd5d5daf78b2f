/* The operation descriptor (mg_call): the names of its enums (comm.h;
 * element types are core's) and the check of its arguments (call.h).
 * Out-of-range values give "?" rather than reading past a table: these
 * are also used on values received from peers. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "comm/call.h"

const char *mg_op_name(mg_op op)
{
    static const char *n[MG_OP_COUNT] = {"sum", "prod", "min", "max", "avg"};
    return (unsigned)op < MG_OP_COUNT ? n[op] : "?";
}

const char *mg_coll_name(mg_coll c)
{
    static const char *n[MG_COLL_COUNT] = {
        "broadcast", "reduce", "all_reduce", "all_gather", "gather", "scatter",
        "reduce_scatter", "all_to_all", "barrier", "send", "recv"};
    return (unsigned)c < MG_COLL_COUNT ? n[c] : "?";
}

bool mg__coll_rooted(mg_coll c)
{
    return c == MG_COLL_BROADCAST || c == MG_COLL_REDUCE || c == MG_COLL_GATHER ||
           c == MG_COLL_SCATTER;
}

/* Which of its buffers a rank uses: broadcast and scatter read sendbuf at
 * the root only, reduce and gather write recvbuf at the root only. */
bool mg__reads_sendbuf(mg_coll c, bool root)
{
    if (c == MG_COLL_BROADCAST || c == MG_COLL_SCATTER) return root;
    return c != MG_COLL_RECV;
}

bool mg__writes_recvbuf(mg_coll c, bool root)
{
    if (c == MG_COLL_REDUCE || c == MG_COLL_GATHER) return root;
    return c != MG_COLL_SEND;
}

mg_status mg__call_check(const mg_call *c, const mg__names *nm, int rank, int size)
{
    if ((unsigned)c->coll >= MG_COLL_COUNT)
        return mg_error(MG_EINVAL, "operation %d is not an mg_coll", (int)c->coll);
    const char *name = mg_coll_name(c->coll);
    if (c->coll == MG_COLL_BARRIER) return MG_OK;
    if ((unsigned)c->dtype >= MG_DTYPE_COUNT)
        return mg_error(MG_EINVAL, "%s: unknown dtype %d", name, (int)c->dtype);
    if ((unsigned)c->op >= MG_OP_COUNT)
        return mg_error(MG_EINVAL, "%s: unknown reduction op %d", name, (int)c->op);
    bool p2p = c->coll == MG_COLL_SEND || c->coll == MG_COLL_RECV;
    if (c->coll == MG_COLL_RECV && c->root == MG_ANY_SOURCE) {
        if (c->nfrom < 0 || (c->nfrom > 0 && !c->from) || (!c->from && c->nfrom))
            return mg_error(MG_EINVAL, "recv from any source: %d ranks in the set at %p", c->nfrom,
                            (const void *)c->from);
        if (c->from && !c->nfrom)
            return mg_error(MG_EINVAL, "recv from any source: an empty set of ranks would wait "
                            "forever (NULL for every rank)");
        for (int i = 0; i < c->nfrom; i++)
            if (c->from[i] < 0 || c->from[i] >= size)
                return mg_error(MG_EINVAL, "recv from any source: rank %d of the set is outside "
                                "[0, %d)", c->from[i], size);
    } else if ((mg__coll_rooted(c->coll) || p2p) && (c->root < 0 || c->root >= size))
        return mg_error(MG_EINVAL, "%s: %s %d is outside [0, %d)", name, p2p ? "peer" : "root",
                        c->root, size);
    if (c->count > SIZE_MAX / mg_dtype_size(c->dtype) / (size_t)size)
        return mg_error(MG_EINVAL, "%s: count %zu overflows the address space", name, c->count);
    if (!c->count) return MG_OK;
    bool root = c->root == rank;
    const char *which = NULL;
    if (!c->sendbuf && mg__reads_sendbuf(c->coll, root)) which = "send";
    else if (!c->recvbuf && mg__writes_recvbuf(c->coll, root)) which = "receive";
    char me[128];
    if (which)
        return mg_error(MG_EINVAL, "%s: NULL %s buffer on %s for %zu elements", name, which,
                        mg__rank_name(nm, rank, NULL, me, sizeof me), c->count);
    return MG_OK;
}

void mg__call_spans(const mg_call *c, int rank, int size, size_t *sn, size_t *rn)
{
    size_t n = c->count * mg_dtype_size(c->dtype), all = n * (size_t)size;
    bool root = c->root == rank;
    mg_coll k = c->coll;
    *sn = *rn = 0;
    if (k == MG_COLL_BARRIER) return;
    if (mg__reads_sendbuf(k, root))
        *sn = k == MG_COLL_SCATTER || k == MG_COLL_REDUCE_SCATTER || k == MG_COLL_ALL_TO_ALL ? all
                                                                                            : n;
    if (mg__writes_recvbuf(k, root))
        *rn = k == MG_COLL_ALL_GATHER || k == MG_COLL_GATHER || k == MG_COLL_ALL_TO_ALL ? all : n;
}

void mg__call_resolve(const mg_call *c, int rank, int size, const char **s, char **r,
                      size_t *in, size_t *out)
{
    const char *sb = c->sendbuf;
    char *rb = c->recvbuf;
    size_t b = c->count * mg_dtype_size(c->dtype), all = b * (size_t)size;
    bool root = c->root == rank;
    mg_coll k = c->coll;
    *in = *out = 0;
    switch (k) {
    case MG_COLL_BROADCAST:
        if (root && sb != rb && mg__overlaps(sb, b, rb, b)) *in = b;
        break;
    case MG_COLL_ALL_REDUCE:
    case MG_COLL_REDUCE:
        if (sb != rb && (k == MG_COLL_ALL_REDUCE || root) && mg__overlaps(sb, b, rb, b)) *in = b;
        break;
    case MG_COLL_ALL_GATHER:
    case MG_COLL_GATHER:
        if (k == MG_COLL_ALL_GATHER || root) {
            if (sb == rb) sb = rb + (size_t)rank * b;
            if (sb != rb + (size_t)rank * b && mg__overlaps(sb, b, rb, all)) *in = b;
        }
        break;
    case MG_COLL_SCATTER:
        if (root) {
            if (rb == sb) rb = (char *)sb + (size_t)rank * b;
            if (rb != sb + (size_t)rank * b && mg__overlaps(sb, all, rb, b)) *out = b;
        }
        break;
    case MG_COLL_REDUCE_SCATTER:
        if (rb != sb + (size_t)rank * b && mg__overlaps(sb, all, rb, b)) *out = b;
        break;
    case MG_COLL_ALL_TO_ALL:
        if (mg__overlaps(sb, all, rb, all)) *in = all;
        break;
    default:
        break;
    }
    *s = sb;
    *r = rb;
}

bool mg__overlaps(const void *a, size_t an, const void *b, size_t bn)
{
    if (!a || !b || !an || !bn) return false;
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bn && y < x + an;
}

void mg__call_describe_p2p(const mg_call *c, const mg__names *nm, uint64_t seq, char *buf,
                           size_t n)
{
    const char *f = c->file ? strrchr(c->file, '/') : NULL;
    f = f ? f + 1 : c->file ? c->file : "?";
    char peer[128];
    if (c->root == MG_ANY_SOURCE)
        snprintf(peer, sizeof peer, "%s", c->from ? "any rank of its set" : "any rank");
    else mg__rank_name(nm, c->root, NULL, peer, sizeof peer);
    snprintf(buf, n, "%s #%llu %s %s (%zu x %s, tag %d) at %s:%d", mg_coll_name(c->coll),
             (unsigned long long)seq, c->coll == MG_COLL_SEND ? "to" : "from", peer, c->count,
             mg_dtype_name(c->dtype), c->tag, f, c->line);
}
