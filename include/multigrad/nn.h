/* multigrad — layers with backward, and models whose parameters live in
 * arenas laid out in backward order.
 *
 * A model owns three arenas of the same layout: parameters, gradients and
 * (through mg_optim) optimizer state. The last layer's parameters come
 * first, so backward finishes gradients in increasing arena order; after
 * each layer's backward the model calls the gradient hook with the range
 * [lo, hi) that is now final (data-parallel training launches
 * communication from it). Each weight is a view at a fixed offset.
 *
 * The training step allocates nothing: mg_model_reserve() sizes the
 * activation and workspace arena for a batch once. */
#ifndef MULTIGRAD_NN_H
#define MULTIGRAD_NN_H

#include <stdint.h>
#include "tensor.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_model mg_model;

/* A named tensor of a model: a parameter (with a gradient) or a buffer
 * (e.g. batch-norm running statistics). Names, shapes and order follow
 * ../shared/models.md and PyTorch's state_dict ("conv1.weight",
 * [out, in, kh, kw]). */
typedef struct mg_param {
    char name[64];
    int ndim;
    int shape[MG_MAX_DIMS];
    size_t numel;
    size_t offset;   /* in floats, into the parameter arena (or the buffer arena) */
    float *data;     /* view into the arena */
    float *grad;     /* view into the gradient arena; NULL for buffers */
    bool is_buffer;
} mg_param;

/* Called after each layer's backward with the gradient range that is final. */
typedef void (*mg_grad_hook)(void *ud, size_t lo, size_t hi);

/* The zoo: "mlp", "lenet-d2l", "lenet5" (images) and "gpt-mini" (a
 * byte-level language model at models.md's default sizes; other sizes:
 * mg_model_create_gpt). Parameters initialised as models.md says, from
 * seed. */
mg_status mg_model_create(const char *name, uint64_t seed, mg_model **out);
void mg_model_destroy(mg_model *m);
/* NULL-terminated list of zoo names. */
const char *const *mg_model_names(void);
const char *mg_model_name(const mg_model *m);

/* The default hyper-parameters of a zoo model (models.md). Image models
 * train by epochs with SGD; a language model by steps with AdamW, weight
 * decay on its 2-D parameters only (mg_model_decay_groups) and gradient
 * clipping. */
typedef struct mg_zoo_defaults {
    int batch;
    float lr;
    float momentum;
    int epochs;             /* image models; 0 for a language model */
    bool normalized_input;  /* (u8/255 - 0.2860)/0.3530, else u8/255 */
    bool language_model;    /* trains on text (mg_text), by steps */
    long steps;             /* language model: optimizer steps */
    int eval_every;         /* language model: steps between validations */
    mg_optim_kind optimizer;
    float beta2;            /* Adam/AdamW */
    float weight_decay;     /* language model: on 2-D parameters only */
    float clip_grad;        /* global gradient-norm clip; 0: none */
} mg_zoo_defaults;
mg_status mg_zoo_defaults_of(const char *name, mg_zoo_defaults *out);

/* Weight-decay groups as models.md's AdamW wants them: wd on every
 * parameter with 2 or more dimensions (weights, embeddings), 0 on the
 * others (biases, LayerNorm); adjacent tensors of the same decay merge.
 * Fills up to cap groups and returns how many there are. */
int mg_model_decay_groups(const mg_model *m, float wd, mg_optim_group *out, int cap);

/* Re-initialise every parameter from seed (as at creation). */
void mg_model_init_params(mg_model *m, uint64_t seed);

/* Per-image input size (c, h, w; the MLP takes c=1, h=1, w=784) and classes
 * (a language model: its vocabulary). */
void mg_model_input_shape(const mg_model *m, int *c, int *h, int *w);
int mg_model_classes(const mg_model *m);
/* Rows of logits per sample: 1 for the image models, T for a language
 * model (whose logits are [batch, T, vocab] and labels [batch, T]). */
int mg_model_positions(const mg_model *m);

/* The arenas. arena_size is the padded length in floats (a multiple of
 * MG_ARENA_PAD), num_params the floats actually used. */
#define MG_ARENA_PAD 1024
size_t mg_model_num_params(const mg_model *m);
/* FLOPs per image of a forward and of a training step (forward and
 * backward), counting the GEMM-like work of convolution and linear layers
 * (2 per multiply-add); either pointer may be NULL. */
