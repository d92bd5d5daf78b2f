/* Pipeline schedules as pure functions (torch.distributed.pipelining's
 * IR, Megatron-LM's interleaving): generators give each rank's compute
 * actions, lowering adds the sends and receives between neighbouring
 * stages, and a lock-step simulator runs every rank's list to find
 * deadlocks and measure the bubble — all without processes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/pipeline.h"
#include "core/strbuf.h"

static const char *const names[] = {"naive", "gpipe", "1f1b", "interleaved"};

mg_status mg_pipe_parse(const char *s, mg_pipe_kind *out)
{
    for (int k = 0; k < 4; k++)
        if (s && !strcmp(s, names[k])) {
            *out = (mg_pipe_kind)k;
            return MG_OK;
        }
    return mg_error(MG_EINVAL, "unknown pipeline schedule '%s': use naive, gpipe, 1f1b or "
                    "interleaved", s ? s : "(null)");
}

const char *mg_pipe_name(mg_pipe_kind k)
{
    MG_ASSERT(k >= MG_PIPE_NAIVE && k <= MG_PIPE_INTERLEAVED);
    return names[k];
}

mg_status mg_pipe_check(mg_pipe_kind k, int P, int M, int V)
{
    if (k < MG_PIPE_NAIVE || k > MG_PIPE_INTERLEAVED)
        return mg_error(MG_EINVAL, "pipeline: unknown schedule %d", (int)k);
    if (P < 1 || P > 64 || M < 1 || M > (1 << 20) || V < 1 || V > 64)
        return mg_error(MG_EINVAL, "pipeline: %d stages, %d micro-batches, %d chunks: each must "
                        "be at least 1 (stages and chunks at most 64)", P, M, V);
    if (k != MG_PIPE_INTERLEAVED && V != 1)
        return mg_error(MG_EINVAL, "pipeline: --chunks %d is for --pp-schedule interleaved; %s "
                        "runs one chunk per stage", V, names[k]);
    if (k == MG_PIPE_INTERLEAVED && M < P)
        return mg_error(MG_EINVAL, "pipeline: the interleaved schedule runs micro-batches in "
                        "groups of at least the stage count: %d micro-batches is fewer than "
                        "%d stages; use --micro-batches %d or more, or 1f1b", M, P, P);
    return MG_OK;
}

/* Appends unless full; counts regardless. */
typedef struct { mg_pipe_action *a; int n, cap; } list;

static void put(list *l, int stage, mg_pipe_op op, int mb)
{
    if (l->n < l->cap) l->a[l->n] = (mg_pipe_action){stage, op, mb};
    l->n++;
}

/* Megatron-LM's interleaved order runs the micro-batches in groups of at
 * least P (a shorter group would leave rank 0 waiting for its own next
 * chunk's input), each group through chunk 0, then chunk 1, ... Groups
 * here are M / P of them, as even as can be (the first M mod that count
 * one longer), so the longest, which sets the warm-up, is the shortest
 * it can be: P where P divides M. */
static int groups(int P, int M) { return M / P > 0 ? M / P : 1; }
static int longest_group(int P, int M) { return (M + groups(P, M) - 1) / groups(P, M); }

/* The group of the k-th forward (the k-th backward: the same, its chunks
 * counted from the last): its first micro-batch and its length. */
static void group_of(int P, int M, int V, int k, int *first, int *len)
{
    int q = groups(P, M), base = M / q, longer = M % q;
    int in_longer = longer * (base + 1) * V;   /* forwards in the longer groups */
    int g = k < in_longer ? k / ((base + 1) * V) : longer + (k - in_longer) / (base * V);
    *len = base + (g < longer);
    *first = g * base + (g < longer ? g : longer);
}

/* The k-th forward (backward) of a rank: its chunk and micro-batch. */
static void interleaved_at(int P, int M, int V, int k, bool fwd, int *chunk, int *mb)
{
    int first, len;
    group_of(P, M, V, k, &first, &len);
    int j = k - first * V;   /* its place in the group */
    *chunk = j / len;
    if (!fwd) *chunk = V - 1 - *chunk;
    *mb = first + j % len;
}

/* The interleaved schedule's warm-up forwards on a rank (Megatron-LM's):
 * enough for the backward of a group's first micro-batch on the last
 * chunk, and for its gradient to come back down the ranks. */
static int interleaved_warm(int P, int M, int V, int rank)
{
    int warm = (P - rank - 1) * 2 + (V - 1) * longest_group(P, M);
    return warm < M * V ? warm : M * V;
}

