/* SVG training curves. The plot is simple on purpose: two panels, linear axes with round ticks, one polyline per
 * series; it needs nothing but stdio. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "multigrad/core.h"
#include "multigrad/plot.h"
#include "core/strbuf.h"

/* A round tick step giving about 5 ticks over [lo, hi]. */
static double tick_step(double lo, double hi)
{
    double span = hi - lo, raw = span / 5, mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

static void escape(mg__str *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') mg__str_put(b, "&lt;", 4);
        else if (*s == '>') mg__str_put(b, "&gt;", 4);
        else if (*s == '&') mg__str_put(b, "&amp;", 5);
        else mg__str_put(b, s, 1);
    }
}

mg_status mg_plot_svg(const char *path, const char *title,
                      const char *const panel_title[2],
                      const mg_plot_series *s, int n_series, int n)
{
    return mg_plot_svg_xy(path, title, panel_title, "epoch", NULL, s, n_series, n);
}

mg_status mg_plot_svg_xy(const char *path, const char *title,
                         const char *const panel_title[2], const char *x_label,
                         const double *xs, const mg_plot_series *s, int n_series, int n)
{
    static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f"};
    const int n_colors = (int)(sizeof colors / sizeof *colors);
    const int W = 900, H = 380, pw = 380, ph = 260, top = 60, left[2] = {70, 520};
    /* x of point i: xs[i], or i + 1 (epochs); XPOS maps it into the panel */
#define X(i) (xs ? xs[i] : (double)(i) + 1)
    double xlo = n > 0 ? X(0) : 1, xhi = xlo;
    for (int i = 1; i < n; i++) {
        xlo = fmin(xlo, X(i));
        xhi = fmax(xhi, X(i));
    }
#define XPOS(v) (x0 + (xhi > xlo ? ((v) - xlo) / (xhi - xlo) * pw : pw / 2.0))
    mg__str b = {0};
    mg__str_addf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                 "font-family=\"sans-serif\" font-size=\"12\">\n"
                 "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                 "<text x=\"%d\" y=\"24\" font-size=\"16\" text-anchor=\"middle\">", W, H, W / 2);
    escape(&b, title);
    mg__str_addf(&b, "</text>\n");
    for (int p = 0; p < 2; p++) {
        double lo = INFINITY, hi = -INFINITY;
        for (int k = 0; k < n_series; k++)
            if (s[k].panel == p)
                for (int i = 0; i < n; i++)
                    if (isfinite(s[k].y[i])) {
                        lo = fmin(lo, s[k].y[i]);
                        hi = fmax(hi, s[k].y[i]);
                    }
        if (!(lo <= hi)) { lo = 0; hi = 1; }
        if (hi - lo < 1e-9) { hi += 0.5; lo -= 0.5; }
        double st = tick_step(lo, hi);
        lo = floor(lo / st) * st;
        hi = ceil(hi / st) * st;
        int x0 = left[p], y0 = top;
        mg__str_addf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", x0 + pw / 2, y0 - 10);
        escape(&b, panel_title[p]);
        mg__str_addf(&b, "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                     "fill=\"none\" stroke=\"#444\"/>\n", x0, y0, pw, ph);
        for (double v = lo; v <= hi + st / 2; v += st) {
            double y = y0 + ph - (v - lo) / (hi - lo) * ph;
            mg__str_addf(&b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                         "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                         x0, x0 + pw, y, y, x0 - 6, y + 4, fabs(v) < st / 1e6 ? 0.0 : v);
        }
        double xst = xhi - xlo <= 10 ? 1 : tick_step(xlo, xhi);
        for (double v = ceil(xlo / xst) * xst; v <= xhi + xst / 1e6; v += xst)
            mg__str_addf(&b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
                         XPOS(v), y0 + ph + 16, v);
        mg__str_addf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", x0 + pw / 2,
                     y0 + ph + 34);
        escape(&b, x_label);
        mg__str_addf(&b, "</text>\n");
        int legend = 0;
        for (int k = 0; k < n_series; k++) {
            if (s[k].panel != p) continue;
            const char *c = colors[k % n_colors];
            mg__str_addf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                         "points=\"", c);
            for (int i = 0; i < n; i++) {
                if (!isfinite(s[k].y[i])) continue;
                double y = y0 + ph - (s[k].y[i] - lo) / (hi - lo) * ph;
                mg__str_addf(&b, "%.1f,%.1f ", XPOS(X(i)), y);
            }
            mg__str_addf(&b, "\"/>\n");
            for (int i = 0; i < n; i++) {
                if (!isfinite(s[k].y[i])) continue;
                double y = y0 + ph - (s[k].y[i] - lo) / (hi - lo) * ph;
                mg__str_addf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>",
                             XPOS(X(i)), y, c);
            }
            mg__str_addf(&b, "\n<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"3\" fill=\"%s\"/>"
                         "<text x=\"%d\" y=\"%d\">", x0 + 10, y0 + 12 + 16 * legend, c,
                         x0 + 28, y0 + 17 + 16 * legend);
            escape(&b, s[k].label);
            mg__str_addf(&b, "</text>\n");
            legend++;
        }
    }
#undef X
#undef XPOS
    mg__str_addf(&b, "</svg>\n");
    if (b.oom) {
        free(b.s);
        return mg_error(MG_ENOMEM, "plot %s: out of memory", path);
    }
    mg_status st = mg_write_file_atomic(path, b.s, b.len);
    free(b.s);
    return st;
}
