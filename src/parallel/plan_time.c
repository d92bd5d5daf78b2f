/* The planner's time side: a model of one step of a plan, from the
 * figures the units give (forward FLOPs per sample, bytes out, what their
 * split layers move through the tensor-parallel group) and the cluster's
 * rates.
 *   - Compute: a training micro-batch of the rank's part as measured for
 *     its size (or from the FLOPs at the rank's rate plus an overhead),
 *     split over the stages by their FLOPs, a third forward and two
 *     thirds backward, recomputation a forward again. Measured, it is
 *     what the node's ranks running at once each take; from figures,
 *     ranks beyond a node's cores share them. The collectives' copies are
 *     the cores' work too: on a node whose ranks outnumber its cores
 *     their links slow by that ratio.
 *   - Tensor parallelism: measured with its group's ranks, within the
 *     compute; from figures, each unit's collectives as all-reduces over
 *     the tp group (mg_coll_time), on the critical path, and the parallel
 *     cross-entropy's three floats a position.
 *   - A pipeline: a micro-batch's forward and backward on the slowest
 *     chunk, with its activation's send to the next stage, run through
 *     the schedule's simulation (mg_pipe_simulate): the bubble is what
 *     the makespan adds to the work.
 *   - Data parallelism: the gradients' collectives over the dp group
 *     (DDP: an all-reduce; ZeRO: reduce-scatters, all-gathers), in
 *     buckets of the cap, on the link the group spans (within a node when
 *     it fits in one: the mesh puts tp, then dp, fastest). What DDP and
 *     ZeRO launch during backward hides behind it in the cluster's
 *     overlap share of it, always but the last bucket; the all-gathers
 *     after the optimizer never hide. ZeRO-3 gathers into pages it gave
 *     back (offloaded, its piece too), and a pipeline's ZeRO 2-3 give
 *     back the gradients outside the piece, written again in backward:
 *     those bytes at the measured refill rate, with the collectives.
 *   - The optimizer: a pass reading and writing its state, the
 *     parameters and the gradients at the rank's memory rate.
 *   - Offload: the optimizer streams its state (and ZeRO-3's parameter
 *     pieces, ZeRO 2-3's gradient pieces) from the files and back while
 *     it computes (an I/O thread: the slower of the two counts where
 *     cores are spare, their sum where the copies share the rank's core,
 *     in the overlap share between); ZeRO 2-3
 *     write each micro-batch's gradient pieces to the file and read the
 *     sum so far back (all but the first), and ZeRO-3 reads a bucket's
 *     parameter piece at each gather (forward and backward), inside the
 *     step. All at the files' measured rate.
 * Limits: given figures (--flops) run every GEMM at one rate; no
 * contention between the dimensions' collectives; one link per group
 * (its slowest). */
#include <math.h>
#include <stdlib.h>
#include "parallel/planner_internal.h"

/* The link a group of `size` ranks spaced `stride` apart spans: in[0]
 * within a node, in[1] between nodes. */
static const mg_link *link_of(const mg_plan_cluster *cl, const mg_link in[2], int size,
                              int stride)
{
    return (size_t)size * (size_t)stride <= (size_t)cl->ranks_per_node &&
                   cl->ranks_per_node % (size * stride) == 0
               ? &in[0] : &in[1];
}

/* Seconds of the collective over the group, its bytes in buckets of cap
 * (ZeRO's reduce-scatters and all-gathers as measured against the model). */
static double bucketed(const mg_plan_cluster *cl, mg_coll c, double bytes, int p,
                       const mg_link *l, double cap, double *last)
{
    double n = bytes > cap ? ceil(bytes / cap) : 1;
    double scale = c == MG_COLL_REDUCE_SCATTER ? cl->rs_scale
                   : c == MG_COLL_ALL_GATHER   ? cl->ag_scale : 0;
    double one = mg_coll_time(c, bytes / n, p, l) * (scale > 0 ? scale : 1);
    if (last) *last = one;
    return n * one;
}

/* Seconds of a training micro-batch of n samples on a rank's part under
 * tp, from the measured sizes (0: none measured). */
static double micro_seconds(const mg_plan_cluster *cl, int tp, int n)
{
    if (tp > MG_PLAN_MEASURED_TP) return 0;
    const double *t = cl->micro_s[tp];
    int lo = -1, hi = -1;   /* the measured sizes around n */
    for (int k = 0; k < MG_PLAN_SIZES; k++) {
        if (t[k] <= 0) continue;
        if ((1 << k) <= n) lo = k;
        if ((1 << k) >= n && hi < 0) hi = k;
    }
    if (lo < 0 && hi < 0) return 0;
    if (lo < 0) return t[hi] * n / (1 << hi);   /* below the smallest */
    if (hi < 0 || hi == lo) return t[lo] * n / (1 << lo);   /* beyond the largest */
    double a = 1 << lo, b = 1 << hi;
    return t[lo] + (t[hi] - t[lo]) * (n - a) / (b - a);
}

