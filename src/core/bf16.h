/* Internal: bf16 <-> f32, inline so that the reduction kernels' loops
 * (src/comm/coll/reduce.c) vectorise through them; everyone else calls
 * mg_bf16_to_f32 and mg_f32_to_bf16 (core.h), which are these. Rounds to
 * nearest even; NaN stays NaN (quiet). */
#ifndef MG_CORE_BF16_H
#define MG_CORE_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t mg__f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static inline float mg__f32_from_bits(uint32_t x)
{
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline float mg__bf16_to_f32(uint16_t h) { return mg__f32_from_bits((uint32_t)h << 16); }

static inline uint16_t mg__f32_to_bf16(float f)
{
    uint32_t u = mg__f32_bits(f);
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? ((u >> 16) | 0x40u)
                                                        : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}

#endif
