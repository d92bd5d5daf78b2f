/* multigrad — layers with backward, and models: a sequence of units whose
 * parameters live in arenas laid out in backward order, run on tapes.
 *
 * A model is structure and parameters only. A unit is a layer or a block
 * (nested Sequentials are opened up into their layers); each owns one
 * contiguous range of the arenas, padded so that a world size divides it.
 * The model owns parameters and gradients; optimizer state (mg_optim) has
 * the same layout. The last unit's parameters come first, so backward
 * finishes gradients in increasing arena order. Hooks run around each
 * unit's forward and backward: a strategy is the set of hooks it installs
 * (DDP all-reduces a bucket once its units' backward is done).
 *
 * Activations saved for backward live in a tape (mg_tape) the caller
 * owns, one per micro-batch in flight, sized once for a batch and reused:
 * the training step allocates nothing. Several tapes can be live on one
 * model (a pipeline stage's micro-batches, DataParallel threads). The
 * mg_model_forward family runs on a tape the model keeps for itself. */
#ifndef MULTIGRAD_NN_H
#define MULTIGRAD_NN_H

#include <stdint.h>
#include "tensor.h"
#include "optim.h"
#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_model mg_model;

/* How a parameter's local tensor lies in its logical one (PyTorch
 * DTensor's placement, Megatron-LM's partition_dim and partition_stride):
 * whole (dim -1: replicated wherever it is held), or part `index` of
 * `parts` along dimension `dim`, taken in `stride` blocks: the logical
 * dimension is cut into stride equal blocks (a fused tensor's: qkv's q, k
 * and v), each block into parts pieces, and the local tensor is piece
 * `index` of every block, in block order. So the local dimension is the
 * logical one / parts, and a whole tensor is {-1, 1, 0, 1}. */
typedef struct mg_placement {
    int dim, parts, index, stride;
} mg_placement;
#define MG_WHOLE ((mg_placement){-1, 1, 0, 1})
/* Pure. The logical shape of a local one (shape[dim] * parts). */
void mg_placement_global_shape(const mg_placement *pl, int ndim, const int *local_shape,
                               int *global_shape);
/* Pure. The run of the logical tensor from local element `local` on: the
 * logical element it is, *global, and how many local elements from it
 * follow one another in the logical tensor too (row-major both). A local
 * range maps to the logical one run by run. */
size_t mg_placement_run(const mg_placement *pl, int ndim, const int *local_shape, size_t local,
                        size_t *global);
/* Pure: MG_EINVAL, one line, unless pl fits a local tensor of this shape
 * (dim < ndim, 1 <= parts, 0 <= index < parts, stride divides the local
 * dimension). */
mg_status mg_placement_check(const mg_placement *pl, int ndim, const int *local_shape);

/* ---- Tensor parallelism (Megatron-LM) -------------------------------------
 * A model split over the `size` ranks of a tensor-parallel group, this
 * process building part `rank`: a column-parallel linear holds its
 * weight's rows `rank` (its outputs are split), a row-parallel one its
 * columns (its inputs are split; the outputs are summed over the group,
 * then the bias and ReLU are applied), a vocabulary-parallel embedding and
 * tied head their rows of wte, and the cross-entropy of split logits is
 * computed without gathering them. Split layers place their parameters
 * (mg_placement), so initial values and checkpoints are the logical
 * tensors'. Their collectives go through callbacks a plan gives the model
 * (mg_model_set_tp_comm), so nn includes no comm.
 *
 * Sequence parallelism (Megatron-LM's, `sequence`): between the split
 * regions the activations are split too, each rank holding 1/size of a
 * batch's rows (its contiguous part of the n x T positions), so
 * LayerNorms run on a part and keep 1/size of their statistics; a
 * column-parallel linear all-gathers its input (again in backward) and
 * reduce-scatters its input gradient, a row-parallel one reduce-scatters
 * its output and all-gathers its output gradient. The whole tensors the
 * parts run through (LayerNorms, row-parallel biases) then get partial
 * gradients (mg_param.grad_partial), which the plan sums over the group. */
