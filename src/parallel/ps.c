/* The parameter server (issue 34): `--parallel ps --servers K`. The last K
 * ranks of the job are servers, the others workers.
 *   - A server owns a contiguous run of whole units of the arena, the
 *     runs balanced by their parameters, and the optimizer's state for
 *     them (its ranges); it computes nothing.
 *   - A worker keeps the whole model and no optimizer state: each step it
 *     runs its share of the global batch (the micro-batches as one
 *     process would), pushes each server the gradients of its run (their
 *     sum over the micro-batches, with how many there were) and takes the
 *     server's updated parameters back.
 *   - Update k of a server is the mean of the workers' k-th pushes, taken
 *     as they come (recv from any source, then from that worker) into a
 *     slot per worker and summed in worker order, so its bits do not
 *     depend on arrival; it goes through the strategy's step (the mean
 *     over the micro-batches, clipping over the servers' runs, the
 *     optimizer).
 *   - Bounded staleness S (SSP, Ho et al. 2013): a worker's k-th gradient
 *     is computed on parameters of version k - S or later (the version:
 *     updates applied). A server answers push k with its run as soon as
 *     its version is k + 1 - S or later, so a worker runs at most S steps
 *     ahead of the slowest, and pushes of the next S steps wait in their
 *     slots. S = 0 is synchronous: the numbers are DDP's but for the
 *     order of the sum.
 *   - Fully asynchronous (S unbounded, TensorFlow's first parameter
 *     servers): each push is its own update as it comes (the mean over
 *     its micro-batches, clipped by its own norm, which the worker sends),
 *     and its worker gets the run back at once. A server's step ends when
 *     every worker has pushed that step, so the learning-rate schedule
 *     follows the slowest worker; the optimizer counts the updates
 *     (Adam's bias correction, in checkpoints too).
 *   - Each push says the version of that server's run it was computed on
 *     (the version: updates applied): a server counts the pushes and the
 *     largest staleness it saw (updates between a worker's pull and its
 *     push's update).
 *   - The job's group carries the pushes and parameters; the workers'
 *     group sums the training figures and the servers' the gradient norm.
 *     Checkpoints are the strategy's: each server writes its run (its own
 *     ranges), rank 0 the rest; every rank reads what it holds.
 *   - Elastic (--elastic, under mgrun --elastic): every rank contains its
 *     peers' failures. A server that loses a worker's link goes on
 *     without it: its steps wait for the workers that remain, and a step
 *     is the mean of the pushes that came. Between steps, before the
 *     job's collectives, the roll call: server 0 hears every other rank
 *     and tells each which workers left, and the ranks that remain make
 *     the groups of those that remain (mg_group_exclude). The survivors
 *     keep their shares of each batch (the one lost is not trained on);
 *     evaluation spreads over them, whole.
 * This file: the job both roles share (the runs, the roles, the roll
 * call); ps_server.c and ps_worker.c the two components.
 * Limits: memory for (S + 1) x workers pushes of its run on a server under
 * bounded staleness; no tensor or pipeline parallelism with it; the
 * model's buffers (batch statistics) stay each worker's; a server's
 * failure stops the job, as does a worker's during the roll call itself
 * or the job's collectives after it (the ranks that remain then wait for
 * it at most MG_PEER_TIMEOUT). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/ps.h"

/* The arena cut at unit borders into `servers` runs of about equal
 * parameters (the last takes the arena's end). */
static mg_status cut_runs(ps_job *j)
{
    int nu = mg_model_num_units(j->m), K = j->servers;
    size_t total = mg_model_arena_size(j->m);
    if (nu < K)
        return mg_error(MG_EINVAL, "--servers %d: the model has %d units to split among them; "
                        "give at most %d", K, nu, nu);
    if (!(j->run = calloc((size_t)K, sizeof *j->run)))
        return mg_error(MG_ENOMEM, "ps: out of memory");
    size_t lo = 0;
    int u = 0;
    for (int k = 0; k < K; k++) {
        size_t want = total * (size_t)(k + 1) / (size_t)K, hi = lo;
        /* Whole units up to the share, leaving one for each server after. */
        while (u < nu - (K - 1 - k)) {
            size_t a, b;
            mg_model_unit_range(j->m, u, &a, &b);
            if (hi > lo && b > want && k + 1 < K) break;
            hi = b;
            u++;
        }
        if (k + 1 == K) hi = total;
        j->run[k] = (mg_range){lo, hi};
        lo = hi;
    }
    return MG_OK;
}

