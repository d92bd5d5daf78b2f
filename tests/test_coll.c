/* Tests of the collective algorithms (src/comm/coll): the reduction
 * kernels and conversions, the selector, and every collective x op x dtype
 * x count x world size x algorithm through the in-process mock group of
 * coll_mock.h (threads as ranks, rendezvous channels, shared memory over
 * plain memory). Inputs are rank-dependent integers small enough that
 * every result is exact, so outputs are compared bit for bit.
 *
 * The same cases run through the public API in real processes over both
 * transports in tests/test_coll_proc.c. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include "harness.h"
#include "coll_mock.h"
#include "coll_cases.h"
#include "comm/coll/algos.h"
#include "multigrad/core.h"

typedef struct {
    mgt_world *w;
    int rank;
    mg__p2p *p;
    mg__algo algo;
} mock_ctx;

static mg_status mock_run(void *ctx, const mg_call *c)
{
    mock_ctx *m = ctx;
    return mgt_coll(m->p, c, m->algo);
}
static void *mock_galloc(void *ctx, size_t bytes)
{
    mock_ctx *m = ctx;
    return mgt_galloc(m->w, m->rank, bytes);
}
static void mock_greset(void *ctx)
{
    mock_ctx *m = ctx;
    mgt_greset(m->w, m->rank);
}

static int run_plan(mgt_world *w, int rank, mg__p2p *p, void *arg)
{
    plan *pl = arg;
    mock_ctx m = {w, rank, p, pl->algo};
    tenv e = {rank, p->size, mock_run, mock_galloc, mock_greset, &m};
    return ct_run_plan(&e, pl);
}

/* Run the sweep at world sizes 1..8 and 13; under a sanitizer
 * (mgt_sanitized) at 1 to 4 and 13, which still hold one rank, powers of
 * two and not, odd and even, and the largest. */
static void sweep(mg__algo algo, int shm, int gmem)
{
    setenv("MG_COLL_CHUNK", "4096", 1);   /* many chunks at small counts */
    int sizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 13};
    for (int si = 0; si < 9; si++) {
        int P = sizes[si];
        if (mgt_sanitized() && P > 4 && P < 13) continue;
        plan pl = {.algo = algo, .gmem = gmem};
        pthread_mutex_init(&pl.mu, NULL);
        ct_build_sweep(&pl, P);
        mgt_world *w = mgt_world_create(P, shm, MG__SHM_SLOT_MIN, gmem ? ct_sweep_gmem_bytes(P) : 0, 30);
        int failed = mgt_world_run(w, run_plan, &pl);
        mgt_world_destroy(w);
        CHECK_MSG(!failed, "P=%d: %d ranks failed: %s", P, failed, pl.err);
        free(pl.cases);
        pthread_mutex_destroy(&pl.mu);
    }
}

TEST_T(coll_sweep_ring, 180) { sweep(MG_ALGO_RING, 0, 0); }
TEST_T(coll_sweep_rd, 180) { sweep(MG_ALGO_RD, 0, 0); }
TEST_T(coll_sweep_tree, 180) { sweep(MG_ALGO_TREE, 0, 0); }
TEST_T(coll_sweep_central, 180) { sweep(MG_ALGO_CENTRAL, 0, 0); }
TEST_T(coll_sweep_shm_staged, 180) { sweep(MG_ALGO_SHM, 1, 0); }
TEST_T(coll_sweep_shm_direct, 180) { sweep(MG_ALGO_SHM, 1, 1); }
TEST_T(coll_sweep_auto_shm, 180) { sweep(MG_ALGO_AUTO, 1, 0); }

/* Group memory on some ranks only, or at different offsets on each: the
 * ranks must agree on the form (no hang) and stay exact. */
