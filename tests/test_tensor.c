/* Tests of src/tensor: kernels against hand-computed answers (GEMM,
 * im2col, convolution, pooling) and the fast convolutions (chunked
 * im2col + GEMM with fused ReLU/pool epilogues, the direct one-channel
 * kernels, the kernels with images in the vector lanes) against a direct
 * double-precision convolution, forward and both backward passes, and the
 * lanes kernels against im2col + GEMM. */
#include "harness.h"
#include "multigrad/tensor.h"

TEST(tensor_threads)
{
    /* One BLAS thread per process unless MG_THREADS asks for more. */
    CHECK_EQ(mg_get_threads(), mg_env_long("MG_THREADS", 1));
    mg_set_threads(2);
    CHECK_EQ(mg_get_threads(), 2);
    mg_set_threads(1);
    CHECK_EQ(mg_get_threads(), 1);
}

TEST(tensor_gemm_known_answers)
{
    /* A = [1 2 3; 4 5 6], B = [7 8; 9 10; 11 12]: AB = [58 64; 139 154]. */
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {7, 8, 9, 10, 11, 12};
    float C[4] = {1, 1, 1, 1};
    mg_gemm(false, false, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2);
    CHECK(C[0] == 58 && C[1] == 64 && C[2] == 139 && C[3] == 154);
    /* beta accumulates, alpha scales. */
    mg_gemm(false, false, 2, 2, 3, 0.5f, A, 3, B, 2, 1.0f, C, 2);
    CHECK(C[0] == 87 && C[3] == 231);
    /* A^T (A stored [3,2] = the transpose) and B^T (stored [2,3]). */
    float At[6] = {1, 4, 2, 5, 3, 6}, Bt[6] = {7, 9, 11, 8, 10, 12};
    mg_gemm(true, true, 2, 2, 3, 1.0f, At, 2, Bt, 3, 0.0f, C, 2);
    CHECK(C[0] == 58 && C[1] == 64 && C[2] == 139 && C[3] == 154);
    /* K = 0 scales C by beta only. */
    mg_gemm(false, false, 2, 2, 0, 1.0f, A, 1, B, 2, 2.0f, C, 2);
    CHECK(C[0] == 116 && C[3] == 308);
}

TEST(tensor_im2col_known_answer_and_adjoint)
{
    /* x = [1 2 3; 4 5 6; 7 8 9], 2x2 kernel, stride 2, pad 1: 2x2 outputs. */
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    float col[4 * 4];
    mg_im2col(col, 4, x, 1, 3, 3, 2, 2, 2, 1, 2, 2);
    float expect[16] = {
        0, 0, 0, 5,   /* tap (0,0): x[-1+2oy][-1+2ox] */
        0, 0, 4, 6,   /* tap (0,1) */
        0, 2, 0, 8,   /* tap (1,0) */
        1, 3, 7, 9,   /* tap (1,1) */
    };
    for (int i = 0; i < 16; i++) CHECK_EQ(col[i], expect[i]);
    /* <col2im(c), x> == <c, im2col(x)> for random c, x (stride 2, pad 1, 2 channels). */
    mg_rng r;
    mg_rng_init(&r, 1);
    float xx[2 * 7 * 6], cc[2 * 9 * 4 * 3], ic[2 * 9 * 4 * 3], back[2 * 7 * 6] = {0};
    for (int i = 0; i < 84; i++) xx[i] = mg_rng_uniform(&r) - 0.5f;
    for (int i = 0; i < 216; i++) cc[i] = mg_rng_uniform(&r) - 0.5f;
    int oh = (7 + 2 - 3) / 2 + 1, ow = (6 + 2 - 3) / 2 + 1;
    CHECK_EQ(oh * ow, 12);
    mg_im2col(ic, 12, xx, 2, 7, 6, 3, 3, 2, 1, oh, ow);
    mg_col2im(back, cc, 12, 2, 7, 6, 3, 3, 2, 1, oh, ow);
    double a = 0, b = 0;
    for (int i = 0; i < 216; i++) a += (double)cc[i] * ic[i];
    for (int i = 0; i < 84; i++) b += (double)back[i] * xx[i];
    CHECK_NEAR(a, b, 1e-5);
}

