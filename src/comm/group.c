/* Process groups: options, choosing a backend, init and destroy, queries,
 * split and group memory. The work of each lies in the backend (see
 * backend.h); ordering and failure handling in work.c.
 *
 * The MPI backend is linked in when the build has MPI (MG_HAVE_MPI) and
 * src/comm/mpi/backend_mpi.h declares `extern const mg__backend
 * mg__backend_mpi;`. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm/backend.h"
#include "comm/nccl.h"
#include "multigrad/core.h"

#if defined(MG_HAVE_MPI) && defined(__has_include)
#if __has_include("comm/mpi/backend_mpi.h")
#include "comm/mpi/backend_mpi.h"
#define MG__WITH_MPI_BACKEND 1
#endif
#endif

mg_group_options mg_group_options_default(void)
{
    return (mg_group_options){.init_method = NULL, .rank = -1, .size = -1, .local_rank = -1,
                              .local_size = -1, .secret = NULL, .backend = NULL,
                              .timeout_s = 0};
}

const mg__backend *mg__backend_find(const char *name)
{
    if (!strcmp(name, "builtin")) return &mg__backend_builtin;
#ifdef MG__WITH_MPI_BACKEND
    if (!strcmp(name, "mpi")) return &mg__backend_mpi;
#endif
    return NULL;
}

/* An integer environment variable: 1 if set, 0 if unset, -1 if malformed. */
static int env_int(const char *name, int *out)
{
    const char *s = mg_env_other(name);
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < -1 || v > 1 << 24) return -1;
    *out = (int)v;
    return 1;
}

/* An integer environment variable; -1 if unset or nonsense. */
static int env_val(const char *name)
{
    int v = -1;
    return env_int(name, &v) > 0 ? v : -1;
}

