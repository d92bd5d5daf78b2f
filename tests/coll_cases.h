/* Collective test cases shared by the mock and real-process tests (see
 * coll_cases.c). */
#ifndef MG_TESTS_COLL_CASES_H
#define MG_TESTS_COLL_CASES_H

#include <pthread.h>
#include <stdatomic.h>
#include "comm/coll/coll.h"

extern const mg_dtype ct_dtypes[7];
extern const char *ct_dt_name[7];
extern const char *ct_op_name[5];
extern const char *ct_coll_name[9];
extern const size_t ct_dt_size[7];

/* Input of element i from source s for a reduction with op (exact). */
long long ct_rvalue(long long s, size_t i, mg_dtype t, mg_op op, int P);
void ct_put(void *buf, size_t i, mg_dtype t, double v);
double ct_get(const void *buf, size_t i, mg_dtype t);
/* The exact reduction over sources salt..salt+P-1 of element i, stored as t at o. */
void ct_put_reduced(void *buf, size_t o, mg_dtype t, mg_op op, int P, size_t i, long long salt);

typedef struct {
    mg_coll coll;
    mg_dtype dt;
    mg_op op;
    size_t count;
    int root;
    int inplace;   /* 0 out of place, 1 sendbuf == recvbuf, 2 NCCL's offset form */
} tcase;

typedef struct {
    tcase *cases;
    int n, cap;
    mg__algo algo;
    int gmem;      /* 0 malloc, 1 group memory, 2 group memory on even ranks, 3 at rank offsets */
    pthread_mutex_t mu;
    char err[1024];
    _Atomic int barrier_local, *barrier_count;   /* the count is shared by all ranks */
} plan;

/* Where a case runs: through the mock group (threads) or a real one
 * (forked processes, public API). */
typedef struct {
    int rank, size;
    mg_status (*run)(void *ctx, const mg_call *c);
    void *(*galloc)(void *ctx, size_t bytes);   /* group memory, bump-allocated */
    void (*greset)(void *ctx);
    void *ctx;
} tenv;


void ct_add_case(plan *pl, tcase c);
/* Run every case of the plan on this rank (all ranks run the same plan):
 * 0 when all passed; the first failure is described in pl->err. */
int ct_run_plan(tenv *e, plan *pl);
/* The sweep of issue 3 for world size P (mock), and a lighter one for
 * real processes. */
void ct_build_sweep(plan *pl, int P);
void ct_build_sweep_lite(plan *pl, int P);
/* Group memory a rank needs for build_sweep's cases. */
size_t ct_sweep_gmem_bytes(int P);

#endif
