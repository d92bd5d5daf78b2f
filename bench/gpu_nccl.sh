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
# 3. A 2-stage pipeline (issue 36): mgtrain pp=2 (1F1B, 4 micro-batches)
#    of gpt-mini and of the 85M shape, and interleaved (2 chunks, 4
#    micro-batches: two rounds, in lock-step) of gpt-mini, its stages'
#    batches of sends and receives through NCCL (received in GPU memory)
#    against the same staged through the host (MG_NCCL=off); --verbose
#    prints each rank's batches received in device memory and its busy
#    share of the step.
#
# On a machine with one GPU the ranks share it, which NCCL refuses for
# ranks of one host: each rank is then told it is a host of its own
# (NCCL_HOSTID), and NCCL moves the data through its network transport
# over loopback, the ranks' kernels taking turns on the GPU. Such figures
# compare multigrad's NCCL path with PyTorch's on the same footing; they
# are not what two GPUs joined by NVLink reach.
#
#   bench/gpu_nccl.sh [--bin DIR] [--data DIR] [--only LIST]
#     DIR holds mgbench, mgtrain and mgrun; --data is the Fashion-MNIST
#     directory (default mgtrain's); --only runs the sections named in
#     LIST (comma-separated: mgbench, torch, ddp, main, pipeline)
set -uo pipefail
cd "$(dirname "$0")/.."
tools=build/bin
data=""
only=mgbench,torch,ddp,main,pipeline
while [ $# -gt 0 ]; do
    case "$1" in
    --bin) tools=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: bench/gpu_nccl.sh [--bin DIR] [--data DIR] [--only LIST]" >&2; exit 2 ;;
    esac
done
want() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
gpus=$(nvidia-smi -L | wc -l)
own=""
[ "$gpus" -lt 2 ] && own="NCCL_HOSTID=mg-bench-\$RANK"
echo "# GPUs: $gpus${own:+ (ranks share one: each told it is a host of its own)}"
wrap() { "$tools/mgrun" -n 2 sh -c "$own exec \"\$0\" \"\$@\"" "$@"; }
sizes="-b 1M -e 256M -f 4 -i 10"
want mgbench && for m in on off; do
    echo "== mgbench, GPU buffers, MG_NCCL=$m"
    MG_NCCL=$m wrap "$tools/mgbench" all_reduce all_gather $sizes --device cuda | grep -v "^#  "
done
want torch && for b in "" --blocking; do
    echo "== torch.distributed (nccl) $b"
    python3 bench/gpu_nccl_torch.py -n 2 $sizes ${own:+--own-hosts} $b
done
g="--model gpt-mini --steps 200 --eval-every 200"
want ddp && for m in on off; do
    echo "== mgtrain gpt-mini, DDP on 2 ranks, MG_NCCL=$m"
    MG_NCCL=$m wrap "$tools/mgtrain" $g --device cuda --parallel ddp | grep -E "collectives|final"
done
want main && for m in on off; do
    echo "== the main job, lenet-d2l, DDP on 2 ranks (models.md's 10 epochs), MG_NCCL=$m"
    MG_NCCL=$m wrap "$tools/mgtrain" --model lenet-d2l --parallel ddp --device cuda \
        ${data:+--data "$data"} | grep -E "collectives|final"
done
big="--model gpt-mini --layers 12 --dim 768 --heads 12 --ctx 256 --batch 16 --steps 20"
big="$big --eval-every 20 --no-eval-on-start"
want pipeline && for shape in "$g" "$big"; do
    for m in on off on off; do
        echo "== mgtrain pp=2 (1f1b, 4 micro-batches), MG_NCCL=$m: ${shape#--model }"
        MG_NCCL=$m wrap "$tools/mgtrain" $shape --device cuda --mesh pp=2 --micro-batches 4 \
            --verbose | grep -E "collectives|pipeline|final"
    done
done
want pipeline && for m in on off on off; do
    echo "== mgtrain pp=2 (interleaved, 2 chunks, 4 micro-batches), MG_NCCL=$m: ${g#--model }"
    MG_NCCL=$m wrap "$tools/mgtrain" $g --device cuda --mesh pp=2 --pp-schedule interleaved \
        --chunks 2 --micro-batches 4 --verbose | grep -E "collectives|pipeline|final"
done
exit 0   # (a section not asked for is no failure; the runs print their own)
