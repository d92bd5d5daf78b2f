/* DataParallel: one process, several threads on one model, as
 * torch.nn.DataParallel does on several devices of one machine: scatter
 * the batch, apply the model in parallel (each thread forward, loss and
 * backward on its own tape into its own gradient arena), gather the
 * losses and reduce the gradients onto the model's, weighting each by its
 * share of the batch so the result equals one process on the whole batch.
 * The reduce adds to the model's gradients, as a backward does, so
 * micro-batches accumulate. The caller steps the optimizer on the model.
 *
 * The threads share the parameters (they only read them), so nothing is
 * replicated; what a forward writes goes to the thread's tape, gradient
 * arena and, for threads after the first, a copy of the buffers (batch-
 * norm running statistics stay the first thread's, as torch keeps device
 * 0's). Compared with DDP this keeps one optimizer and pays a reduce over
 * all parameters every step, serialised on one thread — the design
 * difference the PyTorch tutorials point out. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"

typedef struct {
    mg_tape *t;
    float *grads;     /* this thread's gradient arena */
    float *buffers;   /* threads after the first: their copy of the buffers */
    const void *x;    /* the model's input: floats, or int32 tokens (4 bytes each too) */
    const int32_t *y;
    float *xb;        /* --deterministic: its shard's input and labels, copied */
    int32_t *yb;
    int n;            /* samples of this thread this step */
    uint64_t step;    /* where its forward draws dropout */
    float loss;
    int correct;
    /* A failed forward: the message is per thread, so it is kept here for
     * the main thread. */
    mg_status st;
    char err[512];
} worker;

struct mg_dp {
    mg_model *m;
    bool own;          /* made by mg_dp_create(_with): destroyed with it */
    int workers;
    worker *w;
    pthread_t *threads;
    int started;       /* threads 1..started are running */
    /* Step hand-off: the main thread bumps gen; each thread applies the
     * model once per generation and the last one to finish signals. */
    pthread_mutex_t mu;
    pthread_cond_t go, fin;
    unsigned gen;
    int pending;
    bool stop;
    size_t in;         /* input elements (4 bytes) per sample */
    int positions;     /* labels per sample (a language model: T) */
};

static void apply(worker *r, uint64_t step)
{
    size_t n = mg_model_arena_size(mg_tape_model(r->t));
    memset(r->grads, 0, n * sizeof(float));
    r->loss = 0;
    r->correct = 0;
    r->st = MG_OK;
    if (r->n == 0) return;
    mg_tape_pin_step(r->t, step);
    if (!mg_tape_forward(r->t, (const float *)r->x, r->n)) {
        r->st = MG_EINVAL;
        snprintf(r->err, sizeof r->err, "%s", mg_last_error());
        return;
    }
    r->loss = mg_tape_loss(r->t, r->y, &r->correct);
    mg_tape_backward(r->t);
}

typedef struct { mg_dp *dp; int k; } thread_arg;

static void *thread_main(void *p)
{
    thread_arg a = *(thread_arg *)p;
    free(p);
    mg_dp *dp = a.dp;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&dp->mu);
        while (dp->gen == seen && !dp->stop) pthread_cond_wait(&dp->go, &dp->mu);
        if (dp->stop) {
            pthread_mutex_unlock(&dp->mu);
            return NULL;
        }
        seen = dp->gen;
        pthread_mutex_unlock(&dp->mu);
        apply(&dp->w[a.k], dp->w[a.k].step);
        pthread_mutex_lock(&dp->mu);
        if (--dp->pending == 0) pthread_cond_signal(&dp->fin);
        pthread_mutex_unlock(&dp->mu);
    }
}

/* Each thread's tape for `per` samples: all made, or none changed. */
static mg_status make_tapes(mg_dp *dp, int per)
{
    mg_tape **t = calloc((size_t)dp->workers, sizeof *t);
    if (!t) return mg_error(MG_ENOMEM, "dp: out of memory");
    mg_status st = MG_OK;
    for (int k = 0; k < dp->workers && !st; k++) st = mg_tape_create(dp->m, per, &t[k]);
    for (int k = 0; k < dp->workers; k++) {
        if (st) {
            mg_tape_destroy(t[k]);
            continue;
        }
        mg_tape_destroy(dp->w[k].t);
        dp->w[k].t = t[k];
        mg_tape_set_grads(t[k], dp->w[k].grads);
        mg_tape_set_buffers(t[k], dp->w[k].buffers);
    }
    free(t);
    if (st) return mg_error(st, "DataParallel threads: %s", mg_last_error());
    return MG_OK;
}

/* Tapes for n samples: made again when n outgrows them or the model's
 * layout changed (then at their capacity, at least n). */
