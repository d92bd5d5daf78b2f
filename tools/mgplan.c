/* mgplan — which plan to train a model with: every mesh (dp, pp, tp), ZeRO
 * stage, pipeline schedule and micro-batch count, recomputation, sequence
 * parallelism and offload to files on a cluster of ranks, with each plan's memory per
 * rank and time per step (planner.h), ranked among those that fit; the
 * recommendation with the constraint that decided it, and its mgtrain
 * command line.
 *
 * The cluster is this machine (its cores; a rank's FLOP/s and optimizer
 * rate measured on the model; the builtin backend's shared-memory link
 * within the node and TCP's between nodes; the offload files' rate in
 * the offload directory) unless flags describe another: --flops,
 * --mem-bw, --disk-bw and the links' --intra-... and --inter-... figures,
 * for shapes and clusters that do not exist here.
 *
 * Bad input (unknown model, a number out of range, nothing that fits, a
 * world size no mesh divides the batch by) gives one line saying what is
 * wrong and what would do, and exit status 2. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "multigrad/multigrad.h"

static const char *prog = "mgplan";

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    mg_launch_defer_to_rank_0();   /* run by mgrun, every rank finds the same */
    va_start(ap, fmt);
    mg_veprintf(prog, fmt, ap);
    va_end(ap);
    exit(2);
}

#define TRY(call) do { if (call) die("%s", mg_last_error()); } while (0)

static void usage(FILE *f)
{
    fprintf(f,
"usage: mgplan --model NAME -n RANKS [options]\n"
"Rank every plan that trains the model on the ranks by its time per step\n"
"among those that fit in --memory, recommend one and print its mgtrain\n"
"command line.\n"
"  --model NAME        a zoo model (mlp, lenet-d2l, lenet5, gpt-mini)\n"
"  --layers N --dim D --heads H --ctx T --vocab V\n"
"                      gpt-mini's sizes (default 4, 128, 4, 128, 256; vocab\n"
"                      other than 256 is for simulation: mgtrain's text is bytes)\n"
"  --batch B           samples per optimizer step, all ranks (default: the\n"
"                      model's)\n"
"  --optimizer O       sgd | adam | adamw (default: the model's)\n"
"  -n N                ranks, all on this node (as mgrun -n N)\n"
"  --ranks-per-node R --nodes K\n"
"                      a cluster of K nodes of R ranks each\n"
"  --memory SIZE       what a rank may hold, e.g. 900M, 2G, 80G (default: no\n"
"                      limit)\n"
"  --cores C           cores per node (default: this machine's when the\n"
"                      rates are measured, else one per rank)\n"
"  --flops X           a rank's sustained FLOP/s on the training step, e.g.\n"
"                      2.5e10 or 300e12 (default: measured on this machine)\n"
"  --mem-bw X          a rank's memory rate in bytes/s: its optimizer pass and the\n"
"                      collectives' sums (default: measured)\n"
"  --intra-bw GBPS --intra-latency US\n"
"                      the link within a node in GB/s and microseconds\n"
"                      (default: measured with mgbench's all-reduce on this\n"
"                      host's ranks when the rates are, else the shared-memory\n"
"                      transport's, 6 and 2)\n"
"  --inter-bw GBITS --inter-latency US\n"
"                      between nodes in Gb/s and microseconds (default:\n"
"                      measured through TCP on this host when the rates are,\n"
"                      else TCP's, 9.6 and 25)\n"
"  --overlap F         the share of backward that hides collectives, 0-1\n"
"                      (default: 1 with --flops, else what cores beyond the\n"
"                      ranks leave: min(1, cores/ranks - 1))\n"
"  --offload disk:DIR  where offloaded state would go: its rate is measured\n"
"                      there and the command line names it (default\n"
"                      /var/tmp); offload is tried for the plans that do not\n"
"                      fit without it\n"
"  --disk-bw GBPS      a rank's offload files' rate in GB/s, read and written\n"
"                      (default: measured when the rates are; with --flops,\n"
"                      offload is searched only when this is given)\n"
"  --mesh SPEC --zero K --pp-schedule S\n"
"                      only plans of this mesh (mgtrain's syntax, e.g. dp=2,pp=2),\n"
"                      ZeRO stage (0: none) or pipeline schedule\n"
"  --no-zero --no-pipeline --no-tp --no-recompute --no-sequence-parallel\n"
"  --no-offload\n"
"                      leave those out of the search\n"
"  --top K             print the K best plans (default 10; 0: all)\n"
"  --verify            run the best plans (--verify-top, default 3), the rules of\n"
"                      thumb's and plain data parallelism's through mgrun and\n"
"                      mgtrain for --verify-steps steps (default 10) on this\n"
"                      machine and print predicted against measured step time\n"
"                      (after the first step; the whole run's beside it) and\n"
"                      memory (gpt-mini; this machine's cluster only)\n"
"  --verify-runs R     run each plan R times, the median counts (default 1)\n"
"  --flags             print only the recommended command line\n"
"  --probe, --probe-links\n"
"                      (run by mgplan under mgrun) measure the rates and the\n"
"                      link with this job's ranks at once, or the link only\n"
"  --version           version, CPU and kernels of this machine\n"
"  --help              this text\n");
}

