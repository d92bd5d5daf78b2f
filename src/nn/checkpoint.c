/* Training checkpoints in safetensors (see checkpoint.h): parameters and
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/checkpoint.h"

#define FORMAT "multigrad-checkpoint"
#define FORMAT_VERSION "1"
#define NAME_MAX_ 192

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

/* Optimizer state s indexed by arena offset. Checkpoints hold every
 * parameter's state, so the optimizer must cover all of them (a sharded
 * strategy gathers first). */
static float *optim_arena(const mg_model *m, mg_optim *o, int s, const char **name)
{
    size_t lo, hi;
    mg_optim_range(o, &lo, &hi);
    MG_ASSERT(lo == 0 && hi >= mg_model_arena_size(m));
    return mg_optim_state(o, s, name);
}

mg_status mg_checkpoint_save(const char *path, mg_model *m, mg_optim *o,
                             const mg_ckpt_meta *meta)
{
    mg_ckpt_meta zero = {0};
    if (!meta) meta = &zero;
    int nt = mg_model_num_tensors(m), ns = o ? mg_optim_num_states(o) : 0;
    size_t cap = (size_t)nt * (size_t)(1 + ns);
    mg_st_tensor *t = calloc(cap + 1, sizeof *t);
    char *names = calloc(cap + 1, NAME_MAX_);
    char *plist = calloc((size_t)nt + 1, 66);
    mg_status st = MG_OK;
    if (!t || !names || !plist) {
        st = mg_error(MG_ENOMEM, "checkpoint %s: out of memory", path);
        goto out;
    }
    int n = 0;
    for (int i = 0; i < nt; i++) {
        const mg_param *p = mg_model_tensor(m, i);
        mg_st_tensor *x = &t[n++];
        x->name = p->name;
        x->dtype = MG_ST_F32;
        x->ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) x->shape[d] = p->shape[d];
        x->data = p->data;
        x->nbytes = p->numel * sizeof(float);
        if (!p->is_buffer) {
            if (plist[0]) strcat(plist, ",");
            strcat(plist, p->name);
        }
    }
    for (int s = 0; s < ns; s++) {
        const char *sname;
        const float *state = optim_arena(m, o, s, &sname);
        for (int i = 0; i < nt; i++) {
            const mg_param *p = mg_model_tensor(m, i);
            if (p->is_buffer) continue;
            mg_st_tensor *x = &t[n];
            char *nm = names + (size_t)n * NAME_MAX_;
            snprintf(nm, NAME_MAX_, "optim.%s.%s", sname, p->name);
            *x = t[i];
            x->name = nm;
            x->data = state + p->offset;
            n++;
        }
    }
    char step[24], epoch[24], seed[24], rng[24], osteps[24], ocfg[256];
    put_num(step, sizeof step, (uint64_t)meta->step);
    put_num(epoch, sizeof epoch, (uint64_t)meta->epoch);
    put_num(seed, sizeof seed, meta->seed);
    put_num(rng, sizeof rng, mg_model_rng_counter(m));
    put_num(osteps, sizeof osteps, o ? (uint64_t)mg_optim_steps(o) : 0);
    ocfg[0] = 0;
    if (o) {
        const mg_optim_config *c = mg_optim_config_of(o);
        char v[7][24];
        snprintf(ocfg, sizeof ocfg, "lr=%s;momentum=%s;dampening=%s;nesterov=%d;"
                 "weight_decay=%s;beta1=%s;beta2=%s;eps=%s", short_float(v[0], 24, c->lr),
                 short_float(v[1], 24, c->momentum), short_float(v[2], 24, c->dampening),
                 c->nesterov ? 1 : 0, short_float(v[3], 24, c->weight_decay),
                 short_float(v[4], 24, c->beta1), short_float(v[5], 24, c->beta2),
                 short_float(v[6], 24, c->eps));
    }
    const char *kv[] = {
        "format", FORMAT,
        "format_version", FORMAT_VERSION,
        "model", mg_model_name(m),
        "step", step,
        "epoch", epoch,
        "seed", seed,
        "rng_counter", rng,
        "hparams", meta->hparams,
        "optimizer", o ? mg_optim_kind_name(mg_optim_config_of(o)->kind) : "none",
        "optimizer_config", ocfg,
        "optimizer_steps", osteps,
        "parameters", plist,
        "producer", "multigrad",
    };
    st = mg_st_write(path, t, n, kv, (int)(sizeof kv / sizeof kv[0] / 2));
out:
    free(t);
    free(names);
    free(plist);
    return st;
}

