/* mgtrain — train a zoo model from the command line: flags, usage and
 * printing over the trainer (train.h), which does the work: the image
 * models on Fashion-MNIST (or MNIST) by epochs, gpt-mini on text (the
 * fortunes corpus, or --data) by steps; in one process, with DataParallel
 * threads (--parallel dp), or as one rank of a job launched by mgrun or
 * mpirun (--parallel ddp, --mesh; --batch is the global batch, so the same
 * flags mean the same training at any world size). Image models report
 * train loss and accuracy, test accuracy, seconds and images/s per epoch;
 * gpt-mini reports train loss, validation loss and perplexity and
 * tokens/s every --eval-every steps and can generate text (--sample).
 *
 * Bad input (unknown model, a number outside its flag's range, a bad MG_*
 * variable, a missing data directory, a damaged or mismatched checkpoint,
 * ranks started with different flags) gives one line saying what is
 * wrong and how to fix it, and exit status 2; no file is written before
 * the input has been checked. */
#define _GNU_SOURCE
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "multigrad/multigrad.h"
#include "multigrad/train.h"

#define MAX_EPOCHS 1000000     /* --epochs */
#define MAX_STEPS 1000000000L  /* --steps */

/* The trainer's config and what only the tool has: printing and sampling. */
typedef struct {
    mg_train_config c;
    const char *parallel, *prompt;
    int quiet, print_plan, print_hash, sample, top_k, have_sample_opts, have_arch;
    float temperature;
    mg_trainer *t;
    int tty;                  /* stderr is a terminal: a progress bar */
} options;

static const char *prog = "mgtrain";
static bool parsing = true;   /* the flags: every rank of a launched job reads the same */

/* One line, and exit 2. A mistake in the flags is said by rank 0 of a
 * launched job alone (the others find it alike). */
static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    if (parsing) mg_launch_defer_to_rank_0();
    va_start(ap, fmt);
    mg_veprintf(prog, fmt, ap);
    va_end(ap);
    exit(2);
}

/* A failed library call: its one line, and exit 2; MG_ESTOPPED (another
 * rank failed first and says why): the line only if the launcher did not
 * end this rank meanwhile (mg_launch_defer_to_the_first). */
