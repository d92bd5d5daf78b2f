/* multigrad — core services: aligned memory, arenas, seeded randomness,
 * environment tunables, logging, clocks. Used by every other module. */
#ifndef MULTIGRAD_CORE_H
#define MULTIGRAD_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_ALIGN 64
/* Floats in one SIMD register's worth of aligned memory (AVX-512). */
#define MG_SIMD_FLOATS (MG_ALIGN / 4)

/* 64-byte aligned allocation; NULL on failure (size 0 gives a valid pointer).
 * mg_alloc_zero also zeroes. Free with mg_free (accepts NULL). */
void *mg_alloc(size_t bytes);
void *mg_alloc_zero(size_t bytes);
void mg_free(void *p);
/* Zeroed memory in a mapping of its own (page-aligned; NULL on failure):
 * a page becomes resident when first written, so an arena of which a
 * process uses only a part (a ZeRO shard) costs only that part. Free with
 * mg_unmap and the same size. */
void *mg_map_zero(size_t bytes);
void mg_unmap(void *p, size_t bytes);
/* No huge pages for the whole pages of [p, p + bytes) of memory from
 * mg_map_zero (a part never written: a huge page faulted in by its
 * neighbour would make up to 2 MiB of it resident). */
void mg_mem_no_huge(void *p, size_t bytes);
/* Zero [p, p + bytes) of memory from mg_map_zero, giving its whole pages
 * back to the system (they read as zeros and become resident again when
 * written); the partial pages at the edges are cleared in place. */
void mg_mem_discard(void *p, size_t bytes);

/* Element types of buffers (communication) and files (safetensors). */
typedef enum { MG_F32, MG_F64, MG_F16, MG_BF16, MG_I32, MG_I64, MG_U8,
               MG_DTYPE_COUNT } mg_dtype;
/* Bytes per element (0 out of range) and the name, "f32" ("?"). */
size_t mg_dtype_size(mg_dtype t);
const char *mg_dtype_name(mg_dtype t);
/* One f16 or bf16 value to f32 and back, rounding to nearest even (as
 * PyTorch; NaN stays NaN, f16 overflows to infinity). Buffers:
 * mg_convert_from_f32 / mg_convert_to_f32 (comm.h). */
float mg_f16_to_f32(uint16_t h);
uint16_t mg_f32_to_f16(float f);
float mg_bf16_to_f32(uint16_t h);
uint16_t mg_f32_to_bf16(float f);

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
float mg_rng_uniform(mg_rng *r);          /* [0, 1) */
float mg_rng_normal(mg_rng *r);           /* N(0, 1), Box-Muller */
uint32_t mg_rng_below(mg_rng *r, uint32_t n); /* uniform in [0, n), unbiased */
/* Value i of a stream of its own, drawn by counter (no state): U[0, 1)
 * and N(0, 1). Any slice of a stream is drawn alone, equal to its part of
 * the whole. */
float mg_rng_uniform_at(uint64_t seed, uint64_t i);
float mg_rng_normal_at(uint64_t seed, uint64_t i);
/* A seed of its own for each name (a parameter's), from a job's seed. */
uint64_t mg_rng_seed_for(uint64_t seed, const char *name);
/* Fisher-Yates permutation of 0..n-1 seeded by seed. */
void mg_permutation(uint64_t seed, int32_t *perm, int n);

/* Numbers from the command line or the environment: the whole string is
 * a decimal in [lo, hi] (mg_parse_double: finite; MG_OPEN_LO / MG_OPEN_HI
 * leave a bound out), else MG_EINVAL with one line naming `what` (a flag,
 * "--threads", or a variable, "MG_THREADS") and the range, e.g.
 * "--threads 4294967296 is out of range: give an integer from 1 to 1024". */
enum { MG_OPEN_LO = 1, MG_OPEN_HI = 2 };
mg_status mg_parse_long(const char *what, const char *s, long lo, long hi, long *out);
mg_status mg_parse_double(const char *what, const char *s, double lo, double hi, int open,
                          double *out);

/* Environment tunables: every MG_* variable is a row of one table
 * (src/core/param.c), as NCCL declares NCCL_PARAM. INT and REAL values lie
 * in [min, max]; BOOL is 0/1 (or true/false, yes/no, on/off); CHOICE is one
 * of `choices` ("auto|ring|rd"); STR and SECRET (never printed) have at
 * most `max` characters (0: any). `dflt` is the value when unset, as text;
 * NULL when the code decides (the doc says how). */
