/* multigrad — distributed deep-learning training in C. One include for all. */
#ifndef MULTIGRAD_H
#define MULTIGRAD_H
#include "status.h"
#include "core.h"
#include "device.h"
#include "tensor.h"
#include "nn.h"
#include "optim.h"
#include "data.h"
#include "checkpoint.h"
#include "comm.h"
#include "sampler.h"
#include "strategies.h"
#include "pipeline.h"
#include "plan.h"
#include "component.h"
#include "plot.h"
#include "trace.h"
#include "train.h"
#include "planner.h"
#endif
