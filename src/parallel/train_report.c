/* The trainer's reports, written to a stream the caller gives: the plan
 * (mgtrain --print-plan: every unit's parameters, arena range, FLOPs and
 * bytes kept, the tape of a micro-batch, and for a pipeline its cut and
 * every rank's schedule, simulated) and the counters (--verbose: what this
 * rank held at most and moved per step, what the device holds, the
 * pipeline's bubble as this rank lived it; with MG_TRACE, how much of
 * DDP's all-reduce backward hid); and the figures' fingerprint
 * (--print-hash). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/evp.h>
#include "multigrad/trace.h"
#include "multigrad/train.h"
#include "parallel/internal.h"
#include "train_internal.h"
#include "core/strbuf.h"

/* The pipeline's cut and every rank's schedule, simulated. */
static mg_status print_pipeline(const mg_trainer *t, FILE *f)
{
    const mg_train_config *c = &t->c;
    mg_model *m = t->m;
    int P = t->info.pp, nu = mg_model_num_units(m), V = c->chunks, M = c->micro_batches, S;
    mg_pipe_kind k = MG_PIPE_1F1B;
    if (c->pp_schedule) mg_pipe_parse(c->pp_schedule, &k);   /* checked */
    const int *first = mg_pipe_cut(mg_strategy_pipe(t->s), &S);
    double total = 0;
    for (int u = 0; u < nu; u++) total += mg_pipe_unit_cost(m, u);
    fprintf(f, "pipeline: %d stage(s) on %d rank(s) (%d chunk(s) each), schedule %s, %d "
            "micro-batch(es); cut %s:\n", S, P, V, mg_pipe_name(k), M,
            c->split ? "as --split gives" : "balancing the units' forward FLOPs");
    for (int s = 0; s < S; s++) {
        double cost = 0;
        for (int u = first[s]; u < first[s + 1]; u++) cost += mg_pipe_unit_cost(m, u);
        mg_tape *tp;
        MG_TRY(mg_tape_create_range(m, t->info.local, first[s], first[s + 1], &tp));
        fprintf(f, "  stage %d on rank %d: units %d-%d (%s .. %s), %.1f%% of the FLOPs, a tape "
                "of %.1f MB per micro-batch\n", s, s % P, first[s], first[s + 1] - 1,
                mg_model_unit(m, first[s]).name, mg_model_unit(m, first[s + 1] - 1).name,
                total > 0 ? 100 * cost / total : 0, mg_tape_bytes(tp) / 1e6);
        mg_tape_destroy(tp);
    }
    mg_pipe_sim sim;
    MG_TRY(mg_pipe_simulate(k, P, M, V, 1, 2, &sim));
    fprintf(f, "bubble %.1f%% of the time (theory, a backward twice a forward); every rank's "
            "actions (stage, F/B, micro-batch):\n", 100 * sim.idle_fraction);
    enum { CAP = 4096 };
    mg_pipe_action *a = malloc(sizeof *a * CAP);
    char *line = malloc(65536);
    if (!a || !line) {
        free(a);
        free(line);
        return mg_error(MG_ENOMEM, "out of memory for the schedules");
    }
    for (int r = 0; r < P; r++) {
        int n = mg_pipe_compute(k, P, M, V, r, a, CAP);
        mg_pipe_list_str(a, n < CAP ? n : CAP, line, 65536);
        fprintf(f, "  rank %d (at most %d micro-batch(es) in flight): %s%s\n", r,
                sim.peak_in_flight[r], line, n > CAP ? " ..." : "");
    }
    free(a);
    free(line);
    return MG_OK;
}

mg_status mg_trainer_print_plan(const mg_trainer *t, FILE *f)
{
    if (t->info.rank != 0) return MG_OK;
    mg_model *m = t->m;
    char mesh[64] = "";
    if (t->mesh) mg_mesh_describe(t->mesh, mesh, sizeof mesh);
    fprintf(f, "plan: %s, strategy %s on %d rank(s)%s%s, units padded to %zu floats; %zu "
            "parameters in an arena of %zu floats\n", mg_model_name(m), mg_strategy_name(t->s),
            t->info.world, *mesh ? ", mesh " : "", mesh, mg_model_unit_pad(m),
            mg_model_num_params(m), mg_model_arena_size(m));
    fprintf(f, "%4s  %-16s %-12s %10s  %-22s %12s %12s %12s\n", "unit", "name", "kind", "params",
            "arena range", "fwd MFLOP", "kept KB", "out KB");
    for (int u = 0; u < mg_model_num_units(m); u++) {
        mg_unit_info ui = mg_model_unit(m, u);
        char range[48] = "-";
        if (ui.hi > ui.lo) snprintf(range, sizeof range, "[%zu, %zu)", ui.lo, ui.hi);
        fprintf(f, "%4d  %-16s %-12s %10zu  %-22s %12.3f %12.1f %12.1f\n", u, ui.name, ui.kind,
                ui.numel, range, ui.flops / 1e6, ui.saved_bytes / 1e3, ui.out_bytes / 1e3);
    }
    mg_tape *tp;
    MG_TRY(mg_tape_create(m, t->info.local, &tp));
    fprintf(f, "(FLOPs and bytes per sample.) A tape for a micro-batch of %d: %.1f MB%s\n",
            t->info.local, mg_tape_bytes(tp) / 1e6, mg_model_recompute(m) ? " (recomputing)" : "");
    mg_tape_destroy(tp);
    return t->info.pp > 1 ? print_pipeline(t, f) : MG_OK;
}

