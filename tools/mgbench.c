/* mgbench — collective benchmark in the conventions of nccl-tests:
 *   mgbench [-n RANKS] COLLECTIVE... [flags]
 * times every collective of include/multigrad/comm.h over a range of sizes,
 * out of place and in place, and prints nccl-tests' columns (size, count,
 * type, redop, root, time, algbw, busbw, #wrong) with its bus-bandwidth
 * factors, so figures compare directly with nccl-tests and MPI benchmarks
 * (bench/mpi_peer prints the same table for Open MPI; mgbench_common.h).
 *
 * It starts its own ranks on this host (-n N: N forked processes with a
 * fresh port and job secret; for --backend mpi it re-executes itself under
 * mpirun), or runs as one rank under a launcher (mgrun: RANK/WORLD_SIZE;
 * mpirun: OMPI_COMM_WORLD_RANK, which selects the MPI backend).
 *
 * Limits: blocking operations, one at a time (as a training loop issues
 * them, not nccl-tests' back-to-back async launches); the time of a size
 * is the slowest rank's mean over the timed iterations. Check mode fills
 * buffers with small rank-dependent integers so every dtype, op and
 * algorithm must give exact results. --traffic adds the bytes a rank sent
 * and received per operation (mg_group_traffic over the timed out-of-place
 * iterations, the most of any rank) beside the bytes nccl-tests' busbw
 * assumes each rank moves (size x bus factor). */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "mgbench_common.h"

typedef struct {
    mgb_opts c;                     /* the flags mpi_peer takes too */
    int nranks;                     /* -n; 0: from the launcher, else 1 */
    const char *algo, *backend;
    int tcp;
    mg_device dev;                  /* --device: where the buffers are */
    int dev_local;                  /* --device cuda: the local rank's GPU */
    double timeout;
    char **argv;
} options;

