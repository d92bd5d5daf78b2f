/* Models: a tree of layers whose parameters live in arenas.
 *
 * Parameters, gradients and (in src/optim) optimizer state are arenas of
 * one layout: the parameter tensors in reverse forward order (the last
 * layer's first, each layer's weight then bias), packed without gaps and
 * padded with zeros to a multiple of MG_ARENA_PAD floats. Backward thus
 * finishes gradients in increasing arena order; after each top-level layer
 * the gradient hook gets the range that is now final, and the ranges of one
 * backward tile [0, arena_size) exactly (the last one includes the padding).
 * Buffers (batch-norm running statistics) have an arena of their own, in
 * forward order.
 *
 * All activation, gradient and workspace memory is one block sized by
 * mg_model_reserve for the largest batch and touched once, so a training
 * step neither allocates nor page-faults. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nn/layer.h"

struct mg_model {
    char name[32];
    mg_layer *root;            /* a Sequential */
    int in[3], classes;
    int positions;             /* rows of logits per sample (1; T for a language model) */
    size_t out_size;           /* floats of output per sample: positions * classes */
    size_t num_params, arena_size, buf_size;
    float *params, *grads, *own_grads, *buffers;
    mg_param *tensors;
    int n_tensors;
    mg_layer **leaves;         /* layers with their own tensors, forward order */
    int n_leaves;
    size_t *top_lo, *top_hi;   /* arena range of each top-level layer */
    int first_param_child;     /* the top-level layer whose hook ends backward */
    mg_grad_hook hook;
    void *hook_ud;
    mg_ctx ctx;
    bool input_grad;
    /* Workspace, sized by mg_model_reserve. */
    int max_batch;
    char *ws;
    float *logits, *dlogits, *dinput, *scratch;
    /* The last forward. */
    int batch;
    const float *x;
    bool have_fwd, have_loss;
};

static bool is_sequential(const mg_layer *l) { return strcmp(l->vt->kind, "sequential") == 0; }

/* ---- Building ------------------------------------------------------------ */

static int count_leaves(const mg_layer *l)
{
    int n = l->n_params > 0;
    for (int i = 0; i < l->n_child; i++) n += count_leaves(l->child[i]);
    return n;
}

/* Pre-order walk: leaves in forward order, with their full names (which
 * must leave room for ".running_mean" in mg_param's 64 bytes). */
static bool collect(mg_model *m, mg_layer *l, const char *prefix, char (*names)[64], int *id)
{
    l->id = (*id)++;
    char path[64];
    int k;
    if (!prefix) k = snprintf(path, sizeof path, "%s", "");   /* the root's name is not a prefix */
    else if (l->anonymous) k = snprintf(path, sizeof path, "%s", prefix);
    else if (!prefix[0]) k = snprintf(path, sizeof path, "%s", l->name);
    else k = snprintf(path, sizeof path, "%s.%s", prefix, l->name);
    if (k < 0 || k + 14 > 64) {
        mg_error(MG_EINVAL, "model '%s': layer path '%s...' is too long for a tensor name "
                 "(at most 49 characters); use shorter layer names", m->name, path);
        return false;
    }
    if (l->n_params > 0) {
        memcpy(names[m->n_leaves], path, sizeof path);
        m->leaves[m->n_leaves++] = l;
    }
    for (int i = 0; i < l->n_child; i++)
        if (!collect(m, l->child[i], path, names, id)) return false;
    return true;
}

static void range_of(const mg_layer *l, size_t *lo, size_t *hi, const float *base)
{
    for (int i = 0; i < l->n_params; i++) {
        if (l->p[i].is_buffer) continue;
        size_t a = (size_t)(l->p[i].data - base), b = a + l->p[i].numel;
        if (a < *lo) *lo = a;
        if (b > *hi) *hi = b;
    }
    for (int i = 0; i < l->n_child; i++) range_of(l->child[i], lo, hi, base);
}