static mg_status fit_tapes(mg_dp *dp, int n)
{
    int cap = mg_tape_capacity(dp->w[0].t);
    return n > cap || mg_tape_stale(dp->w[0].t) ? make_tapes(dp, n > cap ? n : cap) : MG_OK;
}

mg_status mg_dp_wrap(mg_model *m, int workers, int max_batch, mg_dp **out)
{
    *out = NULL;
    if (workers < 1)
        return mg_error(MG_EINVAL, "DataParallel needs at least 1 worker (got %d)", workers);
    if (max_batch < 1)
        return mg_error(MG_EINVAL, "DataParallel: batch size %d must be positive", max_batch);
    if (mg_model_num_hooks(m))
        return mg_error(MG_EINVAL, "DataParallel: model '%s' has unit hooks (another strategy's?), "
                        "which its threads would call at once; give it a model of its own",
                        mg_model_name(m));
    mg_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return mg_error(MG_ENOMEM, "dp: out of memory");
    dp->m = m;
    dp->workers = workers;
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->go, NULL);
    pthread_cond_init(&dp->fin, NULL);
    dp->w = calloc((size_t)workers, sizeof *dp->w);
    dp->threads = calloc((size_t)workers, sizeof *dp->threads);
    if (!dp->w || !dp->threads) {
        mg_dp_destroy(dp);
        return mg_error(MG_ENOMEM, "dp: out of memory");
    }
    size_t n = mg_model_arena_size(m), nb = mg_model_buffer_size(m);
    for (int k = 0; k < workers; k++) {
        dp->w[k].grads = mg_alloc_zero(n * sizeof(float));
        if (k > 0 && nb) dp->w[k].buffers = mg_alloc(nb * sizeof(float));
        if (!dp->w[k].grads || (k > 0 && nb && !dp->w[k].buffers)) {
            mg_dp_destroy(dp);
            return mg_error(MG_ENOMEM, "dp: cannot allocate gradients for %d threads", workers);
        }
    }
    mg_status st = make_tapes(dp, (max_batch + workers - 1) / workers);
    if (st) {
        mg_dp_destroy(dp);
        return st;
    }
    int c, h, w;
    mg_model_input_shape(m, &c, &h, &w);
    dp->in = (size_t)c * h * w;
    dp->positions = mg_model_positions(m);
    for (int k = 1; k < workers; k++) {
        thread_arg *a = malloc(sizeof *a);
        if (a) *a = (thread_arg){dp, k};
        if (!a || pthread_create(&dp->threads[k], NULL, thread_main, a)) {
            free(a);
            mg_dp_destroy(dp);
            return mg_error(MG_ENOMEM, "dp: cannot start worker thread %d", k);
        }
        dp->started = k;
    }
    *out = dp;
    return MG_OK;
}

typedef struct { const char *name; uint64_t seed; } zoo_model;

static mg_status make_zoo_model(void *ud, mg_model **out)
{
    const zoo_model *z = ud;
    return mg_model_create(z->name, z->seed, out);
}

mg_status mg_dp_create(const char *model, uint64_t seed, int workers, int max_batch,
                       mg_dp **out)
{
    zoo_model z = {model, seed};
    return mg_dp_create_with(make_zoo_model, &z, workers, max_batch, out);
}

mg_status mg_dp_create_with(mg_model_factory make, void *ud, int workers, int max_batch,
                            mg_dp **out)
{
    *out = NULL;
    mg_model *m;
    MG_TRY(make(ud, &m));
    mg_status st = mg_dp_wrap(m, workers, max_batch, out);
    if (st) mg_model_destroy(m);
    else (*out)->own = true;
    return st;
}

void mg_dp_destroy(mg_dp *dp)
{
    if (!dp) return;
    pthread_mutex_lock(&dp->mu);
    dp->stop = true;
    pthread_cond_broadcast(&dp->go);
    pthread_mutex_unlock(&dp->mu);
    for (int k = 1; k <= dp->started; k++) pthread_join(dp->threads[k], NULL);
    for (int k = 0; dp->w && k < dp->workers; k++) {
        mg_tape_destroy(dp->w[k].t);
        mg_free(dp->w[k].grads);
        mg_free(dp->w[k].buffers);
        free(dp->w[k].xb);
        free(dp->w[k].yb);
    }
    if (dp->own) mg_model_destroy(dp->m);
    pthread_mutex_destroy(&dp->mu);
    pthread_cond_destroy(&dp->go);
    pthread_cond_destroy(&dp->fin);
    free(dp->w);
    free(dp->threads);
    free(dp);
}

mg_model *mg_dp_model(mg_dp *dp) { return dp->m; }
int mg_dp_workers(const mg_dp *dp) { return dp->workers; }

/* Parallel apply: each thread its share (the first on this thread);
 * every thread draws dropout at the model's position, which then moves on
 * once (pinned: at the positions the caller gave each, the model's left
 * alone). A failed thread's error, the gradients left as they were. */
