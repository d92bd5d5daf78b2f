#!/usr/bin/env bash
# bench/tp.sh — tensor parallelism (issue 32) in one run, against PyTorch
# doing Megatron-LM's tensor parallelism by hand (bench/gpt_torch.py --tp,
# custom autograd all-reduces over gloo, as Megatron's mappings) on the
# same machine:
#   1. speed: gpt-mini (4 layers, dim 128, 4 heads, context 128, AdamW,
#      clip 1), global batch --batch (default 32), --steps steps: one
#      process, DDP on 2 ranks, tp=2, tp=2 with sequence parallelism, each
#      of one thread per rank; tokens/s of the steps (best of --repeat,
#      the two sides alternating; mgtrain's include the first step,
#      PyTorch's leave it out) and the whole command's wall time (start-up,
#      data, evaluation at the start and the end included);
#   2. memory per rank (mgtrain --verbose): parameters, gradients and
#      optimizer state at tp = 1, 2, 4, against 1/T of the split tensors
#      plus the whole ones; the activations of a micro-batch and a block's
#      kept bytes per sequence with and without sequence parallelism, and
#      the peak RSS of the process;
#   3. communication per step and rank (mgtrain --verbose): what the tp
#      dimension moved and the time its operations took, beside what the
#      ring algorithms move in theory for the collectives the layers make
#      (4 all-reduces per block; with sequence parallelism 6 all-gathers
#      and 4 reduce-scatters).
#
#   bench/tp.sh [--repeat N] [--steps S] [--batch B] [--skip SECTIONS]
#                                      (SECTIONS: any of speed,memory,comm)
set -euo pipefail
cd "$(dirname "$0")/.."

repeat=3 steps=30 batch=32 skip=""
while [ $# -gt 0 ]; do
    case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --skip) skip="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tp.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$repeat" "$steps" "$batch"; do
    case "$v" in ''|*[!0-9]*|0) echo "tp.sh: --repeat, --steps and --batch need positive integers" >&2; exit 2 ;; esac
done
[ "$steps" -ge 2 ] || { echo "tp.sh: --steps must be at least 2 (the first is warm-up)" >&2; exit 2; }
py=/usr/bin/python3
make -j2 all >/dev/null
bin=build/bin
runs() { case ",$skip," in *",$1,"*) return 1 ;; esac; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
# PyTorch with glibc malloc tuned in its favour, as bench/gpt.sh.
torch() {
    OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184 \
        MALLOC_TOP_PAD_=268435456 $py bench/gpt_torch.py "$@"
}
have_torch=1
$py -c 'import torch' 2>/dev/null || have_torch=0

echo "# bench/tp: $(date -u +%Y-%m-%d), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' '))"
[ "$have_torch" = 1 ] && echo "# torch $($py -c 'import torch; print(torch.__version__)')" ||
    echo "# PyTorch is missing (scripts/install-deps.sh --bench): its column is left empty"

# mgtrain on N ranks (1: one process): "tokens/s wall_seconds"
mg() {
    local n=$1; shift
    local t0 t1 out
    t0=$(date +%s.%N)
    if [ "$n" -gt 1 ]; then
        out=$(MG_THREADS=1 $bin/mgrun -n "$n" $bin/mgtrain --model gpt-mini --batch "$batch" \
              --steps "$steps" --eval-every "$steps" --quiet "$@")
    else
        out=$(MG_THREADS=1 $bin/mgtrain --model gpt-mini --batch "$batch" --steps "$steps" \
              --eval-every "$steps" --quiet "$@")
    fi
    t1=$(date +%s.%N)
    echo "$(sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p' <<<"$out") $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')"
}
# gpt_torch.py: "tokens/s wall_seconds"
pt() {
    local t0 t1 out
    [ "$have_torch" = 1 ] || { echo "- -"; return; }
    t0=$(date +%s.%N)
    out=$(torch --steps "$steps" --batch "$batch" --eval-every "$steps" "$@" | grep '^gpt-mini ')
    t1=$(date +%s.%N)
    echo "$(awk '{print $5}' <<<"$out") $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')"
}
# The best (highest tokens/s) of lines "tokens/s wall" on stdin.
best() { sort -k1,1nr | head -1; }

if runs speed; then
    declare -A M P
    names=("one process" "DDP, 2 ranks" "tp=2" "tp=2, sequence parallel")
    mgargs=("1" "2 --parallel ddp" "2 --mesh tp=2" "2 --mesh tp=2 --sequence-parallel")
    ptargs=("" "--ddp 2" "--tp 2" "--tp 2 --sp")
    for ((r = 0; r < repeat; r++)); do
        for i in "${!names[@]}"; do
            M[$i]+="$(mg ${mgargs[$i]})"$'\n'
            P[$i]+="$(pt ${ptargs[$i]})"$'\n'
        done
    done
    echo
    echo "## speed: gpt-mini, global batch $batch x 128 tokens, $steps steps, one thread per rank (best of $repeat)"
    echo "| run | multigrad tokens/s | PyTorch tokens/s | ratio | multigrad wall s | PyTorch wall s |"
    echo "|---|---|---|---|---|---|"
    for i in "${!names[@]}"; do
        read -r mt mw <<<"$(printf '%s' "${M[$i]}" | best)"
        read -r ptt pw <<<"$(printf '%s' "${P[$i]}" | best)"
        rr=-
        [ "$ptt" != - ] && rr="$(ratio "$mt" "$ptt")x"
        echo "| ${names[$i]} | $mt | $ptt | $rr | $mw | $pw |"
    done
