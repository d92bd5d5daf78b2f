/* multigrad — the layer interface inside src/nn (ggml's "interface +
 * context" style): every layer is a struct that starts with mg_layer, whose
 * vtable gives shape inference, memory sizes, forward and backward.
 *
 * Memory: a layer never allocates while training and keeps no per-call
 * state. Each layer states what it keeps from forward to backward (`saved`,
 * per batch) and what it needs only during one call (`scratch`); a tape
 * (mg_tape, one per micro-batch in flight) carves one block for all of it.
 * A layer reaches its part through the tape's slots, which the call's
 * context carries: slot l->slot is its saved memory, the next n_slots - 1
 * are pointers it derives from it at bind time (Sequential: its children's
 * outputs). Composite layers carve their children's parts out of their own.
 * Gradients and buffer updates also go where the context says, so several
 * tapes (DataParallel threads) can run on one model at once.
 *
 * Backward contract: dy may be overwritten by the layer; dx (NULL when no
 * earlier layer needs it) is overwritten; parameter gradients accumulate. */
#ifndef MG_NN_LAYER_H
#define MG_NN_LAYER_H

#include "multigrad/nn.h"

#define MG__MAX_LAYER_PARAMS 4

/* A split model's tensor-parallel group, as its layers see it: its part,
 * the plan's callbacks, and the first failure of one (later calls then do
 * nothing: the step fails as a whole, mg_model_tp_failure). */
typedef struct mg__tp {
    mg_tp_split split;
    mg_tp_comm comm;
    mg_status failed;
} mg__tp;

typedef struct mg_ctx {
    mg__tp *tp;           /* the model's group (NULL: a whole model) */
    bool training;
    bool recompute;       /* a forward run again before its backward: updates no state */
    bool bf16_kept;       /* the tape was sized with the GEMMs rounding to bfloat16: a
                             layer's memory holds room for the rounded operands it keeps,
                             and attention's for the path of that precision */
    uint64_t dropout_seed;
    uint64_t step;        /* the dropout counter of this forward */
    float *scratch;       /* this call's workspace */
    char **slot;          /* the tape's memory of each layer (see above) */
    float *grads;         /* the gradient arena backward accumulates into */
    float *buffers;       /* the buffer arena a training forward updates */
    const mg_grad_window *win;   /* the tape's gradient windows (MG_GRAD_WINDOWS) */
    const mg_grad_window *borrowed;   /* borrowed parameters' gradients (NULL: none) */
} mg_ctx;

typedef struct mg_layer_param {
    const char *suffix;   /* "weight", "bias", "running_mean", ... */
    int ndim;
    int shape[MG_MAX_DIMS];
    size_t numel;
    bool is_buffer;
    size_t off;           /* into the parameter (or buffer) arena */
    float *data;          /* bound by the model */
    const char *name;     /* the tensor's whole name (the model's) */
    mg_placement place;   /* where it lies in the logical tensor (MG_WHOLE) */
    bool grad_partial;    /* mg_param.grad_partial */
} mg_layer_param;

/* Initialisation by counter: logical element k of a parameter named N is
 * value k of the stream mg_rng_seed_for(seed, N), so any part of the parameters
 * is drawn alone and equals its part of the whole. Only the elements of
 * the parameter arena inside ranges r (floats; NULL: all) are written;
 * buffers always. */
typedef struct mg_init {
    uint64_t seed;
    const mg_range *r;
    int nr;
} mg_init;
typedef enum { MG__FILL_CONST, MG__FILL_UNIFORM, MG__FILL_NORMAL } mg_fill;
/* p's elements (those c asks for): a constant a, U(-a, a) or N(0, a^2). */
void mg__init_fill(const mg_init *c, const mg_layer_param *p, mg_fill f, float a);

typedef struct mg_layer_vt {
    const char *kind;
    /* Output shape [c, h, w] from the input's; MG_EINVAL with a message if
     * the input does not fit. Composite layers set up their children. */
    mg_status (*setup)(mg_layer *l, const int in[3], int out[3]);
    /* Bytes kept from forward to backward for n images, and floats of
     * scratch needed within one forward or backward call. */
    void (*sizes)(const mg_layer *l, int n, size_t *saved, size_t *scratch);
    /* Optional: with slot[l->slot] set to the saved memory for n images,
     * fill the layer's other slots and hand parts to children. */
    void (*bind)(mg_layer *l, int n, char **slot);
    /* Optional: after need_dx is set, tell children. */
    void (*propagate)(mg_layer *l);
    void (*forward)(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n);
    void (*backward)(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                     float *dy, float *dx, int n);
    /* Optional: parameter initialisation other than mg__layer_init_default. */
    void (*init)(mg_layer *l, const mg_init *c);
    /* Optional: FLOPs of one image's forward (2 per multiply-add; the
     * elementwise work is not counted). */
    double (*flops)(const mg_layer *l);
    /* Optional: free what the layer owns beyond the struct and children. */
    void (*destroy)(mg_layer *l);
    /* Optional: the layer whose parameters this one also reads (a head
     * tied to an embedding), so a strategy keeps them at hand for both. */
    const mg_layer *(*borrows)(const mg_layer *l);
    /* Optional, split layers: what one image's forward and backward move
     * through the tensor-parallel group, in floats of all-reduces of the
     * whole vector (an all-gather or a reduce-scatter of it counts half:
     * a ring moves that much), for the planner's cost model. */
    void (*tp_floats)(const mg_layer *l, double *fwd, double *bwd);
    /* Its forward and backward call only kernels of tensor.h that have
     * device versions (src/device/kernels.cu), so it runs on a device. */
    bool on_device;
} mg_layer_vt;

