#!/usr/bin/env python3
"""PyTorch side of bench/ddp: one training epoch of a zoo model with
DistributedDataParallel over gloo (W processes of one thread each), or in one
process with T threads (--threads, PyTorch's best use of the cores), with
models.md's global batch (each rank takes perm[r::W] and batch B/W), data
preloaded as float tensors.

    ddp_torch.py --model NAME [--world W] [--threads T] [--data DIR]

Prints "model world threads images/s seconds loss"."""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_torch import DEFAULTS, build, load_idx  # noqa: E402
from torch_ranks import run_ranks  # noqa: E402


def load(data, name):
    import numpy as np
    images = load_idx(f"{data}/train-images-idx3-ubyte.gz")
    labels = torch.from_numpy(load_idx(f"{data}/train-labels-idx1-ubyte.gz").astype(np.int64))
    raw = torch.from_numpy(images.astype(np.float32) / 255.0)
    normalized = DEFAULTS[name][3]
    x = (raw - 0.2860) / 0.3530 if normalized else raw
    x = x.reshape(-1, 784) if name == "mlp" else x.reshape(-1, 1, 28, 28)
    return x.contiguous(), labels


def run(rank, world, port, args, out):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batch, lr, momentum, _ = DEFAULTS[args.model]
    x_all, labels = load(args.data, args.model)
    model = build(args.model)
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    n = x_all.shape[0]
    local = batch // world
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))[rank::world]
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    total, steps = 0.0, 0
    for i in range(0, perm.numel(), local):
        idx = perm[i:i + local]
        x, y = x_all[idx], labels[idx]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        total += loss.item()
        steps += 1
    if world > 1:
        dist.barrier()
    secs = time.perf_counter() - t0
    if rank == 0:
        out.put((n / secs, secs, total / steps))
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, choices=sorted(DEFAULTS))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    ips, secs, loss = run_ranks(args.world, run, (args,), "ddp_torch.py")
    print(f"{args.model} {args.world} {args.threads} {ips:.0f} {secs:.2f} {loss:.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
