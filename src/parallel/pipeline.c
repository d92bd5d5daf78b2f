/* Pipeline parallelism: one executor for every schedule of
 * pipeline_sched.c. The model is cut into S = P·V stages at unit
 * boundaries; this rank runs the stages s with s mod P == rank (its V
 * chunks), each micro-batch on a tape of the stage's units alone, one
 * tape per micro-batch in flight (a pool per chunk that grows to the
 * schedule's peak: GPipe's M, 1F1B's P - rank), with its own buffer for
 * the input it receives; its output's gradient is received straight into
 * its tape (mg_tape_output_grad), so interleaved may receive one a few
 * backwards early.
 *
 * The executor walks the rank's lowered list. The sends and receives
 * between two computations are posted as one batch (sends first, so two
 * stages exchanging never wait on each other) before the computation;
 * it waits for the batch only when it holds a receive. Tags name the
 * direction, the stage and the micro-batch, so messages cannot be
 * confused, and a failed transfer says which stages and micro-batch it
 * joined. On a device, receives go to device memory: between GPUs with
 * NCCL every batch is then wholly on the GPU and goes through NCCL's
 * sends and receives, with no copy through the host. That is sound
 * because every list the schedules give also runs where a send ends only
 * with its receive and messages are matched in the order posted
 * (mg_pipe_simulate_rendezvous, swept by the schedule tests).
 *
 * Parameters: every rank makes the whole model (the same initialisation
 * as one process), keeps its stages' ranges and gives the rest of the
 * arena back (mg_mem_discard). A unit that reads another stage's
 * parameters (gpt's head tied to the embedding) keeps that range too, and
 * after the last backward the two ranks holding it add their gradients
 * (each sends its own, both add: a + b on both sides, the same bits), as
 * Megatron-LM sums the embedding's gradient between its first and last
 * stage. Both then step the same values with the same state.
 *
 * Before each backward the executor tells whoever asked
 * (mg__pipe_around_backward: the strategy's other components) whether it
 * is its stage's last of the step, after which the stage's gradients are
 * final (its replicas' average starts then), and after it that it is done
 * (--deterministic takes each micro-batch's gradients then).
 *
 * Evaluation and generation run the same lists without their backwards
 * (mg__pipe_forward): a tape goes back as soon as its output is sent.
 *
 * NCCL connects two ranks at their first message each way, and a batch
 * holding such a message waits for the peer's batch with its other end
 * (README): GPipe's rank 0 would post its first receive from rank 1
 * beside a send rank 1 waits for. So the first run of a pipe exchanges a
 * float each way with each rank it talks to, in one batch on every rank,
 * before its lists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"
#include "multigrad/trace.h"

typedef struct flight {   /* a micro-batch in flight on a chunk */
    mg_tape *t;
    float *in;            /* its received input (stages > 0; on the model's device) */
    bool sending;         /* a send of its input gradient may be in flight */
} flight;

typedef struct chunk {
    int stage, u0, u1;
    size_t in_per, out_per;   /* floats per sample in and out */
    flight **pool;            /* free ones: pool[0 .. n_free) */
    int n_free, n_all;
    flight **all;             /* every one made (n_all) */
    flight **mb;              /* [micro-batch]: the one it runs on */
} chunk;

typedef struct tie {          /* a range this rank shares with another */
    size_t lo, hi;
    int peer;                 /* the other rank (in the pipeline group) */
    bool owner;               /* this rank holds the unit (counts it in norms and saves) */
} tie;

struct mg_pipe {
    mg_group *g;
    mg_model *m;
    mg_pipe_kind kind;
    int P, M, V, S, rank, max_batch;
    int *first;               /* S + 1 unit boundaries */
    chunk *ch;                /* V */
    mg_range ranges[MG_PIPE_MAX_RANGES];   /* this rank's, ascending */
    int n_ranges;
    mg_range own[MG_PIPE_MAX_RANGES];      /* of them, those not borrowed, not empty */
    int n_own;
    tie ties[8];
    int n_ties;
    bool ties_left;         /* mg__pipe_leave_ties */
    bool linked;              /* link_peers done */
    /* The step's micro-batches, copied. */
    float *x;
    int32_t *y;
    int *n;
    size_t x_per, y_per;      /* input floats and labels per sample */
    /* The lowered list made last, for acts_for = 2·count + forward-only
     * (0: none yet). */
    mg_pipe_action *acts;
    bool *final_b;            /* per action: its stage's last backward of the step */
    int n_acts, acts_for;
    /* Called before each backward (final: its stage's last of the step). */
    void (*before_backward)(void *ud, bool final);
    mg_status (*after_backward)(void *ud);
    void *bb_ud;
    int cur_chunk;            /* of the backward after_backward follows */
    const mg_tape *logits;    /* the last stage's last forward's tape */
    float *host_logits;       /* on a device: their copy for mg__pipe_logits */
    /* Posted batches of sends only, not waited for yet. */
    mg_work **pend;
    int n_pend, cap_pend;
    int held;                 /* micro-batches holding a tape now, all chunks */
    mg_pipe_stats stats;
};

