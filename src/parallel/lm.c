/* Validation loss of a language model (models.md D): mean cross-entropy
 * over every position of the validation windows, evaluated in batches of
 * the training batch. In a group each rank takes a contiguous share of
 * the windows and the sums are all-reduced, so every rank gets the exact
 * figure of one process (up to summation order). */
#include <math.h>
#include <stdlib.h>
#include "multigrad/parallel.h"

mg_status mg_lm_val_loss(mg_model *m, const mg_text *t, int batch, mg_group *g, double *loss)
{
    int T = mg_model_positions(m);
    int nw = mg_text_val_windows(t, T), begin = 0, end = nw;
    if (g) mg_shard_range(nw, mg_group_rank(g), mg_group_size(g), &begin, &end);
    int32_t *x = malloc(sizeof(int32_t) * (size_t)batch * T);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)batch * T);
    double v[3] = {0, 0, !x || !y};   /* loss sum, windows, failed */
    mg_model_set_training(m, false);
    for (int w = begin; w < end && !v[2]; w += batch) {
        int n = end - w < batch ? end - w : batch;
        mg_text_val_batch(t, T, w, n, x, y);
        if (!mg_model_forward_tokens(m, x, n)) {
            v[2] = 1;
            break;
        }
        v[0] += (double)mg_model_loss(m, y, NULL) * n;
        v[1] += n;
    }
    mg_model_set_training(m, true);
    free(x);
    free(y);
    /* Also when this rank failed: the others are in the same all-reduce. */
    if (g) MG_TRY(mg_all_reduce(g, v, v, 3, MG_F64, MG_SUM));
    if (v[2]) return mg_error(MG_ENOMEM, "validation: cannot forward a batch of %d", batch);
    *loss = v[1] > 0 ? v[0] / v[1] : NAN;
    return MG_OK;
}
