/* examples/allreduce.c — collectives with libmultigrad, the way
 * torch.distributed is used: run it as `mgrun -n 4 build/examples/allreduce`. */
#include <stdio.h>
#include "multigrad/comm.h"

int main(void)
{
    mg_group *g;
    if (mg_group_init(NULL, &g)) {
        fprintf(stderr, "allreduce: %s\n", mg_last_error());
        return 1;
    }
    int rank = mg_group_rank(g), size = mg_group_size(g);
    float v[4] = {rank, rank, rank, rank};
    /* Blocking all-reduce, in place: every rank gets 0 + 1 + ... + size-1. */
    if (mg_all_reduce(g, v, v, 4, MG_F32, MG_SUM)) goto fail;
    /* Async: start, do other work, then wait. */
    int token = rank == 0 ? 42 : 0;
    mg_work *w;
    if (mg_broadcast_async(g, &token, 1, MG_I32, 0, &w)) goto fail;
    mg_status st = mg_work_wait(w, -1);
    mg_work_free(w);
    if (st) goto fail;
    printf("rank %d of %d: sum %g (expected %d), token %d\n", rank, size, v[0],
           size * (size - 1) / 2, token);
    mg_group_destroy(g);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, mg_last_error());
    mg_group_destroy(g);
    return 1;
}
