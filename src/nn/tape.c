/* Tapes: everything a forward keeps for its backward, the logits, their
 * gradient and the workspace, as one block sized for a batch once and
 * touched at creation, so a training step neither allocates nor
 * page-faults; with recomputation the units share one block for what
 * they keep (the largest unit's), and each unit's forward runs again
 * before its backward. A tape runs all the model's units, or a range of
 * them (a pipeline stage's: activations in, their output and the input's
 * gradient out), calling the model's unit hooks around each. Several
 * tapes may be live on one model. The mg_model_forward family runs on a
 * tape the model owns. The model's structure and arenas are model.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nn/model_internal.h"

/* ---- Tapes ------------------------------------------------------------------ */

/* Bytes of n floats, aligned. */
static size_t fbytes(size_t n) { return mg__align(n * sizeof(float)); }

/* The tape's block for batches of n: what the units keep (side by side, or
 * with recomputation one block they share), the units' outputs, logits,
 * their gradient, the input gradient and the scratch. With mem NULL only
 * counts; else fills the slots and the tape's pointers. */
static size_t range_layout(const mg_model *m, int n, int a, int b, char *mem, mg_tape *t);

/* Fixed sums: the loss's chunks of this rank's vocabulary (0: none), and
 * the tensor-parallel size they are gathered over. */
static int loss_chunks(const mg_model *m, int *T)
{
    *T = m->vocab_split ? m->tp.split.size : 1;
    return m->sum_chunks && m->vocab_splittable ? m->sum_chunks / *T : 0;
}

/* The cross-entropy works in the scratch: 4 floats a row (loss.c), and
 * with fixed sums a float a row for each chunk and each tp rank. */
static size_t loss_scratch(const mg_model *m, int n, size_t scratch)
{
    int T, chunks = loss_chunks(m, &T);
    size_t need = (size_t)(4 + (chunks ? chunks + T : 0)) * (size_t)n * (size_t)m->positions;
    return scratch > need ? scratch : need;
}

static size_t tape_layout(const mg_model *m, int n, int a, int b, char *mem, mg_tape *t)
{
    if (a != 0 || b != m->n_units) return range_layout(m, n, a, b, mem, t);
    mg_layer *root = m->root;
    size_t saved, scratch, off = 0;
    root->vt->sizes(root, n, &saved, &scratch);
    scratch = loss_scratch(m, n, scratch);
    if (!m->recompute) {
        if (mem) {
            t->slot[root->slot] = mem;
            root->vt->bind(root, n, t->slot);
        }
        off = mg__align(saved);
    } else {
        size_t shared = 0;
        for (int u = 0; u < m->n_units; u++) {
            size_t b = mg__saved_bytes(m->units[u].l, n);
            if (b > shared) shared = b;
        }
        off = shared;
        int last = -1;
        for (int u = 0; u < m->n_units; u++) {
            mg_layer *l = m->units[u].l;
            if (mem) {
                mg__bind_child(l, n, mem, t->slot);
                t->rerun[u] = mg__saved_bytes(l, n) > 0;
                if (t->rerun[u]) last = u;
            }
            if (u + 1 < m->n_units) {
                if (mem) t->slot[root->slot + 1 + u] = mem + off;
                off += fbytes((size_t)n * mg__per_image(l->out));
            }
        }
        /* The last unit's kept memory is still its own at its backward. */
        if (mem && last >= 0) t->rerun[last] = false;
    }
    size_t out = fbytes((size_t)n * m->out_size);
    size_t in = m->input_grad ? fbytes((size_t)n * mg__per_image(m->in)) : 0;
    if (mem) {
        t->logits = (float *)(mem + off);
        t->dlogits = (float *)(mem + off + out);
        t->dinput = in ? (float *)(mem + off + 2 * out) : NULL;
        t->scratch = (float *)(mem + off + 2 * out + in);
    }
    return off + 2 * out + in + scratch * sizeof(float);
}

/* The same for units [a, b) only: their kept memory and the outputs
 * between them (or, recomputing, one block they share), then the
 * output, its gradient, the input gradient (a > 0, or the model's input
 * gradient), two buffers for the gradients between the units and the
 * largest unit's scratch. */