typedef enum mg_tunable_type {
    MG_TUNE_INT, MG_TUNE_REAL, MG_TUNE_BOOL, MG_TUNE_CHOICE, MG_TUNE_STR, MG_TUNE_SECRET
} mg_tunable_type;
typedef struct mg_tunable {
    const char *name;
    mg_tunable_type type;
    const char *dflt;
    double min, max;
    const char *choices;
    const char *doc;
} mg_tunable;
/* The table (n rows), and one row by name (NULL if none). */
const mg_tunable *mg_tunables(int *n);
const mg_tunable *mg_tunable_find(const char *name);
/* The range a row accepts, as words ("an integer from 1 to 1024"). */
void mg_tunable_range(const mg_tunable *p, char *buf, size_t cap);
/* Its text in the environment now, unchecked; NULL if unset or empty. */
const char *mg_tunable_value(const mg_tunable *p);
/* Checks every MG_* variable that is set: MG_EINVAL with one line for a
 * malformed or out-of-range value; a variable the table does not know
 * gets a warning naming the closest one it does (once per process, on the
 * first rank only). Programs call it at start-up (the tools do, and exit
 * 2); mg_group_init does too. */
mg_status mg_tunables_check(void);
/* A tunable's value; `dflt` (the table's default, or what the code chose
 * where the table has none) when it is unset. A value the check would
 * refuse gives one warning and dflt. */
long mg_env_long(const char *name, long dflt);
double mg_env_double(const char *name, double dflt);
const char *mg_env_str(const char *name, const char *dflt);
/* A variable that others define and set for us — a launcher's RANK,
 * WORLD_SIZE, MASTER_ADDR, ..., MPI's OMPI_* and PMI*, OpenBLAS's
 * OPENBLAS_CORETYPE, PATH — as it is (NULL: unset): read through this
 * file too, so that src/core/param.c is the one place that reads the
 * environment. */
const char *mg_env_other(const char *name);

/* CPUs the local ranks of this job share: MG_LOCAL_CPUS when a launcher
 * that binds its workers to CPUs of their own sets it (mgrun does), else
 * the CPUs in this process's affinity mask. Waits spin only when the local
 * ranks do not outnumber them. */
int mg_local_cpus(void);

/* The library's version. */
#define MG_VERSION "0.3.0"

/* SIMD level of an x86-64 CPU, counting only what the OS enabled: SSE
 * (x86-64's baseline), AVX, AVX2 with FMA, AVX-512 (F, BW and VL), and
 * AVX-512 with AMX tiles (BF16). MG_SIMD_NONE on other architectures. */
typedef enum mg_simd {
    MG_SIMD_NONE, MG_SIMD_SSE, MG_SIMD_AVX, MG_SIMD_AVX2, MG_SIMD_AVX512, MG_SIMD_AMX
} mg_simd;
const char *mg_simd_name(mg_simd s);

/* The CPUID registers the decoding reads (recorded sets of other CPUs test
 * it on any machine). */
typedef struct mg_cpuid_regs {
    char vendor[13];             /* leaf 0 */
    char brand[49];              /* leaves 0x80000002-4 */
    uint32_t max_leaf;
    uint32_t l1_eax, l1_ecx, l1_edx;
    uint32_t l7_ebx, l7_ecx, l7_edx;   /* leaf 7, subleaf 0 */
    uint32_t l71_eax;                  /* leaf 7, subleaf 1 */
    uint64_t xcr0;               /* XGETBV(0): states the OS saves */
} mg_cpuid_regs;

typedef struct mg_cpu_info {
    char vendor[13];             /* "GenuineIntel", "AuthenticAMD" */
    char model[49];              /* the brand string, e.g. "AMD EPYC 9654 96-Core Processor" */
    int family, model_id, stepping;   /* display family and model */
    mg_simd simd;
    bool avx512_bf16;
} mg_cpu_info;

/* Decoding a CPU's registers; this CPU's info (read once). */
void mg_cpu_decode(const mg_cpuid_regs *r, mg_cpu_info *out);
const mg_cpu_info *mg_cpu(void);