/* The naive schedule also runs V chunks per rank: what an interleaved
 * step of fewer micro-batches than P (an epoch's end) runs. */
static bool computable(mg_pipe_kind k, int P, int M, int V)
{
    if (k == MG_PIPE_NAIVE && V > 1) return !mg_pipe_check(k, P, M, 1) && V <= 64;
    return !mg_pipe_check(k, P, M, V);
}

int mg_pipe_compute(mg_pipe_kind k, int P, int M, int V, int rank, mg_pipe_action *out, int cap)
{
    MG_ASSERT(computable(k, P, M, V) && rank >= 0 && rank < P);
    list l = {out, 0, cap};
    int s = rank;   /* the stage, for V = 1 */
    switch (k) {
    case MG_PIPE_NAIVE:
        /* Each micro-batch through every stage and back: this rank's
         * part of one process's order, so no two ranks wait on each other. */
        for (int i = 0; i < M; i++) {
            for (int c = 0; c < V; c++) put(&l, c * P + rank, MG_PIPE_F, i);
            for (int c = V - 1; c >= 0; c--) put(&l, c * P + rank, MG_PIPE_B, i);
        }
        break;
    case MG_PIPE_GPIPE:
        for (int i = 0; i < M; i++) put(&l, s, MG_PIPE_F, i);
        for (int i = 0; i < M; i++) put(&l, s, MG_PIPE_B, i);
        break;
    case MG_PIPE_1F1B: {
        int warm = P - 1 - rank < M ? P - 1 - rank : M;
        for (int i = 0; i < warm; i++) put(&l, s, MG_PIPE_F, i);
        for (int i = 0; i < M - warm; i++) {
            put(&l, s, MG_PIPE_F, warm + i);
            put(&l, s, MG_PIPE_B, i);
        }
        for (int i = M - warm; i < M; i++) put(&l, s, MG_PIPE_B, i);
        break;
    }
    case MG_PIPE_INTERLEAVED: {
        int total = M * V, c, mb, warm = interleaved_warm(P, M, V, rank);
        for (int i = 0; i < warm; i++) {
            interleaved_at(P, M, V, i, true, &c, &mb);
            put(&l, c * P + rank, MG_PIPE_F, mb);
        }
        for (int i = 0; i < total - warm; i++) {
            interleaved_at(P, M, V, warm + i, true, &c, &mb);
            put(&l, c * P + rank, MG_PIPE_F, mb);
            interleaved_at(P, M, V, i, false, &c, &mb);
            put(&l, c * P + rank, MG_PIPE_B, mb);
        }
        for (int i = total - warm; i < total; i++) {
            interleaved_at(P, M, V, i, false, &c, &mb);
            put(&l, c * P + rank, MG_PIPE_B, mb);
        }
        break;
    }
    }
    return l.n;
}

/* The send of a computation's result, if it has one. */
static void put_send(list *l, const mg_pipe_action *c, int S)
{
    if (c->op == MG_PIPE_F && c->stage < S - 1) put(l, c->stage, MG_PIPE_SEND_F, c->mb);
    if (c->op == MG_PIPE_B && c->stage > 0) put(l, c->stage, MG_PIPE_SEND_B, c->mb);
}

/* Where the iteration of the rank's computations that begins at c[i]
 * ends: every computation is one, but for interleaved's steady state
 * (Megatron-LM's lock-step: a forward and a backward). */
static int iteration_end(mg_pipe_kind k, int warm, int n, int i)
{
    return i + (k == MG_PIPE_INTERLEAVED && i >= warm && i < n - warm ? 2 : 1);
}

/* A computation's place in its rank's list: its iteration and index. */
typedef struct { int iter, at; } place;

static long comp_key(int S, int M, mg_pipe_op op, int stage, int mb)
{
    return ((long)(op == MG_PIPE_B) * S + stage) * M + mb;
}

/* The places of the n computations c of a rank. */
static void place_list(mg_pipe_kind k, int P, int M, int V, int rank, const mg_pipe_action *c,
                       int n, place *out)
{
    int warm = k == MG_PIPE_INTERLEAVED ? interleaved_warm(P, M, V, rank) : 0;
    for (int i = 0, it = 0, next; i < n; i = next, it++) {
        next = iteration_end(k, warm, n, i);
        for (int j = i; j < next; j++) out[j] = (place){it, j};
    }
}

