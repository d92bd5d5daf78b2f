/* bench/train — images/s of one training epoch for each zoo model in one
 * process, one BLAS thread (MG_THREADS or --threads to change), with the
 * data set preloaded (u8 in memory, each batch gathered and scaled as
 * mgtrain does). Each model trains with its models.md defaults (batch, lr,
 * momentum) on the seed-0 permutation of the 60,000 training images.
 * bench/train.sh runs this and PyTorch's bench/train_torch.py side by side.
 *
 *   train [--model NAME]... [--epochs N] [--data DIR] [--threads N] [--batch N]
 *         [--device cpu|cuda[:N]|emu]
 *
 * First it measures the machine's SGEMM peak with the same kernels and
 * threads (best of square GEMMs of 384..1024); then prints one line per
 * model: "model batch images/s seconds loss peak_MB GFLOP/s %peak", where
 * GFLOP/s counts the model's convolution and linear work per training
 * image (mg_model_flops). With --device on a GPU the peak is the GPU's
 * float32 GEMM measured with cuBLAS (mg_device_sgemm_peak); the batches
 * are gathered on the host and copied in, as mgtrain does; the GPU peer
 * is `bench/train_torch.py --device cuda` (bench/gpu.sh). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/multigrad.h"
#include "peak.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: train [--model NAME]... [--epochs N] [--data DIR] [--threads N] [--batch N]\n"
"             [--device cpu|cuda[:N]|emu] [--version]\n"
            "  --model NAME   mlp, lenet-d2l or lenet5 (repeatable; default all)\n"
            "  --epochs N     epochs to time (default 1; images/s is over all)\n"
            "  --data DIR     Fashion-MNIST directory (default /usr/share/datasets/fashion-mnist)\n"
            "  --threads N    BLAS threads (default 1, or MG_THREADS)\n"
            "  --batch N      override the model's default batch size\n"
            "  --device D     train on D (default cpu)\n");
}


static double peak_gflops;
static mg_device dev = {MG_DEVICE_CPU, 0};

/* The epoch's batches, gathered from the preloaded data set in the
 * order of perm: each step's one micro-batch. */
typedef struct {
    const mg_dataset *ds;
    const int32_t *perm;
    int at, batch;
    mg_scaling sc;
    float *x;
    int32_t *y;
} feed;

static bool next_batch(void *ud, mg_micro_batch *b)
{
    feed *f = ud;
    if (f->at >= f->ds->n) return false;
    int n = f->ds->n - f->at < f->batch ? f->ds->n - f->at : f->batch;
    if (mg_dataset_gather(f->ds, f->perm + f->at, n, f->sc, f->x,
                          (size_t)f->batch * f->ds->h * f->ds->w, f->y))
        return false;
    f->at += n;
    *b = (mg_micro_batch){f->x, f->y, n, true};
    return true;
}

static int run(const char *name, const mg_dataset *ds, int epochs, int batch_override)
{
    mg_zoo_defaults d;
    mg_model *m;
    mg_optim *o = NULL;
    mg_strategy *st = NULL;
    if (mg_zoo_defaults_of(name, &d) || mg_model_create(name, 0, &m)) {
        fprintf(stderr, "train: %s\n", mg_last_error());
        return 1;
    }
    int batch = batch_override > 0 ? batch_override : d.batch;
    mg_optim_config cfg = mg_optim_defaults(MG_OPTIM_SGD, d.lr);
    cfg.momentum = d.momentum;
    int c, h, w;
    mg_model_input_shape(m, &c, &h, &w);
    mg_strategy_options so = mg_strategy_defaults(MG_STRATEGY_SINGLE);
    so.max_batch = batch;
    if (mg_dataset_check_input(ds, name, c, h, w, mg_model_classes(m)) ||
        mg_model_to_device(m, dev) || mg_strategy_create(m, &so, &st) ||
        mg_strategy_optim(st, &cfg, &o)) {
        fprintf(stderr, "train: %s\n", mg_last_error());
        mg_strategy_destroy(st);
        mg_model_destroy(m);
        return 1;
    }
    mg_scaling sc = d.normalized_input ? MG_SCALE_NORMAL : MG_SCALE_UNIT;
    int n = ds->n;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n), *y = malloc(sizeof(int32_t) * (size_t)batch);
    float *x = mg_alloc_zero(sizeof(float) * (size_t)batch * ds->h * ds->w);
    if (!perm || !y || !x) {
        fprintf(stderr, "train: out of memory\n");
        return 1;
    }
    int rc = 0;
    double loss_sum = 0, t0 = mg_now();
    long images = 0, steps = 0;
    mg_step_options opt = {.accumulate = 1, .lr = d.lr};
    for (int e = 0; e < epochs; e++) {
        mg_permutation((uint64_t)e, perm, n);
        loss_sum = 0;
        steps = 0;
        feed f = {ds, perm, 0, batch, sc, x, y};
        mg_step_result r;
        while (f.at < n) {
            if (mg_train_step(st, o, &opt, next_batch, &f, &r) || r.micro == 0) {
                fprintf(stderr, "train: %s\n", mg_last_error());
                rc = 1;
                goto out;
            }
            loss_sum += r.loss_sum / (double)r.samples;
            images += r.samples;
            steps++;
        }
    }
    mg_device_synchronize(dev);   /* the last step's work done */
    double secs = mg_now() - t0;
    double flops, gf;
    mg_model_flops(m, NULL, &flops);
    gf = flops * images / secs / 1e9;
    printf("%-10s %5d %10.0f %8.2f %8.4f %7.1f %7.1f %5.1f\n", name, batch, images / secs, secs,
           loss_sum / steps, mg_peak_rss() / 1e6, gf, 100 * gf / peak_gflops);
    fflush(stdout);
