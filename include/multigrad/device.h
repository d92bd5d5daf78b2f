/* multigrad — devices: where arenas live and kernels run (issue 15).
 *
 * The CPU always; NVIDIA GPUs through the CUDA runtime when the library
 * was built with the CUDA toolkit (make detects it; make GPU=0 leaves it
 * out). This is the first layer of the GPU backend: naming a device,
 * finding out whether it is there, and its memory. The numeric core and
 * the collectives on device memory build on it. */
#ifndef MULTIGRAD_DEVICE_H
#define MULTIGRAD_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MG_DEVICE_EMU ("emu") runs the GPU code path on the host: device
 * memory is host memory and the device kernels run as loops. It is for
 * tests where there is no GPU, and for seeing what the device path does;
 * it is slow. */
typedef enum { MG_DEVICE_CPU, MG_DEVICE_CUDA, MG_DEVICE_EMU } mg_device_kind;
typedef struct mg_device {
    mg_device_kind kind;
    int index;   /* cuda:N; 0 for the CPU */
} mg_device;

/* Pure: "cpu", "cuda" (cuda:0) or "cuda:N" (0 <= N < 1024). MG_EINVAL
 * with a message naming the spec and what to write otherwise. */
mg_status mg_device_parse(const char *s, mg_device *out);
/* "cpu", "cuda:0" */
void mg_device_format(mg_device d, char *buf, size_t cap);

/* Whether this library was built with the CUDA backend. */
bool mg_device_cuda_built(void);
/* GPUs this process can use: 0 without the backend, a driver or a GPU;
 * *why (may be NULL) then gets the reason in words. With a GPU this
 * starts the CUDA driver, as any CUDA call does: a child that the
 * process forks afterwards (without exec) cannot use a GPU. Ask in the
 * child, or exec it, as mgrun does. */
int mg_device_cuda_count(const char **why);
/* The GPU of this local rank, as mgrun hands them out: LOCAL_RANK modulo
 * the GPUs (0 without LOCAL_RANK or a GPU). Ranks of one host share GPUs
 * when there are fewer. */
int mg_device_cuda_local(void);
/* MG_OK when d can be used here; else MG_EINVAL (an index past the
 * GPUs there are) or MG_EUNSUPPORTED (no backend, driver or GPU), with
 * a message that says which and what to do. */
mg_status mg_device_check(mg_device d);
/* The device's name ("NVIDIA H100 80GB HBM3", or the CPU's model) and its
 * memory in bytes (0 when unknown). */
mg_status mg_device_describe(mg_device d, char *name, size_t cap, size_t *memory);

/* Memory on d (zeroed; page-aligned on the CPU); NULL with mg_last_error
 * when it cannot be had. Freed with mg_device_free on the same device. */
void *mg_device_alloc(mg_device d, size_t bytes);
void mg_device_free(mg_device d, void *p);
/* Copies n bytes between memory of devices (either side may be the CPU);
 * complete when it returns. */
mg_status mg_device_copy(mg_device to, void *dst, mg_device from, const void *src, size_t n);

/* Page-locked host memory for copies to and from d (a GPU's copy engines
 * read and write it directly, at the bus's speed, and asynchronously;
 * cudaHostAlloc), or ordinary host memory for the CPU and emu. It costs
 * far more to get than ordinary memory: keep it. NULL with mg_last_error
 * when it cannot be had; freed by mg_device_host_free with the same d. */
void *mg_device_host_alloc(mg_device d, size_t bytes);
void mg_device_host_free(mg_device d, void *p);
/* Page-locks n bytes of host memory that exists (shared memory, say) for
 * d's copies (cudaHostRegister), until mg_device_host_unregister; nothing
 * on the CPU and emu. */
mg_status mg_device_host_register(mg_device d, void *p, size_t bytes);
void mg_device_host_unregister(mg_device d, void *p);

/* The device whose memory p points into: a GPU's (its index) or emu's
 * for memory from mg_device_alloc, else the CPU. The collectives ask it
 * of their buffers (comm.h), as a CUDA-aware MPI does. */
mg_device mg_device_of(const void *p);
/* Memory on device d (not the CPU, whose is mg_map_zero's) whose parts
 * can be given back (mg_device_discard) and had again, for arenas that a
 * sharded strategy keeps only in part (ZeRO-3's parameters, ZeRO-2's
 * gradients, a pipeline stage's). In granules: on a GPU, reserved address
 * space whose granules (2 MiB) are allocated and mapped, or unmapped and
 * freed (CUDA's virtual memory management; plain memory, nothing ever
 * given back, with a driver without it); on emu, host pages, and one
 * given back is made inaccessible as an unmapped granule is on a GPU, so
 * that tests on emu stop where a GPU would fault. A granule given back
 * holds memory again when mg_device_copy or mg_device_zero writes it
 * (zeros where not written), and mg_device_copy reads it as zeros; a
 * kernel must not touch it. Zeroed; freed with mg_device_free. */
void *mg_device_alloc_sparse(mg_device d, size_t bytes);
/* Zeroes n bytes of d's memory, in order with the kernels queued on d. */
mg_status mg_device_zero(mg_device d, void *p, size_t bytes);
/* The contents of n bytes at p are no longer needed (they read as
 * anything afterwards): a sparse allocation gives back the granules
 * wholly inside (a GPU's once its queued work is done); other memory of
 * the CPU and emu gives its whole pages back (mg_mem_discard); a GPU's
 * stays as it is. */
void mg_device_discard(mg_device d, void *p, size_t bytes);
/* The bytes of [p, p + n) that hold memory: less than n only in a sparse
 * allocation with granules given back. */
size_t mg_device_resident(mg_device d, const void *p, size_t bytes);

/* The device the calling thread's kernels run on (tensor.h, and
 * mg_grad_sumsq/_scale of optim.h): the CPU unless set. Pointers given to
 * them must then be that device's memory. Tapes and optimizers on a
 * device set it for their own calls and restore it; set it to call the
 * kernels directly on device memory (clipping a device model's gradients,
 * say). Kernels are queued in order; mg_device_copy and results that
 * kernels return to the host wait for what was queued. */
mg_status mg_device_set_current(mg_device d);
mg_device mg_device_current(void);
/* TF32 for d's float GEMMs (cuBLAS's TF32 tensor-op math: 10-bit
 * mantissas in the products, float sums; PyTorch's allow_tf32). Off by
 * default, so a GPU's results match the CPU's within float rounding. No
 * effect on the CPU and emu. */
mg_status mg_device_set_tf32(mg_device d, bool on);
/* bfloat16 GEMMs on d, the mixed precision of PyTorch's bfloat16 autocast
 * for its matrix products: every GEMM's operands rounded to bfloat16 (to
 * nearest even, by a conversion kernel on a GPU), products summed in
 * float32 (cuBLAS on the bfloat16 copies: tensor cores); the rest of a step
 * (normalisations, softmax, losses, optimizer) and everything stored
 * (weights, activations, gradients) stay float32. emu rounds the same way
 * on the host; no effect on the CPU. Off by default; over TF32 when both
 * are on. */
mg_status mg_device_set_bf16(mg_device d, bool on);
/* Waits until device d has done the work queued on it (at once for the
 * CPU and emu). */
mg_status mg_device_synchronize(mg_device d);
/* The float32 peak of d in FLOP/s without tensor cores (SMs x FP32 lanes
 * x 2 x the boost clock), 0 when not known (the CPU, emu). */
double mg_device_fp32_peak(mg_device d);

#ifdef __cplusplus
}
#endif
#endif