/* Every rank's computations' places, by comp_key. */
static place *places(mg_pipe_kind k, int P, int M, int V)
{
    int S = P * V, n = mg_pipe_compute(k, P, M, V, 0, NULL, 0);
    place *pl = malloc(sizeof *pl * 2 * (size_t)S * (size_t)M);
    mg_pipe_action *c = malloc(sizeof *c * (size_t)(n ? n : 1));
    place *mine = malloc(sizeof *mine * (size_t)(n ? n : 1));
    MG_ASSERT(pl && c && mine);
    for (int r = 0; r < P; r++) {
        mg_pipe_compute(k, P, M, V, r, c, n);
        place_list(k, P, M, V, r, c, n, mine);
        for (int j = 0; j < n; j++) pl[comp_key(S, M, c[j].op, c[j].stage, c[j].mb)] = mine[j];
    }
    free(mine);
    free(c);
    return pl;
}

/* A receive: the batch that posts it (-1: before the first iteration),
 * its sender's rank and place in its list, and the receive. */
typedef struct { int batch, from_at, from_rank; mg_pipe_action a; } recv_at;

static int by_batch_then_sender(const void *x, const void *y)
{
    const recv_at *a = x, *b = y;
    if (a->batch != b->batch) return a->batch < b->batch ? -1 : 1;
    if (a->from_rank != b->from_rank) return a->from_rank < b->from_rank ? -1 : 1;
    return (a->from_at > b->from_at) - (a->from_at < b->from_at);
}

/* The rank's receives, each in the batch after the iteration before the
 * computation that waits for it; interleaved's in the batch of the same
 * tick as its send where that is earlier. While no warm-up is cut short
 * by the step's end, lock-step batches meet their neighbours' at a tick,
 * iteration + rank (rank r's k-th batch meets rank r+1's (k-1)-th and
 * rank r-1's (k+1)-th). A forward that goes round from the last rank to
 * rank 0, or a gradient back from rank 0 to the last, is sent L - P ticks
 * before it is used in a group of L > P micro-batches: Megatron-LM
 * receives it then and keeps it, and so must we where a send ends only
 * with its receive. Sorted by batch, then as each sender sends (the other
 * schedules receive at most once a batch). Returns the count. */
static int receives(mg_pipe_kind k, int P, int M, int V, int rank, const mg_pipe_action *c,
                    int n, recv_at *out)
{
    int S = P * V, count = 0;
    bool ticks = k == MG_PIPE_INTERLEAVED && interleaved_warm(P, M, V, 0) < M * V;
    place *mine = malloc(sizeof *mine * (size_t)(n ? n : 1));
    place *pl = ticks ? places(k, P, M, V) : NULL;   /* every rank's, for the ticks */
    MG_ASSERT(mine);
    place_list(k, P, M, V, rank, c, n, mine);
    for (int j = 0; j < n; j++) {
        mg_pipe_action a = {c[j].stage, c[j].op == MG_PIPE_F ? MG_PIPE_RECV_F : MG_PIPE_RECV_B,
                            c[j].mb};
        int from = mg_pipe_peer_stage(&a);
        if (from < 0 || from >= S) continue;
        int batch = mine[j].iter - 1, from_at = j;
        if (pl) {
            place sender = pl[comp_key(S, M, c[j].op, from, c[j].mb)];
            int tick = sender.iter + from % P - rank;
            if (tick < batch) batch = tick > -1 ? tick : -1;
            from_at = sender.at;
        }
        out[count++] = (recv_at){batch, from_at, from % P, a};
    }
    free(pl);
    free(mine);
    qsort(out, (size_t)count, sizeof *out, by_batch_then_sender);
    return count;
}

