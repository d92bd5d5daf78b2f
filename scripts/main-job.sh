#!/usr/bin/env bash
# The main job (README, `make run`): d2l's multi-GPU training experiment
# done with processes — LeNet (lenet-d2l) on Fashion-MNIST, 10 epochs,
# batch 256, lr 0.2, on one worker and then with DistributedDataParallel on
# two (mgrun -n 2 mgtrain --parallel ddp), the same global batch: the same
# accuracy, less time per epoch. Logs and plots go to out/.
#   scripts/main-job.sh [BIN_DIR] [EPOCHS]
set -euo pipefail
bin=${1:-build/bin}
epochs=${2:-10}
mkdir -p out
flags=(--model lenet-d2l --epochs "$epochs" --batch 256 --lr 0.2)

summary=()
for n in 1 2; do
    echo "== $n worker(s): mgrun -n $n mgtrain ${flags[*]} --parallel ddp --log out/lenet-d2l-$n.csv"
    "$bin/mgrun" -n "$n" "$bin/mgtrain" "${flags[@]}" --parallel ddp \
        --log "out/lenet-d2l-$n.csv" | tee "out/lenet-d2l-$n.txt"
    acc=$(awk -F, 'END {printf "%.2f", 100 * $6}' "out/lenet-d2l-$n.csv")
    secs=$(awk -F, 'NR > 1 {s += $7; n++} END {printf "%.2f", s / n}' "out/lenet-d2l-$n.csv")
    summary+=("$(printf '%-8s %14s %16s' "$n" "$acc%" "$secs s")")
done
echo
printf '%-8s %14s %16s\n' workers "test accuracy" "seconds/epoch"
printf '%s\n' "${summary[@]}"
echo "metrics logs and plots: out/lenet-d2l-1.{csv,svg} out/lenet-d2l-2.{csv,svg}"