static void bind_grads(mg_model *m)
{
    for (int i = 0; i < m->n_tensors; i++) {
        mg_param *t = &m->tensors[i];
        if (!t->is_buffer) t->grad = m->grads + t->offset;
    }
    for (int i = 0; i < m->n_leaves; i++) {
        mg_layer *l = m->leaves[i];
        for (int j = 0; j < l->n_params; j++)
            if (!l->p[j].is_buffer) l->p[j].grad = m->grads + (l->p[j].data - m->params);
    }
}

static mg_status layout(mg_model *m)
{
    int n_leaves = count_leaves(m->root), id = 0;
    char (*names)[64] = calloc((size_t)(n_leaves ? n_leaves : 1), 64);
    m->leaves = calloc((size_t)(n_leaves ? n_leaves : 1), sizeof *m->leaves);
    int n_t = 0;
    if (names && m->leaves) {
        if (!collect(m, m->root, NULL, names, &id)) {
            free(names);
            return MG_EINVAL;
        }
        for (int i = 0; i < m->n_leaves; i++) n_t += m->leaves[i]->n_params;
        m->tensors = calloc((size_t)(n_t ? n_t : 1), sizeof *m->tensors);
    }
    if (!names || !m->leaves || !m->tensors) {
        free(names);
        return mg_error(MG_ENOMEM, "model '%s': out of memory for the parameter table", m->name);
    }
    /* Arena offsets: leaves in reverse, each one's parameters in order. */
    size_t off = 0, boff = 0;
    size_t *poff = calloc((size_t)(n_t ? n_t : 1), sizeof *poff);
    if (!poff) {
        free(names);
        return mg_error(MG_ENOMEM, "model '%s': out of memory for the parameter table", m->name);
    }
    for (int i = m->n_leaves - 1, base = n_t; i >= 0; i--) {
        mg_layer *l = m->leaves[i];
        base -= l->n_params;
        for (int j = 0; j < l->n_params; j++)
            if (!l->p[j].is_buffer) {
                poff[base + j] = off;
                off += l->p[j].numel;
            }
    }
    m->num_params = off;
    m->arena_size = (off + MG_ARENA_PAD - 1) / MG_ARENA_PAD * MG_ARENA_PAD;
    if (m->arena_size == 0) m->arena_size = MG_ARENA_PAD;
    for (int i = 0, k = 0; i < m->n_leaves; i++)
        for (int j = 0; j < m->leaves[i]->n_params; j++, k++)
            if (m->leaves[i]->p[j].is_buffer) {
                poff[k] = boff;
                boff += m->leaves[i]->p[j].numel;
            }
    m->buf_size = boff;
    m->params = mg_alloc_zero(m->arena_size * sizeof(float));
    m->own_grads = mg_alloc_zero(m->arena_size * sizeof(float));
    m->buffers = mg_alloc_zero((boff ? boff : 1) * sizeof(float));
    if (!m->params || !m->own_grads || !m->buffers) {
        free(names);
        free(poff);
        return mg_error(MG_ENOMEM, "model '%s': cannot allocate arenas of %zu floats",
                        m->name, m->arena_size);
    }
    m->grads = m->own_grads;
    /* Named tensors: parameters in forward order, then buffers. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0, k = 0; i < m->n_leaves; i++) {
            mg_layer *l = m->leaves[i];
            for (int j = 0; j < l->n_params; j++, k++) {
                mg_layer_param *p = &l->p[j];
                if (p->is_buffer != (pass == 1)) continue;
                mg_param *t = &m->tensors[m->n_tensors++];
                size_t nl = strlen(names[i]), sl = strlen(p->suffix);
                memcpy(t->name, names[i], nl);
                if (nl) t->name[nl++] = '.';
                memcpy(t->name + nl, p->suffix, sl + 1);
                t->ndim = p->ndim;
                memcpy(t->shape, p->shape, sizeof t->shape);
                t->numel = p->numel;
                t->offset = poff[k];
                t->is_buffer = p->is_buffer;
                t->data = p->data = (p->is_buffer ? m->buffers : m->params) + poff[k];
            }
        }
    free(names);
    free(poff);
    bind_grads(m);
    /* Hook ranges of the top-level layers. */
    int nc = m->root->n_child;
    m->top_lo = calloc((size_t)nc, sizeof *m->top_lo);
    m->top_hi = calloc((size_t)nc, sizeof *m->top_hi);
    if (!m->top_lo || !m->top_hi)
        return mg_error(MG_ENOMEM, "model '%s': out of memory", m->name);
    m->first_param_child = -1;
    for (int i = 0; i < nc; i++) {
        size_t lo = SIZE_MAX, hi = 0;
        range_of(m->root->child[i], &lo, &hi, m->params);
        if (hi == 0) lo = 0;
        else if (m->first_param_child < 0) m->first_param_child = i;
        m->top_lo[i] = lo;
        m->top_hi[i] = hi;
    }
    return MG_OK;
}

