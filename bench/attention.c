/* bench/attention — causal self-attention alone on a device: forward and
 * backward of multigrad's kernel over B sequences x H heads x T positions
 * of head size hd, in the gpt models' layout (qkv [B, T, 3 H hd], y
 * [B, T, H hd]); bench/attention_torch.py is PyTorch's SDPA on the same
 * shapes and layout.
 *
 *   attention [--device cuda[:N]|emu] [--T T] [--batch B] [--heads H] [--hd D]
 *             [--bf16] [--gemm] [--iters N]
 *
 * The fused kernel (MG_ATTENTION=fused; MG_ATTENTION_ROWS as set), or with
 * --gemm the batched GEMMs' path; --bf16: bfloat16 operands (the fused
 * path's then runs on the tensor cores: src/device/attention_tc.cu). After 3
 * warm-up rounds, N rounds of forward then backward, timed with the
 * device synchronised at both ends, and N forwards alone. Prints one line:
 *
 *   attention T B H hd precision path fwd+bwd_ms fwd_ms TFLOP/s
 *
 * TFLOP/s counts as FlashAttention's benchmarks do: the causal half of
 * the two products, 4 B H T^2 hd / 2 forward, 2.5 times that backward. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "multigrad/multigrad.h"

static void *filled(mg_device d, size_t n, uint64_t seed)
{
    float *h = malloc(n * sizeof(float));
    mg_rng r;
    mg_rng_init(&r, seed);
    for (size_t i = 0; h && i < n; i++) h[i] = mg_rng_normal(&r);
    float *p = mg_device_alloc(d, n * sizeof(float));
    if (!h || !p || mg_device_copy(d, p, (mg_device){MG_DEVICE_CPU, 0}, h, n * sizeof(float))) {
        fprintf(stderr, "attention: %zu floats on the device: %s\n", n, mg_last_error());
        exit(1);
    }
    free(h);
    return p;
}

int main(int argc, char **argv)
{
    int T = 256, B = 16, H = 12, hd = 64, bf16 = 0, gemm = 0, iters = 20;
    mg_device dev = {MG_DEVICE_CUDA, 0};
    static const struct option opts[] = {
        {"T", 1, 0, 't'},   {"batch", 1, 0, 'b'}, {"heads", 1, 0, 'h'}, {"hd", 1, 0, 'd'},
        {"bf16", 0, 0, 'f'}, {"gemm", 0, 0, 'g'}, {"iters", 1, 0, 'i'}, {"device", 1, 0, 'v'},
        {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 't': T = atoi(optarg); break;
        case 'b': B = atoi(optarg); break;
        case 'h': H = atoi(optarg); break;
        case 'd': hd = atoi(optarg); break;
        case 'f': bf16 = 1; break;
        case 'g': gemm = 1; break;
        case 'i': iters = atoi(optarg); break;
        case 'v':
            if (mg_device_parse(optarg, &dev)) {
                fprintf(stderr, "attention: %s\n", mg_last_error());
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: attention [--device D] [--T T] [--batch B] [--heads H] "
                            "[--hd D] [--bf16] [--gemm] [--iters N]\n");
            return 2;
        }
    }
    if (T < 1 || B < 1 || H < 1 || hd < 1 || iters < 1 || dev.kind == MG_DEVICE_CPU) {
        fprintf(stderr, "attention: T, batch, heads, hd and iters must be positive, on a "
                        "device (--device cuda or emu)\n");
        return 2;
    }
    setenv("MG_ATTENTION", gemm ? "gemm" : "fused", 1);
    if ((bf16 && mg_device_set_bf16(dev, true)) || mg_device_set_current(dev)) {
        fprintf(stderr, "attention: %s\n", mg_last_error());
        return 1;
    }
    int d = H * hd;
    size_t nx = (size_t)B * T * 3 * d, ny = (size_t)B * T * d;
    float *qkv = filled(dev, nx, 1), *dy = filled(dev, ny, 2), *y = filled(dev, ny, 3);
    float *dx = filled(dev, nx, 4);
    float *saved = filled(dev, mg_attention_saved(B, T, d, H), 5);
    float *ws = filled(dev, mg_attention_scratch(B, T, d, H) + 1, 6);
    for (int i = 0; i < 3; i++) {
        mg_attention_forward(y, saved, qkv, B, T, d, H, ws);
        mg_attention_backward(dx, dy, y, saved, qkv, B, T, d, H, ws);
    }
    mg_device_synchronize(dev);
    double t0 = mg_now();
    for (int i = 0; i < iters; i++) {
        mg_attention_forward(y, saved, qkv, B, T, d, H, ws);
        mg_attention_backward(dx, dy, y, saved, qkv, B, T, d, H, ws);
    }
    mg_device_synchronize(dev);
    double t1 = mg_now();
    for (int i = 0; i < iters; i++) mg_attention_forward(y, saved, qkv, B, T, d, H, ws);
    mg_device_synchronize(dev);
    double t2 = mg_now();
    double both = (t1 - t0) / iters, fwd = (t2 - t1) / iters;
    double flops = 4.0 * B * H * (double)T * T * hd / 2 * 3.5;
    printf("attention %d %d %d %d %s %s %.3f %.3f %.2f\n", T, B, H, hd,
           bf16 ? "bf16" : "float32", gemm ? "gemm" : "fused", both * 1e3, fwd * 1e3,
           flops / both / 1e12);
    float *own[] = {qkv, dy, y, dx, saved, ws};
    for (int i = 0; i < 6; i++) mg_device_free(dev, own[i]);
    return 0;
}
