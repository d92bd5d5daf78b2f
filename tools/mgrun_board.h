/* The nodes' board (tools/mgrun.c): how the mgruns of a job of several
 * nodes tell each other what happened, through keys in node 0's store, as
 * torchrun's agents share a rendezvous. Without it each node learns of a
 * failure elsewhere only from its own workers, which wait for a lost peer
 * up to MG_PEER_TIMEOUT, and up to MG_TIMEOUT while their group forms (a
 * node started with another -n, a rank that failed before the group
 * formed); a node whose only worker was stopped waited for ever.
 *
 * Per attempt (MG_RUN_ID) a node posts the first failure of its workers,
 * or that its mgrun was interrupted or refused the job, once; every node
 * reads the board every BOARD_POLL_S while its workers run, and on another
 * node's post stops its own, saying why, and exits as that node does
 * (--max-restarts restarts every node's workers then, as torchrun does).
 * A node that can no longer read node 0's store (node 0's mgrun is gone)
 * stops its workers too. Each node counts itself done after each attempt;
 * node 0 keeps the store until every node is done, so that a node whose
 * workers are still finishing is not stopped by node 0's end (after a
 * failure, only long enough for the others to read the board). Each node
 * also registers its --node-rank once: a second launcher of one rank is
 * refused.
 *
 * Limits: a node that cannot reach the store at all (another secret, an
 * unreachable address) can post nothing: node 0's ranks then wait for it
 * up to MG_TIMEOUT as before. One round trip to the store per
 * BOARD_POLL_S per node while the job runs.
 *
 * A header of static functions because each tool is one source file. */
#ifndef MGRUN_BOARD_H
#define MGRUN_BOARD_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/comm.h"
#include "multigrad/core.h"

#define BOARD_POLL_S 0.25
/* A store request of the board waits at most this long, so that a node 0
 * cut off from this one does not hold up mgrun's poll loop for long. */
#define BOARD_REPLY_S 1.0

typedef struct {
    bool on;                    /* false: one node, no board */
    mg_store *s;                /* NULL while it connects again */
    int node, nnodes;
    const char *id;             /* this mgrun's own (two may claim one node rank) */
    char url[300];
    const char *secret;
    double checked;             /* when it was last read */
    double silent_since;        /* the store has not answered since (0: it does) */
} board;

/* Another node's post, as this node reads it. */
typedef struct {
    int rc;                     /* the exit status that node's mgrun gives */
    bool fatal;                 /* no restart: a refusal or an interruption */
    char why[400];              /* "node 1: rank 3 (pid 99) exited with status 7" */
} board_post_t;

static void board_key(char *k, size_t cap, int attempt, const char *what)
{
    snprintf(k, cap, "mgrun/a%d/%s", attempt, what);
}

/* Connects to the store at url; false after printing why. id: this
 * mgrun's (a word of letters and digits). */
static bool board_open(board *b, const char *url, const char *secret, int node, int nnodes,
                       const char *id)
{
    *b = (board){.node = node, .nnodes = nnodes, .id = id, .secret = secret};
    snprintf(b->url, sizeof b->url, "%s", url);
    if (mg_store_connect(url, secret, BOARD_REPLY_S, &b->s) == MG_OK) return b->on = true;
    fprintf(stderr, "mgrun: node %d cannot open the nodes' board in the rendezvous store at %s: "
            "%s\n", node, url, mg_last_error());
    return false;
}

static void board_close(board *b)
{
    mg_store_destroy(b->s);
    b->s = NULL;
    b->on = false;
}

/* Posts this node's outcome of attempt when it is the attempt's first
 * (what every node reads); best effort: a node that cannot post leaves
 * the others to learn of it from their workers. */
static void board_post(board *b, int attempt, int rc, bool fatal, const char *why)
{
    if (!b->s) return;   /* off, or not answering */
    char k[64], v[sizeof ((board_post_t *)0)->why + 64];
    int64_t first = 0;
    board_key(k, sizeof k, attempt, "claim");
    if (mg_store_add(b->s, k, 1, &first) || first != 1) return;
    int n = snprintf(v, sizeof v, "%d %d %d %s %s", rc, fatal ? 1 : 0, b->node, b->id, why);
    board_key(k, sizeof k, attempt, "why");
    if (mg_store_set(b->s, k, v, (size_t)n < sizeof v ? (size_t)n : sizeof v - 1)) return;
    board_key(k, sizeof k, attempt, "posted");
    mg_store_add(b->s, k, 1, NULL);
}

/* Reads the board for attempt: 1 when another node posted (in *p), -1
 * when node 0's store cannot be read (on node 0 itself: never), 0 when
 * nothing was posted or this mgrun posted it. */
