#!/bin/sh
# bench/plan.sh — the planner's predictions against real runs on this
# machine (issue 33): mgplan --verify, for gpt-mini (4 layers, dim 128,
# batch 32, 20 steps) under
#   1 rank; 2 ranks: DDP, ZeRO 1, 2 and 3, pp=2 under gpipe, 1f1b and
#   interleaved, tp=2; 4 ranks: DDP, ZeRO-3, dp=2 x pp=2 with ZeRO-1,
#   dp=2 x tp=2, pp=2 x tp=2;
# each the fastest plan of its kind the planner finds (its micro-batches,
# recomputation and sequence parallelism its choice); then the 85M shape
# (--layers 12 --dim 768 --heads 12 --ctx 256, batch 8, 3 steps) on 4 ranks
# with 1.2 GB a rank, below plain DDP's 16 bytes a parameter: the
# recommendation, the rules of thumb's plan and what fits of plain DDP;
# then offload: the 85M shape at context 64 (batch 8, 6 steps) on 2 ranks
# with 500 MB a rank, where nothing fits in memory: the recommendation,
# and the best ZeRO-2 and ZeRO-3 plans (their gradient and parameter
# pieces in files), the files in $OFFLOAD_DIR (default /var/tmp).
# Each row: predicted and measured step time (a step after the first,
# from mgtrain's tokens/s; beside it the rate with the first step) and
# model state (parameters, gradients, optimizer; the largest rank's
# counters), activations, the largest rank's RSS and the whole run's
# seconds. Several ranks on 2 to 7 cores run each plan 3 times and take
# the median (the same run spread by a third here). Ends with the largest
# deviations.
#
#   bench/plan.sh [quick|big]   (quick: the gpt-mini rows only; big: the 85M
#                               shape's only)
set -e
cd "$(dirname "$0")/.."
make -s tools >/dev/null
P=build/bin/mgplan
out=$(mktemp)
one=$(mktemp)
trap 'rm -f "$out" "$one"' EXIT
echo "# $(date -u +%Y-%m-%d) $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed "s/^ //") (family $(grep -m1 "cpu family" /proc/cpuinfo | cut -d: -f2 | tr -d " ") model $(grep -m1 "^model\s" /proc/cpuinfo | cut -d: -f2 | tr -d " ")), $(nproc) cores"
run() {
    echo "## mgplan --model gpt-mini $*"
    $P --model gpt-mini "$@" --top 0 --verify --verify-top 1 --verify-steps "${STEPS:-20}" \
        | sed -n '/^verify:/,$p' | tail -n +3 | tee -a "$out"
}
big() {   # the 85M shape: the whole output, its verify rows kept
    echo "## mgplan --model gpt-mini --layers 12 --dim 768 --heads 12 $*"
    $P --model gpt-mini --layers 12 --dim 768 --heads 12 "$@" > "$one"
    cat "$one"
    sed -n '/^verify:/,$p' "$one" | tail -n +3 >> "$out"
}
many=""   # ranks that share cores: runs spread by a third here
[ "$(nproc)" -lt 8 ] && many="--verify-runs 3"
if [ "$1" != big ]; then
    run -n 1
    for z in 0 1 2 3; do run -n 2 --mesh dp=2 --zero $z --no-pipeline --no-tp $many; done
    for s in gpipe 1f1b interleaved; do run -n 2 --mesh pp=2 --pp-schedule $s $many; done
    run -n 2 --mesh tp=2 $many
    run -n 4 --mesh dp=4 --zero 0 $many
    run -n 4 --mesh dp=4 --zero 3 $many
    run -n 4 --mesh dp=2,pp=2 --zero 1 $many
    run -n 4 --mesh dp=2,tp=2 $many
    run -n 4 --mesh pp=2,tp=2 $many
fi
if [ "$1" != quick ]; then
    big --ctx 256 --batch 8 -n 4 --memory 1.2G --top 5 --verify --verify-top 1 --verify-steps 3
    off="--offload disk:${OFFLOAD_DIR:-/var/tmp}"
    big --ctx 64 --batch 8 -n 2 --memory 500M $off --top 5 --verify --verify-top 1 --verify-steps 6
    for z in 2 3; do
        big --ctx 64 --batch 8 -n 2 --memory 500M $off --mesh dp=2 --zero $z --top 3 --verify \
            --verify-top 1 --verify-steps 6
    done
fi
echo "## largest deviations (measured / predicted)"
awk '$0 !~ /failed/ && NF >= 13 {
        t = $(NF - 8); m = $(NF - 4); n++
        if (n == 1 || t > tmax) tmax = t; if (n == 1 || t < tmin) tmin = t
        if (n == 1 || m > mmax) mmax = m; if (n == 1 || m < mmin) mmin = m }
     END { printf "%d plans: step time %.2f to %.2f, model state %.2f to %.2f\n", n, tmin, tmax, mmin, mmax }' "$out"
if grep -q failed "$out"; then echo "FAILED runs:"; grep failed "$out"; exit 1; fi
