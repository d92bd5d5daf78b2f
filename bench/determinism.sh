#!/usr/bin/env bash
# bench/determinism.sh — what --deterministic costs (issue 35; target: at
# most 10% slower on 2 ranks), on this machine: gpt-mini (its default
# sizes, batch 32, 60 steps, no evaluation) and lenet-d2l (Fashion-MNIST,
# batch 256, one epoch), each on 2 ranks under --parallel ddp with and
# without --deterministic (8 virtual shards, --tp-chunks 2: every run cuts
# what a tp split would), in turn, RUNS times (default 3); gpt-mini on
# tp=2 (--mesh tp=2) and under a parameter server (3 ranks: 2 workers, 1
# server), the same way. Prints per run the whole run's seconds (mgrun to exit, start-up and
# the final evaluation included), the rate after the first step and over
# the training, and the parameters' hash; then the medians and the cost
# (deterministic / default - 1, of the steady rate and of the whole run).
# The deterministic hashes agree run to run (and with 1, 4 and 8 ranks:
# tests/test_determinism.c); the default ones are DDP's.
#
#   bash bench/determinism.sh        (about 4 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
make -s tools >/dev/null
BIN=build/bin
RUNS=${RUNS:-3}

echo "# $(date -u +%Y-%m-%d) $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed "s/^ //") (family $(grep -m1 "cpu family" /proc/cpuinfo | cut -d: -f2 | tr -d " ") model $(grep -m1 "^model\s" /proc/cpuinfo | cut -d: -f2 | tr -d " ")), $(nproc) cores"
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for what in "2 gpt-mini --parallel ddp" "2 lenet-d2l --parallel ddp" "2 gpt-mini --mesh tp=2" \
            "3 gpt-mini --parallel ps"; do
    read -r ranks model plan <<< "$what"
    case $model in
    gpt-mini) job=(--model gpt-mini --steps 60 --eval-every 60 --no-eval-on-start
                   --eval-windows 8); unit=tokens/s ;;
    lenet-d2l) job=(--model lenet-d2l --epochs 1); unit=images/s ;;
    esac
    echo
    echo "## $model, $ranks ranks, $plan"
    printf "%-14s %4s %8s %10s %10s  %s\n" mode run "whole s" steady "$unit" "parameters sha256"
    rm -f /tmp/det.$$.*
    for run in $(seq "$RUNS"); do
        for mode in default deterministic; do
            extra=()
            [ $mode = deterministic ] && extra=(--deterministic)
            t0=$(date +%s.%N)
            # shellcheck disable=SC2086   # plan: words
            out=$("$BIN/mgrun" -n "$ranks" "$BIN/mgtrain" "${job[@]}" $plan "${extra[@]}" \
                  --print-hash --quiet 2>&1)
            t1=$(date +%s.%N)
            whole=$(echo "$t1 - $t0" | bc)
            rate=$(echo "$out" | grep '^final:' | awk -v u="$unit" '{
                for (i = 1; i <= NF; i++) { if ($i == u) r = $(i-1); if ($i ~ /^\(/) s = substr($i, 2) }
                print s, r }')
            hash=$(echo "$out" | awk '/^parameters sha256/ { print $3 }')
            printf "%-14s %4d %8.2f %10s %10s  %s\n" $mode "$run" "$whole" $rate "$hash"
            echo "$whole" >> /tmp/det.$$.$mode.whole
            echo "$rate" | cut -d' ' -f1 >> /tmp/det.$$.$mode.steady
        done
    done
    for f in whole steady; do
        a=$(median < /tmp/det.$$.default.$f)
        b=$(median < /tmp/det.$$.deterministic.$f)
        if [ $f = whole ]; then cost=$(echo "$b / $a - 1" | bc -l); else cost=$(echo "$a / $b - 1" | bc -l); fi
        printf "median %-7s default %10s  deterministic %10s  cost %+.1f%%\n" $f "$a" "$b" \
            "$(echo "$cost * 100" | bc -l)"
    done
    rm -f /tmp/det.$$.*
done
