/* DataParallel: one process, several threads each holding a replica of the
 * model, as torch.nn.DataParallel does on several devices of one machine:
 * replicate the parameters of replica 0, scatter the batch, apply the
 * replicas in parallel (forward, loss, backward), gather the losses and
 * reduce the gradients to replica 0, weighting each by its share of the
 * batch so the result equals one process on the whole batch. The reduce
 * adds to replica 0's gradients, as a backward does, so micro-batches
 * accumulate. The caller steps the optimizer on replica 0; the next step
 * replicates again.
 *
 * Compared with DDP this keeps one optimizer and pays a replicate and a
 * reduce over all parameters every step, serialised on replica 0 — the
 * design difference the PyTorch tutorials point out. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/parallel.h"

typedef struct {
    mg_model *m;
    const void *x;    /* the model's input: floats, or int32 tokens (4 bytes each too) */
    const int32_t *y;
    int n;            /* samples of this replica this step */
    float loss;
    int correct;
    /* A failed forward (a larger batch that cannot be reserved): the
     * message is per thread, so it is kept here for the main thread. */
    mg_status st;
    char err[512];
} replica;

struct mg_dp {
    int workers;
    replica *r;
    pthread_t *threads;
    int started;       /* worker threads 1..started are running */
    /* Step hand-off: the main thread bumps gen; each worker applies its
     * replica once per generation and the last one to finish signals. */
    pthread_mutex_t mu;
    pthread_cond_t go, fin;
    unsigned gen;
    int pending;
    bool stop;
    size_t in;         /* input elements (4 bytes) per sample */
    int positions;     /* labels per sample (a language model: T) */
    /* Replica 0's gradients from before this call (earlier micro-batches):
     * replica 0 zeroes its arena to compute its own share. */
    float *acc;
};

static void apply(replica *r)
{
    mg_model_zero_grad(r->m);
    r->loss = 0;
    r->correct = 0;
    r->st = MG_OK;
    if (r->n == 0) return;
    if (!mg_model_forward(r->m, (const float *)r->x, r->n)) {
        r->st = MG_ENOMEM;
        snprintf(r->err, sizeof r->err, "%s", mg_last_error());
        return;
    }
    r->loss = mg_model_loss(r->m, r->y, &r->correct);
    mg_model_backward(r->m);
}

typedef struct { mg_dp *dp; int k; } thread_arg;

static void *worker(void *p)
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
        apply(&dp->r[a.k]);
        pthread_mutex_lock(&dp->mu);
        if (--dp->pending == 0) pthread_cond_signal(&dp->fin);
        pthread_mutex_unlock(&dp->mu);
    }
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
    if (workers < 1)
        return mg_error(MG_EINVAL, "DataParallel needs at least 1 worker (got %d)", workers);
    mg_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return mg_error(MG_ENOMEM, "dp: out of memory");
    dp->workers = workers;
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->go, NULL);
    pthread_cond_init(&dp->fin, NULL);
    dp->r = calloc((size_t)workers, sizeof *dp->r);
    dp->threads = calloc((size_t)workers, sizeof *dp->threads);
    if (!dp->r || !dp->threads) {
        mg_dp_destroy(dp);
        return mg_error(MG_ENOMEM, "dp: out of memory");
    }
    int per = (max_batch + workers - 1) / workers;
    for (int k = 0; k < workers; k++) {
        mg_status st = make(ud, &dp->r[k].m);
        if (!st) st = mg_model_reserve(dp->r[k].m, per);
        if (st) {
            mg_dp_destroy(dp);
            return st;
        }
    }
    int c, h, w;
    mg_model_input_shape(dp->r[0].m, &c, &h, &w);
    dp->in = (size_t)c * h * w;
    dp->positions = mg_model_positions(dp->r[0].m);
    size_t n = mg_model_arena_size(dp->r[0].m);
    dp->acc = mg_alloc(n * sizeof(float));
    if (!dp->acc) {
        mg_dp_destroy(dp);
        return mg_error(MG_ENOMEM, "dp: cannot allocate %zu floats to accumulate gradients", n);
    }
    for (int k = 1; k < workers; k++) {
        thread_arg *a = malloc(sizeof *a);
        if (a) *a = (thread_arg){dp, k};
        if (!a || pthread_create(&dp->threads[k], NULL, worker, a)) {
            free(a);
            mg_dp_destroy(dp);
            return mg_error(MG_ENOMEM, "dp: cannot start worker thread %d", k);
        }
        dp->started = k;
    }
    *out = dp;
    return MG_OK;
}