typedef struct mg_tp_split {
    int size, rank;   /* size <= 1: whole */
    bool sequence;    /* sequence parallelism (a language model's, size | T) */
} mg_tp_split;
#define MG_TP_NONE ((mg_tp_split){1, 0, false})
typedef enum { MG_TP_COLUMN, MG_TP_ROW } mg_tp_role;
typedef struct mg_tp_comm {
    /* x [n] = its sum (max: its maximum) over the group's ranks, in place,
     * on every rank (pointers of the model's device, here and below). */
    mg_status (*all_reduce)(void *ud, float *x, size_t n, bool max);
    /* out [size n] = every rank's in [n], in rank order. */
    mg_status (*all_gather)(void *ud, const float *in, float *out, size_t n);
    /* out [n] = part `rank` of the sum over the ranks of in [size n]. */
    mg_status (*reduce_scatter)(void *ud, const float *in, float *out, size_t n);
    void *ud;
} mg_tp_comm;

/* A named tensor of a model: a parameter (with a gradient) or a buffer
 * (e.g. batch-norm running statistics). Names, shapes and order follow
 * ../shared/models.md and PyTorch's state_dict ("conv1.weight",
 * [out, in, kh, kw]). shape is the local tensor's, which this process
 * holds; place says where it lies in the logical tensor of gshape
 * (checkpoints and initial values are the logical tensor's). */
typedef struct mg_param {
    char name[64];
    int ndim;
    int shape[MG_MAX_DIMS];
    size_t numel;
    int gshape[MG_MAX_DIMS];
    size_t gnumel;
    mg_placement place;
    /* Its gradient is a partial sum over the tensor-parallel group (a
     * whole tensor that sequence parallelism runs on a part of the rows):
     * the plan sums it there. */
    bool grad_partial;
    size_t offset;   /* in floats, into the parameter arena (or the buffer arena) */
    float *data;     /* view into the arena */
    float *grad;     /* view into the gradient arena; NULL for buffers */
    bool is_buffer;
} mg_param;

typedef struct mg_tape mg_tape;

/* The zoo: "mlp", "lenet-d2l", "lenet5" (images) and "gpt-mini" (a
 * byte-level language model at models.md's default sizes; other sizes:
 * mg_model_create_gpt). Parameters initialised as models.md says, from
 * seed. */
mg_status mg_model_create(const char *name, uint64_t seed, mg_model **out);
/* The same model split for tensor parallelism (mg_tp_split): gpt-mini as
 * mg_gpt_config.tp says; an image model's fully connected layers in
 * column-then-row pairs (mlp and lenet5: fc1 column, fc2 row, fc3 whole;
 * lenet-d2l: fc1 column, fc2 row), the convolutions whole. MG_EINVAL, one
 * line, when tp.size does not divide a split dimension. */
mg_status mg_model_create_split(const char *name, uint64_t seed, mg_tp_split tp, mg_model **out);
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

/* Re-initialise every parameter from seed (as at creation). Values are
 * drawn by counter: element k of the parameter named N is value k of the
 * stream mg_rng_seed_for(seed, N), so a part drawn alone equals its part
 * of the whole, whatever the arena's layout. */
mg_status mg_model_init_params(mg_model *m, uint64_t seed);
/* The seed that makes a model without values (as torchtitan builds on the
 * meta device): its arenas are mapped but untouched, costing no memory,
 * until mg_model_init_params or mg_model_init_ranges writes them, or a
 * plan (mg_strategy_create) writes each rank's part from its init_seed. */
#define MG_SEED_DEFERRED UINT64_MAX
/* Only the parameters in the arena ranges r (floats), and every buffer.
 * On a device they are drawn in host memory as large as the part and
 * copied in (MG_ENOMEM, or the copy's error, when that fails). */
mg_status mg_model_init_ranges(mg_model *m, uint64_t seed, const mg_range *r, int n);
/* False while a model made with MG_SEED_DEFERRED has no values yet. */
bool mg_model_has_values(const mg_model *m);

/* Moves the parameters, gradients and buffers to device dev (device.h) or
 * back to the CPU: the pointers mg_model_params, _grads, _buffers and the
 * tensor table give are then that device's memory, and the model's tapes
 * (made again after the move) keep their activations there and run its
 * kernels. Inputs, labels and output gradients given to tapes stay host
 * memory (they are copied in); logits and input gradients are device
 * memory (mg_tape_logits_to_host copies the logits). Every layer of the
 * library has device kernels; MG_EUNSUPPORTED names the first layer
 * without them, should a model have one. */
mg_status mg_model_to_device(mg_model *m, mg_device dev);
mg_device mg_model_device(const mg_model *m);