/* ---- command line ------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
"usage: mgbench [-n RANKS] COLLECTIVE... [flags]\n"
"Times multigrad collectives in the manner of nccl-tests: for each size,\n"
"out of place and in place, the slowest rank's mean time, algbw and busbw\n"
"(nccl-tests' bus-bandwidth factors), and #wrong in check mode.\n"
"\n"
"COLLECTIVE: broadcast reduce all_reduce all_gather gather scatter\n"
"  reduce_scatter all_to_all barrier sendrecv, or 'all' (several may be given)\n"
"\n"
"  -n, --nranks N        start N ranks on this host (forked processes, or\n"
"                        mpirun -n N for --backend mpi); under a launcher\n"
"                        (mgrun, mpirun) it must match the launcher's size\n"
"  -b, --minbytes SIZE   smallest size (default 4; suffixes K, M, G = 2^10..)\n"
"  -e, --maxbytes SIZE   largest size (default 64M)\n"
"  -f, --stepfactor F    multiply the size by F each step (default 2)\n"
"      --stepbytes SIZE  add SIZE each step instead (unless -f is given)\n"
"  -i, --iters N         timed iterations per size (default 20)\n"
"  -w, --warmup N        untimed iterations first (default 5)\n"
"  -c, --check 0|1       verify results with exact integer data (default 1)\n"
"  -d, --dtype T         f32 f64 f16 bf16 i32 i64 u8, or all (default f32;\n"
"                        nccl-tests' names float, double, half, bfloat16,\n"
"                        int32, int64, uint8 work too)\n"
"  -o, --op OP           sum prod min max avg, or all (default sum)\n"
"  -r, --root R          root of broadcast/reduce/gather/scatter (default 0)\n"
"  -a, --algo A          auto ring rd tree shm central (sets MG_ALGO; central:\n"
"                        every collective through rank 0, a parameter server's\n"
"                        aggregation)\n"
"      --backend B       builtin (default; mpi under mpirun) or mpi\n"
"      --group-alloc     buffers from mg_group_alloc (shared memory peers\n"
"                        read directly) instead of malloc\n"
"      --device D        buffers in device memory (cuda: each local rank's\n"
"                        GPU; cuda:N or emu), as nccl-tests' are: through\n"
"                        NCCL when every rank has a GPU of its own, else\n"
"                        staged through the host; the check copies its data\n"
"                        in and out untimed\n"
"  -t, --tcp             TCP between all ranks (sets MG_TRANSPORT=tcp)\n"
"  -T, --timeout S       the group's deadline per operation (MG_TIMEOUT)\n"
"      --traffic         three more columns: the most bytes any rank sent and\n"
"                        received per operation (mg_group_traffic, out of\n"
"                        place), and the bytes per rank busbw assumes (size\n"
"                        x the bus factor): 2(n-1)/n x size for a ring\n"
"                        all_reduce; the mpi backend counts ring volumes\n"
"      --model-time      one more column: the time the cost model gives the\n"
"                        row (mg_coll_time_by: the algorithm of -a, auto the\n"
"                        model's choice) on the transport's builtin figures\n"
"      --version         version, CPU and kernels of this machine\n"
"  -h, --help            this help\n"
"\n"
"Differences from nccl-tests: -n is the number of ranks, as in mpirun -n\n"
"(nccl-tests' -n, the iteration count, is -i here; nccl-tests' -i, the\n"
"step in bytes, is --stepbytes here); -t is TCP, not threads per process\n"
"(a rank is a process); -a is the algorithm, not the averaging (the time\n"
"is always the slowest rank's, nccl-tests' -a 3); there is no -g (GPUs per\n"
"thread: --device names a rank's one device). Sizes are whole buffers as in\n"
"nccl-tests: all_gather, gather, reduce_scatter, scatter and all_to_all\n"
"move size/RANKS per rank. busbw = algbw * 2(n-1)/n for all_reduce, (n-1)/n\n"
"for all_gather, gather, scatter, reduce_scatter and all_to_all, 1 for\n"
"broadcast, reduce and sendrecv. In place follows MPI: a gather's own\n"
"block sits at its slot, reduce_scatter leaves its result at the start.\n"
"Exit status: 0 when everything ran and every check passed; 1 on a failed\n"
"operation or a wrong value; 2 for bad flags.\n");
}

enum { OPT_BACKEND = 256, OPT_VERSION, OPT_TRAFFIC, OPT_DEVICE, OPT_MODEL_TIME };

static void parse_args(int argc, char **argv, options *o)
{
    static const struct option longs[] = {
        MGB_LONGOPTS,
        {"nranks", required_argument, NULL, 'n'},
        {"algo", required_argument, NULL, 'a'},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"tcp", no_argument, NULL, 't'},
        {"timeout", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {"traffic", no_argument, NULL, OPT_TRAFFIC},
        {"model-time", no_argument, NULL, OPT_MODEL_TIME},
        {"device", required_argument, NULL, OPT_DEVICE},
        {0, 0, 0, 0},
    };
    *o = (options){.argv = argv};
    mgb_defaults(&o->c);
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":" MGB_SHORTOPTS "n:a:tT:h", longs, NULL)) != -1) {
        if (mgb_option(&o->c, opt, optarg)) continue;
        switch (opt) {
        case 'n': o->nranks = (int)mgb_parse_long("-n", optarg, 1, 4096); break;
        case 'a':
            if (strcmp(optarg, "auto") && strcmp(optarg, "ring") && strcmp(optarg, "rd") &&
                strcmp(optarg, "tree") && strcmp(optarg, "shm") && strcmp(optarg, "central"))
                mgb_bad_input("-a: unknown algorithm '%s' (auto ring rd tree shm central)", optarg);
            o->algo = optarg;
            break;
        case OPT_BACKEND:
            if (strcmp(optarg, "builtin") && strcmp(optarg, "mpi"))
                mgb_bad_input("--backend: '%s' is not builtin or mpi", optarg);
            o->backend = optarg;
            break;
        case 't': o->tcp = 1; break;
        case OPT_TRAFFIC: o->c.traffic = 1; break;
        case OPT_MODEL_TIME: o->c.model_time = 1; break;
        case OPT_DEVICE:
            if (mg_device_parse(optarg, &o->dev)) mgb_bad_input("--device: %s", mg_last_error());
            o->dev_local = !strcmp(optarg, "cuda");
            break;
        case 'T': o->timeout = mgb_parse_double("-T", optarg, 0, 1e7, MG_OPEN_LO); break;
        case 'h': usage(stdout); exit(0);
        case OPT_VERSION: mg_print_version("mgbench"); exit(0);
        default: mgb_bad_option(opt, argv);
        }
    }
    mgb_finish_args(&o->c, argc, argv);
    if (o->dev.kind != MG_DEVICE_CPU && o->c.group_alloc)
        mgb_bad_input("--device and --group-alloc: device memory is not group memory; give one");
    if (o->c.model_time && ((o->backend && !strcmp(o->backend, "mpi")) || o->dev.kind != MG_DEVICE_CPU))
        mgb_bad_input("--model-time: the cost model is the builtin backend's on the CPU; "
                      "leave out --backend mpi and --device");
}

/* ---- one measurement ------------------------------------------------------ */