TEST(tensor_conv_known_answer)
{
    /* 1 channel 3x3 input, one 2x2 filter [1 0; 0 -1], bias 0.5, stride 1. */
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 0, 0, -1}, b = 0.5f, y[4];
    mg_conv2d_shape s;
    CHECK(mg_conv2d_shape_init(&s, 1, 3, 3, 1, 2, 2, 1, 0, false, MG_POOL_NONE));
    CHECK(s.oh == 2 && s.ow == 2 && s.ph == 2);
    float *ws = malloc(mg_conv2d_workspace(&s, 1) * sizeof(float));
    mg_conv2d_forward(y, NULL, x, w, &b, &s, 1, ws);
    for (int i = 0; i < 4; i++) CHECK_EQ(y[i] * 2, -7);   /* x[p] - x[p+4] + 0.5 = -3.5 */
    /* Backward of sum(y): dW[k] = sum of the inputs under tap k, db = 4,
     * dx = how many outputs each input feeds times the tap sign. */
    float dy[4] = {1, 1, 1, 1}, dw[4] = {0}, db = 0, dx[9];
    mg_conv2d_backward(dx, dw, &db, dy, y, NULL, x, w, &s, 1, ws);
    CHECK(dw[0] == 12 && dw[1] == 16 && dw[2] == 24 && dw[3] == 28 && db == 4);
    float edx[9] = {1, 1, 0, 1, 0, -1, 0, -1, -1};
    for (int i = 0; i < 9; i++) CHECK_EQ(dx[i], edx[i]);
    /* Impossible geometry is refused. */
    CHECK(!mg_conv2d_shape_init(&s, 1, 3, 3, 1, 5, 5, 1, 0, false, MG_POOL_NONE));
    CHECK(!mg_conv2d_shape_init(&s, 1, 3, 3, 1, 3, 3, 1, 0, false, MG_POOL_AVG));
    free(ws);
}

TEST(tensor_pool_known_answers)
{
    /* 5x5 plane, 2x2/2 pools in floor mode use the top-left 4x4 only. */
    float x[25];
    for (int i = 0; i < 25; i++) x[i] = (float)i;
    x[0] = x[1] = 6;   /* a tie in the first window: 6 at 0, 1 and 6 */
    float y[4], dx[25];
    int32_t arg[4];
    mg_avgpool2d_forward(y, x, 1, 5, 5, 2, 2);
    CHECK(y[0] == (6 + 6 + 5 + 6) / 4.0f && y[1] == (2 + 3 + 7 + 8) / 4.0f);
    CHECK(y[2] == (10 + 11 + 15 + 16) / 4.0f && y[3] == (12 + 13 + 17 + 18) / 4.0f);
    mg_maxpool2d_forward(y, arg, x, 1, 5, 5, 2, 2);
    CHECK(y[0] == 6 && arg[0] == 0);   /* first maximum in row-major order */
    CHECK(y[1] == 8 && arg[1] == 8 && y[3] == 18 && arg[3] == 18);
    float dy[4] = {1, 2, 3, 4};
    mg_maxpool2d_backward(dx, dy, arg, 1, 5, 5, 2, 2);
    CHECK(dx[0] == 1 && dx[1] == 0 && dx[6] == 0 && dx[8] == 2 && dx[16] == 3 && dx[18] == 4);
    CHECK(dx[4] == 0 && dx[24] == 0);
    mg_avgpool2d_backward(dx, dy, 1, 5, 5, 2, 2);
    CHECK(dx[0] == 0.25f && dx[6] == 0.25f && dx[2] == 0.5f && dx[18] == 1.0f);
    CHECK(dx[4] == 0 && dx[20] == 0 && dx[24] == 0);
    /* 3x3 windows, stride 1. */
    float z[16];
    for (int i = 0; i < 16; i++) z[i] = (float)i;
    mg_avgpool2d_forward(y, z, 1, 4, 4, 3, 1);
    CHECK(y[0] == 5 && y[1] == 6 && y[2] == 9 && y[3] == 10);
}

/* ---- The fast convolution against a direct one in double ------------- */

typedef struct {
    int c, h, w, oc, k, stride, pad;
    bool relu;
    mg_pool_kind pool;
    int n;
} conv_case;

