/* Equivalence of strategies with one process: the training cases of
 * test_zero.c and test_pipeline.c (lenet5 with SGD and momentum on
 * Fashion-MNIST, gpt-mini with AdamW on the reference's text batches),
 * their data sources and the one-process run they are compared with.
 * Ranks write their results as files in mgt_tmpdir(). */
#ifndef MGT_EQUIV_H
#define MGT_EQUIV_H

#include "harness.h"
#include "multigrad/multigrad.h"

typedef struct {
    const char *model;   /* "lenet5", "gpt-mini" (the reference's) or "gpt-6" */
    int stage, world;
    int batch;           /* global batch of a micro-batch */
    int accumulate, steps;
    int port;
    const char *offload;   /* --offload disk: directory, or NULL */
    size_t window;         /* its window bytes */
    const char *save;      /* write a checkpoint after training here (rank files: .N) */
    /* pipeline: stages, schedule, chunks, micro-batches per step (then
     * accumulate), and whether to cut by hand (first: unit boundaries) */
    int pp, chunks;
    int pp_m;              /* the pipeline's M (0: accumulate); accumulate < pp_m: a short step */
    mg_pipe_kind pp_kind;
    const int *first;
    mg_device dev;         /* where the ranks train (the one process: the CPU) */
    bool offload_cpu;      /* with dev: the optimizer on the host (--offload cpu) */
} eq_case;

enum { T = 64, GB = 8 };   /* the gpt-mini reference: context, batch */

/* The micro-batches of a case: data-parallel rank `rank` of `world`
 * (world 1: one process taking every rank's micro-batches in turn). */
typedef struct {
    const eq_case *c;
    int rank, world;     /* whose rows: world 1 = all */
    int step, j;         /* eq_next micro-batch of the step */
    int parts;           /* micro-batches per step this eq_source gives */
    mg_dataset *train;
    int32_t *perm;
    const mg_text *text;
    const int32_t *offs; /* gpt: the reference's offsets, GB per step */
    float *x;
    int32_t *tok, *y;
} eq_source;

/* gpt-mini (the reference's), or gpt-6: 6 layers of 64 (not the
 * reference's) on the same text. */
bool eq_lm(const eq_case *c);
void eq_out_path(char *p, size_t cap, const char *what, int rank);
void eq_write_floats(const char *what, int rank, const float *v, size_t n);
float *eq_read_floats(const char *what, int rank, size_t n);
/* A source: micro-batch j of step `step` (mg_batch_source). */
bool eq_next(void *ud, mg_micro_batch *b);
mg_model *eq_make_model(const eq_case *c, const mg_st_file *ref, uint64_t seed);
mg_optim *eq_make_optim(const eq_case *c, mg_strategy *s);
/* c->steps steps through s; each step's loss (this process's mean) in
 * losses; returns the parameters as a vector (gathered). */
float *eq_train(const eq_case *c, mg_strategy *s, eq_source *src, float *losses);
void eq_open_data(const eq_case *c, eq_source *s, mg_st_file **ref);
void eq_close_data(eq_source *s, mg_st_file *ref);
/* One process on the CPU over every rank's micro-batches. */
float *eq_one_process(const eq_case *c, float *losses);
/* The 20 gpt-mini steps of procs ranks (their "losses", summing to the
 * global mean, and "params") against PyTorch's values within the
 * one-process test's bounds (test_gpt.c); what names the run. */
void eq_match_pytorch(int procs, const char *what);
/* Only the losses, of the files "losses" 0 .. procs-1. */
void eq_match_pytorch_losses(int procs, const char *what);
/* A rank's end: each of them destroyed (any may be NULL). */
void eq_end_rank(mg_strategy *s, mg_model *m, eq_source *src, mg_st_file *ref, mg_group *g);
/* The two files exist and hold the same bytes. */
bool eq_same_file(const char *a, const char *b);
/* max |a - b| / max |b| */
double eq_max_rel(const float *a, const float *b, size_t n);

#endif
