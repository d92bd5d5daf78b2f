/* Causal attention in bfloat16 on the tensor cores: the fused kernels of
 * attention.cu (the same tiles of 64 queries and 64 keys, online softmax,
 * the log-sum-exp kept, the backward in two kernels that sum in a fixed
 * order) with their tile products as warp matrix products (wmma: 16 x 16
 * x 16 bfloat16 operands, float sums), taken when bf16 is on.
 *
 * A block has 8 warps. The operands live in shared memory as bfloat16,
 * row-major ([query or key][column]); a warp computes its 16 rows x 16 NT
 * columns of a 64-row product and stores them as floats in shared memory,
 * where the threads read them as the float kernels' threads read their
 * micro-tiles (RT = 4 query rows x 4 keys a thread) for the softmax, its
 * gradient and the output. dK, dV and dQ stay in the warps' accumulators
 * over the tiles; the forward's output stays in the threads' registers,
 * rescaled as the running maximum grows, and adds each tile's P V.
 *
 * Under emu, a warp's product (and its write-out) is computed whole by the
 * warp's first lane on the host, in float from the same bfloat16
 * operands: the same tiles, masks and roundings as on a GPU, not the same
 * last bits (the tensor cores add in an order of their own). Head sizes up
 * to 128, zero-padded to 32, 64 or 128. Limits: the operands go through
 * shared memory between products (FlashAttention-2 keeps the scores in
 * registers), and Q, K, V and dO are rounded from floats as they load. */
#include <type_traits>
#include "device/attention_blocks.h"
#ifdef __CUDACC__
#include <mma.h>
#endif

typedef uint16_t bf;   /* bfloat16's bits */
enum { BPAD = 8, SLD = AB + 4, WARPS = 8 };

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

/* ---- A warp's products ------------------------------------------------------------- *
 * acc: a warp's NT tiles of 16 x 16 side by side, in float. acc_mma adds
 * A B, A 16 x K and B K x 16 NT, bfloat16 in shared memory: A row-major
 * (A(r, k) at a[r lda + k]) or, AT, transposed (a[k lda + r]); B
 * row-major (b[k ldb + c]) or, BT, transposed (b[c ldb + k]). Every lane
 * of the warp calls each; on the host (emu) lane 0 does the warp's work. */
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

template <int NT, int K, bool AT, bool BT>
static HD AINL void acc_mma(warp_acc<NT> &acc, const bf *a, int lda, const bf *b, int ldb,
                            int lane)
{
#ifdef __CUDA_ARCH__
    using namespace nvcuda;
    typedef typename std::conditional<AT, wmma::col_major, wmma::row_major>::type la;
    typedef typename std::conditional<BT, wmma::col_major, wmma::row_major>::type lb;
    const __nv_bfloat16 *A = reinterpret_cast<const __nv_bfloat16 *>(a);
    const __nv_bfloat16 *B = reinterpret_cast<const __nv_bfloat16 *>(b);
    UNROLL
    for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, la> fa;
        wmma::load_matrix_sync(fa, AT ? A + (size_t)k * lda : A + k, lda);
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
                s += from_bf(AT ? a[k * lda + r] : a[r * lda + k]) *
                     from_bf(BT ? b[c * ldb + k] : b[k * ldb + c]);
            acc.c[r][c] += s;
        }
#endif
}

/* c[r ldc + col] = the warp's tiles, in shared memory, for the block
 * after the next barrier. */
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

/* A warp's place in a 64-row product of N columns: its rows 16 (w / 2),
 * its NT = N / 32 tiles from column 16 NT (w % 2). */
static HD inline int warp_row(int tid) { return 16 * (tid / 32 / 2); }
template <int N> static HD inline int warp_col(int tid) { return N / 2 * (tid / 32 % 2); }

/* ---- Tiles ------------------------------------------------------------------------- */

/* Eight bfloat16s, loaded and stored at once. */
struct alignas(16) bf8 {
    uint32_t w[4];
};

static HD inline bf8 ld8(const bf *p)
{
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const bf8 *>(p);
#else
    bf8 v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}

static HD inline void st8(bf *p, const bf8 &v)
{
#ifdef __CUDA_ARCH__
    *reinterpret_cast<bf8 *>(p) = v;
#else
    memcpy(p, &v, sizeof v);
#endif
}

/* dst[r][e] = x's row r0 + r, column e (of head bh at col0), x bfloat16;
 * zero past T or hd. Eight columns at a time where heads are a multiple
 * of 8 wide (then so are the rows and every head's first column). */
