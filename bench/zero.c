/* bench/zero — one rank of a gpt training job under DDP or ZeRO, for
 * bench/zero.sh: tokens/s, the model state this rank keeps and held at
 * most, the bytes it moved per step and its peak resident memory.
 *
 *   mgrun -n N zero [--stage 0|1|2|3] [--steps S] [--batch B] [--ctx T]
 *                   [--layers L] [--dim D] [--heads H] [--offload DIR]
 *                   [--mesh pp=P[,dp=D]]
 *
 * --stage 0 is DDP (one process: no strategy communication at all), or
 * with --mesh pp=P a pipeline (1F1B, 2 micro-batches of B/D/2); the model
 * is made without values and each rank draws only its part (the plan's
 * init_seed, issue 31); --batch is the global batch (B/D sequences per
 * data-parallel rank), AdamW as
 * models.md's gpt-mini (lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on
 * 2-D parameters, clipping to norm 1); --offload: the optimizer state (and
 * under stage 3 the parameter pieces) in files in DIR. The first step warms up and is not
 * timed. Every rank prints one line:
 *   zero rank R world N stage S params P tok_s X state_params_mb A
 *   state_grads_mb G state_optim_mb O peak_params_mb .. peak_grads_mb ..
 *   activations_mb .. sent_mb_step .. received_mb_step .. peak_rss_mb ..
 *   largest_bucket_mb .. steps_peak_rss_mb .. setup_peak_rss_mb ..
 * (state_*: held between steps; peak_*: at most during a step; MB = 1e6
 * bytes; peak_rss_mb: the whole process's, set-up included). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/multigrad.h"
#include "gpt_optim.h"

typedef struct {
    mg_text *t;
    int B, T, rank, world;  /* global batch; data-parallel rank and ranks */
    int parts;              /* micro-batches of a step */
    uint64_t draw;
    int32_t *x, *y;
    int given;
} src;

static bool next(void *ud, mg_micro_batch *b)
{
    src *s = ud;
    if (s->given == s->parts) return false;
    int n = s->B / s->world / s->parts;
    if (!s->given) mg_text_batch(s->t, 0, s->draw, 0, s->B, s->T, s->rank, s->world, s->x, s->y);
    size_t at = (size_t)s->given * n * s->T;
    *b = (mg_micro_batch){.x = s->x + at, .y = s->y + at, .n = n,
                          .last = ++s->given == s->parts};
    return true;
}

/* The kernel's peak resident set (VmHWM), which writing 5 to clear_refs
 * resets: the peak of the training steps alone, after set-up. */
static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static double peak_since_reset_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb * 1024 / 1e6;
}

