/* libFuzzer target for what a group's ranks tell each other when it
 * chooses the path of its collectives on GPU memory
 * (mg_group_use_device, src/comm/nccl.c): the all-gathered
 * mg__nccl_peer records, whatever a peer may send, through
 * mg__nccl_plan. The reason it gives must be one printable line, and a
 * plan that allows NCCL must have a GPU and NCCL on every rank and no
 * two ranks on one GPU of one host.
 *
 * The input: the records back to back (a partial one at the end is
 * dropped), at most 256. Seeds: tests/fuzz/nccl_plan/. */
#include "common.h"  /* first: it defines _GNU_SOURCE */
#include "comm/nccl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t n = size / sizeof(mg__nccl_peer);
    if (n > 256) return 0;
    mg__nccl_peer *p = malloc(n ? n * sizeof *p : 1);
    FUZZ_CHECK(p);
    if (n) memcpy(p, data, n * sizeof *p);
    char why[256];
    memset(why, 0x7f, sizeof why);
    bool ok = mg__nccl_plan(p, (int)n, NULL, why, sizeof why);
    size_t len = strnlen(why, sizeof why);
    FUZZ_CHECK(len > 0 && len < sizeof why);
    for (size_t i = 0; i < len; i++) FUZZ_CHECK(why[i] >= 32 && why[i] < 127);
    for (size_t i = 0; ok && i < n; i++) {
        FUZZ_CHECK(p[i].bus[0] && p[i].loaded == 1 && p[i].version == p[0].version);
        for (size_t j = 0; j < i; j++)
            FUZZ_CHECK(p[j].host != p[i].host || strncmp(p[j].bus, p[i].bus, sizeof p[i].bus));
    }
    free(p);
    return 0;
}
