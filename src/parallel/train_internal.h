/* Internal to the trainer (trainer.c, train_loop.c, train_log.c,
 * train_settings.c): its state and what its files share. */
#ifndef MG_TRAIN_INTERNAL_H
#define MG_TRAIN_INTERNAL_H

#include "multigrad/train.h"

/* The metrics log's rows (train_log.c). */
typedef struct {
    bool text;
    mg_train_row *rows;
    int n, cap;
    int read;       /* the first rows, read back from the log on resume */
} mg__metrics;
mg_train_row mg__train_row_empty(void);
mg_status mg__metrics_add(mg__metrics *mt, const mg_train_row *r);
/* The log and its plot, written whole and atomically. */
mg_status mg__log_write(const char *path, const char *model, const mg__metrics *mt);
/* On resume: the rows of path whose first figure (epoch, or step) is at
 * most upto, increasing; a missing file adds none. */
mg_status mg__log_read(const char *path, mg__metrics *mt, double upto);
/* The same from n bytes of a log (CSV, or JSON lines): what the fuzz
 * target feeds. */
mg_status mg__log_parse(const char *s, size_t n, bool csv, mg__metrics *mt, double upto);
/* The plot beside a log: its path with .svg for the extension. */
void mg__log_plot_path(const char *log, char *out, size_t cap);

struct mg_trainer {
    mg_train_config c;        /* resolved */
    mg_optim_kind optim;
    mg_schedule sched;
    mg_compress compress;
    mg_device dev;
    double first_items;       /* images or tokens of mg_trainer_run's first step */
    double began;             /* when mg_trainer_run began (mg_now) */
    double log_written;       /* when rank 0 last wrote the log (mg_now; 0: not yet) */
    double log_cost;          /* how long that took */
    int log_rows;             /* the rows it held then */
    mg_group *g;              /* a job's ranks (NULL: one process) */
    mg_strategy *s;
    mg_model *m;
    mg_optim *opt;
    mg_mesh *mesh;            /* the strategy's */
    mg_trainer_info info;
    char hp[512];             /* the hyper-parameters a resume must share */
    int first[64 * 64 + 1];   /* --split's cut */
    char plan_mesh[48];       /* --plan auto's mesh */
    /* data */
    mg_dataset *train, *test;
    mg_text *text;
    mg__metrics log;
    bool saved;               /* a checkpoint written by this run, of step saved_step */
    long saved_step;
    long steps_per_epoch;     /* images */
    int leaves;               /* micro-batches a rank runs a step: --accumulate, or
                                 --deterministic's V/W virtual shards */
    float *xb;                /* images: a test batch (x, labels, indices) */
    int32_t *yb, *ib;
};

/* st agreed over the job, where there is one (mg_trainer_agree): a
 * mistake every rank finds alike is said once, by the first. The step
 * that made st ended alike on every rank (no collective left half done),
 * so that every rank comes here (trainer.c). */
mg_status mg__train_agreed(mg_trainer *t, mg_status st);

/* train_settings.c */
/* The hyper-parameters saved in checkpoints: "model=...;batch=...;...". */
void mg__train_hparams(const mg_train_config *c, char *out, size_t cap);
/* MG_EMISMATCH with one line naming the first that differs when a saved
 * checkpoint's hyper-parameters do not let this run resume it (model_only:
 * evaluate it, which needs the same model alone). */
mg_status mg__train_resume_check(const char *saved, const char *now, const char *path,
                                 bool model_only);
/* Every setting the ranks of a job must share (the hyper-parameters, what
 * shapes the collectives, the tool's), as "key=value;...". */
mg_status mg__train_settings(const mg_trainer *t, char *out, size_t cap);
/* Collective: the ranks were started with the same settings, or every
 * rank fails with one line naming the first difference from rank 0. */
mg_status mg__train_same_on_every_rank(mg_trainer *t, const char *settings);

/* train_loop.c */
/* A failure in a step or a collective, named with the rank and its mesh
 * coordinates: "rank 3 (pp 1, dp 1): ...". */
mg_status mg__train_step_error(const mg_trainer *t);

#endif