TEST_T(coll_shm_mixed_memory, 120)
{
    setenv("MG_COLL_CHUNK", "4096", 1);
    int sizes[] = {2, 3, 5};
    for (int gm = 2; gm <= 3; gm++)
        for (int si = 0; si < 3; si++) {
            int P = sizes[si];
            plan pl = {.algo = MG_ALGO_SHM, .gmem = gm};
            pthread_mutex_init(&pl.mu, NULL);
            ct_build_sweep(&pl, P);
            mgt_world *w = mgt_world_create(P, 1, MG__SHM_SLOT_MIN, ct_sweep_gmem_bytes(P), 30);
            int failed = mgt_world_run(w, run_plan, &pl);
            mgt_world_destroy(w);
            CHECK_MSG(!failed, "gmem=%d P=%d: %s", gm, P, pl.err);
            free(pl.cases);
            pthread_mutex_destroy(&pl.mu);
        }
}

/* ---- kernels and conversions ----------------------------------------- */

TEST(coll_reduce_kernels_exact)
{
    /* Every dtype x op, the three aliasing forms of reduce3, and the
     * multi-source form, against scalar arithmetic in long long. */
    enum { N = 301 };
    for (int d = 0; d < 7; d++)
        for (int op = 0; op < MG_OP_COUNT; op++) {
            mg_dtype t = ct_dtypes[d];
            size_t es = ct_dt_size[t];
            char a[N * 8], b[N * 8], dst[N * 8], want[N * 8], c3[N * 8];
            const void *srcs[3] = {a, b, c3};
            for (size_t i = 0; i < N; i++) {
                ct_put(a, i, t, (double)ct_rvalue(1, i, t, (mg_op)op, 3));
                ct_put(b, i, t, (double)ct_rvalue(2, i, t, (mg_op)op, 3));
                ct_put(c3, i, t, (double)ct_rvalue(3, i, t, (mg_op)op, 3));
            }
            /* Two sources: dst = a op b (AVG reduces as SUM, finish divides). */
            for (size_t i = 0; i < N; i++) {
                long long x = ct_rvalue(1, i, t, (mg_op)op, 3), y = ct_rvalue(2, i, t, (mg_op)op, 3);
                long long r = op == MG_PROD ? x * y : op == MG_MIN ? (x < y ? x : y)
                            : op == MG_MAX ? (x > y ? x : y) : x + y;
                ct_put(want, i, t, (double)r);
            }
            mg__reduce3(dst, a, b, N, t, (mg_op)op);
            CHECK_MSG(!memcmp(dst, want, N * es), "reduce3 %s %s", ct_dt_name[d], ct_op_name[op]);
            memcpy(dst, a, N * es);
            mg__reduce(dst, b, N, t, (mg_op)op);
            CHECK_MSG(!memcmp(dst, want, N * es), "reduce %s %s", ct_dt_name[d], ct_op_name[op]);
            memcpy(dst, b, N * es);
            mg__reduce3(dst, a, dst, N, t, (mg_op)op);
            CHECK_MSG(!memcmp(dst, want, N * es), "reduce3 dst==b %s %s", ct_dt_name[d], ct_op_name[op]);
            /* Three sources into two destinations, one of them a source. */
            char d2[N * 8];
            memcpy(dst, b, N * es);
            void *dsts[2] = {dst, d2};
            const void *s3[3] = {a, dst, c3};
            mg__reduce_multi(dsts, 2, s3, 3, N, t, (mg_op)op, 3, 2);
            for (size_t i = 0; i < N; i++) ct_put_reduced(want, i, t, (mg_op)op, 3, i, 1);
            CHECK_MSG(!memcmp(dst, want, N * es) && !memcmp(d2, want, N * es),
                      "reduce_multi %s %s", ct_dt_name[d], ct_op_name[op]);
            /* Non-temporal stores into an aligned destination. */
            char *big = mg_alloc(N * 8 * 4);
            void *bd[1] = {big};
            mg__reduce_multi(bd, 1, srcs, 3, N, t, (mg_op)op, 3, 0);
            CHECK_MSG(!memcmp(big, want, N * es), "reduce_multi nt %s %s", ct_dt_name[d], ct_op_name[op]);
            mg_free(big);
        }
}