void mg_trainer_print_counters(const mg_trainer *t, const char *me, FILE *f)
{
    int rank = t->g ? mg_group_rank(t->g) : 0;   /* as it started, in an elastic job */
    mg_ddp *ddp = mg_strategy_ddp(t->s);
    if (ddp && mg_trace_on() && rank == 0) {
        mg_ddp_stats ds = mg_ddp_get_stats(ddp);
        if (ds.comm_us > 0)
            fprintf(f, "%s: %d buckets, all-reduce %.1f ms, %.1f ms exposed (%.0f%% hidden "
                    "behind backward)\n", me, mg_ddp_num_buckets(ddp), ds.comm_us / 1e3,
                    ds.exposed_us / 1e3, 100 * (1 - ds.exposed_us / ds.comm_us));
    }
    if (!mg_verbose()) return;
    mg_memory_stats ms = mg_strategy_memory(t->s, t->opt);
    double n = t->info.steps_run ? (double)t->info.steps_run : 1;
    /* The data held: the text, or the images and labels loaded (none on
     * a parameter server, which loads their shape alone). */
    double data = t->text ? (double)mg_text_size(t->text) : 0;
    const mg_dataset *sets[2] = {t->train, t->test};
    for (int i = 0; i < 2 && !t->text; i++)
        if (sets[i] && sets[i]->images) data += (double)sets[i]->n * (sets[i]->h * sets[i]->w + 1);
    fprintf(f, "%s: rank %d %s: peak MB parameters %.1f gradients %.1f optimizer %.1f "
            "activations %.1f data %.1f; per step MB sent %.3f received %.3f; peak RSS %.1f "
            "MB\n", me, rank, mg_strategy_name(t->s), ms.params / 1e6, ms.grads / 1e6,
            ms.optim / 1e6, ms.activations / 1e6, data / 1e6, (double)t->info.step_sent / n / 1e6,
            (double)t->info.step_received / n / 1e6, mg_peak_rss() / 1e6);
    if (t->mesh) {   /* what each dimension moved, and the time its operations took */
        char line[512];   /* one write: the ranks' lines must not interleave */
        int len = 0;
        for (int k = 0; k < MG_MESH_DIMS; k++) {
            const mg_traffic *by = &t->info.step_by_dim[k];
            len = mg__catf(line, sizeof line, len,
                           "%s %s: MB sent %.3f received %.3f in %.2f ms", k ? ";" : "",
                           mg_mesh_dim_name((mg_mesh_dim)k), (double)by->sent / n / 1e6,
                           (double)by->received / n / 1e6, by->seconds / n * 1e3);
        }
        fprintf(f, "%s: rank %d per step on%s\n", me, rank, line);
    }
    mg_model *m = t->m;
    mg_device d = mg_model_device(m);
    if (d.kind != MG_DEVICE_CPU) {   /* what the device holds now, between steps */
        size_t a = mg_model_arena_size(m) * sizeof(float);
        fprintf(f, "%s: rank %d device memory now MB parameters %.1f gradients %.1f (of %.1f "
                "each); the optimizer's state in %s memory\n", me, rank,
                mg_device_resident(d, mg_model_params(m), a) / 1e6,
                mg_device_resident(d, mg_model_grads(m), a) / 1e6, a / 1e6,
                mg_optim_device(t->opt).kind == MG_DEVICE_CPU ? "host" : "device");
    }
    mg_pipe *p = mg_strategy_pipe(t->s);
    if (!p) return;
    mg_pipe_stats ps = mg_pipe_get_stats(p);
    fprintf(f, "%s: rank %d pipeline: busy %.1f%% of %.1f ms per step (idle %.1f%%), at most %d "
            "micro-batch(es) in flight\n", me, rank,
            ps.step_us > 0 ? 100 * ps.busy_us / ps.step_us : 0,
            ps.steps ? ps.step_us / ps.steps / 1e3 : 0,
            ps.step_us > 0 ? 100 * (1 - ps.busy_us / ps.step_us) : 0, ps.peak_in_flight);
    if (d.kind != MG_DEVICE_CPU)
        fprintf(f, "%s: rank %d pipeline: %ld batches of sends and receives received in "
                "device memory; the group's device path: %s\n", me, rank, ps.batches,
                mg_group_device_path(mg__pipe_group(p), NULL));
}

mg_status mg_trainer_figures_hash(const mg_trainer *t, uint8_t out[32])
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    bool ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1;
    for (int i = t->log.read; ok && i < t->log.n; i++) {
        const mg_train_row *r = &t->log.rows[i];
        double v[5] = {r->train_loss, r->train_acc, r->test_loss, r->test_acc, r->val_loss};
        unsigned char b[sizeof v];
        memcpy(b, v, sizeof v);   /* little-endian hosts (x86-64, arm64) */
        ok = EVP_DigestUpdate(md, b, sizeof b) == 1;
    }
    unsigned len = 0;
    ok = ok && EVP_DigestFinal_ex(md, out, &len) == 1 && len == 32;
    EVP_MD_CTX_free(md);
    return ok ? MG_OK : mg_error(MG_ENOMEM, "--print-hash: SHA-256 of the figures failed");
}