static int fail(const char *what)
{
    fprintf(stderr, "zero: %s: %s\n", what, mg_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    mg_gpt_config g = mg_gpt_defaults();
    int steps = 6, B = 2, stage = 0;
    const char *offload = NULL, *mesh = NULL;
    g.layers = 12;
    g.dim = 768;
    g.heads = 12;
    g.ctx = 128;
    static const struct option opts[] = {
        {"steps", 1, 0, 's'}, {"batch", 1, 0, 'b'}, {"ctx", 1, 0, 't'}, {"layers", 1, 0, 'l'},
        {"dim", 1, 0, 'd'},   {"heads", 1, 0, 'h'}, {"stage", 1, 0, 'z'},
        {"offload", 1, 0, 'o'}, {"mesh", 1, 0, 'm'}, {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 's': steps = atoi(optarg); break;
        case 'b': B = atoi(optarg); break;
        case 't': g.ctx = atoi(optarg); break;
        case 'l': g.layers = atoi(optarg); break;
        case 'd': g.dim = atoi(optarg); break;
        case 'h': g.heads = atoi(optarg); break;
        case 'z': stage = atoi(optarg); break;
        case 'o': offload = optarg; break;
        case 'm': mesh = optarg; break;
        default:
            fprintf(stderr, "usage: zero [--stage 0..3] [--steps S] [--batch B] [--ctx T] "
                            "[--layers L] [--dim D] [--heads H] [--offload DIR] "
                            "[--mesh pp=P[,dp=D]]\n");
            return 2;
        }
    }
    if (steps < 2 || B < 1 || stage < 0 || stage > 3) {
        fprintf(stderr, "zero: --steps must be at least 2, --batch positive, --stage 0..3\n");
        return 2;
    }
    mg_set_threads((int)mg_env_long("MG_THREADS", 1));
    mg_group *grp = NULL;
    int rank = 0, world = 1;
    if (mg_launch_detect().by) {
        if (mg_group_init(NULL, &grp)) return fail("joining the job");
        rank = mg_group_rank(grp);
        world = mg_group_size(grp);
    }
    int pp = 1, dp = world, parts = 1;
    if (mesh) {
        int size[MG_MESH_DIMS];
        if (mg_mesh_parse(mesh, world, size)) return fail("--mesh");
        pp = size[MG_MESH_PP];
        dp = size[MG_MESH_DP];
        parts = pp > 1 ? 2 : 1;
    }
    if (B % (dp * parts)) {
        fprintf(stderr, "zero: --batch %d does not divide among %d ranks and %d micro-batches\n",
                B, dp, parts);
        return 2;
    }
    mg_text *t;
    mg_model *m;
    if (mg_text_open(NULL, g.ctx, &t)) return fail("text");
    if (mg_model_create_gpt(&g, MG_SEED_DEFERRED, &m)) return fail("model");
    mg_strategy_options so = mg_strategy_defaults(!grp ? MG_STRATEGY_SINGLE
                                                  : stage ? MG_STRATEGY_ZERO
                                                  : pp > 1 ? MG_STRATEGY_PIPELINE
                                                  : MG_STRATEGY_DDP);
    so.group = grp;
    so.mesh = mesh;
    so.zero_stage = stage;
    so.max_batch = B / dp / parts;
    so.offload_dir = offload;
    so.pipe = (mg_pipe_options){.kind = MG_PIPE_1F1B, .micro_batches = parts};
    mg_strategy *s;
    if (mg_strategy_create(m, &so, &s)) return fail("strategy");
    mg_optim *o;
    if (gpt_adamw(s, &o)) return 1;
    int drank = grp ? mg_mesh_coord(mg_strategy_mesh(s), MG_MESH_DP) : 0;
    src in = {.t = t, .B = B, .T = g.ctx, .rank = drank, .world = dp, .parts = parts,
              .x = malloc(sizeof(int32_t) * (size_t)B * g.ctx),
              .y = malloc(sizeof(int32_t) * (size_t)B * g.ctx)};
    mg_step_options sto = {.accumulate = parts, .lr = 1e-3f, .clip_grad = 1.0f};
    double t0 = 0;
    mg_traffic a = {0, 0};
    double setup_rss = mg_peak_rss() / 1e6;
    reset_peak();
    for (int k = 0; k < steps; k++) {
        if (k == 1) {
            if (grp && mg_barrier(grp)) return fail("barrier");
            t0 = mg_now();
            a = mg_strategy_traffic(s);
        }
        in.draw = (uint64_t)k;
        in.given = 0;
        mg_step_result r;
        if (mg_train_step(s, o, &sto, next, &in, &r)) return fail("step");
    }
    double secs = mg_now() - t0;
    mg_traffic b = mg_strategy_traffic(s);
    mg_memory_stats ms = mg_strategy_memory(s, o);
    size_t arena = mg_model_arena_size(m) * sizeof(float), kp = arena, kg = arena;
    if (mg_strategy_zero(s)) {
        mg_zero_stats z = mg_zero_get_stats(mg_strategy_zero(s));
        kp = z.param_bytes;
        kg = z.grad_bytes;
    }
    /* The largest bucket: what stage 3 gathers at once. */
    int nu = mg_model_num_units(m);
    mg_range *br = malloc(sizeof *br * (size_t)(nu + 1));
    if (!br) return 1;
    size_t unit = 0;
    for (int i = 0, nb = mg_buckets(m, so.ddp.first_bucket_bytes, so.ddp.bucket_bytes, br);
         i < nb; i++)
        if ((br[i].hi - br[i].lo) * sizeof(float) > unit) unit = (br[i].hi - br[i].lo) * sizeof(float);
    free(br);
    double n = steps - 1;
    printf("zero rank %d world %d stage %d params %zu tok_s %.1f state_params_mb %.1f "
           "state_grads_mb %.1f state_optim_mb %.1f peak_params_mb %.1f peak_grads_mb %.1f "
           "activations_mb %.1f sent_mb_step %.3f received_mb_step %.3f peak_rss_mb %.1f "
           "largest_bucket_mb %.1f steps_peak_rss_mb %.1f setup_peak_rss_mb %.1f\n",
           rank, world, grp ? stage : 0, mg_model_num_params(m), (double)B * g.ctx * n / secs,
           kp / 1e6, kg / 1e6, mg_optim_bytes(o) / 1e6, ms.params / 1e6, ms.grads / 1e6,
           ms.activations / 1e6, (double)(b.sent - a.sent) / n / 1e6,
           (double)(b.received - a.received) / n / 1e6, fmax(setup_rss, mg_peak_rss() / 1e6), unit / 1e6,
           peak_since_reset_mb(), setup_rss);
    fflush(stdout);
    mg_optim_destroy(o);
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    mg_text_close(t);
    mg_group_destroy(grp);
    free(in.x);
    free(in.y);
    return 0;
}
