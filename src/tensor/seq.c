/* Kernels of the transformer: LayerNorm over the last dimension and causal
 * multi-head self-attention (GELU is in gelu.c).
 *
 * Attention keeps memory lean as the flash-attention papers do: the
 * forward saves only the log-sum-exp of each softmax row, and the
 * backward recomputes one head's probabilities at a time from it, so no
 * [T, T] matrix outlives the head that uses it. Rows are cut into blocks
 * of query positions; a block only multiplies the keys at or before its
 * last position (the causal mask), so about half of the score matrix is
 * never computed. Limit, as in FlashAttention-2: the backward's
 * D = rowsum(dO . O) cancels where a softmax row saturates (one
 * probability near 1), so there a gradient that should be 0 carries
 * float32's error of that sum: 5e-5 of the gradient's scale at scores of
 * about 1e3 (a probe: torch's eager attention, which keeps P, 4e-8); at
 * ordinary scales 3e-7. */
#include <math.h>
#include <string.h>
#include "multigrad/tensor.h"
#include "device/dk.h"
#include "tensor/lanes.h"

/* ---- LayerNorm --------------------------------------------------------- */

void mg_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, size_t rows, int d, float eps)
{
    if (mg__dk_cur) {
        mg_dk_layernorm_forward(y, mean, rstd, x, w, b, rows, d, eps);
        return;
    }
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        float mu = mg__lanes_sum(xr, d) / d;
        float rs = 1.0f / sqrtf(mg__lanes_sqdev(xr, d, mu) / d + eps);
        for (int i = 0; i < d; i++) yr[i] = (xr[i] - mu) * rs * w[i] + b[i];
        mean[r] = mu;
        rstd[r] = rs;
    }
}

void mg_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const float *w, size_t rows,
                           int d)
{
    if (mg__dk_cur) {
        mg_dk_layernorm_backward(dx, dw, db, dy, x, mean, rstd, w, rows, d);
        return;
    }
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *gr = dy + r * d;
        float mu = mean[r], rs = rstd[r], a1[MG__LANES] = {0}, a2[MG__LANES] = {0};
        for (int i = 0; i < d; i++) {
            dw[i] += gr[i] * ((xr[i] - mu) * rs);
            db[i] += gr[i];
        }
        if (!dx) continue;
        /* s1 = sum g, s2 = sum g x-hat, g = dy w: in lanes (lanes.h) */
        MG__LANES_LOOP(d, {
            float g = gr[i] * w[i];
            a1[j] += g;
            a2[j] += g * ((xr[i] - mu) * rs);
        });
        float s1 = mg__lanes_fold(a1), s2 = mg__lanes_fold(a2);
        float *dr = dx + r * d, m1 = s1 / d, m2 = s2 / d;
        for (int i = 0; i < d; i++) {
            float xh = (xr[i] - mu) * rs;
            dr[i] = rs * (gr[i] * w[i] - m1 - xh * m2);
        }
    }
}

/* ---- Embedding ------------------------------------------------------------- */

void mg_embedding_forward(float *y, const int32_t *tok, const float *wte, int lo, int rows,
                          const float *wpe, int n, int T, int d)
{
    if (mg__dk_cur) {
        mg_dk_embedding_forward(y, tok, wte, lo, rows, wpe, n, T, d);
        return;
    }
    size_t dd = (size_t)d;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < T; t++) {
            int k = tok[(size_t)i * T + t] - lo;
            const float *a = k >= 0 && k < rows ? wte + (size_t)k * dd : NULL;
            const float *b = wpe ? wpe + (size_t)t * dd : NULL;
            float *o = y + ((size_t)i * T + t) * dd;
            if (a && b)
                for (size_t j = 0; j < dd; j++) o[j] = a[j] + b[j];
            else if (a || b)
                memcpy(o, a ? a : b, dd * sizeof(float));
            else
                memset(o, 0, dd * sizeof(float));
        }
}

void mg_embedding_backward(float *gte, float *gpe, const float *dy, const int32_t *tok, int lo,
                           int rows, int n, int T, int d)
{
    if (mg__dk_cur) {
        mg_dk_embedding_backward(gte, gpe, dy, tok, lo, rows, n, T, d);
        return;
    }
    for (int i = 0; i < n; i++)
        for (int t = 0; t < T; t++) {
            const float *g = dy + ((size_t)i * T + t) * d;
            int k = tok[(size_t)i * T + t] - lo;
            float *a = k >= 0 && k < rows ? gte + (size_t)k * d : NULL, *b = gpe + (size_t)t * d;
            for (int j = 0; j < d; j++) b[j] += g[j];
            for (int j = 0; a && j < d; j++) a[j] += g[j];
        }
}

/* ---- Causal self-attention ----------------------------------------------- */

/* Query rows per block: the keys a block needs end at its last row. */
#define ATT_BLOCK 32

size_t mg_attention_saved_as(int n, int T, int d, int heads, bool sized_bf16)
{
    if (mg__dk_cur) return mg_dk_attention_saved(n, T, d, heads, sized_bf16);
    return (size_t)n * heads * T;
}

size_t mg_attention_saved(int n, int T, int d, int heads)
{
    return mg_attention_saved_as(n, T, d, heads, mg_gemm_bf16());
}

size_t mg_attention_scratch(int n, int T, int d, int heads)
{
    if (mg__dk_cur) return mg_dk_attention_scratch(n, T, d, heads, mg_gemm_bf16());
    return 2 * (size_t)ATT_BLOCK * T;
}

void mg_attention_forward(float *y, float *lse, const float *qkv, int n, int T, int d,
                          int heads, float *ws)
{
    mg_attention_forward_as(y, lse, qkv, n, T, d, heads, ws, mg_gemm_bf16());
}