static size_t fl(size_t n) { return n * sizeof(float); }

/* *b holds `floats` on the model's device (made there, or moved when
 * the model moved). */
static mg_status recv_ready(const mg_pipe *p, float **b, size_t floats)
{
    mg_device want = mg_model_device(p->m), at = mg_device_of(*b);
    if (*b && at.kind == want.kind && at.index == want.index) return MG_OK;
    if (*b) mg_device_free(at, *b);
    *b = mg_device_alloc(want, fl(floats));
    return *b ? MG_OK : mg_error(MG_ENOMEM, "pipeline: out of memory for a receive buffer");
}

static void recv_free(float *b)
{
    if (b) mg_device_free(mg_device_of(b), b);
}

mg_group *mg__pipe_group(const mg_pipe *p) { return p->g; }
int mg__pipe_chunks(const mg_pipe *p) { return p->V; }
int mg__pipe_current_chunk(const mg_pipe *p) { return p->cur_chunk; }
bool mg__pipe_has_ties(const mg_pipe *p) { return p->n_ties > 0; }
void mg__pipe_leave_ties(mg_pipe *p) { p->ties_left = true; }
bool mg__pipe_ties_left(const mg_pipe *p) { return p->ties_left; }
mg_model *mg__pipe_model(const mg_pipe *p) { return p->m; }

void mg__pipe_around_backward(mg_pipe *p, void (*before)(void *ud, bool final),
                              mg_status (*after)(void *ud), void *ud)
{
    p->before_backward = before;
    p->after_backward = after;
    p->bb_ud = ud;
}

/* The arena range of units [u0, u1) (units lie in reverse order). */
static mg_range units_range(const mg_model *m, int u0, int u1)
{
    size_t lo, hi, a, b;
    mg_model_unit_range(m, u1 - 1, &lo, &b);
    mg_model_unit_range(m, u0, &a, &hi);
    return (mg_range){lo, hi};
}

double mg_pipe_unit_cost(const mg_model *m, int u)
{
    mg_unit_info ui = mg_model_unit(m, u);
    return ui.flops > 0 ? ui.flops : (double)ui.numel;
}

static int stage_of_unit(const mg_pipe *p, int u)
{
    int s = 0;
    while (u >= p->first[s + 1]) s++;
    return s;
}

int mg__pipe_chunk_of(const mg_pipe *p, int u)
{
    int s = stage_of_unit(p, u);
    return s % p->P == p->rank ? s / p->P : -1;
}

