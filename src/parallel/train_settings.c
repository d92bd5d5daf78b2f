/* The trainer's settings: the hyper-parameters a checkpoint records and a
 * resume must share (the global batch, batch x accumulate, compared as
 * one; epochs and steps may grow), and every setting the ranks of a job
 * must be started with alike, compared before the first collective that
 * depends on them: one all-gather of a SHA-256 digest, and when they
 * differ, one line naming the first difference from rank 0 as the flag
 * that gives it ("rank 1 has --lr 0.2, rank 0 has --lr 0.1"). What each
 * rank may choose (threads, verbosity, a GPU's index, the offload
 * directory, output paths other than the checkpoint's) is left out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/evp.h>
#include "train_internal.h"
#include "core/strbuf.h"

void mg__train_hparams(const mg_train_config *c, char *out, size_t cap)
{
    size_t n = mg__catf(out, cap, 0, "model=%s;batch=%d;lr=%g;momentum=%g;optimizer=%s;"
                        "weight_decay=%g;schedule=%s;seed=%llu;accumulate=%d;clip_grad=%g;",
                        c->model, c->batch, c->lr, c->momentum, c->optimizer, c->weight_decay,
                        c->schedule, (unsigned long long)c->seed, c->accumulate, c->clip_grad);
    if (strcmp(c->optimizer, "sgd"))
        n = mg__catf(out, cap, n, "betas=%g,%g;", c->beta1, c->beta2);
    if (c->text)   /* heads change no tensor shape, so the checkpoint cannot tell */
        mg__catf(out, cap, n, "arch=L%d,d%d,h%d,T%d;steps=%ld", c->gpt.layers, c->gpt.dim,
                 c->gpt.heads, c->gpt.ctx, c->steps);
    else
        mg__catf(out, cap, n, "epochs=%d", c->epochs);
}

/* The keys of now that saved has alike, or one line saying which is not
 * and how to fix it (clip_grad=, betas= and arch= are checked when this
 * run has them: a checkpoint from before they existed saved no clip, 0,
 * and betas it does not say). */
static mg_status resume_keys(const char *saved, const char *now, const char *path,
                             const char *const *keys, size_t n, const char *fix)
{
    for (size_t k = 0; k < n; k++) {
        const char *a = strstr(saved, keys[k]), *b = strstr(now, keys[k]);
        if (!b) continue;
        if (!a && !strcmp(keys[k], "clip_grad=")) a = "clip_grad=0";
        if (!a && !strcmp(keys[k], "betas=")) continue;   /* saved before --betas: unknown */
        if (!a)
            return mg_error(MG_EMISMATCH, "%s: checkpoint has no '%s' hyper-parameter: it was "
                            "not written by mgtrain or mg_trainer (mg_strategy_save writes the "
                            "caller's); load its weights alone (--init, .init)", path, keys[k]);
        size_t la = strcspn(a, ";"), lb = strcspn(b, ";");
        if (la != lb || strncmp(a, b, la) != 0)
            return mg_error(MG_EMISMATCH, "%s was saved with %.*s but this run has %.*s; %s",
                            path, (int)la, a, (int)lb, b, fix);
    }
    return MG_OK;
}

mg_status mg__train_resume_check(const char *saved, const char *now, const char *path,
                                 bool model_only)
{
    /* What makes the model first: another model's checkpoint was said to
     * have another batch, and giving that batch only then named the model
     * (a probe). The rest is training's. */
    static const char *model[] = {"model=", "arch="};
    MG_TRY(resume_keys(saved, now, path, model, 2, "give the flags of the model it holds "
                       "(--model, and a gpt's sizes)"));
    if (model_only) return MG_OK;
    long gb[2];
    const char *hp[2] = {saved, now};
    for (int k = 0; k < 2; k++) {
        const char *b = strstr(hp[k], "batch="), *a = strstr(hp[k], "accumulate=");
        gb[k] = (b ? atol(b + 6) : 0) * (a ? atol(a + 11) : 1);
    }
    if (gb[0] != gb[1])
        return mg_error(MG_EMISMATCH, "%s was saved with a global batch of %ld (--batch x "
                        "--accumulate) but this run's is %ld; resume with the same global "
                        "batch, or start a new run without --resume", path, gb[0], gb[1]);
    static const char *keys[] = {"lr=", "momentum=", "optimizer=", "weight_decay=",
                                 "schedule=", "seed=", "clip_grad=", "betas="};
    return resume_keys(saved, now, path, keys, sizeof keys / sizeof keys[0],
                       "resume with the same flags, or start a new run without --resume");
}