static mg_status run_threads(mg_dp *dp, bool pinned)
{
    mg_model *m = dp->m;
    uint64_t step = mg_model_rng_counter(m);
    for (int k = 0; k < dp->workers && !pinned; k++) dp->w[k].step = step;
    pthread_mutex_lock(&dp->mu);
    dp->pending = dp->workers - 1;
    dp->gen++;
    pthread_cond_broadcast(&dp->go);
    pthread_mutex_unlock(&dp->mu);
    apply(&dp->w[0], dp->w[0].step);
    pthread_mutex_lock(&dp->mu);
    while (dp->pending > 0) pthread_cond_wait(&dp->fin, &dp->mu);
    pthread_mutex_unlock(&dp->mu);
    if (mg_model_training(m) && !pinned) mg_model_set_rng_counter(m, step + 1);
    for (int k = 0; k < dp->workers; k++)
        if (dp->w[k].st)
            return mg_error(dp->w[k].st, "DataParallel thread %d: %s", k, dp->w[k].err);
    return MG_OK;
}

/* As mg_dp_forward_backward, the gradients times the micro-batch's weight
 * in its step (mg_micro_batch; 1: as they are). */
static mg_status forward_backward(mg_dp *dp, const void *x, const int32_t *y, int batch,
                                  float weight, float *loss, int *correct)
{
    MG_ASSERT(batch > 0);
    int W = dp->workers;
    mg_model *m = dp->m;
    size_t n = mg_model_arena_size(m), nb = mg_model_buffer_size(m);
    /* scatter: contiguous chunks, as torch's scatter along dim 0 */
    int per = (batch + W - 1) / W, off = 0;
    MG_TRY(fit_tapes(dp, per));
    for (int k = 0; k < W; k++) {
        int len = batch - off < per ? batch - off : per;
        if (len < 0) len = 0;
        dp->w[k].x = (const char *)x + (size_t)off * dp->in * 4;
        dp->w[k].y = y + (size_t)off * dp->positions;
        dp->w[k].n = len;
        off += len;
        if (k > 0 && nb) memcpy(dp->w[k].buffers, mg_model_buffers(m), nb * sizeof(float));
    }
    MG_TRY(run_threads(dp, false));
    /* gather and reduce onto the model's gradients, weighted by batch
     * share, on top of what they held */
    float l = 0;
    int cor = 0;
    float *g = mg_model_grads(m);
    for (int k = 0; k < W; k++) {
        l += dp->w[k].loss * (float)dp->w[k].n / (float)batch;
        cor += dp->w[k].correct;
        if (dp->w[k].n == 0) continue;
        const float *gk = dp->w[k].grads;
        float wk = (float)dp->w[k].n / (float)batch;
        if (weight != 1) wk *= weight;
        for (size_t i = 0; i < n; i++) g[i] += wk * gk[i];
    }
    if (loss) *loss = l;
    if (correct) *correct = cor;
    return MG_OK;
}

mg_status mg_dp_forward_backward(mg_dp *dp, const void *x, const int32_t *y, int batch,
                                 float *loss, int *correct)
{
    return forward_backward(dp, x, y, batch, 1, loss, correct);
}

/* ---- as a strategy's component: the threads run each micro-batch ------- */

static mg_status dp_attach(mg_strategy *s, void **state)
{
    const mg_strategy_options *o = mg_strategy_options_of(s);
    mg_model *m = mg_strategy_model(s);
    if (mg_model_device(m).kind != MG_DEVICE_CPU)
        return mg_error(MG_EUNSUPPORTED, "strategy dp (threads sharing one model) does not run "
                        "on a device; use ddp, which runs one process per GPU, or --device cpu");
    return mg_dp_wrap(m, o->workers, o->max_batch, (mg_dp **)state);
}

static void dp_destroy(void *c) { mg_dp_destroy(c); }

static mg_status dp_micro(void *c, const mg_micro_batch *b, float *loss, int *correct)
{
    return forward_backward(c, b->x, b->y, b->n, mg__weighed(b) ? b->weight : 1, loss, correct);
}

const mg_component_ops mg__dp_component = {
    .name = "dp", .attach = dp_attach, .destroy = dp_destroy, .run_micro = dp_micro,
};

/* ---- --deterministic: the threads take whole virtual shards -------------
 * Each thread runs one shard (a micro-batch of the trainer's, its rows
 * copied, for the source reuses its buffers) on its own tape, in rounds of
 * as many shards as threads; the shards' gradients go into det.c's tree in
 * their order, so the sum is the one process's, and any number of threads
 * gives the same bits. Drives the step (run_step) in the strategy's
 * deterministic mode; drops itself otherwise. */