static int cmp_range(const void *a, const void *b)
{
    const mg_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Every rank of the pipeline must run the same schedule on the same cut:
 * one all-gather of what each was given, and an error naming the first
 * rank that differs from rank 0. */
static mg_status same_plan(mg_pipe *p)
{
    int32_t mine[8 + 4097] = {(int32_t)p->kind, p->P, p->M, p->V, p->S, p->max_batch};
    size_t n = 6 + (size_t)p->S + 1;
    for (int s = 0; s <= p->S; s++) mine[6 + s] = p->first[s];
    int32_t *all = malloc(sizeof *all * n * (size_t)p->P);
    if (!all) return mg_error(MG_ENOMEM, "pipeline: out of memory");
    mg_status st = mg_all_gather(p->g, mine, all, n, MG_I32);
    char a[128], b[128];
    for (int r = 1; r < p->P && !st; r++)
        if (memcmp(all, all + n * (size_t)r, n * sizeof *all))
            st = mg_error(MG_EMISMATCH, "pipeline: %s was given another schedule, micro-batch "
                          "count, batch or cut than %s (%s, %d micro-batches, %d chunks, batch "
                          "%d); give every rank the same", mg_group_rank_name(p->g, r, a, sizeof a),
                          mg_group_rank_name(p->g, 0, b, sizeof b),
                          mg_pipe_name((mg_pipe_kind)all[0]), all[2], all[3], all[5]);
    free(all);
    return st;
}

mg_status mg__pipe_create(mg_group *g, mg_model *m, const mg_pipe_options *o, int max_batch,
                         mg_pipe **out)
{
    *out = NULL;
    int P = mg_group_size(g), V = o->chunks ? o->chunks : 1, nu = mg_model_num_units(m);
    MG_TRY(mg_pipe_check(o->kind, P, o->micro_batches, V));
    int S = P * V;
    if (S > nu)
        return mg_error(MG_EINVAL, "pipeline: %d stages for %s's %d units: a stage is at least "
                        "one unit; use fewer ranks or chunks", S, mg_model_name(m), nu);
    if (max_batch < 1)
        return mg_error(MG_EINVAL, "pipeline: batch size %d must be positive", max_batch);
    mg_pipe *p = calloc(1, sizeof *p);
    if (!p) return mg_error(MG_ENOMEM, "pipeline: out of memory");
    p->g = g;
    p->m = m;
    p->kind = o->kind;
    p->P = P;
    p->M = o->micro_batches;
    p->V = V;
    p->S = S;
    p->rank = mg_group_rank(g);
    p->max_batch = max_batch;
    p->first = calloc((size_t)S + 1, sizeof *p->first);
    p->ch = calloc((size_t)V, sizeof *p->ch);
    double *cost = calloc((size_t)nu, sizeof *cost);
    mg_status st = !p->first || !p->ch || !cost
                       ? mg_error(MG_ENOMEM, "pipeline: out of memory") : MG_OK;
    if (!st && o->first) {
        memcpy(p->first, o->first, sizeof *p->first * ((size_t)S + 1));
        bool ok = p->first[0] == 0 && p->first[S] == nu;
        for (int s = 0; s < S && ok; s++) ok = p->first[s] < p->first[s + 1];
        if (!ok) st = mg_error(MG_EINVAL, "pipeline: the cut does not split %s's %d units "
                               "into %d stages of at least one unit", mg_model_name(m), nu, S);
    } else if (!st) {
        for (int u = 0; u < nu; u++) cost[u] = mg_pipe_unit_cost(m, u);
        st = mg_pipe_balance(cost, nu, S, p->first);
    }
    free(cost);
    if (!st) st = same_plan(p);
    int c, h, w;
    mg_model_input_shape(m, &c, &h, &w);
    p->x_per = (size_t)c * h * w;
    p->y_per = (size_t)mg_model_positions(m);
    size_t M = (size_t)p->M;
    if (!st) {
        p->x = malloc(fl(M * max_batch * p->x_per));
        p->y = malloc(sizeof *p->y * M * max_batch * p->y_per);
        p->n = calloc(M, sizeof *p->n);
        if (!p->x || !p->y || !p->n) st = mg_error(MG_ENOMEM, "pipeline: out of memory");
    }
    for (int k = 0; k < V && !st; k++) {
        chunk *ck = &p->ch[k];
        ck->stage = k * P + p->rank;
        ck->u0 = p->first[ck->stage];
        ck->u1 = p->first[ck->stage + 1];
        ck->in_per = ck->u0 ? mg_model_unit(m, ck->u0 - 1).out_bytes / sizeof(float) : p->x_per;
        ck->out_per = mg_model_unit(m, ck->u1 - 1).out_bytes / sizeof(float);
        ck->mb = calloc(M, sizeof *ck->mb);
        ck->pool = calloc(M, sizeof *ck->pool);
        ck->all = calloc(M, sizeof *ck->all);
        if (!ck->mb || !ck->pool || !ck->all)
            st = mg_error(MG_ENOMEM, "pipeline: out of memory");
        mg_range r = units_range(m, ck->u0, ck->u1);
        if (r.hi > r.lo) p->ranges[p->n_ranges++] = r;
    }
    /* Parameters a unit of this rank borrows from a stage of another
     * rank, and parameters of this rank another rank's unit borrows. */
    for (int u = 0; u < nu && !st; u++) {
        int j = mg_model_unit(m, u).borrows;
        if (j < 0) continue;
        int su = stage_of_unit(p, u) % P, sj = stage_of_unit(p, j) % P;
        if (su == sj || (su != p->rank && sj != p->rank)) continue;
        mg_range r = units_range(m, j, j + 1);
        bool again = false;
        for (int k = 0; k < p->n_ties; k++) again |= p->ties[k].lo == r.lo;
        if (p->n_ties == 8 || again) {
            st = mg_error(MG_EINVAL, "pipeline: %s: at most 8 units may read another rank's "
                          "parameters, and only one each unit's", mg_model_name(m));
            break;
        }
        p->ties[p->n_ties++] = (tie){r.lo, r.hi, su == p->rank ? sj : su, sj == p->rank};
        if (su == p->rank && r.hi > r.lo) p->ranges[p->n_ranges++] = r;
    }
    qsort(p->ranges, (size_t)p->n_ranges, sizeof *p->ranges, cmp_range);
    /* The ranges this rank owns: it counts them in norms and saves them. */
    for (int i = 0; i < p->n_ranges; i++) {
        bool borrowed = false;
        for (int k = 0; k < p->n_ties; k++)
            borrowed |= !p->ties[k].owner && p->ties[k].lo == p->ranges[i].lo;
        if (!borrowed) p->own[p->n_own++] = p->ranges[i];
    }
    /* Stages without parameters (a flatten, a dropout): an empty range,
     * so that the optimizer has one to (not) update. */
    if (!p->n_ranges) p->ranges[p->n_ranges++] = (mg_range){0, 0};
    if (st) {
        mg__pipe_destroy(p);
        return st;
    }
    mg__pipe_release(p);
    *out = p;
    return MG_OK;
}

void mg__pipe_destroy(mg_pipe *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_pend; i++) mg_work_free(p->pend[i]);
    free(p->pend);
    for (int k = 0; p->ch && k < p->V; k++) {
        chunk *ck = &p->ch[k];
        for (int i = 0; i < ck->n_all; i++) {
            mg_tape_destroy(ck->all[i]->t);
            recv_free(ck->all[i]->in);
            free(ck->all[i]);
        }
        free(ck->all);
        free(ck->pool);
        free(ck->mb);
    }
    free(p->ch);
    free(p->first);
    free(p->acts);
    free(p->final_b);
    mg_free(p->host_logits);
    free(p->x);
    free(p->y);
    free(p->n);
    free(p);
}

