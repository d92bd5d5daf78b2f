/* mpi_peer — the Open MPI side of bench/vs_mpi.sh: the collectives mgbench
 * times, written directly against MPI (MPI_Allreduce and friends), with
 * mgbench's flags, sizes, iterations, check data and nccl-tests columns
 * (tools/mgbench_common.h), so the two tables compare line by line:
 *   mpirun -n 2 build/bench/mpi_peer all_reduce -b 4 -e 64M -f 2
 *
 * Limits: MPI's native types only (f32 f64 i32 i64 u8: MPI has no f16 or
 * bf16, and '-d all' skips them); avg is MPI_SUM then a division, counted
 * in the time; broadcast out of place copies at the root, then broadcasts
 * (MPI has one buffer), as multigrad does. --group-alloc takes the
 * buffers from MPI_Alloc_mem. Built only with MPI (MG_HAVE_MPI). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef MG_HAVE_MPI
int main(void)
{
    fprintf(stderr, "mpi_peer: built without MPI (mpicc was not found at build time); "
                    "install libopenmpi-dev and openmpi-bin, then rebuild with make\n");
    return 2;
}
#else
#include <mpi.h>
#include "../tools/mgbench_common.h"

static int rank, size;

static void finalize(void) { MPI_Finalize(); }

static void usage(void)
{
    if (rank) return;
    printf("usage: mpirun -n RANKS mpi_peer COLLECTIVE... [flags]\n"
           "The Open MPI peer of mgbench: the same collectives, flags, check data and\n"
           "columns, carried by MPI's own calls (MPI_Allreduce, MPI_Bcast, ...).\n"
           "COLLECTIVE: broadcast reduce all_reduce all_gather gather scatter\n"
           "  reduce_scatter all_to_all barrier sendrecv all\n"
           "  -b SIZE -e SIZE -f F --stepbytes SIZE -i ITERS -w WARMUP -c 0|1 -r ROOT\n"
           "  -d f32|f64|i32|i64|u8|all  -o sum|prod|min|max|avg|all\n"
           "  --group-alloc  buffers from MPI_Alloc_mem instead of malloc\n"
           "See mgbench --help for their meaning.\n");
}

static int native(mg_dtype t) { return t != MG_F16 && t != MG_BF16; }

static void parse_args(int argc, char **argv, mgb_opts *o)
{
    static const struct option longs[] = {
        MGB_LONGOPTS, {"help", no_argument, NULL, 'h'}, {0, 0, 0, 0},
    };
    mgb_defaults(o);
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":" MGB_SHORTOPTS "h", longs, NULL)) != -1) {
        if (mgb_option(o, opt, optarg)) continue;
        if (opt == 'h') {
            usage();
            finalize();
            exit(0);
        }
        mgb_bad_option(opt, argv);
    }
    mgb_finish_args(o, argc, argv);
    int k = 0;
    for (int i = 0; i < o->ndtypes; i++)
        if (native((mg_dtype)o->dtypes[i])) o->dtypes[k++] = o->dtypes[i];
    if (!k) mgb_bad_input("-d: MPI has no f16 or bf16 type (f32 f64 i32 i64 u8 all)");
    o->ndtypes = k;
    if (o->root >= size) mgb_bad_input("-r %d is not a rank of this %d-rank job", o->root, size);
    if (size < 2 && !o->all_colls)
        for (int i = 0; i < o->ncolls; i++)
            if (o->colls[i] == MGB_SENDRECV) mgb_bad_input("sendrecv needs at least 2 ranks");
}

static MPI_Datatype mpi_type(mg_dtype t)
{
    switch (t) {
    case MG_F32: return MPI_FLOAT;
    case MG_F64: return MPI_DOUBLE;
    case MG_I32: return MPI_INT32_T;
    case MG_I64: return MPI_INT64_T;
    default: return MPI_UINT8_T;
    }
}

static MPI_Op mpi_op(mg_op op)
{
    return op == MG_PROD ? MPI_PROD : op == MG_MIN ? MPI_MIN : op == MG_MAX ? MPI_MAX : MPI_SUM;
}

/* AVG: MPI has none; integers truncate, as C's division does. */
static void avg_finish(void *b, mg_dtype t, size_t n)
{
    for (size_t i = 0; i < n; i++) mgb_set(b, t, i, mgb_get(b, t, i) / size);
}

/* One operation, in place as coll.h (MPI's own conventions) describes. */
static int run_once(const mgb_case *c)
{
    MPI_Datatype dt = mpi_type(c->t);
    MPI_Comm w = MPI_COMM_WORLD;
    int k = (int)c->k, r = c->root, me = rank, rc;
    void *s = c->inplace ? MPI_IN_PLACE : c->sbuf, *rb = c->rbuf;
    switch (c->coll) {
    case MG_COLL_BROADCAST:
        if (!c->inplace && me == r) memcpy(rb, c->sbuf, c->k * mg_dtype_size(c->t));
        return MPI_Bcast(rb, k, dt, r, w);
    case MG_COLL_REDUCE:
        rc = MPI_Reduce(c->inplace && me != r ? rb : s, rb, k, dt, mpi_op(c->op), r, w);
        if (c->op == MG_AVG && me == r) avg_finish(rb, c->t, c->k);
        return rc;
    case MG_COLL_ALL_REDUCE:
        rc = MPI_Allreduce(s, rb, k, dt, mpi_op(c->op), w);
        if (c->op == MG_AVG) avg_finish(rb, c->t, c->k);
        return rc;
    case MG_COLL_ALL_GATHER: return MPI_Allgather(s, k, dt, rb, k, dt, w);
    case MG_COLL_GATHER: return MPI_Gather(c->inplace && me != r ? rb : s, k, dt, rb, k, dt, r, w);
    case MG_COLL_SCATTER:
        if (c->inplace) return MPI_Scatter(rb, k, dt, me == r ? MPI_IN_PLACE : rb, k, dt, r, w);
        return MPI_Scatter(c->sbuf, k, dt, rb, k, dt, r, w);
    case MG_COLL_REDUCE_SCATTER:
        rc = MPI_Reduce_scatter_block(s, rb, k, dt, mpi_op(c->op), w);
        if (c->op == MG_AVG) avg_finish(rb, c->t, c->k);
        return rc;
    case MG_COLL_ALL_TO_ALL: return MPI_Alltoall(s, k, dt, rb, k, dt, w);
    case MG_COLL_BARRIER: return MPI_Barrier(w);
    default:
        return MPI_Sendrecv(c->sbuf, k, dt, (me + 1) % size, 7, rb, k, dt,
                            (me + size - 1) % size, 7, w, MPI_STATUS_IGNORE);
    }
}

