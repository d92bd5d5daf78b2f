/* What mgbench (tools/mgbench.c) and its Open MPI peer (bench/mpi_peer.c)
 * share, so that their tables compare line by line: the collectives and
 * their names, the flags both take, check-mode data and the exact results
 * expected, sizes and nccl-tests' bus-bandwidth factors, and the table.
 *
 * A header of static functions because each tool is one source file (the
 * Makefile builds one binary per file of tools/ and bench/).
 *
 * Check data are small non-negative integers chosen so that every partial
 * result of every algorithm is exact in every dtype (bf16 holds integers
 * to 256): sums stay under 5 per rank, products are powers of two of at
 * most 2^7, and the AVG data sum to a multiple of the world size. In-place
 * forms follow coll.h (MPI's conventions): gathers find a rank's own block
 * at its slot of recvbuf (a gather non-root sends from recvbuf), a scatter
 * root keeps its block at its slot, reduce_scatter leaves the result at
 * the start of the buffer. */
#ifndef MGBENCH_COMMON_H
#define MGBENCH_COMMON_H

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/comm.h"
#include "multigrad/tensor.h"   /* the machine's CPU and kernels in the header */

#define MGB_BAD_INPUT 2

/* sendrecv is not an mg_coll: each rank sends to the next, receives from
 * the previous (nccl-tests' sendrecv_perf). */
enum { MGB_SENDRECV = MG_COLL_COUNT, MGB_NCOLLS };

typedef struct {
    size_t minb, maxb, stepb;
    double factor;              /* > 1: multiply; else add stepb */
    int iters, warmup, check, root, group_alloc;
    int colls[MGB_NCOLLS], ncolls;
    int all_colls;              /* 'all' given: skip what the world cannot run */
    int dtypes[MG_DTYPE_COUNT], ndtypes;
    int ops[MG_OP_COUNT], nops;
    int traffic;                /* mgbench --traffic: the bytes columns */
    int model_time;             /* mgbench --model-time: the cost model's time */
} mgb_opts;

/* Set by each tool: its name, and whether this process keeps quiet about
 * bad input (MPI ranks but 0) and what it does before exiting. */
static const char *mgb_prog = "mgbench";
static int mgb_quiet;
static void (*mgb_before_exit)(void);

static inline void __attribute__((noreturn, format(printf, 1, 2)))
mgb_bad_input(const char *fmt, ...)
{
    if (!mgb_quiet) {
        mg_launch_defer_to_rank_0();   /* under mgrun every rank reads the same flags */
        char msg[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        mg_eprintf(mgb_prog, "%s (see %s --help)", msg, mgb_prog);
    }
    if (mgb_before_exit) mgb_before_exit();
    exit(MGB_BAD_INPUT);
}

static inline long mgb_parse_long(const char *flag, const char *s, long lo, long hi)
{
    long v;
    if (mg_parse_long(flag, s, lo, hi, &v)) mgb_bad_input("%s", mg_last_error());
    return v;
}

static inline double mgb_parse_double(const char *flag, const char *s, double lo, double hi,
                                      int open)
{
    double v;
    if (mg_parse_double(flag, s, lo, hi, open, &v)) mgb_bad_input("%s", mg_last_error());
    return v;
}

/* "4", "64K", "16M", "1G" (powers of 2, as nccl-tests). */
static inline size_t mgb_parse_size(const char *flag, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end), mult = 1;
    if (end != s && *end) {
        mult = strchr("kK", *end) ? 1024.0 : strchr("mM", *end) ? 1048576.0 :
               strchr("gG", *end) ? 1073741824.0 : 0;
        end++;
        if (*end == 'B' || *end == 'b') end++;
    }
    if (errno || end == s || *end || mult == 0 || !(v >= 0))
        mgb_bad_input("%s: '%s' is not a size (e.g. 4, 64K, 16M, 1G)", flag, s);
    if (v * mult > (double)(1ull << 40)) mgb_bad_input("%s: '%s' is larger than 1 TiB", flag, s);
    return (size_t)(v * mult);
}

