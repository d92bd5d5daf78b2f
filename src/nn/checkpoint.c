/* Reading training checkpoints in safetensors (see checkpoint.h; writing
 * them is ckpt_write.c): parameters and
 * buffers under their state_dict names and shapes (PyTorch's
 * load_state_dict takes them as they are), optimizer state as
 * "optim.<state>.<param>" (e.g. optim.momentum_buffer.conv1.weight), and
 * metadata: format and version, model, step, epoch, seed, RNG position,
 * hyper-parameters and the optimizer's kind and configuration.
 *
 * Loading validates everything before touching the model: the file
 * (structure and the writer's CRC, see safetensors.c), the format, the
 * model name, every tensor's presence, dtype and shape, the optimizer kind
 * and state, and the metadata numbers; only then are values copied, so a
 * refused checkpoint leaves model and optimizer as they were.
 * mg_model_load_weights reads parameters from any safetensors file named
 * like a state_dict (F32, or F64/F16/BF16 converted to float). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/checkpoint.h"

#include "nn/ckpt_format.h"
#include "core/strbuf.h"

static bool same_shape(const mg_st_tensor *x, const mg_param *p)
{
    if (x->ndim != p->ndim) return false;
    for (int d = 0; d < p->ndim; d++)
        if (x->shape[d] != p->gshape[d]) return false;   /* the logical tensor's */
    return true;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *s64, const int *s32)
{
    size_t k = mg__catf(buf, cap, 0, "[");
    for (int d = 0; d < ndim; d++)
        k = mg__catf(buf, cap, k, "%s%lld", d ? ", " : "",
                     s64 ? (long long)s64[d] : (long long)s32[d]);
    mg__catf(buf, cap, k, "]");
}

/* A tensor of the file that must match p: present, of an accepted dtype,
 * of p's shape. */
static mg_status check_tensor(const char *path, const mg_st_file *f, const char *name,
                              const mg_param *p, bool any_float, const mg_st_tensor **out)
{
    const mg_st_tensor *x = mg_st_find(f, name);
    *out = x;
    if (!x)
        return mg_error(MG_EMISMATCH, "%s has no tensor '%s': it was written for another "
                        "model or is incomplete (a file must hold every tensor of the model; "
                        "only tensors beyond them may be left out)", path, name);
    bool ok = x->dtype == MG_ST_F32 || (any_float && (x->dtype == MG_ST_F64 ||
              x->dtype == MG_ST_F16 || x->dtype == MG_ST_BF16));
    if (!ok)
        return mg_error(MG_EMISMATCH, "%s: tensor '%s' is %s, expected F32", path, name,
                        mg_st_dtype_name(x->dtype));
    if (!same_shape(x, p)) {
        char a[96], b[96];
        shape_str(a, sizeof a, x->ndim, x->shape, NULL);
        shape_str(b, sizeof b, p->ndim, NULL, p->gshape);
        return mg_error(MG_EMISMATCH, "%s: tensor '%s' has shape %s, the model's is %s: the "
                        "file is of another model", path, name, a, b);
    }
    return MG_OK;
}

/* n floats of tensor x of f from its element `from` on, converted to
 * float; a remote file's through a bounce buffer unless they are F32. */
static mg_status copy_part(float *dst, const mg_st_file *f, const mg_st_tensor *x, size_t from,
                           size_t n)
{
    size_t es = mg_st_dtype_size(x->dtype);
    if (x->dtype == MG_ST_F32) return mg_st_read(f, x, from * es, n * es, dst);
    enum { CHUNK = 2048 };
    uint8_t buf[CHUNK * 8];
    for (size_t at = 0; at < n;) {
        size_t k = n - at < CHUNK ? n - at : CHUNK;
        const uint8_t *s = x->data ? (const uint8_t *)x->data + (from + at) * es : buf;
        if (!x->data) MG_TRY(mg_st_read(f, x, (from + at) * es, k * es, buf));
        float *d = dst + at;
        switch (x->dtype) {
        case MG_ST_F64:
            for (size_t i = 0; i < k; i++) {
                double v;
                memcpy(&v, s + 8 * i, 8);
                d[i] = (float)v;
            }
            break;
        case MG_ST_F16:
            for (size_t i = 0; i < k; i++) {
                uint16_t h;
                memcpy(&h, s + 2 * i, 2);
                d[i] = mg_f16_to_f32(h);
            }
            break;
        case MG_ST_BF16:
            for (size_t i = 0; i < k; i++) {
                uint16_t h;
                memcpy(&h, s + 2 * i, 2);
                d[i] = mg_bf16_to_f32(h);
            }
            break;
        default:
            MG_ASSERT(!"not a float dtype");
        }
        at += k;
    }
    return MG_OK;
}

