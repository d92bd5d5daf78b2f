/* Equivalence of strategies with one process: the shared cases (equiv.h). */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include "equiv.h"

bool eq_lm(const eq_case *c) { return !strncmp(c->model, "gpt", 3); }




void eq_out_path(char *p, size_t cap, const char *what, int rank)
{
    snprintf(p, cap, "%s/%s.%d", mgt_tmpdir(), what, rank);
}

void eq_write_floats(const char *what, int rank, const float *v, size_t n)
{
    char p[512];
    eq_out_path(p, sizeof p, what, rank);
    FILE *f = fopen(p, "wb");
    CHECK(f && fwrite(v, sizeof(float), n, f) == n);
    fclose(f);
}

float *eq_read_floats(const char *what, int rank, size_t n)
{
    char p[512];
    eq_out_path(p, sizeof p, what, rank);
    float *v = malloc(n * sizeof(float));
    FILE *f = fopen(p, "rb");
    CHECK_MSG(f && fread(v, sizeof(float), n, f) == n, "%s: missing or short", p);
    fclose(f);
    return v;
}

/* ---- batches ----------------------------------------------------------- */



/* Micro-batch j of step `step` for rank r of w: images perm[r + w*i] of
 * the rank's local micro-batches (DistributedSampler order); text rows
 * (acc*w + r)*local .. of the step's reference rows. A one-process source with
 * parts = w*accumulate gives every rank's micro-batches in turn. */
bool eq_next(void *ud, mg_micro_batch *b)
{
    eq_source *s = ud;
    if (s->j == s->parts) return false;
    const eq_case *c = s->c;
    int local = c->batch / c->world, j = s->j++;
    int r = s->world == 1 ? j % c->world : s->rank;
    int acc = s->world == 1 ? j / c->world : j;
    if (eq_lm(c)) {
        int64_t o64[GB];
        /* The step's rows in blocks of `local`, micro-batch by micro-batch. */
        for (int i = 0; i < local; i++) {
            long at = (long)s->step * GB + ((long)acc * c->world + r) * local + i;
            CHECK(at < 20 * GB);
            o64[i] = s->offs[at];
        }
        mg_text_batch_at(s->text, o64, local, T, s->tok, s->y);
        *b = (mg_micro_batch){.x = s->tok, .y = s->y, .n = local};
    } else {
        int32_t idx[256];
        for (int i = 0; i < local; i++) {
            long mi = (long)(s->step * c->accumulate + acc) * local + i;
            idx[i] = s->perm[(r + (long)c->world * mi) % s->train->n];
        }
        CHECK_OK(mg_dataset_gather(s->train, idx, local, MG_SCALE_UNIT, s->x,
                                   784 * (size_t)local, s->y));
        *b = (mg_micro_batch){.x = s->x, .y = s->y, .n = local};
    }
    return true;
}

mg_model *eq_make_model(const eq_case *c, const mg_st_file *ref, uint64_t seed)
{
    mg_model *m;
    if (eq_lm(c)) {
        mg_gpt_config g = mg_gpt_defaults();
        g.ctx = T;
        bool g6 = !strcmp(c->model, "gpt-6");
        if (g6) {   /* deep enough for 8 stages */
            g.layers = 6;
            g.dim = 64;
            g.heads = 2;
        }
        CHECK_OK(mg_model_create_gpt(&g, seed, &m));
        char key[96];
        for (int i = 0; ref && !g6 && i < mg_model_num_tensors(m); i++) {
            const mg_param *p = mg_model_tensor(m, i);
            snprintf(key, sizeof key, "init.%s", p->name);
            const mg_st_tensor *t = mg_st_find(ref, key);
            CHECK(t && t->nbytes == p->numel * 4);
            memcpy(p->data, t->data, t->nbytes);
        }
    } else {
        CHECK_OK(mg_model_create(c->model, seed, &m));
    }
    if (c->dev.kind != MG_DEVICE_CPU) CHECK_OK(mg_model_to_device(m, c->dev));
    return m;
}

