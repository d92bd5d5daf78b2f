/* Placements (issue 31, item 2): a parameter's local tensor is a part of
 * its logical one, split along a dimension, in blocks for fused tensors.
 * The run map agrees with the definition element by element and the parts
 * tile the logical tensor; initial values of a part are its slice of the
 * whole; and checkpoints are the logical tensors, so the parts of one
 * split write one file that the whole model and other splits read
 * (parameters and optimizer state). */
#include <math.h>
#include <unistd.h>
#include "harness.h"
#include "multigrad/multigrad.h"

/* The definition: local multi-index -> logical flat index. */
static size_t by_definition(const mg_placement *pl, int nd, const int *ls, size_t local)
{
    int idx[MG_MAX_DIMS], gs[MG_MAX_DIMS];
    mg_placement_global_shape(pl, nd, ls, gs);
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = (int)(local % (size_t)ls[d]);
        local /= (size_t)ls[d];
    }
    if (pl->dim >= 0 && pl->parts > 1) {
        int piece = ls[pl->dim] / pl->stride, block = gs[pl->dim] / pl->stride;
        int i = idx[pl->dim];
        idx[pl->dim] = i / piece * block + pl->index * piece + i % piece;
    }
    size_t g = 0;
    for (int d = 0; d < nd; d++) g = g * (size_t)gs[d] + (size_t)idx[d];
    return g;
}

TEST(placement_runs_follow_the_definition_and_parts_tile)
{
    static const struct { int nd, gshape[3], dim, parts, stride; } cases[] = {
        {2, {6, 4}, 0, 3, 1}, {2, {6, 4}, 1, 2, 1}, {2, {12, 5}, 0, 2, 3},
        {3, {2, 12, 3}, 1, 3, 2}, {1, {8}, 0, 4, 1}, {2, {6, 4}, -1, 1, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int nd = cases[c].nd, ls[3];
        size_t gn = 1;
        for (int d = 0; d < nd; d++) gn *= (size_t)cases[c].gshape[d];
        int *hit = calloc(gn, sizeof *hit);
        for (int ix = 0; ix < cases[c].parts; ix++) {
            mg_placement pl = {cases[c].dim, cases[c].parts, ix, cases[c].stride};
            for (int d = 0; d < nd; d++)
                ls[d] = cases[c].gshape[d] / (d == pl.dim ? pl.parts : 1);
            CHECK_OK(mg_placement_check(&pl, nd, ls));
            size_t ln = gn / (size_t)cases[c].parts;
            for (size_t j = 0; j < ln;) {
                size_t g, n = mg_placement_run(&pl, nd, ls, j, &g);
                CHECK_MSG(n >= 1 && j + n <= ln, "case %zu: run of %zu at %zu", c, n, j);
                if (n < 1) break;
                for (size_t k = 0; k < n; k++) {
                    CHECK_EQ(by_definition(&pl, nd, ls, j + k), g + k);
                    hit[g + k]++;
                }
                /* Maximal: the next element is not the next logical one. */
                if (j + n < ln) CHECK(by_definition(&pl, nd, ls, j + n) != g + n);
                j += n;
            }
        }
        for (size_t g = 0; g < gn; g++) CHECK_MSG(hit[g] == 1, "case %zu: element %zu held %d times", c, g, hit[g]);
        free(hit);
    }
    mg_placement bad = {2, 2, 0, 1};
    int s2[2] = {4, 4};
    CHECK(mg_placement_check(&bad, 2, s2) == MG_EINVAL);
    bad = (mg_placement){0, 2, 0, 3};
    CHECK(mg_placement_check(&bad, 2, s2) == MG_EINVAL);   /* 3 does not divide 4 */
}

/* fc: 8 -> 6 with ReLU (weight [6, 8], bias [6]), then out: 6 -> 4
 * (weight [4, 6], bias [4]): whole; or as Megatron-LM's MLP, fc split by
 * rows (its out features: column-parallel) and out's weight by columns
 * (its in features: row-parallel; its bias whole) into `parts`; or out
 * alone split by rows (its outputs). */
enum { WHOLE, MEGATRON, HEAD_ROWS };
static mg_model *model(int kind, int parts, int index)
{
    int p = kind == WHOLE ? 1 : parts, mid = kind == MEGATRON ? 6 / p : 6;
    int classes = kind == HEAD_ROWS ? 4 / p : 4;
    mg_layer *l[] = {mg_layer_linear("fc", 8, mid, true),
                     mg_layer_linear("out", mid, classes, false)};
    mg_model *m;
    CHECK_OK(mg_model_create_from("tp", mg_layer_sequential(NULL, l, 2), 8, 1, 1, MG_SEED_DEFERRED,
                                  &m));
    if (kind == MEGATRON) {
        CHECK_OK(mg_model_place(m, "fc.weight", (mg_placement){0, p, index, 1}));
        CHECK_OK(mg_model_place(m, "fc.bias", (mg_placement){0, p, index, 1}));
        CHECK_OK(mg_model_place(m, "out.weight", (mg_placement){1, p, index, 1}));
    } else if (kind == HEAD_ROWS) {
        CHECK_OK(mg_model_place(m, "out.weight", (mg_placement){0, p, index, 1}));
        CHECK_OK(mg_model_place(m, "out.bias", (mg_placement){0, p, index, 1}));
    }
    CHECK_OK(mg_model_init_ranges(m, 7, NULL, 0));
    return m;
}

/* Every local element of part m equals its logical element of whole w
 * (parameters; with optimizers, state s too). */
static double part_differs(mg_model *m, mg_model *w, mg_optim *om, mg_optim *ow, int s)
{
    double worst = 0;
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i), *q = mg_model_find(w, p->name);
        const float *a = p->data, *b = q->data;
        if (om) {
            a = mg_optim_state_at(om, s, p->offset, p->offset + p->numel);
            b = mg_optim_state_at(ow, s, q->offset, q->offset + q->numel);
        }
        for (size_t j = 0; j < p->numel; j++) {   /* by the definition, not the run map */
            double d = fabs((double)a[j] - b[by_definition(&p->place, p->ndim, p->shape, j)]);
            if (d > worst) worst = d;
        }
    }
    return worst;
}