typedef struct {
    mg_group *g;
    const options *o;
    int rank, size;
    void *sbuf, *rbuf;
    size_t cap;                     /* bytes in each buffer */
    void *dsbuf, *drbuf;            /* --device: the operations' buffers; sbuf and
                                       rbuf then hold the check's data */
    mgb_table tb;
} bench;

/* With --device, the device buffer at p's offset in sbuf or rbuf. */
static void *on_device(const bench *b, const void *p)
{
    if (!b->dsbuf || !p || p == MG_IN_PLACE) return (void *)p;
    const char *c = p, *s = b->sbuf, *r = b->rbuf;
    if (c >= s && c < s + b->cap) return (char *)b->dsbuf + (c - s);
    return (char *)b->drbuf + (c - r);
}

/* --device: n bytes of both buffers copied to the device, or the
 * receive buffer back. */
static void copy_check_data(const bench *b, size_t n, bool in)
{
    mg_device cpu = {MG_DEVICE_CPU, 0}, d = b->o->dev;
    if (n > b->cap) n = b->cap;
    mg_status s = in ? mg_device_copy(d, b->dsbuf, cpu, b->sbuf, n)
                     : mg_device_copy(cpu, b->rbuf, d, b->drbuf, n);
    if (!s && in) s = mg_device_copy(d, b->drbuf, cpu, b->rbuf, n);
    if (s) {
        fprintf(stderr, "%s: rank %d: %s\n", mgb_prog, b->rank, mg_last_error());
        exit(1);
    }
}

static void __attribute__((noreturn)) op_failed(const bench *b, int coll, mg_dtype t,
                                                 size_t bytes, mg_status s)
{
    fprintf(stderr, "%s: rank %d: %s of %zu B (%s) failed: %s: %s\n", mgb_prog, b->rank,
            mgb_coll_names[coll], bytes, mg_dtype_name(t), mg_status_name(s),
            mg_error_past_rank(mg_last_error(), b->rank));
    exit(1);
}

static mg_status run_once(bench *b, const mg_call *c, int coll)
{
    if (coll != MGB_SENDRECV) return mg_run(b->g, c);
    /* Each rank sends to the next and receives from the previous one. */
    int n = b->size, r = b->rank;
    mg_work *ws = NULL, *wr = NULL;
    mg_call snd = *c, rcv = *c;
    snd.coll = MG_COLL_SEND;
    snd.recvbuf = NULL;
    snd.root = (r + 1) % n;
    snd.tag = 7;
    rcv.coll = MG_COLL_RECV;
    rcv.sendbuf = NULL;
    rcv.root = (r + n - 1) % n;
    rcv.tag = 7;
    mg_status s = mg_start(b->g, &snd, &ws);
    if (!s) s = mg_start(b->g, &rcv, &wr);
    mg_status s2 = wr ? mg_work_wait(wr, -1) : MG_OK;
    mg_status s1 = ws ? mg_work_wait(ws, -1) : MG_OK;
    mg_work_free(wr);
    mg_work_free(ws);
    return s ? s : s1 ? s1 : s2;
}

