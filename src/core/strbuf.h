/* Strings built piece by piece: a growable one (mg__str, for documents
 * written to files: the trace, the plot, safetensors headers, the log) and
 * appends to a caller's fixed buffer that never pass its end (mg__catf).
 * The pattern they replace, len += snprintf(buf + len, cap - len, ...),
 * wrapped cap - len around once a piece was cut and wrote past the buffer
 * (a probe: mg_trace_close with few events, mg_plan_describe into a short
 * buffer). */
#ifndef MG_CORE_STRBUF_H
#define MG_CORE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *s;       /* NUL-terminated once anything was added; NULL before */
    size_t len, cap;
    bool oom;      /* an allocation failed: what follows is dropped */
} mg__str;

void mg__str_addf(mg__str *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mg__str_put(mg__str *b, const char *p, size_t n);
/* s as a JSON string: quoted, with '"', '\\' and control characters escaped. */
void mg__str_json(mg__str *b, const char *s);
void mg__str_free(mg__str *b);

/* Append to buf[cap] at `at` (what the previous call returned, or 0): the
 * new length, at most cap - 1 (a piece that does not fit is cut, and the
 * ones after it are dropped). */
size_t mg__catf(char *buf, size_t cap, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
