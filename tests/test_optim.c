/* Tests of src/optim: SGD (momentum, dampening, Nesterov, weight decay),
 * Adam and AdamW against values computed by hand and by torch.optim 1.13
 * (the literals below; see grad_of), range updates against full ones, and
 * the learning-rate schedules. */
#include "harness.h"
#include "multigrad/optim.h"

/* Gradient of step t for element i: dyadic, so exact in float and in the
 * Python script that produced the expected values:
 *   p = Parameter(tensor([0.5, -1, 2, 0, 3])); for t in range(4):
 *   p.grad = tensor([grad(t, i) ...]); opt.step() */
static float grad_of(int t, int i)
{
    return 0.25f * (float)(i + 1) - 0.5f * (float)t + (i % 2 ? 0.125f : -0.375f);
}

typedef struct {
    const char *name;
    mg_optim_config cfg;
    float after1[5], after4[5];
} torch_case;

static void run_case(const torch_case *tc)
{
    float p[5] = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f}, g[5];
    mg_optim *o;
    CHECK_OK(mg_optim_create(&tc->cfg, 5, &o));
    for (int t = 0; t < 4; t++) {
        for (int i = 0; i < 5; i++) g[i] = grad_of(t, i);
        mg_optim_step(o, p, g, tc->cfg.lr);
        const float *want = t == 0 ? tc->after1 : t == 3 ? tc->after4 : NULL;
        for (int i = 0; want && i < 5; i++)
            CHECK_MSG(fabsf(p[i] - want[i]) <= 3e-7f * fmaxf(1.0f, fabsf(want[i])),
                      "%s step %d p[%d] = %.9g, torch %.9g", tc->name, t + 1, i,
                      (double)p[i], (double)want[i]);
    }
    CHECK_EQ(mg_optim_steps(o), 4);
    mg_optim_destroy(o);
}

static mg_optim_config sgd(float lr, float mu, float damp, bool nesterov, float wd)
{
    mg_optim_config c = mg_optim_defaults(MG_OPTIM_SGD, lr);
    c.momentum = mu; c.dampening = damp; c.nesterov = nesterov; c.weight_decay = wd;
    return c;
}

static mg_optim_config adam(mg_optim_kind k, float lr, float wd, float b1, float b2, float eps)
{
    mg_optim_config c = mg_optim_defaults(k, lr);
    c.weight_decay = wd; c.beta1 = b1; c.beta2 = b2; c.eps = eps;
    return c;
}

