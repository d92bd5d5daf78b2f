/* Pipeline schedules as pure functions, without processes: the lists
 * the generators give (golden text), and every schedule over a sweep of
 * stage, micro-batch and chunk counts run by the lock-step simulator: no
 * deadlock, every send received once, every backward after its forward,
 * the bubble the anchors state and the micro-batches held in flight. */
#include "harness.h"
#include "multigrad/pipeline.h"

#define CHECK_STR_EQ(a, b) CHECK_MSG(!strcmp((a), (b)), "got  \"%s\"\nwant \"%s\"", (a), (b))

static void compute_str(mg_pipe_kind k, int P, int M, int V, int rank, char *buf, size_t cap)
{
    mg_pipe_action a[256];
    int n = mg_pipe_compute(k, P, M, V, rank, a, 256);
    CHECK(n <= 256);
    mg_pipe_list_str(a, n, buf, cap);
}

TEST(pipe_schedules_golden_lists)
{
    static const struct {
        mg_pipe_kind k;
        int P, M, V, rank;
        const char *want;
    } c[] = {
        {MG_PIPE_NAIVE, 2, 2, 1, 1, "1F0 1B0 1F1 1B1"},
        {MG_PIPE_GPIPE, 2, 3, 1, 0, "0F0 0F1 0F2 0B0 0B1 0B2"},
        /* 1F1B, 4 stages, 6 micro-batches: 3 warm-up forwards on the
         * first stage, none on the last; fewer micro-batches than
         * warm-up slots. */
        {MG_PIPE_1F1B, 4, 6, 1, 0, "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5"},
        {MG_PIPE_1F1B, 4, 6, 1, 3, "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5"},
        {MG_PIPE_1F1B, 4, 2, 1, 0, "0F0 0F1 0B0 0B1"},
        /* Megatron-LM's interleaving, 2 ranks, 2 chunks (stages 0 and 2
         * on rank 0), 4 micro-batches in rounds of 2. */
        {MG_PIPE_INTERLEAVED, 2, 4, 2, 0,
         "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3"},
        {MG_PIPE_INTERLEAVED, 2, 4, 2, 1,
         "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"},
    };
    char s[2048];
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        compute_str(c[i].k, c[i].P, c[i].M, c[i].V, c[i].rank, s, sizeof s);
        CHECK_STR_EQ(s, c[i].want);
    }
    /* Lowered: receives before, sends after. */
    mg_pipe_action a[64];
    int n = mg_pipe_lower(MG_PIPE_GPIPE, 2, 2, 1, 1, a, 64);
    mg_pipe_list_str(a, n, s, sizeof s);
    CHECK_STR_EQ(s, "1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1");
}

/* Every schedule, P up to 6, M up to 12 (interleaved: M >= P, V 2 and
 * 3): the simulator finishes (no deadlock under any interleaving, every
 * message matched) and measures the anchors' bubble exactly, with a
 * backward twice a forward. Memory: the micro-batches a rank holds, from
 * the receive of the input to the backward, are the anchors' too; where
 * interleaved's groups are longer than P (M not a multiple of P), rank 0
 * also holds what it receives early from the last rank, at most one per
 * micro-batch the longest group has over P. */
