#!/usr/bin/env bash
# bench/pipeline.sh — pipeline parallelism (issue 14) in one run: the
# bubble against theory, the activation memory of each schedule, and
# gpt-mini's speed on a 2-stage pipeline against one process and DDP.
#
# 1. Bubble and memory (bench/pipeline.c): gpt of 8 layers, dim 128,
#    context 128, micro-batches of 4 sequences, on P = 2 and P = 4 stages
#    (one rank each; P = 4 runs oversubscribed on a 2-core machine: it is
#    reported, with no target), every schedule, M = 1, 2, 4, 8, 16. For
#    each: the theory's idle fraction ((P-1)/P for naive, (P-1)/(M+P-1)
#    for GPipe and 1F1B, (P-1)/(V·M+P-1) for interleaved with V = 2), the
#    idle fraction each stage lived (1 - its forward and backward time /
#    the step's pipeline time, until every stage finished) and their mean,
#    and the most micro-batches each stage held with their activation
#    memory (tapes and inputs): GPipe's grows with M, 1F1B's stays at P - r.
#    Then P = 2 with M = 3, 5, 7 (not multiples of P): interleaved in
#    groups as even as can be against 1F1B at the same M and naive (one
#    micro-batch at a time: the bubble, (P-1)/P, such an interleaved step
#    had before, when it ran naive's order over the chunks).
# 2. Speed: gpt-mini (4 layers, dim 128, context 128, batch 32, AdamW)
#    through mgtrain: one process (1 thread, and 2 threads), DDP on 2
#    ranks, and pipelines of 2 stages with M = 4, 8, 16 (1F1B) and M = 8
#    (GPipe, interleaved). Best tokens/s of --repeat runs of --steps steps.
# 3. From the trace: mgtrain gpt-mini on pp=2, 1F1B, M=8 with MG_TRACE; each
#    stage's busy and idle time summed from its trace events (its "stage s
#    F/B mb m" spans within its "pipeline step" spans), beside the share
#    mgtrain --verbose prints from the same run.
#
#   bench/pipeline.sh [--repeat N] [--steps S] [--skip-bubble] [--skip-speed]
set -euo pipefail
cd "$(dirname "$0")/.."

repeat=3
steps=40
bubble=1
speed=1
while [ $# -gt 0 ]; do
    case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --skip-bubble) bubble=0; shift ;;
    --skip-speed) speed=0; shift ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "pipeline.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

make -j2 all benches >/dev/null
bin=build/bin
unset OPENBLAS_CORETYPE

echo "# $(date -u +%Y-%m-%d) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"

if [ "$bubble" = 1 ]; then
    for P in 2 4; do
        echo
        echo "## bubble and activation memory, P=$P (gpt 8x128, micro-batches of 4 x 128 tokens)"
        printf '%-12s %3s %2s %8s %8s %6s  %-24s %-12s %s\n' schedule M V theory measured diff \
            "idle per stage" "in flight" "activations MB per stage"
        $bin/mgrun -n "$P" build/bench/pipeline --steps 4 | awk '
            $1 == "pipeline" {
                for (i = 2; i < NF; i += 2) v[$i] = $(i + 1)
                d = 100 * (v["idle_mean"] - v["idle_theory"])
                printf "%-12s %3d %2d %7.1f%% %7.1f%% %+5.1f  %-24s %-12s %s\n", v["schedule"],
                    v["M"], v["V"], 100 * v["idle_theory"], 100 * v["idle_mean"], d,
                    v["idle_ranks"], v["peak_in_flight"], v["activations_mb"]
            }'
    done
    echo
    echo "## M not a multiple of P, P=2 (gpt 8x128, micro-batches of 4 x 128 tokens)"
    printf '%-12s %3s %2s %8s %8s %6s  %-24s %-12s %-24s %s\n' schedule M V theory measured \
        diff "idle per stage" "in flight" "activations MB per stage" tokens/s
    $bin/mgrun -n 2 build/bench/pipeline --schedules interleaved,1f1b,naive \
        --micro-batches 3,5,7 --steps 6 | awk '
        $1 == "pipeline" {
            for (i = 2; i < NF; i += 2) v[$i] = $(i + 1)
            d = 100 * (v["idle_mean"] - v["idle_theory"])
            printf "%-12s %3d %2d %7.1f%% %7.1f%% %+5.1f  %-24s %-12s %-24s %.0f\n",
                v["schedule"], v["M"], v["V"], 100 * v["idle_theory"], 100 * v["idle_mean"], d,
                v["idle_ranks"], v["peak_in_flight"], v["activations_mb"], v["tok_s"]
        }'
fi

# best TOKENS-PER-SECOND of $repeat runs of: mgtrain ARGS (with mgrun -n N when N > 1)
best() {
    local n=$1; shift
    local b=0 t
    for _ in $(seq "$repeat"); do
        if [ "$n" -gt 1 ]; then
            t=$($bin/mgrun -n "$n" $bin/mgtrain --model gpt-mini --steps "$steps" \
                --eval-every "$steps" --quiet "$@" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
        else
            t=$($bin/mgtrain --model gpt-mini --steps "$steps" --eval-every "$steps" --quiet \
                "$@" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
        fi
        b=$(awk -v a="$b" -v c="$t" 'BEGIN { print (c > a ? c : a) }')
    done
    echo "$b"
}

if [ "$speed" = 1 ]; then
    echo
    echo "## speed: gpt-mini, batch 32 x 128 tokens, $steps steps, best of $repeat"
    one=$(best 1 --batch 32)
    one2=$(best 1 --batch 32 --threads 2)
    ddp=$(best 2 --batch 32 --parallel ddp)
    printf '%-44s %10s %8s\n' run tokens/s "x one"
    row() { printf '%-44s %10.0f %7.2fx\n' "$1" "$2" "$(awk -v a="$2" -v b="$one" 'BEGIN { print a / b }')"; }
    row "one process, 1 thread" "$one"
    row "one process, 2 threads" "$one2"
    row "DDP, 2 ranks" "$ddp"
    for s in "1f1b 4" "1f1b 8" "1f1b 16" "gpipe 8" "interleaved 8"; do
        set -- $s
        t=$(best 2 --batch 32 --mesh pp=2 --pp-schedule "$1" --micro-batches "$2")
        row "pipeline pp=2, $1, M=$2" "$t"
    done
fi

echo
echo "## from the trace: gpt-mini pp=2 1f1b M=8, $steps steps"
tdir=$(mktemp -d)
MG_TRACE="$tdir/t.json" $bin/mgrun -n 2 $bin/mgtrain --model gpt-mini --batch 32 --mesh pp=2 \
    --micro-batches 8 --steps "$steps" --eval-every "$steps" --quiet --verbose 2>&1 |
    sed -n 's/^mgtrain: \(rank [0-9]* pipeline: .*\)/--verbose: \1/p'
python3 - "$tdir" <<'PY'
import json, sys
for r in (0, 1):
    d = json.load(open(f"{sys.argv[1]}/t.rank{r}.json"))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "pp step"]
    work = [(e["ts"], e["ts"] + e["dur"]) for e in ev
            if e.get("cat") in ("pp forward", "pp backward")]
    span = sum(b - a for a, b in steps)
    busy = sum(max(0, min(b, t) - max(a, s)) for a, b in work for s, t in steps)
    print(f"trace:     rank {r}: {len(steps)} steps, busy {100 * busy / span:.1f}% of "
          f"{span / len(steps) / 1e3:.1f} ms per step (idle {100 * (1 - busy / span):.1f}%)")
PY
rm -rf "$tdir"
