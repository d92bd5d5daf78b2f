#!/usr/bin/env python3
"""Loads an mgtrain gpt-mini checkpoint into PyTorch: builds bench/gpt_torch.py's
model (nanoGPT-style modules, models.md D) and calls load_state_dict(strict=True)
on the checkpoint's parameters (the optim.* entries, mgtrain's optimizer state,
left out), then prints the validation loss PyTorch computes with them, to be
compared with `mgtrain --eval-only --init CKPT` on the same sizes (taken from
the checkpoint's hparams, arch=L..,d..,h..,T..; a flag given overrides them).

    gpt_load_check.py CKPT [--layers L] [--dim D] [--heads H] [--ctx T]
                           [--batch B] [--data DIR]"""
import argparse
import json
import struct

import numpy as np
import torch

import gpt_torch


def read_safetensors(path):
    """The checkpoint's parameters and its gpt sizes (None where it does not say)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    sizes = {}
    hp = header.get("__metadata__", {}).get("hparams", "")
    for item in hp.split(";"):
        if item.startswith("arch="):   # arch=L4,d128,h4,T128
            for part in item[5:].split(","):
                key = {"L": "layers", "d": "dim", "h": "heads", "T": "ctx"}.get(part[:1])
                if key:
                    sizes[key] = int(part[1:])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or name.startswith("optim."):
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"gpt_load_check.py: {path}: {name} is {info['dtype']}, not F32")
        lo, hi = info["data_offsets"]
        data = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=np.float32)
        out[name] = torch.from_numpy(data.copy()).reshape(info["shape"])
    return out, sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    defaults = {"layers": 4, "dim": 128, "heads": 4, "ctx": 128}   # gpt-mini's
    for k in defaults:
        ap.add_argument("--" + k, type=int, default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    a = ap.parse_args()
    torch.set_num_threads(1)
    state, sizes = read_safetensors(a.ckpt)
    for k, v in defaults.items():   # a flag, else the checkpoint's, else gpt-mini's
        if getattr(a, k) is None:
            setattr(a, k, sizes.get(k, v))
    model = gpt_torch.build(a.layers, a.dim, a.heads, a.ctx, 0)
    model.load_state_dict(state, strict=True)   # raises on a missing or extra name or shape
    _, val = gpt_torch.load_text(a.data)
    loss = gpt_torch.evaluate(model, val, a.ctx, a.batch)
    print(f"load_state_dict(strict=True): {len(state)} tensors; "
          f"validation loss {loss:.4f}, perplexity {np.exp(loss):.2f}")


if __name__ == "__main__":
    main()
