/* The device mesh: a group's ranks as a grid of named dimensions (tp, dp,
 * pp), one sub-group per dimension, laid out as Megatron-LM does (tp
 * fastest, then dp, then pp).
 *
 * The sub-group of dimension d holds the ranks that differ from this one
 * only in coordinate d. With stride[d] the distance between neighbours
 * along d (1 for tp, tp for dp, tp*dp for pp), the rank with coordinate d
 * set to 0, rank - coord[d] * stride[d], names that set uniquely: it is
 * the split's color, and coord[d] its key, so a rank's sub-group rank is
 * its coordinate.
 *
 * Messages name a rank by its world rank and, when two dimensions or more
 * have more than one rank, its coordinates along those, outermost first
 * ("rank 3 (pp 1, dp 1)"; along one dimension the coordinate is the world
 * rank): the mesh labels each rank of the group it is made from
 * (mg_group_set_label) before it splits it, so every sub-group's messages
 * say the same. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/plan.h"
#include "core/strbuf.h"

struct mg_mesh {
    int size[MG_MESH_DIMS], coord[MG_MESH_DIMS];
    mg_group *group[MG_MESH_DIMS];
};

static const char *const dim_names[MG_MESH_DIMS] = {"tp", "dp", "pp"};

const char *mg_mesh_dim_name(mg_mesh_dim d)
{
    MG_ASSERT((unsigned)d < MG_MESH_DIMS);
    return dim_names[d];
}

static int dim_find(const char *s, size_t n)
{
    for (int d = 0; d < MG_MESH_DIMS; d++)
        if (strlen(dim_names[d]) == n && !strncmp(s, dim_names[d], n)) return d;
    return -1;
}

/* One "NAME=SIZE" entry of spec, n bytes at s, into got[]. */
static mg_status parse_entry(const char *spec, const char *s, size_t n, int world,
                             int got[MG_MESH_DIMS])
{
    const char *eq = memchr(s, '=', n);
    if (!eq)
        return mg_error(MG_EINVAL,
                        "mesh '%s': '%.*s' is not NAME=SIZE: write dp=N, optionally with "
                        "tp=N and pp=N, separated by commas (e.g. dp=%d)",
                        spec, (int)n, s, world);
    int d = dim_find(s, (size_t)(eq - s));
    if (d < 0)
        return mg_error(MG_EINVAL, "mesh '%s': unknown dimension '%.*s': use dp, tp or pp",
                        spec, (int)(eq - s), s);
    if (got[d])
        return mg_error(MG_EINVAL, "mesh '%s': %s is given twice: give each of dp, tp, pp "
                        "at most once", spec, dim_names[d]);
    char *num = strndup(eq + 1, n - (size_t)(eq + 1 - s));
    if (!num) return mg_error(MG_ENOMEM, "mesh: out of memory");
    long v = 0;
    mg_status st = mg_parse_long(dim_names[d], num, 1, world, &v);
    free(num);
    if (st) {
        char why[512];
        snprintf(why, sizeof why, "%s", mg_last_error());
        return mg_error(st, "mesh '%s': %s", spec, why);
    }
    got[d] = (int)v;
    return MG_OK;
}

mg_status mg_mesh_parse(const char *spec, int world, int sizes[MG_MESH_DIMS])
{
    if (world < 1) return mg_error(MG_EINVAL, "mesh: the world size %d is not positive", world);
    if (!*spec)
        return mg_error(MG_EINVAL, "mesh '': empty: write dp=N, optionally with tp=N and "
                        "pp=N (e.g. dp=%d)", world);
    int got[MG_MESH_DIMS] = {0};
    for (const char *s = spec;; s++) {
        size_t n = strcspn(s, ",");
        MG_TRY(parse_entry(spec, s, n, world, got));
        s += n;
        if (!*s) break;
    }
    long long tp = got[MG_MESH_TP] ? got[MG_MESH_TP] : 1;
    long long pp = got[MG_MESH_PP] ? got[MG_MESH_PP] : 1;
    if (!got[MG_MESH_DP] && world % (tp * pp))
        return mg_error(MG_EINVAL, "mesh '%s': tp*pp = %lld does not divide the %d ranks, so "
                        "dp = ranks/(tp*pp) cannot be derived: give tp and pp whose product "
                        "divides %d", spec, tp * pp, world, world);
    long long dp = got[MG_MESH_DP] ? got[MG_MESH_DP] : world / (tp * pp);
    if (dp * tp * pp != world)
        return mg_error(MG_EINVAL, "mesh '%s' has dp*tp*pp = %lld ranks but the job has %d: "
                        "give sizes whose product is %d, or leave dp out to derive it",
                        spec, dp * tp * pp, world, world);
    sizes[MG_MESH_TP] = (int)tp;
    sizes[MG_MESH_DP] = (int)dp;
    sizes[MG_MESH_PP] = (int)pp;
    return MG_OK;
}

