/* Tests of the device mesh: parsing (good specs with their exact sizes,
 * bad ones with the line that names the problem), and meshes of 3, 4, 6, 8
 * and 13 forked ranks over the builtin backend, where each rank learns
 * through its sub-groups exactly which world ranks share its tp, dp and pp
 * group, and in which order, and how messages name them. */
#include "harness.h"
#include "multigrad/plan.h"

static void parse_ok(const char *spec, int world, int tp, int dp, int pp)
{
    int s[MG_MESH_DIMS] = {-1, -1, -1};
    mg_status st = mg_mesh_parse(spec, world, s);
    CHECK_MSG(st == MG_OK, "'%s' on %d ranks: %s", spec, world, mg_last_error());
    CHECK_MSG(s[MG_MESH_TP] == tp && s[MG_MESH_DP] == dp && s[MG_MESH_PP] == pp,
              "'%s' on %d ranks: tp=%d dp=%d pp=%d, expected tp=%d dp=%d pp=%d", spec, world,
              s[MG_MESH_TP], s[MG_MESH_DP], s[MG_MESH_PP], tp, dp, pp);
}

/* Fails with MG_EINVAL, one line naming the spec and containing `what`,
 * and leaves sizes as they were. */
static void parse_bad(const char *spec, int world, const char *what)
{
    int s[MG_MESH_DIMS] = {-7, -7, -7};
    CHECK_ERR(mg_mesh_parse(spec, world, s), MG_EINVAL);
    const char *e = mg_last_error();
    char quoted[128];
    snprintf(quoted, sizeof quoted, "'%s'", spec);
    CHECK_MSG(strstr(e, quoted) && strstr(e, what) && !strchr(e, '\n'),
              "'%s' on %d ranks: message '%s' should name the spec and '%s'", spec, world, e,
              what);
    CHECK(s[0] == -7 && s[1] == -7 && s[2] == -7);
}

TEST(mesh_parse)
{
    parse_ok("dp=2", 2, 1, 2, 1);
    parse_ok("dp=2,tp=2", 4, 2, 2, 1);
    parse_ok("tp=2,dp=2", 4, 2, 2, 1);
    parse_ok("pp=2,dp=2,tp=2", 8, 2, 2, 2);
    parse_ok("dp=3,tp=2", 6, 2, 3, 1);
    parse_ok("dp=13", 13, 1, 13, 1);
    parse_ok("dp=1", 1, 1, 1, 1);
    /* A missing dp is world / (tp * pp). */
    parse_ok("tp=2", 6, 2, 3, 1);
    parse_ok("pp=2,tp=2", 8, 2, 2, 2);
    parse_ok("pp=3", 3, 1, 1, 3);
    parse_ok("tp=4", 4, 4, 1, 1);

    parse_bad("", 4, "dp=N");
    parse_bad("xp=2", 4, "unknown dimension 'xp': use dp, tp or pp");
    parse_bad("DP=2", 2, "unknown dimension 'DP'");
    parse_bad(" dp=2", 2, "unknown dimension ' dp'");
    parse_bad("dp=2,dp=2", 4, "dp is given twice");
    parse_bad("tp=1,dp=4,tp=1", 4, "tp is given twice");
    parse_bad("dp=two", 2, "'two' is not an integer");
    parse_bad("dp=2 ", 2, "not an integer");
    parse_bad("dp=", 2, "not an integer");
    parse_bad("dp=2;tp=2", 4, "not an integer");
    parse_bad("dp=0", 2, "out of range: give an integer from 1 to 2");
    parse_bad("dp=-2", 2, "out of range");
    parse_bad("tp=99999999999999999999", 2, "out of range");
    parse_bad("dp", 2, "is not NAME=SIZE");
    parse_bad("dp=2,", 2, "'' is not NAME=SIZE");
    parse_bad(",dp=2", 2, "'' is not NAME=SIZE");
    parse_bad("dp=2,tp=2", 6, "dp*tp*pp = 4 ranks but the job has 6");
    parse_bad("dp=2", 4, "dp*tp*pp = 2 ranks but the job has 4");
    parse_bad("tp=4", 6, "tp*pp = 4 does not divide the 6 ranks");
    parse_bad("tp=2,pp=2", 6, "tp*pp = 4 does not divide");
    int s[MG_MESH_DIMS];
    CHECK_ERR(mg_mesh_parse("dp=1", 0, s), MG_EINVAL);

    CHECK(!strcmp(mg_mesh_dim_name(MG_MESH_TP), "tp"));
    CHECK(!strcmp(mg_mesh_dim_name(MG_MESH_DP), "dp"));
    CHECK(!strcmp(mg_mesh_dim_name(MG_MESH_PP), "pp"));
    char buf[64];
    CHECK_OK(mg_mesh_parse("tp=2,pp=3", 12, s));
    mg_mesh_format(s, buf, sizeof buf);
    CHECK(!strcmp(buf, "dp=2,pp=3,tp=2"));
}

