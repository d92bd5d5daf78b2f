/* Tests of the Open MPI backend (src/comm/mpi), run under mpirun:
 * - mgbench --backend mpi in check mode over every collective, dtype and
 *   op, counts 0 to over a million, world sizes 1 to 4 and 8, malloc'd and
 *   group buffers, started by mpirun and by mgbench -n itself;
 * - this test binary as the MPI program (a constructor runs the worker
 *   named by MGT_MPI_WORKER and exits before the runner starts): the
 *   collective cases of coll_cases.c that the builtin backend passes, at
 *   1 to 5, 8 and 13 ranks, with and without group memory; world
 *   and local ranks, tagged point-to-point (order, tags, two ranks sending
 *   each other large messages first, count mismatch), sub-groups, group
 *   memory, the in-place and overlapping forms of coll.h, AVG, async
 *   work, a timeout that names the operation and the peer it fails, and
 *   mismatched collectives with MG_MPI_CHECK=1; traffic counted as the ring
 *   volume of each call (MPI hides its own);
 * - outside mpirun, a job of several ranks is refused with a clear error;
 * - the README's mpirun lines run as written (mpirun is detected: mgtrain
 *   --parallel ddp takes the MPI backend), and the builtin backend under
 *   mpirun takes its ranks from mpirun.
 * Skipped when the build has no MPI or mpirun is not installed. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/mman.h>
#include "harness.h"
#include "coll_cases.h"
#include "traffic_model.h"
#include "multigrad/comm.h"
#include "multigrad/core.h"

/* ---- workers: run as MPI ranks of this binary -------------------------- */

#define W_CHECK(cond, ...)                                                     \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed: ", w_rank,        \
                    __FILE__, __LINE__, #cond);                                 \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            return 1;                                                           \
        }                                                                       \
    } while (0)
