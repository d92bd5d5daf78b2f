/* Per-thread error messages (see include/multigrad/status.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/status.h"

static _Thread_local char last_error[1024];
static _Thread_local mg_status last_code;

mg_status mg_error(mg_status code, const char *fmt, ...)
{
    char msg[sizeof last_error];   /* the arguments may be the last message */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    last_code = code;
    return code;
}

const char *mg_last_error(void) { return last_error; }
mg_status mg_last_error_code(void) { return last_code; }

const char *mg_error_past_rank(const char *msg, int rank)
{
    char me[24];
    int n = snprintf(me, sizeof me, "rank %d", rank);
    if (strncmp(msg, me, (size_t)n)) return msg;
    const char *p = msg + n;
    if (!strncmp(p, " (", 2) && (p = strchr(p, ')'))) p++;   /* a label (no parentheses) */
    return p && !strncmp(p, ": ", 2) ? p + 2 : msg;
}

const char *mg_status_name(mg_status s)
{
    static const char *names[] = {
        "MG_OK", "MG_EINVAL", "MG_EIO", "MG_ENOMEM", "MG_EFORMAT",
        "MG_ETIMEOUT", "MG_EPEER", "MG_EAUTH", "MG_EMISMATCH", "MG_EUNSUPPORTED", "MG_ELEFT",
        "MG_ESTOPPED", "MG_EDIVERGED",
    };
    if (s < 0 || s >= (int)(sizeof names / sizeof names[0])) return "MG_E?";
    return names[s];
}

void mg__assert_fail(const char *expr, const char *file, int line)
{
    /* Most often a call that broke its header's rule (a pointer from
     * another object, a call out of order): the caller's bug, or ours. */
    fprintf(stderr, "multigrad: assertion '%s' failed at %s:%d: a call broke the rule its "
            "header states, or multigrad has a bug\n", expr, file, line);
    abort();
}
