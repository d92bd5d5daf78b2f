#!/usr/bin/env python3
"""PyTorch peer of bench/attention: causal self-attention alone,
F.scaled_dot_product_attention(is_causal=True) forward and backward, in the
layout of gpu_gpt_torch.py's sdpa_forward (q, k, v split from [B, T, 3d],
viewed as heads and transposed; the output transposed back and made
contiguous). float32 with TF32 off, or --bf16: the inputs in bfloat16, as
autocast gives SDPA the c_attn product's output.

    attention_torch.py [--T T] [--batch B] [--heads H] [--hd D] [--bf16] [--iters N]

Prints: attention T B H hd precision sdpa fwd+bwd_ms fwd_ms TFLOP/s (counted
as bench/attention counts).
"""
import argparse
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--hd", type=int, default=64)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    B, T, H, hd = a.batch, a.T, a.heads, a.hd
    d = H * hd
    dt = torch.bfloat16 if a.bf16 else torch.float32
    qkv = torch.randn(B, T, 3 * d, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(B, T, d, device="cuda", dtype=dt)

    def fwd():
        q, k, v = qkv.split(d, dim=2)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, H, hd).transpose(1, 2)
        v = v.view(B, T, H, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).contiguous().view(B, T, d)

    for _ in range(3):
        fwd().backward(dy)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        qkv.grad = None
        fwd().backward(dy)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    with torch.no_grad():
        for _ in range(a.iters):
            fwd()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    both, f = (t1 - t0) / a.iters, (t2 - t1) / a.iters
    flops = 4.0 * B * H * T * T * hd / 2 * 3.5
    print(f"attention {T} {B} {H} {hd} {'bf16' if a.bf16 else 'float32'} sdpa "
          f"{both * 1e3:.3f} {f * 1e3:.3f} {flops / both / 1e12:.2f}", flush=True)


if __name__ == "__main__":
    main()
