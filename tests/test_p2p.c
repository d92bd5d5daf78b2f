/* Tests of point-to-point messages over shared memory and TCP: ordering
 * within a tag, receives in another tag order than the sends (unexpected
 * messages), zero-length and large messages, messages to oneself, two
 * ranks (and a ring of ranks) sending each other large messages at once,
 * messages interleaved with collectives, size mismatches, batches of
 * sends and receives whose receives are listed first, batches run by
 * NCCL's rules (MG_BATCH_RULES=nccl), and receives from any source (or a
 * set), with a dead peer's failure contained or not. */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "multigrad/comm.h"
#include "comm/transport/sock.h"

typedef struct {
    int port;
    const char *transport;
} job;

static job new_job(const char *transport)
{
    return (job){mgt_free_port(), transport};
}

static mg_group *join_group(int rank, int n, const job *j, double timeout)
{
    return mgt_join(rank, n, j->port, j->transport, timeout);
}

static void run(int n, int (*fn)(int, int, void *), const char *transport)
{
    job j = new_job(transport);
    int bad = mgt_fork_ranks(n, fn, &j, 60, NULL);
    CHECK_MSG(bad == 0, "%d of %d ranks failed (transport %s)", bad, n,
              transport ? transport : "auto");
}

/* ---- ordering and tags ----------------------------------------------------- */

enum { K = 12 };

static size_t msg_count(int k) { return k == 5 ? 0 : (size_t)k * 1000 + 3; }

static int order_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 30);
    if (!g) return 2;
    size_t big = (size_t)3 << 20;
    int32_t *buf = malloc((msg_count(K - 1) + 1) * sizeof *buf);
    int32_t *large = malloc(big * sizeof *large);
    CHECK(buf && large);
    if (rank == 0) {
        for (int k = 0; k < K; k++) {
            for (size_t i = 0; i < msg_count(k); i++) buf[i] = k * 7 + (int32_t)i;
            CHECK_OK(mg_send(g, buf, msg_count(k), MG_I32, 1, k % 4));
        }
        for (size_t i = 0; i < big; i++) large[i] = (int32_t)(i * 3);
        CHECK_OK(mg_send(g, large, big, MG_I32, 1, 99));
    } else {
        /* Tags in reverse order; within a tag, in sending order. */
        for (int t = 3; t >= 0; t--)
            for (int k = t; k < K; k += 4) {
                memset(buf, 0xff, (msg_count(k) + 1) * sizeof *buf);
                CHECK_OK(mg_recv(g, buf, msg_count(k), MG_I32, 0, t));
                for (size_t i = 0; i < msg_count(k); i++) CHECK_EQ(buf[i], k * 7 + (int32_t)i);
                CHECK_EQ(buf[msg_count(k)], -1); /* nothing written past the end */
            }
        CHECK_OK(mg_recv(g, large, big, MG_I32, 0, 99));
        for (size_t i = 0; i < big; i += 997) CHECK_EQ(large[i], (int32_t)(i * 3));
    }
    CHECK_OK(mg_barrier(g));
    free(buf);
    free(large);
    mg_group_destroy(g);
    return 0;
}

TEST(p2p_order_and_tags_shm) { run(2, order_rank, NULL); }
TEST(p2p_order_and_tags_tcp) { run(2, order_rank, "tcp"); }

/* ---- large messages both ways at once ------------------------------------------ */

static int exchange_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 30);
    if (!g) return 2;
    size_t count = (size_t)12 << 20 >> 2; /* 12 MiB: more than any ring or socket buffer */
    float *out = malloc(count * sizeof *out), *in = malloc(count * sizeof *in);
    CHECK(out && in);
    for (size_t i = 0; i < count; i++) out[i] = (float)(rank * 100000 + (int)(i % 50000));
    int peer = 1 - rank;
    mg_work *ws, *wr;
    CHECK_OK(mg_isend(g, out, count, MG_F32, peer, 1, &ws));
    CHECK_OK(mg_irecv(g, in, count, MG_F32, peer, 1, &wr));
    CHECK_OK(mg_work_wait(ws, -1));
    CHECK_OK(mg_work_wait(wr, -1));
    mg_work_free(ws);
    mg_work_free(wr);
    for (size_t i = 0; i < count; i += 1013)
        CHECK_EQ((int)in[i], peer * 100000 + (int)(i % 50000));
    /* The same with blocking calls: each rank sends first. */
    CHECK_OK(mg_send(g, out, count, MG_F32, peer, 2));
    CHECK_OK(mg_recv(g, in, count, MG_F32, peer, 2));
    CHECK_EQ((int)in[count - 1], peer * 100000 + (int)((count - 1) % 50000));
    free(out);
    free(in);
    mg_group_destroy(g);
    return 0;
}

