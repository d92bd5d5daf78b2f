/* Models: a sequence of units whose parameters live in arenas, run on
 * caller-owned tapes (tape.c).
 *
 * Units: the root's layers, with nested Sequentials opened up, so a unit
 * is a layer or a block at any depth of nesting (gpt-mini: the embedding,
 * each transformer block, ln_f, the head). Units are what strategies work
 * with: hooks run around each unit's forward and backward, and each owns
 * one contiguous range of the arenas.
 *
 * Parameters, gradients and (in src/optim) optimizer state are arenas of
 * one layout: units in reverse forward order (the last unit's first),
 * within a unit its layers' tensors in reverse order (each layer's weight
 * then bias), and each unit's range padded with zeros to a multiple of
 * the model's pad (mg_model_set_unit_pad: a strategy makes it a multiple
 * of its world size, so every unit splits into equal shards). Backward
 * thus finishes gradients in increasing arena order, and the ranges of
 * the units tile the arena. Buffers (batch-norm running statistics) have
 * an arena of their own, in forward order.
 *
 * What a forward keeps for its backward is a tape's (tape.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nn/model_internal.h"

/* ---- Building ------------------------------------------------------------ */

static int count_leaves(const mg_layer *l)
{
    int n = l->n_params > 0;
    for (int i = 0; i < l->n_child; i++) n += count_leaves(l->child[i]);
    return n;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Two layers of one name would give two tensors of one name, which no
 * checkpoint can hold: said at creation, not at the first save. */
static mg_status unique_names(const mg_model *m)
{
    const char **s = malloc(sizeof *s * (size_t)(m->n_tensors ? m->n_tensors : 1));
    if (!s) return mg_error(MG_ENOMEM, "model: out of memory");
    for (int i = 0; i < m->n_tensors; i++) s[i] = m->tensors[i].name;
    qsort(s, (size_t)m->n_tensors, sizeof *s, cmp_names);
    mg_status st = MG_OK;
    for (int i = 1; i < m->n_tensors && !st; i++)
        if (!strcmp(s[i - 1], s[i]))
            st = mg_error(MG_EINVAL, "model '%s': two tensors are named '%s': give its layers "
                          "different names", m->name, s[i]);
    free(s);
    return st;
}

/* Pre-order walk: leaves in forward order, with their full names (which
 * must leave room for ".running_mean" in mg_param's 64 bytes); paths[id]
 * gets each layer's. */
static bool collect(mg_model *m, mg_layer *l, const char *prefix, char (*names)[64],
                    char (*paths)[64], int *id)
{
    l->id = (*id)++;
    char path[64];
    int k;
    if (!prefix) k = snprintf(path, sizeof path, "%s", "");   /* the root's name is not a prefix */
    else if (l->anonymous) k = snprintf(path, sizeof path, "%s", prefix);
    else if (!prefix[0]) k = snprintf(path, sizeof path, "%s", l->name);
    else k = snprintf(path, sizeof path, "%s.%s", prefix, l->name);
    memcpy(paths[l->id], path, sizeof path);
    if (k < 0 || k + 14 > 64) {
        mg_error(MG_EINVAL, "model '%s': layer path '%s...' is too long for a tensor name "
                 "(at most 49 characters); use shorter layer names", m->name, path);
        return false;
    }
    if (l->n_params > 0) {
        memcpy(names[m->n_leaves], path, 64);
        m->leaves[m->n_leaves++] = l;
    }
    for (int i = 0; i < l->n_child; i++)
        if (!collect(m, l->child[i], paths[l->id], names, paths, id)) return false;
    return true;
}

static int count_layers(const mg_layer *l)
{
    int n = 1;
    for (int i = 0; i < l->n_child; i++) n += count_layers(l->child[i]);
    return n;
}

/* The units under l: its children, with Sequentials opened up. out may be
 * NULL (counting). */
static int open_up(mg_layer *l, mg_layer **out, int n)
{
    for (int i = 0; i < l->n_child; i++) {
        mg_layer *ch = l->child[i];
        if (mg__is_sequential(ch)) n = open_up(ch, out, n);
        else if (out) out[n++] = ch;
        else n++;
    }
    return n;
}

/* Frees the Sequential shells under l (not their units). */
static void free_shells(mg_layer *l)
{
    for (int i = 0; i < l->n_child; i++)
        if (mg__is_sequential(l->child[i])) free_shells(l->child[i]);
    l->n_child = 0;
    mg_layer_destroy(l);
}

static void assign_slots(mg_layer *l, int *next)
{
    l->slot = *next;
    *next += l->n_slots;
    for (int i = 0; i < l->n_child; i++) assign_slots(l->child[i], next);
}

/* t is part pl of its logical tensor. */
static void set_placement(mg_param *t, mg_placement pl)
{
    t->place = pl;
    mg_placement_global_shape(&pl, t->ndim, t->shape, t->gshape);
    t->gnumel = 1;
    for (int d = 0; d < t->ndim; d++) t->gnumel *= (size_t)t->gshape[d];
}

/* Names the tensors and the units, then replaces the root by a Sequential
 * of the units. */
static mg_status build(mg_model *m)
{
    int n_leaves = count_leaves(m->root), n_layers = count_layers(m->root), id = 0;
    char (*names)[64] = calloc((size_t)(n_leaves ? n_leaves : 1), 64);
    char (*paths)[64] = calloc((size_t)n_layers, 64);
    m->leaves = calloc((size_t)(n_leaves ? n_leaves : 1), sizeof *m->leaves);
    int n_units = open_up(m->root, NULL, 0);
    mg_layer **ul = calloc((size_t)n_units, sizeof *ul);
    m->units = calloc((size_t)n_units, sizeof *m->units);
    mg_status st = MG_OK;
    if (!names || !paths || !m->leaves || !ul || !m->units) {
        st = mg_error(MG_ENOMEM, "model '%s': out of memory for the parameter table", m->name);
    } else if (!collect(m, m->root, NULL, names, paths, &id)) {
        st = MG_EINVAL;
    } else {
        int n_t = 0;
        for (int i = 0; i < m->n_leaves; i++) n_t += m->leaves[i]->n_params;
        m->tensors = calloc((size_t)(n_t ? n_t : 1), sizeof *m->tensors);
        if (!m->tensors) st = mg_error(MG_ENOMEM, "model '%s': out of memory", m->name);
    }
    if (!st) {
        open_up(m->root, ul, 0);
        mg_layer *root = mg_layer_sequential(NULL, ul, n_units);
        if (!root) {
            st = mg_error(MG_ENOMEM, "model '%s': out of memory", m->name);
        } else {
            free_shells(m->root);
            m->root = root;
            memcpy(root->in, ul[0]->in, sizeof root->in);
            memcpy(root->out, ul[n_units - 1]->out, sizeof root->out);
            m->n_units = n_units;
            for (int u = 0, leaf = 0; u < n_units; u++) {
                unit *un = &m->units[u];
                un->l = ul[u];
                snprintf(un->name, sizeof un->name, "%s",
                         paths[ul[u]->id][0] ? paths[ul[u]->id] : ul[u]->vt->kind);
                un->leaf0 = leaf;
                un->n_leaves = count_leaves(ul[u]);
                leaf += un->n_leaves;
            }
            m->n_slots = 0;
            assign_slots(root, &m->n_slots);
        }
    }
    /* Tensor names: parameters in forward order, then buffers. */
    for (int pass = 0; pass < 2 && !st; pass++)
        for (int i = 0; i < m->n_leaves; i++) {
            mg_layer *l = m->leaves[i];
            for (int j = 0; j < l->n_params; j++) {
                mg_layer_param *p = &l->p[j];
                if (p->is_buffer != (pass == 1)) continue;
                mg_param *t = &m->tensors[m->n_tensors++];
                size_t nl = strlen(names[i]), sl = strlen(p->suffix);
                memcpy(t->name, names[i], nl);
                if (nl) t->name[nl++] = '.';
                memcpy(t->name + nl, p->suffix, sl + 1);
                p->name = t->name;
                t->ndim = p->ndim;
                memcpy(t->shape, p->shape, sizeof t->shape);
                t->numel = p->numel;
                t->is_buffer = p->is_buffer;
                set_placement(t, p->place);
                t->grad_partial = p->grad_partial;
            }
        }
    free(names);
    free(paths);
    free(ul);
    return st ? st : unique_names(m);
}

/* Places the units' parameters for ranges padded to `pad` (with assign,
 * into the units and layer parameters); returns the arena's floats. */
static size_t place(mg_model *m, size_t pad, bool assign)
{
    size_t off = 0;
    for (int u = m->n_units - 1; u >= 0; u--) {
        unit *un = &m->units[u];
        size_t lo = off;
        for (int i = un->leaf0 + un->n_leaves - 1; i >= un->leaf0; i--)
            for (int j = 0; j < m->leaves[i]->n_params; j++) {
                mg_layer_param *p = &m->leaves[i]->p[j];
                if (p->is_buffer) continue;
                if (assign) p->off = off;
                off += p->numel;
            }
        size_t used = off - lo;
        off = (off + pad - 1) / pad * pad;
        if (assign) {
            un->lo = lo;
            un->hi = off;
            un->numel = used;
        }
    }
    return off ? off : pad;
}

/* Points the layers' tensors and the table's entries into the arenas.
 * Table entries follow the layers' order: parameters, then buffers. */

static void bind_tensors(mg_model *m)
{
    for (int pass = 0, k = 0; pass < 2; pass++)
        for (int i = 0; i < m->n_leaves; i++)
            for (int j = 0; j < m->leaves[i]->n_params; j++) {
                mg_layer_param *p = &m->leaves[i]->p[j];
                if (p->is_buffer != (pass == 1)) continue;
                mg_param *t = &m->tensors[k++];
                t->offset = p->off;
                t->data = p->data = (p->is_buffer ? m->buffers : m->params) + p->off;
                t->grad = p->is_buffer ? NULL : m->grads + p->off;
            }
}

/* Arena memory on d: mapped on the CPU (see layout), else the device's,
 * sparse as the CPU's is (sharded strategies give parts back). */
static float *arena_alloc(mg_device d, size_t floats)
{
    if (d.kind == MG_DEVICE_CPU) return mg_map_zero(floats * sizeof(float));
    return mg_device_alloc_sparse(d, floats * sizeof(float));
}

static void arena_free(mg_device d, float *p, size_t floats)
{
    if (d.kind == MG_DEVICE_CPU) mg_unmap(p, floats * sizeof(float));
    else mg_device_free(d, p);
}

/* Arena offsets of every tensor for unit ranges padded to `pad`; the
 * arenas are made anew and the parameters (and buffers) keep their
 * values. On failure nothing changes. */
static mg_status layout(mg_model *m, size_t pad)
{
    size_t arena = place(m, pad, false), boff = 0;
    /* Buffers: forward order, the same offsets in every layout. */
    for (int i = 0; i < m->n_leaves; i++)
        for (int j = 0; j < m->leaves[i]->n_params; j++)
            if (m->leaves[i]->p[j].is_buffer) {
                m->leaves[i]->p[j].off = boff;
                boff += m->leaves[i]->p[j].numel;
            }
    /* Mapped: a page of gradients costs memory once written, so a
     * strategy that keeps a shard of them keeps only that resident. */
    float *params = mg_map_zero(arena * sizeof(float));
    float *grads = mg_map_zero(arena * sizeof(float));
    if (!m->buffers) m->buffers = mg_alloc_zero((boff ? boff : 1) * sizeof(float));
    if (!params || !grads || !m->buffers) {
        mg_unmap(params, arena * sizeof(float));
        mg_unmap(grads, arena * sizeof(float));
        return mg_error(MG_ENOMEM, "model '%s': cannot allocate arenas of %zu floats", m->name,
                        arena);
    }
    place(m, pad, true);
    /* p->data still points into the old arena (none at creation, and
     * nothing to copy before a deferred model has values). */
    for (int i = 0; i < m->n_leaves && m->params && m->has_values; i++)
        for (int j = 0; j < m->leaves[i]->n_params; j++) {
            mg_layer_param *p = &m->leaves[i]->p[j];
            if (!p->is_buffer) memcpy(params + p->off, p->data, p->numel * sizeof(float));
        }
    size_t used = 0;
    for (int u = 0; u < m->n_units; u++) used += m->units[u].numel;
    mg_unmap(m->params, m->arena_size * sizeof(float));
    mg_unmap(m->own_grads, m->arena_size * sizeof(float));
    m->params = params;
    m->grads = m->own_grads = grads;
    m->num_params = used;
    m->arena_size = arena;
    m->buf_size = boff;
    m->pad = pad;
    bind_tensors(m);
    return MG_OK;
}

mg_status mg_model_set_unit_pad(mg_model *m, size_t pad)
{
    MG_ASSERT(pad > 0);
    MG_ASSERT(m->grads == m->own_grads);   /* before DDP moves the gradients */
    if (pad == m->pad) return MG_OK;
    if (!m->dk) return layout(m, pad);
    /* The layout is made on the host: there and back. */
    mg_device dev = m->dev;
    MG_TRY(mg_model_to_device(m, (mg_device){MG_DEVICE_CPU, 0}));
    mg_status st = layout(m, pad);
    mg_status e = mg_model_to_device(m, dev);
    return st ? st : e;
}

size_t mg_model_unit_pad(const mg_model *m) { return m->pad; }

/* The tensor-parallel split of the model's split layers: one for all. */
static mg_status find_split(mg_model *m)
{
    for (int i = 0; i < m->n_leaves; i++) {
        mg_tp_split t = m->leaves[i]->tp;
        if (t.size <= 1) continue;
        if (m->ctx.tp && (m->tp.split.size != t.size || m->tp.split.rank != t.rank ||
                          m->tp.split.sequence != t.sequence))
            return mg_error(MG_EINVAL, "model '%s': its layers are split over %d and %d "
                            "tensor-parallel ranks (parts %d and %d): build every split layer "
                            "with the same mg_tp_split", m->name, m->tp.split.size, t.size,
                            m->tp.split.rank, t.rank);
        m->tp.split = t;
        m->ctx.tp = &m->tp;
    }
    return MG_OK;
}

mg_status mg_model_create_from(const char *name, mg_layer *root, int c, int h, int w,
                               uint64_t seed, mg_model **out)
{
    *out = NULL;
    if (!root)   /* a constructor's NULL, passed up by its composites, says why */
        return mg_error(mg_last_error_code() ? mg_last_error_code() : MG_EINVAL, "model '%s': no "
                        "root layer (%s)", name, *mg_last_error() ? mg_last_error()
                        : "NULL given");
    if (c <= 0 || h <= 0 || w <= 0) {
        mg_layer_destroy(root);
        return mg_error(MG_EINVAL, "model '%s': bad input shape %dx%dx%d", name, c, h, w);
    }
    if (!mg__is_sequential(root)) {
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
    if (st == MG_OK) st = build(m);
    if (st == MG_OK) st = layout(m, MG_SIMD_FLOATS);
    if (st == MG_OK) st = find_split(m);
    if (st) {
        mg_model_destroy(m);
        return st;
    }
    m->out_size = mg__per_image(m->root->out);
    m->classes = (int)m->out_size;
    m->positions = 1;
    m->root->need_dx = false;
    m->root->vt->propagate(m->root);
    m->ctx.training = true;
    if (seed != MG_SEED_DEFERRED) mg_model_init_params(m, seed);   /* on the CPU: no failure */
    *out = m;
    return MG_OK;
}

void mg_model_destroy(mg_model *m)
{
    if (!m) return;
    mg_tape_destroy(m->tape);
    mg_layer_destroy(m->root);
    arena_free(m->dev, m->params, m->arena_size);
    arena_free(m->dev, m->own_grads, m->arena_size);
    mg_device_free(m->dev, m->buffers);
    free(m->tensors);
    free(m->leaves);
    free(m->units);
    free(m);
}

/* The layers draw into the arenas their tensors point at. */
static void draw(mg_model *m, uint64_t seed, const mg_range *r, int n)
{
    mg_init c = {.seed = seed, .r = r, .nr = n};
    for (int i = 0; i < m->n_leaves; i++) {
        mg_layer *l = m->leaves[i];
        if (l->vt->init) l->vt->init(l, &c);
        else mg__layer_init_default(l, &c);
    }
}

/* On a device the layers draw into host mappings the size of the arenas,
 * of which only the ranges are touched, and those ranges are copied in:
 * the host never holds more than the part. */
static mg_status draw_on_device(mg_model *m, uint64_t seed, const mg_range *r, int n)
{
    size_t pb = m->arena_size * sizeof(float), bb = m->buf_size * sizeof(float);
    float *hp = mg_map_zero(pb ? pb : 1), *hb = mg_map_zero(bb ? bb : 1);
    mg_status st = hp && hb ? MG_OK : mg_error(MG_ENOMEM, "model '%s': out of host memory "
                                               "to draw its parameters", m->name);
    for (int i = 0; i < m->n_leaves && !st; i++)
        for (int j = 0; j < m->leaves[i]->n_params; j++) {
            mg_layer_param *p = &m->leaves[i]->p[j];
            p->data = (p->is_buffer ? hb : hp) + p->off;
        }
    if (!st) draw(m, seed, r, n);
    mg_device cpu = {MG_DEVICE_CPU, 0};
    mg_range whole = {0, m->arena_size};
    if (!r) r = &whole, n = 1;
    for (int k = 0; k < n && !st; k++)
        if (r[k].hi > r[k].lo)
            st = mg_device_copy(m->dev, m->params + r[k].lo, cpu, hp + r[k].lo,
                                (r[k].hi - r[k].lo) * sizeof(float));
    if (!st && bb) st = mg_device_copy(m->dev, m->buffers, cpu, hb, bb);
    bind_tensors(m);   /* back to the device's arenas */
    if (hp) mg_unmap(hp, pb ? pb : 1);
    if (hb) mg_unmap(hb, bb ? bb : 1);
    return st;
}

mg_status mg_model_init_ranges(mg_model *m, uint64_t seed, const mg_range *r, int n)
{
    if (m->dk) MG_TRY(draw_on_device(m, seed, r, n));
    else draw(m, seed, r, n);
    m->has_values = true;
    return MG_OK;
}

mg_status mg_model_init_params(mg_model *m, uint64_t seed)
{
    return mg_model_init_ranges(m, seed, NULL, 0);
}

bool mg_model_has_values(const mg_model *m) { return m->has_values; }

/* ---- Devices ---------------------------------------------------------------- */

/* NULL when every layer of l runs on a device (mg_layer_vt.on_device),
 * else the first that does not. */
static const mg_layer *no_device_kernels(const mg_layer *l)
{
    if (!l->vt->on_device) return l;
    for (int i = 0; i < l->n_child; i++) {
        const mg_layer *b = no_device_kernels(l->child[i]);
        if (b) return b;
    }
    return NULL;
}

mg_status mg_model_to_device(mg_model *m, mg_device dev)
{
    if (dev.kind == m->dev.kind && dev.index == m->dev.index) return MG_OK;
    char name[16];
    mg_device_format(dev, name, sizeof name);
    const mg_layer *bad = dev.kind == MG_DEVICE_CPU ? NULL : no_device_kernels(m->root);
    if (bad)
        return mg_error(MG_EUNSUPPORTED, "model '%s' on %s: layer '%s' (%s) has no device "
                        "kernels (every layer of the library has them); use --device cpu",
                        m->name, name, bad->name, bad->vt->kind);
    if (m->grads != m->own_grads)
        return mg_error(MG_EUNSUPPORTED, "model '%s': move it to %s before a strategy takes "
                        "its gradients", m->name, name);
    mg_dk *dk;
    MG_TRY(mg__dk_get(dev, &dk));
    size_t n = m->arena_size, nb = m->buf_size ? m->buf_size : 1;
    float *p = arena_alloc(dev, n), *g = arena_alloc(dev, n);
    float *b = mg_device_alloc(dev, nb * sizeof(float));
    mg_status st = p && g && b ? MG_OK
                               : mg_error(MG_ENOMEM, "model '%s': cannot allocate its %.1f MB "
                                          "of arenas on %s", m->name,
                                          (2.0 * n + nb) * sizeof(float) / 1e6, name);
    if (!st) st = mg_device_copy(dev, p, m->dev, m->params, n * sizeof(float));
    if (!st) st = mg_device_copy(dev, g, m->dev, m->grads, n * sizeof(float));
    if (!st) st = mg_device_copy(dev, b, m->dev, m->buffers, nb * sizeof(float));
    if (st) {
        arena_free(dev, p, n);
        arena_free(dev, g, n);
        mg_device_free(dev, b);
        return st;
    }
    arena_free(m->dev, m->params, n);
    arena_free(m->dev, m->own_grads, n);
    mg_device_free(m->dev, m->buffers);
    m->params = p;
    m->grads = m->own_grads = g;
    m->buffers = b;
    m->dev = dev;
    m->dk = dk;
    bind_tensors(m);
    mg__model_relayout(m);
    return MG_OK;
}

mg_device mg_model_device(const mg_model *m) { return m->dev; }

/* ---- Units ----------------------------------------------------------------- */

int mg_model_num_units(const mg_model *m) { return m->n_units; }

static double flops_of(const mg_layer *l)
{
    double f = l->vt->flops ? l->vt->flops(l) : 0.0;
    for (int i = 0; i < l->n_child; i++) f += flops_of(l->child[i]);
    return f;
}

static void tp_floats_of(const mg_layer *l, mg_unit_info *r)
{
    if (l->vt->tp_floats) {
        double f = 0, b = 0;
        l->vt->tp_floats(l, &f, &b);
        r->tp_fwd_floats += f;
        r->tp_bwd_floats += b;
    }
    for (int i = 0; i < l->n_child; i++) tp_floats_of(l->child[i], r);
}

void mg_model_unit_range(const mg_model *m, int i, size_t *lo, size_t *hi)
{
    MG_ASSERT(i >= 0 && i < m->n_units);
    *lo = m->units[i].lo;
    *hi = m->units[i].hi;
}

mg_unit_info mg_model_unit(const mg_model *m, int i)
{
    MG_ASSERT(i >= 0 && i < m->n_units);
    const unit *u = &m->units[i];
    mg_unit_info r = {.name = u->name, .kind = u->l->vt->kind, .lo = u->lo, .hi = u->hi,
                      .numel = u->numel, .flops = flops_of(u->l), .borrows = -1};
    const mg_layer *lent = u->l->vt->borrows ? u->l->vt->borrows(u->l) : NULL;
    for (int j = 0; lent && lent->n_params && j < m->n_units; j++)
        if (m->units[j].lo <= lent->p[0].off && lent->p[0].off < m->units[j].hi) r.borrows = j;
    r.buf_lo = r.buf_hi = 0;
    for (int i = u->leaf0; i < u->leaf0 + u->n_leaves; i++)
        for (int j = 0; j < m->leaves[i]->n_params; j++) {
            const mg_layer_param *p = &m->leaves[i]->p[j];
            if (!p->is_buffer) continue;
            if (r.buf_hi == r.buf_lo) r.buf_lo = p->off;
            r.buf_hi = p->off + p->numel;
        }
    size_t a, b;
    u->l->vt->sizes(u->l, 1, &a, &b);
    r.saved_bytes = a;
    r.out_bytes = mg__per_image(u->l->out) * sizeof(float);
    tp_floats_of(u->l, &r);
    return r;
}

mg_status mg_model_add_hooks(mg_model *m, const mg_unit_hooks *h, void *ud)
{
    if (m->n_hooks == MG_MAX_UNIT_HOOKS)
        return mg_error(MG_EINVAL, "model '%s' has %d hook tables already: remove one first",
                        m->name, MG_MAX_UNIT_HOOKS);
    m->hooks[m->n_hooks].h = h;
    m->hooks[m->n_hooks++].ud = ud;
    return MG_OK;
}

void mg_model_remove_hooks(mg_model *m, const mg_unit_hooks *h, void *ud)
{
    for (int i = 0; i < m->n_hooks; i++)
        if (m->hooks[i].h == h && m->hooks[i].ud == ud) {
            size_t after = (size_t)(m->n_hooks - i - 1);
            memmove(&m->hooks[i], &m->hooks[i + 1], sizeof m->hooks[0] * after);
            m->n_hooks--;
            return;
        }
}

int mg_model_num_hooks(const mg_model *m) { return m->n_hooks; }

/* ---- Accessors ----------------------------------------------------------- */

const char *mg_model_name(const mg_model *m) { return m->name; }

void mg_model_input_shape(const mg_model *m, int *c, int *h, int *w)
{
    if (c) *c = m->in[0];
    if (h) *h = m->in[1];
    if (w) *w = m->in[2];
}

/* Logical: a vocabulary split over tp ranks is all of it. */
int mg_model_classes(const mg_model *m) { return m->classes * (m->vocab_split ? m->tp.split.size : 1); }
int mg_model_positions(const mg_model *m) { return m->positions; }

int mg_model_vocab(const mg_model *m)
{
    return m->n_leaves ? mg__embedding_vocab(m->leaves[0]) : 0;
}

mg_status mg_model_check_tokens(const mg_model *m, const int32_t *tokens, int batch)
{
    int V = mg_model_vocab(m), T = m->in[2];
    if (!V)
        return mg_error(MG_EINVAL, "model '%s' takes floats, not tokens: give them to "
                        "mg_model_forward", m->name);
    if (batch < 1 || !tokens)
        return mg_error(MG_EINVAL, "model '%s': %d rows of tokens%s: give 1 or more", m->name,
                        batch, tokens ? "" : " at NULL");
    for (size_t i = 0; i < (size_t)batch * T; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return mg_error(MG_EINVAL, "model '%s': token %d (row %zu, position %zu of %d) is "
                            "outside the vocabulary [0, %d)", m->name, (int)tokens[i], i / T,
                            i % T, T, V);
    return MG_OK;
}

int mg_model_decay_groups(const mg_model *m, float wd, mg_optim_group *out, int cap)
{
    /* Tensors in arena order (the table is in forward order, the arena the
     * reverse of it by layer), so merging sees neighbours; a unit's padding
     * goes with its last tensor's group. */
    int n = 0;
    size_t at = 0;
    float last = -1.0f;   /* the decay of group n-1 (which ends at `at`) */
    while (at < m->arena_size) {
        const mg_param *t = NULL;
        size_t next = m->arena_size;
        for (int i = 0; i < m->n_tensors && !t; i++) {
            const mg_param *c = &m->tensors[i];
            if (c->is_buffer) continue;
            if (c->offset == at) t = c;
            else if (c->offset > at && c->offset < next) next = c->offset;
        }
        if (!t && n == 0) break;   /* no parameters at all */
        if (t) {
            float d = t->ndim >= 2 ? wd : 0.0f;
            if (n == 0 || d != last) {
                if (n < cap) out[n].lo = at;
                n++;
                last = d;
            }
            next = at + t->numel;
        }
        at = next;
        if (n <= cap) {
            out[n - 1].hi = at;
            out[n - 1].weight_decay = last;
        }
    }
    return n;
}

void mg__model_set_positions(mg_model *m, int positions)
{
    MG_ASSERT(positions > 0 && m->out_size % (size_t)positions == 0);
    m->positions = positions;
    m->classes = (int)(m->out_size / (size_t)positions);
}

size_t mg_model_num_params(const mg_model *m) { return m->num_params; }
size_t mg_model_arena_size(const mg_model *m) { return m->arena_size; }

void mg_model_to_vector(const mg_model *m, const float *arena, float *out)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const mg_param *t = &m->tensors[i];
        if (t->is_buffer) continue;
        memcpy(out, arena + t->offset, t->numel * sizeof(float));
        out += t->numel;
    }
}
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

mg_status mg_model_place(mg_model *m, const char *name, mg_placement pl)
{
    for (int i = 0; i < m->n_leaves; i++)
        for (int j = 0; j < m->leaves[i]->n_params; j++) {
            mg_layer_param *p = &m->leaves[i]->p[j];
            if (strcmp(p->name, name)) continue;
            if (p->is_buffer || m->has_values)
                return mg_error(MG_EINVAL, "model '%s': %s is %s: place a parameter of a model "
                                "made without values (MG_SEED_DEFERRED)", m->name, name,
                                p->is_buffer ? "a buffer" : "drawn already");
            MG_TRY(mg_placement_check(&pl, p->ndim, p->shape));
            p->place = pl;
            for (int k = 0; k < m->n_tensors; k++)
                if (!strcmp(m->tensors[k].name, name)) set_placement(&m->tensors[k], pl);
            return MG_OK;
        }
    return mg_error(MG_EINVAL, "model '%s' has no parameter '%s'", m->name, name);
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
    for (int i = 0; i < m->n_tensors; i++)
        if (!m->tensors[i].is_buffer) m->tensors[i].grad = grads + m->tensors[i].offset;
}

void mg_model_set_training(mg_model *m, bool training) { m->ctx.training = training; }
bool mg_model_training(const mg_model *m) { return m->ctx.training; }
void mg_model_set_dropout_seed(mg_model *m, uint64_t seed) { m->ctx.dropout_seed = seed; }
uint64_t mg_model_rng_counter(const mg_model *m) { return m->ctx.step; }
void mg_model_set_rng_counter(mg_model *m, uint64_t counter) { m->ctx.step = counter; }

/* A change of what tapes hold: tapes made before it are refused, the
 * model's own is made again at its next use. */
void mg__model_relayout(mg_model *m)
{
    m->layout++;
    int cap = m->tape ? m->tape->cap : 0;
    mg_tape_destroy(m->tape);
    m->tape = NULL;
    if (cap) mg_model_reserve(m, cap);
}

void mg_model_set_input_grad(mg_model *m, bool on)
{
    if (m->input_grad == on) return;
    m->input_grad = on;
    m->root->need_dx = on;
    m->root->vt->propagate(m->root);
    mg__model_relayout(m);
}

void mg_model_set_recompute(mg_model *m, bool on)
{
    if (m->recompute == on) return;
    m->recompute = on;
    mg__model_relayout(m);
}

bool mg_model_recompute(const mg_model *m) { return m->recompute; }

void mg_model_zero_grad(mg_model *m)
{
    if (m->dk) {
        mg_dk *prev = mg__dk_enter(m->dk);
        mg_dk_zero(m->grads, m->arena_size * sizeof(float));
        mg__dk_leave(prev);
        return;
    }
    memset(m->grads, 0, m->arena_size * sizeof(float));
}
