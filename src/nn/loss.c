/* Softmax cross-entropy, mean over the batch (torch.nn.CrossEntropyLoss):
 * loss_i = logsumexp(z_i) - z_i[y_i], computed after subtracting the row
 * maximum so no exp overflows; the gradient is (softmax - onehot) / n. */
#include <math.h>
#include "multigrad/nn.h"
#include "device/dk.h"

float mg_softmax_xent(const float *logits, const int32_t *labels, int n,
                      int classes, float *dlogits, int *correct)
{
    if (mg__dk_cur) return mg_dk_softmax_xent(logits, labels, n, classes, dlogits, correct);
    double total = 0.0;
    int hits = 0;
    float inv_n = n > 0 ? 1.0f / (float)n : 0.0f;
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * classes;
        int y = labels[i];
        MG_ASSERT(y >= 0 && y < classes);
        int arg = 0;
        float mx = z[0];
        for (int j = 1; j < classes; j++)
            if (z[j] > mx) {
                mx = z[j];
                arg = j;
            }
        hits += arg == y;
        float sum = 0.0f;
        for (int j = 0; j < classes; j++) sum += expf(z[j] - mx);
        /* (max - z_y) first: adding log(sum) to a large max would round. */
        total += (double)((mx - z[y]) + logf(sum));
        if (dlogits) {
            float *d = dlogits + (size_t)i * classes;
            float inv = 1.0f / sum;
            for (int j = 0; j < classes; j++) d[j] = expf(z[j] - mx) * inv * inv_n;
            d[y] -= inv_n;
        }
    }
    if (correct) *correct = hits;
    return n > 0 ? (float)(total / n) : 0.0f;
}