/* Per-image input size (c, h, w; the MLP takes c=1, h=1, w=784) and classes
 * (a language model: its vocabulary). */
void mg_model_input_shape(const mg_model *m, int *c, int *h, int *w);
int mg_model_classes(const mg_model *m);
/* Rows of logits per sample: 1 for the image models, T for a language
 * model (whose logits are [batch, T, vocab] and labels [batch, T]). */
int mg_model_positions(const mg_model *m);
/* The vocabulary of a model whose input is tokens (its first layer an
 * embedding); 0 for a model whose input is floats. */
int mg_model_vocab(const mg_model *m);
/* MG_OK when tokens [batch, T] (host memory) are a language model's input:
 * each in [0, vocab). MG_EINVAL naming the first that is not (row,
 * position), or a model whose input is floats. The forward checks them
 * (mg_model_forward_tokens); a device's kernels would read such a token
 * as zeros, the CPU's out of bounds. */
mg_status mg_model_check_tokens(const mg_model *m, const int32_t *tokens, int batch);

/* The arenas. arena_size is the padded length in floats (each unit's range
 * is a multiple of the unit pad), num_params the floats actually used. */
size_t mg_model_num_params(const mg_model *m);
/* FLOPs per image of a forward and of a training step (forward and
 * backward), counting the GEMM-like work of convolution and linear layers
 * (2 per multiply-add); either pointer may be NULL. */
void mg_model_flops(const mg_model *m, double *forward, double *train);
size_t mg_model_arena_size(const mg_model *m);
/* The tensors of an arena of the model's layout (its parameters, its
 * gradients or an optimizer state) one after the other in table order,
 * without padding, as torch's parameters_to_vector: num_params floats,
 * the same whatever the unit pad. */
void mg_model_to_vector(const mg_model *m, const float *arena, float *out);
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
/* Parameter `name`'s local tensor is its part pl of the logical one (a
 * tensor-parallel layer's shard): before it has values (a model made with
 * MG_SEED_DEFERRED), so that they are drawn by logical element index.
 * MG_EINVAL for an unknown name, a buffer, a model with values or a pl
 * that does not fit. */
mg_status mg_model_place(mg_model *m, const char *name, mg_placement pl);

/* The tensor-parallel split the model was built with (MG_TP_NONE: whole),
 * the callbacks its split layers call (copied; NULL: none, and a split
 * model's forward then fails), and the first failure of a callback since
 * the last call of mg_model_tp_failure (MG_OK: none; a forward during
 * which one failed returns NULL). */
mg_tp_split mg_model_tp(const mg_model *m);
void mg_model_set_tp_comm(mg_model *m, const mg_tp_comm *c);
mg_status mg_model_tp_failure(mg_model *m);

/* Move the gradient arena to caller-owned storage of arena_size floats
 * (e.g. group shared memory for DDP); current gradients are copied. The
 * caller keeps ownership and must outlive the model's use of it. NULL
 * moves the gradients back to the model's own arena. */
void mg_model_set_grad_storage(mg_model *m, float *grads);
void mg_model_set_training(mg_model *m, bool training);
bool mg_model_training(const mg_model *m);
/* Seed of dropout masks (a counter-based stream, advanced per step). */
void mg_model_set_dropout_seed(mg_model *m, uint64_t seed);

/* ---- Units ------------------------------------------------------------
 * Unit i in forward order: its name (the layer path, e.g. "h.0"; the kind
 * for an unnamed layer), its padded parameter range [lo, hi) of the
 * arena (lo == hi: no parameters), the parameters in it, its forward
 * FLOPs per sample and the bytes it keeps for backward (saved) and
 * outputs per sample; what its split layers move through the
 * tensor-parallel group per sample in forward and backward (floats of
 * all-reduces of the whole vector; an all-gather or reduce-scatter counts
 * half; 0 when whole); borrows: the unit whose parameters it also reads
 * (a head tied to the embedding), or -1; and its buffers (running
 * statistics), one range of the buffer arena (empty: buf_lo == buf_hi). */