/* A one-element all-reduce of a figure across ranks. */
static void combine(bench *b, void *v, mg_dtype t, mg_op op)
{
    mg_call c = {.coll = MG_COLL_ALL_REDUCE, .sendbuf = MG_IN_PLACE, .recvbuf = v, .count = 1,
                 .dtype = t, .op = op, .file = __FILE__, .line = __LINE__};
    mg_status s = mg_run(b->g, &c);
    if (s) op_failed(b, MG_COLL_ALL_REDUCE, t, mg_dtype_size(t), s);
}

/* One column group of a row: the slowest rank's mean time in us and the
 * number of wrong elements over all ranks (-1 when not checked); with
 * --traffic, the most bytes any rank sent and received per timed
 * operation (tr[0], tr[1]). */
static void measure(bench *b, const mgb_case *mc, double *us, long long *wrong, double *tr)
{
    const mgb_opts *o = &b->o->c;
    int coll = mc->coll;
    size_t bytes = mgb_shown_count(coll, mc->k, b->size) * mg_dtype_size(mc->t);
    mg_call c = {.coll = (mg_coll)coll, .sendbuf = mc->inplace ? MG_IN_PLACE : mc->sbuf,
                 .recvbuf = mc->rbuf, .count = mc->k, .dtype = mc->t, .op = mc->op,
                 .root = mc->root, .file = __FILE__, .line = __LINE__};
    if (coll == MG_COLL_BROADCAST && mc->inplace) c.sendbuf = mc->rbuf;
    c.sendbuf = on_device(b, c.sendbuf);
    c.recvbuf = on_device(b, c.recvbuf);
    /* The most any operation's buffer holds: count x ranks. */
    size_t extent = mc->k * (size_t)b->size * mg_dtype_size(mc->t);
    mg_status s;
    int64_t bad = -1;
    if (o->check) {
        mgb_prepare(mc);
        if (b->dsbuf) copy_check_data(b, extent, true);
        if ((s = run_once(b, &c, coll))) op_failed(b, coll, mc->t, bytes, s);
        if (b->dsbuf) copy_check_data(b, extent, false);
        bad = mgb_verify(mc);
    }
    for (int i = 0; i < o->warmup; i++)
        if ((s = run_once(b, &c, coll))) op_failed(b, coll, mc->t, bytes, s);
    if ((s = mg_barrier(b->g))) op_failed(b, MG_COLL_BARRIER, mc->t, 0, s);
    mg_traffic m0 = mg_group_traffic(b->g);
    double t0 = mg_now();
    for (int i = 0; i < o->iters; i++)
        if ((s = run_once(b, &c, coll))) op_failed(b, coll, mc->t, bytes, s);
    double mean = (mg_now() - t0) / o->iters * 1e6;
    mg_traffic m1 = mg_group_traffic(b->g);
    tr[0] = (double)(m1.sent - m0.sent) / o->iters;
    tr[1] = (double)(m1.received - m0.received) / o->iters;
    if (o->traffic) {
        combine(b, &tr[0], MG_F64, MG_MAX);
        combine(b, &tr[1], MG_F64, MG_MAX);
    }
    /* One figure for all ranks: the slowest rank's (nccl-tests averages the ranks by
     * default, -a 1; its -a 3, the maximum, is this one). */
    combine(b, &mean, MG_F64, MG_MAX);
    if (o->check) combine(b, &bad, MG_I64, MG_SUM);
    *us = mean;
    *wrong = bad;
}