int mg_pipe_lower(mg_pipe_kind k, int P, int M, int V, int rank, mg_pipe_action *out, int cap)
{
    int n = mg_pipe_compute(k, P, M, V, rank, NULL, 0), S = P * V;
    mg_pipe_action *c = malloc(sizeof *c * (size_t)(n ? n : 1));
    recv_at *rv = malloc(sizeof *rv * (size_t)(n ? n : 1));
    MG_ASSERT(c && rv);
    mg_pipe_compute(k, P, M, V, rank, c, n);
    int warm = k == MG_PIPE_INTERLEAVED ? interleaved_warm(P, M, V, rank) : 0;
    int nr = receives(k, P, M, V, rank, c, n, rv), r = 0;
    list l = {out, 0, cap};
    /* The receives before the first iteration; after each iteration, one
     * batch: its results' sends, then its receives. */
    for (; r < nr && rv[r].batch < 0; r++) put(&l, rv[r].a.stage, rv[r].a.op, rv[r].a.mb);
    for (int i = 0, it = 0, next; i < n; i = next, it++) {
        next = iteration_end(k, warm, n, i);
        for (int j = i; j < next; j++) put(&l, c[j].stage, c[j].op, c[j].mb);
        for (int j = i; j < next; j++) put_send(&l, &c[j], S);
        for (; r < nr && rv[r].batch == it; r++) put(&l, rv[r].a.stage, rv[r].a.op, rv[r].a.mb);
    }
    MG_ASSERT(r == nr);
    free(rv);
    free(c);
    return l.n;
}

/* The schedule a step of M micro-batches runs (mg_pipe_lower_step). */
static mg_pipe_kind step_kind(mg_pipe_kind k, int P, int M, int V, bool fwd_only)
{
    if (fwd_only && k != MG_PIPE_INTERLEAVED && V == 1) return MG_PIPE_GPIPE;
    return k == MG_PIPE_INTERLEAVED && M < P ? MG_PIPE_NAIVE : k;
}

int mg_pipe_lower_step(mg_pipe_kind k, int P, int M, int V, int rank, bool fwd_only,
                       mg_pipe_action *out, int cap)
{
    k = step_kind(k, P, M, V, fwd_only);
    if (!fwd_only) return mg_pipe_lower(k, P, M, V, rank, out, cap);
    int n = mg_pipe_lower(k, P, M, V, rank, NULL, 0);
    mg_pipe_action *all = malloc(sizeof *all * (size_t)(n ? n : 1));
    MG_ASSERT(all);
    mg_pipe_lower(k, P, M, V, rank, all, n);
    list l = {out, 0, cap};
    for (int i = 0; i < n; i++)
        if (all[i].op == MG_PIPE_F || all[i].op == MG_PIPE_SEND_F || all[i].op == MG_PIPE_RECV_F)
            put(&l, all[i].stage, all[i].op, all[i].mb);
    free(all);
    return l.n;
}

int mg_pipe_peer_stage(const mg_pipe_action *a)
{
    MG_ASSERT(a->op != MG_PIPE_F && a->op != MG_PIPE_B);
    return a->op == MG_PIPE_SEND_F || a->op == MG_PIPE_RECV_B ? a->stage + 1 : a->stage - 1;
}

int mg_pipe_held_change(const mg_pipe_action *a)
{
    if (a->op == MG_PIPE_RECV_F || (a->op == MG_PIPE_F && a->stage == 0)) return 1;
    return a->op == MG_PIPE_B ? -1 : 0;
}

static const char *const ops[] = {"F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};

void mg_pipe_action_str(const mg_pipe_action *a, char *buf, size_t cap)
{
    snprintf(buf, cap, "%d%s%d", a->stage, ops[a->op], a->mb);
}

void mg_pipe_list_str(const mg_pipe_action *a, int n, char *buf, size_t cap)
{
    size_t at = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < n && at + 1 < cap; i++) {
        char one[48];
        mg_pipe_action_str(&a[i], one, sizeof one);
        at = mg__catf(buf, cap, at, "%s%s", i ? " " : "", one);
    }
}

/* ---- the simulator -------------------------------------------------------- */

/* The message an action sends or receives: the stage it goes to, its
 * direction and micro-batch. A send of stage s forward goes to s + 1,
 * and is received there as RECV_F of s + 1. */
static long msg_key(const mg_pipe_action *a, int S, int M)
{
    if (a->op == MG_PIPE_F || a->op == MG_PIPE_B) return -1;
    bool send = a->op == MG_PIPE_SEND_F || a->op == MG_PIPE_SEND_B;
    int to = send ? mg_pipe_peer_stage(a) : a->stage;
    bool fwd = a->op == MG_PIPE_SEND_F || a->op == MG_PIPE_RECV_F;
    return ((long)!fwd * S + to) * M + a->mb;
}

/* Every rank's list for a step (mg_pipe_lower_step), run by the eager
 * simulator (tf, tb, out) or the rendezvous one (out NULL). */
