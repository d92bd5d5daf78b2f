/* The trainer's loop (train.h): image models by epochs (each rank its
 * share perm[r::k] of every epoch's permutation), language models by steps
 * (each step's rows drawn once, micro-batch j and rank r taking theirs);
 * each step through mg_train_step, whatever the plan. After an epoch, or
 * every eval_every steps, the figures summed over the data-parallel
 * replicas, the evaluation (one copy for both kinds: the test set, or the
 * validation windows), the log and its plot (rank 0, every rank learning
 * whether it worked), the checkpoint, and the row handed to on_row; all
 * of it done again over the ranks that remain when one left amid it (an
 * elastic job's worker, mg_strategy_settle). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/sampler.h"
#include "multigrad/train.h"
#include "train_internal.h"

mg_status mg__train_step_error(const mg_trainer *t)
{
    const char *e = mg_last_error();
    if (!t->g) return mg_error(MG_EINVAL, "%s", e);
    char me[96];   /* "rank 3", or with its mesh coordinates "rank 3 (pp 1, dp 1)" */
    char msg[1024];
    int rank = mg_group_rank(t->g);
    snprintf(msg, sizeof msg, "%s", mg_error_past_rank(e, rank));
    /* A rank the others went on without says so to its caller. */
    mg_status code = mg_last_error_code() == MG_ELEFT ? MG_ELEFT : MG_EPEER;
    return mg_error(code, "%s: %s", mg_group_rank_name(t->g, rank, me, sizeof me), msg);
}

/* ---- batches --------------------------------------------------------------- */

typedef struct {
    mg_loader *loader;
    long left;               /* images of this rank's epoch not yet drawn */
    int per_step, drawn;     /* micro-batches a step takes, and drawn this epoch */
    long step_rows;          /* the rows of the step being drawn (this rank's), */
    int step_micro;          /* in that many micro-batches */
    const mg_text *text;     /* or text */
    uint64_t seed, step;
    int first, micro, batch, T, rank, world;
    int32_t *x, *y;
} source;

/* The loader's next micro-batch; without a loader (a data set's shape
 * alone: a parameter server) its size alone, the data NULL. */
static bool next_images(void *ud, mg_micro_batch *b)
{
    source *s = ud;
    const float *x = NULL;
    const int32_t *y = NULL;
    if (s->drawn++ % s->per_step == 0) {   /* a step begins: the epoch's last may be short */
        s->step_rows = s->left < (long)s->per_step * s->batch ? s->left
                                                              : (long)s->per_step * s->batch;
        s->step_micro = (int)((s->step_rows + s->batch - 1) / s->batch);
    }
    int n = !s->loader ? (int)(s->left < s->batch ? s->left : s->batch)
                       : mg_loader_next(s->loader, &x, &y);
    if (n <= 0) return false;
    s->left -= n;
    /* 1 but where the step's micro-batches differ in rows (64 as 48 + 16) */
    float weight = (float)((double)s->step_micro * n / (double)s->step_rows);
    *b = (mg_micro_batch){x, y, n, s->left <= 0, weight};
    return true;
}

/* Micro-batch j of step s: rows [first + j B, first + (j + 1) B) of step
 * s's draw, this rank's share of them (rank of world), so a global batch
 * is the same rows however accumulation, a pipeline's micro-batches and
 * the data-parallel ranks cut it (--deterministic: the rank's virtual
 * shards, each whole, from its first). */
static bool next_text(void *ud, mg_micro_batch *b)
{
    source *s = ud;
    int rows = mg_text_batch(s->text, s->seed, s->step, s->first + s->micro++ * s->batch,
                             s->batch, s->T, s->rank, s->world, s->x, s->y);
    *b = (mg_micro_batch){s->x, s->y, rows, false};
    return true;
}

/* The traffic counters of the job's group (tr[MG_MESH_DIMS]) and of each
 * dimension of its mesh, now (zeros in one process). */
