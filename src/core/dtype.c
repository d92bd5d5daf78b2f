/* Element types: names, sizes and the scalar f16 and bf16 conversions.
 * Out-of-range values give "?" (names) or 0 (sizes) rather than reading
 * past the table: these are also used on values received from peers. */
#include "core/dtype.h"
#include "core/bf16.h"

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

float mg_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1f) {
        x = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);  /* NaN: quiet */
    } else if (e == 0) {
        if (!m) {
            x = sign;
        } else {
            uint32_t sh = 0;
            while (!(m & 0x400u)) { m <<= 1; sh++; }
            x = sign | ((113u - sh) << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    return mg__f32_from_bits(x);
}

uint16_t mg_f32_to_f16(float f)
{
    uint32_t x = mg__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* >= 65520: inf */
    if (ax < 0x38800000u) {                                        /* f16 subnormal */
        if (ax <= 0x33000000u) return (uint16_t)sign;              /* <= 2^-25: 0 */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e, r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

float mg_bf16_to_f32(uint16_t h) { return mg__bf16_to_f32(h); }
uint16_t mg_f32_to_bf16(float f) { return mg__f32_to_bf16(f); }