#define W_TRY(expr)                                                               \
    do {                                                                          \
        mg_status w_s = (expr);                                                   \
        W_CHECK(w_s == MG_OK, "%s: %s: %s", #expr, mg_status_name(w_s), mg_last_error()); \
    } while (0)

static int w_rank;

static mg_call call(mg_coll coll, const void *s, void *r, size_t count, mg_dtype t, mg_op op,
                    int root)
{
    return (mg_call){.coll = coll, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t,
                     .op = op, .root = root, .file = __FILE__, .line = __LINE__};
}

static mg_group *w_join(double timeout)
{
    mg_group_options o = mg_group_options_default();
    o.backend = "mpi";
    o.timeout_s = timeout;
    mg_group *g = NULL;
    mg_status s = mg_group_init(&o, &g);
    if (s) {
        fprintf(stderr, "mg_group_init: %s: %s\n", mg_status_name(s), mg_last_error());
        return NULL;
    }
    w_rank = mg_group_rank(g);
    return g;
}

static int w_world(mg_group *g)
{
    int n = mg_group_size(g), r = mg_group_rank(g);
    W_CHECK(n == atoi(getenv("OMPI_COMM_WORLD_SIZE")), "size %d", n);
    W_CHECK(r == atoi(getenv("OMPI_COMM_WORLD_RANK")), "rank %d", r);
    W_CHECK(mg_group_local_size(g) == n && mg_group_local_rank(g) == r, "local %d/%d",
            mg_group_local_rank(g), mg_group_local_size(g));
    W_CHECK(!strcmp(mg_group_backend(g), "mpi"), "%s", mg_group_backend(g));
    return 0;
}

static int w_p2p(mg_group *g)
{
    int r = mg_group_rank(g), peer = 1 - r;
    if (r > 1) return 0;
    /* Tags: receive the second message first. */
    int32_t a[3] = {1, 2, 3}, b[5] = {4, 5, 6, 7, 8}, ra[3] = {0}, rb[5] = {0};
    if (r == 0) {
        mg_call s1 = call(MG_COLL_SEND, a, NULL, 3, MG_I32, MG_SUM, peer);
        mg_call s2 = call(MG_COLL_SEND, b, NULL, 5, MG_I32, MG_SUM, peer);
        s1.tag = 5;
        s2.tag = 6;
        W_TRY(mg_run(g, &s1));
        W_TRY(mg_run(g, &s2));
    } else {
        mg_call r2 = call(MG_COLL_RECV, NULL, rb, 5, MG_I32, MG_SUM, peer);
        mg_call r1 = call(MG_COLL_RECV, NULL, ra, 3, MG_I32, MG_SUM, peer);
        r2.tag = 6;
        r1.tag = 5;
        W_TRY(mg_run(g, &r2));
        W_TRY(mg_run(g, &r1));
        W_CHECK(ra[2] == 3 && rb[4] == 8 && rb[0] == 4, "tags mixed up");
    }
    /* Order: messages with one tag arrive in the order sent. */
    for (int i = 0; i < 20; i++) {
        int64_t v = i * 10 + r;
        mg_call c = call(r == 0 ? MG_COLL_SEND : MG_COLL_RECV, &v, &v, 1, MG_I64, MG_SUM, peer);
        c.tag = 9;
        W_TRY(mg_run(g, &c));
        if (r == 1) W_CHECK(v == i * 10, "message %d arrived as %lld", i, (long long)v);
    }
    /* Both send 8 MiB first, then receive: sends must not wait for receives. */
    size_t n = 2 << 20;
    float *out = mg_alloc(n * 4), *in = mg_alloc(n * 4);
    for (size_t i = 0; i < n; i++) out[i] = (float)(i % 1000) + r;
    mg_work *ws, *wr;
    mg_call sc = call(MG_COLL_SEND, out, NULL, n, MG_F32, MG_SUM, peer);
    mg_call rc = call(MG_COLL_RECV, NULL, in, n, MG_F32, MG_SUM, peer);
    W_TRY(mg_start(g, &sc, &ws));
    W_TRY(mg_start(g, &rc, &wr));
    W_TRY(mg_work_wait(wr, -1));
    W_TRY(mg_work_wait(ws, -1));
    mg_work_free(ws);
    mg_work_free(wr);
    for (size_t i = 0; i < n; i++)
        W_CHECK(in[i] == (float)(i % 1000) + peer, "element %zu: %g", i, in[i]);
    /* A batch with the receive listed first on both ranks: its send
     * starts first, so neither waits on the other. */
    mg_p2p_op ops[2] = {{MG_COLL_RECV, in, n, MG_F32, peer, 11},
                        {MG_COLL_SEND, out, n, MG_F32, peer, 11}};
    memset(in, 0, n * 4);
    mg_work *wb;
    W_TRY(mg_batch_isend_irecv(g, ops, 2, &wb));
    W_TRY(mg_work_wait(wb, -1));
    mg_work_free(wb);
    W_CHECK(in[n - 1] == (float)((n - 1) % 1000) + peer, "batch: %g", in[n - 1]);
    memset(in, 0, n * 4);
    W_TRY(mg_sendrecv(g, out, n, peer, 12, in, n, peer, 12, MG_F32));
    W_CHECK(in[7] == (float)7 + peer, "sendrecv: %g", in[7]);
    mg_free(out);
    mg_free(in);
    /* From any source, or from a set: the sender named. Peer failures are
     * MPI's to handle: not contained. */
    int64_t any = 0;
    int src = -1, set[1] = {1};
    for (int i = 0; i < 3; i++) {
        if (r == 1) {
            any = 70 + i;
            W_TRY(mg_send(g, &any, 1, MG_I64, 0, 13));
        } else {
            W_TRY(mg_recv_any(g, &any, 1, MG_I64, i ? set : NULL, i ? 1 : 0, 13, &src));
            W_CHECK(src == 1 && any == 70 + i, "any source: %lld from %d", (long long)any, src);
        }
    }
    W_CHECK(mg_group_contain_peer_failures(g) == MG_EUNSUPPORTED, "contain under MPI");
    /* To itself: a message sent first arrives; a receive with nothing sent
     * is refused at once and the group stays usable. */
    int64_t self_out = 42 + r, self_in = 0;
    mg_call ss = call(MG_COLL_SEND, &self_out, NULL, 1, MG_I64, MG_SUM, r);
    mg_call sr = call(MG_COLL_RECV, NULL, &self_in, 1, MG_I64, MG_SUM, r);
    W_TRY(mg_run(g, &ss));
    W_TRY(mg_run(g, &sr));
    W_CHECK(self_in == 42 + r, "from itself: %lld", (long long)self_in);
    double t0 = mg_now();
    mg_status st = mg_run(g, &sr);
    W_CHECK(st == MG_EINVAL && mg_now() - t0 < 1, "%s: %s", mg_status_name(st), mg_last_error());
    W_CHECK(strstr(mg_last_error(), "itself"), "%s", mg_last_error());
    mg_call bar = call(MG_COLL_BARRIER, NULL, NULL, 0, MG_U8, MG_SUM, 0);
    W_TRY(mg_run(g, &bar));
    /* A receive expecting more than was sent fails, naming the count. */
    int32_t small[4] = {0}, big[8] = {0};
    mg_call bad = r == 0 ? call(MG_COLL_SEND, small, NULL, 4, MG_I32, MG_SUM, peer)
                         : call(MG_COLL_RECV, NULL, big, 8, MG_I32, MG_SUM, peer);
    mg_status s = mg_run(g, &bad);
    if (r == 1) {
        W_CHECK(s == MG_EMISMATCH, "%s: %s", mg_status_name(s), mg_last_error());
        W_CHECK(strstr(mg_last_error(), "recv #") && strstr(mg_last_error(), "4 elements"),
                "%s", mg_last_error());
    }
    return 0;
}

static int w_split(mg_group *g)
{
    int r = mg_group_rank(g), n = mg_group_size(g);
    mg_group *sub = NULL;
    /* The last rank stays out; the others split by parity, keys reversed. */
    int color = r == n - 1 ? MG_UNDEFINED : r % 2;
    W_TRY(mg_group_split(g, color, -r, &sub));
    if (color == MG_UNDEFINED) {
        W_CHECK(sub == NULL, "MG_UNDEFINED gave a group");
    } else {
        int members = 0, below = 0;
        for (int q = 0; q < n - 1; q++)
            if (q % 2 == color) {
                members++;
                below += q > r;
            }
        W_CHECK(sub && mg_group_size(sub) == members, "size %d, want %d", mg_group_size(sub),
                members);
        W_CHECK(mg_group_rank(sub) == below, "rank %d, want %d", mg_group_rank(sub), below);
        int32_t v = r;
        mg_call c = call(MG_COLL_ALL_REDUCE, &v, &v, 1, MG_I32, MG_SUM, 0);
        W_TRY(mg_run(sub, &c));
        int32_t want = 0;
        for (int q = 0; q < n - 1; q++) want += q % 2 == color ? q : 0;
        W_CHECK(v == want, "sum %d, want %d", v, want);
        mg_group_destroy(sub);
    }
    /* The parent still works after the split. */
    mg_call b = call(MG_COLL_BARRIER, NULL, NULL, 0, MG_U8, MG_SUM, 0);
    W_TRY(mg_run(g, &b));
    return 0;
}

static int w_memory(mg_group *g)
{
    int r = mg_group_rank(g), n = mg_group_size(g);
    size_t count = 300001;
    float *p = mg_group_alloc(g, count * 4);
    W_CHECK(p && ((uintptr_t)p & 63) == 0, "mg_group_alloc gave %p", (void *)p);
    for (size_t i = 0; i < count; i++) W_CHECK(p[i] == 0, "not zeroed at %zu", i);
    for (size_t i = 0; i < count; i++) p[i] = (float)(i % 7 + r);
    mg_call c = call(MG_COLL_ALL_REDUCE, p, p, count, MG_F32, MG_SUM, 0);
    W_TRY(mg_run(g, &c));
    for (size_t i = 0; i < count; i++)
        W_CHECK(p[i] == (float)(n * (i % 7) + n * (n - 1) / 2), "element %zu: %g", i, p[i]);
    mg_group_free(g, p);
    return 0;
}

/* coll.h's in-place forms and other overlaps, AVG, async work. */
static int w_forms(mg_group *g)
{
    int r = mg_group_rank(g), n = mg_group_size(g);
    size_t k = 5;
    int32_t *buf = calloc(k * (size_t)n + 8, sizeof *buf);
    /* reduce_scatter, NCCL's form: the result lands at this rank's slot. */
    for (size_t i = 0; i < k * (size_t)n; i++) buf[i] = (int32_t)(i + (size_t)r);
    mg_call rs = call(MG_COLL_REDUCE_SCATTER, buf, buf + (size_t)r * k, k, MG_I32, MG_SUM, 0);
    W_TRY(mg_run(g, &rs));
    for (size_t i = 0; i < k; i++) {
        int32_t want = 0;
        for (int q = 0; q < n; q++) want += (int32_t)((size_t)r * k + i + (size_t)q);
        W_CHECK(buf[(size_t)r * k + i] == want, "reduce_scatter slot %zu: %d, want %d", i,
                buf[(size_t)r * k + i], want);
    }
    /* all_gather, both in-place spellings. */
    for (int form = 0; form < 2; form++) {
        memset(buf, 0xff, k * (size_t)n * sizeof *buf);
        for (size_t i = 0; i < k; i++) buf[(size_t)r * k + i] = (int32_t)(100 * r + (int)i);
        mg_call ag = call(MG_COLL_ALL_GATHER, form ? buf : buf + (size_t)r * k, buf, k, MG_I32,
                          MG_SUM, 0);
        W_TRY(mg_run(g, &ag));
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < k; i++)
                W_CHECK(buf[(size_t)q * k + i] == 100 * q + (int)i, "all_gather form %d", form);
    }
    /* all_reduce whose input overlaps its output by half. */
    int32_t ov[12];
    for (int i = 0; i < 12; i++) ov[i] = i + r;
    mg_call ar = call(MG_COLL_ALL_REDUCE, ov, ov + 4, 8, MG_I32, MG_MAX, 0);
    W_TRY(mg_run(g, &ar));
    for (int i = 0; i < 8; i++) W_CHECK(ov[4 + i] == i + n - 1, "overlap %d: %d", i, ov[4 + i]);
    /* AVG for integers and f16 (1.0 in f16 is 0x3c00). */
    int64_t iv = 2 * r + 10;
    mg_call avg = call(MG_COLL_ALL_REDUCE, &iv, &iv, 1, MG_I64, MG_AVG, 0);
    W_TRY(mg_run(g, &avg));
    W_CHECK(iv == n - 1 + 10, "avg %lld", (long long)iv);
    uint16_t h[3] = {0x3c00, 0x3c00, 0x4000};   /* 1, 1, 2 */
    mg_call havg = call(MG_COLL_ALL_REDUCE, h, h, 3, MG_F16, MG_AVG, 0);
    W_TRY(mg_run(g, &havg));
    W_CHECK(h[0] == 0x3c00 && h[2] == 0x4000, "f16 avg %04x %04x", h[0], h[2]);
    /* Async: three in flight, completed in order. */
    double d[3][64];
    mg_work *w[3];
    for (int j = 0; j < 3; j++) {
        for (int i = 0; i < 64; i++) d[j][i] = j + r;
        mg_call c = call(MG_COLL_ALL_REDUCE, d[j], d[j], 64, MG_F64, MG_SUM, 0);
        W_TRY(mg_start(g, &c, &w[j]));
    }
    for (int j = 2; j >= 0; j--) {
        W_TRY(mg_work_wait(w[j], -1));
        W_CHECK(mg_work_test(w[j]), "test after wait");
        W_CHECK(d[j][63] == n * j + n * (n - 1) / 2.0, "async %d: %g", j, d[j][63]);
        mg_work_free(w[j]);
    }
    free(buf);
    return 0;
}