static void traffic_now(const mg_trainer *t, mg_traffic tr[MG_MESH_DIMS + 1])
{
    for (int d = 0; d <= MG_MESH_DIMS; d++)
        tr[d] = d == MG_MESH_DIMS ? (t->g ? mg_group_traffic(t->g) : (mg_traffic){0})
              : t->mesh ? mg_group_traffic(mg_mesh_group(t->mesh, (mg_mesh_dim)d))
                        : (mg_traffic){0};
}

/* One optimizer step through the strategy; this rank's figures in r,
 * what it moved in the trainer's counters (each mesh dimension's, and
 * all of it). */
static mg_status step_run(mg_trainer *t, double lr, source *src, mg_batch_source next,
                          mg_step_result *r)
{
    mg_step_options so = {.accumulate = t->leaves, .lr = (float)lr,
                          .clip_grad = t->c.clip_grad,
                          .slow = t->c.slow_factor > 0 && t->info.rank == t->c.slow_rank
                                      ? t->c.slow_factor : 1};
    mg_traffic a[MG_MESH_DIMS + 1], b[MG_MESH_DIMS + 1];
    traffic_now(t, a);
    if (mg_train_step(t->s, t->opt, &so, next, src, r)) return mg__train_step_error(t);
    traffic_now(t, b);
    for (int d = 0; d <= MG_MESH_DIMS; d++) {
        t->info.step_sent += b[d].sent - a[d].sent;
        t->info.step_received += b[d].received - a[d].received;
        if (d == MG_MESH_DIMS) continue;
        mg_traffic *by = &t->info.step_by_dim[d];
        by->sent += b[d].sent - a[d].sent;
        by->received += b[d].received - a[d].received;
        by->seconds += b[d].seconds - a[d].seconds;
    }
    if (r->micro) t->info.steps_run++;   /* the empty call that ends an epoch is none */
    return MG_OK;
}

static mg_status sum_over_replicas(mg_trainer *t, double *v, int n)
{
    return mg_strategy_sum(t->s, v, n) ? mg__train_step_error(t) : MG_OK;
}

/* Between steps, before the job's collectives (done MG_OK) and after
 * them: the ranks that remain agree (an elastic job's roll call), and this
 * rank learns its place among them; *again: do them again. */
static mg_status settle(mg_trainer *t, mg_status done, bool *again)
{
    mg_status st = mg_strategy_settle(t->s, done, again);
    if (st && !done) return mg__train_step_error(t);
    mg_group *job = mg_strategy_group(t->s);
    if (job) {
        t->info.rank = mg_group_rank(job);
        t->info.world = mg_group_size(job);
    }
    return st;
}

/* ---- evaluation ------------------------------------------------------------ */

/* The test images [at, end) in batches. */
typedef struct {
    const mg_dataset *test;
    int at, end, batch;
    mg_scaling sc;
    float *x;
    int32_t *y, *idx;
    size_t x_len;
} test_source;

static bool next_test(void *ud, mg_micro_batch *b)
{
    test_source *s = ud;
    if (s->at >= s->end) return false;
    int n = s->end - s->at < s->batch ? s->end - s->at : s->batch;
    for (int k = 0; k < n; k++) s->idx[k] = s->at + k;
    bool counted = !s->test->images;   /* a shape alone: the batch's size alone */
    if (!counted && mg_dataset_gather(s->test, s->idx, n, s->sc, s->x, s->x_len, s->y))
        return false;
    s->at += n;
    *b = (mg_micro_batch){counted ? NULL : s->x, counted ? NULL : s->y, n, false};
    return true;
}

/* Test loss and accuracy through the strategy: each data-parallel replica
 * takes a contiguous shard of the test set and the sums are added, so the
 * figures are exact. */
