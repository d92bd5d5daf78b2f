"""Shared by the PyTorch peers of the data-parallel benchmarks: run one
function as `world` ranks and return rank 0's result."""
import queue
import socket

import torch.multiprocessing as mp


def run_ranks(world, target, args, who):
    """Calls target(rank, world, port, *args, out) for every rank, where
    `port` is a free loopback port for gloo and rank 0 puts its result on
    `out`; returns that result. One rank runs in this process (OpenMP's
    thread pool does not survive fork, which would understate PyTorch's
    threads); more are forked. A rank that fails ends the program, naming
    `who` (the script)."""
    if world == 1:
        out = queue.Queue()
        target(0, 1, 0, *args, out)
        return out.get()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    result = out.get()   # before join: a full queue would block the rank's exit
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"{who}: rank exited with {p.exitcode}")
    return result
