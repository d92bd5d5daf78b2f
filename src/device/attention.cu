/* Causal self-attention on a device (dk.h's mg_dk_attention_*): a fused
 * kernel in the manner of FlashAttention-2, and batched GEMMs that keep
 * the T x T probabilities, as PyTorch's eager attention does. MG_ATTENTION
 * chooses; by default (auto) in float32 the GEMMs up to 512 positions,
 * where cuBLAS made them faster on an H100, and the fused kernel above,
 * where it is as fast and its memory grows with T, not T^2; in bfloat16
 * the fused path (attention_tc.cu's tensor-core kernels) at any length,
 * faster than the GEMMs at every length measured (docs/PERFORMANCE.md,
 * issue 36). The precision the buffers were sized for chooses the path,
 * the current one the kernels. Heads over 128 wide always take the GEMMs.
 *
 * The fused kernel never writes the T x T scores. A block takes 64 query
 * rows of one sequence's head and walks the key tiles of 64 that the
 * causal mask leaves (online softmax: a running maximum and sum per row,
 * the output rescaled as they grow); it keeps each row's log-sum-exp for
 * the backward, as the CPU's kernel does. The backward recomputes the
 * probabilities from it in two kernels: one per key tile (dK, dV, over
 * the query tiles after it), one per query tile (dQ, over the key tiles
 * before it). FlashAttention-2 adds dQ's parts with atomic adds; the
 * second kernel costs three more tile products but sums every gradient in
 * a fixed order, so a run repeats bit for bit.
 *
 * The tiles live in shared memory, transposed where a thread reads a
 * column of rows at once; a thread owns RT query rows (MG_ATTENTION_ROWS,
 * 4 or 8) of 4 keys of the scores (keys tx, tx + 16, tx + 32, tx + 48) and
 * of the outputs RT rows x hd/16 columns. Row maxima and sums go through
 * shared memory. Head sizes up to 128 (zero-padded to 32, 64 or 128).
 * These kernels multiply in float FMAs; with bf16 on, the fused path is
 * attention_tc.cu's, the same algorithm on the tensor cores.
 *
 * Each kernel is a struct of phases (block_kernel, attention_blocks.h):
 * on a GPU the threads run a phase and meet at a barrier; under the device
 * kind emu the host runs each phase for all the block's threads in turn,
 * so the very same indexing, masks and arithmetic are tested where there
 * is no GPU. */
#include "device/attention_blocks.h"

/* ---- The fused kernels' float tiles ---------------------------------------------- */

/* dst[e][r] (or dst[r][e] when !transposed) = x's row r0 + r, column e
 * (of head bh at col0); zero past T or hd. A thread keeps its
 * column: threads is a multiple of HDM. */
template <int HDM, int threads, bool transposed, int ld>
static HD AINL void load_tile(float (*dst)[ld], const att_args &a, const float *x, int w,
                              int col0, int bh, int r0, int tid)
{
    const float *base = x + row_at(a, bh, r0, w, col0);
    int e = tid % HDM;
    for (int r = tid / HDM; r < AB; r += threads / HDM) {
        float v = r0 + r < a.T && e < a.hd ? base[(size_t)r * w + e] : 0.0f;
        if (transposed) dst[e][r] = v;
        else dst[r][e] = v;
    }
}

/* s[i][j] = sum_e A[e][RT ty + i] B[e][tx + 16 j]: a thread's micro-tile
 * of the product of two transposed tiles (RT rows, 4 keys). */
template <int HDM, int RT>
static HD AINL void micro(float s[RT][4], const float (*A)[APAD], const float (*B)[APAD], int ty,
                          int tx)
{
    UNROLL
    for (int i = 0; i < RT; i++)
        UNROLL
        for (int j = 0; j < 4; j++) s[i][j] = 0.0f;
    UNROLL_4
    for (int e = 0; e < HDM; e++) {
        float q[RT], k[4];
        UNROLL
        for (int g = 0; g < RT; g += 4) ld4(&A[e][RT * ty + g], q + g);
        UNROLL
        for (int j = 0; j < 4; j++) k[j] = B[e][tx + 16 * j];
        UNROLL
        for (int i = 0; i < RT; i++)
            UNROLL
            for (int j = 0; j < 4; j++) s[i][j] += q[i] * k[j];
    }
}

/* acc[i][j] += sum_c At[c][RT ty + i] b(c, j): a thread's RT rows x CJ
 * columns of a product whose left side is a transposed tile. */