static mg_status evaluate_images(mg_trainer *t, mg_train_row *r)
{
    int ch, h, w, batch = t->info.local;
    mg_model_input_shape(t->m, &ch, &h, &w);
    size_t in = (size_t)ch * h * w;
    if (!t->xb) {
        t->xb = mg_alloc(sizeof(float) * in * (size_t)batch);
        t->yb = mg_alloc(sizeof(int32_t) * (size_t)batch);
        t->ib = mg_alloc(sizeof(int32_t) * (size_t)batch);
        if (!t->xb || !t->yb || !t->ib)
            return mg_error(MG_ENOMEM, "out of memory for a batch of %d", batch);
    }
    test_source src = {.test = t->test, .batch = batch, .x = t->xb, .y = t->yb, .idx = t->ib,
                       .sc = t->c.normalized_input ? MG_SCALE_NORMAL : MG_SCALE_UNIT,
                       .x_len = in * (size_t)batch};
    int share, shares;
    mg_strategy_eval_share(t->s, &share, &shares);
    if (t->c.det_shards)   /* the same batches at any world size */
        mg_shard_blocks(t->test->n, batch, share, shares, &src.at, &src.end);
    else
        mg_shard_range(t->test->n, share, shares, &src.at, &src.end);
    mg_step_result sr;
    if (mg_strategy_evaluate(t->s, next_test, &src, &sr) || src.at < src.end)
        return mg__train_step_error(t);
    double v[3] = {sr.loss_sum, (double)sr.correct, (double)sr.samples};
    MG_TRY(sum_over_replicas(t, v, 3));
    r->test_loss = v[0] / v[2];
    r->test_acc = v[1] / v[2];
    return MG_OK;
}

mg_status mg_trainer_evaluate(mg_trainer *t, mg_train_row *r)
{
    MG_NEED("mg_trainer_evaluate", t);
    MG_NEED("mg_trainer_evaluate", r);
    if (!t->c.text) return evaluate_images(t, r);
    int share, shares;
    mg_strategy_eval_share(t->s, &share, &shares);
    if (mg_strategy_lm_val_loss(t->s, t->text, t->info.local, share, shares, t->c.eval_windows,
                                &r->val_loss))
        return mg__train_step_error(t);
    r->val_ppl = exp(r->val_loss);
    return MG_OK;
}

/* ---- after an epoch or evaluation ------------------------------------------ */

/* A training loss that is not a finite number, since step `since`: every
 * later step would only train on NaN, and a checkpoint of NaN parameters
 * could not be resumed, so the run stops without writing one over the last
 * good one (the row still goes to the log). */
static mg_status diverged(mg_trainer *t, const mg_train_row *r, long since)
{
    char kept[600] = "";
    if (t->saved)
        snprintf(kept, sizeof kept, "; %s keeps step %ld", t->c.save, t->saved_step);
    else if (t->c.resume)
        snprintf(kept, sizeof kept, "; %s is untouched", t->c.resume);
    return mg_error(MG_EDIVERGED, "training diverged: the training loss of steps %ld to %ld is "
                    "%g%s: lower --lr, warm it up (--schedule ...,warmup:STEPS) or clip the "
                    "gradients (--clip-grad)", since + 1, r->step, r->train_loss, kept);
}

/* Rank 0 writes the log and its plot whole (a file replaced, never half
 * written): at a save, at the run's end, and else after each row once ten
 * times the last write's time has passed, so that it takes at most a
 * tenth of the run. A short log is written every row; written every row,
 * a long one's cost grew with the square of its rows (105 s of a 156 s run
 * of 8,000 rows; a probe). */
static mg_status write_log(mg_trainer *t, bool now)
{
    const mg_train_config *c = &t->c;
    if (t->info.rank || !c->log || t->log_rows == t->log.n) return MG_OK;
    double t0 = mg_now();
    if (!now && t0 - t->log_written < 10 * t->log_cost) return MG_OK;
    mg_status st = mg__log_write(c->log, c->model, &t->log);
    if (st)
        return mg_error(st, "--log: %s (the log and its plot as they were before this row)",
                        mg_last_error());
    t->log_written = mg_now();
    t->log_cost = t->log_written - t0;
    t->log_rows = t->log.n;
    return MG_OK;
}

