/* Internal to the pipeline's two files: pipeline.c (the pipe: its cut,
 * the parameters a rank keeps, the ties) and pipeline_exec.c (the
 * executor: micro-batches in flight, their batches of sends and
 * receives, a step's lists). */
#ifndef MG_PARALLEL_PIPELINE_INTERNAL_H
#define MG_PARALLEL_PIPELINE_INTERNAL_H

#include "parallel/internal.h"

typedef struct flight {   /* a micro-batch in flight on a chunk */
    mg_tape *t;
    float *in;            /* its received input (stages > 0; on the model's device) */
    bool sending;         /* a send of its input gradient may be in flight */
} flight;

typedef struct chunk {
    int stage, u0, u1;
    size_t in_per, out_per;   /* floats per sample in and out */
    flight **pool;            /* free ones: pool[0 .. n_free) */
    int n_free, n_all;
    flight **all;             /* every one made (n_all) */
    flight **mb;              /* [micro-batch]: the one it runs on */
} chunk;

typedef struct tie {          /* a range this rank shares with another */
    size_t lo, hi;
    int peer;                 /* the other rank (in the pipeline group) */
    bool owner;               /* this rank holds the unit (counts it in norms and saves) */
} tie;

struct mg_pipe {
    mg_group *g;
    mg_model *m;
    mg_pipe_kind kind;
    int P, M, V, S, rank, max_batch;
    int *first;               /* S + 1 unit boundaries */
    chunk *ch;                /* V */
    mg_range ranges[MG_PIPE_MAX_RANGES];   /* this rank's, ascending */
    int n_ranges;
    mg_range own[MG_PIPE_MAX_RANGES];      /* of them, those not borrowed, not empty */
    int n_own;
    tie ties[8];
    int n_ties;
    bool ties_left;         /* mg__pipe_leave_ties */
    bool linked;              /* link_peers done */
    /* The step's micro-batches, copied. */
    float *x;
    int32_t *y;
    int *n;
    float *w;               /* each micro-batch's weight (mg_micro_batch) */
    size_t x_per, y_per;      /* input floats and labels per sample */
    /* The lowered list made last, for acts_for = 2·count + forward-only
     * (0: none yet). */
    mg_pipe_action *acts;
    bool *final_b;            /* per action: its stage's last backward of the step */
    int n_acts, acts_for;
    /* Called before each backward (final: its stage's last of the step). */
    void (*before_backward)(void *ud, bool final);
    mg_status (*after_backward)(void *ud);
    void *bb_ud;
    int cur_chunk;            /* of the backward after_backward follows */
    const mg_tape *logits;    /* the last stage's last forward's tape */
    float *host_logits;       /* on a device: their copy for mg__pipe_logits */
    /* Posted batches of sends only, not waited for yet. */
    mg_work **pend;
    int n_pend, cap_pend;
    int held;                 /* micro-batches holding a tape now, all chunks */
    mg_pipe_stats stats;
};

static inline size_t mg__pipe_fl(size_t n) { return n * sizeof(float); }

/* The executor's memory (its tapes, receive buffers, pending sends), freed
 * by mg__pipe_destroy. */
void mg__pipe_exec_free(mg_pipe *p);

#endif