static void fail(mg_status st) __attribute__((noreturn));
static void fail(mg_status st)
{
    char why[2048];
    snprintf(why, sizeof why, "%s", mg_last_error());
    if (st == MG_ESTOPPED && !mg_launch_defer_to_the_first()) exit(2);
    die("%s", why);
}
#define TRY(call) do { mg_status st_ = (call); if (st_) fail(st_); } while (0)

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
"  --betas B1,B2       Adam's and AdamW's betas (default: 0.9,0.999; gpt-mini's\n"
"                      AdamW 0.9,0.99)\n"
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
"  --eval-only         evaluate the weights of --init or --resume (test accuracy,\n"
"                      or validation loss; only the model flags must match),\n"
"                      no training\n"
"  --log FILE          metrics per epoch or evaluation: CSV (.csv) or JSON lines\n"
"                      (otherwise); an SVG plot is written next to it (.svg)\n"
"  --quiet             print only the final summary\n"
"  --verbose           print the CPU, the kernels in use and the settings\n"
"                      (as MG_VERBOSE=1)\n"
"  --version           version, CPU and kernels of this machine\n"
"  --print-params      the MG_* environment variables: default, range, meaning\n"
"  --parallel MODE     none | dp (threads in this process) | ddp (one rank of\n"
"                      a job started by mgrun or mpirun) | ps (a parameter\n"
"                      server: the last --servers ranks keep the parameters\n"
"                      and the optimizer, the others compute) (default none)\n"
"  --servers K         with --parallel ps: server ranks (default 1), each a run\n"
"                      of whole units\n"
"  --staleness S       with --parallel ps: steps a worker may run ahead of the\n"
"                      slowest, 0 to 64 (default 0: synchronous), or inf:\n"
"                      fully asynchronous, each push its own update\n"
"  --elastic           with --parallel ps under mgrun --elastic: a worker that\n"
"                      dies leaves the job and the others go on without it\n"
"  --mesh SPEC         the job's ranks as a mesh, e.g. dp=4 (tp varies fastest,\n"
"                      then dp, then pp; a missing dp is ranks/(tp*pp));\n"
"                      --parallel ddp is --mesh dp=<ranks>; pp=P cuts the\n"
"                      model into a pipeline of P stages (with dp=D: D\n"
"                      replicas of it); tp=T splits every layer over T ranks\n"
"                      (Megatron-LM's tensor parallelism: gpt's attention by\n"
"                      heads, its MLP, its embedding and head by vocabulary;\n"
"                      an image model's fc1/fc2 pair), e.g. dp=2,pp=2,tp=2\n"
"  --sequence-parallel with tp=T, a gpt's activations between its attention\n"
"                      and MLP split over the positions too (Megatron-LM's\n"
"                      sequence parallelism: LayerNorms on 1/T of them)\n"
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
"  --slow-rank R:F     a straggler on purpose: rank R's forwards and backwards\n"
"                      take F times as long (it sleeps F - 1 times their time\n"
"                      after each micro-batch); the numbers are the same. Not\n"
"                      with a pipeline\n"
"  --plan auto         let the planner (mgplan) choose the mesh, --zero, the\n"
"                      pipeline's schedule and micro-batches, --accumulate,\n"
"                      --recompute and --sequence-parallel for the global batch\n"
"                      (--batch x --accumulate) on the job's ranks, measuring\n"
"                      this machine first; it prints its choice and why. With\n"
"                      --offload disk:DIR it may also offload there, where\n"
"                      nothing fits without\n"
"  --plan-memory MB    with --plan auto, what a rank may hold (default: the\n"
"                      node's available memory over its ranks)\n"
"  --print-plan        print the units (parameter ranges, FLOPs, activation\n"
"                      bytes) as the strategy lays them out, and stop\n"
"  --deterministic     the same bits at any world size and plan: the step's\n"
"                      rows cut into --virtual-shards V (default 8) micro-\n"
"                      batches, each the same rows whatever the ranks, their\n"
"                      gradients summed in one fixed tree (every plan; a\n"
"                      parameter server's with --staleness 0; the data-\n"
"                      parallel ranks or the workers must divide V)\n"
"  --virtual-shards V  with --deterministic: a power of two dividing\n"
"                      --batch x --accumulate (implies --deterministic)\n"
"  --tp-chunks C       with --deterministic: what a tensor-parallel split\n"
"                      cuts, computed in C fixed chunks at any tp size (a\n"
"                      power of two the tp sizes divide; default 2)\n"
"  --print-hash        after training, print a SHA-256 of the parameters as\n"
"                      logical tensors: the same whatever plan held them\n"
"                      (with --deterministic, at any world size too), and\n"
"                      one of the figures (losses, accuracies) of the run\n"
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
    TRY(mg_parse_long(flag, optarg, lo, hi, &v));
    return v;
}

/* --staleness: 0 to 64 steps, or inf. */
static int staleness_flag(void)
{
    long v;
    if (!strcmp(optarg, "inf")) return MG_STALENESS_UNBOUNDED;
    if (mg_parse_long("--staleness", optarg, 0, 64, &v))
        die("--staleness %s: give the steps a worker may run ahead, 0 (synchronous) to 64, or "
            "inf (fully asynchronous)", optarg);
    return (int)v;
}

static float real_flag(const char *flag, double lo, double hi, int open)
{
    double v;
    TRY(mg_parse_double(flag, optarg, lo, hi, open, &v));
    return (float)v;
}

/* --betas B1,B2: torch.optim.Adam's pair, each in [0, 1), B2 above 0. */
static void betas_flag(mg_train_config *c)
{
    char b1[64];
    const char *comma = strchr(optarg, ',');
    double v[2];
    if (!comma || (size_t)(comma - optarg) >= sizeof b1)
        die("--betas %s: give two numbers as B1,B2 (e.g. 0.9,0.95)", optarg);
    snprintf(b1, sizeof b1, "%.*s", (int)(comma - optarg), optarg);
    TRY(mg_parse_double("--betas (B1)", b1, 0, 1, MG_OPEN_HI, &v[0]));
    TRY(mg_parse_double("--betas (B2)", comma + 1, 0, 1, MG_OPEN_LO | MG_OPEN_HI, &v[1]));
    c->beta1 = (float)v[0];
    c->beta2 = (float)v[1];
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
    TRY(mg_tunables_check());
}

/* The flags into o; what the model decides (batch, lr, ...) stays 0 (or
 * -1, NULL) until the model's defaults fill it. */