TEST(pipe_schedules_sweep_no_deadlock_bubble_and_memory)
{
    int runs = 0;
    for (int k = MG_PIPE_NAIVE; k <= MG_PIPE_INTERLEAVED; k++)
        for (int P = 1; P <= 6; P++)
            for (int M = 1; M <= 12; M++)
                for (int V = 1; V <= (k == MG_PIPE_INTERLEAVED ? 3 : 1); V++) {
                    if (k == MG_PIPE_INTERLEAVED && (V < 2 || M < P)) continue;
                    mg_pipe_sim sim;
                    mg_status st = mg_pipe_simulate((mg_pipe_kind)k, P, M, V, 1.0, 2.0, &sim);
                    CHECK_MSG(st == MG_OK, "%s P %d M %d V %d: %s", mg_pipe_name(k), P, M, V,
                              mg_last_error());
                    if (st) continue;
                    runs++;
                    /* The bubble of the anchors. */
                    double want = k == MG_PIPE_NAIVE ? (double)(P - 1) / P
                                  : (double)(P - 1) / (V * M + P - 1);
                    CHECK_MSG(fabs(sim.idle_fraction - want) < 1e-12,
                              "%s P %d M %d V %d: idle %.6f, theory %.6f", mg_pipe_name(k), P, M,
                              V, sim.idle_fraction, want);
                    /* Messages: each boundary once per micro-batch each way. */
                    CHECK_EQ(sim.messages, 2L * (P * V - 1) * M);
                    for (int r = 0; r < P; r++) {
                        int peak = sim.peak_in_flight[r], most, early = 0;
                        switch (k) {
                        case MG_PIPE_NAIVE: most = 1; break;
                        case MG_PIPE_GPIPE: most = M; break;
                        case MG_PIPE_1F1B: most = P - r < M ? P - r : M; break;
                        default: {
                            int groups = M / P, longest = (M + groups - 1) / groups;
                            int warm = (P - r - 1) * 2 + (V - 1) * longest;
                            most = warm + 1 < M * V ? warm + 1 : M * V;
                            early = r == 0 ? longest - P : 0;
                        }
                        }
                        CHECK_MSG(peak >= most && peak <= most + early, "%s P %d M %d V %d rank "
                                  "%d: %d micro-batches in flight, expected %d (+ %d)",
                                  mg_pipe_name(k), P, M, V, r, peak, most, early);
                    }
                }
    printf("%d schedules simulated: no deadlock, bubbles and memory as the anchors state\n", runs);
    CHECK(runs > 150);
}

/* The simulator refuses what is wrong: a deadlock (both ranks receive
 * first), a backward before its forward, a send nobody receives. */
TEST(pipe_simulator_catches_bad_lists)
{
    mg_pipe_sim sim;
    /* Rank 0 waits for 1's gradient before sending its activation. */
    mg_pipe_action r0[] = {{0, MG_PIPE_F, 0}, {0, MG_PIPE_RECV_B, 0}, {0, MG_PIPE_SEND_F, 0},
                           {0, MG_PIPE_B, 0}};
    mg_pipe_action r1[] = {{1, MG_PIPE_RECV_F, 0}, {1, MG_PIPE_F, 0}, {1, MG_PIPE_B, 0},
                           {1, MG_PIPE_SEND_B, 0}};
    const mg_pipe_action *a[2] = {r0, r1};
    int n[2] = {4, 4};
    CHECK_EQ(mg_pipe_run(a, n, 2, 2, 1, 1, 2, &sim), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "deadlocks") && strstr(mg_last_error(), "rank 0 at 0RECV_B0") &&
          strstr(mg_last_error(), "rank 1 at 1RECV_F0"));
    /* Fixed order runs. */
    mg_pipe_action f0[] = {{0, MG_PIPE_F, 0}, {0, MG_PIPE_SEND_F, 0}, {0, MG_PIPE_RECV_B, 0},
                           {0, MG_PIPE_B, 0}};
    a[0] = f0;
    CHECK_OK(mg_pipe_run(a, n, 2, 2, 1, 1, 2, &sim));
    CHECK_NEAR(sim.makespan, 6, 1e-12);
    /* Backward first. */
    mg_pipe_action b1[] = {{1, MG_PIPE_RECV_F, 0}, {1, MG_PIPE_B, 0}, {1, MG_PIPE_F, 0},
                           {1, MG_PIPE_SEND_B, 0}};
    a[1] = b1;
    CHECK_EQ(mg_pipe_run(a, n, 2, 2, 1, 1, 2, &sim), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "before its forward"));
    /* A send without its receive. */
    mg_pipe_action s1[] = {{1, MG_PIPE_F, 0}, {1, MG_PIPE_B, 0}, {1, MG_PIPE_SEND_B, 0}};
    mg_pipe_action s0[] = {{0, MG_PIPE_F, 0}, {0, MG_PIPE_B, 0}};
    a[0] = s0;
    a[1] = s1;
    int m[2] = {2, 3};
    CHECK_EQ(mg_pipe_run(a, m, 2, 2, 1, 1, 2, &sim), MG_EINVAL);
    /* A stage on the wrong rank. */
    mg_pipe_action w0[] = {{1, MG_PIPE_F, 0}};
    a[0] = w0;
    int one[2] = {1, 0};
    CHECK_EQ(mg_pipe_run(a, one, 2, 2, 1, 1, 2, &sim), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "not one of its stages"));
}