TEST(p2p_exchange_large_shm) { run(2, exchange_rank, NULL); }
TEST(p2p_exchange_large_tcp) { run(2, exchange_rank, "tcp"); }

static int ring_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 30);
    if (!g) return 2;
    size_t count = (size_t)6 << 20 >> 2;
    int32_t *out = malloc(count * 4), *in = malloc(count * 4);
    CHECK(out && in);
    for (size_t i = 0; i < count; i++) out[i] = rank + (int32_t)i;
    /* Everyone sends before receiving: a cycle of blocked sends. */
    CHECK_OK(mg_send(g, out, count, MG_I32, (rank + 1) % n, 0));
    CHECK_OK(mg_recv(g, in, count, MG_I32, (rank + n - 1) % n, 0));
    CHECK_EQ(in[7], (rank + n - 1) % n + 7);
    free(out);
    free(in);
    mg_group_destroy(g);
    return 0;
}

TEST(p2p_ring_of_blocking_sends) { run(4, ring_rank, NULL); run(3, ring_rank, "tcp"); }

/* ---- oneself, interleaving with collectives -------------------------------------- */

static int mixed_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 30);
    if (!g) return 2;
    int64_t a = 41 + rank, b = 0;
    CHECK_OK(mg_send(g, &a, 1, MG_I64, rank, 3));
    CHECK_OK(mg_recv(g, &b, 1, MG_I64, rank, 3));
    CHECK_EQ(b, 41 + rank);
    CHECK_ERR(mg_recv(g, &b, 1, MG_I64, rank, 4), MG_EINVAL); /* nothing was sent */
    /* Rank 0 sends, then everyone all-reduces; the receive comes after. */
    if (rank == 0) {
        mg_work *w;
        double v[4] = {1, 2, 3, 4};
        for (int p = 1; p < n; p++) {
            CHECK_OK(mg_isend(g, v, 4, MG_F64, p, 5, &w));
            CHECK_OK(mg_work_wait(w, -1));
            mg_work_free(w);
        }
    }
    int32_t x = rank, s;
    CHECK_OK(mg_all_reduce(g, &x, &s, 1, MG_I32, MG_SUM));
    CHECK_EQ(s, n * (n - 1) / 2);
    if (rank > 0) {
        double v[4];
        CHECK_OK(mg_recv(g, v, 4, MG_F64, 0, 5));
        CHECK(v[3] == 4);
    }
    CHECK_OK(mg_barrier(g));
    mg_group_destroy(g);
    return 0;
}

TEST(p2p_self_and_collectives_shm) { run(3, mixed_rank, NULL); }
TEST(p2p_self_and_collectives_tcp) { run(3, mixed_rank, "tcp"); }

/* ---- mismatches -------------------------------------------------------------------- */

/* A receive that does not fit the send: 20 int32 for 10, or the same
 * bytes as float32 (taken as reinterpreted bits until a probe found it). */
static bool other_dtype;   /* set before the ranks fork */

static int mismatch_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 10);
    if (!g) return 2;
    int32_t buf[20] = {0};
    if (rank == 0) {
        CHECK_OK(mg_send(g, buf, 10, MG_I32, 1, 1));
        /* Rank 1 fails; its notice reaches us in the next operation. */
        double t0 = mg_now();
        CHECK_ERR(mg_barrier(g), MG_EPEER);
        CHECK_MSG(strstr(mg_last_error(), "rank 1"), "message: %s", mg_last_error());
        CHECK_MSG(mg_now() - t0 < 5, "took %.2f s: %s", mg_now() - t0, mg_last_error());
    } else {
        int32_t guard[24];
        for (int i = 0; i < 24; i++) guard[i] = -7;
        CHECK_ERR(mg_recv(g, guard + 2, other_dtype ? 10 : 20, other_dtype ? MG_F32 : MG_I32, 0,
                          1), MG_EMISMATCH);
        CHECK_MSG(strstr(mg_last_error(), other_dtype ? "dtypes differ" : "sizes differ"),
                  "message: %s", mg_last_error());
        for (int i = 0; i < 24; i++) CHECK_EQ(guard[i], -7); /* untouched */
        /* The group is now unusable, and says why. */
        CHECK_ERR(mg_barrier(g), MG_EMISMATCH);
        CHECK_MSG(strstr(mg_last_error(), "the group failed then and cannot be used any more"),
                  "message: %s", mg_last_error());
    }
    mg_group_destroy(g);
    return 0;
}

TEST(p2p_size_mismatch_shm) { run(2, mismatch_rank, NULL); }
TEST(p2p_size_mismatch_tcp) { run(2, mismatch_rank, "tcp"); }
TEST(p2p_dtype_mismatch)
{
    other_dtype = true;
    run(2, mismatch_rank, NULL);
    run(2, mismatch_rank, "tcp");
    other_dtype = false;
}