/* Units [a, b) of m: forward FLOPs, tp floats forward and backward per
 * sample, and the tp all-reduces' seconds for a micro-batch. */
typedef struct {
    double flops, tp_s_fwd, tp_s_bwd;
} span;

static span span_of(const mg__plan_shape *sh, int a, int b, const mg_plan *p,
                    const mg_link *tpl, bool in_compute)
{
    span s = {0, 0, 0};
    double local = p->local;
    for (int u = a; u < b; u++) {
        const mg_unit_info *ui = &sh->unit[u];
        s.flops += ui->flops * local;
        if (in_compute || p->tp == 1) continue;
        if (ui->tp_fwd_floats > 0)
            s.tp_s_fwd += mg_coll_time(MG_COLL_ALL_REDUCE, ui->tp_fwd_floats * 4 * local, p->tp, tpl);
        if (ui->tp_bwd_floats > 0)
            s.tp_s_bwd += mg_coll_time(MG_COLL_ALL_REDUCE, ui->tp_bwd_floats * 4 * local, p->tp, tpl);
    }
    /* The parallel cross-entropy: the rows' maxima, then sums and labels. */
    if (p->tp > 1 && !in_compute && b == sh->n) {
        double rows = local * mg_model_positions(sh->m);
        s.tp_s_fwd += mg_coll_time(MG_COLL_ALL_REDUCE, rows * 4, p->tp, tpl) +
                      mg_coll_time(MG_COLL_ALL_REDUCE, rows * 8, p->tp, tpl);
    }
    return s;
}