static double num(const char *flag, double lo, double hi)
{
    double v;
    TRY(mg_parse_double(flag, optarg, lo, hi, 0, &v));
    return v;
}

static int inum(const char *flag, long lo, long hi)
{
    long v;
    TRY(mg_parse_long(flag, optarg, lo, hi, &v));
    return (int)v;
}

/* "900M", "2G", "2.5GB", "1500000000": bytes (decimal units). */
static double size_arg(const char *flag)
{
    char num_part[64];
    size_t n = strlen(optarg);
    double mult = 1;
    snprintf(num_part, sizeof num_part, "%s", optarg);
    if (n && (num_part[n - 1] == 'B' || num_part[n - 1] == 'b')) num_part[--n] = 0;
    if (n) {
        char u = num_part[n - 1];
        mult = u == 'K' || u == 'k' ? 1e3 : u == 'M' || u == 'm' ? 1e6 : u == 'G' || u == 'g' ? 1e9
               : u == 'T' || u == 't' ? 1e12 : 1;
        if (mult > 1) num_part[--n] = 0;
    }
    double v;
    if (mg_parse_double(flag, num_part, 0, 1e18, MG_OPEN_LO, &v))
        die("%s %s is not a size above 0: give bytes with K, M, G or T, e.g. 900M or 2G", flag,
            optarg);
    return v * mult;
}

enum { O_LAYERS = 256, O_DIM, O_HEADS, O_CTX, O_VOCAB, O_BATCH, O_OPT, O_RPN, O_NODES, O_MEM,
       O_CORES, O_FLOPS, O_MEMBW, O_IBW, O_ILAT, O_XBW, O_XLAT, O_OVERLAP, O_NOZERO, O_NOPP,
       O_NOTP, O_NORC, O_NOSP, O_TOP, O_FLAGS, O_MODEL, O_VERIFY, O_VTOP, O_VSTEPS, O_MESH, O_ZERO,
       O_SCHED, O_PROBE, O_PROBE_LINKS, O_NOOFF, O_OFFLOAD, O_DISKBW, O_VRUNS, O_VERSION };

static void print_table(const mg_plan *all, int n, int top)
{
    printf("%3s %-15s %-5s %-11s %4s %5s %3s %3s %3s %8s %8s %8s %8s %9s %9s %8s %7s %7s %7s "
           "%8s %7s %7s\n", "#", "mesh", "zero", "schedule", "M", "local", "rc", "sp", "off",
           "params", "grads", "optim", "activ", "total MB", "step ms", "compute", "bubble", "tp",
           "pp", "dp (exp)", "optim", "files");
    for (int i = 0; i < n && (top <= 0 || i < top); i++) {
        const mg_plan *p = &all[i];
        char mesh[48], zero[8];
        snprintf(mesh, sizeof mesh, "dp=%d,pp=%d,tp=%d", p->dp, p->pp, p->tp);
        snprintf(zero, sizeof zero, p->zero ? "%d" : "-", p->zero);
        printf("%3d %-15s %-5s %-11s %4d %5d %3s %3s %3s %8.1f %8.1f %8.1f %8.1f %9.1f%s %9.2f "
               "%8.2f %7.2f %7.2f %7.2f %8.2f %7.2f %7.2f\n", i + 1, mesh, zero,
               p->pp > 1 ? mg_pipe_name(p->schedule) : p->micro > 1 ? "accumulate" : "-",
               p->micro, p->local, p->recompute ? "y" : "-", p->sequence_parallel ? "y" : "-",
               p->offload ? "y" : "-", p->memory.params / 1e6, p->memory.grads / 1e6,
               p->memory.optim / 1e6, p->memory.activations / 1e6, p->bytes / 1e6,
               p->fits ? " " : "!", p->step * 1e3, p->compute * 1e3, p->bubble * 1e3,
               p->tp_comm * 1e3, p->pp_comm * 1e3, p->dp_exposed * 1e3, p->optimizer * 1e3,
               p->offload_io * 1e3);
    }
}