static mg_status simulate(mg_pipe_kind k, int P, int M, int V, bool fwd_only, double tf,
                          double tb, mg_pipe_sim *out)
{
    /* The eager simulator takes the schedule as given (an interleaved
     * step of fewer than P micro-batches is refused); the rendezvous one
     * as a step runs. */
    mg_pipe_kind as = out ? k : step_kind(k, P, M, V, fwd_only);
    if (!computable(as, P, M, V)) MG_TRY(mg_pipe_check(as, P, M, V));
    mg_pipe_action *a[64];
    int n[64];
    mg_status st = MG_OK;
    for (int r = 0; r < P; r++) {
        n[r] = mg_pipe_lower_step(k, P, M, V, r, fwd_only, NULL, 0);
        a[r] = malloc(sizeof *a[r] * (size_t)(n[r] ? n[r] : 1));
        if (!a[r]) st = mg_error(MG_ENOMEM, "pipeline: out of memory");
        else mg_pipe_lower_step(k, P, M, V, r, fwd_only, a[r], n[r]);
    }
    const mg_pipe_action *const *ca = (const mg_pipe_action *const *)a;
    if (!st)
        st = out ? mg_pipe_run(ca, n, P, P * V, M, tf, tb, out)
                 : mg_pipe_run_rendezvous(ca, n, P, P * V, M);
    for (int r = 0; r < P; r++) free(a[r]);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mg_last_error());
        return mg_error(st, "%s%s: %s", names[k], fwd_only ? " (forwards)" : "", msg);
    }
    return MG_OK;
}

mg_status mg_pipe_simulate(mg_pipe_kind k, int P, int M, int V, double tf, double tb,
                           mg_pipe_sim *out)
{
    memset(out, 0, sizeof *out);
    return simulate(k, P, M, V, false, tf, tb, out);
}

mg_status mg_pipe_simulate_rendezvous(mg_pipe_kind k, int P, int M, int V, bool fwd_only)
{
    return simulate(k, P, M, V, fwd_only, 0, 0, NULL);
}

