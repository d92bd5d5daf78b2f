/* The device kernels of the library's layers (dk.h): elementwise and
 * dense layers, dropout, pooling, batch normalisation, LayerNorm, GELU,
 * convolutions with their fused ReLU and pool, and the embedding. Each is
 * written once as a function of an element or a row and runs on a GPU or
 * on the host for emu (dk_internal.h); each matches the CPU's kernel of
 * the same name within float rounding (where said, bit for bit). */
#include <limits.h>
#include "device/dk_internal.h"

/* ---- Elementwise and dense ---------------------------------------------------- */

extern "C" void mg_dk_relu_forward(float *y, const float *x, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; });
}

extern "C" void mg_dk_relu_backward(float *dx, const float *dy, const float *y, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; });
}

extern "C" void mg_dk_add_into(float *y, const float *a, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { y[i] += a[i]; });
}

extern "C" void mg_dk_mul(float *y, const float *a, const float *b, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { y[i] = a[i] * b[i]; });
}

extern "C" void mg_dk_copy_floats(float *y, const float *x, size_t n)
{
    PROFILE(__func__);
    if (!n) return;
#ifdef __CUDACC__
    if (!DK()->emu) {
        ck(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, DK()->stream),
           "copy within the GPU");
        return;
    }
#endif
    memcpy(y, x, n * sizeof(float));
}

/* ---- Dropout, pooling, batch normalisation ---------------------------------- *
 * The CPU's kernels (src/tensor/dense.c, pool.c, batchnorm.c) element for
 * element: the same mask stream, and each input gradient gathered from the
 * outputs that cover it in the order the CPU adds them, so they agree
 * bit for bit; batch normalisation's sums per channel are a warp's, in
 * double as the CPU's. */

extern "C" void mg_dk_dropout_mask(uint8_t *keep, size_t n, float p, uint64_t seed,
                                   uint64_t counter)
{
    PROFILE(__func__);
    uint32_t thr = (uint32_t)((double)p * 16777216.0);
    /* Word i of the stream from block `counter`: mg_rng's order. */
    each(n, [=] HD(size_t i) {
        uint32_t w[4];
        mg__philox(seed, counter + i / 4, w);
        keep[i] = (w[i % 4] >> 8) >= thr;
    });
}

extern "C" void mg_dk_dropout_apply(float *y, const float *x, const uint8_t *keep, size_t n,
                                    float p)
{
    PROFILE(__func__);
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    each(n, [=] HD(size_t i) { y[i] = keep[i] ? x[i] * scale : 0.0f; });
}

/* The outputs o (of n along an axis, stride s, window k) whose windows
 * hold input i: [*o0, *o1]. */
static HD inline void covering(int i, int k, int s, int n, int *o0, int *o1)
{
    *o0 = i < k ? 0 : (i - k) / s + 1;
    *o1 = i / s < n - 1 ? i / s : n - 1;
}

/* Input element e of planes h x w pooled to oh x ow: its plane's outputs
 * start at *out (of the plane p it returns), the covering ones are rows
 * r[0..1] and columns r[2..3], and it is at *at within its plane. */
static HD inline size_t pooled_by(size_t e, int h, int w, int k, int s, int oh, int ow, int r[4],
                                  int *at)
{
    int iy = (int)(e / w % h), ix = (int)(e % w);
    covering(iy, k, s, oh, &r[0], &r[1]);
    covering(ix, k, s, ow, &r[2], &r[3]);
    *at = iy * w + ix;
    return e / ((size_t)h * w) * oh * ow;
}

extern "C" void mg_dk_avgpool2d_forward(float *y, const float *x, int nc, int h, int w, int k,
                                        int s)
{
    PROFILE(__func__);
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    each((size_t)nc * oh * ow, [=] HD(size_t q) {
        y[q] = mg__pool_mean(x + q / ((size_t)oh * ow) * h * w, w, k, s, (int)(q / ow % oh),
                             (int)(q % ow));
    });
}

