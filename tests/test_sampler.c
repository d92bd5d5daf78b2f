/* Tests of the distributed sampler and evaluation shards: shards disjoint
 * and covering, padding and drop_last as torch, per-epoch shuffles, and
 * the models.md property that the ranks' k-th local batches together are
 * the single-process k-th batch. */
#include "harness.h"
#include "multigrad/sampler.h"

/* Counts how often each sample appears over all ranks' lists. */
static void count_epoch(int n, int world, bool shuffle, uint64_t seed, bool drop_last,
                        int64_t epoch, int *count, int *per_rank)
{
    memset(count, 0, (size_t)n * sizeof *count);
    for (int r = 0; r < world; r++) {
        mg_sampler s;
        CHECK_OK(mg_sampler_init(&s, n, r, world, shuffle, seed, drop_last));
        mg_sampler_set_epoch(&s, epoch);
        int m;
        const int32_t *idx = mg_sampler_indices(&s, &m);
        if (r == 0) *per_rank = m;
        CHECK_EQ(m, *per_rank);
        for (int i = 0; i < m; i++) {
            CHECK(idx[i] >= 0 && idx[i] < n);
            count[idx[i]]++;
        }
        mg_sampler_free(&s);
    }
}

TEST(sampler_shards_disjoint_and_covering)
{
    int sizes[] = {0, 1, 2, 5, 12, 13, 97, 1000};
    int worlds[] = {1, 2, 3, 4, 8, 13};
    int count[1000];
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof worlds / sizeof *worlds; b++) {
            int n = sizes[a], w = worlds[b], m = 0;
            /* Divisible sizes: a partition, with or without drop_last. */
            for (int dl = 0; dl < 2; dl++) {
                count_epoch(n, w, true, 7, dl, 3, count, &m);
                int dups = 0, missing = 0;
                for (int i = 0; i < n; i++) {
                    dups += count[i] > 1 ? count[i] - 1 : 0;
                    missing += count[i] == 0;
                }
                if (dl) {
                    /* Truncated to a multiple of world: disjoint, only
                     * the remainder left out. */
                    CHECK_EQ(m, n / w);
                    CHECK_EQ(dups, 0);
                    CHECK_EQ(missing, n % w);
                } else {
                    /* Padded to equal length: covers everything; the only
                     * duplicates are the padding. */
                    CHECK_EQ(m, (n + w - 1) / w);
                    CHECK_EQ(missing, 0);
                    CHECK_EQ(dups, m * w - n);
                }
            }
        }
}

TEST(sampler_padding_wraps_as_torch)
{
    /* torch: indices += indices[:padding]; with padding longer than the
     * data set, the order repeats. Unshuffled, n = 10, world 4:
     * 0..9,0,1 -> rank 1 takes 1,5,9. n = 2, world 5: 0,1,0,1,0. */
    mg_sampler s;
    int m;
    CHECK_OK(mg_sampler_init(&s, 10, 1, 4, false, 0, false));
    const int32_t *idx = mg_sampler_indices(&s, &m);
    CHECK_EQ(m, 3);
    CHECK_EQ(s.total_size, 12);
    CHECK(idx[0] == 1 && idx[1] == 5 && idx[2] == 9);
    mg_sampler_free(&s);
    CHECK_OK(mg_sampler_init(&s, 10, 3, 4, false, 0, false));
    idx = mg_sampler_indices(&s, &m);
    CHECK(m == 3 && idx[0] == 3 && idx[1] == 7 && idx[2] == 1);
    mg_sampler_free(&s);
    CHECK_OK(mg_sampler_init(&s, 10, 3, 4, false, 0, true));
    idx = mg_sampler_indices(&s, &m);
    CHECK(m == 2 && idx[0] == 3 && idx[1] == 7);
    mg_sampler_free(&s);
    int expect[5] = {0, 1, 0, 1, 0};
    for (int r = 0; r < 5; r++) {
        CHECK_OK(mg_sampler_init(&s, 2, r, 5, false, 0, false));
        idx = mg_sampler_indices(&s, &m);
        CHECK(m == 1 && idx[0] == expect[r]);
        mg_sampler_free(&s);
    }
}

