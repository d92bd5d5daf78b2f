/* bench/pipeline — one rank of a gpt pipeline (every rank a stage), for
 * bench/pipeline.sh: for each schedule and micro-batch count, the idle
 * fraction each stage lived against the formula, the micro-batches it
 * held and their activation memory, and tokens/s.
 *
 *   mgrun -n P pipeline [--schedules naive,gpipe,1f1b,interleaved]
 *                       [--micro-batches 1,2,4,8,16] [--micro-size S]
 *                       [--steps N] [--layers L] [--dim D] [--heads H] [--ctx T]
 *
 * A micro-batch is S sequences (default 4) whatever M, so a step is M·S
 * sequences and every micro-batch costs the same (as the formula
 * assumes); AdamW as models.md's gpt-mini. Interleaved runs 2 chunks per
 * rank where M >= P (in groups as even as can be: pipeline.h). The first
 * step warms up (the tapes are made) and is not counted. A stage's idle
 * fraction is 1 - its time computing forwards and backwards / its time in
 * the schedule (the optimizer step after it is outside both). Rank 0
 * prints one line per run:
 *   pipeline P p schedule K M m V v idle_theory x idle_mean y idle_ranks
 *   a,b,.. peak_in_flight a,b,.. activations_mb a,b,.. tok_s t
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/multigrad.h"
#include "gpt_optim.h"

typedef struct {
    mg_text *t;
    int S, T;
    uint64_t draw;
    int32_t *x, *y;
} src;

static bool next(void *ud, mg_micro_batch *b)
{
    src *s = ud;
    mg_text_batch(s->t, 0, s->draw++, 0, s->S, s->T, 0, 1, s->x, s->y);
    *b = (mg_micro_batch){.x = s->x, .y = s->y, .n = s->S};
    return true;
}

static int fail(const char *what)
{
    fprintf(stderr, "pipeline: %s: %s\n", what, mg_last_error());
    return 1;
}

/* One run; rank 0 prints its line. */
static int run(mg_group *g, const mg_gpt_config *cfg, mg_text *t, mg_pipe_kind k, int M, int S,
               int steps)
{
    int P = mg_group_size(g), rank = mg_group_rank(g), V = k == MG_PIPE_INTERLEAVED ? 2 : 1;
    mg_model *m;
    if (mg_model_create_gpt(cfg, 0, &m)) return fail("model");
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_PIPELINE);
    char mesh[32];
    snprintf(mesh, sizeof mesh, "pp=%d", P);
    so.group = g;
    so.mesh = mesh;
    so.max_batch = S;
    so.pipe = (mg_pipe_options){.kind = k, .micro_batches = M, .chunks = V};
    mg_strategy *s;
    if (mg_strategy_create(m, &so, &s)) return fail("strategy");
    mg_optim *o;
    if (gpt_adamw(s, &o)) return 1;
    src in = {.t = t, .S = S, .T = cfg->ctx, .x = malloc(sizeof(int32_t) * (size_t)S * cfg->ctx),
              .y = malloc(sizeof(int32_t) * (size_t)S * cfg->ctx)};
    if (!in.x || !in.y) return fail("out of memory");
    mg_step_options sto = {.accumulate = M, .lr = 1e-3f, .clip_grad = 1.0f};
    mg_pipe *p = mg_strategy_pipe(s);
    mg_pipe_stats a = {0};
    double t0 = 0;
    for (int step = 0; step <= steps; step++) {
        if (step == 1) {
            if (mg_barrier(g)) return fail("barrier");
            a = mg_pipe_get_stats(p);
            t0 = mg_now();
        }
        mg_step_result r;
        if (mg_train_step(s, o, &sto, next, &in, &r)) return fail("step");
    }
    double secs = mg_now() - t0;
    mg_pipe_stats b = mg_pipe_get_stats(p);
    double mine[3] = {1 - (b.busy_us - a.busy_us) / (b.step_us - a.step_us),
                      (double)b.peak_in_flight, b.activation_bytes / 1e6};
    double *all = malloc(sizeof *all * 3 * (size_t)P);
    if (!all || mg_all_gather(g, mine, all, 3, MG_F64)) return fail("gathering the figures");
    mg_pipe_sim sim;
    if (mg_pipe_simulate(k, P, M, V, 1, 2, &sim)) return fail("theory");
    if (rank == 0) {
        double mean = 0;
        for (int r = 0; r < P; r++) mean += all[3 * r] / P;
        printf("pipeline P %d schedule %s M %d V %d idle_theory %.4f idle_mean %.4f idle_ranks",
               P, mg_pipe_name(k), M, V, sim.idle_fraction, mean);
        for (int f = 0; f < 3; f++) {
            printf(f == 1 ? " peak_in_flight" : f == 2 ? " activations_mb" : "");
            for (int r = 0; r < P; r++)
                printf(f == 1 ? "%s%.0f" : f == 2 ? "%s%.1f" : "%s%.4f", r ? "," : " ",
                       all[3 * r + f]);
        }
        printf(" tok_s %.0f\n", (double)steps * M * S * cfg->ctx / secs);
        fflush(stdout);
    }
    free(all);
    free(in.x);
    free(in.y);
    mg_optim_destroy(o);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    return 0;
}