extern "C" void mg_dk_avgpool2d_backward(float *dx, const float *dy, int nc, int h, int w, int k,
                                         int s)
{
    PROFILE(__func__);
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    float inv = 1.0f / (float)(k * k);
    each((size_t)nc * h * w, [=] HD(size_t e) {
        int r[4], at;
        const float *gp = dy + pooled_by(e, h, w, k, s, oh, ow, r, &at);
        float acc = 0.0f;
        for (int oy = r[0]; oy <= r[1]; oy++)
            for (int ox = r[2]; ox <= r[3]; ox++) acc += gp[oy * ow + ox] * inv;
        dx[e] = acc;
    });
}

extern "C" void mg_dk_maxpool2d_forward(float *y, int32_t *arg, const float *x, int nc, int h,
                                        int w, int k, int s)
{
    PROFILE(__func__);
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    each((size_t)nc * oh * ow, [=] HD(size_t q) {
        y[q] = mg__pool_max(x + q / ((size_t)oh * ow) * h * w, w, k, s, (int)(q / ow % oh),
                            (int)(q % ow), &arg[q]);
    });
}

extern "C" void mg_dk_maxpool2d_backward(float *dx, const float *dy, const int32_t *arg, int nc,
                                         int h, int w, int k, int s)
{
    PROFILE(__func__);
    int oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    each((size_t)nc * h * w, [=] HD(size_t e) {
        int r[4], at;
        size_t o = pooled_by(e, h, w, k, s, oh, ow, r, &at);
        const float *gp = dy + o;
        const int32_t *ap = arg + o;
        float acc = 0.0f;
        for (int oy = r[0]; oy <= r[1]; oy++)
            for (int ox = r[2]; ox <= r[3]; ox++)
                if (ap[oy * ow + ox] == at) acc += gp[oy * ow + ox];
        dx[e] = acc;
    });
}

extern "C" void mg_dk_batchnorm2d_forward(float *y, float *mean, float *invstd, const float *x,
                                          const float *gamma, const float *beta,
                                          float *run_mean, float *run_var, int n, int c, int hw,
                                          float eps, float momentum, bool training)
{
    PROFILE(__func__);
    size_t m = (size_t)n * hw;
    rows((size_t)c, [=] HD(size_t ch, int lane, int lanes) {
        /* Element j of the channel: image j / hw, position j % hw. */
#define MG__AT(j) (((j) / hw * (size_t)c + ch) * hw + (j) % hw)
        float mu, is;
        if (training) {
            double sum = 0.0, s2 = 0.0;
            for (size_t j = lane; j < m; j += lanes) sum += x[MG__AT(j)];
            sum = lane_sum_d(sum);
            double dm = m ? sum / (double)m : 0.0;
            for (size_t j = lane; j < m; j += lanes) {
                double d = x[MG__AT(j)] - dm;
                s2 += d * d;
            }
            s2 = lane_sum_d(s2);
            double var = m ? s2 / (double)m : 0.0;
            double unbiased = m > 1 ? s2 / (double)(m - 1) : var;
            mu = (float)dm;
            is = (float)(1.0 / sqrt(var + eps));
            if (run_mean && lane == 0) {
                run_mean[ch] = (1.0f - momentum) * run_mean[ch] + momentum * (float)dm;
                run_var[ch] = (1.0f - momentum) * run_var[ch] + momentum * (float)unbiased;
            }
        } else {
            mu = run_mean[ch];
            is = (float)(1.0 / sqrt((double)run_var[ch] + eps));
        }
        if (lane == 0) {
            mean[ch] = mu;
            invstd[ch] = is;
        }
        float a = gamma[ch] * is, b = beta[ch] - mu * a;
        for (size_t j = lane; j < m; j += lanes) y[MG__AT(j)] = x[MG__AT(j)] * a + b;
    });
}

