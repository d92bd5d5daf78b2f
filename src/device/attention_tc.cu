/* Causal attention in bfloat16 on the tensor cores, taken by the fused
 * path when bf16 is on: the algorithm of attention.cu's float kernels
 * (tiles of 64 queries and 64 keys, online softmax, the log-sum-exp kept,
 * the backward in two kernels that sum in a fixed order) with the tile
 * products as the tensor cores' warp products (mma.sync m16n8k16,
 * bfloat16 operands, float sums), as FlashAttention-2 does: a block's 4
 * warps each own 16 rows (queries, or keys for dK and dV), so that
 * between the block's barriers a warp works alone, and the scores never
 * leave its registers. The scores' sums are laid out in the lanes as the
 * next product takes its left operand, so the probabilities (and dS) go
 * from a product's sums to the next product's operand in place.
 *
 * Per tile, a block waits for the tile's operands (bfloat16 copies of qkv
 * and dy made once per call) and queues the next tile's, which land in
 * shared memory while it computes (cp.async, two buffers); the warps read
 * the operands from there with ldmatrix. The forward's output and the
 * backward's dK, dV and dQ stay in the warps' sums from the first tile to
 * the last.
 *
 * Under emu, each warp's work is done by its first lane on the host (the
 * other lanes' calls return), which holds the warp's whole 16-row tiles:
 * the products in float from the same bfloat16 operands. The same tiles,
 * masks and roundings as on a GPU, not the same last bits (the tensor
 * cores add in an order of their own). Head sizes up to 128, zero-padded
 * to 32, 64 or 128 (the asynchronous copies need heads a multiple of 8
 * wide; others load element by element). Needs compute capability 8.0
 * (the tensor cores' bfloat16). dS is rounded to bfloat16 unscaled; dK and
 * dQ take the scale after their sums. Limits: blocks of 64 query rows
 * leave a long sequence's short tiles (the first queries see few keys) to
 * finish early. */
#include "core/bf16.h"
#include "device/attention_blocks.h"

typedef uint16_t bf;   /* bfloat16's bits */
enum { BPAD = 8, WARPS = 4 };
#ifdef __CUDA_ARCH__
enum { LANES = 32 };
#else
enum { LANES = 1 };   /* emu: a warp's first lane does the warp's work */
#endif

static HD inline bf to_bf(float x)
{
#ifdef __CUDA_ARCH__
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#else
    return mg__f32_to_bf16(x);
#endif
}

#ifndef __CUDA_ARCH__
static inline float from_bf(bf h) { return mg__bf16_to_f32(h); }   /* emu's products */
#endif

/* ---- A warp's tiles of sums ---------------------------------------------------------- *
 * sums<NT>: a warp's 16 x 8 NT tile of float sums, the result of the
 * tensor cores' m16n8k16 products. On a GPU each lane holds 4 cells of
 * each 8 columns: rows lane / 4 and lane / 4 + 8 (its row slots 0 and 1),
 * columns 2 (lane % 4) and the next; a row is spread over 4 lanes side by
 * side. On the host (emu) the first lane holds all 16 rows (16 slots). */
#ifdef __CUDA_ARCH__
enum { SLOTS = 2 };
#else
enum { SLOTS = 16 };
#endif
template <int NT> struct sums {
    static constexpr int cells = SLOTS == 2 ? 4 * NT : 16 * 8 * NT;
    float f[cells];
};

/* The warp's row r of its slot i. */
static HD inline int slot_row(int lane, int i) { return SLOTS == 2 ? lane / 4 + 8 * i : i; }

/* Whether a lane is the first of its rows' lanes (which writes a row's own value). */
static HD inline bool row_leader(int lane) { return SLOTS == 2 ? lane % 4 == 0 : true; }

/* fn(i, r, c, n) for each of a lane's cells: row slot i, the warp's row r
 * and column c, the cell f[n]. */
