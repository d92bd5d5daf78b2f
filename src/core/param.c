/* Environment tunables: every MG_* variable multigrad reads is a row of
 * the table below (name, type, default, range, one line of doc), as NCCL
 * declares NCCL_PARAM. Reads go through mg_env_long/_double/_str, which
 * check the value against its row and log it in verbose mode;
 * mg_tunables_check() refuses a bad value with one line (the tools call it
 * at start-up and exit 2) and warns about MG_* names the table does not
 * know; `mgtrain --print-params` prints the table.
 *
 * The number parsers serve the tools' flags too, so that a flag and a
 * variable are refused in the same words. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "multigrad/core.h"

#define I MG_TUNE_INT
#define R MG_TUNE_REAL
#define B MG_TUNE_BOOL
#define C MG_TUNE_CHOICE
#define S MG_TUNE_STR
#define K MG_TUNE_SECRET

/* One row per variable: adding a tunable is adding a line. */
static const mg_tunable params[] = {
    /* name, type, default, min, max, choices, doc */
    {"MG_VERBOSE", B, "0", 0, 1, NULL, "log the settings in use and debug messages (--verbose)"},
    {"MG_THREADS", I, "1", 1, 1024, NULL, "BLAS threads per process (mgtrain --threads)"},
    {"MG_LOCAL_CPUS", I, "0", 0, 1 << 20, NULL, "CPUs the node's ranks share (set by mgrun when it binds them); 0: this process's CPUs"},
    {"MG_KERNELS", C, "auto", 0, 0, "auto|generic", "generic: the portable C convolution kernels instead of AVX-512"},
    {"MG_BLAS_CORE", S, "auto", 0, 64, NULL, "OpenBLAS kernels: a core name (SkylakeX, Haswell, Zen, ...), keep (OpenBLAS's choice) or auto"},
    {"MG_BLAS_MISDETECT", S, NULL, 0, 64, NULL, "testing aid: start from this OpenBLAS core as if it had been detected"},
    {"MG_CONV_CHUNK_KB", I, "1024", 16, 1 << 20, NULL, "convolution: working set of one chunk of the batch, KiB"},
    {"MG_ZERO_OVERLAP", B, "1", 0, 1, NULL, "ZeRO: prefetch the next bucket's parameters (stage 3) and reduce a bucket's gradients behind the next one's backward (stages 2-3); 0: one bucket of each in flight, the least memory"},
    {"MG_OFFLOAD_WINDOW_MB", I, "1", 1, 1 << 16, NULL, "--offload: MiB of each array (parameters, gradients, each optimizer state) in one streamed window; three windows are in memory (one read ahead, one updated, one written back)"},
    {"MG_BLOCK_ROWS", I, "512", 1, 1 << 30, NULL, "transformer block: positions per slice of the batch"},
    {"MG_TRACE", S, NULL, 0, 4000, NULL, "write a Chrome trace per rank to this file (trace.rankN.json)"},
    {"MG_ATTENTION", C, "auto", 0, 0, "auto|fused|gemm", "GPU: causal attention by the fused kernel (no T x T matrix; heads up to 128 wide) or by batched GEMMs that keep the T x T probabilities; auto: in float32 GEMMs up to 512 positions, fused above; in bfloat16 fused"},
    {"MG_ATTENTION_ROWS", I, "4", 4, 8, NULL, "GPU: query rows of the fused attention kernel a thread computes, 4 (256 threads a block) or 8 (128)"},
    {"MG_DK_PROFILE", B, "0", 0, 1, NULL, "GPU: print each device kernel entry's GPU time (and the GEMMs' within it), summed per name, to stderr at exit"},
    {"MG_BACKEND", C, NULL, 0, 0, "builtin|mpi", "process groups: default mpi under mpirun or another PMI launcher (when built with MPI), else builtin"},
    {"MG_NCCL", C, "auto", 0, 0, "auto|on|off", "collectives on GPU memory (mg_group_use_device): NCCL when every rank has a GPU of its own (auto), NCCL or an error (on), or always staged through the host (off)"},
    {"MG_BATCH_RULES", C, "host", 0, 0, "host|nccl", "batches of sends and receives (mg_batch_isend_irecv): matched by tag with sends that never wait (host), or on any transport as NCCL runs them between GPUs, a send ending only once its receive is posted and the messages between two ranks matched in the order posted (nccl: a deadlock or a crossing NCCL would meet shows on the CPU)"},
    {"MG_TRANSPORT", C, "auto", 0, 0, "auto|shm|tcp", "between ranks on one host: shared memory (auto) or tcp"},
    {"MG_ALGO", C, "auto", 0, 0, "auto|ring|rd|tree|shm|central", "force a collective algorithm (auto: the cost model's choice; central: every collective through rank 0, the parameter-server baseline, never chosen by the model)"},
    {"MG_TIMEOUT", R, "300", 0.001, 1e7, NULL, "deadline of every wait of a group, seconds"},
    {"MG_PEER_TIMEOUT", R, "15", 0, 1e7, NULL, "seconds a waiting rank hears nothing (data or heartbeat) from a peer before declaring it dead; 0: only MG_TIMEOUT"},
    {"MG_JOB_SECRET", K, NULL, 0, 511, NULL, "the job's shared secret (mgrun sets one); without one only loopback peers"},
    {"MG_COLL_CHUNK", I, "524288", 4096, 1 << 30, NULL, "collectives: bytes per pipelined chunk of a ring"},
    {"MG_SHM_CHUNK", I, "0", 0, 1 << 30, NULL, "shared-memory collectives: bytes per chunk (0: from the slot size; at least 4096)"},
    {"MG_SHM_RING_KB", I, "0", 0, 1 << 20, NULL, "shared memory: KiB of each rank's message ring (0: 32 MiB over the peers, 256 KiB to 4 MiB)"},
    {"MG_SHM_SLOT_KB", I, "0", 0, 1 << 20, NULL, "shared memory: KiB of each rank's collective slot (0: the built-in size)"},
    {"MG_CKPT_RELAY", C, "auto", 0, 0, "auto|always", "a job's checkpoints: ranks that see rank 0's file write and read their parts directly, the others through rank 0 (auto); always: every rank through rank 0"},
    {"MG_P2P_UNEXPECTED_MB", I, "512", 1, 1 << 20, NULL, "MiB of messages a rank holds before it posts their receives"},
    {"MG_SPIN_US", R, NULL, 0, 1e6, NULL, "microseconds a wait spins before yielding (default 50, 0 when ranks outnumber CPUs)"},
    {"MG_YIELD_US", R, NULL, 0, 1e6, NULL, "microseconds a wait yields before sleeping (default 200, 2000 when ranks outnumber CPUs)"},
    {"MG_MPI_CHECK", B, "0", 0, 1, NULL, "MPI backend: check that ranks call the same collectives (costs a message each)"},
    {"MG_GRACE", R, "5", 0, 86400, NULL, "mgrun (and mgbench -n): seconds between SIGTERM and SIGKILL when it stops the workers"},
    {"MG_STORE_PORT", I, "0", 0, 65535, NULL, "set by mgrun: the port of the rendezvous store it serves at MASTER_ADDR, where the ranks meet (rank 0 serves none; MASTER_PORT is left to other programs); 0: rank 0 serves it at MASTER_PORT"},
    {"MG_RUN_ID", S, "", 0, 32, NULL, "set by mgrun: the attempt, so that a restart rendezvouses under keys of its own"},
    {"MG_SHM_TAG", S, "", 0, 16, NULL, "set by mgrun: letters and digits in the names of its ranks' shared memory (each mgrun has its own), which it removes when they end"},
    {"MG_RESTART_COUNT", I, "0", 0, 1000000, NULL, "set by mgrun: restarts so far (mgtrain resumes from --save after one)"},
    {"MG_ELASTIC", B, "0", 0, 1, NULL, "set by mgrun --elastic: a worker killed by a signal does not stop the others (mgtrain --elastic needs it)"},
    {"MG_MPIRUN", S, "mpirun", 0, 4000, NULL, "mgbench --backend mpi -n N: the mpirun it starts"},
    {"MG_BIN", S, "build/bin", 0, 4000, NULL, "tests and bench scripts: the directory of the built tools"},
    {"MG_BENCH", S, "build/bench", 0, 4000, NULL, "bench scripts: the directory of the built benchmarks"},
    {"MG_DATA", S, "/usr/share/datasets/fashion-mnist", 0, 4000, NULL, "the Fashion-MNIST directory: mgtrain's default --data, the tests'"},
    {"MG_TEST_DATA", S, "tests/data", 0, 4000, NULL, "tests: the directory of their data files"},
    {"MG_TEST_JOBS", I, "2", 1, 1024, NULL, "tests: how many run at once (mgtest -j)"},
    {"MG_FUZZ_BIN", S, "build-fuzz/fuzz", 0, 4000, NULL, "tests: the directory of the built fuzz targets (make fuzz)"},
};
#define N_PARAMS (int)(sizeof params / sizeof *params)

