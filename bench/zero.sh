#!/usr/bin/env bash
# bench/zero.sh — ZeRO's memory, communication and speed (issue 13), in one
# run, against the formulas of the ZeRO paper and against PyTorch 1.13.
#
# 1. Memory and traffic: gpt with 12 layers, dim 768, 12 heads (85 M
#    parameters, Ψ), context 256, AdamW, on 1, 2 and 4 ranks under DDP and
#    ZeRO stages 1-3 (bench/zero.c, one line per rank). For each: the model
#    state a rank keeps between steps (parameters + gradients + optimizer
#    state, counted) against the paper's 16Ψ, 4Ψ+4Ψ+8Ψ/N, 4Ψ+12Ψ/N and
#    16Ψ/N bytes; the peak during a step (buckets gathered or reduced in
#    flight included) and the peak resident memory measured by the kernel;
#    bytes sent per step and rank against 2Ψ(N-1)/N·4 (DDP, stages 1-2)
#    and 1.5 times that (stage 3).
# 2. Against PyTorch, the issue's configuration: context 128, global batch
#    2, 2 ranks: PyTorch DDP and DDP + ZeroRedundancyOptimizer (its ZeRO-1)
#    over gloo (bench/gpt_torch.py --mem) beside multigrad's DDP and ZeRO-1-3:
#    peak RSS per rank and tokens/s.
# 3. Offload (--offload disk:DIR) on the 85 M shape, context 256, 2 and 4
#    ranks, stages 1-3: the peak resident memory of the training steps
#    (after set-up: the model is created whole on every rank first)
#    against the issue's bound, the parameters' shard + the largest bucket
#    (one unit in flight) + the activations, and tokens/s against the
#    same stage in memory; "lean" is stage 3 with MG_ZERO_OVERLAP=0 (one
#    bucket of parameters and one of gradients in flight).
# 4. Speed on gpt-mini (4 layers, dim 128, batch 32, context 128), 2 ranks:
#    DDP and stages 1-3, and stages 1 and 3 offloaded, best tokens/s of
#    --repeat runs.
# 5. No rank holds the whole model (issue 31): the 85 M shape, context 128,
#    global batch 4, made without values so that each rank draws only its
#    part: the whole-process peak resident memory per rank (set-up
#    included; the set-up's own peak beside it) of each stage of pp=2,
#    ZeRO-3 on 2 ranks and ZeRO-3 with disk offload on 4, against one
#    process's, with the issue's bounds (58%, 60%, 25%).
#
#   bench/zero.sh [--repeat N] [--steps S] [--skip-big] [--offload-dir DIR]
#                 [--only-setup]
set -euo pipefail
cd "$(dirname "$0")/.."

repeat=3
steps=5
big=1
only_setup=0
odir=${TMPDIR:-/tmp}/mg-zero-offload
while [ $# -gt 0 ]; do
    case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --skip-big) big=0; shift ;;
    --offload-dir) odir="$2"; shift 2 ;;
    --only-setup) only_setup=1; shift ;;
    -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "zero.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

make -j2 all benches >/dev/null
mkdir -p "$odir"
bin=build/bin
z=build/bench/zero
py=/usr/bin/python3
export -n OPENBLAS_CORETYPE 2>/dev/null || true
unset OPENBLAS_CORETYPE
have_torch=1
$py -c 'import torch' 2>/dev/null || have_torch=0

echo "# $(date -u +%Y-%m-%d) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"

# run N STAGE ARGS...: the ranks' lines of bench/zero
run() {
    local n=$1 st=$2
    shift 2
    if [ "$n" = 1 ]; then $z --stage 0 "$@"
    else $bin/mgrun -n "$n" $z --stage "$st" "$@"; fi
}
# field NAME LINE
field() { echo "$2" | tr ' ' '\n' | awk -v k="$1" 'p {print; exit} $0 == k {p = 1}'; }
# the largest value of field NAME over the ranks' lines
maxf() { echo "$2" | while read -r l; do field "$1" "$l"; done | sort -g | tail -1; }

