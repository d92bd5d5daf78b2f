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

void mg__model_set_vocab_split(mg_model *m) { m->vocab_split = m->ctx.tp != NULL; }
