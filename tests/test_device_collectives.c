/* Collectives on device memory (issue 15, issue 36): staged through the
 * host, or through NCCL between GPUs (mg_group_use_device), what keeps a
 * group on the host path and says why, and a dead or stopped peer amid an
 * NCCL call. Without a GPU the GPU's part skips, saying why; emu's
 * always runs. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"
#include "devices.h"
#include "multigrad/multigrad.h"
#include "comm/nccl.h"

/* ---- collectives on device memory (staged through the host) ------------- */

enum { CN = 1000 };   /* floats per rank's piece */

static float cval(int rank, size_t i) { return (float)(rank * 7 + (int)(i % 97)); }

typedef struct {
    mg_device d;
    int port;
    bool nccl;   /* each rank a host of its own to NCCL (NCCL_HOSTID), MG_NCCL=on */
} coll_case;

/* Device memory holding f(rank, i) for i < n. */
static float *dev_fill(mg_device d, int rank, size_t n)
{
    float *h = malloc(n * sizeof(float));
    CHECK(h);
    for (size_t i = 0; i < n; i++) h[i] = cval(rank, i);
    float *p = mgt_on_device(d, h, n);
    free(h);
    return p;
}

/* The CN floats of device memory at p are the sums over W ranks of
 * cval(q, at + i). */
static void check_sums(mg_device d, const float *p, int W, size_t at)
{
    float *h = mgt_device_floats(d, p, CN);
    for (size_t i = 0; i < CN; i++) {
        float want = 0;
        for (int q = 0; q < W; q++) want += cval(q, at + i);
        CHECK(h[i] == want);
    }
    free(h);
}

/* Device memory at p holds every rank's CN values in rank order. */
static void check_gathered(mg_device d, const float *p, int W)
{
    float *h = mgt_device_floats(d, p, (size_t)CN * W);
    for (int q = 0; q < W; q++)
        for (size_t i = 0; i < CN; i++) CHECK(h[(size_t)q * CN + i] == cval(q, i));
    free(h);
}

