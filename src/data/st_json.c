/* The safetensors header parser: JSON restricted to exactly the format's
 * schema (an object of tensor entries {"dtype", "shape", "data_offsets"}
 * and an optional "__metadata__" object of strings). Strict: no duplicate
 * keys in an entry (duplicate names and metadata keys are found after
 * parsing, by sorting), no unknown keys, integers without sign, fraction, exponent or leading
 * zero, strings of valid UTF-8 without raw control characters, escapes
 * decoded (surrogate pairs included, NUL refused). Bounded: the nesting is
 * fixed by the schema (no recursion), decoded strings never outgrow the
 * header, and the tables grow geometrically with what the header holds. */
#include <stdlib.h>
#include <string.h>
#include "st_internal.h"

#define MAX_NDIM MG__ST_MAX_NDIM

typedef struct {
    const char *p, *begin, *end;
    char *out;              /* decoded strings are appended here */
    const char *err;
    mg_st_file *f;
} parser;

static bool fail(parser *ps, const char *msg)
{
    if (!ps->err) ps->err = msg;
    return false;
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static bool expect(parser *ps, char c)
{
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != c) return false;
    ps->p++;
    return true;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex4(parser *ps, unsigned *out)
{
    if (ps->end - ps->p < 4) return false;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(ps->p[i]);
        if (h < 0) return false;
        v = v << 4 | (unsigned)h;
    }
    ps->p += 4;
    *out = v;
    return true;
}

static void put_utf8(char **o, unsigned cp)
{
    unsigned char *u = (unsigned char *)*o;
    if (cp < 0x80) {
        *u++ = (unsigned char)cp;
    } else if (cp < 0x800) {
        *u++ = (unsigned char)(0xC0 | cp >> 6);
        *u++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *u++ = (unsigned char)(0xE0 | cp >> 12);
        *u++ = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        *u++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else {
        *u++ = (unsigned char)(0xF0 | cp >> 18);
        *u++ = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
        *u++ = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        *u++ = (unsigned char)(0x80 | (cp & 0x3F));
    }
    *o = (char *)u;
}

/* Length of the valid UTF-8 sequence at p (non-ASCII lead), or 0. */
static int utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0], cp;
    int n;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (end - p < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    /* Overlong forms, surrogates and code points past U+10FFFF. */
    if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return n;
}

bool mg__st_utf8(const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    while (p < end) {
        int n = *p < 0x80 ? 1 : utf8_len(p, end);
        if (!n) return false;
        p += n;
    }
    return true;
}

/* A JSON string, decoded into ps->out (NUL-terminated); NULL on error.
 * The decoded form is never longer than the encoded one, so the strings
 * buffer (as large as the header) cannot overflow. */
static const char *parse_string(parser *ps)
{
    if (!expect(ps, '"')) return fail(ps, "expected a string"), NULL;
    char *start = ps->out, *o = ps->out;
    for (;;) {
        if (ps->p >= ps->end) return fail(ps, "unterminated string"), NULL;
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') { ps->p++; break; }
        if (c < 0x20) return fail(ps, "control character in a string"), NULL;
        if (c == '\\') {
            if (++ps->p >= ps->end) return fail(ps, "unterminated string"), NULL;
            char e = *ps->p++;
            unsigned cp;
            switch (e) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '/': *o++ = '/'; break;
            case 'b': *o++ = '\b'; break;
            case 'f': *o++ = '\f'; break;
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            case 'u':
                if (!hex4(ps, &cp)) return fail(ps, "bad \\u escape"), NULL;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u')
                        return fail(ps, "unpaired surrogate in \\u escape"), NULL;
                    ps->p += 2;
                    if (!hex4(ps, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return fail(ps, "unpaired surrogate in \\u escape"), NULL;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return fail(ps, "unpaired surrogate in \\u escape"), NULL;
                }
                if (cp == 0) return fail(ps, "NUL character in a string"), NULL;
                put_utf8(&o, cp);
                break;
            default:
                return fail(ps, "bad escape in a string"), NULL;
            }
        } else if (c < 0x80) {
            *o++ = (char)c;
            ps->p++;
        } else {
            int n = utf8_len((const unsigned char *)ps->p, (const unsigned char *)ps->end);
            if (!n) return fail(ps, "invalid UTF-8 in a string"), NULL;
            memcpy(o, ps->p, (size_t)n);
            o += n;
            ps->p += n;
        }
    }
    *o++ = 0;
    ps->out = o;
    return start;
}

/* A non-negative integer without sign, fraction, exponent or leading zero. */
static bool parse_uint(parser *ps, uint64_t *out)
{
    skip_ws(ps);
    const char *s = ps->p;
    uint64_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        unsigned d = (unsigned)(*ps->p - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) return fail(ps, "integer too large");
        v = v * 10 + d;
        ps->p++;
    }
    if (ps->p == s) return fail(ps, "expected a non-negative integer");
    if (ps->p - s > 1 && *s == '0') return fail(ps, "integer with a leading zero");
    if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))
        return fail(ps, "expected an integer");
    *out = v;
    return true;
}

