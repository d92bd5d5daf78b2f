/* Internal to the parameter server (ps.c, ps_server.c, ps_worker.c): the
 * job both roles share, its messages, and the workers that left it. */
#ifndef MG_PARALLEL_PS_H
#define MG_PARALLEL_PS_H

#include "parallel/internal.h"

/* The job's messages ("ps"): a push's head and gradients; the answer's
 * version and parameters; under --elastic the roll call and its answer;
 * under --deterministic a push's borrowed gradients (kept apart). */
enum { TAG_HEAD = 0x7073, TAG_GRADS, TAG_VERSION, TAG_PARAMS, TAG_ROLL, TAG_GONE, TAG_TIE };

/* A push's head: the worker's step, its micro-batches, the version of the
 * server's run it computed on, and (fully asynchronous) the squared norm
 * of its mean gradient, the bits of a double. */
enum { HEAD_STEP, HEAD_MICRO, HEAD_BASE, HEAD_SUMSQ, HEAD_LEN };

/* What the two roles share: the job, who is who, and each server's run. */
typedef struct {
    mg_strategy *s;
    mg_model *m;
    mg_group *g;        /* the job: pushes, parameters, the roll call (all along) */
    mg_group *role;     /* the workers, or the servers */
    int workers, servers, staleness;
    bool async;         /* staleness unbounded: each push its own update */
    bool elastic;       /* a worker's failure is contained: the others go on */
    mg_range *run;      /* per server: its units' range of the arena */
    bool *gone;         /* per worker: it left the job (--elastic) */
    int *live, n_live;  /* the workers that remain, ascending */
    int excluded;       /* workers left out of the groups below so far */
    int failed_in_a_row;   /* roll calls that found the collectives between steps failed */
    /* Under --elastic, from the first roll call: the groups of the ranks
     * that remain (the job's, and the workers'), for the collectives
     * between steps. */
    mg_group *job_left, *role_left;
} ps_job;

/* Whether rank `rank` of a job of `world` ranks is one of its `servers`
 * servers: the last ones. A server takes no data: it only counts the
 * batches of worker 0's share (the trainer loads the data set's shape
 * alone for it). */
static inline bool mg__ps_is_server(int rank, int world, int servers)
{
    return servers >= 1 && rank >= world - servers;
}

/* The server whose run holds range r (runs are whole units, r within
 * one), or -1 (r empty). */
static inline int mg__ps_server_of(const ps_job *j, mg_range r)
{
    for (int k = 0; r.hi > r.lo && k < j->servers; k++)
        if (r.lo >= j->run[k].lo && r.hi <= j->run[k].hi) return k;
    return -1;
}

/* A role's state (size bytes, its ps_job first) on the ranks of that
 * role; *state stays NULL on the others (the component drops itself).
 * Collective over the job. */
mg_status mg__ps_attach_role(mg_strategy *s, bool server, size_t size, void **state);
void mg__ps_job_free(ps_job *j);

/* A send to or receive from worker w that ended with st: under --elastic
 * a worker's failure (MG_EPEER, MG_ETIMEOUT) is contained: w has left the
 * job (said once, with why) and MG_OK comes back; otherwise st. */
mg_status mg__ps_lost(ps_job *j, int w, mg_status st);

/* The component's settle (component.h), both roles: under --elastic,
 * the roll call through server 0 (each rank says which workers it saw
 * leave and whether its collectives between steps failed; server 0 hears
 * every rank that remains, a worker whose link fails meanwhile has left
 * too, and tells every rank who left and who failed); the groups of the
 * ranks that remain (*job, and the workers' own) at the first, and again
 * when workers left since the last or collectives failed. When they
 * failed (this rank's given up first, so that no peer waits on it) and a
 * worker left meanwhile, *again: they are done again over the new
 * groups. */
mg_status mg__ps_settle(void *c, bool failed, bool *again, mg_group **job);

/* The workers' group for the collectives between steps (those that
 * remain). */
mg_group *mg__ps_workers_now(ps_job *j);

#endif