mg_status mg_model_create_from(const char *name, mg_layer *root, int c, int h, int w,
                               uint64_t seed, mg_model **out)
{
    *out = NULL;
    if (!root) return mg_error(MG_ENOMEM, "model '%s': out of memory building layers", name);
    if (c <= 0 || h <= 0 || w <= 0) {
        mg_layer_destroy(root);
        return mg_error(MG_EINVAL, "model '%s': bad input shape %dx%dx%d", name, c, h, w);
    }
    if (!is_sequential(root)) {
        root = mg_layer_sequential(NULL, &root, 1);
        if (!root) return mg_error(MG_ENOMEM, "model '%s': out of memory", name);
    }
    mg_model *m = calloc(1, sizeof *m);
    if (!m) {
        mg_layer_destroy(root);
        return mg_error(MG_ENOMEM, "model '%s': out of memory", name);
    }
    snprintf(m->name, sizeof m->name, "%s", name);
    m->root = root;
    m->in[0] = c;
    m->in[1] = h;
    m->in[2] = w;
    memcpy(root->in, m->in, sizeof m->in);
    mg_status st = root->vt->setup(root, m->in, root->out);
    if (st == MG_OK) st = layout(m);
    if (st) {
        mg_model_destroy(m);
        return st;
    }
    m->out_size = mg__per_image(root->out);
    m->classes = (int)m->out_size;
    m->positions = 1;
    root->need_dx = false;
    root->vt->propagate(root);
    m->ctx.training = true;
    mg_model_init_params(m, seed);
    *out = m;
    return MG_OK;
}

void mg_model_destroy(mg_model *m)
{
    if (!m) return;
    mg_layer_destroy(m->root);
    mg_free(m->params);
    mg_free(m->own_grads);
    mg_free(m->buffers);
    mg_free(m->ws);
    free(m->tensors);
    free(m->leaves);
    free(m->top_lo);
    free(m->top_hi);
    free(m);
}

void mg_model_init_params(mg_model *m, uint64_t seed)
{
    mg_rng r;
    mg_rng_init(&r, seed);
    for (int i = 0; i < m->n_leaves; i++) {
        mg_layer *l = m->leaves[i];
        if (l->vt->init) l->vt->init(l, &r);
        else mg__layer_init_default(l, &r);
    }
}

/* ---- Accessors ----------------------------------------------------------- */

const char *mg_model_name(const mg_model *m) { return m->name; }

void mg_model_input_shape(const mg_model *m, int *c, int *h, int *w)
{
    if (c) *c = m->in[0];
    if (h) *h = m->in[1];
    if (w) *w = m->in[2];
}

int mg_model_classes(const mg_model *m) { return m->classes; }
int mg_model_positions(const mg_model *m) { return m->positions; }

