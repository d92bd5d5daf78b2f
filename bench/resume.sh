#!/usr/bin/env bash
# bench/resume.sh — what --resume costs: the whole-process peak memory and
# the wall time of a run resumed from a checkpoint against a fresh run of
# the same steps, in one process and under ZeRO-3 on 2 ranks. A checkpoint
# is read where it lies (mg_st_open_on_disk: its header in memory, the
# checksum and values checked in pieces), so a resumed run's peak should
# be a fresh run's; a reader that holds the file adds up to its size.
#
#   bench/resume.sh [--layers L] [--dim D] [--heads H] [--ctx T] [--batch B]
#                   [--bin DIR]     (default: gpt-mini 12 x 768, 12 heads, ctx
#                                    256: the 85M shape, a 1 GB checkpoint)
#
# For each plan: one step saved to a file, then 2 steps fresh and 2 steps
# resumed from it (the resumed run should end where the fresh one does:
# each prints its last line); the peak is the largest rank's peak RSS
# (mgtrain --verbose), the time the whole run's, start-up and evaluation
# (1 window) included.
set -euo pipefail
cd "$(dirname "$0")/.."

layers=12 dim=768 heads=12 ctx=256 batch=2 bin=build/bin
while [ $# -gt 0 ]; do
    case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --dim) dim="$2"; shift 2 ;;
    --heads) heads="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "resume.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$bin" = build/bin ] && make -j2 tools >/dev/null
unset OPENBLAS_CORETYPE
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
g="--model gpt-mini --layers $layers --dim $dim --heads $heads --ctx $ctx --batch $batch
   --eval-windows 1 --no-eval-on-start --verbose"

echo "# $(date -u +%Y-%m-%d) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; gpt $layers x $dim, ctx $ctx, batch $batch"
printf '%-22s %-8s %10s %10s  %s\n' plan run "peak MB" seconds "last line"
# run PLAN NAME ARGS...: one line of the table
run() {
    local plan=$1 name=$2; shift 2
    local launch=() t0 t1 out
    [ "$plan" = zero3 ] && launch=("$bin/mgrun" -n 2)
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    out=$("${launch[@]}" "$bin/mgtrain" $g ${plan_args[$plan]} "$@" 2>&1)
    t1=$(date +%s.%N)
    local peak
    peak=$(echo "$out" | sed -n 's/.*peak RSS \([0-9.]*\) MB.*/\1/p' | sort -n | tail -1)
    [ -n "$peak" ] || peak=$(echo "$out" | sed -n 's/.*peak memory \([0-9.]*\) MB.*/\1/p')
    printf '%-22s %-8s %10.0f %10.1f  %s\n' "$plan" "$name" "$peak" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
        "$(echo "$out" | grep '^final' | cut -c1-48)"
}
declare -A plan_args=([one]="" [zero3]="--mesh dp=2 --zero 3")
for plan in one zero3; do
    ck="$dir/$plan.st"
    run "$plan" save --steps 1 --save "$ck" >/dev/null
    echo "$(printf '%-22s' "$plan") file $(du -m "$ck" | cut -f1) MB"
    run "$plan" fresh --steps 2
    run "$plan" resumed --steps 2 --resume "$ck"
done
