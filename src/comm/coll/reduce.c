/* Reduction kernels for the collectives: dst = a (op) b over every dtype
 * and op, the multi-source form the shared-memory algorithms use (one pass
 * over p sources, accumulating f16/bf16 in f32 and rounding once), and
 * AVG's final division.
 *
 * The loops are written so GCC vectorises them (-O3 -march=native): one
 * kernel per (type, op, aliasing) with restrict pointers, because a run-
 * time alias check would send the in-place case (dst == a) down the scalar
 * path. f16 uses F16C when the build has it and a portable bit-exact
 * conversion otherwise; bf16 converts with integer arithmetic. Both round
 * to nearest even, as PyTorch does.
 *
 * Semantics: integer SUM/PROD wrap around; float MIN/MAX propagate NaN
 * (as torch.minimum); AVG on integers truncates toward zero (C division,
 * as NCCL's ncclAvg). */
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include "comm/coll/algos.h"
#include "core/bf16.h"

/* ---- block conversions -------------------------------------------------- */

static void half_to_f32(float *restrict d, const void *src, size_t n, mg_dtype t)
{
    const uint16_t *s = src;
    size_t i = 0;
    if (t == MG_BF16) {
        for (; i < n; i++) d[i] = mg__bf16_to_f32(s[i]);
        return;
    }
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
    for (; i < n; i++) d[i] = mg_f16_to_f32(s[i]);
}

static void f32_to_half(void *dst, const float *restrict s, size_t n, mg_dtype t)
{
    uint16_t *d = dst;
    size_t i = 0;
    if (t == MG_BF16) {
        for (; i < n; i++) d[i] = mg__f32_to_bf16(s[i]);
        return;
    }
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) d[i] = mg_f32_to_f16(s[i]);
}

/* ---- native kernels ------------------------------------------------------ */

/* For each type: k3 (d = a op b), k2 (d = d op b) and k2r (d = a op d), all
 * with restrict so that each vectorises without alias checks. U is the
 * type in which SUM/PROD are computed (unsigned for integers, to wrap). */
#define OPS_ARITH(x, y, U, T) ((T)((U)(x) + (U)(y)))
#define OPS_MUL(x, y, U, T) ((T)((U)(x) * (U)(y)))
#define OPS_IMIN(x, y) ((y) < (x) ? (y) : (x))
#define OPS_IMAX(x, y) ((y) > (x) ? (y) : (x))
#define OPS_FMIN(x, y) ((x) != (x) ? (x) : (y) != (y) ? (y) : (y) < (x) ? (y) : (x))
#define OPS_FMAX(x, y) ((x) != (x) ? (x) : (y) != (y) ? (y) : (y) > (x) ? (y) : (x))

#define KERNEL3(name, T, expr)                                                 \
    static void name##_3(T *restrict d, const T *restrict a, const T *restrict b, size_t n) \
    { for (size_t i = 0; i < n; i++) { T x = a[i], y = b[i]; d[i] = (expr); } } \
    static void name##_2(T *restrict d, const T *restrict b, size_t n)         \
    { for (size_t i = 0; i < n; i++) { T x = d[i], y = b[i]; d[i] = (expr); } } \
    static void name##_2r(T *restrict d, const T *restrict a, size_t n)        \
    { for (size_t i = 0; i < n; i++) { T x = a[i], y = d[i]; d[i] = (expr); } }

