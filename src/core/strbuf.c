/* Strings built piece by piece (strbuf.h). */
#include "core/strbuf.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(mg__str *b, size_t more)
{
    if (b->oom) return false;
    if (b->len + more + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + more + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
        b->oom = true;
        return false;
    }
    b->s = s;
    b->cap = cap;
    return true;
}

/* Formatted into the room there is; formatted again only when it did not
 * fit (the log's cells are formatted once each). */
void mg__str_addf(mg__str *b, const char *fmt, ...)
{
    for (int k = 0; k < 2 && !b->oom; k++) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(room ? b->s + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        if (!reserve(b, (size_t)n)) return;
    }
}

void mg__str_put(mg__str *b, const char *p, size_t n)
{
    if (!reserve(b, n)) return;
    memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = 0;
}

void mg__str_json(mg__str *b, const char *s)
{
    mg__str_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') mg__str_addf(b, "\\%c", c);
        else if (c < 0x20) mg__str_addf(b, "\\u%04x", c);
        else mg__str_put(b, (const char *)&c, 1);
    }
    mg__str_put(b, "\"", 1);
}

void mg__str_free(mg__str *b)
{
    free(b->s);
    *b = (mg__str){0};
}

size_t mg__catf(char *buf, size_t cap, size_t at, const char *fmt, ...)
{
    if (!cap) return 0;
    if (at + 1 >= cap) {   /* full: the string ends at the last byte */
        buf[cap - 1] = 0;
        return cap - 1;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + at, cap - at, fmt, ap);
    va_end(ap);
    if (n < 0) return at;
    return at + (size_t)n < cap ? at + (size_t)n : cap - 1;
}