# 5. every rank builds only its part
setup_peaks() {
    echo
    echo "## no rank holds the whole model: L=12 d=768 h=12 T=128, global batch 4, AdamW, peak RSS per rank"
    printf '%-16s %5s %10s %10s %10s %9s %7s\n' config ranks setup_MB steps_MB peak_MB vs_one bound
    local one=0 cfg n args out
    for cfg in "single 1" "pp=2 2 --mesh pp=2" "zero3 2 --stage 3" "zero3 4 --stage 3" \
               "zero3+disk 4 --stage 3 --offload $odir"; do
        set -- $cfg
        name=$1 n=$2
        shift 2
        st=0
        [ "${1:-}" = --stage ] && st=$2
        out=$(run $n $st --layers 12 --dim 768 --heads 12 --ctx 128 --batch 4 --steps 3 "$@")
        peak=$(maxf peak_rss_mb "$out")
        [ $n = 1 ] && one=$peak
        bound=-
        case "$name $n" in "pp=2 2") bound=0.58 ;; "zero3 2") bound=0.60 ;;
            "zero3+disk 4") bound=0.25 ;; esac
        printf '%-16s %5d %10.1f %10.1f %10.1f %9.3f %7s\n' "$name" $n \
            "$(maxf setup_peak_rss_mb "$out")" "$(maxf steps_peak_rss_mb "$out")" "$peak" \
            "$(awk -v a="$peak" -v b="$one" 'BEGIN {print a / b}')" "$bound"
    done
}
if [ $only_setup = 1 ]; then
    setup_peaks
    exit 0
fi

if [ $big = 1 ]; then
    echo
    echo "## memory and traffic per rank: L=12 d=768 h=12 T=256, batch = ranks, AdamW"
    printf '%-6s %5s %10s %10s %7s %10s %10s %10s %12s %10s %7s\n' config ranks state_MB \
        formula_MB ratio peak_MB rss_MB sent_MB formula_MB ratio tok/s
    for n in 1 2 4; do
        for st in 0 1 2 3; do
            [ $n = 1 ] && [ $st != 0 ] && continue
            out=$(run $n $st --layers 12 --dim 768 --heads 12 --ctx 256 --batch $n --steps "$steps")
            l0=$(echo "$out" | grep '^zero rank 0')
            P=$(field params "$l0")
            state=$(echo "$l0" | awk '{for (i = 1; i < NF; i++) v[$i] = $(i + 1);
                print v["state_params_mb"] + v["state_grads_mb"] + v["state_optim_mb"]}')
            peak=$(echo "$l0" | awk '{for (i = 1; i < NF; i++) v[$i] = $(i + 1);
                print v["peak_params_mb"] + v["peak_grads_mb"] + v["state_optim_mb"]}')
            # The paper's bytes per rank with Adam in fp32 (Ψ = the parameters).
            form=$(awk -v p="$P" -v n=$n -v s=$st 'BEGIN {
                f = s == 0 ? 16 * p : s == 1 ? 8 * p + 8 * p / n : s == 2 ? 4 * p + 12 * p / n : 16 * p / n
                printf "%.1f", f / 1e6 }')
            comm=$(awk -v p="$P" -v n=$n -v s=$st 'BEGIN {
                v = 2 * p * (n - 1) / n * 4; if (s == 3) v *= 1.5; printf "%.1f", v / 1e6 }')
            sent=$(maxf sent_mb_step "$out")
            name=$([ $st = 0 ] && { [ $n = 1 ] && echo single || echo ddp; } || echo "zero$st")
            printf '%-6s %5d %10.1f %10.1f %7.3f %10.1f %10.1f %10.1f %12.1f %10s %7.1f\n' \
                "$name" $n "$state" "$form" "$(awk -v a="$state" -v b="$form" 'BEGIN {print a / b}')" \
                "$peak" "$(maxf peak_rss_mb "$out")" "$sent" "$comm" \
                "$(awk -v a="$sent" -v b="$comm" 'BEGIN {if (b > 0) printf "%.3f", a / b; else print "-"}')" \
                "$(field tok_s "$l0")"
        done
    done

    echo
    echo "## against PyTorch 1.13 (gloo): L=12 d=768 h=12 T=128, global batch 2, 2 ranks"
    printf '%-22s %12s %8s\n' config peak_rss_MB tok/s
    for st in 0 1 2 3; do
        out=$(run 2 $st --layers 12 --dim 768 --heads 12 --ctx 128 --batch 2 --steps "$steps")
        name=$([ $st = 0 ] && echo "multigrad ddp" || echo "multigrad zero$st")
        printf '%-22s %12.1f %8.1f\n' "$name" "$(maxf peak_rss_mb "$out")" \
            "$(field tok_s "$(echo "$out" | grep '^zero rank 0')")"
    done
    if [ $have_torch = 1 ]; then
        for mode in "" --zero1; do
            line=$($py bench/gpt_torch.py --layers 12 --dim 768 --heads 12 --ctx 128 --batch 2 \
                --ddp 2 --no-eval --steps "$steps" --mem $mode | grep '^zero-peer')
            printf '%-22s %12.1f %8.1f\n' "pytorch $(field mode "$line")" \
                "$(field peak_rss_mb_max "$line")" "$(field tokens_per_s "$line")"
        done
    else
        echo "# PyTorch not found: run scripts/install-deps.sh --bench for the peer rows"
    fi
