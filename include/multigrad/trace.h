/* multigrad — Chrome trace events (chrome://tracing, Perfetto).
 * MG_TRACE=FILE turns tracing on; each rank writes its own file
 * (FILE itself for a single process, else FILE with ".rankN" before the
 * extension). Events are kept in memory and written when the trace is
 * closed, so tracing costs one clock read and an append per event. */
#ifndef MULTIGRAD_TRACE_H
#define MULTIGRAD_TRACE_H

#include <stdbool.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Start tracing to path (NULL: MG_TRACE; nothing if unset) as `rank` of
 * `world` processes. Safe to call once per process. */
mg_status mg_trace_open(const char *path, int rank, int world);
bool mg_trace_on(void);
/* Microseconds on the trace clock. */
double mg_trace_now(void);
/* A time of the mg_now() clock on the trace clock (microseconds). */
double mg_trace_at(double mg_now_seconds);
/* A complete event [start_us, end_us] on track `tid` (0 = compute,
 * 1 = communication, ...), category cat (e.g. "forward", "allreduce"). */
void mg_trace_event(const char *name, const char *cat, int tid,
                    double start_us, double end_us);
/* Write the file atomically and stop tracing. */
mg_status mg_trace_close(void);

#ifdef __cplusplus
}
#endif
#endif
