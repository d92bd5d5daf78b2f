/* Logging to stderr, clocks and process statistics. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/resource.h>
#include "multigrad/core.h"

static int v = -1;

void mg_set_verbose(bool on) { v = on; }

bool mg_verbose(void)
{
    if (v < 0) {
        const char *s = getenv("MG_VERBOSE");
        v = s && *s && *s != '0';
    }
    return v;
}

static void vlog(const char *fmt, va_list ap)
{
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    fprintf(stderr, "multigrad: %s\n", line);
}

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

size_t mg_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru)) return 0;
    return (size_t)ru.ru_maxrss * 1024;
}
