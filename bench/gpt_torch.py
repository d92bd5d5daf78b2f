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
                 [--zero1] [--tp WORLD [--sp]] [--mem]

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
--tp W spawns W processes (gloo, one thread each unless --threads) forming one
tensor-parallel group, Megatron-LM style (not with --ddp or --zero1): every
rank trains on the whole global batch and holds 1/W of each block's matrices
(attn.c_attn and mlp.c_fc split by output features, column-parallel, c_attn's
q, k and v each by whole heads, so a rank runs heads/W heads; attn.c_proj and
mlp.c_proj split by input features, row-parallel, their biases replicated and
added after the sum over the ranks) and 1/W of the vocabulary (wte's rows, so
the tied head computes this rank's columns of the logits and the loss is a
vocabulary-parallel cross-entropy that never gathers the logits); wpe and the
LayerNorms are replicated. Every rank builds the full model from --seed and
keeps its slices, so --tp W starts from the same model as one process (its
peak RSS includes that full model, briefly). The global gradient norm for
clipping sums the split tensors' squares over the ranks and counts the
replicated ones once. Needs --heads and 256 (the vocabulary) to be multiples
of W. --sp (needs --tp W, W >= 2, and --ctx a multiple of W) adds sequence
parallelism: outside the parallel layers (LayerNorms, residual stream, wpe)
rank r holds positions [r*T/W, (r+1)*T/W) of every sequence; entering a
parallel layer all-gathers the sequence, leaving it reduce-scatters instead of
all-reducing, and the replicated parameters' gradients (LayerNorms, wpe,
row-parallel biases), each rank's from its own positions, are all-reduced
before clipping.
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
final_train_loss is the last step's loss over the whole global batch; with
--tp, the ranks share every sequence, so tokens/s counts the global batch once.
peak_MB is ru_maxrss/1024 of the (rank 0) process.

With --mem, the summary line is followed by one line per rank and a last line

    mem rank R peak_rss_mb X
    zero-peer mode M world W tokens_per_s X peak_rss_mb_max Y

where M is zero1 (--zero1), ddp (--ddp W, W >= 2), tp (--tp W, W >= 2), tp-sp
(--tp W --sp) or single (one process),
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
from types import SimpleNamespace

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
        q, k, v = self.c_attn(x).chunk(3, dim=2)  # with --tp: this rank's h heads
        B, T, d = q.shape
        hd = d // self.h
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


# -- Tensor parallelism (Megatron-LM style), 1: the mappings ---------------------
# The --tp ranks form one group (the whole world). A "parallel region" is the
# span between a column-parallel layer's input and a row-parallel layer's
# output, where each rank computes its own slice of the features. Four
# autograd functions move activations in and out of it; each one's backward is
# its forward's adjoint. With --sp the activations outside the regions are
# split along the sequence (dim 1 of [B, T, d]) rather than replicated.

tp = SimpleNamespace(world=1, rank=0, sp=False)  # this process in the tp group


def _all_reduce(x, op=dist.ReduceOp.SUM):
    """Sums (or op) x over the tp ranks, in place: x is a fresh product no other
    autograd node holds."""
    dist.all_reduce(x, op)
    return x


