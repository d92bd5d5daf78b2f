#!/usr/bin/env bash
# bench/ckpt_relay.sh — what a job's checkpoint costs when only rank 0 can
# reach its path (issue 30 item 1): the same save and resume with every
# rank writing and reading its part directly (MG_CKPT_RELAY=auto on one
# host: all see the file) and with every part through rank 0
# (MG_CKPT_RELAY=always, as on nodes without a shared filesystem).
#
# For a gpt of --layers/--dim (AdamW: the file holds 3 floats per
# parameter) under ZeRO-3 and under a pipeline, on --ranks ranks: one step
# with a save, then a resume with one more step and a save, each timed as
# a whole process (start-up included), the checkpoint's size, and each
# rank's peak resident memory as mgtrain --verbose reports it (rank 0 keeps
# one 4 MiB piece beyond its model when it relays). The two files are
# compared byte for byte. Whole-process seconds on a loaded 2-core machine
# vary by ~10%: compare the rows' ratio, and run --repeat times.
#
#   bench/ckpt_relay.sh [--ranks N] [--layers L] [--dim D] [--repeat R]
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=2
layers=8
dim=512
repeat=3
while [ $# -gt 0 ]; do
    case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --dim) dim="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    *) echo "usage: $0 [--ranks N] [--layers L] [--dim D] [--repeat R]" >&2; exit 2 ;;
    esac
done
make -s -j"$(nproc)" tools >/dev/null
B=build/bin
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gpt="--model gpt-mini --layers $layers --dim $dim --heads 8 --ctx 64 --batch $((2 * ranks))
     --eval-every 1 --eval-windows 1 --no-eval-on-start --verbose"

cpu() { grep -m1 "^$1" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
echo "# $(date -u +%F) $(cpu 'model name') (family $(cpu 'cpu family') model $(cpu 'model')," \
     "$(nproc) CPUs); $ranks ranks; gpt --layers $layers --dim $dim (AdamW)"
echo "# command: bench/ckpt_relay.sh --ranks $ranks --layers $layers --dim $dim --repeat $repeat"
printf "%-10s %-8s %10s %12s %12s %14s %14s\n" strategy parts "file MB" "save run s" \
       "resume run s" "rank 0 RSS MB" "others RSS MB"

# One timed run: wall seconds; rank peak RSS into $dir/rss.
run() {
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$("$@" 2>&1) || { echo "$out" >&2; exit 1; }
    t1=$(date +%s.%N)
    echo "$out" | sed -n 's/.*rank \([0-9]*\) .*peak RSS \([0-9.]*\) MB.*/\1 \2/p' >"$dir/rss"
    awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}'
}

min() { awk -v a="$1" -v b="$2" 'BEGIN {print (a < b ? a : b)}'; }

for strat in "zero3:--parallel ddp --zero 3" "pp:--mesh pp=$ranks"; do
    name=${strat%%:*}
    flags=${strat#*:}
    for relay in auto always; do
        best_s=1e9 best_r=1e9
        for _ in $(seq "$repeat"); do
            rm -f "$dir/$relay.st" "$dir/$relay.2.st"
            s=$(MG_CKPT_RELAY=$relay run $B/mgrun -n "$ranks" $B/mgtrain $gpt $flags --steps 1 \
                --save "$dir/$relay.st")
            r=$(MG_CKPT_RELAY=$relay run $B/mgrun -n "$ranks" $B/mgtrain $gpt $flags --steps 2 \
                --resume "$dir/$relay.st" --save "$dir/$relay.2.st")
            best_s=$(min "$s" "$best_s")
            best_r=$(min "$r" "$best_r")
        done
        r0=$(awk '$1 == 0 {print $2}' "$dir/rss")
        rest=$(awk '$1 != 0 {printf "%s%s", sep, $2; sep = "/"}' "$dir/rss")
        mb=$(awk -v n="$(stat -c %s "$dir/$relay.st")" 'BEGIN {print n / 1e6}')
        printf "%-10s %-8s %10.1f %12.2f %12.2f %14s %14s\n" "$name" \
               "$([ $relay = auto ] && echo direct || echo 'rank 0')" "$mb" "$best_s" "$best_r" \
               "$r0" "$rest"
    done
    cmp "$dir/auto.st" "$dir/always.st" && cmp "$dir/auto.2.st" "$dir/always.2.st" &&
        echo "# $name: the files through rank 0 equal the direct ones byte for byte"
done
