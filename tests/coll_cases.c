/* The collective test cases shared by tests/test_coll.c (the algorithms
 * through the in-process mock) and tests/test_coll_proc.c (real processes
 * through the public API): exact rank-dependent inputs, the expected
 * outputs, and a runner that checks every output, that inputs stay
 * untouched and that non-roots' outputs are not written. */
#define _GNU_SOURCE
#include <stdarg.h>
#include "harness.h"
#include "coll_cases.h"

/* ---- values -------------------------------------------------------------- */

const mg_dtype ct_dtypes[7] = {MG_F32, MG_F64, MG_F16, MG_BF16, MG_I32, MG_I64, MG_U8};
const char *ct_dt_name[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
const char *ct_op_name[] = {"sum", "prod", "min", "max", "avg"};
const char *ct_coll_name[] = {"broadcast", "reduce", "all_reduce", "all_gather", "gather",
                                  "scatter", "reduce_scatter", "all_to_all", "barrier"};
const size_t ct_dt_size[] = {4, 8, 2, 2, 4, 8, 1};

static int is_signed(mg_dtype t) { return t != MG_U8; }
static int is_float(mg_dtype t) { return t <= MG_BF16; }

/* Largest magnitude a sum may reach and stay exact. */
static long long exact_limit(mg_dtype t)
{
    switch (t) {
    case MG_F16: return 2048;
    case MG_BF16: return 256;
    case MG_U8: return 255;
    case MG_F32: return 1 << 24;
    default: return 1 << 30;
    }
}

/* Input of element i from source s for a reduction with op. */
long long ct_rvalue(long long s, size_t i, mg_dtype t, mg_op op, int P)
{
    if (op == MG_PROD) {   /* +-1, +-2: products are +-2^k, k <= 13 */
        long long v = (i + (size_t)s) % 3 == 0 ? 2 : 1;
        return is_signed(t) && (i + 2 * (size_t)s) % 5 == 0 ? -v : v;
    }
    if (op == MG_MIN || op == MG_MAX) {
        long long M = t == MG_BF16 ? 256 : t == MG_U8 ? 251 : 2000;
        long long v = (long long)((i * 5 + (size_t)s * 11) % (size_t)M);
        return is_signed(t) ? v - M / 2 : v;
    }
    long long M = exact_limit(t) / P;
    if (M > 100003) M = 100003;
    if (M < 2) M = 2;
    long long v = (long long)((i * 7 + (size_t)s * 3) % (size_t)M);
    return is_signed(t) ? v - M / 2 : v;
}

/* Input of element i from source s for a data-movement collective. */
static long long cvalue(long long s, size_t i, mg_dtype t)
{
    long long v = (long long)((i * 13 + (size_t)s * 101) % 251);
    return is_signed(t) ? v - 125 : v;
}

void ct_put(void *buf, size_t i, mg_dtype t, double v)
{
    switch (t) {
    case MG_F32: ((float *)buf)[i] = (float)v; break;
    case MG_F64: ((double *)buf)[i] = v; break;
    case MG_F16: ((uint16_t *)buf)[i] = mg_f32_to_f16((float)v); break;
    case MG_BF16: ((uint16_t *)buf)[i] = mg_f32_to_bf16((float)v); break;
    case MG_I32: ((int32_t *)buf)[i] = (int32_t)(long long)v; break;
    case MG_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)(long long)v; break;
    }
}

double ct_get(const void *buf, size_t i, mg_dtype t)
{
    switch (t) {
    case MG_F32: return ((const float *)buf)[i];
    case MG_F64: return ((const double *)buf)[i];
    case MG_F16: return mg_f16_to_f32(((const uint16_t *)buf)[i]);
    case MG_BF16: return mg_bf16_to_f32(((const uint16_t *)buf)[i]);
    case MG_I32: return ((const int32_t *)buf)[i];
    case MG_I64: return (double)((const int64_t *)buf)[i];
    default: return ((const uint8_t *)buf)[i];
    }
}

/* The exact reduction over sources 0..P-1 of element i, stored as t. */
void ct_put_reduced(void *buf, size_t o, mg_dtype t, mg_op op, int P, size_t i,
                        long long salt)
{
    long long r = ct_rvalue(salt, i, t, op, P);
    for (int s = 1; s < P; s++) {
        long long v = ct_rvalue(s + salt, i, t, op, P);
        r = op == MG_PROD ? r * v : op == MG_MIN ? (v < r ? v : r) : op == MG_MAX ? (v > r ? v : r) : r + v;
    }
    if (op != MG_AVG) {
        ct_put(buf, o, t, (double)r);
    } else if (t == MG_F64) {
        ((double *)buf)[o] = (double)r / P;
    } else if (is_float(t)) {
        ct_put(buf, o, t, (double)((float)r / (float)P));
    } else {
        ct_put(buf, o, t, (double)(r / P));
    }
}

