/* The trainer's metrics log and plot: a table of rows (mg_train_row), one
 * per epoch (image models) or evaluation (language models), written whole
 * and atomically after each row as CSV (a path ending in .csv) or JSON
 * lines, with its SVG plot beside it (loss | accuracy per epoch, or loss |
 * perplexity per step). A missing figure (the train loss before the first
 * step) is "nan" in CSV and null in JSON. On resume the rows the
 * checkpoint covers are read back, so the log goes on as one run's. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/train.h"
#include "multigrad/plot.h"
#include "train_internal.h"
#include "core/strbuf.h"

typedef struct {
    const char *name, *fmt;
    size_t at;   /* offset of the double in mg_train_row (epoch, step: longs) */
} log_col;

#define ROW(f) offsetof(mg_train_row, f)
static const log_col image_cols[] = {
    {"epoch", "%.0f", ROW(epoch)}, {"step", "%.0f", ROW(step)},
    {"train_loss", "%.6f", ROW(train_loss)}, {"train_acc", "%.6f", ROW(train_acc)},
    {"test_loss", "%.6f", ROW(test_loss)}, {"test_acc", "%.6f", ROW(test_acc)},
    {"seconds", "%.3f", ROW(seconds)}, {"images_per_s", "%.1f", ROW(per_s)},
    {"lr", "%.6g", ROW(lr)}, {"elapsed", "%.3f", ROW(elapsed)}};
static const log_col text_cols[] = {
    {"step", "%.0f", ROW(step)}, {"train_loss", "%.6f", ROW(train_loss)},
    {"val_loss", "%.6f", ROW(val_loss)}, {"val_ppl", "%.4f", ROW(val_ppl)},
    {"seconds", "%.3f", ROW(seconds)}, {"tokens_per_s", "%.1f", ROW(per_s)},
    {"lr", "%.6g", ROW(lr)}, {"elapsed", "%.3f", ROW(elapsed)}};
/* The last column came later: a line without it is a whole row still. */
#define OPTIONAL_LAST 1

static const log_col *columns(bool text, int *n)
{
    *n = text ? (int)(sizeof text_cols / sizeof *text_cols)
              : (int)(sizeof image_cols / sizeof *image_cols);
    return text ? text_cols : image_cols;
}

static bool is_count(size_t at) { return at == ROW(epoch) || at == ROW(step); }

static double get(const mg_train_row *r, size_t at)
{
    const char *p = (const char *)r + at;
    return is_count(at) ? (double)*(const long *)p : *(const double *)p;
}

static void set(mg_train_row *r, size_t at, double v)
{
    char *p = (char *)r + at;
    if (is_count(at)) *(long *)p = (long)v;
    else *(double *)p = v;
}

mg_train_row mg__train_row_empty(void)
{
    return (mg_train_row){0, 0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
}

mg_status mg__metrics_add(mg__metrics *mt, const mg_train_row *r)
{
    if (mt->n == mt->cap) {
        int cap = mt->cap ? 2 * mt->cap : 16;
        mg_train_row *rows = realloc(mt->rows, sizeof *rows * (size_t)cap);
        if (!rows) return mg_error(MG_ENOMEM, "out of memory for the metrics log");
        mt->rows = rows;
        mt->cap = cap;
    }
    mt->rows[mt->n++] = *r;
    return MG_OK;
}

static bool is_csv(const char *path)
{
    size_t n = strlen(path);
    return n >= 4 && strcmp(path + n - 4, ".csv") == 0;
}

void mg__log_plot_path(const char *log, char *out, size_t cap)
{
    const char *dot = strrchr(log, '.'), *slash = strrchr(log, '/');
    size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - log) : strlen(log);
    snprintf(out, cap, "%.*s.svg", (int)stem, log);
}

static mg_status write_log(const char *path, const mg__metrics *mt)
{
    int nc;
    const log_col *cols = columns(mt->text, &nc);
    mg__str s = {0};   /* a figure of 1e300 is 300 characters wide */
    bool csv = is_csv(path);
    for (int c = 0; csv && c < nc; c++)
        mg__str_addf(&s, "%s%c", cols[c].name, c + 1 < nc ? ',' : '\n');
    for (int i = 0; i < mt->n; i++)
        for (int c = 0; c < nc; c++) {
            double v = get(&mt->rows[i], cols[c].at);
            if (!csv) mg__str_addf(&s, "%s\"%s\":", c ? "," : "{", cols[c].name);
            if (isnan(v)) mg__str_addf(&s, "%s", csv ? "nan" : "null");
            else mg__str_addf(&s, cols[c].fmt, v);
            if (c + 1 == nc) mg__str_addf(&s, "%s", csv ? "\n" : "}\n");
            else if (csv) mg__str_addf(&s, ",");
        }
    mg_status st = s.oom ? mg_error(MG_ENOMEM, "log: out of memory")
                         : mg_write_file_atomic(path, s.s ? s.s : "", s.len);
    mg__str_free(&s);
    return st;
}

