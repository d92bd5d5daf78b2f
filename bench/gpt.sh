#!/usr/bin/env bash
# bench/gpt.sh — gpt-mini (models.md D) against PyTorch 1.13 running the same
# model (bench/gpt_torch.py), measured in one run, issue 11's targets:
#   1. one process, one thread, batch 32, context 128: tokens/s (target
#      1.3x PyTorch), multigrad's GFLOP/s and share of the single-thread
#      SGEMM peak, peak memory (target at most 0.25x PyTorch's);
#   2. DDP on 2 ranks (mgrun + mgtrain --parallel ddp) against PyTorch DDP
#      (gloo, 2 processes of one thread): tokens/s (target 1.3x) and against
#      one mgtrain process (target 1.8x);
#   3. quality: --quality-steps (default 2,000) steps with the defaults, the
#      validation loss every 250 steps of both, side by side (target: within
#      0.03 at the last step), and an SVG of both curves (OUT/gpt-quality.svg);
#   4. the bigger shape --layers 12 --dim 768 --heads 12 --ctx 256 (85 M
#      parameters), batch 8, 3 steps in one process: tokens/s and peak memory
#      of both.
#
#   bench/gpt.sh [--repeat N] [--steps N] [--quality-steps N] [--out DIR]
#                [--skip SECTIONS]      (SECTIONS: any of speed,ddp,quality,big)
#
# Speed runs (--steps, default 31; the first step is warm-up) alternate the
# two sides --repeat times (default 2) and take each side's best: the
# machine is shared. The two quality runs go side by side (one core each).
set -euo pipefail
cd "$(dirname "$0")/.."

repeat=2 steps=31 qsteps=2000 out=/tmp/mg-gpt-bench skip=""
while [ $# -gt 0 ]; do
    case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --quality-steps) qsteps="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --skip) skip="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpt.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$repeat" "$steps" "$qsteps"; do
    case "$v" in ''|*[!0-9]*|0) echo "gpt.sh: --repeat, --steps and --quality-steps need positive integers" >&2; exit 2 ;; esac
done
[ "$steps" -ge 2 ] || { echo "gpt.sh: --steps must be at least 2 (the first is warm-up)" >&2; exit 2; }
py=/usr/bin/python3
$py -c 'import torch' 2>/dev/null || { echo "gpt.sh: PyTorch is missing: scripts/install-deps.sh --bench" >&2; exit 2; }
make -j2 all >/dev/null
mkdir -p "$out"
runs() { case ",$skip," in *",$1,"*) return 1 ;; esac; }
# PyTorch with glibc malloc tuned in its favour, as bench/train.sh.
torch() {
    OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184 \
        MALLOC_TOP_PAD_=268435456 $py bench/gpt_torch.py "$@"
}
# Field k of the best (highest tokens/s, field 4) summary line on stdin.
best() { grep '^gpt-mini ' | sort -k4,4nr | head -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
met() { awk -v r="$1" -v t="$2" -v le="${3:-}" 'BEGIN{print (le ? r <= t : r >= t) ? "yes" : "NO"}'; }

mg_info=$(MG_THREADS=1 ./build/bench/gpt --steps 2 --batch 1 --no-eval | grep -E '^# (cpu|gemm|SGEMM)')
echo "# bench/gpt: gpt-mini, $(date -u +%Y-%m-%d), $(nproc) cores,"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' '))"
[ -z "${OPENBLAS_CORETYPE:-}${MG_BLAS_CORE:-}" ] ||
    echo "# environment: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} MG_BLAS_CORE=${MG_BLAS_CORE:-}"
printf '%s\n' "$mg_info"
echo "# torch $($py -c 'import torch; print(torch.__version__)')"

if runs speed; then
    mg_runs="" pt_runs=""
    for ((r = 0; r < repeat; r++)); do
        mg_runs+="$(MG_THREADS=1 ./build/bench/gpt --steps "$steps" --no-eval | grep '^gpt-mini ')"$'\n'
        pt_runs+="$(torch --steps "$steps" --no-eval | grep '^gpt-mini ')"$'\n'
    done
    read -r _ B T _ mg_tps _ mg_loss _ mg_mb mg_gf mg_pct <<<"$(printf '%s' "$mg_runs" | best)"
    read -r _ _ _ _ pt_tps _ pt_loss _ pt_mb <<<"$(printf '%s' "$pt_runs" | best)"
    r=$(ratio "$mg_tps" "$pt_tps") m=$(ratio "$mg_mb" "$pt_mb")
    echo
    echo "## one process, one thread, batch $B, context $T, $steps steps (best of $repeat)"
    echo "| | multigrad | PyTorch | ratio | target | met |"
    echo "|---|---|---|---|---|---|"
    echo "| tokens/s | $mg_tps | $pt_tps | ${r}x | 1.3x | $(met "$r" 1.3) |"
    echo "| peak MB | $mg_mb | $pt_mb | ${m}x | <= 0.25x | $(met "$m" 0.25 1) |"
    echo "| last train loss | $mg_loss | $pt_loss | | | |"
    echo "multigrad: $mg_gf GFLOP/s, $mg_pct% of the SGEMM peak (whole step: attention, LayerNorm, GELU, softmax, optimizer included)"