static int recv_vs_coll_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 10);
    if (!g) return 2;
    int32_t v = 1;
    double t0 = mg_now();
    if (rank == 0) {
        /* All-reduce while rank 1 waits for a message that never comes. */
        mg_status st = mg_all_reduce(g, MG_IN_PLACE, &v, 1, MG_I32, MG_SUM);
        CHECK(st == MG_EPEER || st == MG_EMISMATCH);
    } else {
        CHECK_ERR(mg_recv(g, &v, 1, MG_I32, 0, 9), MG_EMISMATCH);
        CHECK_MSG(strstr(mg_last_error(), "all_reduce"), "message: %s", mg_last_error());
    }
    CHECK_MSG(mg_now() - t0 < 5, "took %.2f s: %s", mg_now() - t0, mg_last_error());
    mg_group_destroy(g);
    return 0;
}

TEST(p2p_recv_while_peer_in_collective) { run(2, recv_vs_coll_rank, "tcp"); }

/* ---- batches: receives listed first never hold up sends ------------------------ */

/* Two ranks each post [receive from the other, send to the other] of
 * 12 MiB as one batch: the receive is listed first on both, which as two
 * separate requests would wait forever (requests run in issue order);
 * the batch starts its sends first. Then mg_sendrecv, and a ring of
 * stages where each rank receives three micro-batches (tags) from the
 * left in reverse order while sending three to the right. */
static int batch_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 30);
    if (!g) return 2;
    size_t count = (size_t)12 << 20 >> 2;
    float *out = malloc(count * sizeof *out), *in = malloc(count * sizeof *in);
    CHECK(out && in);
    for (size_t i = 0; i < count; i++) out[i] = (float)(rank * 100000 + (int)(i % 50000));
    int right = (rank + 1) % n, left = (rank + n - 1) % n;
    if (n == 2) {
        mg_p2p_op ops[2] = {{MG_COLL_RECV, in, count, MG_F32, right, 7},
                            {MG_COLL_SEND, out, count, MG_F32, right, 7}};
        mg_work *w;
        CHECK_OK(mg_batch_isend_irecv(g, ops, 2, &w));
        CHECK_OK(mg_work_wait(w, -1));
        mg_work_free(w);
        for (size_t i = 0; i < count; i += 1013)
            CHECK_EQ((int)in[i], right * 100000 + (int)(i % 50000));
        memset(in, 0, count * sizeof *in);
        CHECK_OK(mg_sendrecv(g, out, count, right, 8, in, count, left, 8, MG_F32));
        CHECK_EQ((int)in[count - 1], left * 100000 + (int)((count - 1) % 50000));
    }
    /* Pipeline stages: micro-batches 0..2 forward to the right, received
     * from the left, the receives listed first and in reverse order. */
    enum { MB = 3 };
    size_t c = count / 4;
    mg_p2p_op ops[2 * MB];
    for (int mb = 0; mb < MB; mb++) {
        ops[mb] = (mg_p2p_op){MG_COLL_RECV, in + (size_t)mb * c, c, MG_F32, left, 100 + MB - 1 - mb};
        for (size_t i = 0; i < 4; i++) out[(size_t)mb * c + i] = (float)(rank * 10 + mb);
        ops[MB + mb] = (mg_p2p_op){MG_COLL_SEND, out + (size_t)mb * c, c, MG_F32, right, 100 + mb};
    }
    mg_work *w;
    CHECK_OK(mg_batch_isend_irecv(g, ops, 2 * MB, &w));
    CHECK_OK(mg_work_wait(w, -1));
    mg_work_free(w);
    for (int mb = 0; mb < MB; mb++)   /* slot mb got tag 100 + MB-1-mb */
        CHECK_EQ((int)in[(size_t)mb * c], left * 10 + (MB - 1 - mb));
    /* Not a send or receive, a bad peer: refused, the group still works. */
    mg_p2p_op bad[1] = {{MG_COLL_ALL_REDUCE, in, 4, MG_F32, right, 0}};
    CHECK_EQ(mg_batch_isend_irecv(g, bad, 1, &w), MG_EINVAL);
    CHECK(w == NULL && strstr(mg_last_error(), "not a send or a receive"));
    bad[0] = (mg_p2p_op){MG_COLL_SEND, in, 4, MG_F32, n, 0};
    CHECK_EQ(mg_batch_isend_irecv(g, bad, 1, &w), MG_EINVAL);
    CHECK_OK(mg_batch_isend_irecv(g, NULL, 0, &w));   /* empty: done at once */
    CHECK_OK(mg_work_wait(w, -1));
    mg_work_free(w);
    CHECK_OK(mg_barrier(g));
    free(out);
    free(in);
    mg_group_destroy(g);
    return 0;
}

