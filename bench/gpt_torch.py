#!/usr/bin/env python3
"""PyTorch side of the gpt-mini benchmark: a GPT-2-style byte-level language
model written from ../shared/models.md section D (nanoGPT-style modules, so
named_parameters() gives models.md's names and order; pre-LayerNorm, GELU
tanh, tied head, explicit causal attention), trained on the fortunes text
with AdamW (weight decay 0.1 on 2-D parameters, lr 1e-3, betas (0.9, 0.99),
eps 1e-8) and global gradient clipping to norm 1.0, on one thread per process.

    gpt_torch.py [--steps N] [--batch B] [--ctx T] [--layers L] [--dim D]
                 [--heads H] [--eval-every N] [--data DIR] [--seed S]
                 [--threads N] [--curve FILE] [--ddp WORLD] [--no-eval]
                 [--zero1] [--mem]

--no-eval skips validation (for big shapes; final_val_loss is then nan).
--ddp W spawns W processes (gloo, one thread each unless --threads) wrapped in
DistributedDataParallel; rank r trains on rows r::W of the global batch B (so
B/W sequences per rank) and evaluates windows r::W of the validation set.
--zero1 (needs --ddp W, W >= 2) keeps the DDP-wrapped model but shards the
optimizer state: torch.distributed.optim.ZeroRedundancyOptimizer with
optimizer_class AdamW, the same hyper-parameters and the same two parameter
groups (weight decay 0.1 on 2-D parameters, 0 on the rest); each rank keeps
AdamW's moments of its own share of the parameters (a greedy partition by
size, whole tensors, within each group), updates that share and broadcasts it.
--mem makes every rank measure its peak resident memory at the end of its run
(ru_maxrss of the process, in MB = KiB*1024/1e6) and rank 0 gather them.

Output: a header comment line ("# torch ..."), one line per evaluation
"eval step S val_loss X.XXXX ppl Y.YY" (step 0 before training, every
--eval-every steps, and the last step; --curve FILE also writes "step val_loss"
lines), then the summary line

    gpt-mini B T steps tokens/s seconds final_train_loss final_val_loss peak_MB

tokens/s = B*T*(steps-1) / seconds, where seconds is the time of the training
steps only: evaluation is excluded, and so is the first step (warm-up), unless
--steps is 1. With --ddp, tokens/s counts all ranks' tokens (B is global) and
final_train_loss is the last step's loss over the whole global batch. peak_MB
is ru_maxrss/1024 of the (rank 0) process.

With --mem, the summary line is followed by one line per rank and a last line

    mem rank R peak_rss_mb X
    zero-peer mode M world W tokens_per_s X peak_rss_mb_max Y

where M is zero1 (--zero1), ddp (--ddp W, W >= 2) or single (one process),
tokens_per_s is the summary line's tokens/s (all ranks' tokens over the timed
steps: the first step is warm-up and excluded, unless --steps is 1) and
peak_rss_mb_max the largest rank's peak RSS. The ranks are forked from the
launching process after it has imported torch and read the text, so each
rank's RSS counts those shared pages too."""
import argparse
import gc
import hashlib
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer

from torch_ranks import run_ranks

# models.md D: sorted by name (C locale), concatenated byte for byte.
FILES = ("art ascii-art computers cookie debian definitions disclaimer drugs education ethnic "
         "food goedel humorists kids knghtbrd law linux linuxcookie love magic medicine "
         "men-women miscellaneous news paradoxum people perl pets platitudes politics pratchett "
         "science songs-poems sports startrek tao translate-me wisdom work zippy").split()
SHA256 = "2fc106f17c1d1059a2883c69171a75c17df0d426ae6c3de824cca88b787dcc8b"
VOCAB = 256


