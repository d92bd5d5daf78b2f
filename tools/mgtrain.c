/* mgtrain — train a zoo model from the command line: the image models on
 * Fashion-MNIST (or MNIST) by epochs, gpt-mini on text (the fortunes
 * corpus, or --data) by steps. In one process, with DataParallel threads
 * (--parallel dp), or as one rank of a DistributedDataParallel job
 * launched by mgrun or mpirun (--parallel ddp; --batch is the global
 * batch, each rank takes B/k, so the same flags mean the same training at
 * any k). Image models report train loss and accuracy, test accuracy,
 * seconds and images/s per epoch; gpt-mini reports train loss, validation
 * loss and perplexity and tokens/s every --eval-every steps and can
 * generate text (--sample). A metrics log (CSV or JSON lines) and an SVG
 * plot are written next to each other; checkpoints are safetensors with
 * PyTorch's names, written atomically, and --resume continues exactly
 * where one left off.
 *
 * Bad input (unknown model, a number outside its flag's range, a bad MG_*
 * variable, a missing data directory, a damaged or mismatched checkpoint,
 * DDP ranks started with different flags) gives one line saying what is
 * wrong and how to fix it, and exit status 2; no file is written before
 * the input has been checked. */
#define _GNU_SOURCE
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <openssl/evp.h>
#include "multigrad/multigrad.h"
#include "multigrad/plot.h"

#define MAX_EPOCHS 1000000     /* --epochs */
#define MAX_STEPS 1000000000L  /* --steps */

typedef struct {
    const char *model, *data, *optimizer, *schedule, *save, *resume, *init, *init_prefix, *log;
    const char *parallel, *compress, *prompt, *mesh, *offload_dir, *device;
    mg_strategy_kind strategy;   /* of --parallel, ddp for --mesh, zero with --zero */
    int epochs, batch, threads, quiet, eval_only, workers, accumulate, recompute, print_plan;
    int tf32, bf16;     /* --tf32, --bf16 */
    int init_partial;   /* --init-partial */
    int offload_cpu;    /* --offload cpu */
    int zero;           /* --zero stage, 0: none */
    double bucket_mb;
    float lr, momentum, weight_decay, clip_grad, temperature;
    uint64_t seed;
    /* language models */
    long steps;
    int eval_every, sample, top_k;
    int eval_windows;        /* --eval-windows (0: all of models.md D's, at most 512) */
    int no_eval_on_start;    /* --no-eval-on-start */
    mg_gpt_config gpt;
    int have_batch, have_lr, have_momentum, have_epochs, have_steps, have_eval_every;
    int have_sample_opts, have_arch;
    /* pipeline (--mesh pp=P) */
    const char *pp_schedule, *split;
    int micro_batches, chunks;
} options;

