#!/usr/bin/env python3
"""Loads an mgtrain gpt-mini checkpoint into PyTorch: builds bench/gpt_torch.py's
model (nanoGPT-style modules, models.md D) and calls load_state_dict(strict=True)
on the checkpoint's parameters (the optim.* entries, mgtrain's optimizer state,
left out), then prints the validation loss PyTorch computes with them, to be
compared with `mgtrain --eval-only --init CKPT` on the same sizes.

    gpt_load_check.py CKPT [--layers L] [--dim D] [--heads H] [--ctx T]
                           [--batch B] [--data DIR]"""
import argparse
import json
import struct

import numpy as np
import torch

import gpt_torch


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or name.startswith("optim."):
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"gpt_load_check.py: {path}: {name} is {info['dtype']}, not F32")
        lo, hi = info["data_offsets"]
        data = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=np.float32)
        out[name] = torch.from_numpy(data.copy()).reshape(info["shape"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = gpt_torch.build(a.layers, a.dim, a.heads, a.ctx, 0)
    state = read_safetensors(a.ckpt)
    model.load_state_dict(state, strict=True)   # raises on a missing or extra name or shape
    _, val = gpt_torch.load_text(a.data)
    loss = gpt_torch.evaluate(model, val, a.ctx, a.batch)
    print(f"load_state_dict(strict=True): {len(state)} tensors; "
          f"validation loss {loss:.4f}, perplexity {np.exp(loss):.2f}")


if __name__ == "__main__":
    main()