template <int HDM, int threads>
static HD AINL void load_bf(bf (*dst)[HDM + BPAD], const att_args &a, const bf *x, int w,
                            int col0, int bh, int r0, int tid)
{
    const bf *base = x + row_at(a, bh, r0, w, col0);
    if (a.hd % 8 == 0) {
        enum { per_row = HDM / 8 };
        int e = tid % per_row * 8;
        for (int r = tid / per_row; r < AB; r += threads / per_row) {
            bf8 v = {};
            if (r0 + r < a.T && e < a.hd) v = ld8(base + (size_t)r * w + e);
            st8(&dst[r][e], v);
        }
        return;
    }
    int e = tid % HDM;
    for (int r = tid / HDM; r < AB; r += threads / HDM)
        dst[r][e] = r0 + r < a.T && e < a.hd ? base[(size_t)r * w + e] : 0;
}

/* The tiles of the backward kernels: a query tile's q and dO with its
 * rows' log-sum-exp and D, a key tile's k and v, the probabilities and the
 * scores' gradient in bfloat16 ([query][key]), the score and dP products
 * in float. */
template <int HDM> struct grad_tiles {
    bf q[AB][HDM + BPAD], dO[AB][HDM + BPAD], k[AB][HDM + BPAD], v[AB][HDM + BPAD];
    bf p[AB][AB + BPAD], ds[AB][AB + BPAD];
    float s[AB][SLD], dp[AB][SLD];   /* also the warps' scratch in finish */
    float lse[AB], D[AB];
};

template <int HDM, int threads>
static HD AINL void load_queries(grad_tiles<HDM> &sh, const att_args &a, int bh, int q0,
                                 int tid)
{
    load_bf<HDM, threads>(sh.q, a, a.qkv16, 3 * a.d, 0, bh, q0, tid);
    load_bf<HDM, threads>(sh.dO, a, a.dy16, a.d, 0, bh, q0, tid);
    load_rows<threads>(sh.lse, a.lse, a, bh, q0, tid);
    load_rows<threads>(sh.D, a.D, a, bh, q0, tid);
}

template <int HDM, int threads>
static HD AINL void load_keys(grad_tiles<HDM> &sh, const att_args &a, int bh, int k0, int tid)
{
    load_bf<HDM, threads>(sh.k, a, a.qkv16, 3 * a.d, a.d, bh, k0, tid);
    load_bf<HDM, threads>(sh.v, a, a.qkv16, 3 * a.d, 2 * a.d, bh, k0, tid);
}

/* The warps: S = Q K^T and dP = dO V^T into s and dp. */
template <int HDM> static HD AINL void score_products(grad_tiles<HDM> &sh, int tid)
{
    int r = warp_row(tid), c = warp_col<AB>(tid), lane = tid % 32;
    warp_acc<2> acc;
    acc_zero(acc, lane);
    acc_mma<2, HDM, false, true>(acc, sh.q[r], HDM + BPAD, sh.k[c], HDM + BPAD, lane);
    acc_store(acc, &sh.s[r][c], SLD, lane);
    acc_zero(acc, lane);
    acc_mma<2, HDM, false, true>(acc, sh.dO[r], HDM + BPAD, sh.v[c], HDM + BPAD, lane);
    acc_store(acc, &sh.dp[r][c], SLD, lane);
}

/* The threads: P = exp(S scale - lse) (when keep_p) and dS = P (dP - D)
 * scale of their micro-tiles into p and ds, zero where the mask hides the
 * key. */
template <int HDM, int RT, bool keep_p>
static HD AINL void probs_and_grads(grad_tiles<HDM> &sh, const att_args &a, int q0, int k0,
                                    int tid)
{
    int ty = tid / 16, tx = tid % 16;
    UNROLL
    for (int i = 0; i < RT; i++)
        UNROLL
        for (int j = 0; j < 4; j++) {
            int r = RT * ty + i, c = tx + 16 * j;
            bool in = visible<RT>(a, q0, k0, ty, tx, i, j);
            float pr = in ? expf(sh.s[r][c] * a.scale - sh.lse[r]) : 0.0f;
            if (keep_p) sh.p[r][c] = to_bf(pr);
            sh.ds[r][c] = to_bf(pr * (sh.dp[r][c] - sh.D[r]) * a.scale);
        }
}

/* Row r0 + r (of head bh, columns col0) of a [n, T, 3d] gradient gets
 * value at column c, none past T or hd. */