TEST(p2p_batch_receives_first_shm) { run(2, batch_rank, NULL); run(4, batch_rank, NULL); }
TEST(p2p_batch_receives_first_tcp) { run(2, batch_rank, "tcp"); run(3, batch_rank, "tcp"); }

/* ---- batches by NCCL's rules (MG_BATCH_RULES=nccl) ------------------------------ */

typedef struct {
    job j;
    const char *rules;   /* MG_BATCH_RULES */
    int cse;             /* 0 matched, 1 crossed, 2 deadlocked, 3 unconnected */
} rules_job;

/* One batch of the ops, waited for. */
static mg_status batch(mg_group *g, mg_p2p_op *ops, int n)
{
    mg_work *w;
    MG_TRY(mg_batch_isend_irecv(g, ops, n, &w));
    mg_status st = mg_work_wait(w, -1);
    mg_work_free(w);
    return st;
}

/* Two ranks, three exchanges that the host's rules (tags, sends that never
 * wait) run alike, but NCCL's do not:
 *   matched: each sends and receives in one batch, then rank 0 sends two
 *     batches of one send that rank 1 receives in one batch: fine;
 *   crossed: rank 0 sends tags 20 and 21, rank 1 receives 21 then 20
 *     (NCCL would swap the messages): rank 0 fails at once, naming both;
 *   deadlocked: each posts a batch of a lone send, then a batch of its
 *     receive (NCCL's sends wait for their receive): both wait until the
 *     group's deadline, and say why;
 *   unconnected (GPipe's first step over two stages): rank 0 sends in one
 *     batch, then sends again with its first receive from rank 1 in the
 *     next; rank 1 receives each in a batch, then sends. NCCL connects
 *     rank 1 to rank 0 at the first message that way, and rank 0's batch
 *     holding its end waits for rank 1's, which rank 1 posts only after
 *     the receive that batch would have sent: both wait, rank 0 says why. */
static int rules_rank(int rank, int n, void *arg)
{
    (void)n;
    const rules_job *rj = arg;
    setenv("MG_BATCH_RULES", rj->rules, 1);
    bool nccl = !strcmp(rj->rules, "nccl");
    mg_group *g = join_group(rank, 2, &rj->j, 3);
    if (!g) return 2;
    int peer = 1 - rank;
    float out[4] = {(float)rank, 1, 2, 3}, in[4] = {0}, in2[4] = {0};
    mg_status st = MG_OK;
    if (rj->cse == 0) {
        mg_p2p_op x[2] = {{MG_COLL_RECV, in, 4, MG_F32, peer, 1},
                          {MG_COLL_SEND, out, 4, MG_F32, peer, 1}};
        CHECK_OK(batch(g, x, 2));
        CHECK_EQ((int)in[0], peer);
        if (rank == 0) {
            for (int t = 10; t < 12; t++)
                CHECK_OK(batch(g, &(mg_p2p_op){MG_COLL_SEND, out, 4, MG_F32, 1, t}, 1));
        } else {
            mg_p2p_op r2[2] = {{MG_COLL_RECV, in, 4, MG_F32, 0, 10},
                               {MG_COLL_RECV, in2, 4, MG_F32, 0, 11}};
            CHECK_OK(batch(g, r2, 2));
        }
        CHECK_OK(mg_barrier(g));
    } else if (rj->cse == 1) {
        mg_p2p_op s2[2] = {{MG_COLL_SEND, out, 4, MG_F32, 1, 20},
                           {MG_COLL_SEND, out, 4, MG_F32, 1, 21}};
        mg_p2p_op r2[2] = {{MG_COLL_RECV, in, 4, MG_F32, 0, 21},
                           {MG_COLL_RECV, in2, 4, MG_F32, 0, 20}};
        st = batch(g, rank == 0 ? s2 : r2, 2);
        if (rank == 0 && nccl) {
            CHECK_EQ(st, MG_EINVAL);
            CHECK_MSG(strstr(mg_last_error(), "has tag 20, but the receive rank 1 posted for it "
                             "in that order has tag 21") &&
                      strstr(mg_last_error(), "would cross"), "%s", mg_last_error());
        } else if (!nccl) {
            CHECK_OK(st);
        }
    } else if (rj->cse == 3) {
        double t0 = mg_now();
        if (rank == 0) {
            st = batch(g, &(mg_p2p_op){MG_COLL_SEND, out, 4, MG_F32, 1, 40}, 1);
            mg_p2p_op sr[2] = {{MG_COLL_SEND, out, 4, MG_F32, 1, 41},
                               {MG_COLL_RECV, in, 4, MG_F32, 1, 42}};
            if (!st) st = batch(g, sr, 2);
        } else {
            st = batch(g, &(mg_p2p_op){MG_COLL_RECV, in, 4, MG_F32, 0, 40}, 1);
            /* Rank 0's wait reaches the deadline first: it says why. */
            usleep(500000);
            if (!st) st = batch(g, &(mg_p2p_op){MG_COLL_RECV, in2, 4, MG_F32, 0, 41}, 1);
            if (!st) st = batch(g, &(mg_p2p_op){MG_COLL_SEND, out, 4, MG_F32, 0, 42}, 1);
        }
        if (nccl) {
            CHECK_MSG(st == MG_ETIMEOUT || st == MG_EPEER, "%d: %s", st, mg_last_error());
            CHECK_MSG(strstr(mg_last_error(), "would deadlock"), "%s", mg_last_error());
            CHECK(mg_now() - t0 >= 2.9);
            if (rank == 0 && st == MG_ETIMEOUT)
                CHECK_MSG(strstr(mg_last_error(), "first receive from rank 1"), "%s",
                          mg_last_error());
        } else {
            CHECK_OK(st);
            CHECK_EQ((int)in[0], peer);
        }
    } else {
        double t0 = mg_now();
        st = batch(g, &(mg_p2p_op){MG_COLL_SEND, out, 4, MG_F32, peer, 30}, 1);
        if (!st) st = batch(g, &(mg_p2p_op){MG_COLL_RECV, in, 4, MG_F32, peer, 30}, 1);
        if (nccl) {
            /* One rank reaches the deadline; the other learns it from it. */
            CHECK_MSG(st == MG_ETIMEOUT || st == MG_EPEER, "%d: %s", st, mg_last_error());
            CHECK_MSG(strstr(mg_last_error(), "would deadlock"), "%s", mg_last_error());
            CHECK(mg_now() - t0 >= 2.9);
        } else {
            CHECK_OK(st);
            CHECK_EQ((int)in[0], peer);
        }
    }
    mg_group_destroy(g);
    return 0;
}