/* Local elements [from, from + n) of p from the logical tensor x of f,
 * run by run (p's placement). */
static mg_status copy_local(float *dst, const mg_st_file *f, const mg_st_tensor *x,
                            const mg_param *p, size_t from, size_t n)
{
    for (size_t k = from; k < from + n;) {
        size_t g, len = mg_placement_run(&p->place, p->ndim, p->shape, k, &g);
        if (len > from + n - k) len = from + n - k;
        MG_TRY(copy_part(dst + (k - from), f, x, g, len));
        k += len;
    }
    return MG_OK;
}

/* Values a model or optimizer cannot hold: each element of a local file's
 * tensor x must be finite (and not below 0 where nonneg). */
static mg_status check_values(const char *path, const mg_st_file *f, const mg_st_tensor *x,
                              bool nonneg)
{
    if (!mg_st_checks_contents(f)) return MG_OK;   /* another process checked it */
    enum { CHUNK = 4096 };
    float v[CHUNK];
    size_t n = x->nbytes / mg_st_dtype_size(x->dtype);
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t k = n - at < CHUNK ? n - at : CHUNK;
        MG_TRY(copy_part(v, f, x, at, k));
        size_t bad = k;
        for (size_t i = 0; i < k; i++)
            if (!isfinite(v[i]) || (nonneg && v[i] < 0)) bad = bad < i ? bad : i;
        if (bad < k)
            return mg_error(MG_EFORMAT, "%s: tensor '%s' holds %g at element %zu%s: the file "
                            "is damaged or crafted (training from it would not recover)", path,
                            x->name, (double)v[bad], at + bad,
                            isfinite(v[bad]) ? ", and it cannot be negative" : "");
    }
    return MG_OK;
}

/* The part of tensor p's optimizer state s that o holds (the
 * intersections of p with o's ranges) from x; offloaded state through a
 * buffer of chunks. */
static mg_status copy_state(mg_optim *o, int s, const mg_param *p, const mg_st_file *f,
                            const mg_st_tensor *x)
{
    enum { CHUNK = 1 << 18 };
    size_t lo = p->offset, hi = p->offset + p->numel;
    bool off = mg_optim_offloaded(o);
    float *buf = off ? malloc(CHUNK * sizeof(float)) : NULL;
    if (off && !buf) return mg_error(MG_ENOMEM, "checkpoint: out of memory");
    mg_status st = MG_OK;
    for (int k = 0; k < mg_optim_num_ranges(o) && !st; k++) {
        mg_range r = mg_optim_range_at(o, k);
        size_t a = r.lo > lo ? r.lo : lo, b = r.hi < hi ? r.hi : hi;
        if (a < b && !off) st = copy_local(mg_optim_state_at(o, s, a, b), f, x, p, a - lo, b - a);
        for (size_t c = a; c < b && off && !st; c += CHUNK) {
            size_t n = b - c < CHUNK ? b - c : CHUNK;
            st = copy_local(buf, f, x, p, c - lo, n);
            if (!st) st = mg_optim_write_state(o, s, c, c + n, buf);
        }
    }
    free(buf);
    return st;
}

/* Counters (steps, epochs) are at most 2^53 - 1: they fit a long and
 * travel exactly as doubles (DDP broadcasts them so). */
#define MAX_COUNT ((UINT64_C(1) << 53) - 1)

/* A metadata number in [0, max]. */
static mg_status meta_u64(const char *path, const mg_st_file *f, const char *key, uint64_t max,
                          uint64_t *out)
{
    const char *s = mg_st_meta(f, key);
    char *end;
    errno = 0;
    if (!s || !*s || *s < '0' || *s > '9' ||
        (*out = strtoull(s, &end, 10), errno || *end))
        return mg_error(MG_EFORMAT, "%s: metadata '%s' is %s%s%s, expected a number: the file "
                        "is damaged", path, key, s ? "'" : "missing", s ? s : "", s ? "'" : "");
    if (*out > max)
        return mg_error(MG_EFORMAT, "%s: metadata '%s' is %s, over the largest a checkpoint "
                        "holds (%" PRIu64 "): the file is damaged or crafted", path, key, s, max);
    return MG_OK;
}