static int coll_rank(int r, int W, void *arg)
{
    const coll_case *c = arg;
    mg_device d = c->d;
    if (c->nccl) mgt_nccl_host_of_its_own(r);
    mg_group *g = mgt_join(r, W, c->port, NULL, 60);
    CHECK(g);
    const char *why, *path;
    CHECK_OK(mg_group_use_device(g, d));
    path = mg_group_device_path(g, &why);
    CHECK_MSG(!strcmp(path, c->nccl ? "nccl" : "host"), "rank %d: path %s: %s", r, path, why);
    size_t all = (size_t)CN * W;
    /* all-reduce in place, and from device to host memory */
    float *x = dev_fill(d, r, CN), host[CN];
    CHECK(mg_device_of(host).kind == MG_DEVICE_CPU);
    CHECK(mg_device_of(x + 5).kind == d.kind);
    CHECK_OK(mg_all_reduce(g, x, x, CN, MG_F32, MG_SUM));
    check_sums(d, x, W, 0);
    mg_device_free(d, x);
    x = dev_fill(d, r, CN);
    CHECK_OK(mg_all_reduce(g, x, host, CN, MG_F32, MG_MAX));
    for (size_t i = 0; i < CN; i++) CHECK(host[i] == cval(W - 1, i));
    mg_device_free(d, x);
    /* all-gather of the rank's piece inside the whole, as ZeRO's */
    float *w = mg_device_alloc(d, all * sizeof(float)), *piece = dev_fill(d, r, CN);
    CHECK_OK(mg_device_copy(d, w + (size_t)r * CN, d, piece, CN * sizeof(float)));
    CHECK_OK(mg_all_gather(g, w + (size_t)r * CN, w, CN, MG_F32));
    check_gathered(d, w, W);
    mg_device_free(d, w);
    mg_device_free(d, piece);
    /* reduce-scatter into the rank's piece of the whole, async: complete
     * (mg_work_test) means the result is in device memory */
    w = dev_fill(d, r, all);
    mg_work *wk;
    CHECK_OK(mg_reduce_scatter_async(g, w, w + (size_t)r * CN, CN, MG_F32, MG_SUM, &wk));
    while (!mg_work_test(wk)) usleep(100);
    check_sums(d, w + (size_t)r * CN, W, (size_t)r * CN);
    CHECK_OK(mg_work_wait(wk, -1));
    mg_work_free(wk);
    mg_device_free(d, w);
    /* broadcast and reduce with roots; gather and scatter */
    x = dev_fill(d, r, CN);
    CHECK_OK(mg_broadcast(g, x, CN, MG_F32, 1 % W));
    float *h = mgt_device_floats(d, x, CN);
    for (size_t i = 0; i < CN; i++) CHECK(h[i] == cval(1 % W, i));
    free(h);
    mg_device_free(d, x);
    x = dev_fill(d, r, CN);
    float *y = mg_device_alloc(d, all * sizeof(float));
    CHECK_OK(mg_reduce(g, x, y, CN, MG_F32, MG_SUM, W - 1));
    CHECK_OK(mg_gather(g, x, r == 0 ? y : NULL, CN, MG_F32, 0));
    if (r == W - 1 && r != 0) check_sums(d, y, W, 0);
    if (r == 0) check_gathered(d, y, W);
    mg_device_free(d, x);
    mg_device_free(d, y);
    w = dev_fill(d, r, all);
    x = mg_device_alloc(d, CN * sizeof(float));
    CHECK_OK(mg_scatter(g, w, x, CN, MG_F32, 0));
    h = mgt_device_floats(d, x, CN);
    for (size_t i = 0; i < CN; i++) CHECK(h[i] == cval(0, (size_t)r * CN + i));
    free(h);
    /* all-to-all, and a ring of sends and receives from device memory */
    y = mg_device_alloc(d, all * sizeof(float));
    CHECK_OK(mg_all_to_all(g, w, y, CN, MG_F32));
    h = mgt_device_floats(d, y, all);
    for (int q = 0; q < W; q++)
        for (size_t i = 0; i < CN; i++)
            CHECK(h[(size_t)q * CN + i] == cval(q, (size_t)r * CN + i));
    free(h);
    CHECK_OK(mg_sendrecv(g, w, CN, (r + 1) % W, 5, x, CN, (r + W - 1) % W, 5, MG_F32));
    h = mgt_device_floats(d, x, CN);
    for (size_t i = 0; i < CN; i++) CHECK(h[i] == cval((r + W - 1) % W, i));
    free(h);
    /* a batch both ways round the ring, as pipeline stages exchange
     * (with NCCL one group: each pair's messages posted in one order on
     * both sides), and one receiving into host memory (staged whole) */
    int next = (r + 1) % W, prev = (r + W - 1) % W;
    float *from_prev = mg_device_alloc(d, CN * sizeof(float));
    float *from_next = mg_device_alloc(d, CN / 2 * sizeof(float)), host_half[CN / 2];
    for (int staged = 0; staged < 2; staged++) {
        mg_p2p_op ops[] = {
            {MG_COLL_SEND, w, CN, MG_F32, next, 1},
            {MG_COLL_SEND, w + CN, CN / 2, MG_F32, prev, 2},
            {MG_COLL_RECV, from_prev, CN, MG_F32, prev, 1},
            {MG_COLL_RECV, staged ? (void *)host_half : from_next, CN / 2, MG_F32, next, 2},
        };
        mg_work *bw;
        CHECK_OK(mg_batch_isend_irecv(g, ops, 4, &bw));
        CHECK_OK(mg_work_wait(bw, -1));
        mg_work_free(bw);
        h = mgt_device_floats(d, from_prev, CN);
        for (size_t i = 0; i < CN; i++) CHECK(h[i] == cval(prev, i));
        free(h);
        h = staged ? host_half : mgt_device_floats(d, from_next, CN / 2);
        for (size_t i = 0; i < CN / 2; i++) CHECK(h[i] == cval(next, CN + i));
        if (!staged) free(h);
    }
    mg_device_free(d, from_prev);
    mg_device_free(d, from_next);
    mg_device_free(d, w);
    mg_device_free(d, x);
    mg_device_free(d, y);
    if (d.kind == MG_DEVICE_EMU) CHECK(mg_device_of(x).kind == MG_DEVICE_CPU);   /* freed */
    /* the other in-place forms: all-gather with sendbuf == recvbuf (the
     * rank's block already in place), reduce-scatter with the result at
     * the start of its input; and the average, divided as the host
     * divides (sum / W, rounded once) */
    w = mg_device_alloc(d, all * sizeof(float));
    piece = dev_fill(d, r, CN);
    CHECK_OK(mg_device_copy(d, w + (size_t)r * CN, d, piece, CN * sizeof(float)));
    CHECK_OK(mg_all_gather(g, w, w, CN, MG_F32));
    check_gathered(d, w, W);
    mg_device_free(d, w);
    mg_device_free(d, piece);
    w = dev_fill(d, r, all);
    CHECK_OK(mg_reduce_scatter(g, w, w, CN, MG_F32, MG_SUM));
    check_sums(d, w, W, (size_t)r * CN);
    mg_device_free(d, w);
    x = dev_fill(d, r, CN);
    CHECK_OK(mg_all_reduce(g, x, x, CN, MG_F32, MG_AVG));
    h = mgt_device_floats(d, x, CN);
    for (size_t i = 0; i < CN; i++) {
        float sum = 0;
        for (int q = 0; q < W; q++) sum += cval(q, i);
        CHECK(h[i] == sum / (float)W);
    }
    free(h);
    mg_device_free(d, x);
    /* ZeRO-3's all-gather into sparse memory whose granules were given
     * back, and a reduce-scatter reading such memory (as zeros) */
    size_t big = (size_t)W << 20;   /* floats: 4 MiB a rank, granules of 2 MiB */
    float *sp = mg_device_alloc_sparse(d, big * sizeof(float)), *mine = dev_fill(d, r, big / W);
    CHECK(sp);
    mg_device_discard(d, sp, big * sizeof(float));
    CHECK_OK(mg_all_gather(g, mine, sp, big / W, MG_F32));
    h = mgt_device_floats(d, sp, big);
    for (int q = 0; q < W; q++)
        for (size_t i = 0; i < big / W; i++) CHECK(h[(size_t)q * (big / W) + i] == cval(q, i));
    free(h);
    mg_device_discard(d, sp, big * sizeof(float));
    CHECK_OK(mg_reduce_scatter(g, sp, mine, big / W, MG_F32, MG_SUM));
    h = mgt_device_floats(d, mine, big / W);
    for (size_t i = 0; i < big / W; i++) CHECK(h[i] == 0);
    free(h);
    mg_device_free(d, sp);
    mg_device_free(d, mine);
    /* a sub-group chooses its path for the same device */
    mg_group *sub;
    CHECK_OK(mg_group_split(g, r % 2, r, &sub));
    CHECK(sub);
    path = mg_group_device_path(sub, &why);
    /* (a sub-group of one rank on a GPU has it to itself: NCCL may take it) */
    if (mg_group_size(sub) > 1)
        CHECK_MSG(!strcmp(path, c->nccl ? "nccl" : "host"), "rank %d sub-group: %s: %s", r, path,
                  why);
    x = dev_fill(d, r, CN);
    CHECK_OK(mg_all_reduce(g, x, x, CN, MG_F32, MG_SUM));
    CHECK_OK(mg_all_reduce(sub, x, x, CN, MG_F32, MG_MAX));
    check_sums(d, x, W, 0);
    mg_device_free(d, x);
    mg_group_destroy(sub);
    mg_group_destroy(g);
    return 0;
}