static size_t range_layout(const mg_model *m, int n, int a, int b, char *mem, mg_tape *t)
{
    mg_layer *root = m->root;
    size_t off = 0, scratch = 0, shared = 0, between = 0;
    for (int u = a; u < b; u++) {
        size_t sv, sc;
        m->units[u].l->vt->sizes(m->units[u].l, n, &sv, &sc);
        if (sc > scratch) scratch = sc;
        if (mg__align(sv) > shared) shared = mg__align(sv);
        size_t o = mg__per_image(m->units[u].l->out);
        if (u + 1 < b && o > between) between = o;
    }
    if (b == m->n_units) scratch = loss_scratch(m, n, scratch);
    if (m->recompute) off = shared;
    int last = -1;
    for (int u = a; u < b; u++) {
        mg_layer *l = m->units[u].l;
        if (m->recompute) {
            if (mem) mg__bind_child(l, n, mem, t->slot);
            if (mem && (t->rerun[u] = mg__saved_bytes(l, n) > 0)) last = u;
        } else {
            if (mem) mg__bind_child(l, n, mem + off, t->slot);
            off += mg__saved_bytes(l, n);
        }
        if (u + 1 < b) {
            if (mem) t->slot[root->slot + 1 + u] = mem + off;
            off += fbytes((size_t)n * mg__per_image(l->out));
        }
    }
    if (mem && last >= 0) t->rerun[last] = false;
    size_t out = fbytes((size_t)n * mg__per_image(m->units[b - 1].l->out));
    size_t in = a > 0 || m->input_grad ? fbytes((size_t)n * mg__per_image(m->units[a].l->in)) : 0;
    size_t g = fbytes((size_t)n * between);
    if (mem) {
        t->logits = (float *)(mem + off);
        t->dlogits = (float *)(mem + off + out);
        t->dinput = in ? (float *)(mem + off + 2 * out) : NULL;
        t->gbuf[0] = (float *)(mem + off + 2 * out + in);
        t->gbuf[1] = (float *)(mem + off + 2 * out + in + g);
        t->scratch = (float *)(mem + off + 2 * out + in + 2 * g);
    }
    return off + 2 * out + in + 2 * g + scratch * sizeof(float);
}

mg_status mg_tape_create(mg_model *m, int max_batch, mg_tape **out)
{
    return mg_tape_create_range(m, max_batch, 0, m->n_units, out);
}

mg_status mg_tape_create_range(mg_model *m, int max_batch, int first, int last, mg_tape **out)
{
    *out = NULL;
    if (max_batch <= 0)
        return mg_error(MG_EINVAL, "model '%s': batch size %d must be positive", m->name,
                        max_batch);
    if (first < 0 || first >= last || last > m->n_units)
        return mg_error(MG_EINVAL, "model '%s': units [%d, %d) are not a range of its %d units",
                        m->name, first, last, m->n_units);
    mg_tape *t = calloc(1, sizeof *t);
    if (!t) return mg_error(MG_ENOMEM, "model '%s': out of memory for a tape", m->name);
    t->m = m;
    t->dev = m->dev;
    t->dk = m->dk;
    t->layout = m->layout;
    t->cap = max_batch;
    t->u0 = first;
    t->u1 = last;
    t->in_per = mg__per_image(m->units[first].l->in);
    t->out_per = mg__per_image(m->units[last - 1].l->out);
    /* The layers size their memory for the device they run on. */
    mg_dk *prev = mg__dk_enter(m->dk);
    t->bf16_kept = mg_gemm_bf16();
    t->bytes = tape_layout(m, max_batch, first, last, NULL, NULL);
    /* Zeroed: every page is touched now rather than in the first step. */
    t->mem = mg_device_alloc(m->dev, t->bytes);
    t->slot = calloc((size_t)m->n_slots, sizeof *t->slot);
    t->rerun = calloc((size_t)m->n_units, sizeof *t->rerun);
    bool io = true;
    if (m->dk) {
        t->feed = mg_dk_feed_create((size_t)max_batch * t->in_per * sizeof(float));
        t->dev_labels = mg_device_alloc(m->dev, (size_t)max_batch * m->positions * sizeof(int32_t));
        io = t->feed && t->dev_labels;
    }
    if (!t->mem || !t->slot || !t->rerun || !io) {
        mg__dk_leave(prev);
        double mb = t->bytes / 1e6;
        mg_tape_destroy(t);
        return mg_error(MG_ENOMEM, "model '%s': cannot allocate %.1f MB of activations for "
                        "batch %d; use a smaller batch", m->name, mb, max_batch);
    }
    tape_layout(m, max_batch, first, last, t->mem, t);
    mg__dk_leave(prev);
    mg_debug("model %s: a tape of %.1f MB for batch %d%s", m->name, t->bytes / 1e6, max_batch,
             m->recompute ? " (recomputing)" : "");
    *out = t;
    return MG_OK;
}