/* Every list the executor runs, with and without backwards, P up to 8,
 * M up to 12, under sends that end only with their receive and messages
 * between two ranks matched in the order posted (NCCL's sends and
 * receives in groups): no batch over MG_PIPE_BATCH_MAX, no crossed
 * messages, no deadlock. Interleaved training runs in lock-step (one
 * batch after each iteration); lowered as the other schedules are, with
 * each send after its computation, two ranks of a step of two rounds or
 * more would each post a gradient send alone before the batch that
 * receives the other's (the second test below). Naive over V chunks is
 * what an interleaved step of fewer micro-batches than P runs. */
TEST(pipe_schedules_sweep_rendezvous_in_order)
{
    int runs = 0;
    for (int k = MG_PIPE_NAIVE; k <= MG_PIPE_INTERLEAVED; k++)
        for (int P = 1; P <= 8; P++)
            for (int M = 1; M <= 12; M++)
                for (int V = 1; V <= (k == MG_PIPE_NAIVE || k == MG_PIPE_INTERLEAVED ? 3 : 1);
                     V++)
                    for (int fwd = 0; fwd < 2; fwd++) {
                        if (k == MG_PIPE_INTERLEAVED && V < 2) continue;
                        mg_status st = mg_pipe_simulate_rendezvous((mg_pipe_kind)k, P, M, V, fwd);
                        CHECK_MSG(st == MG_OK, "%s P %d M %d V %d%s: %s", mg_pipe_name(k), P, M,
                                  V, fwd ? " forwards" : "", st ? mg_last_error() : "runs");
                        runs++;
                    }
    printf("%d step lists run with rendezvous sends: none deadlocks, none crosses\n", runs);
    CHECK(runs > 900);
}

/* Interleaved training in lock-step: after each iteration (a warm-up
 * forward, a forward and a backward, a cool-down backward) one batch of
 * its sends and the next iteration's receives. Lowered with each send
 * right after its computation instead, rank 0 posts 2SEND_B0 alone (the
 * next forward, of stage 0, receives nothing) while rank 1 posts 3SEND_B1
 * before the batch that receives 2SEND_B0: under NCCL a deadlock. */
TEST(pipe_interleaved_lock_step_batches)
{
    mg_pipe_action a[128];
    char s[4096];
    int n = mg_pipe_lower(MG_PIPE_INTERLEAVED, 2, 4, 2, 1, a, 128);
    mg_pipe_list_str(a, n, s, sizeof s);
    CHECK_STR_EQ(s, "1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 3RECV_F0 3F0 3B0 3SEND_B0 "
                    "3RECV_F1 3F1 3B1 3SEND_B1 1RECV_F2 1RECV_B0 1F2 1B0 1SEND_F2 1SEND_B0 "
                    "1RECV_F3 1RECV_B1 1F3 1B1 1SEND_F3 1SEND_B1 3RECV_F2 3F2 3B2 3SEND_B2 "
                    "3RECV_F3 3F3 3B3 3SEND_B3 1RECV_B2 1B2 1SEND_B2 1RECV_B3 1B3 1SEND_B3");
    /* The same computations lowered send-after-compute deadlock. */
    mg_pipe_action c[2][16], l[2][64];
    const mg_pipe_action *lists[2] = {l[0], l[1]};
    int ln[2];
    for (int r = 0; r < 2; r++) {
        int nc = mg_pipe_compute(MG_PIPE_INTERLEAVED, 2, 4, 2, r, c[r], 16);
        ln[r] = 0;
        for (int i = 0; i < nc; i++) {
            mg_pipe_action x = c[r][i];
            bool f = x.op == MG_PIPE_F;
            if (f ? x.stage > 0 : x.stage < 3)
                l[r][ln[r]++] = (mg_pipe_action){x.stage, f ? MG_PIPE_RECV_F : MG_PIPE_RECV_B,
                                                 x.mb};
            l[r][ln[r]++] = x;
            if (f ? x.stage < 3 : x.stage > 0)
                l[r][ln[r]++] = (mg_pipe_action){x.stage, f ? MG_PIPE_SEND_F : MG_PIPE_SEND_B,
                                                 x.mb};
        }
    }
    mg_pipe_sim sim;
    CHECK_OK(mg_pipe_run(lists, ln, 2, 4, 4, 1, 2, &sim));
    CHECK_EQ(mg_pipe_run_rendezvous(lists, ln, 2, 4, 4), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "rank 0 waits at 2SEND_B0") &&
              strstr(mg_last_error(), "rank 1 waits at 3SEND_B1"), "%s", mg_last_error());
    /* Sending a forward's result only after the iteration's backward
     * costs no bubble: Megatron-LM's (P-1)/(V·M+P-1) for a backward 1,
     * 1.5 or 3 times a forward too (the sweep above checks 2), for any
     * M >= P. */
    const double tb[] = {1, 1.5, 3};
    for (int t = 0; t < 3; t++)
        for (int P = 2; P <= 8; P++)
            for (int M = P; M <= 24; M++)
                for (int V = 2; V <= 4; V++) {
                    CHECK_OK(mg_pipe_simulate(MG_PIPE_INTERLEAVED, P, M, V, 1, tb[t], &sim));
                    double want = (double)(P - 1) / (V * M + P - 1);
                    CHECK_MSG(fabs(sim.idle_fraction - want) < 1e-12, "P %d M %d V %d tb %g: "
                              "idle %.6f, theory %.6f", P, M, V, tb[t], sim.idle_fraction, want);
                }
}