mg_launch mg_launch_detect(void)
{
    /* Each MPI launcher, with its names for the rank, the size and the local ones. */
    static const struct { const char *by, *rank, *size, *local_rank, *local_size; } mpi[] = {
        {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"PMIx", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"},
        {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    };
    mg_launch l = {NULL, false, -1, -1, -1, -1};
    const char *r = mg_env_other("RANK");
    if (r && *r) {
        l.by = "RANK";
        l.rank = env_val("RANK");
        l.size = env_val("WORLD_SIZE");
        l.local_rank = env_val("LOCAL_RANK");
        l.local_size = env_val("LOCAL_WORLD_SIZE");
    }
    for (size_t i = 0; i < sizeof mpi / sizeof *mpi && !l.mpi; i++) {
        const char *s = mg_env_other(mpi[i].rank);
        if (!s || !*s) continue;
        l.mpi = true;
        if (l.by) break;   /* RANK and WORLD_SIZE are the job's (e.g. mgrun under mpirun) */
        l.by = mpi[i].by;
        l.rank = env_val(mpi[i].rank);
        l.size = env_val(mpi[i].size);
        l.local_rank = env_val(mpi[i].local_rank);
        l.local_size = env_val(mpi[i].local_size);
    }
    return l;
}

/* Until the launcher ends this process, at most MG_PEER_TIMEOUT seconds. */
static void wait_for_the_launcher(void) { mg_sleep(mg_env_double("MG_PEER_TIMEOUT", 15)); }

void mg_launch_defer_to_rank_0(void)
{
    mg_launch l = mg_launch_detect();
    if (l.by && l.size > 1 && l.rank > 0) wait_for_the_launcher();
}

bool mg_launch_defer_to_the_first(void)
{
    mg_launch l = mg_launch_detect();
    if (l.mpi && l.by && strcmp(l.by, "RANK")) return false;
    wait_for_the_launcher();
    return true;
}

/* given (>= 0), else the environment variable env, else what an MPI
 * launcher said (launched >= 0). */
static mg_status pick(int given, const char *env, int launched, bool required, int *out)
{
    *out = -1;
    if (given >= 0) {
        *out = given;
        return MG_OK;
    }
    int r = env_int(env, out);
    if (r < 0)
        return mg_error(MG_EINVAL, "%s='%s' is not a non-negative integer", env, mg_env_other(env));
    if (r == 0) *out = launched;
    if (*out < 0 && required)
        return mg_error(MG_EINVAL, "%s is not set: start the ranks with a launcher (mgrun, "
                        "torchrun, mpirun) or pass rank and size explicitly", env);
    return MG_OK;
}

mg_status mg__resolve_ranks(const mg_group_options *opt, int *rank, int *size,
                            int *local_rank, int *local_size)
{
    mg_launch l = mg_launch_detect();
    if (!l.mpi || !strcmp(l.by, "RANK")) l.rank = l.size = l.local_rank = l.local_size = -1;
    MG_TRY(pick(opt->rank, "RANK", l.rank, true, rank));
    MG_TRY(pick(opt->size, "WORLD_SIZE", l.size, true, size));
    MG_TRY(pick(opt->local_rank, "LOCAL_RANK", l.local_rank, false, local_rank));
    MG_TRY(pick(opt->local_size, "LOCAL_WORLD_SIZE", l.local_size, false, local_size));
    if (*size < 1)
        return mg_error(MG_EINVAL, "world size %d: it must be at least 1 (WORLD_SIZE)", *size);
    if (*rank < 0 || *rank >= *size)
        return mg_error(MG_EINVAL, "rank %d is outside [0, %d): RANK must be below WORLD_SIZE",
                        *rank, *size);
    if (*local_size >= 1 && *local_rank >= *local_size)
        return mg_error(MG_EINVAL, "local rank %d is outside [0, %d): LOCAL_RANK must be below "
                        "LOCAL_WORLD_SIZE", *local_rank, *local_size);
    return MG_OK;
}

/* Started by an MPI launcher (and not by one that sets RANK), a group
 * takes the MPI backend unless told otherwise; the builtin one gets its
 * ranks from the launcher but still needs a rendezvous. */
static mg_status mpi_launch_backend(const mg_group_options *opt, const char **name)
{
    mg_launch l = mg_launch_detect();
    bool by_mpi = l.mpi && strcmp(l.by, "RANK");
    if (!*name) *name = by_mpi && mg__backend_find("mpi") ? "mpi" : "builtin";
    const char *a = mg_env_other("MASTER_ADDR");
    if (!by_mpi || strcmp(*name, "builtin") || opt->init_method || (a && *a)) return MG_OK;
    if (!mg__backend_find("mpi"))
        return mg_error(MG_EUNSUPPORTED, "started by %s, but this build has no MPI backend: "
                        "rebuild multigrad with Open MPI installed (libopenmpi-dev), or give "
                        "the builtin backend a rendezvous (mpirun -x MASTER_ADDR=HOST -x "
                        "MASTER_PORT=PORT)", l.by);
    return mg_error(MG_EINVAL, "MG_BACKEND=builtin under %s needs a rendezvous: mpirun -x "
                    "MASTER_ADDR=HOST -x MASTER_PORT=PORT (or leave MG_BACKEND unset for the "
                    "MPI backend)", l.by);
}

mg_status mg_group_init(const mg_group_options *opt, mg_group **out)
{
    MG_NEED("mg_group_init", out);
    *out = NULL;
    mg_group_options def = mg_group_options_default();
    if (!opt) opt = &def;
    MG_TRY(mg_tunables_check());
    double timeout = opt->timeout_s > 0 ? opt->timeout_s : mg_env_double("MG_TIMEOUT", 300);
    const char *name = opt->backend ? opt->backend : mg_env_str("MG_BACKEND", NULL);
    MG_TRY(mpi_launch_backend(opt, &name));
    const mg__backend *be = mg__backend_find(name);
    if (!be) {
        if (!strcmp(name, "mpi"))
            return mg_error(MG_EUNSUPPORTED, "backend 'mpi' is not in this build: install "
                            "libopenmpi-dev and rebuild, or use MG_BACKEND=builtin");
        return mg_error(MG_EINVAL, "unknown backend '%s' (MG_BACKEND): use builtin or mpi", name);
    }
    mg_group *g = mg__group_new(be, timeout);
    if (!g) return mg_error(MG_ENOMEM, "group: out of memory");
    mg_status st = be->init(g, opt);
    if (!st) st = mg__group_start(g);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mg_last_error());
        mg__group_free(g);
        return mg_error(st, "%s", msg);
    }
    mg_debug("rank %d/%d: group ready (backend %s, local rank %d/%d, timeout %g s)", g->rank,
             g->size, be->name, g->local_rank, g->local_size, g->timeout);
    *out = g;
    return MG_OK;
}

