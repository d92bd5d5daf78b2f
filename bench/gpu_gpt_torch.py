#!/usr/bin/env python3
"""PyTorch peer of `bench/gpt --device cuda`: the same GPT (bench/gpt_torch.py's
modules, from models.md section D), AdamW and clipping, trained on one GPU in
eager mode and float32 with TF32 off (the precision multigrad's GPU kernels
keep), on the fortunes text.

    gpu_gpt_torch.py [--steps N] [--batch B] [--ctx T] [--layers L] [--dim D]
                     [--heads H] [--data DIR] [--attn manual|sdpa] [--bf16]

--attn manual (default) is gpt_torch.py's explicit causal attention (the two
products and a masked softmax, as multigrad's kernels do); sdpa replaces it
with F.scaled_dot_product_attention(is_causal=True), PyTorch's fused kernel.
The optimizer is torch.optim.AdamW's default (foreach) implementation.
--bf16 runs forward and loss under torch.autocast(dtype=torch.bfloat16), the
peer of multigrad's --bf16 (whose GEMMs alone take bfloat16 operands; autocast
also keeps the products' outputs in bfloat16).

Output: a header comment line, then the summary line

    gpt-mini B T steps tokens/s seconds final_train_loss

where tokens/s = B*T*(steps-1) / seconds over the steps after the first
(warm-up), timed with the GPU synchronised at both ends.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch as G  # noqa: E402


def sdpa_forward(self, x):
    B, T, d = x.shape
    hd = d // self.h
    q, k, v = self.c_attn(x).split(d, dim=2)
    q = q.view(B, T, self.h, hd).transpose(1, 2)
    k = k.view(B, T, self.h, hd).transpose(1, 2)
    v = v.view(B, T, self.h, hd).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, d))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--attn", choices=["manual", "sdpa"], default="manual")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="print the GPU time per operator (torch.profiler) after the run")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_gpt_torch.py: PyTorch sees no GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    train, _ = G.load_text(a.data)
    n_train = train.numel()
    B, T = a.batch, a.ctx
    model = G.build(a.layers, a.dim, a.heads, T, 0)
    if a.attn == "sdpa":
        G.CausalSelfAttention.forward = sdpa_forward
    model.to(dev)
    for blk in model.h:
        blk.attn.mask = blk.attn.mask.to(dev)
    opt = G.optimizer(model)
    prec = "bfloat16 autocast" if a.bf16 else "float32, TF32 off"
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}: {prec}, "
          f"eager, attention {a.attn}; gpt L={a.layers} d={a.dim} h={a.heads} T={T} B={B}: "
          f"{sum(p.numel() for p in model.parameters())} parameters", flush=True)
    loss = float("nan")
    t0 = 0.0
    prof = None
    if a.profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    for s in range(a.steps):
        if s == 1:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = G.batch(train, G.offsets(n_train, B, T, 0, s), T)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            loss = G.train_step(model, opt, x.to(dev, non_blocking=True),
                                y.to(dev, non_blocking=True))
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    if prof:
        prof.__exit__(None, None, None)
        for key in ("self_device_time_total", "self_cuda_time_total"):
            try:
                print(prof.key_averages().table(sort_by=key, row_limit=30), flush=True)
                break
            except Exception:
                continue
    tps = B * T * (a.steps - 1) / secs if a.steps > 1 and secs > 0 else 0.0
    print(f"gpt-mini {B} {T} {a.steps} {tps:.0f} {secs:.2f} {loss:.4f}", flush=True)
    if not math.isfinite(loss):
        raise SystemExit("gpu_gpt_torch.py: the loss is not finite")


if __name__ == "__main__":
    main()