mg_optim *eq_make_optim(const eq_case *c, mg_strategy *s)
{
    mg_model *m = mg_strategy_model(s);
    mg_optim *o;
    if (eq_lm(c)) {
        mg_optim_config oc = mg_optim_defaults(MG_OPTIM_ADAMW, 1e-3f);
        oc.beta2 = 0.99f;
        oc.weight_decay = 0.1f;
        CHECK_OK(mg_strategy_optim(s, &oc, &o));
        mg_optim_group gr[128];
        int ng = mg_model_decay_groups(m, 0.1f, gr, 128);
        CHECK_OK(mg_optim_set_groups(o, gr, ng));
    } else {
        mg_optim_config oc = mg_optim_defaults(MG_OPTIM_SGD, 0.05f);
        oc.momentum = 0.9f;
        CHECK_OK(mg_strategy_optim(s, &oc, &o));
    }
    return o;
}

/* Train c->steps steps with strategy s, writing each step's loss (this
 * process's mean) to losses[] and returning the parameters as a vector. */
float *eq_train(const eq_case *c, mg_strategy *s, eq_source *src, float *losses)
{
    mg_model *m = mg_strategy_model(s);
    mg_optim *o = eq_make_optim(c, s);
    if (c->offload) {
        /* The files are unlinked as soon as they are made. */
        CHECK(mg_optim_offloaded(o));
        DIR *d = opendir(c->offload);
        CHECK(d);
        int n = 0;
        for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
        if (d) closedir(d);
        CHECK_EQ(n, 0);
    }
    bool lm = eq_lm(c);
    /* Offloaded to the host, the optimizer stays there, checkpoints too. */
    mg_device_kind ok = c->offload_cpu ? MG_DEVICE_CPU : mg_model_device(m).kind;
    CHECK(mg_optim_device(o).kind == ok);
    mg_step_options so = {.accumulate = src->parts, .lr = lm ? 1e-3f : 0.05f,
                          .clip_grad = lm ? 1.0f : 0.0f};
    for (int step = 0; step < c->steps; step++) {
        src->step = step;
        src->j = 0;
        mg_step_result r;
        CHECK_OK(mg_train_step(s, o, &so, eq_next, src, &r));
        CHECK_EQ(r.micro, src->parts);
        losses[step] = (float)(r.loss_sum / (double)r.samples);
    }
    if (c->save) {
        CHECK_OK(mg_strategy_save(s, c->save, o, NULL));
        /* Read back into the same strategy and saved again: the same bytes. */
        char again[1100];
        snprintf(again, sizeof again, "%.1000s.again", c->save);
        CHECK_OK(mg_strategy_load(s, c->save, o, NULL));
        CHECK_OK(mg_strategy_save(s, again, o, NULL));
        CHECK(mg_optim_device(o).kind == ok);
    }
    CHECK_OK(mg_strategy_gather(s));
    float *v = malloc(mg_model_num_params(m) * sizeof(float));
    size_t n = mg_model_arena_size(m);
    float *p = malloc(n * sizeof(float));
    CHECK(v && p);
    CHECK_OK(mg_device_copy((mg_device){MG_DEVICE_CPU, 0}, p, mg_model_device(m),
                            mg_model_params(m), n * sizeof(float)));
    mg_model_to_vector(m, p, v);
    free(p);
    mg_strategy_release(s);
    mg_optim_destroy(o);
    return v;
}

void eq_open_data(const eq_case *c, eq_source *s, mg_st_file **ref)
{
    *ref = NULL;
    if (eq_lm(c)) {
        mg_text *t;
        CHECK_OK(mg_text_open(NULL, T, &t));
        s->text = t;
        CHECK_OK(mg_st_open(mgt_data("gpt-mini.safetensors"), ref));
        const mg_st_tensor *o = mg_st_find(*ref, "steps.offsets");
        CHECK(o && o->nbytes == 20 * GB * 4);
        s->offs = o->data;
        s->tok = malloc(sizeof(int32_t) * GB * T);
        s->y = malloc(sizeof(int32_t) * GB * T);
    } else {
        CHECK_OK(mg_dataset_load(mgt_fashion_dir(), true, &s->train));
        s->perm = malloc(sizeof(int32_t) * (size_t)s->train->n);
        mg_permutation(0, s->perm, s->train->n);
        s->x = malloc(sizeof(float) * 784 * 256);
        s->y = malloc(sizeof(int32_t) * 256);
    }
}

