/* mgrun's command line (tools/mgrun.c): its options, their help, and
 * their parsing and checks, each mistake one line and exit status 2
 * before any worker starts (the program to run is looked up as execvp
 * would, the MG_* variables and MG_JOB_SECRET checked once here).
 *
 * A header of static functions because each tool is one source file (the
 * Makefile builds one binary per file of tools/). */
#ifndef MGRUN_OPTIONS_H
#define MGRUN_OPTIONS_H

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "multigrad/core.h"
#include "multigrad/tensor.h"

#define BAD_INPUT 2
enum { BIND_AUTO, BIND_NONE, BIND_CORE };

typedef struct {
    int nproc, nnodes, node_rank, max_restarts;
    int master_port;            /* the store's; 0: a free port, chosen once by the store */
    int worker_port;            /* the workers' MASTER_PORT (mgrun_rdzv.h) */
    const char *master_addr;
    bool tag_output;
    bool elastic;               /* a worker killed by a signal, or left, does not stop the others */
    int bind;                   /* BIND_NONE or BIND_CORE, after auto is decided */
    cpu_set_t cpus;             /* the CPUs mgrun may use */
    int ncpus;
    char **prog;                /* PROGRAM ARGS... (NULL-terminated) */
    char secret[80];
    char shm_tag[17];           /* MG_SHM_TAG: 16 random hex digits */
    double grace;               /* seconds between SIGTERM and SIGKILL */
} options;

/* ---- command line ------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
"usage: mgrun [options] PROGRAM [ARGS...]\n"
"Starts PROGRAM as the workers of a multigrad job on this node, in the\n"
"manner of torchrun, and stops them all when one fails.\n"
"\n"
"  -n, --nproc-per-node N  workers on this node (default 1; 'auto': one per CPU)\n"
"      --nnodes N          nodes in the job (default 1)\n"
"      --node-rank R       this node's index, 0..nnodes-1 (default 0)\n"
"      --master-addr HOST  address of node 0, where mgrun serves the job's\n"
"                          rendezvous store (default 127.0.0.1)\n"
"      --master-port PORT  the store's port (default on one node: a free\n"
"                          port; required with --nnodes > 1)\n"
"      --max-restarts N    restart the whole job up to N times after a\n"
"                          failure (default 0)\n"
"      --tag-output        prefix each output line with \"[rank]: \"\n"
"      --elastic           a worker killed by a signal, or one that exits\n"
"                          with status 3 (the others took it as lost and\n"
"                          went on), does not stop the others: mgrun says\n"
"                          so and the job goes on without it, for programs\n"
"                          that go on with the ranks that remain (mgtrain\n"
"                          --parallel ps --elastic); the workers get\n"
"                          MG_ELASTIC=1\n"
"      --bind MODE         core: each worker runs on its own equal share of\n"
"                          the CPUs mgrun may use (as Open MPI's --bind-to\n"
"                          core); none: the workers are not bound; auto\n"
"                          (default): core when the workers of this node do\n"
"                          not outnumber those CPUs, none when they do\n"
"      --version           version, CPU and kernels of this machine\n"
"  -h, --help              this help\n"
"(torchrun's spellings with '_', e.g. --nproc_per_node, are accepted too.)\n"
"\n"
"Each worker gets RANK (node_rank * nproc + local rank), WORLD_SIZE,\n"
"LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and NODE_RANK (the node rank),\n"
"GROUP_WORLD_SIZE, MASTER_ADDR (--master-addr), MG_STORE_PORT (the\n"
"store's port: multigrad ranks meet there), MASTER_PORT (another port,\n"
"free on node 0 and the same on every node, for a program that serves its\n"
"own rendezvous there, as PyTorch's init_process_group does),\n"
"MG_JOB_SECRET, MG_RESTART_COUNT and MG_RUN_ID (0, then 1 after the first\n"
"restart, ...) and MG_SHM_TAG (in the names of their shared memory, which mgrun removes\n"
"once they have exited, however they ended); with more than one worker,\n"
"OMP_NUM_THREADS and OPENBLAS_NUM_THREADS are set to 1 unless already\n"
"set; bound workers get MG_LOCAL_CPUS, the CPUs they share.\n"
"Workers read stdin from /dev/null and run in their own process groups.\n"
"\n"
"The job secret: MG_JOB_SECRET if set (at least 16 characters), else 32\n"
"random bytes in hex. A multi-node job needs the same MG_JOB_SECRET on\n"
"every node, e.g. export MG_JOB_SECRET=$(openssl rand -hex 32).\n"
"\n"
"SIGINT, SIGTERM and SIGHUP are forwarded to the workers (a second one\n"
"kills them). When a worker exits non-zero or is killed, the others get\n"
"SIGTERM, then SIGKILL after MG_GRACE seconds (default 5).\n"
"Exit status: 0 when every worker succeeded (--elastic: every worker not\n"
"lost); else the failed worker's exit\n"
"status (128 + N if killed by signal N; 128 + N when mgrun was stopped by\n"
"signal N); 1 on node 0 when another node never joined; 2 for bad options.\n");
}

/* Prints one line about bad input and exits with status 2. */
static void __attribute__((noreturn, format(printf, 1, 2))) bad_input(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mg_veprintf("mgrun", fmt, ap);
    va_end(ap);
    exit(BAD_INPUT);
}

