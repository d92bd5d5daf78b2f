/* Tests of the traffic counters (mg_group_traffic): with 2, 3 and 4 ranks,
 * over shared memory and TCP, each algorithm that runs a large all_reduce,
 * reduce_scatter and all_gather must count on every rank exactly the
 * bytes that algorithm moves (traffic_model.h works them out independently:
 * 2n(p-1)/p each way for the ring and the shared-memory parts, give or
 * take the rounding of uneven blocks; n(p-1)/p for reduce_scatter and
 * all_gather); the small shared-memory all_reduce, where every rank reads
 * every input, counts (p-1)n; broadcast, reduce, gather, scatter and
 * all_to_all over shared memory count what each rank takes from or gives
 * to the others, in the small, direct and staged forms; a message of k
 * bytes counts k sent on one side and k received on the other, and
 * nothing anywhere else; over a group, sent and received totals agree;
 * and a thread may read the counters while the progress thread runs
 * operations. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include "harness.h"
#include "traffic_model.h"
#include "multigrad/comm.h"
#include "multigrad/core.h"
#include "comm/builtin.h"
#include "comm/coll/algos.h"

/* Large enough for the bandwidth forms (over the 64 KiB small-message
 * region), odd so that blocks and parts are uneven. */
#define BIG_COUNT (((size_t)1 << 20) + 5)
/* Staging chunks of the shared-memory forms, set through MG_SHM_CHUNK so
 * the test knows how the staged forms cut the vector. */
#define SHM_CHUNK_BYTES ((size_t)256 << 10)

typedef struct {
    int port;
    const char *transport;   /* MG_TRANSPORT, or NULL */
    const char *algo;        /* MG_ALGO, or NULL: the selector's choice */
    int gmem;                /* buffers from mg_group_alloc */
} job;

static void run(int n, int (*fn)(int, int, void *), const char *transport, const char *algo,
                int gmem)
{
    job j = {mgt_free_port(), transport, algo, gmem};
    int bad = mgt_fork_ranks(n, fn, &j, 120, NULL);
    CHECK_MSG(bad == 0, "%d of %d ranks failed (transport %s, algo %s, gmem %d)", bad, n,
              transport ? transport : "auto", algo ? algo : "auto", gmem);
}

static mg_group *join(int rank, int n, const job *j)
{
    setenv("MG_TIMEOUT", "60", 1);
    if (j->algo) setenv("MG_ALGO", j->algo, 1);
    char chunk[32];
    snprintf(chunk, sizeof chunk, "%zu", SHM_CHUNK_BYTES);
    setenv("MG_SHM_CHUNK", chunk, 1);
    return mgt_join(rank, n, j->port, j->transport, 60);
}

static mg_traffic delta(mg_traffic before, mg_traffic after)
{
    return (mg_traffic){after.sent - before.sent, after.received - before.received};
}

/* Every rank's counters, gathered; sent and received totals agree. */
static void check_totals(mg_group *g)
{
    int n = mg_group_size(g);
    mg_traffic t = mg_group_traffic(g);
    uint64_t mine[2] = {t.sent, t.received}, *all = calloc((size_t)n * 2, sizeof *all);
    CHECK(all);
    CHECK_OK(mg_all_gather(g, mine, all, 2, MG_I64));
    uint64_t s = 0, r = 0;
    for (int q = 0; q < n; q++) {
        s += all[2 * q];
        r += all[2 * q + 1];
    }
    CHECK_MSG(s == r, "over the group %llu bytes were sent and %llu received",
              (unsigned long long)s, (unsigned long long)r);
    free(all);
}

/* ---- large collectives --------------------------------------------------- */

/* The algorithm the group runs for c: MG_ALGO (as run_coll in builtin.c
 * applies it), else the selector's choice. */
static mg__algo algo_of(mg_group *g, const job *j, const mg_call *c)
{
    mg__bi *b = g->impl;
    if (j->algo) {
        int a = mg__algo_parse(j->algo);
        if (a != MG_ALGO_SHM || b->p2p.shm) return (mg__algo)a;
    }
    return mg__coll_select(&b->p2p, c);
}

