#!/usr/bin/env bash
# bench/ab.sh — one mgtrain job with this tree's build and with an older
# commit's (built into a worktree under /tmp), in one run on one machine:
# a change's speed against what it replaced.
#
# Each of --repeat rounds runs the older build, then this one (so
# background noise falls on both alike); for each build the best round's
# training seconds (mgtrain's "final: ... N s training": the steps,
# steady state) and that round's whole-process seconds (start-up, set-up
# and evaluation included), and the ratio of the two builds' best. With
# --trace, one more run of this build under MG_TRACE prints DDP's own
# account from rank 0 (buckets, all-reduce time, how much the step waited
# for it).
#
#   bench/ab.sh --before COMMIT [-n RANKS] [--repeat 3] [--trace] -- MGTRAIN-ARGS...
#
# e.g. a pipeline's replicas averaging during the last backward (issue 31):
#   bench/ab.sh --before c65de70 -n 4 --trace -- --model gpt-mini --layers 6 --dim 256 \
#       --heads 4 --batch 16 --mesh pp=2,dp=2 --micro-batches 4 --bucket-mb 2 \
#       --steps 20 --eval-every 20 --eval-windows 8
set -euo pipefail
cd "$(dirname "$0")/.."

before=""
n=1
repeat=3
trace=0
while [ $# -gt 0 ]; do
    case "$1" in
    --before) before="$2"; shift 2 ;;
    -n) n="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --trace) trace=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ab.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$before" ] || [ $# -eq 0 ]; then
    echo "ab.sh: give --before COMMIT and, after --, mgtrain's arguments (see --help)" >&2
    exit 2
fi

make -j2 all >/dev/null
old=/tmp/mg-before-$(git rev-parse --short "$before")
if [ ! -x "$old/build/bin/mgtrain" ]; then
    git worktree add -f --detach "$old" "$before" >/dev/null 2>&1 || true
    make -C "$old" -j2 all >/dev/null
fi
unset OPENBLAS_CORETYPE

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
fam=$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
mod=$(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
echo "# $(date -u +%Y-%m-%d) $cpu (family $fam model $mod), $(nproc) cores; $n rank(s): mgtrain $*"

# one run of build BIN: "training-seconds whole-seconds"
once() {
    local bin=$1 s0 s1 out
    shift
    s0=$(date +%s.%N)
    if [ "$n" -gt 1 ]; then out=$("$bin/mgrun" -n "$n" "$bin/mgtrain" --quiet "$@")
    else out=$("$bin/mgtrain" --quiet "$@"); fi
    s1=$(date +%s.%N)
    echo "$(echo "$out" | sed -n 's/.* \([0-9.]*\) s training.*/\1/p' | tail -1)" \
         "$(awk -v a="$s0" -v b="$s1" 'BEGIN { printf "%.2f", b - a }')"
}

declare -A best whole
for b in old new; do best[$b]=1e30; whole[$b]=0; done
for _ in $(seq "$repeat"); do
    for b in old new; do
        dir=build/bin
        [ "$b" = old ] && dir=$old/build/bin
        read -r t w < <(once "$dir" "$@")
        if awk -v a="$t" -v c="${best[$b]}" 'BEGIN { exit !(a < c) }'; then
            best[$b]=$t
            whole[$b]=$w
        fi
    done
done
printf '%-32s %12s %10s\n' build "training s" "whole s"
printf '%-32s %12s %10s\n' "before ($(git rev-parse --short "$before"))" "${best[old]}" "${whole[old]}"
printf '%-32s %12s %10s\n' "this tree" "${best[new]}" "${whole[new]}"
awk -v a="${best[old]}" -v b="${best[new]}" 'BEGIN { printf "speed ratio (before / this, training): %.3f\n", a / b }'

if [ "$trace" = 1 ]; then
    tdir=$(mktemp -d)
    if [ "$n" -gt 1 ]; then
        MG_TRACE="$tdir/t.json" build/bin/mgrun -n "$n" build/bin/mgtrain --quiet "$@" 2>&1
    else
        MG_TRACE="$tdir/t.json" build/bin/mgtrain --quiet "$@" 2>&1
    fi | sed -n 's/^mgtrain: \([0-9]* buckets.*\)/DDP, rank 0: \1/p'
    rm -rf "$tdir"
fi
