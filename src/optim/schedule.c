/* Learning-rate schedules, a pure function of the step (0-based optimizer
 * step about to be taken), so a resumed run continues the same curve:
 *   constant            base_lr
 *   step:S:G            base_lr * G^floor(t / S)
 *   cosine[:MIN]        MIN + (base_lr - MIN) * (1 + cos(pi * t / T)) / 2,
 *                       T = total_steps - warmup_steps, MIN after T
 *   ...,warmup:W        first W steps ramp linearly: base_lr * (step+1) / W
 *                       (no step is wasted at lr 0; step W-1 is at base_lr),
 *                       then t = step - W.
 * Values are computed in double, as PyTorch's schedulers do in Python. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "multigrad/optim.h"

static bool parse_long(const char *s, size_t len, long *out)
{
    char buf[32];
    if (len == 0 || len >= sizeof buf) return false;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *end;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (errno || *end || buf[0] == '+' || buf[0] == ' ') return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, size_t len, float *out)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf) return false;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (errno || *end || !isfinite(v) || buf[0] == ' ') return false;
    *out = (float)v;
    return true;
}

#define USAGE "use constant, step:STEPS:GAMMA, cosine or cosine:MIN_LR, " \
              "optionally followed by ,warmup:STEPS"

mg_status mg_schedule_parse(const char *spec, float base_lr, mg_schedule *out)
{
    mg_schedule s = {.kind = MG_SCHED_CONSTANT, .base_lr = base_lr, .gamma = 1.0f};
    if (!spec) return mg_error(MG_EINVAL, "schedule: none given: " USAGE);
    const char *comma = strchr(spec, ',');
    size_t mlen = comma ? (size_t)(comma - spec) : strlen(spec);
    const char *c1 = memchr(spec, ':', mlen);
    size_t nlen = c1 ? (size_t)(c1 - spec) : mlen;
    const char *args = c1 ? c1 + 1 : spec + mlen;
    size_t alen = (size_t)(spec + mlen - args);

    if (nlen == 8 && !strncmp(spec, "constant", 8) && !c1) {
        s.kind = MG_SCHED_CONSTANT;
    } else if (nlen == 4 && !strncmp(spec, "step", 4) && c1) {
        const char *c2 = memchr(args, ':', alen);
        if (!c2 || !parse_long(args, (size_t)(c2 - args), &s.step_size) || s.step_size <= 0 ||
            !parse_float(c2 + 1, (size_t)(spec + mlen - c2 - 1), &s.gamma) || !(s.gamma > 0))
            return mg_error(MG_EINVAL, "schedule '%s': step needs STEPS > 0 and GAMMA > 0 "
                            "(e.g. step:1000:0.5)", spec);
        s.kind = MG_SCHED_STEP;
    } else if (nlen == 6 && !strncmp(spec, "cosine", 6)) {
        s.kind = MG_SCHED_COSINE;
        if (c1 && (!parse_float(args, alen, &s.min_lr) || !(s.min_lr >= 0)))
            return mg_error(MG_EINVAL, "schedule '%s': MIN_LR must be a number >= 0 "
                            "(e.g. cosine:0.001)", spec);
    } else {
        return mg_error(MG_EINVAL, "unknown schedule '%s': " USAGE, spec);
    }
    if (comma) {
        const char *w = comma + 1;
        if (strncmp(w, "warmup:", 7) != 0 || !parse_long(w + 7, strlen(w + 7), &s.warmup_steps) ||
            s.warmup_steps < 0)
            return mg_error(MG_EINVAL, "schedule '%s': after the comma expected warmup:STEPS "
                            "with STEPS >= 0 (e.g. cosine,warmup:500)", spec);
    }
    *out = s;
    return MG_OK;
}

float mg_schedule_lr(const mg_schedule *s, long step)
{
    double base = s->base_lr;
    if (step < 0) step = 0;
    if (step < s->warmup_steps)
        return (float)(base * (double)(step + 1) / (double)s->warmup_steps);
    long t = step - s->warmup_steps;
    switch (s->kind) {
    case MG_SCHED_CONSTANT:
        return s->base_lr;
    case MG_SCHED_STEP:
        MG_ASSERT(s->step_size > 0);
        return (float)(base * pow((double)s->gamma, (double)(t / s->step_size)));
    case MG_SCHED_COSINE: {
        long T = s->total_steps - s->warmup_steps;
        if (T <= 0 || t >= T) return s->min_lr;
        double mn = s->min_lr;
        return (float)(mn + (base - mn) * (1.0 + cos(M_PI * (double)t / (double)T)) / 2.0);
    }
    }
    MG_ASSERT(!"unknown schedule kind");
    return 0.0f;
}
