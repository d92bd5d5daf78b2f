/* Softmax cross-entropy, mean over the batch (torch.nn.CrossEntropyLoss):
 * loss_i = logsumexp(z_i) - z_i[y_i], computed after subtracting the row
 * maximum so no exp overflows; the gradient is (softmax - onehot) / n.
 * One implementation for whole logits and for logits split over the
 * vocabulary (tensor parallelism: Megatron-LM's vocabulary-parallel
 * cross-entropy), in per-row pieces that run on the CPU or the current
 * device, with the group's reductions between them when split. */
#include <math.h>
#include <stdlib.h>
#include "nn/layer.h"
#include "device/dk.h"

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

/* Fixed sums (mg_model_set_fixed_sums): each row's sum of exp(z - max)
 * over `chunks` fixed chunks of this rank's columns, summed in the binary
 * tree over every rank's chunks (CPU); parts holds (chunks + T) n floats. */
static void xent_fixed_sums(const mg_ctx *c, float *sum, const float *logits, const float *mx,
                            int n, int classes, int chunks, float *parts)
{
    int T = c ? c->tp->split.size : 1, w = classes / chunks;
    for (int j = 0; j < chunks; j++)
        for (int i = 0; i < n; i++) {
            const float *z = logits + (size_t)i * classes + (size_t)j * w;
            float s = 0.0f;
            for (int k = 0; k < w; k++) s += expf(z[k] - mx[i]);
            parts[(size_t)j * n + i] = s;
        }
    mg__fixed_sum(c, T, parts, chunks, (size_t)n, sum);
}

/* Per row: the maximum over every rank's columns, then the sum of
 * exp(z - max) and the label's logit (only its owner adds it), then the
 * loss log(sum) + max - z[y] ((max - z[y]) first: adding log(sum) to a
 * large max would round) and the gradient on this rank's columns. The
 * argmax is the smallest logical column holding the maximum, as one
 * process's first maximum. Whole logits (c NULL) communicate nothing and
 * a label outside them makes the loss NaN. On a device the rows' four
 * values and the labels come to the host for the loss. chunks: fixed sums
 * (0: off). */
float mg__softmax_xent(const mg_ctx *c, const float *logits, const int32_t *labels, int n,
                       int classes, int lo, float *dlogits, int *correct, float *ws, int chunks)
{
    float *mx = ws, *sum = ws + n, *zy = ws + 2 * (size_t)n, *arg = ws + 3 * (size_t)n;
    xent_max(mx, logits, n, classes);
    if (c) mg__tp_all_reduce(c, mx, (size_t)n, true);
    xent_sums(sum, zy, arg, logits, labels, mx, n, classes, lo);
    if (chunks) {   /* the label's logit: one rank's, the others' zeros (exact) */
        xent_fixed_sums(c, sum, logits, mx, n, classes, chunks, ws + 4 * (size_t)n);
        if (c) mg__tp_all_reduce(c, zy, (size_t)n, false);
    } else if (c) {
        mg__tp_all_reduce(c, sum, 2 * (size_t)n, false);   /* sum and zy, side by side */
    }
    if (c && correct) mg__tp_all_reduce(c, arg, (size_t)n, true);
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
        bool ok = c || (labels[i] >= 0 && labels[i] < classes);
        total += ok ? (double)((mx[i] - zy[i]) + logf(sum[i])) : NAN;
        hits += correct && -arg[i] == (float)labels[i];
    }
    free(host);
    if (correct) *correct = hits;
    return n > 0 ? (float)(total / n) : 0.0f;
}

float mg_softmax_xent(const float *logits, const int32_t *labels, int n, int classes,
                      float *dlogits, int *correct)
{
    size_t bytes = 4 * (size_t)(n > 0 ? n : 1) * sizeof(float);
    float *ws = mg__dk_cur ? mg_dk_workspace(bytes) : malloc(bytes);
    MG_ASSERT(ws);
    float loss = mg__softmax_xent(NULL, logits, labels, n, classes, 0, dlogits, correct, ws, 0);
    if (!mg__dk_cur) free(ws);
    return loss;
}
