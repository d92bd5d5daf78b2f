#!/usr/bin/env bash
# bench/gpu_nccl.sh — collectives on GPU memory through NCCL (issue 15)
# against PyTorch's NCCL process group, and against the same collectives
# staged through the host, in one run:
#
# 1. mgbench all_reduce and all_gather on 2 ranks with the buffers on the
#    GPU: through NCCL (MG_NCCL=on), staged through the host (MG_NCCL=off),
#    and bench/gpu_nccl_torch.py (torch.distributed, backend nccl).
# 2. mgtrain gpt-mini, DDP on 2 ranks: through NCCL and staged.
#
# On a machine with one GPU the ranks share it, which NCCL refuses for
# ranks of one host: each rank is then told it is a host of its own
# (NCCL_HOSTID), and NCCL moves the data through its network transport
# over loopback, the ranks' kernels taking turns on the GPU. Such figures
# compare multigrad's NCCL path with PyTorch's on the same footing; they
# are not what two GPUs joined by NVLink reach.
#
#   bench/gpu_nccl.sh [--bin DIR]     (DIR holds mgbench, mgtrain, mgrun)
set -uo pipefail
cd "$(dirname "$0")/.."
tools=build/bin
[ "${1:-}" = --bin ] && tools=$2
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
echo "== torch.distributed (nccl)"
python3 bench/gpu_nccl_torch.py -n 2 $sizes ${own:+--own-hosts}
g="--model gpt-mini --steps 200 --eval-every 200"
for m in on off; do
    echo "== mgtrain gpt-mini, DDP on 2 ranks, MG_NCCL=$m"
    MG_NCCL=$m wrap "$tools/mgtrain" $g --device cuda --parallel ddp | grep -E "collectives|final"
done
