/* Causal attention in bfloat16 on the tensor cores, taken by the fused
 * path when bf16 is on: the algorithm of attention.cu's float kernels
 * (tiles of 64 queries and 64 keys, online softmax, the log-sum-exp kept,
 * the backward in two kernels that sum in a fixed order) with the tile
 * products as warp matrix products (wmma: 16 x 16 x 16, bfloat16 operands,
 * float sums), in the manner of FlashAttention-2: a block's 4 warps each
 * own 16 rows (queries, or keys for dK and dV), so that between the
 * block's barriers a warp works alone.
 *
 * Per tile, a block waits for the tile's operands (bfloat16 copies of qkv
 * and dy made once per call) and queues the next tile's, which land in
 * shared memory while it computes (cp.async, two buffers); then each warp
 * computes its scores (and dP) as a 16 x 64 product, stores them as floats
 * in shared memory, where its lanes (each a column) take the softmax with
 * its row maxima and sums through shuffles, or the scores' gradient, and
 * write the probabilities (and dS) in bfloat16 for the next product. The
 * forward's output stays in the lanes' registers, rescaled as the running
 * maximum grows; dK, dV and dQ stay in the warps' accumulators.
 *
 * Under emu, each warp's work is done by its first lane on the host (the
 * other lanes' calls return): the products in float from the same
 * bfloat16 operands, a row's lanes folded into one. The same tiles, masks
 * and roundings as on a GPU, not the same last bits (the tensor cores add
 * in an order of their own). Head sizes up to 128, zero-padded to 32, 64
 * or 128 (the asynchronous copies need heads a multiple of 8 wide; others
 * load element by element). Limits: the scores go through shared memory
 * between products (FlashAttention-2 keeps them in registers). */
#include <type_traits>
#include "core/bf16.h"
#include "device/attention_blocks.h"
#ifdef __CUDACC__
#include <mma.h>
#endif

typedef uint16_t bf;   /* bfloat16's bits */
enum { BPAD = 8, SLD = AB + 4, WARPS = 4 };
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

static HD inline void warp_sync(void)
{
#ifdef __CUDA_ARCH__
    __syncwarp();
#endif
}

/* A warp's lanes over its 16 rows of 64 scores (or 16 rows of an
 * output): on a GPU two lanes a row, lane % 16, each half of its columns,
 * lane / 16, a row's maximum and sum combined through one shuffle; on the
 * host (emu) the first lane takes all 16 rows whole. RPL rows a lane,
 * rows in HALVES parts. */
#ifdef __CUDA_ARCH__
enum { RPL = 1, HALVES = 2 };
#else
enum { RPL = 16, HALVES = 1 };
#endif
static HD inline int lane_row(int lane, int i) { return RPL == 1 ? lane % 16 : i; }
static HD inline int lane_half(int lane) { return HALVES == 2 ? lane / 16 : 0; }

static HD inline float pair_max(float v)
{
#ifdef __CUDA_ARCH__
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
#endif
    return v;
}

static HD inline float pair_sum(float v)
{
#ifdef __CUDA_ARCH__
    v += __shfl_xor_sync(0xffffffffu, v, 16);
#endif
    return v;
}

/* p[0..7] = v[0..7] in bfloat16, stored at once on a GPU. */
static HD AINL void st_bf8(bf *p, const float v[8])
{
#ifdef __CUDA_ARCH__
    uint32_t w[4];
    UNROLL
    for (int i = 0; i < 4; i++) w[i] = to_bf(v[2 * i]) | (uint32_t)to_bf(v[2 * i + 1]) << 16;
    *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
#else
    for (int i = 0; i < 8; i++) p[i] = to_bf(v[i]);
#endif
}

/* ---- A warp's products ------------------------------------------------------------- *
 * acc: a warp's NT tiles of 16 x 16 side by side, in float. acc_mma adds
 * A B, A 16 x K and B K x 16 NT, bfloat16 in shared memory: A row-major
 * (A(r, k) at a[r lda + k]), B row-major (b[k ldb + c]) or, BT, transposed
 * (b[c ldb + k]). Every lane of the warp calls each; on the host (emu)
 * lane 0 does the warp's work. */