static void parse_args(int argc, char **argv, options *o)
{
    enum { O_MODEL = 256, O_DATA, O_EPOCHS, O_BATCH, O_LR, O_MOM, O_OPT, O_WD, O_BETAS,
           O_SCHED, O_SEED, O_THREADS, O_SAVE, O_RESUME, O_INIT, O_EVAL, O_LOG,
           O_QUIET, O_HELP, O_INIT_PREFIX, O_PARALLEL, O_WORKERS, O_BUCKET, O_ACCUM,
           O_COMPRESS, O_VERBOSE, O_VERSION, O_CLIP, O_STEPS, O_EVAL_EVERY, O_LAYERS,
           O_DIM, O_HEADS, O_CTX, O_SAMPLE, O_PROMPT, O_TEMP, O_TOPK, O_PARAMS,
           O_RECOMPUTE, O_PLAN, O_HASH, O_DET, O_SHARDS, O_TPCHUNKS, O_MESH, O_ZERO, O_OFFLOAD, O_SCHEDULE,
           O_MICRO, O_CHUNKS, O_SPLIT, O_DEVICE, O_TF32, O_BF16, O_INIT_PARTIAL,
           O_EVAL_WINDOWS, O_NO_EVAL_START, O_SEQ_PAR, O_PLAN_AUTO, O_PLAN_MEM, O_SLOW,
           O_SERVERS, O_STALENESS, O_ELASTIC };
    static const struct option lo[] = {
        {"model", 1, 0, O_MODEL}, {"data", 1, 0, O_DATA}, {"epochs", 1, 0, O_EPOCHS},
        {"batch", 1, 0, O_BATCH}, {"lr", 1, 0, O_LR}, {"momentum", 1, 0, O_MOM},
        {"optimizer", 1, 0, O_OPT}, {"weight-decay", 1, 0, O_WD},
        {"betas", 1, 0, O_BETAS},
        {"schedule", 1, 0, O_SCHED}, {"seed", 1, 0, O_SEED}, {"threads", 1, 0, O_THREADS},
        {"save", 1, 0, O_SAVE}, {"resume", 1, 0, O_RESUME}, {"init", 1, 0, O_INIT},
        {"init-prefix", 1, 0, O_INIT_PREFIX}, {"eval-only", 0, 0, O_EVAL}, {"log", 1, 0, O_LOG},
        {"quiet", 0, 0, O_QUIET}, {"help", 0, 0, O_HELP}, {"parallel", 1, 0, O_PARALLEL},
        {"workers", 1, 0, O_WORKERS}, {"bucket-mb", 1, 0, O_BUCKET},
        {"accumulate", 1, 0, O_ACCUM}, {"compress", 1, 0, O_COMPRESS},
        {"verbose", 0, 0, O_VERBOSE}, {"version", 0, 0, O_VERSION},
        {"clip-grad", 1, 0, O_CLIP}, {"steps", 1, 0, O_STEPS},
        {"eval-every", 1, 0, O_EVAL_EVERY}, {"layers", 1, 0, O_LAYERS}, {"dim", 1, 0, O_DIM},
        {"heads", 1, 0, O_HEADS}, {"ctx", 1, 0, O_CTX}, {"sample", 1, 0, O_SAMPLE},
        {"prompt", 1, 0, O_PROMPT}, {"temperature", 1, 0, O_TEMP}, {"top-k", 1, 0, O_TOPK},
        {"print-params", 0, 0, O_PARAMS}, {"recompute", 0, 0, O_RECOMPUTE},
        {"print-plan", 0, 0, O_PLAN}, {"print-hash", 0, 0, O_HASH},
        {"deterministic", 0, 0, O_DET}, {"virtual-shards", 1, 0, O_SHARDS},
        {"tp-chunks", 1, 0, O_TPCHUNKS}, {"mesh", 1, 0, O_MESH}, {"zero", 1, 0, O_ZERO},
        {"offload", 1, 0, O_OFFLOAD}, {"pp-schedule", 1, 0, O_SCHEDULE},
        {"micro-batches", 1, 0, O_MICRO}, {"chunks", 1, 0, O_CHUNKS}, {"split", 1, 0, O_SPLIT},
        {"device", 1, 0, O_DEVICE}, {"tf32", 0, 0, O_TF32}, {"bf16", 0, 0, O_BF16},
        {"init-partial", 0, 0, O_INIT_PARTIAL}, {"eval-windows", 1, 0, O_EVAL_WINDOWS},
        {"no-eval-on-start", 0, 0, O_NO_EVAL_START}, {"sequence-parallel", 0, 0, O_SEQ_PAR},
        {"plan", 1, 0, O_PLAN_AUTO}, {"plan-memory", 1, 0, O_PLAN_MEM},
        {"slow-rank", 1, 0, O_SLOW}, {"servers", 1, 0, O_SERVERS},
        {"staleness", 1, 0, O_STALENESS}, {"elastic", 0, 0, O_ELASTIC}, {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    mg_train_config *c = &o->c;
    *c = (mg_train_config){.model = "lenet-d2l", .gpt = mg_gpt_defaults(), .momentum = -1,
                           .weight_decay = -1, .clip_grad = -1, .schedule = "constant",
                           .workers = 2, .accumulate = 1, .bucket_mb = 25, .compress = "none"};
    o->parallel = "none";
    o->prompt = "\n";
    o->temperature = 0.8f;
    o->top_k = 200;
    int k;
    opterr = 0;
    while ((k = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (k) {
        case O_MODEL: c->model = optarg; break;
        case O_DATA: c->data = optarg; break;
        case O_EPOCHS: c->epochs = (int)int_flag("--epochs", 1, MAX_EPOCHS); break;
        case O_BATCH: c->batch = (int)int_flag("--batch", 1, 65536); break;
        case O_LR: c->lr = real_flag("--lr", 0, 1e6, MG_OPEN_LO); break;
        case O_MOM: c->momentum = real_flag("--momentum", 0, 1, MG_OPEN_HI); break;
        case O_OPT: c->optimizer = optarg; break;
        case O_WD: c->weight_decay = real_flag("--weight-decay", 0, 1e6, 0); break;
        case O_BETAS: betas_flag(c); break;
        case O_SCHED: c->schedule = optarg; break;
        case O_SEED: c->seed = (uint64_t)int_flag("--seed", 0, LONG_MAX); break;
        case O_THREADS: c->threads = (int)int_flag("--threads", 1, 1024); break;
        case O_SAVE: c->save = optarg; break;
        case O_RESUME: c->resume = optarg; break;
        case O_INIT: c->init = optarg; break;
        case O_INIT_PREFIX: c->init_prefix = optarg; break;
        case O_INIT_PARTIAL: c->init_partial = true; break;
        case O_EVAL: c->eval_only = true; break;
        case O_LOG: c->log = optarg; break;
        case O_QUIET: o->quiet = 1; break;
        case O_HELP:   /* under a launcher, rank 0 says it for the job */
            if (mg_launch_detect().rank <= 0) usage(stdout);
            exit(0);
        case O_PARALLEL: o->parallel = optarg; break;
        case O_WORKERS: c->workers = (int)int_flag("--workers", 1, 1024); break;
        case O_SERVERS: c->ps_servers = (int)int_flag("--servers", 1, 4096); break;
        case O_STALENESS: c->ps_staleness = staleness_flag(); break;
        case O_ELASTIC: c->elastic = true; break;
        case O_BUCKET: c->bucket_mb = real_flag("--bucket-mb", 0.001, 65536, 0); break;
        case O_ACCUM: c->accumulate = (int)int_flag("--accumulate", 1, 65536); break;
        case O_COMPRESS: c->compress = optarg; break;
        case O_VERBOSE: mg_set_verbose(true); break;
        case O_VERSION:
            if (mg_launch_detect().rank <= 0) mg_print_version("mgtrain");
            exit(0);
        case O_PARAMS: print_params(); exit(0);
        case O_RECOMPUTE: c->recompute = true; break;
        case O_SEQ_PAR: c->sequence_parallel = true; break;
        case O_PLAN: o->print_plan = 1; break;
        case O_HASH: o->print_hash = 1; break;
        case O_DET: if (!c->det_shards) c->det_shards = 8; break;
        case O_SHARDS: c->det_shards = (int)int_flag("--virtual-shards", 1, 1 << 20); break;
        case O_TPCHUNKS: c->det_chunks = (int)int_flag("--tp-chunks", 1, 64); break;
        case O_SCHEDULE: c->pp_schedule = optarg; break;
        case O_MICRO: c->micro_batches = (int)int_flag("--micro-batches", 1, 1 << 20); break;
        case O_CHUNKS: c->chunks = (int)int_flag("--chunks", 1, 64); break;
        case O_SPLIT: c->split = optarg; break;
        case O_DEVICE: c->device = optarg; break;
        case O_TF32: c->tf32 = true; break;
        case O_BF16: c->bf16 = true; break;
        case O_MESH: c->mesh = optarg; break;
        case O_PLAN_AUTO:
            if (strcmp(optarg, "auto")) die("--plan %s: the one plan it takes is auto", optarg);
            c->plan_auto = true;
            break;
        case O_PLAN_MEM: c->plan_memory = real_flag("--plan-memory", 0, 1e9, 1) * 1e6; break;
        case O_ZERO: c->zero = (int)int_flag("--zero", 1, 3); break;
        case O_OFFLOAD:
            if (!strncmp(optarg, "disk:", 5) && optarg[5]) c->offload_dir = optarg + 5;
            else if (!strcmp(optarg, "cpu")) c->offload_cpu = true;
            else die("--offload '%s': give disk:DIR (a directory for the offload files) or cpu",
                     optarg);
            break;
        case O_CLIP: c->clip_grad = real_flag("--clip-grad", 0, 1e6, 0); break;
        case O_SLOW: {
            char *end;
            long r = strtol(optarg, &end, 10);
            double f = *end == ':' ? strtod(end + 1, &end) : 0;
            if (*end || end == optarg || r < 0 || r > 1 << 20 || !(f > 1) || f > 1000)
                die("--slow-rank '%s': give RANK:FACTOR, a rank and a factor above 1 (at most "
                    "1000), e.g. 1:3", optarg);
            c->slow_rank = (int)r;
            c->slow_factor = (float)f;
            break;
        }
        case O_STEPS: c->steps = int_flag("--steps", 1, MAX_STEPS); break;
        case O_EVAL_EVERY: c->eval_every = (int)int_flag("--eval-every", 1, 1000000000); break;
        case O_EVAL_WINDOWS: c->eval_windows = (int)int_flag("--eval-windows", 1, 512); break;
        case O_NO_EVAL_START: c->no_eval_on_start = true; break;
        case O_LAYERS: c->gpt.layers = (int)int_flag("--layers", 1, 256); o->have_arch = 1; break;
        case O_DIM: c->gpt.dim = (int)int_flag("--dim", 1, 16384); o->have_arch = 1; break;
        case O_HEADS: c->gpt.heads = (int)int_flag("--heads", 1, 256); o->have_arch = 1; break;
        case O_CTX: c->gpt.ctx = (int)int_flag("--ctx", 2, 16384); o->have_arch = 1; break;
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
    if (mg_strategy_parse(o->parallel, &c->strategy)) die("--parallel: %s", mg_last_error());
}

/* The model's defaults where no flag was given; flags that do not apply to
 * the model. */
static void model_defaults(options *o)
{
    mg_train_config *c = &o->c, d;
    TRY(mg_train_config_defaults(c->model, &d));
    if (d.text && c->epochs)
        die("--epochs: %s trains by steps; give --steps N (default %ld)", c->model, d.steps);
    if (!d.text && (c->steps || c->eval_every || o->have_arch || o->sample ||
                    o->have_sample_opts || c->eval_windows || c->no_eval_on_start))
        die("--steps, --eval-every, --eval-windows, --no-eval-on-start, --layers, --dim, "
            "--heads, --ctx and --sample apply to gpt-mini; %s trains by --epochs", c->model);
    c->text = d.text;
    c->normalized_input = d.normalized_input;
    if (!c->batch) c->batch = d.batch;
    if (!c->lr) c->lr = d.lr;
    if (c->momentum < 0) c->momentum = d.momentum;
    if (!c->epochs) c->epochs = d.epochs;
    if (!c->steps) c->steps = d.steps;
    if (!c->eval_every) c->eval_every = d.eval_every;
    if (!c->optimizer) c->optimizer = d.optimizer;
    if (o->sample && !*o->prompt)
        die("--prompt is empty: the sample continues a prompt of at least one byte (default: "
            "a newline)");
}

/* A prompt as a setting the ranks share: its first bytes (';', '=' and
 * unprintable ones as \xNN), and for a longer one its length and CRC. */
static void prompt_setting(const char *p, char *out, size_t cap)
{
    size_t n = strlen(p), k = 0;
    for (size_t i = 0; i < n && i < 40 && k + 5 < cap; i++) {
        unsigned char ch = (unsigned char)p[i];
        k += (size_t)(ch >= 32 && ch < 127 && ch != ';' && ch != '=' && ch != '\\'
                          ? snprintf(out + k, cap - k, "%c", ch)
                          : snprintf(out + k, cap - k, "\\x%02x", ch));
    }
    out[k] = 0;
    if (n > 40) snprintf(out + k, cap - k, "... (%zu bytes, CRC %08x)", n, mg_crc32(p, n));
}

/* ---- printing ---------------------------------------------------------------- */

/* Rank 0 of the job (of those that remain, in an elastic one) prints,
 * unless --quiet. */
static bool speaks(const options *o)
{
    mg_group *job = mg_trainer_group(o->t);
    return !o->quiet && (!job || mg_group_rank(job) == 0);
}

/* "LABEL [====>   ] 42% RATE UNIT/s loss X ETA Ns" on a terminal. */
static void print_progress(const mg_train_progress *p, void *ud)
{
    options *o = ud;
    static double last;
    if (!o->tty || !speaks(o)) return;
    double now = mg_now();
    if (now - last < 0.1 && p->done < p->total) return;
    last = now;
    double el = now - p->started, ips = el > 0 ? p->done / el : 0;
    double eta = ips > 0 ? (p->total - p->done) / ips : 0;
    int width = 30, fill = (int)(width * p->done / (p->total ? p->total : 1));
    char bar[64], label[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    bar[width] = 0;
    if (o->c.text) snprintf(label, sizeof label, "step %ld/%ld", p->step, p->steps);
    else snprintf(label, sizeof label, "epoch %d/%d", p->epoch + 1, p->epochs);
    fprintf(stderr, "\r%s [%s] %3d%% %7.0f %s/s  loss %.4f  ETA %3.0fs ", label, bar,
            (int)(100 * p->done / (p->total ? p->total : 1)), ips * p->per_item, p->unit,
            p->loss, eta);
    fflush(stderr);
}

/* A row of figures: after an epoch, or a language model's evaluation. */
static void print_row(const mg_train_row *r, void *ud)
{
    options *o = ud;
    if (!speaks(o)) return;
    if (o->tty) fprintf(stderr, "\r%100s\r", "");
    if (!o->c.text)
        printf("epoch %2ld/%d  loss %.4f  train acc %5.2f%%  test acc %5.2f%%  %6.2f s  %8.0f "
               "img/s\n", r->epoch, o->c.epochs, r->train_loss, 100 * r->train_acc,
               100 * r->test_acc, r->seconds, r->per_s);
    else if (r->step == 0)
        printf("step %5d/%ld  val loss %.4f  ppl %7.2f\n", 0, o->c.steps, r->val_loss, r->val_ppl);
    else
        printf("step %5ld/%ld  loss %.4f  val loss %.4f  ppl %7.2f  %7.2f s  %8.0f tok/s\n",
               r->step, o->c.steps, r->train_loss, r->val_loss, r->val_ppl, r->seconds, r->per_s);
    fflush(stdout);
}

/* The first line: the model, the batch and how the job splits it. */
static void print_header(const options *o)
{
    const mg_train_config *c = mg_trainer_config(o->t);
    mg_trainer_info in = mg_trainer_get_info(o->t);
    mg_strategy *s = mg_trainer_strategy(o->t);
    mg_model *m = mg_trainer_model(o->t);
    if (c->text)
        printf("mgtrain: %s (%d layers, dim %d, %d heads, context %d), ", c->model,
               c->gpt.layers, c->gpt.dim, c->gpt.heads, c->gpt.ctx);
    else
        printf("mgtrain: %s, ", c->model);
    size_t logical = 0;
    for (int i = 0; i < mg_model_num_tensors(m); i++)
        if (!mg_model_tensor(m, i)->is_buffer) logical += mg_model_tensor(m, i)->gnumel;
    printf("%zu parameters", logical);
    if (in.tp.size > 1)
        printf(" (%zu on each of %d tensor-parallel ranks)", mg_model_num_params(m), in.tp.size);
    printf(", batch %d", c->batch);
    if (in.distributed && in.pp == 1 && in.tp.size > 1) {
        char mesh[64];
        mg_mesh_describe(mg_strategy_mesh(s), mesh, sizeof mesh);
        printf(" (%d per data-parallel rank, mesh %s, %s)", in.local, mesh, mg_strategy_name(s));
    } else if (c->strategy == MG_STRATEGY_PS) {
        printf(" (%d per worker on %d workers; %d parameter server%s, ", in.local, in.dp_size,
               c->ps_servers, c->ps_servers > 1 ? "s" : "");
        if (c->ps_staleness == MG_STALENESS_UNBOUNDED) printf("fully asynchronous)");
        else if (c->ps_staleness) printf("staleness at most %d)", c->ps_staleness);
        else printf("synchronous)");
    } else if (in.distributed && in.pp == 1 && c->det_shards) {   /* local: a shard's rows */
        printf(" (%d per rank on %d ranks, in %d virtual shards of %d, %s)", c->batch / in.dp_size,
               in.world, c->det_shards, in.local, mg_strategy_name(s));
    } else if (in.distributed && in.pp == 1) {
        printf(" (%d per rank on %d ranks, %s)", in.local, in.world, mg_strategy_name(s));
    } else if (in.distributed) {
        char mesh[64];
        mg_mesh_describe(mg_strategy_mesh(s), mesh, sizeof mesh);
        printf(" x %d micro-batches (%d per replica; a pipeline of %d stages, %s, mesh %s, %s)",
               c->micro_batches, in.local, in.pp * c->chunks,
               c->pp_schedule ? c->pp_schedule : "1f1b", mesh, mg_strategy_name(s));
    }
    if (mg_strategy_kind_traits(c->strategy).threads)
        printf(" (%d DataParallel workers)", c->workers);
    if (c->accumulate > 1 && in.pp == 1) printf(" x %d accumulated", c->accumulate);
    if (c->text)
        printf(", %s lr %g, %ld steps; %zu bytes of text (%zu train)\n", c->optimizer, c->lr,
               c->steps, in.text_bytes, in.text_train_bytes);
    else
        printf(", %s lr %g, %d epochs\n", c->optimizer, c->lr, c->epochs);
    if (c->slow_factor > 0)
        printf("mgtrain: rank %d is a straggler on purpose: its forwards and backwards take "
               "%gx as long (--slow-rank)\n", c->slow_rank, c->slow_factor);
    mg_pipe *p = mg_strategy_pipe(s);
    if (!p) return;
    int S;
    const int *first = mg_pipe_cut(p, &S);
    printf("pipeline cut:");
    for (int k = 0; k < S; k++)
        printf("%s stage %d on rank %d = %s .. %s", k ? "," : "", k, k % in.pp,
               mg_model_unit(m, first[k]).name, mg_model_unit(m, first[k + 1] - 1).name);
    printf("\n");
}

/* --sample bytes after --prompt through the strategy (collective: ZeRO-3
 * gathers the parameters, a pipeline runs each token through its stages);
 * rank 0 prints them. */
static void print_sample(const options *o)
{
    if (!o->sample) return;
    int np = (int)strlen(o->prompt);
    int32_t *tok = malloc(sizeof *tok * (size_t)(np + o->sample));
    if (!tok) die("out of memory for a sample of %d bytes", o->sample);
    for (int i = 0; i < np; i++) tok[i] = (unsigned char)o->prompt[i];
    if (mg_strategy_generate(mg_trainer_strategy(o->t), tok, np, o->sample, o->temperature,
                             o->top_k, o->c.seed, tok + np))
        die("--sample: %s", mg_last_error());
    if (mg_trainer_get_info(o->t).rank == 0) {
        printf("sample (%d bytes, temperature %g, top-k %d):\n%s", o->sample, o->temperature,
               o->top_k, o->prompt);
        for (int i = 0; i < o->sample; i++) putchar(tok[np + i]);
        putchar('\n');
        fflush(stdout);
    }
    free(tok);
}

/* What the trainer found before training: a restart, the device, notes. */
static void print_start(const options *o)
{
    const mg_train_config *c = &o->c;
    mg_trainer_info in = mg_trainer_get_info(o->t);
    if (in.restarted && in.rank == 0)
        fprintf(stderr, "%s: restarted: resuming from %s\n", prog, c->save);
    if (*in.collectives && speaks(o)) printf("collectives on GPU memory: %s\n", in.collectives);
    if (*in.plan && in.rank == 0 && speaks(o)) printf("plan auto: %s\n", in.plan);
    mg_device dev = mg_model_device(mg_trainer_model(o->t));
    if (dev.kind != MG_DEVICE_CPU && speaks(o)) {
        char name[128], d[16];
        size_t mem;
        mg_device_format(dev, d, sizeof d);
        TRY(mg_device_describe(dev, name, sizeof name, &mem));
        printf("device: %s (%s)%s\n", d, name,
               c->offload_cpu ? "; the optimizer's state in host memory (--offload cpu)" : "");
    }
    if (c->offload_cpu && dev.kind == MG_DEVICE_CPU && in.rank == 0)
        fprintf(stderr, "%s: --offload cpu: on the CPU the state already lives in host memory, "
                "so nothing moves (disk:DIR moves it to files)\n", prog);
    if (in.init_left && speaks(o))
        fprintf(stderr, "%s: --init-partial: left out %d tensor(s) of %s that %s has no place "
                "for\n", prog, in.init_left, c->init, c->model);
}

/* --print-hash: the parameters' SHA-256 (collective), rank 0 prints it,
 * --quiet or not; after training, the figures' too. */
static void print_hash(const options *o, bool trained)
{
    if (!o->print_hash) return;
    uint8_t d[2][32];
    TRY(mg_strategy_param_hash(mg_trainer_strategy(o->t), d[0]));
    if (trained) TRY(mg_trainer_figures_hash(o->t, d[1]));
    mg_group *job = mg_trainer_group(o->t);
    if (job && mg_group_rank(job) != 0) return;
    for (int k = 0; k < 1 + trained; k++) {
        printf("%s sha256 ", k ? "figures" : "parameters");
        for (int i = 0; i < 32; i++) printf("%02x", d[k][i]);
        printf("\n");
    }
    fflush(stdout);
}

/* Training (or evaluation alone), then the summary. */
static void train(options *o)
{
    const mg_train_config *c = mg_trainer_config(o->t);
    mg_trainer_info in = mg_trainer_get_info(o->t);
    mg_train_row r = {0};
    if (c->eval_only) {
        TRY(mg_trainer_evaluate(o->t, &r));
        if (in.rank == 0 && c->text)
            printf("%s: validation loss %.4f, perplexity %.2f (%d windows of %d bytes)\n",
                   c->model, r.val_loss, r.val_ppl, in.val_windows, c->gpt.ctx);
        else if (in.rank == 0)
            printf("%s: test loss %.4f, test accuracy %.2f%% (%ld images)\n", c->model,
                   r.test_loss, 100 * r.test_acc, in.test_samples);
        print_hash(o, false);
        print_sample(o);
        return;
    }
    long at = c->text ? in.start_step : in.start_epoch, end = c->text ? c->steps : c->epochs;
    if (at >= end) {
        if (in.rank == 0)
            fprintf(stderr, "%s: %s already covers %ld %s(s); %s\n", prog, c->resume, at,
                    c->text ? "step" : "epoch",
                    at >= (c->text ? MAX_STEPS : MAX_EPOCHS)
                        ? c->text ? "--steps goes up to 1000000000, so there is nothing left "
                                    "to train" : "--epochs goes up to 1000000, so there is "
                                    "nothing left to train"
                        : c->text ? "raise --steps to train more" : "raise --epochs to train more");
        print_hash(o, false);
        print_sample(o);
        return;
    }
    if (speaks(o)) print_header(o);
    mg_train_summary s;
    mg_status st = mg_trainer_run(o->t, &s);
    if (st == MG_ELEFT) {   /* an elastic job went on without this worker: mgrun's "lost" */
        mg_eprintf(prog, "%s", mg_last_error());
        exit(MG_EXIT_LEFT);
    }
    TRY(st);
    in = mg_trainer_get_info(o->t);   /* an elastic job's rank 0 may be another now */
    if (in.rank == 0 && c->text)
        printf("final: validation loss %.4f, perplexity %.2f, %.1f s training, %.0f tokens/s "
               "(%.0f after the first step), peak memory %.0f MB\n", s.last.val_loss,
               s.last.val_ppl, s.seconds, s.per_s, s.steady_per_s, mg_peak_rss() / 1e6);
    else if (in.rank == 0)
        printf("final: test accuracy %.2f%%, test loss %.4f, %.1f s training, %.0f images/s "
               "(%.0f after the first step), peak memory %.0f MB\n", 100 * s.last.test_acc,
               s.last.test_loss, s.seconds, s.per_s, s.steady_per_s, mg_peak_rss() / 1e6);
    mg_trainer_print_counters(o->t, prog, stderr);
    print_hash(o, true);
    print_sample(o);
}

int main(int argc, char **argv)
{
    options o;
    parse_args(argc, argv, &o);
    TRY(mg_tunables_check());
    mg_kernels();   /* the GEMM kernel check sets the environment: before any thread starts */
    model_defaults(&o);
    /* The tool's own settings the ranks must share. */
    char prompt[300], settings[512];
    prompt_setting(o.prompt, prompt, sizeof prompt);
    snprintf(settings, sizeof settings, "sample=%d;prompt=%s;temperature=%g;top_k=%d;"
             "print_plan=%d;print_hash=%d", o.sample, prompt, o.temperature, o.top_k,
             o.print_plan, o.print_hash);
    o.c.settings = settings;
    o.c.plan_only = o.print_plan;
    o.c.on_progress = print_progress;
    o.c.on_row = print_row;
    o.c.ud = &o;
    o.tty = isatty(2);
    TRY(mg_train_config_check(&o.c));
    parsing = false;   /* the trainer agrees its own mistakes (MG_ESTOPPED) */
    TRY(mg_trainer_create(&o.c, &o.t));
    o.c = *mg_trainer_config(o.t);   /* resolved: a pipeline's micro-batches */
    print_start(&o);
    if (o.print_plan) TRY(mg_trainer_print_plan(o.t, stdout));
    else train(&o);
    mg_trainer_destroy(o.t);
    return 0;
}
