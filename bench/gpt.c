/* bench/gpt — tokens/s of gpt-mini training in one process (one BLAS
 * thread unless MG_THREADS says otherwise) on the fortunes text, with
 * models.md's defaults: AdamW lr 1e-3, betas (0.9, 0.99), weight decay 0.1
 * on 2-D parameters, gradients clipped to norm 1, batch 32, context 128.
 * bench/gpt.sh runs it beside PyTorch's bench/gpt_torch.py.
 *
 *   gpt [--steps N] [--batch B] [--ctx T] [--layers L] [--dim D] [--heads H] [--data PATH]
 *       [--no-eval] [--device cpu|cuda[:N]|emu] [--bf16]
 *
 * Prints the SGEMM peak, then "eval step S val_loss X" at step 0 and at
 * the end (not with --no-eval: for big shapes, where validation would
 * take longer than the steps; final_val_loss is then nan), then the summary line "gpt-mini B T steps tokens/s seconds
 * final_train_loss final_val_loss peak_MB GFLOP/s %peak" (the first step
 * warms up and is not timed; evaluation is not timed). GFLOP/s counts
 * the model's matrix work (mg_model_flops: linear layers, attention's two
 * products, the head). With --device on a GPU the peak is the GPU's: its
 * float32 SGEMM through cuBLAS measured here (4096^3) and its nominal
 * float32 peak, and GFLOP/s is against the measured one; the bench/gpu.sh
 * peer is bench/gpu_gpt_torch.py. --bf16 (a device) makes the GEMMs take
 * bfloat16 operands (mg_device_set_bf16), the peak then measured so too. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include "multigrad/multigrad.h"
#include "peak.h"

static double val_loss(mg_model *m, const mg_text *t, int B)
{
    double v = NAN;
    if (mg_lm_val_loss(m, t, B, NULL, &v)) fprintf(stderr, "gpt: %s\n", mg_last_error());
    return v;
}

int main(int argc, char **argv)
{
    mg_gpt_config g = mg_gpt_defaults();
    int steps = 50, B = 32, eval = 1, bf16 = 0;
    const char *data = NULL;
    mg_device dev = {MG_DEVICE_CPU, 0};
    static const struct option opts[] = {
        {"steps", 1, 0, 's'}, {"batch", 1, 0, 'b'}, {"ctx", 1, 0, 't'}, {"layers", 1, 0, 'l'},
        {"dim", 1, 0, 'd'},   {"heads", 1, 0, 'h'}, {"data", 1, 0, 'D'},
        {"no-eval", 0, 0, 'n'}, {"device", 1, 0, 'v'}, {"bf16", 0, 0, 'f'}, {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 's': steps = atoi(optarg); break;
        case 'b': B = atoi(optarg); break;
        case 't': g.ctx = atoi(optarg); break;
        case 'l': g.layers = atoi(optarg); break;
        case 'd': g.dim = atoi(optarg); break;
        case 'h': g.heads = atoi(optarg); break;
        case 'D': data = optarg; break;
        case 'n': eval = 0; break;
        case 'f': bf16 = 1; break;
        case 'v':
            if (mg_device_parse(optarg, &dev)) {
                fprintf(stderr, "gpt: %s\n", mg_last_error());
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: gpt [--steps N] [--batch B] [--ctx T] [--layers L] [--dim D] "
                            "[--heads H] [--data PATH] [--no-eval] [--device cpu|cuda[:N]|emu] "
                            "[--bf16]\n");
            return 2;
        }
    }
    if (steps < 2 || B < 1) {
        fprintf(stderr, "gpt: --steps must be at least 2 and --batch positive\n");
        return 2;
    }
    if (bf16 && (dev.kind == MG_DEVICE_CPU || mg_device_set_bf16(dev, true))) {
        fprintf(stderr, "gpt: --bf16: %s\n", dev.kind == MG_DEVICE_CPU ? "give --device"
                                                                        : mg_last_error());
        return 2;
    }
    mg_set_threads((int)mg_env_long("MG_THREADS", 1));
    char desc[1024];
    mg_kernels_describe(desc, sizeof desc, "# ");
    fputs(desc, stdout);
    double peak = bench_peak("gpt", dev);
    if (peak < 0) return 1;
    mg_text *t;
    mg_model *m;
    mg_optim *o;
    if (mg_text_open(data, g.ctx, &t) || mg_model_create_gpt(&g, 0, &m) ||
        mg_model_reserve(m, B)) {
        fprintf(stderr, "gpt: %s\n", mg_last_error());
        return 1;
    }
    int T = g.ctx;
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_ADAMW, 1e-3f);
    oc.beta2 = 0.99f;
    oc.weight_decay = 0.1f;
    int ng = mg_model_decay_groups(m, 0.1f, NULL, 0);
    mg_optim_group *gr = malloc(sizeof *gr * (size_t)ng);
    int32_t *x = malloc(sizeof(int32_t) * (size_t)B * T), *y = malloc(sizeof(int32_t) * (size_t)B * T);
    if (!gr || !x || !y || mg_optim_create(&oc, mg_model_arena_size(m), &o)) {
        fprintf(stderr, "gpt: out of memory\n");
        return 1;
    }
    mg_model_decay_groups(m, 0.1f, gr, ng);
    if (mg_optim_set_groups(o, gr, ng) || mg_model_to_device(m, dev) ||
        mg_optim_to_device(o, dev) || mg_model_reserve(m, B)) {
        fprintf(stderr, "gpt: %s\n", mg_last_error());
        return 1;
    }
    printf("# gpt-mini L=%d d=%d h=%d T=%d B=%d: %zu parameters\n", g.layers, g.dim, g.heads, T, B,
           mg_model_num_params(m));
    if (eval) printf("eval step 0 val_loss %.4f\n", val_loss(m, t, B));
    size_t np = mg_model_arena_size(m);
    double t0 = 0, loss = 0;
    for (int s = 0; s < steps; s++) {
        if (s == 1) t0 = mg_now();
        mg_text_batch(t, 0, (uint64_t)s, 0, B, T, 0, 1, x, y);
        mg_model_zero_grad(m);
        mg_model_forward_tokens(m, x, B);
        loss = mg_model_loss(m, y, NULL);
        mg_model_backward(m);
        mg_device_set_current(dev);   /* the gradients are on dev */
        mg_clip_grad_norm(mg_model_grads(m), np, 1.0f);
        mg_device_set_current((mg_device){MG_DEVICE_CPU, 0});
        mg_optim_step(o, mg_model_params(m), mg_model_grads(m), 1e-3f);
    }
    mg_device_synchronize(dev);
    double secs = mg_now() - t0, tok = (double)B * T * (steps - 1) / secs;
    double vl = eval ? val_loss(m, t, B) : NAN;
    if (eval) printf("eval step %d val_loss %.4f\n", steps, vl);
    double train_flops;
    mg_model_flops(m, NULL, &train_flops);   /* per sequence */
    double gf = train_flops * B * (steps - 1) / secs / 1e9;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("gpt-mini %d %d %d %.0f %.2f %.4f %.4f %.1f %.1f %.1f\n", B, T, steps, tok, secs, loss, vl,
           ru.ru_maxrss / 1024.0, gf, peak > 0 ? 100.0 * gf / peak : 0.0);
    mg_optim_destroy(o);
    mg_model_destroy(m);
    mg_text_close(t);
    free(gr);
    free(x);
    free(y);
    return 0;
}