template <int RT, int CJ, class B>
static HD AINL void accumulate(float acc[RT][CJ], const float (*At)[APAD], int ty, B b)
{
    UNROLL_4
    for (int c = 0; c < AB; c++) {
        float x[RT];
        UNROLL
        for (int g = 0; g < RT; g += 4) ld4(&At[c][RT * ty + g], x + g);
        UNROLL
        for (int j = 0; j < CJ; j++) {
            float v = b(c, j);
            UNROLL
            for (int i = 0; i < RT; i++) acc[i][j] += x[i] * v;
        }
    }
}

/* A thread's RT x CJ results into rows r0 + RT ty + i, columns col0 +
 * tx + 16 j of the [n, T, w]-wide array x (head bh's columns), each
 * times scale[i] (NULL: 1); none past T or hd. */
template <int RT, int CJ>
static HD AINL void store_tile(const float (*acc)[CJ], const float *scale, const att_args &a,
                               float *x, int w, int col0, int bh, int r0, int ty, int tx)
{
    for (int i = 0; i < RT; i++) {
        if (r0 + RT * ty + i >= a.T) continue;
        float *row = x + row_at(a, bh, r0 + RT * ty + i, w, col0), s = scale ? scale[i] : 1.0f;
        for (int j = 0; j < CJ; j++)
            if (tx + 16 * j < a.hd) row[tx + 16 * j] = acc[i][j] * s;
    }
}

/* ---- Forward ----------------------------------------------------------------------- */

/* RT query rows a thread: 16 (AB / RT) threads. */
template <int HDM, int RT> struct att_fwd {
    static constexpr int threads = 16 * (AB / RT), phases = 4, CJ = HDM / 16;
    struct shared {
        float qt[HDM][APAD];   /* the block's queries, transposed */
        float kt[HDM][APAD];   /* a tile's keys, transposed */
        float pt[AB][APAD];    /* its probabilities (unnormalised), transposed */
        float v[AB][HDM];      /* its values */
        float mx[AB][16], sum[AB][16];   /* the 16 threads' row maxima and sums */
    };
    struct thread {
        float m[RT], l[RT], o[RT][CJ], s[RT][4];
    };
    att_args a;

    HD int begin(int) const { return 0; }
    HD int end(int blk) const { return tile_of(a, blk) + 1; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        load_tile<HDM, threads, true>(sh.qt, a, a.qkv, 3 * a.d, 0, bh_of(a, blk),
                                AB * tile_of(a, blk), tid);
        for (int i = 0; i < RT; i++) {
            t.m[i] = -INFINITY;
            t.l[i] = 0.0f;
            for (int j = 0; j < CJ; j++) t.o[i][j] = 0.0f;
        }
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), k0 = AB * tile;
        int ty = tid / 16, tx = tid % 16;
        if (p == 0) {   /* the key tile */
            load_tile<HDM, threads, true>(sh.kt, a, a.qkv, 3 * a.d, a.d, bh, k0, tid);
            load_tile<HDM, threads, false>(sh.v, a, a.qkv, 3 * a.d, 2 * a.d, bh, k0, tid);
        } else if (p == 1) {   /* scores, masked; each row's part of the maximum */
            micro<HDM, RT>(t.s, sh.qt, sh.kt, ty, tx);
            UNROLL
            for (int i = 0; i < RT; i++) {
                float m = -INFINITY;
                UNROLL
                for (int j = 0; j < 4; j++) {
                    bool in = visible<RT>(a, q0, k0, ty, tx, i, j);
                    t.s[i][j] = in ? t.s[i][j] * a.scale : -INFINITY;
                    m = fmaxf(m, t.s[i][j]);
                }
                sh.mx[RT * ty + i][tx] = m;
            }
        } else if (p == 2) {   /* the new maxima; probabilities, the old sums rescaled */
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
                    t.s[i][j] = e;
                }
                sh.sum[RT * ty + i][tx] = sum;
            }
            UNROLL
            for (int j = 0; j < 4; j++)
                UNROLL
                for (int g = 0; g < RT; g += 4) {
                    float col[4] = {t.s[g][j], t.s[g + 1][j], t.s[g + 2][j], t.s[g + 3][j]};
                    st4(&sh.pt[tx + 16 * j][RT * ty + g], col);
                }
        } else {   /* the sums; o += P V */
            UNROLL
            for (int i = 0; i < RT; i++)
                for (int x = 0; x < 16; x++) t.l[i] += sh.sum[RT * ty + i][x];
            accumulate<RT, CJ>(t.o, sh.pt, ty,
                               [&](int c, int j) { return sh.v[c][tx + 16 * j]; });
        }
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), ty = tid / 16, tx = tid % 16;
        float inv[RT];
        for (int i = 0; i < RT; i++) {
            inv[i] = 1.0f / t.l[i];
            if (tx == 0 && q0 + RT * ty + i < a.T)
                a.lse[(size_t)bh * a.T + q0 + RT * ty + i] = t.m[i] + logf(t.l[i]);
        }
        store_tile<RT, CJ>(t.o, inv, a, a.out, a.d, 0, bh, q0, ty, tx);
    }
};