/* Rank 0 waits for a message never sent and times out; rank 1, waiting
 * too with a long deadline, learns at once that rank 0 failed. */
static int w_timeout(mg_group *g)
{
    int r = mg_group_rank(g);
    int32_t v;
    mg_call c = call(MG_COLL_RECV, NULL, &v, 1, MG_I32, MG_SUM, 1 - r);
    double t0 = mg_now();
    mg_status s = mg_run(g, &c);
    double el = mg_now() - t0;
    if (r == 0) {
        W_CHECK(s == MG_ETIMEOUT, "%s: %s", mg_status_name(s), mg_last_error());
        W_CHECK(el >= 1.4 && el < 8, "timed out after %.2f s", el);
        W_CHECK(strstr(mg_last_error(), "recv #0 from rank 1"), "%s", mg_last_error());
    } else {
        W_CHECK(s == MG_EPEER, "%s: %s", mg_status_name(s), mg_last_error());
        W_CHECK(el < 10, "learned of the failure after %.2f s", el);
        W_CHECK(strstr(mg_last_error(), "rank 0 failed"), "%s", mg_last_error());
    }
    /* The group is failed: later operations fail at once. */
    mg_call b = call(MG_COLL_BARRIER, NULL, NULL, 0, MG_U8, MG_SUM, 0);
    t0 = mg_now();
    W_CHECK(mg_run(g, &b) != MG_OK && mg_now() - t0 < 1, "barrier on a failed group");
    return 0;
}