void mg_mesh_format(const int sizes[MG_MESH_DIMS], char *buf, size_t cap)
{
    snprintf(buf, cap, "dp=%d,pp=%d,tp=%d", sizes[MG_MESH_DP], sizes[MG_MESH_PP],
             sizes[MG_MESH_TP]);
}

/* Every rank's sizes (0 where its spec is bad) agree, found with one
 * all-reduce of the sizes and their negatives: the largest and smallest. */
static mg_status agree(mg_group *g, const char *spec, const int sizes[MG_MESH_DIMS], bool ok)
{
    enum { D = MG_MESH_DIMS };
    int32_t v[2 * D];
    for (int d = 0; d < D; d++) {
        v[d] = ok ? sizes[d] : 0;
        v[D + d] = -v[d];
    }
    MG_TRY(mg_all_reduce(g, MG_IN_PLACE, v, 2 * D, MG_I32, MG_MAX));
    if (!ok) return MG_OK;   /* the caller reports its own spec */
    for (int d = 0; d < D; d++) {
        if (-v[D + d] == 0)
            return mg_error(MG_EMISMATCH, "mesh '%s': another rank's mesh is invalid (its "
                            "own message says why): give every rank the same valid mesh", spec);
    }
    for (int d = 0; d < D; d++) {
        if (v[d] != -v[D + d])
            return mg_error(MG_EMISMATCH, "mesh '%s': the ranks disagree on the mesh (%s from "
                            "%d to %d): give every rank the same mesh", spec, dim_names[d],
                            -v[D + d], v[d]);
    }
    return MG_OK;
}

mg_status mg_mesh_create(mg_group *g, const char *spec, mg_mesh **out)
{
    MG_NEED("mg_mesh_create", out);
    *out = NULL;
    MG_NEED("mg_mesh_create", g);
    MG_NEED("mg_mesh_create", spec);
    int world = mg_group_size(g), rank = mg_group_rank(g);
    int sizes[MG_MESH_DIMS] = {0};
    mg_status bad = mg_mesh_parse(spec, world, sizes);
    char why[1024];
    snprintf(why, sizeof why, "%s", mg_last_error());
    mg_status st = agree(g, spec, sizes, !bad);
    if (bad) return mg_error(bad, "%s", why);
    if (st) return st;
    mg_mesh *m = calloc(1, sizeof *m);
    if (!m) return mg_error(MG_ENOMEM, "mesh: out of memory");
    for (int d = 0, stride = 1; d < MG_MESH_DIMS; stride *= sizes[d++]) {
        m->size[d] = sizes[d];
        m->coord[d] = rank / stride % sizes[d];
    }
    char label[MG_GROUP_LABEL_MAX + 1] = "";
    int dims = 0;
    for (int d = 0; d < MG_MESH_DIMS; d++) dims += m->size[d] > 1;
    for (int d = MG_MESH_DIMS - 1, n = 0; d >= 0 && dims > 1; d--)
        if (m->size[d] > 1)
            n = mg__catf(label, sizeof label, n, "%s%s %d", n ? ", " : "",
                         dim_names[d], m->coord[d]);
    st = mg_group_set_label(g, label);
    if (st) {
        mg_mesh_destroy(m);
        return st;
    }
    int stride = 1;
    for (int d = 0; d < MG_MESH_DIMS; d++) {
        st = mg_group_split(g, rank - m->coord[d] * stride, m->coord[d],
                                      &m->group[d]);
        if (st) {
            mg_mesh_destroy(m);
            return st;
        }
        mg_group_set_name(m->group[d], dim_names[d]);   /* its operations in traces */
        stride *= sizes[d];
    }
    *out = m;
    return MG_OK;
}

void mg_mesh_destroy(mg_mesh *m)
{
    if (!m) return;
    for (int d = 0; d < MG_MESH_DIMS; d++)
        if (m->group[d]) mg_group_destroy(m->group[d]);
    free(m);
}

int mg_mesh_size(const mg_mesh *m, mg_mesh_dim d)
{
    MG_ASSERT((unsigned)d < MG_MESH_DIMS);
    return m->size[d];
}

int mg_mesh_coord(const mg_mesh *m, mg_mesh_dim d)
{
    MG_ASSERT((unsigned)d < MG_MESH_DIMS);
    return m->coord[d];
}

mg_group *mg_mesh_group(mg_mesh *m, mg_mesh_dim d)
{
    MG_ASSERT((unsigned)d < MG_MESH_DIMS);
    return m->group[d];
}

void mg_mesh_describe(const mg_mesh *m, char *buf, size_t cap)
{
    mg_mesh_format(m->size, buf, cap);
}