template <int NT> struct warp_acc {
#ifdef __CUDA_ARCH__
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f[NT];
#else
    float c[16][16 * NT];
#endif
};

template <int NT> static HD AINL void acc_zero(warp_acc<NT> &acc, int lane)
{
#ifdef __CUDA_ARCH__
    UNROLL
    for (int t = 0; t < NT; t++) nvcuda::wmma::fill_fragment(acc.f[t], 0.0f);
#else
    if (lane == 0) memset(acc.c, 0, sizeof acc.c);
#endif
}

template <int NT, int K, bool BT>
static HD AINL void acc_mma(warp_acc<NT> &acc, const bf *a, int lda, const bf *b, int ldb,
                            int lane)
{
#ifdef __CUDA_ARCH__
    using namespace nvcuda;
    typedef typename std::conditional<BT, wmma::col_major, wmma::row_major>::type lb;
    const __nv_bfloat16 *A = reinterpret_cast<const __nv_bfloat16 *>(a);
    const __nv_bfloat16 *B = reinterpret_cast<const __nv_bfloat16 *>(b);
    UNROLL
    for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, A + k, lda);
        UNROLL
        for (int t = 0; t < NT; t++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, lb> fb;
            wmma::load_matrix_sync(fb, BT ? B + (size_t)16 * t * ldb + k
                                          : B + (size_t)k * ldb + 16 * t, ldb);
            wmma::mma_sync(acc.f[t], fa, fb, acc.f[t]);
        }
    }
#else
    if (lane) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16 * NT; c++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += from_bf(a[r * lda + k]) *
                     from_bf(BT ? b[c * ldb + k] : b[k * ldb + c]);
            acc.c[r][c] += s;
        }
#endif
}

/* c[r ldc + col] = the warp's tiles, in shared memory (the warp's lanes
 * read them after a warp_sync). */
template <int NT>
static HD AINL void acc_store(const warp_acc<NT> &acc, float *c, int ldc, int lane)
{
#ifdef __CUDA_ARCH__
    UNROLL
    for (int t = 0; t < NT; t++)
        nvcuda::wmma::store_matrix_sync(c + 16 * t, acc.f[t], ldc, nvcuda::wmma::mem_row_major);
#else
    if (lane == 0)
        for (int r = 0; r < 16; r++) memcpy(c + r * ldc, acc.c[r], sizeof acc.c[r]);
#endif
}

/* out(r, col, value) for each of the warp's values, through its own
 * scratch of 16 x (16 NT + 4) floats in shared memory. */
