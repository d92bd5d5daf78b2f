/* Tensor parallelism inside nn (Megatron-LM): the collectives a split
 * layer calls through the plan's callbacks (nn includes no comm) and the
 * model's tensor-parallel settings; the cross-entropy of logits split
 * over the vocabulary is loss.c's.
 *
 * Where the collectives are (the layers call the region mappings,
 * mg__tp_all_rows and mg__tp_sum_rows):
 *   column-parallel linear   backward: the input gradient is summed
 *   row-parallel linear      forward: the output is summed, then the bias
 *   vocabulary embedding     forward: each rank's rows of wte, summed
 *   tied head                backward: the input gradient is summed
 *   cross-entropy            three sums or maxima of one float per row
 * (with sequence parallelism each sum is a reduce-scatter over the
 * positions, and the gathers before the column-parallel layers and the
 * head are all-gathers),
 * so a transformer block costs two all-reduces in forward and two in
 * backward. Limits: the collectives are synchronous. */
#include <string.h>
#include "nn/model_internal.h"

/* The group to call, or NULL after a failure (recorded: none given). */
static mg__tp *group(const mg_ctx *c, bool given)
{
    mg__tp *tp = c->tp;
    if (!tp || tp->failed) return NULL;
    if (!given) {
        tp->failed = mg_error(MG_EINVAL, "a model split for tensor parallelism (part %d of %d) "
                              "ran without its group: give it one with mg_model_set_tp_comm "
                              "(a plan with --mesh tp=%d does)", tp->split.rank, tp->split.size,
                              tp->split.size);
        return NULL;
    }
    return tp;
}

void mg__tp_all_reduce(const mg_ctx *c, float *x, size_t n, bool max)
{
    mg__tp *tp = group(c, c->tp && c->tp->comm.all_reduce);
    if (tp) tp->failed = tp->comm.all_reduce(tp->comm.ud, x, n, max);
}

/* Megatron's region mappings: entering a split region every rank needs
 * all positions (with sequence parallelism gathered, else each rank has
 * them), and leaving it the ranks' partial values are summed (with
 * sequence parallelism each rank keeping its part of the positions). The
 * backward of each is the other. */
const float *mg__tp_all_rows(const mg_layer *l, const mg_ctx *c, const float *x, size_t rows,
                             size_t w, float *buf)
{
    if (!mg__seq_split(l)) return x;
    mg__tp *tp = group(c, c->tp && c->tp->comm.all_gather);
    if (tp) tp->failed = tp->comm.all_gather(tp->comm.ud, x, buf, rows / (size_t)l->tp.size * w);
    return buf;
}

size_t mg__tp_sum_rows(const mg_layer *l, const mg_ctx *c, float *part, float *out, size_t rows,
                       size_t w)
{
    if (!mg__seq_split(l)) {
        MG_ASSERT(part == out);
        if (mg__split(l)) mg__tp_all_reduce(c, out, rows * w, false);
        return rows;
    }
    size_t here = rows / (size_t)l->tp.size;
    mg__tp *tp = group(c, c->tp && c->tp->comm.reduce_scatter);
    if (tp) tp->failed = tp->comm.reduce_scatter(tp->comm.ud, part, out, here * w);
    return here;
}

/* The blocks b[0 .. k) of n floats (k a power of two) summed into b[0] in
 * the binary tree over them: pairs, then pairs of pairs. */
static void tree(float *b, int k, size_t n)
{
    for (int step = 1; step < k; step <<= 1)
        for (int i = 0; i + step < k; i += 2 * step)
            mg_add_into(b + (size_t)i * n, b + (size_t)(i + step) * n, n);
}

void mg__fixed_sum(const mg_ctx *c, int T, float *parts, int nl, size_t n, float *out)
{
    tree(parts, nl, n);
    const float *root = parts;
    if (T > 1) {
        float *all = parts + (size_t)nl * n;
        mg__tp *tp = group(c, c->tp && c->tp->comm.all_gather);
        if (tp) tp->failed = tp->comm.all_gather(tp->comm.ud, parts, all, n);
        tree(all, T, n);
        root = all;
    }
    if (root != out) memcpy(out, root, n * sizeof *out);
}

/* ---- the model's settings ------------------------------------------------ */

mg_tp_split mg_model_tp(const mg_model *m)
{
    return m->ctx.tp ? m->ctx.tp->split : MG_TP_NONE;
}

void mg_model_set_tp_comm(mg_model *m, const mg_tp_comm *c)
{
    if (m->ctx.tp) m->ctx.tp->comm = c ? *c : (mg_tp_comm){0};
}

mg_status mg_model_tp_failure(mg_model *m)
{
    if (!m->ctx.tp) return MG_OK;
    mg_status st = m->ctx.tp->failed;
    m->ctx.tp->failed = MG_OK;
    return st;
}

void mg__model_set_vocab_split(mg_model *m)
{
    m->vocab_splittable = true;
    m->vocab_split = m->ctx.tp != NULL;
}

mg_status mg_model_set_fixed_sums(mg_model *m, int chunks)
{
    int T = m->ctx.tp ? m->ctx.tp->split.size : 1;
    if (chunks && (chunks < 0 || chunks > 64 || chunks & (chunks - 1) || chunks % T))
        return mg_error(MG_EINVAL, "fixed sums: %d chunk(s): give a power of two up to 64 that "
                        "the tensor-parallel size %d divides (--tp-chunks)", chunks, T);
    if (chunks && m->dev.kind != MG_DEVICE_CPU)
        return mg_error(MG_EUNSUPPORTED, "fixed sums (--deterministic) are built for a model on "
                        "the CPU; on a device leave out --mesh tp and they are not needed");
    if (chunks && m->ctx.tp && m->ctx.tp->split.sequence)
        return mg_error(MG_EUNSUPPORTED, "fixed sums (--deterministic) are not built with "
                        "sequence parallelism: leave out --sequence-parallel");
    for (int i = 0; i < m->n_leaves && chunks; i++)   /* all checked before any is set */
        for (int j = 0; j < m->leaves[i]->n_params; j++) {
            const mg_layer_param *p = &m->leaves[i]->p[j];
            long G = p->place.dim < 0 ? 0 : (long)p->shape[p->place.dim] * T;
            if (G % ((long)p->place.stride * chunks))
                return mg_error(MG_EINVAL, "fixed sums: %s's %ld rows or columns along its split "
                                "dimension (in %d block(s)) do not cut into %d chunks: give "
                                "--tp-chunks a power of two that divides %ld", p->name, G,
                                p->place.stride, chunks, G / p->place.stride);
        }
    for (int i = 0; i < m->n_leaves; i++) {   /* a layer with a placed tensor is cut */
        mg_layer *l = m->leaves[i];
        bool placed = false;
        for (int j = 0; j < l->n_params; j++) placed |= l->p[j].place.dim >= 0;
        l->chunks = placed && chunks ? chunks / T : 0;
    }
    m->sum_chunks = chunks;
    mg__model_relayout(m);
    return MG_OK;
}

int mg_model_fixed_sums(const mg_model *m) { return m->sum_chunks; }