TEST(coll_reduce_semantics)
{
    /* Integer SUM and PROD wrap; AVG truncates toward zero. */
    uint8_t u[2] = {200, 16}, v[2] = {100, 17};
    mg__reduce(u, v, 1, MG_U8, MG_SUM);
    CHECK_EQ(u[0], 44);
    mg__reduce(u + 1, v + 1, 1, MG_U8, MG_PROD);
    CHECK_EQ(u[1], (16 * 17) % 256);
    int32_t i[2] = {INT32_MAX, -7}, j[2] = {1, 0};
    mg__reduce(i, j, 2, MG_I32, MG_SUM);
    CHECK_EQ(i[0], INT32_MIN);
    mg__reduce_finish(i + 1, 1, MG_I32, MG_AVG, 2);
    CHECK_EQ(i[1], -3);
    int64_t l = INT64_MAX, m = 2;
    mg__reduce(&l, &m, 1, MG_I64, MG_PROD);
    CHECK_EQ(l, -2);
    /* Float MIN/MAX propagate NaN from either side. */
    float f[4] = {NAN, 1, 2, -1}, g[4] = {1, NAN, 3, -2};
    mg__reduce(f, g, 4, MG_F32, MG_MIN);
    CHECK(isnan(f[0]) && isnan(f[1]) && f[2] == 2 && f[3] == -2);
    double x[2] = {NAN, 5}, y[2] = {0, NAN};
    mg__reduce(x, y, 2, MG_F64, MG_MAX);
    CHECK(isnan(x[0]) && isnan(x[1]));
    uint16_t h[2] = {mg_f32_to_bf16(NAN), mg_f32_to_bf16(3)}, k[2] = {mg_f32_to_bf16(1),
                                                                         mg_f32_to_bf16(4)};
    mg__reduce(h, k, 2, MG_BF16, MG_MAX);
    CHECK(isnan(mg_bf16_to_f32(h[0])) && mg_bf16_to_f32(h[1]) == 4);
    /* AVG of halves divides in f32 and rounds once. */
    uint16_t a = mg_f32_to_f16(7);
    mg__reduce_finish(&a, 1, MG_F16, MG_AVG, 3);
    CHECK_EQ(a, mg_f32_to_f16(7.0f / 3.0f));
    /* Rounding of half sums: 2049 + 0 is not representable in f16. */
    uint16_t p = mg_f32_to_f16(2048), q = mg_f32_to_f16(1);
    mg__reduce(&p, &q, 1, MG_F16, MG_SUM);
    CHECK_EQ(mg_f16_to_f32(p), 2048);   /* 2049 ties to even */
}