static bool same_shape(const mg_st_tensor *x, const mg_param *p)
{
    if (x->ndim != p->ndim) return false;
    for (int d = 0; d < p->ndim; d++)
        if (x->shape[d] != p->shape[d]) return false;
    return true;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *s64, const int *s32)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "",
                              s64 ? (long long)s64[d] : (long long)s32[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
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
                        "model or is incomplete", path, name);
    bool ok = x->dtype == MG_ST_F32 || (any_float && (x->dtype == MG_ST_F64 ||
              x->dtype == MG_ST_F16 || x->dtype == MG_ST_BF16));
    if (!ok)
        return mg_error(MG_EMISMATCH, "%s: tensor '%s' is %s, expected F32", path, name,
                        mg_st_dtype_name(x->dtype));
    if (!same_shape(x, p)) {
        char a[96], b[96];
        shape_str(a, sizeof a, x->ndim, x->shape, NULL);
        shape_str(b, sizeof b, p->ndim, NULL, p->shape);
        return mg_error(MG_EMISMATCH, "%s: tensor '%s' has shape %s, the model's is %s: the "
                        "file is of another model", path, name, a, b);
    }
    return MG_OK;
}

static void copy_floats(float *dst, const mg_st_tensor *x, size_t n)
{
    const uint8_t *s = x->data;
    switch (x->dtype) {
    case MG_ST_F32:
        memcpy(dst, s, n * 4);
        break;
    case MG_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, s + 8 * i, 8);
            dst[i] = (float)d;
        }
        break;
    case MG_ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = mg_f16_to_f32(h);
        }
        break;
    case MG_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = mg_bf16_to_f32(h);
        }
        break;
    default:
        MG_ASSERT(!"not a float dtype");
    }
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
        return mg_error(MG_EFORMAT, "%s: the checkpoint's checksum is missing: the file is "
                        "damaged", path);
    const char *model = mg_st_meta(f, "model");
    if (!model || strcmp(model, mg_model_name(m)) != 0)
        return mg_error(MG_EMISMATCH, "%s is a checkpoint of model '%s', not '%s': pass "
                        "--model %s or another checkpoint", path, model ? model : "(none)",
                        mg_model_name(m), model ? model : "?");
    uint64_t step, epoch, seed, rng, os;
    MG_TRY(meta_u64(path, f, "step", MAX_COUNT, &step));
    MG_TRY(meta_u64(path, f, "epoch", MAX_COUNT, &epoch));
    MG_TRY(meta_u64(path, f, "seed", UINT64_MAX, &seed));
    MG_TRY(meta_u64(path, f, "rng_counter", UINT64_MAX, &rng));
    MG_TRY(meta_u64(path, f, "optimizer_steps", MAX_COUNT, &os));
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
    }
    *osteps = (long)os;

    /* Every model tensor, and no tensor the model does not have. */
    int nt = mg_model_num_tensors(m);
    const mg_st_tensor *x;
    for (int i = 0; i < nt; i++) {
        MG_TRY(check_tensor(path, f, mg_model_tensor(m, i)->name, mg_model_tensor(m, i),
                            false, &x));
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

mg_status mg_checkpoint_load(const char *path, mg_model *m, mg_optim *o, mg_ckpt_meta *meta)
{
    mg_st_file *f;
    MG_TRY(mg_st_open(path, &f));
    mg_ckpt_meta got;
    long osteps = 0;
    mg_status st = validate(path, f, m, o, &got, &osteps);
    if (st) { mg_st_close(f); return st; }
    char name[NAME_MAX_];
    int nt = mg_model_num_tensors(m);
    for (int i = 0; i < nt; i++) {
        const mg_param *p = mg_model_tensor(m, i);
        copy_floats(p->data, mg_st_find(f, p->name), p->numel);
    }
    if (o) {
        for (int s = 0; s < mg_optim_num_states(o); s++) {
            const char *sname;
            float *state = optim_arena(m, o, s, &sname);
            for (int i = 0; i < nt; i++) {
                const mg_param *p = mg_model_tensor(m, i);
                if (p->is_buffer) continue;
                snprintf(name, sizeof name, "optim.%s.%s", sname, p->name);
                copy_floats(state + p->offset, mg_st_find(f, name), p->numel);
            }
        }
        mg_optim_set_steps(o, osteps);
    }
    mg_model_set_rng_counter(m, got.rng_counter);
    if (meta) *meta = got;
    mg_st_close(f);
    return MG_OK;
}

mg_status mg_model_load_weights(const char *path, mg_model *m, const char *prefix)
{
    mg_st_file *f;
    MG_TRY(mg_st_open(path, &f));
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
    }
    if (st) { mg_st_close(f); return st; }
    for (int i = 0; i < nt; i++) {
        const mg_param *p = mg_model_tensor(m, i);
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        if ((x = mg_st_find(f, name))) copy_floats(p->data, x, p->numel);
    }
    mg_st_close(f);
    return MG_OK;
}
