/* Writing training checkpoints in safetensors (see checkpoint.h; reading
 * them is checkpoint.c): one file laid out from the model's logical
 * tensors (parameters and buffers under their state_dict names,
 * optimizer state as "optim.<state>.<param>") and the metadata; each
 * process writes the pieces of its arena ranges, a placed parameter's
 * part as the runs of the logical tensor it covers, and one writes the
 * header, refusing bytes nobody or two processes wrote, and commits.
 * mg_checkpoint_save is one process writing everything. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/checkpoint.h"
#include "nn/ckpt_format.h"

static void put_num(char *buf, size_t cap, uint64_t v) { snprintf(buf, cap, "%" PRIu64, v); }

/* The shortest decimal that reads back as x ("0.9", not "0.899999976"). */
static const char *short_float(char *buf, size_t cap, float x)
{
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, cap, "%.*g", prec, (double)x);
        if (strtof(buf, NULL) == x) break;
    }
    return buf;
}

/* ---- writing: the layout, then each process's part, then the header ---- */

#define NKV 14

struct mg_ckpt_writer {
    mg_model *m;
    mg_optim *o;
    int n;                  /* tensors in the file */
    mg_st_tensor *t;        /* their names and shapes (no data) */
    const mg_param **p;     /* the model tensor each is (or is the state of) */
    int *state;             /* optimizer state index, -1: the parameter or buffer */
    uint64_t *off;          /* file offset of each one's data */
    uint64_t size;
    char *names, *plist;
    char num[6][24], ocfg[256], hparams[512];
    const char *kv[2 * NKV];
};

void mg_ckpt_writer_destroy(mg_ckpt_writer *w)
{
    if (!w) return;
    free(w->t);
    free(w->p);
    free(w->state);
    free(w->off);
    free(w->names);
    free(w->plist);
    free(w);
}

