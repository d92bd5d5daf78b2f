/* Placements (nn.h): where a parameter's local tensor lies in its logical
 * one, and the map between their elements, run by run. Pure functions:
 * checkpoints write and read a local tensor as runs of the logical one's
 * bytes, and initial values are drawn by logical element index, so any
 * placement of a tensor reads what any other wrote and equals its part of
 * the whole. One split dimension per tensor (Megatron-LM's tensor
 * parallelism splits one); two would need a second level here. */
#include "multigrad/nn.h"

static size_t prod(const int *s, int from, int to)
{
    size_t n = 1;
    for (int d = from; d < to; d++) n *= (size_t)s[d];
    return n;
}

static bool whole(const mg_placement *pl) { return pl->dim < 0 || pl->parts <= 1; }

void mg_placement_global_shape(const mg_placement *pl, int ndim, const int *local_shape,
                               int *global_shape)
{
    for (int d = 0; d < ndim; d++) global_shape[d] = local_shape[d];
    if (!whole(pl)) global_shape[pl->dim] *= pl->parts;
}

size_t mg_placement_run(const mg_placement *pl, int ndim, const int *ls, size_t local,
                        size_t *global)
{
    if (whole(pl)) {
        *global = local;
        return prod(ls, 0, ndim) - local;
    }
    int d = pl->dim;
    size_t inner = prod(ls, d + 1, ndim), L = (size_t)ls[d];
    size_t piece = L / (size_t)pl->stride;              /* of each block, locally */
    size_t G = L * (size_t)pl->parts, block = G / (size_t)pl->stride;
    size_t q = local / inner, e = local % inner, i = q % L, outer = q / L;
    size_t k = i / piece, w = i % piece;                /* block k, element w of its piece */
    *global = (outer * G + k * block + (size_t)pl->index * piece + w) * inner + e;
    return (piece - w) * inner - e;
}

mg_status mg_placement_check(const mg_placement *pl, int ndim, const int *ls)
{
    if (pl->dim < 0) return MG_OK;
    if (pl->dim >= ndim || pl->parts < 1 || pl->index < 0 || pl->index >= pl->parts ||
        pl->stride < 1 || ls[pl->dim] % pl->stride)
        return mg_error(MG_EINVAL, "placement: part %d of %d along dimension %d in %d block(s) "
                        "does not fit a tensor of %d dimension(s)%s: give 0 <= index < parts, "
                        "dim < %d and a stride that divides the dimension", pl->index, pl->parts,
                        pl->dim, pl->stride, ndim, pl->dim < ndim ? "" : " (dim is past them)",
                        ndim);
    return MG_OK;
}