out:
    free(perm);
    free(y);
    mg_free(x);
    mg_optim_destroy(o);
    mg_strategy_destroy(st);
    mg_model_destroy(m);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"epochs", required_argument, 0, 'e'},
        {"data", required_argument, 0, 'd'},  {"threads", required_argument, 0, 't'},
        {"batch", required_argument, 0, 'b'}, {"help", no_argument, 0, 'h'},
        {"device", required_argument, 0, 'D'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    const char *models[8], *dir = "/usr/share/datasets/fashion-mnist";
    int n_models = 0, epochs = 1, batch = 0, c;
    while ((c = getopt_long(argc, argv, "m:e:d:t:b:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            if (n_models < 8) models[n_models++] = optarg;
            break;
        case 'e': epochs = atoi(optarg); break;
        case 'd': dir = optarg; break;
        case 't':
            if (atoi(optarg) < 1) {
                fprintf(stderr, "train: --threads must be at least 1\n");
                return 2;
            }
            mg_set_threads(atoi(optarg));
            break;
        case 'b': batch = atoi(optarg); break;
        case 'h': usage(stdout); return 0;
        case 'V': mg_print_version("train"); return 0;
        case 'D':
            if (mg_device_parse(optarg, &dev) || mg_device_check(dev)) {
                fprintf(stderr, "train: --device: %s\n", mg_last_error());
                return 2;
            }
            break;
        default: usage(stderr); return 2;
        }
    }
    if (epochs < 1 || batch < 0) {
        fprintf(stderr, "train: --epochs must be at least 1 and --batch positive\n");
        return 2;
    }
    if (n_models == 0)
        for (const char *const *nm = mg_model_names(); *nm; nm++) {
            mg_zoo_defaults d;
            if (!mg_zoo_defaults_of(*nm, &d) && !d.language_model) models[n_models++] = *nm;
        }
    mg_dataset *train, *test;
    /* The test set is loaded too, as mgtrain holds it: peak memory is the
     * whole training process's. */
    if (mg_dataset_load(dir, true, &train) || mg_dataset_load(dir, false, &test)) {
        fprintf(stderr, "train: %s\n", mg_last_error());
        return 1;
    }
    char sys[1024];
    mg_kernels_describe(sys, sizeof sys, "# ");
    printf("# multigrad %s: %d thread(s), %d epoch(s)\n%s", MG_VERSION, mg_get_threads(), epochs,
           sys);
    if ((peak_gflops = bench_peak("train", dev)) < 0) return 1;
    printf("%-10s %5s %10s %8s %8s %7s %7s %5s\n", "model", "batch", "images/s", "seconds", "loss",
           "peakMB", "GFLOP/s", "%peak");
    int rc = 0;
    for (int i = 0; i < n_models; i++) rc |= run(models[i], train, epochs, batch);
    mg_dataset_destroy(train);
    mg_dataset_destroy(test);
    return rc;
}