mg_status mg_ckpt_writer_create(mg_model *m, mg_optim *o, const mg_ckpt_meta *meta,
                                mg_ckpt_writer **out)
{
    *out = NULL;
    /* Without meta, the step is the optimizer's; with it, the optimizer
     * took at least one step per training step (the loader checks the
     * file's count against the step and the steps beyond). */
    mg_ckpt_meta zero = {.step = o ? mg_optim_steps(o) : 0};
    if (!meta) meta = &zero;
    long osteps = !o ? 0 : meta->optimizer_steps ? meta->optimizer_steps : mg_optim_steps(o);
    if (o && (meta->step < 0 || osteps < meta->step))
        return mg_error(MG_EINVAL, "checkpoint: the optimizer took %ld steps in %ld training "
                        "steps: it takes at least one per training step", osteps, meta->step);
    int nt = mg_model_num_tensors(m), ns = o ? mg_optim_num_states(o) : 0;
    size_t cap = (size_t)nt * (size_t)(1 + ns) + 1;
    mg_ckpt_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->m = m;
        w->o = o;
        w->t = calloc(cap, sizeof *w->t);
        w->p = calloc(cap, sizeof *w->p);
        w->state = calloc(cap, sizeof *w->state);
        w->off = calloc(cap, sizeof *w->off);
        w->names = calloc(cap, NAME_MAX_);
        w->plist = calloc((size_t)nt + 1, 66);
    }
    if (!w || !w->t || !w->p || !w->state || !w->off || !w->names || !w->plist) {
        mg_ckpt_writer_destroy(w);
        return mg_error(MG_ENOMEM, "checkpoint: out of memory");
    }
    int n = 0;
    for (int s = -1; s < ns; s++) {
        const char *sname = NULL;
        if (s >= 0) mg_optim_state(o, s, &sname);
        for (int i = 0; i < nt; i++) {
            const mg_param *p = mg_model_tensor(m, i);
            if (s >= 0 && p->is_buffer) continue;
            mg_st_tensor *x = &w->t[n];
            x->name = p->name;
            if (s >= 0) {
                char *nm = w->names + (size_t)n * NAME_MAX_;
                snprintf(nm, NAME_MAX_, "optim.%s.%s", sname, p->name);
                x->name = nm;
            } else if (!p->is_buffer) {
                if (w->plist[0]) strcat(w->plist, ",");
                strcat(w->plist, p->name);
            }
            x->dtype = MG_ST_F32;
            x->ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++) x->shape[d] = p->gshape[d];   /* logical */
            x->nbytes = p->gnumel * sizeof(float);
            w->p[n] = p;
            w->state[n] = s;
            n++;
        }
    }
    w->n = n;
    put_num(w->num[0], 24, (uint64_t)meta->step);
    put_num(w->num[1], 24, (uint64_t)meta->epoch);
    put_num(w->num[2], 24, meta->seed);
    put_num(w->num[3], 24, mg_model_rng_counter(m));
    put_num(w->num[4], 24, (uint64_t)osteps);
    put_num(w->num[5], 24, o ? (uint64_t)(osteps - meta->step) : 0);
    if (o) {
        const mg_optim_config *c = mg_optim_config_of(o);
        char v[7][24];
        snprintf(w->ocfg, sizeof w->ocfg, "lr=%s;momentum=%s;dampening=%s;nesterov=%d;"
                 "weight_decay=%s;beta1=%s;beta2=%s;eps=%s", short_float(v[0], 24, c->lr),
                 short_float(v[1], 24, c->momentum), short_float(v[2], 24, c->dampening),
                 c->nesterov ? 1 : 0, short_float(v[3], 24, c->weight_decay),
                 short_float(v[4], 24, c->beta1), short_float(v[5], 24, c->beta2),
                 short_float(v[6], 24, c->eps));
    }
    snprintf(w->hparams, sizeof w->hparams, "%.*s", (int)sizeof meta->hparams, meta->hparams);
    const char *kv[2 * NKV] = {
        "format", FORMAT,
        "format_version", FORMAT_VERSION,
        "model", mg_model_name(m),
        "step", w->num[0],
        "epoch", w->num[1],
        "seed", w->num[2],
        "rng_counter", w->num[3],
        "hparams", w->hparams,
        "optimizer", o ? mg_optim_kind_name(mg_optim_config_of(o)->kind) : "none",
        "optimizer_config", w->ocfg,
        "optimizer_steps", w->num[4],
        "optimizer_extra_steps", w->num[5],
        "parameters", w->plist,
        "producer", "multigrad",
    };
    memcpy(w->kv, kv, sizeof kv);
    void *h;
    size_t hl;
    mg_status st = mg_st_header(w->t, n, w->kv, NKV, NULL, &h, &hl);
    if (st) {
        mg_ckpt_writer_destroy(w);
        return st;
    }
    free(h);
    w->size = hl;
    for (int i = 0; i < n; i++) {
        w->off[i] = w->size;
        w->size += w->t[i].nbytes;
    }
    *out = w;
    return MG_OK;
}

uint64_t mg_ckpt_writer_size(const mg_ckpt_writer *w) { return w->size; }

static mg_status sink_write(const mg_ckpt_sink *out, const void *data, size_t len, uint64_t off)
{
    return out->write ? out->write(out->ud, data, len, off)
                      : mg_pwrite_all(out->fd, data, len, off, out->path);
}

static mg_status put_piece(mg_ckpt_writer *w, const mg_ckpt_sink *out, int i, const float *src,
                           size_t from, size_t n, mg_ckpt_piece *pc)
{
    size_t off = from * sizeof(float), len = n * sizeof(float);
    MG_TRY(sink_write(out, src, len, w->off[i] + off));
    *pc = (mg_ckpt_piece){.tensor = i, .crc = mg_crc32(src, len), .off = off, .len = len};
    return MG_OK;
}

/* Offloaded optimizer state [a, b) of tensor i (from float `from` of
 * the tensor): read from the offload file in chunks, written on. */
