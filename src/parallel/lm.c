/* Validation loss of a language model (models.md D): mean cross-entropy
 * over every position of the validation windows, evaluated in batches of
 * the training batch. In a group each rank (through a strategy: each
 * data-parallel replica) takes a contiguous share of the windows and the
 * sums are all-reduced, so every rank gets the exact figure of one process
 * (up to summation order; under --deterministic the shares are whole
 * batches, one process's batches: the same bits). */
#include <math.h>
#include <stdlib.h>
#include "multigrad/component.h"
#include "multigrad/plan.h"
#include "multigrad/sampler.h"

/* The validation windows [w, end) in batches. */
typedef struct {
    const mg_text *t;
    int T, batch, w, end;
    int32_t *x, *y;
} windows;

static bool next_windows(void *ud, mg_micro_batch *b)
{
    windows *s = ud;
    if (s->w >= s->end) return false;
    int n = s->end - s->w < s->batch ? s->end - s->w : s->batch;
    mg_text_val_batch(s->t, s->T, s->w, n, s->x, s->y);
    s->w += n;
    *b = (mg_micro_batch){.x = s->x, .y = s->y, .n = n};
    return true;
}

int mg_lm_val_windows(const mg_text *t, int T, int max)
{
    int n = mg_text_val_windows(t, T);
    return max > 0 && max < n ? max : n;
}

/* aligned: each share in whole batches (--deterministic: the batches of
 * one process at any world size). */
static bool windows_open(windows *s, const mg_text *t, int T, int n, int batch, int rank,
                         int world, bool aligned)
{
    *s = (windows){.t = t, .T = T, .batch = batch};
    if (aligned) mg_shard_blocks(mg_lm_val_windows(t, T, n), batch, rank, world, &s->w, &s->end);
    else mg_shard_range(mg_lm_val_windows(t, T, n), rank, world, &s->w, &s->end);
    s->x = malloc(sizeof(int32_t) * (size_t)batch * T);
    s->y = malloc(sizeof(int32_t) * (size_t)batch * T);
    return s->x && s->y;
}

static void windows_close(windows *s)
{
    free(s->x);
    free(s->y);
}

mg_status mg_lm_val_loss(mg_model *m, const mg_text *t, int batch, mg_group *g, double *loss)
{
    windows s;
    bool ok = windows_open(&s, t, mg_model_positions(m), 0, batch, g ? mg_group_rank(g) : 0,
                           g ? mg_group_size(g) : 1, false);
    double v[3] = {0, 0, !ok};   /* loss sum, windows, failed */
    mg_model_set_training(m, false);
    for (mg_micro_batch b; !v[2] && next_windows(&s, &b);) {
        if (!mg_model_forward_tokens(m, b.x, b.n)) {
            v[2] = 1;
            break;
        }
        v[0] += (double)mg_model_loss(m, b.y, NULL) * b.n;
        v[1] += b.n;
    }
    mg_model_set_training(m, true);
    windows_close(&s);
    /* Also when this rank failed: the others are in the same all-reduce. */
    if (g) MG_TRY(mg_all_reduce(g, v, v, 3, MG_F64, MG_SUM));
    if (v[2]) return mg_error(MG_ENOMEM, "validation: cannot forward a batch of %d", batch);
    *loss = v[1] > 0 ? v[0] / v[1] : NAN;
    return MG_OK;
}

mg_status mg_strategy_lm_val_loss(mg_strategy *s, const mg_text *t, int batch, int replica,
                                  int replicas, int n_windows, double *loss)
{
    MG_NEED("mg_strategy_lm_val_loss", s);
    MG_NEED("mg_strategy_lm_val_loss", t);
    MG_NEED("mg_strategy_lm_val_loss", loss);
    windows w;
    bool ok = windows_open(&w, t, mg_model_positions(mg_strategy_model(s)), n_windows, batch,
                           replica, replicas, mg_strategy_options_of(s)->det_shards > 0);
    mg_step_result r = {0};
    mg_status st = ok ? mg_strategy_evaluate(s, next_windows, &w, &r)
                      : mg_error(MG_ENOMEM, "validation: out of memory for a batch of %d", batch);
    windows_close(&w);
    double v[3] = {r.loss_sum, (double)r.samples, st != MG_OK};
    /* Also when this rank failed: the others are in the same sum. */
    MG_TRY(mg_strategy_sum(s, v, 3));
    if (v[2] && !st) return mg_error(MG_EPEER, "validation failed on another rank");
    if (st) return st;
    *loss = v[1] > 0 ? v[0] / v[1] : NAN;
    return MG_OK;
}