static const char *prog = "mgtrain";

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
typedef struct trainer trainer;
static void die_in_step(const trainer *t) __attribute__((noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mg_veprintf(prog, fmt, ap);
    va_end(ap);
    exit(2);
}

static void usage(FILE *f)
{
    fprintf(f,
"usage: mgtrain [options]\n"
"Train a zoo model: an image model on Fashion-MNIST, reporting loss and\n"
"accuracy per epoch, or gpt-mini on text, reporting validation loss and\n"
"perplexity every --eval-every steps.\n"
"\n"
"  --model NAME        mlp | lenet-d2l | lenet5 | gpt-mini (default lenet-d2l)\n"
"  --data PATH         image models: IDX files directory (default: MG_DATA, or\n"
"                      /usr/share/datasets/fashion-mnist);\n"
"                      gpt-mini: a text file or a directory of text files\n"
"                      (default: the fortunes corpus, models.md D)\n"
"  --epochs N          image models: epochs (default 10)\n"
"  --batch B           batch size (default: the model's)\n"
"  --lr X              learning rate (default: the model's)\n"
"  --momentum X        SGD momentum (default: the model's)\n"
"  --optimizer NAME    sgd | adam | adamw (default: sgd; gpt-mini adamw)\n"
"  --weight-decay X    weight decay (default 0; AdamW: 0.01; gpt-mini: 0.1 on\n"
"                      its 2-D parameters only)\n"
"  --clip-grad X       clip gradients to global L2 norm X (default: none;\n"
"                      gpt-mini 1.0; 0 turns it off)\n"
"  --schedule SPEC     constant | step:STEPS:GAMMA | cosine[:MIN_LR],\n"
"                      optionally followed by ,warmup:STEPS (default constant)\n"
"  --seed N            seed for initialisation, data order and sampling (default 0)\n"
"  --threads N         BLAS threads (default 1, or MG_THREADS)\n"
"  --save FILE         write a checkpoint (safetensors) after every epoch\n"
"                      (gpt-mini: at every evaluation)\n"
"  --resume FILE       continue the training saved in FILE\n"
"  --init FILE         start from the parameters in a safetensors file\n"
"  --init-prefix P     look the parameters up as P<name> (e.g. init.)\n"
"  --init-partial      take from --init the tensors that fit and leave out those\n"
"                      the model has no place for (a model of more layers);\n"
"                      without it such a file is refused\n"
"  --eval-only         evaluate the weights (test accuracy, or validation loss),\n"
"                      no training\n"
"  --log FILE          metrics per epoch or evaluation: CSV (.csv) or JSON lines\n"
"                      (otherwise); an SVG plot is written next to it (.svg)\n"
"  --quiet             print only the final summary\n"
"  --verbose           print the CPU, the kernels in use and the settings\n"
"                      (as MG_VERBOSE=1)\n"
"  --version           version, CPU and kernels of this machine\n"
"  --print-params      the MG_* environment variables: default, range, meaning\n"
"  --parallel MODE     none | dp (threads in this process) | ddp (one rank of\n"
"                      a job started by mgrun or mpirun) (default none)\n"
"  --mesh SPEC         the job's ranks as a mesh, e.g. dp=4 (tp varies fastest,\n"
"                      then dp, then pp; a missing dp is ranks/(tp*pp));\n"
"                      --parallel ddp is --mesh dp=<ranks>; pp=P cuts the\n"
"                      model into a pipeline of P stages (with dp=D: D\n"
"                      replicas of it); tp is not built yet\n"
"  --pp-schedule S     pipeline schedule: naive | gpipe | 1f1b | interleaved\n"
"                      (default 1f1b; --schedule is the learning rate's)\n"
"  --micro-batches M   pipeline micro-batches per step (default: the stages):\n"
"                      --batch B is split into M micro-batches, as one process\n"
"                      with --batch B/M --accumulate M\n"
"  --chunks V          model chunks per stage for interleaved (default 1, 2 for\n"
"                      interleaved)\n"
"  --split U1,U2,..    cut the pipeline where these units begin (default: the\n"
"                      cut that balances the units' FLOPs)\n"
"  --device D          where the model trains: cpu (default), cuda (each local\n"
"                      rank its own GPU, LOCAL_RANK modulo the GPUs: NCCL\n"
"                      between them; ranks sharing one reduce through the\n"
"                      host; MG_NCCL=on|off), cuda:N, or emu\n"
"                      (the GPU code path run on the CPU, for tests). On a\n"
"                      device: one process, ddp, --zero and pipelines, every\n"
"                      zoo model\n"
"  --tf32              on a GPU, float GEMMs with TF32 tensor cores (faster,\n"
"                      10-bit mantissas in the products; default off)\n"
"  --bf16              on a GPU (or emu), GEMMs with bfloat16 operands on tensor\n"
"                      cores and float32 sums, as PyTorch's bfloat16 autocast\n"
"                      does its matrix products; all else, and all that is\n"
"                      stored, float32 (default off)\n"
"  --workers N         DataParallel threads (default 2)\n"
"  --bucket-mb X       DDP bucket cap in MiB (default 25; the first is 1)\n"
"  --accumulate N      micro-batches per optimizer step (default 1)\n"
"  --compress C        DDP gradient compression: none | fp16 | bf16\n"
"  --recompute         drop each unit's activations after its forward and run\n"
"                      the forward again before its backward: less memory,\n"
"                      the same numbers\n"
"  --zero STAGE        with --parallel ddp or --mesh dp=N: ZeRO stage 1 (each rank\n"
"                      keeps 1/N of the optimizer state), 2 (and of the\n"
"                      gradients) or 3 (and of the parameters); with pp=P\n"
"                      too, over each stage's replicas (whole during a step,\n"
"                      as torchtitan's FSDP with pipelines)\n"
"  --offload disk:DIR  keep the optimizer state (with --zero 3 also the\n"
"                      parameter shard) in files in DIR, streamed through a few\n"
"                      windows of MG_OFFLOAD_WINDOW_MB: the same numbers, less\n"
"                      memory; the files are private and gone at exit\n"
"  --offload cpu       with --device: the optimizer's state in host memory and its\n"
"                      step there (ZeRO-Offload); the gradients of the rank's\n"
"                      ranges come to the host each step, the parameters go\n"
"                      back. On the CPU, where the state is already, a no-op\n"
"  --print-plan        print the units (parameter ranges, FLOPs, activation\n"
"                      bytes) as the strategy lays them out, and stop\n"
"gpt-mini only:\n"
"  --steps N           optimizer steps (default 2000)\n"
"  --eval-every N      steps between validations (default 250)\n"
"  --eval-windows N    validation windows of context bytes per evaluation\n"
"                      (default: all the text has, at most 512; nanoGPT's\n"
"                      eval_iters)\n"
"  --no-eval-on-start  no validation at step 0 (the curve then starts at the\n"
"                      first --eval-every)\n"
"  --layers N --dim D --heads H --ctx T\n"
"                      model size (default 4, 128, 4, 128; D divisible by H)\n"
"  --sample N          after training (or of the --init/--resume weights),\n"
"                      generate N bytes and print them\n"
"  --prompt TEXT       text the sample continues (default: a newline)\n"
"  --temperature X     sampling temperature (default 0.8; 0: most likely byte)\n"
"  --top-k K           sample among the K most likely bytes (default 200; 0: all)\n"
"  --help              this text\n");
}

/* A flag's number, in the range its meaning allows. */
static long int_flag(const char *flag, long lo, long hi)
{
    long v;
    if (mg_parse_long(flag, optarg, lo, hi, &v)) die("%s", mg_last_error());
    return v;
}

static float real_flag(const char *flag, double lo, double hi, int open)
{
    double v;
    if (mg_parse_double(flag, optarg, lo, hi, open, &v)) die("%s", mg_last_error());
    return (float)v;
}

/* The tunables' table and the values set now; then the check of those
 * (a warning for a name it does not know, exit 2 for a bad value). */
static void print_params(void)
{
    int n;
    const mg_tunable *p = mg_tunables(&n);
    printf("%-22s %-12s %-36s %s\n", "# variable", "default", "accepts", "meaning");
    for (int i = 0; i < n; i++) {
        char range[128];
        const char *now = mg_tunable_value(&p[i]);
        mg_tunable_range(&p[i], range, sizeof range);
        printf("%-22s %-12s %-36s %s", p[i].name, p[i].dflt ? *p[i].dflt ? p[i].dflt : "''" : "-",
               range, p[i].doc);
        if (now) printf(" [set: %s]", p[i].type == MG_TUNE_SECRET ? "..." : now);
        putchar('\n');
    }
    fflush(stdout);
    if (mg_tunables_check()) die("%s", mg_last_error());
}

static void parse_args(int argc, char **argv, options *o)
{
    enum { O_MODEL = 256, O_DATA, O_EPOCHS, O_BATCH, O_LR, O_MOM, O_OPT, O_WD,
           O_SCHED, O_SEED, O_THREADS, O_SAVE, O_RESUME, O_INIT, O_EVAL, O_LOG,
           O_QUIET, O_HELP, O_INIT_PREFIX, O_PARALLEL, O_WORKERS, O_BUCKET, O_ACCUM,
           O_COMPRESS, O_VERBOSE, O_VERSION, O_CLIP, O_STEPS, O_EVAL_EVERY, O_LAYERS,
           O_DIM, O_HEADS, O_CTX, O_SAMPLE, O_PROMPT, O_TEMP, O_TOPK, O_PARAMS,
           O_RECOMPUTE, O_PLAN, O_MESH, O_ZERO, O_OFFLOAD, O_SCHEDULE,
           O_MICRO, O_CHUNKS, O_SPLIT, O_DEVICE, O_TF32, O_BF16, O_INIT_PARTIAL,
           O_EVAL_WINDOWS, O_NO_EVAL_START };
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
        {"verbose", 0, 0, O_VERBOSE}, {"version", 0, 0, O_VERSION},
        {"clip-grad", 1, 0, O_CLIP}, {"steps", 1, 0, O_STEPS},
        {"eval-every", 1, 0, O_EVAL_EVERY}, {"layers", 1, 0, O_LAYERS}, {"dim", 1, 0, O_DIM},
        {"heads", 1, 0, O_HEADS}, {"ctx", 1, 0, O_CTX}, {"sample", 1, 0, O_SAMPLE},
        {"prompt", 1, 0, O_PROMPT}, {"temperature", 1, 0, O_TEMP}, {"top-k", 1, 0, O_TOPK},
        {"print-params", 0, 0, O_PARAMS}, {"recompute", 0, 0, O_RECOMPUTE},
        {"print-plan", 0, 0, O_PLAN}, {"mesh", 1, 0, O_MESH}, {"zero", 1, 0, O_ZERO},
        {"offload", 1, 0, O_OFFLOAD}, {"pp-schedule", 1, 0, O_SCHEDULE},
        {"micro-batches", 1, 0, O_MICRO}, {"chunks", 1, 0, O_CHUNKS}, {"split", 1, 0, O_SPLIT},
        {"device", 1, 0, O_DEVICE}, {"tf32", 0, 0, O_TF32}, {"bf16", 0, 0, O_BF16},
        {"init-partial", 0, 0, O_INIT_PARTIAL}, {"eval-windows", 1, 0, O_EVAL_WINDOWS},
        {"no-eval-on-start", 0, 0, O_NO_EVAL_START},
        {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->model = "lenet-d2l";
    o->schedule = "constant";
    o->weight_decay = -1;
    o->clip_grad = -1;
    o->parallel = "none";
    o->compress = "none";
    o->workers = 2;
    o->accumulate = 1;
    o->bucket_mb = 25;
    o->gpt = mg_gpt_defaults();
    o->prompt = "\n";
    o->temperature = 0.8f;
    o->top_k = 200;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case O_MODEL: o->model = optarg; break;
        case O_DATA: o->data = optarg; break;
        case O_EPOCHS: o->epochs = (int)int_flag("--epochs", 1, MAX_EPOCHS); o->have_epochs = 1; break;
        case O_BATCH: o->batch = (int)int_flag("--batch", 1, 65536); o->have_batch = 1; break;
        case O_LR: o->lr = real_flag("--lr", 0, 1e6, MG_OPEN_LO); o->have_lr = 1; break;
        case O_MOM:
            o->momentum = real_flag("--momentum", 0, 1, MG_OPEN_HI);
            o->have_momentum = 1;
            break;
        case O_OPT: o->optimizer = optarg; break;
        case O_WD: o->weight_decay = real_flag("--weight-decay", 0, 1e6, 0); break;
        case O_SCHED: o->schedule = optarg; break;
        case O_SEED: o->seed = (uint64_t)int_flag("--seed", 0, LONG_MAX); break;
        case O_THREADS: o->threads = (int)int_flag("--threads", 1, 1024); break;
        case O_SAVE: o->save = optarg; break;
        case O_RESUME: o->resume = optarg; break;
        case O_INIT: o->init = optarg; break;
        case O_INIT_PREFIX: o->init_prefix = optarg; break;
        case O_INIT_PARTIAL: o->init_partial = 1; break;
        case O_EVAL: o->eval_only = 1; break;
        case O_LOG: o->log = optarg; break;
        case O_QUIET: o->quiet = 1; break;
        case O_HELP: usage(stdout); exit(0);
        case O_PARALLEL: o->parallel = optarg; break;
        case O_WORKERS: o->workers = (int)int_flag("--workers", 1, 1024); break;
        case O_BUCKET: o->bucket_mb = real_flag("--bucket-mb", 0.001, 65536, 0); break;
        case O_ACCUM: o->accumulate = (int)int_flag("--accumulate", 1, 65536); break;
        case O_COMPRESS: o->compress = optarg; break;
        case O_VERBOSE: mg_set_verbose(true); break;
        case O_VERSION: mg_print_version("mgtrain"); exit(0);
        case O_PARAMS: print_params(); exit(0);
        case O_RECOMPUTE: o->recompute = 1; break;
        case O_PLAN: o->print_plan = 1; break;
        case O_SCHEDULE: o->pp_schedule = optarg; break;
        case O_MICRO: o->micro_batches = (int)int_flag("--micro-batches", 1, 1 << 20); break;
        case O_CHUNKS: o->chunks = (int)int_flag("--chunks", 1, 64); break;
        case O_SPLIT: o->split = optarg; break;
        case O_DEVICE: o->device = optarg; break;
        case O_TF32: o->tf32 = 1; break;
        case O_BF16: o->bf16 = 1; break;
        case O_MESH: o->mesh = optarg; break;
        case O_ZERO: o->zero = (int)int_flag("--zero", 1, 3); break;
        case O_OFFLOAD:
            if (!strncmp(optarg, "disk:", 5) && optarg[5]) {
                o->offload_dir = optarg + 5;
            } else if (!strcmp(optarg, "cpu")) {
                o->offload_cpu = 1;
            } else {
                die("--offload '%s': give disk:DIR (a directory for the offload files) or cpu",
                    optarg);
            }
            break;
        case O_CLIP: o->clip_grad = real_flag("--clip-grad", 0, 1e6, 0); break;
        case O_STEPS: o->steps = int_flag("--steps", 1, MAX_STEPS); o->have_steps = 1; break;
        case O_EVAL_EVERY:
            o->eval_every = (int)int_flag("--eval-every", 1, 1000000000);
            o->have_eval_every = 1;
            break;
        case O_EVAL_WINDOWS:
            o->eval_windows = (int)int_flag("--eval-windows", 1, 512);
            break;
        case O_NO_EVAL_START: o->no_eval_on_start = 1; break;
        case O_LAYERS: o->gpt.layers = (int)int_flag("--layers", 1, 256); o->have_arch = 1; break;
        case O_DIM: o->gpt.dim = (int)int_flag("--dim", 1, 16384); o->have_arch = 1; break;
        case O_HEADS: o->gpt.heads = (int)int_flag("--heads", 1, 256); o->have_arch = 1; break;
        case O_CTX: o->gpt.ctx = (int)int_flag("--ctx", 2, 16384); o->have_arch = 1; break;
        case O_SAMPLE: o->sample = (int)int_flag("--sample", 1, 1 << 20); break;
        case O_PROMPT: o->prompt = optarg; o->have_sample_opts = 1; break;
        case O_TEMP:
            o->temperature = real_flag("--temperature", 0, 1000, 0);
            o->have_sample_opts = 1;
            break;
        case O_TOPK: o->top_k = (int)int_flag("--top-k", 0, 256); o->have_sample_opts = 1; break;
        default:
            if (optopt) die("option '%s' needs a value (see --help)", argv[optind - 1]);
            die("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc) die("unexpected argument '%s' (see --help)", argv[optind]);
    if (mg_strategy_parse(o->parallel, &o->strategy)) die("--parallel: %s", mg_last_error());
    if (o->mesh && o->strategy == MG_STRATEGY_DP)
        die("--mesh lays out the ranks of a job; --parallel dp is threads in one process: "
            "give one of them");
    if (o->mesh) o->strategy = MG_STRATEGY_DDP;   /* the mesh's dp dimension runs DDP */
    if ((o->pp_schedule || o->micro_batches || o->chunks || o->split) && !o->mesh)
        die("--pp-schedule, --micro-batches, --chunks and --split shape a pipeline: give "
            "--mesh pp=P");
    if (o->zero) {
        if (o->strategy != MG_STRATEGY_DDP)
            die("--zero %d shards the state of a data-parallel job: give it with --parallel ddp "
                "or --mesh dp=N", o->zero);
        o->strategy = MG_STRATEGY_ZERO;   /* ... or ZeRO */
    }
}

/* ---- metrics log and plot ------------------------------------------------
 *
 * A log is a table of numbers, one row per epoch (image models) or per
 * evaluation (language models), with named columns; NaN (no value yet,
 * e.g. the train loss before the first step) is written as "nan" in CSV
 * and null in JSON. */

typedef struct {
    const char *name, *fmt;
} log_col;

enum { E_EPOCH, E_STEP, E_TRAIN_LOSS, E_TRAIN_ACC, E_TEST_LOSS, E_TEST_ACC, E_SECONDS,
       E_IMAGES_PER_S, E_LR, E_COLS };
static const log_col epoch_cols[E_COLS] = {
    {"epoch", "%.0f"}, {"step", "%.0f"}, {"train_loss", "%.6f"}, {"train_acc", "%.6f"},
    {"test_loss", "%.6f"}, {"test_acc", "%.6f"}, {"seconds", "%.3f"},
    {"images_per_s", "%.1f"}, {"lr", "%.6g"}};

enum { L_STEP, L_TRAIN_LOSS, L_VAL_LOSS, L_VAL_PPL, L_SECONDS, L_TOKENS_PER_S, L_LR, L_COLS };
static const log_col lm_cols[L_COLS] = {
    {"step", "%.0f"}, {"train_loss", "%.6f"}, {"val_loss", "%.6f"}, {"val_ppl", "%.4f"},
    {"seconds", "%.3f"}, {"tokens_per_s", "%.1f"}, {"lr", "%.6g"}};

#define MAX_COLS 9
typedef struct {
    double v[MAX_COLS];
} log_row;

typedef struct {
    const log_col *cols;
    int ncols;
    log_row *rows;
    int n, cap;
} metrics;

static log_row *metrics_add(metrics *mt)
{
    if (mt->n == mt->cap) {
        int cap = mt->cap ? 2 * mt->cap : 16;
        log_row *r = realloc(mt->rows, sizeof *r * (size_t)cap);
        if (!r) die("out of memory for the metrics log");
        mt->rows = r;
        mt->cap = cap;
    }
    log_row *r = &mt->rows[mt->n++];
    for (int i = 0; i < MAX_COLS; i++) r->v[i] = NAN;
    return r;
}

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

static mg_status write_log(const char *path, const metrics *mt)
{
    size_t cap = 256 + (size_t)(mt->n + 1) * (size_t)mt->ncols * 48, len = 0;
    char *s = malloc(cap);
    if (!s) return mg_error(MG_ENOMEM, "log: out of memory");
    int csv = log_is_csv(path);
    for (int c = 0; csv && c < mt->ncols; c++)
        len += (size_t)snprintf(s + len, cap - len, "%s%c", mt->cols[c].name,
                                c + 1 < mt->ncols ? ',' : '\n');
    for (int i = 0; i < mt->n; i++)
        for (int c = 0; c < mt->ncols; c++) {
            double v = mt->rows[i].v[c];
            if (!csv) len += (size_t)snprintf(s + len, cap - len, "%s\"%s\":", c ? "," : "{",
                                              mt->cols[c].name);
            if (isnan(v)) len += (size_t)snprintf(s + len, cap - len, csv ? "nan" : "null");
            else len += (size_t)snprintf(s + len, cap - len, mt->cols[c].fmt, v);
            if (c + 1 == mt->ncols) len += (size_t)snprintf(s + len, cap - len, csv ? "\n" : "}\n");
            else if (csv) len += (size_t)snprintf(s + len, cap - len, ",");
        }
    mg_status st = mg_write_file_atomic(path, s, len);
    free(s);
    return st;
}

/* A logged number: a decimal, nan (CSV) or null (JSON). */
static int parse_value(const char *p, double *v, const char **end)
{
    if (!strncmp(p, "null", 4)) {
        *v = NAN;
        *end = p + 4;
        return 1;
    }
    char *e;
    *v = strtod(p, &e);
    *end = e;
    return e != p;
}

/* On resume, take back the rows the checkpoint covers: those whose first
 * column (epoch, or step) is at most upto, in increasing order. Lines
 * that do not parse (the CSV header, a damaged line) are skipped. */
static void read_log(const char *path, metrics *mt, double upto)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[2048];
    int csv = log_is_csv(path);
    while (fgets(line, sizeof line, f)) {
        log_row r;
        const char *p = line, *end;
        int c = 0;
        for (; c < mt->ncols; c++) {
            if (!csv) {
                char key[64];
                snprintf(key, sizeof key, "\"%s\":", mt->cols[c].name);
                if (!(p = strstr(line, key))) break;
                p += strlen(key);
            }
            if (!parse_value(p, &r.v[c], &end)) break;
            if (csv && *end != (c + 1 < mt->ncols ? ',' : '\n') && !(c + 1 == mt->ncols && !*end))
                break;
            p = end + 1;
        }
        if (c < mt->ncols || !(r.v[0] <= upto) || (mt->n && !(r.v[0] > mt->rows[mt->n - 1].v[0])))
            continue;
        *metrics_add(mt) = r;
    }
    fclose(f);
}

/* The plot: image models loss | accuracy per epoch; language models
 * loss | perplexity per step. */
static mg_status write_plot(const char *log, const char *model, const metrics *mt)
{
    char path[4096], title[128];
    plot_path(log, path, sizeof path);
    int n = mt->n, lm = mt->cols == lm_cols;
    double *v = malloc(sizeof(double) * 4 * (size_t)(n + 1));
    if (!v) return mg_error(MG_ENOMEM, "plot: out of memory");
    const int *cols = lm ? (const int[]){L_STEP, L_TRAIN_LOSS, L_VAL_LOSS, L_VAL_PPL}
                         : (const int[]){E_EPOCH, E_TRAIN_LOSS, E_TRAIN_ACC, E_TEST_ACC};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < n; i++) v[k * n + i] = mt->rows[i].v[cols[k]];
    mg_plot_series img[3] = {{"train loss", v + n, 0}, {"train accuracy", v + 2 * n, 1},
                             {"test accuracy", v + 3 * n, 1}};
    mg_plot_series txt[3] = {{"train loss", v + n, 0}, {"validation loss", v + 2 * n, 0},
                             {"validation perplexity", v + 3 * n, 1}};
    const char *img_titles[2] = {"loss", "accuracy"}, *txt_titles[2] = {"loss", "perplexity"};
    snprintf(title, sizeof title, "mgtrain %s", model);
    mg_status st = lm ? mg_plot_svg_xy(path, title, txt_titles, "step", v, txt, 3, n)
                      : mg_plot_svg(path, title, img_titles, img, 3, n);
    free(v);
    return st;
}

/* ---- progress -------------------------------------------------------------- */

typedef struct {
    int tty, quiet;
    double start, last;
} progress;

/* "LABEL [====>   ] 42% RATE UNIT/s loss X ETA Ns": done of total items,
 * each worth per_item units (images, tokens). */
static void progress_update(progress *p, const char *label, long done, long total,
                            double per_item, const char *unit, double loss)
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
    fprintf(stderr, "\r%s [%s] %3d%% %7.0f %s/s  loss %.4f  ETA %3.0fs ", label, bar,
            (int)(100 * done / (total ? total : 1)), ips * per_item, unit, loss, eta);
    fflush(stderr);
}