def load_text(data):
    """The fortunes text as uint8, its train and validation splits (int64 tensors)."""
    chunks = []
    for name in FILES:
        path = os.path.join(data, name)
        try:
            with open(path, "rb") as f:
                chunks.append(f.read())
        except OSError as e:
            raise SystemExit(f"gpt_torch.py: {e} (apt-get install fortunes)")
    raw = b"".join(chunks)
    if hashlib.sha256(raw).hexdigest() != SHA256:
        print(f"gpt_torch.py: warning: {data}: text differs from models.md's "
              f"(sha256 {SHA256[:12]}...)", file=sys.stderr)
    text = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).astype(np.int64))
    n_train = int(0.9 * len(raw))
    return text[:n_train], text[n_train:]


class CausalSelfAttention(nn.Module):
    def __init__(self, d, h, T):
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        # A plain attribute, not a buffer: the same on every rank, nothing for
        # DDP to broadcast (and gloo broadcasts no bool tensors).
        self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def forward(self, x):
        B, T, d = x.shape
        hd = d // self.h
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q.view(B, T, self.h, hd).transpose(1, 2)  # [B, h, T, hd]
        k = k.view(B, T, self.h, hd).transpose(1, 2)
        v = v.view(B, T, self.h, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, d)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d, h, T):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.attn = CausalSelfAttention(d, h, T)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, L=4, d=128, h=4, T=128):
        super().__init__()
        if d % h:
            raise SystemExit(f"gpt_torch.py: --dim {d} is not a multiple of --heads {h}")
        self.T = T
        self.wte = nn.Embedding(VOCAB, d)
        self.wpe = nn.Embedding(T, d)
        self.h = nn.ModuleList(Block(d, h, T) for _ in range(L))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        # GPT-2 init (models.md D), drawn after the modules' own default init, one
        # parameter at a time in named_parameters() order: with the same seed this
        # gives the reference file's init.* bit for bit.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.startswith("ln_f.") or ".ln_" in name:
                nn.init.ones_(p) if name.endswith(".weight") else nn.init.zeros_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe.weight[:T]
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


def build(L, d, h, T, seed):
    torch.manual_seed(seed)
    return GPT(L, d, h, T)


