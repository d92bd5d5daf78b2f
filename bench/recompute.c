/* bench/recompute — what activation recomputation (mgtrain --recompute)
 * saves and costs: for gpt-mini (batch 32, context 128, on the fortunes
 * text) and lenet-d2l (batch 256, on Fashion-MNIST), the tape (all
 * activation memory of a step) and the time per training step with and
 * without recomputation, runs alternating, best of --repeat; and whether
 * the parameters after the steps are the same bit for bit.
 *
 *   recompute [--steps N] [--repeat R]
 *
 * One BLAS thread (MG_THREADS to change); the first step of each run
 * warms up and is not timed. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/multigrad.h"

typedef struct {
    const mg_text *text;        /* gpt-mini */
    const mg_dataset *images;   /* lenet-d2l */
    int batch, T;
    long draw;
    float *x;
    int32_t *y, *idx;
} feed;

static bool next_batch(void *ud, mg_micro_batch *b)
{
    feed *f = ud;
    if (f->text) {
        mg_text_batch(f->text, 0, (uint64_t)f->draw++, 0, f->batch, f->T, 0, 1, (int32_t *)f->x,
                      f->y);
    } else {
        for (int i = 0; i < f->batch; i++)
            f->idx[i] = (int32_t)((f->draw * f->batch + i) % f->images->n);
        f->draw++;
        if (mg_dataset_gather(f->images, f->idx, f->batch, MG_SCALE_UNIT, f->x,
                              (size_t)f->batch * 784, f->y))
            return false;
    }
    *b = (mg_micro_batch){f->x, f->y, f->batch, true};
    return true;
}

/* One run: steps + 1 training steps; seconds per timed step, the tape's
 * bytes and the final parameters (the caller frees them). */
static int run(const char *name, bool recompute, feed *f, int steps, double *secs,
               size_t *tape, float **params, size_t *n)
{
    mg_zoo_defaults d;
    mg_model *m;
    mg_strategy *s = NULL;
    mg_optim *o = NULL;
    if (mg_zoo_defaults_of(name, &d) || mg_model_create(name, 0, &m)) return 1;
    mg_model_set_recompute(m, recompute);
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_SINGLE);
    so.max_batch = f->batch;
    mg_optim_config oc = mg_optim_defaults(d.optimizer, d.lr);
    oc.momentum = d.momentum;
    if (mg_strategy_create(m, &so, &s) || mg_strategy_optim(s, &oc, &o)) return 1;
    mg_step_options opt = {.accumulate = 1, .lr = d.lr, .clip_grad = d.clip_grad};
    mg_step_result r;
    f->draw = 0;
    double t0 = 0;
    for (int i = 0; i <= steps; i++) {
        if (i == 1) t0 = mg_now();
        if (mg_train_step(s, o, &opt, next_batch, f, &r) || r.micro != 1) return 1;
    }
    *secs = (mg_now() - t0) / steps;
    *tape = mg_tape_bytes(mg_model_tape(m));
    *n = mg_model_arena_size(m);
    *params = malloc(*n * sizeof(float));
    if (!*params) return 1;
    memcpy(*params, mg_model_params(m), *n * sizeof(float));
    mg_optim_destroy(o);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    return 0;
}

int main(int argc, char **argv)
{
    int steps = 10, repeat = 3;
    static const struct option lo[] = {{"steps", 1, 0, 's'}, {"repeat", 1, 0, 'r'},
                                       {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 's' && !mg_parse_long("--steps", optarg, 1, 100000, &v)) steps = (int)v;
        else if (c == 'r' && !mg_parse_long("--repeat", optarg, 1, 100, &v)) repeat = (int)v;
        else {
            if (c != 'h' && c != '?') fprintf(stderr, "recompute: %s\n", mg_last_error());
            fprintf(c == 'h' ? stdout : stderr, "usage: recompute [--steps N] [--repeat R]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    mg_set_threads((int)mg_env_long("MG_THREADS", 1));
    char sys[1024];
    mg_kernels_describe(sys, sizeof sys, "# ");
    printf("%s", sys);
    mg_text *text;
    mg_dataset *images;
    if (mg_text_open(NULL, 128, &text) ||
        mg_dataset_load("/usr/share/datasets/fashion-mnist", true, &images)) {
        fprintf(stderr, "recompute: %s\n", mg_last_error());
        return 1;
    }
    const char *names[2] = {"gpt-mini", "lenet-d2l"};
    int batch[2] = {32, 256};
    printf("%-10s %5s %10s %10s %7s %10s %10s %7s %s\n", "model", "batch", "tape MB", "recomp MB",
           "saved", "ms/step", "recomp ms", "cost", "identical");
    for (int k = 0; k < 2; k++) {
        feed f = {k == 0 ? text : NULL, k == 1 ? images : NULL, batch[k], 128, 0,
                  malloc(sizeof(float) * (size_t)batch[k] * 784),
                  malloc(sizeof(int32_t) * (size_t)batch[k] * 128),
                  malloc(sizeof(int32_t) * (size_t)batch[k])};
        double best[2] = {1e30, 1e30};
        size_t tape[2] = {0, 0}, n[2] = {0, 0};
        float *p[2] = {NULL, NULL};
        for (int r = 0; r < repeat; r++)
            for (int mode = 0; mode < 2; mode++) {
                double secs;
                free(p[mode]);
                if (run(names[k], mode, &f, steps, &secs, &tape[mode], &p[mode], &n[mode])) {
                    fprintf(stderr, "recompute: %s: %s\n", names[k], mg_last_error());
                    return 1;
                }
                if (secs < best[mode]) best[mode] = secs;
            }
        bool same = n[0] == n[1] && !memcmp(p[0], p[1], n[0] * sizeof(float));
        printf("%-10s %5d %10.1f %10.1f %6.0f%% %10.1f %10.1f %6.0f%% %s\n", names[k], batch[k],
               tape[0] / 1e6, tape[1] / 1e6, 100.0 * (1.0 - (double)tape[1] / tape[0]),
               best[0] * 1e3, best[1] * 1e3, 100.0 * (best[1] / best[0] - 1.0),
               same ? "yes" : "NO");
        free(p[0]);
        free(p[1]);
        free(f.x);
        free(f.y);
        free(f.idx);
    }
    printf("# %d timed steps per run, best of %d alternating runs: build/bench/recompute "
           "--steps %d --repeat %d\n", steps, repeat, steps, repeat);
    mg_text_close(text);
    mg_dataset_destroy(images);
    return 0;
}