static const char *const mgb_coll_names[MGB_NCOLLS] = {
    [MG_COLL_BROADCAST] = "broadcast", [MG_COLL_REDUCE] = "reduce",
    [MG_COLL_ALL_REDUCE] = "all_reduce", [MG_COLL_ALL_GATHER] = "all_gather",
    [MG_COLL_GATHER] = "gather", [MG_COLL_SCATTER] = "scatter",
    [MG_COLL_REDUCE_SCATTER] = "reduce_scatter", [MG_COLL_ALL_TO_ALL] = "all_to_all",
    [MG_COLL_BARRIER] = "barrier", [MGB_SENDRECV] = "sendrecv",
};

static inline void mgb_add_coll(mgb_opts *o, const char *name)
{
    static const struct { const char *alias, *name; } aliases[] = {
        {"allreduce", "all_reduce"}, {"allgather", "all_gather"},
        {"reducescatter", "reduce_scatter"}, {"alltoall", "all_to_all"}, {"bcast", "broadcast"},
    };
    char norm[64];
    snprintf(norm, sizeof norm, "%s", name);
    for (char *p = norm; *p; p++) if (*p == '-') *p = '_';
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        if (!strcmp(norm, aliases[i].alias)) snprintf(norm, sizeof norm, "%s", aliases[i].name);
    int all = !strcmp(norm, "all"), found = 0;
    o->all_colls |= all;
    for (int c = 0; c < MGB_NCOLLS; c++) {
        if (!mgb_coll_names[c] || (!all && strcmp(norm, mgb_coll_names[c]))) continue;
        found = 1;
        int seen = 0;
        for (int k = 0; k < o->ncolls; k++) seen |= o->colls[k] == c;
        if (!seen) o->colls[o->ncolls++] = c;
    }
    if (!found)
        mgb_bad_input("unknown collective '%s' (broadcast reduce all_reduce all_gather gather "
                      "scatter reduce_scatter all_to_all barrier sendrecv all)", name);
}

static inline void mgb_parse_dtypes(mgb_opts *o, const char *s)
{
    static const struct { const char *name; mg_dtype t; } names[] = {
        {"f32", MG_F32}, {"float", MG_F32}, {"float32", MG_F32},
        {"f64", MG_F64}, {"double", MG_F64}, {"float64", MG_F64},
        {"f16", MG_F16}, {"half", MG_F16}, {"float16", MG_F16},
        {"bf16", MG_BF16}, {"bfloat16", MG_BF16},
        {"i32", MG_I32}, {"int32", MG_I32}, {"int", MG_I32},
        {"i64", MG_I64}, {"int64", MG_I64},
        {"u8", MG_U8}, {"uint8", MG_U8},
    };
    o->ndtypes = 0;
    if (!strcmp(s, "all")) {
        for (int t = 0; t < MG_DTYPE_COUNT; t++) o->dtypes[o->ndtypes++] = t;
        return;
    }
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(s, names[i].name)) {
            o->dtypes[o->ndtypes++] = names[i].t;
            return;
        }
    mgb_bad_input("-d: unknown dtype '%s' (f32 f64 f16 bf16 i32 i64 u8 all)", s);
}

static inline void mgb_parse_ops(mgb_opts *o, const char *s)
{
    o->nops = 0;
    for (int p = 0; p < MG_OP_COUNT; p++)
        if (!strcmp(s, "all") || !strcasecmp(s, mg_op_name((mg_op)p))) o->ops[o->nops++] = p;
    if (!o->nops) mgb_bad_input("-o: unknown op '%s' (sum prod min max avg all)", s);
}