/* ---- Backward ---------------------------------------------------------------------- */

/* The probabilities P and the scores' gradient dS = P (dP - D) scale of a
 * thread's micro-tile, dP = dO V^T, both from the transposed tiles; zero
 * where the mask hides the key. */
template <int HDM, int RT>
static HD AINL void grad_tile(const att_args &a, float p[RT][4], float ds[RT][4],
                              const float (*qt)[APAD], const float (*kt)[APAD],
                              const float (*dot)[APAD], const float (*vt)[APAD],
                              const float *lse, const float *D, int q0, int k0, int ty, int tx)
{
    micro<HDM, RT>(p, qt, kt, ty, tx);
    micro<HDM, RT>(ds, dot, vt, ty, tx);
    UNROLL
    for (int i = 0; i < RT; i++)
        UNROLL
        for (int j = 0; j < 4; j++) {
            bool in = visible<RT>(a, q0, k0, ty, tx, i, j);
            float pr = in ? expf(p[i][j] * a.scale - lse[RT * ty + i]) : 0.0f;
            p[i][j] = pr;
            ds[i][j] = pr * (ds[i][j] - D[RT * ty + i]) * a.scale;
        }
}

/* The backward kernels' tiles (S: their shared memory): a query tile's
 * q and dO transposed with its rows' log-sum-exp and D, and a key tile's
 * k and v transposed. */
template <int HDM, int threads, class S>
static HD AINL void load_queries(S &sh, const att_args &a, int bh, int q0, int tid)
{
    load_tile<HDM, threads, true>(sh.qt, a, a.qkv, 3 * a.d, 0, bh, q0, tid);
    load_tile<HDM, threads, true>(sh.dot, a, a.dy, a.d, 0, bh, q0, tid);
    load_rows<threads>(sh.lse, a.lse, a, bh, q0, tid);
    load_rows<threads>(sh.D, a.D, a, bh, q0, tid);
}

template <int HDM, int threads, class S>
static HD AINL void load_keys(S &sh, const att_args &a, int bh, int k0, int tid)
{
    load_tile<HDM, threads, true>(sh.kt, a, a.qkv, 3 * a.d, a.d, bh, k0, tid);
    load_tile<HDM, threads, true>(sh.vt, a, a.qkv, 3 * a.d, 2 * a.d, bh, k0, tid);
}

/* dK and dV of a key tile: over the query tiles from its own on. */
template <int HDM, int RT> struct att_dkv {
    static constexpr int threads = 16 * (AB / RT), phases = 3, CJ = HDM / 16;
    struct shared {
        float kt[HDM][APAD], vt[HDM][APAD];    /* the block's keys and values, transposed */
        float qt[HDM][APAD], dot[HDM][APAD];   /* a query tile's q and dO, transposed */
        float p[AB][APAD], ds[AB][APAD];       /* [query][key] */
        float lse[AB], D[AB];
    };
    struct thread {
        float dk[RT][CJ], dv[RT][CJ];   /* keys RT ty + i, columns tx + 16 j */
    };
    att_args a;

    HD int begin(int blk) const { return tile_of(a, blk); }
    HD int end(int) const { return a.tiles; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        load_keys<HDM, threads>(sh, a, bh_of(a, blk), AB * tile_of(a, blk), tid);
        for (int i = 0; i < RT; i++)
            for (int j = 0; j < CJ; j++) t.dk[i][j] = t.dv[i][j] = 0.0f;
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), k0 = AB * tile_of(a, blk), q0 = AB * tile;
        int ty = tid / 16, tx = tid % 16;
        if (p == 0) {
            load_queries<HDM, threads>(sh, a, bh, q0, tid);
        } else if (p == 1) {
            float pr[RT][4], ds[RT][4];
            grad_tile<HDM, RT>(a, pr, ds, sh.qt, sh.kt, sh.dot, sh.vt, sh.lse, sh.D, q0, k0, ty,
                               tx);
            UNROLL
            for (int i = 0; i < RT; i++)
                UNROLL
                for (int j = 0; j < 4; j++) {
                    sh.p[RT * ty + i][tx + 16 * j] = pr[i][j];
                    sh.ds[RT * ty + i][tx + 16 * j] = ds[i][j];
                }
        } else {   /* dV += P^T dO, dK += dS^T Q */
            accumulate<RT, CJ>(t.dv, sh.p, ty,
                               [&](int r, int j) { return sh.dot[tx + 16 * j][r]; });
            accumulate<RT, CJ>(t.dk, sh.ds, ty,
                               [&](int r, int j) { return sh.qt[tx + 16 * j][r]; });
        }
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &) const
    {
        int bh = bh_of(a, blk), k0 = AB * tile_of(a, blk), ty = tid / 16, tx = tid % 16;
        store_tile<RT, CJ>(t.dk, NULL, a, a.out, 3 * a.d, a.d, bh, k0, ty, tx);
        store_tile<RT, CJ>(t.dv, NULL, a, a.out, 3 * a.d, 2 * a.d, bh, k0, ty, tx);
    }
};

