/* Internal to the planner (planner.c, plan_memory.c, plan_time.c). */
#ifndef MG_PARALLEL_PLANNER_INTERNAL_H
#define MG_PARALLEL_PLANNER_INTERNAL_H

#include "multigrad/planner.h"

/* The plan's model as tensor-parallel rank tp_rank builds it, without
 * values, with its recomputation, padded for its dp ranks. */
mg_status mg__plan_model(const mg_plan_job *job, const mg_plan *p, int tp_rank, mg_model **out);
/* The pipeline's cut of m into pp x chunks stages (S + 1 boundaries), as
 * the executor balances it. */
mg_status mg__plan_cut(const mg_model *m, const mg_plan *p, int *first);
/* What pipeline rank pp_rank of the plan holds (mg_strategy_memory's
 * figures) on m (from mg__plan_model). */
mg_status mg__plan_memory(const mg_plan_job *job, const mg_plan *p, const mg_model *m,
                          int pp_rank, mg_memory_stats *ms);
/* The plan's seconds (compute ... step) on m; stage_floats[r]: the
 * gradient floats pipeline rank r reduces over dp; p->memory set. */
mg_status mg__plan_time(const mg_plan_job *job, const mg_plan_cluster *cl, const mg_model *m,
                        const size_t *stage_floats, mg_plan *p);

#endif