/* One line, "PREFIX: MESSAGE\n", to stderr in one write(2), so that the
 * lines of processes sharing stderr (the ranks of a job) never run into
 * each other. Messages longer than 4 KiB are cut. */
void mg_eprintf(const char *prefix, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mg_veprintf(const char *prefix, const char *fmt, va_list ap);

/* Logging to stderr ("multigrad: ..." lines, as mg_eprintf); MG_VERBOSE=1
 * enables mg_debug. */
void mg_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void mg_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool mg_verbose(void);
/* Overrides MG_VERBOSE (tools' --verbose); call before threads start. */
void mg_set_verbose(bool on);

/* Monotonic clock in seconds. */
double mg_now(void);
/* Sleep for secs seconds (<= 0: not at all), resumed after signals. */
void mg_sleep(double secs);

/* Write a file atomically (temporary file PATH.tmp.XXXXXX in the same
 * directory, fsync, rename, fsync of the directory): a crash leaves either
 * the old file or the new one, never half of one, and a failure leaves no
 * temporary file; one a crash left is removed by the next save of PATH.
 * The _v form writes the n pieces one after another. The file keeps the
 * mode of the one it replaces; a new file gets 0666 less the umask. */
typedef struct mg_piece { const void *data; size_t len; } mg_piece;
mg_status mg_write_file_atomic(const char *path, const void *data, size_t len);
mg_status mg_write_file_atomic_v(const char *path, const mg_piece *pieces, int n);
/* The same in phases, for a file several processes write (each its own
 * byte ranges, by the temporary name): begin makes the temporary file of
 * `size` bytes (its name in tmp); pwrite_all writes at an offset (a full
 * disk is a clear MG_EIO); commit syncs, renames and syncs the directory
 * (closing fd; on failure the temporary file is removed); abort removes
 * it. */
mg_status mg_atomic_begin(const char *path, uint64_t size, char *tmp, size_t cap, int *fd);
mg_status mg_pwrite_all(int fd, const void *data, size_t len, uint64_t off, const char *path);
/* The same for reading: all len bytes at off, or MG_EIO naming path. */
mg_status mg_pread_all(int fd, void *data, size_t len, uint64_t off, const char *path);
mg_status mg_atomic_commit(const char *path, const char *tmp, int fd);
void mg_atomic_abort(const char *tmp, int fd);
/* CRC-32 (zlib's) of len bytes, and of two byte strings one after the
 * other from their CRCs (len_b: the second's length). */
uint32_t mg_crc32(const void *data, size_t len);
uint32_t mg_crc32_combine(uint32_t a, uint32_t b, uint64_t len_b);
/* Whether path can be written by the above (before any work that ends in
 * writing it): not a directory or other non-regular file, and a file can
 * be created next to it. MG_EINVAL or MG_EIO naming path otherwise. */
mg_status mg_check_writable(const char *path);
/* a and b name one file: the same file where both are there, else the
 * same absolute path (its directory resolved): an output that would
 * overwrite an input or another output. */
bool mg_same_file(const char *a, const char *b);
/* Open a regular file for reading: never blocks (a FIFO is refused, not
 * waited on) and refuses what is not a regular file. The descriptor, or
 * -1 with mg_error set (MG_EIO; `how`, may be NULL, is appended as the
 * fix); *sb (may be NULL) gets its fstat. */
struct stat;
int mg_open_regular(const char *path, const char *how, struct stat *sb);

/* A scratch file for offloaded state (optimizer state, parameter shards):
 * made in dir with mode 0600 and unlinked at once, so it goes with the
 * process however that ends; all `bytes` reserved up front, so a full disk
 * is a clear MG_EIO here rather than in the middle of training. `what`
 * names the contents in messages. Reads and writes are whole; they may
 * come from several threads at once (pread/pwrite). */
typedef struct mg_scratch mg_scratch;
mg_status mg_scratch_create(const char *dir, uint64_t bytes, const char *what, mg_scratch **out);
mg_status mg_scratch_read(mg_scratch *s, void *dst, size_t len, uint64_t off);
mg_status mg_scratch_write(mg_scratch *s, const void *src, size_t len, uint64_t off);
uint64_t mg_scratch_size(const mg_scratch *s);
void mg_scratch_destroy(mg_scratch *s);

/* Peak resident set size of this process in bytes (from getrusage). */
size_t mg_peak_rss(void);

#ifdef __cplusplus
}
#endif
#endif