TEST(coll_f16_bf16_conversions)
{
    /* Every f16 value converts to f32 and back unchanged (NaNs stay NaN). */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mg_f16_to_f32((uint16_t)h);
        uint16_t back = mg_f32_to_f16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            CHECK(isnan(f) && (back & 0x7c00) == 0x7c00 && (back & 0x3ff));
            continue;
        }
        CHECK_MSG(back == h, "f16 %#x -> %g -> %#x", h, (double)f, back);
    }
    /* Rounding to nearest even at the boundaries. */
    CHECK_EQ(mg_f32_to_f16(65504), 0x7bff);
    CHECK_EQ(mg_f32_to_f16(65519.99f), 0x7bff);
    CHECK_EQ(mg_f32_to_f16(65520), 0x7c00);
    CHECK_EQ(mg_f32_to_f16(1 + 1.0f / 2048), 0x3c00);           /* tie -> even */
    CHECK_EQ(mg_f32_to_f16(1 + 3.0f / 2048), 0x3c02);           /* tie -> even (up) */
    CHECK_EQ(mg_f32_to_f16(ldexpf(1, -24)), 0x0001);            /* smallest subnormal */
    CHECK_EQ(mg_f32_to_f16(ldexpf(1, -25)), 0x0000);            /* tie -> 0 */
    CHECK_EQ(mg_f32_to_f16(ldexpf(3, -26)), 0x0001);            /* 0.75 ulp -> 1 */
    CHECK_EQ(mg_f32_to_f16(-0.0f), 0x8000);
    CHECK_EQ(mg_f32_to_bf16(1 + 1.0f / 256), 0x3f80);           /* tie -> even */
    CHECK_EQ(mg_f32_to_bf16(1 + 3.0f / 256), 0x3f82);
    CHECK_EQ(mg_f32_to_bf16(INFINITY), 0x7f80);
    CHECK(isnan(mg_bf16_to_f32(mg_f32_to_bf16(NAN))));
    CHECK_EQ(mg_f32_to_bf16(3.0e38f), 0x7f62);
    /* The vector paths (F16C when built with it) agree with the scalar
     * conversions on random values, through a reduction with zero. */
    mg_rng r;
    mg_rng_init(&r, 5);
    enum { N = 4099 };
    static float f[N];
    static uint16_t hv[N], zero[N], out[N];
    for (int t = 0; t < 2; t++) {
        mg_dtype dt = t ? MG_BF16 : MG_F16;
        for (int i = 0; i < N; i++) {
            uint32_t bits = mg_rng_u32(&r);
            memcpy(&f[i], &bits, 4);
            if (isnan(f[i]) || (t == 0 && fabsf(f[i]) > 70000)) f[i] = mg_rng_normal(&r) * 1000;
            hv[i] = t ? mg_f32_to_bf16(f[i]) : mg_f32_to_f16(f[i]);
            zero[i] = 0;
        }
        mg__reduce3(out, hv, zero, N, dt, MG_SUM);
        for (int i = 0; i < N; i++) {
            uint16_t want = hv[i] == 0x8000 ? 0 : hv[i];   /* -0 + 0 = +0 */
            CHECK_MSG(out[i] == want, "%s[%d]: %#x vs %#x", t ? "bf16" : "f16", i, out[i], want);
        }
    }
}

TEST(coll_algo_names)
{
    for (int a = 0; a < MG_ALGO_COUNT; a++)
        CHECK_EQ(mg__algo_parse(mg__algo_name((mg__algo)a)), a);
    CHECK_EQ(mg__algo_parse("bogus"), -1);
    CHECK_EQ(mg__algo_parse(NULL), -1);
}

/* ---- every rank gets the same bits ----------------------------------- */

typedef struct {
    mg__algo algo;
    int gmem;
    mg_dtype dt;
    mg_op op;
    size_t count;
    char **in, **out;    /* per rank */
} ident_job;

static int ident_rank(mgt_world *w, int rank, mg__p2p *p, void *arg)
{
    ident_job *j = arg;
    size_t bytes = j->count * ct_dt_size[j->dt];
    char *buf = j->gmem ? mgt_galloc(w, rank, bytes) : mg_alloc(bytes);
    MG_ASSERT(buf);
    memcpy(buf, j->in[rank], bytes);
    mg_call c = {.coll = MG_COLL_ALL_REDUCE, .sendbuf = buf, .recvbuf = buf, .count = j->count,
                 .dtype = j->dt, .op = j->op};
    mg_status st = mgt_coll(p, &c, j->algo);
    if (st) printf("rank %d: %s\n", rank, mg_last_error());
    memcpy(j->out[rank], buf, bytes);
    if (!j->gmem) mg_free(buf);
    mgt_greset(w, rank);
    return st != MG_OK;
}

/* Random floats (with NaNs and signed zeros for MIN/MAX): the reduction
 * order may differ between algorithms, but within one all_reduce every
 * rank must end with identical bits (DDP replicas must not drift), close
 * to the exact sum. */