fi

if runs ddp; then
    mgt() { ./build/bin/mgtrain --model gpt-mini --steps "$steps" --eval-every "$steps" --quiet "$@" |
            sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p'; }
    one="" two="" ptd=""
    for ((r = 0; r < repeat; r++)); do
        one+="$(MG_THREADS=1 mgt)"$'\n'
        two+="$(MG_THREADS=1 ./build/bin/mgrun -n 2 ./build/bin/mgtrain --model gpt-mini --parallel ddp \
                --steps "$steps" --eval-every "$steps" --quiet | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')"$'\n'
        ptd+="$(torch --ddp 2 --steps "$steps" --no-eval | grep '^gpt-mini ' | awk '{print $5}')"$'\n'
    done
    one=$(printf '%s' "$one" | sort -nr | head -1) two=$(printf '%s' "$two" | sort -nr | head -1)
    ptd=$(printf '%s' "$ptd" | sort -nr | head -1)
    r=$(ratio "$two" "$ptd") s=$(ratio "$two" "$one")
    echo
    echo "## DDP, 2 ranks of one thread, global batch 32, $steps steps (best of $repeat)"
    echo "| | tokens/s | ratio | target | met |"
    echo "|---|---|---|---|---|"
    echo "| multigrad DDP 2 ranks | $two | | | |"
    echo "| PyTorch DDP (gloo) 2 ranks | $ptd | ${r}x | 1.3x | $(met "$r" 1.3) |"
    echo "| multigrad 1 rank (mgtrain) | $one | ${s}x | 1.8x | $(met "$s" 1.8) |"
    echo "(mgtrain's tokens/s include the first step; PyTorch's leave it out)"
fi

if runs quality; then
    ev=250
    [ "$qsteps" -ge $ev ] || ev=$qsteps
    MG_THREADS=1 ./build/bin/mgtrain --model gpt-mini --steps "$qsteps" --eval-every $ev --quiet \
        --log "$out/mg-quality.csv" >"$out/mg-quality.out" &
    torch --steps "$qsteps" --eval-every $ev --curve "$out/pt-quality.txt" >"$out/pt-quality.out"
    wait
    awk -F, 'NR > 1 {print $1, $3}' "$out/mg-quality.csv" >"$out/mg-quality.txt"
    ./build/bench/curves "$out/gpt-quality.svg" "gpt-mini validation loss, $qsteps steps (models.md defaults)" \
        multigrad "$out/mg-quality.txt" PyTorch "$out/pt-quality.txt"
    echo
    echo "## quality: validation loss, $qsteps steps with the defaults (batch 32, context 128, AdamW, clip 1)"
    echo "| step | multigrad | PyTorch | difference |"
    echo "|---|---|---|---|"
    join "$out/mg-quality.txt" "$out/pt-quality.txt" |
        awk '{printf "| %d | %.4f | %.4f | %+.4f |\n", $1, $2, $3, $2 - $3}'
    last=$(join "$out/mg-quality.txt" "$out/pt-quality.txt" | tail -1 | awk '{d = $2 - $3; print d < 0 ? -d : d}')
    echo "last step: |difference| $last (target <= 0.03: $(met "$last" 0.03 1)); plot: $out/gpt-quality.svg"
fi

if runs big; then
    big="--layers 12 --dim 768 --heads 12 --ctx 256 --batch 8 --steps 3 --no-eval"
    read -r _ _ _ _ mg_tps _ _ _ mg_mb mg_gf mg_pct <<<"$(MG_THREADS=1 ./build/bench/gpt $big | best)"
    read -r _ _ _ _ pt_tps _ _ _ pt_mb <<<"$(torch $big | best)"
    echo
    echo "## the bigger shape: $big"
    echo "| | multigrad | PyTorch | ratio |"
    echo "|---|---|---|---|"
    echo "| tokens/s | $mg_tps | $pt_tps | $(ratio "$mg_tps" "$pt_tps")x |"
    echo "| peak MB | $mg_mb | $pt_mb | $(ratio "$mg_mb" "$pt_mb")x |"
    echo "multigrad: $mg_gf GFLOP/s, $mg_pct% of the SGEMM peak"
fi
echo
echo "# reproduce: bench/gpt.sh --repeat $repeat --steps $steps --quality-steps $qsteps${skip:+ --skip $skip}"