/* ---- training ------------------------------------------------------------- */

/* The settings a resumed run must share with the saved one (epochs and
 * steps may grow); language models add the clip and the architecture
 * (heads change no tensor shape, so the checkpoint cannot tell). */
static void hparams_string(const options *o, int lm, char *out, size_t cap)
{
    int n = snprintf(out, cap, "model=%s;batch=%d;lr=%g;momentum=%g;optimizer=%s;"
                     "weight_decay=%g;schedule=%s;seed=%llu;accumulate=%d;clip_grad=%g;",
                     o->model, o->batch, o->lr, o->momentum, o->optimizer, o->weight_decay,
                     o->schedule, (unsigned long long)o->seed, o->accumulate, o->clip_grad);
    if (lm)
        snprintf(out + n, cap - (size_t)n, "arch=L%d,d%d,h%d,T%d;steps=%ld", o->gpt.layers,
                 o->gpt.dim, o->gpt.heads, o->gpt.ctx, o->steps);
    else
        snprintf(out + n, cap - (size_t)n, "epochs=%d", o->epochs);
}

/* The flags that must match to resume; 1 and a message in msg if one
 * differs. clip_grad= and arch= are checked when this run has them (a
 * checkpoint from before they existed saved no clip: 0). */
static int resume_flags_differ(const char *saved, const char *now, const char *path,
                               char *msg, size_t cap)
{
    /* Training depends on the global batch, batch x accumulate (a
     * pipeline's --batch B is B/M x M micro-batches): compared as one. */
    long gb[2];
    const char *hp[2] = {saved, now};
    for (int k = 0; k < 2; k++) {
        const char *b = strstr(hp[k], "batch="), *a = strstr(hp[k], "accumulate=");
        gb[k] = (b ? atol(b + 6) : 0) * (a ? atol(a + 11) : 1);
    }
    if (gb[0] != gb[1]) {
        snprintf(msg, cap, "%s was saved with a global batch of %ld (--batch x --accumulate) "
                 "but this run's is %ld; resume with the same global batch, or start a new "
                 "run without --resume", path, gb[0], gb[1]);
        return 1;
    }
    const char *keys[] = {"model=", "lr=", "momentum=", "optimizer=", "weight_decay=",
                          "schedule=", "seed=", "clip_grad=", "arch="};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *a = strstr(saved, keys[k]), *b = strstr(now, keys[k]);
        if (!b) continue;
        if (!a && !strcmp(keys[k], "clip_grad=")) a = "clip_grad=0";
        if (!a) {
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

struct trainer {
    mg_strategy_kind mode;   /* --parallel (or --mesh: ddp; with --zero: zero) */
    mg_group *g;        /* ddp: the whole job */
    mg_mesh *mesh;      /* its ranks as a mesh (the strategy's; --parallel ddp: dp only) */
    int pp;             /* the mesh's pipeline stages (ranks) */
    int rank, world;
    int drank, dworld;  /* how the data are shared: the data-parallel rank and ranks */
    mg_strategy *s;
    mg_model *m;
    mg_optim *opt;
    mg_device dev;      /* --device, picked once (pick_device) */
    int lm;             /* a language model */
    char hp[512];       /* hparams_string */
    uint64_t step_sent, step_received;   /* bytes the training steps moved */
    long steps_run;
};

/* One rank of a job (DDP, ZeRO or a pipeline), not one process. */
static bool distributed(const trainer *t)
{
    return t->mode == MG_STRATEGY_DDP || t->mode == MG_STRATEGY_ZERO ||
           t->mode == MG_STRATEGY_PIPELINE;
}

/* Sum training figures over the data-parallel ranks (a pipeline's stages
 * all report their replica's). */
static void sum_over_replicas(trainer *t, double *v, int n)
{
    if (mg_strategy_sum(t->s, v, n)) die_in_step(t);
}

/* A step failed on this rank (a forward could not reserve its batch, a
 * collective failed). In a DDP job the other ranks' next collective fails
 * when this one exits, and they stop too. The line names the rank once
 * (a group's errors begin with it). */
static void die_in_step(const trainer *t)
{
    const char *e = mg_last_error();
    char me[96];   /* "rank 3", or with its mesh coordinates "rank 3 (pp 1, dp 1)" */
    if (distributed(t))
        die("%s: %s", mg_group_rank_name(t->g, t->rank, me, sizeof me),
            mg_error_past_rank(e, t->rank));
    die("%s", e);
}

/* Every rank leaves when one fails. The failing rank says why before the
 * others can know, and leaves first, so that a launcher names it as the
 * cause; the others wait until it is gone (their barrier fails) instead of
 * waiting for it forever. */
static void agree_or_die(trainer *t, int failed, const char *what)
{
    if (failed) mg_eprintf(prog, "%s", what);
    if (distributed(t)) {
        double who = failed ? t->rank + 1 : 0;   /* the last failing rank, + 1 */
        if (mg_all_reduce(t->g, &who, &who, 1, MG_F64, MG_MAX)) die_in_step(t);
        if (who > 0 && !failed) {
            mg_barrier(t->g);
            die("rank %d: stopping because rank %d failed (its message says why)", t->rank,
                (int)who - 1);
        }
    }
    if (failed) exit(2);
}

/* ---- ranks that disagree --------------------------------------------------- */

/* One setting of a ";"-separated list as the flag that gives it:
 * "model=mlp" -> "--model mlp". */
static void setting_words(const char *kv, size_t n, char *out, size_t cap)
{
    size_t k = strcspn(kv, "=");
    if (k > n) k = n;
    char flag[64] = "--layers/--dim/--heads/--ctx";
    if (k != 4 || strncmp(kv, "arch", 4)) {
        snprintf(flag, sizeof flag, "--%.*s", (int)k, kv);
        for (char *p = flag; *p; p++) if (*p == '_') *p = '-';
    }
    snprintf(out, cap, "%s %.*s", flag, k < n ? (int)(n - k - 1) : 0, kv + k + (k < n));
}

/* Every rank of a DDP job checks before its first collective that all
 * were started with the same settings, and again once the data are loaded:
 * ranks that disagree would otherwise fail later with a misleading error,
 * or wait for each other until the timeout. One all-gather of a SHA-256
 * digest; when they differ, one of the settings, to name the first
 * difference from rank 0. */
#define SETTINGS_CAP 2048
static void same_on_every_rank(trainer *t, const char *settings)
{
    if (!distributed(t)) return;
    unsigned char md[EVP_MAX_MD_SIZE], *all = malloc((size_t)t->world * SETTINGS_CAP);
    if (!all || !EVP_Digest(settings, strlen(settings), md, NULL, EVP_sha256(), NULL))
        die("cannot compare the settings of the ranks: out of memory");
    if (mg_all_gather(t->g, md, all, 32, MG_U8)) die_in_step(t);
    int other = 0;
    for (int r = 1; r < t->world && !other; r++) other = memcmp(all + 32 * r, all, 32) ? r : 0;
    if (other) {
        char mine[SETTINGS_CAP] = "";
        snprintf(mine, sizeof mine, "%s", settings);
        if (mg_all_gather(t->g, mine, all, SETTINGS_CAP, MG_U8)) die_in_step(t);
        const char *a = (const char *)all + (size_t)other * SETTINGS_CAP, *b = (const char *)all;
        all[(size_t)other * SETTINGS_CAP + SETTINGS_CAP - 1] = all[SETTINGS_CAP - 1] = 0;
        for (;;) {
            size_t la = strcspn(a, ";"), lb = strcspn(b, ";");
            if (!*a && !*b)
                die("rank %d was started with other settings than rank 0: start every rank "
                    "with the same flags", other);
            if (la != lb || strncmp(a, b, la)) {
                char wa[SETTINGS_CAP], wb[SETTINGS_CAP];
                setting_words(a, la, wa, sizeof wa);
                setting_words(b, lb, wb, sizeof wb);
                die("rank %d has %s, rank 0 has %s: start every rank with the same %s", other,
                    wa, wb, strncmp(a, "data=", 5) ? "flags" : "data");
            }
            a += la + (a[la] != 0);
            b += lb + (b[lb] != 0);
        }
    }
    free(all);
}

/* A prompt as a setting: its first bytes (';', '=' and unprintable ones
 * as \xNN), and for a longer one its length and CRC. */
static void prompt_setting(const char *p, char *out, size_t cap)
{
    size_t n = strlen(p), k = 0;
    for (size_t i = 0; i < n && i < 40 && k + 5 < cap; i++) {
        unsigned char c = (unsigned char)p[i];
        k += (size_t)(c >= 32 && c < 127 && c != ';' && c != '=' && c != '\\'
                          ? snprintf(out + k, cap - k, "%c", c)
                          : snprintf(out + k, cap - k, "\\x%02x", c));
    }
    out[k] = 0;
    if (n > 40)
        snprintf(out + k, cap - k, "... (%zu bytes, CRC %08x)", n, mg_crc32(p, n));
}

/* Every flag the ranks of a job must share: the checkpoint's
 * hyper-parameters, what shapes the collectives (the mesh, the pipeline,
 * ZeRO, the device's kind and precision, offload, evaluation, sampling,
 * who saves) -- not what each rank may choose (threads, verbosity, the
 * GPU's index, the offload directory, output paths other than --save). */
static void settings_string(const options *o, const trainer *t, char *out, size_t cap)
{
    char hp[512], prompt[300];
    hparams_string(o, t->lm, hp, sizeof hp);
    prompt_setting(o->prompt, prompt, sizeof prompt);
    const char *dev = t->dev.kind == MG_DEVICE_CUDA ? "cuda"
                    : t->dev.kind == MG_DEVICE_EMU ? "emu" : "cpu";
    int n = snprintf(out, cap, "%s;compress=%s;bucket_mb=%g;eval_every=%d;eval_only=%s;"
                     "resume=%s;init=%s;zero=%d;mesh=%s;pp_schedule=%s;micro_batches=%d;"
                     "chunks=%d;split=%s;device=%s;tf32=%d;bf16=%d;offload=%s;"
                     "eval_windows=%d;no_eval_on_start=%d;sample=%d;prompt=%s;temperature=%g;"
                     "top_k=%d;save=%s;print_plan=%d", hp, o->compress, o->bucket_mb,
                     o->eval_every, o->eval_only ? "yes" : "no", o->resume ? "given" : "none",
                     o->init ? "given" : "none", o->zero, o->mesh ? o->mesh : "none",
                     o->pp_schedule ? o->pp_schedule : "1f1b", o->micro_batches, o->chunks,
                     o->split ? o->split : "none", dev, o->tf32, o->bf16,
                     o->offload_dir ? "disk" : o->offload_cpu ? "cpu" : "none",
                     o->eval_windows, o->no_eval_on_start, o->sample, prompt, o->temperature,
                     o->top_k, o->save ? "given" : "none", o->print_plan);
    if (n < 0 || (size_t)n >= cap) die("the settings of this run do not fit %zu bytes", cap);
}

/* --mesh pp=P: the pipeline strategy. --batch B is split into its M
 * micro-batches, so from here the run is one process's --batch B/M
 * --accumulate M (the same draws, logs and checkpoints). */
static void pipeline_flags(options *o, trainer *t, int P)
{
    /* The replicas of each stage average as DDP does, or shard under ZeRO. */
    t->mode = o->zero ? MG_STRATEGY_ZERO : MG_STRATEGY_PIPELINE;
    /* Each mistake one line (every rank finds it and says it). */
    if (o->zero && o->offload_dir)
        die("--offload disk with --zero on a pipeline (--mesh pp=%d) is not built: leave out "
            "--zero (its replicas then average as DDP does) or --offload", P);
    if (strcmp(o->compress, "none"))
        die("--compress %s applies to --parallel ddp: a pipeline's data-parallel replicas "
            "average full-precision gradients", o->compress);
    if (o->accumulate > 1)
        die("--accumulate %d with a pipeline: its micro-batches are the accumulation; give "
            "--micro-batches %d", o->accumulate, o->accumulate);
    mg_pipe_kind k = MG_PIPE_1F1B;
    if (o->pp_schedule && mg_pipe_parse(o->pp_schedule, &k))
        die("--pp-schedule: %s", mg_last_error());
    if (!o->chunks) o->chunks = k == MG_PIPE_INTERLEAVED ? 2 : 1;
    bool given = o->micro_batches > 0;
    if (!given) o->micro_batches = P;
    if (mg_pipe_check(k, P, o->micro_batches, o->chunks)) die("%s", mg_last_error());
    if (o->batch % o->micro_batches)
        die("--batch %d does not split into --micro-batches %d%s: give a multiple of %d",
            o->batch, o->micro_batches, given ? "" : " (one per stage unless given)",
            o->micro_batches);
    o->batch /= o->micro_batches;
    o->accumulate = o->micro_batches;
}

/* --device: cuda without an index is the local rank's GPU (LOCAL_RANK
 * modulo the GPUs). */
static mg_device pick_device(const options *o)
{
    mg_device d = {MG_DEVICE_CPU, 0};
    if (!o->device) return d;
    if (mg_device_parse(o->device, &d)) die("--device: %s", mg_last_error());
    if (mg_device_check(d)) die("--device %s: %s", o->device, mg_last_error());
    if (d.kind == MG_DEVICE_CUDA && !strcmp(o->device, "cuda")) d.index = mg_device_cuda_local();
    return d;
}

/* Join the DDP job (when --parallel ddp) and set the threads; check that
 * the ranks agree and the batch divides among them. An automatic restart
 * (mgrun --max-restarts) resumes from the last save. */
static void join_job(options *o, trainer *t)
{
    t->dev = pick_device(o);
    if (distributed(t)) {
        if (!mg_launch_detect().by)
            die("%s needs a launcher: run it as 'mgrun -n N mgtrain %s ...' (or under "
                "mpirun)", o->mesh ? "--mesh" : "--parallel ddp",
                o->mesh ? "--mesh dp=N" : "--parallel ddp");
        if (mg_group_init(NULL, &t->g)) die("%s", mg_last_error());
        t->rank = mg_group_rank(t->g);
        t->world = mg_group_size(t->g);
        /* Before any other collective (the device's, the mesh's groups):
         * ranks that disagree on a flag that shapes the collectives or the
         * numbers are told which, instead of failing later. */
        char settings[SETTINGS_CAP];
        settings_string(o, t, settings, sizeof settings);
        same_on_every_rank(t, settings);
        /* On GPUs the group's collectives go through NCCL when every rank
         * has its own, else through the host; the mesh's groups follow. */
        if (t->dev.kind == MG_DEVICE_CUDA) {
            if (mg_group_use_device(t->g, t->dev))
                die("--device %s: %s", o->device, mg_last_error());
            const char *why, *path = mg_group_device_path(t->g, &why);
            if (t->rank == 0 && !o->quiet)
                printf("collectives on GPU memory: %s (%s)\n",
                       strcmp(path, "nccl") ? "staged through the host" : "NCCL", why);
        }
        /* The mesh itself is the strategy's (setup_training); every
         * rank has the same spec (same_on_every_rank), so every rank
         * finds the same mistakes in it here. */
        char spec[32];
        int size[MG_MESH_DIMS];
        snprintf(spec, sizeof spec, "dp=%d", t->world);
        if (mg_mesh_parse(o->mesh ? o->mesh : spec, t->world, size))
            die("--mesh: %s", mg_last_error());
        if (size[MG_MESH_PP] == 1 &&
            (o->pp_schedule || o->micro_batches || o->chunks || o->split))
            die("--pp-schedule, --micro-batches, --chunks and --split plan a pipeline, and "
                "--mesh %s has none: give pp=P", o->mesh);
        if (size[MG_MESH_TP] > 1)
            die("--mesh %s: tensor parallelism (tp) is not built yet; give dp and pp only, "
                "e.g. --mesh dp=%d", o->mesh, t->world);
        t->dworld = size[MG_MESH_DP];
        t->pp = size[MG_MESH_PP];
        if (t->pp > 1) pipeline_flags(o, t, t->pp);
        char msg[256];
        snprintf(msg, sizeof msg, "--batch %d does not divide among %d data-parallel ranks: "
                 "use a multiple of %d (--batch is the global batch)",
                 o->batch * o->accumulate, t->dworld, t->dworld * o->accumulate);
        agree_or_die(t, o->batch % t->dworld != 0, msg);
        if (t->rank != 0) o->quiet = 1;
        mg_trace_open(NULL, t->rank, t->world);
    } else {
        mg_trace_open(NULL, 0, 1);
    }
    mg_set_threads(o->threads);   /* with --verbose, logs the CPU and the kernels */
    /* Rank 0's file decides: the other nodes may not see it (they read
     * it through rank 0). */
    int32_t restart = !o->resume && o->save && mg_env_long("MG_RESTART_COUNT", 0) > 0 &&
                      t->rank == 0 && access(o->save, R_OK) == 0;
    if (distributed(t) && mg_broadcast(t->g, &restart, 1, MG_I32, 0)) die_in_step(t);
    if (restart) {
        o->resume = o->save;
        if (t->rank == 0) fprintf(stderr, "%s: restarted: resuming from %s\n", prog, o->save);
    }
}

/* The files the run writes (rank 0: --save, --log and the plot next to
 * it) can be written: found before any work, not after the first epoch. */
static void check_outputs(const options *o, trainer *t)
{
    int failed = 0;
    char msg[1200] = "", plot[4096] = "";
    if (o->log) plot_path(o->log, plot, sizeof plot);
    const char *flag[3] = {"--save", "--log", "--log (its plot)"};
    const char *path[3] = {o->save, o->log, o->log ? plot : NULL};
    for (int i = 0; i < 3 && t->rank == 0 && !o->eval_only && !failed; i++)
        if (path[i] && mg_check_writable(path[i])) {
            snprintf(msg, sizeof msg, "%s: %s", flag[i], mg_last_error());
            failed = 1;
        }
    agree_or_die(t, failed, msg);
}

/* The optimizer of --optimizer and its settings; a language model decays
 * only its 2-D parameters (models.md D). */
static void make_optimizer(const options *o, mg_optim_kind kind, float beta2, int lm, trainer *t)
{
    mg_optim_config oc = mg_optim_defaults(kind, o->lr);
    oc.momentum = o->momentum;
    oc.weight_decay = o->weight_decay;
    if (kind != MG_OPTIM_SGD) oc.beta2 = beta2;
    if (mg_strategy_optim(t->s, &oc, &t->opt)) die("%s", mg_last_error());
    if (!lm) return;
    int n = mg_model_decay_groups(t->m, o->weight_decay, NULL, 0);
    mg_optim_group *g = malloc(sizeof *g * (size_t)n);
    if (!g) die("out of memory");
    mg_model_decay_groups(t->m, o->weight_decay, g, n);
    if (mg_optim_set_groups(t->opt, g, n)) die("%s", mg_last_error());
    free(g);
}

/* The starting state: --resume (rank 0 reads the checkpoint, the strategy
 * gives every rank its state) or --init (rank 0 reads the weights). */
static void start_state(const options *o, trainer *t, mg_ckpt_meta *meta)
{
    memset(meta, 0, sizeof *meta);
    if (o->resume) {
        if (mg_strategy_load(t->s, o->resume, t->opt, meta)) die("--resume: %s", mg_last_error());
        char msg[1200] = "";
        if (resume_flags_differ(meta->hparams, t->hp, o->resume, msg, sizeof msg))
            die("%s", msg);
    } else if (o->init) {
        int failed = 0;
        char msg[1200] = "";
        int left = 0;
        if (t->rank == 0 &&
            mg_model_load_weights(o->init, t->m, o->init_prefix, o->init_partial ? &left : NULL)) {
            snprintf(msg, sizeof msg, "--init: %s%s", mg_last_error(),
                     strstr(mg_last_error(), "no place") ? "; give --init-partial to start "
                     "from the tensors that fit" : "");
            failed = 1;
        }
        agree_or_die(t, failed, msg);
        if (left && !o->quiet)
            fprintf(stderr, "%s: --init-partial: left out %d tensor(s) of %s that %s has no "
                    "place for\n", prog, left, o->init, o->model);
        if (mg_strategy_sync(t->s)) die("%s", mg_last_error());
    }
}

/* The models: a zoo model by name, or gpt-mini of the flags' sizes. */
typedef struct {
    const char *name;
    uint64_t seed;
} zoo_spec;

static mg_status make_zoo(void *ud, mg_model **out)
{
    const zoo_spec *s = ud;
    return mg_model_create(s->name, s->seed, out);
}

typedef struct {
    mg_gpt_config g;
    uint64_t seed;
} gpt_spec;

static mg_status make_gpt(void *ud, mg_model **out)
{
    const gpt_spec *s = ud;
    return mg_model_create_gpt(&s->g, s->seed, out);
}

/* The pipeline of --mesh pp=P: the cut (--split, or balanced by the
 * units' forward FLOPs) and every rank's schedule, simulated. */
static void print_pipeline(const trainer *t, const options *o)
{
    mg_model *m = t->m;
    int P = mg_mesh_size(t->mesh, MG_MESH_PP), nu = mg_model_num_units(m);
    mg_pipe_kind k = MG_PIPE_1F1B;
    if (o->pp_schedule) mg_pipe_parse(o->pp_schedule, &k);   /* checked */
    int V = o->chunks, M = o->micro_batches, S;
    const int *first = mg_pipe_cut(mg_strategy_pipe(t->s), &S);
    double total = 0;
    for (int u = 0; u < nu; u++) total += mg_pipe_unit_cost(m, u);
    printf("pipeline: %d stage(s) on %d rank(s) (%d chunk(s) each), schedule %s, %d "
           "micro-batch(es); cut %s:\n", S, P, V, mg_pipe_name(k), M,
           o->split ? "as --split gives" : "balancing the units' forward FLOPs");
    for (int s = 0; s < S; s++) {
        double c = 0;
        for (int u = first[s]; u < first[s + 1]; u++) c += mg_pipe_unit_cost(m, u);
        mg_tape *tp;
        if (mg_tape_create_range(m, o->batch / t->dworld, first[s], first[s + 1], &tp))
            die("%s", mg_last_error());
        printf("  stage %d on rank %d: units %d-%d (%s .. %s), %.1f%% of the FLOPs, a tape of "
               "%.1f MB per micro-batch\n", s, s % P, first[s], first[s + 1] - 1,
               mg_model_unit(m, first[s]).name, mg_model_unit(m, first[s + 1] - 1).name,
               total > 0 ? 100 * c / total : 0,
               mg_tape_bytes(tp) / 1e6);
        mg_tape_destroy(tp);
    }
    mg_pipe_sim sim;
    if (mg_pipe_simulate(k, P, M, V, 1, 2, &sim)) die("%s", mg_last_error());
    printf("bubble %.1f%% of the time (theory, a backward twice a forward); every rank's "
           "actions (stage, F/B, micro-batch):\n", 100 * sim.idle_fraction);
    mg_pipe_action a[4096];
    char line[65536];
    for (int r = 0; r < P; r++) {
        int n = mg_pipe_compute(k, P, M, V, r, a, 4096);
        mg_pipe_list_str(a, n < 4096 ? n : 4096, line, sizeof line);
        printf("  rank %d (at most %d micro-batch(es) in flight): %s%s\n", r,
               sim.peak_in_flight[r], line, n > 4096 ? " ..." : "");
    }
}

/* --print-plan: the units as the strategy laid them out (rank 0), then
 * every rank stops. */
static void print_plan(trainer *t, const options *o, int local)
{
    mg_model *m = t->m;
    if (t->rank == 0) {
        char mesh[64] = "";
        if (t->mesh) mg_mesh_describe(t->mesh, mesh, sizeof mesh);
        printf("plan: %s, strategy %s on %d rank(s)%s%s, units padded to %zu floats; %zu "
               "parameters in an arena of %zu floats\n", mg_model_name(m),
               mg_strategy_name(t->s), t->world, t->mesh ? ", mesh " : "", mesh,
               mg_model_unit_pad(m), mg_model_num_params(m), mg_model_arena_size(m));
        printf("%4s  %-16s %-12s %10s  %-22s %12s %12s %12s\n", "unit", "name", "kind",
               "params", "arena range", "fwd MFLOP", "kept KB", "out KB");
        for (int u = 0; u < mg_model_num_units(m); u++) {
            mg_unit_info ui = mg_model_unit(m, u);
            char range[48] = "-";
            if (ui.hi > ui.lo) snprintf(range, sizeof range, "[%zu, %zu)", ui.lo, ui.hi);
            printf("%4d  %-16s %-12s %10zu  %-22s %12.3f %12.1f %12.1f\n", u, ui.name, ui.kind,
                   ui.numel, range, ui.flops / 1e6, ui.saved_bytes / 1e3, ui.out_bytes / 1e3);
        }
        mg_tape *tp;
        if (mg_tape_create(m, local, &tp)) die("%s", mg_last_error());
        printf("(FLOPs and bytes per sample.) A tape for a micro-batch of %d: %.1f MB%s\n",
               local, mg_tape_bytes(tp) / 1e6, mg_model_recompute(m) ? " (recomputing)" : "");
        mg_tape_destroy(tp);
        if (t->mesh && mg_mesh_size(t->mesh, MG_MESH_PP) > 1) print_pipeline(t, o);
    }
    exit(0);
}

/* The pipeline strategy's groups and schedule; the cut of --split. */
static void pipeline_options(const options *o, trainer *t, mg_strategy_options *so, int *first)
{
    so->pipe.kind = MG_PIPE_1F1B;
    if (o->pp_schedule) mg_pipe_parse(o->pp_schedule, &so->pipe.kind);   /* checked */
    so->pipe.micro_batches = o->micro_batches;
    so->pipe.chunks = o->chunks;
    if (!o->split) return;
    int nu = mg_model_num_units(t->m), S = t->pp * o->chunks;
    const char **names = malloc(sizeof *names * (size_t)nu);
    if (!names) die("out of memory");
    for (int u = 0; u < nu; u++) names[u] = mg_model_unit(t->m, u).name;
    if (mg_pipe_split_parse(o->split, names, nu, S, first)) die("%s", mg_last_error());
    free(names);
    so->pipe.first = first;
}

/* The model, the strategy for local micro-batches (DDP: rank 0's
 * parameters on every rank), the optimizer over its range and the
 * starting state. */
static void setup_training(const options *o, trainer *t, mg_model_factory make, void *ud, int lm,
                           mg_optim_kind kind, float beta2, mg_compress comp, int local,
                           mg_ckpt_meta *meta)
{
    if (make(ud, &t->m)) die("%s", mg_last_error());
    mg_model_set_recompute(t->m, o->recompute);
    mg_device dev = t->dev;
    if (mg_model_to_device(t->m, dev)) die("--device %s: %s", o->device, mg_last_error());
    if (o->tf32 && dev.kind != MG_DEVICE_CUDA) die("--tf32 is for GPUs: give --device cuda");
    if (o->tf32 && mg_device_set_tf32(dev, true)) die("--tf32: %s", mg_last_error());
    if (o->bf16 && dev.kind == MG_DEVICE_CPU)
        die("--bf16 is for devices: give --device cuda (or emu)");
    if (o->bf16 && o->tf32) die("--bf16 and --tf32 are two precisions of the GEMMs: give one");
    if (o->bf16 && mg_device_set_bf16(dev, true)) die("--bf16: %s", mg_last_error());
    if (dev.kind != MG_DEVICE_CPU && t->rank == 0 && !o->quiet) {
        char name[128], d[16];
        size_t mem;
        mg_device_format(dev, d, sizeof d);
        if (mg_device_describe(dev, name, sizeof name, &mem)) die("%s", mg_last_error());
        printf("device: %s (%s)%s\n", d, name,
               o->offload_cpu ? "; the optimizer's state in host memory (--offload cpu)" : "");
    }
    mg_strategy_options so = mg_strategy_defaults(t->mode);
    so.max_batch = t->mode == MG_STRATEGY_DP ? o->batch : local;
    so.workers = o->workers;
    so.group = distributed(t) ? t->g : NULL;
    so.mesh = o->mesh;
    so.ddp.bucket_bytes = (size_t)(o->bucket_mb * (1 << 20));
    if (so.ddp.first_bucket_bytes > so.ddp.bucket_bytes)
        so.ddp.first_bucket_bytes = so.ddp.bucket_bytes;
    so.ddp.compress = comp;
    so.zero_stage = o->zero;
    so.init_seed = o->seed;
    so.offload_dir = o->offload_dir;
    so.offload_cpu = o->offload_cpu;
    if (o->offload_cpu && dev.kind == MG_DEVICE_CPU && t->rank == 0)
        fprintf(stderr, "%s: --offload cpu: on the CPU the state already lives in host memory, "
                "so nothing moves (disk:DIR moves it to files)\n", prog);
    int first[64 * 64 + 1];
    if (t->pp > 1) pipeline_options(o, t, &so, first);
    if (mg_strategy_create(t->m, &so, &t->s)) die("%s", mg_last_error());
    if ((t->mesh = mg_strategy_mesh(t->s))) t->drank = mg_mesh_coord(t->mesh, MG_MESH_DP);
    if (o->print_plan) print_plan(t, o, local);
    make_optimizer(o, kind, beta2, lm, t);
    hparams_string(o, lm, t->hp, sizeof t->hp);
    start_state(o, t, meta);
}

/* A micro-batch source for mg_train_step: the loader's batches of an
 * epoch (the last one ends the step), or a language model's draws. */
typedef struct {
    mg_loader *loader;
    int left;            /* images of this rank's epoch not yet drawn */
    /* language model */
    const mg_text *text;
    uint64_t seed, draw;
    int batch, T, rank, world;
    int32_t *x, *y;
} source;

static bool next_images(void *ud, mg_micro_batch *b)
{
    source *s = ud;
    const float *x;
    const int32_t *y;
    int n = mg_loader_next(s->loader, &x, &y);
    if (n <= 0) return false;
    s->left -= n;
    *b = (mg_micro_batch){x, y, n, s->left <= 0};
    return true;
}

/* Micro-batch j of step s is draw s * accumulate + j of the seeded
 * stream: accumulate 1 is models.md's batch order. */
static bool next_text(void *ud, mg_micro_batch *b)
{
    source *s = ud;
    int rows = mg_text_batch(s->text, s->seed, s->draw++, s->batch, s->T, s->rank, s->world, s->x,
                             s->y);
    *b = (mg_micro_batch){s->x, s->y, rows, false};
    return true;
}

/* One optimizer step through the strategy; this rank's figures in r. */
static void train_step(trainer *t, const options *o, double lr, source *src, mg_batch_source next,
                       mg_step_result *r)
{
    mg_step_options so = {.accumulate = o->accumulate, .lr = (float)lr,
                          .clip_grad = o->clip_grad};
    mg_traffic a = mg_strategy_traffic(t->s);
    if (mg_train_step(t->s, t->opt, &so, next, src, r)) die_in_step(t);
    mg_traffic b = mg_strategy_traffic(t->s);
    t->step_sent += b.sent - a.sent;
    t->step_received += b.received - a.received;
    t->steps_run++;
}

/* How the job splits the batch (after "batch B"). */
static void print_layout(const trainer *t, const options *o, int local)
{
    if (t->pp == 1) {
        printf(" (%d per rank on %d ranks, %s)", local, t->world, mg_strategy_name(t->s));
        return;
    }
    char mesh[64];
    mg_mesh_describe(t->mesh, mesh, sizeof mesh);
    printf(" x %d micro-batches (%d per replica; a pipeline of %d stages, %s, mesh %s, %s)",
           o->micro_batches, local, mg_mesh_size(t->mesh, MG_MESH_PP) * o->chunks,
           o->pp_schedule ? o->pp_schedule : "1f1b", mesh, mg_strategy_name(t->s));
}

/* A pipeline's cut, one line. */
static void print_cut(const trainer *t)
{
    mg_pipe *p = mg_strategy_pipe(t->s);
    if (!p) return;
    int S;
    const int *first = mg_pipe_cut(p, &S), P = mg_mesh_size(t->mesh, MG_MESH_PP);
    printf("pipeline cut:");
    for (int s = 0; s < S; s++)
        printf("%s stage %d on rank %d = %s .. %s", s ? "," : "", s, s % P,
               mg_model_unit(t->m, first[s]).name, mg_model_unit(t->m, first[s + 1] - 1).name);
    printf("\n");
}

/* Rank 0 writes the log and its plot; every rank learns whether it worked
 * (also the barrier before a save). */
static void write_metrics(trainer *t, const options *o, const metrics *mt)
{
    int failed = 0;
    char msg[1200] = "";
    if (t->rank == 0 && o->log &&
        (write_log(o->log, mt) || write_plot(o->log, o->model, mt))) {
        snprintf(msg, sizeof msg, "%s", mg_last_error());
        failed = 1;
    }
    agree_or_die(t, failed, msg);
}

static void save_checkpoint(trainer *t, const options *o, long step, long epoch)
{
    if (!o->save) return;
    mg_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    snprintf(meta.model, sizeof meta.model, "%s", o->model);
    meta.step = step;
    meta.epoch = epoch;
    meta.seed = o->seed;
    snprintf(meta.hparams, sizeof meta.hparams, "%s", t->hp);
    if (mg_strategy_save(t->s, o->save, t->opt, &meta))
        die("--save: %s (the previous checkpoint, if any, is intact)", mg_last_error());
}

/* --verbose: what each rank held at most and moved per step. */
static void print_counters(trainer *t)
{
    if (!mg_verbose()) return;
    mg_memory_stats ms = mg_strategy_memory(t->s, t->opt);
    long n = t->steps_run ? t->steps_run : 1;
    fprintf(stderr, "%s: rank %d %s: peak MB parameters %.1f gradients %.1f optimizer %.1f "
            "activations %.1f; per step MB sent %.3f received %.3f; peak RSS %.1f MB\n", prog,
            t->rank, mg_strategy_name(t->s), ms.params / 1e6, ms.grads / 1e6, ms.optim / 1e6,
            ms.activations / 1e6, (double)t->step_sent / (double)n / 1e6,
            (double)t->step_received / (double)n / 1e6, mg_peak_rss() / 1e6);
    mg_model *m = mg_strategy_model(t->s);
    mg_device d = mg_model_device(m);
    if (d.kind != MG_DEVICE_CPU) {   /* what the device holds now, between steps */
        size_t a = mg_model_arena_size(m) * sizeof(float);
        fprintf(stderr, "%s: rank %d device memory now MB parameters %.1f gradients %.1f (of "
                "%.1f each); the optimizer's state in %s memory\n", prog, t->rank,
                mg_device_resident(d, mg_model_params(m), a) / 1e6,
                mg_device_resident(d, mg_model_grads(m), a) / 1e6, a / 1e6,
                mg_optim_device(t->opt).kind == MG_DEVICE_CPU ? "host" : "device");
    }
    mg_pipe *p = mg_strategy_pipe(t->s);
    if (!p) return;
    /* The bubble as this rank lived it: the share of its steps' time it
     * was not computing. */
    mg_pipe_stats ps = mg_pipe_get_stats(p);
    fprintf(stderr, "%s: rank %d pipeline: busy %.1f%% of %.1f ms per step (idle %.1f%%), at "
            "most %d micro-batch(es) in flight\n", prog, t->rank,
            ps.step_us > 0 ? 100 * ps.busy_us / ps.step_us : 0,
            ps.steps ? ps.step_us / ps.steps / 1e3 : 0,
            ps.step_us > 0 ? 100 * (1 - ps.busy_us / ps.step_us) : 0, ps.peak_in_flight);
}

static void print_ddp_stats(const trainer *t)
{
    mg_ddp *ddp = mg_strategy_ddp(t->s);
    if (!ddp || !mg_trace_on()) return;
    mg_ddp_stats ds = mg_ddp_get_stats(ddp);
    if (t->rank == 0 && ds.comm_us > 0)
        fprintf(stderr, "%s: %d buckets, all-reduce %.1f ms, %.1f ms exposed (%.0f%% hidden "
                "behind backward)\n", prog, mg_ddp_num_buckets(ddp), ds.comm_us / 1e3,
                ds.exposed_us / 1e3, 100 * (1 - ds.exposed_us / ds.comm_us));
}

/* ---- image models: epochs over Fashion-MNIST ------------------------------ */

/* The data sets' images and labels fit the model (images of another size
 * would overrun its batches). */
static void check_data_fits(trainer *t, const mg_dataset *train, const mg_dataset *test)
{
    int c, h, w, failed = 0;
    char msg[1200] = "";
    mg_model_input_shape(t->m, &c, &h, &w);
    const mg_dataset *sets[2] = {train, test};
    for (int i = 0; i < 2 && !failed; i++)
        if (sets[i] && mg_dataset_check_input(sets[i], mg_model_name(t->m), c, h, w,
                                              mg_model_classes(t->m))) {
            snprintf(msg, sizeof msg, "%s", mg_last_error());
            failed = 1;
        }
    agree_or_die(t, failed, msg);
}

/* The test images [at, end) in batches. */
typedef struct {
    const mg_dataset *test;
    int at, end, batch;
    mg_scaling sc;
    float *x;
    int32_t *y, *idx;
    size_t x_len;
} test_source;

static bool next_test(void *ud, mg_micro_batch *b)
{
    test_source *s = ud;
    if (s->at >= s->end) return false;
    int n = s->end - s->at < s->batch ? s->end - s->at : s->batch;
    for (int k = 0; k < n; k++) s->idx[k] = s->at + k;
    if (mg_dataset_gather(s->test, s->idx, n, s->sc, s->x, s->x_len, s->y)) return false;
    s->at += n;
    *b = (mg_micro_batch){s->x, s->y, n, false};
    return true;
}

/* Test loss and accuracy through the strategy: each data-parallel replica
 * takes a contiguous shard of the test set and the sums are added, so the
 * figures are exact. */
static void evaluate(trainer *t, const mg_dataset *test, float *x, int32_t *y, int32_t *idx,
                     int batch, mg_scaling sc, double *loss, double *acc)
{
    int ch, h, w;
    mg_model_input_shape(t->m, &ch, &h, &w);
    test_source src = {.test = test, .batch = batch, .sc = sc, .x = x, .y = y, .idx = idx,
                       .x_len = (size_t)batch * ch * h * w};
    mg_shard_range(test->n, t->drank, t->dworld, &src.at, &src.end);
    mg_step_result r;
    if (mg_strategy_evaluate(t->s, next_test, &src, &r) || src.at < src.end) die_in_step(t);
    double v[3] = {r.loss_sum, (double)r.correct, (double)r.samples};
    sum_over_replicas(t, v, 3);
    *loss = v[0] / v[2];
    *acc = v[1] / v[2];
}

static void train_images(options *o, const mg_zoo_defaults *def, mg_optim_kind kind,
                         mg_compress comp, mg_schedule sched, trainer *t)
{
    if (!o->data) o->data = mg_env_str("MG_DATA", "/usr/share/datasets/fashion-mnist");
    struct stat sb;
    if (stat(o->data, &sb) || !S_ISDIR(sb.st_mode))
        die("data directory '%s' not found: install the dataset-fashion-mnist "
            "package (scripts/install-deps.sh) or pass --data DIR (or set MG_DATA)", o->data);
    join_job(o, t);
    check_outputs(o, t);
    mg_dataset *train = NULL, *test = NULL;
    if (!o->eval_only && mg_dataset_load(o->data, true, &train)) die("%s", mg_last_error());
    if (mg_dataset_load(o->data, false, &test)) die("%s", mg_last_error());
    char data[128];
    snprintf(data, sizeof data, "data=with %d+%d images of %dx%d", train ? train->n : 0, test->n,
             test->h, test->w);
    same_on_every_rank(t, data);

    int local = o->batch / t->dworld;  /* images per rank and micro-batch */
    zoo_spec spec = {o->model, MG_SEED_DEFERRED};   /* the strategy draws each rank's part */
    mg_ckpt_meta meta;
    setup_training(o, t, make_zoo, &spec, 0, kind, def->beta2, comp, local, &meta);
    check_data_fits(t, train, test);
    mg_model *m = t->m;
    long start_epoch = meta.epoch;   /* compared as read: at most 2^53 - 1 */
    long step = meta.step;

    mg_scaling sc = def->normalized_input ? MG_SCALE_NORMAL : MG_SCALE_UNIT;
    int c, h, w;
    mg_model_input_shape(m, &c, &h, &w);
    size_t in = (size_t)c * h * w;
    int eval_batch = local;
    float *xb = mg_alloc(sizeof(float) * in * (size_t)eval_batch);
    int32_t *yb = mg_alloc(sizeof(int32_t) * (size_t)eval_batch);
    int32_t *ib = mg_alloc(sizeof(int32_t) * (size_t)eval_batch);
    if (!xb || !yb || !ib) die("out of memory for a batch of %d", eval_batch);

    mg_sampler sampler = {0};
    metrics mt = {epoch_cols, E_COLS, NULL, 0, 0};
    mg_loader *loader = NULL;
    if (o->eval_only) {
        double loss, acc;
        evaluate(t, test, xb, yb, ib, eval_batch, sc, &loss, &acc);
        if (t->rank == 0)
            printf("%s: test loss %.4f, test accuracy %.2f%% (%d images)\n", o->model, loss,
                   100 * acc, test->n);
        goto done;
    }

    /* Each rank's shard of every epoch's permutation (models.md: perm[r::k]). */
    if (mg_sampler_init(&sampler, train->n, t->drank, t->dworld, true, o->seed, false))
        die("%s", mg_last_error());
    int n_local;
    mg_sampler_indices(&sampler, &n_local);
    int micro_per_epoch = (n_local + local - 1) / local;
    int steps_per_epoch = (micro_per_epoch + o->accumulate - 1) / o->accumulate;
    sched.total_steps = (long)steps_per_epoch * o->epochs;
    if (start_epoch >= o->epochs) {
        if (t->rank == 0)
            fprintf(stderr, "%s: %s already covers %ld epoch(s); %s\n", prog, o->resume,
                    start_epoch, start_epoch >= MAX_EPOCHS
                                     ? "--epochs goes up to 1000000, so there is nothing left "
                                       "to train" : "raise --epochs to train more");
        goto done;
    }
    if (step != start_epoch * steps_per_epoch)
        die("%s: step %ld is not the end of epoch %ld with --batch %d --accumulate %d",
            o->resume, step, start_epoch, o->batch, o->accumulate);

    if (o->log && o->resume && t->rank == 0) read_log(o->log, &mt, start_epoch);

    if (mg_loader_create(train, local, sc, &loader)) die("%s", mg_last_error());
    progress pr = {isatty(2), o->quiet, 0, 0};
    if (!o->quiet) {
        printf("mgtrain: %s, %zu parameters, batch %d", o->model, mg_model_num_params(m), o->batch);
        if (distributed(t))
            print_layout(t, o, local);
        if (t->mode == MG_STRATEGY_DP) printf(" (%d DataParallel workers)", o->workers);
        if (o->accumulate > 1 && t->pp == 1)
            printf(" x %d accumulated", o->accumulate);
        printf(", %s lr %g, %d epochs\n", o->optimizer, o->lr, o->epochs);
        print_cut(t);
    }
    double total_time = 0;
    for (int e = (int)start_epoch; e < o->epochs; e++) {
        mg_sampler_set_epoch(&sampler, e);
        const int32_t *order = mg_sampler_indices(&sampler, &n_local);
        mg_loader_start(loader, order, n_local, local, 0);
        double v[3] = {0, 0, 0};  /* loss sum, correct, images (this rank) */
        double t0 = mg_now(), lr = o->lr;
        pr.start = t0;
        pr.last = 0;
        char label[64];
        snprintf(label, sizeof label, "epoch %d/%d", e + 1, o->epochs);
        source src = {.loader = loader, .left = n_local};
        for (;;) {
            mg_step_result sr;
            lr = mg_schedule_lr(&sched, step);
            train_step(t, o, lr, &src, next_images, &sr);
            if (sr.micro == 0) break;
            v[0] += sr.loss_sum;
            v[1] += (double)sr.correct;
            v[2] += (double)sr.samples;
            step++;
            progress_update(&pr, label, (long)v[2] * t->dworld, train->n, 1, "img", v[0] / v[2]);
        }
        double secs = mg_now() - t0;
        sum_over_replicas(t, v, 3);
        total_time += secs;
        log_row *r = metrics_add(&mt);
        r->v[E_EPOCH] = e + 1;
        r->v[E_STEP] = (double)step;
        r->v[E_TRAIN_LOSS] = v[0] / v[2];
        r->v[E_TRAIN_ACC] = v[1] / v[2];
        r->v[E_SECONDS] = secs;
        r->v[E_IMAGES_PER_S] = v[2] / secs;
        r->v[E_LR] = lr;
        evaluate(t, test, xb, yb, ib, eval_batch, sc, &r->v[E_TEST_LOSS], &r->v[E_TEST_ACC]);
        if (pr.tty && !o->quiet) fprintf(stderr, "\r%100s\r", "");
        if (!o->quiet) {
            printf("epoch %2d/%d  loss %.4f  train acc %5.2f%%  test acc %5.2f%%  "
                   "%6.2f s  %8.0f img/s\n", e + 1, o->epochs, r->v[E_TRAIN_LOSS],
                   100 * r->v[E_TRAIN_ACC], 100 * r->v[E_TEST_ACC], secs,
                   r->v[E_IMAGES_PER_S]);
            fflush(stdout);
        }
        write_metrics(t, o, &mt);
        save_checkpoint(t, o, step, e + 1);
    }
    const log_row *last = &mt.rows[mt.n - 1];
    if (t->rank == 0)
        printf("final: test accuracy %.2f%%, test loss %.4f, %.1f s training, "
               "peak memory %.0f MB\n", 100 * last->v[E_TEST_ACC], last->v[E_TEST_LOSS],
               total_time, mg_peak_rss() / 1e6);
    print_ddp_stats(t);
    print_counters(t);
done:
    mg_sampler_free(&sampler);
    free(mt.rows);
    mg_loader_destroy(loader);
    mg_free(xb);
    mg_free(yb);
    mg_free(ib);
    mg_dataset_destroy(train);
    mg_dataset_destroy(test);
}

/* ---- language models: steps over text ------------------------------------- */

/* Validation loss (collective in DDP) and its perplexity, over --eval-windows
 * windows. */
static double validate(trainer *t, const options *o, const mg_text *text, int batch, double *ppl)
{
    double v;
    if (mg_strategy_lm_val_loss(t->s, text, batch, t->drank, t->dworld, o->eval_windows, &v))
        die_in_step(t);
    *ppl = exp(v);
    return v;
}

/* --sample bytes after --prompt through the strategy (collective: ZeRO-3
 * gathers the parameters, a pipeline runs each token through its stages);
 * rank 0 prints them. */
static void print_sample(trainer *t, const options *o)
{
    if (!o->sample) return;
    int np = (int)strlen(o->prompt);
    int32_t *tok = malloc(sizeof *tok * (size_t)(np + o->sample));
    if (!tok) die("out of memory for a sample of %d bytes", o->sample);
    for (int i = 0; i < np; i++) tok[i] = (unsigned char)o->prompt[i];
    if (mg_strategy_generate(t->s, tok, np, o->sample, o->temperature, o->top_k, o->seed,
                             tok + np))
        die("--sample: %s", mg_last_error());
    if (t->rank == 0) {
        printf("sample (%d bytes, temperature %g, top-k %d):\n%s", o->sample, o->temperature,
               o->top_k, o->prompt);
        for (int i = 0; i < o->sample; i++) putchar(tok[np + i]);
        putchar('\n');
        fflush(stdout);
    }
    free(tok);
}

static void train_lm(options *o, mg_optim_kind kind, const mg_zoo_defaults *def,
                     mg_compress comp, mg_schedule sched, trainer *t)
{
    if (o->gpt.dim % o->gpt.heads)
        die("--dim %d does not divide into --heads %d: give a multiple of %d", o->gpt.dim,
            o->gpt.heads, o->gpt.heads);
    mg_text *text;
    if (mg_text_open(o->data, o->gpt.ctx, &text)) die("%s", mg_last_error());
    join_job(o, t);
    char data[64];
    snprintf(data, sizeof data, "data=with %zu bytes", mg_text_size(text));
    same_on_every_rank(t, data);
    check_outputs(o, t);
    int local = o->batch / t->dworld, T = o->gpt.ctx;   /* sequences per rank */
    gpt_spec spec = {o->gpt, MG_SEED_DEFERRED};
    mg_ckpt_meta meta;
    setup_training(o, t, make_gpt, &spec, 1, kind, def->beta2, comp, local, &meta);
    mg_model *m = t->m;
    long step = meta.step;
    double ppl, vl;
    if (o->eval_only) {
        vl = validate(t, o, text, local, &ppl);
        if (t->rank == 0)
            printf("%s: validation loss %.4f, perplexity %.2f (%d windows of %d bytes)\n",
                   o->model, vl, ppl, mg_lm_val_windows(text, T, o->eval_windows), T);
        print_sample(t, o);
        mg_text_close(text);
        return;
    }
    if (step >= o->steps) {
        if (t->rank == 0)
            fprintf(stderr, "%s: %s already covers %ld step(s); %s\n", prog, o->resume, step,
                    step >= MAX_STEPS ? "--steps goes up to 1000000000, so there is nothing "
                                        "left to train" : "raise --steps to train more");
        print_sample(t, o);
        mg_text_close(text);
        return;
    }
    sched.total_steps = o->steps;
    int32_t *x = malloc(sizeof(int32_t) * (size_t)local * T);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)local * T);
    if (!x || !y) die("out of memory for a batch of %d sequences", local);
    metrics mt = {lm_cols, L_COLS, NULL, 0, 0};
    if (o->log && o->resume && t->rank == 0) read_log(o->log, &mt, (double)step);
    if (!o->quiet) {
        printf("mgtrain: %s (%d layers, dim %d, %d heads, context %d), %zu parameters, "
               "batch %d", o->model, o->gpt.layers, o->gpt.dim, o->gpt.heads, T,
               mg_model_num_params(m), o->batch);
        if (distributed(t))
            print_layout(t, o, local);
        if (t->mode == MG_STRATEGY_DP) printf(" (%d DataParallel workers)", o->workers);
        if (o->accumulate > 1 && t->pp == 1)
            printf(" x %d accumulated", o->accumulate);
        printf(", %s lr %g, %ld steps; %zu bytes of text (%zu train)\n", o->optimizer, o->lr,
               o->steps, mg_text_size(text), mg_text_train_size(text));
        print_cut(t);
    }
    if (step == 0 && !o->no_eval_on_start) {   /* the curve starts at initialisation */
        log_row *r = metrics_add(&mt);
        r->v[L_STEP] = 0;
        r->v[L_VAL_LOSS] = vl = validate(t, o, text, local, &ppl);
        r->v[L_VAL_PPL] = ppl;
        if (!o->quiet) printf("step %5d/%ld  val loss %.4f  ppl %7.2f\n", 0, o->steps, vl, ppl);
    }
    progress pr = {isatty(2), o->quiet, mg_now(), 0};
    double v[2] = {0, 0};   /* loss sum, steps since the last evaluation (this rank) */
    double secs = 0, total_time = 0, t0 = mg_now(), lr = o->lr;
    long first = step, tokens_per_step = (long)o->batch * T * o->accumulate;
    while (step < o->steps) {
        source src = {.text = text, .seed = o->seed,
                      .draw = (uint64_t)step * (uint64_t)o->accumulate, .batch = o->batch,
                      .T = T, .rank = t->drank, .world = t->dworld, .x = x, .y = y};
        mg_step_result sr;
        lr = mg_schedule_lr(&sched, step);
        train_step(t, o, lr, &src, next_text, &sr);
        step++;
        v[0] += sr.loss_sum / (double)sr.samples;
        v[1] += 1;
        char label[64];
        snprintf(label, sizeof label, "step %ld/%ld", step, o->steps);
        progress_update(&pr, label, step - first, o->steps - first, (double)tokens_per_step,
                        "tok", v[0] / v[1]);
        if (step % o->eval_every && step < o->steps) continue;
        secs = mg_now() - t0;
        total_time += secs;
        sum_over_replicas(t, v, 2);
        log_row *r = metrics_add(&mt);
        r->v[L_STEP] = (double)step;
        r->v[L_TRAIN_LOSS] = v[0] / v[1];
        r->v[L_SECONDS] = secs;
        r->v[L_TOKENS_PER_S] = v[1] / t->dworld * (double)tokens_per_step / secs;
        r->v[L_LR] = lr;
        r->v[L_VAL_LOSS] = validate(t, o, text, local, &r->v[L_VAL_PPL]);
        if (pr.tty && !o->quiet) fprintf(stderr, "\r%100s\r", "");
        if (!o->quiet) {
            printf("step %5ld/%ld  loss %.4f  val loss %.4f  ppl %7.2f  %7.2f s  %8.0f tok/s\n",
                   step, o->steps, r->v[L_TRAIN_LOSS], r->v[L_VAL_LOSS], r->v[L_VAL_PPL], secs,
                   r->v[L_TOKENS_PER_S]);
            fflush(stdout);
        }
        write_metrics(t, o, &mt);
        save_checkpoint(t, o, step, 0);
        v[0] = v[1] = 0;
        t0 = mg_now();
    }
    const log_row *last = &mt.rows[mt.n - 1];
    if (t->rank == 0)
        printf("final: validation loss %.4f, perplexity %.2f, %.1f s training, %.0f tokens/s, "
               "peak memory %.0f MB\n", last->v[L_VAL_LOSS], last->v[L_VAL_PPL], total_time,
               (double)(step - first) * tokens_per_step / total_time, mg_peak_rss() / 1e6);
    print_ddp_stats(t);
    print_counters(t);
    print_sample(t, o);
    free(mt.rows);
    free(x);
    free(y);
    mg_text_close(text);
}

