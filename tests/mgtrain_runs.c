/* The mgtrain end-to-end tests' shared helpers (mgtrain_runs.h). */
#include <sys/stat.h>
#include "harness.h"
#include "idx_files.h"
#include "mgtrain_runs.h"
#include "multigrad/checkpoint.h"

double mgt_ckpt_rel_diff(const char *a, const char *b, double *max_rel)
{
    mg_st_file *fa, *fb;
    CHECK_OK(mg_st_open(a, &fa));
    CHECK_OK(mg_st_open(b, &fb));
    double dn = 0, nn = 0, worst = 0, scale = 0;
    int params = 0;
    for (int i = 0; i < mg_st_count(fb); i++) {
        const mg_st_tensor *y = mg_st_get(fb, i), *x = mg_st_find(fa, y->name);
        if (!strncmp(y->name, "optim.", 6)) continue;
        CHECK_MSG(x && x->nbytes == y->nbytes && x->dtype == MG_ST_F32, "tensor %s", y->name);
        const float *p = (const float *)x->data, *q = (const float *)y->data;
        for (size_t k = 0; k < y->nbytes / 4; k++) {
            dn += ((double)p[k] - q[k]) * ((double)p[k] - q[k]);
            nn += (double)q[k] * q[k];
            worst = fmax(worst, fabs((double)p[k] - q[k]));
            scale = fmax(scale, fabs((double)q[k]));
        }
        params++;
    }
    CHECK_EQ(params, 2 + 12 * 2 + 2);   /* wte, wpe, 12 per block, ln_f */
    mg_st_close(fa);
    mg_st_close(fb);
    *max_rel = worst / scale;
    return sqrt(dn / nn);
}

void mgt_refused(const mgt_refusal *c)
{
    char *out;
    const char *bin = mgt_tool("mgtrain");
    const char *run = mgt_tool("mgrun");
    for (; c->args; c++) {
        int rc = mgt_sh(&out, "%s -n 2 %s --model mlp --epochs 1 %s", run, bin, c->args);
        CHECK_MSG(rc != 0 && strstr(out, c->want), "%s: rc %d: %s", c->args, rc, out);
        free(out);
    }
}

const char *mgt_fashion_cut(int n_train, int n_test)
{
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/cut-%d-%d", mgt_tmpdir(), n_train, n_test);
    CHECK(mkdir(dir, 0700) == 0);
    CHECK_EQ(mgt_cut_fashion(mgt_fashion_dir(), dir, n_train, n_test), 0);
    return dir;
}