/* The directory mgplan runs from, where mgrun, mgtrain and mgbench are. */
static void tool_dir(char *dir, size_t cap)
{
    ssize_t len = readlink("/proc/self/exe", dir, cap - 1);
    dir[len > 0 ? len : 0] = 0;
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
}

/* --probe, run by mgrun from measure(): every rank measures its copy of
 * the model at once and the job's link (mg_plan_measure_job); rank 0
 * prints the measured cluster on one line, its bytes in hex (the reader
 * is this same program). --probe-links: the link only, as the cluster's
 * intra. */
static int probe(const mg_plan_job *job, int nodes, bool links_only)
{
    mg_group *g;
    TRY(mg_group_init(NULL, &g));
    mg_plan_cluster cl = mg_plan_cluster_here(mg_group_size(g), links_only ? 1 : nodes, 0, 1);
    mg_status st = links_only ? mg_plan_measure_links(g, &cl)
                              : mg_plan_measure_job(g, job, &cl);
    if (!st && mg_group_rank(g) == 0) {
        const unsigned char *b = (const unsigned char *)&cl;
        printf("probe: ");
        for (size_t i = 0; i < sizeof cl; i++) printf("%02x", b[i]);
        printf("\n");
    }
    mg_group_destroy(g);
    if (st) die("%s", mg_last_error());
    return 0;
}

/* Runs this tool's probe under mgrun on `ranks` ranks of this host
 * (through TCP: as between nodes) with the given arguments; the cluster
 * it measured into *out. False when it gives none, with the probe's
 * first error line in err. */
static bool measure(int ranks, bool tcp, const char *args, mg_plan_cluster *out, char *err,
                    size_t cap)
{
    char dir[4096], cmd[16384];
    static char line[1 << 16];
    tool_dir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "%s'%s/mgrun' -n %d '%s/mgplan' %s 2>&1",
             tcp ? "MG_TRANSPORT=tcp " : "", dir, ranks, dir, args);
    FILE *f = popen(cmd, "r");
    bool got = false;
    *err = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "probe: ", 7)) {
            if (!*err && strstr(line, "mgplan: ")) {
                line[strcspn(line, "\n")] = 0;
                snprintf(err, cap, ": %.400s", strstr(line, "mgplan: ") + 8);
            }
            continue;
        }
        unsigned char *b = (unsigned char *)out;
        size_t i = 0;
        for (unsigned x; i < sizeof *out && sscanf(line + 7 + 2 * i, "%2x", &x) == 1; i++)
            b[i] = (unsigned char)x;
        got = i == sizeof *out;
    }
    if (f && pclose(f)) got = false;
    return got;
}

/* ---- --verify ------------------------------------------------------------ */

typedef struct {
    double step_s, first_s, wall_s; /* a step after the first, one with the first (from
                                       tokens/s), the whole run */
    double state, activations, rss; /* the largest rank's MB */
    int ranks;
} measured;

/* Runs the plan's command for `steps` steps, its ranks printing their
 * counters; false (with the output's last line) when it fails. */