int main(int argc, char **argv)
{
    options o;
    parse_args(argc, argv, &o);
    if (mg_tunables_check()) die("%s", mg_last_error());
    if (!o.threads) o.threads = (int)mg_env_long("MG_THREADS", 1);
    mg_kernels();   /* the GEMM kernel check sets the environment: before any thread starts */
    trainer t = {.mode = o.strategy, .rank = 0, .world = 1, .dworld = 1, .pp = 1};

    /* ---- check all input before touching any file ---- */
    mg_zoo_defaults def;
    if (mg_zoo_defaults_of(o.model, &def)) die("%s", mg_last_error());
    int lm = t.lm = def.language_model;
    if (lm && o.have_epochs)
        die("--epochs: %s trains by steps; give --steps N (default %ld)", o.model, def.steps);
    if (!lm && (o.have_steps || o.have_eval_every || o.have_arch || o.sample ||
                o.have_sample_opts || o.eval_windows || o.no_eval_on_start))
        die("--steps, --eval-every, --eval-windows, --no-eval-on-start, --layers, --dim, "
            "--heads, --ctx and --sample apply to gpt-mini; %s trains by --epochs", o.model);
    if (!o.have_batch) o.batch = def.batch;
    if (!o.have_lr) o.lr = def.lr;
    if (!o.have_momentum) o.momentum = def.momentum;
    if (!o.have_epochs) o.epochs = def.epochs;
    if (!o.have_steps) o.steps = def.steps;
    if (!o.have_eval_every) o.eval_every = def.eval_every;
    if (!o.optimizer) o.optimizer = mg_optim_kind_name(def.optimizer);
    mg_optim_kind kind;
    if (mg_optim_parse(o.optimizer, &kind)) die("--optimizer: %s", mg_last_error());
    if (o.weight_decay < 0)
        o.weight_decay = kind == def.optimizer ? def.weight_decay
                       : kind == MG_OPTIM_ADAMW ? 0.01f : 0.0f;
    if (o.clip_grad < 0) o.clip_grad = def.clip_grad;
    mg_schedule sched;
    mg_pipe_kind pk;
    if (!mg_pipe_parse(o.schedule, &pk))
        die("--schedule %s: --schedule is the learning-rate schedule; the pipeline's is "
            "--pp-schedule %s", o.schedule, o.schedule);
    if (mg_schedule_parse(o.schedule, o.lr, &sched)) die("--schedule: %s", mg_last_error());
    mg_compress comp;
    if (mg_compress_parse(o.compress, &comp)) die("--compress: %s", mg_last_error());
    if (comp != MG_COMPRESS_NONE && t.mode != MG_STRATEGY_DDP)
        die("--compress %s applies to --parallel ddp without --zero (ZeRO reduce-scatters "
            "full-precision gradients)", o.compress);
    if (o.resume && o.init) die("--resume and --init both set: give one of them");
    if (o.init_partial && !o.init) die("--init-partial shapes --init: give --init FILE");
    if (o.sample && !*o.prompt)
        die("--prompt is empty: the sample continues a prompt of at least one byte (default: "
            "a newline)");
    mg_device dev;
    if (o.offload_dir && o.device && !mg_device_parse(o.device, &dev) &&
        dev.kind != MG_DEVICE_CPU)
        die("--offload disk:DIR keeps the optimizer's state in files for a model on the CPU; "
            "with --device %s give --offload cpu (the state in host memory)", o.device);
    if (o.eval_only && !o.resume && !o.init)
        die("--eval-only needs weights: give --init FILE or --resume FILE");
    if (t.mode == MG_STRATEGY_DP && o.batch < o.workers)
        die("--batch %d is smaller than --workers %d: give each worker at least one sample",
            o.batch, o.workers);

    if (lm) train_lm(&o, kind, &def, comp, sched, &t);
    else train_images(&o, &def, kind, comp, sched, &t);

    if (mg_trace_close()) mg_log("trace: %s", mg_last_error());
    mg_optim_destroy(t.opt);
    mg_strategy_destroy(t.s);
    mg_model_destroy(t.m);
    mg_group_destroy(t.g);
    return 0;
}