template <int NT, class F>
static HD AINL void acc_write(const warp_acc<NT> &acc, float *scratch, int lane, F out)
{
    enum { LD = 16 * NT + 4 };
    acc_store<NT>(acc, scratch, LD, lane);
#ifdef __CUDA_ARCH__
    __syncwarp();
    for (int i = lane; i < 16 * 16 * NT; i += 32)
        out(i / (16 * NT), i % (16 * NT), scratch[i / (16 * NT) * LD + i % (16 * NT)]);
    __syncwarp();
#else
    if (lane == 0)
        for (int i = 0; i < 16 * 16 * NT; i++)
            out(i / (16 * NT), i % (16 * NT), scratch[i / (16 * NT) * LD + i % (16 * NT)]);
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

/* A warp's scores s = a b^T, 16 x 64 (a: the warp's 16 rows, b: the
 * tile's 64), floats in shared memory for the warp's lanes (after a
 * warp_sync). */
template <int HDM, int LD>
static HD AINL void scores(float (*s)[LD], const bf (*a)[HDM + BPAD], const bf (*b)[HDM + BPAD],
                           int lane)
{
    warp_acc<4> acc;
    acc_zero(acc, lane);
    acc_mma<4, HDM, true>(acc, a[0], HDM + BPAD, b[0], HDM + BPAD, lane);
    acc_store(acc, s[0], LD, lane);
}

/* The backward's pair: s = a1 b1^T and dp = a2 b2^T (S and dP, or their
 * transposes), then a warp_sync. */
template <int HDM>
static HD AINL void score_pair(float (*s)[SLD], float (*dp)[SLD], const bf (*a1)[HDM + BPAD],
                               const bf (*b1)[HDM + BPAD], const bf (*a2)[HDM + BPAD],
                               const bf (*b2)[HDM + BPAD], int lane)
{
    scores<HDM, SLD>(s, a1, b1, lane);
    scores<HDM, SLD>(dp, a2, b2, lane);
    warp_sync();
}

/* Row r0 + r (of head bh, columns col0) of a [n, T, 3d] gradient gets
 * value at column c, none past T or hd. */
static HD inline void put(const att_args &a, int bh, int r0, int col0, int r, int c, float v)
{
    if (r0 + r < a.T && c < a.hd) a.out[row_at(a, bh, r0 + r, 3 * a.d, col0) + c] = v;
}

/* ---- Forward ----------------------------------------------------------------------- */

/* Phase 0: the key tile's copies complete, the next one's queued; phase
 * 1: a warp's 16 query rows against the tile. */
template <int HDM> struct tc_fwd {
    static constexpr int threads = 32 * WARPS, phases = 2, KC = AB / HALVES, OC = HDM / HALVES;
    static constexpr int OLD = (HDM > AB ? HDM : AB) + 4;
    struct shared {
        bf q[AB][HDM + BPAD];
        bf kv[2][2][AB][HDM + BPAD];   /* [buffer][keys, values] */
        bf p[AB][AB + BPAD];           /* the probabilities (unnormalised) */
        float s[AB][OLD];              /* the scores, then P V */
    };
    struct thread {   /* a lane's rows: the running maximum (base 2) and sum, its half of
                         the output */
        float m[RPL], l[RPL], o[RPL][OC];
    };
    att_args a;

    HD int begin(int) const { return 0; }
    HD int end(int blk) const { return tile_of(a, blk) + 1; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        copy_tile<HDM>(sh.q, a, a.qkv16, 3 * a.d, 0, bh_of(a, blk), AB * tile_of(a, blk), tid);
        copy_keys<HDM>(sh.kv[0], a, bh_of(a, blk), 0, tid);
        copies_commit();
        for (int i = 0; i < RPL; i++) {
            t.m[i] = -INFINITY;
            t.l[i] = 0.0f;
            for (int c = 0; c < OC; c++) t.o[i][c] = 0.0f;
        }
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), k0 = AB * tile;
        if (p == 0) {
            next_keys<HDM>(sh.kv, a, bh, tile, end(blk), tid);
            return;
        }
        int lane = tid % 32, r0 = 16 * (tid / 32), half = lane_half(lane);
        if (lane >= LANES) return;
        const bf(*kv)[AB][HDM + BPAD] = sh.kv[tile % 2];
        float(*s)[OLD] = sh.s + r0;
        scores<HDM, OLD>(s, sh.q + r0, kv[0], lane);   /* S = Q K^T, the warp's rows */
        warp_sync();
        /* the softmax, online: a lane's rows, its half of their keys */
        UNROLL
        for (int i = 0; i < RPL; i++) {
            int k = lane_row(lane, i), q = q0 + r0 + k, c0 = half * KC;
            float x[KC], mx = -INFINITY, scale2 = a.scale * LOG2E;
            UNROLL
            for (int j = 0; j < KC; j += 4) ld4(&s[k][c0 + j], x + j);
            UNROLL
            for (int j = 0; j < KC; j++) {
                x[j] = k0 + c0 + j <= q && q < a.T ? x[j] * scale2 : -INFINITY;
                mx = fmaxf(mx, x[j]);
            }
            float m = fmaxf(t.m[i], pair_max(mx)), sum = 0.0f;
            float alpha = m == -INFINITY ? 1.0f : exp2f(t.m[i] - m);
            UNROLL
            for (int j = 0; j < KC; j++) {
                x[j] = x[j] == -INFINITY ? 0.0f : exp2f(x[j] - m);
                sum += x[j];
            }
            UNROLL
            for (int j = 0; j < KC; j += 8) st_bf8(&sh.p[r0 + k][c0 + j], x + j);
            t.m[i] = m;
            t.l[i] = t.l[i] * alpha + pair_sum(sum);
            UNROLL
            for (int c = 0; c < OC; c++) t.o[i][c] *= alpha;
        }
        warp_sync();
        /* o += P V */
        warp_acc<HDM / 16> pv;
        acc_zero(pv, lane);
        acc_mma<HDM / 16, AB, false>(pv, sh.p[r0], AB + BPAD, kv[1][0], HDM + BPAD, lane);
        acc_store(pv, s[0], OLD, lane);
        warp_sync();
        UNROLL
        for (int i = 0; i < RPL; i++) {
            const float *row = &s[lane_row(lane, i)][half * OC];
            UNROLL
            for (int c = 0; c < OC; c += 4) {
                float v[4];
                ld4(row + c, v);
                for (int e = 0; e < 4; e++) t.o[i][c + e] += v[e];
            }
        }
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), lane = tid % 32, r0 = 16 * (tid / 32);
        int half = lane_half(lane);
        if (lane >= LANES) return;
        for (int i = 0; i < RPL; i++) {
            int q = q0 + r0 + lane_row(lane, i);
            if (q >= a.T) continue;
            if (half == 0) a.lse[(size_t)bh * a.T + q] = t.m[i] * LN2 + logf(t.l[i]);
            float *row = a.out + row_at(a, bh, q, a.d, 0), inv = 1.0f / t.l[i];
            for (int c = 0; c < OC; c++)
                if (half * OC + c < a.hd) row[half * OC + c] = t.o[i][c] * inv;
        }
    }
};