static double ref_z(const conv_case *t, const float *x, const float *w, const float *b, int i,
                    int o, int oy, int ox)
{
    double z = b[o];
    for (int ci = 0; ci < t->c; ci++)
        for (int ki = 0; ki < t->k; ki++)
            for (int kj = 0; kj < t->k; kj++) {
                int iy = oy * t->stride - t->pad + ki, ix = ox * t->stride - t->pad + kj;
                if (iy < 0 || iy >= t->h || ix < 0 || ix >= t->w) continue;
                z += (double)w[((o * t->c + ci) * t->k + ki) * t->k + kj] *
                     x[((size_t)(i * t->c + ci) * t->h + iy) * t->w + ix];
            }
    return z;
}

/* A convolution test's input, weights, bias and output gradient from seed. */
static void conv_inputs(uint64_t seed, float *x, size_t nx, float *w, size_t nw, float *b, int oc,
                        float *dy, size_t ny)
{
    mg_rng r;
    mg_rng_init(&r, seed);
    for (size_t i = 0; i < nx; i++) x[i] = mg_rng_uniform(&r) - 0.5f;
    for (size_t i = 0; i < nw; i++) w[i] = mg_rng_uniform(&r) - 0.5f;
    for (int i = 0; i < oc; i++) b[i] = 0.2f * (mg_rng_uniform(&r) - 0.5f);
    for (size_t i = 0; i < ny; i++) dy[i] = mg_rng_uniform(&r) - 0.5f;
}

static void check_conv(const conv_case *t, uint64_t seed)
{
    mg_conv2d_shape s;
    CHECK(mg_conv2d_shape_init(&s, t->c, t->h, t->w, t->oc, t->k, t->k, t->stride, t->pad,
                               t->relu, t->pool));
    int oh = s.oh, ow = s.ow, ph = s.ph, pw = s.pw;
    size_t nx = (size_t)t->n * t->c * t->h * t->w, nw = (size_t)t->oc * t->c * t->k * t->k;
    size_t ny = (size_t)t->n * t->oc * ph * pw, nz = (size_t)t->n * t->oc * oh * ow;
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc(t->oc * 4), *y = malloc(ny * 4);
    float *dy = malloc(ny * 4), *dx = malloc(nx * 4), *dw = calloc(nw, 4), *db = calloc(t->oc, 4);
    double *z = malloc(nz * 8), *gz = calloc(nz, 8);
    uint8_t *saved = malloc(mg_conv2d_saved_bytes(&s) * t->n + 1);
    float *ws = malloc(mg_conv2d_workspace(&s, t->n) * 4);
    conv_inputs(seed, x, nx, w, nw, b, t->oc, dy, ny);
    mg_conv2d_forward(y, saved, x, w, b, &s, t->n, ws);
    /* Without dx first (the direct path when it applies), then with. */
    float *dw0 = calloc(nw, 4), *db0 = calloc(t->oc, 4);
    mg_conv2d_backward(NULL, dw0, db0, dy, y, saved, x, w, &s, t->n, ws);
    mg_conv2d_backward(dx, dw, db, dy, y, saved, x, w, &s, t->n, ws);
    for (size_t i = 0; i < nw; i++) CHECK_NEAR(dw0[i], dw[i], 1e-4);
    for (int i = 0; i < t->oc; i++) CHECK_NEAR(db0[i], db[i], 1e-4);
    free(dw0);
    free(db0);
    /* Reference forward, then the gradient of each pre-activation. */
    for (int i = 0; i < t->n; i++)
        for (int o = 0; o < t->oc; o++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++)
                    z[((size_t)(i * t->oc + o) * oh + oy) * ow + ox] = ref_z(t, x, w, b, i, o, oy, ox);
    for (int i = 0; i < t->n; i++)
        for (int o = 0; o < t->oc; o++) {
            double *zp = z + (size_t)(i * t->oc + o) * oh * ow, *gp = gz + (size_t)(i * t->oc + o) * oh * ow;
            const float *yp = y + (size_t)(i * t->oc + o) * ph * pw, *gy = dy + (size_t)(i * t->oc + o) * ph * pw;
            for (int py = 0; py < ph; py++)
                for (int px = 0; px < pw; px++) {
                    double out, g = gy[py * pw + px];
                    if (t->pool == MG_POOL_NONE) {
                        double v = zp[py * ow + px];
                        out = t->relu && v <= 0 ? 0 : v;
                        gp[py * ow + px] = t->relu && v <= 0 ? 0 : g;
                    } else {
                        int idx[4] = {2 * py * ow + 2 * px, 2 * py * ow + 2 * px + 1,
                                      (2 * py + 1) * ow + 2 * px, (2 * py + 1) * ow + 2 * px + 1};
                        if (t->pool == MG_POOL_AVG) {
                            out = 0;
                            for (int q = 0; q < 4; q++) {
                                double v = zp[idx[q]];
                                bool on = !t->relu || v > 0;
                                out += on ? v / 4 : 0;
                                gp[idx[q]] = on ? g / 4 : 0;
                            }
                        } else {
                            int a = 0;
                            for (int q = 1; q < 4; q++)
                                if (zp[idx[q]] > zp[idx[a]]) a = q;
                            out = zp[idx[a]];
                            if (t->relu && out <= 0) out = 0;
                            else gp[idx[a]] = g;
                        }
                    }
                    CHECK_MSG(fabs(yp[py * pw + px] - out) < 1e-5, "y[%d,%d,%d,%d]: %g vs %g",
                              i, o, py, px, yp[py * pw + px], out);
                }
        }
    /* dW, db and dx from the pre-activation gradients. */
    for (int o = 0; o < t->oc; o++) {
        double sb = 0;
        for (int i = 0; i < t->n; i++)
            for (int p = 0; p < oh * ow; p++) sb += gz[(size_t)(i * t->oc + o) * oh * ow + p];
        CHECK_NEAR(db[o], sb, 1e-4);
    }
    double *rdx = calloc(nx, 8), *rdw = calloc(nw, 8);
    for (int i = 0; i < t->n; i++)
        for (int o = 0; o < t->oc; o++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    double g = gz[((size_t)(i * t->oc + o) * oh + oy) * ow + ox];
                    if (g == 0) continue;
                    for (int ci = 0; ci < t->c; ci++)
                        for (int ki = 0; ki < t->k; ki++)
                            for (int kj = 0; kj < t->k; kj++) {
                                int iy = oy * t->stride - t->pad + ki, ix = ox * t->stride - t->pad + kj;
                                if (iy < 0 || iy >= t->h || ix < 0 || ix >= t->w) continue;
                                size_t xi = ((size_t)(i * t->c + ci) * t->h + iy) * t->w + ix;
                                size_t wi = (size_t)((o * t->c + ci) * t->k + ki) * t->k + kj;
                                rdx[xi] += g * w[wi];
                                rdw[wi] += g * x[xi];
                            }
                }
    for (size_t i = 0; i < nw; i++) CHECK_MSG(fabs(dw[i] - rdw[i]) < 1e-4, "dw[%zu]: %g vs %g", i, dw[i], rdw[i]);
    for (size_t i = 0; i < nx; i++) CHECK_MSG(fabs(dx[i] - rdx[i]) < 1e-5, "dx[%zu]: %g vs %g", i, dx[i], rdx[i]);
    free(x); free(w); free(b); free(y); free(dy); free(dx); free(dw); free(db);
    free(z); free(gz); free(saved); free(ws); free(rdx); free(rdw);
}

