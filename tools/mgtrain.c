/* mgtrain — train a zoo model on Fashion-MNIST (or MNIST) from the command
 * line: in one process, with DataParallel threads (--parallel dp), or as
 * one rank of a DistributedDataParallel job launched by mgrun or mpirun
 * (--parallel ddp; --batch is the global batch, each rank takes B/k, so
 * the same flags mean the same training at any k). Each epoch reports train loss and accuracy, test
 * accuracy, seconds and images/s; a metrics log (CSV or JSON lines) and an
 * SVG plot of loss and accuracy are written next to each other; checkpoints
 * are safetensors, written atomically, and --resume continues exactly
 * where one left off.
 *
 * Bad input (unknown model, a non-positive number, a missing data
 * directory, a damaged or mismatched checkpoint) gives one line saying
 * what is wrong and how to fix it, and exit status 2; no file is written
 * before the input has been checked. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "multigrad/multigrad.h"
#include "multigrad/plot.h"

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

typedef struct {
    const char *model, *data, *optimizer, *schedule, *save, *resume, *init, *init_prefix, *log;
    const char *parallel, *compress;
    int epochs, batch, threads, quiet, eval_only, workers, accumulate;
    double bucket_mb;
    float lr, momentum, weight_decay;
    uint64_t seed;
    int have_batch, have_lr, have_momentum, have_epochs;
} options;

typedef struct {
    int epoch;            /* 1-based */
    long step;
    double train_loss, train_acc, test_loss, test_acc, seconds, images_per_s, lr;
} epoch_row;

static const char *prog = "mgtrain";

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static void usage(FILE *f)
{
    fprintf(f,
"usage: mgtrain [options]\n"
"Train a zoo model on Fashion-MNIST and report loss and accuracy per epoch.\n"
"\n"
"  --model NAME        mlp | lenet-d2l | lenet5 (default lenet-d2l)\n"
"  --data DIR          IDX files directory (default " DEFAULT_DATA ")\n"
"  --epochs N          epochs (default: the model's, 10)\n"
"  --batch B           batch size (default: the model's)\n"
"  --lr X              learning rate (default: the model's)\n"
"  --momentum X        SGD momentum (default: the model's)\n"
"  --optimizer NAME    sgd | adam | adamw (default sgd)\n"
"  --weight-decay X    weight decay (default 0; AdamW: 0.01)\n"
"  --schedule SPEC     constant | step:STEPS:GAMMA | cosine[:MIN_LR],\n"
"                      optionally followed by ,warmup:STEPS (default constant)\n"
"  --seed N            seed for initialisation and shuffling (default 0)\n"
"  --threads N         BLAS threads (default 1, or MG_THREADS)\n"
"  --save FILE         write a checkpoint (safetensors) after every epoch\n"
"  --resume FILE       continue the training saved in FILE\n"
"  --init FILE         start from the parameters in a safetensors file\n"
"  --init-prefix P     look the parameters up as P<name> (e.g. init.)\n"
"  --eval-only         report test loss and accuracy of the weights, no training\n"
"  --log FILE          metrics per epoch: CSV (.csv) or JSON lines (otherwise);\n"
"                      an SVG plot is written next to it (FILE with .svg)\n"
"  --quiet             print only the final summary\n"
"  --verbose           print the CPU, the kernels in use and the settings\n"
"                      (as MG_VERBOSE=1)\n"
"  --version           version, CPU and kernels of this machine\n"
"  --parallel MODE     none | dp (threads in this process) | ddp (one rank of\n"
"                      a job started by mgrun or mpirun) (default none)\n"
"  --workers N         DataParallel threads (default 2)\n"
"  --bucket-mb X       DDP bucket cap in MiB (default 25; the first is 1)\n"
"  --accumulate N      micro-batches per optimizer step (default 1)\n"
"  --compress C        DDP gradient compression: none | fp16 | bf16\n"
"  --help              this text\n");
}

static long parse_long(const char *flag, const char *s, long lo)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s)
        die("%s '%s' is not an integer; give e.g. %s 10", flag, s, flag);
    if (v < lo)
        die("%s %s must be at least %ld", flag, s, lo);
    return v;
}