static int board_read(board *b, int attempt, board_post_t *p)
{
    if (!b->on) return 0;
    double now = b->checked = mg_now();
    char k[64];
    int64_t posted = 0;
    board_key(k, sizeof k, attempt, "posted");
    mg_status st = b->s ? MG_OK : mg_store_connect(b->url, b->secret, BOARD_REPLY_S, &b->s);
    if (!st) st = mg_store_add(b->s, k, 0, &posted);
    if (st) {
        /* Closed: node 0's mgrun has ended. Silent: a link down, survived
         * as the ranks survive it, up to MG_PEER_TIMEOUT (0: for ever). */
        mg_store_destroy(b->s);
        b->s = NULL;
        double patience = mg_env_double("MG_PEER_TIMEOUT", 15);
        if (!b->silent_since) b->silent_since = now;
        if (b->node == 0 || (st == MG_ETIMEOUT &&
                             (patience <= 0 || now - b->silent_since < patience)))
            return 0;
        snprintf(p->why, sizeof p->why, "node 0's mgrun has ended (its rendezvous store is "
                 "gone: %s)", mg_last_error());
        p->rc = 1;
        p->fatal = true;
        return -1;
    }
    b->silent_since = 0;
    if (posted < 1) return 0;
    void *v = NULL;
    size_t n = 0;
    board_key(k, sizeof k, attempt, "why");
    if (mg_store_get(b->s, k, &v, &n)) return 0;
    int rc = 1, fatal = 1, node = -1, at = 0;
    char id[32] = "";
    bool ok = sscanf(v, "%d %d %d %31s %n", &rc, &fatal, &node, id, &at) == 4 && at > 0,
         mine = !strcmp(id, b->id);
    if (ok && !mine) {
        snprintf(p->why, sizeof p->why, "node %d: %s", node, (const char *)v + at);
        p->rc = rc;
        p->fatal = fatal != 0;
    }
    free(v);
    return ok && !mine;
}

/* This node is done with attempt (its workers have all exited). */
static void board_done(board *b, int attempt)
{
    if (!b->s) return;
    char k[64];
    board_key(k, sizeof k, attempt, "done");
    mg_store_add(b->s, k, 1, NULL);
}

/* Registers this node's rank once for the job; false when another
 * launcher registered it first (said, and posted on the board). */
static bool board_join(board *b)
{
    if (!b->s) return true;
    char k[64];
    int64_t seen = 0;
    snprintf(k, sizeof k, "mgrun/node%d", b->node);
    if (mg_store_add(b->s, k, 1, &seen) || seen == 1) return true;
    fprintf(stderr, "mgrun: another mgrun joined the job as --node-rank %d first: give each node "
            "its own --node-rank (or start the whole job again)\n", b->node);
    char why[200];
    snprintf(why, sizeof why, "a second mgrun was started as --node-rank %d: give each node its "
             "own --node-rank", b->node);
    board_post(b, 0, 1, true, why);
    board_done(b, 0);
    return false;
}

/* The node ranks that never registered (board_join), as "1, 3" into
 * list; how many. */
static int board_missing(board *b, char *list, size_t cap)
{
    int missing = 0;
    size_t len = 0;
    list[0] = 0;
    for (int node = 1; node < b->nnodes; node++) {
        char k[64];
        int64_t seen = 0;
        snprintf(k, sizeof k, "mgrun/node%d", node);
        if (mg_store_add(b->s, k, 0, &seen) || seen > 0) continue;
        if (len + 16 < cap)   /* room for ", " and any int: never cut */
            len += (size_t)snprintf(list + len, cap - len, "%s%d", missing ? ", " : "", node);
        else
            snprintf(list + len, cap - len, ", ...");   /* the same each time */
        missing++;
    }
    return missing;
}

/* Node 0, its workers of attempt done: waits until every node is done
 * with it, up to `wait` seconds, or until stop() says to give up (a
 * signal to mgrun). A failure another node posts meanwhile is said and
 * its status returned when this node's rc was 0; so is a node that never
 * joined the job (status 1: the job did not run whole). */
static int board_wait_done(board *b, int attempt, int rc, double wait, bool (*stop)(void))
{
    if (!b->on || !b->s) return rc;
    char k[64];
    board_key(k, sizeof k, attempt, "done");
    double until = mg_now() + wait;
    bool said = false;
    for (;;) {
        board_post_t p;
        if (!said && rc == 0 && board_read(b, attempt, &p) == 1) {
            fprintf(stderr, "mgrun: %s, after this node's workers ended\n", p.why);
            rc = p.rc ? p.rc : 1;
            said = true;
        }
        int64_t done = 0;
        if (mg_store_add(b->s, k, 0, &done) || done >= b->nnodes || stop()) return rc;
        if (mg_now() >= until) {
            char list[200];
            int missing = board_missing(b, list, sizeof list);
            if (missing)
                fprintf(stderr, "mgrun: node%s %s of %d never joined the job: no mgrun with "
                        "--node-rank %s reached this node's rendezvous store (%s); start %s with "
                        "the same --nnodes, --master-addr, --master-port and MG_JOB_SECRET\n",
                        missing > 1 ? "s" : "", list, b->nnodes, list, b->url,
                        missing > 1 ? "them" : "it");
            fprintf(stderr, "mgrun: %lld of %d nodes ended within %.0f s; ending the job's "
                    "rendezvous store\n", (long long)done, b->nnodes, wait);
            return missing && rc == 0 ? 1 : rc;
        }
        mg_sleep(0.05);
    }
}

#endif