mg_status mg_pipe_run(const mg_pipe_action *const *a, const int *n, int P, int S, int M,
                      double tf, double tb, mg_pipe_sim *out)
{
    memset(out, 0, sizeof *out);
    if (P < 1 || P > 64 || S < P || M < 1)
        return mg_error(MG_EINVAL, "pipeline: %d ranks, %d stages, %d micro-batches", P, S, M);
    long nkeys = 2L * S * M;
    int at[64];
    double t[64];         /* when each rank is free */
    int inflight[64];
    double *sent = malloc(sizeof *sent * (size_t)nkeys);      /* when, or -1 */
    char *recvd = calloc((size_t)nkeys, 1);
    char *fwd = calloc((size_t)S * (size_t)M, 1), *bwd = calloc((size_t)S * (size_t)M, 1);
    mg_status st = MG_OK;
    if (!sent || !recvd || !fwd || !bwd) st = mg_error(MG_ENOMEM, "pipeline: out of memory");
    for (long i = 0; i < nkeys && !st; i++) sent[i] = -1;
    for (int r = 0; r < P; r++) {
        at[r] = 0;
        t[r] = 0;
        inflight[r] = 0;
    }
    int done = 0, total = 0;
    for (int r = 0; r < P; r++) total += n[r];
    while (!st && done < total) {
        bool moved = false;
        for (int r = 0; r < P && !st; r++) {
            while (at[r] < n[r] && !st) {
                const mg_pipe_action *x = &a[r][at[r]];
                if (x->stage < 0 || x->stage >= S || x->stage % P != r || x->mb < 0 ||
                    x->mb >= M || (int)x->op < 0 || x->op > MG_PIPE_RECV_B ||
                    (x->op == MG_PIPE_SEND_F && x->stage == S - 1) ||
                    (x->op == MG_PIPE_RECV_F && x->stage == 0) ||
                    (x->op == MG_PIPE_SEND_B && x->stage == 0) ||
                    (x->op == MG_PIPE_RECV_B && x->stage == S - 1)) {
                    st = mg_error(MG_EINVAL, "pipeline: rank %d's action %d (stage %d, op %d, "
                                  "micro-batch %d) is not one of its stages' actions", r, at[r],
                                  x->stage, (int)x->op, x->mb);
                    break;
                }
                long key = msg_key(x, S, M);
                int fb = x->stage * M + x->mb;
                if (x->op == MG_PIPE_RECV_F || x->op == MG_PIPE_RECV_B) {
                    if (sent[key] < 0) break;   /* waits for its send */
                    if (recvd[key]++)
                        st = mg_error(MG_EINVAL, "pipeline: stage %d receives micro-batch "
                                      "%d twice", x->stage, x->mb);
                    if (x->op == MG_PIPE_RECV_B && !fwd[fb])   /* it goes to the tape */
                        st = mg_error(MG_EINVAL, "pipeline: stage %d receives the gradient of "
                                      "micro-batch %d before its forward", x->stage, x->mb);
                    if (sent[key] > t[r]) t[r] = sent[key];
                } else if (x->op == MG_PIPE_SEND_F || x->op == MG_PIPE_SEND_B) {
                    if (sent[key] >= 0)
                        st = mg_error(MG_EINVAL, "pipeline: stage %d sends micro-batch %d "
                                      "twice", x->stage, x->mb);
                    sent[key] = t[r];
                    out->messages++;
                } else if (x->op == MG_PIPE_F) {
                    if (fwd[fb]++)
                        st = mg_error(MG_EINVAL, "pipeline: stage %d runs forward %d twice",
                                      x->stage, x->mb);
                    t[r] += tf;
                    out->busy[r] += tf;
                } else {
                    if (!fwd[fb] || bwd[fb]++)
                        st = mg_error(MG_EINVAL, "pipeline: stage %d runs backward %d %s",
                                      x->stage, x->mb,
                                      fwd[fb] ? "twice" : "before its forward");
                    t[r] += tb;
                    out->busy[r] += tb;
                }
                inflight[r] += mg_pipe_held_change(x);
                if (inflight[r] > out->peak_in_flight[r]) out->peak_in_flight[r] = inflight[r];
                at[r]++;
                done++;
                moved = true;
            }
        }
        if (!st && !moved) {
            char what[512] = "";
            size_t w = 0;
            for (int r = 0; r < P && w + 1 < sizeof what; r++)
                if (at[r] < n[r]) {
                    char one[48];
                    mg_pipe_action_str(&a[r][at[r]], one, sizeof one);
                    w = mg__catf(what, sizeof what, w, " rank %d at %s;", r, one);
                }
            st = mg_error(MG_EINVAL, "pipeline (%d ranks, %d stages, %d micro-batches) "
                          "deadlocks:%s", P, S, M, what);
        }
    }
    for (long i = 0; i < nkeys && !st; i++)
        if ((sent[i] >= 0) != (recvd[i] != 0))
            st = mg_error(MG_EINVAL, "pipeline: message %ld sent but not received or the "
                          "other way round", i);
    bool backwards = false;   /* lists without any are forwards alone (evaluation) */
    for (int i = 0; i < S * M; i++) backwards |= bwd[i] != 0;
    for (int i = 0; i < S * M && !st; i++)
        if (!fwd[i] || (backwards && !bwd[i]))
            st = mg_error(MG_EINVAL, "pipeline: stage %d misses micro-batch %d", i / M, i % M);
    if (!st) {
        double busy = 0;
        for (int r = 0; r < P; r++) {
            if (t[r] > out->makespan) out->makespan = t[r];
            busy += out->busy[r];
        }
        out->idle_fraction = out->makespan > 0 ? 1 - busy / P / out->makespan : 0;
    }
    free(sent);
    free(recvd);
    free(fwd);
    free(bwd);
    return st;
}

/* ---- the rendezvous simulator --------------------------------------------- */

/* A send or receive of the lists, in its rank's batch. */
typedef struct {
    const mg_pipe_action *a;
    int rank, batch, peer;   /* peer: the rank it goes to or comes from */
    bool send, done;
    long key;                /* msg_key */
    int partner;             /* the op it meets */
} rv_op;

/* Cuts the lists into the executor's batches: op[] gets every send and
 * receive, nb[r] rank r's batch count; MG_EINVAL for a batch too long. */
static mg_status rv_batches(const mg_pipe_action *const *a, const int *n, int P, int S, int M,
                            rv_op *op, int *nops, int *nb)
{
    int k = 0;
    for (int r = 0; r < P; r++) {
        nb[r] = 0;
        int in_batch = 0;
        for (int i = 0; i < n[r]; i++) {
            const mg_pipe_action *x = &a[r][i];
            if (x->op == MG_PIPE_F || x->op == MG_PIPE_B) {
                in_batch = 0;
                continue;
            }
            if (!in_batch++) nb[r]++;
            if (in_batch > MG_PIPE_BATCH_MAX) {
                char one[48];
                mg_pipe_action_str(x, one, sizeof one);
                return mg_error(MG_EINVAL, "pipeline: rank %d's batch ending at %s has more "
                                "than %d sends and receives", r, one, MG_PIPE_BATCH_MAX);
            }
            bool send = x->op == MG_PIPE_SEND_F || x->op == MG_PIPE_SEND_B;
            op[k++] = (rv_op){.a = x, .rank = r, .batch = nb[r] - 1,
                              .peer = mg_pipe_peer_stage(x) % P,
                              .send = send, .key = msg_key(x, S, M), .partner = -1};
        }
    }
    *nops = k;
    return MG_OK;
}