/* The flags both tools take. */
enum { MGB_OPT_STEPBYTES = 300, MGB_OPT_GROUP_ALLOC, MGB_OPT_MALLOC };
#define MGB_SHORTOPTS "b:e:f:i:w:c:d:o:r:"
#define MGB_LONGOPTS                                                           \
    {"minbytes", required_argument, NULL, 'b'},                                \
    {"maxbytes", required_argument, NULL, 'e'},                                \
    {"stepfactor", required_argument, NULL, 'f'},                              \
    {"stepbytes", required_argument, NULL, MGB_OPT_STEPBYTES},                 \
    {"iters", required_argument, NULL, 'i'},                                   \
    {"warmup", required_argument, NULL, 'w'},                                  \
    {"warmup_iters", required_argument, NULL, 'w'},                            \
    {"check", required_argument, NULL, 'c'},                                   \
    {"dtype", required_argument, NULL, 'd'},                                   \
    {"datatype", required_argument, NULL, 'd'},                                \
    {"op", required_argument, NULL, 'o'},                                      \
    {"root", required_argument, NULL, 'r'},                                    \
    {"group-alloc", no_argument, NULL, MGB_OPT_GROUP_ALLOC},                   \
    {"malloc", no_argument, NULL, MGB_OPT_MALLOC}

static inline void mgb_defaults(mgb_opts *o)
{
    *o = (mgb_opts){.minb = 4, .maxb = 64u << 20, .factor = 2, .stepb = 1u << 20,
                    .iters = 20, .warmup = 5, .check = 1};
    mgb_parse_dtypes(o, "f32");
    mgb_parse_ops(o, "sum");
}

/* One common flag: 1 if it was one. */
static inline int mgb_option(mgb_opts *o, int opt, const char *arg)
{
    static int factor_given;
    switch (opt) {
    case 'b': o->minb = mgb_parse_size("-b", arg); return 1;
    case 'e': o->maxb = mgb_parse_size("-e", arg); return 1;
    case 'f':
        o->factor = mgb_parse_double("-f", arg, 1, 1e6, 0);
        factor_given = 1;
        return 1;
    case MGB_OPT_STEPBYTES:
        o->stepb = mgb_parse_size("--stepbytes", arg);
        if (o->stepb == 0) mgb_bad_input("--stepbytes must be more than 0");
        if (!factor_given) o->factor = 1;
        return 1;
    case 'i': o->iters = (int)mgb_parse_long("-i", arg, 1, 100000000); return 1;
    case 'w': o->warmup = (int)mgb_parse_long("-w", arg, 0, 100000000); return 1;
    case 'c': o->check = (int)mgb_parse_long("-c", arg, 0, 1); return 1;
    case 'd': mgb_parse_dtypes(o, arg); return 1;
    case 'o': mgb_parse_ops(o, arg); return 1;
    case 'r': o->root = (int)mgb_parse_long("-r", arg, 0, INT_MAX); return 1;
    case MGB_OPT_GROUP_ALLOC: o->group_alloc = 1; return 1;
    case MGB_OPT_MALLOC: o->group_alloc = 0; return 1;
    default: return 0;
    }
}

/* getopt's complaints (opterr = 0, optstring starting with ':'). */
static inline void __attribute__((noreturn)) mgb_bad_option(int opt, char **argv)
{
    if (opt == ':') mgb_bad_input("option '%s' needs a value", argv[optind - 1]);
    if (optopt && optopt < 256) mgb_bad_input("unknown option '-%c'", optopt);
    mgb_bad_input("unknown option '%s'", argv[optind - 1]);
}

/* The positional collectives and the checks across flags. */
static inline void mgb_finish_args(mgb_opts *o, int argc, char **argv)
{
    for (int a = optind; a < argc; a++) mgb_add_coll(o, argv[a]);
    if (!o->ncolls) mgb_bad_input("no collective given (e.g. %s all_reduce)", mgb_prog);
    if (o->minb > o->maxb) mgb_bad_input("-b %zu is larger than -e %zu", o->minb, o->maxb);
}

static inline size_t mgb_next_size(const mgb_opts *o, size_t sz)
{
    size_t next = o->factor > 1 ? (size_t)((double)sz * o->factor) : sz + o->stepb;
    return next > sz ? next : sz + 1;
}