mg_range mg__pipe_chunk_range(const mg_pipe *p, int i)
{
    return units_range(p->m, p->ch[i].u0, p->ch[i].u1);
}

const mg_range *mg__pipe_ranges(const mg_pipe *p, int *n)
{
    *n = p->n_ranges;
    return p->ranges;
}

const int *mg_pipe_cut(const mg_pipe *p, int *stages)
{
    *stages = p->S;
    return p->first;
}

mg_pipe_stats mg_pipe_get_stats(const mg_pipe *p) { return p->stats; }

/* ---- the parameters this rank keeps ------------------------------------- */

static bool kept(const mg_pipe *p, size_t at, size_t *end)
{
    for (int i = 0; i < p->n_ranges; i++)
        if (p->ranges[i].lo <= at && at < p->ranges[i].hi) {
            *end = p->ranges[i].hi;
            return true;
        }
    *end = mg_model_arena_size(p->m);
    for (int i = 0; i < p->n_ranges; i++)
        if (p->ranges[i].lo > at && p->ranges[i].lo < *end) *end = p->ranges[i].lo;
    return false;
}

void mg__pipe_release(mg_pipe *p)
{
    float *w = mg_model_params(p->m);
    size_t n = mg_model_arena_size(p->m), end;
    for (size_t at = 0; at < n; at = end)
        if (!kept(p, at, &end)) mg_device_discard(mg_model_device(p->m), w + at, fl(end - at));
}

static mg_status gather(mg_pipe *p, bool params)
{
    mg_model *m = p->m;
    float *w = mg_model_params(m), *bf = mg_model_buffers(m);
    for (int s = 0; s < p->S; s++) {
        mg_range r = units_range(m, p->first[s], p->first[s + 1]);
        if (params && r.hi > r.lo)
            MG_TRY(mg_broadcast(p->g, w + r.lo, r.hi - r.lo, MG_F32, s % p->P));
        mg_unit_info a = mg_model_unit(m, p->first[s]);
        size_t blo = a.buf_lo, bhi = a.buf_hi;
        for (int u = p->first[s] + 1; u < p->first[s + 1]; u++) {
            mg_unit_info ui = mg_model_unit(m, u);
            if (ui.buf_hi == ui.buf_lo) continue;
            if (bhi == blo) blo = ui.buf_lo;
            bhi = ui.buf_hi;
        }
        if (bhi > blo) MG_TRY(mg_broadcast(p->g, bf + blo, bhi - blo, MG_F32, s % p->P));
    }
    return MG_OK;
}

mg_status mg__pipe_gather(mg_pipe *p) { return gather(p, true); }
mg_status mg__pipe_gather_buffers(mg_pipe *p) { return gather(p, false); }

/* ---- after the last backward -------------------------------------------- */

