/* Internal to src/comm: what the group, both backends and the algorithms
 * share about one operation (mg_call). */
#ifndef MG_COMM_CALL_H
#define MG_COMM_CALL_H

#include <stdbool.h>
#include "multigrad/comm.h"

/* The one check of a call's arguments, made when it is issued (mg_start,
 * mg_run), before any backend sees it, as rank `rank` of a group of
 * `size`: a known operation, dtype and reduction op; a root (peer for
 * send and recv) in [0, size); count elements of every rank fitting the
 * address space; no NULL buffer that this rank reads or writes. MG_EINVAL
 * with one line naming the operation and the argument otherwise. */
mg_status mg__call_check(const mg_call *c, int rank, int size);

#endif