/* The row to the log (rank 0 writes it and its plot; every rank learns
 * whether it worked, and whether training diverged on a rank that trained
 * since step `since` (-1: it did not): also the barrier before a save),
 * then the checkpoint. */
static mg_status record(mg_trainer *t, mg_train_row *r, bool save, long since)
{
    const mg_train_config *c = &t->c;
    r->elapsed = mg_now() - t->began;
    MG_TRY(mg__metrics_add(&t->log, r));
    mg_status st = write_log(t, save && c->save);
    if (!st && since >= 0) st = diverged(t, r, since);
    MG_TRY(mg_trainer_agree(t, st));
    if (!save || !c->save) return MG_OK;
    mg_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    snprintf(meta.model, sizeof meta.model, "%s", c->model);
    meta.step = r->step;
    meta.epoch = r->epoch;
    meta.seed = c->seed;
    snprintf(meta.hparams, sizeof meta.hparams, "%s", t->hp);
    if ((st = mg_strategy_save(t->s, c->save, t->opt, &meta)))   /* a peer's loss stays one */
        return mg__train_agreed(t, mg_error(st == MG_EPEER || st == MG_ETIMEOUT ? st : MG_EIO,
                                            "--save: %s (the previous checkpoint, if any, is "
                                            "intact)", mg_last_error()));
    t->saved = true;
    t->saved_step = r->step;
    return MG_OK;
}

/* What ends an epoch or an evaluation interval: this rank's training
 * sums over the replicas (n of them: images: loss, correct, images; text:
 * loss, steps; none before the first step), the row made of them and
 * evaluated, recorded and (save) checkpointed. */
typedef struct {
    double mine[3];
    int n;
    bool save;
    mg_train_row row;   /* its figures apart from the sums' and evaluation's */
    double tokens_per_step;
    long since;         /* the step before the interval's first */
    double items;       /* out: the images or tokens trained on (row.per_s's) */
} interval_end;

static mg_status end_interval(mg_trainer *t, interval_end *e)
{
    mg_train_row r = e->row;
    double v[3];   /* summed again on each try: mine stays this rank's */
    memcpy(v, e->mine, sizeof v);
    if (e->n) MG_TRY(sum_over_replicas(t, v, e->n));
    if (e->n == 3) {
        r.train_loss = v[0] / v[2];
        r.train_acc = v[1] / v[2];
        e->items = v[2];
    } else if (e->n == 2) {
        r.train_loss = v[0] / v[1];
        e->items = v[1] / t->info.dp_size * e->tokens_per_step;
    }
    if (e->n) r.per_s = e->items / r.seconds;
    /* A rank that trained (an image server's loss is 0 / 0) and found NaN */
    bool bad = e->n && v[e->n - 1] > 0 && !isfinite(r.train_loss);
    MG_TRY(mg_trainer_evaluate(t, &r));
    return record(t, &r, e->save, bad ? e->since : -1);
}

/* end_interval between two settles: when a rank left amid it (an elastic
 * job's worker), the ranks that remain agree on it and do it again
 * (another row in the log's place). The row goes to on_row once. */
static mg_status between_steps(mg_trainer *t, interval_end *e)
{
    bool again = false;
    mg_status st = settle(t, MG_OK, &again);
    int logged = t->log.n;
    while (!st) {
        t->log.n = logged;
        st = settle(t, end_interval(t, e), &again);
        if (!again) break;
    }
    if (t->log.n > logged && t->c.on_row) t->c.on_row(&t->log.rows[t->log.n - 1], t->c.ud);
    return st;
}

static void progress(mg_trainer *t, mg_train_progress *p)
{
    if (t->c.on_progress) t->c.on_progress(p, t->c.ud);
}

/* ---- the loops ----------------------------------------------------------- */