/* --model-time: the cost model's microseconds for the row, by the
 * algorithm asked for (MG_ALGO; auto: the model's choice) on the
 * builtin figures of the transport (shared memory unless TCP); negative
 * where the model has none (shm over TCP, which runs the model's
 * choice). */
static double model_us(const bench *b, int coll, size_t bytes)
{
    const char *algo = b->o->algo ? b->o->algo : mg_env_str("MG_ALGO", "auto");
    bool tcp = b->o->tcp || !strcmp(mg_env_str("MG_TRANSPORT", "auto"), "tcp");
    mg_coll c = coll == MGB_SENDRECV ? MG_COLL_SEND : (mg_coll)coll;
    return mg_coll_time_by(algo, c, (double)bytes, b->size, mg_link_builtin(tcp ? "tcp" : "shm")) * 1e6;
}

static void bench_row(bench *b, int coll, mg_dtype t, mg_op op, size_t req_bytes)
{
    size_t es = mg_dtype_size(t);
    mgb_case mc = {.coll = coll, .r = b->rank, .n = b->size, .root = b->o->c.root, .t = t,
                   .op = op, .sbuf = b->sbuf, .rbuf = b->rbuf};
    mc.k = mgb_per_rank_count(coll, req_bytes / es, b->size);
    size_t count = mgb_shown_count(coll, mc.k, b->size);
    if (b->rank == 0) mgb_print_row_start(count * es, count, t, coll, op, mc.root);
    double tr[2] = {0, 0}, tr_in[2];
    for (mc.inplace = 0; mc.inplace < 2; mc.inplace++) {
        if (mc.inplace && mgb_no_in_place(coll)) {
            if (b->rank == 0) mgb_print_no_cols();
            continue;
        }
        double us;
        long long wrong;
        measure(b, &mc, &us, &wrong, mc.inplace ? tr_in : tr);
        if (b->rank == 0) mgb_print_cols(&b->tb, coll, b->size, count * es, us, wrong);
        else if (wrong > 0) b->tb.wrong_total += wrong;
    }
    if (b->rank == 0) {
        if (b->o->c.traffic)
            printf("  %12.0f  %12.0f  %12.0f", tr[0], tr[1],
                   (double)(count * es) * mgb_bus_factor(coll, b->size));
        if (b->o->c.model_time) {
            double m = model_us(b, coll, count * es);
            if (m < 0) printf("  %9s", "N/A");   /* shm where the ranks share no memory */
            else printf("  %9.1f", m);
        }
        printf("\n");
        fflush(stdout);
    }
}

static void print_header(const bench *b, const char *backend)
{
    const options *o = b->o;
    printf("# mgbench:");
    for (int i = 0; i < o->c.ncolls; i++) printf(" %s", mgb_coll_names[o->c.colls[i]]);
    printf("  ranks %d  backend %s", b->size, backend);
    /* Algorithms and transports are the builtin backend's; MPI picks its own. */
    if (!strcmp(backend, "builtin"))
        printf("  algo %s  transport %s", o->algo ? o->algo : mg_env_str("MG_ALGO", "auto"),
               o->tcp ? "tcp" : mg_env_str("MG_TRANSPORT", "auto"));
    char d[16];
    mg_device_format(o->dev, d, sizeof d);
    const char *path = mg_group_device_path(b->g, NULL);
    if (o->dev.kind != MG_DEVICE_CPU)
        printf("  buffers %s (%s)\n", d, strcmp(path, "nccl") ? "staged through the host" : "NCCL");
    else printf("  buffers %s\n", o->c.group_alloc ? "mg_group_alloc" : "malloc");
    mgb_print_header(&o->c);
}

