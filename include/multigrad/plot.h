/* multigrad — training curves as SVG (no dependencies): one panel per
 * group of series sharing a y axis, epochs (or steps) on the x axis. */
#ifndef MULTIGRAD_PLOT_H
#define MULTIGRAD_PLOT_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_plot_series {
    const char *label;
    const double *y;     /* n values, one per x */
    int panel;           /* 0 or 1: which panel (e.g. loss, accuracy) */
} mg_plot_series;

/* Write an SVG with two panels (titles panel_title[0], [1]) atomically;
 * point i of every series is at epoch i + 1. */
mg_status mg_plot_svg(const char *path, const char *title,
                      const char *const panel_title[2],
                      const mg_plot_series *s, int n_series, int n);
/* The same with point i at xs[i] (e.g. training steps) and the x axis
 * named x_label; NaN values are left out of a series. */
mg_status mg_plot_svg_xy(const char *path, const char *title,
                         const char *const panel_title[2], const char *x_label,
                         const double *xs, const mg_plot_series *s, int n_series, int n);

#ifdef __cplusplus
}
#endif
#endif