template <int NT, class F> static HD AINL void for_cells(int lane, F fn)
{
#ifdef __CUDA_ARCH__
    UNROLL
    for (int j = 0; j < NT; j++)
        UNROLL
        for (int e = 0; e < 4; e++)
            fn(e / 2, lane / 4 + 8 * (e / 2), 8 * j + 2 * (lane % 4) + e % 2, 4 * j + e);
#else
    (void)lane;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8 * NT; c++) fn(r, r, c, r * 8 * NT + c);
#endif
}

template <int NT> static HD AINL void sums_zero(sums<NT> &s)
{
    UNROLL
    for (int n = 0; n < sums<NT>::cells; n++) s.f[n] = 0.0f;
}

/* A row's maximum and sum over the lanes that share it. */
static HD inline float row_max(float v)
{
#ifdef __CUDA_ARCH__
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
#endif
    return v;
}

static HD inline float row_sum(float v)
{
#ifdef __CUDA_ARCH__
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
#endif
    return v;
}

#ifdef __CUDA_ARCH__
/* Four 8 x 8 matrices of bfloat16 from shared memory, lane l giving the
 * address of row l % 8 of matrix l / 8; lane l receives row l / 4,
 * columns 2 (l % 4) and the next, of each (of each transposed, TRANS). */
template <bool TRANS> static __device__ AINL void ldsm4(uint32_t r[4], const bf *p)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

/* c (16 x 8) += a (16 x 16) b (16 x 8), in the tensor cores' lane layout. */
static __device__ AINL void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ AINL uint32_t pack_bf2(float lo, float hi)
{
    return (uint32_t)to_bf(lo) | (uint32_t)to_bf(hi) << 16;
}

/* acc += a B for the k columns k0 .. k0 + 15: B's 16 rows from shared
 * memory, b[c ldb + k] (BT) or b[k ldb + c]. */
template <int NT, bool BT>
static __device__ AINL void mma_k16(sums<NT> &acc, const uint32_t a[4], const bf *b, int ldb,
                                    int k0, int lane)
{
    static_assert(NT % 2 == 0, "B is loaded 16 columns at a time");
    UNROLL
    for (int j = 0; j < NT; j += 2) {
        uint32_t r[4];
        if (BT)
            ldsm4<false>(r, b + (size_t)(8 * j + lane % 8 + lane / 16 * 8) * ldb + k0 +
                                lane / 8 % 2 * 8);
        else
            ldsm4<true>(r, b + (size_t)(k0 + lane % 8 + lane / 8 % 2 * 8) * ldb + 8 * j +
                               lane / 16 * 8);
        mma16816(&acc.f[4 * j], a, r[0], r[1]);
        mma16816(&acc.f[4 * j + 4], a, r[2], r[3]);
    }
}
#else
/* emu: acc += A B, A(r, k) from a(r, k), B(k, c) at b[c ldb + k] (BT) or b[k ldb + c]. */
template <int NT, int K, bool BT, class F>
static void emu_mma(sums<NT> &acc, F a, const bf *b, int ldb)
{
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8 * NT; c++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += a(r, k) * from_bf(BT ? b[c * ldb + k] : b[k * ldb + c]);
            acc.f[r * 8 * NT + c] += s;
        }
}
#endif

/* acc += A B^T, the scores of the warp's 16 rows of A against the 8 NT
 * rows of B, both K wide, bfloat16 in shared memory: A(r, k) at a[r lda
 * + k], B(c, k) at b[c ldb + k]. */
template <int NT, int K>
static HD AINL void mma_shared(sums<NT> &acc, const bf *a, int lda, const bf *b, int ldb,
                               int lane)
{
#ifdef __CUDA_ARCH__
    UNROLL
    for (int k = 0; k < K; k += 16) {
        uint32_t fa[4];
        ldsm4<false>(fa, a + (size_t)(lane % 8 + lane / 8 % 2 * 8) * lda + k + lane / 16 * 8);
        mma_k16<NT, true>(acc, fa, b, ldb, k, lane);
    }
#else
    (void)lane;
    emu_mma<NT, K, true>(acc, [&](int r, int k) { return from_bf(a[r * lda + k]); }, b, ldb);
#endif
}