TEST_T(coll_all_reduce_bitwise_identical, 120)
{
    int sizes[] = {3, 5, 8};
    size_t counts[] = {1001, 70001};
    struct { mg__algo a; int shm, gmem; } algos[] = {
        {MG_ALGO_RING, 0, 0}, {MG_ALGO_RD, 0, 0}, {MG_ALGO_TREE, 0, 0},
        {MG_ALGO_SHM, 1, 0}, {MG_ALGO_SHM, 1, 1}, {MG_ALGO_CENTRAL, 0, 0}};
    struct { mg_dtype dt; mg_op op; } kinds[] = {
        {MG_F32, MG_SUM}, {MG_BF16, MG_SUM}, {MG_F32, MG_MIN}, {MG_F64, MG_MAX}, {MG_F16, MG_AVG}};
    mg_rng r;
    mg_rng_init(&r, 11);
    for (int si = 0; si < 3; si++)
        for (int ci = 0; ci < 2; ci++)
            for (int ki = 0; ki < 5; ki++)
                for (int ai = 0; ai < 6; ai++) {
                    int P = sizes[si];
                    size_t n = counts[ci], es = ct_dt_size[kinds[ki].dt];
                    ident_job j = {algos[ai].a, algos[ai].gmem, kinds[ki].dt, kinds[ki].op, n,
                                   calloc((size_t)P, sizeof(char *)), calloc((size_t)P, sizeof(char *))};
                    double *ref = calloc(n, sizeof *ref);
                    for (int q = 0; q < P; q++) {
                        j.in[q] = malloc(n * es);
                        j.out[q] = malloc(n * es);
                        for (size_t i = 0; i < n; i++) {
                            double v = mg_rng_normal(&r);
                            if (kinds[ki].op == MG_MIN || kinds[ki].op == MG_MAX) {
                                uint32_t u = mg_rng_below(&r, 50);
                                v = u == 0 ? NAN : u == 1 ? 0.0 : u == 2 ? -0.0 : v;
                            }
                            ct_put(j.in[q], i, kinds[ki].dt, v);
                            ref[i] += ct_get(j.in[q], i, kinds[ki].dt);
                        }
                    }
                    mgt_world *w = mgt_world_create(P, algos[ai].shm, MG__SHM_SLOT_MIN,
                                                    algos[ai].gmem ? n * es + 64 : 0, 30);
                    CHECK_EQ(mgt_world_run(w, ident_rank, &j), 0);
                    mgt_world_destroy(w);
                    for (int q = 1; q < P; q++)
                        CHECK_MSG(!memcmp(j.out[q], j.out[0], n * es),
                                  "P=%d n=%zu %s %s algo %s gmem %d: rank %d differs from rank 0",
                                  P, n, ct_dt_name[kinds[ki].dt], ct_op_name[kinds[ki].op],
                                  mg__algo_name(algos[ai].a), algos[ai].gmem, q);
                    if (kinds[ki].op == MG_SUM || kinds[ki].op == MG_AVG) {
                        /* Halves round every partial sum (|sum| < ~6). */
                        double tol = kinds[ki].dt == MG_F32 ? 1e-5 : kinds[ki].dt == MG_F16 ? 0.02 : 0.15;
                        for (size_t i = 0; i < n; i++) {
                            double want = kinds[ki].op == MG_AVG ? ref[i] / P : ref[i];
                            CHECK_CLOSE(ct_get(j.out[0], i, kinds[ki].dt), want, 1e-2, tol);
                        }
                    }
                    for (int q = 0; q < P; q++) free(j.in[q]), free(j.out[q]);
                    free(j.in);
                    free(j.out);
                    free(ref);
                }
}

/* The central family adds in rank order, ((x0 + x1) + x2) + ..., as one
 * process summing the ranks' vectors would: its float all_reduce equals
 * that sum bit for bit at any world size, and the ring's at two ranks
 * (where the order of an addition of two is all there is). */