void mg_model_flops(const mg_model *m, double *forward, double *train);
size_t mg_model_arena_size(const mg_model *m);
float *mg_model_params(mg_model *m);
float *mg_model_grads(mg_model *m);
/* Buffers (running statistics) in their own arena; may be 0 floats. */
size_t mg_model_buffer_size(const mg_model *m);
float *mg_model_buffers(mg_model *m);

/* Named tensors: parameters in models.md order (each layer's weight then
 * bias), then buffers. */
int mg_model_num_tensors(const mg_model *m);
const mg_param *mg_model_tensor(const mg_model *m, int i);
const mg_param *mg_model_find(const mg_model *m, const char *name);

/* Move the gradient arena to caller-owned storage of arena_size floats
 * (e.g. group shared memory for DDP); current gradients are copied. The
 * caller keeps ownership and must outlive the model's use of it. NULL
 * moves the gradients back to the model's own arena. */
void mg_model_set_grad_storage(mg_model *m, float *grads);
void mg_model_set_grad_hook(mg_model *m, mg_grad_hook fn, void *ud);
void mg_model_set_training(mg_model *m, bool training);
/* Seed of dropout masks (a counter-based stream, advanced per step). */
void mg_model_set_dropout_seed(mg_model *m, uint64_t seed);

/* Size the activation workspace for batches up to max_batch (once). */
mg_status mg_model_reserve(mg_model *m, int max_batch);
/* Forward a batch x [batch, c, h, w]; returns the logits [batch, classes]
 * (valid until the next forward). x must stay unchanged until the
 * backward. A batch larger than the reserved one reserves again (an
 * allocation, once); NULL if that fails. Training mode advances the
 * dropout stream by one step. */
const float *mg_model_forward(mg_model *m, const float *x, int batch);
/* A language model's forward: tokens [batch, T] (int32, < vocab). */
const float *mg_model_forward_tokens(mg_model *m, const int32_t *tokens, int batch);
/* Generate n tokens after a prompt of n_prompt >= 1 tokens (nanoGPT's
 * generate: the context cropped to the last T tokens, the next token
 * drawn from the last position's logits / temperature, restricted to the
 * top_k most likely when top_k > 0; temperature 0: the most likely).
 * Draws come from a generator seeded by seed. MG_EINVAL for a model that
 * is not a language model or a token outside the vocabulary. */
mg_status mg_model_generate(mg_model *m, const int32_t *prompt, int n_prompt, int n,
                            float temperature, int top_k, uint64_t seed, int32_t *out);
/* Mean softmax cross-entropy of the last forward against labels (one per
 * position: batch * positions of them); prepares
 * the logits' gradient for backward; *correct (may be NULL) gets the
 * number of argmax hits. */
float mg_model_loss(mg_model *m, const int32_t *labels, int *correct);
/* Backward of the last forward and loss: accumulates into the gradient
 * arena and calls the hook after each layer that has parameters, in
 * increasing arena order; the ranges of one backward tile
 * [0, arena_size) (the last includes the padding). */
void mg_model_backward(mg_model *m);
void mg_model_zero_grad(mg_model *m);

/* Position of the dropout stream (checkpointed so a resumed run draws the
 * same masks). */
uint64_t mg_model_rng_counter(const mg_model *m);
void mg_model_set_rng_counter(mg_model *m, uint64_t counter);

/* Also compute d(loss)/d(input) in backward (pipeline stages, tests); set
 * before mg_model_reserve. The gradient is valid after mg_model_backward. */
void mg_model_set_input_grad(mg_model *m, bool on);
const float *mg_model_input_grad(const mg_model *m);
/* Backward from a given gradient of the output [batch, classes] instead of
 * the loss's (a custom loss, a pipeline stage). */
void mg_model_backward_from(mg_model *m, const float *dout);

/* ---- Building models from layers ------------------------------------
 * Layers are created unattached and owned by the composite or model they
 * are given to (also when that call fails). A NULL or empty name inside a
 * Sequential becomes the child's index, as in torch.nn.Sequential;
 * parameters are named "<path>.weight". Constructors return NULL only when
 * memory runs out (composites then free their children). */
typedef struct mg_layer mg_layer;
typedef enum { MG_INIT_TORCH_DEFAULT, MG_INIT_NORMAL } mg_init_kind;

/* y = x W^T + b (input [c,h,w] flattened channel-major), then ReLU if relu. */
mg_layer *mg_layer_linear(const char *name, int in, int out, bool relu);
/* k x k convolution, then ReLU if relu, then a 2x2/2 pool if pool is not
 * MG_POOL_NONE: one layer so the pre-pool map never goes to memory. */