typedef struct mg_unit_info {
    const char *name, *kind;
    size_t lo, hi, numel;
    double flops;
    size_t saved_bytes, out_bytes;
    double tp_fwd_floats, tp_bwd_floats;
    int borrows;
    size_t buf_lo, buf_hi;   /* its buffers' range of the buffer arena */
} mg_unit_info;
int mg_model_num_units(const mg_model *m);
mg_unit_info mg_model_unit(const mg_model *m, int i);
/* Just the range (cheap: for hooks on the training path). */
void mg_model_unit_range(const mg_model *m, int i, size_t *lo, size_t *hi);
/* Lay the arenas out again with every unit's range a multiple of pad
 * floats (a strategy passes lcm(world size, MG_SIMD_FLOATS); the default
 * is MG_SIMD_FLOATS). Parameters keep their values; gradients are zeroed.
 * Call it before mg_model_set_grad_storage and before making optimizer
 * state. MG_ENOMEM if the new arenas cannot be allocated. */
mg_status mg_model_set_unit_pad(mg_model *m, size_t pad);
size_t mg_model_unit_pad(const mg_model *m);

/* Hooks around each unit's work, called with the tape of the pass (the
 * same thread), table after table in the order they were added (a
 * strategy's, a user's probe). pre_backward runs before a recomputed
 * forward too. A table must stay valid until it is removed; at most
 * MG_MAX_UNIT_HOOKS (MG_EINVAL beyond). */
typedef struct mg_unit_hooks {
    void (*pre_forward)(void *ud, mg_tape *t, int unit);
    void (*post_forward)(void *ud, mg_tape *t, int unit);
    void (*pre_backward)(void *ud, mg_tape *t, int unit);
    void (*post_backward)(void *ud, mg_tape *t, int unit);
} mg_unit_hooks;
#define MG_MAX_UNIT_HOOKS 4
mg_status mg_model_add_hooks(mg_model *m, const mg_unit_hooks *h, void *ud);
void mg_model_remove_hooks(mg_model *m, const mg_unit_hooks *h, void *ud);
int mg_model_num_hooks(const mg_model *m);

/* Activation recomputation: units share one block for what they keep from
 * forward to backward and run their forward again just before their
 * backward (as torch.utils.checkpoint on every unit): less memory, about
 * one more forward of time, the same numbers bit for bit. Tapes made
 * before a change (of this or of mg_model_set_input_grad) must be made
 * again. */
void mg_model_set_recompute(mg_model *m, bool on);
bool mg_model_recompute(const mg_model *m);

/* ---- Tapes -------------------------------------------------------------
 * A tape holds one micro-batch's forward for its backward: sized for
 * batches up to max_batch and touched at creation. Forward never
 * allocates: a larger batch is refused (NULL, MG_EINVAL). By default the
 * backward accumulates into the model's gradient arena and a training
 * forward updates the model's buffers (running statistics); set_grads and
 * set_buffers point them elsewhere (arenas of the model's layout, e.g. a
 * DataParallel thread's own). Training mode and the dropout position are
 * the model's at the forward; the backward reuses them. */
mg_status mg_tape_create(mg_model *m, int max_batch, mg_tape **out);
/* A tape of units [first, last) only (a pipeline stage's part of the
 * model), holding only their memory. Its forward takes unit first's
 * input (the model's input when first is 0; else activations of
 * in_floats per sample) and gives unit last-1's output (the logits when
 * last is the number of units; else out_floats per sample); its loss
 * needs last to be the end, and mg_tape_backward_from takes the output's
 * gradient. With first > 0 the backward leaves the input's gradient in
 * mg_tape_input_grad (zeros when no unit before first has parameters).
 * Hooks are called with the model's unit indices. MG_EINVAL unless
 * 0 <= first < last <= units. */
mg_status mg_tape_create_range(mg_model *m, int max_batch, int first, int last, mg_tape **out);
void mg_tape_range(const mg_tape *t, int *first, int *last, size_t *in_floats,
                   size_t *out_floats);
void mg_tape_destroy(mg_tape *t);
size_t mg_tape_bytes(const mg_tape *t);   /* activation memory */
/* What mg_tape_create_range(m, max_batch, first, last) would hold, with
 * the model's recomputation setting, without making it (a planner's
 * figure: exact). */
size_t mg_tape_bytes_for(const mg_model *m, int max_batch, int first, int last);
/* Whether t's model has changed its layout since t was made (moved to
 * another device, input gradients or recomputation switched): a stale
 * tape cannot run; make a new one. True for NULL. */