/* A logged number: a decimal, nan (CSV) or null (JSON). */
static bool parse_value(const char *p, double *v, const char **end)
{
    if (!strncmp(p, "null", 4)) {
        *v = NAN;
        *end = p + 4;
        return true;
    }
    char *e;
    *v = strtod(p, &e);
    *end = e;
    return e != p;
}

/* One line of a log (ending in '\n'): its row, or false when it does not
 * parse (the CSV header, a damaged line). */
static bool parse_line(const char *line, bool csv, const log_col *cols, int nc, mg_train_row *r)
{
    *r = mg__train_row_empty();
    const char *p = line, *end;
    for (int c = 0; c < nc; c++) {
        bool optional = c >= nc - OPTIONAL_LAST;
        if (!csv) {
            char key[64];
            snprintf(key, sizeof key, "\"%s\":", cols[c].name);
            if (!(p = strstr(line, key))) return optional;
            p += strlen(key);
        } else if (optional && p > line && p[-1] == '\n') {
            return true;   /* a line of an older log */
        }
        double v;
        if (!parse_value(p, &v, &end)) return false;
        bool last = c + 1 == nc || (c + 1 >= nc - OPTIONAL_LAST && *end == '\n');
        if (csv && *end != (last ? '\n' : ',')) return false;
        if (is_count(cols[c].at) && !(fabs(v) < 9e15)) return false;   /* a long holds it */
        set(r, cols[c].at, v);
        p = end + 1;
    }
    return true;
}

mg_status mg__log_parse(const char *s, size_t n, bool csv, mg__metrics *mt, double upto)
{
    int nc;
    const log_col *cols = columns(mt->text, &nc);
    char line[2048];
    for (size_t at = 0; at < n;) {
        const char *nl = memchr(s + at, '\n', n - at);
        size_t len = nl ? (size_t)(nl - (s + at)) : n - at;
        size_t next = at + len + 1;
        if (len + 2 > sizeof line) {   /* longer than any line a log has */
            at = next;
            continue;
        }
        memcpy(line, s + at, len);
        line[len] = '\n';
        line[len + 1] = 0;
        at = next;
        if (memchr(line, 0, len)) continue;
        mg_train_row r;
        if (!parse_line(line, csv, cols, nc, &r)) continue;
        /* The rows kept increase and end at upto. */
        double first = get(&r, cols[0].at);
        if (!(first <= upto) || (mt->n && !(first > get(&mt->rows[mt->n - 1], cols[0].at))))
            continue;
        MG_TRY(mg__metrics_add(mt, &r));
    }
    return MG_OK;
}

mg_status mg__log_read(const char *path, mg__metrics *mt, double upto)
{
    FILE *f = fopen(path, "r");
    if (!f) return MG_OK;   /* no log yet: the run starts one */
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    while (s) {
        n += fread(s + n, 1, cap - n, f);
        if (n < cap) break;
        char *t = realloc(s, cap *= 2);
        if (!t) free(s);
        s = t;
    }
    fclose(f);
    if (!s) return mg_error(MG_ENOMEM, "%s: out of memory to read the log", path);
    mg_status st = mg__log_parse(s, n, is_csv(path), mt, upto);
    free(s);
    return st;
}

static mg_status write_plot(const char *log, const char *model, const mg__metrics *mt)
{
    char path[4096], title[128];
    mg__log_plot_path(log, path, sizeof path);
    int n = mt->n;
    double *v = malloc(sizeof(double) * 4 * (size_t)(n + 1));
    if (!v) return mg_error(MG_ENOMEM, "plot: out of memory");
    for (int i = 0; i < n; i++) {
        const mg_train_row *r = &mt->rows[i];
        v[i] = (double)(mt->text ? r->step : r->epoch);
        v[n + i] = r->train_loss;
        v[2 * n + i] = mt->text ? r->val_loss : r->train_acc;
        v[3 * n + i] = mt->text ? r->val_ppl : r->test_acc;
    }
    mg_plot_series img[3] = {{"train loss", v + n, 0}, {"train accuracy", v + 2 * n, 1},
                             {"test accuracy", v + 3 * n, 1}};
    mg_plot_series txt[3] = {{"train loss", v + n, 0}, {"validation loss", v + 2 * n, 0},
                             {"validation perplexity", v + 3 * n, 1}};
    const char *img_titles[2] = {"loss", "accuracy"}, *txt_titles[2] = {"loss", "perplexity"};
    snprintf(title, sizeof title, "mgtrain %s", model);
    mg_status st = mt->text ? mg_plot_svg_xy(path, title, txt_titles, "step", v, txt, 3, n)
                            : mg_plot_svg(path, title, img_titles, img, 3, n);
    free(v);
    return st;
}

mg_status mg__log_write(const char *path, const char *model, const mg__metrics *mt)
{
    MG_TRY(write_log(path, mt));
    return write_plot(path, model, mt);
}