/* dQ of a query tile: over the key tiles up to its own. */
template <int HDM, int RT> struct att_dq {
    static constexpr int threads = 16 * (AB / RT), phases = 3, CJ = HDM / 16;
    struct shared {
        float qt[HDM][APAD], dot[HDM][APAD];   /* the block's q and dO, transposed */
        float kt[HDM][APAD], vt[HDM][APAD];    /* a key tile's, transposed */
        float dst[AB][APAD];                   /* dS^T: [key][query] */
        float lse[AB], D[AB];
    };
    struct thread {
        float dq[RT][CJ];   /* queries RT ty + i, columns tx + 16 j */
    };
    att_args a;

    HD int begin(int) const { return 0; }
    HD int end(int blk) const { return tile_of(a, blk) + 1; }

    HD AINL void init(int blk, int tid, thread &t, shared &sh) const
    {
        load_queries<HDM, threads>(sh, a, bh_of(a, blk), AB * tile_of(a, blk), tid);
        for (int i = 0; i < RT; i++)
            for (int j = 0; j < CJ; j++) t.dq[i][j] = 0.0f;
    }

    HD AINL void phase(int p, int blk, int tile, int tid, thread &t, shared &sh) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), k0 = AB * tile;
        int ty = tid / 16, tx = tid % 16;
        if (p == 0) {
            load_keys<HDM, threads>(sh, a, bh, k0, tid);
        } else if (p == 1) {
            float pr[RT][4], ds[RT][4];
            grad_tile<HDM, RT>(a, pr, ds, sh.qt, sh.kt, sh.dot, sh.vt, sh.lse, sh.D, q0, k0, ty,
                               tx);
            UNROLL
            for (int j = 0; j < 4; j++)
                UNROLL
                for (int g = 0; g < RT; g += 4) {
                    float col[4] = {ds[g][j], ds[g + 1][j], ds[g + 2][j], ds[g + 3][j]};
                    st4(&sh.dst[tx + 16 * j][RT * ty + g], col);
                }
        } else {   /* dQ += dS K */
            accumulate<RT, CJ>(t.dq, sh.dst, ty,
                               [&](int c, int j) { return sh.kt[tx + 16 * j][c]; });
        }
    }

    HD AINL void finish(int blk, int tid, thread &t, shared &) const
    {
        int bh = bh_of(a, blk), q0 = AB * tile_of(a, blk), ty = tid / 16, tx = tid % 16;
        store_tile<RT, CJ>(t.dq, NULL, a, a.out, 3 * a.d, 0, bh, q0, ty, tx);
    }
};

/* ---- Entry points ------------------------------------------------------------------ */

/* The fused kernels' padded head size for hd; 0 for the GEMM path: heads
 * over 128 wide, MG_ATTENTION=gemm, or by default (auto) in float32
 * sequences of up to AUTO_GEMM_T positions, where the batched GEMMs were
 * faster on an H100 (docs/PERFORMANCE.md) and their T x T probabilities
 * small. In bfloat16 (the tensor-core kernels) auto is the fused path at
 * any length. bf16: the precision the buffers were sized for, so that
 * the path stays the one they hold room for when bf16 is switched after
 * (the float kernels or the GEMMs then run in the other precision). */
