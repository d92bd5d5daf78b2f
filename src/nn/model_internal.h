/* Internal to src/nn: the model's and the tape's structures, shared by
 * model.c (building, arenas, units, devices) and tape.c (what a forward
 * keeps for its backward, and the runs over units). */
#ifndef MG_NN_MODEL_INTERNAL_H
#define MG_NN_MODEL_INTERNAL_H

#include "nn/layer.h"
#include "device/dk.h"

typedef struct unit {
    mg_layer *l;
    char name[64];
    size_t lo, hi;             /* padded range in the parameter arena */
    size_t numel;              /* parameters in it */
    int leaf0, n_leaves;       /* its layers with tensors: m->leaves[leaf0 ...] */
} unit;

struct mg_model {
    char name[32];
    mg_layer *root;            /* a Sequential whose children are the units */
    unit *units;
    int n_units;
    int in[3], classes;
    int positions;             /* rows of logits per sample (1; T for a language model) */
    size_t out_size;           /* floats of output per sample: positions * classes */
    size_t num_params, arena_size, buf_size, pad;
    float *params, *grads, *own_grads, *buffers;
    mg_param *tensors;
    int n_tensors;
    mg_layer **leaves;         /* layers with their own tensors, forward order */
    int n_leaves;
    int n_slots;               /* slots of a tape */
    struct { const mg_unit_hooks *h; void *ud; } hooks[MG_MAX_UNIT_HOOKS];
    int n_hooks;
    mg_ctx ctx;                /* training, dropout seed and counter; ctx.tp: &tp or NULL */
    mg__tp tp;                 /* its layers' tensor-parallel split (tensor_parallel.c) */
    bool vocab_split;          /* its logits are split over the vocabulary */
    bool vocab_splittable;     /* a tensor-parallel split would split them */
    int sum_chunks;            /* mg_model_set_fixed_sums (0: off) */
    bool input_grad, recompute;
    unsigned layout;           /* changes when tapes must be made again */
    mg_tape *tape;             /* the mg_model_forward family's */
    mg_grad_window borrowed;   /* mg_model_set_borrowed_grads (buf NULL: none) */
    mg_device dev;             /* where the arenas are (mg_model_to_device) */
    mg_dk *dk;                 /* its kernels; NULL on the CPU */
    bool has_values;           /* false until a deferred model is initialised */
};

/* A change of what tapes hold: tapes made before it are refused, the
 * model's own is made again at its next use (model.c). */
void mg__model_relayout(mg_model *m);

struct mg_tape {
    mg_model *m;
    unsigned layout;           /* m->layout it was made for */
    int cap;                   /* largest batch */
    int u0, u1;                /* the units it runs: [u0, u1) */
    size_t in_per, out_per;    /* floats per sample of their input and output */
    float *gbuf[2];            /* a range's gradients between its units */
    size_t bytes;
    char *mem;
    char **slot;
    bool *rerun;               /* recomputation: unit i runs its forward again */
    bool bf16_kept;            /* sized with bfloat16 GEMMs (mg_ctx.bf16_kept) */
    float *logits, *dlogits, *dinput, *scratch;
    float *grads, *buffers;    /* NULL: the model's */
    mg_grad_window win[MG_GRAD_WINDOWS];
    mg_grad_window borrowed;   /* mg_tape_set_borrowed_grads (buf NULL: none) */
    /* The last forward. */
    const float *x;
    int batch;
    uint64_t step;
    bool training, have_fwd, have_loss;
    bool pinned;               /* the next forward draws dropout at pin */
    uint64_t pin;
    /* On a device: its memory, how inputs come in (beside the kernels
     * still queued), and where labels are copied. */
    mg_device dev;
    mg_dk *dk;
    mg_dk_feed *feed;
    int32_t *dev_labels;
};

#endif