int main(int argc, char **argv)
{
    mg_gpt_config cfg = mg_gpt_defaults();
    cfg.layers = 8;
    const char *kinds = "naive,gpipe,1f1b,interleaved", *ms = "1,2,4,8,16";
    int S = 4, steps = 4;
    static const struct option opts[] = {
        {"schedules", 1, 0, 'k'}, {"micro-batches", 1, 0, 'm'}, {"micro-size", 1, 0, 's'},
        {"steps", 1, 0, 'n'},     {"layers", 1, 0, 'l'},        {"dim", 1, 0, 'd'},
        {"heads", 1, 0, 'h'},     {"ctx", 1, 0, 't'},           {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'k': kinds = optarg; break;
        case 'm': ms = optarg; break;
        case 's': S = atoi(optarg); break;
        case 'n': steps = atoi(optarg); break;
        case 'l': cfg.layers = atoi(optarg); break;
        case 'd': cfg.dim = atoi(optarg); break;
        case 'h': cfg.heads = atoi(optarg); break;
        case 't': cfg.ctx = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: pipeline [--schedules K,..] [--micro-batches M,..] "
                            "[--micro-size S] [--steps N] [--layers L] [--dim D] [--heads H] "
                            "[--ctx T]\n");
            return 2;
        }
    }
    if (S < 1 || steps < 1) {
        fprintf(stderr, "pipeline: --micro-size and --steps must be positive\n");
        return 2;
    }
    mg_set_threads((int)mg_env_long("MG_THREADS", 1));
    mg_group *g;
    if (!mg_launch_detect().by) {
        fprintf(stderr, "pipeline: run it under mgrun -n P (P stages)\n");
        return 2;
    }
    if (mg_group_init(NULL, &g)) return fail("joining the job");
    mg_text *t;
    if (mg_text_open(NULL, cfg.ctx, &t)) return fail("text");
    int rc = 0;
    char kl[256];
    snprintf(kl, sizeof kl, "%s", kinds);
    for (char *ks = strtok(kl, ","); ks && !rc; ks = strtok(NULL, ",")) {
        mg_pipe_kind k;
        if (mg_pipe_parse(ks, &k)) return fail("--schedules");
        for (const char *mp = ms; *mp && !rc;) {
            int M = atoi(mp);
            mp += strcspn(mp, ",");
            mp += *mp == ',';
            int V = k == MG_PIPE_INTERLEAVED ? 2 : 1;
            if (M < 1 || mg_pipe_check(k, mg_group_size(g), M, V) ||
                mg_group_size(g) * V > cfg.layers + 3)
                continue;
            rc = run(g, &cfg, t, k, M, S, steps);
        }
    }
    mg_text_close(t);
    mg_group_destroy(g);
    return rc;
}
