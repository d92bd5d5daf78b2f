/* multigrad — core services: aligned memory, arenas, seeded randomness,
 * environment tunables, logging, clocks. Used by every other module. */
#ifndef MULTIGRAD_CORE_H
#define MULTIGRAD_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_ALIGN 64

/* 64-byte aligned allocation; NULL on failure (size 0 gives a valid pointer).
 * mg_alloc_zero also zeroes. Free with mg_free (accepts NULL). */
void *mg_alloc(size_t bytes);
void *mg_alloc_zero(size_t bytes);
void mg_free(void *p);

/* A bump arena: many aligned allocations, freed together. Used for
 * activations and workspaces sized once per batch shape, so the training
 * step allocates nothing. */
typedef struct mg_arena {
    char *base;
    size_t cap, used, peak;
} mg_arena;
mg_status mg_arena_init(mg_arena *a, size_t cap);
void mg_arena_free(mg_arena *a);
/* Aligned to MG_ALIGN; NULL if the arena is full (caller grows and retries). */
void *mg_arena_push(mg_arena *a, size_t bytes);
void mg_arena_reset(mg_arena *a);

/* Counter-based generator (Philox-4x32-10): the stream is a pure function
 * of (seed, counter), so runs are reproducible and a stream can be split
 * by giving each user its own seed. */
typedef struct mg_rng {
    uint64_t seed;
    uint64_t counter;   /* number of 128-bit blocks consumed */
    uint32_t buf[4];
    int avail;          /* unused words left in buf */
} mg_rng;
void mg_rng_init(mg_rng *r, uint64_t seed);
uint32_t mg_rng_u32(mg_rng *r);
uint64_t mg_rng_u64(mg_rng *r);
float mg_rng_uniform(mg_rng *r);          /* [0, 1) */
float mg_rng_normal(mg_rng *r);           /* N(0, 1), Box-Muller */
uint32_t mg_rng_below(mg_rng *r, uint32_t n); /* uniform in [0, n), unbiased */
/* Fisher-Yates permutation of 0..n-1 seeded by seed. */
void mg_permutation(uint64_t seed, int32_t *perm, int n);

/* Environment tunables, read through one helper so they can be logged. */
long mg_env_long(const char *name, long dflt);
double mg_env_double(const char *name, double dflt);
const char *mg_env_str(const char *name, const char *dflt);

/* CPUs the local ranks of this job share: MG_LOCAL_CPUS when a launcher
 * that binds its workers to CPUs of their own sets it (mgrun does), else
 * the CPUs in this process's affinity mask. Waits spin only when the local
 * ranks do not outnumber them. */
int mg_local_cpus(void);

/* Logging to stderr; MG_VERBOSE=1 enables mg_debug. */
void mg_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void mg_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool mg_verbose(void);

/* Monotonic clock in seconds. */
double mg_now(void);

/* Write a file atomically (temporary file in the same directory, fsync,
 * rename, fsync of the directory): a crash leaves either the old file or
 * the new one, never half of one, and a failure leaves no temporary file.
 * The _v form writes the n pieces one after another. Mode 0644. */
typedef struct mg_piece { const void *data; size_t len; } mg_piece;
mg_status mg_write_file_atomic(const char *path, const void *data, size_t len);
mg_status mg_write_file_atomic_v(const char *path, const mg_piece *pieces, int n);

/* Peak resident set size of this process in bytes (from getrusage). */
size_t mg_peak_rss(void);

#ifdef __cplusplus
}
#endif
#endif