/* acc += P B, P the warp's own 16 x K sums (the probabilities, or dS)
 * rounded to bfloat16, B K x 8 NT in shared memory: B(k, c) at b[k ldb +
 * c]. On a GPU a lane's cells of P are its operand's cells as they lie. */
template <int NT, int K>
static HD AINL void mma_sums(sums<NT> &acc, const sums<K / 8> &p, const bf *b, int ldb, int lane)
{
#ifdef __CUDA_ARCH__
    UNROLL
    for (int k = 0; k < K; k += 16) {
        const float *c = &p.f[k / 2];   /* the 8-column parts k / 8 and k / 8 + 1 */
        uint32_t fa[4] = {pack_bf2(c[0], c[1]), pack_bf2(c[2], c[3]), pack_bf2(c[4], c[5]),
                          pack_bf2(c[6], c[7])};
        mma_k16<NT, false>(acc, fa, b, ldb, k, lane);
    }
#else
    (void)lane;
    emu_mma<NT, K, false>(acc, [&](int r, int k) { return from_bf(to_bf(p.f[r * K + k])); }, b,
                          ldb);
#endif
}

/* Scores are taken in base 2, S scale log2(e), so that an exponential is
 * one exp2f (as FlashAttention does); the log-sum-exp is kept in natural
 * units, as the float kernels and the CPU keep it. */
static constexpr float LOG2E = 1.44269504088896341f, LN2 = 0.693147180559945309f;

/* ---- Tiles ------------------------------------------------------------------------- */

/* N (16 or 4) bytes from global memory into shared memory: on a GPU
 * queued (cp.async; 16 bytes past L1) and complete once
 * copies_wait_but_last says so, on the host at once. zero16: 16 bytes of
 * zeros, at once. */
template <int N> static HD AINL void copy_async(void *dst, const void *src)
{
    static_assert(N == 16 || N == 4, "cp.async copies 16 or 4 bytes here");
#ifdef __CUDA_ARCH__
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    if (N == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src));
#else
    memcpy(dst, src, N);
#endif
}

static HD AINL void zero16(void *dst)
{
#ifdef __CUDA_ARCH__
    *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
#else
    memset(dst, 0, 16);
#endif
}

/* The copies queued so far form a group; then wait until all groups but
 * the last are complete (each thread its own: a barrier must follow). */
static HD AINL void copies_commit(void)
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

static HD AINL void copies_wait_but_last(void)
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group 1;\n" ::);
#endif
}

/* dst[r][e] = x's row r0 + r, column e (of head bh at col0), x bfloat16;
 * zero past T or hd. Eight columns a copy where heads are a multiple of
 * 8 wide (then so are the rows and every head's first column). */
template <int HDM>
static HD AINL void copy_tile(bf (*dst)[HDM + BPAD], const att_args &a, const bf *x, int w,
                              int col0, int bh, int r0, int tid)
{
    enum { threads = 32 * WARPS };
    const bf *base = x + row_at(a, bh, r0, w, col0);
    if (a.hd % 8 == 0) {
        enum { per_row = HDM / 8 };
        int e = tid % per_row * 8;
        for (int r = tid / per_row; r < AB; r += threads / per_row) {
            if (r0 + r < a.T && e < a.hd) copy_async<16>(&dst[r][e], base + (size_t)r * w + e);
            else zero16(&dst[r][e]);
        }
        return;
    }
    int e = tid % HDM;
    for (int r = tid / HDM; r < AB; r += threads / HDM)
        dst[r][e] = r0 + r < a.T && e < a.hd ? base[(size_t)r * w + e] : 0;
}