/* What rank r of p moves in c run by algorithm a (count: c's). */
static tm_vol expected(mg_group *g, const job *j, const mg_call *c, mg__algo a)
{
    int r = mg_group_rank(g), p = mg_group_size(g);
    size_t es = mg_dtype_size(c->dtype), blk = c->count * es;
    bool pow2 = !(p & (p - 1));
    mg__bi *b = g->impl;
    if (c->coll != MG_COLL_ALL_REDUCE) {
        /* reduce_scatter and all_gather: one block to (from) each peer in
         * the ring, the recursive halving (doubling) of a power of two and
         * the shared-memory forms alike. */
        CHECK_MSG(a != MG_ALGO_RD || pow2, "no model of the folded rd %s on %d ranks",
                  mg_coll_name(c->coll), p);
        CHECK_MSG(a != MG_ALGO_TREE, "no model of the tree %s", mg_coll_name(c->coll));
        return (tm_vol){(uint64_t)(p - 1) * blk, (uint64_t)(p - 1) * blk};
    }
    switch (a) {
    case MG_ALGO_RING: return tm_ring_all_reduce(c->count, es, r, p);
    case MG_ALGO_SHM:
        return tm_shm_all_reduce(c->count, es, r, p, j->gmem ? c->count : SHM_CHUNK_BYTES / es);
    case MG_ALGO_RD:
        CHECK_MSG(pow2, "no model of the folded rd all_reduce on %d ranks", p);
        if (mg__rd_use_halving(&b->p2p, blk, c->count))
            return tm_rd_halving_all_reduce(c->count, es, r, p);
        {
            /* Recursive doubling: the whole vector each round. */
            int lg = 0;
            while ((1 << lg) < p) lg++;
            return (tm_vol){(uint64_t)lg * blk, (uint64_t)lg * blk};
        }
    default:
        CHECK_MSG(0, "no model of the %s all_reduce", mg__algo_name(a));
        return (tm_vol){0, 0};
    }
}

static int big_rank(int rank, int n, void *arg)
{
    const job *j = arg;
    mg_group *g = join(rank, n, j);
    if (!g) return 2;
    mg_traffic t0 = mg_group_traffic(g);
    CHECK_MSG(t0.sent == 0 && t0.received == 0, "a new group counts %llu/%llu bytes",
              (unsigned long long)t0.sent, (unsigned long long)t0.received);
    size_t rs_count = BIG_COUNT / (size_t)n, bytes = (BIG_COUNT + (size_t)n) * sizeof(float);
    float *in = j->gmem ? mg_group_alloc(g, bytes) : malloc(bytes);
    float *out = j->gmem ? mg_group_alloc(g, bytes) : malloc(bytes);
    CHECK(in && out);
    struct {
        mg_coll coll;
        size_t count;
    } ops[] = {{MG_COLL_ALL_REDUCE, BIG_COUNT}, {MG_COLL_REDUCE_SCATTER, rs_count},
               {MG_COLL_ALL_GATHER, rs_count}};
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        size_t in_n = ops[k].coll == MG_COLL_REDUCE_SCATTER ? rs_count * (size_t)n : ops[k].count;
        for (size_t i = 0; i < in_n; i++) in[i] = (float)(rank + 1);
        mg_call c = {.coll = ops[k].coll, .sendbuf = in, .recvbuf = out, .count = ops[k].count,
                     .dtype = MG_F32, .op = MG_SUM, .file = __FILE__, .line = __LINE__};
        mg__algo a = algo_of(g, j, &c);
        tm_vol want = expected(g, j, &c, a);
        mg_traffic before = mg_group_traffic(g);
        CHECK_OK(mg_run(g, &c));
        mg_traffic got = delta(before, mg_group_traffic(g));
        float sum = (float)(n * (n + 1) / 2);
        if (ops[k].coll == MG_COLL_ALL_GATHER)
            CHECK_EQ((int)out[(size_t)(n - 1) * rs_count], n);
        else
            CHECK_EQ((int)out[ops[k].count - 1], (int)sum);
        CHECK_MSG(got.sent == want.sent && got.received == want.recv,
                  "rank %d of %d, %s of %zu x f32 by %s (%s, %s): counted %llu sent, %llu "
                  "received; the algorithm moves %llu and %llu", rank, n,
                  mg_coll_name(ops[k].coll), ops[k].count, mg__algo_name(a),
                  j->transport ? j->transport : "auto transport",
                  j->gmem ? "group memory" : "malloc", (unsigned long long)got.sent,
                  (unsigned long long)got.received, (unsigned long long)want.sent,
                  (unsigned long long)want.recv);
        if (rank == 0)
            printf("%d ranks, %s, %s: %s by %s: %llu sent, %llu received\n", n,
                   j->transport ? j->transport : "auto transport",
                   j->gmem ? "group memory" : "malloc", mg_coll_name(ops[k].coll),
                   mg__algo_name(a), (unsigned long long)got.sent,
                   (unsigned long long)got.received);
        /* The bandwidth forms are within rounding of the ideal volume. */
        double vec = (double)(ops[k].coll == MG_COLL_ALL_REDUCE ? BIG_COUNT : rs_count * (size_t)n)
                     * sizeof(float);
        double ideal = (ops[k].coll == MG_COLL_ALL_REDUCE ? 2.0 : 1.0) * vec * (n - 1) / n;
        CHECK_MSG(fabs((double)got.sent - ideal) <= 64.0 * n * 20 &&
                  fabs((double)got.received - ideal) <= 64.0 * n * 20,
                  "%s by %s: %llu/%llu bytes, ideal %.0f", mg_coll_name(ops[k].coll),
                  mg__algo_name(a), (unsigned long long)got.sent,
                  (unsigned long long)got.received, ideal);
    }
    check_totals(g);
    if (j->gmem) {
        mg_group_free(g, in);
        mg_group_free(g, out);
    } else {
        free(in);
        free(out);
    }
    mg_group_destroy(g);
    return 0;
}