static void run_rules(const char *rules, int cse)
{
    rules_job rj = {new_job(NULL), rules, cse};
    CHECK_MSG(mgt_fork_ranks(2, rules_rank, &rj, 60, NULL) == 0, "MG_BATCH_RULES=%s, case %d",
              rules, cse);
}

TEST(p2p_batches_by_nccl_rules_catch_deadlocks_crossings_and_unconnected)
{
    for (int cse = 0; cse < 4; cse++) {
        run_rules("host", cse);
        run_rules("nccl", cse);
    }
}

/* ---- receives from any source ----------------------------------------------- */

/* Rank 0 takes whatever its peers send with a tag, from anyone or from a
 * set: every message once, each sender's in its order, the sender named;
 * a collective's frames from a rank already in the next operation wait
 * their turn; a message to itself counts; the async form too. */
static int any_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 30);
    if (!g) return 2;
    enum { R = 6 };
    int32_t msg[2];
    if (rank == 0) {
        int got[8] = {0}, src = -1;
        for (int i = 0; i < (n - 1) * R; i++) {
            CHECK_OK(mg_recv_any(g, msg, 2, MG_I32, NULL, 0, 7, &src));
            CHECK(src >= 1 && src < n && msg[0] == src);
            CHECK_MSG(msg[1] == got[src], "from %d: message %d where %d was next", src, msg[1],
                      got[src]);
            got[src]++;
        }
        for (int s = 1; s < n; s++) CHECK_EQ(got[s], R);
        /* A set, ranks 1 .. n-2: only its ranks' messages are taken (the
         * last rank's waits for the plain receive after). */
        int set[8], seen = 0;
        for (int i = 0; i < n - 2; i++) set[i] = i + 1;
        for (int i = 0; i < n - 2; i++) {
            CHECK_OK(mg_recv_any(g, msg, 2, MG_I32, set, n - 2, 8, &src));
            CHECK(src >= 1 && src <= n - 2);
            CHECK_EQ(msg[0], 100 + src);
            seen |= 1 << src;
        }
        CHECK_EQ(seen, (1 << (n - 1)) - 2);
        CHECK_OK(mg_recv(g, msg, 2, MG_I32, n - 1, 8));
        CHECK_EQ(msg[0], 100 + n - 1);
        /* The others are in the barrier now: their frames wait. */
        usleep(100000);
        int32_t self[2] = {42, 43};
        CHECK_OK(mg_send(g, self, 2, MG_I32, 0, 9));
        mg_work *w;
        CHECK_OK(mg_irecv_any(g, msg, 2, MG_I32, NULL, 0, 9, &src, &w));
        CHECK_OK(mg_work_wait(w, -1));
        mg_work_free(w);
        CHECK(src == 0 && msg[0] == 42 && msg[1] == 43);
        /* An empty set, a rank outside the group: refused at once. */
        CHECK_ERR(mg_recv_any(g, msg, 2, MG_I32, set, 0, 9, &src), MG_EINVAL);
        int far[1] = {n};
        CHECK_ERR(mg_recv_any(g, msg, 2, MG_I32, far, 1, 9, &src), MG_EINVAL);
        mg_p2p_op op = {MG_COLL_RECV, msg, 2, MG_I32, MG_ANY_SOURCE, 9};
        CHECK_ERR(mg_batch_isend_irecv(g, &op, 1, &w), MG_EINVAL);
    } else {
        for (int k = 0; k < R; k++) {
            msg[0] = rank;
            msg[1] = k;
            CHECK_OK(mg_send(g, msg, 2, MG_I32, 0, 7));
            if ((k + rank) % 3 == 0) usleep(2000 * (unsigned)rank);
        }
        msg[0] = 100 + rank;
        CHECK_OK(mg_send(g, msg, 2, MG_I32, 0, 8));
    }
    CHECK_OK(mg_barrier(g));
    mg_group_destroy(g);
    return 0;
}

