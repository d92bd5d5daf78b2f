/* Pipeline parallelism, the executor (the pipe itself: pipeline.c). Each
 * micro-batch runs on a tape of its stage's units alone, one tape per
 * micro-batch in flight (a pool per chunk that grows to the schedule's
 * peak: GPipe's M, 1F1B's P - rank), with its own buffer for the input it
 * receives; its output's gradient is received straight into its tape
 * (mg_tape_output_grad), so interleaved may receive one a few backwards
 * early.
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
#include "parallel/pipeline_internal.h"
#include "multigrad/trace.h"

/* *b holds `floats` on the model's device (made there, or moved when
 * the model moved). */
static mg_status recv_ready(const mg_pipe *p, float **b, size_t floats)
{
    mg_device want = mg_model_device(p->m), at = mg_device_of(*b);
    if (*b && at.kind == want.kind && at.index == want.index) return MG_OK;
    if (*b) mg_device_free(at, *b);
    *b = mg_device_alloc(want, mg__pipe_fl(floats));
    return *b ? MG_OK : mg_error(MG_ENOMEM, "pipeline: out of memory for a receive buffer");
}

static void recv_free(float *b)
{
    if (b) mg_device_free(mg_device_of(b), b);
}

void mg__pipe_exec_free(mg_pipe *p)
{
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
    mg_free(p->host_logits);
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
                                     (f->in ? mg__pipe_fl((size_t)p->max_batch * ck->in_per) : 0);
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
    float *b = mg_device_alloc(dev, mg__pipe_fl(4));
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
        if (!(p->host_logits = mg_alloc(mg__pipe_fl((size_t)p->max_batch * ck->out_per * split)))) {
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
    while (count < max_micro && count < p->M && mg__next_micro(next, ud, &b)) {
        MG_TRY(mg__micro_check(fwd_only ? "mg_strategy_evaluate" : "mg_train_step", &b, m));
        if (b.n > p->max_batch)
            return mg_error(MG_EINVAL, "pipeline: micro-batch %d has %d samples; the "
                            "pipeline was made for 1 to %d", count, b.n, p->max_batch);
        size_t k = (size_t)count * p->max_batch;
        memcpy(p->x + k * p->x_per, b.x, mg__pipe_fl((size_t)b.n * p->x_per));
        memcpy(p->y + k * p->y_per, b.y, sizeof *p->y * (size_t)b.n * p->y_per);
        p->w[count] = mg__weighed(&b) ? b.weight : 1;
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
                if (p->w[mb] != 1) mg_tape_weigh_loss(f->t, p->w[mb]);
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