fi

if [ $big = 1 ]; then
    echo
    echo "## offload to $odir ($(df -h "$odir" | awk 'NR == 2 {print $1}')): L=12 d=768 h=12 T=256, batch = ranks, peak RSS of the steps"
    printf '%-15s %5s %10s %10s %7s %10s %10s %9s %9s %7s\n' config ranks rss_MB bound_MB ratio \
        state_MB setup_MB tok/s in_mem vs_mem
    for n in 2 4; do
        for cfg in 1 2 3 3l; do
            st=${cfg%l}
            lean=1
            [ "$cfg" != "$st" ] && lean=0
            mem=$(run $n $st --layers 12 --dim 768 --heads 12 --ctx 256 --batch $n --steps "$steps" |
                grep '^zero rank 0')
            out=$(export MG_ZERO_OVERLAP=$lean; run $n $st --layers 12 --dim 768 --heads 12 --ctx 256 \
                --batch $n --steps "$steps" --offload "$odir")
            l0=$(echo "$out" | grep '^zero rank 0')
            P=$(field params "$l0")
            bound=$(awk -v p="$P" -v n=$n -v u="$(field largest_bucket_mb "$l0")" \
                -v a="$(field activations_mb "$l0")" 'BEGIN {printf "%.1f", 4 * p / n / 1e6 + u + a}')
            rss=$(maxf steps_peak_rss_mb "$out")
            state=$(echo "$l0" | awk '{for (i = 1; i < NF; i++) v[$i] = $(i + 1);
                print v["state_params_mb"] + v["state_grads_mb"] + v["state_optim_mb"]}')
            name="zero$st+disk"
            [ $lean = 0 ] && name="$name lean"
            printf '%-15s %5d %10.1f %10.1f %7.3f %10.1f %10.1f %9.1f %9.1f %7.3f\n' "$name" $n \
                "$rss" "$bound" "$(awk -v a="$rss" -v b="$bound" 'BEGIN {print a / b}')" "$state" \
                "$(maxf peak_rss_mb "$out")" "$(field tok_s "$l0")" "$(field tok_s "$mem")" \
                "$(awk -v a="$(field tok_s "$l0")" -v b="$(field tok_s "$mem")" 'BEGIN {print a / b}')"
        done
    done
fi

echo
echo "## speed: gpt-mini (L=4 d=128 h=4 T=128), batch 32, 2 ranks, best of $repeat"
printf '%-12s %8s %8s\n' config tok/s vs_ddp
ddp=0
for cfg in 0 1 2 3 1d 3d; do
    st=${cfg%d}
    extra=()
    [ "$cfg" != "$st" ] && extra=(--offload "$odir")
    best=0
    for i in $(seq "$repeat"); do
        t=$(run 2 $st --layers 4 --dim 128 --heads 4 --ctx 128 --batch 32 --steps 12 "${extra[@]}" |
            grep '^zero rank 0' | tr ' ' '\n' | awk 'p {print; exit} $0 == "tok_s" {p = 1}')
        best=$(awk -v a="$best" -v b="$t" 'BEGIN {print (b > a ? b : a)}')
    done
    [ $st = 0 ] && ddp=$best
    name=$([ $st = 0 ] && echo ddp || echo "zero$st")
    [ "$cfg" != "$st" ] && name="$name+disk"
    printf '%-12s %8.0f %8.3f\n' "$name" "$best" "$(awk -v a="$best" -v b="$ddp" 'BEGIN {print a / b}')"
done

[ $big = 1 ] && setup_peaks