mg_status mg__plan_time(const mg_plan_job *job, const mg_plan_cluster *cl,
                        const mg__plan_shape *sh, const int *first, const size_t *stage_floats,
                        mg_plan *p)
{
    double part;    /* a sample's forward FLOPs of the rank's tp part */
    mg_model_flops(sh->m, &part, NULL);
    /* A micro-batch's forward and backward of the whole part: measured,
     * or from the rate and overhead. */
    double whole = micro_seconds(cl, p->tp, p->local);
    bool measured = whole > 0;   /* by the node's ranks at once: sharing its cores */
    if (!measured) whole = cl->overhead / p->tp + 3 * part * p->local / cl->flops;
    int S = p->pp * p->chunks;
    /* Ranks beyond the node's cores share them, computing and copying
     * (the builtin transports' collectives are the CPU's work; the links
     * were measured with nothing else running). */
    double share = cl->cores > 0 && cl->cores < cl->ranks_per_node
                       ? (double)cl->ranks_per_node / cl->cores : 1.0;
    double cshare = measured ? 1.0 : share;
    mg_link links[2] = {cl->intra, cl->inter};
    for (int i = 0; i < 2; i++) {
        links[i].latency *= share;
        links[i].bandwidth /= share;
        links[i].reduce /= share;
    }
    const mg_link *tpl = link_of(cl, links, p->tp, 1), *dpl = link_of(cl, links, p->dp, p->tp);
    const mg_link *ppl = link_of(cl, links, p->pp, p->tp * p->dp);
    double rc = p->recompute ? 1 : 0;
    /* Per micro-batch, on the slowest rank: compute, tp, pp seconds. */
    double fwd = 0, bwd = 0, tpf = 0, tpb = 0, send = 0, dp_floats = 0;
    double worst = -1;
    for (int r = 0; r < p->pp; r++) {
        double f = 0, b = 0, tf = 0, tb = 0, sd = 0;
        for (int k = 0; k < p->chunks; k++) {
            int s = k * p->pp + r;
            span sp = span_of(sh, first[s], first[s + 1], p, tpl, measured && cl->micro_with_tp);
            /* The stage's share of the part's FLOPs: a third forward, two
             * thirds backward. */
            double t = part > 0 ? whole * cshare * sp.flops / p->local / part : 0;
            f += t / 3;
            b += (2 + rc) * t / 3;
            tf += sp.tp_s_fwd;
            tb += sp.tp_s_bwd + rc * sp.tp_s_fwd;
            if (s + 1 < S) {
                double bytes = (double)sh->unit[first[s + 1] - 1].out_bytes * p->local;
                sd += 2 * mg_coll_time(MG_COLL_SEND, bytes, 2, ppl);
            }
        }
        double all = f + b + tf + tb + sd;
        if (all > worst) {
            worst = all;
            fwd = f;
            bwd = b;
            tpf = tf;
            tpb = tb;
            send = sd;
            dp_floats = (double)stage_floats[r];
        }
    }
    double M = p->micro;
    p->compute = M * (fwd + bwd);
    p->tp_comm = M * (tpf + tpb);
    p->pp_comm = M * send;
    p->bubble = 0;
    double work = p->compute + p->tp_comm + p->pp_comm, makespan = work;
    if (p->pp > 1) {
        mg_pipe_sim sim;
        double V = p->chunks;
        MG_TRY(mg_pipe_simulate(p->schedule, p->pp, p->micro, p->chunks,
                                (fwd + tpf + send / 2) / V, (bwd + tpb + send / 2) / V, &sim));
        makespan = sim.makespan > work ? sim.makespan : work;
        p->bubble = makespan - work;
    }
    /* The data-parallel collectives of the gradients (floats of the arena
     * or the stage's ranges). */
    size_t first_cap, caps;
    mg__plan_buckets(job, &first_cap, &caps);
    double G = dp_floats * 4, cap = (double)caps;
    double backward = bwd + tpb;   /* of one micro-batch, on this rank */
    double hide = cl->overlap * backward, last = 0, launched = 0, after = 0;
    double refill = cl->refill_bytes_per_s[p->tp <= MG_PLAN_MEASURED_TP ? p->tp : 1];
    if (p->dp > 1) {
        int D = p->dp;
        /* Bytes of a gather (or a pipeline's gradients) into pages given back. */
        double back = refill > 0 ? G * (D - 1) / D / refill : 0;
        switch (p->zero) {
        case 0:
            launched = bucketed(cl, MG_COLL_ALL_REDUCE, G, D, dpl, cap, &last);
            break;
        case 1:
            launched = bucketed(cl, MG_COLL_REDUCE_SCATTER, G, D, dpl, cap, &last);
            after = bucketed(cl, MG_COLL_ALL_GATHER, G, D, dpl, cap, NULL);
            break;
        case 2:
            launched = bucketed(cl, MG_COLL_REDUCE_SCATTER, G, D, dpl, cap, &last);
            after = bucketed(cl, MG_COLL_ALL_GATHER, G, D, dpl, cap, NULL);
            if (p->pp == 1) {   /* a reduce-scatter every micro-batch */
                launched *= M;
                hide *= M;
            } else {            /* the gradients outside the piece given back */
                after += back;
            }
            break;
        default:
            launched = bucketed(cl, MG_COLL_REDUCE_SCATTER, G, D, dpl, cap, &last);
            if (p->pp == 1) {   /* gathered for forward and backward, every micro-batch */
                double ag = bucketed(cl, MG_COLL_ALL_GATHER, G, D, dpl, cap, NULL);
                if (p->offload && refill > 0) back = G / refill;   /* the piece too */
                launched = M * (launched + 2 * (ag + back));
                hide = cl->overlap * M * (fwd + tpf + backward);
            } else {            /* gathered once a step; the gradients given back */
                after = bucketed(cl, MG_COLL_ALL_GATHER, G, D, dpl, cap, NULL) + 2 * back;
            }
        }
    }
    double exposed = launched - hide;
    if (exposed < last) exposed = launched < last ? launched : last;
    p->dp_comm = launched + after;
    p->dp_exposed = exposed + after;
    /* The optimizer steps the rank's ranges, or ZeRO's 1/dp of them. */
    int states = mg__plan_states(job);
    double stepped = dp_floats / (p->zero ? p->dp : 1);
    p->optimizer = stepped * 4 * (3 + 2 * states) / cl->bytes_per_s * cshare;
    p->offload_io = 0;
    if (p->offload) {
        bool grads = mg__plan_grads_in_files(p), params = mg__plan_params_in_files(p);
        double piece = stepped * 4;
        double streamed = piece * (2 * states + (params ? 2 : 0) + (grads ? 1 : 0));
        double in_step = (grads ? (2 * M - 1) * piece : 0) + (params ? 2 * M * piece : 0);
        double stream_s = streamed / cl->disk_bytes_per_s, opt = p->optimizer;
        double longer = stream_s > opt ? stream_s : opt, shorter = stream_s + opt - longer;
        p->offload_io = in_step / cl->disk_bytes_per_s + longer - opt +
                        (1 - cl->overlap) * shorter;
    }
    p->step = makespan + p->dp_exposed + p->optimizer + p->offload_io;
    return MG_OK;
}
