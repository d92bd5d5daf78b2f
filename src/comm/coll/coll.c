/* The collective dispatcher: mg__coll_run takes an operation the group
 * checked when it was issued (mg__call_check), resolves the in-place
 * conventions of coll.h into the few shapes the algorithms accept
 * (copying through a temporary where a caller's buffers overlap in
 * another way), handles the trivial cases (count 0, one rank), picks the
 * algorithm (argument, MG_ALGO, or select.c's cost model) and calls it.
 * Also: algorithm names, scratch memory kept between operations, rank
 * spaces, and the chunk tunables.
 *
 * Families without a dedicated algorithm for a collective fall back as
 * docs/algorithms.md lists (e.g. rd gather -> binomial tree). */
#include <pthread.h>
#include <stdlib.h>
#include "comm/call.h"
#include "comm/coll/algos.h"

static const char *algo_names[MG_ALGO_COUNT] = {"auto", "ring", "rd", "tree", "shm",
                                                   "central"};

const char *mg__algo_name(mg__algo a)
{
    return (unsigned)a < MG_ALGO_COUNT ? algo_names[a] : "?";
}

int mg__algo_parse(const char *name)
{
    if (!name) return -1;
    for (int a = 0; a < MG_ALGO_COUNT; a++)
        if (!strcmp(name, algo_names[a])) return a;
    return -1;
}

/* ---- tunables ----------------------------------------------------------- */

static size_t env_chunk, env_shm_chunk;
static int env_algo;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void env_read(void)
{
    env_chunk = (size_t)mg_env_long("MG_COLL_CHUNK", 512 << 10);
    long s = mg_env_long("MG_SHM_CHUNK", 0);
    env_shm_chunk = s <= 0 ? 0 : s < 4096 ? 4096 : (size_t)s;
    /* The table admits only the names mg__algo_parse knows. */
    env_algo = mg__algo_parse(mg_env_str("MG_ALGO", "auto"));
}

size_t mg__coll_chunk(void)
{
    pthread_once(&env_once, env_read);
    return env_chunk;
}

size_t mg__shm_chunk_cap(void)
{
    pthread_once(&env_once, env_read);
    return env_shm_chunk;
}

mg__algo mg__algo_forced(void)
{
    pthread_once(&env_once, env_read);
    return (mg__algo)env_algo;
}

/* ---- scratch ---------------------------------------------------------- */

/* Scratch larger than this is released after the operation, so one huge
 * collective does not pin its memory for the life of the group. */
#define SCRATCH_KEEP ((size_t)16 << 20)

void *mg__op_scratch(mg__op *o, size_t bytes)
{
    mg__p2p *p = o->p;
    if (bytes < 64) bytes = 64;
    if (p->scratch_bytes >= bytes) return p->scratch;
    mg_free(p->scratch);
    p->scratch = mg_alloc(bytes);
    p->scratch_bytes = p->scratch ? bytes : 0;
    if (!p->scratch)
        mg_error(MG_ENOMEM, "%s: cannot allocate %zu bytes of scratch", mg_coll_name(o->coll),
                 bytes);
    return p->scratch;
}

void mg__coll_scratch_free(mg__p2p *p)
{
    if (!p) return;
    mg_free(p->scratch);
    p->scratch = NULL;
    p->scratch_bytes = 0;
}

/* ---- rank spaces ------------------------------------------------------- */

mg__space mg__space_plain(int p, int rank, int rot)
{
    return (mg__space){.n = p, .rem = 0, .rot = rot, .p = p, .me = (rank - rot + p) % p};
}

mg__space mg__space_fold(int p, int rank, int rot)
{
    int pp = 1;
    while (pp * 2 <= p) pp *= 2;
    int rem = p - pp, rel = (rank - rot + p) % p;
    int me = rel < 2 * rem ? (rel % 2 ? -1 : rel / 2) : rel - rem;
    return (mg__space){.n = pp, .rem = rem, .rot = rot, .p = p, .me = me};
}