void mg_dp_destroy(mg_dp *dp)
{
    if (!dp) return;
    pthread_mutex_lock(&dp->mu);
    dp->stop = true;
    pthread_cond_broadcast(&dp->go);
    pthread_mutex_unlock(&dp->mu);
    for (int k = 1; k <= dp->started; k++) pthread_join(dp->threads[k], NULL);
    if (dp->r)
        for (int k = 0; k < dp->workers; k++) mg_model_destroy(dp->r[k].m);
    pthread_mutex_destroy(&dp->mu);
    pthread_cond_destroy(&dp->go);
    pthread_cond_destroy(&dp->fin);
    free(dp->r);
    free(dp->threads);
    mg_free(dp->acc);
    free(dp);
}

mg_model *mg_dp_model(mg_dp *dp) { return dp->r[0].m; }
int mg_dp_workers(const mg_dp *dp) { return dp->workers; }

mg_status mg_dp_forward_backward(mg_dp *dp, const void *x, const int32_t *y, int batch,
                                 float *loss, int *correct)
{
    MG_ASSERT(batch > 0);
    int W = dp->workers;
    mg_model *m0 = dp->r[0].m;
    size_t n = mg_model_arena_size(m0), nb = mg_model_buffer_size(m0);
    float *g0 = mg_model_grads(m0);
    memcpy(dp->acc, g0, n * sizeof(float));
    /* replicate */
    for (int k = 1; k < W; k++) {
        memcpy(mg_model_params(dp->r[k].m), mg_model_params(m0), n * sizeof(float));
        if (nb) memcpy(mg_model_buffers(dp->r[k].m), mg_model_buffers(m0), nb * sizeof(float));
    }
    /* scatter: contiguous chunks, as torch's scatter along dim 0 */
    int per = (batch + W - 1) / W, off = 0;
    for (int k = 0; k < W; k++) {
        int len = batch - off < per ? batch - off : per;
        if (len < 0) len = 0;
        dp->r[k].x = (const char *)x + (size_t)off * dp->in * 4;
        dp->r[k].y = y + (size_t)off * dp->positions;
        dp->r[k].n = len;
        off += len;
    }
    /* parallel apply: replica 0 on this thread */
    pthread_mutex_lock(&dp->mu);
    dp->pending = W - 1;
    dp->gen++;
    pthread_cond_broadcast(&dp->go);
    pthread_mutex_unlock(&dp->mu);
    apply(&dp->r[0]);
    pthread_mutex_lock(&dp->mu);
    while (dp->pending > 0) pthread_cond_wait(&dp->fin, &dp->mu);
    pthread_mutex_unlock(&dp->mu);
    for (int k = 0; k < W; k++)
        if (dp->r[k].st) {
            /* Leave the gradients as they were: the caller may stop here or
             * retry with smaller batches. */
            memcpy(g0, dp->acc, n * sizeof(float));
            return mg_error(dp->r[k].st, "DataParallel replica %d: %s", k, dp->r[k].err);
        }
    /* gather and reduce to replica 0, weighted by batch share, on top of
     * what it held (g0 = acc + sum_k w_k g_k; for a zeroed arena exactly
     * the weighted sum) */
    float l = 0;
    int cor = 0;
    const float *acc = dp->acc;
    float w0 = (float)dp->r[0].n / (float)batch;
    for (size_t i = 0; i < n; i++) g0[i] = acc[i] + w0 * g0[i];
    for (int k = 0; k < W; k++) {
        l += dp->r[k].loss * (float)dp->r[k].n / (float)batch;
        cor += dp->r[k].correct;
        if (k == 0 || dp->r[k].n == 0) continue;
        const float *gk = mg_model_grads(dp->r[k].m);
        float wk = (float)dp->r[k].n / (float)batch;
        for (size_t i = 0; i < n; i++) g0[i] += wk * gk[i];
    }
    /* Batch-norm running statistics stay replica 0's, as in torch's DataParallel. */
    if (loss) *loss = l;
    if (correct) *correct = cor;
    return MG_OK;
}