/* After the run's first step, begun at t0, of `items` images or tokens:
 * its time, apart from the steady rate's. */
static void first_step(mg_trainer *t, mg_train_summary *sum, double t0, double items)
{
    if (sum->first_step_s > 0) return;
    sum->first_step_s = mg_now() - t0;
    t->first_items = items;
}

static mg_status run_images(mg_trainer *t, mg_train_summary *sum)
{
    const mg_train_config *c = &t->c;
    long step = t->info.start_step;
    t->sched.total_steps = t->steps_per_epoch * c->epochs;
    mg_sampler sampler = {0};
    mg_loader *loader = NULL;
    mg_status st = c->det_shards   /* each global batch's rows in place, at any world size */
        ? mg_sampler_init_blocks(&sampler, t->train->n, t->info.dp_rank, t->info.dp_size,
                                 c->batch * c->accumulate, true, c->seed)
        : mg_sampler_init(&sampler, t->train->n, t->info.dp_rank, t->info.dp_size, true, c->seed,
                          false);
    if (!st && t->train->images)   /* else a shape alone: counted (next_images) */
        st = mg_loader_create(t->train, t->info.local,
                              c->normalized_input ? MG_SCALE_NORMAL : MG_SCALE_UNIT, &loader);
    for (int e = (int)t->info.start_epoch; !st && e < c->epochs; e++) {
        int n_local;
        mg_sampler_set_epoch(&sampler, e);
        const int32_t *order = mg_sampler_indices(&sampler, &n_local);
        if (loader && (st = mg_loader_start(loader, order, n_local, t->info.local, 0))) break;
        double v[3] = {0, 0, 0};  /* loss sum, correct, images (this rank) */
        double t0 = mg_now(), lr = c->lr;
        long since = step;
        mg_train_progress p = {.epoch = e, .epochs = c->epochs, .total = t->train->n,
                               .per_item = 1, .unit = "img", .started = t0};
        source src = {.loader = loader, .left = n_local, .batch = t->info.local,
                      .per_step = t->leaves};
        for (;;) {
            mg_step_result sr;
            double step_lr = mg_schedule_lr(&t->sched, step);   /* the row's: the last run */
            double began = mg_now();
            if ((st = step_run(t, step_lr, &src, next_images, &sr)) || sr.micro == 0) break;
            lr = step_lr;
            first_step(t, sum, began, (double)sr.samples * t->info.dp_size);
            v[0] += sr.loss_sum;
            v[1] += (double)sr.correct;
            v[2] += (double)sr.samples;
            step++;
            p.step = step;
            p.done = (long)v[2] * t->info.dp_size;
            p.loss = v[0] / v[2];
            progress(t, &p);
        }
        if (st) break;
        interval_end end = {.mine = {v[0], v[1], v[2]}, .n = 3, .save = true,
                            .row = mg__train_row_empty()};
        end.row.epoch = e + 1;
        end.row.step = step;
        end.since = since;
        end.row.seconds = mg_now() - t0;
        end.row.lr = lr;
        if ((st = between_steps(t, &end))) break;
        sum->seconds += end.row.seconds;
        sum->per_s += end.items;   /* divided below */
    }
    mg_loader_destroy(loader);
    mg_sampler_free(&sampler);
    return st;
}

