/* Every rank builds only its part (issue 31, item 3): a model made without
 * values (MG_SEED_DEFERRED) gets, under any plan and world size, values
 * only where its rank holds parameters, drawn by counter from the plan's
 * init_seed; gathered, they are one process's mg_model_create(..., seed)
 * bytes, and no rank's parameter arena ever had more pages in memory
 * than its part. */
#include <sys/mman.h>
#include <unistd.h>
#include "harness.h"
#include "multigrad/multigrad.h"

#define SEED 7

typedef struct {
    const char *model;
    mg_strategy_kind kind;
    const char *mesh;
    int stage, world, port;
} init_case;

static mg_status make(const char *model, uint64_t seed, mg_model **m)
{
    if (strcmp(model, "gpt")) return mg_model_create(model, seed, m);
    mg_gpt_config c = {.layers = 4, .dim = 64, .heads = 4, .ctx = 32, .vocab = 256};
    return mg_model_create_gpt(&c, seed, m);
}

/* Pages of [p, p + bytes) in memory (mincore). */
static size_t resident(const void *p, size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p / page * page, hi = ((uintptr_t)p + bytes + page - 1) / page * page;
    size_t n = (hi - lo) / page, in = 0;
    unsigned char *v = malloc(n ? n : 1);
    CHECK(v && mincore((void *)lo, hi - lo, v) == 0);
    for (size_t i = 0; i < n; i++) in += v[i] & 1;
    free(v);
    return in * page;
}

static int init_rank(int rank, int world, void *arg)
{
    const init_case *c = arg;
    mg_group *g = world > 1 ? mgt_join(rank, world, c->port, NULL, 30) : NULL;
    CHECK(world == 1 || g);
    mg_model *m;
    CHECK_OK(make(c->model, MG_SEED_DEFERRED, &m));
    CHECK(!mg_model_has_values(m));
    mg_strategy_options so = mg_strategy_defaults(world > 1 ? c->kind : MG_STRATEGY_SINGLE);
    so.group = g;
    so.mesh = c->mesh;
    so.zero_stage = world > 1 ? c->stage : 0;
    so.init_seed = SEED;
    so.max_batch = 2;
    so.pipe = (mg_pipe_options){.kind = MG_PIPE_1F1B, .micro_batches = 2};
    mg_strategy *s;
    CHECK_OK(mg_strategy_create(m, &so, &s));
    CHECK(mg_model_has_values(m));
    /* In memory: at most the parameters this rank holds (here its ranges:
     * ZeRO-3's pieces, a pipeline's stages), the pages its ends share with
     * others, and the page at the far end of its bucket, which giving the
     * rest back zeroes (mg_mem_discard zeroes partial pages). */
    size_t n = mg_model_arena_size(m), in = resident(mg_model_params(m), n * sizeof(float));
    size_t page = (size_t)sysconf(_SC_PAGESIZE), held = 0;
    int nr;
    const mg_range *r = mg_strategy_ranges(s, &nr);
    for (int k = 0; k < nr; k++) held += (r[k].hi - r[k].lo) * sizeof(float) + 3 * page;
    printf("rank %d of %s %s: %zu of %zu parameter bytes in memory, its part %zu\n", rank,
           mg_strategy_name(s), c->mesh ? c->mesh : "", in, n * sizeof(float), held);
    CHECK_MSG(in <= held, "rank %d holds %zu bytes, its part %zu", rank, in, held);
    /* Gathered: one process's initialisation. */
    CHECK_OK(mg_strategy_gather(s));
    if (rank == 0) {
        float *v = malloc(mg_model_num_params(m) * sizeof(float));
        CHECK(v);
        mg_model_to_vector(m, mg_model_params(m), v);
        char path[600];
        snprintf(path, sizeof path, "%s/params", mgt_tmpdir());
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(v, sizeof(float), mg_model_num_params(m), f) == mg_model_num_params(m));
        fclose(f);
        free(v);
    }
    CHECK_OK(mg_strategy_release(s));
    mg_strategy_destroy(s);
    mg_model_destroy(m);
    mg_group_destroy(g);
    return 0;
}

static void check_case(init_case c)
{
    c.port = mgt_free_port();
    mgt_tmpdir();
    int st[8];
    CHECK_MSG(mgt_fork_ranks(c.world, init_rank, &c, 60, st) == 0, "%s %s on %d ranks failed",
              c.model, c.mesh ? c.mesh : "", c.world);
    mg_model *ref;
    CHECK_OK(make(c.model, SEED, &ref));
    size_t np = mg_model_num_params(ref);
    float *want = malloc(np * sizeof(float)), *got = malloc(np * sizeof(float));
    CHECK(want && got);
    mg_model_to_vector(ref, mg_model_params(ref), want);
    char path[600];
    snprintf(path, sizeof path, "%s/params", mgt_tmpdir());
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(got, sizeof(float), np, f) == np);
    fclose(f);
    CHECK_MSG(!memcmp(want, got, np * sizeof(float)), "%s %s (zero %d) on %d ranks: the "
              "parameters differ from one process's", c.model, c.mesh ? c.mesh : "ddp", c.stage,
              c.world);
    unlink(path);
    free(want);
    free(got);
    mg_model_destroy(ref);
}

/* DDP and ZeRO-3 at 1 to 4 ranks, pipelines of 2 and 4 stages, 2 stages
 * with 2 replicas under ZeRO-3: lenet5 and a gpt whose head is tied to
 * its embedding across the stages. */
TEST_T(sharded_init_equals_one_process_under_every_plan, 240)
{
    const char *models[] = {"lenet5", "gpt"};
    for (int k = 0; k < 2; k++) {
        for (int w = 1; w <= 4; w++) {
            check_case((init_case){models[k], MG_STRATEGY_DDP, NULL, 0, w});
            check_case((init_case){models[k], MG_STRATEGY_ZERO, NULL, 3, w});
        }
        check_case((init_case){models[k], MG_STRATEGY_PIPELINE, "pp=2", 0, 2});
        check_case((init_case){models[k], MG_STRATEGY_PIPELINE, "pp=4", 0, 4});
        check_case((init_case){models[k], MG_STRATEGY_ZERO, "pp=2,dp=2", 3, 4});
    }
}
