/* multigrad — which samples each rank takes: the distributed sampler of
 * training (torch's DistributedSampler) and the shards of evaluation. */
#ifndef MULTIGRAD_SAMPLER_H
#define MULTIGRAD_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- distributed sampler ----------------------------------------------
 *
 * As torch.utils.data.DistributedSampler. Epoch e shuffles the whole data
 * set with mg_permutation(seed + e) — the same order on every rank — and
 * rank r takes perm[r::world] (models.md "Batch order"): with a global
 * batch B and local batch B/world, the union of the ranks' k-th local
 * batches is exactly the single-process k-th batch.
 *
 * Every rank gets the same number of indices: without drop_last the order
 * is padded by wrapping around to ceil(n / world) * world entries (a few
 * samples are seen twice per epoch, as in torch); with drop_last it is cut
 * to floor(n / world) * world. Without shuffle the order is 0..n-1. */
typedef struct mg_sampler {
    int n_samples;      /* size of the data set */
    int rank, world;
    bool shuffle, drop_last;
    uint64_t seed;
    int64_t epoch;
    int block;          /* 0: perm[r::world]; else blocks of the order (mg_sampler_init_blocks) */
    int num_samples;    /* indices per rank and epoch */
    int64_t total_size; /* num_samples * world */
    int32_t *perm;      /* scratch: the epoch's order, n_samples entries */
    int32_t *indices;   /* this rank's indices, num_samples entries */
} mg_sampler;

/* Sets up the sampler at epoch 0. MG_EINVAL for n_samples < 0, world < 1
 * or rank outside [0, world); MG_ENOMEM if the index lists cannot be
 * allocated. */
mg_status mg_sampler_init(mg_sampler *s, int n_samples, int rank, int world,
                          bool shuffle, uint64_t seed, bool drop_last);
/* The order cut into global batches of `block` samples (the last padded
 * by wrapping around to the start, so every one is whole), rank r taking
 * the r-th contiguous share of block / world of each: a global batch's
 * samples fall into the same places of it whatever the world size
 * (--deterministic's virtual shards). MG_EINVAL unless world divides
 * block. */
mg_status mg_sampler_init_blocks(mg_sampler *s, int n_samples, int rank, int world, int block,
                                 bool shuffle, uint64_t seed);
void mg_sampler_free(mg_sampler *s);
/* Selects the epoch (call it before each epoch, as in torch, or every
 * epoch reuses the same order). */
void mg_sampler_set_epoch(mg_sampler *s, int64_t epoch);
/* This rank's indices for the current epoch; *n (when not NULL) gets
 * their number. Valid until the next set_epoch or free. */
const int32_t *mg_sampler_indices(const mg_sampler *s, int *n);

/* Sharded evaluation: rank r evaluates [*begin, *end) of n samples. The
 * shards are contiguous, disjoint and cover 0..n-1 without padding (sizes
 * differ by at most one, some may be empty), so correct/total counts summed
 * over ranks are exact. MG_ASSERTs 0 <= rank < world and n >= 0. */
void mg_shard_range(int n, int rank, int world, int *begin, int *end);
/* The same in whole blocks of `block` samples (the last may be shorter),
 * dealt out as mg_shard_range deals samples: each share begins at a
 * multiple of block, so evaluating it in batches of block gives the same
 * batches at any world size (--deterministic's figures). block >= 1. */
void mg_shard_blocks(int n, int block, int rank, int world, int *begin, int *end);

#ifdef __cplusplus
}
#endif
#endif
