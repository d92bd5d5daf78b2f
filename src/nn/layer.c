/* What every layer shares: allocation, parameter declaration, default
 * initialisation (PyTorch's defaults or d2l's N(0, 0.01^2)), destruction. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nn/layer.h"

mg_layer *mg__layer_alloc(size_t size, const mg_layer_vt *vt, const char *name)
{
    MG_ASSERT(size >= sizeof(mg_layer));
    mg_layer *l = calloc(1, size);
    if (!l) return mg_error(MG_ENOMEM, "layer '%s': out of memory", name ? name : ""), NULL;
    l->vt = vt;
    l->init_kind = MG_INIT_TORCH_DEFAULT;
    l->need_dx = true;
    l->n_slots = 1;
    if (name) snprintf(l->name, sizeof l->name, "%s", name);
    return l;
}

void mg__layer_param(mg_layer *l, const char *suffix, bool is_buffer, int ndim,
                     const int *shape)
{
    MG_ASSERT(l->n_params < MG__MAX_LAYER_PARAMS && ndim >= 1 && ndim <= MG_MAX_DIMS);
    mg_layer_param *p = &l->p[l->n_params++];
    p->suffix = suffix;
    p->is_buffer = is_buffer;
    p->place = MG_WHOLE;
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->numel *= (size_t)shape[i];
    }
}

void mg__init_fill(const mg_init *c, const mg_layer_param *p, mg_fill f, float a)
{
    uint64_t key = mg_rng_seed_for(c->seed, p->name);
    for (int i = 0; i < (c->r && !p->is_buffer ? c->nr : 1); i++) {
        size_t lo = 0, hi = p->numel;   /* of the parameter's elements */
        if (c->r && !p->is_buffer) {
            lo = c->r[i].lo > p->off ? c->r[i].lo - p->off : 0;
            hi = c->r[i].hi > p->off ? c->r[i].hi - p->off : 0;
            if (hi > p->numel) hi = p->numel;
        }
        for (size_t k = lo; k < hi;) {   /* by logical index, run by run */
            size_t g, n = mg_placement_run(&p->place, p->ndim, p->shape, k, &g);
            if (n > hi - k) n = hi - k;
            for (size_t j = 0; j < n; j++, g++)
                p->data[k + j] = f == MG__FILL_CONST ? a
                               : f == MG__FILL_UNIFORM ? (2.0f * mg_rng_uniform_at(key, g) - 1.0f) * a
                                                       : a * mg_rng_normal_at(key, g);
            k += n;
        }
    }
}

void mg__layer_init_default(mg_layer *l, const mg_init *c)
{
    /* fan_in of the first parameter (the weight): numel / out_features. */
    size_t fan_in = 1;
    if (l->n_params > 0 && l->p[0].shape[0] > 0) {   /* of the logical weight */
        int gs[MG_MAX_DIMS];
        mg_placement_global_shape(&l->p[0].place, l->p[0].ndim, l->p[0].shape, gs);
        fan_in = 1;
        for (int d = 1; d < l->p[0].ndim; d++) fan_in *= (size_t)gs[d];
    }
    float bound = 1.0f / sqrtf((float)(fan_in ? fan_in : 1));
    for (int i = 0; i < l->n_params; i++) {
        mg_layer_param *p = &l->p[i];
        if (p->is_buffer) continue;
        bool is_bias = strcmp(p->suffix, "bias") == 0;
        if (l->init_kind != MG_INIT_NORMAL) mg__init_fill(c, p, MG__FILL_UNIFORM, bound);
        else if (is_bias) mg__init_fill(c, p, MG__FILL_CONST, 0.0f);
        else mg__init_fill(c, p, MG__FILL_NORMAL, l->init_std);
    }
}

bool mg__layer_has_params(const mg_layer *l)
{
    for (int i = 0; i < l->n_params; i++)
        if (!l->p[i].is_buffer) return true;
    for (int i = 0; i < l->n_child; i++)
        if (mg__layer_has_params(l->child[i])) return true;
    return false;
}

size_t mg__per_image(const int s[3]) { return (size_t)s[0] * s[1] * s[2]; }

size_t mg__align(size_t bytes) { return (bytes + MG_ALIGN - 1) / MG_ALIGN * MG_ALIGN; }

void mg_layer_set_init(mg_layer *l, mg_init_kind kind, float std)
{
    if (!l) return;
    l->init_kind = kind;
    l->init_std = std;
    for (int i = 0; i < l->n_child; i++) mg_layer_set_init(l->child[i], kind, std);
}

void mg_layer_destroy(mg_layer *l)
{
    if (!l) return;
    for (int i = 0; i < l->n_child; i++) mg_layer_destroy(l->child[i]);
    if (l->vt->destroy) l->vt->destroy(l);
    free(l->child);
    free(l);
}

void mg__no_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    *saved = 0;
    *scratch = 0;
}

mg_status mg__same_setup(mg_layer *l, const int in[3], int out[3])
{
    memcpy(out, in, 3 * sizeof(int));
    return MG_OK;
}

void mg__children_sizes(const mg_layer *l, int n, size_t *saved, size_t *scratch)
{
    size_t sv = 0, sc = 0;
    for (int i = 0; i < l->n_child; i++) {
        size_t a, b;
        l->child[i]->vt->sizes(l->child[i], n, &a, &b);
        sv += mg__align(a);
        if (b > sc) sc = b;
    }
    *saved = sv;
    *scratch = sc;
}

size_t mg__saved_bytes(const mg_layer *l, int n)
{
    size_t a, b;
    l->vt->sizes(l, n, &a, &b);
    return mg__align(a);
}

char *mg__bind_child(mg_layer *ch, int n, char *p, char **slot)
{
    slot[ch->slot] = p;
    if (ch->vt->bind) ch->vt->bind(ch, n, slot);
    return p + mg__saved_bytes(ch, n);
}

char *mg__bind_children(mg_layer *l, int n, char **slot)
{
    char *p = slot[l->slot];
    for (int i = 0; i < l->n_child; i++) p = mg__bind_child(l->child[i], n, p, slot);
    return p;
}