#define KERNELS(tn, T, U, MIN, MAX)                                            \
    KERNEL3(tn##_sum, T, OPS_ARITH(x, y, U, T))                                \
    KERNEL3(tn##_prod, T, OPS_MUL(x, y, U, T))                                 \
    KERNEL3(tn##_min, T, MIN(x, y))                                            \
    KERNEL3(tn##_max, T, MAX(x, y))

KERNELS(f32, float, float, OPS_FMIN, OPS_FMAX)
KERNELS(f64, double, double, OPS_FMIN, OPS_FMAX)
KERNELS(i32, int32_t, uint32_t, OPS_IMIN, OPS_IMAX)
KERNELS(i64, int64_t, uint64_t, OPS_IMIN, OPS_IMAX)
KERNELS(u8, uint8_t, unsigned, OPS_IMIN, OPS_IMAX)

typedef void (*k3_fn)(void *, const void *, const void *, size_t);
typedef void (*k2_fn)(void *, const void *, size_t);
typedef struct { k3_fn k3; k2_fn k2, k2r; } kset;

#define KSET(name) { (k3_fn)name##_3, (k2_fn)name##_2, (k2_fn)name##_2r }
#define KROW(tn) { KSET(tn##_sum), KSET(tn##_prod), KSET(tn##_min), KSET(tn##_max) }

/* Indexed by the storage type (halves use the f32 row) and the op (AVG as
 * SUM). */
static const kset kernels[MG_DTYPE_COUNT][4] = {
    [MG_F32] = KROW(f32), [MG_F64] = KROW(f64), [MG_F16] = KROW(f32),
    [MG_BF16] = KROW(f32), [MG_I32] = KROW(i32), [MG_I64] = KROW(i64),
    [MG_U8] = KROW(u8),
};

static const kset *kernel_for(mg_dtype t, mg_op op)
{
    MG_ASSERT((unsigned)t < MG_DTYPE_COUNT && (unsigned)op < MG_OP_COUNT);
    return &kernels[t][mg__accop(op)];
}

static int is_half(mg_dtype t) { return t == MG_F16 || t == MG_BF16; }

/* Elements per block when halves go through f32 (or multi-source reduce). */
#define BLK 2048

void mg__reduce3(void *dst, const void *a, const void *b, size_t n, mg_dtype t, mg_op op)
{
    const kset *k = kernel_for(t, op);
    if (!n) return;
    if (!is_half(t)) {
        if (dst == a && dst == b) {
            /* x op x: only through a copy of one operand (tiny blocks). */
            size_t es = mg__dtsize(t);
            _Alignas(64) unsigned char tmp[BLK * 8];
            for (size_t i = 0; i < n; i += BLK) {
                size_t m = n - i < BLK ? n - i : BLK;
                memcpy(tmp, (char *)dst + i * es, m * es);
                k->k2((char *)dst + i * es, tmp, m);
            }
        } else if (dst == a) {
            k->k2(dst, b, n);
        } else if (dst == b) {
            k->k2r(dst, a, n);
        } else {
            k->k3(dst, a, b, n);
        }
        return;
    }
    _Alignas(64) float fa[BLK], fb[BLK];
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        half_to_f32(fa, (const uint16_t *)a + i, m, t);
        half_to_f32(fb, (const uint16_t *)b + i, m, t);
        k->k2(fa, fb, m);
        f32_to_half((uint16_t *)dst + i, fa, m, t);
    }
}

void mg__reduce(void *dst, const void *src, size_t n, mg_dtype t, mg_op op)
{
    mg__reduce3(dst, dst, src, n, t, op);
}

/* d[i] /= div in the type's own arithmetic. */
static void avg_native(void *buf, size_t n, mg_dtype t, int div)
{
    if (t == MG_F32) {
        float *d = buf, v = (float)div;
        for (size_t i = 0; i < n; i++) d[i] /= v;
    } else if (t == MG_F64) {
        double *d = buf, v = div;
        for (size_t i = 0; i < n; i++) d[i] /= v;
    } else if (t == MG_I32) {
        int32_t *d = buf;
        for (size_t i = 0; i < n; i++) d[i] /= div;
    } else if (t == MG_I64) {
        int64_t *d = buf;
        for (size_t i = 0; i < n; i++) d[i] /= div;
    } else {
        MG_ASSERT(t == MG_U8);  /* half types go through f32 */
        uint8_t *d = buf;
        for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(d[i] / (unsigned)div);
    }
}

void mg__reduce_finish(void *buf, size_t n, mg_dtype t, mg_op op, int size)
{
    if (op != MG_AVG || size == 1 || !n) return;
    MG_ASSERT(size > 1);
    if (!is_half(t)) {
        avg_native(buf, n, t, size);
        return;
    }
    _Alignas(64) float f[BLK];
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        half_to_f32(f, (uint16_t *)buf + i, m, t);
        avg_native(f, m, MG_F32, size);
        f32_to_half((uint16_t *)buf + i, f, m, t);
    }
}

/* Copy out of a block; non-temporal when asked and the destination is
 * 32-byte aligned (the tail and unaligned cases use memcpy). */
static void copy_out(void *dst, const void *src, size_t bytes, int nt)
{
#ifdef __AVX__
    if (nt && bytes >= 256 && ((uintptr_t)dst & 31) == 0) {
        size_t i = 0;
        for (; i + 128 <= bytes; i += 128) {
            const char *s = (const char *)src + i;
            char *d = (char *)dst + i;
            __m256i a = _mm256_loadu_si256((const __m256i *)s);
            __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
            __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
            __m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
            _mm256_stream_si256((__m256i *)d, a);
            _mm256_stream_si256((__m256i *)(d + 32), b);
            _mm256_stream_si256((__m256i *)(d + 64), c);
            _mm256_stream_si256((__m256i *)(d + 96), e);
        }
        memcpy((char *)dst + i, (const char *)src + i, bytes - i);
        return;
    }
#endif
    (void)nt;
    memcpy(dst, src, bytes);
}

void mg__copy_nt(void *dst, const void *src, size_t n)
{
    copy_out(dst, src, n, 1);
#ifdef __AVX__
    _mm_sfence();
#endif
}

void mg__reduce_multi(void *const *dst, int nd, const void *const *src, int ns,
                      size_t n, mg_dtype t, mg_op op, int avg_div, int nt_from)
{
    MG_ASSERT(ns >= 1 && nd >= 1);
    const kset *k = kernel_for(t, op);
    size_t es = mg__dtsize(t);
    int half = is_half(t);
    _Alignas(64) unsigned char acc[BLK * 8];
    _Alignas(64) float tmp[BLK];
    _Alignas(64) uint16_t hout[BLK];
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK, off = i * es;
        if (half) {
            half_to_f32((float *)acc, (const char *)src[0] + off, m, t);
            for (int j = 1; j < ns; j++) {
                half_to_f32(tmp, (const char *)src[j] + off, m, t);
                k->k2(acc, tmp, m);
            }
        } else if (ns == 1) {
            memcpy(acc, (const char *)src[0] + off, m * es);
        } else {
            k->k3(acc, (const char *)src[0] + off, (const char *)src[1] + off, m);
            for (int j = 2; j < ns; j++) k->k2(acc, (const char *)src[j] + off, m);
        }
        if (op == MG_AVG && avg_div > 1) avg_native(acc, m, half ? MG_F32 : t, avg_div);
        const void *out = acc;
        if (half) {
            f32_to_half(hout, (const float *)acc, m, t);
            out = hout;
        }
        for (int j = 0; j < nd; j++) copy_out((char *)dst[j] + off, out, m * es, j >= nt_from);
    }
#ifdef __AVX__
    if (nt_from < nd) _mm_sfence();
#endif
}

/* ---- public conversions (comm.h) ----------------------------------------- */

void mg_convert_from_f32(void *dst, mg_dtype t, const float *src, size_t n)
{
    MG_ASSERT(t == MG_F16 || t == MG_BF16);
    f32_to_half(dst, src, n, t);
}

void mg_convert_to_f32(float *dst, const void *src, mg_dtype t, size_t n)
{
    MG_ASSERT(t == MG_F16 || t == MG_BF16);
    half_to_f32(dst, src, n, t);
}