/* Interleaved with any M >= P (Megatron-LM's microbatch groups): the
 * micro-batches in M / P groups as even as can be, each through chunk 0,
 * then chunk 1. At 2 stages, M = 5 runs groups of 3 and 2. Where a group
 * is longer than P, rank 0 has the last rank's output for its next chunk
 * before it needs it: at 3 stages, M = 8 (two groups of 4), 3RECV_F0 is
 * posted with the batch after 0F2, a forward before 3F0, where the last
 * rank sends it; received only before 3F0, as the other receives are,
 * the ranks would deadlock where a send ends only with its receive. */
TEST(pipe_interleaved_any_micro_batch_count)
{
    char s[4096];
    compute_str(MG_PIPE_INTERLEAVED, 2, 5, 2, 0, s, sizeof s);
    CHECK_STR_EQ(s, "0F0 0F1 0F2 2F0 2F1 2F2 2B0 0F3 2B1 0F4 2B2 2F3 0B0 2F4 0B1 0B2 2B3 2B4 "
                    "0B3 0B4");
    mg_pipe_action a[128];
    int n = mg_pipe_lower(MG_PIPE_INTERLEAVED, 3, 8, 2, 0, a, 128);
    mg_pipe_list_str(a, n, s, sizeof s);
    const char *head = "0F0 0SEND_F0 0F1 0SEND_F1 0F2 0SEND_F2 3RECV_F0 0F3 0SEND_F3 3RECV_F1 "
                       "3F0 3SEND_F0 3RECV_F2 3F1";
    CHECK_MSG(!strncmp(s, head, strlen(head)), "%s", s);
    mg_pipe_sim sim;
    CHECK_OK(mg_pipe_simulate(MG_PIPE_INTERLEAVED, 3, 8, 2, 1, 2, &sim));
    CHECK_NEAR(sim.idle_fraction, 2.0 / 18, 1e-12);
    CHECK_OK(mg_pipe_simulate_rendezvous(MG_PIPE_INTERLEAVED, 3, 8, 2, false));
}

/* What passes with eager sends but not with NCCL's: a rank's send to
 * itself posted a batch before its receive (one rank running two stages),
 * and two receives taken in the other order than sent. */