TEST(sampler_epoch_and_seed)
{
    int n = 1000, w = 3;
    mg_sampler a, b, c;
    CHECK_OK(mg_sampler_init(&a, n, 1, w, true, 42, false));
    CHECK_OK(mg_sampler_init(&b, n, 1, w, true, 42, false));
    CHECK_OK(mg_sampler_init(&c, n, 1, w, true, 43, false));
    int m;
    const int32_t *ia = mg_sampler_indices(&a, &m), *ib = mg_sampler_indices(&b, NULL);
    /* Same seed and epoch: the same list (every rank draws the same
     * permutation, so the shards agree). */
    CHECK(memcmp(ia, ib, (size_t)m * sizeof *ia) == 0);
    /* It is mg_permutation(seed + epoch) strided. */
    int32_t perm[1000];
    mg_sampler_set_epoch(&a, 5);
    mg_sampler_set_epoch(&b, 5);
    mg_permutation(42 + 5, perm, n);
    for (int i = 0; i < m; i++) {
        CHECK_EQ(ia[i], perm[(1 + i * w) % n]);
        CHECK_EQ(ib[i], ia[i]);
    }
    /* Another epoch or another seed: another order. */
    int32_t e5[334];
    memcpy(e5, ia, (size_t)m * sizeof *ia);
    mg_sampler_set_epoch(&a, 6);
    mg_sampler_set_epoch(&c, 5);
    int same_epoch = 0, same_seed = 0;
    const int32_t *ic = mg_sampler_indices(&c, NULL);
    for (int i = 0; i < m; i++) {
        same_epoch += ia[i] == e5[i];
        same_seed += ic[i] == e5[i];
    }
    CHECK(same_epoch < 10);
    CHECK(same_seed < 10);
    /* Going back to an epoch reproduces it (resuming from a checkpoint). */
    mg_sampler_set_epoch(&a, 5);
    CHECK(memcmp(ia, e5, (size_t)m * sizeof *ia) == 0);
    /* No shuffle: the identity order strided, whatever the epoch. */
    mg_sampler_free(&c);
    CHECK_OK(mg_sampler_init(&c, n, 2, w, false, 42, false));
    mg_sampler_set_epoch(&c, 9);
    ic = mg_sampler_indices(&c, NULL);
    for (int i = 0; i < m; i++) CHECK_EQ(ic[i], (2 + i * w) % n);
    mg_sampler_free(&a);
    mg_sampler_free(&b);
    mg_sampler_free(&c);
}

/* models.md: global batch B over W ranks, local batch B/W; the union of
 * the ranks' k-th local batches is the single-process k-th batch, the last
 * short one included (60000 = 234*256 + 96). */
TEST(sampler_union_of_kth_batches)
{
    enum { N = 60000, B = 256 };
    static int32_t perm[N], seen[N];
    int worlds[] = {2, 4, 8};
    for (size_t t = 0; t < sizeof worlds / sizeof *worlds; t++) {
        int w = worlds[t], lb = B / w;
        mg_sampler s[8];
        const int32_t *idx[8];
        for (int r = 0; r < w; r++) {
            CHECK_OK(mg_sampler_init(&s[r], N, r, w, true, 1234, false));
            mg_sampler_set_epoch(&s[r], 2);
            int m;
            idx[r] = mg_sampler_indices(&s[r], &m);
            CHECK_EQ(m, N / w);
        }
        mg_permutation(1234 + 2, perm, N);
        int steps = (N + B - 1) / B;
        CHECK_EQ(steps, 235);
        memset(seen, 0, sizeof seen);
        for (int k = 0; k < steps; k++) {
            int lo = k * B, hi = lo + B < N ? lo + B : N, got = 0;
            for (int r = 0; r < w; r++) {
                int llo = k * lb, lhi = llo + lb < N / w ? llo + lb : N / w;
                for (int i = llo; i < lhi; i++) {
                    seen[idx[r][i]] = k + 1;
                    got++;
                }
            }
            CHECK_EQ(got, hi - lo);
            for (int i = lo; i < hi; i++) CHECK_EQ(seen[perm[i]], k + 1);
        }
        for (int r = 0; r < w; r++) mg_sampler_free(&s[r]);
    }
}

