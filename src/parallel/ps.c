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
 *     slot per worker and summed in a binary tree over the workers, so its
 *     bits do not depend on arrival; it goes through the strategy's step
 *     (the mean over the micro-batches, clipping over the servers' runs,
 *     the optimizer). Under --deterministic (synchronous only) the pushes
 *     are the workers' subtrees of det.c and that tree is its upper levels:
 *     one process's bits.
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
 *     ranges), rank 0 the rest; every rank reads what it holds. A fully
 *     asynchronous job's hold the most updates a server applied as the
 *     optimizer's steps (mg_strategy_save), which a resume gives every
 *     server.
 *   - Elastic (--elastic, under mgrun --elastic): every rank contains its
 *     peers' failures. A server that loses a worker's link goes on
 *     without it: its steps wait for the workers that remain, and a step
 *     is the mean of the pushes that came. Between steps, before the
 *     job's collectives, the roll call: server 0 hears every other rank
 *     and tells each which workers left, and the ranks that remain make
 *     the groups of those that remain (mg_group_exclude). The survivors
 *     keep their shares of each batch (the one lost is not trained on);
 *     evaluation spreads over them, whole. The job's collectives between
 *     steps run on those groups, never on the job's own (a failed
 *     collective ends its group), and a second roll call follows them:
 *     where they failed, the rank gives them up first (mg_group_revoke,
 *     so that no peer waits on it), and when a worker left meanwhile (or
 *     none did: a stall past MG_PEER_TIMEOUT, at most twice in a row)
 *     every rank that remains does them again over new groups.
 * This file: the job both roles share (the runs, the roles, the roll
 * call); ps_server.c and ps_worker.c the two components.
 * Limits: memory for (S + 1) x workers pushes of its run on a server under
 * bounded staleness; no tensor or pipeline parallelism with it; the
 * model's buffers (batch statistics) stay each worker's; a server's
 * failure stops the job (mgrun --max-restarts restarts it from its last
 * checkpoint), as does a worker's before the first roll call (the job's
 * set-up); a worker taken as lost that comes back leaves (MG_ELEFT). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/ps.h"