static mg_status copy_str(const char *path, const char *key, const char *v, char *dst, size_t cap)
{
    if (strlen(v) >= cap)
        return mg_error(MG_EFORMAT, "%s: metadata '%s' is longer than %zu bytes", path, key,
                        cap - 1);
    strcpy(dst, v);
    return MG_OK;
}

static mg_status validate(const char *path, const mg_st_file *f, mg_model *m, mg_optim *o,
                          mg_ckpt_meta *meta, long *osteps)
{
    const char *fmt = mg_st_meta(f, "format"), *ver = mg_st_meta(f, "format_version");
    if (!fmt || strcmp(fmt, FORMAT) != 0)
        return mg_error(MG_EFORMAT, "%s is not a multigrad checkpoint (no format metadata): "
                        "to start from weights exported from PyTorch use --init", path);
    if (!ver || strcmp(ver, FORMAT_VERSION) != 0)
        return mg_error(MG_EFORMAT, "%s: checkpoint format version '%s', this build reads "
                        "version " FORMAT_VERSION, path, ver ? ver : "(none)");
    if (!mg_st_verified(f))
        return mg_error(MG_EFORMAT, "%s: the checkpoint's checksum ('multigrad.crc32') is "
                        "missing: the file is damaged, or was edited; --init takes its weights "
                        "without it", path);
    const char *model = mg_st_meta(f, "model");
    if (!model || strcmp(model, mg_model_name(m)) != 0)
        return mg_error(MG_EMISMATCH, "%s is a checkpoint of model '%s', not '%s': pass "
                        "--model %s or another checkpoint", path, model ? model : "(none)",
                        mg_model_name(m), model ? model : "?");
    uint64_t step, epoch, seed, rng, os, extra = 0;
    MG_TRY(meta_u64(path, f, "step", MAX_COUNT, &step));
    MG_TRY(meta_u64(path, f, "epoch", MAX_COUNT, &epoch));
    MG_TRY(meta_u64(path, f, "seed", UINT64_MAX, &seed));
    MG_TRY(meta_u64(path, f, "rng_counter", MAX_COUNT, &rng));
    MG_TRY(meta_u64(path, f, "optimizer_steps", MAX_COUNT, &os));
    /* The steps beyond one per training step: an asynchronous parameter
     * server's pushes (files from before it have none). */
    if (mg_st_meta(f, "optimizer_extra_steps"))
        MG_TRY(meta_u64(path, f, "optimizer_extra_steps", MAX_COUNT, &extra));
    /* (A file without optimizer state is said to be one below, not
     * damaged: a probe.) */
    const char *has = mg_st_meta(f, "optimizer");
    if (o && has && strcmp(has, "none") && os != step + extra)
        return mg_error(MG_EFORMAT, "%s: metadata 'optimizer_steps' is %" PRIu64 " but 'step' is "
                        "%" PRIu64 " and 'optimizer_extra_steps' %" PRIu64 ": a checkpoint's "
                        "optimizer takes one step per training step and the extra ones (an "
                        "asynchronous parameter server's pushes), so the file is damaged or "
                        "crafted", path, os, step, extra);
    const char *hp = mg_st_meta(f, "hparams");
    if (!hp)
        return mg_error(MG_EFORMAT, "%s: metadata 'hparams' missing: the file is damaged", path);
    if (meta) {
        memset(meta, 0, sizeof *meta);
        MG_TRY(copy_str(path, "model", model, meta->model, sizeof meta->model));
        MG_TRY(copy_str(path, "hparams", hp, meta->hparams, sizeof meta->hparams));
        meta->step = (long)step;
        meta->epoch = (long)epoch;
        meta->seed = seed;
        meta->rng_counter = rng;
        meta->optimizer_steps = (long)os;
    }
    *osteps = (long)os;

    /* Every model tensor, and no tensor the model does not have. */
    int nt = mg_model_num_tensors(m);
    const mg_st_tensor *x;
    for (int i = 0; i < nt; i++) {
        MG_TRY(check_tensor(path, f, mg_model_tensor(m, i)->name, mg_model_tensor(m, i),
                            false, &x));
        MG_TRY(check_values(path, f, x, false));
    }
    const char *okind = mg_st_meta(f, "optimizer");
    if (o) {
        const char *want = mg_optim_kind_name(mg_optim_config_of(o)->kind);
        if (!okind || !strcmp(okind, "none"))
            return mg_error(MG_EMISMATCH, "%s holds no optimizer state (it was saved without "
                            "one), so training cannot resume from it: start from its weights "
                            "instead (--init)", path);
        if (strcmp(okind, want) != 0)
            return mg_error(MG_EMISMATCH, "%s holds %s optimizer state, but the optimizer is "
                            "%s: pass --optimizer %s to resume from it", path, okind, want,
                            okind);
        char name[NAME_MAX_];
        for (int s = 0; s < mg_optim_num_states(o); s++) {
            const char *sname;
            mg_optim_state(o, s, &sname);
            for (int i = 0; i < nt; i++) {
                const mg_param *p = mg_model_tensor(m, i);
                if (p->is_buffer) continue;
                snprintf(name, sizeof name, "optim.%s.%s", sname, p->name);
                MG_TRY(check_tensor(path, f, name, p, false, &x));
                MG_TRY(check_values(path, f, x, mg_optim_state_nonnegative(o, s)));
            }
        }
    }
    for (int i = 0; i < mg_st_count(f); i++) {
        const char *nm = mg_st_get(f, i)->name;
        if (!o && !strncmp(nm, "optim.", 6)) continue;
        bool known = false;
        for (int j = 0; j < nt && !known; j++) known = !strcmp(nm, mg_model_tensor(m, j)->name);
        if (!known && !strncmp(nm, "optim.", 6)) {
            char name[NAME_MAX_];
            for (int s = 0; s < mg_optim_num_states(o) && !known; s++) {
                const char *sname;
                mg_optim_state(o, s, &sname);
                for (int j = 0; j < nt && !known; j++) {
                    snprintf(name, sizeof name, "optim.%s.%s", sname, mg_model_tensor(m, j)->name);
                    known = !strcmp(nm, name);
                }
            }
        }
        if (!known)
            return mg_error(MG_EMISMATCH, "%s: unexpected tensor '%s' (the model or optimizer "
                            "has no such state): the checkpoint is of another configuration",
                            path, nm);
    }
    return MG_OK;
}