/* ---- Backward ---------------------------------------------------------------------- */

/* dK and dV of a key tile, over the query tiles from its own on: a warp
 * owns 16 keys, computes their scores S^T = K Q^T and dP^T = V dO^T
 * against the query tile, P^T and dS^T, and adds dV += P^T dO, dK +=
 * dS^T Q. */
template <int HDM> struct tc_dkv {
    static constexpr int threads = 32 * WARPS, phases = 2, NT = HDM / 16, KC = AB / HALVES;
    struct shared {
        bf k[AB][HDM + BPAD], v[AB][HDM + BPAD];
        bf qd[2][2][AB][HDM + BPAD];   /* [buffer][queries, dO] */
        float rows[2][2][AB];          /* [buffer][log-sum-exp, D] */
        bf p[AB][AB + BPAD], ds[AB][AB + BPAD];   /* P^T, dS^T: [key][query] */
        float s[AB][SLD], dp[AB][SLD];             /* S^T, dP^T; the warps' scratch at the end */
    };
    struct thread {
        warp_acc<NT> dk, dv;   /* the warp's 16 keys */
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
        acc_zero(t.dk, tid % 32);
        acc_zero(t.dv, tid % 32);
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
        const bf(*q)[HDM + BPAD] = sh.qd[b][0], (*dO)[HDM + BPAD] = sh.qd[b][1];
        score_pair<HDM>(sh.s + r0, sh.dp + r0, sh.k + r0, q, sh.v + r0, dO, lane);
        /* P^T and dS^T: a lane's keys, its half of the queries, 8 at a time */
        int c0 = lane_half(lane) * KC;
        UNROLL
        for (int i = 0; i < RPL; i++) {
            int k = lane_row(lane, i), key = k0 + r0 + k;
            for (int j = c0; j < c0 + KC; j += 8) {
                float sv[8], dv[8], lse[8], D[8];
                for (int h = 0; h < 8; h += 4) {
                    ld4(&sh.s[r0 + k][j + h], sv + h);
                    ld4(&sh.dp[r0 + k][j + h], dv + h);
                    ld4(&sh.rows[b][0][j + h], lse + h);
                    ld4(&sh.rows[b][1][j + h], D + h);
                }
                UNROLL
                for (int e = 0; e < 8; e++) {
                    int qi = q0 + j + e;
                    float x = fmaf(sv[e], a.scale * LOG2E, -lse[e] * LOG2E);
                    sv[e] = key <= qi && qi < a.T ? exp2f(x) : 0.0f;
                    dv[e] = sv[e] * (dv[e] - D[e]) * a.scale;
                }
                st_bf8(&sh.p[r0 + k][j], sv);
                st_bf8(&sh.ds[r0 + k][j], dv);
            }
        }
        warp_sync();
        acc_mma<NT, AB, false>(t.dv, sh.p[r0], AB + BPAD, dO[0], HDM + BPAD, lane);
        acc_mma<NT, AB, false>(t.dk, sh.ds[r0], AB + BPAD, q[0], HDM + BPAD, lane);
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), k0 = AB * tile_of(a, blk), lane = tid % 32, r0 = 16 * (tid / 32);
        if (lane >= LANES) return;
        float *scratch = &sh.s[0][0] + tid / 32 * 16 * (HDM + 4);
        acc_write<NT>(t.dk, scratch, lane,
                      [&](int i, int j, float v) { put(a, bh, k0, a.d, r0 + i, j, v); });
        acc_write<NT>(t.dv, scratch, lane,
                      [&](int i, int j, float v) { put(a, bh, k0, 2 * a.d, r0 + i, j, v); });
    }
};

