/* Tensor parallelism (Megatron-LM) as a strategy's component: the mesh's
 * tp group for a model built split over it (mg_tp_split, nn.h).
 *
 * The layers communicate themselves, through the callbacks this gives
 * the model (nn includes no comm): two all-reduces per transformer block
 * in forward and two in backward, the vocabulary-parallel embedding's and
 * head's, the parallel cross-entropy's. What the plan needs besides:
 *   - the gradient norm counts each tensor once: the split tensors' parts
 *     are summed over the group (shards_over), the whole ones (LayerNorms,
 *     wpe, row-parallel biases, whose gradients are the same on every tp
 *     rank) only from tp rank 0 (own_ranges);
 *   - a checkpoint gets each split tensor's part from every tp rank and
 *     the whole ones from tp rank 0, by the same own ranges;
 *   - a collective that failed inside a layer fails the micro-batch;
 *   - with sequence parallelism, the gradients of the whole tensors that
 *     ran on a part of the positions (mg_param.grad_partial) are summed
 *     over the group after the data-parallel reduction, in one all-reduce
 *     of this rank's ranges of them.
 * The component comes first in every kind's list: tp inside, then the
 * pipeline and the data-parallel sharding over each tp rank's arena (all
 * tp ranks have the same layout, so their dp and pp groups line up).
 *
 * Limits: sequence parallelism keeps its gradients in the arena (not with
 * --offload disk), and sums them in host memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"

typedef struct {
    mg_strategy *s;
    mg_model *m;
    mg_group *g;        /* the mesh's tp group */
    mg_range *own;      /* tp rank 0: NULL (all it holds); others: the split tensors */
    int n_own;
    mg_range *partial;  /* the partial gradients within this rank's ranges */
    int n_partial;
    float *sum;         /* them, packed for their all-reduce */
    size_t sum_len;
    char label[16];
} tp_part;

static mg_status tp_all_reduce(void *ud, float *x, size_t n, bool max)
{
    tp_part *t = ud;
    return mg_all_reduce(t->g, x, x, n, MG_F32, max ? MG_MAX : MG_SUM);
}

static mg_status tp_all_gather(void *ud, const float *in, float *out, size_t n)
{
    return mg_all_gather(((tp_part *)ud)->g, in, out, n, MG_F32);
}

static mg_status tp_reduce_scatter(void *ud, const float *in, float *out, size_t n)
{
    return mg_reduce_scatter(((tp_part *)ud)->g, in, out, n, MG_F32, MG_SUM);
}

static bool is_split(const mg_param *p) { return p->place.dim >= 0 && p->place.parts > 1; }
static bool is_partial(const mg_param *p) { return p->grad_partial; }

/* The ranges of the parameters `which` picks, ascending, adjacent ones
 * merged, within the ranges `in` (ascending) when given. */
static mg_status tensor_ranges(const mg_model *m, bool (*which)(const mg_param *),
                               const mg_range *in, int n_in, mg_range **out, int *n)
{
    int nt = mg_model_num_tensors(m), w = 0;
    mg_range *r = malloc(sizeof *r * (size_t)(2 * nt + n_in + 1));
    if (!r) return mg_error(MG_ENOMEM, "tensor parallelism: out of memory");
    for (int i = 0; i < nt; i++) {   /* the table is in arena order within a unit, units reversed */
        const mg_param *p = mg_model_tensor(m, i);
        if (p->is_buffer || !which(p)) continue;
        mg_range t = {p->offset, p->offset + p->numel};
        int k = w;
        while (k > 0 && r[k - 1].lo > t.lo) k--;
        for (int j = w; j > k; j--) r[j] = r[j - 1];
        r[k] = t;
        w++;
    }
    int v = 0;
    for (int k = 0; k < w; k++) {
        if (v && r[v - 1].hi == r[k].lo) r[v - 1].hi = r[k].hi;
        else r[v++] = r[k];
    }
    if (in) {   /* cut to the ranges in */
        w = mg__ranges_intersect(r, v, in, n_in, r + v);
        memmove(r, r + v, sizeof *r * (size_t)w);
        v = w;
    }
    *out = r;
    *n = v;
    return MG_OK;
}