TEST(p2p_recv_any_shm) { run(4, any_rank, NULL); }
TEST(p2p_recv_any_tcp) { run(3, any_rank, "tcp"); }

/* A peer of the set killed while rank 0 waits for any of them. With the
 * failures contained, the receive names it (MG_EPEER, *source) and the
 * group goes on with the others: a later receive from any of them works,
 * and a send to the dead one fails at once. Without, the group fails as
 * it always did. */
typedef struct {
    job j;
    bool contain;
} contain_job;

static int contain_rank(int rank, int n, void *arg)
{
    contain_job *cj = arg;
    mg_group *g = join_group(rank, n, &cj->j, 5);
    if (!g) return 2;
    if (rank == 0 && cj->contain) CHECK_OK(mg_group_contain_peer_failures(g));
    CHECK_OK(mg_barrier(g));
    int32_t v = 0;
    if (rank == 2) raise(SIGKILL);
    if (rank == 1) {
        mg_status st = mg_recv(g, &v, 1, MG_I32, 0, 1);   /* "go" */
        if (cj->contain) {
            CHECK_OK(st);
            v = 11;
            CHECK_OK(mg_send(g, &v, 1, MG_I32, 0, 2));
        } else {
            CHECK(st == MG_EPEER);   /* rank 0's group failed and told its peers */
        }
    } else {
        int set[2] = {1, 2}, src = -1;
        double t0 = mg_now();
        mg_status st = mg_recv_any(g, &v, 1, MG_I32, set, 2, 2, &src);
        CHECK_MSG(st == MG_EPEER && src == 2, "status %d, source %d: %s", st, src, mg_last_error());
        CHECK(strstr(mg_last_error(), "rank 2"));
        CHECK(mg_now() - t0 < 4);   /* found dead, not timed out */
        if (cj->contain) {
            CHECK_OK(mg_send(g, &v, 1, MG_I32, 1, 1));
            CHECK_OK(mg_recv_any(g, &v, 1, MG_I32, set, 1, 2, &src));
            CHECK(src == 1 && v == 11);
            t0 = mg_now();
            CHECK_ERR(mg_send(g, &v, 1, MG_I32, 2, 3), MG_EPEER);
            CHECK(mg_now() - t0 < 0.5);
        } else {
            CHECK_ERR(mg_send(g, &v, 1, MG_I32, 1, 1), MG_EPEER);   /* the group failed */
        }
    }
    mg_group_destroy(g);
    return 0;
}

static void expect_contained(const char *transport, bool contain)
{
    contain_job cj = {new_job(transport), contain};
    int st[3];
    mgt_fork_ranks(3, contain_rank, &cj, 40, st);
    for (int r = 0; r < 2; r++)
        CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d status %d (%s, contain %d)",
                  r, st[r], transport ? transport : "shm", contain);
    CHECK(WIFSIGNALED(st[2]) && WTERMSIG(st[2]) == SIGKILL);
}

TEST_T(p2p_recv_any_contains_a_dead_peer, 120)
{
    expect_contained(NULL, true);
    expect_contained("tcp", true);
    expect_contained(NULL, false);
}

/* A peer that a group containing failures took as lost, and that comes
 * back: rank 1 is stopped (SIGSTOP from a child of its own, SIGCONT 3 s
 * later) while rank 0 waits for it; past MG_PEER_TIMEOUT (1 s) rank 0's
 * receive fails, contained, and a send to rank 1 fails at once. Rank 1,
 * resumed, waits for rank 0: its receive fails within a second with
 * MG_ELEFT naming rank 0 (before: shared memory waited for the group's
 * 30 s deadline, TCP read the closed link as rank 0's death); over TCP
 * it also gives rank 0's reason. */