#undef I
#undef R
#undef B
#undef C
#undef S
#undef K

const mg_tunable *mg_tunables(int *n)
{
    *n = N_PARAMS;
    return params;
}

const mg_tunable *mg_tunable_find(const char *name)
{
    for (int i = 0; i < N_PARAMS; i++)
        if (!strcmp(params[i].name, name)) return &params[i];
    return NULL;
}

const char *mg_tunable_value(const mg_tunable *p)
{
    const char *s = getenv(p->name);
    return s && *s ? s : NULL;
}

/* ---- numbers ------------------------------------------------------------- */

/* "--threads 5" or "MG_THREADS=5" */
static const char *joiner(const char *what) { return what[0] == '-' ? " " : "="; }

static void real_range(double lo, double hi, int open, char *buf, size_t cap)
{
    snprintf(buf, cap, "a number %s %g%s %g", open & MG_OPEN_LO ? "above" : "from", lo,
             open & MG_OPEN_HI ? (open & MG_OPEN_LO ? " and below" : ", below")
                               : (open & MG_OPEN_LO ? ", at most" : " to"), hi);
}

mg_status mg_parse_long(const char *what, const char *s, long lo, long hi, long *out)
{
    char range[96], *end;
    snprintf(range, sizeof range, "an integer from %ld to %ld", lo, hi);
    errno = 0;
    long v = strtol(s, &end, 10);
    /* strtol skips leading blanks: a whole string is a number and nothing else. */
    if (end == s || *end || (*s != '-' && *s != '+' && (*s < '0' || *s > '9')))
        return mg_error(MG_EINVAL, "%s%s'%.64s' is not an integer: give %s", what, joiner(what),
                        s, range);
    if (errno == ERANGE || v < lo || v > hi)
        return mg_error(MG_EINVAL, "%s%s%.64s is out of range: give %s", what, joiner(what), s,
                        range);
    *out = v;
    return MG_OK;
}