mg_status mg__pipe_sum_ties(mg_pipe *p)
{
    float *g = mg_model_grads(p->m);
    mg_device dev = mg_model_device(p->m);
    for (int i = 0; i < p->n_ties; i++) {
        tie *t = &p->ties[i];
        size_t n = t->hi - t->lo;
        float *other = mg_device_alloc(dev, fl(n));
        if (!other) return mg_error(MG_ENOMEM, "pipeline: out of memory");
        mg_status st = mg_sendrecv(p->g, g + t->lo, n, t->peer, 0x7fff0000 + i, other, n,
                                   t->peer, 0x7fff0000 + i, MG_F32);
        if (st) {
            mg_device_free(dev, other);
            char why[1024], a[128], b[128];
            snprintf(why, sizeof why, "%s", mg_last_error());
            return mg_error(st, "pipeline: summing the gradients of the parameters tied "
                            "across %s and %s: %s", mg_group_rank_name(p->g, p->rank, a, sizeof a),
                            mg_group_rank_name(p->g, t->peer, b, sizeof b), why);
        }
        st = mg_add_into_on(dev, g + t->lo, other, n);
        mg_device_free(dev, other);
        MG_TRY(st);
    }
    return MG_OK;
}

const mg_range *mg__pipe_own_ranges(const mg_pipe *p, int *n)
{
    *n = p->n_own;
    return p->own;
}

/* ---- the executor --------------------------------------------------------- */

static mg_status wait_sends(mg_pipe *p)
{
    mg_status st = MG_OK;
    for (int i = 0; i < p->n_pend; i++) {
        mg_status e = mg_work_wait(p->pend[i], -1);
        if (!st) st = e;
        mg_work_free(p->pend[i]);
    }
    p->n_pend = 0;
    for (int k = 0; k < p->V; k++)
        for (int i = 0; i < p->ch[k].n_all; i++) p->ch[k].all[i]->sending = false;
    return st;
}

static void give_back(mg_pipe *p, chunk *ck, int mb, bool sending)
{
    flight *f = ck->mb[mb];
    p->held--;
    f->sending = sending;
    ck->pool[ck->n_free++] = f;
    ck->mb[mb] = NULL;
}

/* A free tape (and input buffer) of chunk ck for micro-batch mb; one is
 * made when none is free (the pool grows to the schedule's peak). */
static mg_status take(mg_pipe *p, chunk *ck, int mb)
{
    if (ck->mb[mb]) return MG_OK;
    flight *f = NULL;
    if (ck->n_free) {
        f = ck->pool[--ck->n_free];
        /* The model moved (a checkpoint goes through the host): a new tape. */
        if (mg_tape_stale(f->t)) {
            size_t was = mg_tape_bytes(f->t);
            mg_tape_destroy(f->t);
            f->t = NULL;
            mg_status st = mg_tape_create_range(p->m, p->max_batch, ck->u0, ck->u1, &f->t);
            if (st) {
                ck->pool[ck->n_free++] = f;   /* destroy finds it there */
                return st;
            }
            p->stats.activation_bytes += mg_tape_bytes(f->t) - was;
        }
    } else {
        if (ck->n_all == p->M) return mg_error(MG_EINVAL, "pipeline: stage %d has more than "
                                               "%d micro-batches in flight", ck->stage, p->M);
        f = calloc(1, sizeof *f);
        if (!f) return mg_error(MG_ENOMEM, "pipeline: out of memory");
        mg_status st = mg_tape_create_range(p->m, p->max_batch, ck->u0, ck->u1, &f->t);
        if (!st && ck->stage > 0) st = recv_ready(p, &f->in, (size_t)p->max_batch * ck->in_per);
        if (st) {
            mg_tape_destroy(f->t);
            free(f);
            return st;
        }
        ck->all[ck->n_all++] = f;
        /* Tapes are only ever added: the total is the peak. */
        p->stats.activation_bytes += mg_tape_bytes(f->t) +
                                     (f->in ? fl((size_t)p->max_batch * ck->in_per) : 0);
    }
    ck->mb[mb] = f;
    if (++p->held > p->stats.peak_in_flight) p->stats.peak_in_flight = p->held;
    return MG_OK;
}


static int tag_of(const mg_pipe *p, bool fwd, int stage, int mb)
{
    return ((fwd ? 0 : 1) * p->S + stage) * p->M + mb;
}

static const char *op_words(mg_pipe_op op)
{
    switch (op) {
    case MG_PIPE_SEND_F: return "sending activations to";
    case MG_PIPE_RECV_F: return "receiving activations from";
    case MG_PIPE_SEND_B: return "sending gradients to";
    case MG_PIPE_RECV_B: return "receiving gradients from";
    default: return "?";
    }
}

/* One batch on every rank: a float each way with the ranks before and
 * after it (round the ring for interleaved, whose last stage sends to
 * rank 0), on the model's device, so that every link NCCL makes lazily is
 * made at once (see the top). Ties exchange in batches of both ways. */