static mg_status put_offloaded(mg_ckpt_writer *w, const mg_ckpt_sink *out, int i, size_t a,
                               size_t b, size_t from, mg_ckpt_piece *pc)
{
    enum { CHUNK = 1 << 18 };
    float *buf = malloc(CHUNK * sizeof(float));
    if (!buf) return mg_error(MG_ENOMEM, "checkpoint %s: out of memory", out->path);
    *pc = (mg_ckpt_piece){.tensor = i, .crc = mg_crc32(NULL, 0), .off = from * sizeof(float),
                          .len = (b - a) * sizeof(float)};
    mg_status st = MG_OK;
    for (size_t x = a; x < b && !st; x += CHUNK) {
        size_t n = b - x < CHUNK ? b - x : CHUNK, len = n * sizeof(float);
        st = mg_optim_read_state(w->o, w->state[i], x, x + n, buf);
        if (!st) st = sink_write(out, buf, len, w->off[i] + (from + x - a) * sizeof(float));
        if (!st) pc->crc = mg_crc32_combine(pc->crc, mg_crc32(buf, len), len);
    }
    free(buf);
    return st;
}

/* A growing list of pieces. */
typedef struct {
    mg_ckpt_piece *pc;
    int n, cap;
} piece_list;

static mg_ckpt_piece *next_piece(piece_list *l, const char *path)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        mg_ckpt_piece *pc = realloc(l->pc, sizeof *pc * (size_t)cap);
        if (!pc) {
            mg_error(MG_ENOMEM, "checkpoint %s: out of memory", path);
            return NULL;
        }
        l->pc = pc;
        l->cap = cap;
    }
    return &l->pc[l->n++];
}

/* Arena floats [a, b) of tensor i (its parameter, or its optimizer
 * state), one piece per run of the logical tensor they are part of. */
static mg_status put_range(mg_ckpt_writer *w, const mg_ckpt_sink *out, int i, size_t a, size_t b,
                           piece_list *l)
{
    const mg_param *p = w->p[i];
    bool offloaded = w->state[i] >= 0 && mg_optim_offloaded(w->o);
    for (size_t k = a - p->offset; k < b - p->offset;) {
        size_t g, n = mg_placement_run(&p->place, p->ndim, p->shape, k, &g);
        if (n > b - p->offset - k) n = b - p->offset - k;
        size_t x = p->offset + k;   /* in the arena */
        mg_ckpt_piece *pc = next_piece(l, out->path);
        if (!pc) return MG_ENOMEM;
        if (offloaded) MG_TRY(put_offloaded(w, out, i, x, x + n, g, pc));
        else MG_TRY(put_piece(w, out, i, w->state[i] < 0 ? p->data + k
                                          : mg_optim_state_at(w->o, w->state[i], x, x + n),
                              g, n, pc));
        k += n;
    }
    return MG_OK;
}

mg_status mg_ckpt_write_part(mg_ckpt_writer *w, const mg_ckpt_sink *out, const mg_range *r,
                             int nr, bool buffers, mg_ckpt_piece **pieces, int *np)
{
    *pieces = NULL;
    *np = 0;
    piece_list l = {0};
    mg_status st = MG_OK;
    for (int i = 0; i < w->n && !st; i++) {
        const mg_param *p = w->p[i];
        if (p->is_buffer) {
            mg_ckpt_piece *pc = buffers ? next_piece(&l, out->path) : NULL;
            if (buffers) st = pc ? put_piece(w, out, i, p->data, 0, p->numel, pc) : MG_ENOMEM;
            continue;
        }
        size_t lo = p->offset, hi = p->offset + p->numel;
        for (int k = 0; k < nr && !st; k++) {
            size_t a = r[k].lo > lo ? r[k].lo : lo, b = r[k].hi < hi ? r[k].hi : hi;
            if (a < b) st = put_range(w, out, i, a, b, &l);
        }
    }
    if (st) {
        free(l.pc);
        return st;
    }
    *pieces = l.pc ? l.pc : calloc(1, sizeof *l.pc);
    *np = l.n;
    return *pieces ? MG_OK : mg_error(MG_ENOMEM, "checkpoint %s: out of memory", out->path);
}