mg_status mg_parse_double(const char *what, const char *s, double lo, double hi, int open,
                          double *out)
{
    char range[96], *end;
    real_range(lo, hi, open, range, sizeof range);
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || !(*s == '-' || *s == '+' || *s == '.' || (*s >= '0' && *s <= '9')) ||
        isnan(v))
        return mg_error(MG_EINVAL, "%s%s'%.64s' is not a number: give %s", what, joiner(what), s,
                        range);
    bool below = open & MG_OPEN_LO ? !(v > lo) : !(v >= lo);
    bool above = open & MG_OPEN_HI ? !(v < hi) : !(v <= hi);
    if (below || above || isinf(v))
        return mg_error(MG_EINVAL, "%s%s%.64s is out of range: give %s", what, joiner(what), s,
                        range);
    *out = v;
    return MG_OK;
}

/* ---- rows ---------------------------------------------------------------- */

void mg_tunable_range(const mg_tunable *p, char *buf, size_t cap)
{
    switch (p->type) {
    case MG_TUNE_INT:
        snprintf(buf, cap, "an integer from %.0f to %.0f", p->min, p->max);
        break;
    case MG_TUNE_REAL: real_range(p->min, p->max, 0, buf, cap); break;
    case MG_TUNE_BOOL: snprintf(buf, cap, "0 or 1"); break;
    case MG_TUNE_CHOICE: {
        size_t n = (size_t)snprintf(buf, cap, "one of ");
        for (const char *c = p->choices; *c && n + 3 < cap; c++) {
            if (*c == '|') buf[n++] = ',';
            buf[n++] = *c == '|' ? ' ' : *c;
        }
        buf[n] = 0;
        break;
    }
    default:
        if (p->max > 0) snprintf(buf, cap, "at most %.0f characters", p->max);
        else snprintf(buf, cap, "any text");
    }
}

