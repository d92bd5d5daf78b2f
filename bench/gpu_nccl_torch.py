#!/usr/bin/env python3
"""bench/gpu_nccl_torch.py — PyTorch's peer of `mgbench --device cuda`
through NCCL (bench/gpu_nccl.sh): torch.distributed's NCCL process group
timing all_reduce and all_gather (all_gather_into_tensor) on GPU memory,
in nccl-tests' conventions (size: the bytes of the whole vector; time:
the mean of --iters after --warmup; algbw = size / time; busbw with
nccl-tests' factors 2(n-1)/n and (n-1)/n).

By default the --iters calls are queued and waited for once, as
nccl-tests does; --blocking waits for each call before the next, as
mgbench's blocking collectives do (mg_run returns with the result in
device memory).

Each rank gets the GPU LOCAL_RANK modulo the GPUs. With --own-hosts each
rank is told it is a host of its own (NCCL_HOSTID), as gpu_nccl.sh tells
mgbench's ranks, so that ranks may share a GPU (NCCL refuses two ranks on
one GPU of one host).

  python3 bench/gpu_nccl_torch.py [-n 2] [-b 1M] [-e 256M] [-f 4] [-i 10] [--own-hosts]
                                  [--blocking]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def size_arg(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def rank_main(r, a):
    if a.own_hosts:
        os.environ["NCCL_HOSTID"] = "torch-peer-%d" % r
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    dev = torch.device("cuda", r % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=r, world_size=a.n, device_id=dev)
    n = a.n
    if r == 0:
        print("# torch %s, NCCL %s, %d ranks, %s, %s" % (torch.__version__,
              ".".join(map(str, torch.cuda.nccl.version())), n, torch.cuda.get_device_name(dev),
              "each call waited for" if a.blocking else "calls queued, waited for once"))
        print("# %-12s %-10s %12s %10s %10s" % ("coll", "size", "time(us)", "algbw", "busbw"))
    size = a.b
    while size <= a.e:
        count = size // 4 // n * n
        whole = torch.ones(count, device=dev)
        piece = torch.ones(count // n, device=dev)
        for coll in ("all_reduce", "all_gather"):
            if coll == "all_reduce":
                op, factor = (lambda: dist.all_reduce(whole)), 2 * (n - 1) / n
            else:
                op, factor = (lambda: dist.all_gather_into_tensor(whole, piece)), (n - 1) / n
            for _ in range(a.w):
                op()
            torch.cuda.synchronize()
            dist.barrier()
            t = time.perf_counter()
            for _ in range(a.i):
                op()
                if a.blocking:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            dt = torch.tensor([(time.perf_counter() - t) / a.i], device=dev)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)   # the slowest rank's
            if r == 0:
                s = dt.item()
                alg = count * 4 / s / 1e9
                print("  %-12s %-10d %12.1f %10.2f %10.2f" % (coll, count * 4, s * 1e6, alg,
                                                             alg * factor), flush=True)
        size *= a.f
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=2)
    p.add_argument("-b", type=size_arg, default=1 << 20)
    p.add_argument("-e", type=size_arg, default=256 << 20)
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-i", type=int, default=10)
    p.add_argument("-w", type=int, default=3)
    p.add_argument("--port", type=int, default=29571)
    p.add_argument("--own-hosts", action="store_true")
    p.add_argument("--blocking", action="store_true")
    a = p.parse_args()
    mp.spawn(rank_main, args=(a,), nprocs=a.n)


if __name__ == "__main__":
    main()
