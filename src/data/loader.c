/* The background batch loader: one thread gathers and scales batch k+1
 * (mg_dataset_gather) into one of two slots while the caller trains on
 * batch k in the other (double buffering). Batch k always lives in slot
 * k % 2; a slot is FREE, FILLING, READY or HELD (by the caller until its
 * next mg_loader_next or mg_loader_start). The worker copies the epoch's
 * parameters under the lock, so a new epoch can start while the previous
 * one was not drained: start waits for a fill in progress, then resets. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/data.h"

enum { FREE, FILLING, READY, HELD };

typedef struct slot {
    float *x;
    int32_t *y;
    int count;
    int state;
} slot;

struct mg_loader {
    const mg_dataset *ds;
    int max_batch;
    size_t img;              /* floats per image */
    mg_scaling scaling;
    slot slots[2];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;     /* worker waits: a slot to fill, or stop */
    pthread_cond_t done;     /* caller waits: a fill finished */
    /* The epoch, guarded by mu. */
    const int32_t *order;
    int n, batch, nbatches;
    int next_fill, next_take;
    int held;                /* slot held by the caller, or -1 */
    bool stop;
};

static void *worker(void *arg)
{
    mg_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && !(l->next_fill < l->nbatches &&
                             l->slots[l->next_fill % 2].state == FREE))
            pthread_cond_wait(&l->work, &l->mu);
        if (l->stop) break;
        int k = l->next_fill++;
        slot *s = &l->slots[k % 2];
        s->state = FILLING;
        const int32_t *idx = l->order + (size_t)k * (size_t)l->batch;
        long left = (long)l->n - (long)k * l->batch;
        int count = left < l->batch ? (int)left : l->batch;
        pthread_mutex_unlock(&l->mu);
        /* Cannot fail: the slot holds max_batch images of the data set's
         * size, and mg_loader_start checked order's indices. */
        mg_status st = mg_dataset_gather(l->ds, idx, count, l->scaling, s->x,
                                         (size_t)l->max_batch * l->img, s->y);
        MG_ASSERT(st == MG_OK);
        pthread_mutex_lock(&l->mu);
        s->count = count;
        s->state = READY;
        pthread_cond_broadcast(&l->done);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

mg_status mg_loader_create(const mg_dataset *ds, int max_batch, mg_scaling scaling,
                           mg_loader **out)
{
    *out = NULL;
    if (max_batch <= 0)
        return mg_error(MG_EINVAL, "loader: batch size %d must be positive", max_batch);
    if (!ds || !ds->images)
        return mg_error(MG_EINVAL, "loader: %s: give a data set loaded with its images "
                        "(mg_dataset_load)", ds ? "the data set is its shape alone" : "no data set");
    mg_loader *l = calloc(1, sizeof *l);
    if (!l) return mg_error(MG_ENOMEM, "loader: out of memory");
    l->ds = ds;
    l->max_batch = max_batch;
    l->scaling = scaling;
    l->held = -1;
    size_t img = l->img = (size_t)ds->h * (size_t)ds->w;
    for (int i = 0; i < 2; i++) {
        l->slots[i].x = mg_alloc((size_t)max_batch * img * sizeof(float));
        l->slots[i].y = mg_alloc((size_t)max_batch * sizeof(int32_t));
        if (!l->slots[i].x || !l->slots[i].y) {
            for (int j = 0; j <= i; j++) { mg_free(l->slots[j].x); mg_free(l->slots[j].y); }
            free(l);
            return mg_error(MG_ENOMEM, "loader: cannot allocate two batches of %d images",
                            max_batch);
        }
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->work, NULL);
    pthread_cond_init(&l->done, NULL);
    int rc = pthread_create(&l->thread, NULL, worker, l);
    if (rc) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->work);
        pthread_cond_destroy(&l->done);
        for (int i = 0; i < 2; i++) { mg_free(l->slots[i].x); mg_free(l->slots[i].y); }
        free(l);
        return mg_error(MG_ENOMEM, "loader: cannot start its thread (error %d)", rc);
    }
    *out = l;
    return MG_OK;
}

void mg_loader_destroy(mg_loader *l)
{
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->work);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->work);
    pthread_cond_destroy(&l->done);
    for (int i = 0; i < 2; i++) { mg_free(l->slots[i].x); mg_free(l->slots[i].y); }
    free(l);
}

mg_status mg_loader_start(mg_loader *l, const int32_t *order, int n, int batch, int skip)
{
    if (n < 0 || (n > 0 && !order) || batch < 1 || batch > l->max_batch || skip < 0)
        return mg_error(MG_EINVAL, "loader: an epoch of %d indices%s in batches of %d, %d "
                        "skipped: give 0 or more indices, batches of 1 to the loader's %d, 0 "
                        "or more skipped", n, n > 0 && !order ? " at NULL" : "", batch, skip,
                        l->max_batch);
    /* Checked here, where the caller hears of it: the worker's gather
     * would find it on a thread that cannot say so (a probe). */
    for (int i = 0; i < n; i++)
        if (order[i] < 0 || order[i] >= l->ds->n)
            return mg_error(MG_EINVAL, "loader: index %d of the epoch's order is %d, outside "
                            "the %d images of %s", i, (int)order[i], l->ds->n, l->ds->path);
    pthread_mutex_lock(&l->mu);
    while (l->slots[0].state == FILLING || l->slots[1].state == FILLING)
        pthread_cond_wait(&l->done, &l->mu);
    l->slots[0].state = l->slots[1].state = FREE;
    l->held = -1;
    l->order = order;
    l->n = n;
    l->batch = batch;
    l->nbatches = (int)(((long)n + batch - 1) / batch);
    l->next_fill = l->next_take = skip < l->nbatches ? skip : l->nbatches;
    pthread_cond_signal(&l->work);
    pthread_mutex_unlock(&l->mu);
    return MG_OK;
}

int mg_loader_next(mg_loader *l, const float **x, const int32_t **y)
{
    pthread_mutex_lock(&l->mu);
    if (l->held >= 0) {
        l->slots[l->held].state = FREE;
        l->held = -1;
        pthread_cond_signal(&l->work);
    }
    if (l->next_take >= l->nbatches) {
        pthread_mutex_unlock(&l->mu);
        *x = NULL;
        *y = NULL;
        return 0;
    }
    int si = l->next_take % 2;
    slot *s = &l->slots[si];
    while (s->state != READY) pthread_cond_wait(&l->done, &l->mu);
    s->state = HELD;
    l->held = si;
    l->next_take++;
    int count = s->count;
    pthread_mutex_unlock(&l->mu);
    *x = s->x;
    *y = s->y;
    return count;
}