static void bench_all(bench *b)
{
    const mgb_opts *o = &b->o->c;
    for (int ci = 0; ci < o->ncolls; ci++) {
        int coll = o->colls[ci];
        if (b->rank == 0 && o->ncolls > 1) printf("# %s\n", mgb_coll_names[coll]);
        if (coll == MGB_SENDRECV && b->size < 2) {
            if (b->rank == 0) printf("#  (skipped: sendrecv needs at least 2 ranks)\n");
            continue;
        }
        if (coll == MG_COLL_BARRIER) {
            bench_row(b, coll, MG_U8, MG_SUM, 0);
            continue;
        }
        int nops = mgb_is_reduction(coll) ? o->nops : 1;
        for (int di = 0; di < o->ndtypes; di++)
            for (int pi = 0; pi < nops; pi++)
                for (size_t sz = o->minb; sz <= o->maxb; sz = mgb_next_size(o, sz))
                    bench_row(b, coll, (mg_dtype)o->dtypes[di],
                              mgb_is_reduction(coll) ? (mg_op)o->ops[pi] : MG_SUM, sz);
    }
}

static int run_rank(const options *given, const char *backend)
{
    options mine = *given;   /* --device cuda: this local rank's GPU */
    if (mine.dev_local) mine.dev.index = mg_device_cuda_local();
    const options *o = &mine;
    mg_group_options go = mg_group_options_default();
    go.backend = backend;
    if (o->timeout > 0) go.timeout_s = o->timeout;
    bench b = {.o = o};
    /* What every rank finds alike, before the group: rank 0's exit would
     * end the others' rendezvous, each then saying it could not join. */
    if (o->dev.kind != MG_DEVICE_CPU && mg_device_check(o->dev))
        mgb_bad_input("--device: %s", mg_last_error());
    b.cap = o->c.maxb > 64 ? o->c.maxb : 64;
    if (!o->c.group_alloc && (!(b.sbuf = mg_alloc(b.cap)) || !(b.rbuf = mg_alloc(b.cap))))
        mgb_bad_input("-e %zu: cannot allocate 2 x %zu B: out of memory: give a smaller -e "
                      "(the largest size)", o->c.maxb, b.cap);
    mg_status s = mg_group_init(&go, &b.g);
    if (s) {
        fprintf(stderr, "%s: cannot join the group: %s: %s\n", mgb_prog, mg_status_name(s),
                mg_last_error());
        return 1;
    }
    b.rank = mg_group_rank(b.g);
    b.size = mg_group_size(b.g);
    int need_sendrecv = 0, rc = 0;
    for (int i = 0; i < o->c.ncolls; i++) need_sendrecv |= o->c.colls[i] == MGB_SENDRECV;
    if (o->c.root >= b.size) {
        if (b.rank == 0)
            fprintf(stderr, "%s: -r %d is not a rank of this %d-rank group (see %s --help)\n",
                    mgb_prog, o->c.root, b.size, mgb_prog);
        rc = MGB_BAD_INPUT;
    } else if (need_sendrecv && b.size < 2 && !o->c.all_colls) {
        if (b.rank == 0)
            fprintf(stderr, "%s: sendrecv needs at least 2 ranks (see %s --help)\n", mgb_prog,
                    mgb_prog);
        rc = MGB_BAD_INPUT;
    }
    if (rc) {
        mg_group_destroy(b.g);
        mg_free(b.sbuf);
        mg_free(b.rbuf);
        return rc;
    }
    if (o->c.group_alloc) {
        b.sbuf = mg_group_alloc(b.g, b.cap);
        b.rbuf = mg_group_alloc(b.g, b.cap);
        if (!b.sbuf || !b.rbuf)   /* every rank asks for as much */
            mgb_bad_input("-e %zu: cannot allocate 2 x %zu B with mg_group_alloc: %s",
                          o->c.maxb, b.cap, mg_last_error());
    }
    if (o->dev.kind != MG_DEVICE_CPU &&
        (mg_device_check(o->dev) || !(b.dsbuf = mg_device_alloc(o->dev, b.cap)) ||
         !(b.drbuf = mg_device_alloc(o->dev, b.cap)))) {
        fprintf(stderr, "%s: rank %d: --device: %s\n", mgb_prog, b.rank, mg_last_error());
        return 1;
    }
    /* On GPUs, NCCL when every rank has its own (mg_group_use_device). */
    if (o->dev.kind == MG_DEVICE_CUDA && mg_group_use_device(b.g, o->dev)) {
        fprintf(stderr, "%s: rank %d: --device: %s\n", mgb_prog, b.rank, mg_last_error());
        return 1;
    }
    /* Touch every page now so that page faults are not timed. */
    memset(b.sbuf, 0, b.cap);
    memset(b.rbuf, 0, b.cap);
    if (b.rank == 0) print_header(&b, mg_group_backend(b.g));
    bench_all(&b);
    if (b.rank == 0) mgb_print_footer(&b.tb);
    if (o->c.group_alloc) {
        mg_group_free(b.g, b.sbuf);
        mg_group_free(b.g, b.rbuf);
    } else {
        mg_free(b.sbuf);
        mg_free(b.rbuf);
    }
    mg_device_free(o->dev, b.dsbuf);
    mg_device_free(o->dev, b.drbuf);
    mg_group_destroy(b.g);
    /* Every rank knows the total: the counts were all-reduced. */
    return b.tb.wrong_total ? 1 : 0;
}