bool mg_tape_stale(const mg_tape *t);
int mg_tape_capacity(const mg_tape *t);
void mg_tape_set_grads(mg_tape *t, float *grads);
/* Gradient windows: the backward writes the gradients of the arena range
 * [lo, hi) (whole tensors) into buf (hi - lo floats, accumulating as into
 * the arena) instead; slot 0..MG_GRAD_WINDOWS-1, buf NULL clears it. A
 * sharded strategy's hooks point each bucket at a buffer of its own so
 * the arena outside the rank's shard is never written. */
#define MG_GRAD_WINDOWS 4
typedef struct mg_grad_window { size_t lo, hi; float *buf; } mg_grad_window;
void mg_tape_set_grad_window(mg_tape *t, int slot, size_t lo, size_t hi, float *buf);
/* Borrowed gradients kept apart: the gradients a unit takes for the
 * parameters it borrows (a tied head's for the embedding's weight) in the
 * arena range [lo, hi) go into buf (hi - lo floats, on the model's device,
 * accumulating) instead of adding into the lender's, which then holds the
 * lender's own contribution only; buf NULL: as usual. A tape's own setting
 * wins; the model's (mg_model_set_borrowed_grads) holds for the tapes that
 * write the model's gradient arena (not those given their own by
 * mg_tape_set_grads). --deterministic sums the two parts apart so that
 * every plan adds them in the same place. */
void mg_tape_set_borrowed_grads(mg_tape *t, size_t lo, size_t hi, float *buf);
void mg_model_set_borrowed_grads(mg_model *m, size_t lo, size_t hi, float *buf);
/* Fixed sums (--deterministic under tensor parallelism): every product a
 * tensor-parallel split cuts (the split dimension of a column- or
 * row-parallel linear, the vocabulary of the tied head and of the loss)
 * is computed in `chunks` fixed chunks of that dimension, one GEMM each,
 * and a sum over it in the binary tree over the chunks, whatever tp size
 * T (it divides chunks) holds them: the same bits at tp = 1, 2, ...,
 * chunks. Layers the split never cuts run as before. chunks: a power of
 * two up to 64 that every split dimension's blocks divide (MG_EINVAL, one line),
 * 0: off (the default). On the CPU, without sequence parallelism. */
mg_status mg_model_set_fixed_sums(mg_model *m, int chunks);
int mg_model_fixed_sums(const mg_model *m);
void mg_tape_set_buffers(mg_tape *t, float *buffers);
mg_model *mg_tape_model(const mg_tape *t);
/* The next forward draws dropout at position `step` and leaves the
 * model's counter alone (threads sharing a model at one position). */
void mg_tape_pin_step(mg_tape *t, uint64_t step);
/* As mg_model_forward (and _tokens, _loss, _backward, _backward_from,
 * _input_grad) on the given tape; the logits stay valid until the tape's
 * next forward. For a model on a device, the input and dout may be in
 * host memory (copied in) or in the device's (a pipeline stage's received
 * activations and gradients: read there, as the input stays until the
 * backward). */
const float *mg_tape_forward(mg_tape *t, const float *x, int batch);
const float *mg_tape_forward_tokens(mg_tape *t, const int32_t *tokens, int batch);
float mg_tape_loss(mg_tape *t, const int32_t *labels, int *correct);
/* Between a loss and its backward: the loss's gradient times w (a
 * micro-batch's weight in its step, mg_micro_batch). */
void mg_tape_weigh_loss(mg_tape *t, float w);
void mg_tape_backward(mg_tape *t);
void mg_tape_backward_from(mg_tape *t, const float *dout);
/* The tape's own buffer for that dout (batch * outputs per sample floats,
 * on the tape's device), valid from a forward to its backward: a caller
 * may write the gradient there (a pipeline stage receives it there) and
 * pass this pointer, and then nothing is copied. */
float *mg_tape_output_grad(mg_tape *t);
const float *mg_tape_input_grad(const mg_tape *t);
const float *mg_tape_logits(const mg_tape *t);
/* The last forward's output, batch * outputs per sample floats, into
 * host memory dst (from the device for a model on one). Logits split over
 * the vocabulary come whole (batch * positions * mg_model_classes floats,
 * gathered: collective over the tensor-parallel group). */
void mg_tape_logits_to_host(const mg_tape *t, float *dst);

/* ---- The model's own tape ----------------------------------------------
 * Size it for batches up to max_batch (once; a larger batch later makes it
 * again, an allocation). */