TEST_T(coll_central_sums_in_rank_order, 60)
{
    size_t n = 30001;
    mg_rng r;
    mg_rng_init(&r, 5);
    for (int P = 2; P <= 8; P++) {
        mg__algo algos[] = {MG_ALGO_CENTRAL, MG_ALGO_RING};
        float *want = calloc(n, sizeof *want), *got[2] = {NULL, NULL};
        char *in[8];
        for (int q = 0; q < P; q++) {
            in[q] = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) {
                float v = mg_rng_normal(&r) * (float)(1 + q * 1000);
                memcpy(in[q] + i * sizeof v, &v, sizeof v);
                want[i] = q ? want[i] + v : v;
            }
        }
        for (int a = 0; a < (P == 2 ? 2 : 1); a++) {
            ident_job j = {algos[a], 0, MG_F32, MG_SUM, n, in, calloc((size_t)P, sizeof(char *))};
            for (int q = 0; q < P; q++) j.out[q] = malloc(n * sizeof(float));
            mgt_world *w = mgt_world_create(P, 0, MG__SHM_SLOT_MIN, 0, 30);
            CHECK_EQ(mgt_world_run(w, ident_rank, &j), 0);
            mgt_world_destroy(w);
            got[a] = (float *)(void *)j.out[0];
            for (int q = 1; q < P; q++) free(j.out[q]);
            free(j.out);
        }
        CHECK_MSG(!memcmp(got[0], want, n * sizeof(float)), "P=%d: central differs from the "
                  "sum in rank order", P);
        if (got[1])
            CHECK_MSG(!memcmp(got[0], got[1], n * sizeof(float)), "central and ring differ at 2");
        for (int q = 0; q < P; q++) free(in[q]);
        free(got[0]);
        free(got[1]);
        free(want);
    }
}

/* ---- large counts ------------------------------------------------------- */

static void run_cases_at(int P, mg__algo algo, int shm, int gmem, const tcase *cs, int ncs,
                         size_t gmem_bytes)
{
    plan pl = {.algo = algo, .gmem = gmem};
    pthread_mutex_init(&pl.mu, NULL);
    for (int i = 0; i < ncs; i++) ct_add_case(&pl, cs[i]);
    mgt_world *w = mgt_world_create(P, shm, MG__SHM_SLOT_BYTES, gmem ? gmem_bytes : 0, 60);
    int failed = mgt_world_run(w, run_plan, &pl);
    mgt_world_destroy(w);
    CHECK_MSG(!failed, "P=%d algo=%s gmem=%d: %s", P, mg__algo_name(algo), gmem, pl.err);
    free(pl.cases);
    pthread_mutex_destroy(&pl.mu);
}

/* Counts over a million, for each family (default chunk sizes). */
TEST_T(coll_large_counts, 180)
{
    size_t M = (size_t)1 << 20;
    struct { mg__algo a; int shm, gmem; } fam[] = {
        {MG_ALGO_RING, 0, 0}, {MG_ALGO_RD, 0, 0}, {MG_ALGO_TREE, 0, 0},
        {MG_ALGO_SHM, 1, 0}, {MG_ALGO_SHM, 1, 1}, {MG_ALGO_CENTRAL, 0, 0}};
    for (int f = 0; f < 6; f++) {
        int P = 2 + f % 3;   /* 2, 3, 4, 2, 3 */
        tcase cs[] = {
            {MG_COLL_ALL_REDUCE, MG_F32, MG_SUM, M + 3, 0, f % 2},
            {MG_COLL_REDUCE_SCATTER, MG_BF16, MG_AVG, M / (size_t)P + 1, 0, f % 3},
            {MG_COLL_ALL_GATHER, MG_I32, MG_SUM, M / (size_t)P + 3, 0, f % 3},
            {MG_COLL_BROADCAST, MG_U8, MG_SUM, 3 * M + 1, P - 1, 0},
            {MG_COLL_ALL_TO_ALL, MG_F64, MG_SUM, M / (size_t)P + 5, 0, 0},
            {MG_COLL_REDUCE, MG_I64, MG_MAX, M + 7, P / 2, 1},
        };
        run_cases_at(P, fam[f].a, fam[f].shm, fam[f].gmem, cs, 6, 2 * (M + 64) * 8 * 5);
    }
    /* Above the shared-memory algorithms' non-temporal threshold (16 MiB). */
    tcase nt[] = {
        {MG_COLL_ALL_REDUCE, MG_F32, MG_SUM, 4 * M + 3, 0, 0},
        {MG_COLL_REDUCE, MG_F32, MG_MAX, 4 * M + 5, 1, 0},
        {MG_COLL_ALL_REDUCE, MG_I32, MG_AVG, 4 * M + 1, 0, 1},
    };
    run_cases_at(2, MG_ALGO_SHM, 1, 0, nt, 3, 0);
    run_cases_at(3, MG_ALGO_SHM, 1, 1, nt, 3, 2 * (4 * M + 64) * 4 + 4096);
}