struct mg_layer {
    const mg_layer_vt *vt;
    char name[48];
    bool anonymous;             /* adds no component to tensor names */
    int in[3], out[3];          /* per image, set by setup */
    bool need_dx;               /* the input gradient is used */
    int id;                     /* position in the model (dropout streams) */
    int slot, n_slots;          /* the layer's slots in a tape (n_slots >= 1) */
    int n_params;
    mg_layer_param p[MG__MAX_LAYER_PARAMS];
    int n_child;
    mg_layer **child;
    mg_init_kind init_kind;
    float init_std;
    mg_tp_split tp;             /* a split layer's part (size 0 or 1: whole) */
    int chunks;                 /* fixed sums: its local chunks of the split dimension (0: off) */
};

/* A layer's memory in the call's tape, its k-th slot, the gradient of its
 * parameter i and the running value of its buffer i. */
static inline char *mg__saved(const mg_layer *l, const mg_ctx *c) { return c->slot[l->slot]; }
static inline char *mg__slot(const mg_layer *l, const mg_ctx *c, int k)
{
    return c->slot[l->slot + k];
}
/* A parameter's gradient: in a window of the tape when one holds its
 * offset (a sharded strategy's bucket buffer), else in the arena. */
static inline float *mg__grad(const mg_layer *l, const mg_ctx *c, int i)
{
    size_t off = l->p[i].off;
    for (int k = 0; c->win && k < MG_GRAD_WINDOWS; k++)
        if (c->win[k].buf && c->win[k].lo <= off && off < c->win[k].hi)
            return c->win[k].buf + (off - c->win[k].lo);
    return c->grads + off;
}
/* The gradient a layer takes for parameter i of a layer it borrows (a
 * tied head's for the embedding's weight): into the borrowed-gradient
 * window when one holds it (the two contributions kept apart), else where
 * the lender's own goes. */
static inline float *mg__borrowed_grad(const mg_layer *l, const mg_ctx *c, int i)
{
    size_t off = l->p[i].off;
    if (c->borrowed && c->borrowed->lo <= off && off < c->borrowed->hi)
        return c->borrowed->buf + (off - c->borrowed->lo);
    return mg__grad(l, c, i);
}
static inline float *mg__buffer(const mg_layer *l, const mg_ctx *c, int i)
{
    return c->buffers + l->p[i].off;
}

/* Tensor parallelism (tensor_parallel.c). The sum (max: the maximum) of
 * x [n] over the group, in place; nothing after a failure, which it
 * records. */
void mg__tp_all_reduce(const mg_ctx *c, float *x, size_t n, bool max);
/* The region mappings of a split layer l, over the `rows` positions
 * (rows of w floats) it computes on. all_rows: all of them from this
 * rank's x: gathered into buf with sequence parallelism (x holds 1/size
 * of them), else x itself. sum_rows: the sum over the group of every
 * rank's partial part: with sequence parallelism this rank's 1/size of
 * the positions into out, else all of them in place (part == out);
 * returns the rows out holds. Nothing for a layer that is not split. */
const float *mg__tp_all_rows(const mg_layer *l, const mg_ctx *c, const float *x, size_t rows,
                             size_t w, float *buf);
size_t mg__tp_sum_rows(const mg_layer *l, const mg_ctx *c, float *part, float *out, size_t rows,
                       size_t w);
/* Sequence parallelism: the layer's activations outside the split
 * regions are 1/size of the rows. */
static inline bool mg__seq_split(const mg_layer *l) { return l->tp.size > 1 && l->tp.sequence; }
/* Whether a layer's split makes it communicate. */
static inline bool mg__split(const mg_layer *l) { return l->tp.size > 1; }
static inline int mg__tp_size(const mg_layer *l) { return l->tp.size > 1 ? l->tp.size : 1; }
/* Fixed sums (mg_model_set_fixed_sums): parts holds nl blocks of n
 * floats, this rank's consecutive chunks of a split dimension's products,
 * and room for T more; out gets their sum over all C = nl T chunks in one
 * binary tree (this rank's subtree, then the T ranks' roots gathered and
 * summed in the upper levels on every rank): the same bits at any T that
 * divides C. T > 1 needs c's group (an all-gather). */
