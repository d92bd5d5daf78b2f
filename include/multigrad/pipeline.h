/* multigrad — pipeline parallelism: the schedules (pipeline_sched.c), pure
 * functions testable without processes, and the executor's public face
 * (pipeline.c: its cut and counters; a strategy, plan.h, runs it). */
#ifndef MULTIGRAD_PIPELINE_H
#define MULTIGRAD_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>
#include "core.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- pipeline schedules (schedule.c) ----------------------------------------
 *
 * A schedule is a pure function of (kind, P ranks, M micro-batches, V
 * chunks per rank, rank) to the ordered list of that rank's actions, as
 * torch.distributed.pipelining's IR: F and B of a (virtual) stage and a
 * micro-batch, and, once lowered, the sends and receives between
 * neighbouring stages. The model is cut into S = P·V stages; stage s runs
 * on rank s mod P (Megatron-LM's interleaving; V = 1 for the others).
 * One executor runs any list; a new schedule is one new generator. The
 * text form of an action is "<stage><kind><micro-batch>": 0F3, 1B0,
 * 1RECV_F3, 0SEND_B2. */
typedef enum { MG_PIPE_NAIVE, MG_PIPE_GPIPE, MG_PIPE_1F1B, MG_PIPE_INTERLEAVED } mg_pipe_kind;
/* The pipeline strategy's schedule (the executor, pipeline_exec.c, below). */
typedef struct mg_pipe_options {
    mg_pipe_kind kind;
    int micro_batches;   /* M: micro-batches per step */
    int chunks;          /* V (interleaved); 0 means 1 */
    const int *first;    /* S + 1 unit boundaries, or NULL: balanced */
} mg_pipe_options;
typedef struct mg_pipe mg_pipe;

/* "naive" | "gpipe" | "1f1b" | "interleaved" */
mg_status mg_pipe_parse(const char *s, mg_pipe_kind *out);
const char *mg_pipe_name(mg_pipe_kind k);

typedef enum { MG_PIPE_F, MG_PIPE_B, MG_PIPE_SEND_F, MG_PIPE_RECV_F, MG_PIPE_SEND_B,
               MG_PIPE_RECV_B } mg_pipe_op;
typedef struct mg_pipe_action {
    int stage;   /* virtual stage: chunk * P + rank */
    mg_pipe_op op;
    int mb;      /* micro-batch */
} mg_pipe_action;

/* MG_EINVAL with a message unless 1 <= P, 1 <= M, 1 <= V, V > 1 only for
 * interleaved, and interleaved has M >= P (Megatron-LM's groups of at
 * least P micro-batches). */
mg_status mg_pipe_check(mg_pipe_kind k, int P, int M, int V);
/* The rank's compute actions (F and B only): the generators.
 *   naive:       F0 B0 F1 B1 ...: one micro-batch in the pipe at a time
 *                (with M = 1, the plain layer split). It also takes V > 1
 *                chunks (each micro-batch through all S stages and back),
 *                which mg_pipe_check refuses from users: the executor runs
 *                it for an interleaved step of fewer micro-batches than P.
 *   gpipe:       every F, then every B: M micro-batches in flight.
 *   1f1b:        P-1-rank warm-up forwards, then one F one B, then the
 *                remaining B: at most P-rank in flight (PipeDream-Flush).
 *   interleaved: 1F1B over the rank's V chunks, the micro-batches in
 *                groups each run through chunk 0, then 1, ... (Megatron-
 *                LM): M/P groups as even as can be, so groups of P where
 *                P divides M; bubble (P-1)/(V·M+P-1) for any M >= P.
 * Returns the count (2·M·V), writing at most cap actions. */
int mg_pipe_compute(mg_pipe_kind k, int P, int M, int V, int rank, mg_pipe_action *out, int cap);
/* The same with communication: RECV_F before each F of a stage s > 0,
 * SEND_F after it when s < S-1; RECV_B before each B of s < S-1, SEND_B
 * after it when s > 0. Interleaved runs in lock-step, as Megatron-LM
 * batches it: its computations in iterations (a warm-up F, an F and a B,
 * a cool-down B), after each the sends of its results and then the
 * receives of the next iteration, so every rank's batches meet its
 * neighbours' also where a send ends only with its receive; where groups
 * are longer than P, what goes round between the last rank and rank 0 is
 * received as soon as it is sent, up to (longest group - P) iterations
 * before it is used. Returns the count, writing at most cap. */
int mg_pipe_lower(mg_pipe_kind k, int P, int M, int V, int rank, mg_pipe_action *out, int cap);
/* What the executor runs for a step of M micro-batches (M may be short
 * of the schedule's at an epoch's end): the lowered list of k, or with
 * fwd_only (evaluation) its forwards, sends and receives alone, GPipe's
 * for one chunk a rank; an interleaved step of fewer than P micro-batches
 * runs naive's order over the V chunks. Returns the count, writing at
 * most cap. */
int mg_pipe_lower_step(mg_pipe_kind k, int P, int M, int V, int rank, bool fwd_only,
                       mg_pipe_action *out, int cap);
/* The executor posts each run of sends and receives between two
 * computations as one batch (mg_batch_isend_irecv) of at most this many. */
#define MG_PIPE_BATCH_MAX 8
/* The stage a send goes to or a receive comes from: the next (s + 1) for
 * SEND_F and RECV_B, the previous for SEND_B and RECV_F. */
int mg_pipe_peer_stage(const mg_pipe_action *a);
/* How an action changes the micro-batches its rank holds (a tape each, as
 * the executor takes them): +1 at the receive of an input (RECV_F) or a
 * forward on stage 0, -1 at a backward, else 0. */
int mg_pipe_held_change(const mg_pipe_action *a);
/* "0F3" and so on; the list joined by spaces. */
void mg_pipe_action_str(const mg_pipe_action *a, char *buf, size_t cap);
void mg_pipe_list_str(const mg_pipe_action *a, int n, char *buf, size_t cap);

/* Every rank's lowered list run in lock-step: sends never block, a
 * receive waits for its send, a forward costs tf and a backward tb (on a
 * chunk), messages are free. Since a send, once done, stays done, a list
 * set that completes this way completes under any interleaving of the
 * ranks; one that cannot is a deadlock (MG_EINVAL naming the stuck
 * actions). Also checks that every send has its one receive and every
 * backward, and every receive of a gradient, follows its forward. */
typedef struct mg_pipe_sim {
    double makespan;       /* time of the last action */
    double busy[64];       /* per rank: time computing */
    double idle_fraction;  /* 1 - mean busy / makespan: the bubble */
    int peak_in_flight[64];/* per rank, at most: micro-batches held, each from
                              the receive of its input (its forward on
                              stage 0) to its backward, as the executor does */
    long messages;         /* sends */
} mg_pipe_sim;
mg_status mg_pipe_simulate(mg_pipe_kind k, int P, int M, int V, double tf, double tb,
                           mg_pipe_sim *out);   /* (naive with V > 1 too) */
/* Cutting the model into S stages at unit boundaries (units in forward
 * order): first[s] is stage s's first unit, first[0] = 0, first[S] = n,
 * every stage at least one unit. balance minimises the largest stage's
 * cost (cost[u]: the unit's estimate, e.g. its forward FLOPs); MG_EINVAL
 * when S > n. split_parse takes the user's cut (--split): the names of the
 * units where stages 1 .. S-1 begin, comma-separated, in forward order. */
mg_status mg_pipe_balance(const double *cost, int n, int S, int *first);
mg_status mg_pipe_split_parse(const char *spec, const char *const *names, int n, int S,
                              int *first);

/* The same for any lists: a[r] (n[r] actions) is rank r's, for S stages
 * (stage s on rank s mod P) and M micro-batches: the validator of a
 * hand-written or new schedule. Lists without a backward are forwards
 * alone (evaluation): every stage's forward of every micro-batch. */
mg_status mg_pipe_run(const mg_pipe_action *const *a, const int *n, int P, int S, int M,
                      double tf, double tb, mg_pipe_sim *out);

/* The executor's batches where a send ends only with its receive and the
 * messages between two ranks are matched in the order they were posted,
 * not by tag: NCCL's ncclSend and ncclRecv in one ncclGroupStart/End, as
 * a pipeline between GPUs sends (mg_batch_isend_irecv). Each rank's list
 * is cut into batches as the executor posts them; a rank's batches run one
 * at a time in order (its group's progress thread, NCCL's stream); a
 * batch ends once each of its messages has met its partner in the peer's
 * running batch. Waiting for a batch, or for the sends, adds no deadlock
 * here: what would run after it waits in the rank's queue anyway. First
 * the lists pass mg_pipe_run; then MG_EINVAL names two messages the order
 * would cross, a batch over MG_PIPE_BATCH_MAX, or the stuck batches of a
 * deadlock. run_rendezvous takes any lists; simulate_rendezvous the
 * executor's for a schedule (mg_pipe_lower_step). */
mg_status mg_pipe_run_rendezvous(const mg_pipe_action *const *a, const int *n, int P, int S,
                                 int M);
mg_status mg_pipe_simulate_rendezvous(mg_pipe_kind k, int P, int M, int V, bool fwd_only);



/* ---- the pipeline executor (pipeline.c, pipeline_exec.c) -----------------
 *
 * Runs any schedule above on a group of P ranks (the mesh's pp group):
 * the model is cut into S = P·V stages at unit boundaries (first, or
 * balanced by the units' forward FLOPs), rank r runs stages r, r + P, ...
 * each micro-batch on a tape of its stage's units (mg_tape_create_range),
 * as many tapes as micro-batches in flight. Activations and their
 * gradients travel between neighbouring stages in batches of sends and
 * receives (mg_batch_isend_irecv), tagged by stage and micro-batch; a
 * failed transfer names both stages and the micro-batch. Every rank
 * makes the whole model (one initialisation, as in one process) and
 * keeps only its stages' parameters (plus parameters its units borrow
 * from another rank's: gpt's head tied to the embedding, whose
 * gradients the two ranks add after the last backward). A strategy (plan.h)
 * runs it as a component; its parts are internal (src/parallel/
 * internal.h). */
/* The cut: S + 1 unit boundaries (*stages gets S). */
const int *mg_pipe_cut(const mg_pipe *p, int *stages);
/* A unit's cost as the balanced cut weighs it: its forward FLOPs (its
 * parameters when it has none, e.g. an embedding). */
double mg_pipe_unit_cost(const mg_model *m, int u);
typedef struct mg_pipe_stats {
    long steps;
    /* Summed over steps: computing forwards and backwards, and from the
     * step's start until every stage finished it. */
    double busy_us, step_us;
    int peak_in_flight;         /* micro-batches held at once, at most */
    size_t activation_bytes;    /* their tapes and inputs, at most */
    /* Batches of sends and receives posted (a model on a device receives
     * them in its memory: between GPUs with NCCL, through NCCL's sends and
     * receives). */
    long batches;
} mg_pipe_stats;
mg_pipe_stats mg_pipe_get_stats(const mg_pipe *p);

#ifdef __cplusplus
}
#endif
#endif
