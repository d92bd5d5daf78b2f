/* Philox-4x32-10 counter-based generator (Salmon et al., SC'11). The output
 * is a pure function of (seed, counter): reproducible across runs and ranks. */
#include <math.h>
#include "multigrad/core.h"
#include "core/elem.h"

void mg_rng_init(mg_rng *r, uint64_t seed)
{
    r->seed = seed;
    r->counter = 0;
    r->avail = 0;
}

uint32_t mg_rng_u32(mg_rng *r)
{
    if (r->avail == 0) {
        mg__philox(r->seed, r->counter++, r->buf);
        r->avail = 4;
    }
    return r->buf[4 - r->avail--];
}

float mg_rng_uniform(mg_rng *r)
{
    return (float)(mg_rng_u32(r) >> 8) * (1.0f / 16777216.0f);
}

float mg_rng_normal(mg_rng *r)
{
    /* u1 in (0, 1] so log() is finite. */
    double u1 = ((double)(mg_rng_u32(r) >> 8) + 1.0) / 16777216.0;
    double u2 = (double)(mg_rng_u32(r) >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

float mg_rng_uniform_at(uint64_t seed, uint64_t i)
{
    uint32_t w[4];
    mg__philox(seed, i / 4, w);
    return (float)(w[i % 4] >> 8) * (1.0f / 16777216.0f);
}

float mg_rng_normal_at(uint64_t seed, uint64_t i)
{
    uint32_t w[4];
    mg__philox(seed, i / 2, w);
    const uint32_t *h = w + 2 * (i % 2);
    double u1 = ((double)(h[0] >> 8) + 1.0) / 16777216.0;
    double u2 = (double)(h[1] >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/* FNV-1a of the name, then splitmix64's finaliser over it and the seed. */
uint64_t mg_rng_seed_for(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = (h ^ *c) * 0x100000001b3ull;
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (h | 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint32_t mg_rng_below(mg_rng *r, uint32_t n)
{
    /* Lemire's multiply-shift with rejection: unbiased. */
    uint64_t m = (uint64_t)mg_rng_u32(r) * n;
    uint32_t lo = (uint32_t)m;
    if (lo < n) {
        uint32_t t = -n % n;
        while (lo < t) {
            m = (uint64_t)mg_rng_u32(r) * n;
            lo = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

void mg_permutation(uint64_t seed, int32_t *perm, int n)
{
    mg_rng r;
    mg_rng_init(&r, seed);
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)mg_rng_below(&r, (uint32_t)i + 1);
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
}
