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
/* The optimizer's state arrays a parameter has (mg_optim_states), and
 * the bucket caps in bytes (DDP's and ZeRO's: the first, the others). */
int mg__plan_states(const mg_plan_job *job);
void mg__plan_buckets(const mg_plan_job *job, size_t *first_cap, size_t *cap);
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
