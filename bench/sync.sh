#!/usr/bin/env bash
# bench/sync.sh — synchronous against stale updates, central aggregation
# against the ring, with and without a straggler (issue 34), on this
# machine: gpt-mini (batch 16, 60 steps, validation on 16 windows every 10
# steps) on 2 workers, trained by
#   ddp-ring     mgrun -n 2 --parallel ddp, MG_ALGO=ring
#   ddp-central  the same through rank 0 (MG_ALGO=central)
#   ps-sync      mgrun -n 3 --parallel ps (2 workers, 1 server), --staleness 0
#   ps-stale4    the same with --staleness 4
# each as it is and with worker 1 three times slower (--slow-rank 1:3).
# Prints per run: the whole run's seconds (mgrun to exit), the seconds from
# the start of training to a validation loss of $TARGET (default 3.3; "-"
# if never; the log's elapsed column, evaluations and waits included: a
# stale worker waits at the evaluation, not in its steps), rank 0's tokens/s
# after the first step and over the run (its training seconds only), and
# the final validation loss; then writes OUT/sync.svg (the validation loss
# against the elapsed seconds, every run) and keeps the logs in OUT.
# Not yet: fully asynchronous updates, lenet5, 4 and 8 workers (the issue's
# next parts).
#
#   bash bench/sync.sh [OUT]    (default /tmp/sync; about 5 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
make -s tools >/dev/null
make -s build/bench/curves >/dev/null
BIN=build/bin
OUT=${1:-/tmp/sync}
TARGET=${TARGET:-3.3}
mkdir -p "$OUT"
JOB=(--model gpt-mini --batch 16 --steps 60 --eval-every 10 --eval-windows 16)

echo "# $(date -u +%Y-%m-%d) $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed "s/^ //") (family $(grep -m1 "cpu family" /proc/cpuinfo | cut -d: -f2 | tr -d " ") model $(grep -m1 "^model\s" /proc/cpuinfo | cut -d: -f2 | tr -d " ")), $(nproc) cores"
printf "%-12s %-6s %8s %10s %9s %9s %9s\n" plan slow "whole s" "to $TARGET" "steady" "tok/s" "val loss"
curves=()
for slow in no yes; do
    for plan in ddp-ring ddp-central ps-sync ps-stale4; do
        extra=()
        [ "$slow" = yes ] && extra=(--slow-rank 1:3)
        case $plan in
        ddp-ring) cmd=(env MG_ALGO=ring "$BIN/mgrun" -n 2 "$BIN/mgtrain" --parallel ddp) ;;
        ddp-central) cmd=(env MG_ALGO=central "$BIN/mgrun" -n 2 "$BIN/mgtrain" --parallel ddp) ;;
        ps-sync) cmd=("$BIN/mgrun" -n 3 "$BIN/mgtrain" --parallel ps) ;;
        ps-stale4) cmd=("$BIN/mgrun" -n 3 "$BIN/mgtrain" --parallel ps --staleness 4) ;;
        esac
        log="$OUT/$plan-$slow.csv"
        rm -f "$log"
        t0=$(date +%s.%N)
        final=$("${cmd[@]}" "${JOB[@]}" "${extra[@]}" --log "$log" --quiet 2>&1 | grep '^final:')
        t1=$(date +%s.%N)
        # seconds since training began (evaluations and waits included) at
        # each evaluation, and its validation loss
        awk -F, 'NR > 1 { print $8, $3 }' "$log" > "$OUT/$plan-$slow.curve"
        reach=$(awk -v T="$TARGET" '$2 <= T { printf "%.1f", $1; found = 1; exit }
                                    END { if (!found) print "-" }' "$OUT/$plan-$slow.curve")
        echo "$final" | awk -v p="$plan" -v s="$slow" -v w="$(echo "$t1 - $t0" | bc)" -v r="$reach" '{
            for (i = 1; i <= NF; i++) { if ($i == "tokens/s") tok = $(i-1); if ($i ~ /^\(/) st = substr($i, 2) }
            l = $4; sub(/,/, "", l)
            printf "%-12s %-6s %8.1f %10s %9s %9s %9s\n", p, s, w, r, st, tok, l }'
        curves+=("$plan${slow/yes/ slow}" "$OUT/$plan-$slow.curve")
    done
done
build/bench/curves --time "$OUT/sync.svg" \
    "gpt-mini on 2 workers: validation loss against the seconds since training began" "${curves[@]}"
echo "# plot: $OUT/sync.svg; logs: $OUT/*.csv"