static float parse_float(const char *flag, const char *s, int positive)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v))
        die("%s '%s' is not a number; give e.g. %s 0.1", flag, s, flag);
    if (positive && v <= 0) die("%s %s must be positive", flag, s);
    if (!positive && v < 0) die("%s %s must not be negative", flag, s);
    return (float)v;
}

static void parse_args(int argc, char **argv, options *o)
{
    enum { O_MODEL = 256, O_DATA, O_EPOCHS, O_BATCH, O_LR, O_MOM, O_OPT, O_WD,
           O_SCHED, O_SEED, O_THREADS, O_SAVE, O_RESUME, O_INIT, O_EVAL, O_LOG,
           O_QUIET, O_HELP, O_INIT_PREFIX, O_PARALLEL, O_WORKERS, O_BUCKET, O_ACCUM,
           O_COMPRESS, O_VERBOSE, O_VERSION };
    static const struct option lo[] = {
        {"model", 1, 0, O_MODEL}, {"data", 1, 0, O_DATA}, {"epochs", 1, 0, O_EPOCHS},
        {"batch", 1, 0, O_BATCH}, {"lr", 1, 0, O_LR}, {"momentum", 1, 0, O_MOM},
        {"optimizer", 1, 0, O_OPT}, {"weight-decay", 1, 0, O_WD},
        {"schedule", 1, 0, O_SCHED}, {"seed", 1, 0, O_SEED}, {"threads", 1, 0, O_THREADS},
        {"save", 1, 0, O_SAVE}, {"resume", 1, 0, O_RESUME}, {"init", 1, 0, O_INIT}, {"init-prefix", 1, 0, O_INIT_PREFIX},
        {"eval-only", 0, 0, O_EVAL}, {"log", 1, 0, O_LOG}, {"quiet", 0, 0, O_QUIET},
        {"help", 0, 0, O_HELP}, {"parallel", 1, 0, O_PARALLEL},
        {"workers", 1, 0, O_WORKERS}, {"bucket-mb", 1, 0, O_BUCKET},
        {"accumulate", 1, 0, O_ACCUM}, {"compress", 1, 0, O_COMPRESS},
        {"verbose", 0, 0, O_VERBOSE}, {"version", 0, 0, O_VERSION}, {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->model = "lenet-d2l";
    o->data = DEFAULT_DATA;
    o->optimizer = "sgd";
    o->schedule = "constant";
    o->threads = (int)mg_env_long("MG_THREADS", 1);
    o->weight_decay = -1;
    o->parallel = "none";
    o->compress = "none";
    o->workers = 2;
    o->accumulate = 1;
    o->bucket_mb = 25;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case O_MODEL: o->model = optarg; break;
        case O_DATA: o->data = optarg; break;
        case O_EPOCHS: o->epochs = (int)parse_long("--epochs", optarg, 1); o->have_epochs = 1; break;
        case O_BATCH: o->batch = (int)parse_long("--batch", optarg, 1); o->have_batch = 1; break;
        case O_LR: o->lr = parse_float("--lr", optarg, 1); o->have_lr = 1; break;
        case O_MOM: o->momentum = parse_float("--momentum", optarg, 0); o->have_momentum = 1; break;
        case O_OPT: o->optimizer = optarg; break;
        case O_WD: o->weight_decay = parse_float("--weight-decay", optarg, 0); break;
        case O_SCHED: o->schedule = optarg; break;
        case O_SEED: o->seed = (uint64_t)parse_long("--seed", optarg, 0); break;
        case O_THREADS: o->threads = (int)parse_long("--threads", optarg, 1); break;
        case O_SAVE: o->save = optarg; break;
        case O_RESUME: o->resume = optarg; break;
        case O_INIT: o->init = optarg; break;
        case O_INIT_PREFIX: o->init_prefix = optarg; break;
        case O_EVAL: o->eval_only = 1; break;
        case O_LOG: o->log = optarg; break;
        case O_QUIET: o->quiet = 1; break;
        case O_HELP: usage(stdout); exit(0);
        case O_PARALLEL: o->parallel = optarg; break;
        case O_WORKERS: o->workers = (int)parse_long("--workers", optarg, 1); break;
        case O_BUCKET: o->bucket_mb = parse_float("--bucket-mb", optarg, 1); break;
        case O_ACCUM: o->accumulate = (int)parse_long("--accumulate", optarg, 1); break;
        case O_COMPRESS: o->compress = optarg; break;
        case O_VERBOSE: mg_set_verbose(true); break;
        case O_VERSION: mg_print_version("mgtrain"); exit(0);
        default:
            if (optopt) die("option '%s' needs a value (see --help)", argv[optind - 1]);
            die("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc) die("unexpected argument '%s' (see --help)", argv[optind]);
    if (o->momentum >= 1) die("--momentum %g must be below 1", o->momentum);
    if (strcmp(o->parallel, "none") && strcmp(o->parallel, "dp") && strcmp(o->parallel, "ddp"))
        die("unknown --parallel '%s': use none, dp or ddp", o->parallel);
}

/* ---- metrics log and plot ------------------------------------------------ */

static int log_is_csv(const char *path)
{
    size_t n = strlen(path);
    return n >= 4 && strcmp(path + n - 4, ".csv") == 0;
}

static void plot_path(const char *log, char *out, size_t cap)
{
    const char *dot = strrchr(log, '.'), *slash = strrchr(log, '/');
    size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - log) : strlen(log);
    snprintf(out, cap, "%.*s.svg", (int)stem, log);
}

static mg_status write_log(const char *path, const epoch_row *r, int n)
{
    size_t cap = 256 + (size_t)n * 256, len = 0;
    char *s = malloc(cap);
    if (!s) return mg_error(MG_ENOMEM, "log: out of memory");
    int csv = log_is_csv(path);
    if (csv)
        len += (size_t)snprintf(s + len, cap - len, "epoch,step,train_loss,train_acc,"
                                "test_loss,test_acc,seconds,images_per_s,lr\n");
    for (int i = 0; i < n; i++) {
        const char *fmt = csv ? "%d,%ld,%.6f,%.6f,%.6f,%.6f,%.3f,%.1f,%.6g\n"
            : "{\"epoch\":%d,\"step\":%ld,\"train_loss\":%.6f,\"train_acc\":%.6f,"
              "\"test_loss\":%.6f,\"test_acc\":%.6f,\"seconds\":%.3f,"
              "\"images_per_s\":%.1f,\"lr\":%.6g}\n";
        len += (size_t)snprintf(s + len, cap - len, fmt, r[i].epoch, r[i].step,
                                r[i].train_loss, r[i].train_acc, r[i].test_loss,
                                r[i].test_acc, r[i].seconds, r[i].images_per_s, r[i].lr);
    }
    mg_status st = mg_write_file_atomic(path, s, len);
    free(s);
    return st;
}

/* On resume, take back the rows of epochs the checkpoint covers. */
static int read_log(const char *path, epoch_row *r, int max_epoch)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < max_epoch) {
        epoch_row e;
        int ok = log_is_csv(path)
            ? sscanf(line, "%d,%ld,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &e.epoch, &e.step,
                     &e.train_loss, &e.train_acc, &e.test_loss, &e.test_acc,
                     &e.seconds, &e.images_per_s, &e.lr) == 9
            : sscanf(line, "{\"epoch\":%d,\"step\":%ld,\"train_loss\":%lf,\"train_acc\":%lf,"
                     "\"test_loss\":%lf,\"test_acc\":%lf,\"seconds\":%lf,"
                     "\"images_per_s\":%lf,\"lr\":%lf}", &e.epoch, &e.step,
                     &e.train_loss, &e.train_acc, &e.test_loss, &e.test_acc,
                     &e.seconds, &e.images_per_s, &e.lr) == 9;
        if (ok && e.epoch == n + 1) r[n++] = e;
    }
    fclose(f);
    return n;
}