/* A row's value (lse or D) per row r0 + r; 0 past T. */
static HD AINL void copy_rows(float *dst, const float *v, const att_args &a, int bh, int r0,
                              int tid)
{
    for (int r = tid; r < AB; r += 32 * WARPS) {
        if (r0 + r < a.T) copy_async<4>(&dst[r], &v[(size_t)bh * a.T + r0 + r]);
        else dst[r] = 0.0f;
    }
}

/* Key tile k0's keys and values into kv[0] and kv[1]. */
template <int HDM>
static HD AINL void copy_keys(bf (*kv)[AB][HDM + BPAD], const att_args &a, int bh, int k0,
                              int tid)
{
    copy_tile<HDM>(kv[0], a, a.qkv16, 3 * a.d, a.d, bh, k0, tid);
    copy_tile<HDM>(kv[1], a, a.qkv16, 3 * a.d, 2 * a.d, bh, k0, tid);
}

/* Phase 0 of a tile over keys (the forward, dQ): the next tile's keys and
 * values copied in behind this one's, which is then waited for. kv: the
 * two buffers, tile t's in kv[t % 2]. */
template <int HDM>
static HD AINL void next_keys(bf (*kv)[2][AB][HDM + BPAD], const att_args &a, int bh, int tile,
                              int end, int tid)
{
    if (tile + 1 < end) copy_keys<HDM>(kv[(tile + 1) % 2], a, bh, AB * (tile + 1), tid);
    copies_commit();
    copies_wait_but_last();
}

/* Query tile q0's queries and output gradients into qd[0] and qd[1],
 * their rows' log-sum-exp and D into rows[0] and rows[1]. */
template <int HDM>
static HD AINL void copy_queries(bf (*qd)[AB][HDM + BPAD], float (*rows)[AB], const att_args &a,
                                 int bh, int q0, int tid)
{
    copy_tile<HDM>(qd[0], a, a.qkv16, 3 * a.d, 0, bh, q0, tid);
    copy_tile<HDM>(qd[1], a, a.dy16, a.d, 0, bh, q0, tid);
    copy_rows(rows[0], a.lse, a, bh, q0, tid);
    copy_rows(rows[1], a.D, a, bh, q0, tid);
}

/* Row r0 + r (of head bh, columns col0) of a [n, T, 3d] gradient gets
 * value at column c, none past T or hd. */
static HD inline void put(const att_args &a, int bh, int r0, int col0, int r, int c, float v)
{
    if (r0 + r < a.T && c < a.hd) a.out[row_at(a, bh, r0 + r, 3 * a.d, col0) + c] = v;
}

/* Scores that are hidden (a key after its query, or a query past T) to
 * -inf: the warp's rows are queries row0 + r and its columns keys col0 +
 * c, or, KEY_ROWS, the other way round. Nothing to do, and no cell
 * looked at, where every key comes before every query (a tile off the
 * diagonal, not the last). */
template <int NT, bool KEY_ROWS>
static HD AINL void mask_hidden(sums<NT> &s, const att_args &a, int row0, int col0, int lane)
{
    int row1 = row0 + 15, col1 = col0 + 8 * NT - 1;
    int first_q = KEY_ROWS ? col0 : row0, last_q = KEY_ROWS ? col1 : row1;
    if ((KEY_ROWS ? row1 : col1) <= first_q && last_q < a.T) return;
    for_cells<NT>(lane, [&](int, int r, int c, int n) {
        int q = KEY_ROWS ? col0 + c : row0 + r, k = KEY_ROWS ? row0 + r : col0 + c;
        if (k > q || q >= a.T) s.f[n] = -INFINITY;
    });
}

/* ---- Forward ----------------------------------------------------------------------- */

/* Phase 0: the key tile's copies complete, the next one's queued; phase
 * 1: a warp's 16 query rows against the tile. */
