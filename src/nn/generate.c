/* Text generation from a language model (mgtrain --sample): as nanoGPT's
 * generate(), one token at a time from the logits of the last position,
 * the context cropped to the model's last T tokens.
 *
 * The model's context is fixed (T positions, learned position embedding),
 * so a shorter context is forwarded padded: attention is causal, so the
 * logits at position len-1 depend on tokens 0..len-1 only and the padding
 * after them changes nothing. Each token costs one forward of one
 * sequence: generation is for seeing what a model learned, not a
 * serving path. */
#include <float.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/nn.h"

/* Index of the next token from one row of logits: the argmax at
 * temperature 0; otherwise softmax(z / temperature) over the top_k largest
 * (all when top_k <= 0 or >= V; ties with the k-th kept, as torch's
 * "logits < kth" masking does), sampled with one uniform draw. */
static int pick(const float *z, int V, float temperature, int top_k, float *scratch, mg_rng *rng)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (z[i] > z[best]) best = i;
    if (temperature <= 0) return best;
    float kth = -FLT_MAX;
    if (top_k > 0 && top_k < V) {
        /* the k-th largest value, from a sorted copy */
        memcpy(scratch, z, sizeof(float) * (size_t)V);
        for (int i = 1; i < V; i++)   /* insertion sort, descending (V is small) */
            for (int j = i; j > 0 && scratch[j] > scratch[j - 1]; j--) {
                float t = scratch[j];
                scratch[j] = scratch[j - 1];
                scratch[j - 1] = t;
            }
        kth = scratch[top_k - 1];
    }
    double sum = 0;
    for (int i = 0; i < V; i++) {
        scratch[i] = z[i] >= kth ? expf((z[i] - z[best]) / temperature) : 0.0f;
        sum += scratch[i];
    }
    double u = mg_rng_uniform(rng) * sum, acc = 0;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (scratch[i] == 0) continue;
        acc += scratch[i];
        last = i;
        if (u < acc) return i;
    }
    return last;   /* rounding left u at the very top */
}

/* A model's own forward of one sequence; on a device the logits come
 * back to host memory. */
typedef struct {
    mg_model *m;
    float *host;   /* T * V floats; NULL on the CPU */
} own_forward;

static const float *model_forward(void *ud, const int32_t *ctx)
{
    own_forward *f = ud;
    const float *l = mg_model_forward_tokens(f->m, ctx, 1);
    if (!l || !f->host) return l;
    mg_tape_logits_to_host(mg_model_tape(f->m), f->host);
    return mg_model_tp_failure(f->m) ? NULL : f->host;
}

mg_status mg_model_generate(mg_model *m, const int32_t *prompt, int n_prompt, int n,
                            float temperature, int top_k, uint64_t seed, int32_t *out)
{
    int T = mg_model_positions(m), V = mg_model_classes(m);
    if (T < 2)
        return mg_error(MG_EINVAL, "generate: model %s is not a language model",
                        mg_model_name(m));
    own_forward o = {m, NULL};
    /* On a device, or split over the vocabulary, the logits are gathered. */
    if ((mg_model_device(m).kind != MG_DEVICE_CPU || mg_model_tp(m).size > 1) &&
        !(o.host = malloc(sizeof(float) * (size_t)T * V)))
        return mg_error(MG_ENOMEM, "generate: out of memory");
    mg_lm_forward f = {model_forward, NULL, &o, m, T, V};
    mg_status st = mg_generate(&f, prompt, n_prompt, n, temperature, top_k, seed, out);
    free(o.host);
    return st;
}

mg_status mg_generate(const mg_lm_forward *f, const int32_t *prompt, int n_prompt, int n,
                      float temperature, int top_k, uint64_t seed, int32_t *out)
{
    int T = f->positions, V = f->vocab;
    mg_model *m = f->model;
    MG_NEED("generate", prompt);
    if (n_prompt < 1)
        return mg_error(MG_EINVAL, "generate: the prompt needs at least one token");
    if (n < 0 || (n > 0 && !out))
        return mg_error(MG_EINVAL, "generate: %d tokens into %s: give 0 or more, and room "
                        "for them", n, out ? "out" : "out NULL");
    if (!(temperature >= 0))
        return mg_error(MG_EINVAL, "generate: temperature %g: give 0 (the most likely token) "
                        "or more", temperature);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return mg_error(MG_EINVAL, "generate: prompt token %d is %d, outside the "
                            "vocabulary [0, %d)", i, prompt[i], V);
    int32_t *ctx = calloc((size_t)T, sizeof *ctx);
    float *scratch = malloc(sizeof(float) * (size_t)V);
    if (!ctx || !scratch) {
        free(ctx);
        free(scratch);
        return mg_error(MG_ENOMEM, "generate: out of memory");
    }
    int len = n_prompt < T ? n_prompt : T;
    memcpy(ctx, prompt + (n_prompt - len), sizeof *ctx * (size_t)len);
    mg_rng rng;
    mg_rng_init(&rng, seed);
    bool training = mg_model_training(m);
    mg_model_set_training(m, false);
    mg_status st = MG_OK;
    for (int k = 0; k < n; k++) {
        const float *logits = f->forward(f->ud, ctx);
        if (!logits) {
            char why[1024];
            snprintf(why, sizeof why, "%s", mg_last_error());
            st = mg_error(MG_ENOMEM, "generate: %s", why);
            break;
        }
        int32_t tok = pick(logits + (size_t)(len - 1) * V, V, temperature, top_k, scratch, &rng);
        if (f->share && (st = f->share(f->ud, &tok))) break;
        out[k] = tok;
        if (len == T) {
            memmove(ctx, ctx + 1, sizeof *ctx * (size_t)(T - 1));
            ctx[T - 1] = tok;
        } else {
            ctx[len++] = tok;
        }
    }
    mg_model_set_training(m, training);
    free(ctx);
    free(scratch);
    return st;
}