extern "C" void mg_dk_batchnorm2d_backward(float *dx, float *dgamma, float *dbeta,
                                           const float *dy, const float *x, const float *mean,
                                           const float *invstd, const float *gamma, int n, int c,
                                           int hw, bool training)
{
    PROFILE(__func__);
    size_t m = (size_t)n * hw;
    rows((size_t)c, [=] HD(size_t ch, int lane, int lanes) {
        float mu = mean[ch], is = invstd[ch];
        double sdy = 0.0, sdyx = 0.0;
        for (size_t j = lane; j < m; j += lanes) {
            float g = dy[MG__AT(j)];
            sdy += g;
            sdyx += (double)g * ((x[MG__AT(j)] - mu) * is);
        }
        sdy = lane_sum_d(sdy);
        sdyx = lane_sum_d(sdyx);
        if (lane == 0) {
            dgamma[ch] += (float)sdyx;
            dbeta[ch] += (float)sdy;
        }
        if (!dx) return;
        float a = gamma[ch] * is;
        float c0 = mg__bn_mean(training, m, sdy), c1 = mg__bn_mean(training, m, sdyx);
        for (size_t j = lane; j < m; j += lanes)
            dx[MG__AT(j)] = mg__bn_dx(a, dy[MG__AT(j)], c0, x[MG__AT(j)], mu, is, c1);
#undef MG__AT
    });
}

/* What a linear keeps with bf16 on: x rounded, then (256-byte aligned) W. */
static size_t kept_w_at(int n, int in) { return (dk_bf16_bytes((size_t)n * in) + 255) & ~255ul; }

extern "C" size_t mg_dk_linear_kept(int n, int in, int out)
{
    size_t w = dk_bf16_bytes((size_t)in * out);
    return w ? kept_w_at(n, in) + w : 0;
}

extern "C" void mg_dk_linear_forward(float *y, const float *x, const float *wt, const float *b,
                                     int n, int in, int out, bool relu, void *kept)
{
    PROFILE(__func__);
    if (kept) {
        dk_bf16_keep(x, (size_t)n * in, kept, true);
        dk_bf16_keep(wt, (size_t)in * out, (char *)kept + kept_w_at(n, in), true);
    }
    mg_dk_gemm(false, true, n, out, in, 1.0f, x, in, wt, in, 0.0f, y, out);
    dk_bf16_forget();
    mg_dk_bias_relu(y, b, n, out, relu);
}

extern "C" void mg_dk_bias_relu(float *y, const float *b, int n, int out, bool relu)
{
    PROFILE(__func__);
    if (!b && !relu) return;
    /* a warp per row: no division per element */
    rows((size_t)n, [=] HD(size_t r, int lane, int nl) {
        float *yr = y + r * out;
        for (int j = lane; j < out; j += nl) {
            float v = yr[j] + (b ? b[j] : 0.0f);
            yr[j] = relu ? (v > 0.0f ? v : 0.0f) : v;
        }
    });
}

/* Column sums of K quantities over nrows rows of D columns, added into
 * sum.p[k][j]: value(r, j, v) gives row r's K values of column j (and may
 * write the row, which only it reads). Each column's sums over blocks of
 * rows (a thread per column and block, neighbours reading neighbouring
 * columns), then over the blocks, in a fixed order: the same bits from
 * run to run, on a GPU and on emu. */
template <int K> struct columns_of {
    float *p[K];   /* where each quantity's sums are added */
};

template <int K, class F>
static void column_sums(size_t nrows, int D, F value, columns_of<K> sum)
{
    if (!nrows) return;
    size_t nb = nrows < 64 ? nrows : 64, per = (nrows + nb - 1) / nb;
    float *part = (float *)dk_ws(K * nb * D * sizeof(float));
    each(nb * D, [=] HD(size_t i) {
        size_t blk = i / D, r1 = (blk + 1) * per < nrows ? (blk + 1) * per : nrows;
        int j = (int)(i % D);
        float s[K] = {0}, v[K];
        for (size_t r = blk * per; r < r1; r++) {
            value(r, j, v);
            for (int k = 0; k < K; k++) s[k] += v[k];
        }
        for (int k = 0; k < K; k++) part[k * nb * D + i] = s[k];
    });
    each((size_t)D, [=] HD(size_t j) {
        float s[K] = {0};
        for (size_t blk = 0; blk < nb; blk++)
            for (int k = 0; k < K; k++) s[k] += part[k * nb * D + blk * D + j];
        for (int k = 0; k < K; k++) sum.p[k][j] += s[k];
    });
}