static mg_status load_host(const char *path, mg_model *m, mg_optim *o, mg_ckpt_meta *meta)
{
    mg_st_file *f;
    MG_TRY(mg_st_open_on_disk(path, &f));
    mg_status st = mg_checkpoint_load_st(f, path, m, o, NULL, 0, meta);
    mg_st_close(f);
    return st;
}

mg_status mg_checkpoint_load(const char *path, mg_model *m, mg_optim *o, mg_ckpt_meta *meta)
{
    mg_device was[2];
    MG_TRY(mg_ckpt_host_begin(m, o, was));
    return mg_ckpt_host_end(m, o, was, load_host(path, m, o, meta));
}

/* Local elements [from, from + n) of p from x, into p's memory wherever
 * it is (a device's through a host copy). */
static mg_status copy_into(const mg_param *p, const mg_st_file *f, const mg_st_tensor *x,
                           size_t from, size_t n, mg_device dev, const char *path)
{
    if (dev.kind == MG_DEVICE_CPU) return copy_local(p->data + from, f, x, p, from, n);
    float *h = malloc(n * sizeof(float));
    if (!h) return mg_error(MG_ENOMEM, "%s: out of memory", path);
    mg_status st = copy_local(h, f, x, p, from, n);
    if (!st) st = mg_device_copy(dev, p->data + from, (mg_device){MG_DEVICE_CPU, 0}, h,
                                 n * sizeof(float));
    free(h);
    return st;
}

/* The part of p inside the arena ranges r (NULL: all of it; buffers are
 * whole) from x. */
static mg_status read_part(const mg_param *p, const mg_st_file *f, const mg_st_tensor *x,
                           const mg_range *r, int nr, mg_device dev, const char *path)
{
    if (!r || p->is_buffer) return copy_into(p, f, x, 0, p->numel, dev, path);
    size_t lo = p->offset, hi = p->offset + p->numel;
    for (int k = 0; k < nr; k++) {
        size_t a = r[k].lo > lo ? r[k].lo : lo, b = r[k].hi < hi ? r[k].hi : hi;
        if (a < b) MG_TRY(copy_into(p, f, x, a - lo, b - a, dev, path));
    }
    return MG_OK;
}

/* Validated first, so a refused file changes nothing; a read of a file
 * not in memory failing part-way (a remote one's holder died, a disk's
 * read failed) leaves a partial state, which the caller must not train
 * from. */
