/* Test helpers for models on devices (test_device.c, test_gpt.c). */
#ifndef MGT_DEVICES_H
#define MGT_DEVICES_H

#include "harness.h"
#include "multigrad/multigrad.h"

/* The device of a test: the CPU, emu (always there) or cuda:0, which
 * skips without a GPU, saying why. */
static inline mg_device mgt_device(mg_device_kind kind)
{
    const char *why;
    if (kind == MG_DEVICE_CUDA && !mg_device_cuda_count(&why)) mgt_skip("no GPU: %s", why);
    return (mg_device){kind, 0};
}

/* n floats of m's memory (on its device) in a host copy to free. */
static inline float *mgt_host_floats(const mg_model *m, const float *p, size_t n)
{
    float *h = (float *)malloc(n * sizeof(float));
    CHECK(h != NULL);
    CHECK_OK(mg_device_copy((mg_device){MG_DEVICE_CPU, 0}, h, mg_model_device(m), p,
                            n * sizeof(float)));
    return h;
}

#endif
