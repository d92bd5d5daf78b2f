/* multigrad — the layer interface inside src/nn (ggml's "interface +
 * context" style): every layer is a struct that starts with mg_layer, whose
 * vtable gives shape inference, memory sizes, forward and backward.
 *
 * Memory: a layer never allocates while training. At mg_model_reserve()
 * each layer states what it keeps from forward to backward (`saved`, per
 * max batch) and what it needs only during one call (`scratch`); the model
 * carves one block for all of it. Composite layers (Sequential, Residual)
 * carve their children's parts out of their own.
 *
 * Backward contract: dy may be overwritten by the layer; dx (NULL when no
 * earlier layer needs it) is overwritten; parameter gradients accumulate. */
#ifndef MG_NN_LAYER_H
#define MG_NN_LAYER_H

#include "multigrad/nn.h"

#define MG__MAX_LAYER_PARAMS 4

typedef struct mg_ctx {
    bool training;
    uint64_t dropout_seed;
    uint64_t step;        /* training forwards so far: the dropout counter */
    float *scratch;       /* this call's workspace */
} mg_ctx;

typedef struct mg_layer_param {
    const char *suffix;   /* "weight", "bias", "running_mean", ... */
    int ndim;
    int shape[MG_MAX_DIMS];
    size_t numel;
    bool is_buffer;
    float *data, *grad;   /* bound by the model; grad NULL for buffers */
} mg_layer_param;

typedef struct mg_layer_vt {
    const char *kind;
    /* Output shape [c, h, w] from the input's; MG_EINVAL with a message if
     * the input does not fit. Composite layers set up their children. */
    mg_status (*setup)(mg_layer *l, const int in[3], int out[3]);
    /* Bytes kept from forward to backward for n images, and floats of
     * scratch needed within one forward or backward call. */
    void (*sizes)(const mg_layer *l, int n, size_t *saved, size_t *scratch);
    /* Optional: after l->saved is set, hand parts to children. */
    void (*bind)(mg_layer *l, int n);
    /* Optional: after need_dx is set, tell children. */
    void (*propagate)(mg_layer *l);
    void (*forward)(mg_layer *l, const mg_ctx *c, const float *x, float *y, int n);
    void (*backward)(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                     float *dy, float *dx, int n);
    /* Optional: parameter initialisation other than mg__layer_init_default. */
    void (*init)(mg_layer *l, mg_rng *r);
    /* Optional: FLOPs of one image's forward (2 per multiply-add; the
     * elementwise work is not counted). */
    double (*flops)(const mg_layer *l);
    /* Optional: free what the layer owns beyond the struct and children. */
    void (*destroy)(mg_layer *l);
} mg_layer_vt;

struct mg_layer {
    const mg_layer_vt *vt;
    char name[48];
    bool anonymous;             /* adds no component to tensor names */
    int in[3], out[3];          /* per image, set by setup */
    bool need_dx;               /* the input gradient is used */
    int id;                     /* position in the model (dropout streams) */
    int n_params;
    mg_layer_param p[MG__MAX_LAYER_PARAMS];
    int n_child;
    mg_layer **child;
    mg_init_kind init_kind;
    float init_std;
    char *saved;                /* kept from forward to backward */
};

/* Allocates a zeroed layer of `size` bytes (a struct starting with
 * mg_layer); NULL on allocation failure. */
mg_layer *mg__layer_alloc(size_t size, const mg_layer_vt *vt, const char *name);
/* Declares a parameter (or buffer) of the layer. */
void mg__layer_param(mg_layer *l, const char *suffix, bool is_buffer, int ndim,
                     const int *shape);
/* PyTorch's default (kaiming_uniform(a=sqrt(5)) and the matching bias
 * bound: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both) or N(0, std^2)
 * weights with zero bias, as l->init_kind says. */
void mg__layer_init_default(mg_layer *l, mg_rng *r);
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
char *mg__bind_children(mg_layer *l, int n);
/* Gives child ch its saved memory at p; returns the first byte after it. */
char *mg__bind_child(mg_layer *ch, int n, char *p);

/* A sequence model's output per sample is `positions` rows of logits
 * (the language model's [T, vocab]); labels are per position. */
void mg__model_set_positions(mg_model *m, int positions);

/* Sequential's backward with a callback after each child (the model's
 * gradient hook). */
typedef void (*mg__child_done)(void *ud, int child);
void mg__seq_backward(mg_layer *l, const mg_ctx *c, const float *x, const float *y,
                      float *dy, float *dx, int n, mg__child_done done, void *ud);

#endif