static int parse_int(const char *flag, const char *s, long lo, long hi)
{
    long v;
    if (mg_parse_long(flag, s, lo, hi, &v)) bad_input("%s", mg_last_error());
    return (int)v;
}

/* A script's #! interpreter: execvp's ENOENT for a missing one reads as
 * if the script itself were missing, once per worker. */
static void check_interpreter(const char *name, const char *path)
{
    char head[256] = "";
    FILE *f = fopen(path, "r");
    if (!f) return;   /* execvp will say why */
    size_t n = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    head[n] = 0;
    if (strncmp(head, "#!", 2)) return;
    char *interp = head + 2 + strspn(head + 2, " \t");
    interp[strcspn(interp, " \t\r\n")] = 0;
    if (*interp == '/' && access(interp, X_OK) != 0)
        bad_input("cannot run '%s': its interpreter %s (its #! line): %s", name, interp,
                  strerror(errno));
}

/* Fails early, with a clear line, for what execvp would refuse. */
static void check_program(const char *name)
{
    struct stat st;
    if (strchr(name, '/')) {
        if (stat(name, &st) != 0) bad_input("cannot run '%s': %s", name, strerror(errno));
        if (S_ISDIR(st.st_mode)) bad_input("cannot run '%s': it is a directory", name);
        if (access(name, X_OK) != 0)
            bad_input("cannot run '%s': %s", name, strerror(errno));
        check_interpreter(name, name);
        return;
    }
    const char *path = mg_env_other("PATH");
    if (!path) path = "/usr/local/bin:/usr/bin:/bin";
    bool seen = false;
    for (const char *p = path;; ) {
        const char *colon = strchrnul(p, ':');
        char full[PATH_MAX];
        int dlen = (int)(colon - p);
        snprintf(full, sizeof full, "%.*s%s%s", dlen, p, dlen ? "/" : "", name);
        if (stat(full, &st) == 0 && !S_ISDIR(st.st_mode)) {
            if (access(full, X_OK) == 0) {
                check_interpreter(name, full);
                return;
            }
            seen = true;
        }
        if (!*colon) break;
        p = colon + 1;
    }
    bad_input("cannot run '%s': %s", name,
              seen ? "permission denied (not executable)" : "not found in PATH");
}

enum { OPT_NNODES = 256, OPT_NODE_RANK, OPT_ADDR, OPT_PORT, OPT_RESTARTS, OPT_TAG, OPT_BIND,
       OPT_ELASTIC, OPT_VERSION };