static HD inline void put(const att_args &a, int bh, int r0, int col0, int r, int c, float v)
{
    if (r0 + r < a.T && c < a.hd) a.out[row_at(a, bh, r0 + r, 3 * a.d, col0) + c] = v;
}

/* ---- Forward ----------------------------------------------------------------------- */

template <int HDM> struct tc_fwd {
    static constexpr int threads = 32 * WARPS, phases = 6, RT = 4, CJ = HDM / 16;
    static constexpr int OLD = (HDM > AB ? HDM : AB) + 4;
    struct shared {
        bf q[AB][HDM + BPAD], k[AB][HDM + BPAD], v[AB][HDM + BPAD];
        bf p[AB][AB + BPAD];   /* the probabilities (unnormalised) */
        float s[AB][OLD];      /* the scores, then P V */
        float mx[AB][16], sum[AB][16];
    };
    struct thread {
        float m[RT], l[RT], o[RT][CJ], s[RT][4];
    };
    att_args a;

    HD int begin(int) const { return 0; }
    HD int end(int blk) const { return tile_of(a, blk) + 1; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        load_bf<HDM, threads>(sh.q, a, a.qkv16, 3 * a.d, 0, bh_of(a, blk), AB * tile_of(a, blk),
                              tid);
        for (int i = 0; i < RT; i++) {
            t.m[i] = -INFINITY;
            t.l[i] = 0.0f;
            for (int j = 0; j < CJ; j++) t.o[i][j] = 0.0f;
        }
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), k0 = AB * tile;
        int ty = tid / 16, tx = tid % 16, lane = tid % 32, wr = warp_row(tid);
        if (p == 0) {   /* the key tile */
            load_bf<HDM, threads>(sh.k, a, a.qkv16, 3 * a.d, a.d, bh, k0, tid);
            load_bf<HDM, threads>(sh.v, a, a.qkv16, 3 * a.d, 2 * a.d, bh, k0, tid);
        } else if (p == 1) {   /* the warps: S = Q K^T */
            int c = warp_col<AB>(tid);
            warp_acc<2> acc;
            acc_zero(acc, lane);
            acc_mma<2, HDM, false, true>(acc, sh.q[wr], HDM + BPAD, sh.k[c], HDM + BPAD, lane);
            acc_store(acc, &sh.s[wr][c], OLD, lane);
        } else if (p == 2) {   /* scores, masked; each row's part of the maximum */
            UNROLL
            for (int i = 0; i < RT; i++) {
                float m = -INFINITY;
                UNROLL
                for (int j = 0; j < 4; j++) {
                    bool in = visible<RT>(a, q0, k0, ty, tx, i, j);
                    t.s[i][j] = in ? sh.s[RT * ty + i][tx + 16 * j] * a.scale : -INFINITY;
                    m = fmaxf(m, t.s[i][j]);
                }
                sh.mx[RT * ty + i][tx] = m;
            }
        } else if (p == 3) {   /* the new maxima; probabilities, the old sums rescaled */
            UNROLL
            for (int i = 0; i < RT; i++) {
                float m = t.m[i];
                for (int x = 0; x < 16; x++) m = fmaxf(m, sh.mx[RT * ty + i][x]);
                float alpha = m == -INFINITY ? 1.0f : expf(t.m[i] - m), sum = 0.0f;
                t.m[i] = m;
                t.l[i] *= alpha;
                UNROLL
                for (int j = 0; j < CJ; j++) t.o[i][j] *= alpha;
                UNROLL
                for (int j = 0; j < 4; j++) {
                    float e = t.s[i][j] == -INFINITY ? 0.0f : expf(t.s[i][j] - m);
                    sum += e;
                    sh.p[RT * ty + i][tx + 16 * j] = to_bf(e);
                }
                sh.sum[RT * ty + i][tx] = sum;
            }
        } else if (p == 4) {   /* the warps: P V, over the scores */
            int c = warp_col<HDM>(tid);
            warp_acc<HDM / 32> acc;
            acc_zero(acc, lane);
            acc_mma<HDM / 32, AB, false, false>(acc, sh.p[wr], AB + BPAD, &sh.v[0][c],
                                                HDM + BPAD, lane);
            acc_store(acc, &sh.s[wr][c], OLD, lane);
        } else {   /* the sums; o += P V */
            UNROLL
            for (int i = 0; i < RT; i++) {
                for (int x = 0; x < 16; x++) t.l[i] += sh.sum[RT * ty + i][x];
                UNROLL
                for (int j = 0; j < CJ; j++) t.o[i][j] += sh.s[RT * ty + i][tx + 16 * j];
            }
        }
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), ty = tid / 16, tx = tid % 16;
        for (int i = 0; i < RT; i++) {
            int q = q0 + RT * ty + i;
            if (q >= a.T) continue;
            if (tx == 0) a.lse[(size_t)bh * a.T + q] = t.m[i] + logf(t.l[i]);
            float *row = a.out + row_at(a, bh, q, a.d, 0), inv = 1.0f / t.l[i];
            for (int j = 0; j < CJ; j++)
                if (tx + 16 * j < a.hd) row[tx + 16 * j] = t.o[i][j] * inv;
        }
    }
};