TEST(pipe_rendezvous_catches_deadlock_and_crossing)
{
    /* One rank, stages 0 and 1, two micro-batches: 0SEND_F0 alone in a
     * batch, its receive in the next. */
    mg_pipe_action d[] = {
        {0, MG_PIPE_F, 0},      {0, MG_PIPE_SEND_F, 0}, {0, MG_PIPE_F, 1},
        {0, MG_PIPE_SEND_F, 1}, {1, MG_PIPE_RECV_F, 0}, {1, MG_PIPE_F, 0},
        {1, MG_PIPE_RECV_F, 1}, {1, MG_PIPE_F, 1},      {1, MG_PIPE_B, 0},
        {1, MG_PIPE_SEND_B, 0}, {1, MG_PIPE_B, 1},      {1, MG_PIPE_SEND_B, 1},
        {0, MG_PIPE_RECV_B, 0}, {0, MG_PIPE_B, 0},      {0, MG_PIPE_RECV_B, 1},
        {0, MG_PIPE_B, 1}};
    const mg_pipe_action *a[2] = {d};
    int n[2] = {16};
    mg_pipe_sim sim;
    CHECK_OK(mg_pipe_run(a, n, 1, 2, 2, 1, 2, &sim));
    CHECK_EQ(mg_pipe_run_rendezvous(a, n, 1, 2, 2), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "deadlocks when a send waits for its receive") &&
              strstr(mg_last_error(), "rank 0 waits at 0SEND_F0"), "%s", mg_last_error());
    /* Two stages: the last receives micro-batch 1 before 0. */
    mg_pipe_action r0[] = {{0, MG_PIPE_F, 0},      {0, MG_PIPE_SEND_F, 0}, {0, MG_PIPE_F, 1},
                           {0, MG_PIPE_SEND_F, 1}, {0, MG_PIPE_RECV_B, 0}, {0, MG_PIPE_B, 0},
                           {0, MG_PIPE_RECV_B, 1}, {0, MG_PIPE_B, 1}};
    mg_pipe_action r1[] = {{1, MG_PIPE_RECV_F, 1}, {1, MG_PIPE_RECV_F, 0}, {1, MG_PIPE_F, 0},
                           {1, MG_PIPE_B, 0},      {1, MG_PIPE_SEND_B, 0}, {1, MG_PIPE_F, 1},
                           {1, MG_PIPE_B, 1},      {1, MG_PIPE_SEND_B, 1}};
    a[0] = r0;
    a[1] = r1;
    int m[2] = {8, 8};
    CHECK_OK(mg_pipe_run(a, m, 2, 2, 2, 1, 2, &sim));
    CHECK_EQ(mg_pipe_run_rendezvous(a, m, 2, 2, 2), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "rank 0's message 0 to rank 1 is 0SEND_F0, but rank 1's "
                     "receive 0 from rank 0 is 1RECV_F1"), "%s", mg_last_error());
    /* In order, it runs. */
    r1[0] = (mg_pipe_action){1, MG_PIPE_RECV_F, 0};
    r1[1] = (mg_pipe_action){1, MG_PIPE_RECV_F, 1};
    CHECK_OK(mg_pipe_run_rendezvous(a, m, 2, 2, 2));
}

TEST(pipe_bad_arguments)
{
    mg_pipe_kind k;
    CHECK_OK(mg_pipe_parse("1f1b", &k));
    CHECK_EQ(k, MG_PIPE_1F1B);
    CHECK_EQ(mg_pipe_parse("zb", &k), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "naive, gpipe, 1f1b or interleaved"));
    CHECK_EQ(mg_pipe_check(MG_PIPE_GPIPE, 2, 4, 2), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "--chunks 2 is for --pp-schedule interleaved"));
    CHECK_EQ(mg_pipe_check(MG_PIPE_INTERLEAVED, 4, 3, 2), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "3 micro-batches is fewer than 4 stages"));
    CHECK_OK(mg_pipe_check(MG_PIPE_INTERLEAVED, 4, 6, 2));
    CHECK_EQ(mg_pipe_check(MG_PIPE_1F1B, 0, 4, 1), MG_EINVAL);
    CHECK_EQ(mg_pipe_check(MG_PIPE_1F1B, 2, 0, 1), MG_EINVAL);
    mg_pipe_sim sim;
    CHECK_EQ(mg_pipe_simulate(MG_PIPE_INTERLEAVED, 2, 1, 2, 1, 2, &sim), MG_EINVAL);
}

static double largest(const double *c, const int *first, int S)
{
    double m = 0;
    for (int s = 0; s < S; s++) {
        double x = 0;
        for (int u = first[s]; u < first[s + 1]; u++) x += c[u];
        if (x > m) m = x;
    }
    return m;
}

/* The least largest stage over every cut of n units into S stages. */
static double brute(const double *c, int n, int S, int *first, int s)
{
    if (s == S) {
        first[S] = n;
        return largest(c, first, S);
    }
    double best = -1;
    for (int u = first[s - 1] + 1; u <= n - (S - s); u++) {
        first[s] = u;
        double m = brute(c, n, S, first, s + 1);
        if (best < 0 || m < best) best = m;
    }
    return best;
}