static void big_sweep(const char *transport, const char *algo, int gmem)
{
    for (int n = 2; n <= 4; n++) run(n, big_rank, transport, algo, gmem);
}

TEST_T(traffic_shm_selected, 120) { big_sweep(NULL, NULL, 0); }
TEST_T(traffic_shm_direct_group_memory, 120) { big_sweep(NULL, "shm", 1); }
TEST_T(traffic_shm_staged, 120) { big_sweep(NULL, "shm", 0); }
TEST_T(traffic_shm_channels_ring, 120) { big_sweep(NULL, "ring", 0); }
TEST_T(traffic_tcp_selected, 120) { big_sweep("tcp", NULL, 0); }
TEST_T(traffic_tcp_ring, 120) { big_sweep("tcp", "ring", 0); }

TEST_T(traffic_tcp_rd_powers_of_two, 120)
{
    run(2, big_rank, "tcp", "rd", 0);
    run(4, big_rank, "tcp", "rd", 0);
}

/* ---- small all_reduce over shared memory ------------------------------------ */

static int small_rank(int rank, int n, void *arg)
{
    mg_group *g = join(rank, n, arg);
    if (!g) return 2;
    enum { COUNT = 1000 };
    int32_t in[COUNT], out[COUNT];
    for (int i = 0; i < COUNT; i++) in[i] = rank + i;
    mg_traffic before = mg_group_traffic(g);
    CHECK_OK(mg_all_reduce(g, in, out, COUNT, MG_I32, MG_SUM));
    mg_traffic got = delta(before, mg_group_traffic(g));
    CHECK_EQ(out[7], n * (n - 1) / 2 + 7 * n);
    /* Every rank reads all p inputs from the regions: (p-1)n each way, not
     * the 2n(p-1)/p of the bandwidth forms. */
    uint64_t want = (uint64_t)(n - 1) * sizeof in;
    CHECK_MSG(got.sent == want && got.received == want,
              "rank %d of %d: %llu sent, %llu received; want %llu each", rank, n,
              (unsigned long long)got.sent, (unsigned long long)got.received,
              (unsigned long long)want);
    /* A barrier carries no payload. */
    before = mg_group_traffic(g);
    CHECK_OK(mg_barrier(g));
    got = delta(before, mg_group_traffic(g));
    CHECK_EQ(got.sent, 0);
    CHECK_EQ(got.received, 0);
    check_totals(g);
    mg_group_destroy(g);
    return 0;
}

TEST_T(traffic_shm_small_all_reduce_reads_every_input, 60)
{
    for (int n = 2; n <= 4; n++) run(n, small_rank, NULL, "shm", 0);
}

/* ---- the other shared-memory collectives ------------------------------------ */

/* Region of the small forms (1/16 of the default 4 MiB slot, at most
 * 64 KiB) and the most a small reduction reads (shm_direct.c). */
#define SHM_REGION ((size_t)64 << 10)
#define SHM_SMALL_READ ((size_t)1 << 20)