extern "C" void mg_dk_bias_relu_backward(float *dy, float *db, const float *y, int n, int out,
                                         bool relu)
{
    PROFILE(__func__);
    /* db += the columns' sums of dy. In float32, cuBLAS's product with a
     * vector of ones (a GEMV): on an H200 the 85M shape trained at 69.6 K
     * tokens/s so, 68.8 K with the column sums below. With bf16 GEMMs that
     * product would round dY and run on the tensor cores as a GEMM of one
     * column (55-60 us a call there, the sums 20 us), so the sums, in
     * float, masked by ReLU in the same pass. */
    if (!db || !DK()->bf16) {
        if (relu) each((size_t)n * out, [=] HD(size_t i) { dy[i] = y[i] > 0.0f ? dy[i] : 0.0f; });
        if (db)
            mg_dk_gemm(true, false, out, 1, n, 1.0f, dy, out, dk_ones((size_t)n), 1, 1.0f, db, 1);
        return;
    }
    size_t D = (size_t)out;
    column_sums<1>((size_t)n, out, [=] HD(size_t r, int j, float v[1]) {
        float g = dy[r * D + j];
        if (relu) dy[r * D + j] = g = y[r * D + j] > 0.0f ? g : 0.0f;
        v[0] = g;
    }, columns_of<1>{{db}});
}

extern "C" void mg_dk_linear_backward(float *dx, float *dw, float *db, float *dy, const float *y,
                                      const float *x, const float *wt, int n, int in, int out,
                                      bool relu, const void *kept)
{
    PROFILE(__func__);
    /* dY, once masked, feeds the weight and input gradients' GEMMs (and in
     * float32 the bias's): with bf16, rounded once for both; x and W as the
     * forward kept them rounded */
    dk_bf16_reuse(dy, (size_t)n * out);
    mg_dk_bias_relu_backward(dy, db, y, n, out, relu);
    if (kept) {
        dk_bf16_keep(x, (size_t)n * in, (void *)kept, false);
        dk_bf16_keep(wt, (size_t)in * out, (char *)kept + kept_w_at(n, in), false);
    }
    mg_dk_gemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (dx) mg_dk_gemm(false, false, n, in, out, 1.0f, dy, out, wt, in, 0.0f, dx, in);
    dk_bf16_forget();
    dk_bf16_reuse(NULL, 0);
}

/* ---- LayerNorm and GELU --------------------------------------------------------- */

extern "C" void mg_dk_layernorm_forward(float *y, float *mean, float *rstd, const float *x,
                                        const float *w, const float *b, size_t nrows, int d,
                                        float eps)
{
    PROFILE(__func__);
    rows(nrows, [=] HD(size_t r, int lane, int nl) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        float s = 0.0f;
        for (int i = lane; i < d; i += nl) s += xr[i];
        float mu = lane_sum(s) / d, v = 0.0f;
        for (int i = lane; i < d; i += nl) {
            float c = xr[i] - mu;
            v += c * c;
        }
        float rs = 1.0f / sqrtf(lane_sum(v) / d + eps);
        for (int i = lane; i < d; i += nl) yr[i] = (xr[i] - mu) * rs * w[i] + b[i];
        if (lane == 0) {
            mean[r] = mu;
            rstd[r] = rs;
        }
    });
}

