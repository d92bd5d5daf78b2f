#!/usr/bin/env bash
# bench/train.sh — one training epoch per zoo model, multigrad (bench/train)
# and PyTorch (bench/train_torch.py) side by side in one run, one thread
# each, data preloaded, each model's models.md defaults. Prints the
# machine (CPU, the GEMM kernels in use, the single-thread SGEMM peak), a
# table of images/s, the ratio and the target ratio of issue 10, the
# GFLOP/s each model reaches and its share of the SGEMM peak, and peak
# memory, then the command that reproduces it.
#
#   bench/train.sh [--repeat N] [--models "mlp lenet-d2l lenet5"] [--data DIR]
#
# With --repeat N each side runs N times per model, alternating, and the
# best epoch of each counts (the machine is shared; the best is the least
# disturbed). PyTorch runs with glibc malloc tuned in its favour (no
# mmap/trim churn for large tensors), as in the issue's measurements.
set -euo pipefail
cd "$(dirname "$0")/.."

repeat=1
models="mlp lenet-d2l lenet5"
data=/usr/share/datasets/fashion-mnist
while [ $# -gt 0 ]; do
    case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$repeat" in ''|*[!0-9]*|0) echo "train.sh: --repeat needs a positive integer" >&2; exit 2 ;; esac

make -j2 all >/dev/null
py=/usr/bin/python3
have_torch=1
$py -c 'import torch' 2>/dev/null || have_torch=0

declare -A target=([mlp]=1.3 [lenet-d2l]=2.2 [lenet5]=2.0)
# Best of the runs: "images/s peakMB batch GFLOP/s %peak".
best() { sort -k3,3nr | head -1 | awk '{print $3, $6, $2, $7, $8}'; }

rows=()
header=""
for m in $models; do
    mg_runs="" pt_runs=""
    for ((r = 0; r < repeat; r++)); do
        out=$(MG_THREADS=1 ./build/bench/train --model "$m" --data "$data")
        [ -n "$header" ] || header=$(printf '%s\n' "$out" | grep -E '^# (cpu|gemm|conv|SGEMM)')
        mg_runs+="$(printf '%s\n' "$out" | grep "^$m ")"$'\n'
        if [ $have_torch = 1 ]; then
            pt_runs+="$(OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=33554432 \
                MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=268435456 \
                $py bench/train_torch.py --model "$m" --data "$data" | grep "^$m ")"$'\n'
        fi
    done
    read -r mg_ips mg_mb batch mg_gf mg_pct <<<"$(printf '%s' "$mg_runs" | grep . | best)"
    if [ $have_torch = 1 ]; then
        read -r pt_ips pt_mb _ <<<"$(printf '%s' "$pt_runs" | grep . | best)"
        ratio=$(awk -v a="$mg_ips" -v b="$pt_ips" 'BEGIN{printf "%.2f", a/b}')
        ok=$(awk -v r="$ratio" -v t="${target[$m]}" 'BEGIN{print (r >= t) ? "yes" : "NO"}')
    else
        pt_ips="n/a" pt_mb="n/a" ratio="n/a" ok="n/a (no torch)"
    fi
    rows+=("$(printf '| %-9s | %5s | %9s | %9s | %5s | %5sx | %-4s | %7s | %5s%% | %6s | %6s |' \
        "$m" "$batch" "$mg_ips" "$pt_ips" "$ratio" "${target[$m]}" "$ok" "$mg_gf" "$mg_pct" \
        "$mg_mb" "$pt_mb")")
done

echo "# bench/train: one epoch of Fashion-MNIST (60,000 images), 1 thread, $(date -u +%Y-%m-%d), $(nproc) cores,"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), best of $repeat run(s) per side"
[ -z "${OPENBLAS_CORETYPE:-}${MG_BLAS_CORE:-}${MG_BLAS_MISDETECT:-}" ] ||
    echo "# environment: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} MG_BLAS_CORE=${MG_BLAS_CORE:-} MG_BLAS_MISDETECT=${MG_BLAS_MISDETECT:-}"
printf '%s\n' "$header"
echo "| model     | batch | multigrad | PyTorch   | ratio | target | met  | GFLOP/s | %peak  | mg MB  | pt MB  |"
echo "|-----------|-------|-----------|-----------|-------|--------|------|---------|--------|--------|--------|"
printf '%s\n' "${rows[@]}"
echo "# images/s; GFLOP/s: multigrad's convolution and linear work per second (mg_model_flops),"
echo "# %peak: its share of the SGEMM peak above; MB = peak RSS of the process (data set included)"
echo "# reproduce: bench/train.sh --repeat $repeat --models \"$models\""