/* Pairs the k-th send from rank r to q with q's k-th receive from r, as
 * NCCL does; MG_EINVAL where those are two messages. */
static mg_status rv_pair(rv_op *op, int nops, int P)
{
    /* Per pair (sender, receiver), its sends and its receives as lists in
     * posting order: the first of each, and each op's next. */
    int pairs = P * P;
    int *head_s = malloc(sizeof(int) * (size_t)pairs);
    int *head_r = malloc(sizeof(int) * (size_t)pairs);
    int *next = malloc(sizeof(int) * (size_t)(nops ? nops : 1));
    mg_status st = head_s && head_r && next ? MG_OK
                                            : mg_error(MG_ENOMEM, "pipeline: out of memory");
    for (int i = 0; i < pairs && !st; i++) head_s[i] = head_r[i] = -1;
    for (int i = nops - 1; i >= 0 && !st; i--) {
        int pair = op[i].send ? op[i].rank * P + op[i].peer : op[i].peer * P + op[i].rank;
        int *head = op[i].send ? head_s : head_r;
        next[i] = head[pair];
        head[pair] = i;
    }
    for (int pair = 0; pair < pairs && !st; pair++) {
        int s = head_s[pair], r = head_r[pair];
        for (int k = 0; (s >= 0 || r >= 0) && !st; k++, s = s >= 0 ? next[s] : -1,
                 r = r >= 0 ? next[r] : -1) {
            if (s >= 0 && r >= 0 && op[s].key == op[r].key) {
                op[s].partner = r;
                op[r].partner = s;
                continue;
            }
            char a[48] = "nothing", b[48] = "nothing";
            if (s >= 0) mg_pipe_action_str(op[s].a, a, sizeof a);
            if (r >= 0) mg_pipe_action_str(op[r].a, b, sizeof b);
            st = mg_error(MG_EINVAL, "pipeline: rank %d's message %d to rank %d is %s, but "
                          "rank %d's receive %d from rank %d is %s: matched in the order "
                          "posted (NCCL), they would cross", pair / P, k, pair % P, a, pair % P,
                          k, pair / P, b);
        }
    }
    free(head_s);
    free(head_r);
    free(next);
    return st;
}

mg_status mg_pipe_run_rendezvous(const mg_pipe_action *const *a, const int *n, int P, int S,
                                 int M)
{
    mg_pipe_sim sim;
    MG_TRY(mg_pipe_run(a, n, P, S, M, 1, 1, &sim));
    long total = 0;
    for (int r = 0; r < P; r++) total += n[r];
    rv_op *op = malloc(sizeof *op * (size_t)(total ? total : 1));
    int *left = calloc((size_t)(total ? total : 1), sizeof *left);   /* per (rank, batch) */
    int nops = 0, nb[64], first[65], head[64];
    mg_status st = op && left ? MG_OK : mg_error(MG_ENOMEM, "pipeline: out of memory");
    if (!st) st = rv_batches(a, n, P, S, M, op, &nops, nb);
    if (!st) st = rv_pair(op, nops, P);
    first[0] = 0;
    for (int r = 0; r < P; r++) {
        first[r + 1] = first[r] + (st ? 0 : nb[r]);
        head[r] = 0;
    }
    for (int i = 0; i < nops && !st; i++) left[first[op[i].rank] + op[i].batch]++;
    /* Rounds: every message whose batch and partner's batch both run
     * meets it; finished batches give way to the next. */
    for (bool moved = true; moved && !st;) {
        moved = false;
        for (int i = 0; i < nops; i++) {
            rv_op *x = &op[i], *y = &op[x->partner];
            if (x->done || x->batch != head[x->rank] || y->batch != head[y->rank]) continue;
            x->done = y->done = true;
            left[first[x->rank] + x->batch]--;
            left[first[y->rank] + y->batch]--;
            moved = true;
        }
        for (int r = 0; r < P; r++)
            while (head[r] < nb[r] && !left[first[r] + head[r]]) head[r]++;
    }
    bool stuck = false;
    for (int r = 0; r < P && !st; r++) stuck |= head[r] < nb[r];
    if (stuck) {
        char what[512] = "";
        size_t w = 0;
        for (int i = 0; i < nops && w + 1 < sizeof what; i++)
            if (!op[i].done && op[i].batch == head[op[i].rank]) {
                char one[48];
                mg_pipe_action_str(op[i].a, one, sizeof one);
                w = mg__catf(what, sizeof what, w, " rank %d waits at %s;",
                             op[i].rank, one);
            }
        st = mg_error(MG_EINVAL, "pipeline (%d ranks, %d stages, %d micro-batches) deadlocks "
                      "when a send waits for its receive:%s", P, S, M, what);
    }
    free(op);
    free(left);
    return st;
}