static int by_tensor_off(const void *a, const void *b)
{
    const mg_ckpt_piece *x = a, *y = b;
    if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

mg_status mg_ckpt_write_header(mg_ckpt_writer *w, const mg_ckpt_sink *out, mg_ckpt_piece *pc,
                               int n)
{
    const char *path = out->path;
    qsort(pc, (size_t)n, sizeof *pc, by_tensor_off);
    uint32_t *crc = calloc((size_t)w->n + 1, sizeof *crc);
    if (!crc) return mg_error(MG_ENOMEM, "checkpoint %s: out of memory", path);
    int k = 0;
    for (int i = 0; i < w->n; i++) {
        uint64_t at = 0;
        uint32_t c = mg_crc32(NULL, 0);
        for (; k < n && pc[k].tensor == i; k++) {
            if (pc[k].off != at) break;
            c = mg_crc32_combine(c, pc[k].crc, pc[k].len);
            at += pc[k].len;
        }
        if (at != w->t[i].nbytes || (k < n && pc[k].tensor == i)) {
            free(crc);
            return mg_error(MG_EINVAL, "checkpoint %s: the bytes of '%s' were written %s", path,
                            w->t[i].name, at < w->t[i].nbytes ? "in part only" : "twice");
        }
        crc[i] = c;
    }
    void *h;
    size_t hl;
    mg_status st = mg_st_header(w->t, w->n, w->kv, NKV, crc, &h, &hl);
    free(crc);
    if (st) return st;
    MG_ASSERT(hl == w->off[0] || w->n == 0);
    st = sink_write(out, h, hl, 0);
    free(h);
    return st;
}

mg_status mg_ckpt_host_begin(mg_model *m, mg_optim *o, mg_device was[2])
{
    mg_device cpu = {MG_DEVICE_CPU, 0};
    was[0] = mg_model_device(m);
    was[1] = o ? mg_optim_device(o) : cpu;
    MG_TRY(mg_model_to_device(m, cpu));
    return o ? mg_optim_to_device(o, cpu) : MG_OK;
}

mg_status mg_ckpt_host_end(mg_model *m, mg_optim *o, const mg_device was[2], mg_status st)
{
    mg_status e = mg_model_to_device(m, was[0]);
    if (!e && o) e = mg_optim_to_device(o, was[1]);
    return st ? st : e;
}

static mg_status save_host(const char *path, mg_model *m, mg_optim *o, const mg_ckpt_meta *meta);

mg_status mg_checkpoint_save(const char *path, mg_model *m, mg_optim *o,
                             const mg_ckpt_meta *meta)
{
    mg_device was[2];
    MG_TRY(mg_ckpt_host_begin(m, o, was));
    return mg_ckpt_host_end(m, o, was, save_host(path, m, o, meta));
}

static mg_status save_host(const char *path, mg_model *m, mg_optim *o, const mg_ckpt_meta *meta)
{
    mg_ckpt_writer *w;
    MG_TRY(mg_ckpt_writer_create(m, o, meta, &w));
    char tmp[4096];
    int fd;
    mg_status st = mg_atomic_begin(path, w->size, tmp, sizeof tmp, &fd);
    if (st) {
        mg_ckpt_writer_destroy(w);
        return st;
    }
    /* One process holds every parameter's state. */
    mg_range all = {0, mg_model_arena_size(m)};
    mg_ckpt_piece *pc = NULL;
    int np = 0;
    mg_ckpt_sink out = {.fd = fd, .path = tmp};
    st = mg_ckpt_write_part(w, &out, &all, 1, true, &pc, &np);
    if (!st) st = mg_ckpt_write_header(w, &out, pc, np);
    free(pc);
    mg_ckpt_writer_destroy(w);
    if (st) {
        mg_atomic_abort(tmp, fd);
        return st;
    }
    return mg_atomic_commit(path, tmp, fd);
}

