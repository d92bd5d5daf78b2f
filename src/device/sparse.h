/* Internal to src/device: sparse allocations (sparse.c), device memory
 * whose parts can be given back and had again, for the arenas that
 * sharded strategies keep only in part (mg_device_alloc_sparse). */
#ifndef MG_DEVICE_SPARSE_H
#define MG_DEVICE_SPARSE_H

#include <stdbool.h>
#include <stddef.h>
#include "multigrad/device.h"

/* bytes on d (emu or a GPU), zeroed, every granule holding memory; NULL
 * with mg_last_error, or with *fallback set when d cannot have sparse
 * memory (a GPU without the driver's virtual memory management: the
 * caller allocates plainly). */
void *mg__sparse_alloc(mg_device d, size_t bytes, bool *fallback);
/* Frees p when it is a sparse allocation's start: true; else false. */
bool mg__sparse_free(void *p);
/* The device of the sparse allocation p points into: true; else false. */
bool mg__sparse_device(const void *p, mg_device *d);
/* The granules wholly inside [p, p + n) of a sparse allocation give their
 * memory back (a GPU's after its queued work is done): true; false when
 * p is not in one. */
bool mg__sparse_discard(void *p, size_t n);
/* The granules that [p, p + n) touches hold memory again (zeroed where it
 * was given back); nothing outside sparse allocations. */
mg_status mg__sparse_commit(void *p, size_t n);
/* The length (<= n) of the run from p whose granules all hold memory
 * (*held) or all do not; n with *held for memory outside sparse ones. */
size_t mg__sparse_run(const void *p, size_t n, bool *held);
/* The bytes of [p, p + n) that hold memory (n outside sparse ones). */
size_t mg__sparse_resident(const void *p, size_t n);

#endif