TEST(placement_parts_draw_their_slice_of_the_whole)
{
    mg_model *w = model(WHOLE, 1, 0);
    for (int kind = MEGATRON; kind <= HEAD_ROWS; kind++)
        for (int k = 0; k < 2; k++) {
            mg_model *m = model(kind, 2, k);
            CHECK_MSG(part_differs(m, w, NULL, NULL, 0) == 0, "part %d of 2 (kind %d) differs", k,
                      kind);
            const mg_param *p = mg_model_find(m, "out.weight");
            CHECK(p->gnumel == 2 * p->numel && p->gshape[0] == 4 && p->gshape[1] == 6);
            mg_model_destroy(m);
        }
    /* Placed once values are drawn: refused. */
    CHECK(mg_model_place(w, "fc.weight", (mg_placement){0, 2, 0, 1}) == MG_EINVAL);
    mg_model_destroy(w);
}

/* SGD with momentum over m's arena; steps: its step count (a checkpoint's
 * must match the one it loads into). */
static mg_optim *blank_optim(mg_model *m)
{
    mg_optim_config c = mg_optim_defaults(MG_OPTIM_SGD, 0.1f);
    c.momentum = 0.9f;
    mg_optim *o;
    CHECK_OK(mg_optim_create(&c, mg_model_arena_size(m), &o));
    mg_optim_set_steps(o, 1);
    return o;
}

/* One SGD step with momentum whose gradients are a function of the
 * logical element: the momentum buffers hold them. */
static mg_optim *stepped(mg_model *m)
{
    mg_optim *o = blank_optim(m);
    mg_optim_set_steps(o, 0);
    float *g = mg_model_grads(m);
    for (int i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param *p = mg_model_tensor(m, i);
        for (size_t j = 0; j < p->numel;) {
            size_t at, n = mg_placement_run(&p->place, p->ndim, p->shape, j, &at);
            for (size_t k = 0; k < n; k++) g[p->offset + j + k] = 0.01f * (float)((at + k) % 97) + (float)i;
            j += n;
        }
    }
    CHECK_OK(mg_optim_step(o, mg_model_params(m), g, 0.1f));
    return o;
}

/* Parts m[0..n) of one model write one file: each its split tensors,
 * part 0 also the whole ones (and the buffers). */