static bool run_plan(const mg_plan_job *job, const mg_plan *p, int steps, measured *m,
                     char *err, size_t cap)
{
    char dir[4096], flags[1024], cmd[6144];
    tool_dir(dir, sizeof dir);
    mg_plan_flags(job, p, flags, sizeof flags);
    const char *rest = strstr(flags, "mgtrain ") + strlen("mgtrain ");
    int world = p->dp * p->pp * p->tp;
    int at = world > 1 ? snprintf(cmd, sizeof cmd, "'%s/mgrun' -n %d ", dir, world) : 0;
    snprintf(cmd + at, sizeof cmd - (size_t)at, "'%s/mgtrain' %s --steps %d --eval-every %d "
             "--no-eval-on-start --eval-windows 1 --quiet --verbose 2>&1", dir, rest, steps, steps);
    memset(m, 0, sizeof *m);
    double t0 = mg_now();
    FILE *f = popen(cmd, "r");
    if (!f) {
        snprintf(err, cap, "cannot run mgrun and mgtrain from %.300s", dir);
        return false;
    }
    char line[2048], last[2048] = "";
    double per_s = 0, steady = 0;
    while (fgets(line, sizeof line, f)) {
        double a, b, c, d, r;
        const char *pk = strstr(line, ": peak MB parameters");
        if (pk && sscanf(pk, ": peak MB parameters %lf gradients %lf optimizer %lf activations %lf",
                         &a, &b, &c, &d) == 4) {
            m->ranks++;
            if (a + b + c > m->state) m->state = a + b + c;
            if (d > m->activations) m->activations = d;
            const char *rs = strstr(line, "peak RSS ");
            if (rs && sscanf(rs, "peak RSS %lf", &r) == 1 && r > m->rss) m->rss = r;
        }
        const char *tk = strstr(line, " s training, ");
        if (!strncmp(line, "final:", 6) && tk)
            sscanf(tk, " s training, %lf tokens/s (%lf after", &per_s, &steady);
        if (*line != '\n') snprintf(last, sizeof last, "%s", line);
    }
    int st = pclose(f);
    m->wall_s = mg_now() - t0;
    if (st || per_s <= 0 || m->ranks != world) {
        last[strcspn(last, "\n")] = 0;
        snprintf(err, cap, "%.400s", *last ? last : "no figures");
        return false;
    }
    m->first_s = (double)job->batch * job->gpt.ctx / per_s;
    m->step_s = steady > 0 ? (double)job->batch * job->gpt.ctx / steady : m->first_s;
    return true;
}

static int by_step(const void *a, const void *b)
{
    double x = ((const measured *)a)->step_s, y = ((const measured *)b)->step_s;
    return x < y ? -1 : x > y;
}

/* The best `top` plans, the rules of thumb's and the fastest plain data
 * parallelism that fits, run `runs` times each (the median counts);
 * predicted against measured. */