/* Every collective, in place and not, blocking and async, and sends and
 * receives, on device memory: the group stages it through host memory
 * (comm/stage.c), or with `nccl` runs it through NCCL (comm/nccl.c), and
 * the results are exact. */
static void collectives_on_device(mg_device d, bool nccl)
{
    for (int W = 2; W <= 3; W++) {
        coll_case c = {.d = d, .port = mgt_free_port(), .nccl = nccl};
        int st[4];
        CHECK_EQ(mgt_fork_ranks(W, coll_rank, &c, 60, st), 0);
    }
}

TEST_T(device_emu_collectives_stage_through_the_host, 120)
{
    collectives_on_device(mgt_device(MG_DEVICE_EMU), false);
}
TEST_T(device_gpu_collectives_stage_through_the_host, 120)
{
    collectives_on_device(mgt_device(MG_DEVICE_CUDA), false);
}
TEST_T(device_gpu_collectives_through_nccl, 180)
{
    mg_device d = mgt_nccl_gpu();
    collectives_on_device(d, true);
}

/* A rank lost with NCCL's communicator set up: the survivor's next
 * collective through NCCL fails, naming the call, and the group can be
 * destroyed (the communicator aborted).
 * - A rank that exits: within the group's deadline (NCCL's own error).
 * - A rank that stops (SIGSTOP): NCCL alone would wait for it until
 *   MG_TIMEOUT (60 s here); the host path's watch names it, stopped,
 *   within MG_PEER_TIMEOUT (3 s) and 2 s. Rank 0 then ends it. */