void mg__moff_even(size_t *moff, int n, size_t count, size_t es)
{
    size_t q = count / (size_t)n, r = count % (size_t)n;
    for (int i = 0; i <= n; i++)
        moff[i] = ((size_t)i * q + ((size_t)i < r ? (size_t)i : r)) * es;
}

void mg__moff_blocks(size_t *moff, const mg__space *s, size_t blk)
{
    for (int i = 0; i <= s->n; i++) moff[i] = (size_t)mg__sp_bfirst(s, i) * blk;
}

size_t *mg__moff_scratch(mg__op *o, int n, size_t extra, char **data)
{
    size_t head = ((size_t)(n + 1) * sizeof(size_t) + 63) & ~(size_t)63;
    char *s = mg__op_scratch(o, head + extra);
    if (!s) return NULL;
    *data = s + head;
    return (size_t *)(void *)s;
}

/* ---- dispatch --------------------------------------------------------- */

typedef mg_status (*algo_fn)(mg__op *);

static mg_status a2a_shift(mg__op *o) { return mg__pairwise_all_to_all(o, 0); }
static mg_status a2a_xor(mg__op *o) { return mg__pairwise_all_to_all(o, 1); }

static const algo_fn table[MG_ALGO_COUNT][MG_COLL_BARRIER + 1] = {
    [MG_ALGO_RING] = {
        [MG_COLL_BROADCAST] = mg__ring_broadcast, [MG_COLL_REDUCE] = mg__ring_reduce,
        [MG_COLL_ALL_REDUCE] = mg__ring_all_reduce, [MG_COLL_ALL_GATHER] = mg__ring_all_gather,
        [MG_COLL_GATHER] = mg__flat_gather, [MG_COLL_SCATTER] = mg__flat_scatter,
        [MG_COLL_REDUCE_SCATTER] = mg__ring_reduce_scatter, [MG_COLL_ALL_TO_ALL] = a2a_shift,
        [MG_COLL_BARRIER] = mg__dissemination_barrier},
    [MG_ALGO_RD] = {
        [MG_COLL_BROADCAST] = mg__rd_broadcast, [MG_COLL_REDUCE] = mg__rd_reduce,
        [MG_COLL_ALL_REDUCE] = mg__rd_all_reduce, [MG_COLL_ALL_GATHER] = mg__rd_all_gather,
        [MG_COLL_GATHER] = mg__tree_gather, [MG_COLL_SCATTER] = mg__tree_scatter,
        [MG_COLL_REDUCE_SCATTER] = mg__rd_reduce_scatter, [MG_COLL_ALL_TO_ALL] = a2a_xor,
        [MG_COLL_BARRIER] = mg__dissemination_barrier},
    [MG_ALGO_TREE] = {
        [MG_COLL_BROADCAST] = mg__tree_broadcast, [MG_COLL_REDUCE] = mg__tree_reduce,
        [MG_COLL_ALL_REDUCE] = mg__tree_all_reduce, [MG_COLL_ALL_GATHER] = mg__tree_all_gather,
        [MG_COLL_GATHER] = mg__tree_gather, [MG_COLL_SCATTER] = mg__tree_scatter,
        [MG_COLL_REDUCE_SCATTER] = mg__tree_reduce_scatter, [MG_COLL_ALL_TO_ALL] = a2a_shift,
        [MG_COLL_BARRIER] = mg__tree_barrier},
    [MG_ALGO_SHM] = {
        [MG_COLL_BROADCAST] = mg__shm_broadcast, [MG_COLL_REDUCE] = mg__shm_reduce,
        [MG_COLL_ALL_REDUCE] = mg__shm_all_reduce, [MG_COLL_ALL_GATHER] = mg__shm_all_gather,
        [MG_COLL_GATHER] = mg__shm_gather, [MG_COLL_SCATTER] = mg__shm_scatter,
        [MG_COLL_REDUCE_SCATTER] = mg__shm_reduce_scatter, [MG_COLL_ALL_TO_ALL] = mg__shm_all_to_all,
        [MG_COLL_BARRIER] = mg__shm_barrier},
    [MG_ALGO_CENTRAL] = {
        [MG_COLL_BROADCAST] = mg__central_broadcast, [MG_COLL_REDUCE] = mg__central_reduce,
        [MG_COLL_ALL_REDUCE] = mg__central_all_reduce, [MG_COLL_ALL_GATHER] = mg__central_all_gather,
        [MG_COLL_GATHER] = mg__flat_gather, [MG_COLL_SCATTER] = mg__flat_scatter,
        [MG_COLL_REDUCE_SCATTER] = mg__central_reduce_scatter, [MG_COLL_ALL_TO_ALL] = a2a_shift,
        [MG_COLL_BARRIER] = mg__central_barrier},
};