static void verify_plans(const mg_plan_job *job, const mg_plan_cluster *cl, const mg_plan *all,
                         int n, int top, int steps, int runs)
{
    int pick[128], np = 0, rule = mg_plan_rule_of_thumb(all, n, cl), plain = -1;
    for (int i = 0; i < n && plain < 0; i++)
        if (all[i].fits && mg_plan_is_plain(&all[i])) plain = i;
    for (int i = 0; i < n && np < top; i++)
        if (all[i].fits) pick[np++] = i;
    int extra[2] = {rule, plain};
    for (int k = 0; k < 2; k++) {
        bool have = extra[k] < 0;
        for (int i = 0; i < np; i++) have |= pick[i] == extra[k];
        if (!have) pick[np++] = extra[k];
    }
    printf("\nverify: %d steps of each on this machine (%s, %d cores)%s, predicted against "
           "measured (a step after the first; with the first: the whole run's rate); state: "
           "parameters, gradients and optimizer of the largest rank\n", steps,
           mg_cpu()->model, cl->cores, runs > 1 ? ", the median of the runs" : "");
    printf("%3s %-44s %9s %9s %6s %9s %9s %9s %6s %9s %9s %8s %8s\n", "#", "plan", "step ms",
           "measured", "ratio", "with 1st", "state MB", "measured", "ratio", "activ MB",
           "measured", "RSS MB", "whole s");
    for (int k = 0; k < np; k++) {
        const mg_plan *p = &all[pick[k]];
        char name[160], err[512];
        mg_plan_describe(p, name, sizeof name - 8);
        if (pick[k] == rule) strcat(name, " (rule)");
        fflush(stdout);
        measured m, r[16];
        double state = (p->memory.params + p->memory.grads + p->memory.optim) / 1e6;
        bool ok = true;
        for (int i = 0; i < runs && ok; i++) ok = run_plan(job, p, steps, &r[i], err, sizeof err);
        if (!ok) {
            printf("%3d %-44s %9.1f failed: %s\n", pick[k] + 1, name, p->step * 1e3, err);
            continue;
        }
        qsort(r, (size_t)runs, sizeof *r, by_step);
        m = r[runs / 2];
        printf("%3d %-44s %9.1f %9.1f %6.2f %9.1f %9.1f %9.1f %6.2f %9.1f %9.1f %8.1f %8.1f\n",
               pick[k] + 1, name, p->step * 1e3, m.step_s * 1e3, m.step_s / p->step,
               m.first_s * 1e3, state, m.state, m.state / state, p->memory.activations / 1e6,
               m.activations, m.rss, m.wall_s);
    }
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL}, {"layers", required_argument, 0, O_LAYERS},
        {"dim", required_argument, 0, O_DIM}, {"heads", required_argument, 0, O_HEADS},
        {"ctx", required_argument, 0, O_CTX}, {"vocab", required_argument, 0, O_VOCAB},
        {"batch", required_argument, 0, O_BATCH}, {"optimizer", required_argument, 0, O_OPT},
        {"ranks-per-node", required_argument, 0, O_RPN},
        {"nodes", required_argument, 0, O_NODES}, {"memory", required_argument, 0, O_MEM},
        {"cores", required_argument, 0, O_CORES}, {"flops", required_argument, 0, O_FLOPS},
        {"mem-bw", required_argument, 0, O_MEMBW}, {"intra-bw", required_argument, 0, O_IBW},
        {"intra-latency", required_argument, 0, O_ILAT},
        {"inter-bw", required_argument, 0, O_XBW},
        {"inter-latency", required_argument, 0, O_XLAT},
        {"overlap", required_argument, 0, O_OVERLAP}, {"no-zero", no_argument, 0, O_NOZERO},
        {"no-pipeline", no_argument, 0, O_NOPP}, {"no-tp", no_argument, 0, O_NOTP},
        {"no-recompute", no_argument, 0, O_NORC},
        {"no-sequence-parallel", no_argument, 0, O_NOSP}, {"top", required_argument, 0, O_TOP},
        {"flags", no_argument, 0, O_FLAGS}, {"verify", no_argument, 0, O_VERIFY},
        {"verify-top", required_argument, 0, O_VTOP},
        {"verify-steps", required_argument, 0, O_VSTEPS}, {"mesh", required_argument, 0, O_MESH},
        {"verify-runs", required_argument, 0, O_VRUNS},
        {"zero", required_argument, 0, O_ZERO}, {"pp-schedule", required_argument, 0, O_SCHED},
        {"probe", no_argument, 0, O_PROBE}, {"probe-links", no_argument, 0, O_PROBE_LINKS},
        {"no-offload", no_argument, 0, O_NOOFF}, {"offload", required_argument, 0, O_OFFLOAD},
        {"disk-bw", required_argument, 0, O_DISKBW},
        {"help", no_argument, 0, 'h'}, {"version", no_argument, 0, O_VERSION},
        {0, 0, 0, 0}};
    const char *model = NULL;
    mg_gpt_config gpt = mg_gpt_defaults();
    int batch = 0, top = 10, flags_only = 0, cores = 0, n = 0, verify = 0, vtop = 3, vsteps = 10;
    int vruns = 1;
    const char *optimizer = NULL, *mesh = NULL, *schedule = NULL, *offload_dir = "/var/tmp";
    bool no_offload = false, arch = false;   /* arch: a gpt size flag given */
    int zero = -1, probing = 0;
    bool nos[5] = {false}, links_given[2] = {false, false};
    mg_plan_cluster cl = {.ranks_per_node = 0, .nodes = 1, .overlap = -1,
                          .intra = *mg_link_builtin("shm"), .inter = *mg_link_builtin("tcp")};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: model = optarg; break;
        case O_LAYERS: gpt.layers = inum("--layers", 1, 1000), arch = true; break;
        case O_DIM: gpt.dim = inum("--dim", 1, 1 << 20), arch = true; break;
        case O_HEADS: gpt.heads = inum("--heads", 1, 4096), arch = true; break;
        case O_CTX: gpt.ctx = inum("--ctx", 2, 1 << 20), arch = true; break;
        case O_VOCAB: gpt.vocab = inum("--vocab", 2, 1 << 24), arch = true; break;
        case O_BATCH: batch = inum("--batch", 1, 1 << 24); break;
        case O_OPT: optimizer = optarg; break;
        case 'n': n = inum("-n", 1, 1 << 20); break;
        case O_RPN: cl.ranks_per_node = inum("--ranks-per-node", 1, 4096); break;
        case O_NODES: cl.nodes = inum("--nodes", 1, 1 << 20); break;
        case O_MEM: cl.memory = size_arg("--memory"); break;
        case O_CORES: cores = inum("--cores", 1, 1 << 16); break;
        case O_FLOPS: cl.flops = num("--flops", 1e3, 1e18); break;
        case O_MEMBW: cl.bytes_per_s = num("--mem-bw", 1e3, 1e16); break;
        case O_IBW: cl.intra.bandwidth = num("--intra-bw", 1e-3, 1e5) * 1e9; links_given[0] = true; break;
        case O_ILAT: cl.intra.latency = num("--intra-latency", 0, 1e6) * 1e-6; links_given[0] = true; break;
        case O_XBW: cl.inter.bandwidth = num("--inter-bw", 1e-3, 1e5) * 1e9 / 8; links_given[1] = true; break;
        case O_XLAT: cl.inter.latency = num("--inter-latency", 0, 1e6) * 1e-6; links_given[1] = true; break;
        case O_OVERLAP: cl.overlap = num("--overlap", 0, 1); break;
        case O_NOZERO: case O_NOPP: case O_NOTP: case O_NORC: case O_NOSP:
            nos[c - O_NOZERO] = true;
            break;
        case O_TOP: top = inum("--top", 0, 1 << 20); break;
        case O_FLAGS: flags_only = 1; break;
        case O_MESH: mesh = optarg; break;
        case O_ZERO: zero = inum("--zero", 0, 3); break;
        case O_SCHED: schedule = optarg; break;
        case O_VERIFY: verify = 1; break;
        case O_VTOP: vtop = inum("--verify-top", 1, 100); break;
        case O_VSTEPS: vsteps = inum("--verify-steps", 2, 100000); break;
        case O_VRUNS: vruns = inum("--verify-runs", 1, 16); break;
        case 'h': usage(stdout); return 0;
        case O_VERSION: mg_print_version("mgplan"); return 0;
        case O_PROBE: probing = 1; break;
        case O_PROBE_LINKS: probing = 2; break;
        case O_NOOFF: no_offload = true; break;
        case O_OFFLOAD:
            if (strncmp(optarg, "disk:", 5) || !optarg[5])
                die("--offload '%s': give disk:DIR, the directory offloaded state would go to",
                    optarg);
            offload_dir = optarg + 5;
            break;
        case O_DISKBW: cl.disk_bytes_per_s = num("--disk-bw", 1e-6, 1e6) * 1e9; break;
        default:
            die("unknown or incomplete option '%s': see mgplan --help", argv[optind - 1]);
        }
    }
    if (optind < argc) die("unexpected argument '%s': see mgplan --help", argv[optind]);
    if (mg_tunables_check()) die("%s", mg_last_error());   /* every MG_* variable, as every tool */
    if (!model) die("give the model: --model NAME (mgplan --help)");
    if (n && cl.ranks_per_node) die("give -n N (one node) or --ranks-per-node R --nodes K, not both");
    if (!n && !cl.ranks_per_node) die("give the ranks: -n N, or --ranks-per-node R --nodes K");
    if (n) cl.ranks_per_node = n;
    mg_plan_job job;
    if (mg_plan_job_defaults(model, &job))
        die("unknown model '%s': give mlp, lenet-d2l, lenet5 or gpt-mini", model);
    if (arch && strcmp(model, "gpt-mini"))
        die("--layers, --dim, --heads, --ctx and --vocab apply to gpt-mini, not %s", model);
    if (verify && (cl.nodes > 1 || cl.flops > 0 || cl.bytes_per_s > 0))
        die("--verify runs the plans on this machine: leave out --nodes, --flops and --mem-bw");
    if (verify && strcmp(model, "gpt-mini"))
        die("--verify runs gpt-mini (trained by steps); %s trains by epochs: plan it without "
            "--verify", model);
    if (verify && gpt.vocab != 256)
        die("--verify trains on bytes: leave out --vocab");
    job.gpt = gpt;
    if (batch) job.batch = batch;
    if (optimizer) TRY(mg_optim_parse(optimizer, &job.optimizer));
    if (mesh) {
        int size[MG_MESH_DIMS];
        if (mg_mesh_parse(mesh, cl.ranks_per_node * cl.nodes, size)) die("--mesh: %s", mg_last_error());
        job.dp = size[MG_MESH_DP];
        job.pp = size[MG_MESH_PP];
        job.tp = size[MG_MESH_TP];
    }
    job.zero = zero;
    if (schedule) {
        mg_pipe_kind k;
        if (mg_pipe_parse(schedule, &k)) die("--pp-schedule: %s", mg_last_error());
        job.schedule = (int)k;
    }
    job.no_zero = nos[0];
    job.no_pipeline = nos[1];
    job.no_tp = nos[2];
    job.no_recompute = nos[3];
    job.no_sequence_parallel = nos[4];
    job.no_offload = no_offload;
    job.offload_dir = offload_dir;
    bool measured = !(cl.flops > 0 && cl.bytes_per_s > 0);
    char line[1024];
    /* Collectives sum at the rank's memory rate when it is given. */
    if (cl.bytes_per_s > 0) cl.intra.reduce = cl.inter.reduce = cl.bytes_per_s;
    /* This machine's cores and what they leave backward to hide
     * collectives; given figures: every rank its own core or GPU. */
    mg_plan_cluster here = mg_plan_cluster_here(cl.ranks_per_node, cl.nodes, cores, 1);
    cl.cores = measured || cores ? here.cores : 0;
    if (cl.overlap < 0) cl.overlap = measured ? here.overlap : 1;
    if (probing) return probe(&job, cl.nodes, probing == 2);
    if (measured) {
        /* A job no plan takes is said before the minutes of measuring:
         * the search's refusals do not depend on the rates. */
        mg_plan_cluster any = cl;
        any.flops = any.bytes_per_s = 1;
        any.intra = any.inter = (mg_link){.bandwidth = 1, .reduce = 1};
        mg_plan *none;
        int nn;
        TRY(mg_plan_search(&job, &any, &none, &nn));
        free(none);
        if (!flags_only)
            fprintf(stderr, "%s: measuring a rank's rates on this machine with %s, %d rank(s) "
                    "at once (give --flops and --mem-bw to skip)\n", prog, model,
                    cl.ranks_per_node);
        mg_plan_cluster m;
        char args[8192], err[512];
        int len = 0;
        for (int i = 1; i < argc; i++) {
            int w = snprintf(args + len, sizeof args - (size_t)len, "'%s' ", argv[i]);
            if (w < 0 || len + w + 16 >= (int)sizeof args)
                die("the command line is over %zu bytes: shorten it", sizeof args - 16);
            len += w;
        }
        snprintf(args + len, sizeof args - (size_t)len, "--probe");
        if (cl.ranks_per_node > 1) {
            if (!measure(cl.ranks_per_node, false, args, &m, err, sizeof err))
                die("cannot measure this machine (mgrun -n %d mgplan ... --probe)%s", cl.ranks_per_node,
                    *err ? err : ": give --flops, --mem-bw and the links");
        } else {
            m = cl;
            TRY(mg_plan_measure(&job, &m));
        }
        if (!(cl.flops > 0)) {
            cl.flops = m.flops;
            cl.overhead = m.overhead;
            memcpy(cl.micro_s, m.micro_s, sizeof cl.micro_s);
            cl.micro_with_tp = m.micro_with_tp;
        }
        if (!(cl.bytes_per_s > 0)) {
            cl.bytes_per_s = m.bytes_per_s;
            memcpy(cl.refill_bytes_per_s, m.refill_bytes_per_s, sizeof cl.refill_bytes_per_s);
        }
        if (!(cl.disk_bytes_per_s > 0)) cl.disk_bytes_per_s = m.disk_bytes_per_s;
        if (!links_given[0]) {
            cl.intra = m.intra;
            cl.rs_scale = m.rs_scale;
            cl.ag_scale = m.ag_scale;
        }
        if (!links_given[1] && cl.nodes > 1) {   /* the probe's one node: its intra */
            snprintf(args, sizeof args, "--model '%s' -n %d --probe-links", model, cl.nodes);
            if (!measure(cl.nodes, true, args, &m, err, sizeof err))
                die("cannot measure the link between nodes (through TCP on this host)%s: give "
                    "--inter-bw and --inter-latency", err);
            cl.inter = m.intra;
        }
    }
    mg_plan *all;
    int np;
    TRY(mg_plan_search(&job, &cl, &all, &np));
    if (!all[0].fits) {
        mg_plan_reason(all, np, &cl, line, sizeof line);
        bool offloaded = false;
        for (int i = 0; i < np; i++) offloaded |= all[i].offload;
        free(all);
        /* How to search with offload: it said --offload disk:DIR where that
         * changed nothing (a probe). */
        die("%s%s", line, offloaded ? ""
            : job.no_offload ? " (leave out --no-offload)"
            : " (give --disk-bw: with --flops, offload is searched only then)");
    }
    mg_plan_flags(&job, &all[0], line, sizeof line);
    if (flags_only) {
        printf("%s\n", line);
        free(all);
        return 0;
    }
    int fit = 0;
    for (int i = 0; i < np; i++) fit += all[i].fits;
    char cap[32] = "no limit", rate[160];
    if (cl.memory > 0) snprintf(cap, sizeof cap, "%.0f MB", cl.memory / 1e6);
    /* Measured: the rate on the largest micro-batch, beside the line's
     * slope (the marginal sample's rate, which small batches' overhead
     * makes far higher than any the CPU reaches; a probe took it for one). */
    int k = MG_PLAN_SIZES - 1;
    while (k >= 0 && !(cl.micro_s[1][k] > 0)) k--;
    double t = k >= 0 ? cl.micro_s[1][k] : 0;
    if (t > cl.overhead)
        snprintf(rate, sizeof rate, "%.3g FLOP/s on a micro-batch of %d (%.3g at the margin over "
                 "a micro-batch overhead of %.2f ms)", cl.flops * (t - cl.overhead) / t, 1 << k,
                 cl.flops, cl.overhead * 1e3);
    else
        snprintf(rate, sizeof rate, "%.3g FLOP/s, micro-batch overhead %.2f ms", cl.flops,
                 cl.overhead * 1e3);
    printf("%s: %s, batch %d, %d rank(s) (%d a node x %d), memory a rank %s; a rank %s, "
           "optimizer %.3g B/s, pages given back refilled at "
           "%.3g B/s, offload files %.3g B/s%s; "
           "links: within a node %.1f us and %.2f GB/s, between nodes %.1f us and %.2f GB/s\n",
           prog, model, job.batch, cl.ranks_per_node * cl.nodes, cl.ranks_per_node, cl.nodes, cap,
           rate, cl.bytes_per_s, cl.refill_bytes_per_s[1], cl.disk_bytes_per_s,
           measured ? " (measured)" : "",
           cl.intra.latency * 1e6, cl.intra.bandwidth / 1e9, cl.inter.latency * 1e6,
           cl.inter.bandwidth / 1e9);
    printf("%d plans, %d fit; the best %d (MB are a rank's most; ms a step; ! does not fit):\n",
           np, fit, top && top < np ? top : np);
    print_table(all, np, top);
    char why[512];
    mg_plan_reason(all, np, &cl, why, sizeof why);
    printf("recommended: %s\n  because %s\n", line, why);
    if (verify) verify_plans(&job, &cl, all, np, vtop, vsteps, vruns);
    free(all);
    return 0;
}