int mg_model_decay_groups(const mg_model *m, float wd, mg_optim_group *out, int cap)
{
    /* Tensors in arena order (the table is in forward order, the arena the
     * reverse of it by layer), so merging sees neighbours. */
    int n = 0;
    size_t at = 0;
    float last = -1.0f;   /* the decay of group n-1 (which ends at `at`) */
    while (at < m->num_params) {
        const mg_param *t = NULL;
        for (int i = 0; i < m->n_tensors && !t; i++)
            if (!m->tensors[i].is_buffer && m->tensors[i].offset == at) t = &m->tensors[i];
        MG_ASSERT(t);
        float d = t->ndim >= 2 ? wd : 0.0f;
        if (n == 0 || d != last) {
            if (n < cap) out[n].lo = at;
            n++;
            last = d;
        }
        at += t->numel;
        if (n <= cap) out[n - 1] = (mg_optim_group){.lo = out[n - 1].lo, .hi = at, .weight_decay = d};
    }
    return n;
}

void mg__model_set_positions(mg_model *m, int positions)
{
    MG_ASSERT(positions > 0 && m->out_size % (size_t)positions == 0);
    m->positions = positions;
    m->classes = (int)(m->out_size / (size_t)positions);
}

const float *mg_model_forward_tokens(mg_model *m, const int32_t *tokens, int batch)
{
    /* The embedding layer reads its input as int32 (nn/transformer.c). */
    return mg_model_forward(m, (const float *)(const void *)tokens, batch);
}
size_t mg_model_num_params(const mg_model *m) { return m->num_params; }
size_t mg_model_arena_size(const mg_model *m) { return m->arena_size; }
float *mg_model_params(mg_model *m) { return m->params; }
float *mg_model_grads(mg_model *m) { return m->grads; }
size_t mg_model_buffer_size(const mg_model *m) { return m->buf_size; }
float *mg_model_buffers(mg_model *m) { return m->buffers; }
int mg_model_num_tensors(const mg_model *m) { return m->n_tensors; }

/* A layer's weight gradient costs what its forward does, and its input
 * gradient (when an earlier layer needs it) the same again. */
static void layer_flops(const mg_layer *l, double *fwd, double *train)
{
    for (int i = 0; i < l->n_child; i++) layer_flops(l->child[i], fwd, train);
    double f = l->vt->flops ? l->vt->flops(l) : 0.0;
    *fwd += f;
    *train += f * (l->need_dx ? 3.0 : 2.0);
}

void mg_model_flops(const mg_model *m, double *forward, double *train)
{
    double f = 0, t = 0;
    layer_flops(m->root, &f, &t);
    if (forward) *forward = f;
    if (train) *train = t;
}

const mg_param *mg_model_tensor(const mg_model *m, int i)
{
    return i >= 0 && i < m->n_tensors ? &m->tensors[i] : NULL;
}

