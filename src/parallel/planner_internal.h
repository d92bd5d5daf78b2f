/* Internal to the planner (planner.c, plan_memory.c, plan_time.c,
 * plan_measure.c). */
#ifndef MG_PARALLEL_PLANNER_INTERNAL_H
#define MG_PARALLEL_PLANNER_INTERNAL_H

#include "multigrad/planner.h"

/* The plan's model as tensor-parallel rank tp_rank builds it, without
 * values, with its recomputation, padded for its dp ranks. */
mg_status mg__plan_model(const mg_plan_job *job, const mg_plan *p, int tp_rank, mg_model **out);
/* That model and its units' figures (mg_model_unit, read once): what
 * every plan of the same tp, sp, dp and recomputation shares. */
typedef struct mg__plan_shape {
    mg_model *m;
    mg_unit_info *unit;
    int n;
} mg__plan_shape;
mg_status mg__plan_shape_make(const mg_plan_job *job, const mg_plan *p, int tp_rank,
                              mg__plan_shape *out);
void mg__plan_shape_free(mg__plan_shape *s);
/* The pipeline's cut into pp x chunks stages (S + 1 boundaries), as the
 * executor balances it; one stage [0, n) without a pipeline. */
mg_status mg__plan_cut(const mg__plan_shape *s, const mg_plan *p, int *first);
/* The job's optimizer, the state arrays a parameter has
 * (mg_optim_states), and the bucket caps in bytes (DDP's and ZeRO's: the
 * first, the others). */
mg_optim_config mg__plan_optim(const mg_plan_job *job);
int mg__plan_states(const mg_plan_job *job);
void mg__plan_buckets(const mg_plan_job *job, size_t *first_cap, size_t *cap);
/* What an offloaded plan keeps in files besides its optimizer's state:
 * ZeRO 2-3 without a pipeline its gradient pieces, ZeRO-3 its parameter
 * pieces too (zero.c's offload; over a pipeline's replicas the shards stay
 * in memory). */
static inline bool mg__plan_grads_in_files(const mg_plan *p)
{
    return p->offload && p->zero >= 2 && p->pp == 1;
}
static inline bool mg__plan_params_in_files(const mg_plan *p)
{
    return p->offload && p->zero == 3 && p->pp == 1;
}
/* What pipeline rank pp_rank of the plan holds (mg_strategy_memory's
 * figures) on shape s cut at first. */
mg_status mg__plan_memory(const mg_plan_job *job, const mg_plan *p, const mg__plan_shape *s,
                          const int *first, int pp_rank, mg_memory_stats *ms);
/* The plan's seconds (compute ... step) on s cut at first;
 * stage_floats[r]: the gradient floats pipeline rank r reduces over dp. */
mg_status mg__plan_time(const mg_plan_job *job, const mg_plan_cluster *cl,
                        const mg__plan_shape *s, const int *first, const size_t *stage_floats,
                        mg_plan *p);

#endif