/* dQ of a query tile, over the key tiles up to its own: a warp owns 16
 * queries, computes their S = Q K^T and dP = dO V^T against the key tile,
 * dS, and adds dQ += dS K. */
template <int HDM> struct tc_dq {
    static constexpr int threads = 32 * WARPS, phases = 2, NT = HDM / 16, KC = AB / HALVES;
    struct shared {
        bf qd[2][AB][HDM + BPAD];      /* the queries, dO */
        float rows[2][AB];             /* the log-sum-exp, D */
        bf kv[2][2][AB][HDM + BPAD];   /* [buffer][keys, values] */
        bf ds[AB][AB + BPAD];          /* [query][key] */
        float s[AB][SLD], dp[AB][SLD];
    };
    struct thread {
        warp_acc<NT> dq;   /* the warp's 16 queries */
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
        acc_zero(t.dq, tid % 32);
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
        const bf(*kv)[AB][HDM + BPAD] = sh.kv[tile % 2];
        score_pair<HDM>(sh.s + r0, sh.dp + r0, sh.qd[0] + r0, kv[0], sh.qd[1] + r0, kv[1], lane);
        /* dS: a lane's queries, its half of the keys, 8 at a time */
        int c0 = lane_half(lane) * KC;
        UNROLL
        for (int i = 0; i < RPL; i++) {
            int k = lane_row(lane, i), qi = q0 + r0 + k;
            float lse2 = sh.rows[0][r0 + k] * LOG2E, D = sh.rows[1][r0 + k];
            for (int j = c0; j < c0 + KC; j += 8) {
                float sv[8], dv[8];
                for (int h = 0; h < 8; h += 4) {
                    ld4(&sh.s[r0 + k][j + h], sv + h);
                    ld4(&sh.dp[r0 + k][j + h], dv + h);
                }
                UNROLL
                for (int e = 0; e < 8; e++) {
                    float x = fmaf(sv[e], a.scale * LOG2E, -lse2);
                    float pr = k0 + j + e <= qi && qi < a.T ? exp2f(x) : 0.0f;
                    dv[e] = pr * (dv[e] - D) * a.scale;
                }
                st_bf8(&sh.ds[r0 + k][j], dv);
            }
        }
        warp_sync();
        acc_mma<NT, AB, false>(t.dq, sh.ds[r0], AB + BPAD, kv[0][0], HDM + BPAD, lane);
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), lane = tid % 32, r0 = 16 * (tid / 32);
        if (lane >= LANES) return;
        float *scratch = &sh.s[0][0] + tid / 32 * 16 * (HDM + 4);
        acc_write<NT>(t.dq, scratch, lane,
                      [&](int i, int j, float v) { put(a, bh, q0, 0, r0 + i, j, v); });
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