def _gather_seq(x):
    """Every rank's [B, T/W, ...] -> the whole [B, T, ...] (rank r's at r*T/W)."""
    parts = [torch.empty_like(x) for _ in range(tp.world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=1)


def _reduce_scatter_seq(x):
    """Every rank's partial [B, T, ...] -> this rank's [B, T/W, ...] of their sum.
    gloo (1.13) has no reduce-scatter: one all-to-all sends sequence part j to
    rank j (the same traffic), which adds up the W parts it receives."""
    send = torch.stack(x.chunk(tp.world, dim=1))  # [W, B, T/W, ...]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.sum(0)


def _mapping(name, forward, backward, doc):
    """A region mapping: an autograd function whose forward and backward are
    the two given collectives (or the identity)."""
    return type(name, (torch.autograd.Function,), {
        "__doc__": doc,
        "forward": staticmethod(lambda ctx, x: forward(x)),
        "backward": staticmethod(lambda ctx, g: backward(g))})


def _identity(x):
    return x


# Megatron-LM's four mappings: into and out of a split region, without and
# with sequence parallelism.
CopyToTP = _mapping("CopyToTP", _identity, lambda g: _all_reduce(g.contiguous()),
                    "Into a region: identity; backward sums the ranks' partial input "
                    "gradients.")
ReduceFromTP = _mapping("ReduceFromTP", _all_reduce, _identity,
                        "Out of a region: sums the ranks' partial outputs; backward is "
                        "identity.")
GatherFromSP = _mapping("GatherFromSP", _gather_seq, _reduce_scatter_seq,
                        "Into a region with --sp: all-gathers the sequence; backward "
                        "reduce-scatters (sums the ranks' partial gradients, keeping this "
                        "rank's positions).")
ReduceScatterToSP = _mapping("ReduceScatterToSP", _reduce_scatter_seq, _gather_seq,
                             "Out of a region with --sp: sums the ranks' partial outputs, "
                             "keeping this rank's positions; backward all-gathers the "
                             "sequence.")


def into_region(x):
    return GatherFromSP.apply(x) if tp.sp else CopyToTP.apply(x)


def out_of_region(x):
    return ReduceScatterToSP.apply(x) if tp.sp else ReduceFromTP.apply(x)


# -- Tensor parallelism, 2: the parallel layers ------------------------------------
# Built from the full model's layers: each keeps this rank's slice of the
# weights. Split parameters carry tp_split = True; the others are replicated.

def split_param(t):
    p = nn.Parameter(t.detach().clone())
    p.tp_split = True
    return p


class ColumnParallelLinear(nn.Module):
    """nn.Linear `full`'s output features `rows` (weight rows, bias entries):
    replicated (--sp: sequence-split) input, feature-split output."""
    def __init__(self, full, rows):
        super().__init__()
        self.weight = split_param(full.weight[rows])
        self.bias = split_param(full.bias[rows])

    def forward(self, x):
        return F.linear(into_region(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """nn.Linear `full`'s input features `cols` (weight columns): feature-split
    input, the partial products summed over the ranks (--sp: reduce-scattered
    over the sequence), then the replicated bias added."""
    def __init__(self, full, cols):
        super().__init__()
        self.weight = split_param(full.weight[:, cols])
        self.bias = full.bias

    def forward(self, x):
        return out_of_region(F.linear(x, self.weight)) + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [r*V/W, (r+1)*V/W) of the token embedding: each rank looks up the
    tokens in its range (zeros for the others) and the ranks' lookups are summed
    (--sp: reduce-scattered over the sequence). Also the tied head's weight."""
    def __init__(self, full):
        super().__init__()
        n = full.shape[0] // tp.world
        self.lo = tp.rank * n
        self.weight = split_param(full[self.lo:self.lo + n])

    def forward(self, idx):
        local = idx - self.lo
        inside = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(local * inside, self.weight) * inside.unsqueeze(-1)
        return out_of_region(x)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy of logits [N, V/W] that hold this rank's vocabulary
    columns, without gathering them: the row max, the sum of exponentials and
    the target's logit (on the rank that holds it, 0 elsewhere) are
    all-reduced (the last two in one call)."""
    @staticmethod
    def forward(ctx, logits, target):
        n = logits.shape[-1]
        local = target - tp.rank * n
        inside = (local >= 0) & (local < n)
        local = local * inside
        z = logits - _all_reduce(logits.max(dim=-1)[0], dist.ReduceOp.MAX).unsqueeze(-1)
        e = z.exp()
        zt = z.gather(1, local.unsqueeze(-1)).squeeze(-1) * inside
        sums = _all_reduce(torch.stack([e.sum(dim=-1), zt]))  # [sum exp, target logit]
        e /= sums[0].unsqueeze(-1)  # softmax, this rank's columns
        ctx.save_for_backward(e, local, inside)
        return sums[0].log() - sums[1]

    @staticmethod
    def backward(ctx, g):
        p, local, inside = ctx.saved_tensors  # d loss / d logits = softmax - onehot
        p[torch.arange(p.shape[0]), local] -= inside.to(p.dtype)
        return p.mul_(g.unsqueeze(-1)), None


class TensorParallelGPT(nn.Module):
    """GPT's forward on this rank's slices of `full` (taken apart: its other
    modules are reused). Parameter names and order are GPT's. Returns this
    rank's vocabulary columns of the logits, [B, T, V/W]."""
    def __init__(self, full):
        super().__init__()
        W, r, d = tp.world, tp.rank, full.wte.weight.shape[1]

        def part(n, k=1):  # this rank's rows of each of k consecutive blocks of n
            return torch.cat([torch.arange(j * n + r * n // W, j * n + (r + 1) * n // W)
                              for j in range(k)])
        self.T = full.T
        self.wte = VocabParallelEmbedding(full.wte.weight)
        self.wpe = full.wpe
        self.h = full.h
        for b in self.h:
            b.attn.h //= W
            b.attn.c_attn = ColumnParallelLinear(b.attn.c_attn, part(d, 3))  # q, k, v
            b.attn.c_proj = RowParallelLinear(b.attn.c_proj, part(d))
            b.mlp.c_fc = ColumnParallelLinear(b.mlp.c_fc, part(4 * d))
            b.mlp.c_proj = RowParallelLinear(b.mlp.c_proj, part(4 * d))
        self.ln_f = full.ln_f

    def forward(self, idx):
        x = self.wte(idx)  # [B, T, d]; --sp: this rank's positions, [B, T/W, d]
        lo = tp.rank * x.shape[1] if tp.sp else 0
        x = x + self.wpe.weight[lo:lo + x.shape[1]]
        for block in self.h:
            x = block(x)
        return F.linear(into_region(self.ln_f(x)), self.wte.weight)  # tied head


def tp_finish_grads(params, max_norm=1.0):
    """With --tp, between backward and the optimizer step. --sp: the replicated
    parameters (LayerNorms, wpe, row-parallel biases) hold the gradient of this
    rank's positions only: sum them over the ranks (one all-reduce). Then clip
    as clip_grad_norm_ would the full model: the split parts' squared norms
    summed over the ranks, the replicated ones counted once (rank 0's)."""
    params = [p for p in params if p.grad is not None]
    repl = [p.grad for p in params if not getattr(p, "tp_split", False)]
    if tp.sp:
        flat = _all_reduce(torch.cat([g.reshape(-1) for g in repl]))
        for g, f in zip(repl, flat.split([g.numel() for g in repl])):
            g.copy_(f.view_as(g))
    sq = torch.stack([p.grad.norm() for p in params
                      if getattr(p, "tp_split", False) or tp.rank == 0]).square().sum()
    coef = torch.clamp(max_norm / (_all_reduce(sq).sqrt() + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(coef)


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


def loss_fn(logits, y, reduction="mean"):
    logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
    if tp.world == 1:
        return F.cross_entropy(logits, y, reduction=reduction)
    loss = VocabParallelCrossEntropy.apply(logits, y)
    return loss.mean() if reduction == "mean" else loss.sum()


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    if tp.world > 1:
        tp_finish_grads(model.parameters(), 1.0)
    else:
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
        total += loss_fn(model(x), y, reduction="sum").double()
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
    nparams = sum(p.numel() for p in model.parameters())
    # The data-parallel ranks split the batch; the tensor-parallel ones share it.
    dp_rank, dp_world = (0, 1) if args.tp > 1 else (rank, world)
    mode = ("tp-sp" if args.sp else "tp") if args.tp > 1 else (
        "zero1" if args.zero1 else "ddp" if world > 1 else "single")
    if args.tp > 1:
        tp.world, tp.rank, tp.sp = world, rank, args.sp
        model = TensorParallelGPT(model)
    net = nn.parallel.DistributedDataParallel(model) if dp_world > 1 else model
    opt = optimizer(model, zero=args.zero1)
    B, T, local = args.batch, args.ctx, args.batch // dp_world
    curve = open(args.curve, "w") if rank == 0 and args.curve else None

    def report(step):
        if args.no_eval:
            return float("nan")
        v = evaluate(model, val, T, local, dp_rank, dp_world)
        if rank == 0:
            print(f"eval step {step} val_loss {v:.4f} ppl {math.exp(v):.2f}", flush=True)
            if curve:
                curve.write(f"{step} {v:.6f}\n")
                curve.flush()
        return v

    if rank == 0:
        print(f"# torch {torch.__version__}: {torch.get_num_threads()} thread(s) x {world} "
              f"process(es){', ' + mode if args.tp > 1 else ''}; gpt-mini L={args.layers} "
              f"d={args.dim} h={args.heads} T={T} B={B}: {nparams} parameters; text "
              f"{train.numel() + val.numel()} bytes (train {train.numel()}, val {val.numel()}); "
              f"summary: gpt-mini B T steps tokens/s seconds final_train_loss final_val_loss "
              f"peak_MB", flush=True)
    val_loss = report(0)
    secs, loss = 0.0, float("nan")
    if world > 1:
        dist.barrier()
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = batch(train, offsets(train.numel(), B, T, args.seed, step)[dp_rank::dp_world], T)
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
        if dp_world > 1:  # (the tp ranks' losses are the same)
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
    ap.add_argument("--tp", type=int, default=1, metavar="WORLD",
                    help="tensor parallelism over WORLD processes (Megatron-LM style)")
    ap.add_argument("--sp", action="store_true",
                    help="sequence parallelism in the --tp group")
    ap.add_argument("--mem", action="store_true",
                    help="report every rank's peak RSS and a zero-peer summary line")
    args = ap.parse_args()
    world = args.ddp
    if args.tp > 1 and (args.ddp != 1 or args.zero1):
        raise SystemExit("gpt_torch.py: --tp combines with neither --ddp nor --zero1 "
                         "(one tensor-parallel group, no data parallelism)")
    if args.zero1 and world < 2:
        raise SystemExit("gpt_torch.py: --zero1 needs --ddp WORLD with WORLD >= 2")
    if world < 1 or args.batch % world:
        raise SystemExit(f"gpt_torch.py: --batch {args.batch} is not a multiple of --ddp {world}")
    if args.tp < 1:
        raise SystemExit(f"gpt_torch.py: --tp {args.tp}: WORLD must be at least 1")
    if args.sp and args.tp < 2:
        raise SystemExit("gpt_torch.py: --sp needs --tp WORLD with WORLD >= 2")
    if args.tp > 1:
        world = args.tp
        need = [("--heads", args.heads), ("the vocabulary", VOCAB)]
        for what, n in need + ([("--ctx", args.ctx)] if args.sp else []):
            if n % world:
                raise SystemExit(f"gpt_torch.py: {what} {n} is not a multiple of --tp {world}")
    text = load_text(args.data)
    print(run_ranks(world, run, (args, text), "gpt_torch.py"), flush=True)


if __name__ == "__main__":
    sys.exit(main())
