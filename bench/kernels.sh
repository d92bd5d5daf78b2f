#!/usr/bin/env bash
# bench/kernels.sh — what the GEMM kernel check is worth: one training epoch
# per zoo model (bench/train, one thread) in three settings, interleaved in
# one run:
#   detected    the kernels multigrad selects on this CPU (the default)
#   misdetected OpenBLAS starts on CORE as if it had misdetected the CPU
#               (MG_BLAS_MISDETECT=CORE): the check must fix it
#   unfixed     CORE forced (MG_BLAS_CORE=CORE): what a user of the
#               misdetected BLAS would get without the check
# Target (issue 10): misdetected within 10% of detected.
#
#   bench/kernels.sh [--repeat N] [--core CORE] [--models "mlp lenet-d2l lenet5"] [--data DIR]
#
# Each setting runs N times per model (alternating); the best epoch counts.
set -euo pipefail
cd "$(dirname "$0")/.."

repeat=1
core=Prescott
models="mlp lenet-d2l lenet5"
data=/usr/share/datasets/fashion-mnist
while [ $# -gt 0 ]; do
    case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --core) core="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "kernels.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$repeat" in ''|*[!0-9]*|0) echo "kernels.sh: --repeat needs a positive integer" >&2; exit 2 ;; esac

make -j2 all >/dev/null
unset OPENBLAS_CORETYPE MG_BLAS_CORE MG_BLAS_MISDETECT
ips() { env "$@" MG_THREADS=1 ./build/bench/train --model "$m" --data "$data" 2>/dev/null |
        awk -v m="$m" '$1 == m {print $3}'; }
max() { sort -nr | head -1; }

echo "# bench/kernels: one epoch of Fashion-MNIST per model, 1 thread, $(date -u +%Y-%m-%d), $(nproc) cores,"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), best of $repeat run(s) per setting"
./build/bin/mgrun --version | grep -E '^(cpu|gemm):' | sed 's/^/# detected:    /'
MG_BLAS_MISDETECT=$core ./build/bin/mgrun --version | grep '^gemm:' | sed 's/^/# misdetected: /'
MG_BLAS_CORE=$core ./build/bin/mgrun --version 2>/dev/null | grep '^gemm:' | sed 's/^/# unfixed:     /'
echo "| model     | detected | misdetected ($core) | ratio | target | met | unfixed ($core) | ratio |"
echo "|-----------|----------|-------------|-------|--------|-----|---------|-------|"
for m in $models; do
    d="" x="" u=""
    for ((r = 0; r < repeat; r++)); do
        d+="$(ips)"$'\n'
        x+="$(ips MG_BLAS_MISDETECT="$core")"$'\n'
        u+="$(ips MG_BLAS_CORE="$core")"$'\n'
    done
    d=$(printf '%s' "$d" | max) x=$(printf '%s' "$x" | max) u=$(printf '%s' "$u" | max)
    awk -v m="$m" -v d="$d" -v x="$x" -v u="$u" 'BEGIN {
        r = x / d; printf "| %-9s | %8d | %11d | %5.2f | >= 0.90 | %-3s | %7d | %5.2f |\n",
        m, d, x, r, (r >= 0.9 ? "yes" : "NO"), u, u / d }'
done
echo "# images/s; ratio = setting / detected"
echo "# reproduce: bench/kernels.sh --repeat $repeat --core $core --models \"$models\""