/* The job split into workers (color 0) and servers (1), and the servers'
 * runs: collective, on every rank, in each role's attach (every rank
 * finds the same mistakes before it communicates). *mine: the rank's
 * role is `server`. */
static mg_status join(mg_strategy *s, bool server, ps_job *j, bool *mine)
{
    const mg_strategy_options *o = mg_strategy_options_of(s);
    memset(j, 0, sizeof *j);
    j->s = s;
    j->m = mg_strategy_model(s);
    j->g = o->group;
    int world = j->g ? mg_group_size(j->g) : 1, rank = j->g ? mg_group_rank(j->g) : 0;
    j->servers = o->ps_servers;
    j->workers = world - j->servers;
    j->staleness = o->ps_staleness;
    j->async = o->ps_staleness == MG_STALENESS_UNBOUNDED;
    j->elastic = o->ps_elastic;
    if (!j->g || j->servers < 1 || j->workers < 1)
        return mg_error(MG_EINVAL, "--parallel ps: %d server(s) among %d rank(s) leave no "
                        "worker; give --servers below the ranks", j->servers, world);
    if (!j->async && (o->ps_staleness < 0 || o->ps_staleness > 64))
        return mg_error(MG_EINVAL, "--staleness %d: give 0 (synchronous) to 64, or inf (fully "
                        "asynchronous)", o->ps_staleness);
    j->gone = calloc((size_t)j->workers, sizeof *j->gone);
    j->live = malloc((size_t)j->workers * sizeof *j->live);
    if (!j->gone || !j->live) return mg_error(MG_ENOMEM, "ps: out of memory");
    for (int w = 0; w < j->workers; w++) j->live[j->n_live++] = w;
    /* The runs first: every rank finds the same mistake before the split. */
    MG_TRY(cut_runs(j));
    if (j->elastic) MG_TRY(mg_group_contain_peer_failures(j->g));
    bool is_server = mg__ps_is_server(rank, world, j->servers);
    MG_TRY(mg_group_split(j->g, is_server, rank, &j->role));
    *mine = is_server == server;
    if (*mine) mg_group_set_name(j->role, server ? "ps" : "workers");
    return MG_OK;
}

void mg__ps_job_free(ps_job *j)
{
    mg_group_destroy(j->role_left);
    mg_group_destroy(j->job_left);
    mg_group_destroy(j->role);
    free(j->run);
    free(j->gone);
    free(j->live);
}

mg_status mg__ps_attach_role(mg_strategy *s, bool server, size_t size, void **state)
{
    ps_job *j = calloc(1, size);
    if (!j) return mg_error(MG_ENOMEM, "ps: out of memory");
    bool mine = false;
    mg_status st = join(s, server, j, &mine);
    if (st || !mine) {
        mg__ps_job_free(j);
        free(j);
        return st;
    }
    *state = j;
    return MG_OK;
}

/* ---- workers that leave (--elastic) ------------------------------------------ */

static void leaves(ps_job *j, int w)
{
    if (j->gone[w]) return;
    j->gone[w] = true;
    int n = 0;
    for (int i = 0; i < j->n_live; i++)
        if (j->live[i] != w) j->live[n++] = j->live[i];
    j->n_live = n;
}

mg_status mg__ps_lost(ps_job *j, int w, mg_status st)
{
    if (!st || !j->elastic || (st != MG_EPEER && st != MG_ETIMEOUT) || w < 0 || w >= j->workers)
        return st;
    if (!j->gone[w]) {   /* the cause, past the operation's description */
        char who[96];
        const char *e = mg_last_error(), *why = strstr(e, "failed: ");
        mg_log("ps: the server on rank %d lost %s: %s; the other %d worker(s) go on without it "
               "(--elastic)", mg_group_rank(j->g), mg_group_rank_name(j->g, w, who, sizeof who),
               why ? why + 8 : e, j->n_live - 1);
        leaves(j, w);
    }
    return j->n_live ? MG_OK
                     : mg_error(MG_EPEER, "ps: every worker has left the job; nothing is left "
                                "to train");
}

