/* The model zoo, exactly as ../shared/models.md defines it: layers,
 * shapes, parameter names, initialisation and default hyper-parameters.
 * ReLU and 2x2 pooling are fused into the convolutions (same arithmetic,
 * one pass fewer over the largest activations); the MLP takes [1, 1, 784]. */
#include <string.h>
#include "nn/layer.h"

static mg_layer *build_lenet_d2l(void)
{
    mg_layer *l[] = {
        mg_layer_conv2d("conv1", 1, 20, 3, 1, 0, true, MG_POOL_AVG),
        mg_layer_conv2d("conv2", 20, 50, 5, 1, 0, true, MG_POOL_AVG),
        mg_layer_linear("fc1", 800, 128, true),
        mg_layer_linear("fc2", 128, 10, false),
    };
    mg_layer *root = mg_layer_sequential(NULL, l, 4);
    mg_layer_set_init(root, MG_INIT_NORMAL, 0.01f);
    return root;
}

static mg_layer *build_lenet5(void)
{
    mg_layer *l[] = {
        mg_layer_conv2d("conv1", 1, 6, 5, 1, 2, true, MG_POOL_MAX),
        mg_layer_conv2d("conv2", 6, 16, 5, 1, 0, true, MG_POOL_MAX),
        mg_layer_linear("fc1", 400, 120, true),
        mg_layer_linear("fc2", 120, 84, true),
        mg_layer_linear("fc3", 84, 10, false),
    };
    return mg_layer_sequential(NULL, l, 5);
}

static mg_layer *build_mlp(void)
{
    mg_layer *l[] = {
        mg_layer_linear("fc1", 784, 512, true),
        mg_layer_linear("fc2", 512, 256, true),
        mg_layer_linear("fc3", 256, 10, false),
    };
    return mg_layer_sequential(NULL, l, 3);
}

typedef struct {
    const char *name;
    mg_layer *(*build)(void);
    int c, h, w;
    mg_zoo_defaults d;
} zoo_entry;

#define IMAGE_SGD(b_, lr_, mom_, norm_)                                                 \
    {.batch = b_, .lr = lr_, .momentum = mom_, .epochs = 10, .normalized_input = norm_,   \
     .optimizer = MG_OPTIM_SGD, .beta2 = 0.999f}

/* gpt-mini is built by mg_model_create_gpt (any size); build is NULL. */
static const zoo_entry zoo[] = {
    {"mlp", build_mlp, 1, 1, 784, IMAGE_SGD(128, 0.05f, 0.9f, true)},
    {"lenet-d2l", build_lenet_d2l, 1, 28, 28, IMAGE_SGD(256, 0.2f, 0.0f, false)},
    {"lenet5", build_lenet5, 1, 28, 28, IMAGE_SGD(128, 0.05f, 0.9f, true)},
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
    *out = NULL;
    const zoo_entry *e = find(name);
    if (!e) return unknown(name);
    if (!e->build) {
        mg_gpt_config g = mg_gpt_defaults();
        return mg_model_create_gpt(&g, seed, out);
    }
    return mg_model_create_from(e->name, e->build(), e->c, e->h, e->w, seed, out);
}