mg_status mg_model_reserve(mg_model *m, int max_batch);
mg_tape *mg_model_tape(mg_model *m);
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
 * is not a language model, a prompt token outside the vocabulary, a
 * temperature that is negative or no number, n < 0, or NULL arrays. */
mg_status mg_model_generate(mg_model *m, const int32_t *prompt, int n_prompt, int n,
                            float temperature, int top_k, uint64_t seed, int32_t *out);
/* The same loop over any forward of model (a pipeline's): forward gives
 * the logits [positions, vocab] of a context of `positions` tokens (NULL:
 * failed, mg_last_error says why); share (may be NULL) may replace each
 * picked token (a pipeline's last stage picks and the others take its;
 * a failure stops). Training mode is off meanwhile. */
typedef struct mg_lm_forward {
    const float *(*forward)(void *ud, const int32_t *ctx);
    mg_status (*share)(void *ud, int32_t *tok);
    void *ud;
    mg_model *model;
    int positions, vocab;
} mg_lm_forward;
mg_status mg_generate(const mg_lm_forward *f, const int32_t *prompt, int n_prompt, int n,
                      float temperature, int top_k, uint64_t seed, int32_t *out);
/* Mean softmax cross-entropy of the last forward against labels (one per
 * position: batch * positions of them); prepares
 * the logits' gradient for backward; *correct (may be NULL) gets the
 * number of argmax hits. */
float mg_model_loss(mg_model *m, const int32_t *labels, int *correct);
/* As mg_tape_weigh_loss, on the model's tape. */
void mg_model_weigh_loss(mg_model *m, float w);
/* Backward of the last forward and loss: accumulates into the gradient
 * arena, calling the unit hooks around each unit. */
void mg_model_backward(mg_model *m);
void mg_model_zero_grad(mg_model *m);

/* Position of the dropout stream (checkpointed so a resumed run draws the
 * same masks). */
uint64_t mg_model_rng_counter(const mg_model *m);
void mg_model_set_rng_counter(mg_model *m, uint64_t counter);

/* Also compute d(loss)/d(input) in backward (pipeline stages, tests); set
 * before making tapes. The gradient is valid after mg_model_backward. */
void mg_model_set_input_grad(mg_model *m, bool on);
const float *mg_model_input_grad(const mg_model *m);
/* Backward from a given gradient of the output [batch, classes] instead of
 * the loss's (a custom loss, a pipeline stage). */
void mg_model_backward_from(mg_model *m, const float *dout);

/* ---- Building models from layers ------------------------------------
 * Layers are created unattached and owned by the composite or model they
 * are given to (also when that call fails). A NULL or empty name inside a
 * Sequential becomes the child's index, as in torch.nn.Sequential;
 * parameters are named "<path>.weight". Constructors return NULL, with
 * mg_last_error saying why, when memory runs out or a size breaks their
 * rule (MG_EINVAL: a size below 1, heads that do not divide the features,
 * dropout p outside [0, 1)); composites then free their children and pass
 * the NULL on, and mg_model_create_from reports it. */
typedef struct mg_layer mg_layer;
typedef enum { MG_INIT_TORCH_DEFAULT, MG_INIT_NORMAL } mg_init_kind;

/* y = x W^T + b (input [c,h,w] flattened channel-major), then ReLU if relu. */
mg_layer *mg_layer_linear(const char *name, int in, int out, bool relu);
/* mg_layer_linear of logical sizes in -> out, split over tp as role says
 * (column: out / tp.size outputs; row: in / tp.size inputs, outputs summed
 * over the group); the split size must divide (NULL and MG_EINVAL otherwise). */
mg_layer *mg_layer_linear_split(const char *name, int in, int out, bool relu, mg_tp_role role,
                                mg_tp_split tp);
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
    /* Tensor parallelism: this process's part (c_attn and mlp.c_fc
     * column-parallel, with whole heads per rank; both c_proj row-parallel;
     * wte split over the vocabulary); heads and vocab must divide. */
    mg_tp_split tp;
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
 * (may be NULL) gets d(loss)/d(logits). Returns the loss (NaN when a
 * label lies outside [0, classes)); *correct (may be NULL) the number of
 * rows whose argmax equals the label. On the current device (device.h)
 * when one is set. */
float mg_softmax_xent(const float *logits, const int32_t *labels, int n,
                      int classes, float *dlogits, int *correct);

#ifdef __cplusplus
}
#endif
#endif
