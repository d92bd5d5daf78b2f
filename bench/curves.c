/* bench/curves — an SVG of validation-loss curves (bench/gpt.sh: multigrad
 * and PyTorch on one plot), through the library's plot writer.
 *
 *   curves OUT.svg TITLE LABEL FILE [LABEL FILE ...]
 *
 * Each FILE holds "step val_loss" lines; the curves must share their
 * steps (the first file's are the x axis). One panel shows the losses,
 * the other each curve's difference from the first. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "multigrad/plot.h"

#define MAX_CURVES 4
#define MAX_POINTS 4096

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

int main(int argc, char **argv)
{
    int k = (argc - 3) / 2;
    if (argc < 5 || (argc - 3) % 2 || k > MAX_CURVES) {
        fprintf(stderr, "usage: curves OUT.svg TITLE LABEL FILE [LABEL FILE ...] (at most %d)\n",
                MAX_CURVES);
        return 2;
    }
    static double x[MAX_CURVES][MAX_POINTS], y[MAX_CURVES][MAX_POINTS], d[MAX_CURVES][MAX_POINTS];
    mg_plot_series s[2 * MAX_CURVES];
    char dlabel[MAX_CURVES][128];
    int n = 0, ns = 0;
    for (int c = 0; c < k; c++) {
        int m = read_curve(argv[4 + 2 * c], x[c], y[c]);
        if (c == 0) n = m;
        if (m != n) {
            fprintf(stderr, "curves: %s has %d points, %s has %d: run both with the same "
                    "--steps and --eval-every\n", argv[4 + 2 * c], m, argv[4], n);
            return 2;
        }
        for (int i = 0; i < n; i++) {
            if (x[c][i] != x[0][i]) {
                fprintf(stderr, "curves: %s point %d is at step %g, %s's at %g\n",
                        argv[4 + 2 * c], i, x[c][i], argv[4], x[0][i]);
                return 2;
            }
            d[c][i] = y[c][i] - y[0][i];
        }
        s[ns++] = (mg_plot_series){argv[3 + 2 * c], y[c], 0};
        if (c > 0) {
            snprintf(dlabel[c], sizeof dlabel[c], "%s - %s", argv[3 + 2 * c], argv[3]);
            s[ns++] = (mg_plot_series){dlabel[c], d[c], 1};
        }
    }
    const char *titles[2] = {"validation loss", "difference"};
    if (mg_plot_svg_xy(argv[1], argv[2], titles, "step", x[0], s, ns, n)) {
        fprintf(stderr, "curves: %s\n", mg_last_error());
        return 1;
    }
    return 0;
}
