/* The distributed sampler (torch.utils.data.DistributedSampler) and the
 * shard ranges of sharded evaluation.
 *
 * Rank r's list is order[(r + i*world) mod n] for i < num_samples, where
 * order is the epoch's permutation: the mod wraps the padding around to
 * the start of the order exactly as torch does (repeating the order when
 * the padding is longer than the data set), and drop_last simply makes
 * num_samples * world <= n so no index wraps. In blocks, rank r's list is
 * the r-th share of each global batch of the order, wrapped the same way. Limits: n fits an int; the
 * permutation is regenerated per epoch in O(n) (60,000 samples: well
 * under a millisecond), done by every rank so no communication is needed. */
#include "multigrad/sampler.h"

static void sampler_fill(mg_sampler *s)
{
    if (s->n_samples == 0) return;
    if (s->shuffle)
        mg_permutation(s->seed + (uint64_t)s->epoch, s->perm, s->n_samples);
    else
        for (int i = 0; i < s->n_samples; i++) s->perm[i] = i;
    int per = s->block / s->world;
    for (int i = 0; i < s->num_samples; i++) {
        int64_t j = s->block ? (int64_t)(i / per) * s->block + (int64_t)s->rank * per + i % per
                             : (int64_t)s->rank + (int64_t)i * s->world;
        s->indices[i] = s->perm[j % s->n_samples];
    }
}

mg_status mg_sampler_init(mg_sampler *s, int n_samples, int rank, int world,
                          bool shuffle, uint64_t seed, bool drop_last)
{
    *s = (mg_sampler){0};
    if (n_samples < 0 || world < 1 || rank < 0 || rank >= world)
        return mg_error(MG_EINVAL,
                        "sampler: bad arguments (n_samples %d, rank %d, world %d): "
                        "need n_samples >= 0 and 0 <= rank < world",
                        n_samples, rank, world);
    int64_t per_rank = drop_last ? n_samples / world
                                 : ((int64_t)n_samples + world - 1) / world;
    s->n_samples = n_samples;
    s->rank = rank;
    s->world = world;
    s->shuffle = shuffle;
    s->drop_last = drop_last;
    s->seed = seed;
    s->num_samples = (int)per_rank;
    s->total_size = per_rank * world;
    s->perm = mg_alloc((size_t)n_samples * sizeof *s->perm);
    s->indices = mg_alloc((size_t)s->num_samples * sizeof *s->indices);
    if (!s->perm || !s->indices) {
        mg_sampler_free(s);
        return mg_error(MG_ENOMEM, "sampler: cannot allocate the index lists "
                        "for %d samples", n_samples);
    }
    sampler_fill(s);
    return MG_OK;
}

mg_status mg_sampler_init_blocks(mg_sampler *s, int n_samples, int rank, int world, int block,
                                 bool shuffle, uint64_t seed)
{
    if (world < 1 || block < world || block % world)
        return mg_error(MG_EINVAL, "sampler: %d ranks do not share global batches of %d "
                        "samples evenly", world, block);
    MG_TRY(mg_sampler_init(s, n_samples, rank, world, shuffle, seed, false));
    int64_t batches = ((int64_t)n_samples + block - 1) / block;
    s->block = block;
    s->num_samples = (int)(batches * (block / world));
    s->total_size = batches * block;
    mg_free(s->indices);
    s->indices = mg_alloc((size_t)(s->num_samples ? s->num_samples : 1) * sizeof *s->indices);
    if (!s->indices) {
        mg_sampler_free(s);
        return mg_error(MG_ENOMEM, "sampler: cannot allocate the index lists for %d samples",
                        n_samples);
    }
    sampler_fill(s);
    return MG_OK;
}

void mg_sampler_free(mg_sampler *s)
{
    if (!s) return;
    mg_free(s->perm);
    mg_free(s->indices);
    s->perm = s->indices = NULL;
}

void mg_sampler_set_epoch(mg_sampler *s, int64_t epoch)
{
    MG_ASSERT(s->indices != NULL);
    s->epoch = epoch;
    sampler_fill(s);
}

const int32_t *mg_sampler_indices(const mg_sampler *s, int *n)
{
    MG_ASSERT(s->indices != NULL);
    if (n) *n = s->num_samples;
    return s->indices;
}

void mg_shard_range(int n, int rank, int world, int *begin, int *end)
{
    MG_ASSERT(n >= 0 && world >= 1 && rank >= 0 && rank < world);
    /* The first n % world shards take one extra sample. */
    int base = n / world, extra = n % world;
    *begin = rank * base + (rank < extra ? rank : extra);
    *end = *begin + base + (rank < extra ? 1 : 0);
}

void mg_shard_blocks(int n, int block, int rank, int world, int *begin, int *end)
{
    MG_ASSERT(block >= 1);
    int b, e;
    mg_shard_range((int)(((long)n + block - 1) / block), rank, world, &b, &e);
    *begin = (int)((long)b * block < n ? (long)b * block : n);
    *end = (int)((long)e * block < n ? (long)e * block : n);
}