typedef struct {
    mg_dp *dp;
    void *det;
    int cap;            /* rows each worker's shard buffers hold */
    mg_range tie;       /* borrowed parameters kept apart (det.c's) */
    float **part;       /* each worker's gradients of them */
} dp_det;

static mg_status dp_det_attach(mg_strategy *s, void **state)
{
    if (!mg_strategy_options_of(s)->det_shards) return MG_OK;
    dp_det *q = calloc(1, sizeof *q);
    if (!q) return mg_error(MG_ENOMEM, "dp: out of memory");
    q->dp = mg_strategy_part(s, &mg__dp_component);
    q->det = mg_strategy_part(s, &mg__det_component);
    MG_ASSERT(q->dp && q->det);
    *state = q;
    q->tie = mg__det_tie(q->det);
    size_t tn = q->tie.hi - q->tie.lo;
    if (!tn) return MG_OK;
    q->part = calloc((size_t)q->dp->workers, sizeof *q->part);
    for (int k = 0; q->part && k < q->dp->workers; k++)
        if (!(q->part[k] = mg_alloc(tn * sizeof(float)))) break;
    if (!q->part || !q->part[q->dp->workers - 1])
        return mg_error(MG_ENOMEM, "dp: out of memory for the tied gradients");
    return MG_OK;
}

static void dp_det_destroy(void *c)
{
    dp_det *q = c;
    for (int k = 0; q->part && k < q->dp->workers; k++) mg_free(q->part[k]);
    free(q->part);
    free(q);
}

/* Worker k's copy of shard b. */
static mg_status take_shard(dp_det *q, int k, const mg_micro_batch *b)
{
    mg_dp *dp = q->dp;
    worker *w = &dp->w[k];
    if (b->n > q->cap) {   /* the shards of a run are all the same size */
        for (int i = 0; i < dp->workers; i++) {
            free(dp->w[i].xb);
            free(dp->w[i].yb);
            dp->w[i].xb = malloc((size_t)b->n * dp->in * 4);
            dp->w[i].yb = malloc((size_t)b->n * dp->positions * sizeof(int32_t));
            if (!dp->w[i].xb || !dp->w[i].yb)
                return mg_error(MG_ENOMEM, "dp: out of memory for shards of %d rows", b->n);
        }
        q->cap = b->n;
    }
    MG_TRY(fit_tapes(dp, b->n));
    memcpy(w->xb, b->x, (size_t)b->n * dp->in * 4);
    memcpy(w->yb, b->y, (size_t)b->n * dp->positions * sizeof(int32_t));
    w->x = w->xb;
    w->y = w->yb;
    w->n = b->n;
    return MG_OK;
}

static mg_status dp_det_run_step(void *c, mg_batch_source next, void *ud, int max_micro,
                                 mg_step_result *r)
{
    dp_det *q = c;
    mg_dp *dp = q->dp;
    size_t nb = mg_model_buffer_size(dp->m);
    bool more = true;
    while (more && r->micro < max_micro) {
        int k = 0;
        mg_micro_batch b;
        while (k < dp->workers && r->micro + k < max_micro && mg__next_micro(next, ud, &b)) {
            MG_TRY(mg__micro_check("mg_train_step", &b, dp->m));
            MG_TRY(take_shard(q, k++, &b));
            if (b.last) break;
        }
        more = k == dp->workers;
        if (!k) break;
        uint64_t at = mg_model_rng_counter(dp->m);   /* the next shard's (det.c sets it) */
        for (int i = 0; i < dp->workers; i++) {
            dp->w[i].step = at + (uint64_t)i;   /* dropout keyed by the shard */
            if (i >= k) dp->w[i].n = 0;
            if (i > 0 && nb) memcpy(dp->w[i].buffers, mg_model_buffers(dp->m), nb * sizeof(float));
            if (q->part) {   /* the tapes are made again when shards grow */
                memset(q->part[i], 0, (q->tie.hi - q->tie.lo) * sizeof(float));
                mg_tape_set_borrowed_grads(dp->w[i].t, q->tie.lo, q->tie.hi, q->part[i]);
            }
        }
        MG_TRY(run_threads(dp, true));
        mg_model_set_rng_counter(dp->m, at + (uint64_t)k);
        for (int i = 0; i < k; i++) {   /* in the shards' order */
            MG_TRY(mg__det_push(q->det, dp->w[i].grads, q->part ? q->part[i] : NULL));
            r->loss_sum += (double)dp->w[i].loss * dp->w[i].n;
            r->correct += dp->w[i].correct;
            r->samples += dp->w[i].n;
            r->micro++;
        }
    }
    return MG_OK;
}

const mg_component_ops mg__dp_det_component = {
    .name = "dp-det", .attach = dp_det_attach, .destroy = dp_det_destroy,
    .run_step = dp_det_run_step,
};