void eq_close_data(eq_source *s, mg_st_file *ref)
{
    if (s->text) mg_text_close((mg_text *)s->text);
    if (s->train) mg_dataset_destroy(s->train);
    mg_st_close(ref);
    free(s->perm);
    free(s->x);
    free(s->tok);
    free(s->y);
}


/* One process over the ranks' micro-batches (every rank's, in turn). */
float *eq_one_process(const eq_case *cc, float *losses)
{
    eq_case one = *cc;   /* the plain run: in memory, on the CPU, nothing saved */
    one.dev = (mg_device){MG_DEVICE_CPU, 0};
    one.offload = NULL;
    one.save = NULL;
    const eq_case *c = &one;
    eq_source src = {.c = c, .world = 1, .parts = c->world * c->accumulate};
    mg_st_file *ref;
    eq_open_data(c, &src, &ref);
    mg_model *m = eq_make_model(c, ref, 0);
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_SINGLE);
    so.max_batch = c->batch / c->world;
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    float *v = eq_train(c, s, &src, losses);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    eq_close_data(&src, ref);
    return v;
}

/* max |a - b| / max |b| */
double eq_max_rel(const float *a, const float *b, size_t n)
{
    double mx = 0, err = 0;
    for (size_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(b[i]));
        err = fmax(err, fabs(a[i] - b[i]));
    }
    return err / mx;
}

void eq_match_pytorch_losses(int procs, const char *what)
{
    mg_st_file *f;
    CHECK_OK(mg_st_open(mgt_data("gpt-mini.safetensors"), &f));
    const float *want = mg_st_find(f, "losses")->data;
    float sum[20] = {0};
    for (int r = 0; r < procs; r++) {
        float *l = eq_read_floats("losses", r, 20);
        for (int i = 0; i < 20; i++) sum[i] += l[i];
        free(l);
    }
    for (int i = 0; i < 20; i++)
        CHECK_MSG(fabs(sum[i] - want[i]) <= 1e-4 * want[i], "%s step %d: loss %.7g vs PyTorch "
                  "%.7g", what, i, sum[i], want[i]);
    mg_st_close(f);
}

void eq_match_pytorch(int procs, const char *what)
{
    mg_st_file *f;
    CHECK_OK(mg_st_open(mgt_data("gpt-mini.safetensors"), &f));
    eq_case c = {.model = "gpt-mini"};
    mg_model *m = eq_make_model(&c, NULL, 0);
    size_t n = mg_model_num_params(m);
    eq_match_pytorch_losses(procs, what);
    for (int r = 0; r < procs; r++) {
        float *p = eq_read_floats("params", r, n);
        size_t at = 0;
        char key[96];
        for (int i = 0; i < mg_model_num_tensors(m); i++) {
            const mg_param *t = mg_model_tensor(m, i);
            if (t->is_buffer) continue;
            snprintf(key, sizeof key, "final.%s", t->name);
            const mg_st_tensor *x = mg_st_find(f, key);
            CHECK(x && x->nbytes == t->numel * 4);
            double d = eq_max_rel(p + at, x->data, t->numel);
            CHECK_MSG(d <= 1e-3, "%s rank %d: %s differs from PyTorch by %.3g of its scale", what,
                      r, t->name, d);
            at += t->numel;
        }
        free(p);
    }
    printf("%s: 20 losses and final parameters match PyTorch\n", what);
    mg_model_destroy(m);
    mg_st_close(f);
}

void eq_end_rank(mg_strategy *s, mg_model *m, eq_source *src, mg_st_file *ref, mg_group *g)
{
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    if (src) eq_close_data(src, ref);
    mg_group_destroy(g);
}

/* The two files exist and hold the same bytes. */
bool eq_same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    bool there = access(a, R_OK) == 0 && access(b, R_OK) == 0;
    CHECK_MSG(there, "%s or %s missing", a, b);
    char *x = mgt_slurp(a, &na), *y = mgt_slurp(b, &nb);
    bool same = there && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}