extern "C" void mg_dk_layernorm_backward(float *dx, float *dw, float *db, const float *dy,
                                         const float *x, const float *mean, const float *rstd,
                                         const float *w, size_t nrows, int d)
{
    PROFILE(__func__);
    if (!nrows) return;
    /* dw += sum_r dy x-hat, db += sum_r dy */
    size_t D = (size_t)d;
    column_sums<2>(nrows, d, [=] HD(size_t r, int j, float v[2]) {
        float g = dy[r * D + j];
        v[0] = g * ((x[r * D + j] - mean[r]) * rstd[r]);
        v[1] = g;
    }, columns_of<2>{{dw, db}});
    if (!dx) return;
    rows(nrows, [=] HD(size_t r, int lane, int nl) {
        const float *xr = x + r * d, *gr = dy + r * d;
        float mu = mean[r], rs = rstd[r], s1 = 0.0f, s2 = 0.0f;
        for (int i = lane; i < d; i += nl) {
            float xh = (xr[i] - mu) * rs, g = gr[i] * w[i];
            s1 += g;
            s2 += g * xh;
        }
        float m1 = lane_sum(s1) / d, m2 = lane_sum(s2) / d;
        float *dr = dx + r * d;
        for (int i = lane; i < d; i += nl) {
            float xh = (xr[i] - mu) * rs;
            dr[i] = rs * (gr[i] * w[i] - m1 - xh * m2);
        }
    });
}


extern "C" void mg_dk_gelu_forward(float *y, const float *x, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { y[i] = x[i] * mg__gelu_s(x[i]); });
}

extern "C" void mg_dk_gelu_backward(float *dx, const float *dy, const float *x, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) { dx[i] = dy[i] * mg__gelu_deriv(x[i], mg__gelu_s(x[i])); });
}

extern "C" void mg_dk_gelu_forward_deriv(float *y, float *dydx, const float *x, size_t n)
{
    PROFILE(__func__);
    each(n, [=] HD(size_t i) {
        float v = x[i], s = mg__gelu_s(v);
        y[i] = v * s;
        dydx[i] = mg__gelu_deriv(v, s);
    });
}

/* ---- Convolution with the fused ReLU and 2x2 pool ------------------------------------ */

/* All n images' columns side by side: col [c kh kw, N], N = n oh ow (the
 * column of image b, output (oy, ox) is b oh ow + oy ow + ox); the
 * pre-pool map Z = W col [oc, N] is one GEMM. The forward keeps a byte per
 * pooled output: bit k set when element k of its 2x2 window (row-major)
 * gets gradient (the ReLU was active for avg; the first maximum, when
 * not cut by the ReLU, for max), as the CPU's masks say. */
extern "C" size_t mg_dk_conv2d_saved_bytes(const mg_conv2d_shape *s)
{
    return s->pool == MG_POOL_NONE ? 0 : (size_t)s->oc * s->ph * s->pw;
}

extern "C" size_t mg_dk_conv2d_workspace(const mg_conv2d_shape *s, int n)
{
    size_t N = (size_t)n * s->oh * s->ow, K = (size_t)s->c * s->kh * s->kw;
    return 2 * K * N + (size_t)s->oc * N;
}

static void im2col_all(float *col, const float *x, const mg_conv2d_shape *sh, int n)
{
    mg_conv2d_shape s = *sh;
    size_t P = (size_t)s.oh * s.ow, N = (size_t)n * P, K = (size_t)s.c * s.kh * s.kw;
    each(K * N, [=] HD(size_t i) {
        size_t r = i / N, q = i % N, b = q / P, p = q % P;
        int ci = (int)(r / (s.kh * s.kw)), ki = (int)(r / s.kw % s.kh), kj = (int)(r % s.kw);
        int iy = (int)(p / s.ow) * s.stride - s.pad + ki, ix = (int)(p % s.ow) * s.stride - s.pad + kj;
        bool in = iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
        col[i] = in ? x[(((size_t)b * s.c + ci) * s.h + iy) * s.w + ix] : 0.0f;
    });
}

