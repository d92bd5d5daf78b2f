/* Tensor parallelism inside nn (Megatron-LM): the collectives a split
 * layer calls through the plan's callbacks (nn includes no comm), the
 * cross-entropy of logits split over the vocabulary, and the model's
 * tensor-parallel settings.
 *
 * Where the collectives are (the layers call the region mappings,
 * mg__tp_all_rows and mg__tp_sum_rows):
 *   column-parallel linear   backward: the input gradient is summed
 *   row-parallel linear      forward: the output is summed, then the bias
 *   vocabulary embedding     forward: each rank's rows of wte, summed
 *   tied head                backward: the input gradient is summed
 *   cross-entropy            three sums or maxima of one float per row
 * (with sequence parallelism each sum is a reduce-scatter over the
 * positions, and the gathers before the column-parallel layers and the
 * head are all-gathers),
 * so a transformer block costs two all-reduces in forward and two in
 * backward. Limits: the collectives are synchronous. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "nn/model_internal.h"

/* The group to call, or NULL after a failure (recorded: none given). */
static mg__tp *group(const mg_ctx *c, bool given)
{
    mg__tp *tp = c->tp;
    if (!tp || tp->failed) return NULL;
    if (!given) {
        tp->failed = mg_error(MG_EINVAL, "a model split for tensor parallelism (part %d of %d) "
                              "ran without its group: give it one with mg_model_set_tp_comm "
                              "(a plan with --mesh tp=%d does)", tp->split.rank, tp->split.size,
                              tp->split.size);
        return NULL;
    }
    return tp;
}

void mg__tp_all_reduce(const mg_ctx *c, float *x, size_t n, bool max)
{
    mg__tp *tp = group(c, c->tp && c->tp->comm.all_reduce);
    if (tp) tp->failed = tp->comm.all_reduce(tp->comm.ud, x, n, max);
}

/* Megatron's region mappings: entering a split region every rank needs
 * all positions (with sequence parallelism gathered, else each rank has
 * them), and leaving it the ranks' partial values are summed (with
 * sequence parallelism each rank keeping its part of the positions). The
 * backward of each is the other. */
const float *mg__tp_all_rows(const mg_layer *l, const mg_ctx *c, const float *x, size_t rows,
                             size_t w, float *buf)
{
    if (!mg__seq_split(l)) return x;
    mg__tp *tp = group(c, c->tp && c->tp->comm.all_gather);
    if (tp) tp->failed = tp->comm.all_gather(tp->comm.ud, x, buf, rows / (size_t)l->tp.size * w);
    return buf;
}

size_t mg__tp_sum_rows(const mg_layer *l, const mg_ctx *c, float *part, float *out, size_t rows,
                       size_t w)
{
    if (!mg__seq_split(l)) {
        MG_ASSERT(part == out);
        if (mg__split(l)) mg__tp_all_reduce(c, out, rows * w, false);
        return rows;
    }
    size_t here = rows / (size_t)l->tp.size;
    mg__tp *tp = group(c, c->tp && c->tp->comm.reduce_scatter);
    if (tp) tp->failed = tp->comm.reduce_scatter(tp->comm.ud, part, out, here * w);
    return here;
}

/* The per-row pieces, on the CPU or the current device: each row's
 * maximum; the sum of exp(z - max), the label's logit (0 when another
 * rank holds its column) and -(the first column holding the maximum); the
 * gradient (softmax - onehot) / n on this rank's columns. */
static void xent_max(float *mx, const float *logits, int n, int classes)
{
    if (mg__dk_cur) {
        mg_dk_xent_max(mx, logits, n, classes);
        return;
    }
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * classes;
        float m = z[0];
        for (int j = 1; j < classes; j++) m = z[j] > m ? z[j] : m;
        mx[i] = m;
    }
}

