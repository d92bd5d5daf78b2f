/* The benchmarks' gpt optimizer: models.md's AdamW for gpt-mini (lr 1e-3,
 * betas (0.9, 0.99), weight decay 0.1 on 2-D parameters only) over the
 * strategy's ranges. Returns 0, or 1 after printing why. */
#ifndef MG_BENCH_GPT_OPTIM_H
#define MG_BENCH_GPT_OPTIM_H

#include <stdio.h>
#include <stdlib.h>
#include "multigrad/multigrad.h"

static int gpt_adamw(mg_strategy *s, mg_optim **o)
{
    mg_model *m = mg_strategy_model(s);
    mg_optim_config oc = mg_optim_defaults(MG_OPTIM_ADAMW, 1e-3f);
    oc.beta2 = 0.99f;
    oc.weight_decay = 0.1f;
    int ng = mg_model_decay_groups(m, 0.1f, NULL, 0);
    mg_optim_group *gr = malloc(sizeof *gr * (size_t)ng);
    if (!gr || mg_strategy_optim(s, &oc, o)) {
        fprintf(stderr, "the optimizer: %s\n", gr ? mg_last_error() : "out of memory");
        free(gr);
        return 1;
    }
    mg_model_decay_groups(m, 0.1f, gr, ng);
    mg_status st = mg_optim_set_groups(*o, gr, ng);
    free(gr);
    if (st) fprintf(stderr, "the optimizer's groups: %s\n", mg_last_error());
    return st != MG_OK;
}

#endif
