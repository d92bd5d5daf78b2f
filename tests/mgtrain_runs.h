/* What the mgtrain end-to-end tests share (test_mgtrain*.c): the small
 * gpt-mini they train, and how far a run's saved parameters are from a
 * reference's. */
#ifndef MGT_MGTRAIN_RUNS_H
#define MGT_MGTRAIN_RUNS_H

/* A gpt-mini small enough for tests: 2 layers, dim 64, 4 heads, context 64,
 * batch 12 (divides among 2, 3 and 4 ranks and workers), 16 validation
 * windows (all 512 the text has take most of a short run under TSan). */
#define GPT_SMALL "--model gpt-mini --layers 2 --dim 64 --heads 4 --ctx 64 --batch 12 " \
                  "--eval-windows 16"

/* |a - b| / |b| over all parameters of two gpt-mini checkpoints of
 * GPT_SMALL (optimizer state left out); *max_rel gets
 * max |a_i - b_i| / max |b|. */
double mgt_ckpt_rel_diff(const char *a, const char *b, double *max_rel);

/* The first n_train training and n_test test images of Fashion-MNIST as a
 * data set of their own in the test's directory (an epoch of a size the
 * test chooses, whatever the runner cut MG_DATA to): its path. */
const char *mgt_fashion_cut(int n_train, int n_test);

/* Each set of flags, on 2 ranks of the mlp, refused with its message
 * (the list ends with NULLs). */
typedef struct {
    const char *args, *want;
} mgt_refusal;

void mgt_refused(const mgt_refusal *c);

#endif