static int by_offset(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* The arena cut at unit borders into `servers` runs of about equal
 * parameters, each cut at the border nearest its share (the last run takes
 * the arena's end). A model's units lie in its arena in any order (last
 * unit first, for DDP's buckets), so the borders are their ends sorted;
 * units without parameters (a tied output layer) have none. */
static mg_status cut_runs(ps_job *j)
{
    int nu = mg_model_num_units(j->m), K = j->servers, n = 0;
    size_t total = mg_model_arena_size(j->m);
    size_t *end = malloc((size_t)(nu ? nu : 1) * sizeof *end);
    if (!end || !(j->run = calloc((size_t)K, sizeof *j->run))) {
        free(end);
        return mg_error(MG_ENOMEM, "ps: out of memory");
    }
    for (int u = 0; u < nu; u++) {
        size_t a, b;
        mg_model_unit_range(j->m, u, &a, &b);
        if (b > a) end[n++] = b;
    }
    if (n < K) {
        free(end);
        return mg_error(MG_EINVAL, "--servers %d: the model has %d units with parameters to "
                        "split among them; give at most %d", K, n, n);
    }
    qsort(end, (size_t)n, sizeof *end, by_offset);
    size_t lo = 0;
    for (int k = 0, i = 0; k < K; k++) {
        size_t want = total * (size_t)(k + 1) / (size_t)K, hi = lo;
        /* Borders up to the share, leaving one for each run after; the
         * first past it where it is nearer. */
        for (; i < n - (K - 1 - k); i++) {
            bool past = end[i] > want;
            if (past && hi > lo && end[i] - want >= want - hi) break;
            hi = end[i];
            if (past) {
                i++;
                break;
            }
        }
        if (k + 1 == K) hi = total;
        j->run[k] = (mg_range){lo, hi};
        lo = hi;
    }
    free(end);
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
    /* Three mistakes, one message each (a probe: 0 servers were said to
     * leave no worker). */
    if (!j->g)
        return mg_error(MG_EINVAL, "--parallel ps: a parameter server needs a job of 2 or more "
                        "ranks (a group): start it under mgrun or torchrun");
    if (j->servers < 1)
        return mg_error(MG_EINVAL, "--parallel ps: %d server(s): give --servers 1 or more "
                        "(ps_servers)", j->servers);
    if (j->workers < 1)
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

/* A roll call message from `from` whose failed rank is not the job's. */
static mg_status malformed(ps_job *j, int from, int32_t failed)
{
    char who[96];
    return mg_error(MG_EFORMAT, "ps: the roll call from %s names rank %d as the one whose "
                    "collectives failed, in a job of %d ranks", mg_group_rank_name(j->g, from, who,
                    sizeof who), (int)failed, mg_group_size(j->g));
}

/* The roll call's exchange, over the job's own group (which contains the
 * workers' failures), of `said`: per worker whether it left, then the
 * rank whose collectives failed since the last roll call (-1: none).
 * Server 0 hears every rank that remains (their workers gone, added to
 * its own; the first rank that failed; a worker whose link fails
 * meanwhile has left too) and answers each. A worker lost while it is
 * answered is left for the next roll call: the others have the list
 * without it. */
static mg_status roll_call(ps_job *j, int32_t *said)
{
    int W = j->workers, world = W + j->servers, root = W, me = mg_group_rank(j->g);
    size_t len = (size_t)W + 1;
    if (me != root) {
        MG_TRY(mg_send(j->g, said, len, MG_I32, root, TAG_ROLL));
        MG_TRY(mg_recv(j->g, said, len, MG_I32, root, TAG_GONE));
        return said[W] >= -1 && said[W] < world ? MG_OK : malformed(j, root, said[W]);
    }
    int *from = malloc((size_t)world * sizeof *from), n = 0;
    int32_t *theirs = malloc(len * sizeof *theirs);
    mg_status st = from && theirs ? MG_OK : mg_error(MG_ENOMEM, "ps: out of memory");
    for (int r = 0; !st && r < world; r++)
        if (r != me && (r >= W || !j->gone[r])) from[n++] = r;
    while (!st && n > 0) {
        int who = -1;
        mg_status e = mg_recv_any(j->g, theirs, len, MG_I32, from, n, TAG_ROLL, &who);
        st = mg__ps_lost(j, who, e);
        if (!st && !e && (theirs[W] < -1 || theirs[W] >= world))
            st = malformed(j, who, theirs[W]);
        for (int w = 0; !st && !e && w < W; w++) said[w] |= theirs[w] != 0;
        if (!st && !e && theirs[W] >= 0 && (said[W] < 0 || theirs[W] < said[W]))
            said[W] = theirs[W];
        int k = 0;
        for (int i = 0; i < n; i++)
            if (from[i] != who) from[k++] = from[i];
        n = k;
    }
    for (int w = 0; w < W; w++) said[w] |= j->gone[w];
    for (int r = 0; !st && r < world; r++)
        if (r != me && (r >= W || !said[r])) {
            mg_status e = mg_send(j->g, said, len, MG_I32, r, TAG_GONE);
            st = r < W ? mg__ps_lost(j, r, e) : e;
        }
    free(from);
    free(theirs);
    return st;
}

/* How many times in a row the job's collectives between steps are done
 * again when they failed and no worker left. */
enum { REDO_WITHOUT_LEAVING = 2 };

/* The groups of the ranks that remain, without the `n` workers in out
 * (the job's, and the workers' own), in place of the last ones. Every
 * rank that remains makes them together. */
static mg_status remake_groups(ps_job *j, const int *out, int n)
{
    int me = mg_group_rank(j->g);
    mg_group *now = NULL, *workers = NULL;
    mg_status st = mg_group_exclude(j->g, out, n, &now);
    /* A worker's rank in the workers' group is its rank in the job. */
    if (!st && me < j->workers) st = mg_group_exclude(j->role, out, n, &workers);
    if (st) {
        mg_group_destroy(now);
        return st;
    }
    mg_group_destroy(j->job_left);
    mg_group_destroy(j->role_left);
    j->job_left = now;
    j->role_left = workers;
    j->excluded = n;
    return MG_OK;
}

/* The groups between steps given up on this rank: their peers'
 * operations there fail at once, naming this rank and why. */
static void give_up(ps_job *j, const char *why)
{
    if (j->job_left) mg_group_revoke(j->job_left, why);
    if (j->role_left) mg_group_revoke(j->role_left, why);
}

/* The job's collectives between steps run on groups of their own, made
 * at the first roll call (j->job_left, j->role_left), never on the job's
 * group: a collective that fails ends its group on every rank, and the
 * roll call after it still needs the job's. */
mg_status mg__ps_settle(void *c, bool failed, bool *again, mg_group **job)
{
    ps_job *j = c;
    *job = NULL;
    *again = false;
    if (!j->elastic) return MG_OK;
    int me = mg_group_rank(j->g), W = j->workers;
    char who[96];
    if (failed) give_up(j, "its collectives between steps failed");   /* no peer waits on it */
    int32_t *said = malloc(((size_t)W + 1) * sizeof *said);
    int *out = malloc((size_t)W * sizeof *out), n = 0;
    mg_status st = said && out ? MG_OK : mg_error(MG_ENOMEM, "ps: out of memory");
    for (int w = 0; !st && w < W; w++) said[w] = j->gone[w];
    if (!st) said[W] = failed ? me : -1;
    if (!st) st = roll_call(j, said);
    if (!st && me < W && said[me])
        st = mg_error(MG_ELEFT, "ps: the servers lost their link to this worker, and the job "
                      "goes on without it (--elastic)");
    for (int w = 0; !st && w < W; w++)
        if (said[w]) {
            leaves(j, w);
            out[n++] = w;
        }
    int first_failed = st ? -1 : said[W];
    bool left = n > j->excluded;
    /* Failed with no worker gone: a peer stalled past MG_PEER_TIMEOUT that
     * came back, or a failure of their own, which a few tries show. */
    j->failed_in_a_row = first_failed < 0 ? 0 : j->failed_in_a_row + 1;
    bool redo = first_failed >= 0 && (left || j->failed_in_a_row <= REDO_WITHOUT_LEAVING);
    if (!st && first_failed >= 0 && !redo && !failed)
        st = mg_error(MG_EPEER, "ps: the job's collectives between steps (evaluation, the log, a "
                      "checkpoint) failed on %s %d times in a row, and no worker left: the job "
                      "stops (its message says why)",
                      mg_group_rank_name(j->g, first_failed, who, sizeof who), j->failed_in_a_row);
    if (!st && (first_failed < 0 || redo)) {
        if (left && me == W)
            mg_log("ps: %d of %d workers go on; each keeps its share of the batch, so a step "
                   "trains on %d/%d of it (--elastic)", j->n_live, W, j->n_live, W);
        if (redo && me == W && left)
            mg_log("ps: the job's collectives between steps (evaluation, the log, a checkpoint) "
                   "failed on %s as a worker left amid them: the %d worker(s) that remain do "
                   "them again (--elastic)", mg_group_rank_name(j->g, first_failed, who,
                   sizeof who), j->n_live);
        else if (redo && me == W)
            mg_log("ps: the job's collectives between steps (evaluation, the log, a checkpoint) "
                   "failed on %s while every worker remains: done again, try %d of %d "
                   "(--elastic)", mg_group_rank_name(j->g, first_failed, who, sizeof who),
                   j->failed_in_a_row + 1, REDO_WITHOUT_LEAVING + 1);
        if (redo) give_up(j, "they are done again");   /* on every rank: closed at once */
        if (!j->job_left || left || redo) st = remake_groups(j, out, n);
        if (!st) *job = j->job_left;
        *again = !st && redo;
    }
    free(said);
    free(out);
    return st;
}