enum { AUTO_GEMM_T = 512 };

static int fused_width(int T, int hd, bool bf16)
{
    const char *how = mg_env_str("MG_ATTENTION", "auto");
    if (!strcmp(how, "gemm") || (!strcmp(how, "auto") && T <= AUTO_GEMM_T && !bf16)) return 0;
    return hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 0;
}

static att_args args_of(int T, int d, int heads)
{
    att_args a = {};
    a.T = T, a.d = d, a.H = heads, a.hd = d / heads, a.tiles = (T + AB - 1) / AB;
    a.scale = 1.0f / sqrtf((float)a.hd);
    a.bf16 = DK()->bf16;
    return a;
}

/* Kernel K for the padded head size and MG_ATTENTION_ROWS query rows a
 * thread, one block per sequence-head and tile. */
template <template <int, int> class K> static void launch(int width, int n, const att_args &a)
{
    int blocks = n * a.H * a.tiles;
    if (mg_env_long("MG_ATTENTION_ROWS", 4) == 8) {
        if (width == 32) block_kernel(blocks, K<32, 8>{a});
        else if (width == 64) block_kernel(blocks, K<64, 8>{a});
        else block_kernel(blocks, K<128, 8>{a});
    } else {
        if (width == 32) block_kernel(blocks, K<32, 4>{a});
        else if (width == 64) block_kernel(blocks, K<64, 4>{a});
        else block_kernel(blocks, K<128, 4>{a});
    }
}

/* Saved: the log-sum-exp [n, H, T] (the GEMM path: the probabilities
 * [n, H, T, T]). Workspace: D [n, H, T] (the GEMM path: dS [n, H, T, T]). */
extern "C" size_t mg_dk_attention_saved(int n, int T, int d, int heads, bool sized_bf16)
{
    return (size_t)n * heads * T * (fused_width(T, d / heads, sized_bf16) ? 1 : (size_t)T);
}

extern "C" size_t mg_dk_attention_scratch(int n, int T, int d, int heads, bool sized_bf16)
{
    return mg_dk_attention_saved(n, T, d, heads, sized_bf16);
}

static void gemm_forward(float *y, float *P, const float *qkv, int n, int T, int d, int H);
static void gemm_backward(float *dqkv, const float *dy, const float *P, const float *qkv, int n,
                          int T, int d, int H, float *dP);

extern "C" void mg_dk_attention_forward(float *y, float *saved, const float *qkv, int n, int T,
                                        int d, int heads, float *w, bool sized_bf16)
{
    PROFILE(__func__);
    int width = fused_width(T, d / heads, sized_bf16);
    if (!width) return gemm_forward(y, saved, qkv, n, T, d, heads);
    att_args a = args_of(T, d, heads);
    a.qkv = qkv, a.out = y, a.lse = saved;
    if (a.bf16) attention_tc_forward(width, n, a);
    else launch<att_fwd>(width, n, a);
}

extern "C" void mg_dk_attention_backward(float *dqkv, const float *dy, const float *y,
                                         const float *saved, const float *qkv, int n, int T,
                                         int d, int heads, float *w, bool sized_bf16)
{
    PROFILE(__func__);
    int width = fused_width(T, d / heads, sized_bf16);
    if (!width) return gemm_backward(dqkv, dy, saved, qkv, n, T, d, heads, w);
    att_args a = args_of(T, d, heads);
    a.qkv = qkv, a.y = y, a.dy = dy, a.out = dqkv, a.lse = (float *)saved, a.D = w;
    int hd = a.hd, H = heads;
    /* D = rowsum(dO * O) per query, in float as the CPU's */
    rows((size_t)n * H * T, [=] HD(size_t r, int lane, int nl) {
        size_t bh = r / T, t = r % T;
        size_t o = ((bh / H) * T + t) * d + (bh % H) * hd;
        float s = 0.0f;
        for (int e = lane; e < hd; e += nl) s += dy[o + e] * y[o + e];
        s = lane_sum(s);
        if (lane == 0) w[r] = s;
    });
    if (a.bf16) {
        attention_tc_backward(width, n, a);
        return;
    }
    launch<att_dkv>(width, n, a);
    launch<att_dq>(width, n, a);
}

/* ---- The GEMM path ----------------------------------------------------------------- *
 * Score and output products as batched GEMMs over sequences x heads, each
 * on its head's columns of the q, k, v rows and writing its columns of
 * the output in place; the forward keeps the probabilities, as PyTorch's
 * eager attention does. */