fi

# --verbose's line of rank 0: field after "$2" (e.g. "parameters")
verbose() { local n=$1; shift; MG_THREADS=1 $bin/mgrun -n "$n" $bin/mgtrain --model gpt-mini \
    --batch 8 --steps 3 --eval-every 3 --eval-windows 8 --quiet --verbose "$@" 2>&1 | grep '^mgtrain: rank 0 '; }
field() { sed -n "s/.* $1 \([0-9.]*\).*/\1/p" | head -1; }

if runs memory; then
    echo
    echo "## memory per rank: gpt-mini, micro-batch 8 x 128 (mgtrain --verbose, rank 0)"
    echo "| mesh | parameters MB | 1/T split + whole, MB | gradients MB | optimizer MB | activations MB | a block keeps per sequence, KB | peak RSS MB |"
    echo "|---|---|---|---|---|---|---|---|"
    for spec in "1" "2" "4" "2 sp" "4 sp"; do
        set -- $spec
        T=$1 extra=() name="tp=$T"
        if [ "${2:-}" = sp ]; then extra=(--sequence-parallel); name="tp=$T, sequence parallel"; fi
        if [ "$T" = 1 ]; then v=$(verbose 1 --parallel ddp); else v=$(verbose "$T" --mesh tp="$T" "${extra[@]}"); fi
        plan=$(MG_THREADS=1 $bin/mgrun -n "$T" $bin/mgtrain --model gpt-mini --batch 8 --print-plan \
               $([ "$T" = 1 ] && echo --parallel ddp || echo --mesh tp="$T") "${extra[@]}" 2>&1)
        # 1/T of c_attn, c_fc, both c_proj weights and wte, plus the rest (models.md D, dim 128, 4 layers)
        want=$(awk -v T="$T" 'BEGIN { d=128; L=4; cut = L*(3*d*d+3*d + d*d + 4*d*d+4*d + 4*d*d) + 256*d;
                                      rest = 842496 - cut; printf "%.3f", (cut/T + rest) * 4 / 1e6 }')
        kept=$(awk '$2 == "h.0" { print $(NF - 1) }' <<<"$plan" | head -1)
        echo "| $name | $(field parameters <<<"$v") | $want | $(field gradients <<<"$v") | $(field optimizer <<<"$v") | $(field activations <<<"$v") | ${kept:-?} | $(field RSS <<<"$v") |"
    done
    echo "(parameters and gradients are the arena: the units padded to whole SIMD vectors; the optimizer holds two of it)"
fi

if runs comm; then
    echo
    echo "## communication per step and rank: gpt-mini, batch $batch x 128, tp dimension (rank 0)"
    echo "| mesh | MB sent | in ms | ring algorithms' theory, MB |"
    echo "|---|---|---|---|"
    for spec in "2" "2 sp" "4" "4 sp"; do
        set -- $spec
        T=$1 extra=() name="tp=$T"
        if [ "${2:-}" = sp ]; then extra=(--sequence-parallel); name="tp=$T, sequence parallel"; fi
        line=$(MG_THREADS=1 $bin/mgrun -n "$T" $bin/mgtrain --model gpt-mini --batch "$batch" \
               --steps 5 --eval-every 5 --eval-windows 8 --quiet --verbose --mesh tp="$T" \
               "${extra[@]}" 2>&1 | grep '^mgtrain: rank 0 per step on tp:')
        sent=$(sed -n 's/.*tp: MB sent \([0-9.]*\).*/\1/p' <<<"$line")
        ms=$(sed -n 's/.*tp: MB sent [0-9.]* received [0-9.]* in \([0-9.]*\) ms.*/\1/p' <<<"$line")
        # Of B x 128 x 128 floats (n bytes), a ring all-reduce sends 2(T-1)/T n per rank, an
        # all-gather or reduce-scatter (T-1)/T n. Without sequence parallelism: 4 all-reduces
        # per block (4 blocks) and the embedding's and head's, 18; with it, per block 6
        # all-gathers and 4 reduce-scatters, and 5 for the embedding (1 + 1) and head (1 + 2),
        # 45. The loss's few floats per position are left out.
        theory=$(awk -v T="$T" -v B="$batch" -v sp="${2:-}" 'BEGIN { n = B*128*128*4;
            printf "%.3f", (sp == "sp" ? 45 * (T-1)/T : 18 * 2*(T-1)/T) * n / 1e6 }')
        echo "| $name | $sent | $ms | $theory |"
    done
fi