mg_status mg__train_settings(const mg_trainer *t, char *out, size_t cap)
{
    const mg_train_config *c = &t->c;
    char hp[512];
    mg__train_hparams(c, hp, sizeof hp);
    const char *dev = t->dev.kind == MG_DEVICE_CUDA ? "cuda"
                    : t->dev.kind == MG_DEVICE_EMU ? "emu" : "cpu";
    int n = snprintf(out, cap, "%s;compress=%s;bucket_mb=%g;eval_every=%d;eval_only=%s;"
                     "resume=%s;init=%s;zero=%d;mesh=%s;sequence_parallel=%d;pp_schedule=%s;micro_batches=%d;"
                     "chunks=%d;split=%s;device=%s;tf32=%d;bf16=%d;offload=%s;"
                     "eval_windows=%d;no_eval_on_start=%d;save=%s;det=%d,%d;%s", hp, c->compress,
                     c->bucket_mb, c->eval_every, c->eval_only ? "yes" : "no",
                     c->resume ? "given" : "none", c->init ? "given" : "none", c->zero,
                     c->mesh ? c->mesh : "none", c->sequence_parallel,
                     c->pp_schedule ? c->pp_schedule : "1f1b",
                     c->micro_batches, c->chunks, c->split ? c->split : "none", dev, c->tf32,
                     c->bf16, c->offload_dir ? "disk" : c->offload_cpu ? "cpu" : "none",
                     c->eval_windows, c->no_eval_on_start, c->save ? "given" : "none",
                     c->det_shards, c->det_chunks, c->settings ? c->settings : "");
    if (n < 0 || (size_t)n >= cap)
        return mg_error(MG_EINVAL, "the settings of this run do not fit %zu bytes", cap);
    return MG_OK;
}

/* One setting of a ";"-separated list as the flag that gives it:
 * "model=mlp" -> "--model mlp". */
static void setting_words(const char *kv, size_t n, char *out, size_t cap)
{
    size_t k = strcspn(kv, "=");
    if (k > n) k = n;
    char flag[64] = "--layers/--dim/--heads/--ctx";
    if (k != 4 || strncmp(kv, "arch", 4)) {
        snprintf(flag, sizeof flag, "--%.*s", (int)k, kv);
        for (char *p = flag; *p; p++) if (*p == '_') *p = '-';
    }
    snprintf(out, cap, "%s %.*s", flag, k < n ? (int)(n - k - 1) : 0, kv + k + (k < n));
}

#define SETTINGS_CAP 2048
/* The first setting where rank other's list differs from rank 0's. */
static mg_status name_difference(const char *a, const char *b, int other)
{
    for (;;) {
        size_t la = strcspn(a, ";"), lb = strcspn(b, ";");
        if (!*a && !*b)
            return mg_error(MG_EMISMATCH, "rank %d was started with other settings than rank "
                            "0: start every rank with the same flags", other);
        if (la != lb || strncmp(a, b, la)) {
            char wa[SETTINGS_CAP], wb[SETTINGS_CAP];
            setting_words(a, la, wa, sizeof wa);
            setting_words(b, lb, wb, sizeof wb);
            return mg_error(MG_EMISMATCH, "rank %d has %s, rank 0 has %s: start every rank "
                            "with the same %s", other, wa, wb,
                            strncmp(a, "data=", 5) ? "flags" : "data");
        }
        a += la + (a[la] != 0);
        b += lb + (b[lb] != 0);
    }
}

mg_status mg__train_same_on_every_rank(mg_trainer *t, const char *settings)
{
    if (!t->g) return MG_OK;
    int world = mg_group_size(t->g);
    unsigned char md[EVP_MAX_MD_SIZE], *all = malloc((size_t)world * SETTINGS_CAP);
    if (!all || !EVP_Digest(settings, strlen(settings), md, NULL, EVP_sha256(), NULL)) {
        free(all);
        return mg_error(MG_ENOMEM, "cannot compare the settings of the ranks: out of memory");
    }
    mg_status st = MG_OK;
    if (mg_all_gather(t->g, md, all, 32, MG_U8)) st = mg__train_step_error(t);
    int other = 0;
    for (int r = 1; !st && r < world && !other; r++) other = memcmp(all + 32 * r, all, 32) ? r : 0;
    if (!st && other) {
        char mine[SETTINGS_CAP] = "";
        snprintf(mine, sizeof mine, "%s", settings);
        if (mg_all_gather(t->g, mine, all, SETTINGS_CAP, MG_U8)) {
            st = mg__train_step_error(t);
        } else {
            all[(size_t)other * SETTINGS_CAP + SETTINGS_CAP - 1] = all[SETTINGS_CAP - 1] = 0;
            st = name_difference((const char *)all + (size_t)other * SETTINGS_CAP,
                                 (const char *)all, other);
        }
    }
    free(all);
    return st;
}
