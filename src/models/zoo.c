/* The model zoo, exactly as ../shared/models.md defines it: layers,
 * shapes, parameter names, initialisation and default hyper-parameters.
 * ReLU and 2x2 pooling are fused into the convolutions (same arithmetic,
 * one pass fewer over the largest activations); the MLP takes [1, 1, 784]. */
#include <string.h>
#include "nn/layer.h"

/* Split for tensor parallelism (tp.size > 1), the fully connected layers
 * go in column-then-row pairs (Megatron-LM's MLP): the pair's hidden
 * activations are split, its output summed over the group. */
static mg_layer *fc(const char *name, int in, int out, bool relu, mg_tp_role role,
                    mg_tp_split tp)
{
    return mg_layer_linear_split(name, in, out, relu, role, tp);
}

static mg_layer *build_lenet_d2l(mg_tp_split tp)
{
    mg_layer *l[] = {
        mg_layer_conv2d("conv1", 1, 20, 3, 1, 0, true, MG_POOL_AVG),
        mg_layer_conv2d("conv2", 20, 50, 5, 1, 0, true, MG_POOL_AVG),
        fc("fc1", 800, 128, true, MG_TP_COLUMN, tp),
        fc("fc2", 128, 10, false, MG_TP_ROW, tp),
    };
    mg_layer *root = mg_layer_sequential(NULL, l, 4);
    mg_layer_set_init(root, MG_INIT_NORMAL, 0.01f);
    return root;
}

static mg_layer *build_lenet5(mg_tp_split tp)
{
    mg_layer *l[] = {
        mg_layer_conv2d("conv1", 1, 6, 5, 1, 2, true, MG_POOL_MAX),
        mg_layer_conv2d("conv2", 6, 16, 5, 1, 0, true, MG_POOL_MAX),
        fc("fc1", 400, 120, true, MG_TP_COLUMN, tp),
        fc("fc2", 120, 84, true, MG_TP_ROW, tp),
        mg_layer_linear("fc3", 84, 10, false),
    };
    return mg_layer_sequential(NULL, l, 5);
}

static mg_layer *build_mlp(mg_tp_split tp)
{
    mg_layer *l[] = {
        fc("fc1", 784, 512, true, MG_TP_COLUMN, tp),
        fc("fc2", 512, 256, true, MG_TP_ROW, tp),
        mg_layer_linear("fc3", 256, 10, false),
    };
    return mg_layer_sequential(NULL, l, 3);
}

typedef struct {
    const char *name;
    mg_layer *(*build)(mg_tp_split tp);
    int c, h, w;
    mg_zoo_defaults d;
    int split;   /* the width its split pair divides (fc1's outputs) */
} zoo_entry;

#define IMAGE_SGD(b_, lr_, mom_, norm_)                                                 \
    {.batch = b_, .lr = lr_, .momentum = mom_, .epochs = 10, .normalized_input = norm_,   \
     .optimizer = MG_OPTIM_SGD, .beta2 = 0.999f}

/* gpt-mini is built by mg_model_create_gpt (any size); build is NULL. */
static const zoo_entry zoo[] = {
    {"mlp", build_mlp, 1, 1, 784, IMAGE_SGD(128, 0.05f, 0.9f, true), 512},
    {"lenet-d2l", build_lenet_d2l, 1, 28, 28, IMAGE_SGD(256, 0.2f, 0.0f, false), 128},
    {"lenet5", build_lenet5, 1, 28, 28, IMAGE_SGD(128, 0.05f, 0.9f, true), 120},
    {"gpt-mini", NULL, 0, 0, 0,
     {.batch = 32, .lr = 1e-3f, .language_model = true, .steps = 2000, .eval_every = 250,
      .optimizer = MG_OPTIM_ADAMW, .beta2 = 0.99f, .weight_decay = 0.1f, .clip_grad = 1.0f}},
};
#define N_ZOO ((int)(sizeof zoo / sizeof zoo[0]))

static const char *const zoo_names[] = {"mlp", "lenet-d2l", "lenet5", "gpt-mini", NULL};

const char *const *mg_model_names(void) { return zoo_names; }

static const zoo_entry *find(const char *name)
{
    for (int i = 0; name && i < N_ZOO; i++)
        if (strcmp(zoo[i].name, name) == 0) return &zoo[i];
    return NULL;
}

static mg_status unknown(const char *name)
{
    return mg_error(MG_EINVAL, "unknown model '%s'; choose one of: mlp, lenet-d2l, lenet5, gpt-mini",
                    name ? name : "(null)");
}

mg_status mg_zoo_defaults_of(const char *name, mg_zoo_defaults *out)
{
    const zoo_entry *e = find(name);
    if (!e) return unknown(name);
    *out = e->d;
    return MG_OK;
}

mg_status mg_model_create(const char *name, uint64_t seed, mg_model **out)
{
    return mg_model_create_split(name, seed, MG_TP_NONE, out);
}

mg_status mg_model_create_split(const char *name, uint64_t seed, mg_tp_split tp, mg_model **out)
{
    MG_NEED("mg_model_create", out);
    *out = NULL;
    const zoo_entry *e = find(name);
    if (!e) return unknown(name);
    if (!e->build) {
        mg_gpt_config g = mg_gpt_defaults();
        g.tp = tp;
        return mg_model_create_gpt(&g, seed, out);
    }
    if (tp.size > 1 && tp.sequence)
        return mg_error(MG_EINVAL, "%s: sequence parallelism splits a language model's "
                        "positions; an image model has none: leave it off", name);
    if (tp.size > 1 && (e->split % tp.size || tp.rank < 0 || tp.rank >= tp.size))
        return mg_error(MG_EINVAL, "%s: its fc1 has %d outputs, which do not split over %d "
                        "tensor-parallel ranks (part %d): give a tp that divides %d", name,
                        e->split, tp.size, tp.rank, e->split);
    return mg_model_create_from(e->name, e->build(tp), e->c, e->h, e->w, seed, out);
}