static mg_status tp_attach(mg_strategy *s, void **state)
{
    mg_model *m = mg_strategy_model(s);
    mg_mesh *mesh = mg_strategy_mesh(s);
    mg_tp_split built = mg_model_tp(m);
    int size = mesh ? mg_mesh_size(mesh, MG_MESH_TP) : 1;
    int coord = mesh ? mg_mesh_coord(mesh, MG_MESH_TP) : 0;
    mg_status st = MG_OK;
    if (built.size != size || (size > 1 && built.rank != coord))
        st = mg_error(MG_EINVAL, "model '%s' is built as tensor-parallel part %d of %d but the "
                      "mesh gives this rank part %d of %d: build it with mg_tp_split{%d, %d} "
                      "(the mesh's tp size and this rank's tp coordinate)", mg_model_name(m),
                      built.rank, built.size, coord, size, size, coord);
    if (size == 1 || st) return mesh ? mg_strategy_agree(s, st) : st;
    tp_part *t = calloc(1, sizeof *t);
    if (!t) return mg_strategy_agree(s, mg_error(MG_ENOMEM, "tensor parallelism: out of memory"));
    t->s = s;
    t->m = m;
    t->g = mg_mesh_group(mesh, MG_MESH_TP);
    snprintf(t->label, sizeof t->label, "tp%d", size);
    *state = t;
    if (coord > 0) st = tensor_ranges(m, is_split, NULL, 0, &t->own, &t->n_own);
    /* The partial gradients this rank steps: its ranges are the
     * components' before it (none: the whole arena; the data-parallel
     * sharding comes after and narrows them later, reduce). */
    if (!st && built.sequence && mg_strategy_options_of(s)->offload_dir)
        st = mg_error(MG_EUNSUPPORTED, "--sequence-parallel with --offload disk: the partial "
                      "gradients of sequence parallelism are summed in memory; leave one out");
    mg_model_set_tp_comm(m, &(mg_tp_comm){tp_all_reduce, tp_all_gather, tp_reduce_scatter, t});
    return mg_strategy_agree(s, st);
}

/* After the data-parallel reduction: the partial gradients within this
 * rank's ranges (found at the first step, when every component has
 * said them), summed over the group in one all-reduce. */
static mg_status sum_partial(tp_part *t, mg_strategy *s)
{
    if (!t->partial) {
        int n;
        const mg_range *r = mg_strategy_ranges(s, &n);
        MG_TRY(tensor_ranges(t->m, is_partial, r, n, &t->partial, &t->n_partial));
        for (int k = 0; k < t->n_partial; k++) t->sum_len += t->partial[k].hi - t->partial[k].lo;
        if (t->sum_len && !(t->sum = malloc(t->sum_len * sizeof(float))))
            return mg_error(MG_ENOMEM, "tensor parallelism: out of memory");
    }
    if (!t->sum_len) return MG_OK;
    float *g = mg_model_grads(t->m), *p = t->sum;
    mg_device dev = mg_model_device(t->m), host = {MG_DEVICE_CPU, 0};
    for (int k = 0; k < t->n_partial; p += t->partial[k].hi - t->partial[k].lo, k++)
        MG_TRY(mg_device_copy(host, p, dev, g + t->partial[k].lo,
                              (t->partial[k].hi - t->partial[k].lo) * sizeof(float)));
    MG_TRY(mg_all_reduce(t->g, t->sum, t->sum, t->sum_len, MG_F32, MG_SUM));
    p = t->sum;
    for (int k = 0; k < t->n_partial; p += t->partial[k].hi - t->partial[k].lo, k++)
        MG_TRY(mg_device_copy(dev, g + t->partial[k].lo, host, p,
                              (t->partial[k].hi - t->partial[k].lo) * sizeof(float)));
    return MG_OK;
}

static void tp_destroy(void *c)
{
    tp_part *t = c;
    mg_model_set_tp_comm(t->m, NULL);
    free(t->own);
    free(t->partial);
    free(t->sum);
    free(t);
}

static const char *tp_label(void *c) { return ((tp_part *)c)->label; }

static const mg_range *tp_own(void *c, int *n)
{
    tp_part *t = c;
    *n = t->n_own;
    return t->own;
}

static mg_group *tp_group(void *c) { return ((tp_part *)c)->g; }

/* A collective a layer called failed: the micro-batch (or, under a
 * pipeline's schedule, the step) fails with its error. */
static mg_status tp_failure(void *c) { return mg_model_tp_failure(((tp_part *)c)->m); }

static mg_status tp_reduce(void *c)
{
    tp_part *t = c;
    MG_TRY(tp_failure(c));
    return mg_model_tp(t->m).sequence ? sum_partial(t, t->s) : MG_OK;
}

const mg_component_ops mg__tp_component = {
    .name = "tp", .attach = tp_attach, .destroy = tp_destroy, .label = tp_label,
    .own_ranges = tp_own, .shards_over = tp_group, .micro_end = tp_failure,
    .reduce = tp_reduce,
};