TEST(sampler_bad_arguments)
{
    mg_sampler s;
    CHECK_ERR(mg_sampler_init(&s, 10, 2, 2, true, 0, false), MG_EINVAL);
    CHECK(strstr(mg_last_error(), "rank 2") != NULL);
    CHECK_ERR(mg_sampler_init(&s, 10, -1, 2, true, 0, false), MG_EINVAL);
    CHECK_ERR(mg_sampler_init(&s, 10, 0, 0, true, 0, false), MG_EINVAL);
    CHECK_ERR(mg_sampler_init(&s, -1, 0, 1, true, 0, false), MG_EINVAL);
    /* An empty data set is valid and yields nothing. */
    CHECK_OK(mg_sampler_init(&s, 0, 1, 3, true, 0, false));
    int m = -1;
    mg_sampler_indices(&s, &m);
    CHECK_EQ(m, 0);
    mg_sampler_set_epoch(&s, 1);
    mg_sampler_free(&s);
    mg_sampler_free(&s);  /* idempotent */
}

TEST(sampler_eval_shards_exact)
{
    int sizes[] = {0, 1, 7, 10000, 10001};
    int worlds[] = {1, 2, 3, 4, 13};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof worlds / sizeof *worlds; b++) {
            int n = sizes[a], w = worlds[b], next = 0, lo, hi, min = n, max = 0;
            for (int r = 0; r < w; r++) {
                mg_shard_range(n, r, w, &lo, &hi);
                /* Contiguous and in rank order: they tile 0..n-1. */
                CHECK_EQ(lo, next);
                CHECK(hi >= lo);
                next = hi;
                min = hi - lo < min ? hi - lo : min;
                max = hi - lo > max ? hi - lo : max;
            }
            CHECK_EQ(next, n);
            CHECK(max - min <= 1);
        }
}

/* Evaluation shares in whole blocks (--deterministic): they tile 0..n-1
 * in rank order, each begins at a multiple of the block, and their
 * block counts differ by at most one, so every rank evaluates one
 * process's batches. */
TEST(sampler_eval_shards_in_whole_blocks)
{
    int sizes[] = {0, 1, 13, 10000, 10001};
    int blocks[] = {1, 2, 16};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t k = 0; k < sizeof blocks / sizeof *blocks; k++)
            for (int w = 1; w <= 8; w++) {
                int n = sizes[a], bl = blocks[k], next = 0, lo, hi, min = n, max = 0;
                for (int r = 0; r < w; r++) {
                    mg_shard_blocks(n, bl, r, w, &lo, &hi);
                    CHECK_EQ(lo, next);
                    CHECK(hi >= lo && (lo % bl == 0 || lo == n));   /* or empty, at the end */
                    int nb = (hi - lo + bl - 1) / bl;
                    min = nb < min ? nb : min;
                    max = nb > max ? nb : max;
                    next = hi;
                }
                CHECK_EQ(next, n);
                CHECK(max - min <= 1);
            }
}

/* Blocks (--deterministic): each global batch of `block` samples of the
 * epoch's order falls into the same places whatever the world size: rank
 * r's i-th sample of batch k is the order's (k block + r block/W + i)-th,
 * the last batch wrapped round to the start; W ranks' lists laid side by
 * side per batch are one rank's list. A world that does not divide the
 * block is refused. */
TEST(sampler_blocks_keep_each_global_batch_in_place)
{
    int n = 103, block = 16;
    mg_sampler one;
    CHECK_OK(mg_sampler_init_blocks(&one, n, 0, 1, block, true, 5));
    mg_sampler_set_epoch(&one, 2);
    int m1;
    const int32_t *all = mg_sampler_indices(&one, &m1);
    CHECK_EQ(m1, 7 * block);   /* ceil(103 / 16) whole batches */
    for (int w = 2; w <= 16; w *= 2) {
        int per = block / w;
        for (int r = 0; r < w; r++) {
            mg_sampler s;
            CHECK_OK(mg_sampler_init_blocks(&s, n, r, w, block, true, 5));
            mg_sampler_set_epoch(&s, 2);
            int m;
            const int32_t *idx = mg_sampler_indices(&s, &m);
            CHECK_EQ(m, 7 * per);
            for (int i = 0; i < m; i++)
                CHECK_MSG(idx[i] == all[(i / per) * block + r * per + i % per],
                          "world %d, rank %d, index %d", w, r, i);
            mg_sampler_free(&s);
        }
    }
    mg_sampler_free(&one);
    mg_sampler s;
    CHECK_ERR(mg_sampler_init_blocks(&s, n, 0, 3, block, true, 5), MG_EINVAL);
}