void mg_tape_destroy(mg_tape *t)
{
    if (!t) return;
    mg_device_free(t->dev, t->mem);
    if (t->feed) {
        mg_dk *prev = mg__dk_enter(t->dk);
        mg_dk_feed_destroy(t->feed);
        mg__dk_leave(prev);
    }
    mg_device_free(t->dev, t->dev_labels);
    free(t->slot);
    free(t->rerun);
    free(t);
}

size_t mg_tape_bytes(const mg_tape *t) { return t->bytes; }

size_t mg_tape_bytes_for(const mg_model *m, int max_batch, int first, int last)
{
    MG_ASSERT(max_batch > 0 && 0 <= first && first < last && last <= m->n_units);
    mg_dk *prev = mg__dk_enter(m->dk);
    size_t b = tape_layout(m, max_batch, first, last, NULL, NULL);
    mg__dk_leave(prev);
    return b;
}
bool mg_tape_stale(const mg_tape *t) { return !t || t->layout != t->m->layout; }
int mg_tape_capacity(const mg_tape *t) { return t->cap; }
void mg_tape_set_grads(mg_tape *t, float *grads) { t->grads = grads; }

void mg_tape_set_grad_window(mg_tape *t, int slot, size_t lo, size_t hi, float *buf)
{
    MG_ASSERT(slot >= 0 && slot < MG_GRAD_WINDOWS && (!buf || lo <= hi));
    t->win[slot] = buf ? (mg_grad_window){lo, hi, buf} : (mg_grad_window){0, 0, NULL};
}
void mg_tape_set_borrowed_grads(mg_tape *t, size_t lo, size_t hi, float *buf)
{
    MG_ASSERT(!buf || lo <= hi);
    t->borrowed = buf ? (mg_grad_window){lo, hi, buf} : (mg_grad_window){0, 0, NULL};
}

void mg_model_set_borrowed_grads(mg_model *m, size_t lo, size_t hi, float *buf)
{
    MG_ASSERT(!buf || lo <= hi);
    m->borrowed = buf ? (mg_grad_window){lo, hi, buf} : (mg_grad_window){0, 0, NULL};
}

void mg_tape_set_buffers(mg_tape *t, float *buffers) { t->buffers = buffers; }
mg_model *mg_tape_model(const mg_tape *t) { return t->m; }

void mg_tape_pin_step(mg_tape *t, uint64_t step)
{
    t->pinned = true;
    t->pin = step;
}

/* The context of a pass on tape t: the model's settings, the tape's
 * memory and where gradients and buffer updates go. */
static mg_ctx tape_ctx(const mg_tape *t)
{
    mg_ctx c = t->m->ctx;
    c.recompute = false;
    c.bf16_kept = t->bf16_kept;
    c.slot = t->slot;
    c.scratch = t->scratch;
    c.grads = t->grads ? t->grads : t->m->grads;
    c.win = t->win;
    /* The model's borrowed window goes with the model's gradient arena. */
    c.borrowed = t->borrowed.buf ? &t->borrowed : !t->grads && t->m->borrowed.buf ? &t->m->borrowed
                                                                                    : NULL;
    c.buffers = t->buffers ? t->buffers : t->m->buffers;
    return c;
}

/* The hook tables in the order they were added. */
static void unit_before(void *ud, int i, bool backward)
{
    mg_tape *t = ud;
    for (int k = 0; k < t->m->n_hooks; k++) {
        const mg_unit_hooks *h = t->m->hooks[k].h;
        void (*fn)(void *, mg_tape *, int) = backward ? h->pre_backward : h->pre_forward;
        if (fn) fn(t->m->hooks[k].ud, t, i);
    }
}

static void unit_after(void *ud, int i, bool backward)
{
    mg_tape *t = ud;
    for (int k = 0; k < t->m->n_hooks; k++) {
        const mg_unit_hooks *h = t->m->hooks[k].h;
        void (*fn)(void *, mg_tape *, int) = backward ? h->post_backward : h->post_forward;
        if (fn) fn(t->m->hooks[k].ud, t, i);
    }
}

/* The root's calls of a pass on t: the hooks, and t's range when it
 * has one. */
static mg__seq_calls tape_calls(mg_tape *t, bool recompute)
{
    bool range = t->u0 != 0 || t->u1 != t->m->n_units;
    return (mg__seq_calls){unit_before, unit_after, t, recompute, t->rerun,
                           range ? t->u0 : 0, range ? t->u1 : 0, {t->gbuf[0], t->gbuf[1]}};
}

static void check_tape(const mg_tape *t)
{
    /* A programmer error: set input gradients and recomputation before
     * making tapes. */
    MG_ASSERT(t->layout == t->m->layout);
}

