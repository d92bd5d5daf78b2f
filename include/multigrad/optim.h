/* multigrad — optimizers and learning-rate schedules.
 * An optimizer's state (momentum, Adam's m and v) lives in arenas of the
 * model's parameter layout, and a step updates a range [lo, hi): a ZeRO
 * shard is just a range. Semantics are torch.optim's. */
#ifndef MULTIGRAD_OPTIM_H
#define MULTIGRAD_OPTIM_H

#include <stddef.h>
#include "core.h"
#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MG_OPTIM_SGD, MG_OPTIM_ADAM, MG_OPTIM_ADAMW } mg_optim_kind;

typedef struct mg_optim_config {
    mg_optim_kind kind;
    float lr;
    float momentum;      /* SGD */
    float dampening;     /* SGD */
    bool nesterov;       /* SGD */
    float weight_decay;  /* SGD/Adam: added to the gradient; AdamW: decoupled */
    float beta1, beta2, eps; /* Adam/AdamW */
} mg_optim_config;

/* torch.optim defaults for a kind (betas 0.9/0.999, eps 1e-8; AdamW wd 0.01). */
mg_optim_config mg_optim_defaults(mg_optim_kind kind, float lr);
/* The state arrays an optimizer of cfg keeps, each as long as its ranges:
 * Adam/AdamW 2 (exp_avg, exp_avg_sq), SGD 1 with momentum, else 0. */
int mg_optim_states(const mg_optim_config *cfg);
/* "sgd" | "adam" | "adamw"; MG_EINVAL with a message otherwise. */
mg_status mg_optim_parse(const char *name, mg_optim_kind *out);
const char *mg_optim_kind_name(mg_optim_kind kind);

typedef struct mg_optim mg_optim;
/* State arenas of n floats (the model's arena_size). */
mg_status mg_optim_create(const mg_optim_config *cfg, size_t n, mg_optim **out);
/* State arenas of hi - lo floats for the range [lo, hi) of the arena that
 * this process updates. Updates, groups and steps take arena offsets. */
mg_status mg_optim_create_range(const mg_optim_config *cfg, size_t lo, size_t hi,
                                mg_optim **out);
/* State for several disjoint arena ranges, ascending (a ZeRO shard: this
 * rank's piece of every bucket): the state arrays hold the ranges one
 * after the other, so they are as long as the ranges together. */
typedef struct mg_range { size_t lo, hi; } mg_range;
mg_status mg_optim_create_ranges(const mg_optim_config *cfg, const mg_range *r, int n,
                                 mg_optim **out);
int mg_optim_num_ranges(const mg_optim *o);
mg_range mg_optim_range_at(const mg_optim *o, int k);
/* Floats per state array: the ranges' total length. */
size_t mg_optim_size(const mg_optim *o);
/* Bytes of state held in memory (offloaded: the windows). */
size_t mg_optim_bytes(const mg_optim *o);
void mg_optim_destroy(mg_optim *o);
const mg_optim_config *mg_optim_config_of(const mg_optim *o);

/* Parameter groups (torch's param_groups): ranges of the arena with their
 * own weight decay, e.g. AdamW decaying only the 2-D weights. Ranges must
 * not overlap; what no group covers keeps the configuration's decay; parts
 * outside the optimizer's range are ignored. */
typedef struct mg_optim_group {
    size_t lo, hi;
    float weight_decay;
} mg_optim_group;
mg_status mg_optim_set_groups(mg_optim *o, const mg_optim_group *groups, int n);

/* Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_):
 * the norm is sqrt of the sum of squares over every gradient of every
 * rank or shard (sum mg_grad_sumsq of each part, all-reduce where the
 * parts live on different ranks), then every gradient is multiplied by
 * mg_clip_coef(norm, max_norm) = min(1, max_norm / (norm + 1e-6)) (NaN
 * for a NaN norm, as torch's; the norm is summed in double, so gradients
 * whose float32 norm overflows, which torch zeroes, are clipped). */
double mg_grad_sumsq(const float *g, size_t n);
float mg_clip_coef(double norm, float max_norm);
void mg_grad_scale(float *g, size_t n, float s);
/* The three for gradients that all live here (one process, or DDP after
 * its all-reduce): clips g in place; returns the norm before clipping. */
double mg_clip_grad_norm(float *g, size_t n, float max_norm);

/* One optimizer step is: begin_step once (advances the step count, sets
 * the learning rate), then update over one or more ranges. */
void mg_optim_begin_step(mg_optim *o, float lr);
/* [lo, hi) must lie in one of the optimizer's ranges, after begin_step
 * (MG_EINVAL otherwise, nothing updated). */
