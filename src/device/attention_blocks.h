/* Internal to the attention kernels (attention.cu: the float kernels, the
 * GEMM path and the entry points; attention_tc.cu: the tensor-core
 * kernels for bfloat16): blocks of threads in phases, which run on a GPU
 * or, under the device kind emu, phase by phase on the host, and what
 * every fused kernel reads (att_args) with its indexing. C++ only. */
#ifndef MG_DEVICE_ATTENTION_BLOCKS_H
#define MG_DEVICE_ATTENTION_BLOCKS_H

#include "device/dk_internal.h"

/* ---- Blocks of threads in phases ------------------------------------------------ *
 * A block kernel K: K::threads threads share a K::shared; each has its own
 * K::thread. k.init(blk, tid, t, sh) runs once, then for each tile in
 * [k.begin(blk), k.end(blk)) the phases 0 .. K::phases - 1, a barrier
 * after each (and after init), then k.finish(blk, tid, t, sh). */
#ifdef __CUDACC__
template <class K> __global__ void __launch_bounds__(K::threads) k_blocks(K k)
{
    extern __shared__ __align__(128) float4 smem_[];
    typename K::shared &sh = *reinterpret_cast<typename K::shared *>(smem_);
    typename K::thread t;
    int blk = (int)blockIdx.x, tid = (int)threadIdx.x;
    k.init(blk, tid, t, sh);
    __syncthreads();
    int end = k.end(blk);
    for (int tile = k.begin(blk); tile < end; tile++) {
#pragma unroll
        for (int p = 0; p < K::phases; p++) {
            k.phase(p, blk, tile, tid, t, sh);
            __syncthreads();
        }
    }
    k.finish(blk, tid, t, sh);
}
#endif

template <class K> static void block_kernel(int blocks, const K &k)
{
    if (blocks <= 0) return;
#ifdef __CUDACC__
    if (!DK()->emu) {
        size_t bytes = sizeof(typename K::shared);
        ck(cudaFuncSetAttribute(k_blocks<K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)bytes),
           "attention's shared memory");
        k_blocks<K><<<blocks, K::threads, bytes, DK()->stream>>>(k);
        ck(cudaGetLastError(), "launching attention");
        return;
    }
#endif
    /* aligned as on a GPU: a K::shared may ask for more than malloc's 16 */
    size_t bytes = (sizeof(typename K::shared) + 127) / 128 * 128;
    typename K::shared *sh = (typename K::shared *)aligned_alloc(128, bytes);
    typename K::thread *t = (typename K::thread *)malloc(K::threads * sizeof *t);
    if (!sh || !t) {
        fprintf(stderr, "multigrad: emu: out of memory for an attention block\n");
        abort();
    }
    for (int blk = 0; blk < blocks; blk++) {
        for (int i = 0; i < K::threads; i++) k.init(blk, i, t[i], *sh);
        for (int tile = k.begin(blk); tile < k.end(blk); tile++)
            for (int p = 0; p < K::phases; p++)
                for (int i = 0; i < K::threads; i++) k.phase(p, blk, tile, i, t[i], *sh);
        for (int i = 0; i < K::threads; i++) k.finish(blk, i, t[i], *sh);
    }
    free(sh);
    free(t);
}

/* ---- The fused kernels' pieces ----------------------------------------------------- */

enum { AB = 64, APAD = AB + 4 };

/* Inlined into the kernel and loops unrolled, so that a thread's state
 * stays in registers. */
#ifdef __CUDACC__
#define AINL __forceinline__
#else
#define AINL inline
#endif
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#define UNROLL_4 _Pragma("unroll 4")
#define UNROLL_8 _Pragma("unroll 8")
#else
#define UNROLL
#define UNROLL_4
#define UNROLL_8
#endif

static HD inline void ld4(const float *p, float v[4])
{
#ifdef __CUDA_ARCH__
    float4 f = *reinterpret_cast<const float4 *>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
#else
    memcpy(v, p, 4 * sizeof(float));
#endif
}

static HD inline void st4(float *p, const float v[4])
{
#ifdef __CUDA_ARCH__
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
#else
    memcpy(p, v, 4 * sizeof(float));
#endif
}

/* What every fused kernel reads: n sequences x H heads, the qkv rows
 * [n, T, 3d] (head h's q, k and v at columns h hd, d + h hd, 2d + h hd),
 * y and dy [n, T, d], the log-sum-exp and D = rowsum(dO * O) [n, H, T]. */
struct att_args {
    const float *qkv, *y, *dy;
    float *out;          /* y (forward) or dqkv (backward) */
    float *lse, *D;
    const uint16_t *qkv16, *dy16;   /* qkv and dy in bfloat16 (the tensor-core kernels) */
    int T, d, H, hd, tiles;
    float scale;
    bool bf16;
};

/* Block blk's sequence-head and tile: the heaviest tiles (most keys under
 * the mask) first. */
static HD inline int bh_of(const att_args &a, int blk) { return blk / a.tiles; }
static HD inline int tile_of(const att_args &a, int blk) { return a.tiles - 1 - blk % a.tiles; }

/* Row r of the [n, T, w]-wide array x, head h's columns (col0 + h hd):
 * bh = b H + h. */
static HD inline size_t row_at(const att_args &a, int bh, int r, int w, int col0)
{
    return ((size_t)(bh / a.H) * a.T + r) * w + col0 + (size_t)(bh % a.H) * a.hd;
}

/* A row's value (lse or D) per query r0 + r; 0 past T. */
template <int threads>
static HD AINL void load_rows(float *dst, const float *v, const att_args &a, int bh, int r0,
                              int tid)
{
    for (int r = tid; r < AB; r += threads)
        dst[r] = r0 + r < a.T ? v[(size_t)bh * a.T + r0 + r] : 0.0f;
}

/* Query q0 + RT ty + i sees key k0 + tx + 16 j. */
template <int RT>
static HD inline bool visible(const att_args &a, int q0, int k0, int ty, int tx, int i, int j)
{
    int q = q0 + RT * ty + i, k = k0 + tx + 16 * j;
    return k <= q && q < a.T;
}

/* The tensor-core kernels (attention_tc.cu), with bf16 on: the forward
 * (y and the log-sum-exp), the backward (dqkv, with D already in a.D),
 * for head sizes padded to `width` (32, 64 or 128), n sequences; they
 * round qkv (and dy) into the workspace first (dk_ws). */
void attention_tc_forward(int width, int n, const att_args &a);
void attention_tc_backward(int width, int n, const att_args &a);

#endif
