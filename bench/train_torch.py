#!/usr/bin/env python3
"""PyTorch side of bench/train: one training epoch of each zoo model, written
from ../shared/models.md, on one thread with the data preloaded as float
tensors (as bench/train.c preloads it), the same defaults (batch, lr,
momentum) and the usual loop (zero_grad, forward, loss, backward, step).

    train_torch.py [--model NAME]... [--epochs N] [--data DIR] [--device cpu|cuda]

--device cuda trains on the GPU in float32 with TF32 off, each batch gathered on
the host and copied in (as bench/train --device does), timed with the GPU
synchronised at both ends.

Prints one line per model: "model batch images/s seconds loss peak_MB"."""
import argparse
import gzip
import resource
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn

DEFAULTS = {  # batch, lr, momentum, normalized input
    "mlp": (128, 0.05, 0.9, True),
    "lenet-d2l": (256, 0.2, 0.0, False),
    "lenet5": (128, 0.05, 0.9, True),
}


def build(name):
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    if name == "lenet5":
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
                             nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                             nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                             nn.Linear(84, 10))
    if name == "lenet-d2l":
        m = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2, 2),
                          nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2, 2), nn.Flatten(),
                          nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
        for p in m.parameters():  # d2l: weights N(0, 0.01^2), biases 0
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.01)
            else:
                nn.init.zeros_(p)
        return m
    raise SystemExit(f"train_torch.py: unknown model '{name}'; choose mlp, lenet-d2l, lenet5")


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    gpu = dev.type == "cuda"
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(1)
    torch.manual_seed(0)
    images = load_idx(f"{args.data}/train-images-idx3-ubyte.gz")
    labels = torch.from_numpy(load_idx(f"{args.data}/train-labels-idx1-ubyte.gz").astype(np.int64))
    raw = torch.from_numpy(images.astype(np.float32) / 255.0)
    where = f" on {torch.cuda.get_device_name(dev)}" if gpu else ""
    print(f"# torch {torch.__version__}{where}: {torch.get_num_threads()} thread(s), "
          f"{args.epochs} epoch(s)")
    print(f"{'model':<10} {'batch':>5} {'images/s':>10} {'seconds':>8} {'loss':>8} {'peakMB':>7}")
    for name in args.model or ["mlp", "lenet-d2l", "lenet5"]:
        batch, lr, momentum, normalized = DEFAULTS[name]
        x_all = (raw - 0.2860) / 0.3530 if normalized else raw
        x_all = x_all.reshape(-1, 784) if name == "mlp" else x_all.reshape(-1, 1, 28, 28)
        x_all = x_all.contiguous()
        model = build(name).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        loss_fn = nn.CrossEntropyLoss()
        n = x_all.shape[0]
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for e in range(args.epochs):
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(e))
            total, steps = 0.0, 0
            for i in range(0, n, batch):
                idx = perm[i:i + batch]
                x, y = x_all[idx].to(dev), labels[idx].to(dev)
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                total += loss.item()
                steps += 1
        if gpu:
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
        print(f"{name:<10} {batch:>5} {n * args.epochs / secs:>10.0f} {secs:>8.2f} "
              f"{total / steps:>8.4f} {peak:>7.1f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
