/* Chrome trace recording (see include/multigrad/trace.h). Events go to an
 * in-memory array under a mutex (the progress thread may record too) and
 * are written as one JSON document at close. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/core.h"
#include "multigrad/trace.h"
#include "core/strbuf.h"

typedef struct {
    char name[48];
    char cat[16];
    int tid;
    double ts, dur;
} event;

static struct {
    pthread_mutex_t mu;
    bool on;
    int rank;
    char path[4096];
    event *ev;
    size_t n, cap;
    double t0;
} tr = {.mu = PTHREAD_MUTEX_INITIALIZER};

mg_status mg_trace_open(const char *path, int rank, int world)
{
    if (!path) path = mg_env_str("MG_TRACE", NULL);
    if (!path) return MG_OK;
    pthread_mutex_lock(&tr.mu);
    if (world > 1) {
        const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
        if (dot && (!slash || dot > slash))
            snprintf(tr.path, sizeof tr.path, "%.*s.rank%d%s", (int)(dot - path), path,
                     rank, dot);
        else
            snprintf(tr.path, sizeof tr.path, "%s.rank%d", path, rank);
    } else {
        snprintf(tr.path, sizeof tr.path, "%s", path);
    }
    tr.rank = rank;
    tr.on = true;
    tr.t0 = mg_now();
    pthread_mutex_unlock(&tr.mu);
    return MG_OK;
}

bool mg_trace_on(void)
{
    return __atomic_load_n(&tr.on, __ATOMIC_RELAXED);
}

double mg_trace_at(double t)
{
    return (t - tr.t0) * 1e6;
}

double mg_trace_now(void)
{
    return mg_trace_at(mg_now());
}

void mg_trace_event(const char *name, const char *cat, int tid, double start_us, double end_us)
{
    if (!mg_trace_on()) return;
    pthread_mutex_lock(&tr.mu);
    if (tr.n == tr.cap) {
        size_t cap = tr.cap ? 2 * tr.cap : 4096;
        event *e = realloc(tr.ev, cap * sizeof *e);
        if (!e) {
            pthread_mutex_unlock(&tr.mu);
            return;
        }
        tr.ev = e;
        tr.cap = cap;
    }
    event *e = &tr.ev[tr.n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->cat, sizeof e->cat, "%s", cat);
    e->tid = tid;
    e->ts = start_us;
    e->dur = end_us > start_us ? end_us - start_us : 0;
    pthread_mutex_unlock(&tr.mu);
}

mg_status mg_trace_close(void)
{
    pthread_mutex_lock(&tr.mu);
    if (!tr.on) {
        pthread_mutex_unlock(&tr.mu);
        return MG_OK;
    }
    tr.on = false;
    static const char *tracks[] = {"compute", "communication", "data", "other"};
    mg__str s = {0};
    mg__str_addf(&s, "{\"traceEvents\":[\n");
    for (int t = 0; t < 4; t++)
        mg__str_addf(&s, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                     "\"args\":{\"name\":\"%s\"}},\n", tr.rank, t, tracks[t]);
    for (size_t i = 0; i < tr.n; i++) {
        const event *e = &tr.ev[i];
        /* Names are the caller's: escaped; a time that is no number is 0
         * (JSON has no nan). */
        mg__str_addf(&s, "{\"name\":");
        mg__str_json(&s, e->name);
        mg__str_addf(&s, ",\"cat\":");
        mg__str_json(&s, e->cat);
        mg__str_addf(&s, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}%s\n",
                     tr.rank, e->tid, isfinite(e->ts) ? e->ts : 0, isfinite(e->dur) ? e->dur : 0,
                     i + 1 < tr.n ? "," : "");
    }
    mg__str_addf(&s, "],\"displayTimeUnit\":\"ms\"}\n");
    mg_status st = s.oom ? mg_error(MG_ENOMEM, "trace %s: out of memory", tr.path)
                         : mg_write_file_atomic(tr.path, s.s, s.len);
    mg__str_free(&s);
    free(tr.ev);
    tr.ev = NULL;
    tr.n = tr.cap = 0;
    pthread_mutex_unlock(&tr.mu);
    return st;
}
