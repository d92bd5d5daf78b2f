/* Names and sizes of the communication enums (comm.h). Out-of-range
 * values give "?" (names) or 0 (sizes) rather than reading past a table:
 * these are also used on values received from peers. */
#include "multigrad/comm.h"

size_t mg_dtype_size(mg_dtype t)
{
    static const size_t sz[MG_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8, 1};
    return (unsigned)t < MG_DTYPE_COUNT ? sz[t] : 0;
}

const char *mg_dtype_name(mg_dtype t)
{
    static const char *n[MG_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return (unsigned)t < MG_DTYPE_COUNT ? n[t] : "?";
}

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