extern "C" void mg_dk_conv2d_forward(float *y, uint8_t *saved, const float *x, const float *wt,
                                     const float *bias, const mg_conv2d_shape *sh, int n,
                                     float *w)
{
    PROFILE(__func__);
    mg_conv2d_shape s = *sh;
    size_t P = (size_t)s.oh * s.ow, N = (size_t)n * P, K = (size_t)s.c * s.kh * s.kw;
    float *col = w, *Z = w + K * N;
    im2col_all(col, x, sh, n);
    mg_dk_gemm(false, false, s.oc, (int)N, (int)K, 1.0f, wt, (int)K, col, (int)N, 0.0f, Z,
               (int)N);
    if (s.pool == MG_POOL_NONE) {
        each((size_t)n * s.oc * P, [=] HD(size_t i) {   /* y [n, oc, oh, ow] */
            size_t p = i % P, o = i / P % s.oc, b = i / P / s.oc;
            float v = Z[o * N + b * P + p] + bias[o];
            y[i] = s.relu ? (v > 0.0f ? v : 0.0f) : v;
        });
        return;
    }
    size_t Q = (size_t)s.ph * s.pw;
    each((size_t)n * s.oc * Q, [=] HD(size_t i) {   /* y [n, oc, ph, pw] */
        size_t q = i % Q, o = i / Q % s.oc, b = i / Q / s.oc;
        size_t py = q / s.pw, px = q % s.pw;
        const float *z = Z + o * N + b * P + 2 * py * s.ow + 2 * px;
        float v[4] = {z[0] + bias[o], z[1] + bias[o], z[s.ow] + bias[o], z[s.ow + 1] + bias[o]};
        unsigned bits = 0;
        if (s.pool == MG_POOL_AVG) {
            for (int k = 0; k < 4; k++) {
                if (s.relu && !(v[k] > 0.0f)) v[k] = 0.0f;
                else bits |= 1u << k;
            }
            y[i] = ((v[0] + v[1]) + (v[2] + v[3])) * 0.25f;
        } else {
            int k = 0;   /* the first maximum in row-major order */
            for (int j = 1; j < 4; j++)
                if (v[j] > v[k]) k = j;
            bool cut = s.relu && !(v[k] > 0.0f);
            y[i] = cut ? 0.0f : v[k];
            bits = cut ? 0u : 1u << k;
        }
        saved[i] = (uint8_t)bits;
    });
}

