#!/bin/bash
# What --log costs a long run: the whole-process time of one mgtrain run of
# gpt-mini (1 layer, dim 32) for STEPS steps with a row every 2 steps,
# without --log and with it, for this build and, beside it, another build's
# (e.g. one from before the log was written at most a tenth of the time,
# which rewrote the log and its plot whole at every row).
#
#   bench/log.sh [BIN] [OTHER_BIN]     (default build/bin; no other)
#
# Prints one row per build and case: wall seconds, training seconds, rows.
set -u
BIN=${1:-build/bin}
OTHER=${2:-}
STEPS=${STEPS:-8000}
unset OPENBLAS_CORETYPE
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
job="--model gpt-mini --layers 1 --dim 32 --heads 2 --ctx 32 --steps $STEPS --eval-every 2 \
--eval-windows 1 --quiet"
printf '%-40s %-10s %8s %10s %6s\n' build case wall_s training_s rows
for b in "$BIN" $OTHER; do
    for case in none log; do
        rm -f "$tmp"/l.csv "$tmp"/l.svg
        extra=""
        [ "$case" = log ] && extra="--log $tmp/l.csv"
        s=$(date +%s.%N)
        # shellcheck disable=SC2086
        "$b/mgtrain" $job $extra > "$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
        e=$(date +%s.%N)
        train=$(grep -o '[0-9.]* s training' "$tmp/out" | cut -d' ' -f1)
        rows=$([ -f "$tmp/l.csv" ] && echo $(( $(wc -l < "$tmp/l.csv") - 1 )) || echo -)
        printf '%-40s %-10s %8s %10s %6s\n' "$b" "$case" \
            "$(awk -v s="$s" -v e="$e" 'BEGIN {printf "%.1f", e - s}')" "$train" "$rows"
    done
done