static mg_status write_plot(const char *log, const char *model, const epoch_row *r, int n)
{
    char path[4096], title[128];
    plot_path(log, path, sizeof path);
    double *v = malloc(sizeof(double) * 3 * (size_t)(n + 1));
    if (!v) return mg_error(MG_ENOMEM, "plot: out of memory");
    for (int i = 0; i < n; i++) {
        v[i] = r[i].train_loss;
        v[n + i] = r[i].train_acc;
        v[2 * n + i] = r[i].test_acc;
    }
    mg_plot_series s[3] = {{"train loss", v, 0}, {"train accuracy", v + n, 1},
                           {"test accuracy", v + 2 * n, 1}};
    const char *titles[2] = {"loss", "accuracy"};
    snprintf(title, sizeof title, "mgtrain %s", model);
    mg_status st = mg_plot_svg(path, title, titles, s, 3, n);
    free(v);
    return st;
}

/* ---- progress -------------------------------------------------------------- */

typedef struct {
    int tty, quiet;
    double start, last;
} progress;

static void progress_update(progress *p, int epoch, int epochs, long done, long total,
                            double loss)
{
    if (!p->tty || p->quiet) return;
    double now = mg_now();
    if (now - p->last < 0.1 && done < total) return;
    p->last = now;
    double el = now - p->start, ips = el > 0 ? done / el : 0;
    double eta = ips > 0 ? (total - done) / ips : 0;
    int width = 30, fill = (int)(width * done / (total ? total : 1));
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    bar[width] = 0;
    fprintf(stderr, "\repoch %d/%d [%s] %3d%% %7.0f img/s  loss %.4f  ETA %3.0fs ",
            epoch, epochs, bar, (int)(100 * done / (total ? total : 1)), ips, loss, eta);
    fflush(stderr);
}

