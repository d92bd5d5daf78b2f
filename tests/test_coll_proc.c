/* Multi-process tests of the collectives through the public API
 * (mg_group_init from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, mg_run,
 * mg_group_alloc): the exact cases of coll_cases.c at world sizes 1 to 13
 * over shared memory (with and without group memory) and over TCP, for
 * every algorithm family. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "harness.h"
#include "coll_cases.h"
#include "multigrad/comm.h"


typedef struct {
    int port;
    const char *transport;   /* MG_TRANSPORT or NULL */
    const char *algo;        /* MG_ALGO or NULL */
    int gmem;
    _Atomic int *barrier_count;   /* MAP_SHARED */
    void (*build)(plan *pl, int P);   /* NULL: ct_build_sweep_lite */
} pjob;

typedef struct {
    mg_group *g;
    char *arena;
    size_t cap, used;
} real_ctx;

static mg_status real_run(void *ctx, const mg_call *c)
{
    real_ctx *r = ctx;
    return mg_run(r->g, c);
}
static void *real_galloc(void *ctx, size_t bytes)
{
    real_ctx *r = ctx;
    size_t b = (bytes + 63) & ~(size_t)63;
    if (!r->arena || r->used + b > r->cap) return NULL;
    void *p = r->arena + r->used;
    r->used += b;
    return p;
}
static void real_greset(void *ctx) { ((real_ctx *)ctx)->used = 0; }

static int proc_rank(int rank, int n, void *arg)
{
    const pjob *j = arg;
    mgt_rank_env(rank, n, j->port);
    setenv("MG_TIMEOUT", "30", 1);
    setenv("MG_COLL_CHUNK", "4096", 1);
    if (j->transport) setenv("MG_TRANSPORT", j->transport, 1);
    if (j->algo) setenv("MG_ALGO", j->algo, 1);
    mg_group_options o = mg_group_options_default();
    mg_group *g;
    if (mg_group_init(&o, &g)) {
        printf("rank %d: mg_group_init: %s\n", rank, mg_last_error());
        return 2;
    }
    plan pl = {.gmem = j->gmem, .barrier_count = j->barrier_count};
    pthread_mutex_init(&pl.mu, NULL);
    if (j->build)
        j->build(&pl, n);
    else
        ct_build_sweep_lite(&pl, n);
    real_ctx rc = {.g = g};
    if (j->gmem) {
        rc.cap = ct_sweep_gmem_bytes(n);
        rc.arena = mg_group_alloc(g, rc.cap);
        if (!rc.arena) {
            printf("rank %d: mg_group_alloc: %s\n", rank, mg_last_error());
            return 2;
        }
    }
    tenv e = {rank, n, real_run, real_galloc, real_greset, &rc};
    int bad = ct_run_plan(&e, &pl);
    if (bad) printf("rank %d (transport %s, algo %s, gmem %d): %s\n", rank,
                    j->transport ? j->transport : "auto", j->algo ? j->algo : "auto", j->gmem,
                    pl.err);
    if (rc.arena) mg_group_free(g, rc.arena);
    mg_group_destroy(g);
    free(pl.cases);
    return bad;
}

static void proc_plan(const char *transport, const char *const *algos, int nalgos,
                      const int *sizes, int nsizes, int gmem, void (*build)(plan *, int))
{
    for (int a = 0; a < nalgos; a++)
        for (int s = 0; s < nsizes; s++) {
            _Atomic int *bc = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
            CHECK(bc != MAP_FAILED);
            pjob j = {mgt_free_port(), transport, algos[a], gmem, bc, build};
            int bad = mgt_fork_ranks(sizes[s], proc_rank, &j, 120, NULL);
            munmap((void *)bc, 4096);
            CHECK_MSG(!bad, "%d of %d ranks failed (transport %s, algo %s, gmem %d)", bad,
                      sizes[s], transport ? transport : "auto", algos[a] ? algos[a] : "auto", gmem);
        }
}

static void proc_sweep(const char *transport, const char *const *algos, int nalgos,
                       const int *sizes, int nsizes, int gmem)
{
    proc_plan(transport, algos, nalgos, sizes, nsizes, gmem, NULL);
}

/* Every staged shared-memory form, six times in a row at two sizes: the
 * first runs alternate cached and non-temporal staging stores
 * (shm_direct.c), later ones take the faster; each must be exact. */
static void build_staged_repeats(plan *pl, int P)
{
    mg_coll colls[] = {MG_COLL_ALL_REDUCE, MG_COLL_REDUCE, MG_COLL_REDUCE_SCATTER,
                       MG_COLL_BROADCAST, MG_COLL_ALL_GATHER, MG_COLL_GATHER,
                       MG_COLL_SCATTER, MG_COLL_ALL_TO_ALL};
    size_t counts[] = {70001, 300007};
    for (int c = 0; c < 8; c++)
        for (int k = 0; k < 2; k++)
            for (int r = 0; r < 6; r++)
                ct_add_case(pl, (tcase){colls[c], r % 2 ? MG_F32 : MG_I32, MG_SUM, counts[k],
                                        r % P, r % 2});
}

TEST_T(coll_proc_shm_staged_stores, 300)
{
    const char *algos[] = {"shm"};
    int sizes[] = {2, 3};
    proc_plan(NULL, algos, 1, sizes, 2, 0, build_staged_repeats);
}

TEST_T(coll_proc_shm, 300)
{
    const char *algos[] = {NULL, "ring", "rd", "tree"};
    /* Under a sanitizer (mgt_sanitized) without 5 and 8: 1 to 4 and 13
     * hold powers of two and not, odd and even, and the largest. */
    int sizes[] = {1, 2, 3, 4, 13, 5, 8};
    proc_sweep(NULL, algos, 4, sizes, mgt_sanitized() ? 5 : 7, 0);
}

TEST_T(coll_proc_shm_group_memory, 300)
{
    const char *algos[] = {"shm"};
    int sizes[] = {2, 3, 4, 8};
    proc_sweep(NULL, algos, 1, sizes, 4, 1);
    proc_sweep(NULL, algos, 1, sizes, 4, 2);
}

TEST_T(coll_proc_tcp, 300)
{
    const char *algos[] = {NULL, "ring", "rd", "tree", "central"};
    int sizes[] = {2, 3, 5, 8};   /* under a sanitizer without 8 */
    proc_sweep("tcp", algos, 5, sizes, mgt_sanitized() ? 3 : 4, 0);
    const char *autos[] = {NULL};
    int big[] = {13};
    proc_sweep("tcp", autos, 1, big, 1, 0);
}