TEST(tensor_conv_matches_direct)
{
    conv_case cases[] = {
        {1, 28, 28, 6, 5, 1, 2, true, MG_POOL_MAX, 3},     /* lenet5 conv1 */
        {6, 14, 14, 16, 5, 1, 0, true, MG_POOL_MAX, 3},    /* lenet5 conv2 */
        {1, 28, 28, 20, 3, 1, 0, true, MG_POOL_AVG, 2},    /* lenet-d2l conv1 */
        {20, 13, 13, 50, 5, 1, 0, true, MG_POOL_AVG, 2},   /* lenet-d2l conv2 (9x9: floor) */
        {3, 9, 8, 4, 3, 2, 1, false, MG_POOL_NONE, 3},     /* stride 2, padding 1 */
        {2, 7, 7, 3, 3, 3, 2, true, MG_POOL_NONE, 2},      /* stride 3, padding 2 */
        {2, 9, 9, 3, 3, 1, 0, false, MG_POOL_AVG, 2},
        {2, 9, 9, 3, 3, 1, 0, false, MG_POOL_MAX, 2},
        {1, 12, 11, 3, 3, 1, 1, true, MG_POOL_NONE, 3},    /* one channel, no pool */
        {1, 10, 30, 2, 4, 1, 0, false, MG_POOL_NONE, 2},   /* one channel, 4x4 */
        {1, 9, 9, 2, 2, 1, 0, false, MG_POOL_MAX, 2},      /* one channel, 2x2, 8x8 */
        {1, 40, 40, 2, 3, 1, 1, true, MG_POOL_AVG, 2},     /* 40 columns: two segments */
        {3, 12, 36, 2, 3, 1, 1, true, MG_POOL_MAX, 2},     /* 36 columns, 3 channels */
        {2, 10, 35, 2, 3, 1, 0, true, MG_POOL_AVG, 2},     /* odd 33 columns */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_conv(&cases[i], 100 + i);
}

/* The same with the portable C kernels (MG_KERNELS=generic), so both
 * paths are checked on machines with AVX-512. */
TEST(tensor_conv_generic_kernels_match_direct)
{
    setenv("MG_KERNELS", "generic", 1);
    conv_case cases[] = {
        {1, 28, 28, 6, 5, 1, 2, true, MG_POOL_MAX, 2},
        {20, 13, 13, 50, 5, 1, 0, true, MG_POOL_AVG, 2},
        {3, 9, 8, 4, 3, 2, 1, false, MG_POOL_NONE, 2},
        {1, 12, 11, 3, 3, 1, 1, true, MG_POOL_NONE, 2},
        {2, 10, 35, 2, 3, 1, 0, true, MG_POOL_AVG, 2},
    };
    mg_conv2d_shape s;
    CHECK(mg_conv2d_shape_init(&s, 1, 28, 28, 6, 5, 5, 1, 2, true, MG_POOL_MAX));
    CHECK(!s.simd && !s.direct);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_conv(&cases[i], 200 + i);
}

/* Shapes for the lanes path: channels, kernel widths 1..5, padding, tiles
 * of a row (1..5 pixels), output channels off the register block, batches
 * off the 16 lanes (one image, a group and a bit, a last group of one). */
static const conv_case lanes_cases[] = {
    {2, 5, 5, 1, 1, 1, 0, false, MG_POOL_NONE, 1},
    {3, 7, 11, 7, 2, 1, 0, true, MG_POOL_MAX, 3},
    {5, 9, 9, 13, 3, 1, 1, true, MG_POOL_AVG, 17},
    {7, 8, 13, 6, 4, 1, 2, false, MG_POOL_NONE, 5},
    {3, 11, 6, 9, 5, 1, 0, true, MG_POOL_AVG, 33},
    {4, 6, 6, 4, 3, 1, 1, false, MG_POOL_MAX, 16},
    {2, 3, 30, 5, 3, 1, 0, true, MG_POOL_NONE, 4},      /* one row of 28: six tiles */
    {1, 40, 40, 3, 3, 1, 1, true, MG_POOL_MAX, 2},      /* one channel, too wide for direct */
    {6, 14, 14, 16, 5, 1, 0, true, MG_POOL_MAX, 20},    /* lenet5 conv2: blocks of 4 */
    {20, 13, 13, 50, 5, 1, 0, true, MG_POOL_AVG, 19},   /* lenet-d2l conv2 */
};

static bool have_avx512_kernels(void) { return mg_kernels()->own == MG_SIMD_AVX512; }

/* The lanes kernels and im2col + GEMM on the same data: outputs, and each
 * backward after the other's forward (the saved masks are shared). */
static void check_lanes_vs_gemm(const conv_case *t, uint64_t seed)
{
    mg_conv2d_shape s, g;
    CHECK(mg_conv2d_shape_init(&s, t->c, t->h, t->w, t->oc, t->k, t->k, t->stride, t->pad,
                               t->relu, t->pool));
    CHECK(s.lanes);
    g = s;
    g.lanes = false;
    size_t nx = (size_t)t->n * t->c * t->h * t->w, nw = (size_t)t->oc * t->c * t->k * t->k;
    size_t ny = (size_t)t->n * t->oc * s.ph * s.pw, nsv = mg_conv2d_saved_bytes(&s) * t->n + 1;
    size_t ws_s = mg_conv2d_workspace(&s, t->n), ws_g = mg_conv2d_workspace(&g, t->n);
    size_t nws = ws_s > ws_g ? ws_s : ws_g;
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc(t->oc * 4), *dy = malloc(ny * 4);
    float *y[2] = {malloc(ny * 4), malloc(ny * 4)}, *dx[2] = {malloc(nx * 4), malloc(nx * 4)};
    float *dw[2] = {calloc(nw, 4), calloc(nw, 4)}, *db[2] = {calloc(t->oc, 4), calloc(t->oc, 4)};
    uint8_t *saved[2] = {calloc(nsv, 1), calloc(nsv, 1)};
    float *ws = malloc(nws * 4);
    conv_inputs(seed, x, nx, w, nw, b, t->oc, dy, ny);
    const mg_conv2d_shape *sh[2] = {&s, &g};
    for (int k = 0; k < 2; k++) mg_conv2d_forward(y[k], saved[k], x, w, b, sh[k], t->n, ws);
    for (size_t i = 0; i < ny; i++)
        CHECK_MSG(fabs(y[0][i] - y[1][i]) < 1e-5, "y[%zu]: %g vs %g", i, y[0][i], y[1][i]);
    /* Each backward from the other path's forward. */
    for (int k = 0; k < 2; k++)
        mg_conv2d_backward(dx[k], dw[k], db[k], dy, y[1 - k], saved[1 - k], x, w, sh[k], t->n, ws);
    for (size_t i = 0; i < nw; i++)
        CHECK_MSG(fabs(dw[0][i] - dw[1][i]) < 1e-4, "dw[%zu]: %g vs %g", i, dw[0][i], dw[1][i]);
    for (int i = 0; i < t->oc; i++) CHECK_NEAR(db[0][i], db[1][i], 1e-4);
    for (size_t i = 0; i < nx; i++)
        CHECK_MSG(fabs(dx[0][i] - dx[1][i]) < 1e-5, "dx[%zu]: %g vs %g", i, dx[0][i], dx[1][i]);
    free(x); free(w); free(b); free(dy); free(ws);
    for (int k = 0; k < 2; k++) {
        free(y[k]); free(dx[k]); free(dw[k]); free(db[k]); free(saved[k]);
    }
}

TEST(tensor_conv_lanes_match_direct_and_gemm)
{
    if (!have_avx512_kernels()) mgt_skip("no AVX-512 kernels in this build or on this CPU");
    for (size_t i = 0; i < sizeof lanes_cases / sizeof lanes_cases[0]; i++) {
        check_conv(&lanes_cases[i], 300 + i);
        check_lanes_vs_gemm(&lanes_cases[i], 400 + i);
    }
    /* Outside its limits the lanes path is not chosen: stride 2, kernel
     * rows of 6, a group beyond the cache budget. */
    mg_conv2d_shape s;
    CHECK(mg_conv2d_shape_init(&s, 3, 9, 9, 4, 3, 3, 2, 1, false, MG_POOL_NONE) && !s.lanes);
    CHECK(mg_conv2d_shape_init(&s, 3, 9, 9, 4, 6, 6, 1, 0, false, MG_POOL_NONE) && !s.lanes);
    CHECK(mg_conv2d_shape_init(&s, 64, 56, 56, 64, 3, 3, 1, 1, true, MG_POOL_NONE) && !s.lanes);
    CHECK(mg_conv2d_shape_init(&s, 20, 13, 13, 50, 5, 5, 1, 0, true, MG_POOL_AVG) && s.lanes);
}

/* The same shapes on the portable C path. */
TEST(tensor_conv_generic_kernels_odd_shapes)
{
    setenv("MG_KERNELS", "generic", 1);
    for (size_t i = 0; i < sizeof lanes_cases / sizeof lanes_cases[0]; i++) {
        mg_conv2d_shape s;
        const conv_case *t = &lanes_cases[i];
        CHECK(mg_conv2d_shape_init(&s, t->c, t->h, t->w, t->oc, t->k, t->k, t->stride, t->pad,
                                   t->relu, t->pool));
        CHECK(!s.simd && !s.lanes);
        check_conv(t, 500 + i);
    }
}

TEST(tensor_conv_chunked_matches_direct)
{
    /* A tiny chunk budget: the batch spans several im2col chunks, the last
     * one short. */
    setenv("MG_CONV_CHUNK_KB", "16", 1);
    conv_case t = {2, 6, 6, 4, 3, 1, 1, true, MG_POOL_AVG, 7};
    mg_conv2d_shape s;
    CHECK(mg_conv2d_shape_init(&s, 2, 6, 6, 4, 3, 3, 1, 1, true, MG_POOL_AVG));
    CHECK(s.chunk > 1 && s.chunk < 7 && 7 % s.chunk != 0 && !s.lanes);
    check_conv(&t, 7);
    /* The direct path's blocks too (one channel, 26x26 planes). */
    conv_case d = {1, 26, 26, 3, 3, 1, 0, true, MG_POOL_MAX, 7};
    CHECK(mg_conv2d_shape_init(&s, 1, 26, 26, 3, 3, 3, 1, 0, true, MG_POOL_MAX));
    check_conv(&d, 8);
    setenv("MG_KERNELS", "generic", 1);
    check_conv(&t, 9);
}

TEST(tensor_linear_and_relu)
{
    /* y = x W^T + b with W = [1 2; 3 4; 5 6] (3 outputs, 2 inputs). */
    float x[4] = {1, -1, 2, 0.5f}, w[6] = {1, 2, 3, 4, 5, 6}, b[3] = {0.5f, -10, 0};
    float y[6];
    mg_linear_forward(y, x, w, b, 2, 2, 3, false);
    float e[6] = {-0.5f, -11, -1, 3.5f, -2, 13};
    for (int i = 0; i < 6; i++) CHECK_EQ(y[i] * 2, e[i] * 2);
    mg_linear_forward(y, x, w, b, 2, 2, 3, true);
    CHECK(y[0] == 0 && y[1] == 0 && y[3] == 3.5f && y[5] == 13);
    float dy[6] = {1, 1, 1, 1, 1, 1}, dw[6] = {0}, db[3] = {0}, dx[4];
    mg_linear_backward(dx, dw, db, dy, y, x, w, 2, 2, 3, true);
    /* Only outputs (1,0) and (1,2) are active. */
    CHECK(db[0] == 1 && db[1] == 0 && db[2] == 1);
    CHECK(dw[0] == 2 && dw[1] == 0.5f && dw[4] == 2 && dw[5] == 0.5f && dw[2] == 0);
    CHECK(dx[0] == 0 && dx[1] == 0 && dx[2] == 6 && dx[3] == 8);
    float r[4] = {-1, 0, 2, -0.0f}, ry[4], rdx[4];
    mg_relu_forward(ry, r, 4);
    CHECK(ry[0] == 0 && ry[1] == 0 && ry[2] == 2 && ry[3] == 0);
    mg_relu_backward(rdx, (float[]){5, 5, 5, 5}, ry, 4);
    CHECK(rdx[0] == 0 && rdx[1] == 0 && rdx[2] == 5 && rdx[3] == 0);
}

/* GELU (forward, backward, and both at once) against double precision
 * over its whole range, in a vector long enough for the vectorised loops
 * (gelu.c is built with -ffast-math): finite everywhere. Every v below
 * about -10.2 gave NaN in the vector loop (an exp overflowing to inf),
 * which blew up a gpt-mini's training. */
TEST(tensor_gelu_is_finite_and_exact_over_its_range)
{
    enum { N = 1024 };
    static float x[N], y[N], y2[N], dx[N], dydx[N], ones[N];
    for (int i = 0; i < N; i++) {
        double t = (i - N / 2) / (double)(N / 2);   /* -1 .. 1 */
        double far = copysign(pow(10, 30 * fabs(t)), t);   /* up to 1e30 either way */
        x[i] = (float)(i % 3 == 0 ? 40 * t : i % 3 == 1 ? 12 * t : far);
        ones[i] = 1;
    }
    mg_gelu_forward(y, x, N);
    mg_gelu_backward(dx, ones, x, N);
    mg_gelu_forward_deriv(y2, dydx, x, N);
    for (int i = 0; i < N; i++) {
        double v = x[i], u = sqrt(2 / M_PI) * (v + 0.044715 * v * v * v);
        double sg = 1 / (1 + exp(-2 * u)), want = v * sg;   /* 0.5 (1 + tanh u) = sigmoid 2u */
        double du = 2 * sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
        double dwant = sg + v * du * sg * (1 - sg);
        CHECK_MSG(isfinite(y[i]) && isfinite(dx[i]) && y[i] == y2[i] && dx[i] == dydx[i],
                  "gelu(%g) = %g, derivative %g (both at once: %g, %g)", v, y[i], dx[i], y2[i],
                  dydx[i]);
        CHECK_MSG(fabs(y[i] - want) <= 1e-5 * fabs(want) + 1e-30, "gelu(%g) = %.9g, want %.9g",
                  v, y[i], want);
        CHECK_MSG(fabs(dx[i] - dwant) <= 1e-5 * fabs(dwant) + 1e-6, "gelu'(%g) = %.9g, want %.9g",
                  v, dx[i], dwant);
    }
}