/* The strides of sequence b's head h: its T x hd block of [n, T, W] rows
 * starts b T W + h hd past the part's first column (Q, K and V are qkv,
 * qkv + d and qkv + 2d, W = 3d; y and dy have W = d), and its T x T
 * scores b H T T + h T T into [n, H, T, T]. */
static bstride head_cols(int T, int W, int hd) { return (bstride){(long long)T * W, hd}; }
static bstride head_scores(int T, int H) { return (bstride){(long long)H * T * T, (long long)T * T}; }

static void gemm_forward(float *y, float *P, const float *qkv, int n, int T, int d, int H)
{
    int hd = d / H, W = 3 * d;
    float scale = 1.0f / sqrtf((float)hd);
    bstride sx = head_cols(T, W, hd), sy = head_cols(T, d, hd), sp = head_scores(T, H);
    /* With bf16: Q, K and V rounded once, for both products */
    dk_bf16_keep_own(0, qkv, (size_t)n * T * W);
    /* S = Q K^T scale; P = softmax(S) over the causal part, zeros after */
    dk_gemm_batched(false, true, T, T, hd, scale, qkv, W, sx, qkv + d, W, sx, 0.0f, P, T, sp, n,
                    H);
    rows((size_t)n * H * T, [=] HD(size_t r, int lane, int nl) {
        int t = (int)(r % T);
        float *s = P + r * T;
        float mx = -INFINITY;
        for (int j = lane; j <= t; j += nl) mx = fmaxf(mx, s[j]);
        mx = lane_max(mx);
        float sum = 0.0f;
        for (int j = lane; j <= t; j += nl) sum += expf(s[j] - mx);
        sum = lane_sum(sum);
        float inv = 1.0f / sum;
        for (int j = lane; j < T; j += nl) s[j] = j <= t ? expf(s[j] - mx) * inv : 0.0f;
    });
    /* y = P V */
    dk_gemm_batched(false, false, T, hd, T, 1.0f, P, T, sp, qkv + 2 * d, W, sx, 0.0f, y, d, sy, n,
                    H);
    dk_bf16_forget();
}

static void gemm_backward(float *dqkv, const float *dy, const float *P, const float *qkv, int n,
                          int T, int d, int H, float *dP)
{
    int hd = d / H, W = 3 * d;
    const float *Q = qkv, *K = qkv + d, *V = qkv + 2 * d;
    float *dQ = dqkv, *dK = dqkv + d, *dV = dqkv + 2 * d;
    float scale = 1.0f / sqrtf((float)hd);
    bstride sx = head_cols(T, W, hd), sy = head_cols(T, d, hd), sp = head_scores(T, H);
    /* With bf16: Q, K, V and dy rounded once, for all four products */
    dk_bf16_keep_own(0, qkv, (size_t)n * T * W);
    dk_bf16_keep_own(1, dy, (size_t)n * T * d);
    /* dP = dy V^T, dV = P^T dy */
    dk_gemm_batched(false, true, T, T, hd, 1.0f, dy, d, sy, V, W, sx, 0.0f, dP, T, sp, n, H);
    dk_gemm_batched(true, false, T, hd, T, 1.0f, P, T, sp, dy, d, sy, 0.0f, dV, W, sx, n, H);
    /* dS = P (dP - sum_k P dP) scale, in dP. */
    rows((size_t)n * H * T, [=] HD(size_t r, int lane, int nl) {
        const float *p = P + r * T;
        float *g = dP + r * T, s = 0.0f;
        int t = (int)(r % T);   /* P is zero after the causal part */
        for (int j = lane; j <= t; j += nl) s += p[j] * g[j];
        s = lane_sum(s);
        for (int j = lane; j < T; j += nl) g[j] = j <= t ? p[j] * (g[j] - s) * scale : 0.0f;
    });
    /* dQ = dS K, dK = dS^T Q (with bf16, dS rounded once for both) */
    dk_bf16_reuse(dP, (size_t)n * H * T * T);
    dk_gemm_batched(false, false, T, hd, T, 1.0f, dP, T, sp, K, W, sx, 0.0f, dQ, W, sx, n, H);
    dk_gemm_batched(true, false, T, hd, T, 1.0f, dP, T, sp, Q, W, sx, 0.0f, dK, W, sx, n, H);
    dk_bf16_reuse(NULL, 0);
    dk_bf16_forget();
}