static mg_status link_peers(mg_pipe *p)
{
    mg_device dev = mg_model_device(p->m);
    float *b = mg_device_alloc(dev, fl(4));
    if (!b) return mg_error(MG_ENOMEM, "pipeline: out of memory");
    int next = (p->rank + 1) % p->P, prev = (p->rank + p->P - 1) % p->P, tag = 2 * p->S * p->M;
    bool ring = p->V > 1;
    mg_p2p_op ops[4];
    int n = 0;
    if (ring || p->rank + 1 < p->P) {
        ops[n++] = (mg_p2p_op){MG_COLL_SEND, b, 1, MG_F32, next, tag};
        ops[n++] = (mg_p2p_op){MG_COLL_RECV, b + 1, 1, MG_F32, next, tag};
    }
    if ((ring || p->rank > 0) && (prev != next || !n)) {
        ops[n++] = (mg_p2p_op){MG_COLL_SEND, b + 2, 1, MG_F32, prev, tag};
        ops[n++] = (mg_p2p_op){MG_COLL_RECV, b + 3, 1, MG_F32, prev, tag};
    }
    mg_work *w = NULL;
    mg_status st = mg_batch_isend_irecv(p->g, ops, n, &w);
    if (!st) st = mg_work_wait(w, -1);
    mg_work_free(w);
    mg_device_free(dev, b);
    if (st) return mg_error(st, "pipeline: linking rank %d with its neighbours: %s", p->rank,
                            mg_last_error());
    p->linked = true;
    return MG_OK;
}

/* Posts the pending sends and receives as one batch; waits for it when
 * it receives. A failure names the stages and the micro-batch. */
static mg_status post(mg_pipe *p, mg_p2p_op *ops, const mg_pipe_action *why, int n)
{
    if (!n) return MG_OK;
    bool recv = false;
    for (int i = 0; i < n; i++) recv |= ops[i].coll == MG_COLL_RECV;
    if (p->n_pend == p->cap_pend) {
        int cap = p->cap_pend ? 2 * p->cap_pend : 16;
        mg_work **w = realloc(p->pend, sizeof *w * (size_t)cap);
        if (!w) return mg_error(MG_ENOMEM, "pipeline: out of memory");
        p->pend = w;
        p->cap_pend = cap;
    }
    double t0 = mg_trace_on() ? mg_trace_now() : 0;
    mg_work *w = NULL;
    p->stats.batches++;
    mg_status st = mg_batch_isend_irecv(p->g, ops, n, &w);
    if (!st && recv) {
        st = mg_work_wait(w, -1);
        mg_work_free(w);
    } else if (!st) {
        p->pend[p->n_pend++] = w;
    }
    if (t0) {
        char name[64] = "", one[24];
        for (int i = 0; i < n; i++) {
            mg_pipe_action_str(&why[i], one, sizeof one);
            snprintf(name + strlen(name), sizeof name - strlen(name), "%s%s", i ? " " : "", one);
        }
        mg_trace_event(name, recv ? "pp wait" : "pp send", 1, t0, mg_trace_now());
    }
    if (st) {
        /* The transfer waited for (a receive) names the stages. */
        const mg_pipe_action *a = &why[0];
        for (int i = n - 1; i >= 0; i--)
            if (why[i].op == MG_PIPE_RECV_F || why[i].op == MG_PIPE_RECV_B) a = &why[i];
        int other = mg_pipe_peer_stage(a);
        /* This rank is named once: the group's message names it too. */
        char why_s[1024], me[128], peer[128];
        snprintf(why_s, sizeof why_s, "%s",
                 mg_error_past_rank(mg_last_error(), mg_group_world_rank(p->g, p->rank)));
        return mg_error(st, "pipeline stage %d on %s, micro-batch %d, %s stage %d on %s: %s",
                        a->stage, mg_group_rank_name(p->g, p->rank, me, sizeof me), a->mb,
                        op_words(a->op), other,
                        mg_group_rank_name(p->g, other % p->P, peer, sizeof peer), why_s);
    }
    return MG_OK;
}

static mg_status run(mg_pipe *p, mg_batch_source next, void *ud, int max_micro, bool fwd_only,
                     mg_step_result *r);

/* The rank's list for count micro-batches (mg_pipe_lower_step, whose
 * lists the simulators check with and without backwards). */
