#!/usr/bin/env bash
# bench/central.sh — central aggregation (every rank's vector to one rank,
# which sums them and sends the sum back: a parameter server's way)
# against the ring all-reduce, on this machine, in one run (issue 34).
# mgbench times the f32 SUM all-reduce with MG_ALGO=ring and
# MG_ALGO=central in turn at 2, 4 and 8 ranks (oversubscribed beyond the
# cores), over the shared-memory transport's channels and over TCP, 4 KiB
# to 64 MiB; runs alternate so that the machine's noise falls on both.
#
#   bash bench/central.sh          # a few minutes on 2 cores
#   QUICK=1 bash bench/central.sh  # 2 and 4 ranks, fewer iterations
#
# Prints one table: ranks, transport, size, both out-of-place times (µs)
# and bus bandwidths (GB/s), and central's time over ring's. The cost
# model's ratio (mg_coll_time_by) is beside it: measured and modelled
# should grow alike with the ranks. Then the same DDP job both ways:
# gpt-mini (batch 32, 30 steps) on 2 and 4 ranks, tokens/s after the
# first step and the whole run's, and the final validation loss (the
# same to its last digit at 2 ranks, where the sums are the same).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MG_BIN:-build/bin}
QUICK=${QUICK:-0}
[ -x "$BIN/mgbench" ] || { echo "central.sh: $BIN/mgbench not built: run make -j2 tools" >&2; exit 2; }
ITERS=20
RANKS="2 4 8"
if [ "$QUICK" = 1 ]; then ITERS=5; RANKS="2 4"; fi
OUT=$(mktemp -d /tmp/central.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

echo "# $(date -u +%Y-%m-%d) $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed "s/^ //") (family $(grep -m1 "cpu family" /proc/cpuinfo | cut -d: -f2 | tr -d " ") model $(grep -m1 "^model\s" /proc/cpuinfo | cut -d: -f2 | tr -d " ")), $(nproc) cores"
printf "%5s %-4s %9s %12s %12s %9s %9s %9s %9s\n" ranks via bytes "ring us" "central us" \
    "ring bw" "cent bw" "measured" "model"
for P in $RANKS; do
    for via in shm tcp; do
        T=()
        [ "$via" = tcp ] && T=(-t)
        for algo in ring central; do
            "$BIN/mgbench" -n "$P" "${T[@]}" -a "$algo" all_reduce -b 4K -e 64M -f 16 \
                -i "$ITERS" -w 3 --model-time > "$OUT/$P.$via.$algo"
        done
        # Rows: size count type redop root time algbw busbw #wrong ... model
        join <(awk '/^ *[0-9]/ {print $1, $6, $8, $NF}' "$OUT/$P.$via.ring") \
             <(awk '/^ *[0-9]/ {print $1, $6, $8, $NF}' "$OUT/$P.$via.central") |
            awk -v p="$P" -v via="$via" '{
                printf "%5d %-4s %9d %12.1f %12.1f %9.2f %9.2f %9.2f %9.2f\n",
                       p, via, $1, $2, $5, $3, $6, $5 / $2, $7 / $4 }'
    done
done

echo
echo "# DDP, gpt-mini, batch 32, 30 steps: tokens/s after the first step (whole run), validation loss"
printf "%5s %-8s %10s %10s %9s\n" ranks algo steady whole loss
JOB=(--model gpt-mini --parallel ddp --batch 32 --steps 30 --eval-every 1000 --no-eval-on-start --eval-windows 8)
[ "$QUICK" = 1 ] && JOB=(--model gpt-mini --parallel ddp --batch 32 --steps 10 --eval-every 1000 --no-eval-on-start --eval-windows 2)
for P in 2 4; do
    for algo in ring central ring central; do
        line=$(MG_ALGO=$algo "$BIN/mgrun" -n "$P" "$BIN/mgtrain" "${JOB[@]}" 2>&1 | grep '^final:')
        echo "$line" | awk -v p="$P" -v a="$algo" '{
            for (i = 1; i <= NF; i++) { if ($i == "tokens/s") w = $(i-1); if ($i == "(" || $i ~ /^\(/) s = substr($i, 2) }
            l = $4; sub(/,/, "", l); printf "%5d %-8s %10s %10s %9s\n", p, a, s, w, l }'
    done
done