/* ---- meshes of forked ranks ------------------------------------------------ */

typedef struct {
    int port;
    const char *spec;
    int tp, dp, pp;   /* the sizes the spec means */
} job;

/* World rank q's name in messages: "rank q", with its coordinates along
 * the dimensions of more than one rank, outermost first, when there are
 * two such dimensions or more ("rank 5 (pp 1, dp 0, tp 1)"). */
static void name_of(const job *j, const int c[MG_MESH_DIMS], int q, char *buf, size_t cap)
{
    const int size[MG_MESH_DIMS] = {j->tp, j->dp, j->pp};
    int n = snprintf(buf, cap, "rank %d", q), dims = (j->tp > 1) + (j->dp > 1) + (j->pp > 1);
    for (int d = MG_MESH_DIMS - 1, first = 1; d >= 0 && dims > 1; d--)
        if (size[d] > 1) {
            n += snprintf(buf + n, cap - (size_t)n, "%s%s %d", first ? " (" : ", ",
                          mg_mesh_dim_name(d), c[d]);
            first = 0;
        }
    if (dims > 1) snprintf(buf + n, cap - (size_t)n, ")");
}

/* World rank q's coordinates, by search over the grid (not by the
 * library's arithmetic): q = tp_i + tp * (dp_i + dp * pp_i). */
static void coords_of(const job *j, int q, int c[MG_MESH_DIMS])
{
    for (int p = 0; p < j->pp; p++)
        for (int d = 0; d < j->dp; d++)
            for (int t = 0; t < j->tp; t++)
                if (t + j->tp * (d + j->dp * p) == q) {
                    c[MG_MESH_TP] = t;
                    c[MG_MESH_DP] = d;
                    c[MG_MESH_PP] = p;
                    return;
                }
    MG_ASSERT(!"rank on the grid");
}

static int mesh_rank(int rank, int n, void *arg)
{
    const job *j = arg;
    mg_group *g = mgt_join(rank, n, j->port, NULL, 30);
    if (!g) return 2;
    mg_mesh *m;
    CHECK_OK(mg_mesh_create(g, j->spec, &m));
    const int want_size[MG_MESH_DIMS] = {j->tp, j->dp, j->pp};
    int me[MG_MESH_DIMS];
    coords_of(j, rank, me);
    char buf[64], want[64];
    mg_mesh_describe(m, buf, sizeof buf);
    snprintf(want, sizeof want, "dp=%d,pp=%d,tp=%d", j->dp, j->pp, j->tp);
    CHECK_MSG(!strcmp(buf, want), "describe: %s, expected %s", buf, want);
    for (int d = 0; d < MG_MESH_DIMS; d++) {
        mg_group *sub = mg_mesh_group(m, d);
        CHECK(sub && sub != g);
        CHECK_EQ(mg_mesh_size(m, d), want_size[d]);
        CHECK_EQ(mg_group_size(sub), want_size[d]);
        CHECK_EQ(mg_mesh_coord(m, d), me[d]);
        CHECK_EQ(mg_group_rank(sub), me[d]);
        /* Each member writes its world rank at its sub-group rank: the sum
         * lists the members in order. */
        int32_t members[16] = {0};
        members[mg_group_rank(sub)] = rank;
        CHECK_OK(mg_all_reduce(sub, MG_IN_PLACE, members, want_size[d], MG_I32, MG_SUM));
        int k = 0;
        for (int q = 0; q < n; q++) {
            int c[MG_MESH_DIMS];
            coords_of(j, q, c);
            bool shares = true;
            for (int e = 0; e < MG_MESH_DIMS; e++) shares &= e == d || c[e] == me[e];
            if (!shares) continue;
            CHECK_MSG(k < want_size[d] && members[k] == q && c[d] == k,
                      "rank %d, %s group: member %d is world rank %d, expected %d", rank,
                      mg_mesh_dim_name(d), k, members[k], q);
            /* Messages name it by its world rank (and coordinates). */
            char name[128], want[128];
            name_of(j, c, q, want, sizeof want);
            CHECK_EQ(mg_group_world_rank(sub, k), q);
            mg_group_rank_name(sub, k, name, sizeof name);
            CHECK_MSG(!strcmp(name, want), "rank %d, %s group: member %d is '%s', expected '%s'",
                      rank, mg_mesh_dim_name(d), k, name, want);
            k++;
        }
        CHECK_EQ(k, want_size[d]);
    }
    mg_mesh_destroy(m);
    mg_mesh_destroy(NULL);
    /* The world group works on. */
    int32_t v = 1;
    CHECK_OK(mg_all_reduce(g, MG_IN_PLACE, &v, 1, MG_I32, MG_SUM));
    CHECK_EQ(v, n);
    mg_group_destroy(g);
    return 0;
}