void mg_group_destroy(mg_group *g)
{
    mg__group_free(g);
}

int mg_group_rank(const mg_group *g) { return g->rank; }
int mg_group_size(const mg_group *g) { return g->size; }
int mg_group_local_rank(const mg_group *g) { return g->local_rank; }
int mg_group_local_size(const mg_group *g) { return g->local_size; }
double mg_group_timeout(const mg_group *g) { return g->timeout; }

mg_status mg_group_contain_peer_failures(mg_group *g)
{
    if (strcmp(g->be->name, "builtin"))
        return mg_error(MG_EUNSUPPORTED, "mg_group_contain_peer_failures: the %s backend ends "
                        "the job on a dead peer; only the builtin one contains it", g->be->name);
    atomic_store(&g->contain, true);
    return MG_OK;
}
const char *mg_group_backend(const mg_group *g) { return g->be->name; }

mg_traffic mg_group_traffic(const mg_group *g)
{
    /* The counters are atomics that the executing thread adds to; reading
     * through a const group does not modify them. */
    mg__traffic *t = (mg__traffic *)&g->traffic;
    return (mg_traffic){atomic_load_explicit(&t->sent, memory_order_relaxed),
                        atomic_load_explicit(&t->received, memory_order_relaxed),
                        atomic_load_explicit(&t->busy_ns, memory_order_relaxed) / 1e9};
}

void mg_group_set_name(mg_group *g, const char *name)
{
    snprintf(g->trace_name, sizeof g->trace_name, "%s", name ? name : "");
}

/* After a split or an exclusion (st): a sub-group chooses its own path
 * for the parent's device. */
static mg_status made_sub(mg_group *g, mg_status st, mg_group **out)
{
    if (!st && *out && g->dev_named) st = mg_group_use_device(*out, g->dev);
    if (st && *out) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mg_last_error());
        mg_group_destroy(*out);
        *out = NULL;
        return mg_error(st, "%s", msg);
    }
    return st;
}

mg_status mg_group_split(mg_group *g, int color, int key, mg_group **out)
{
    MG_NEED("mg_group_split", out);
    *out = NULL;
    MG_NEED("mg_group_split", g);
    if (color < MG_UNDEFINED)
        return mg_error(MG_EINVAL, "mg_group_split: color %d must be >= 0 or MG_UNDEFINED", color);
    mg__req r = {.kind = MG__REQ_SPLIT, .color = color, .key = key, .out_group = out};
    return made_sub(g, mg__run_req(g, &r), out);
}

mg_status mg_group_exclude(mg_group *g, const int *gone, int n_gone, mg_group **out)
{
    *out = NULL;
    if (strcmp(g->be->name, "builtin"))
        return mg_error(MG_EUNSUPPORTED, "mg_group_exclude: the %s backend ends the job on a "
                        "dead peer; only the builtin one goes on without it", g->be->name);
    for (int i = 0; i < n_gone; i++)
        if (gone[i] < 0 || gone[i] >= g->size || gone[i] == g->rank)
            return mg_error(MG_EINVAL, "mg_group_exclude: rank %d of a group of %d cannot be "
                            "left out%s", gone[i], g->size,
                            gone[i] == g->rank ? " by itself" : "");
    mg__req r = {.kind = MG__REQ_EXCLUDE, .gone = gone, .ngone = n_gone, .out_group = out};
    return made_sub(g, mg__run_req(g, &r), out);
}

void mg_group_revoke(mg_group *g, const char *why)
{
    mg__group_fail(g, MG_EPEER, why);   /* peers: "rank R failed and aborted the group: why" */
}

mg_status mg_group_set_label(mg_group *g, const char *label)
{
    MG_TRY(mg__label_check(label));
    enum { L = MG_GROUP_LABEL_MAX + 1 };
    char mine[L] = "", *all = calloc((size_t)g->size, L);
    if (!all) return mg_error(MG_ENOMEM, "mg_group_set_label: out of memory");
    if (label) snprintf(mine, sizeof mine, "%s", label);
    mg_status st = mg_all_gather(g, mine, all, L, MG_U8);
    if (!st) st = mg__names_set_labels(&g->names, g->size, all);
    free(all);
    return st;
}