template <int HDM> struct tc_fwd {
    static constexpr int threads = 32 * WARPS, phases = 2, LD = HDM + BPAD;
    struct shared {
        bf q[AB][LD];
        bf kv[2][2][AB][LD];   /* [buffer][keys, values] */
    };
    struct thread {   /* a lane's rows: the running maximum (base 2) and sum; its output cells */
        float m[SLOTS], l[SLOTS];
        sums<HDM / 8> o;
    };
    att_args a;

    HD int begin(int) const { return 0; }
    HD int end(int blk) const { return tile_of(a, blk) + 1; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        copy_tile<HDM>(sh.q, a, a.qkv16, 3 * a.d, 0, bh_of(a, blk), AB * tile_of(a, blk), tid);
        copy_keys<HDM>(sh.kv[0], a, bh_of(a, blk), 0, tid);
        copies_commit();
        for (int i = 0; i < SLOTS; i++) t.m[i] = -INFINITY, t.l[i] = 0.0f;
        sums_zero(t.o);
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), k0 = AB * tile;
        if (p == 0) {
            next_keys<HDM>(sh.kv, a, bh, tile, end(blk), tid);
            return;
        }
        int lane = tid % 32, r0 = 16 * (tid / 32);
        if (lane >= LANES) return;
        const bf(*kv)[AB][LD] = sh.kv[tile % 2];
        sums<AB / 8> s;   /* S = Q K^T, the warp's rows */
        sums_zero(s);
        mma_shared<AB / 8, HDM>(s, sh.q[r0], LD, kv[0][0], LD, lane);
        mask_hidden<AB / 8, false>(s, a, q0 + r0, k0, lane);
        /* the softmax, online, in base 2: the maxima of the raw scores, scaled
         * (the scale is positive); an exponential one fmaf and one exp2f */
        float mx[SLOTS], sum[SLOTS], alpha[SLOTS], mu[SLOTS], scale2 = a.scale * LOG2E;
        for (int i = 0; i < SLOTS; i++) mx[i] = -INFINITY, sum[i] = 0.0f;
        for_cells<AB / 8>(lane, [&](int i, int, int, int n) { mx[i] = fmaxf(mx[i], s.f[n]); });
        UNROLL
        for (int i = 0; i < SLOTS; i++) {
            float m = fmaxf(t.m[i], row_max(mx[i]) * scale2);
            alpha[i] = m == -INFINITY ? 1.0f : exp2f(t.m[i] - m);
            t.m[i] = m;
            mu[i] = m == -INFINITY ? 0.0f : m;   /* a row with no key seen yet: zeros */
        }
        for_cells<AB / 8>(lane, [&](int i, int, int, int n) {
            s.f[n] = exp2f(fmaf(s.f[n], scale2, -mu[i]));
            sum[i] += s.f[n];
        });
        UNROLL
        for (int i = 0; i < SLOTS; i++) t.l[i] = t.l[i] * alpha[i] + row_sum(sum[i]);
        for_cells<HDM / 8>(lane, [&](int i, int, int, int n) { t.o.f[n] *= alpha[i]; });
        mma_sums<HDM / 8, AB>(t.o, s, kv[1][0], LD, lane);   /* O += P V */
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), lane = tid % 32, r0 = 16 * (tid / 32);
        if (lane >= LANES) return;
        UNROLL
        for (int i = 0; i < SLOTS; i++) {
            int q = q0 + r0 + slot_row(lane, i);
            if (q < a.T && row_leader(lane))
                a.lse[(size_t)bh * a.T + q] = t.m[i] * LN2 + logf(t.l[i]);
        }
        for_cells<HDM / 8>(lane, [&](int i, int r, int c, int n) {
            int q = q0 + r0 + r;
            if (q < a.T && c < a.hd) a.out[row_at(a, bh, q, a.d, 0) + c] = t.o.f[n] / t.l[i];
        });
    }
};

/* ---- Backward ---------------------------------------------------------------------- */