static mg_status run_text(mg_trainer *t, mg_train_summary *sum)
{
    const mg_train_config *c = &t->c;
    long step = t->info.start_step, first = step;
    int T = c->gpt.ctx, local = t->info.local;
    t->sched.total_steps = c->steps;
    mg_status st = MG_OK;
    if (step == 0 && !c->no_eval_on_start) {   /* the curve starts at initialisation */
        interval_end start = {.row = mg__train_row_empty()};
        MG_TRY(between_steps(t, &start));
    }
    int32_t *x = malloc(sizeof(int32_t) * (size_t)local * T);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)local * T);
    if (!x || !y) st = mg_error(MG_ENOMEM, "out of memory for a batch of %d sequences", local);
    double tokens_per_step = (double)c->batch * T * c->accumulate;
    mg_train_progress p = {.steps = c->steps, .total = c->steps - first,
                           .per_item = tokens_per_step, .unit = "tok", .started = mg_now()};
    double v[2] = {0, 0};   /* loss sum, steps since the last evaluation (this rank) */
    double t0 = mg_now(), lr = c->lr;
    while (!st && step < c->steps) {
        source src = {.text = t->text, .seed = c->seed, .step = (uint64_t)step,
                      .batch = c->batch, .T = T, .rank = t->info.dp_rank,
                      .world = t->info.dp_size, .x = x, .y = y};
        if (c->det_shards)   /* the rank's virtual shards, whole */
            src = (source){.text = t->text, .seed = c->seed, .step = (uint64_t)step,
                           .first = t->info.dp_rank * t->leaves * local, .batch = local, .T = T,
                           .world = 1, .x = x, .y = y};
        mg_step_result sr;
        lr = mg_schedule_lr(&t->sched, step);
        double began = mg_now();
        if ((st = step_run(t, lr, &src, next_text, &sr))) break;
        first_step(t, sum, began, tokens_per_step);
        step++;
        if (sr.samples) v[0] += sr.loss_sum / (double)sr.samples;   /* a server has none */
        v[1] += 1;
        p.step = step;
        p.done = step - first;
        p.loss = v[0] / v[1];
        progress(t, &p);
        if (step % c->eval_every && step < c->steps) continue;
        interval_end end = {.mine = {v[0], v[1]}, .n = 2, .save = true,
                            .row = mg__train_row_empty(), .tokens_per_step = tokens_per_step,
                            .since = step - (long)v[1]};
        end.row.step = step;
        end.row.seconds = mg_now() - t0;
        end.row.lr = lr;
        sum->seconds += end.row.seconds;
        if ((st = between_steps(t, &end))) break;
        sum->per_s += end.items;   /* divided below */
        v[0] = v[1] = 0;
        t0 = mg_now();
    }
    free(x);
    free(y);
    return st;
}

mg_status mg_trainer_run(mg_trainer *t, mg_train_summary *s)
{
    MG_NEED("mg_trainer_run", t);
    mg_train_summary mine;
    if (!s) s = &mine;
    memset(s, 0, sizeof *s);
    if (t->c.plan_only || t->c.eval_only)
        return mg_error(MG_EINVAL, "mg_trainer_run: this trainer was made with %s: it has no "
                        "training to run", t->c.plan_only ? "plan_only" : "eval_only");
    long before = t->info.steps_run;
    mg_status st = MG_OK;
    t->began = mg_now();
    if (t->c.text ? t->info.start_step < t->c.steps : t->info.start_epoch < t->c.epochs)
        st = t->c.text ? run_text(t, s) : run_images(t, s);
    if (!st) {
        st = mg_trainer_agree(t, write_log(t, true));   /* the rows since the last */
    } else {   /* ...after a failure too (a diverged row), its message kept */
        char why[1024];
        snprintf(why, sizeof why, "%s", mg_last_error());
        (void)write_log(t, true);
        mg_error(st, "%s", why);
    }
    if (!st) {   /* a second run has nothing left (it trained the epochs again) */
        t->info.start_step = t->c.text ? t->c.steps : t->c.epochs * t->steps_per_epoch;
        if (!t->c.text) t->info.start_epoch = t->c.epochs;
    }
    s->steps_run = t->info.steps_run - before;
    double items = s->per_s, rest = s->seconds - s->first_step_s;
    s->per_s = s->seconds > 0 ? items / s->seconds : 0;
    s->steady_per_s = s->steps_run > 1 && rest > 0 ? (items - t->first_items) / rest : 0;
    s->last = t->log.n ? t->log.rows[t->log.n - 1] : mg__train_row_empty();
    return st;
}