typedef struct {
    int port;
    bool stop;
} lost_peer;

static int nccl_lost_peer_rank(int r, int W, void *arg)
{
    const lost_peer *lp = arg;
    mgt_nccl_host_of_its_own(r);
    if (lp->stop) setenv("MG_PEER_TIMEOUT", "3", 1);
    mg_device d = {MG_DEVICE_CUDA, 0};
    mg_group *g = mgt_join(r, W, lp->port, NULL, lp->stop ? 60 : 8);
    CHECK(g);
    int pid[2] = {getpid(), getpid()};
    CHECK_OK(mg_all_gather(g, &pid[r], pid, 1, MG_I32));
    CHECK_OK(mg_group_use_device(g, d));
    float *x = dev_fill(d, r, CN);
    CHECK_OK(mg_all_reduce(g, x, x, CN, MG_F32, MG_SUM));
    if (r == 1 && lp->stop) raise(SIGSTOP);
    if (r == 1) _exit(0);
    double t0 = mg_now();
    mg_status st = mg_all_reduce(g, x, x, CN, MG_F32, MG_SUM);
    double took = mg_now() - t0;
    if (lp->stop) kill(pid[1], SIGKILL);
    printf("rank 0 after %.1f s: %s\n", took, mg_last_error());
    CHECK(st != MG_OK);
    CHECK_MSG(took < (lp->stop ? 3 + 2 : 30), "the lost rank was found after %.1f s", took);
    CHECK_MSG(strstr(mg_last_error(), "all_reduce #") && strstr(mg_last_error(), "through NCCL"),
              "%s", mg_last_error());
    bool named = strstr(mg_last_error(), "rank 1") && strstr(mg_last_error(), "stopped");
    CHECK_MSG(!lp->stop || named, "%s", mg_last_error());
    CHECK(mg_all_reduce(g, x, x, CN, MG_F32, MG_SUM) != MG_OK);   /* the group failed */
    mg_group_destroy(g);
    mg_device_free(d, x);
    return 0;
}

TEST_T(device_gpu_nccl_survives_a_dead_peer_with_an_error, 90)
{
    mgt_nccl_gpu();
    lost_peer lp = {mgt_free_port(), false};
    int st[2];
    CHECK_EQ(mgt_fork_ranks(2, nccl_lost_peer_rank, &lp, 80, st), 0);
}

