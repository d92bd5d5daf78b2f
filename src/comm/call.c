/* The operation descriptor (mg_call): the names of its enums (comm.h;
 * element types are core's) and the check of its arguments (call.h).
 * Out-of-range values give "?" rather than reading past a table: these
 * are also used on values received from peers. */
#include <stdint.h>
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

/* Which of its buffers a rank uses: broadcast and scatter read sendbuf at
 * the root only, reduce and gather write recvbuf at the root only. */
static bool reads_sendbuf(mg_coll c, bool root)
{
    if (c == MG_COLL_BROADCAST || c == MG_COLL_SCATTER) return root;
    return c != MG_COLL_RECV;
}

static bool writes_recvbuf(mg_coll c, bool root)
{
    if (c == MG_COLL_REDUCE || c == MG_COLL_GATHER) return root;
    return c != MG_COLL_SEND;
}

mg_status mg__call_check(const mg_call *c, int rank, int size)
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
    bool rooted = c->coll == MG_COLL_BROADCAST || c->coll == MG_COLL_REDUCE ||
                  c->coll == MG_COLL_GATHER || c->coll == MG_COLL_SCATTER;
    if ((rooted || p2p) && (c->root < 0 || c->root >= size))
        return mg_error(MG_EINVAL, "%s: %s %d is outside [0, %d)", name, p2p ? "peer" : "root",
                        c->root, size);
    if (c->count > SIZE_MAX / mg_dtype_size(c->dtype) / (size_t)size)
        return mg_error(MG_EINVAL, "%s: count %zu overflows the address space", name, c->count);
    if (!c->count) return MG_OK;
    bool root = c->root == rank;
    const char *which = NULL;
    if (!c->sendbuf && reads_sendbuf(c->coll, root)) which = "send";
    else if (!c->recvbuf && writes_recvbuf(c->coll, root)) which = "receive";
    if (which)
        return mg_error(MG_EINVAL, "%s: NULL %s buffer on rank %d for %zu elements", name, which,
                        rank, c->count);
    return MG_OK;
}
