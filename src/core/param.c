/* Environment tunables (MG_*), read through one helper and logged in
 * verbose mode so a run states the settings it used. */
#include <errno.h>
#include <stdlib.h>
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
