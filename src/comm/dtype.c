/* Names of the communication enums (comm.h; element types are core's).
 * Out-of-range values give "?" rather than reading past a table: these
 * are also used on values received from peers. */
#include "multigrad/comm.h"

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