static bool is_choice(const mg_tunable *p, const char *s)
{
    size_t n = strlen(s);
    if (strchr(s, '|')) return false;
    for (const char *c = p->choices;; c++) {
        if (!strncmp(c, s, n) && (c[n] == '|' || !c[n])) return true;
        if (!(c = strchr(c, '|'))) return false;
    }
}

static int parse_bool(const char *s)
{
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return 1;
        if (!strcasecmp(s, no[i])) return 0;
    }
    return -1;
}

/* Checks value s of row p; a number goes to *num. */
static mg_status check_value(const mg_tunable *p, const char *s, double *num)
{
    long l;
    char range[160];
    switch (p->type) {
    case MG_TUNE_INT:
        MG_TRY(mg_parse_long(p->name, s, (long)p->min, (long)p->max, &l));
        *num = (double)l;
        return MG_OK;
    case MG_TUNE_REAL: return mg_parse_double(p->name, s, p->min, p->max, 0, num);
    case MG_TUNE_BOOL:
        if ((l = parse_bool(s)) < 0)
            return mg_error(MG_EINVAL, "%s='%.64s' is not a yes/no value: give 0 or 1", p->name, s);
        *num = (double)l;
        return MG_OK;
    case MG_TUNE_CHOICE:
        if (is_choice(p, s)) return MG_OK;
        mg_tunable_range(p, range, sizeof range);
        return mg_error(MG_EINVAL, "%s='%.64s' is not known: give %s", p->name, s, range);
    default:
        if (p->max <= 0 || strlen(s) <= p->max) return MG_OK;
        return mg_error(MG_EINVAL, "%s is %zu characters long: give at most %.0f", p->name,
                        strlen(s), p->max);
    }
}

/* ---- reads ---------------------------------------------------------------- */

static atomic_bool warned[N_PARAMS];

/* The code's default must be the table's (where the table has one): a
 * second default that drifts would make --print-params lie. */
static void same_default(const mg_tunable *p, const char *text, double num, bool numeric)
{
    if (!p->dflt) return;
    bool same = numeric ? strtod(p->dflt, NULL) == num : text && !strcmp(text, p->dflt);
    if (!same) {
        char msg[160];
        snprintf(msg, sizeof msg, "the default of %s in the code is not the table's (%s)",
                 p->name, p->dflt);
        mg__assert_fail(msg, __FILE__, __LINE__);
    }
}

/* The variable's text if it is set and passes its row's check, else NULL
 * (a bad value warns once). A name the table lacks is read unchecked (a
 * test checks that every name read is in the table). */