/* dK and dV of a key tile, over the query tiles from its own on: a warp
 * owns 16 keys, computes their scores S^T = K Q^T and dP^T = V dO^T
 * against the query tile, P^T and dS^T in place, and adds dV += P^T dO,
 * dK += dS^T Q. */
template <int HDM> struct tc_dkv {
    static constexpr int threads = 32 * WARPS, phases = 2, LD = HDM + BPAD;
    struct shared {
        bf k[AB][LD], v[AB][LD];
        bf qd[2][2][AB][LD];    /* [buffer][queries, dO] */
        float rows[2][2][AB];   /* [buffer][log-sum-exp, D] */
    };
    struct thread {
        sums<HDM / 8> dk, dv;   /* the warp's 16 keys */
    };
    att_args a;

    HD int begin(int blk) const { return tile_of(a, blk); }
    HD int end(int) const { return a.tiles; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), k0 = AB * tile_of(a, blk);
        copy_tile<HDM>(sh.k, a, a.qkv16, 3 * a.d, a.d, bh, k0, tid);
        copy_tile<HDM>(sh.v, a, a.qkv16, 3 * a.d, 2 * a.d, bh, k0, tid);
        copy_queries<HDM>(sh.qd[begin(blk) % 2], sh.rows[begin(blk) % 2], a, bh, k0, tid);
        copies_commit();
        sums_zero(t.dk);
        sums_zero(t.dv);
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), k0 = AB * tile_of(a, blk), q0 = AB * tile, b = tile % 2;
        if (p == 0) {
            if (tile + 1 < end(blk))
                copy_queries<HDM>(sh.qd[1 - b], sh.rows[1 - b], a, bh, q0 + AB, tid);
            copies_commit();
            copies_wait_but_last();
            return;
        }
        int lane = tid % 32, r0 = 16 * (tid / 32);
        if (lane >= LANES) return;
        const bf(*q)[LD] = sh.qd[b][0], (*dO)[LD] = sh.qd[b][1];
        const float *lse = sh.rows[b][0], *D = sh.rows[b][1];
        sums<AB / 8> s, dp;   /* S^T, dP^T: [key][query], then P^T, dS^T */
        sums_zero(s);
        sums_zero(dp);
        mma_shared<AB / 8, HDM>(s, sh.k[r0], LD, q[0], LD, lane);
        mma_shared<AB / 8, HDM>(dp, sh.v[r0], LD, dO[0], LD, lane);
        mask_hidden<AB / 8, true>(s, a, k0 + r0, q0, lane);
        for_cells<AB / 8>(lane, [&](int, int, int c, int n) {
            s.f[n] = exp2f(fmaf(s.f[n], a.scale * LOG2E, -lse[c] * LOG2E));
            dp.f[n] = s.f[n] * (dp.f[n] - D[c]);   /* dS^T / scale */
        });
        mma_sums<HDM / 8, AB>(t.dv, s, dO[0], LD, lane);
        mma_sums<HDM / 8, AB>(t.dk, dp, q[0], LD, lane);
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &) const
    {
        int bh = bh_of(a, blk), k0 = AB * tile_of(a, blk), lane = tid % 32, r0 = 16 * (tid / 32);
        if (lane >= LANES) return;
        for_cells<HDM / 8>(lane, [&](int, int r, int c, int n) {
            put(a, bh, k0, a.d, r0 + r, c, t.dk.f[n] * a.scale);
            put(a, bh, k0, 2 * a.d, r0 + r, c, t.dv.f[n]);
        });
    }
};

/* dQ of a query tile, over the key tiles up to its own: a warp owns 16
 * queries, computes their S = Q K^T and dP = dO V^T against the key tile,
 * dS in place, and adds dQ += dS K. */