TEST_T(device_gpu_nccl_names_a_stopped_peer_within_the_peer_timeout, 90)
{
    mgt_nccl_gpu();
    lost_peer lp = {mgt_free_port(), true};
    int st[2];
    CHECK_EQ(mgt_fork_ranks(2, nccl_lost_peer_rank, &lp, 80, st), 1);
    CHECK(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0);
    CHECK(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
}

/* ---- the path of collectives on device memory (mg_group_use_device) ------ */

TEST(device_nccl_plan_says_what_stops_it)
{
    mg__nccl_peer p[3];
    char why[256];
    for (int i = 0; i < 3; i++) {
        p[i] = (mg__nccl_peer){.host = 7, .loaded = 1, .version = 22809};
        snprintf(p[i].bus, sizeof p[i].bus, "0000:%02d:00.0", 10 + i);
    }
    CHECK(mg__nccl_plan(p, 3, NULL, why, sizeof why));
    p[2].host = 8;   /* the same bus id on another host is another GPU */
    strcpy(p[2].bus, p[0].bus);
    CHECK(mg__nccl_plan(p, 3, NULL, why, sizeof why));
    p[2].host = 7;
    CHECK(!mg__nccl_plan(p, 3, NULL, why, sizeof why));
    CHECK_MSG(strstr(why, "rank 0 and rank 2 share one GPU (0000:10:00.0)"), "%s", why);
    strcpy(p[2].bus, "0000:12:00.0");
    p[1].version = 22703;
    CHECK(!mg__nccl_plan(p, 3, NULL, why, sizeof why));
    CHECK_MSG(strstr(why, "rank 1 has NCCL 22703 and rank 0 NCCL 22809"), "%s", why);
    p[1].loaded = 0;
    CHECK(!mg__nccl_plan(p, 3, NULL, why, sizeof why));
    CHECK_MSG(strstr(why, "rank 1 cannot load NCCL (libnccl.so.2"), "%s", why);
    memset(p[2].bus, 'A', sizeof p[2].bus);   /* a peer's garbage: no end */
    p[1].loaded = 1;
    p[1].version = 22809;
    CHECK(!mg__nccl_plan(p, 3, NULL, why, sizeof why));
    CHECK_MSG(strstr(why, "rank 2 described itself in a form this build does not know"), "%s",
              why);
    p[0].bus[0] = 0;
    CHECK(!mg__nccl_plan(p, 3, NULL, why, sizeof why));
    CHECK_MSG(strstr(why, "rank 0's device is not a GPU"), "%s", why);
    CHECK(mg__nccl_plan(p, 0, NULL, why, sizeof why));
}

static int host_path_rank(int r, int W, void *arg)
{
    mg_group *g = mgt_join(r, W, *(int *)arg, NULL, 60);
    CHECK(g);
    const char *why;
    CHECK(!strcmp(mg_group_device_path(g, &why), "host") && strstr(why, "no device named"));
    mg_device emu = {MG_DEVICE_EMU, 0};
    setenv("MG_NCCL", "on", 1);   /* every rank refuses, and the group goes on */
    CHECK(mg_group_use_device(g, emu) == MG_EUNSUPPORTED);
    CHECK_MSG(strstr(mg_last_error(), "MG_NCCL=on, but the group cannot use NCCL: rank 0's "
                     "device is not a GPU"), "%s", mg_last_error());
    unsetenv("MG_NCCL");
    CHECK_OK(mg_group_use_device(g, emu));
    CHECK(!strcmp(mg_group_device_path(g, &why), "host"));
    CHECK_MSG(strstr(why, "rank 0's device is not a GPU"), "%s", why);
    float *x = dev_fill(emu, r, CN);
    CHECK_OK(mg_all_reduce(g, x, x, CN, MG_F32, MG_SUM));
    check_sums(emu, x, W, 0);
    mg_device_free(emu, x);
    mg_group_destroy(g);
    return 0;
}

/* Ranks whose devices are no GPUs keep the host path and say why; with
 * MG_NCCL=on every rank refuses. */
TEST_T(device_emu_group_keeps_the_host_path_and_says_why, 60)
{
    int port = mgt_free_port(), st[2];
    CHECK_EQ(mgt_fork_ranks(2, host_path_rank, &port, 60, st), 0);
}