/* ---- starting ranks --------------------------------------------------------- */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void set_env_int(const char *name, long v)
{
    char s[32];
    snprintf(s, sizeof s, "%ld", v);
    setenv(name, s, 1);
}

/* Forks n ranks on this host, as mgrun would start them, and waits; when
 * one fails the others are stopped. Returns the exit status. */
static int launch_local(const options *o, int n, const char *backend)
{
    int port = free_port();
    unsigned char key[32];
    if (port <= 0 || getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) {
        fprintf(stderr, "%s: cannot pick a port or draw a job secret: %s\n", mgb_prog,
                strerror(errno));
        return 1;
    }
    char secret[2 * sizeof key + 1];
    for (size_t i = 0; i < sizeof key; i++) sprintf(secret + 2 * i, "%02x", key[i]);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    set_env_int("MASTER_PORT", port);
    setenv("MG_JOB_SECRET", secret, 1);
    unsetenv("MG_STORE_PORT");   /* a launcher's store (mgrun's, or one left in the
                                    environment): this job's rank 0 serves its own */
    set_env_int("WORLD_SIZE", n);
    set_env_int("LOCAL_WORLD_SIZE", n);
    /* Ranks, not threads, use the cores (as mgrun). */
    if (n > 1) {
        setenv("OMP_NUM_THREADS", "1", 0);
        setenv("OPENBLAS_NUM_THREADS", "1", 0);
    }
    if (n == 1) {
        setenv("RANK", "0", 1);
        setenv("LOCAL_RANK", "0", 1);
        return run_rank(o, backend);
    }
    pid_t parent = getpid();
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!pids) return 1;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "%s: fork: %s\n", mgb_prog, strerror(errno));
            for (int k = 0; k < r; k++) kill(pids[k], SIGKILL);
            free(pids);
            return 1;
        }
        if (pid == 0) {
            /* A rank must not outlive mgbench. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            set_env_int("RANK", r);
            set_env_int("LOCAL_RANK", r);
            int rc = run_rank(o, backend);
            fflush(stdout);
            exit(rc);
        }
        pids[r] = pid;
    }
    int rc = 0, left = n;
    double kill_at = 0;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, kill_at > 0 ? WNOHANG : 0);
        if (p < 0 && errno == EINTR) continue;
        if (p < 0) break;
        if (p == 0) {
            if (mg_now() > kill_at)
                for (int r = 0; r < n; r++) if (pids[r]) kill(pids[r], SIGKILL);
            usleep(10000);
            continue;
        }
        for (int r = 0; r < n; r++) {
            if (pids[r] != p) continue;
            pids[r] = 0;
            left--;
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            if (code && !rc) {
                rc = code;
                if (WIFSIGNALED(st))
                    fprintf(stderr, "%s: rank %d was killed by signal %d (%s)\n", mgb_prog, r,
                            WTERMSIG(st), strsignal(WTERMSIG(st)));
                /* The failed rank said why; the others would only wait for it
                 * until the deadline. SIGCONT a stopped one, so that it acts
                 * on SIGTERM; SIGKILL after MG_GRACE whoever ignores it, as
                 * mgrun does (a fixed 10 s, a probe). */
                kill_at = mg_now() + mg_env_double("MG_GRACE", 5);
                for (int k = 0; k < n; k++)
                    if (pids[k]) {
                        kill(pids[k], SIGTERM);
                        kill(pids[k], SIGCONT);
                    }
            }
        }
    }
    free(pids);
    return rc;
}