const float *mg_tape_forward(mg_tape *t, const float *x, int batch)
{
    mg_model *m = t->m;
    check_tape(t);
    if (batch <= 0 || batch > t->cap) {
        mg_error(MG_EINVAL, "model '%s': batch %d does not fit a tape made for %d", m->name,
                 batch, t->cap);
        return NULL;
    }
    mg_ctx c = tape_ctx(t);
    if (t->pinned) c.step = t->pin;
    else if (m->ctx.training) m->ctx.step++;
    t->pinned = false;
    t->step = c.step;
    t->training = c.training;
    mg__seq_calls k = tape_calls(t, false);
    mg_dk *prev = mg__dk_enter(t->dk);
    if (t->dk && mg_device_of(x).kind == MG_DEVICE_CPU)   /* from the host: copied in */
        x = mg_dk_feed_in(t->feed, x, (size_t)batch * t->in_per * sizeof(float));
    mg__seq_forward(m->root, &c, x, t->logits, batch, &k);
    mg__dk_leave(prev);
    if (m->tp.failed) return NULL;   /* a collective of a split layer failed (mg_last_error) */
    t->x = x;
    t->batch = batch;
    t->have_fwd = true;
    t->have_loss = false;
    return t->logits;
}

const float *mg_tape_forward_tokens(mg_tape *t, const int32_t *tokens, int batch)
{
    /* The embedding layer reads its input as int32 (nn/transformer.c):
     * the first unit's, checked here where they are on the host. */
    if (t->u0 != 0)
        return mg_error(MG_EINVAL, "model '%s': this tape runs from unit %d, whose input is "
                        "floats: give them to mg_tape_forward", t->m->name, t->u0), NULL;
    if (mg_device_of(tokens).kind == MG_DEVICE_CPU &&
        mg_model_check_tokens(t->m, tokens, batch))
        return NULL;
    return mg_tape_forward(t, (const float *)(const void *)tokens, batch);
}

float mg_tape_loss(mg_tape *t, const int32_t *labels, int *correct)
{
    MG_ASSERT(t->have_fwd && t->u1 == t->m->n_units);
    const mg_model *m = t->m;
    t->have_loss = true;
    int n = t->batch * m->positions;
    mg_dk *prev = mg__dk_enter(t->dk);
    if (t->dk) {
        mg_dk_copy_in(t->dev_labels, labels, (size_t)n * sizeof(int32_t));
        labels = t->dev_labels;
    }
    mg_ctx c = tape_ctx(t);
    int T, chunks = loss_chunks(m, &T);
    float loss = mg__softmax_xent(m->vocab_split ? &c : NULL, t->logits, labels, n, m->classes,
                                  m->vocab_split ? m->tp.split.rank * m->classes : 0, t->dlogits,
                                  correct, t->scratch, chunks);
    mg__dk_leave(prev);
    return loss;
}

void mg_tape_weigh_loss(mg_tape *t, float w)
{
    MG_ASSERT(t->have_loss);
    size_t n = (size_t)t->batch * t->m->positions * t->m->classes;   /* this rank's columns */
    if (t->dk) {
        mg_dk *prev = mg__dk_enter(t->dk);
        mg_dk_scale(t->dlogits, n, w);
        mg__dk_leave(prev);
        return;
    }
    for (size_t i = 0; i < n; i++) t->dlogits[i] *= w;
}

static void run_backward(mg_tape *t)
{
    mg_model *m = t->m;
    check_tape(t);
    mg_ctx c = tape_ctx(t);
    c.step = t->step;
    c.training = t->training;
    mg__seq_calls k = tape_calls(t, m->recompute);
    mg_dk *prev = mg__dk_enter(t->dk);
    mg__seq_backward(m->root, &c, t->x, t->logits, t->dlogits, t->dinput, t->batch, &k);
    mg__dk_leave(prev);
    t->have_loss = false;   /* dlogits were consumed (layers may overwrite dy) */
}

void mg_tape_backward(mg_tape *t)
{
    MG_ASSERT(t->have_fwd && t->have_loss);
    run_backward(t);
}

void mg_tape_backward_from(mg_tape *t, const float *dout)
{
    MG_ASSERT(t->have_fwd);
    size_t bytes = (size_t)t->batch * t->out_per * sizeof(float);
    if (dout == t->dlogits) {
        /* written in place (mg_tape_output_grad): nothing to copy */
    } else if (t->dk) {   /* from the host, or on the device already */
        mg_dk *prev = mg__dk_enter(t->dk);
        if (mg_device_of(dout).kind == MG_DEVICE_CPU) mg_dk_copy_in(t->dlogits, dout, bytes);
        else mg_dk_copy_floats(t->dlogits, dout, bytes / sizeof(float));
        mg__dk_leave(prev);
    } else {
        memmove(t->dlogits, dout, bytes);
    }
    run_backward(t);
}