/* ---- elements and check data ----------------------------------------- */

static inline double mgb_get(const void *buf, mg_dtype t, size_t i)
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

static inline void mgb_set(void *buf, mg_dtype t, size_t i, double v)
{
    switch (t) {
    case MG_F32: ((float *)buf)[i] = (float)v; break;
    case MG_F64: ((double *)buf)[i] = v; break;
    case MG_F16: ((uint16_t *)buf)[i] = mg_f32_to_f16((float)v); break;
    case MG_BF16: ((uint16_t *)buf)[i] = mg_f32_to_bf16((float)v); break;
    case MG_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case MG_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

static inline char *mgb_at(void *buf, size_t elems, mg_dtype t)
{
    return (char *)buf + elems * mg_dtype_size(t);
}

static inline int mgb_is_reduction(int coll)
{
    return coll == MG_COLL_REDUCE || coll == MG_COLL_ALL_REDUCE || coll == MG_COLL_REDUCE_SCATTER;
}

static inline int mgb_is_rooted(int coll)
{
    return coll == MG_COLL_BROADCAST || coll == MG_COLL_REDUCE || coll == MG_COLL_GATHER ||
           coll == MG_COLL_SCATTER;
}

/* Element idx of rank k's send buffer (n ranks). */
static inline double mgb_value(int coll, mg_op op, int k, int n, size_t idx)
{
    if (!mgb_is_reduction(coll)) return (double)(((size_t)k * 31 + idx * 7) % 97);
    switch (op) {
    case MG_SUM: return (double)((idx + 3 * (size_t)k) % 5);
    case MG_PROD: return k < 7 && (idx + (size_t)k) % 3 == 0 ? 2 : 1;
    case MG_AVG:
        /* Even ranks add 2 (the last, when n is odd, 1): the extras sum to n. */
        return (double)(idx % 5) + (k % 2 ? 0 : k == n - 1 ? 1 : 2);
    default: return (double)((idx * 13 + (size_t)k * 7) % 31);   /* MIN, MAX */
    }
}

static inline double mgb_reduced(int coll, mg_op op, int n, size_t idx)
{
    double acc = mgb_value(coll, op, 0, n, idx);
    for (int k = 1; k < n; k++) {
        double v = mgb_value(coll, op, k, n, idx);
        acc = op == MG_PROD ? acc * v : op == MG_MIN ? fmin(acc, v) :
              op == MG_MAX ? fmax(acc, v) : acc + v;
    }
    return op == MG_AVG ? acc / n : acc;
}

static inline void mgb_fill(void *buf, mg_dtype t, size_t count, int coll, mg_op op, int k,
                            int n)
{
    for (size_t i = 0; i < count; i++) mgb_set(buf, t, i, mgb_value(coll, op, k, n, i));
}

/* Marks what the operation must overwrite, so a result never written shows. */
static inline void mgb_poison(void *buf, mg_dtype t, size_t count)
{
    for (size_t i = 0; i < count; i++) mgb_set(buf, t, i, t == MG_U8 ? 255 : 99);
}

/* One operation as both tools run it: k elements per rank (the count of
 * an mg_call), on rank r of n. */
typedef struct {
    int coll, r, n, root, inplace;
    mg_dtype t;
    mg_op op;
    size_t k;
    void *sbuf, *rbuf;
} mgb_case;

/* The inputs of a check run; what must be written is poisoned. */
static inline void mgb_prepare(const mgb_case *c)
{
    int coll = c->coll, r = c->r, n = c->n;
    size_t k = c->k, nk = k * (size_t)n;
    void *in = c->inplace ? c->rbuf : c->sbuf;
    switch (coll) {
    case MG_COLL_BROADCAST:
        mgb_poison(c->rbuf, c->t, k);
        if (r == c->root) mgb_fill(in, c->t, k, coll, c->op, r, n);
        break;
    case MG_COLL_REDUCE: case MG_COLL_ALL_REDUCE: case MGB_SENDRECV:
        mgb_poison(c->rbuf, c->t, k);
        mgb_fill(in, c->t, k, coll, c->op, r, n);
        break;
    case MG_COLL_ALL_GATHER: case MG_COLL_GATHER:
        mgb_poison(c->rbuf, c->t, nk);
        if (c->inplace && (coll == MG_COLL_ALL_GATHER || r == c->root))
            in = mgb_at(c->rbuf, (size_t)r * k, c->t);
        mgb_fill(in, c->t, k, coll, c->op, r, n);
        break;
    case MG_COLL_SCATTER:
        mgb_poison(c->rbuf, c->t, c->inplace && r == c->root ? nk : k);
        if (r == c->root) mgb_fill(in, c->t, nk, coll, c->op, r, n);
        break;
    case MG_COLL_REDUCE_SCATTER: case MG_COLL_ALL_TO_ALL:
        mgb_poison(c->rbuf, c->t, nk);
        mgb_fill(in, c->t, nk, coll, c->op, r, n);
        break;
    default:
        break;
    }
}

/* After the check run: the number of elements that differ from the exact
 * result on this rank. */
static inline long long mgb_verify(const mgb_case *c)
{
    int coll = c->coll, r = c->r, n = c->n, root = c->root;
    size_t k = c->k;
    mg_dtype t = c->t;
    mg_op op = c->op;
    long long wrong = 0;
#define MGB_EXPECT(ptr, i, v) (wrong += mgb_get(ptr, t, i) != (v))
    switch (coll) {
    case MG_COLL_BROADCAST:
        for (size_t i = 0; i < k; i++) MGB_EXPECT(c->rbuf, i, mgb_value(coll, op, root, n, i));
        break;
    case MG_COLL_REDUCE: case MG_COLL_ALL_REDUCE:
        if (coll == MG_COLL_REDUCE && r != root) break;
        for (size_t i = 0; i < k; i++) MGB_EXPECT(c->rbuf, i, mgb_reduced(coll, op, n, i));
        break;
    case MG_COLL_ALL_GATHER: case MG_COLL_GATHER:
        if (coll == MG_COLL_GATHER && r != root) break;
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < k; i++)
                MGB_EXPECT(c->rbuf, (size_t)j * k + i, mgb_value(coll, op, j, n, i));
        break;
    case MG_COLL_SCATTER: {
        char *out = c->inplace && r == root ? mgb_at(c->rbuf, (size_t)r * k, t) : c->rbuf;
        for (size_t i = 0; i < k; i++)
            MGB_EXPECT(out, i, mgb_value(coll, op, root, n, (size_t)r * k + i));
        break;
    }
    case MG_COLL_REDUCE_SCATTER:
        for (size_t i = 0; i < k; i++)
            MGB_EXPECT(c->rbuf, i, mgb_reduced(coll, op, n, (size_t)r * k + i));
        break;
    case MG_COLL_ALL_TO_ALL:
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < k; i++)
                MGB_EXPECT(c->rbuf, (size_t)j * k + i,
                           mgb_value(coll, op, j, n, (size_t)r * k + i));
        break;
    case MGB_SENDRECV:
        for (size_t i = 0; i < k; i++)
            MGB_EXPECT(c->rbuf, i, mgb_value(coll, op, (r + n - 1) % n, n, i));
        break;
    default:
        break;
    }
#undef MGB_EXPECT
    return wrong;
}