/* ---- Backward ---------------------------------------------------------------------- */

/* dK and dV of a key tile: over the query tiles from its own on. */
template <int HDM> struct tc_dkv {
    static constexpr int threads = 32 * WARPS, phases = 4, RT = 4, NT = HDM / 32;
    typedef grad_tiles<HDM> shared;
    struct thread {
        warp_acc<NT> dk, dv;   /* keys warp_row, columns warp_col */
    };
    att_args a;

    HD int begin(int blk) const { return tile_of(a, blk); }
    HD int end(int) const { return a.tiles; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        load_keys<HDM, threads>(sh, a, bh_of(a, blk), AB * tile_of(a, blk), tid);
        acc_zero(t.dk, tid % 32);
        acc_zero(t.dv, tid % 32);
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), k0 = AB * tile_of(a, blk), q0 = AB * tile;
        if (p == 0) {
            load_queries<HDM, threads>(sh, a, bh, q0, tid);
        } else if (p == 1) {
            score_products<HDM>(sh, tid);
        } else if (p == 2) {
            probs_and_grads<HDM, RT, true>(sh, a, q0, k0, tid);
        } else {   /* the warps: dV += P^T dO, dK += dS^T Q */
            int r = warp_row(tid), c = warp_col<HDM>(tid), lane = tid % 32;
            acc_mma<NT, AB, true, false>(t.dv, &sh.p[0][r], AB + BPAD, &sh.dO[0][c], HDM + BPAD,
                                         lane);
            acc_mma<NT, AB, true, false>(t.dk, &sh.ds[0][r], AB + BPAD, &sh.q[0][c], HDM + BPAD,
                                         lane);
        }
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), k0 = AB * tile_of(a, blk), r = warp_row(tid);
        int c = warp_col<HDM>(tid), lane = tid % 32;
        float *scratch = &sh.s[0][0] + tid / 32 * 16 * (16 * NT + 4);
        acc_write<NT>(t.dk, scratch, lane,
                      [&](int i, int j, float v) { put(a, bh, k0, a.d, r + i, c + j, v); });
        acc_write<NT>(t.dv, scratch, lane,
                      [&](int i, int j, float v) { put(a, bh, k0, 2 * a.d, r + i, c + j, v); });
    }
};

/* dQ of a query tile: over the key tiles up to its own. */
template <int HDM> struct tc_dq {
    static constexpr int threads = 32 * WARPS, phases = 4, RT = 4, NT = HDM / 32;
    typedef grad_tiles<HDM> shared;
    struct thread {
        warp_acc<NT> dq;
    };
    att_args a;

    HD int begin(int) const { return 0; }
    HD int end(int blk) const { return tile_of(a, blk) + 1; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        load_queries<HDM, threads>(sh, a, bh_of(a, blk), AB * tile_of(a, blk), tid);
        acc_zero(t.dq, tid % 32);
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), k0 = AB * tile;
        if (p == 0) {
            load_keys<HDM, threads>(sh, a, bh, k0, tid);
        } else if (p == 1) {
            score_products<HDM>(sh, tid);
        } else if (p == 2) {
            probs_and_grads<HDM, RT, false>(sh, a, q0, k0, tid);
        } else {   /* the warps: dQ += dS K */
            int r = warp_row(tid), c = warp_col<HDM>(tid);
            acc_mma<NT, AB, false, false>(t.dq, sh.ds[r], AB + BPAD, &sh.k[0][c], HDM + BPAD,
                                          tid % 32);
        }
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), r = warp_row(tid);
        int c = warp_col<HDM>(tid);
        float *scratch = &sh.s[0][0] + tid / 32 * 16 * (16 * NT + 4);
        acc_write<NT>(t.dq, scratch, tid % 32,
                      [&](int i, int j, float v) { put(a, bh, q0, 0, r + i, c + j, v); });
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
