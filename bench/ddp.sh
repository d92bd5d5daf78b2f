#!/usr/bin/env bash
# bench/ddp.sh — data-parallel training speed: multigrad DDP (mgrun -n 2
# mgtrain --parallel ddp) against PyTorch 1.13 DDP over gloo (2 processes
# of one thread) and PyTorch's best use of 2 cores (one process, 2
# threads), one epoch per zoo model with models.md's global batch, in one
# run; plus multigrad's one-rank figure for the scaling, the scaling bound
# of this machine, and how much of DDP's all-reduce time was hidden behind
# backward.
#
# The bound: two independent single processes at half the batch, run at
# the same time (mgrun -n 2 mgtrain --batch B/2, no --parallel): each does a DDP rank's work
# per step (forward and backward of B/2 images, the optimizer step over all
# parameters) with no communication at all. Their summed images/s over one
# rank's is the best scaling DDP can reach on this machine.
#
#   bench/ddp.sh [--repeat N] [--models "mlp lenet-d2l lenet5"]
#
# With --repeat N every configuration runs N times and the best counts.
set -euo pipefail
cd "$(dirname "$0")/.."

repeat=1
models="mlp lenet-d2l lenet5"
while [ $# -gt 0 ]; do
    case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ddp.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$repeat" in ''|*[!0-9]*|0) echo "ddp.sh: --repeat needs a positive integer" >&2; exit 2 ;; esac

make -j2 all >/dev/null
bin=build/bin
py=/usr/bin/python3
have_torch=1
$py -c 'import torch' 2>/dev/null || have_torch=0

# images/s of the epoch line of mgtrain
ours() { "$@" --epochs 1 2>/dev/null | awk '/^epoch/ {for (i = 1; i < NF; i++) if ($(i+1) == "img/s") print $i}'; }
best() { sort -n | tail -1; }

# Issue 10: 2 ranks at least 2.5x PyTorch DDP's images/s for every model.
declare -A target=([mlp]=2.5 [lenet-d2l]=2.5 [lenet5]=2.5)
declare -A batch=([mlp]=128 [lenet-d2l]=256 [lenet5]=128)
# Summed images/s of two independent single processes at half the batch,
# started together by mgrun (so bound to CPUs as DDP's ranks are), each
# told it is no rank of a job (mgtrain refuses to train a copy per rank).
pair() {
    $bin/mgrun -n 2 env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
        $bin/mgtrain --model "$1" --batch $(( ${batch[$1]} / 2 )) --epochs 1 2>/dev/null |
        awk '/^epoch/ {for (i = 1; i < NF; i++) if ($(i+1) == "img/s") s += $i} END {print s}'
}
printf '# bench/ddp.sh, %s, %s, %d core(s), best of %d\n' "$(date -u +%F)" "$(uname -m)" "$(nproc)" "$repeat"
./build/bin/mgrun --version | sed -n '2,4s/^/# /p'   # the CPU and the kernels in use
printf '%-10s %9s %9s %9s %9s %9s %9s %8s %8s %8s %8s\n' model mg1 mg-ddp2 torch-ddp2 torch-2thr \
    scaling bound of-bound vs-ddp target vs-best
for m in $models; do
    one=$(for i in $(seq "$repeat"); do ours $bin/mgtrain --model "$m"; done | best)
    two=$(for i in $(seq "$repeat"); do ours $bin/mgrun -n 2 $bin/mgtrain --model "$m" --parallel ddp; done | best)
    free=$(for i in $(seq "$repeat"); do pair "$m"; done | best)
    if [ $have_torch = 1 ]; then
        tddp=$(for i in $(seq "$repeat"); do $py bench/ddp_torch.py --model "$m" --world 2 | awk '{print $4}'; done | best)
        t2=$(for i in $(seq "$repeat"); do $py bench/ddp_torch.py --model "$m" --world 1 --threads 2 | awk '{print $4}'; done | best)
    else
        tddp=nan; t2=nan
    fi
    awk -v m="$m" -v a="$one" -v b="$two" -v c="$tddp" -v d="$t2" -v t="${target[$m]}" -v f="$free" 'BEGIN {
        printf "%-10s %9.0f %9.0f %9.0f %9.0f %8.2fx %8.2fx %8.0f%% %7.2fx %7.1fx %7.2fx\n",
            m, a, b, c, d, b / a, f / a, 100 * b / f, b / c, t, b / d }'
done
[ $have_torch = 1 ] || echo "# PyTorch not found: run scripts/install-deps.sh --bench for the peer columns"

# Overlap: all-reduce time hidden behind backward. The all-reduce time is
# each bucket's from the start of its all-reduce on the progress thread to
# its completion (waiting for the peer included); exposed is the time the
# training loop waited for them after backward. lenet-d2l in 0.05 MiB
# buckets (3: fc3+fc2, fc1, conv2+conv1): the fully connected layers'
# gradients travel while the convolutions' backward, most of the step,
# runs. mlp in 0.25 MiB buckets for contrast: its largest layer, fc1 (1.6
# MB of gradients), is the last of backward, so most bytes cannot overlap.
echo
for cfg in "lenet-d2l 0.05" "mlp 0.25"; do
    set -- $cfg
    echo "# overlap (mgrun -n 2 mgtrain --model $1 --parallel ddp --bucket-mb $2, MG_TRACE on):"
    trace=$(mktemp -d)
    MG_TRACE=$trace/t.json $bin/mgrun -n 2 $bin/mgtrain --model "$1" --parallel ddp --bucket-mb "$2" \
        --epochs 1 --quiet 2>&1 | grep -E 'hidden' || true
    rm -rf "$trace"
done
echo "# reproduce: bench/ddp.sh --repeat $repeat --models \"$models\""
