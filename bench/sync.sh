#!/usr/bin/env bash
# bench/sync.sh — synchronous, stale and asynchronous updates, central
# aggregation against the ring, with and without a straggler (issue 34),
# on this machine. Two jobs:
#   gpt-mini  batch 16, 60 steps, validation on 16 windows every 10 steps;
#             target: a validation loss of $GPT_TARGET (default 3.3)
#   lenet5    Fashion-MNIST, batch 128, 5 epochs, the test set after each;
#             target: a test accuracy of $LENET_TARGET (default 0.85)
# each on W = 2, 4 and 8 workers (oversubscribed: the machine's cores are
# shared) with the same global batch, trained by
#   ddp-ring     mgrun -n W --parallel ddp, MG_ALGO=ring
#   ddp-central  the same, every collective through rank 0 (MG_ALGO=central)
#   ps-sync      mgrun -n W+1 --parallel ps (W workers, 1 server)
#   ps-stale4    the same with --staleness 4
#   ps-async     the same with --staleness inf (each push its own update)
#   ps-async-lr  the same with the learning rate divided by W (each
#                update is a worker's share of the batch, W times as many)
# each as it is and with worker 1 three times slower (--slow-rank 1:3).
# Prints per run: the whole run's seconds (mgrun to exit), the seconds from
# the start of training to the target (the log's elapsed column,
# evaluations and waits included; "-" if never), rank 0's rate after the
# first step and over the run (its training seconds only: a stale worker
# waits at the evaluation, not in its steps), and the final validation
# loss or test accuracy; then writes OUT/<model>-w<W>-<slow>.svg (the loss
# against the elapsed seconds, the six plans) and keeps the logs in OUT.
#
#   bash bench/sync.sh [OUT]     (default /tmp/sync; about 10 minutes on 2 cores)
#   MODELS="lenet5" WORKERS="2 4" bash bench/sync.sh    (a part of it)
set -euo pipefail
cd "$(dirname "$0")/.."
make -s tools >/dev/null
make -s build/bench/curves >/dev/null
BIN=build/bin
OUT=${1:-/tmp/sync}
GPT_TARGET=${GPT_TARGET:-3.3}
LENET_TARGET=${LENET_TARGET:-0.85}
MODELS=${MODELS:-gpt-mini lenet5}
WORKERS=${WORKERS:-2 4 8}
PLANS=(ddp-ring ddp-central ps-sync ps-stale4 ps-async ps-async-lr)
mkdir -p "$OUT"

echo "# $(date -u +%Y-%m-%d) $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed "s/^ //") (family $(grep -m1 "cpu family" /proc/cpuinfo | cut -d: -f2 | tr -d " ") model $(grep -m1 "^model\s" /proc/cpuinfo | cut -d: -f2 | tr -d " ")), $(nproc) cores"

# The column named $2 of CSV $1's header (1-based).
column() { head -1 "$1" | tr , '\n' | grep -nx "$2" | cut -d: -f1; }

for model in $MODELS; do
    case $model in
    gpt-mini) job=(--model gpt-mini --batch 16 --steps 60 --eval-every 10 --eval-windows 16)
              lr=0.001; metric=val_loss; target=$GPT_TARGET; cmp="<="; curve=val_loss
              rate=tokens/s ;;
    lenet5) job=(--model lenet5 --batch 128 --epochs 5)
            lr=0.05; metric=test_acc; target=$LENET_TARGET; cmp=">="; curve=test_loss
            rate=images/s ;;
    *) echo "bench/sync.sh: unknown model $model (gpt-mini, lenet5)" >&2; exit 2 ;;
    esac
    for W in $WORKERS; do
        echo
        echo "## $model, $W workers (target: $metric $cmp $target)"
        printf "%-12s %-5s %8s %10s %10s %10s %10s\n" plan slow "whole s" "to target" "steady" \
            "${rate}" "final"
        for slow in no yes; do
            curves=()
            for plan in "${PLANS[@]}"; do
                extra=()
                [ "$slow" = yes ] && extra=(--slow-rank 1:3)
                case $plan in
                ddp-ring) cmd=(env MG_ALGO=ring "$BIN/mgrun" -n "$W" "$BIN/mgtrain" --parallel ddp) ;;
                ddp-central) cmd=(env MG_ALGO=central "$BIN/mgrun" -n "$W" "$BIN/mgtrain"
                                  --parallel ddp) ;;
                ps-sync) cmd=("$BIN/mgrun" -n $((W + 1)) "$BIN/mgtrain" --parallel ps) ;;
                ps-stale4) cmd=("$BIN/mgrun" -n $((W + 1)) "$BIN/mgtrain" --parallel ps
                                --staleness 4) ;;
                ps-async) cmd=("$BIN/mgrun" -n $((W + 1)) "$BIN/mgtrain" --parallel ps
                               --staleness inf) ;;
                ps-async-lr) cmd=("$BIN/mgrun" -n $((W + 1)) "$BIN/mgtrain" --parallel ps
                                  --staleness inf --lr "$(echo "$lr / $W" | bc -l)") ;;
                esac
                name="$model-w$W-$plan-$slow"
                log="$OUT/$name.csv"
                rm -f "$log"
                t0=$(date +%s.%N)
                final=$("${cmd[@]}" "${job[@]}" "${extra[@]}" --log "$log" --quiet 2>&1 |
                        grep '^final:')
                t1=$(date +%s.%N)
                el=$(column "$log" elapsed)
                m=$(column "$log" $metric)
                c=$(column "$log" $curve)
                # the seconds since training began at each evaluation, its
                # loss (the curve), and the target's metric
                awk -F, -v e="$el" -v c="$c" 'NR > 1 && $c != "" { print $e, $c }' "$log" \
                    > "$OUT/$name.curve"
                reach=$(awk -F, -v e="$el" -v m="$m" -v T="$target" -v cmp="$cmp" '
                    NR > 1 && $m != "" && ((cmp == "<=" && $m <= T) || (cmp == ">=" && $m >= T)) {
                        printf "%.1f", $e; found = 1; exit }
                    END { if (!found) print "-" }' "$log")
                echo "$final" | awk -v p="$plan" -v s="$slow" -v w="$(echo "$t1 - $t0" | bc)" \
                                    -v r="$reach" -v unit="$rate" '{
                    for (i = 1; i <= NF; i++) { if ($i == unit) tok = $(i-1); if ($i ~ /^\(/) st = substr($i, 2) }
                    l = $4; sub(/,/, "", l)
                    printf "%-12s %-5s %8.1f %10s %10s %10s %10s\n", p, s, w, r, st, tok, l }'
                curves+=("$plan" "$OUT/$name.curve")
            done
            build/bench/curves --time "$OUT/$model-w$W-$slow.svg" \
                "$model on $W workers$([ $slow = yes ] && echo ", worker 1 three times slower"): $curve against the seconds since training began" \
                "${curves[@]}" >/dev/null
        done
    done
done
echo
echo "# plots: $OUT/<model>-w<W>-<no|yes>.svg; logs: $OUT/*.csv"