mg_status mg_optim_update(mg_optim *o, float *params, const float *grads, size_t lo, size_t hi);
/* begin_step + update over all the optimizer's ranges. Both fail only
 * when offloaded (a read or write of the files: MG_EIO with the message). */
mg_status mg_optim_step(mg_optim *o, float *params, const float *grads, float lr);
/* Moves the state to device dev (device.h) or back to the CPU; updates
 * then run there, on that device's parameters and gradients. The state's
 * accessors (mg_optim_state*, read/write_state) then give device memory.
 * Offloaded state does not move (MG_EUNSUPPORTED). */
mg_status mg_optim_to_device(mg_optim *o, mg_device dev);
mg_device mg_optim_device(const mg_optim *o);

/* Offload (ZeRO-Infinity's, on a file system): the state arrays go to a
 * file in dir (mg_scratch: mode 0600, unlinked at once, reserved up front),
 * and when params (grads) is not NULL the parameters (gradients) of the
 * optimizer's ranges are in that file, laid out as a state array (range
 * after range), and the pointer given to update and step is not used
 * (gradients read from a file are multiplied by the factor of
 * mg_optim_scale_grads first, as mg_grad_scale would). A step streams
 * windows of window_bytes per array through three buffers: an I/O thread
 * reads the next window while this one is updated and writes the last one
 * back; only the windows are in memory. The results are bit-identical to
 * the optimizer in memory. State the optimizer holds goes into the file if
 * it has stepped. dir NULL: the states stay in memory. */
mg_status mg_optim_offload(mg_optim *o, const char *dir, size_t window_bytes, mg_scratch *params,
                           mg_scratch *grads);
/* The bytes an optimizer of cfg over n floats, offloaded with windows of
 * window_bytes, keeps in memory (mg_optim_bytes once offloaded): what a
 * planner counts. */
size_t mg_optim_offload_bytes(const mg_optim_config *cfg, size_t n, size_t window_bytes);
/* The factor of the next step's gradients from the gradient file
 * (clipping); 1 after each step. */
void mg_optim_scale_grads(mg_optim *o, float coef);
bool mg_optim_offloaded(const mg_optim *o);
/* Copy state s of arena offsets [lo, hi) (inside one range) out of the
 * optimizer or into it, offloaded or not; s -1 is the parameters in the
 * offload parameter store. */
mg_status mg_optim_read_state(mg_optim *o, int s, size_t lo, size_t hi, float *dst);
mg_status mg_optim_write_state(mg_optim *o, int s, size_t lo, size_t hi, const float *src);

/* Steps taken so far (restored from checkpoints). */
long mg_optim_steps(const mg_optim *o);
void mg_optim_set_steps(mg_optim *o, long steps);
/* State arrays: SGD with momentum has "momentum_buffer"; Adam(W) "exp_avg"
 * and "exp_avg_sq". Each holds mg_optim_size floats: the ranges' state one
 * range after the other. state_at: state i of arena offsets [lo, hi),
 * which must lie in one of the optimizer's ranges. */
int mg_optim_num_states(const mg_optim *o);
/* NULL (the name still given) when the states are offloaded: use
 * mg_optim_read_state / mg_optim_write_state. */
float *mg_optim_state(mg_optim *o, int i, const char **name);
float *mg_optim_state_at(mg_optim *o, int i, size_t lo, size_t hi);
/* Whether state i can never be negative (Adam's exp_avg_sq, a mean of
 * squares): a checkpoint that says otherwise is refused. */
bool mg_optim_state_nonnegative(const mg_optim *o, int i);

/* Learning-rate schedules. */
typedef enum { MG_SCHED_CONSTANT, MG_SCHED_STEP, MG_SCHED_COSINE } mg_sched_kind;
typedef struct mg_schedule {
    mg_sched_kind kind;
    float base_lr;
    long step_size;     /* STEP: multiply by gamma every step_size steps */
    float gamma;
    long total_steps;   /* COSINE: anneal to min_lr over total_steps */
    float min_lr;
    long warmup_steps;  /* linear warm-up from 0 to base_lr first (any kind) */
} mg_schedule;
/* Parse "constant", "step:STEPS:GAMMA", "cosine" or "cosine:MIN_LR", each
 * optionally followed by ",warmup:STEPS". total_steps is filled by the caller. */
mg_status mg_schedule_parse(const char *spec, float base_lr, mg_schedule *out);
float mg_schedule_lr(const mg_schedule *s, long step);

#ifdef __cplusplus
}
#endif
#endif