static void save_parts(const char *path, mg_model **m, mg_optim **o, int n)
{
    mg_ckpt_piece *all = NULL;
    int n_all = 0, fd = -1;
    char tmp[4096];
    mg_ckpt_writer *w0 = NULL;
    for (int k = 0; k < n; k++) {
        mg_ckpt_writer *w;
        CHECK_OK(mg_ckpt_writer_create(m[k], o[k], NULL, &w));
        if (k == 0) {
            w0 = w;
            CHECK_OK(mg_atomic_begin(path, mg_ckpt_writer_size(w), tmp, sizeof tmp, &fd));
        }
        CHECK_EQ(mg_ckpt_writer_size(w), mg_ckpt_writer_size(w0));   /* one layout */
        mg_range mine[16];
        int nr = 0;
        for (int i = 0; i < mg_model_num_tensors(m[k]); i++) {
            const mg_param *p = mg_model_tensor(m[k], i);
            if (!p->is_buffer && (k == 0 || p->gnumel > p->numel))
                mine[nr++] = (mg_range){p->offset, p->offset + p->numel};
        }
        mg_ckpt_sink out = {.fd = fd, .path = tmp};
        mg_ckpt_piece *pc;
        int np;
        CHECK_OK(mg_ckpt_write_part(w, &out, mine, nr, k == 0, &pc, &np));
        all = realloc(all, sizeof *all * (size_t)(n_all + np));
        memcpy(all + n_all, pc, sizeof *pc * (size_t)np);
        n_all += np;
        free(pc);
        if (k) mg_ckpt_writer_destroy(w);
    }
    mg_ckpt_sink out = {.fd = fd, .path = tmp};
    CHECK_OK(mg_ckpt_write_header(w0, &out, all, n_all));
    CHECK_OK(mg_atomic_commit(path, tmp, fd));
    free(all);
    mg_ckpt_writer_destroy(w0);
}

TEST(placement_checkpoints_are_logical_any_split_reads_any_other)
{
    const char *dir = mgt_tmpdir();
    char rows[512], cols[512], alone[512];
    snprintf(rows, sizeof rows, "%s/rows.st", dir);
    snprintf(cols, sizeof cols, "%s/columns.st", dir);
    snprintf(alone, sizeof alone, "%s/alone.st", dir);
    mg_model *w = model(WHOLE, 1, 0);
    mg_optim *ow = stepped(w);
    /* Megatron's split into 2, and out's rows into 2: each set writes one
     * file. */
    mg_model *r[2], *c[2];
    mg_optim *orr[2], *oc[2];
    for (int k = 0; k < 2; k++) orr[k] = stepped(r[k] = model(MEGATRON, 2, k));
    for (int k = 0; k < 2; k++) oc[k] = stepped(c[k] = model(HEAD_ROWS, 2, k));
    save_parts(rows, r, orr, 2);
    save_parts(cols, c, oc, 2);
    /* Every placement reads both files: the whole model, Megatron's split
     * into 3 (another cut than wrote), out's rows into 2. */
    const char *files[2] = {rows, cols};
    for (int f = 0; f < 2; f++)
        for (int v = 0; v < 6; v++) {
            mg_model *m = v == 0 ? model(WHOLE, 1, 0) : v < 4 ? model(MEGATRON, 3, v - 1)
                                                          : model(HEAD_ROWS, 2, v - 4);
            mg_optim *o = blank_optim(m);
            CHECK_OK(mg_checkpoint_load(files[f], m, o, NULL));
            CHECK_MSG(part_differs(m, w, NULL, NULL, 0) == 0 && part_differs(m, w, o, ow, 0) == 0,
                      "%s read as placement %d: differs from the whole", files[f], v);
            mg_optim_destroy(o);
            mg_model_destroy(m);
        }
    /* One part alone does not write the logical tensors: refused, no file. */
    CHECK(mg_checkpoint_save(alone, r[0], orr[0], NULL) != MG_OK);
    CHECK_MSG(strstr(mg_last_error(), "were written in part only"), "%s", mg_last_error());
    CHECK(access(alone, F_OK) != 0);
    for (int k = 0; k < 2; k++) {
        mg_optim_destroy(orr[k]);
        mg_model_destroy(r[k]);
    }
    for (int k = 0; k < 2; k++) {
        mg_optim_destroy(oc[k]);
        mg_model_destroy(c[k]);
    }
    mg_optim_destroy(ow);
    mg_model_destroy(w);
}
