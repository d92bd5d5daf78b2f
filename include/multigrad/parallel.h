/* multigrad — parallel training: every header of it (the sampler, the
 * data-parallel strategies, pipeline schedules, the plan: mesh, strategy,
 * training step, and writing a strategy's component). */
#ifndef MULTIGRAD_PARALLEL_H
#define MULTIGRAD_PARALLEL_H

#include "sampler.h"
#include "strategies.h"
#include "pipeline.h"
#include "plan.h"
#include "component.h"

#endif