template <int HDM> struct tc_dq {
    static constexpr int threads = 32 * WARPS, phases = 2, LD = HDM + BPAD;
    struct shared {
        bf qd[2][AB][LD];      /* the queries, dO */
        float rows[2][AB];     /* the log-sum-exp, D */
        bf kv[2][2][AB][LD];   /* [buffer][keys, values] */
    };
    struct thread {
        sums<HDM / 8> dq;   /* the warp's 16 queries */
    };
    att_args a;

    HD int begin(int) const { return 0; }
    HD int end(int blk) const { return tile_of(a, blk) + 1; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk);
        copy_queries<HDM>(sh.qd, sh.rows, a, bh, q0, tid);
        copy_keys<HDM>(sh.kv[0], a, bh, 0, tid);
        copies_commit();
        sums_zero(t.dq);
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), k0 = AB * tile;
        if (p == 0) {
            next_keys<HDM>(sh.kv, a, bh, tile, end(blk), tid);
            return;
        }
        int lane = tid % 32, r0 = 16 * (tid / 32);
        if (lane >= LANES) return;
        const bf(*kv)[AB][LD] = sh.kv[tile % 2];
        sums<AB / 8> s, dp;   /* S, dP: [query][key], then dS */
        sums_zero(s);
        sums_zero(dp);
        mma_shared<AB / 8, HDM>(s, sh.qd[0][r0], LD, kv[0][0], LD, lane);
        mma_shared<AB / 8, HDM>(dp, sh.qd[1][r0], LD, kv[1][0], LD, lane);
        float lse2[SLOTS], D[SLOTS];
        UNROLL
        for (int i = 0; i < SLOTS; i++) {
            lse2[i] = sh.rows[0][r0 + slot_row(lane, i)] * LOG2E;
            D[i] = sh.rows[1][r0 + slot_row(lane, i)];
        }
        mask_hidden<AB / 8, false>(s, a, q0 + r0, k0, lane);
        for_cells<AB / 8>(lane, [&](int i, int, int, int n) {
            s.f[n] = exp2f(fmaf(s.f[n], a.scale * LOG2E, -lse2[i])) * (dp.f[n] - D[i]);
        });   /* dS / scale */
        mma_sums<HDM / 8, AB>(t.dq, s, kv[0][0], LD, lane);
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), lane = tid % 32, r0 = 16 * (tid / 32);
        if (lane >= LANES) return;
        for_cells<HDM / 8>(lane, [&](int, int r, int c, int n) {
            put(a, bh, q0, 0, r0 + r, c, t.dq.f[n] * a.scale);
        });
    }
};

/* ---- Entry points ------------------------------------------------------------------ */

template <template <int> class K> static void launch_tc(int width, int n, const att_args &a)
{
    int blocks = n * a.H * a.tiles;
    if (width == 32) block_kernel(blocks, K<32>{a});
    else if (width == 64) block_kernel(blocks, K<64>{a});
    else block_kernel(blocks, K<128>{a});
}

/* x's n floats in bfloat16, in the workspace from byte `at` on. */
static const bf *rounded(const float *x, size_t n, size_t at, size_t bytes)
{
    bf *r = (bf *)((char *)dk_ws(bytes) + at);
    each(n, [=] HD(size_t i) { r[i] = to_bf(x[i]); });
    return r;
}

void attention_tc_forward(int width, int n, const att_args &a)
{
    att_args b = a;
    size_t nqkv = (size_t)n * a.T * 3 * a.d;
    b.qkv16 = rounded(a.qkv, nqkv, 0, nqkv * sizeof(bf));
    launch_tc<tc_fwd>(width, n, b);
}

void attention_tc_backward(int width, int n, const att_args &a)
{
    att_args b = a;
    size_t nqkv = (size_t)n * a.T * 3 * a.d, ndy = (size_t)n * a.T * a.d;
    size_t bytes = (nqkv + ndy) * sizeof(bf);
    dk_ws(bytes);
    b.qkv16 = rounded(a.qkv, nqkv, 0, bytes);
    b.dy16 = rounded(a.dy, ndy, nqkv * sizeof(bf), bytes);
    launch_tc<tc_dkv>(width, n, b);
    launch_tc<tc_dq>(width, n, b);
}
