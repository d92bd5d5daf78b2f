/* multigrad — training curves as SVG (no dependencies): one panel per
 * group of series sharing a y axis, epochs on the x axis. */
#ifndef MULTIGRAD_PLOT_H
#define MULTIGRAD_PLOT_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_plot_series {
    const char *label;
    const double *y;     /* n values, epoch 1..n */
    int panel;           /* 0 or 1: which panel (e.g. loss, accuracy) */
} mg_plot_series;

/* Write an SVG with two panels (titles panel_title[0], [1]) atomically. */
mg_status mg_plot_svg(const char *path, const char *title,
                      const char *const panel_title[2],
                      const mg_plot_series *s, int n_series, int n);

#ifdef __cplusplus
}
#endif
#endif