static void run_mesh(int n, const char *spec, int tp, int dp, int pp)
{
    job j = {.port = mgt_free_port(), .spec = spec, .tp = tp, .dp = dp, .pp = pp};
    int bad = mgt_fork_ranks(n, mesh_rank, &j, 60, NULL);
    CHECK_MSG(bad == 0, "%d of %d ranks failed with mesh %s", bad, n, spec);
}

TEST_T(mesh_4_ranks_dp2_tp2, 90) { run_mesh(4, "dp=2,tp=2", 2, 2, 1); }
TEST_T(mesh_8_ranks_dp2_pp2_tp2, 90) { run_mesh(8, "pp=2,dp=2,tp=2", 2, 2, 2); }
TEST_T(mesh_6_ranks_dp3_tp2, 90) { run_mesh(6, "tp=2,dp=3", 2, 3, 1); }
TEST_T(mesh_13_ranks_dp13, 120) { run_mesh(13, "dp=13", 1, 13, 1); }
TEST_T(mesh_3_ranks, 90)
{
    run_mesh(3, "dp=3", 1, 3, 1);
    run_mesh(3, "pp=3", 1, 1, 3);
}

/* Ranks that give a bad or a different mesh: every rank fails at once
 * (the bad one with its own line, the others naming the disagreement);
 * none waits for the timeout. */
typedef struct {
    int port;
    const char *spec[4];
    mg_status want[4];
    const char *what[4];
} bad_job;

static int mismatch_rank(int rank, int n, void *arg)
{
    const bad_job *j = arg;
    mg_group *g = mgt_join(rank, n, j->port, NULL, 30);
    if (!g) return 2;
    mg_mesh *m = (mg_mesh *)&m;
    double t0 = mg_now();
    CHECK_ERR(mg_mesh_create(g, j->spec[rank], &m), j->want[rank]);
    CHECK(m == NULL);
    CHECK_MSG(strstr(mg_last_error(), j->what[rank]), "rank %d: '%s' should say '%s'", rank,
              mg_last_error(), j->what[rank]);
    CHECK_MSG(mg_now() - t0 < 10, "took %.1f s", mg_now() - t0);
    mg_group_destroy(g);
    return 0;
}

TEST_T(mesh_ranks_disagree, 90)
{
    bad_job a = {.port = mgt_free_port(),
                 .spec = {"dp=2,tp=2", "dp=2,tp=2", "dp=2,tp=x", "tp=2"},
                 .want = {MG_EMISMATCH, MG_EMISMATCH, MG_EINVAL, MG_EMISMATCH},
                 .what = {"another rank's mesh is invalid", "another rank's mesh is invalid",
                          "'x' is not an integer", "another rank's mesh is invalid"}};
    CHECK_EQ(mgt_fork_ranks(4, mismatch_rank, &a, 60, NULL), 0);
    bad_job b = {.port = mgt_free_port(),
                 .spec = {"dp=4", "dp=2,tp=2", "dp=2,tp=2", "dp=2,tp=2"},
                 .want = {MG_EMISMATCH, MG_EMISMATCH, MG_EMISMATCH, MG_EMISMATCH},
                 .what = {"tp from 1 to 2", "tp from 1 to 2", "tp from 1 to 2",
                          "tp from 1 to 2"}};
    CHECK_EQ(mgt_fork_ranks(4, mismatch_rank, &b, 60, NULL), 0);
}