mg_layer *mg_layer_conv2d(const char *name, int in_ch, int out_ch, int k, int stride,
                          int pad, bool relu, mg_pool_kind pool);
mg_layer *mg_layer_relu(const char *name);
mg_layer *mg_layer_avgpool2d(const char *name, int k, int stride);
mg_layer *mg_layer_maxpool2d(const char *name, int k, int stride);
mg_layer *mg_layer_flatten(const char *name);
mg_layer *mg_layer_dropout(const char *name, float p);
/* BatchNorm2d(ch): eps 1e-5, momentum 0.1, affine; buffers running_mean,
 * running_var. */
mg_layer *mg_layer_batchnorm2d(const char *name, int ch);
mg_layer *mg_layer_sequential(const char *name, mg_layer *const *children, int n);
/* y = branch(x) + shortcut(x) (shortcut NULL: identity), then ReLU if relu. */
mg_layer *mg_layer_residual(const char *name, mg_layer *branch, mg_layer *shortcut,
                            bool relu);
/* Transformer layers, on sequences [1, T, d] (T positions of d features).
 * Per-position linear map of the last dimension [c, T, in] -> [c, T, out]. */
mg_layer *mg_layer_linear_tokens(const char *name, int in, int out);
/* LayerNorm over the last dimension (weight 1, bias 0 at init). */
mg_layer *mg_layer_layernorm(const char *name, int d, float eps);
/* GELU, tanh approximation (PyTorch's approximate='tanh'). */
mg_layer *mg_layer_gelu(const char *name);
/* Causal self-attention of `heads` heads: [1, T, 3d] (q, k, v) -> [1, T, d]. */
mg_layer *mg_layer_attention(const char *name, int d, int heads);
/* Token and learned position embedding: tokens [1, 1, T] (int32 bits in
 * the float input) -> [1, T, d]; parameters "wte.weight" [vocab, d] and
 * "wpe.weight" [ctx, d] (the layer adds no name of its own). */
mg_layer *mg_layer_embedding(int vocab, int ctx, int d);
/* The language-model head tied to an embedding's wte: [1, T, d] ->
 * [1, T, vocab] = x wte^T; its gradient accumulates into wte's. The
 * embedding must belong to the same model, before the head. */
mg_layer *mg_layer_tied_head(mg_layer *embedding);
/* A pre-LayerNorm GPT-2 block: x += attn(ln_1(x)); x += mlp(ln_2(x)), with
 * children ln_1, attn (c_attn, causal attention, c_proj), ln_2 and mlp
 * (c_fc, GELU, c_proj). It keeps 9 d floats per position for the backward
 * and recomputes its LayerNorm and GELU outputs there; it runs in slices
 * of whole sequences of about MG_BLOCK_ROWS positions (default 512). */
mg_layer *mg_layer_gpt_block(const char *name, int d, int heads);

/* gpt-mini (models.md section D) at any size. */
typedef struct mg_gpt_config {
    int layers, dim, heads, ctx, vocab;
} mg_gpt_config;
/* models.md's defaults: 4 layers, dim 128, 4 heads, context 128, vocab 256. */
mg_gpt_config mg_gpt_defaults(void);
/* Checks the sizes (dim divisible by heads, all positive); GPT-2's
 * initialisation from seed. */
mg_status mg_model_create_gpt(const mg_gpt_config *cfg, uint64_t seed, mg_model **out);

/* Initialisation of a layer's parameters (default MG_INIT_TORCH_DEFAULT;
 * MG_INIT_NORMAL: weights N(0, std^2), biases 0); applies to children. */
void mg_layer_set_init(mg_layer *l, mg_init_kind kind, float std);
void mg_layer_destroy(mg_layer *l);
/* A model whose root (taken, also on failure) takes images [c, h, w];
 * its output per image is the logits. Parameters initialised from seed. */
mg_status mg_model_create_from(const char *name, mg_layer *root, int c, int h, int w,
                               uint64_t seed, mg_model **out);

/* Softmax cross-entropy (mean over n rows of `classes` logits). dlogits
 * (may be NULL) gets d(loss)/d(logits). Returns the loss; *correct (may be
 * NULL) the number of rows whose argmax equals the label. */
float mg_softmax_xent(const float *logits, const int32_t *labels, int n,
                      int classes, float *dlogits, int *correct);

#ifdef __cplusplus
}
#endif
#endif