static const char *read_env(const char *name, const mg_tunable **row, double *num)
{
    const mg_tunable *p = *row = mg_tunable_find(name);
    const char *s = getenv(name);
    if (!s || !*s) return NULL;
    if (!p) return s;
    if (check_value(p, s, num)) {
        if (!atomic_exchange(&warned[p - params], true))
            mg_log("warning: %s; using the default", mg_last_error());
        return NULL;
    }
    mg_debug("%s=%s", name, p->type == MG_TUNE_SECRET ? "(set)" : s);
    return s;
}

long mg_env_long(const char *name, long dflt)
{
    const mg_tunable *p;
    double v = (double)dflt;
    const char *s = read_env(name, &p, &v);
    if (p) {
        MG_ASSERT(p->type == MG_TUNE_INT || p->type == MG_TUNE_BOOL);
        same_default(p, NULL, (double)dflt, true);
    } else if (s) {
        v = (double)strtol(s, NULL, 10);
    }
    return (long)v;
}

double mg_env_double(const char *name, double dflt)
{
    const mg_tunable *p;
    double v = dflt;
    const char *s = read_env(name, &p, &v);
    if (p) {
        MG_ASSERT(p->type == MG_TUNE_REAL || p->type == MG_TUNE_INT);
        same_default(p, NULL, dflt, true);
    } else if (s) {
        v = strtod(s, NULL);
    }
    return v;
}

const char *mg_env_str(const char *name, const char *dflt)
{
    const mg_tunable *p;
    double v;
    const char *s = read_env(name, &p, &v);
    if (p) {
        MG_ASSERT(p->type >= MG_TUNE_CHOICE);
        same_default(p, dflt, 0, false);
    }
    return s ? s : dflt;
}

const char *mg_env_other(const char *name) { return getenv(name); }

/* ---- the start-up check --------------------------------------------------- */

extern char **environ;

static int distance(const char *a, const char *b)
{
    int n = (int)strlen(b), row[80];
    if (n >= 80) return 80;
    for (int j = 0; j <= n; j++) row[j] = j;
    for (int i = 1; a[i - 1]; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= n; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[n];
}

/* The first rank of a job, or a process outside one; under mgrun the
 * launcher itself warned. */
static bool warns(void)
{
    static const char *ranks[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    if (getenv("MG_RUN_ID")) return false;
    for (int i = 0; i < 4; i++) {
        const char *r = getenv(ranks[i]);
        if (r && *r && strcmp(r, "0")) return false;
    }
    return true;
}

static void warn_unknown(void)
{
    if (!warns()) return;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        char name[80];
        if (strncmp(*e, "MG_", 3) || !eq || (size_t)(eq - *e) >= sizeof name) continue;
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
        if (mg_tunable_find(name)) continue;
        int best = -1, bd = 1 << 30;
        for (int i = 0; i < N_PARAMS; i++) {
            int d = distance(name, params[i].name);
            if (d < bd) bd = d, best = i;
        }
        if (bd <= 2 || bd * 4 <= (int)strlen(name))
            mg_log("warning: %s is not a multigrad variable; did you mean %s? (mgtrain "
                   "--print-params lists them)", name, params[best].name);
        else
            mg_log("warning: %s is not a multigrad variable (mgtrain --print-params lists "
                   "them)", name);
    }
}

mg_status mg_tunables_check(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, warn_unknown);
    for (int i = 0; i < N_PARAMS; i++) {
        const char *s = getenv(params[i].name);
        double v;
        if (s && *s) MG_TRY(check_value(&params[i], s, &v));
    }
    return MG_OK;
}

int mg_local_cpus(void)
{
    long c = mg_env_long("MG_LOCAL_CPUS", 0);
    if (c > 0) return (int)c;
    cpu_set_t set;
    if (!sched_getaffinity(0, sizeof set, &set)) c = CPU_COUNT(&set);
    if (c <= 0) c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}