/* ---- selection ------------------------------------------------------------ */

/* The model prices every family by name, central too (which selection
 * never takes): its root moves (p - 1) vectors in and out, so against the
 * ring's 2(p-1)/p it costs about p times as much for large vectors. */
TEST(coll_time_by_family)
{
    const mg_link *l = mg_link_builtin("tcp");
    double A = l->latency, B = 1 / l->bandwidth, G = 1 / l->reduce, n = 64.0 * (1 << 20);
    for (int p = 2; p <= 8; p++) {
        double f1 = (double)(p - 1) / p;
        double ring = mg_coll_time_by("ring", MG_COLL_ALL_REDUCE, n, p, l);
        double central = mg_coll_time_by("central", MG_COLL_ALL_REDUCE, n, p, l);
        CHECK_CLOSE(ring, 2 * (p - 1) * A + 2 * f1 * n * B + f1 * n * G, 1e-12, 0);
        CHECK_CLOSE(central, 2 * (p - 1) * (A + n * B) + (p - 1) * n * G, 1e-12, 0);
        CHECK_CLOSE(central / ring, (double)p, 0.01, 0);
        CHECK(mg_coll_time_by("auto", MG_COLL_ALL_REDUCE, n, p, l) ==
              mg_coll_time(MG_COLL_ALL_REDUCE, n, p, l));
        CHECK(mg_coll_time(MG_COLL_ALL_REDUCE, n, p, l) <= ring);
    }
    CHECK(mg_coll_time_by("shm", MG_COLL_ALL_REDUCE, n, 4, l) < 0);
    CHECK(mg_coll_time_by("bogus", MG_COLL_ALL_REDUCE, n, 4, l) < 0);
    CHECK(mg_coll_time_by("central", MG_COLL_BROADCAST, n, 1, l) == 0);
}

TEST(coll_select_cost_model)
{
    mg__shm_view dummy = {0};
    mg__p2p tcp = {.rank = 0}, shm = {.rank = 0, .shm = &dummy};
    mg_call c = {.dtype = MG_F32, .op = MG_SUM};
    size_t counts[] = {1, 256, 1 << 18, 1 << 24, (size_t)1 << 26};
    int sizes[] = {2, 3, 4, 6, 8, 13};
    for (int si = 0; si < 6; si++)
        for (int k = 0; k <= MG_COLL_BARRIER; k++)
            for (int ci = 0; ci < 5; ci++) {
                tcp.size = shm.size = sizes[si];
                c.coll = (mg_coll)k;
                c.count = counts[ci];
                mg__algo a = mg__coll_select(&tcp, &c);
                CHECK(a == MG_ALGO_RING || a == MG_ALGO_RD || a == MG_ALGO_TREE);
                /* With every rank on one host, the direct algorithms win. */
                CHECK_EQ(mg__coll_select(&shm, &c), MG_ALGO_SHM);
            }
    /* TCP, two ranks: latency-bound -> recursive doubling, large -> ring. */
    tcp.size = 2;
    c.coll = MG_COLL_ALL_REDUCE;
    c.count = 1;
    CHECK_EQ(mg__coll_select(&tcp, &c), MG_ALGO_RD);
    c.count = (size_t)1 << 24;
    CHECK_EQ(mg__coll_select(&tcp, &c), MG_ALGO_RING);
    /* Six ranks, large: halving-doubling pays for the fold; ring wins. */
    tcp.size = 6;
    CHECK_EQ(mg__coll_select(&tcp, &c), MG_ALGO_RING);
    /* A power of two: halving-doubling moves the ring's bytes in fewer steps. */
    tcp.size = 8;
    CHECK_EQ(mg__coll_select(&tcp, &c), MG_ALGO_RD);
    CHECK(mg__rd_use_halving(&tcp, (size_t)4 << 24, (size_t)1 << 24));
    CHECK(!mg__rd_use_halving(&tcp, 4, 1));
    /* Large broadcast: the pipelined chain; small gather: the binomial
     * tree (which the rd family also uses for gather). */
    tcp.size = 4;
    c.coll = MG_COLL_BROADCAST;
    CHECK_EQ(mg__coll_select(&tcp, &c), MG_ALGO_RING);
    c.coll = MG_COLL_GATHER;
    c.count = 1;
    mg__algo g = mg__coll_select(&tcp, &c);
    CHECK(g == MG_ALGO_RD || g == MG_ALGO_TREE);
}