static bool parse_metadata(parser *ps)
{
    if (!expect(ps, '{')) return fail(ps, "__metadata__ must be an object of strings");
    if (expect(ps, '}')) return true;
    do {
        const char *k = parse_string(ps);
        if (!k || !expect(ps, ':')) return fail(ps, "expected ':' after a metadata key");
        const char *v = parse_string(ps);
        if (!v) return fail(ps, "metadata values must be strings");
        mg_st_file *f = ps->f;   /* duplicate keys: found by mg_st_open, in n log n */
        if (f->nmeta == f->metacap) {
            int cap = f->metacap ? 2 * f->metacap : 16;
            const char **m = realloc(f->meta, 2 * (size_t)cap * sizeof *m);
            if (!m) return fail(ps, "out of memory");
            f->meta = m;
            f->metacap = cap;
        }
        f->meta[2 * f->nmeta] = k;
        f->meta[2 * f->nmeta + 1] = v;
        f->nmeta++;
    } while (expect(ps, ','));
    if (!expect(ps, '}')) return fail(ps, "expected ',' or '}' in __metadata__");
    return true;
}

static bool parse_tensor(parser *ps, mg_st_tensor *t, uint64_t off[2])
{
    bool have_dtype = false, have_shape = false, have_off = false;
    if (!expect(ps, '{')) return fail(ps, "a tensor entry must be an object");
    do {
        const char *k = parse_string(ps);
        if (!k || !expect(ps, ':')) return fail(ps, "expected ':' after a key");
        if (!strcmp(k, "dtype")) {
            if (have_dtype) return fail(ps, "duplicate key dtype");
            const char *d = parse_string(ps);
            if (!d) return false;
            int i = 0;
            while (i < MG_DTYPE_COUNT && strcmp(d, mg__dtypes[i].st_name)) i++;
            if (i == MG_DTYPE_COUNT)
                return fail(ps, "unsupported dtype (F32, F64, F16, BF16, I32, I64, U8 are read)");
            t->dtype = (mg_st_dtype)i;
            have_dtype = true;
        } else if (!strcmp(k, "shape")) {
            if (have_shape) return fail(ps, "duplicate key shape");
            if (!expect(ps, '[')) return fail(ps, "shape must be an array");
            t->ndim = 0;
            if (!expect(ps, ']')) {
                do {
                    uint64_t v;
                    if (t->ndim == MAX_NDIM) return fail(ps, "more than 8 dimensions");
                    if (!parse_uint(ps, &v)) return false;
                    t->shape[t->ndim++] = (int64_t)v;
                } while (expect(ps, ','));
                if (!expect(ps, ']')) return fail(ps, "expected ',' or ']' in shape");
            }
            have_shape = true;
        } else if (!strcmp(k, "data_offsets")) {
            if (have_off) return fail(ps, "duplicate key data_offsets");
            if (!expect(ps, '[') || !parse_uint(ps, &off[0]) || !expect(ps, ',') ||
                !parse_uint(ps, &off[1]) || !expect(ps, ']'))
                return fail(ps, "data_offsets must be [BEGIN, END]");
            have_off = true;
        } else {
            return fail(ps, "unknown key in a tensor entry");
        }
    } while (expect(ps, ','));
    if (!expect(ps, '}')) return fail(ps, "expected ',' or '}' in a tensor entry");
    if (!have_dtype || !have_shape || !have_off)
        return fail(ps, "a tensor entry lacks dtype, shape or data_offsets");
    return true;
}

static bool parse_header(parser *ps, uint64_t **offs)
{
    mg_st_file *f = ps->f;
    bool have_meta = false;
    if (!expect(ps, '{')) return fail(ps, "the header must be a JSON object");
    if (!expect(ps, '}')) {
        do {
            const char *k = parse_string(ps);
            if (!k || !expect(ps, ':')) return fail(ps, "expected ':' after a key");
            if (!strcmp(k, "__metadata__")) {
                if (have_meta) return fail(ps, "duplicate __metadata__");
                if (!parse_metadata(ps)) return false;
                have_meta = true;
                continue;
            }
            if (f->n == f->cap) {
                int cap = f->cap ? 2 * f->cap : 64;
                mg_st_tensor *t = realloc(f->t, (size_t)cap * sizeof *t);
                uint64_t *o = realloc(*offs, 2 * (size_t)cap * sizeof *o);
                if (t) f->t = t;
                if (o) *offs = o;
                if (!t || !o) return fail(ps, "out of memory");
                f->cap = cap;
            }
            mg_st_tensor *t = &f->t[f->n];
            memset(t, 0, sizeof *t);
            t->name = k;
            if (!parse_tensor(ps, t, *offs + 2 * f->n)) return false;
            f->n++;
        } while (expect(ps, ','));
        if (!expect(ps, '}')) return fail(ps, "expected ',' or '}' after a tensor entry");
    }
    skip_ws(ps);
    if (ps->p != ps->end) return fail(ps, "unexpected bytes after the header object");
    return true;
}

const char *mg__st_parse_header(mg_st_file *f, const char *json, size_t len, uint64_t **offs,
                                size_t *errpos)
{
    parser ps = {.p = json, .begin = json, .end = json + len, .out = f->strings, .f = f};
    if (parse_header(&ps, offs)) return NULL;
    *errpos = (size_t)(ps.p - ps.begin);
    return ps.err ? ps.err : "malformed JSON";
}