static int w_mismatch(mg_group *g)
{
    int r = mg_group_rank(g);
    float x[4] = {1, 2, 3, 4};
    mg_call c = r == 0 ? call(MG_COLL_ALL_REDUCE, x, x, 4, MG_F32, MG_SUM, 0)
                       : call(MG_COLL_BROADCAST, x, x, 4, MG_F32, MG_SUM, 0);
    mg_status s = mg_run(g, &c);
    W_CHECK(s == MG_EMISMATCH, "%s: %s", mg_status_name(s), mg_last_error());
    W_CHECK(strstr(mg_last_error(), "all_reduce") && strstr(mg_last_error(), "broadcast"),
            "%s", mg_last_error());
    return 0;
}

/* The collective cases of coll_cases.c (as test_coll_proc.c runs them on
 * the builtin backend), here carried by MPI. MGT_GMEM=1 puts the buffers
 * in group memory; MGT_BARFILE is a file all ranks map, for the cases'
 * check that nobody leaves a barrier early. */
typedef struct {
    mg_group *g;
    char *arena;
    size_t cap, used;
} cases_ctx;

static mg_status cases_run(void *ctx, const mg_call *c) { return mg_run(((cases_ctx *)ctx)->g, c); }
static void *cases_galloc(void *ctx, size_t bytes)
{
    cases_ctx *x = ctx;
    size_t b = (bytes + 63) & ~(size_t)63;
    if (!x->arena || x->used + b > x->cap) return NULL;
    x->used += b;
    return x->arena + x->used - b;
}
static void cases_greset(void *ctx) { ((cases_ctx *)ctx)->used = 0; }

static int w_cases(mg_group *g)
{
    int r = mg_group_rank(g), n = mg_group_size(g);
    int fd = open(getenv("MGT_BARFILE"), O_RDWR);
    W_CHECK(fd >= 0, "MGT_BARFILE");
    _Atomic int *bc = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    W_CHECK(bc != MAP_FAILED, "mmap");
    plan pl = {.gmem = atoi(getenv("MGT_GMEM")), .barrier_count = bc};
    pthread_mutex_init(&pl.mu, NULL);
    ct_build_sweep_lite(&pl, n);
    W_CHECK(pl.n > 100, "only %d cases", pl.n);
    cases_ctx x = {.g = g};
    if (pl.gmem) {
        x.cap = ct_sweep_gmem_bytes(n);
        x.arena = mg_group_alloc(g, x.cap);
        W_CHECK(x.arena, "mg_group_alloc: %s", mg_last_error());
    }
    tenv e = {r, n, cases_run, cases_galloc, cases_greset, &x};
    int bad = ct_run_plan(&e, &pl);
    W_CHECK(!bad, "%d cases: %s", pl.n, pl.err);
    if (x.arena) mg_group_free(g, x.arena);
    free(pl.cases);
    munmap((void *)bc, 4096);
    return 0;
}

/* MPI hides what it moves: each call counts the ring algorithms' volume. */
static int w_traffic(mg_group *g)
{
    int r = mg_group_rank(g), n = mg_group_size(g);
    mg_traffic t = mg_group_traffic(g);
    W_CHECK(t.sent == 0 && t.received == 0, "a new group counts %llu/%llu",
            (unsigned long long)t.sent, (unsigned long long)t.received);
    size_t count = ((size_t)1 << 20) + 5, rs = count / (size_t)n;
    float *in = malloc(count * sizeof *in), *out = malloc(count * sizeof *out);
    W_CHECK(in && out, "malloc");
    for (size_t i = 0; i < count; i++) in[i] = 1;
    tm_vol ring = tm_ring_all_reduce(count, sizeof *in, r, n);
    mg_call c = call(MG_COLL_ALL_REDUCE, in, out, count, MG_F32, MG_SUM, 0);
    W_TRY(mg_run(g, &c));
    t = mg_group_traffic(g);
    W_CHECK(t.sent == ring.sent && t.received == ring.recv, "all_reduce: %llu/%llu, ring "
            "%llu/%llu", (unsigned long long)t.sent, (unsigned long long)t.received,
            (unsigned long long)ring.sent, (unsigned long long)ring.recv);
    uint64_t blk = rs * sizeof *in, each = (uint64_t)(n - 1) * blk;
    c = call(MG_COLL_REDUCE_SCATTER, in, out, rs, MG_F32, MG_SUM, 0);
    W_TRY(mg_run(g, &c));
    c = call(MG_COLL_ALL_GATHER, in, out, rs, MG_F32, MG_SUM, 0);
    W_TRY(mg_run(g, &c));
    mg_traffic t2 = mg_group_traffic(g);
    W_CHECK(t2.sent - t.sent == 2 * each && t2.received - t.received == 2 * each,
            "reduce_scatter + all_gather: %llu/%llu, want %llu each",
            (unsigned long long)(t2.sent - t.sent), (unsigned long long)(t2.received - t.received),
            (unsigned long long)(2 * each));
    /* A message counts its bytes on both sides; a barrier nothing. */
    W_TRY(mg_barrier(g));
    if (r < 2) {
        mg_call m = call(r == 0 ? MG_COLL_SEND : MG_COLL_RECV, in, in, 1001, MG_U8, MG_SUM, 1 - r);
        W_TRY(mg_run(g, &m));
    }
    mg_traffic t3 = mg_group_traffic(g);
    W_CHECK(t3.sent - t2.sent == (r == 0 ? 1001u : 0u) &&
            t3.received - t2.received == (r == 1 ? 1001u : 0u), "send/recv: %llu/%llu",
            (unsigned long long)(t3.sent - t2.sent), (unsigned long long)(t3.received - t2.received));
    free(in);
    free(out);
    return 0;
}