void mg_attention_backward(float *dqkv, const float *dy, const float *y, const float *lse,
                           const float *qkv, int n, int T, int d, int heads, float *ws)
{
    mg_attention_backward_as(dqkv, dy, y, lse, qkv, n, T, d, heads, ws, mg_gemm_bf16());
}

void mg_attention_forward_as(float *y, float *lse, const float *qkv, int n, int T, int d,
                             int heads, float *ws, bool sized_bf16)
{
    if (mg__dk_cur) {
        mg_dk_attention_forward(y, lse, qkv, n, T, d, heads, ws, sized_bf16);
        return;
    }
    int hd = d / heads, ld = 3 * d;
    float scale = 1.0f / sqrtf((float)hd);
    float *S = ws;
    for (int i = 0; i < n; i++) {
        const float *xi = qkv + (size_t)i * T * ld;
        float *yi = y + (size_t)i * T * d;
        for (int h = 0; h < heads; h++) {
            const float *q = xi + h * hd, *k = xi + d + h * hd, *v = xi + 2 * d + h * hd;
            float *l = lse + ((size_t)i * heads + h) * T;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                int nb = T - t0 < ATT_BLOCK ? T - t0 : ATT_BLOCK, nk = t0 + nb;
                /* S[r, s] = q[t0+r] . k[s] for s < nk. */
                mg_gemm(false, true, nb, nk, hd, scale, q + (size_t)t0 * ld, ld, k, ld, 0.0f, S,
                        nk);
                for (int r = 0; r < nb; r++) {
                    float *sr = S + (size_t)r * nk;
                    int ns = t0 + r + 1;   /* keys 0..t0+r */
                    float mx = mg__lanes_max(sr, ns);
                    mg__exp_shifted(sr, ns, mx);
                    float sum = mg__lanes_sum(sr, ns);
                    float inv = 1.0f / sum;
                    for (int s = 0; s < ns; s++) sr[s] *= inv;
                    for (int s = ns; s < nk; s++) sr[s] = 0.0f;
                    l[t0 + r] = mx + logf(sum);
                }
                mg_gemm(false, false, nb, hd, nk, 1.0f, S, nk, v, ld, 0.0f,
                        yi + (size_t)t0 * d + h * hd, d);
            }
        }
    }
}

void mg_attention_backward_as(float *dqkv, const float *dy, const float *y, const float *lse,
                              const float *qkv, int n, int T, int d, int heads, float *ws,
                              bool sized_bf16)
{
    if (mg__dk_cur) {
        mg_dk_attention_backward(dqkv, dy, y, lse, qkv, n, T, d, heads, ws, sized_bf16);
        return;
    }
    int hd = d / heads, ld = 3 * d;
    float scale = 1.0f / sqrtf((float)hd);
    float *P = ws, *dP = ws + (size_t)ATT_BLOCK * T;
    for (int i = 0; i < n; i++) {
        const float *xi = qkv + (size_t)i * T * ld, *yi = y + (size_t)i * T * d;
        const float *gi = dy + (size_t)i * T * d;
        float *dxi = dqkv + (size_t)i * T * ld;
        for (int h = 0; h < heads; h++) {
            const float *q = xi + h * hd, *k = xi + d + h * hd, *v = xi + 2 * d + h * hd;
            const float *go = gi + h * hd, *o = yi + h * hd;
            float *dq = dxi + h * hd, *dk = dxi + d + h * hd, *dv = dxi + 2 * d + h * hd;
            const float *l = lse + ((size_t)i * heads + h) * T;
            for (int t = 0; t < T; t++) {
                memset(dk + (size_t)t * ld, 0, sizeof(float) * hd);
                memset(dv + (size_t)t * ld, 0, sizeof(float) * hd);
            }
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                int nb = T - t0 < ATT_BLOCK ? T - t0 : ATT_BLOCK, nk = t0 + nb;
                /* P recomputed from the saved log-sum-exp. */
                mg_gemm(false, true, nb, nk, hd, scale, q + (size_t)t0 * ld, ld, k, ld, 0.0f, P,
                        nk);
                for (int r = 0; r < nb; r++) {
                    float *pr = P + (size_t)r * nk, lr = l[t0 + r];
                    int ns = t0 + r + 1;
                    mg__exp_shifted(pr, ns, lr);
                    for (int s = ns; s < nk; s++) pr[s] = 0.0f;
                }
                /* dV += P^T dO;  dP = dO V^T. */
                mg_gemm(true, false, nk, hd, nb, 1.0f, P, nk, go + (size_t)t0 * d, d, 1.0f, dv, ld);
                mg_gemm(false, true, nb, nk, hd, 1.0f, go + (size_t)t0 * d, d, v, ld, 0.0f, dP, nk);
                /* dS = P * (dP - rowsum(dO * O)), times the scale. */
                for (int r = 0; r < nb; r++) {
                    const float *gr = go + (size_t)(t0 + r) * d, *orow = o + (size_t)(t0 + r) * d;
                    float D = mg__lanes_dot(gr, orow, hd);
                    float *pr = P + (size_t)r * nk, *dpr = dP + (size_t)r * nk;
                    for (int s = 0; s < nk; s++) dpr[s] = pr[s] * (dpr[s] - D) * scale;
                }
                /* dQ = dS K;  dK += dS^T Q. */
                mg_gemm(false, false, nb, hd, nk, 1.0f, dP, nk, k, ld, 0.0f, dq + (size_t)t0 * ld,
                        ld);
                mg_gemm(true, false, nk, hd, nb, 1.0f, dP, nk, q + (size_t)t0 * ld, ld, 1.0f, dk,
                        ld);
            }
        }
    }
}