static mg_status lowered(mg_pipe *p, int count, bool fwd_only)
{
    if (p->acts_for == 2 * count + fwd_only) return MG_OK;
    int kept = mg_pipe_lower_step(p->kind, p->P, count, p->V, p->rank, fwd_only, NULL, 0);
    mg_pipe_action *a = realloc(p->acts, sizeof *a * (size_t)(kept ? kept : 1));
    if (!a) return mg_error(MG_ENOMEM, "pipeline: out of memory");
    mg_pipe_lower_step(p->kind, p->P, count, p->V, p->rank, fwd_only, a, kept);
    p->acts = a;
    bool *final = realloc(p->final_b, sizeof *final * (size_t)(kept ? kept : 1));
    bool *seen = calloc((size_t)p->S, sizeof *seen);
    if (!final || !seen) {
        free(seen);
        if (final) p->final_b = final;
        p->acts_for = 0;
        return mg_error(MG_ENOMEM, "pipeline: out of memory");
    }
    for (int i = kept - 1; i >= 0; i--) {
        final[i] = a[i].op == MG_PIPE_B && !seen[a[i].stage];
        if (a[i].op == MG_PIPE_B) seen[a[i].stage] = true;
    }
    free(seen);
    p->final_b = final;
    p->n_acts = kept;
    p->acts_for = 2 * count + fwd_only;
    return MG_OK;
}

mg_status mg__pipe_step(mg_pipe *p, mg_batch_source next, void *ud, int max_micro,
                       mg_step_result *r)
{
    return run(p, next, ud, max_micro, false, r);
}

mg_status mg__pipe_forward(mg_pipe *p, mg_batch_source next, void *ud, int max_micro,
                          mg_step_result *r)
{
    return run(p, next, ud, max_micro, true, r);
}

/* On a device, or split over a tensor-parallel group (whose ranks
 * gather them), a copy in host memory. */
const float *mg__pipe_logits(mg_pipe *p)
{
    int split = mg_model_tp(p->m).size;
    if (!p->logits || (mg_model_device(p->m).kind == MG_DEVICE_CPU && split == 1))
        return p->logits ? mg_tape_logits(p->logits) : NULL;
    if (!p->host_logits) {
        chunk *ck = &p->ch[(p->S - 1) / p->P];
        if (!(p->host_logits = mg_alloc(fl((size_t)p->max_batch * ck->out_per * split)))) {
            mg_error(MG_ENOMEM, "pipeline: out of memory for the logits");
            return NULL;
        }
    }
    mg_tape_logits_to_host(p->logits, p->host_logits);
    return p->host_logits;
}

/* A step's forwards and backwards, or (fwd_only) its forwards alone:
 * each tape goes back once its output is sent, and the last stage's
 * logits stay until the next run. */
