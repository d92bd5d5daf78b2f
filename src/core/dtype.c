/* Element types: names and sizes. Out-of-range values give "?" (names) or
 * 0 (sizes) rather than reading past the table: these are also used on
 * values received from peers. */
#include "core/dtype.h"

const mg__dtype_info mg__dtypes[MG_DTYPE_COUNT] = {
    [MG_F32] = {"f32", "F32", 4},   [MG_F64] = {"f64", "F64", 8},
    [MG_F16] = {"f16", "F16", 2},   [MG_BF16] = {"bf16", "BF16", 2},
    [MG_I32] = {"i32", "I32", 4},   [MG_I64] = {"i64", "I64", 8},
    [MG_U8] = {"u8", "U8", 1},
};

size_t mg_dtype_size(mg_dtype t)
{
    return (unsigned)t < MG_DTYPE_COUNT ? mg__dtypes[t].size : 0;
}

const char *mg_dtype_name(mg_dtype t)
{
    return (unsigned)t < MG_DTYPE_COUNT ? mg__dtypes[t].name : "?";
}
