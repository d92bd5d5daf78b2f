/* Logging to stderr, clocks and process statistics. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include "multigrad/core.h"

static int v = -1;

void mg_set_verbose(bool on) { v = on; }

bool mg_verbose(void)
{
    if (v < 0) {
        v = 0;   /* its own read logs nothing */
        v = mg_env_long("MG_VERBOSE", 0) != 0;
    }
    return v;
}

void mg_veprintf(const char *prefix, const char *fmt, va_list ap)
{
    char line[4096];
    int n = prefix ? snprintf(line, sizeof line, "%s: ", prefix) : 0;
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    if (m < 0) m = 0;
    size_t len = (size_t)n + ((size_t)m < sizeof line - (size_t)n - 1
                              ? (size_t)m : sizeof line - (size_t)n - 2);
    line[len++] = '\n';
    for (const char *p = line; len > 0;) {
        ssize_t w = write(2, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        len -= (size_t)w;
    }
}

void mg_eprintf(const char *prefix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mg_veprintf(prefix, fmt, ap);
    va_end(ap);
}

static void vlog(const char *fmt, va_list ap) { mg_veprintf("multigrad", fmt, ap); }

void mg_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void mg_debug(const char *fmt, ...)
{
    if (!mg_verbose()) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

double mg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mg_sleep(double secs)
{
    if (!(secs > 0)) return;
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

size_t mg_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru)) return 0;
    return (size_t)ru.ru_maxrss * 1024;
}