__attribute__((constructor)) static void mpi_worker(void)
{
    const char *name = getenv("MGT_MPI_WORKER");
    if (!name || !*name) return;
    static const struct { const char *name; int (*fn)(mg_group *); double timeout; } workers[] = {
        {"world", w_world, 30}, {"p2p", w_p2p, 30}, {"split", w_split, 30},
        {"memory", w_memory, 30}, {"forms", w_forms, 30}, {"mismatch", w_mismatch, 30},
        {"timeout", w_timeout, 0}, {"cases", w_cases, 60}, {"traffic", w_traffic, 30},
    };
    int rc = 3;
    for (size_t i = 0; i < sizeof workers / sizeof *workers; i++) {
        if (strcmp(name, workers[i].name)) continue;
        if (!strcmp(name, "mismatch")) setenv("MG_MPI_CHECK", "1", 1);
        double timeout = workers[i].timeout;
        if (timeout == 0)   /* the timeout test: a short deadline on rank 0 only */
            timeout = atoi(getenv("OMPI_COMM_WORLD_RANK")) == 0 ? 1.5 : 30;
        mg_group *g = w_join(timeout);
        rc = g ? workers[i].fn(g) : 1;
        mg_group_destroy(g);
        if (!rc) printf("worker %s rank %d ok\n", name, w_rank);
    }
    fflush(stdout);
    fflush(stderr);
    exit(rc);
}

/* ---- the tests ------------------------------------------------------------ */

typedef mgt_result result;
#define exit_code mgt_exit_code

static void need_mpi(void)
{
#ifndef MG_HAVE_MPI
    mgt_skip("this build has no MPI (install libopenmpi-dev and openmpi-bin, rebuild)");
#endif
    if (system("command -v mpirun >/dev/null 2>&1") != 0) mgt_skip("mpirun is not installed");
}

/* Open MPI's own allocations and locking are not ours to report under
 * LeakSanitizer and ThreadSanitizer. */
static void quiet_mpi_sanitizers(void)
{
    char tpath[600];
    snprintf(tpath, sizeof tpath, "%s/tsan.supp", mgt_tmpdir());
    FILE *t = fopen(tpath, "w");
    if (t) {
        const char *libs[] = {"libmpi.so", "libopen-pal.so", "libopen-rte.so", "libpmix.so",
                              "libevent", "libhwloc.so", "mca_"};
        for (size_t i = 0; i < sizeof libs / sizeof *libs; i++)
            fprintf(t, "race:%s\ndeadlock:%s\nmutex:%s\nsignal:%s\n", libs[i], libs[i],
                    libs[i], libs[i]);
        fclose(t);
        char opt[700];
        snprintf(opt, sizeof opt, "suppressions=%s", tpath);
        setenv("TSAN_OPTIONS", opt, 1);
    }
    char path[600];
    snprintf(path, sizeof path, "%s/lsan.supp", mgt_tmpdir());
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:libpmix.so\n"
               "leak:libhwloc.so\nleak:libevent\nleak:mca_\nleak:libucp\nleak:libucs\n"
               "leak:libfabric\nleak:libpsm\nleak:libibverbs\n");
    fclose(f);
    char opt[700];
    snprintf(opt, sizeof opt, "suppressions=%s:print_suppressions=0", path);
    setenv("LSAN_OPTIONS", opt, 1);
    /* Open MPI unloads its components at MPI_Finalize, so their frames no
     * longer name a module when leaks are reported: record whole stacks
     * (slow unwinding), whose libmpi frames the suppressions then match. */
    const char *asan = getenv("ASAN_OPTIONS");
    char aopt[1024];
    snprintf(aopt, sizeof aopt, "%s%sfast_unwind_on_malloc=0", asan ? asan : "",
             asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", aopt, 1);
}

/* In the child: mpirun's settings for this container. */
static void mpi_child_env(void)
{
    /* The tests run as root in containers; mpirun refuses that unless told. */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    /* Its own session directory: two mpiruns starting at once in the
     * shared one can collide (orte_session_dir failed). */
    setenv("OMPI_MCA_orte_tmpdir_base", mgt_tmpdir(), 1);
    /* One host: shared memory only (no TCP component probing the network). */
    setenv("OMPI_MCA_btl", "self,vader", 1);
}