/* --backend mpi -n N outside mpirun: start N copies of ourselves under it. */
static int launch_mpirun(const options *o, int n)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "%s: cannot find its own executable: %s\n", mgb_prog, strerror(errno));
        return 1;
    }
    self[len] = 0;
    int argc = 0;
    while (o->argv[argc]) argc++;
    char **args = calloc((size_t)argc + 16, sizeof *args);
    if (!args) return 1;
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", n);
    int k = 0;
    args[k++] = (char *)mg_env_str("MG_MPIRUN", "mpirun");
    /* A container often runs as root, which mpirun refuses unless told. */
    if (geteuid() == 0) args[k++] = "--allow-run-as-root";
    args[k++] = "--oversubscribe";
    args[k++] = "-n";
    args[k++] = nbuf;
    args[k++] = self;
    for (int i = 1; i < argc; i++) args[k++] = o->argv[i];
    args[k] = NULL;
    fflush(stdout);
    execvp(args[0], args);
    fprintf(stderr, "%s: cannot run %s for --backend mpi: %s (install openmpi-bin, or start "
            "mgbench under mpirun yourself)\n", mgb_prog, args[0], strerror(errno));
    free(args);
    return 1;
}

int main(int argc, char **argv)
{
    /* Under a launcher every rank reports bad flags: the launcher may stop
     * rank 0 before it prints once another rank has exited. */
    options o;
    parse_args(argc, argv, &o);
    if (mg_tunables_check()) mgb_bad_input("%s", mg_last_error());
    if (o.algo) setenv("MG_ALGO", o.algo, 1);
    if (o.tcp) setenv("MG_TRANSPORT", "tcp", 1);
    /* Under a launcher (mgrun, torchrun, mpirun) this is one of its ranks;
     * the group picks the backend (MPI under mpirun) unless --backend does. */
    mg_launch l = mg_launch_detect();
    if (l.by && o.nranks && l.size >= 0 && l.size != o.nranks)
        mgb_bad_input("-n %d, but the launcher started %d ranks", o.nranks, l.size);
    /* Checked before any rank starts, so the message cannot be lost when a
     * launcher stops the ranks that have not printed yet (a launcher that
     * does not say its size leaves them to run_rank). */
    int n = l.by ? l.size : o.nranks ? o.nranks : 1;
    if (n > 0 && o.c.root >= n)
        mgb_bad_input("-r %d is not a rank of this %d-rank group", o.c.root, n);
    bool sendrecv = false;
    for (int i = 0; i < o.c.ncolls; i++) sendrecv |= o.c.colls[i] == MGB_SENDRECV;
    if (sendrecv && n == 1 && !o.c.all_colls)
        mgb_bad_input("sendrecv needs at least 2 ranks");
    if (l.by) return run_rank(&o, o.backend);
    const char *backend = o.backend ? o.backend : mg_env_str("MG_BACKEND", NULL);
    if (backend && !strcmp(backend, "mpi")) return launch_mpirun(&o, n);
    return launch_local(&o, n, backend);
}