/* ---- training ------------------------------------------------------------- */

static void hparams_string(const options *o, char *out, size_t cap)
{
    snprintf(out, cap, "model=%s;batch=%d;lr=%g;momentum=%g;optimizer=%s;"
             "weight_decay=%g;schedule=%s;seed=%llu;accumulate=%d;epochs=%d", o->model,
             o->batch, o->lr, o->momentum, o->optimizer, o->weight_decay, o->schedule,
             (unsigned long long)o->seed, o->accumulate, o->epochs);
}

/* The flags that must match to resume (epochs may grow); 1 and a message
 * in msg if one differs. */
static int resume_flags_differ(const char *saved, const char *now, const char *path,
                               char *msg, size_t cap)
{
    const char *keys[] = {"model=", "batch=", "lr=", "momentum=", "optimizer=",
                          "weight_decay=", "schedule=", "seed=", "accumulate="};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *a = strstr(saved, keys[k]), *b = strstr(now, keys[k]);
        if (!a || !b) {
            snprintf(msg, cap, "%s: checkpoint has no '%s' hyper-parameter; it was not "
                     "written by mgtrain", path, keys[k]);
            return 1;
        }
        size_t la = strcspn(a, ";"), lb = strcspn(b, ";");
        if (la != lb || strncmp(a, b, la) != 0) {
            snprintf(msg, cap, "%s was saved with %.*s but this run has %.*s; resume with "
                     "the same flags, or start a new run without --resume", path,
                     (int)la, a, (int)lb, b);
            return 1;
        }
    }
    return 0;
}

/* ---- parallel modes ------------------------------------------------------- */

typedef struct {
    enum { MODE_NONE, MODE_DP, MODE_DDP } mode;
    mg_group *g;        /* ddp */
    int rank, world;
    mg_ddp *ddp;
    mg_dp *dp;
    mg_model *m;        /* the model the optimizer steps (dp: replica 0) */
} trainer;

/* Sum values over the ranks (no-op in one process). */
static void sum_over_ranks(trainer *t, double *v, int n)
{
    if (t->mode != MODE_DDP) return;
    if (mg_all_reduce(t->g, v, v, (size_t)n, MG_F64, MG_SUM))
        die("rank %d: %s", t->rank, mg_last_error());
}

/* A step failed on this rank (a forward could not reserve its batch). In
 * a DDP job the other ranks' next collective fails when this one exits,
 * and they stop too. */
static void die_in_step(const trainer *t) __attribute__((noreturn));
static void die_in_step(const trainer *t)
{
    if (t->mode == MODE_DDP) die("rank %d: %s", t->rank, mg_last_error());
    die("%s", mg_last_error());
}

/* Every rank leaves when one fails: the failing rank's message is printed
 * by that rank; the others exit too instead of waiting for it forever. */
static void agree_or_die(trainer *t, int failed, const char *what)
{
    if (t->mode == MODE_DDP) {
        double f = failed;
        sum_over_ranks(t, &f, 1);
        if (f > 0 && !failed)
            die("rank %d: stopping because another rank failed (its message says why)",
                t->rank);
    }
    if (failed) die("%s", what);
}

/* Test loss and accuracy; in DDP each rank takes a contiguous shard of the
 * test set and the sums are all-reduced, so the figures are exact. */