static void measure(const mgb_opts *o, const mgb_case *c, double *us, long long *wrong)
{
    long long bad = -1;
    if (o->check) {
        mgb_prepare(c);
        if (run_once(c) != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
        bad = mgb_verify(c);
    }
    for (int i = 0; i < o->warmup; i++) run_once(c);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < o->iters; i++) run_once(c);
    double mean = (MPI_Wtime() - t0) / o->iters * 1e6, worst;
    /* nccl-tests reports one figure for all ranks: the slowest rank's. */
    MPI_Allreduce(&mean, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (o->check) {
        long long sum;
        MPI_Allreduce(&bad, &sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        bad = sum;
    }
    *us = worst;
    *wrong = bad;
}

static mgb_table tb;

static void row(const mgb_opts *o, mgb_case *c, size_t req)
{
    size_t es = mg_dtype_size(c->t);
    c->k = mgb_per_rank_count(c->coll, req / es, size);
    size_t count = mgb_shown_count(c->coll, c->k, size);
    if (rank == 0) mgb_print_row_start(count * es, count, c->t, c->coll, c->op, c->root);
    for (c->inplace = 0; c->inplace < 2; c->inplace++) {
        if (c->inplace && mgb_no_in_place(c->coll)) {
            if (rank == 0) mgb_print_no_cols();
            continue;
        }
        double us;
        long long wrong;
        measure(o, c, &us, &wrong);
        if (rank == 0) mgb_print_cols(&tb, c->coll, size, count * es, us, wrong);
        else if (wrong > 0) tb.wrong_total += wrong;
    }
    if (rank == 0) {
        printf("\n");
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mgb_prog = "mpi_peer";
    mgb_quiet = rank != 0;
    mgb_before_exit = finalize;
    mgb_opts o;
    parse_args(argc, argv, &o);
    size_t cap = o.maxb > 64 ? o.maxb : 64;
    void *sbuf = NULL, *rbuf = NULL;
    if (o.group_alloc) {
        if (MPI_Alloc_mem((MPI_Aint)cap, MPI_INFO_NULL, &sbuf) != MPI_SUCCESS ||
            MPI_Alloc_mem((MPI_Aint)cap, MPI_INFO_NULL, &rbuf) != MPI_SUCCESS)
            sbuf = rbuf = NULL;
    } else if (posix_memalign(&sbuf, 64, cap) || posix_memalign(&rbuf, 64, cap)) {
        sbuf = rbuf = NULL;
    }
    if (!sbuf || !rbuf) {
        fprintf(stderr, "mpi_peer: rank %d: cannot allocate 2 x %zu B\n", rank, cap);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Touch every page now so that page faults are not timed. */
    memset(sbuf, 0, cap);
    memset(rbuf, 0, cap);
    if (rank == 0) {
        char ver[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(ver, &len);
        ver[strcspn(ver, "\n")] = 0;
        printf("# mpi_peer:");
        for (int i = 0; i < o.ncolls; i++) printf(" %s", mgb_coll_names[o.colls[i]]);
        printf("  ranks %d  %s  buffers %s\n", size, ver,
               o.group_alloc ? "MPI_Alloc_mem" : "malloc");
        mgb_print_header(&o);
    }
    for (int ci = 0; ci < o.ncolls; ci++) {
        mgb_case c = {.coll = o.colls[ci], .r = rank, .n = size, .root = o.root, .sbuf = sbuf,
                      .rbuf = rbuf};
        if (rank == 0 && o.ncolls > 1) printf("# %s\n", mgb_coll_names[c.coll]);
        if (c.coll == MGB_SENDRECV && size < 2) {
            if (rank == 0) printf("#  (skipped: sendrecv needs at least 2 ranks)\n");
            continue;
        }
        if (c.coll == MG_COLL_BARRIER) {
            c.t = MG_U8;
            row(&o, &c, 0);
            continue;
        }
        int nops = mgb_is_reduction(c.coll) ? o.nops : 1;
        for (int di = 0; di < o.ndtypes; di++)
            for (int pi = 0; pi < nops; pi++) {
                c.t = (mg_dtype)o.dtypes[di];
                c.op = mgb_is_reduction(c.coll) ? (mg_op)o.ops[pi] : MG_SUM;
                for (size_t sz = o.minb; sz <= o.maxb; sz = mgb_next_size(&o, sz)) row(&o, &c, sz);
            }
    }
    if (rank == 0) mgb_print_footer(&tb);
    if (o.group_alloc) {
        MPI_Free_mem(sbuf);
        MPI_Free_mem(rbuf);
    } else {
        free(sbuf);
        free(rbuf);
    }
    MPI_Finalize();
    return tb.wrong_total ? 1 : 0;
}
#endif