static void parse_args(int argc, char **argv, options *o)
{
    static const struct option longs[] = {
        {"nproc-per-node", required_argument, NULL, 'n'},
        {"nproc_per_node", required_argument, NULL, 'n'},
        {"nnodes", required_argument, NULL, OPT_NNODES},
        {"node-rank", required_argument, NULL, OPT_NODE_RANK},
        {"node_rank", required_argument, NULL, OPT_NODE_RANK},
        {"master-addr", required_argument, NULL, OPT_ADDR},
        {"master_addr", required_argument, NULL, OPT_ADDR},
        {"master-port", required_argument, NULL, OPT_PORT},
        {"master_port", required_argument, NULL, OPT_PORT},
        {"max-restarts", required_argument, NULL, OPT_RESTARTS},
        {"max_restarts", required_argument, NULL, OPT_RESTARTS},
        {"tag-output", no_argument, NULL, OPT_TAG},
        {"elastic", no_argument, NULL, OPT_ELASTIC},
        {"bind", required_argument, NULL, OPT_BIND},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {0}};
    *o = (options){.nproc = 1, .nnodes = 1, .master_addr = "127.0.0.1"};
    opterr = 0;   /* our own one-line messages */
    int c;
    /* '+': stop at PROGRAM, so its own flags are left to it. */
    while ((c = getopt_long(argc, argv, "+:n:h", longs, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (strcmp(optarg, "auto") == 0) {
                long cpus = sysconf(_SC_NPROCESSORS_ONLN);
                o->nproc = cpus > 0 ? (int)cpus : 1;
            } else {
                o->nproc = parse_int("--nproc-per-node", optarg, 1, 4096);
            }
            break;
        case OPT_NNODES: o->nnodes = parse_int("--nnodes", optarg, 1, 65536); break;
        case OPT_NODE_RANK: o->node_rank = parse_int("--node-rank", optarg, 0, 65535); break;
        case OPT_ADDR:
            if (!*optarg) bad_input("--master-addr: empty address");
            o->master_addr = optarg;
            break;
        case OPT_PORT: o->master_port = parse_int("--master-port", optarg, 1, 65535); break;
        case OPT_RESTARTS:
            o->max_restarts = parse_int("--max-restarts", optarg, 0, 1000000);
            break;
        case OPT_TAG: o->tag_output = true; break;
        case OPT_ELASTIC: o->elastic = true; break;
        case OPT_BIND:
            if (!strcmp(optarg, "auto")) o->bind = BIND_AUTO;
            else if (!strcmp(optarg, "none")) o->bind = BIND_NONE;
            else if (!strcmp(optarg, "core")) o->bind = BIND_CORE;
            else bad_input("--bind: unknown mode '%s' (use core, none or auto)", optarg);
            break;
        case 'h': usage(stdout); exit(0);
        case OPT_VERSION: mg_print_version("mgrun"); exit(0);
        case ':':
            bad_input("option '%s' needs a value (see mgrun --help)", argv[optind - 1]);
        default:
            if (optopt)
                bad_input("unknown option '-%c' (see mgrun --help)", optopt);
            bad_input("unknown or ambiguous option '%s' (see mgrun --help)", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        bad_input("no program to run (usage: mgrun [options] PROGRAM [ARGS...]; "
                  "see mgrun --help)");
    o->prog = argv + optind;
    if (o->node_rank >= o->nnodes)
        bad_input("--node-rank %d is out of range for --nnodes %d (0..%d)",
                  o->node_rank, o->nnodes, o->nnodes - 1);
    if ((long)o->nproc * o->nnodes > (1L << 24))
        bad_input("a world of %ld workers is more than mgrun supports (%ld)",
                  (long)o->nproc * o->nnodes, 1L << 24);
    if (o->nnodes > 1 && o->master_port == 0)
        bad_input("--nnodes %d needs --master-port (the same on every node)", o->nnodes);
    /* The MG_* variables are checked once here rather than by every worker. */
    if (mg_tunables_check()) bad_input("%s", mg_last_error());
    const char *secret = mg_env_str("MG_JOB_SECRET", NULL);
    if (secret && *secret) {
        if (strlen(secret) < 16 || strlen(secret) >= sizeof o->secret)
            bad_input("MG_JOB_SECRET must have 16 to %zu characters (it has %zu); "
                      "e.g. export MG_JOB_SECRET=$(openssl rand -hex 32)",
                      sizeof o->secret - 1, strlen(secret));
        snprintf(o->secret, sizeof o->secret, "%s", secret);
    } else if (o->nnodes > 1) {
        bad_input("--nnodes %d needs MG_JOB_SECRET set to the same value on every "
                  "node; e.g. export MG_JOB_SECRET=$(openssl rand -hex 32)", o->nnodes);
    }
    check_program(o->prog[0]);
    if (sched_getaffinity(0, sizeof o->cpus, &o->cpus) == 0) o->ncpus = CPU_COUNT(&o->cpus);
    if (o->bind == BIND_CORE && o->nproc > o->ncpus)
        bad_input("--bind core: %d workers on this node but %d CPUs to bind them to; "
                  "use fewer workers or --bind none", o->nproc, o->ncpus);
    if (o->bind == BIND_AUTO) o->bind = o->nproc <= o->ncpus ? BIND_CORE : BIND_NONE;
    o->grace = mg_env_double("MG_GRACE", 5);
}

#endif