static void xent_sums(float *sum, float *zy, float *arg, const float *logits,
                      const int32_t *labels, const float *mx, int n, int classes, int lo)
{
    if (mg__dk_cur) {
        mg_dk_xent_sums(sum, zy, arg, logits, labels, mx, n, classes, lo);
        return;
    }
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * classes;
        float s = 0.0f;
        for (int j = 0; j < classes; j++) s += expf(z[j] - mx[i]);
        sum[i] = s;
        int y = labels[i] - lo;
        zy[i] = y >= 0 && y < classes ? z[y] : 0.0f;
        /* -(first column holding the maximum): the largest is the first */
        arg[i] = -INFINITY;
        for (int j = 0; j < classes; j++)
            if (z[j] == mx[i]) {
                arg[i] = -(float)(lo + j);
                break;
            }
    }
}

static void xent_grad(float *dlogits, const float *logits, const int32_t *labels,
                      const float *mx, const float *sum, int n, int classes, int lo)
{
    if (mg__dk_cur) {
        mg_dk_xent_grad(dlogits, logits, labels, mx, sum, n, classes, lo);
        return;
    }
    float inv_n = n > 0 ? 1.0f / (float)n : 0.0f;
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * classes;
        float *d = dlogits + (size_t)i * classes, inv = 1.0f / sum[i];
        for (int j = 0; j < classes; j++) d[j] = expf(z[j] - mx[i]) * inv * inv_n;
        int y = labels[i] - lo;
        if (y >= 0 && y < classes) d[y] -= inv_n;
    }
}

/* Per row: the maximum over every rank's columns, then the sum of
 * exp(z - max) and the label's logit (only its owner adds it), then the
 * loss log(sum) + max - z[y] and the gradient on this rank's columns. The
 * argmax is the smallest logical column holding the maximum, as one
 * process's first maximum. On a device the rows' four values and the
 * labels come to the host for the loss. */
float mg__tp_softmax_xent(const mg_ctx *c, const float *logits, const int32_t *labels, int n,
                          int classes, int lo, float *dlogits, int *correct, float *ws)
{
    float *mx = ws, *sum = ws + n, *zy = ws + 2 * (size_t)n, *arg = ws + 3 * (size_t)n;
    xent_max(mx, logits, n, classes);
    mg__tp_all_reduce(c, mx, (size_t)n, true);
    xent_sums(sum, zy, arg, logits, labels, mx, n, classes, lo);
    mg__tp_all_reduce(c, sum, 2 * (size_t)n, false);   /* sum and zy, side by side */
    if (correct) mg__tp_all_reduce(c, arg, (size_t)n, true);
    if (dlogits) xent_grad(dlogits, logits, labels, mx, sum, n, classes, lo);
    float *host = NULL;
    if (mg__dk_cur) {
        host = malloc(5 * (size_t)n * sizeof(float));
        MG_ASSERT(host);
        mg_dk_copy_out(host, ws, 4 * (size_t)n * sizeof(float));
        mg_dk_copy_out(host + 4 * (size_t)n, labels, (size_t)n * sizeof(int32_t));
        mx = host, sum = host + n, zy = host + 2 * (size_t)n, arg = host + 3 * (size_t)n;
        labels = (const int32_t *)(const void *)(host + 4 * (size_t)n);
    }
    double total = 0.0;
    int hits = 0;
    for (int i = 0; i < n; i++) {
        total += (double)((mx[i] - zy[i]) + logf(sum[i]));
        hits += correct && -arg[i] == (float)labels[i];
    }
    free(host);
    if (correct) *correct = hits;
    return n > 0 ? (float)(total / n) : 0.0f;
}

/* ---- the model's settings ------------------------------------------------ */

mg_tp_split mg_model_tp(const mg_model *m)
{
    return m->ctx.tp ? m->ctx.tp->split : MG_TP_NONE;
}

void mg_model_set_tp_comm(mg_model *m, const mg_tp_comm *c)
{
    if (m->ctx.tp) m->ctx.tp->comm = c ? *c : (mg_tp_comm){0};
}

mg_status mg_model_tp_failure(mg_model *m)
{
    if (!m->ctx.tp) return MG_OK;
    mg_status st = m->ctx.tp->failed;
    m->ctx.tp->failed = MG_OK;
    return st;
}

void mg__model_set_vocab_split(mg_model *m) { m->vocab_split = m->ctx.tp != NULL; }