static void evaluate(trainer *t, const mg_dataset *test, float *x, int32_t *y, int32_t *idx,
                     int batch, mg_scaling sc, double *loss, double *acc)
{
    mg_model *m = t->m;
    int begin = 0, end = test->n;
    if (t->mode == MODE_DDP) mg_shard_range(test->n, t->rank, t->world, &begin, &end);
    mg_model_set_training(m, false);
    double v[3] = {0, 0, 0};  /* loss sum, correct, images */
    for (int i = begin; i < end; i += batch) {
        int bs = end - i < batch ? end - i : batch;
        for (int k = 0; k < bs; k++) idx[k] = i + k;
        mg_dataset_gather(test, idx, bs, sc, x, y);
        if (!mg_model_forward(m, x, bs)) die_in_step(t);
        int c;
        v[0] += (double)mg_model_loss(m, y, &c) * bs;
        v[1] += c;
        v[2] += bs;
    }
    mg_model_set_training(m, true);
    sum_over_ranks(t, v, 3);
    *loss = v[0] / v[2];
    *acc = v[1] / v[2];
}

/* Forward and backward of one (local) micro-batch; sync says whether DDP
 * all-reduces this one (the last of an accumulation). */
static float forward_backward(trainer *t, const float *x, const int32_t *y, int bs,
                              bool sync, int *correct)
{
    float loss;
    if (t->mode == MODE_DP) {
        if (mg_dp_forward_backward(t->dp, x, y, bs, &loss, correct)) die_in_step(t);
        return loss;
    }
    if (t->ddp) mg_ddp_set_sync(t->ddp, sync);
    if (!mg_model_forward(t->m, x, bs)) die_in_step(t);
    loss = mg_model_loss(t->m, y, correct);
    mg_model_backward(t->m);
    return loss;
}

/* Rank 0 loads the checkpoint and every rank gets its state: parameters
 * and buffers through DDP's broadcast at creation, optimizer state and
 * counters here — so a multi-host job needs the file on rank 0 only. */
static void resume_state(trainer *t, const char *path, mg_optim *opt, const char *hp,
                         mg_ckpt_meta *meta)
{
    int failed = 0;
    char msg[1200] = "";
    if (t->rank == 0) {
        if (mg_checkpoint_load(path, t->m, opt, meta)) {
            snprintf(msg, sizeof msg, "--resume: %s", mg_last_error());
            failed = 1;
        } else {
            failed = resume_flags_differ(meta->hparams, hp, path, msg, sizeof msg);
        }
    }
    agree_or_die(t, failed, msg);
    if (t->mode != MODE_DDP) return;
    double c[3] = {(double)meta->step, (double)meta->epoch, (double)mg_model_rng_counter(t->m)};
    if (mg_broadcast(t->g, c, 3, MG_F64, 0)) die("%s", mg_last_error());
    meta->step = (long)c[0];
    meta->epoch = (long)c[1];
    mg_model_set_rng_counter(t->m, (uint64_t)c[2]);
    mg_optim_set_steps(opt, meta->step);
    for (int i = 0; i < mg_optim_num_states(opt); i++)
        if (mg_broadcast(t->g, mg_optim_state(opt, i, NULL), mg_model_arena_size(t->m),
                         MG_F32, 0))
            die("%s", mg_last_error());
}