typedef struct {
    mg_status want;
    int skip_rank;
    mg__algo algo;
} algo_job;

static int small_all_reduce_rank(mgt_world *w, int rank, mg__p2p *p, void *arg)
{
    algo_job *j = arg;
    (void)w;
    if (rank == j->skip_rank) return 0;
    float v[8], out[8];
    for (int i = 0; i < 8; i++) v[i] = (float)(rank + i);
    mg_call c = {.coll = MG_COLL_ALL_REDUCE, .sendbuf = v, .recvbuf = out, .count = 8,
                 .dtype = MG_F32, .op = MG_SUM};
    mg_status st = mgt_coll(p, &c, j->algo);
    if (st != j->want) {
        printf("rank %d: got %s, want %s: %s\n", rank, mg_status_name(st),
               mg_status_name(j->want), mg_last_error());
        return 1;
    }
    if (!st)
        for (int i = 0; i < 8; i++)
            if (out[i] != (float)(6 + 4 * i)) return 1;
    return 0;
}

static long msgs_for_all_reduce(int shm)
{
    algo_job j = {.want = MG_OK, .skip_rank = -1, .algo = MG_ALGO_AUTO};
    mgt_world *w = mgt_world_create(4, shm, MG__SHM_SLOT_MIN, 0, 10);
    CHECK_EQ(mgt_world_run(w, small_all_reduce_rank, &j), 0);
    long m = mgt_world_msgs(w);
    mgt_world_destroy(w);
    return m;
}

/* MG_ALGO forces a family: P=4 all_reduce of 8 floats sends 2(p-1)p = 24
 * messages by ring, 2(p-1) = 6 by tree, p log2 p = 8 by recursive
 * doubling, none by shm. */
TEST(coll_mg_algo_forces_tree)
{
    setenv("MG_ALGO", "tree", 1);
    CHECK_EQ(msgs_for_all_reduce(0), 6);
    CHECK_EQ(msgs_for_all_reduce(1), 6);
}

TEST(coll_mg_algo_forces_ring)
{
    setenv("MG_ALGO", "ring", 1);
    CHECK_EQ(msgs_for_all_reduce(0), 24);
}

TEST(coll_mg_algo_shm_without_shm_falls_back)
{
    setenv("MG_ALGO", "shm", 1);
    CHECK_EQ(msgs_for_all_reduce(0), 8);   /* the model's choice: rd */
    CHECK_EQ(msgs_for_all_reduce(1), 0);
}

TEST(coll_mg_algo_unknown_is_auto)
{
    setenv("MG_ALGO", "bogus", 1);
    CHECK_EQ(msgs_for_all_reduce(0), 8);
}

/* A rank that never joins: the others fail with MG_ETIMEOUT at their
 * deadline rather than hang, whatever the algorithm. */
TEST_T(coll_missing_rank_times_out, 60)
{
    mg__algo algos[] = {MG_ALGO_RING, MG_ALGO_RD, MG_ALGO_TREE, MG_ALGO_SHM, MG_ALGO_CENTRAL};
    for (int a = 0; a < 5; a++) {
        algo_job j = {.want = MG_ETIMEOUT, .skip_rank = 2, .algo = algos[a]};
        mgt_world *w = mgt_world_create(3, algos[a] == MG_ALGO_SHM, MG__SHM_SLOT_MIN, 0, 0.5);
        double t0 = mg_now();
        CHECK_EQ(mgt_world_run(w, small_all_reduce_rank, &j), 0);
        CHECK(mg_now() - t0 < 5);
        mgt_world_destroy(w);
    }
}

