/* The gradient norm of --deterministic (det.c): the sum of squares of
 * the summed gradient in one grouping whatever the plan and the tensor-
 * parallel size, so that clipping scales by the same bits everywhere.
 *
 * The grouping follows the fixed sums (mg_model_set_fixed_sums: C chunks
 * of every split dimension). Per unit: for each chunk c of its split
 * tensors, the squares of the chunk's elements added in order (the
 * unit's tensors in order, each tensor's chunk row-major: the same
 * elements in the same order whether one rank holds all C chunks or each
 * of T ranks C/T of them), the C chunk sums then added in a binary tree,
 * then the squares of its whole tensors (tp rank 0's, in order). A rank
 * computes its units (a pipeline stage's own) and its chunks; the tp
 * ranks all-gather theirs, the pipeline's stages add their units' (each
 * unit is non-zero on one stage only: exact), and the units' sums are
 * added in the units' order.
 * Limits: a tensor is split along one dimension (placement.c's); sums in
 * double, element by element. */
#include <stdlib.h>
#include <string.h>
#include "parallel/internal.h"

struct mg__det_norm {
    mg_model *m;
    mg_group *tp, *stages;   /* NULL: none */
    int tp_rank, T, nl;      /* nl: this rank's chunks, C / T */
    const mg_range *own;
    int nown;
    int units;
    double *mine;            /* per unit: nl chunk sums, then its whole tensors' */
    double *all;             /* the tp ranks' mine, gathered */
    double *unit_ss;
};

void mg__det_norm_destroy(mg__det_norm *n)
{
    if (!n) return;
    free(n->mine);
    free(n->all);
    free(n->unit_ss);
    free(n);
}

mg_status mg__det_norm_create(mg_model *m, mg_group *tp, mg_group *stages, const mg_range *own,
                              int nown, mg__det_norm **out)
{
    mg__det_norm *n = calloc(1, sizeof *n);
    *out = n;
    if (!n) return mg_error(MG_ENOMEM, "--deterministic: out of memory");
    n->m = m;
    n->tp = tp;
    n->stages = stages;
    n->T = tp ? mg_group_size(tp) : 1;
    n->tp_rank = tp ? mg_group_rank(tp) : 0;
    int C = mg_model_fixed_sums(m);
    n->nl = C > 0 ? C / n->T : 1;
    n->own = own;
    n->nown = nown;
    n->units = mg_model_num_units(m);
    size_t per = (size_t)n->units * (size_t)(n->nl + 1);
    n->mine = calloc(per, sizeof *n->mine);
    n->all = calloc(per * (size_t)n->T, sizeof *n->all);
    n->unit_ss = calloc((size_t)n->units, sizeof *n->unit_ss);
    return n->mine && n->all && n->unit_ss
               ? MG_OK : mg_error(MG_ENOMEM, "--deterministic: out of memory for the norms");
}

static size_t prod(const int *s, int from, int to)
{
    size_t k = 1;
    for (int d = from; d < to; d++) k *= (size_t)s[d];
    return k;
}

/* s + the squares of chunk j (of nl) of split tensor p (gradient g), in
 * row-major order: of each stride block along the split dimension, the
 * j-th of its nl pieces. */
static double chunk_squares(double s, const mg_param *p, const float *g, int j, int nl)
{
    int d = p->place.dim;
    size_t L = (size_t)p->shape[d], inner = prod(p->shape, d + 1, p->ndim);
    size_t outer = prod(p->shape, 0, d), bs = L / (size_t)p->place.stride, w = bs / (size_t)nl;
    for (size_t o = 0; o < outer; o++)
        for (int b = 0; b < p->place.stride; b++) {
            const float *x = g + (o * L + (size_t)b * bs + (size_t)j * w) * inner;
            for (size_t k = 0; k < w * inner; k++) s += (double)x[k] * x[k];
        }
    return s;
}

static bool owned(const mg__det_norm *n, size_t lo, size_t hi)
{
    for (int i = 0; i < n->nown; i++)
        if (lo >= n->own[i].lo && hi <= n->own[i].hi) return true;
    return false;
}

/* The values v[0 .. k) (k a power of two) added in the binary tree. */
static double tree(double *v, int k)
{
    for (int step = 1; step < k; step <<= 1)
        for (int i = 0; i + step < k; i += 2 * step) v[i] += v[i + step];
    return v[0];
}

mg_status mg__det_norm_sumsq(mg__det_norm *n, const float *g, double *sumsq)
{
    int nl = n->nl, per = nl + 1, nt = mg_model_num_tensors(n->m);
    memset(n->mine, 0, (size_t)n->units * (size_t)per * sizeof *n->mine);
    for (int u = 0; u < n->units; u++) {
        size_t lo, hi;
        mg_model_unit_range(n->m, u, &lo, &hi);
        if (hi == lo || !owned(n, lo, hi)) continue;
        double *v = n->mine + (size_t)u * (size_t)per;
        for (int j = 0; j < nl; j++)
            for (int i = 0; i < nt; i++) {
                const mg_param *p = mg_model_tensor(n->m, i);
                if (!p->is_buffer && p->place.dim >= 0 && p->offset >= lo && p->offset < hi)
                    v[j] = chunk_squares(v[j], p, g + p->offset, j, nl);
            }
        for (int i = 0; i < nt && n->tp_rank == 0; i++) {
            const mg_param *p = mg_model_tensor(n->m, i);
            if (p->is_buffer || p->place.dim >= 0 || p->offset < lo || p->offset >= hi) continue;
            const float *x = g + p->offset;
            for (size_t k = 0; k < p->numel; k++) v[nl] += (double)x[k] * x[k];
        }
    }
    size_t len = (size_t)n->units * (size_t)per;
    if (n->tp) MG_TRY(mg_all_gather(n->tp, n->mine, n->all, len, MG_F64));
    else memcpy(n->all, n->mine, len * sizeof *n->all);
    double c[64];   /* mg_model_set_fixed_sums: at most 64 chunks */
    int C = nl * n->T;
    MG_ASSERT(C <= 64);
    for (int u = 0; u < n->units; u++) {
        double whole = 0;
        for (int r = 0; r < n->T; r++) {
            const double *v = n->all + (size_t)r * len + (size_t)u * (size_t)per;
            for (int j = 0; j < nl; j++) c[r * nl + j] = v[j];
            whole += v[nl];   /* tp rank 0's; the others' zeros */
        }
        n->unit_ss[u] = tree(c, C) + whole;
    }
    if (n->stages)
        MG_TRY(mg_all_reduce(n->stages, n->unit_ss, n->unit_ss, (size_t)n->units, MG_F64, MG_SUM));
    *sumsq = 0;
    for (int u = 0; u < n->units; u++) *sumsq += n->unit_ss[u];
    return MG_OK;
}
