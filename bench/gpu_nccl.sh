#!/usr/bin/env bash
# bench/gpu_nccl.sh — collectives on GPU memory through NCCL (issue 15)
# against PyTorch's NCCL process group, and against the same collectives
# staged through the host, in one run:
#
# 1. mgbench all_reduce and all_gather on 2 ranks with the buffers on the
#    GPU: through NCCL (MG_NCCL=on), staged through the host (MG_NCCL=off),
#    and bench/gpu_nccl_torch.py (torch.distributed, backend nccl), its
#    calls queued as nccl-tests queues them and each waited for as
#    mgbench's blocking calls are.
# 2. mgtrain on 2 ranks, through NCCL and staged: gpt-mini with DDP, and
#    the main job (lenet-d2l, DDP, its 10 epochs).
#
# On a machine with one GPU the ranks share it, which NCCL refuses for
# ranks of one host: each rank is then told it is a host of its own
# (NCCL_HOSTID), and NCCL moves the data through its network transport
# over loopback, the ranks' kernels taking turns on the GPU. Such figures
# compare multigrad's NCCL path with PyTorch's on the same footing; they
# are not what two GPUs joined by NVLink reach.
#
#   bench/gpu_nccl.sh [--bin DIR] [--data DIR]
#     DIR holds mgbench, mgtrain and mgrun; --data is the Fashion-MNIST
#     directory (default mgtrain's)
set -uo pipefail
cd "$(dirname "$0")/.."
tools=build/bin
data=""
while [ $# -gt 0 ]; do
    case "$1" in
    --bin) tools=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    *) echo "usage: bench/gpu_nccl.sh [--bin DIR] [--data DIR]" >&2; exit 2 ;;
    esac
done
gpus=$(nvidia-smi -L | wc -l)
own=""
[ "$gpus" -lt 2 ] && own="NCCL_HOSTID=mg-bench-\$RANK"
echo "# GPUs: $gpus${own:+ (ranks share one: each told it is a host of its own)}"
wrap() { "$tools/mgrun" -n 2 sh -c "$own exec \"\$0\" \"\$@\"" "$@"; }
sizes="-b 1M -e 256M -f 4 -i 10"
for m in on off; do
    echo "== mgbench, GPU buffers, MG_NCCL=$m"
    MG_NCCL=$m wrap "$tools/mgbench" all_reduce all_gather $sizes --device cuda | grep -v "^#  "
done
for b in "" --blocking; do
    echo "== torch.distributed (nccl) $b"
    python3 bench/gpu_nccl_torch.py -n 2 $sizes ${own:+--own-hosts} $b
done
g="--model gpt-mini --steps 200 --eval-every 200"
for m in on off; do
    echo "== mgtrain gpt-mini, DDP on 2 ranks, MG_NCCL=$m"
    MG_NCCL=$m wrap "$tools/mgtrain" $g --device cuda --parallel ddp | grep -E "collectives|final"
done
for m in on off; do
    echo "== the main job, lenet-d2l, DDP on 2 ranks (models.md's 10 epochs), MG_NCCL=$m"
    MG_NCCL=$m wrap "$tools/mgtrain" --model lenet-d2l --parallel ddp --device cuda \
        ${data:+--data "$data"} | grep -E "collectives|final"
done