static mg_status run_algo(mg__op *o, mg__algo a)
{
    algo_fn f = table[a][o->coll];
    MG_ASSERT(f);
    return f(o);
}

static mg__algo choose(mg__p2p *p, const mg_call *c, mg__algo algo)
{
    if (algo == MG_ALGO_AUTO) algo = mg__algo_forced();
    if (algo == MG_ALGO_SHM && !p->shm) {
        mg__algo best = mg__coll_select(p, c);
        mg_debug("%s: algorithm shm needs all ranks on one host with shared memory; "
                 "using %s", mg_coll_name(c->coll), mg__algo_name(best));
        return best;
    }
    if (algo == MG_ALGO_AUTO || (unsigned)algo >= MG_ALGO_COUNT) return mg__coll_select(p, c);
    return algo;
}

mg_status mg__coll_run(mg__p2p *p, const mg_call *c, mg__algo algo)
{
    MG_ASSERT(p && c && p->size >= 1 && p->rank >= 0 && p->rank < p->size);
    MG_ASSERT((unsigned)c->coll <= MG_COLL_BARRIER);
    if (c->coll != MG_COLL_BARRIER && !c->count) return MG_OK;

    mg__op o = {
        .p = p, .coll = c->coll, .sbuf = c->sendbuf, .rbuf = c->recvbuf,
        .count = c->count, .es = mg__dtsize(c->dtype), .dt = c->dtype, .op = c->op,
        .root = c->root, .rank = p->rank, .size = p->size,
    };
    if (c->coll == MG_COLL_BARRIER) o.es = 1, o.dt = MG_U8;
    size_t blk = o.count * o.es;
    int me_root = o.rank == o.root;

    if (o.size == 1) {
        if (c->coll != MG_COLL_BARRIER) mg__copy(o.rbuf, o.sbuf, blk);
        return MG_OK;
    }

    /* Resolve in-place forms; route other overlaps through temporaries. */
    void *tmp_in = NULL, *tmp_out = NULL;
    char *final_out = NULL;
    size_t in_bytes, out_bytes;
    mg__call_resolve(c, o.rank, o.size, &o.sbuf, &o.rbuf, &in_bytes, &out_bytes);
    if (in_bytes) {
        if (!(tmp_in = mg_alloc(in_bytes)))
            return mg_error(MG_ENOMEM, "%s: cannot allocate %zu bytes to copy an "
                            "overlapping input", mg_coll_name(o.coll), in_bytes);
        memcpy(tmp_in, o.sbuf, in_bytes);
        o.sbuf = tmp_in;
    }
    if (out_bytes) {
        if (!(tmp_out = mg_alloc(out_bytes))) {
            mg_free(tmp_in);
            return mg_error(MG_ENOMEM, "%s: cannot allocate %zu bytes for an output "
                            "that overlaps the input", mg_coll_name(o.coll), out_bytes);
        }
        final_out = o.rbuf;
        o.rbuf = tmp_out;
    }
    if (o.coll == MG_COLL_BROADCAST) {
        if (me_root) mg__copy(o.rbuf, o.sbuf, blk);
        o.sbuf = o.rbuf;
    }

    mg__algo a = choose(p, c, algo);
    mg_status st = run_algo(&o, a);
    if (!st && final_out) memcpy(final_out, tmp_out, out_bytes);
    mg_free(tmp_in);
    mg_free(tmp_out);
    if (p->scratch_bytes > SCRATCH_KEEP) mg__coll_scratch_free(p);
    return st;
}
