/* multigrad — parallel training: every header of it (the sampler, the
 * data-parallel strategies, pipeline schedules, and the plan: mesh,
 * strategy, training step). */
#ifndef MULTIGRAD_PARALLEL_H
#define MULTIGRAD_PARALLEL_H

#include "sampler.h"
#include "strategies.h"
#include "pipeline.h"
#include "plan.h"

#endif
