/* Environment tunables (MG_*), read through one helper and logged in
 * verbose mode so a run states the settings it used. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>
#include "multigrad/core.h"

long mg_env_long(const char *name, long dflt)
{
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || *end) {
        mg_log("warning: %s='%s' is not an integer; using %ld", name, s, dflt);
        return dflt;
    }
    mg_debug("%s=%ld", name, v);
    return v;
}

double mg_env_double(const char *name, double dflt)
{
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end) {
        mg_log("warning: %s='%s' is not a number; using %g", name, s, dflt);
        return dflt;
    }
    mg_debug("%s=%g", name, v);
    return v;
}

const char *mg_env_str(const char *name, const char *dflt)
{
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    mg_debug("%s=%s", name, s);
    return s;
}

int mg_local_cpus(void)
{
    long c = mg_env_long("MG_LOCAL_CPUS", 0);
    if (c > 0) return c > 1 << 20 ? 1 << 20 : (int)c;
    cpu_set_t set;
    if (!sched_getaffinity(0, sizeof set, &set)) c = CPU_COUNT(&set);
    if (c <= 0) c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}