/* ---- cutting the model into stages ----------------------------------------- */

mg_status mg_pipe_balance(const double *cost, int n, int S, int *first)
{
    if (S < 1 || n < S)
        return mg_error(MG_EINVAL, "pipeline: %d stages need at least %d units, the model has "
                        "%d: use fewer stages", S, S, n);
    /* best[s][i]: the least largest cost of units [0, i) in s stages;
     * cut[s][i]: where its last stage begins. */
    double *pre = malloc(sizeof *pre * (size_t)(n + 1));
    double *best = malloc(sizeof *best * (size_t)(S + 1) * (size_t)(n + 1));
    int *cut = malloc(sizeof *cut * (size_t)(S + 1) * (size_t)(n + 1));
    if (!pre || !best || !cut) {
        free(pre);
        free(best);
        free(cut);
        return mg_error(MG_ENOMEM, "pipeline: out of memory");
    }
#define AT(a, s, i) a[(size_t)(s) * (size_t)(n + 1) + (size_t)(i)]
    pre[0] = 0;
    for (int u = 0; u < n; u++) pre[u + 1] = pre[u] + (cost[u] > 0 ? cost[u] : 0);
    for (int i = 0; i <= n; i++) AT(best, 1, i) = pre[i], AT(cut, 1, i) = 0;
    for (int s = 2; s <= S; s++)
        for (int i = s; i <= n; i++) {
            AT(best, s, i) = -1;
            for (int j = s - 1; j < i; j++) {
                double a = AT(best, s - 1, j), b = pre[i] - pre[j], m = a > b ? a : b;
                if (AT(best, s, i) < 0 || m < AT(best, s, i)) {
                    AT(best, s, i) = m;
                    AT(cut, s, i) = j;
                }
            }
        }
    first[S] = n;
    for (int s = S, i = n; s >= 1; s--) i = first[s - 1] = AT(cut, s, i);
#undef AT
    free(pre);
    free(best);
    free(cut);
    return MG_OK;
}

mg_status mg_pipe_split_parse(const char *spec, const char *const *names, int n, int S,
                              int *first)
{
    if (S < 1 || n < S)
        return mg_error(MG_EINVAL, "pipeline: %d stages need at least %d units, the model has "
                        "%d: use fewer stages", S, S, n);
    first[0] = 0;
    first[S] = n;
    int s = 1;
    const char *p = spec ? spec : "";
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int u = -1;
        for (int i = 0; i < n && u < 0; i++)
            if (strlen(names[i]) == len && !strncmp(names[i], p, len)) u = i;
        if (u < 0)
            return mg_error(MG_EINVAL, "--split: no unit '%.*s' (--print-plan lists the "
                            "units)", (int)len, p);
        if (s >= S)
            return mg_error(MG_EINVAL, "--split '%s' cuts into more than the %d stages: give "
                            "%d unit name(s)", spec, S, S - 1);
        if (u <= first[s - 1])
            return mg_error(MG_EINVAL, "--split: unit '%s' %s: give the units where stages "
                            "begin in forward order", names[u],
                            u == 0 ? "is the first unit, where stage 0 begins"
                                   : "does not come after the previous cut");
        first[s++] = u;
        p += len + (e ? 1 : 0);
    }
    if (s != S)
        return mg_error(MG_EINVAL, "--split '%s' gives %d cut(s) for %d stages: give %d unit "
                        "name(s), the first unit of each stage after the first", spec ? spec : "",
                        s - 1, S, S - 1);
    return MG_OK;
}