static int left_rank(int rank, int n, void *arg)
{
    const job *j = arg;
    setenv("MG_PEER_TIMEOUT", "1", 1);
    mg_group *g = join_group(rank, n, j, 30);
    if (!g) return 2;
    CHECK_OK(mg_group_contain_peer_failures(g));
    CHECK_OK(mg_barrier(g));
    int32_t v = rank;
    double t0 = mg_now();
    if (rank == 0) {
        mg_status st = mg_recv(g, &v, 1, MG_I32, 1, 1);
        CHECK_MSG((st == MG_EPEER || st == MG_ETIMEOUT) && strstr(mg_last_error(), "stopped"),
                  "status %d: %s", st, mg_last_error());
        CHECK_ERR(mg_send(g, &v, 1, MG_I32, 1, 2), MG_EPEER);
        usleep(6 * 1000 * 1000);   /* rank 1 asks the store while rank 0 serves it */
    } else {
        pid_t me = getpid();
        if (fork() == 0) {
            kill(me, SIGSTOP);
            usleep(3 * 1000 * 1000);
            kill(me, SIGCONT);
            _exit(0);
        }
        CHECK_ERR(mg_recv(g, &v, 1, MG_I32, 0, 3), MG_ELEFT);
        const char *e = mg_last_error();
        CHECK_MSG(strstr(e, "rank 0 took this rank as lost") &&
                  (!j->transport || strstr(e, "it found: rank 1")), "%s", e);
        double dt = mg_now() - t0;
        printf("%s: rank 1 learned it %.2f s after the barrier (stopped for 3 s)\n",
               j->transport ? j->transport : "shm", dt);
        CHECK_MSG(dt > 2.5 && dt < 5, "%.1f s: %s", dt, e);
        wait(NULL);
    }
    mg_group_destroy(g);
    return 0;
}

/* fn on n ranks, over shared memory then TCP: every rank exits 0 but
 * `killed` (-1: none), which SIGKILL ends. */
static void on_both_transports(int n, int (*fn)(int, int, void *), int killed)
{
    const char *transports[2] = {NULL, "tcp"};
    for (int t = 0; t < 2; t++) {
        job j = new_job(transports[t]);
        int st[8];
        MG_ASSERT(n <= 8);
        mgt_fork_ranks(n, fn, &j, 40, st);
        for (int r = 0; r < n; r++)
            CHECK_MSG(r == killed ? WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL
                                  : WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0,
                      "%s: rank %d status %d", transports[t] ? transports[t] : "shm", r, st[r]);
    }
}

TEST_T(p2p_a_peer_taken_as_lost_learns_it_when_it_comes_back, 120)
{
    on_both_transports(2, left_rank, -1);
}

/* In a group that contains peer failures, a peer that dies while this
 * rank waits for another is that peer's failure alone: rank 2 sends rank
 * 1 a message it never reads, so rank 1's death 0.3 s later resets their
 * TCP link (shared memory: its process is gone) while rank 2 waits for
 * rank 0, which sends a second later. Rank 2's receive from rank 0 completes
 * (before: it failed naming rank 1, and the group dropped rank 0 as if it
 * had failed). */
static int bystander_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 5);   /* rank 0 serves the store: waits 5 s at the end */
    if (!g) return 2;
    CHECK_OK(mg_group_contain_peer_failures(g));
    int32_t v = rank;
    CHECK_OK(mg_barrier(g));
    if (rank == 2) CHECK_OK(mg_send(g, &v, 1, MG_I32, 1, 7));   /* never read */
    if (rank == 1) {
        usleep(300 * 1000);
        raise(SIGKILL);
    }
    if (rank == 0) {
        usleep(1000 * 1000);
        CHECK_OK(mg_send(g, &v, 1, MG_I32, 2, 8));
    } else {
        v = -1;
        CHECK_OK(mg_recv(g, &v, 1, MG_I32, 0, 8));
        CHECK(v == 0);
    }
    mg_group_destroy(g);
    return 0;
}

TEST_T(p2p_a_bystanders_death_is_its_own_where_failures_are_contained, 120)
{
    on_both_transports(3, bystander_rank, 1);
}

/* ULFM's revoke: of 3 ranks, rank 1 gives the group up instead of
 * joining the next all-reduce (mg_group_revoke): ranks 0 and 2, waiting
 * in it, fail at once (not at the group's 30 s deadline), naming rank 1
 * and its reason; rank 1's own next operation fails too, and every rank
 * still destroys the group. */