void ct_add_case(plan *pl, tcase c)
{
    if (!pl->barrier_count) pl->barrier_count = &pl->barrier_local;   /* before any thread */
    if (pl->n == pl->cap) {
        pl->cap = pl->cap ? 2 * pl->cap : 256;
        pl->cases = realloc(pl->cases, (size_t)pl->cap * sizeof *pl->cases);
        MG_ASSERT(pl->cases);
    }
    pl->cases[pl->n++] = c;
}

static void fail(plan *pl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(plan *pl, const char *fmt, ...)
{
    pthread_mutex_lock(&pl->mu);
    if (!pl->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(pl->err, sizeof pl->err, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&pl->mu);
}

static int is_reduction(mg_coll c)
{
    return c == MG_COLL_REDUCE || c == MG_COLL_ALL_REDUCE || c == MG_COLL_REDUCE_SCATTER;
}

/* Compare n elements of got against want; report the first difference. */
static int compare(plan *pl, const tcase *c, int rank, int P, const char *what,
                   const void *got, const void *want, size_t n)
{
    size_t es = ct_dt_size[c->dt];
    if (!memcmp(got, want, n * es)) return 0;
    size_t i = 0;
    while (i < n && !memcmp((const char *)got + i * es, (const char *)want + i * es, es)) i++;
    fail(pl, "%s %s %s count=%zu root=%d inplace=%d P=%d algo=%s gmem=%d: rank %d %s[%zu] "
         "= %.9g, expected %.9g", ct_coll_name[c->coll], ct_op_name[c->op], ct_dt_name[c->dt], c->count,
         c->root, c->inplace, P, mg__algo_name(pl->algo), pl->gmem, rank, what, i,
         ct_get(got, i, c->dt), ct_get(want, i, c->dt));
    return 1;
}

static void *alloc_buf(tenv *e, plan *pl, int rank, size_t bytes)
{
    int g = pl->gmem == 1 || pl->gmem == 3 || (pl->gmem == 2 && rank % 2 == 0);
    void *b = g ? e->galloc(e->ctx, bytes) : mg_alloc(bytes);
    MG_ASSERT(b);
    return b;
}

static void free_buf(plan *pl, int rank, void *b)
{
    int g = pl->gmem == 1 || pl->gmem == 3 || (pl->gmem == 2 && rank % 2 == 0);
    if (!g) mg_free(b);
}

/* Run one case on one rank: 0 passed, 1 wrong data, 2 the call failed. */
static int run_case(tenv *e, plan *pl, const tcase *c, long long salt)
{
    int P = e->size, rank = e->rank, root = c->root, me_root = rank == root;
    size_t n = c->count, es = ct_dt_size[c->dt], nP = n * (size_t)P;
    mg_coll k = c->coll;
    size_t in_n = 0, out_n = 0;
    switch (k) {
    case MG_COLL_BROADCAST: case MG_COLL_REDUCE: case MG_COLL_ALL_REDUCE: in_n = out_n = n; break;
    case MG_COLL_ALL_GATHER: case MG_COLL_GATHER: in_n = n, out_n = nP; break;
    case MG_COLL_SCATTER: case MG_COLL_REDUCE_SCATTER: in_n = nP, out_n = n; break;
    case MG_COLL_ALL_TO_ALL: in_n = out_n = nP; break;
    default: break;
    }
    if (k == MG_COLL_BARRIER) {
        atomic_fetch_add(pl->barrier_count, 1);
        mg_call call = {.coll = k};
        if (e->run(e->ctx, &call)) {
            fail(pl, "barrier P=%d algo=%s: rank %d: %s", P, mg__algo_name(pl->algo), rank,
                 mg_last_error());
            return 2;
        }
        /* c->root numbers the barriers of the plan. */
        int seen = atomic_load(pl->barrier_count);
        if (seen < (c->root + 1) * P) {
            fail(pl, "barrier P=%d algo=%s: rank %d left before everyone arrived (%d < %d)",
                 P, mg__algo_name(pl->algo), rank, seen, (c->root + 1) * P);
            return 1;
        }
        return 0;
    }
    if (pl->gmem == 3) e->galloc(e->ctx, 64 * (size_t)(rank + 1));   /* rank-dependent offsets */
    /* One buffer of max(in, out) for in-place forms, else two; plus canary. */
    size_t big = (in_n > out_n ? in_n : out_n) * es + es;
    char *A = alloc_buf(e, pl, rank, big), *B = alloc_buf(e, pl, rank, big);
    char *want = mg_alloc(big), *orig = mg_alloc(big);
    memset(A, 0xA5, big);
    memset(B, 0x5A, big);
    /* Fill the input: source id s per element. */
    char *in = A;
    int red = is_reduction(k);
    for (size_t i = 0; i < in_n; i++) {
        long long v;
        if (red)
            v = ct_rvalue(rank + salt, i, c->dt, c->op, P);
        else if (k == MG_COLL_ALL_TO_ALL)
            v = cvalue((long long)rank * P + (long long)(i / (n ? n : 1)) + salt, i % (n ? n : 1), c->dt);
        else if (k == MG_COLL_SCATTER || k == MG_COLL_BROADCAST)
            v = cvalue(root + salt, i, c->dt);
        else
            v = cvalue(rank + salt, i, c->dt);
        ct_put(in, i, c->dt, (double)v);
    }
    const void *sbuf = A;
    void *rbuf = B;
    char *result = B;   /* where the output is checked */
    if (k == MG_COLL_BROADCAST) {
        rbuf = A;
        result = A;
        if (!me_root) memset(A, 0x33, in_n * es);
        sbuf = A;
    } else if (c->inplace) {
        switch (k) {
        case MG_COLL_ALL_REDUCE: case MG_COLL_REDUCE: case MG_COLL_ALL_TO_ALL:
            rbuf = A, result = A;
            break;
        case MG_COLL_ALL_GATHER: case MG_COLL_GATHER:
            if (k == MG_COLL_GATHER && !me_root) break;
            memmove(A + (size_t)rank * n * es, A, n * es);   /* own block at its place */
            rbuf = A, result = A;
            sbuf = c->inplace == 1 ? A : A + (size_t)rank * n * es;
            break;
        case MG_COLL_SCATTER:
            if (!me_root) break;
            rbuf = c->inplace == 1 ? A : A + (size_t)root * n * es;
            result = A + (size_t)root * n * es;
            break;
        case MG_COLL_REDUCE_SCATTER:
            rbuf = c->inplace == 1 ? A : A + (size_t)rank * n * es;
            result = rbuf;
            break;
        default:
            break;
        }
    }
    if (k == MG_COLL_SCATTER && !me_root) sbuf = NULL;   /* must not be read */
    memcpy(orig, A, big);
    mg_call call = {.coll = k, .sendbuf = sbuf, .recvbuf = rbuf, .count = n, .dtype = c->dt,
                    .op = c->op, .root = root};
    mg_status st = e->run(e->ctx, &call);
    int bad = 0;
    if (st) {
        fail(pl, "%s %s %s count=%zu P=%d algo=%s: rank %d: %s: %s", ct_coll_name[k],
             ct_op_name[c->op], ct_dt_name[c->dt], n, P, mg__algo_name(pl->algo), rank,
             mg_status_name(st), mg_last_error());
        bad = 2;
        goto out;
    }
    /* Expected output. */
    int has_out = !((k == MG_COLL_REDUCE || k == MG_COLL_GATHER) && !me_root);
    if (has_out) {
        for (size_t i = 0; i < out_n; i++) {
            switch (k) {
            case MG_COLL_ALL_REDUCE: case MG_COLL_REDUCE:
                ct_put_reduced(want, i, c->dt, c->op, P, i, salt); break;
            case MG_COLL_REDUCE_SCATTER:
                ct_put_reduced(want, i, c->dt, c->op, P, (size_t)rank * n + i, salt); break;
            case MG_COLL_BROADCAST:
                ct_put(want, i, c->dt, (double)cvalue(root + salt, i, c->dt)); break;
            case MG_COLL_ALL_GATHER: case MG_COLL_GATHER:
                ct_put(want, i, c->dt, (double)cvalue((long long)(i / n) + salt, i % n, c->dt)); break;
            case MG_COLL_SCATTER:
                ct_put(want, i, c->dt, (double)cvalue(root + salt, (size_t)rank * n + i, c->dt)); break;
            case MG_COLL_ALL_TO_ALL:
                ct_put(want, i, c->dt, (double)cvalue((long long)(i / n) * P + rank + salt,
                                                    i % n, c->dt)); break;
            default: break;
            }
        }
        bad = compare(pl, c, rank, P, "out", result, want, out_n);
    }
    /* Inputs are const (unless the output lies in them); outputs of
     * non-roots are untouched. */
    int result_in_A = result >= A && result < A + big;
    if (!bad && (!result_in_A || !has_out) && memcmp(A, orig, big))
        bad = compare(pl, c, rank, P, "input", A, orig, big / es);
    if (!bad && !has_out && rbuf == B) {
        memset(want, 0x5A, big);
        bad = compare(pl, c, rank, P, "untouched-out", B, want, big / es);
    }
out:
    free_buf(pl, rank, A);
    free_buf(pl, rank, B);
    mg_free(want);
    mg_free(orig);
    return bad;
}

int ct_run_plan(tenv *e, plan *pl)
{
    int bad = 0;
    for (int i = 0; i < pl->n; i++) {
        e->greset(e->ctx);
        int r = run_case(e, pl, &pl->cases[i], i);
        if (r == 2) return 1;   /* the ranks are out of step now */
        bad |= r;
    }
    return bad;
}

/* The sweep of issue 3 for one world size: every collective x op x dtype
 * for small counts (0, 1, fewer than the ranks, odd), a rotating subset for
 * counts that span many chunks, every in-place form. */
void ct_build_sweep(plan *pl, int P)
{
    size_t counts[] = {0, 1, P > 2 ? (size_t)P - 1 : 2, 3 * (size_t)P + 1, 4099, 40009};
    mg_coll reds[] = {MG_COLL_ALL_REDUCE, MG_COLL_REDUCE, MG_COLL_REDUCE_SCATTER};
    mg_coll moves[] = {MG_COLL_BROADCAST, MG_COLL_ALL_GATHER, MG_COLL_GATHER, MG_COLL_SCATTER,
                       MG_COLL_ALL_TO_ALL};
    mg_dtype mdt[] = {MG_U8, MG_BF16, MG_I32, MG_F64};
    for (int ci = 0; ci < 6; ci++) {
        size_t n = counts[ci];
        int big = n >= 4099;
        for (int k = 0; k < 3; k++)
            for (int op = 0; op < MG_OP_COUNT; op++)
                for (int d = 0; d < 7; d++) {
                    if (big && d != (op + P + k) % 7) continue;
                    int modes = reds[k] == MG_COLL_REDUCE_SCATTER ? 3 : 2;
                    for (int ip = 0; ip < modes; ip++) {
                        if (big && ip != (op + ci) % modes) continue;
                        ct_add_case(pl, (tcase){reds[k], ct_dtypes[d], (mg_op)op, n,
                                             (int)((n + (size_t)op) % (size_t)P), ip});
                    }
                }
        for (int k = 0; k < 5; k++)
            for (int d = 0; d < 4; d++) {
                if (big && d != (k + P) % 4) continue;
                int modes = moves[k] == MG_COLL_BROADCAST ? 1
                          : moves[k] == MG_COLL_ALL_TO_ALL ? 2 : 3;
                for (int ip = 0; ip < modes; ip++)
                    ct_add_case(pl, (tcase){moves[k], mdt[d], MG_SUM, n,
                                         (int)((n + (size_t)d + 1) % (size_t)P), ip});
            }
        ct_add_case(pl, (tcase){.coll = MG_COLL_BARRIER, .root = ci});
    }
}

size_t ct_sweep_gmem_bytes(int P)
{
    return 2 * (40009 * 8 * (size_t)P + 4096) + 64 * 16;
}

/* Fewer cases than the mock sweep (processes cost more): the full op x
 * dtype cross at one count, rotating dtypes and in-place forms elsewhere. */
void ct_build_sweep_lite(plan *pl, int P)
{
    size_t counts[] = {0, 1, P > 2 ? (size_t)P - 1 : 2, 3 * (size_t)P + 1, 4099, 40009};
    mg_coll reds[] = {MG_COLL_ALL_REDUCE, MG_COLL_REDUCE, MG_COLL_REDUCE_SCATTER};
    mg_coll moves[] = {MG_COLL_BROADCAST, MG_COLL_ALL_GATHER, MG_COLL_GATHER, MG_COLL_SCATTER,
                       MG_COLL_ALL_TO_ALL};
    int rot = 0;
    for (int ci = 0; ci < 6; ci++) {
        size_t n = counts[ci];
        for (int k = 0; k < 3; k++)
            for (int op = 0; op < MG_OP_COUNT; op++)
                for (int d = 0; d < 7; d++) {
                    if (ci != 3 && d != (op + k + ci) % 7) continue;
                    int modes = reds[k] == MG_COLL_REDUCE_SCATTER ? 3 : 2;
                    ct_add_case(pl, (tcase){reds[k], ct_dtypes[d], (mg_op)op, n,
                                         (int)((n + (size_t)op) % (size_t)P), rot++ % modes});
                }
        for (int k = 0; k < 5; k++) {
            int modes = moves[k] == MG_COLL_BROADCAST ? 1 : moves[k] == MG_COLL_ALL_TO_ALL ? 2 : 3;
            ct_add_case(pl, (tcase){moves[k], ct_dtypes[(k + ci) % 7], MG_SUM, n,
                                 (int)((n + (size_t)k) % (size_t)P), rot++ % modes});
        }
        ct_add_case(pl, (tcase){.coll = MG_COLL_BARRIER, .root = ci});
    }
}