/* The balanced cut is the best cut (brute force over random costs), and
 * hand cases; the user's cut by unit names, and its errors. */
TEST(pipe_stages_balanced_and_user_split)
{
    int first[16];   /* S + 1 entries, S up to 9 */
    const double c1[] = {5, 1, 1, 1, 1, 1};
    CHECK_OK(mg_pipe_balance(c1, 6, 2, first));
    CHECK(first[0] == 0 && first[1] == 1 && first[2] == 6);
    const double c2[] = {1, 1, 1, 1};
    CHECK_OK(mg_pipe_balance(c2, 4, 4, first));
    CHECK(first[1] == 1 && first[2] == 2 && first[3] == 3 && first[4] == 4);
    CHECK_EQ(mg_pipe_balance(c2, 4, 5, first), MG_EINVAL);
    mg_rng r;
    mg_rng_init(&r, 7);
    for (int t = 0; t < 200; t++) {
        double c[9];
        int n = 1 + (int)mg_rng_below(&r, 9), S = 1 + (int)mg_rng_below(&r, (uint32_t)n);
        for (int u = 0; u < n; u++) c[u] = (double)mg_rng_below(&r, 100);
        CHECK_OK(mg_pipe_balance(c, n, S, first));
        CHECK(first[0] == 0 && first[S] == n);
        for (int s = 0; s < S; s++) CHECK(first[s] < first[s + 1]);
        int f2[10] = {0};
        double want = brute(c, n, S, f2, 1);
        CHECK_MSG(largest(c, first, S) == want, "n %d S %d: largest stage %g, best %g", n, S,
                  largest(c, first, S), want);
    }
    const char *names[] = {"embedding", "h.0", "h.1", "h.2", "h.3", "ln_f", "head"};
    CHECK_OK(mg_pipe_split_parse("h.1,h.3", names, 7, 3, first));
    CHECK(first[0] == 0 && first[1] == 2 && first[2] == 4 && first[3] == 7);
    static const struct { const char *spec; int S; const char *want; } bad[] = {
        {"h.9", 2, "no unit 'h.9'"},
        {"h.1", 3, "gives 1 cut(s) for 3 stages"},
        {"h.1,h.2", 2, "more than the 2 stages"},
        {"h.2,h.1", 3, "does not come after"},
        {"embedding", 2, "is the first unit"},
        {"", 2, "gives 0 cut(s)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(mg_pipe_split_parse(bad[i].spec, names, 7, bad[i].S, first), MG_EINVAL);
        CHECK_MSG(strstr(mg_last_error(), bad[i].want), "'%s': %s", bad[i].spec,
                  mg_last_error());
    }
}

/* The naive schedule over V chunks (an interleaved step cut short at an
 * epoch's end runs it): each micro-batch through all P·V stages and back,
 * one at a time, never a deadlock. */
TEST(pipe_naive_over_chunks_runs_one_micro_batch_at_a_time)
{
    for (int P = 1; P <= 4; P++)
        for (int V = 2; V <= 3; V++)
            for (int M = 1; M <= 5; M++) {
                mg_pipe_sim sim;
                CHECK_OK(mg_pipe_simulate(MG_PIPE_NAIVE, P, M, V, 1, 2, &sim));
                for (int r = 0; r < P; r++) CHECK_EQ(sim.peak_in_flight[r], V);
                CHECK_EQ(sim.messages, 2L * (P * V - 1) * M);
                /* One stage at a time: every rank idle but 1/P of the time. */
                CHECK_NEAR(sim.idle_fraction, (double)(P - 1) / P, 1e-12);
            }
    mg_pipe_action a[16];
    char buf[256];
    CHECK_EQ(mg_pipe_compute(MG_PIPE_NAIVE, 2, 2, 2, 1, a, 16), 8);
    mg_pipe_list_str(a, 8, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "1F0 3F0 3B0 1B0 1F1 3F1 3B1 1B1"), "%s", buf);
    /* Users still give chunks to interleaved only. */
    CHECK_ERR(mg_pipe_check(MG_PIPE_NAIVE, 2, 2, 2), MG_EINVAL);
}