int mg_group_world_rank(const mg_group *g, int r)
{
    MG_ASSERT(r >= 0 && r < g->size);
    return mg__world_rank(&g->names, r);
}

const char *mg_group_rank_name(const mg_group *g, int r, char *buf, size_t cap)
{
    MG_ASSERT(r >= 0 && r < g->size);
    return mg__rank_name(&g->names, r, NULL, buf, cap);
}

mg_status mg_group_use_device(mg_group *g, mg_device d)
{
    const char *mode = mg_env_str("MG_NCCL", "auto");
    mg__nccl_peer me, *all = calloc((size_t)g->size, sizeof *all);
    if (!all) return mg_error(MG_ENOMEM, "mg_group_use_device: out of memory");
    mg__nccl_me(d, &me);
    mg_status st = mg_all_gather(g, &me, all, sizeof me, MG_U8);
    char why[256];
    bool ok = !st && mg__nccl_plan(all, g->size, &g->names, why, sizeof why);
    free(all);
    if (st) return st;
    if (!strcmp(mode, "off")) {
        ok = false;
        snprintf(why, sizeof why, "MG_NCCL=off");
    }
    if (!ok && !strcmp(mode, "on"))
        return mg_error(MG_EUNSUPPORTED, "MG_NCCL=on, but the group cannot use NCCL: %s", why);
    mg__nccl *n = NULL;
    if (ok) st = mg__nccl_open(g, d, &n);
    if (st && !strcmp(mode, "on")) return st;
    if (st) {   /* auto: the host path, and why */
        snprintf(why, sizeof why, "%s", mg_last_error());
        char me[128];
        mg_log("%s: collectives on device memory go through the host: %s",
               mg__rank_name(&g->names, g->rank, NULL, me, sizeof me), why);
    }
    pthread_mutex_lock(&g->mu);
    mg__nccl *before = g->nccl;   /* a device named before: replaced */
    g->dev = d;
    g->dev_named = true;
    g->nccl = n;
    snprintf(g->dev_why, sizeof g->dev_why, "%s", why);
    pthread_mutex_unlock(&g->mu);
    mg__nccl_close(before);
    return MG_OK;
}

const char *mg_group_device_path(const mg_group *g, const char **why)
{
    if (why) *why = g->dev_named ? g->dev_why : "no device named (mg_group_use_device)";
    return g->nccl ? "nccl" : "host";
}

void *mg_group_alloc(mg_group *g, size_t bytes)
{
    void *p = NULL;
    mg__req r = {.kind = MG__REQ_ALLOC, .bytes = bytes, .out_ptr = &p};
    if (mg__run_req(g, &r)) return NULL;
    return p;
}

void mg_group_free(mg_group *g, void *p)
{
    if (!p) return;
    mg__req r = {.kind = MG__REQ_FREE, .ptr = p};
    if (mg__run_req(g, &r)) mg_debug("mg_group_free: %s", mg_last_error());
}

mg_status mg_group_agree(mg_group *g, mg_status st, mg_agree_mode mode)
{
    if (!g) return st;
    int rank = mg_group_rank(g);
    int32_t bad = st ? rank : INT32_MAX;   /* the first failing rank */
    MG_TRY(mg_all_reduce(g, &bad, &bad, 1, MG_I32, MG_MIN));
    if (bad == INT32_MAX) return MG_OK;
    if (mode == MG_AGREE_LEAVE_FIRST)
        return rank == bad ? st : mg_error(MG_ESTOPPED, "rank %d: stopping because rank %d "
                                           "failed (its message says why)", rank, bad);
    struct { int32_t st; char msg[500]; } w = {st, ""};
    if (st) snprintf(w.msg, sizeof w.msg, "%s", mg_last_error());
    MG_TRY(mg_broadcast(g, &w, sizeof w, MG_U8, bad));
    return rank != bad ? mg_error(w.st, "%s", w.msg) : st;
}