mg_group *mg__ps_workers_now(ps_job *j) { return j->role_left ? j->role_left : j->role; }

/* The roll call's exchange: server 0 hears every rank that remains (their
 * lists of workers gone, added to its own), the others hear its list. */
static mg_status roll_call(ps_job *j, uint8_t *gone)
{
    int world = j->workers + j->servers, root = j->workers, me = mg_group_rank(j->g);
    if (me != root) {
        MG_TRY(mg_send(j->g, gone, (size_t)j->workers, MG_U8, root, TAG_ROLL));
        return mg_recv(j->g, gone, (size_t)j->workers, MG_U8, root, TAG_GONE);
    }
    int *from = malloc((size_t)world * sizeof *from), n = 0;
    uint8_t *theirs = malloc((size_t)j->workers);
    mg_status st = from && theirs ? MG_OK : mg_error(MG_ENOMEM, "ps: out of memory");
    for (int r = 0; !st && r < world; r++)
        if (r != me && (r >= j->workers || !j->gone[r])) from[n++] = r;
    while (!st && n > 0) {
        int who = -1;
        mg_status e = mg_recv_any(j->g, theirs, (size_t)j->workers, MG_U8, from, n, TAG_ROLL,
                                  &who);
        st = mg__ps_lost(j, who, e);
        for (int w = 0; !st && !e && w < j->workers; w++) gone[w] |= theirs[w];
        int k = 0;
        for (int i = 0; i < n; i++)
            if (from[i] != who) from[k++] = from[i];
        n = k;
    }
    for (int w = 0; w < j->workers; w++) gone[w] |= j->gone[w];
    for (int r = 0; !st && r < world; r++)
        if (r != me && (r >= j->workers || !gone[r]))
            st = mg_send(j->g, gone, (size_t)j->workers, MG_U8, r, TAG_GONE);
    free(from);
    free(theirs);
    return st;
}

mg_status mg__ps_settle(void *c, mg_group **job)
{
    ps_job *j = c;
    *job = NULL;
    if (!j->elastic) return MG_OK;
    int me = mg_group_rank(j->g);
    uint8_t *gone = malloc((size_t)j->workers);
    int *out = malloc((size_t)j->workers * sizeof *out), n = 0;
    mg_status st = gone && out ? MG_OK : mg_error(MG_ENOMEM, "ps: out of memory");
    for (int w = 0; !st && w < j->workers; w++) gone[w] = j->gone[w];
    if (!st) st = roll_call(j, gone);
    if (!st && me < j->workers && gone[me])
        st = mg_error(MG_EPEER, "ps: the servers lost their link to this worker, and the job "
                      "goes on without it (--elastic)");
    for (int w = 0; !st && w < j->workers; w++) {
        if (gone[w]) leaves(j, w);
        if (j->gone[w]) out[n++] = w;
    }
    if (!st && n > j->excluded) {   /* the groups of the ranks that remain */
        if (me == j->workers)
            mg_log("ps: %d of %d workers go on; each keeps its share of the batch, so a step "
                   "trains on %d/%d of it (--elastic)", j->n_live, j->workers, j->n_live,
                   j->workers);
        mg_group *now = NULL, *workers = NULL;
        st = mg_group_exclude(j->g, out, n, &now);
        /* A worker's rank in the workers' group is its rank in the job. */
        if (!st && me < j->workers) st = mg_group_exclude(j->role, out, n, &workers);
        if (st) {
            mg_group_destroy(now);
        } else {
            mg_group_destroy(j->job_left);
            mg_group_destroy(j->role_left);
            j->job_left = *job = now;
            j->role_left = workers;
            j->excluded = n;
        }
    }
    free(gone);
    free(out);
    return st;
}