void mg__fixed_sum(const mg_ctx *c, int T, float *parts, int nl, size_t n, float *out);
/* mg_softmax_xent (loss.c) of n rows of `classes` logits that are this
 * rank's columns [lo, lo + classes) of logits split over the vocabulary
 * (labels logical): three all-reduces of n floats over c's group (the
 * maxima, the sums of exponentials with the label's logits, and, with
 * correct, the argmax). c NULL: whole logits (lo 0). ws holds 4 n floats
 * of the current device. chunks: fixed sums' chunks of these columns (the
 * sum of exponentials in them, then a tree over every rank's; ws then
 * holds (4 + chunks + T) n floats), or 0. */
float mg__softmax_xent(const mg_ctx *c, const float *logits, const int32_t *labels, int n,
                       int classes, int lo, float *dlogits, int *correct, float *ws, int chunks);
/* Linear layers split over tp (linear.c), with parameters placed: stride
 * blocks of a column-parallel weight (qkv's three) split each. */
mg_layer *mg__layer_linear_split(const char *name, int in, int out, bool relu, bool rows,
                                 mg_tp_role role, mg_tp_split tp, int stride);

/* Allocates a zeroed layer of `size` bytes (a struct starting with
 * mg_layer); NULL on allocation failure. */
mg_layer *mg__layer_alloc(size_t size, const mg_layer_vt *vt, const char *name);
/* Declares a parameter (or buffer) of the layer. */
void mg__layer_param(mg_layer *l, const char *suffix, bool is_buffer, int ndim,
                     const int *shape);
/* PyTorch's default (kaiming_uniform(a=sqrt(5)) and the matching bias
 * bound: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both) or N(0, std^2)
 * weights with zero bias, as l->init_kind says. */
void mg__layer_init_default(mg_layer *l, const mg_init *c);
bool mg__layer_has_params(const mg_layer *l);   /* this layer or a child */
size_t mg__per_image(const int s[3]);
/* Round a byte count up to MG_ALIGN. */
size_t mg__align(size_t bytes);

/* Shared pieces of layers: no saved or scratch memory; output shape =
 * input shape; children's saved memory side by side (the largest child
 * scratch is enough, children run one at a time); binding them returns
 * the first byte after theirs. */
void mg__no_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch);
mg_status mg__same_setup(mg_layer *l, const int in[3], int out[3]);
void mg__children_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch);
char *mg__bind_children(mg_layer *l, int n, char **slot);
/* Gives child ch its saved memory at p; returns the first byte after it. */
char *mg__bind_child(mg_layer *ch, int n, char *p, char **slot);
/* The aligned bytes a layer keeps for n images. */
size_t mg__saved_bytes(const mg_layer *l, int n);

/* A model whose logits are split over the vocabulary (its tied head's
 * part of a tensor-parallel split): its loss is the parallel one. */
void mg__model_set_vocab_split(mg_model *m);

/* A sequence model's output per sample is `positions` rows of logits
 * (the language model's [T, vocab]); labels are per position. */
void mg__model_set_positions(mg_model *m, int positions);

/* Sequential's forward and backward with calls around each child (the
 * model's unit hooks); with `recompute`, backward runs each child's
 * forward again (as a recomputation, c->recompute) before its backward
 * where rerun says so. A
 * Sequential's slot 1 + i holds child i's output (i < n_child - 1). */
typedef struct mg__seq_calls {
    void (*before)(void *ud, int child, bool backward);
    void (*after)(void *ud, int child, bool backward);
    void *ud;
    bool recompute;
    const bool *rerun;   /* recompute: child i's forward runs again (its memory was reused) */
    /* last > 0: only children [first, last) run (a pipeline stage), x is
     * child first's input and y child last-1's output, the gradients
     * between them pass through gbuf[0] and gbuf[1] (each as large as
     * the largest output before the last), and the scratch is the
     * children's alone. */
    int first, last;
    float *gbuf[2];
} mg__seq_calls;
void mg__seq_forward(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n,
                     const mg__seq_calls *k);
void mg__seq_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                      float *dy, float *dx, int n, const mg__seq_calls *k);
bool mg__is_sequential(const mg_layer *l);
int mg__embedding_vocab(const mg_layer *l);   /* its whole vocabulary; 0: not an embedding */
/* A public constructor's rule on its sizes: NULL and MG_EINVAL with the
 * message when it is broken (nn.h). */
#define MG__LAYER_RULE(cond, ...)                                             \
    do {                                                                      \
        if (!(cond)) {                                                        \
            mg_error(MG_EINVAL, __VA_ARGS__);                                 \
            return NULL;                                                      \
        }                                                                     \
    } while (0)

#endif