/* Runs argv (NULL-terminated) with MPI's root permission set; collects
 * exit status and output. */
static result *run(double timeout, const char *const *argv)
{
    quiet_mpi_sanitizers();
    mgt_tmpdir();  /* created before the fork, so the child's setenv only reads it */
    return mgt_exec(timeout, argv, mpi_child_env);
}

/* Every data row shows #wrong 0 (or -- where there is no in-place form). */
static int checked_rows(const char *out)
{
    int rows = 0;
    for (const char *line = out, *nl; *line; line = nl ? nl + 1 : line + strlen(line)) {
        nl = strchr(line, '\n');
        if (line[0] != ' ') continue;
        char w0[16] = "", w1[16] = "";
        long long size;
        int k = sscanf(line, "%lld %*s %*s %*s %*s %*s %*s %*s %15s %*s %*s %*s %15s", &size,
                       w0, w1);
        CHECK_MSG(k == 3, "malformed row: %.120s", line);
        CHECK_MSG(!strcmp(w0, "0") && (!strcmp(w1, "0") || !strcmp(w1, "--")),
                  "wrong values: %.160s", line);
        rows++;
    }
    return rows;
}

static const char *mpirun_args[] = {"mpirun", "--oversubscribe", "-n"};

/* mpirun -n N mgbench ARGS... with the MPI backend, every row exact. */
static void sweep(const char *n, const char *const *args, int min_rows)
{
    const char *bench = mgt_tool("mgbench");
    CHECK_MSG(access(bench, X_OK) == 0, "%s not built: run make -j2 all (or set MG_BIN)", bench);
    const char *argv[48];
    int k = 0;
    for (int i = 0; i < 3; i++) argv[k++] = mpirun_args[i];
    argv[k++] = n;
    argv[k++] = bench;
    argv[k++] = "--backend";
    argv[k++] = "mpi";
    while (*args) argv[k++] = *args++;
    argv[k] = NULL;
    result *r = run(120, argv);
    CHECK_MSG(exit_code(r) == 0, "mpirun -n %s mgbench: exit %d\n%s\n%s", n, exit_code(r),
              r->out, r->err);
    CHECK_MSG(strstr(r->out, "backend mpi"), "%s", r->out);
    CHECK_MSG(strstr(r->out, "# Out of bounds values : 0 OK"), "%s", r->out);
    int rows = checked_rows(r->out);
    CHECK_MSG(rows >= min_rows, "%d rows, expected at least %d", rows, min_rows);
}

static const char *const all_small[] = {"all", "-d", "all", "-o", "all", "-b", "1", "-e", "64K",
                                        "-f", "9", "-i", "1", "-w", "0", "-c", "1", NULL};
/* 6 sizes x 7 dtypes x (3 reductions x 5 ops + 6 others) + barrier */
#define ALL_SMALL_ROWS (6 * 7 * (3 * 5 + 6) + 1)

TEST_T(mpi_mgbench_exact_1_rank, 90) { need_mpi(); sweep("1", all_small, ALL_SMALL_ROWS - 42); }
TEST_T(mpi_mgbench_exact_2_ranks, 90) { need_mpi(); sweep("2", all_small, ALL_SMALL_ROWS); }
TEST_T(mpi_mgbench_exact_3_ranks, 90) { need_mpi(); sweep("3", all_small, ALL_SMALL_ROWS); }
TEST_T(mpi_mgbench_exact_4_ranks, 90) { need_mpi(); sweep("4", all_small, ALL_SMALL_ROWS); }

TEST_T(mpi_mgbench_exact_8_ranks_and_large_counts, 120)
{
    need_mpi();
    /* Eight ranks on the group's memory; then over a million elements per
     * rank (u8, 4 MiB: 1.4 million per rank for the scatters and gathers). */
    sweep("8", (const char *[]){"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                "all_to_all", "-b", "1M", "-e", "1M", "-i", "1", "-w", "0",
                                "--group-alloc", NULL}, 5);
    sweep("3", (const char *[]){"all", "-d", "u8", "-o", "max", "-b", "4M", "-e", "4M",
                                "-i", "1", "-w", "0", NULL}, 10);
    sweep("2", (const char *[]){"all_reduce", "-d", "bf16", "-o", "all", "-b", "3M", "-e",
                                "3M", "-i", "1", "-w", "0", NULL}, 5);
}

/* mgbench -n N --backend mpi starts mpirun itself. */
TEST_T(mpi_mgbench_starts_mpirun, 60)
{
    need_mpi();
    const char *bench = mgt_tool("mgbench");
    result *r = run(60, (const char *[]){bench, "-n", "3", "--backend", "mpi", "all_reduce",
                                         "gather", "-b", "4", "-e", "64K", "-f", "16", NULL});
    CHECK_MSG(exit_code(r) == 0, "exit %d\n%s\n%s", exit_code(r), r->out, r->err);
    CHECK(strstr(r->out, "ranks 3  backend mpi"));
    CHECK_EQ(checked_rows(r->out), 8);   /* 4 sizes, 2 collectives */
}

/* Under mpirun too a mistake every rank finds alike is one line, and the
 * job ends at once: a flag's (rank 0 says it, the others wait for mpirun
 * to end them) and one found once joined (rank 0 says it, the others
 * leave MPI and exit without a word, and mpirun ends the job once all
 * have). Before, the second kind printed a line per rank. */