/* ---- sizes and the table ---------------------------------------------------- */

/* nccl-tests' sizes are whole buffers: the gathers, scatters and
 * all_to_all move size / n per rank. */
static inline int mgb_split_by_ranks(int coll)
{
    return coll == MG_COLL_ALL_GATHER || coll == MG_COLL_GATHER || coll == MG_COLL_SCATTER ||
           coll == MG_COLL_REDUCE_SCATTER || coll == MG_COLL_ALL_TO_ALL;
}

static inline size_t mgb_per_rank_count(int coll, size_t total, int n)
{
    if (coll == MG_COLL_BARRIER) return 0;
    return mgb_split_by_ranks(coll) ? total / (size_t)n : total;
}

static inline size_t mgb_shown_count(int coll, size_t k, int n)
{
    return mgb_split_by_ranks(coll) ? k * (size_t)n : k;
}

static inline double mgb_bus_factor(int coll, int n)
{
    if (coll == MG_COLL_ALL_REDUCE) return 2.0 * (n - 1) / n;
    return mgb_split_by_ranks(coll) ? (double)(n - 1) / n : 1.0;
}

typedef struct {
    long long wrong_total;
    double bw_sum;
    int bw_count;
} mgb_table;

/* After the tool's own first line ("# mgbench: ..."). */
static inline void mgb_print_header(const mgb_opts *o)
{
    char sys[1024];
    mg_kernels_describe(sys, sizeof sys, "#  ");
    fputs(sys, stdout);
    if (o->factor > 1)
        printf("#  minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d "
               "validation: %d\n", o->minb, o->maxb, o->factor, o->warmup, o->iters, o->check);
    else
        printf("#  minBytes %zu maxBytes %zu step: %zu(bytes) warmup iters: %d iters: %d "
               "validation: %d\n", o->minb, o->maxb, o->stepb, o->warmup, o->iters, o->check);
    printf("#\n");
    /* Each group label centred over its four 33-character columns. */
    printf("%-52s%22s%11s%19s", "#", "out-of-place", "", "in-place");
    if (o->traffic) printf("%21s%s", "", "bytes per rank and op");
    printf("\n# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s",
           "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
           "time", "algbw", "busbw", "#wrong");
    if (o->traffic) printf("  %12s  %12s  %12s", "sent", "received", "bus");
    if (o->model_time) printf("  %9s", "model");
    printf("\n# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s",
           "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
           "(GB/s)", "");
    if (o->traffic) printf("  %12s  %12s  %12s", "(max)", "(max)", "(size*busf)");
    if (o->model_time) printf("  %9s", "(us)");
    printf("\n");
    fflush(stdout);
}