mg_status mg_checkpoint_load_st(const mg_st_file *f, const char *path, mg_model *m, mg_optim *o,
                                const mg_range *r, int nr, mg_ckpt_meta *meta)
{
    mg_ckpt_meta got;
    long osteps = 0;
    MG_TRY(validate(path, f, m, o, &got, &osteps));
    char name[NAME_MAX_];
    int nt = mg_model_num_tensors(m);
    mg_status st = MG_OK;
    for (int i = 0; i < nt && !st; i++) {
        const mg_param *p = mg_model_tensor(m, i);
        st = read_part(p, f, mg_st_find(f, p->name), r, nr, mg_model_device(m), path);
    }
    for (int s = 0; o && s < mg_optim_num_states(o); s++) {
        const char *sname;
        mg_optim_state(o, s, &sname);
        for (int i = 0; i < nt && !st; i++) {
            const mg_param *p = mg_model_tensor(m, i);
            if (p->is_buffer) continue;
            snprintf(name, sizeof name, "optim.%s.%s", sname, p->name);
            st = copy_state(o, s, p, f, mg_st_find(f, name));
        }
    }
    if (st) return st;
    if (o) mg_optim_set_steps(o, osteps);
    mg_model_set_rng_counter(m, got.rng_counter);
    if (meta) *meta = got;
    return MG_OK;
}

/* The tensors of f under prefix that m has no place for (a multigrad
 * checkpoint's optimizer state aside: --init leaves it out by design):
 * their count, and the first few names in list. */
static int left_out(const mg_st_file *f, mg_model *m, const char *prefix, char *list, size_t cap)
{
    size_t pl = strlen(prefix);
    const char *fmt = mg_st_meta(f, "format");
    bool ckpt = fmt && !strcmp(fmt, FORMAT);
    int n = 0, nt = mg_model_num_tensors(m);
    size_t k = 0;
    list[0] = 0;
    for (int i = 0; i < mg_st_count(f); i++) {
        const char *nm = mg_st_get(f, i)->name;
        if (strncmp(nm, prefix, pl) || (ckpt && !strncmp(nm + pl, "optim.", 6))) continue;
        bool known = false;
        for (int j = 0; j < nt && !known; j++) known = !strcmp(nm + pl, mg_model_tensor(m, j)->name);
        if (known) continue;
        if (n < 3) k = mg__catf(list, cap, k, "%s%s", n ? ", " : "", nm);
        n++;
    }
    if (n > 3) mg__catf(list, cap, k, " and %d more", n - 3);
    return n;
}

mg_status mg_model_load_weights_st(const mg_st_file *f, const char *path, mg_model *m,
                                   const char *prefix, const mg_range *r, int nr,
                                   int *n_left_out)
{
    if (!prefix) prefix = "";
    char name[NAME_MAX_];
    mg_status st = MG_OK;
    const mg_st_tensor *x;
    int nt = mg_model_num_tensors(m);
    for (int i = 0; i < nt && !st; i++) {
        const mg_param *p = mg_model_tensor(m, i);
        if ((size_t)snprintf(name, sizeof name, "%s%s", prefix, p->name) >= sizeof name) {
            st = mg_error(MG_EINVAL, "%s: prefix '%s' is too long", path, prefix);
            break;
        }
        if (p->is_buffer && !mg_st_find(f, name)) continue;   /* buffers are optional */
        st = check_tensor(path, f, name, p, true, &x);
        if (!st) st = check_values(path, f, x, false);
    }
    char list[300];
    int extra = st ? 0 : left_out(f, m, prefix, list, sizeof list);
    if (n_left_out) *n_left_out = extra;
    else if (extra)
        st = mg_error(MG_EMISMATCH, "%s holds %d tensor%s that model %s has no place for (%s): "
                      "it is of a larger or another model", path, extra, extra > 1 ? "s" : "",
                      mg_model_name(m), list);
    mg_device dev = mg_model_device(m);
    for (int i = 0; i < nt && !st; i++) {
        const mg_param *p = mg_model_tensor(m, i);
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        if (!(x = mg_st_find(f, name))) continue;
        st = read_part(p, f, x, r, nr, dev, path);
    }
    return st;
}

mg_status mg_model_load_weights(const char *path, mg_model *m, const char *prefix,
                                int *n_left_out)
{
    mg_st_file *f;
    MG_TRY(mg_st_open_on_disk(path, &f));
    mg_status st = mg_model_load_weights_st(f, path, m, prefix, NULL, 0, n_left_out);
    mg_st_close(f);
    return st;
}