TEST_T(mpi_a_mistake_every_rank_finds_is_said_once, 60)
{
    need_mpi();
    const char *train = mgt_tool("mgtrain");
    const char *flags[][2] = {{"--tp-chunks", "2"}, {"--mesh", "dp=2"}};
    for (int i = 0; i < 2; i++) {
        double t0 = mg_now();
        result *r = run(40, (const char *[]){"mpirun", "--oversubscribe", "-n", "3", train,
                                             "--model", "lenet5", "--parallel", "ddp",
                                             flags[i][0], flags[i][1], NULL});
        double secs = mg_now() - t0;
        int lines = 0;
        for (const char *p = r->err; (p = strstr(p, "mgtrain: ")); p++) lines++;
        CHECK_MSG(exit_code(r) != 0 && lines == 1 && secs < 10, "%s %s: exit %d, %d lines, "
                  "%.1f s\n%s", flags[i][0], flags[i][1], exit_code(r), lines, secs, r->err);
    }
    /* --help too, once for the job (each rank printed it) */
    result *r = run(40, (const char *[]){"mpirun", "--oversubscribe", "-n", "3", train, "--help",
                                         NULL});
    CHECK_MSG(exit_code(r) == 0 && mgt_count(r->out, "usage: mgtrain") == 1, "%s", r->out);
}

/* --plan auto under mpirun says the command as mpirun's (it said mgrun's,
 * found by a probe). */
TEST_T(mpi_plan_auto_says_the_mpirun_command, 120)
{
    need_mpi();
    result *r = run(100, (const char *[]){"mpirun", "--oversubscribe", "-n", "2",
                                          mgt_tool("mgtrain"), "--model", "mlp", "--plan", "auto",
                                          "--epochs", "1", NULL});
    CHECK_MSG(exit_code(r) == 0 && strstr(r->out, "plan auto: mpirun -n 2 mgtrain --model mlp") &&
              !strstr(r->out, "mgrun"), "exit %d\n%s\n%s", exit_code(r), r->out, r->err);
}

/* Under mpirun a rank stopped amid training (SIGSTOP) is found at
 * MG_TIMEOUT (the waiting operation fails, naming itself, not the rank:
 * MPI does not say whom it waits for), and the job then ends: the rank
 * that saw it used to wait in MPI_Finalize for the stopped one for ever
 * (found by a probe); it leaves unfinalized after MG_PEER_TIMEOUT, and
 * mpirun ends the job. */
TEST_T(mpi_a_stopped_rank_ends_the_job_at_the_timeout, 90)
{
    need_mpi();
    setenv("MG_TIMEOUT", "5", 1);
    setenv("MG_PEER_TIMEOUT", "3", 1);
    char script[1024];
    snprintf(script, sizeof script, "if [ $OMPI_COMM_WORLD_RANK = 1 ]; then (sleep %.0f; "
             "kill -STOP $$) & fi; exec %s --model gpt-mini --layers 2 --dim 64 --heads 4 "
             "--ctx 64 --batch 12 --steps 100000 --eval-every 100000 --eval-windows 4 "
             "--parallel ddp --quiet", 3 * mgt_slow(), mgt_tool("mgtrain"));
    double t0 = mg_now();
    result *r = run(60, (const char *[]){"mpirun", "--oversubscribe", "-n", "2", "sh", "-c",
                                         script, NULL});
    double secs = mg_now() - t0;
    CHECK_MSG(exit_code(r) != 0 && secs < 3 * mgt_slow() + 20 &&
              strstr(r->err, "did not complete within 5 s (MG_TIMEOUT)"),
              "exit %d after %.1f s\n%s", exit_code(r), secs, r->err);
}

/* This binary as the MPI program, running worker `name` on n ranks (with
 * VAR=value settings for it, or NULL). */
static void worker_env(const char *name, const char *n, const char *env1, const char *env2)
{
    need_mpi();
    char self[PATH_MAX], env[64];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0);
    self[len] = 0;
    snprintf(env, sizeof env, "MGT_MPI_WORKER=%s", name);
    const char *argv[16] = {"mpirun", "--oversubscribe", "-n", n, "-x", env};
    int k = 6;
    if (env1) argv[k++] = "-x", argv[k++] = env1;
    if (env2) argv[k++] = "-x", argv[k++] = env2;
    argv[k++] = self;
    argv[k] = NULL;
    result *r = run(90, argv);
    CHECK_MSG(exit_code(r) == 0, "worker %s on %s ranks: exit %d\n%s\n%s", name, n,
              exit_code(r), r->out, r->err);
    int ok = 0;
    for (const char *p = r->out; (p = strstr(p, " ok\n")); p++) ok++;
    CHECK_MSG(ok == atoi(n), "%d of %s ranks finished:\n%s\n%s", ok, n, r->out, r->err);
}

static void worker(const char *name, const char *n) { worker_env(name, n, NULL, NULL); }