int main(int argc, char **argv)
{
    options o;
    parse_args(argc, argv, &o);
    mg_kernels();   /* the GEMM kernel check sets the environment: before any thread starts */
    trainer t = {.mode = !strcmp(o.parallel, "dp") ? MODE_DP
                       : !strcmp(o.parallel, "ddp") ? MODE_DDP : MODE_NONE,
                 .rank = 0, .world = 1};

    /* ---- check all input before touching any file ---- */
    mg_zoo_defaults def;
    if (mg_zoo_defaults_of(o.model, &def)) die("%s", mg_last_error());
    if (!o.have_batch) o.batch = def.batch;
    if (!o.have_lr) o.lr = def.lr;
    if (!o.have_momentum) o.momentum = def.momentum;
    if (!o.have_epochs) o.epochs = def.epochs;
    mg_optim_kind kind;
    if (mg_optim_parse(o.optimizer, &kind)) die("--optimizer: %s", mg_last_error());
    if (o.weight_decay < 0) o.weight_decay = kind == MG_OPTIM_ADAMW ? 0.01f : 0.0f;
    mg_schedule sched;
    if (mg_schedule_parse(o.schedule, o.lr, &sched)) die("--schedule: %s", mg_last_error());
    mg_compress comp;
    if (mg_compress_parse(o.compress, &comp)) die("--compress: %s", mg_last_error());
    if (comp != MG_COMPRESS_NONE && t.mode != MODE_DDP)
        die("--compress %s applies to --parallel ddp only", o.compress);
    if (o.resume && o.init) die("--resume and --init both set: give one of them");
    if (o.eval_only && !o.resume && !o.init)
        die("--eval-only needs weights: give --init FILE or --resume FILE");
    if (t.mode == MODE_DP && o.batch < o.workers)
        die("--batch %d is smaller than --workers %d: give each worker at least one image",
            o.batch, o.workers);
    struct stat sb;
    if (stat(o.data, &sb) || !S_ISDIR(sb.st_mode))
        die("data directory '%s' not found: install the dataset-fashion-mnist "
            "package (scripts/install-deps.sh) or pass --data DIR", o.data);

    if (t.mode == MODE_DDP) {
        if (!getenv("RANK") && !getenv("OMPI_COMM_WORLD_RANK"))
            die("--parallel ddp needs a launcher: run it as 'mgrun -n N mgtrain "
                "--parallel ddp ...' (or under mpirun)");
        if (mg_group_init(NULL, &t.g)) die("%s", mg_last_error());
        t.rank = mg_group_rank(t.g);
        t.world = mg_group_size(t.g);
        char msg[256];
        snprintf(msg, sizeof msg, "--batch %d does not divide among %d ranks: use a "
                 "multiple of %d (--batch is the global batch)", o.batch, t.world, t.world);
        agree_or_die(&t, o.batch % t.world != 0, msg);
        if (t.rank != 0) o.quiet = 1;
        mg_trace_open(NULL, t.rank, t.world);
    } else {
        mg_trace_open(NULL, 0, 1);
    }
    mg_set_threads(o.threads);   /* with --verbose, logs the CPU and the kernels */
    /* An automatic restart (mgrun --max-restarts) resumes from the last save. */
    if (!o.resume && o.save && mg_env_long("MG_RESTART_COUNT", 0) > 0 &&
        access(o.save, R_OK) == 0) {
        o.resume = o.save;
        if (t.rank == 0) fprintf(stderr, "%s: restarted: resuming from %s\n", prog, o.save);
    }

    mg_dataset *train = NULL, *test = NULL;
    if (!o.eval_only && mg_dataset_load(o.data, true, &train)) die("%s", mg_last_error());
    if (mg_dataset_load(o.data, false, &test)) die("%s", mg_last_error());

    int local = o.batch / t.world;  /* images per rank and micro-batch */
    if (t.mode == MODE_DP) {
        if (mg_dp_create(o.model, o.seed, o.workers, o.batch, &t.dp)) die("%s", mg_last_error());
        t.m = mg_dp_model(t.dp);
    } else if (mg_model_create(o.model, o.seed, &t.m)) {
        die("%s", mg_last_error());
    }
    mg_model *m = t.m;
    if (mg_model_reserve(m, local)) die("%s", mg_last_error());
    mg_optim_config oc = mg_optim_defaults(kind, o.lr);
    oc.momentum = o.momentum;
    oc.weight_decay = o.weight_decay;
    mg_optim *opt;
    if (mg_optim_create(&oc, mg_model_arena_size(m), &opt)) die("%s", mg_last_error());

    char hp[512];
    hparams_string(&o, hp, sizeof hp);
    mg_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    if (o.resume) {
        resume_state(&t, o.resume, opt, hp, &meta);
    } else if (o.init) {
        int failed = 0;
        char msg[1200] = "";
        if (t.rank == 0 && mg_model_load_weights(o.init, m, o.init_prefix)) {
            snprintf(msg, sizeof msg, "--init: %s", mg_last_error());
            failed = 1;
        }
        agree_or_die(&t, failed, msg);
    }
    if (t.mode == MODE_DDP) {
        mg_ddp_options dopt = mg_ddp_defaults();
        dopt.bucket_bytes = (size_t)(o.bucket_mb * (1 << 20));
        if (dopt.first_bucket_bytes > dopt.bucket_bytes) dopt.first_bucket_bytes = dopt.bucket_bytes;
        dopt.compress = comp;
        if (mg_ddp_create(t.g, m, &dopt, &t.ddp)) die("%s", mg_last_error());
    }
    int start_epoch = (int)meta.epoch;
    long step = meta.step;

    mg_scaling sc = def.normalized_input ? MG_SCALE_NORMAL : MG_SCALE_UNIT;
    int c, h, w;
    mg_model_input_shape(m, &c, &h, &w);
    size_t in = (size_t)c * h * w;
    int eval_batch = local;
    float *xb = mg_alloc(sizeof(float) * in * (size_t)eval_batch);
    int32_t *yb = mg_alloc(sizeof(int32_t) * (size_t)eval_batch);
    int32_t *ib = mg_alloc(sizeof(int32_t) * (size_t)eval_batch);
    if (!xb || !yb || !ib) die("out of memory for a batch of %d", eval_batch);

    mg_sampler sampler = {0};
    epoch_row *rows = NULL;
    mg_loader *loader = NULL;
    if (o.eval_only) {
        double loss, acc;
        evaluate(&t, test, xb, yb, ib, eval_batch, sc, &loss, &acc);
        if (t.rank == 0)
            printf("%s: test loss %.4f, test accuracy %.2f%% (%d images)\n", o.model, loss,
                   100 * acc, test->n);
        goto done;
    }

    /* Each rank's shard of every epoch's permutation (models.md: perm[r::k]). */
    if (mg_sampler_init(&sampler, train->n, t.rank, t.world, true, o.seed, false))
        die("%s", mg_last_error());
    int n_local;
    mg_sampler_indices(&sampler, &n_local);
    int micro_per_epoch = (n_local + local - 1) / local;
    int steps_per_epoch = (micro_per_epoch + o.accumulate - 1) / o.accumulate;
    sched.total_steps = (long)steps_per_epoch * o.epochs;
    if (start_epoch >= o.epochs) {
        if (t.rank == 0)
            fprintf(stderr, "%s: %s already covers %d epoch(s); raise --epochs to train more\n",
                    prog, o.resume, start_epoch);
        goto done;
    }
    if (step != (long)start_epoch * steps_per_epoch)
        die("%s: step %ld is not the end of epoch %d with --batch %d --accumulate %d",
            o.resume, step, start_epoch, o.batch, o.accumulate);

    rows = calloc((size_t)o.epochs, sizeof *rows);
    int n_rows = 0;
    if (o.log && o.resume && t.rank == 0) n_rows = read_log(o.log, rows, start_epoch);

    if (mg_loader_create(train, local, sc, &loader)) die("%s", mg_last_error());
    progress pr = {isatty(2), o.quiet, 0, 0};
    if (!o.quiet) {
        printf("mgtrain: %s, %zu parameters, batch %d", o.model, mg_model_num_params(m), o.batch);
        if (t.mode == MODE_DDP) printf(" (%d per rank on %d ranks, ddp)", local, t.world);
        if (t.mode == MODE_DP) printf(" (%d DataParallel workers)", o.workers);
        if (o.accumulate > 1) printf(" x %d accumulated", o.accumulate);
        printf(", %s lr %g, %d epochs\n", o.optimizer, o.lr, o.epochs);
    }
    float grad_scale = 1.0f / (float)o.accumulate;
    double total_time = 0;
    for (int e = start_epoch; e < o.epochs; e++) {
        mg_sampler_set_epoch(&sampler, e);
        const int32_t *order = mg_sampler_indices(&sampler, &n_local);
        mg_loader_start(loader, order, n_local, local, 0);
        double v[3] = {0, 0, 0};  /* loss sum, correct, images (this rank) */
        double t0 = mg_now(), lr = o.lr;
        pr.start = t0;
        pr.last = 0;
        const float *x;
        const int32_t *y;
        int bs, micro = 0;
        while ((bs = mg_loader_next(loader, &x, &y)) > 0) {
            bool last = ++micro == o.accumulate || v[2] + bs >= n_local;
            if (micro == 1) mg_model_zero_grad(m);
            int cor;
            float loss = forward_backward(&t, x, y, bs, last, &cor);
            v[0] += (double)loss * bs;
            v[1] += cor;
            v[2] += bs;
            if (!last) continue;
            if (t.ddp && mg_ddp_finish(t.ddp)) die("rank %d: %s", t.rank, mg_last_error());
            if (micro > 1) {
                float *g = mg_model_grads(m), s = micro == o.accumulate ? grad_scale
                                                                        : 1.0f / (float)micro;
                for (size_t i = 0, n = mg_model_num_params(m); i < n; i++) g[i] *= s;
            }
            micro = 0;
            double tl = mg_trace_now();
            lr = mg_schedule_lr(&sched, step);
            mg_optim_step(opt, mg_model_params(m), mg_model_grads(m), (float)lr);
            mg_trace_event("optimizer", "optimizer", 0, tl, mg_trace_now());
            step++;
            progress_update(&pr, e + 1, o.epochs, (long)v[2] * t.world, train->n,
                            v[0] / v[2]);
        }
        double secs = mg_now() - t0;
        sum_over_ranks(&t, v, 3);
        total_time += secs;
        epoch_row *r = &rows[n_rows++];
        r->epoch = e + 1;
        r->step = step;
        r->train_loss = v[0] / v[2];
        r->train_acc = v[1] / v[2];
        r->seconds = secs;
        r->images_per_s = v[2] / secs;
        r->lr = lr;
        evaluate(&t, test, xb, yb, ib, eval_batch, sc, &r->test_loss, &r->test_acc);
        if (pr.tty && !o.quiet) fprintf(stderr, "\r%100s\r", "");
        if (!o.quiet) {
            printf("epoch %2d/%d  loss %.4f  train acc %5.2f%%  test acc %5.2f%%  "
                   "%6.2f s  %8.0f img/s\n", e + 1, o.epochs, r->train_loss,
                   100 * r->train_acc, 100 * r->test_acc, secs, r->images_per_s);
            fflush(stdout);
        }
        int failed = 0;
        char msg[1200] = "";
        if (t.rank == 0 && o.log &&
            (write_log(o.log, rows, n_rows) || write_plot(o.log, o.model, rows, n_rows))) {
            snprintf(msg, sizeof msg, "%s", mg_last_error());
            failed = 1;
        }
        /* Also the barrier: every rank has finished the epoch before rank 0 saves. */
        agree_or_die(&t, failed, msg);
        if (o.save) {
            memset(&meta, 0, sizeof meta);
            snprintf(meta.model, sizeof meta.model, "%s", o.model);
            meta.step = step;
            meta.epoch = e + 1;
            meta.seed = o.seed;
            snprintf(meta.hparams, sizeof meta.hparams, "%s", hp);
            if (t.rank == 0 && mg_checkpoint_save(o.save, m, opt, &meta)) {
                snprintf(msg, sizeof msg, "--save: %s (the previous checkpoint, if any, is "
                         "intact)", mg_last_error());
                failed = 1;
            }
            agree_or_die(&t, failed, msg);
        }
    }
    epoch_row *last = &rows[n_rows - 1];
    if (t.rank == 0)
        printf("final: test accuracy %.2f%%, test loss %.4f, %.1f s training, "
               "peak memory %.0f MB\n", 100 * last->test_acc, last->test_loss, total_time,
               mg_peak_rss() / 1e6);
    if (t.ddp && mg_trace_on()) {
        mg_ddp_stats ds = mg_ddp_get_stats(t.ddp);
        if (t.rank == 0 && ds.comm_us > 0)
            fprintf(stderr, "%s: %d buckets, all-reduce %.1f ms, %.1f ms exposed (%.0f%% hidden "
                    "behind backward)\n", prog, mg_ddp_num_buckets(t.ddp), ds.comm_us / 1e3,
                    ds.exposed_us / 1e3, 100 * (1 - ds.exposed_us / ds.comm_us));
    }
done:
    if (mg_trace_close()) mg_log("trace: %s", mg_last_error());
    mg_sampler_free(&sampler);
    free(rows);
    mg_loader_destroy(loader);
    mg_free(xb);
    mg_free(yb);
    mg_free(ib);
    mg_optim_destroy(opt);
    mg_ddp_destroy(t.ddp);
    if (t.dp) mg_dp_destroy(t.dp);
    else mg_model_destroy(m);
    mg_group_destroy(t.g);
    mg_dataset_destroy(train);
    mg_dataset_destroy(test);
    return 0;
}