const mg_param *mg_model_find(const mg_model *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

void mg_model_set_grad_storage(mg_model *m, float *grads)
{
    if (!grads) grads = m->own_grads;
    if (grads == m->grads) return;
    memcpy(grads, m->grads, m->arena_size * sizeof(float));
    m->grads = grads;
    bind_grads(m);
}

void mg_model_set_grad_hook(mg_model *m, mg_grad_hook fn, void *ud)
{
    m->hook = fn;
    m->hook_ud = ud;
}

void mg_model_set_training(mg_model *m, bool training) { m->ctx.training = training; }
void mg_model_set_dropout_seed(mg_model *m, uint64_t seed) { m->ctx.dropout_seed = seed; }
uint64_t mg_model_rng_counter(const mg_model *m) { return m->ctx.step; }
void mg_model_set_rng_counter(mg_model *m, uint64_t counter) { m->ctx.step = counter; }

void mg_model_set_input_grad(mg_model *m, bool on)
{
    if (m->input_grad == on) return;
    m->input_grad = on;
    m->root->need_dx = on;
    m->root->vt->propagate(m->root);
    /* The workspace layout changes: the next reserve starts afresh. */
    mg_free(m->ws);
    m->ws = NULL;
    m->max_batch = 0;
    m->have_fwd = m->have_loss = false;
}

const float *mg_model_input_grad(const mg_model *m) { return m->input_grad ? m->dinput : NULL; }

/* ---- Training step ------------------------------------------------------- */

mg_status mg_model_reserve(mg_model *m, int max_batch)
{
    if (max_batch <= 0)
        return mg_error(MG_EINVAL, "model '%s': batch size %d must be positive", m->name,
                        max_batch);
    if (max_batch <= m->max_batch) return MG_OK;
    size_t saved, scratch;
    m->root->vt->sizes(m->root, max_batch, &saved, &scratch);
    size_t out = mg__align((size_t)max_batch * m->out_size * sizeof(float));
    size_t in = m->input_grad ? mg__align((size_t)max_batch * mg__per_image(m->in) * sizeof(float)) : 0;
    size_t total = mg__align(saved) + 2 * out + in + scratch * sizeof(float);
    /* Zeroed: every page is touched now rather than in the first step. */
    char *ws = mg_alloc_zero(total);
    if (!ws)
        return mg_error(MG_ENOMEM,
                        "model '%s': cannot allocate %.1f MB of activations for batch %d; "
                        "use a smaller batch", m->name, total / 1e6, max_batch);
    mg_free(m->ws);
    m->ws = ws;
    m->max_batch = max_batch;
    m->root->saved = ws;
    if (m->root->vt->bind) m->root->vt->bind(m->root, max_batch);
    char *p = ws + mg__align(saved);
    m->logits = (float *)p;
    p += out;
    m->dlogits = (float *)p;
    p += out;
    m->dinput = in ? (float *)p : NULL;
    p += in;
    m->scratch = (float *)p;
    m->have_fwd = m->have_loss = false;
    mg_debug("model %s: reserved %.1f MB for batch %d (kept for backward %.1f, logits and "
             "their gradient %.1f, input gradient %.1f, scratch %.1f)", m->name, total / 1e6,
             max_batch, saved / 1e6, 2 * out / 1e6, in / 1e6, scratch * sizeof(float) / 1e6);
    return MG_OK;
}

const float *mg_model_forward(mg_model *m, const float *x, int batch)
{
    MG_ASSERT(batch > 0);
    if (batch > m->max_batch && mg_model_reserve(m, batch)) return NULL;
    mg_ctx c = m->ctx;
    c.scratch = m->scratch;
    m->root->vt->forward(m->root, &c, x, m->logits, batch);
    if (m->ctx.training) m->ctx.step++;
    m->x = x;
    m->batch = batch;
    m->have_fwd = true;
    m->have_loss = false;
    return m->logits;
}

float mg_model_loss(mg_model *m, const int32_t *labels, int *correct)
{
    MG_ASSERT(m->have_fwd);
    m->have_loss = true;
    return mg_softmax_xent(m->logits, labels, m->batch * m->positions, m->classes, m->dlogits,
                           correct);
}

static void child_done(void *ud, int i)
{
    mg_model *m = ud;
    if (!m->hook || m->top_hi[i] == 0) return;
    size_t hi = i == m->first_param_child ? m->arena_size : m->top_hi[i];
    m->hook(m->hook_ud, m->top_lo[i], hi);
}

static void run_backward(mg_model *m)
{
    mg_ctx c = m->ctx;
    c.scratch = m->scratch;
    mg__seq_backward(m->root, &c, m->x, m->logits, m->dlogits, m->dinput, m->batch,
                     child_done, m);
    if (m->hook && m->first_param_child < 0) m->hook(m->hook_ud, 0, m->arena_size);
}

void mg_model_backward(mg_model *m)
{
    MG_ASSERT(m->have_fwd && m->have_loss);
    run_backward(m);
    m->have_loss = false;   /* dlogits were consumed (layers may overwrite dy) */
}

void mg_model_backward_from(mg_model *m, const float *dout)
{
    MG_ASSERT(m->have_fwd);
    memmove(m->dlogits, dout, (size_t)m->batch * m->out_size * sizeof(float));
    run_backward(m);
    m->have_loss = false;
}

void mg_model_zero_grad(mg_model *m)
{
    memset(m->grads, 0, m->arena_size * sizeof(float));
}