static mg_status run(mg_pipe *p, mg_batch_source next, void *ud, int max_micro, bool fwd_only,
                     mg_step_result *r)
{
    mg_model *m = p->m;
    int count = 0;
    mg_micro_batch b;
    memset(r, 0, sizeof *r);
    while (count < max_micro && count < p->M && next(ud, &b)) {
        if (b.n < 1 || b.n > p->max_batch)
            return mg_error(MG_EINVAL, "pipeline: micro-batch %d has %d samples; the "
                            "pipeline was made for 1 to %d", count, b.n, p->max_batch);
        size_t k = (size_t)count * p->max_batch;
        memcpy(p->x + k * p->x_per, b.x, fl((size_t)b.n * p->x_per));
        memcpy(p->y + k * p->y_per, b.y, sizeof *p->y * (size_t)b.n * p->y_per);
        p->n[count++] = b.n;
        if (b.last) break;
    }
    r->micro = count;
    if (!count) return MG_OK;
    if (!p->linked) MG_TRY(link_peers(p));
    MG_TRY(lowered(p, count, fwd_only));
    uint64_t base = mg_model_rng_counter(m);
    bool training = mg_model_training(m);
    p->logits = NULL;
    double loss = 0;
    long correct = 0, samples = 0;
    mg_p2p_op ops[MG_PIPE_BATCH_MAX];
    mg_pipe_action why[MG_PIPE_BATCH_MAX];
    int nops = 0;
    double t_step = mg_trace_now(), busy = 0;
    mg_status st = MG_OK;
    for (int i = 0; i < p->n_acts && !st; i++) {
        const mg_pipe_action *a = &p->acts[i];
        chunk *ck = &p->ch[a->stage / p->P];
        int mb = a->mb, n = p->n[mb];
        bool last = a->stage == p->S - 1;
        flight *f = ck->mb[mb];
        if (a->op != MG_PIPE_F && a->op != MG_PIPE_B) {
            MG_ASSERT(nops < MG_PIPE_BATCH_MAX);
            bool fwd = a->op == MG_PIPE_SEND_F || a->op == MG_PIPE_RECV_F;
            int peer_stage = mg_pipe_peer_stage(a);
            bool sends = a->op == MG_PIPE_SEND_F || a->op == MG_PIPE_SEND_B;
            int tag_stage = sends ? a->stage : peer_stage;   /* the sender's */
            mg_p2p_op o = {.dtype = MG_F32, .peer = peer_stage % p->P,
                           .tag = tag_of(p, fwd, tag_stage, mb)};
            switch (a->op) {
            case MG_PIPE_RECV_F:
                if ((st = take(p, ck, mb))) break;
                if ((st = recv_ready(p, &ck->mb[mb]->in, (size_t)p->max_batch * ck->in_per)))
                    break;
                o.coll = MG_COLL_RECV;
                o.buf = ck->mb[mb]->in;
                o.count = (size_t)n * ck->in_per;
                break;
            case MG_PIPE_SEND_F:
                o.coll = MG_COLL_SEND;
                o.count = (size_t)n * ck->out_per;
                o.buf = (void *)mg_tape_logits(f->t);
                /* Forward only: done with it (the next forward on it
                 * first waits for the send). */
                if (fwd_only) give_back(p, ck, mb, true);
                break;
            case MG_PIPE_RECV_B:
                MG_ASSERT(f);   /* after its forward (mg_pipe_run checks the lists) */
                o.coll = MG_COLL_RECV;
                o.buf = mg_tape_output_grad(f->t);
                o.count = (size_t)n * ck->out_per;
                break;
            default:
                /* SEND_B: the tape goes back to the pool at once. Its input
                 * gradient, which the send reads, is written only by a
                 * backward: the next one on it first waits for the send. */
                o.coll = MG_COLL_SEND;
                o.count = (size_t)n * ck->in_per;
                o.buf = (void *)mg_tape_input_grad(f->t);
                give_back(p, ck, mb, true);
                break;
            }
            if (st) break;
            why[nops] = *a;
            ops[nops++] = o;
            continue;
        }
        st = post(p, ops, why, nops);
        nops = 0;
        if (st) break;
        double t0 = mg_trace_now();
        if (a->op == MG_PIPE_F) {
            if ((st = take(p, ck, mb))) break;
            f = ck->mb[mb];
            if (f->sending && fwd_only && (st = wait_sends(p))) break;
            const float *in = ck->stage == 0 ? p->x + (size_t)mb * p->max_batch * p->x_per
                                             : f->in;
            if (training) mg_tape_pin_step(f->t, base + (uint64_t)mb);
            if (!mg_tape_forward(f->t, in, n)) {
                st = MG_ENOMEM;
                break;
            }
            if (last) {
                int c = 0;
                float l = mg_tape_loss(f->t, p->y + (size_t)mb * p->max_batch * p->y_per, &c);
                loss += (double)l * n;
                correct += c;
                samples += n;
                p->logits = f->t;
                if (fwd_only) give_back(p, ck, mb, false);
            }
        } else {
            MG_ASSERT(f);
            if (f->sending && (st = wait_sends(p))) break;
            if (p->before_backward) p->before_backward(p->bb_ud, p->final_b[i]);
            if (last) mg_tape_backward(f->t);
            else mg_tape_backward_from(f->t, mg_tape_output_grad(f->t));
            p->cur_chunk = (int)(ck - p->ch);
            if (p->after_backward && (st = p->after_backward(p->bb_ud))) break;
            if (ck->stage == 0) give_back(p, ck, mb, false);
        }
        double t1 = mg_trace_now();
        busy += t1 - t0;
        if (mg_trace_on()) {
            char name[64];
            snprintf(name, sizeof name, "stage %d %s mb %d", a->stage,
                     a->op == MG_PIPE_F ? "F" : "B", mb);
            mg_trace_event(name, a->op == MG_PIPE_F ? "pp forward" : "pp backward",
                           0, t0, t1);
        }
    }
    if (!st) st = post(p, ops, why, nops);
    mg_status e = wait_sends(p);
    if (!st) st = e;
    if (st) return st;
    if (training) mg_model_set_rng_counter(m, base + (uint64_t)count);
    /* The last stage's figures reach every stage. */
    double v[3] = {loss, (double)correct, (double)samples};
    MG_TRY(mg_all_reduce(p->g, v, v, 3, MG_F64, MG_SUM));
    /* Until every stage is done (the all-reduce's end): a stage that
     * finishes early waits for the others as the schedule's makespan
     * counts it. */
    double t_end = mg_trace_now();
    if (!fwd_only) {
        p->stats.steps++;
        p->stats.busy_us += busy;
        p->stats.step_us += t_end - t_step;
        mg_trace_event("pipeline step", "pp step", 2, t_step, t_end);
    }
    r->loss_sum = v[0];
    r->correct = (long)v[1];
    r->samples = (long)v[2];
    return MG_OK;
}