float *mg_tape_output_grad(mg_tape *t) { return t->dlogits; }
const float *mg_tape_input_grad(const mg_tape *t) { return t->dinput; }
void mg_tape_range(const mg_tape *t, int *first, int *last, size_t *in_floats,
                   size_t *out_floats)
{
    if (first) *first = t->u0;
    if (last) *last = t->u1;
    if (in_floats) *in_floats = t->in_per;
    if (out_floats) *out_floats = t->out_per;
}
const float *mg_tape_logits(const mg_tape *t) { return t->logits; }

/* Split over the vocabulary: each rank's columns in place, zeros
 * elsewhere, summed over the group in host memory (exact: one term is
 * not zero). On a device the rank's columns come to the host in one copy,
 * into the end of dst, and spread from there in place, first row first:
 * row i's place ends before the rows after it lie. */
static void gather_logits(const mg_tape *t, float *dst)
{
    const mg_model *m = t->m;
    size_t rows = (size_t)t->batch * m->positions, vl = (size_t)m->classes;
    size_t v = vl * (size_t)m->tp.split.size, lo = vl * (size_t)m->tp.split.rank;
    const float *mine = t->logits;
    if (t->dk) {
        float *tail = dst + rows * (v - vl);
        mg_dk *prev = mg__dk_enter(t->dk);
        mg_dk_copy_out(tail, t->logits, rows * vl * sizeof(float));
        mg__dk_leave(prev);
        mine = tail;
    }
    for (size_t i = 0; i < rows; i++) {
        memmove(dst + i * v + lo, mine + i * vl, vl * sizeof(float));
        memset(dst + i * v, 0, lo * sizeof(float));
        memset(dst + i * v + lo + vl, 0, (v - lo - vl) * sizeof(float));
    }
    mg_ctx c = tape_ctx(t);
    mg__tp_all_reduce(&c, dst, rows * v, false);
}

void mg_tape_logits_to_host(const mg_tape *t, float *dst)
{
    MG_ASSERT(t->have_fwd);
    if (t->m->vocab_split) {
        gather_logits(t, dst);
        return;
    }
    size_t bytes = (size_t)t->batch * t->out_per * sizeof(float);
    if (!t->dk) {
        memcpy(dst, t->logits, bytes);
        return;
    }
    mg_dk *prev = mg__dk_enter(t->dk);
    mg_dk_copy_out(dst, t->logits, bytes);
    mg__dk_leave(prev);
}

/* ---- The model's own tape ---------------------------------------------------- */

mg_status mg_model_reserve(mg_model *m, int max_batch)
{
    if (max_batch <= 0)
        return mg_error(MG_EINVAL, "model '%s': batch size %d must be positive", m->name,
                        max_batch);
    if (m->tape && max_batch <= m->tape->cap) return MG_OK;
    mg_tape *t;
    MG_TRY(mg_tape_create(m, max_batch, &t));
    mg_tape_destroy(m->tape);
    m->tape = t;
    return MG_OK;
}

mg_tape *mg_model_tape(mg_model *m) { return m->tape; }

const float *mg_model_forward(mg_model *m, const float *x, int batch)
{
    if (mg_model_reserve(m, batch)) return NULL;   /* batch < 1: MG_EINVAL */
    return mg_tape_forward(m->tape, x, batch);
}

const float *mg_model_forward_tokens(mg_model *m, const int32_t *tokens, int batch)
{
    if (mg_model_reserve(m, batch)) return NULL;   /* batch < 1: MG_EINVAL */
    return mg_tape_forward_tokens(m->tape, tokens, batch);
}

float mg_model_loss(mg_model *m, const int32_t *labels, int *correct)
{
    MG_ASSERT(m->tape);
    return mg_tape_loss(m->tape, labels, correct);
}

void mg_model_weigh_loss(mg_model *m, float w)
{
    MG_ASSERT(m->tape);
    mg_tape_weigh_loss(m->tape, w);
}

void mg_model_backward(mg_model *m)
{
    MG_ASSERT(m->tape);
    mg_tape_backward(m->tape);
}

void mg_model_backward_from(mg_model *m, const float *dout)
{
    MG_ASSERT(m->tape);
    mg_tape_backward_from(m->tape, dout);
}

const float *mg_model_input_grad(const mg_model *m)
{
    return m->tape ? mg_tape_input_grad(m->tape) : NULL;
}