/* The collective cases the builtin backend passes (coll_cases.c), on MPI. */
static void cases(const char *n, const char *gmem)
{
    char file[600], benv[700], genv[32];
    snprintf(file, sizeof file, "%s/barrier.%s.%s", mgt_tmpdir(), n, gmem);
    int fd = open(file, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
    close(fd);
    snprintf(benv, sizeof benv, "MGT_BARFILE=%s", file);
    snprintf(genv, sizeof genv, "MGT_GMEM=%s", gmem);
    worker_env("cases", n, benv, genv);
}

TEST_T(mpi_collective_cases_1_to_4_ranks, 120)
{
    for (int n = 1; n <= 4; n++) {
        char ns[16];
        snprintf(ns, sizeof ns, "%d", n);
        cases(ns, "0");
    }
    cases("3", "1");
}

TEST_T(mpi_collective_cases_5_8_13_ranks, 180)
{
    cases("5", "0");
    cases("8", "1");
    cases("13", "0");
}

TEST_T(mpi_world_and_local_ranks, 60) { worker("world", "3"); }
TEST_T(mpi_point_to_point, 60) { worker("p2p", "2"); }
TEST_T(mpi_split, 60) { worker("split", "4"); worker("split", "5"); }
TEST_T(mpi_group_memory, 60) { worker("memory", "2"); }
TEST_T(mpi_in_place_forms_avg_async, 60) { worker("forms", "3"); worker("forms", "1"); }
TEST_T(mpi_timeout_names_op_and_tells_peers, 60) { worker("timeout", "2"); }
TEST_T(mpi_mismatch_checked, 60) { worker("mismatch", "2"); }
TEST_T(mpi_traffic_counts_ring_volume, 60)
{
    worker("traffic", "2");
    worker("traffic", "3");
    worker("traffic", "4");
}

/* Every `mpirun` line of the README's examples, as written, with the tools
 * on PATH (two cores carry more ranks: told through the environment);
 * mgtrain lines get --epochs 1 to keep the test short (and mgbench's
 * -e 1M under a sanitizer). */
TEST_T(mpi_readme_lines_run_as_written, 300)
{
    need_mpi();
    char path[600], bin[4096], *readme;
    snprintf(path, sizeof path, "%s/../../README.md", mgt_data(""));
    readme = mgt_slurp(path, NULL);
    if (!*readme) mgt_skip("README.md is not here (%s)", path);
    snprintf(path, sizeof path, "%s", mgt_tool("mgtrain"));
    *strrchr(path, '/') = 0;
    CHECK(realpath(path, bin));
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    int ran = 0, trained = 0;
    for (char *l = strtok(readme, "\n"); l; l = strtok(NULL, "\n")) {
        if (strncmp(l, "mpirun ", 7)) continue;
        char *hash = strstr(l, " #"), cmd[8192];
        if (hash) *hash = 0;
        bool mgtrain = strstr(l, " mgtrain ") != NULL;
        /* Under a sanitizer mgbench's sizes stop at 1 MiB (64 MiB buffers
         * took minutes there). */
        snprintf(cmd, sizeof cmd, "PATH=%s:$PATH %s%s%s", bin, l,
                 mgtrain && !strstr(l, "--epochs") ? " --epochs 1" : "",
                 mgt_sanitized() && strstr(l, " mgbench ") && !strstr(l, " -e ") ? " -e 1M" : "");
        result *r = run(240, (const char *[]){"sh", "-c", cmd, NULL});
        CHECK_MSG(exit_code(r) == 0, "'%s' exited %d:\n%s\n%s", l, exit_code(r), r->out, r->err);
        if (mgtrain)
            CHECK_MSG(strstr(r->out, "final: test accuracy") && strstr(r->out, "on 2 ranks, ddp"),
                      "'%s':\n%s", l, r->out);
        if (strstr(l, " mgbench "))
            CHECK_MSG(strstr(r->out, "backend mpi"), "'%s':\n%s", l, r->out);
        trained += mgtrain;
        ran++;
    }
    free(readme);
    CHECK_MSG(ran >= 2 && trained >= 1, "%d mpirun lines in the README, %d of mgtrain", ran,
              trained);
}

/* With MG_BACKEND=builtin and a rendezvous, the ranks are mpirun's. */
TEST_T(mpi_builtin_backend_takes_mpirun_ranks, 120)
{
    need_mpi();
    char port[64];
    const char *bench = mgt_tool("mgbench");
    snprintf(port, sizeof port, "MASTER_PORT=%d", mgt_free_port());
    result *r = run(90, (const char *[]){"mpirun", "--oversubscribe", "-n", "2", "-x",
                                         "MG_BACKEND=builtin", "-x", "MASTER_ADDR=127.0.0.1", "-x",
                                         port, bench, "all_reduce", "-e", "4K", NULL});
    CHECK_MSG(exit_code(r) == 0 && strstr(r->out, "ranks 2  backend builtin"), "exit %d: %s\n%s",
              exit_code(r), r->out, r->err);
}

/* Under mgrun (not mpirun) each process would be a lone MPI world. */
static int lone(int rank, int n, void *arg)
{
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    mg_group_options o = mg_group_options_default();
    o.backend = "mpi";
    mg_group *g = NULL;
    mg_status s = mg_group_init(&o, &g);
    if (s != MG_EINVAL || !strstr(mg_last_error(), "mpirun -n 2")) {
        printf("got %s: %s\n", mg_status_name(s), mg_last_error());
        return 1;
    }
    return 0;
}

TEST_T(mpi_refuses_a_job_outside_mpirun, 30)
{
#ifndef MG_HAVE_MPI
    mgt_skip("this build has no MPI");
#endif
    if (getenv("OMPI_COMM_WORLD_SIZE")) mgt_skip("running under mpirun");
    CHECK_EQ(mgt_fork_ranks(1, lone, NULL, 20, NULL), 0);
}
