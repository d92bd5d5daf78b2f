/* bench/curves — an SVG of validation-loss curves through the library's
 * plot writer: bench/gpt.sh's multigrad and PyTorch by step, bench/sync.sh's
 * plans by training time.
 *
 *   curves OUT.svg TITLE LABEL FILE [LABEL FILE ...]
 *   curves --time OUT.svg TITLE LABEL FILE [LABEL FILE ...]
 *
 * Each FILE holds "x val_loss" lines. By step, the curves must share
 * their steps (the first file's are the x axis); by time (x: seconds of
 * training, or since it began), each curve is read at 200 even instants from 0 to the
 * longest run's end, between its points (none before its first or after
 * its last). One panel shows the losses, the other each curve's
 * difference from the first. At most 8 curves. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/plot.h"

#define MAX_CURVES 8
#define MAX_POINTS 4096
#define TIME_POINTS 200

static int read_curve(const char *path, double *x, double *y)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        exit(2);
    }
    int n = 0;
    while (n < MAX_POINTS && fscanf(f, "%lf %lf", &x[n], &y[n]) == 2) n++;
    fclose(f);
    return n;
}

/* y of the curve (x, y; m points, x ascending) at t; NaN outside it. */
static double at(const double *x, const double *y, int m, double t)
{
    if (m < 1 || t < x[0] || t > x[m - 1]) return NAN;
    int i = 1;
    while (i < m && x[i] < t) i++;
    if (i == m || x[i] == x[i - 1]) return y[i - 1];
    return y[i - 1] + (y[i] - y[i - 1]) * (t - x[i - 1]) / (x[i] - x[i - 1]);
}

int main(int argc, char **argv)
{
    int by_time = argc > 1 && !strcmp(argv[1], "--time");
    argv += by_time;
    argc -= by_time;
    int k = (argc - 3) / 2;
    if (argc < 5 || (argc - 3) % 2 || k > MAX_CURVES) {
        fprintf(stderr, "usage: curves [--time] OUT.svg TITLE LABEL FILE [LABEL FILE ...] (at "
                "most %d)\n", MAX_CURVES);
        return 2;
    }
    static double x[MAX_CURVES][MAX_POINTS], y[MAX_CURVES][MAX_POINTS], d[MAX_CURVES][MAX_POINTS];
    static double grid[MAX_POINTS], v[MAX_CURVES][MAX_POINTS];
    int m[MAX_CURVES];
    double end = 0;
    for (int c = 0; c < k; c++) {
        m[c] = read_curve(argv[4 + 2 * c], x[c], y[c]);
        if (m[c] && x[c][m[c] - 1] > end) end = x[c][m[c] - 1];
    }
    int n = m[0];
    if (by_time) {   /* every curve on one grid of instants */
        n = TIME_POINTS;
        for (int i = 0; i < n; i++) grid[i] = end * i / (n - 1);
        for (int c = 0; c < k; c++)
            for (int i = 0; i < n; i++) v[c][i] = at(x[c], y[c], m[c], grid[i]);
    } else {
        for (int c = 0; c < k; c++) {
            if (m[c] != n) {
                fprintf(stderr, "curves: %s has %d points, %s has %d: run both with the same "
                        "--steps and --eval-every\n", argv[4 + 2 * c], m[c], argv[4], n);
                return 2;
            }
            for (int i = 0; i < n; i++) {
                if (x[c][i] != x[0][i]) {
                    fprintf(stderr, "curves: %s point %d is at step %g, %s's at %g\n",
                            argv[4 + 2 * c], i, x[c][i], argv[4], x[0][i]);
                    return 2;
                }
                v[c][i] = y[c][i];
            }
        }
        memcpy(grid, x[0], sizeof(double) * (size_t)n);
    }
    mg_plot_series s[2 * MAX_CURVES];
    char dlabel[MAX_CURVES][128];
    int ns = 0;
    for (int c = 0; c < k; c++) {
        for (int i = 0; i < n; i++) d[c][i] = v[c][i] - v[0][i];
        s[ns++] = (mg_plot_series){argv[3 + 2 * c], v[c], 0};
        if (c > 0) {
            snprintf(dlabel[c], sizeof dlabel[c], "%s - %s", argv[3 + 2 * c], argv[3]);
            s[ns++] = (mg_plot_series){dlabel[c], d[c], 1};
        }
    }
    const char *titles[2] = {"validation loss", "difference"};
    if (mg_plot_svg_xy(argv[1], argv[2], titles, by_time ? "seconds" : "step", grid,
                       s, ns, n)) {
        fprintf(stderr, "curves: %s\n", mg_last_error());
        return 1;
    }
    return 0;
}