def optimizer(model, lr=1e-3, zero=False):
    """AdamW over two groups (weight decay 0.1 on 2-D parameters, 0 on the rest);
    zero=True shards it over the initialized process group (ZeRO stage 1)."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() == 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}]
    hyper = dict(lr=lr, betas=(0.9, 0.99), eps=1e-8)
    if zero:
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **hyper)
    return torch.optim.AdamW(groups, **hyper)


def offsets(n_train, B, T, seed, step):
    """The global batch's B start offsets of step `step`: uniform in [0, n_train-T-1],
    from a stream that depends only on (seed, step)."""
    g = torch.Generator().manual_seed((seed << 32) + step)
    return torch.randint(0, n_train - T, (B,), generator=g)


def batch(text, offs, T):
    idx = offs.to(torch.int64)[:, None] + torch.arange(T + 1)
    chunk = text[idx]
    return chunk[:, :T], chunk[:, 1:]


def loss_fn(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


@torch.no_grad()
def evaluate(model, val, T, bs, rank=0, world=1):
    """Mean cross-entropy over all positions of the first min(512, (n_val-1)//T)
    windows (window i at offset i*T), in batches of bs; rank r takes windows r::world."""
    nwin = min(512, (val.numel() - 1) // T)
    wins = torch.arange(rank, nwin, world)
    total = torch.zeros(1, dtype=torch.float64)
    for i in range(0, wins.numel(), bs):
        x, y = batch(val, wins[i:i + bs] * T, T)
        logits = model(x)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                 reduction="sum").double()
    if world > 1:
        dist.all_reduce(total)
    return total.item() / (nwin * T)


def run(rank, world, port, args, text, out):
    torch.set_num_threads(args.threads)
    train, val = text
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model = build(args.layers, args.dim, args.heads, args.ctx, args.seed)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = optimizer(model, zero=args.zero1)
    B, T, local = args.batch, args.ctx, args.batch // world
    nparams = sum(p.numel() for p in model.parameters())
    curve = open(args.curve, "w") if rank == 0 and args.curve else None

    def report(step):
        if args.no_eval:
            return float("nan")
        v = evaluate(model, val, T, local, rank, world)
        if rank == 0:
            print(f"eval step {step} val_loss {v:.4f} ppl {math.exp(v):.2f}", flush=True)
            if curve:
                curve.write(f"{step} {v:.6f}\n")
                curve.flush()
        return v

    if rank == 0:
        print(f"# torch {torch.__version__}: {torch.get_num_threads()} thread(s) x {world} "
              f"process(es); gpt-mini L={args.layers} d={args.dim} h={args.heads} T={T} B={B}: "
              f"{nparams} parameters; text {train.numel() + val.numel()} bytes (train "
              f"{train.numel()}, val {val.numel()}); summary: gpt-mini B T steps tokens/s "
              f"seconds final_train_loss final_val_loss peak_MB", flush=True)
    val_loss = report(0)
    secs, loss = 0.0, float("nan")
    if world > 1:
        dist.barrier()
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = batch(train, offsets(train.numel(), B, T, args.seed, step)[rank::world], T)
        loss = train_step(net, opt, x, y)
        if step > 0 or args.steps == 1:
            secs += time.perf_counter() - t0
        done = step + 1
        if done == args.steps or (args.eval_every > 0 and done % args.eval_every == 0):
            val_loss = report(done)
    # Peak RSS in MB (ru_maxrss is KiB on Linux), measured after training.
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
    rss = [own]
    if world > 1:
        t = torch.tensor([loss], dtype=torch.float64)
        dist.all_reduce(t)
        loss = t.item() / world
        if args.mem:
            rss = [None] * world
            dist.all_gather_object(rss, own)
        # Free DDP (whose C++ Reducer holds the process group) and the optimizer
        # while the group is still registered. Were the Reducer's reference the
        # last one, ProcessGroupGloo's destructor would run under the GIL and
        # join a gloo worker that may be waiting for the GIL to free a tensor:
        # a hang seen once at the end of an 85 M --ddp 2 run. The group's own
        # Python handle, dropped last here, releases the GIL as it goes.
        del net, opt
        gc.collect()
        dist.destroy_process_group()
    if curve:
        curve.close()
    if rank == 0:
        timed = max(args.steps - 1, 1) if args.steps > 0 else 0
        tps = B * T * timed / secs if secs > 0 else 0.0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        line = (f"gpt-mini {B} {T} {args.steps} {tps:.0f} {secs:.2f} {loss:.4f} "
                f"{val_loss:.4f} {peak:.1f}")
        if args.mem:
            mode = "zero1" if args.zero1 else "ddp" if world > 1 else "single"
            line += "".join(f"\nmem rank {r} peak_rss_mb {m:.1f}" for r, m in enumerate(rss))
            line += (f"\nzero-peer mode {mode} world {world} tokens_per_s {tps:.1f} "
                     f"peak_rss_mb_max {max(rss):.1f}")
        out.put(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--curve")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--ddp", type=int, default=1, metavar="WORLD")
    ap.add_argument("--zero1", action="store_true",
                    help="shard AdamW's state over the --ddp ranks (ZeroRedundancyOptimizer)")
    ap.add_argument("--mem", action="store_true",
                    help="report every rank's peak RSS and a zero-peer summary line")
    args = ap.parse_args()
    world = args.ddp
    if args.zero1 and world < 2:
        raise SystemExit("gpt_torch.py: --zero1 needs --ddp WORLD with WORLD >= 2")
    if world < 1 or args.batch % world:
        raise SystemExit(f"gpt_torch.py: --batch {args.batch} is not a multiple of --ddp {world}")
    text = load_text(args.data)
    print(run_ranks(world, run, (args, text), "gpt_torch.py"), flush=True)


if __name__ == "__main__":
    sys.exit(main())