static inline void mgb_print_row_start(size_t bytes, size_t count, mg_dtype t, int coll,
                                       mg_op op, int root)
{
    printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count, mg_dtype_name(t),
           mgb_is_reduction(coll) ? mg_op_name(op) : "none", mgb_is_rooted(coll) ? root : -1);
}

/* One column group: time in us, #wrong (-1: not checked). */
static inline void mgb_print_cols(mgb_table *tb, int coll, int n, size_t bytes, double us,
                                  long long wrong)
{
    char ts[32], ws[32];
    snprintf(ts, sizeof ts, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
    if (wrong < 0) snprintf(ws, sizeof ws, "%6s", "N/A");
    else snprintf(ws, sizeof ws, "%6lld", wrong);
    double algbw = us > 0 ? (double)bytes / (us * 1e3) : 0, busbw = algbw * mgb_bus_factor(coll, n);
    printf("  %s  %6.2f  %6.2f  %s", ts, algbw, busbw, ws);
    if (wrong > 0) tb->wrong_total += wrong;
    if (coll != MG_COLL_BARRIER) {
        tb->bw_sum += busbw;
        tb->bw_count++;
    }
}

/* In place, for what has no in-place form (one buffer cannot be sent and
 * received at once; a barrier has no buffer). */
static inline int mgb_no_in_place(int coll)
{
    return coll == MGB_SENDRECV || coll == MG_COLL_BARRIER;
}

static inline void mgb_print_no_cols(void)
{
    printf("  %7s  %6s  %6s  %6s", "--", "--", "--", "--");
}

static inline void mgb_print_footer(const mgb_table *tb)
{
    printf("# Out of bounds values : %lld %s\n", tb->wrong_total,
           tb->wrong_total ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", tb->bw_count ? tb->bw_sum / tb->bw_count : 0.0);
    fflush(stdout);
}

#endif