static int rooted_rank(int rank, int n, void *arg)
{
    const job *j = arg;
    mg_group *g = join(rank, n, j);
    if (!g) return 2;
    size_t es = sizeof(int32_t), big = ((size_t)1 << 20) + 5, bytes = (big + (size_t)n) * es;
    int32_t *in = j->gmem ? mg_group_alloc(g, bytes) : malloc(bytes);
    int32_t *out = j->gmem ? mg_group_alloc(g, bytes) : malloc(bytes);
    CHECK(in && out);
    for (size_t i = 0; i < big + (size_t)n; i++) in[i] = rank + 1;
    int root = n - 1, me_root = rank == root;
    size_t counts[] = {1000, big};
    mg_coll colls[] = {MG_COLL_BROADCAST, MG_COLL_REDUCE, MG_COLL_GATHER, MG_COLL_SCATTER,
                       MG_COLL_ALL_TO_ALL};
    for (int ci = 0; ci < 2; ci++)
        for (int k = 0; k < 5; k++) {
            mg_coll coll = colls[k];
            bool per_rank = coll != MG_COLL_BROADCAST && coll != MG_COLL_REDUCE;
            size_t count = per_rank ? counts[ci] / (size_t)n : counts[ci], blk = count * es;
            uint64_t others = (uint64_t)(n - 1);
            tm_vol want;
            switch (coll) {
            case MG_COLL_BROADCAST: case MG_COLL_SCATTER:
                want = (tm_vol){me_root ? others * blk : 0, me_root ? 0 : blk};
                break;
            case MG_COLL_GATHER:
                want = (tm_vol){me_root ? 0 : blk, me_root ? others * blk : 0};
                break;
            case MG_COLL_REDUCE:
                if (blk <= SHM_REGION && blk * (size_t)n <= SHM_SMALL_READ)
                    /* small: the root reads every input whole */
                    want = (tm_vol){me_root ? 0 : blk, me_root ? others * blk : 0};
                else
                    want = tm_shm_reduce(count, es, rank, n, root,
                                         j->gmem ? count : SHM_CHUNK_BYTES / es);
                break;
            default:
                want = (tm_vol){others * blk, others * blk};
                break;
            }
            mg_call c = {.coll = coll, .sendbuf = coll == MG_COLL_BROADCAST ? (void *)out : in,
                         .recvbuf = out, .count = count, .dtype = MG_I32, .op = MG_SUM,
                         .root = root, .file = __FILE__, .line = __LINE__};
            if (coll == MG_COLL_BROADCAST)
                for (size_t i = 0; i < count; i++) out[i] = rank + 1;
            mg_traffic before = mg_group_traffic(g);
            CHECK_OK(mg_run(g, &c));
            mg_traffic got = delta(before, mg_group_traffic(g));
            if (coll == MG_COLL_BROADCAST) CHECK_EQ(out[count - 1], n);
            if (coll == MG_COLL_REDUCE && me_root) CHECK_EQ(out[count - 1], n * (n + 1) / 2);
            CHECK_MSG(got.sent == want.sent && got.received == want.recv,
                      "rank %d of %d, %s of %zu x i32 (%s): counted %llu sent, %llu received; "
                      "want %llu and %llu", rank, n, mg_coll_name(coll), count,
                      j->gmem ? "group memory" : "malloc", (unsigned long long)got.sent,
                      (unsigned long long)got.received, (unsigned long long)want.sent,
                      (unsigned long long)want.recv);
        }
    check_totals(g);
    if (j->gmem) {
        mg_group_free(g, in);
        mg_group_free(g, out);
    } else {
        free(in);
        free(out);
    }
    mg_group_destroy(g);
    return 0;
}

TEST_T(traffic_shm_rooted_and_all_to_all, 120)
{
    for (int n = 2; n <= 4; n++) {
        run(n, rooted_rank, NULL, "shm", 0);
        run(n, rooted_rank, NULL, "shm", 1);
    }
}

/* ---- point-to-point ------------------------------------------------------------ */

