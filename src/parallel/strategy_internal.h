/* Internal to the strategy (strategy.c, strategy_step.c): its state and
 * how it walks its components. */
#ifndef MG_PARALLEL_STRATEGY_INTERNAL_H
#define MG_PARALLEL_STRATEGY_INTERNAL_H

#include "parallel/internal.h"

typedef struct {
    const mg_component_ops *ops;
    void *c;
} part;

struct mg_strategy {
    mg_model *m;
    mg_strategy_options o;
    mg_group *g;        /* the job (NULL: one process): agreement, rank 0 */
    mg_mesh *mesh;      /* its ranks as a mesh, and its groups */
    int rank, world;
    part part[MG_MAX_COMPONENTS];
    int n;
    char name[64];
    mg_range whole;     /* the arena: the ranges when no component narrows them */
    bool model_tape;    /* the model's own tape runs the micro-batches (no
                         * component's run_step or run_micro does) */
    char *offload_dir;
    /* --offload cpu with a model on a device: the host's copies of the
     * parameters and gradients of this process's ranges, the optimizer's
     * (arena-sized mappings: only the ranges are ever touched) */
    bool offload_cpu;
    float *host_p, *host_g;
    mg_range *own;      /* own_ranges: what every component counts as this rank's */
    int n_own;
    /* During mg_train_step: its optimizer and options (mg_strategy_update,
     * mg_strategy_step_options). */
    mg_optim *step_o;
    const mg_step_options *step_opt;
};

/* Each component with slot f, in list order (for) or reverse (back). */
#define EACH(s, f) for (part *p_ = (s)->part; p_ < (s)->part + (s)->n; p_++) if (p_->ops->f)
#define EACH_BACK(s, f) \
    for (part *p_ = (s)->part + (s)->n - 1; p_ >= (s)->part; p_--) if (p_->ops->f)
#define CALL(f, ...) p_->ops->f(p_->c, ##__VA_ARGS__)

/* The first component with slot f (NULL: none). */
#define FIRST(s, f) ({                                                  \
    part *first_ = NULL;                                                \
    for (int i_ = 0; i_ < (s)->n && !first_; i_++)                      \
        if ((s)->part[i_].ops->f) first_ = &(s)->part[i_];              \
    first_; })

/* A forward that returned NULL: a tensor-parallel layer's collective
 * failed (its status), or the tape could not be made. */
mg_status mg__strategy_forward_failed(mg_model *m);

#endif
