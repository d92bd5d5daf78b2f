#!/usr/bin/env bash
# bench/pp_overlap.sh — a pipeline's replicas averaging during the last
# backward (issue 31) against an older build that averaged after the
# step, in one run on one machine.
#
# mgtrain gpt (--layers L --dim D, context 128, AdamW) on 4 ranks as
# --mesh pp=2,dp=2 (1F1B, M micro-batches; 4 ranks on however many cores
# the machine has: on 2 cores they run oversubscribed, which the ratio
# shares alike), with this tree's build and with the commit --before
# (built into a worktree under /tmp). For each: the best tokens/s of
# --repeat runs of --steps steps (steady state, as mgtrain prints it) and
# the whole process's seconds (start-up, evaluation at the end included).
# Then, from one traced run of this build, DDP's own account (rank 0):
# the all-reduces' time and how much of it the step waited for.
#
#   bench/pp_overlap.sh --before COMMIT [--layers 6] [--dim 256] [--micro-batches 4]
#                       [--batch 16] [--steps 20] [--repeat 3]
set -euo pipefail
cd "$(dirname "$0")/.."

before=""
layers=6
dim=256
M=4
batch=16
steps=20
repeat=3
while [ $# -gt 0 ]; do
    case "$1" in
    --before) before="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --dim) dim="$2"; shift 2 ;;
    --micro-batches) M="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "pp_overlap.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$before" ]; then
    echo "pp_overlap.sh: give --before COMMIT, the build to compare with" >&2
    exit 2
fi

make -j2 all >/dev/null
old=/tmp/mg-before-$(git rev-parse --short "$before")
if [ ! -x "$old/build/bin/mgtrain" ]; then
    git worktree add -f --detach "$old" "$before" >/dev/null 2>&1 || true
    make -C "$old" -j2 all >/dev/null
fi
unset OPENBLAS_CORETYPE

echo "# $(date -u +%Y-%m-%d) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
args=(--model gpt-mini --layers "$layers" --dim "$dim" --heads 4 --batch "$batch"
      --mesh pp=2,dp=2 --micro-batches "$M" --steps "$steps" --eval-every "$steps"
      --eval-windows 8 --quiet)
echo "## gpt ${layers}x${dim}, batch $batch, pp=2 x dp=2, 1F1B M=$M, $steps steps, best of $repeat"

# best tokens/s and the whole-process seconds of that run: run BIN_DIR
run() {
    local bin=$1 b=0 w=0 t s0 s1 out
    for _ in $(seq "$repeat"); do
        s0=$(date +%s.%N)
        out=$("$bin/mgrun" -n 4 "$bin/mgtrain" "${args[@]}")
        s1=$(date +%s.%N)
        t=$(echo "$out" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p' | tail -1)
        if awk -v a="$b" -v c="$t" 'BEGIN { exit !(c > a) }'; then
            b=$t
            w=$(awk -v a="$s0" -v c="$s1" 'BEGIN { printf "%.2f", c - a }')
        fi
    done
    echo "$b $w"
}

read -r tb wb < <(run "$old/build/bin")
read -r ta wa < <(run build/bin)
printf '%-46s %10s %10s\n' build tokens/s "whole s"
printf '%-46s %10.0f %10s\n' "before ($(git rev-parse --short "$before")): average after the step" "$tb" "$wb"
printf '%-46s %10.0f %10s\n' "this tree: average during the last backward" "$ta" "$wa"
awk -v a="$ta" -v b="$tb" 'BEGIN { printf "ratio %.3f\n", a / b }'

tdir=$(mktemp -d)
MG_TRACE="$tdir/t.json" build/bin/mgrun -n 4 build/bin/mgtrain "${args[@]}" 2>&1 |
    sed -n 's/^mgtrain: \([0-9]* buckets.*\)/DDP over the replicas, rank 0: \1/p'
rm -rf "$tdir"