TEST(optim_sgd_matches_torch)
{
    const torch_case cases[] = {
        {"sgd lr 0.1", sgd(0.1f, 0, 0, false, 0),
         {0.512499988f, -1.0625f, 1.96249998f, -0.112500004f, 2.9124999f},
         {0.850000024f, -0.950000048f, 2.1500001f, -0.150000021f, 2.95000005f}},
        {"sgd momentum 0.9", sgd(0.1f, 0.9f, 0, false, 0),
         {0.512499988f, -1.0625f, 1.96249998f, -0.112500004f, 2.9124999f},
         {1.08861244f, -1.0900625f, 2.13616252f, -0.542512476f, 2.68371248f}},
        {"sgd dampening 0.1 wd 0.01", sgd(0.1f, 0.9f, 0.1f, false, 0.01f),
         {0.512000024f, -1.06149995f, 1.9605f, -0.112500004f, 2.90949988f},
         {1.02942705f, -1.09355819f, 2.09291363f, -0.525833786f, 2.66063786f}},
        {"sgd nesterov wd 0.01", sgd(0.1f, 0.9f, 0, true, 0.01f),
         {0.522800028f, -1.11685002f, 1.92495f, -0.213750005f, 2.8280499f},
         {1.3723923f, -1.01767921f, 2.24873686f, -0.635279834f, 2.63113594f}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

TEST(optim_adam_adamw_match_torch)
{
    const torch_case cases[] = {
        {"adam lr 0.01", adam(MG_OPTIM_ADAM, 0.01f, 0, 0.9f, 0.999f, 1e-8f),
         {0.50999999f, -1.00999999f, 1.99000001f, -0.00999999978f, 2.99000001f},
         {0.536503553f, -1.01681018f, 1.99628842f, -0.0319755152f, 2.97373772f}},
        {"adam wd 0.1", adam(MG_OPTIM_ADAM, 0.01f, 0.1f, 0.9f, 0.999f, 1e-8f),
         {0.50999999f, -1.00999999f, 1.99000001f, -0.00999999978f, 2.99000001f},
         {0.535827279f, -1.01193202f, 1.98558712f, -0.0319399983f, 2.96727991f}},
        {"adamw wd 0.1", adam(MG_OPTIM_ADAMW, 0.01f, 0.1f, 0.9f, 0.999f, 1e-8f),
         {0.509500027f, -1.00900006f, 1.98800004f, -0.00999999978f, 2.98699999f},
         {0.534450591f, -1.01276815f, 1.98833477f, -0.0319187045f, 2.96181011f}},
        {"adam betas 0.8/0.99 eps 1e-6", adam(MG_OPTIM_ADAM, 0.05f, 0, 0.8f, 0.99f, 1e-6f),
         {0.549999595f, -1.04999995f, 1.95000017f, -0.0499999598f, 2.95000005f},
         {0.689718187f, -1.0717628f, 1.99367082f, -0.151401788f, 2.87937737f}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

TEST(optim_sgd_momentum_by_hand)
{
    /* p=1, g=1 each step, lr 0.1, mu 0.9: buf 1, 1.9, 2.71; p 0.9, 0.71, 0.439. */
    mg_optim_config c = sgd(0.1f, 0.9f, 0, false, 0);
    mg_optim *o;
    CHECK_OK(mg_optim_create(&c, 1, &o));
    CHECK_EQ(mg_optim_num_states(o), 1);
    const char *name;
    float *buf = mg_optim_state(o, 0, &name);
    CHECK(strcmp(name, "momentum_buffer") == 0);
    CHECK(buf[0] == 0.0f);
    float p = 1.0f, g = 1.0f;
    const float wp[3] = {0.9f, 0.71f, 0.439f}, wb[3] = {1.0f, 1.9f, 2.71f};
    for (int t = 0; t < 3; t++) {
        mg_optim_step(o, &p, &g, 0.1f);
        CHECK_NEAR(p, wp[t], 1e-6);
        CHECK_NEAR(buf[0], wb[t], 1e-6);
    }
    mg_optim_destroy(o);
    /* Nesterov, p=1, g=1: step 1 p -= 0.1*(1 + 0.9*1) = 0.81;
     * step 2 buf = 1.9, p -= 0.1*(1 + 0.9*1.9) = 0.81 - 0.271 = 0.539. */
    c.nesterov = true;
    CHECK_OK(mg_optim_create(&c, 1, &o));
    p = 1.0f;
    mg_optim_step(o, &p, &g, 0.1f);
    CHECK_NEAR(p, 0.81, 1e-6);
    mg_optim_step(o, &p, &g, 0.1f);
    CHECK_NEAR(p, 0.539, 1e-6);
    mg_optim_destroy(o);
    /* Without momentum there is no state; weight decay: g' = 1 + 0.5*2 = 2,
     * p = 2 - 0.1*2 = 1.8. */
    c = sgd(0.1f, 0, 0, false, 0.5f);
    CHECK_OK(mg_optim_create(&c, 1, &o));
    CHECK_EQ(mg_optim_num_states(o), 0);
    p = 2.0f;
    mg_optim_step(o, &p, &g, 0.1f);
    CHECK_NEAR(p, 1.8, 1e-6);
    mg_optim_destroy(o);
}

TEST(optim_adam_by_hand)
{
    /* Step 1 of Adam: m_hat = g and v_hat = g^2, so p -= lr*g/(|g|+eps),
     * about lr*sign(g) whatever |g|. AdamW first scales p by 1 - lr*wd. */
    float p[3] = {1.0f, 1.0f, 1.0f}, g[3] = {4.0f, -0.25f, 1e-3f};
    mg_optim_config c = adam(MG_OPTIM_ADAM, 0.1f, 0, 0.9f, 0.999f, 1e-8f);
    mg_optim *o;
    CHECK_OK(mg_optim_create(&c, 3, &o));
    CHECK_EQ(mg_optim_num_states(o), 2);
    const char *n0, *n1;
    float *m = mg_optim_state(o, 0, &n0), *v = mg_optim_state(o, 1, &n1);
    CHECK(!strcmp(n0, "exp_avg") && !strcmp(n1, "exp_avg_sq"));
    mg_optim_step(o, p, g, 0.1f);
    CHECK_NEAR(p[0], 0.9, 1e-6);
    CHECK_NEAR(p[1], 1.1, 1e-6);
    CHECK_NEAR(p[2], 1.0 - 0.1 * 1e-3 / (1e-3 + 1e-8), 1e-6);
    CHECK_NEAR(m[0], 0.4, 1e-6);
    CHECK_NEAR(v[0], 0.016, 1e-7);
    mg_optim_destroy(o);

    c = adam(MG_OPTIM_ADAMW, 0.1f, 0.5f, 0.9f, 0.999f, 1e-8f);
    CHECK_OK(mg_optim_create(&c, 3, &o));
    p[0] = 2.0f;
    mg_optim_step(o, p, g, 0.1f);
    CHECK_NEAR(p[0], 2.0 * (1 - 0.1 * 0.5) - 0.1, 1e-6);
    mg_optim_destroy(o);
}

static uint32_t hash32(uint32_t x)
{
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}

/* Updating ranges [lo, hi) that cover the arena equals one full update,
 * bit for bit, for every optimizer (this is what ZeRO shards rely on). */
TEST(optim_range_updates_equal_full)
{
    enum { N = 1037 };
    const mg_optim_config cfgs[] = {
        sgd(0.05f, 0, 0, false, 0), sgd(0.05f, 0.9f, 0, false, 0),
        sgd(0.05f, 0.9f, 0.2f, false, 1e-3f), sgd(0.05f, 0.9f, 0, true, 1e-3f),
        adam(MG_OPTIM_ADAM, 1e-3f, 0, 0.9f, 0.999f, 1e-8f),
        adam(MG_OPTIM_ADAM, 1e-3f, 1e-2f, 0.9f, 0.999f, 1e-8f),
        adam(MG_OPTIM_ADAMW, 1e-3f, 1e-2f, 0.9f, 0.999f, 1e-8f),
    };
    const size_t cuts[] = {0, 0, 1, 17, 64, 500, 500, 999, N};
    static float pa[N], pb[N], g[N];
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        mg_optim *a, *b;
        CHECK_OK(mg_optim_create(&cfgs[k], N, &a));
        CHECK_OK(mg_optim_create(&cfgs[k], N, &b));
        for (int i = 0; i < N; i++)
            pa[i] = pb[i] = (float)(hash32((uint32_t)i) % 2001) / 1000.0f - 1.0f;
        for (int t = 0; t < 5; t++) {
            for (int i = 0; i < N; i++)
                g[i] = (float)(hash32((uint32_t)(i + 7919 * t)) % 1001) / 500.0f - 1.0f;
            float lr = 0.05f / (float)(t + 1);
            mg_optim_step(a, pa, g, lr);
            mg_optim_begin_step(b, lr);
            /* Out of order, to show ranges are independent. */
            for (int c = (int)(sizeof cuts / sizeof cuts[0]) - 2; c >= 0; c--)
                mg_optim_update(b, pb, g, cuts[c], cuts[c + 1]);
            CHECK_MSG(memcmp(pa, pb, sizeof pa) == 0, "config %zu step %d differs", k, t);
        }
        for (int s = 0; s < mg_optim_num_states(a); s++)
            CHECK(memcmp(mg_optim_state(a, s, NULL), mg_optim_state(b, s, NULL),
                         N * sizeof(float)) == 0);
        mg_optim_destroy(a);
        mg_optim_destroy(b);
    }
    /* Calls out of their rule stopped the process (a probe): an update
     * before a step begun, or outside the ranges, a reversed range. */
    mg_optim *o;
    CHECK_ERR(mg_optim_create_range(&cfgs[1], 10, 5, &o), MG_EINVAL);
    CHECK_OK(mg_optim_create_range(&cfgs[1], 100, 200, &o));
    CHECK_ERR(mg_optim_update(o, pa, g, 100, 120), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "call mg_optim_begin_step first"));
    mg_optim_begin_step(o, 0.1f);
    CHECK_ERR(mg_optim_update(o, pa, g, 150, 201), MG_EINVAL);
    CHECK_MSG(strstr(mg_last_error(), "floats [150, 201) lie in none"), "%s", mg_last_error());
    CHECK_ERR(mg_optim_read_state(o, 0, 0, 10, pb), MG_EINVAL);
    CHECK_ERR(mg_optim_read_state(o, 3, 100, 110, pb), MG_EINVAL);
    CHECK_OK(mg_optim_update(o, pa, g, 150, 200));
    mg_optim_destroy(o);
}

TEST(optim_state_arenas_aligned_and_zeroed)
{
    mg_optim_config c = adam(MG_OPTIM_ADAMW, 1e-3f, 0.01f, 0.9f, 0.999f, 1e-8f);
    mg_optim *o;
    CHECK_OK(mg_optim_create(&c, 4096, &o));
    for (int s = 0; s < 2; s++) {
        float *st = mg_optim_state(o, s, NULL);
        CHECK(((uintptr_t)st % 64) == 0);
        for (int i = 0; i < 4096; i++) CHECK(st[i] == 0.0f);
    }
    mg_optim_set_steps(o, 7);
    CHECK_EQ(mg_optim_steps(o), 7);
    CHECK(mg_optim_config_of(o)->kind == MG_OPTIM_ADAMW);
    mg_optim_destroy(o);
    mg_optim_destroy(NULL);
}

TEST(optim_parse_defaults_and_bad_configs)
{
    mg_optim_kind k;
    CHECK_OK(mg_optim_parse("adamw", &k));
    CHECK(k == MG_OPTIM_ADAMW);
    CHECK_OK(mg_optim_parse("SGD", &k));
    CHECK(k == MG_OPTIM_SGD);
    CHECK_ERR(mg_optim_parse("rmsprop", &k), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "rmsprop") && strstr(mg_last_error(), "adamw"));
    CHECK(!strcmp(mg_optim_kind_name(MG_OPTIM_ADAM), "adam"));

    mg_optim_config c = mg_optim_defaults(MG_OPTIM_ADAMW, 0.001f);
    CHECK(c.beta1 == 0.9f && c.beta2 == 0.999f && c.eps == 1e-8f && c.weight_decay == 0.01f);
    c = mg_optim_defaults(MG_OPTIM_ADAM, 0.001f);
    CHECK(c.weight_decay == 0.0f);
    c = mg_optim_defaults(MG_OPTIM_SGD, 0.1f);
    CHECK(c.momentum == 0.0f && c.dampening == 0.0f && !c.nesterov && c.lr == 0.1f);

    mg_optim *o = NULL;
    mg_optim_config bad = sgd(-0.1f, 0, 0, false, 0);
    CHECK_ERR(mg_optim_create(&bad, 4, &o), MG_EINVAL);
    CHECK(o == NULL);
    bad = sgd(0.1f, 0, 0, true, 0);              /* nesterov without momentum */
    CHECK_ERR(mg_optim_create(&bad, 4, &o), MG_EINVAL);
    bad = sgd(0.1f, 0.9f, 0.5f, true, 0);        /* nesterov with dampening */
    CHECK_ERR(mg_optim_create(&bad, 4, &o), MG_EINVAL);
    bad = sgd(0.1f, 0.9f, 0, false, -1.0f);
    CHECK_ERR(mg_optim_create(&bad, 4, &o), MG_EINVAL);
    bad = adam(MG_OPTIM_ADAM, 0.1f, 0, 1.0f, 0.999f, 1e-8f);
    CHECK_ERR(mg_optim_create(&bad, 4, &o), MG_EINVAL);
    bad = adam(MG_OPTIM_ADAM, NAN, 0, 0.9f, 0.999f, 1e-8f);
    CHECK_ERR(mg_optim_create(&bad, 4, &o), MG_EINVAL);
}

TEST(optim_schedules)
{
    mg_schedule s;
    CHECK_OK(mg_schedule_parse("constant", 0.1f, &s));
    CHECK(s.kind == MG_SCHED_CONSTANT);
    CHECK(mg_schedule_lr(&s, 0) == 0.1f && mg_schedule_lr(&s, 100000) == 0.1f);

    CHECK_OK(mg_schedule_parse("step:10:0.5", 0.1f, &s));
    CHECK(s.kind == MG_SCHED_STEP && s.step_size == 10 && s.gamma == 0.5f);
    CHECK(mg_schedule_lr(&s, 0) == 0.1f && mg_schedule_lr(&s, 9) == 0.1f);
    CHECK(mg_schedule_lr(&s, 10) == 0.05f && mg_schedule_lr(&s, 19) == 0.05f);
    CHECK(mg_schedule_lr(&s, 25) == 0.025f);

    CHECK_OK(mg_schedule_parse("cosine", 0.1f, &s));
    s.total_steps = 100;
    CHECK(s.kind == MG_SCHED_COSINE && s.min_lr == 0.0f);
    CHECK(mg_schedule_lr(&s, 0) == 0.1f);
    CHECK_NEAR(mg_schedule_lr(&s, 50), 0.05, 1e-8);
    CHECK_NEAR(mg_schedule_lr(&s, 25), 0.05 * (1 + cos(M_PI / 4)), 1e-8);
    CHECK(mg_schedule_lr(&s, 100) == 0.0f && mg_schedule_lr(&s, 500) == 0.0f);

    CHECK_OK(mg_schedule_parse("cosine:0.01,warmup:10", 0.1f, &s));
    s.total_steps = 110;
    CHECK(s.min_lr == 0.01f && s.warmup_steps == 10);
    CHECK_NEAR(mg_schedule_lr(&s, 0), 0.01, 1e-8);    /* 0.1 * 1/10 */
    CHECK_NEAR(mg_schedule_lr(&s, 4), 0.05, 1e-8);
    CHECK(mg_schedule_lr(&s, 9) == 0.1f);
    CHECK(mg_schedule_lr(&s, 10) == 0.1f);             /* cosine starts at t = 0 */
    CHECK_NEAR(mg_schedule_lr(&s, 60), 0.055, 1e-8);   /* halfway: (0.1 + 0.01) / 2 */
    CHECK_NEAR(mg_schedule_lr(&s, 110), 0.01, 1e-9);

    CHECK_OK(mg_schedule_parse("step:5:0.1,warmup:3", 1.0f, &s));
    CHECK_NEAR(mg_schedule_lr(&s, 0), 1.0 / 3, 1e-7);
    CHECK(mg_schedule_lr(&s, 3) == 1.0f && mg_schedule_lr(&s, 7) == 1.0f);
    CHECK_NEAR(mg_schedule_lr(&s, 8), 0.1, 1e-8);

    CHECK_OK(mg_schedule_parse("constant,warmup:0", 0.5f, &s));
    CHECK(mg_schedule_lr(&s, 0) == 0.5f);

    const char *bad[] = {"", "linear", "step", "step:10", "step:0:0.5", "step:10:-1",
                         "step:10:x", "cosine:", "cosine:-1", "constant:3",
                         "cosine,warmup", "cosine,warmup:-2", "cosine,cooldown:3",
                         "step:10:0.5:7", "constantx", NULL};
    for (int i = 0; bad[i]; i++) {
        CHECK_MSG(mg_schedule_parse(bad[i], 0.1f, &s) == MG_EINVAL, "accepted '%s'", bad[i]);
        CHECK(strstr(mg_last_error(), bad[i]) != NULL);
    }
}

/* ---- offload ---------------------------------------------------------------- */

#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *offload_dir(void)
{
    static char d[600];
    snprintf(d, sizeof d, "%s/optim-offload", mgt_tmpdir());
    CHECK(mkdir(d, 0700) == 0 || errno == EEXIST);
    return d;
}

/* Ranges with gaps, groups with their own decay, a window far smaller
 * than a range and not dividing it: the offloaded optimizer (states in a
 * file, and the parameters and gradients too when `params`, the
 * gradients scaled as they are read) steps bit for bit as the one in
 * memory, and its state reads back the same. */
static void offload_equals_memory(mg_optim_config cfg, bool params)
{
    enum { N = 5000 };
    const mg_range r[] = {{0, 1200}, {1600, 3000}, {3200, 5000}};
    float p0[N], p1[N], g[N];
    for (int i = 0; i < N; i++) p0[i] = p1[i] = 0.01f * (float)((i * 37) % 201 - 100);
    mg_optim *a, *b;
    CHECK_OK(mg_optim_create_ranges(&cfg, r, 3, &a));
    CHECK_OK(mg_optim_create_ranges(&cfg, r, 3, &b));
    const mg_optim_group gr[] = {{100, 900, 0.0f}, {2000, 3100, 0.5f}};
    CHECK_OK(mg_optim_set_groups(a, gr, 2));
    CHECK_OK(mg_optim_set_groups(b, gr, 2));
    mg_scratch *ps = NULL, *gs = NULL;
    size_t n = mg_optim_size(b);
    if (params) {
        CHECK_OK(mg_scratch_create(offload_dir(), n * sizeof(float), "parameters", &ps));
        CHECK_OK(mg_scratch_create(offload_dir(), n * sizeof(float), "gradients", &gs));
        for (int k = 0, at = 0; k < 3; at += (int)(r[k].hi - r[k].lo), k++)
            CHECK_OK(mg_scratch_write(ps, p1 + r[k].lo, (r[k].hi - r[k].lo) * sizeof(float),
                                      (uint64_t)at * sizeof(float)));
    }
    /* Stepped once in memory first: that state goes into the file. */
    for (int i = 0; i < N; i++) g[i] = 0.001f * (float)((i * 13) % 97 - 48);
    if (!params) {
        mg_optim_step(a, p0, g, cfg.lr);
        mg_optim_step(b, p1, g, cfg.lr);
    }
    CHECK_OK(mg_optim_offload(b, offload_dir(), 1000, ps, gs));
    CHECK(mg_optim_offloaded(b) == (mg_optim_num_states(b) > 0));
    CHECK(mg_optim_bytes(b) < n * sizeof(float) || mg_optim_num_states(b) == 0);
    for (int t = 0; t < 5; t++) {
        for (int i = 0; i < N; i++) g[i] = 0.001f * (float)((i * (t + 7)) % 101 - 50);
        if (gs) {   /* b reads them from the file and scales them by 0.75 */
            for (int k = 0, at = 0; k < 3; at += (int)(r[k].hi - r[k].lo), k++)
                CHECK_OK(mg_scratch_write(gs, g + r[k].lo, (r[k].hi - r[k].lo) * sizeof(float),
                                          (uint64_t)at * sizeof(float)));
            mg_optim_scale_grads(b, 0.75f);
            mg_grad_scale(g, N, 0.75f);
        }
        mg_optim_step(a, p0, g, cfg.lr * (float)(t + 1));
        CHECK_OK(mg_optim_step(b, p1, g, cfg.lr * (float)(t + 1)));
    }
    /* One range updated alone as well. */
    for (int k = 0, at = 0; gs && k < 3; at += (int)(r[k].hi - r[k].lo), k++)
        CHECK_OK(mg_scratch_write(gs, g + r[k].lo, (r[k].hi - r[k].lo) * sizeof(float),
                                  (uint64_t)at * sizeof(float)));
    mg_optim_begin_step(a, cfg.lr);
    mg_optim_begin_step(b, cfg.lr);
    CHECK_OK(mg_optim_update(a, p0, g, 1700, 2900));
    CHECK_OK(mg_optim_update(b, p1, g, 1700, 2900));
    float x[N], y[N];
    if (params)
        for (int k = 0; k < 3; k++) {
            CHECK_OK(mg_optim_read_state(b, -1, r[k].lo, r[k].hi, y));
            memcpy(p1 + r[k].lo, y, (r[k].hi - r[k].lo) * sizeof(float));
        }
    CHECK_MSG(!memcmp(p0, p1, sizeof p0), "%s%s: parameters differ with offload",
              mg_optim_kind_name(cfg.kind), params ? " (parameters offloaded)" : "");
    for (int s = 0; s < mg_optim_num_states(a); s++)
        for (int k = 0; k < 3; k++) {
            size_t len = r[k].hi - r[k].lo;
            CHECK_OK(mg_optim_read_state(a, s, r[k].lo, r[k].hi, x));
            CHECK_OK(mg_optim_read_state(b, s, r[k].lo, r[k].hi, y));
            CHECK_MSG(!memcmp(x, y, len * sizeof(float)), "%s: state %d of range %d differs",
                      mg_optim_kind_name(cfg.kind), s, k);
            /* Written in and read back. */
            for (size_t i = 0; i < len; i++) x[i] = (float)i;
            CHECK_OK(mg_optim_write_state(b, s, r[k].lo, r[k].hi, x));
            CHECK_OK(mg_optim_read_state(b, s, r[k].lo, r[k].hi, y));
            CHECK(!memcmp(x, y, len * sizeof(float)));
        }
    mg_optim_destroy(a);
    mg_optim_destroy(b);
    mg_scratch_destroy(ps);
    mg_scratch_destroy(gs);
}

TEST(optim_offload_is_bit_identical)
{
    mg_optim_config c[4] = {mg_optim_defaults(MG_OPTIM_SGD, 0.1f),
                            mg_optim_defaults(MG_OPTIM_SGD, 0.1f),
                            mg_optim_defaults(MG_OPTIM_ADAM, 1e-2f),
                            mg_optim_defaults(MG_OPTIM_ADAMW, 1e-2f)};
    c[1].momentum = 0.9f;
    c[1].nesterov = true;
    c[2].weight_decay = 0.01f;
    for (int i = 0; i < 4; i++)
        for (int params = 0; params < 2; params++) offload_equals_memory(c[i], params);
}

/* The directory: missing, a file, or too small a disk (a file-size limit
 * stands in for a full disk: the reservation fails at once) is one clear
 * error naming it; the file is private (0600) and unlinked. */
TEST(optim_offload_bad_directory)
{
    mg_optim_config cfg = mg_optim_defaults(MG_OPTIM_ADAMW, 1e-3f);
    mg_optim *o;
    CHECK_OK(mg_optim_create(&cfg, 1 << 20, &o));
    char bad[700];
    snprintf(bad, sizeof bad, "%s/no-such-dir", mgt_tmpdir());
    CHECK_EQ(mg_optim_offload(o, bad, 1 << 16, NULL, NULL), MG_EIO);
    CHECK(strstr(mg_last_error(), bad) && strstr(mg_last_error(), "create it"));
    snprintf(bad, sizeof bad, "%s/a-file", mgt_tmpdir());
    FILE *f = fopen(bad, "w");
    CHECK(f);
    if (f) fclose(f);
    CHECK_EQ(mg_optim_offload(o, bad, 1 << 16, NULL, NULL), MG_EIO);
    CHECK(strstr(mg_last_error(), "Not a directory"));
    CHECK(!mg_optim_offloaded(o));
    /* Still usable in memory after a failed offload. */
    float p[1 << 4] = {0}, g[1 << 4] = {1};
    CHECK_OK(mg_optim_update((mg_optim_begin_step(o, 1e-3f), o), p, g, 0, 16));
    mg_optim_destroy(o);

    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {1 << 20, 1 << 20};
        setrlimit(RLIMIT_FSIZE, &rl);
        mg_optim *x;
        mg_optim_create(&cfg, 1 << 20, &x);   /* 8 MiB of state */
        mg_status st = mg_optim_offload(x, offload_dir(), 1 << 16, NULL, NULL);
        _exit(st == MG_EIO && strstr(mg_last_error(), "free space") ? 0 : 1);
    }
    int ws;
    CHECK(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);

    mg_scratch *s;
    CHECK_OK(mg_scratch_create(offload_dir(), 4096, "test", &s));
    CHECK_EQ(mg_scratch_size(s), 4096);
    /* Its descriptor: an unlinked file of mode 0600. */
    int found = 0;
    for (int fd = 0; fd < 1024; fd++) {
        char link[64], target[1024];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(link, target, sizeof target - 1);
        if (k <= 0) continue;
        target[k] = 0;
        struct stat sb;
        if (!strstr(target, "multigrad-offload") || fstat(fd, &sb) != 0) continue;
        CHECK_EQ(sb.st_mode & 0777, 0600);
        CHECK_EQ(sb.st_nlink, 0);
        found++;
    }
    CHECK_EQ(found, 1);
    char buf[8] = {0};
    CHECK_EQ(mg_scratch_read(s, buf, 8, 4092), MG_EINVAL);   /* past the end */
    mg_scratch_destroy(s);
}

/* clip_grad_norm_'s cases at the edges (a probe against torch): a NaN
 * gradient makes every gradient NaN, as torch's (before, the others were
 * applied unclipped); gradients whose float32 norm overflows are clipped
 * to max_norm (the norm is a double); the ordinary case is torch's
 * coefficient max_norm / (norm + 1e-6). */
TEST(optim_clip_grad_norm_at_the_edges)
{
    float g[3] = {1, NAN, 2};
    CHECK(isnan(mg_clip_grad_norm(g, 3, 1.0f)));
    CHECK_MSG(isnan(g[0]) && isnan(g[1]) && isnan(g[2]), "%g %g %g", g[0], g[1], g[2]);
    float h[3] = {1e30f, 1e30f, 1};
    double norm = mg_clip_grad_norm(h, 3, 1.0f);
    CHECK_MSG(fabs(norm / (sqrt(2.0) * 1e30) - 1) < 1e-6, "norm %g", norm);
    double after = sqrt((double)h[0] * h[0] + (double)h[1] * h[1] + (double)h[2] * h[2]);
    CHECK_MSG(fabs(after - 1) < 1e-5, "clipped norm %g", after);
    float k[2] = {3, 4};
    CHECK_EQ(mg_clip_grad_norm(k, 2, 1.0f), 5.0);
    CHECK(k[0] == 3 * (float)(1.0 / (5 + 1e-6)) && k[1] == 4 * (float)(1.0 / (5 + 1e-6)));
    float small[2] = {0.3f, 0.4f};   /* under max_norm: unchanged */
    mg_clip_grad_norm(small, 2, 1.0f);
    CHECK(small[0] == 0.3f && small[1] == 0.4f);
}