static int revoke_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 30);
    if (!g) return 2;
    CHECK_OK(mg_barrier(g));
    int32_t v = rank, sum = -1;
    double t0 = mg_now();
    if (rank == 1) {
        usleep(200 * 1000);   /* the others wait in the all-reduce */
        mg_group_revoke(g, "giving up for a test");
    }
    CHECK_ERR(mg_all_reduce(g, &v, &sum, 1, MG_I32, MG_SUM), MG_EPEER);
    const char *e = mg_last_error();
    if (rank != 1)
        CHECK_MSG(strstr(e, "rank 1 failed and aborted the group: giving up for a test"), "%s", e);
    else
        CHECK_MSG(strstr(e, "giving up for a test"), "%s", e);
    CHECK_MSG(mg_now() - t0 < 10, "rank %d: %.1f s", rank, mg_now() - t0);
    mg_group_destroy(g);
    return 0;
}

TEST_T(group_revoke_ends_the_peers_operations, 120)
{
    on_both_transports(3, revoke_rank, -1);
}

/* Over TCP, a rank whose operation fails mid-frame cannot put its abort
 * notice on that link (the stream is inside a frame): it closes the link
 * and leaves the notice in the job's store. Rank 1's send of 64 MB (past
 * any socket buffer) times out at the group's 2 s deadline while rank 0
 * is not reading; rank 0, receiving later, reads the frame's start, then
 * the closed link, and names rank 1 and its reason from the store, at
 * once, instead of a bare closed connection. */
static int midframe_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 2);
    if (!g) return 2;
    size_t count = (size_t)16 << 20;
    float *buf = calloc(count, sizeof *buf);
    CHECK(buf != NULL);
    CHECK_OK(mg_barrier(g));
    if (rank == 1) {
        CHECK_ERR(mg_send(g, buf, count, MG_F32, 0, 5), MG_ETIMEOUT);
    } else {
        usleep(3500 * 1000);   /* past rank 1's deadline */
        double t0 = mg_now();
        CHECK_ERR(mg_recv(g, buf, count, MG_F32, 1, 5), MG_EPEER);
        const char *e = mg_last_error();
        CHECK_MSG(strstr(e, "rank 1 failed and aborted the group: ") && strstr(e, "send"),
                  "%s", e);
        CHECK_MSG(mg_now() - t0 < 1.5, "%.1f s: %s", mg_now() - t0, e);
    }
    free(buf);
    mg_group_destroy(g);
    return 0;
}

TEST_T(p2p_a_peer_that_fails_mid_frame_leaves_its_reason_in_the_store, 60)
{
    run(2, midframe_rank, "tcp");
}

/* ULFM's shrink: of 4 ranks, rank 2 is killed; the other three make the
 * group without it (mg_group_exclude; rank 2 takes no part) and run a
 * collective there, which names its ranks as the job does; leaving
 * oneself out, or a rank the group has not, is refused. */
static int exclude_rank(int rank, int n, void *arg)
{
    mg_group *g = join_group(rank, n, arg, 5);
    if (!g) return 2;
    CHECK_OK(mg_group_contain_peer_failures(g));
    CHECK_OK(mg_barrier(g));
    if (rank == 2) raise(SIGKILL);
    int gone = 2, bad[2] = {rank, 4};
    mg_group *h = NULL, *x = NULL;
    CHECK_ERR(mg_group_exclude(g, &bad[0], 1, &x), MG_EINVAL);
    CHECK_ERR(mg_group_exclude(g, &bad[1], 1, &x), MG_EINVAL);
    CHECK_OK(mg_group_exclude(g, &gone, 1, &h));
    CHECK(h && mg_group_size(h) == 3 && mg_group_rank(h) == (rank < 2 ? rank : 2));
    CHECK(h && mg_group_world_rank(h, 2) == 3);
    int32_t v = rank, sum = -1;
    if (h) CHECK_OK(mg_all_reduce(h, &v, &sum, 1, MG_I32, MG_SUM));
    CHECK(sum == 0 + 1 + 3);
    mg_group_destroy(h);
    mg_group_destroy(g);
    return 0;
}

TEST_T(group_exclude_goes_on_without_a_dead_rank, 120)
{
    const char *transports[2] = {NULL, "tcp"};
    for (int t = 0; t < 2; t++) {
        job j = new_job(transports[t]);
        int st[4];
        double t0 = mg_now();
        mgt_fork_ranks(4, exclude_rank, &j, 40, st);
        for (int r = 0; r < 4; r++)
            if (r != 2)
                CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "%s: rank %d status %d",
                          transports[t] ? transports[t] : "shm", r, st[r]);
        CHECK(WIFSIGNALED(st[2]) && WTERMSIG(st[2]) == SIGKILL);
        /* (rank 0, serving the store here, waits its 5 s for the dead one to leave) */
        CHECK_MSG(mg_now() - t0 < 20, "%.1f s", mg_now() - t0);
    }
}