extern "C" void mg_dk_conv2d_backward(float *dx, float *dw, float *db, const float *dy,
                                      const float *y, const uint8_t *saved, const float *x,
                                      const float *wt, const mg_conv2d_shape *sh, int n,
                                      float *w)
{
    PROFILE(__func__);
    mg_conv2d_shape s = *sh;
    size_t P = (size_t)s.oh * s.ow, N = (size_t)n * P, K = (size_t)s.c * s.kh * s.kw;
    float *col = w, *dz = w + K * N, *dcol = dz + (size_t)s.oc * N;
    /* dz [oc, N]: the gradient before the pool and the ReLU. */
    each((size_t)s.oc * N, [=] HD(size_t i) {
        size_t o = i / N, b = i % N / P, p = i % P, oy = p / s.ow, ox = p % s.ow;
        if (s.pool == MG_POOL_NONE) {
            size_t j = (b * s.oc + o) * P + p;
            dz[i] = s.relu && !(y[j] > 0.0f) ? 0.0f : dy[j];
            return;
        }
        size_t py = oy / 2, px = ox / 2;
        if (py >= (size_t)s.ph || px >= (size_t)s.pw) {   /* the floor mode's dropped edge */
            dz[i] = 0.0f;
            return;
        }
        size_t j = ((b * s.oc + o) * s.ph + py) * s.pw + px;
        int k = (int)(oy % 2) * 2 + (int)(ox % 2);
        float g = dy[j] * (s.pool == MG_POOL_AVG ? 0.25f : 1.0f);
        dz[i] = saved[j] >> k & 1 ? g : 0.0f;
    });
    /* db += dz 1, dw += dz col^T */
    mg_dk_gemm(false, false, s.oc, 1, (int)N, 1.0f, dz, (int)N, dk_ones(N), 1, 1.0f, db, 1);
    im2col_all(col, x, sh, n);
    mg_dk_gemm(false, true, s.oc, (int)K, (int)N, 1.0f, dz, (int)N, col, (int)N, 1.0f, dw,
               (int)K);
    if (!dx) return;
    /* dcol = W^T dz, then each input element gathers its columns. */
    mg_dk_gemm(true, false, (int)K, (int)N, s.oc, 1.0f, wt, (int)K, dz, (int)N, 0.0f, dcol,
               (int)N);
    size_t HW = (size_t)s.h * s.w;
    each((size_t)n * s.c * HW, [=] HD(size_t i) {
        size_t b = i / HW / s.c, ci = i / HW % s.c;
        int iy = (int)(i % HW / s.w), ix = (int)(i % s.w);
        float acc = 0.0f;
        for (int ki = 0; ki < s.kh; ki++) {
            int ty = iy + s.pad - ki;
            if (ty < 0 || ty % s.stride || ty / s.stride >= s.oh) continue;
            for (int kj = 0; kj < s.kw; kj++) {
                int tx = ix + s.pad - kj;
                if (tx < 0 || tx % s.stride || tx / s.stride >= s.ow) continue;
                size_t r = (ci * s.kh + ki) * s.kw + kj;
                acc += dcol[r * N + b * P + (size_t)(ty / s.stride) * s.ow + tx / s.stride];
            }
        }
        dx[i] = acc;
    });
}

/* ---- Embedding ---------------------------------------------------------------------- */

/* wte holds the rows of tokens [lo, lo + vocab): other tokens add 0, as
 * a NULL wpe does (the CPU's kernel, src/tensor/seq.c). */
extern "C" void mg_dk_embedding_forward(float *y, const int32_t *tok, const float *wte, int lo,
                                        int vocab, const float *wpe, int n, int T, int d)
{
    PROFILE(__func__);
    size_t D = (size_t)d;
    each((size_t)n * T * d, [=] HD(size_t i) {
        size_t p = i / D, j = i % D, t = p % T;
        int k = tok[p] - lo;
        float a = k >= 0 && k < vocab ? wte[(size_t)k * D + j] : 0.0f;
        y[i] = wpe ? a + wpe[t * D + j] : a;
    });
}

/* gpe[t] += the sequences' dy at t; gte += onehot(tokens - lo)^T dy, a
 * GEMM over chunks of positions (the one-hot matrix at most 16M floats). */
extern "C" void mg_dk_embedding_backward(float *gte, float *gpe, const float *dy,
                                         const int32_t *tok, int lo, int vocab, int n, int T,
                                         int d)
{
    PROFILE(__func__);
    size_t D = (size_t)d, N = (size_t)n * T, TD = (size_t)T * D;
    each(TD, [=] HD(size_t k) {
        float s = 0.0f;
        for (int b = 0; b < n; b++) s += dy[b * TD + k];
        gpe[k] += s;
    });
    size_t chunk = ((size_t)16 << 20) / (size_t)vocab;
    if (chunk < 1) chunk = 1;
    if (chunk > N) chunk = N;
    for (size_t p0 = 0; p0 < N; p0 += chunk) {
        size_t c = N - p0 < chunk ? N - p0 : chunk;
        float *oh = (float *)dk_ws((size_t)vocab * c * sizeof(float));
        each((size_t)vocab * c, [=] HD(size_t i) {
            size_t v = i / c, p = i % c;
            oh[i] = tok[p0 + p] - lo == (int32_t)v ? 1.0f : 0.0f;
        });
        mg_dk_gemm(false, false, vocab, d, (int)c, 1.0f, oh, (int)c, dy + p0 * D, d, 1.0f, gte, d);
    }
}