static int p2p_rank(int rank, int n, void *arg)
{
    mg_group *g = join(rank, n, arg);
    if (!g) return 2;
    size_t k = 3 * 1000 * 1000 + 7;   /* bytes */
    uint8_t *buf = malloc(k);
    CHECK(buf);
    memset(buf, rank, k);
    /* Rank 0 sends k bytes to the last rank; the others only watch. */
    int last = n - 1;
    mg_traffic before = mg_group_traffic(g);
    if (rank == 0) CHECK_OK(mg_send(g, buf, k, MG_U8, last, 3));
    if (rank == last) CHECK_OK(mg_recv(g, buf, k, MG_U8, 0, 3));
    mg_traffic got = delta(before, mg_group_traffic(g));
    CHECK_EQ(got.sent, rank == 0 ? k : 0);
    CHECK_EQ(got.received, rank == last ? k : 0);
    if (rank == last) CHECK_EQ(buf[k - 1], 0);
    /* A message to itself moves nothing between ranks. */
    before = mg_group_traffic(g);
    CHECK_OK(mg_send(g, buf, 1000, MG_U8, rank, 4));
    CHECK_OK(mg_recv(g, buf, 1000, MG_U8, rank, 4));
    got = delta(before, mg_group_traffic(g));
    CHECK_EQ(got.sent, 0);
    CHECK_EQ(got.received, 0);
    /* Messages that arrive before their receive (another tag first) count
     * once, when they arrive. */
    if (n >= 2 && rank < 2) {
        int peer = 1 - rank;
        before = mg_group_traffic(g);
        if (rank == 0) {
            CHECK_OK(mg_send(g, buf, 100, MG_U8, peer, 1));
            CHECK_OK(mg_send(g, buf, 200, MG_U8, peer, 2));
        } else {
            CHECK_OK(mg_recv(g, buf, 200, MG_U8, peer, 2));
            CHECK_OK(mg_recv(g, buf, 100, MG_U8, peer, 1));
        }
        got = delta(before, mg_group_traffic(g));
        CHECK_EQ(got.sent, rank == 0 ? 300 : 0);
        CHECK_EQ(got.received, rank == 1 ? 300 : 0);
    }
    check_totals(g);
    free(buf);
    mg_group_destroy(g);
    return 0;
}

TEST_T(traffic_send_recv_shm, 60)
{
    for (int n = 2; n <= 4; n++) run(n, p2p_rank, NULL, NULL, 0);
}

TEST_T(traffic_send_recv_tcp, 60)
{
    for (int n = 2; n <= 4; n++) run(n, p2p_rank, "tcp", NULL, 0);
}

/* ---- reading while operations run -------------------------------------------- */

typedef struct {
    mg_group *g;
    atomic_int stop;
    long reads;
    int backwards;
} watcher;

static void *watch(void *arg)
{
    watcher *w = arg;
    mg_traffic last = {0, 0};
    while (!atomic_load(&w->stop)) {
        mg_traffic t = mg_group_traffic(w->g);
        if (t.sent < last.sent || t.received < last.received) w->backwards++;
        last = t;
        w->reads++;
    }
    return NULL;
}

static int concurrent_rank(int rank, int n, void *arg)
{
    mg_group *g = join(rank, n, arg);
    if (!g) return 2;
    size_t count = 300000;
    float *v = malloc(count * sizeof *v);
    CHECK(v);
    for (size_t i = 0; i < count; i++) v[i] = 1;
    watcher w = {.g = g};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, watch, &w) == 0);
    /* Async: the progress thread runs them while this one and the watcher
     * read the counters. */
    enum { K = 6 };
    mg_work *ws[K];
    for (int k = 0; k < K; k++) CHECK_OK(mg_all_reduce_async(g, v, v, count, MG_F32, MG_SUM,
                                                             &ws[k]));
    mg_traffic mid = mg_group_traffic(g);
    for (int k = 0; k < K; k++) {
        CHECK_OK(mg_work_wait(ws[k], -1));
        mg_work_free(ws[k]);
    }
    atomic_store(&w.stop, 1);
    pthread_join(th, NULL);
    mg_traffic end = mg_group_traffic(g);
    CHECK(w.reads > 0);
    CHECK_EQ(w.backwards, 0);
    CHECK(mid.sent <= end.sent && mid.received <= end.received);
    CHECK(end.sent > 0 && end.received > 0);
    check_totals(g);
    free(v);
    mg_group_destroy(g);
    return 0;
}

TEST_T(traffic_read_while_operations_run, 60)
{
    run(3, concurrent_rank, NULL, NULL, 0);
    run(2, concurrent_rank, "tcp", NULL, 0);
}
