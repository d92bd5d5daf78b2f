#!/usr/bin/env bash
# scripts/device-check.sh — runs on a lent GPU machine, in the repository
# root of the tree the device tool sent, with .dev/ carried (made here by
# scripts/device-pack.sh). One prepared run: unpack, name the GPU and the
# host, then run
#   1. the GPU tests (mgtest with the filters in $1, default "gpu": every
#      test whose name holds it; "none" skips them);
#   2. bench/gpu.sh --only "$2" (default none), --repeat "$4" (default 2),
#      --before "$5" (an earlier build's bench/gpt, default none);
#   3. bench/gpu_nccl.sh --only "$3" (default none).
# Everything goes to stdout and to $OUT/device.log (the tool brings $OUT
# back). Give the device tool a timeout that leaves room for a rerun.
#   bash scripts/device-check.sh [TESTS] [GPU_SECTIONS] [NCCL_SECTIONS] [REPEAT] [BEFORE]
set -uo pipefail
cd "$(dirname "$0")/.."
tests=${1:-gpu} gpu_only=${2:-} nccl_only=${3:-} repeat=${4:-2} before=${5:-}
log=${OUT:-/tmp}/device.log
exec > >(tee "$log") 2>&1
t0=$(date +%s)
for f in build libs fortunes; do
    [ -f .dev/$f.tar.xz ] && continue
    echo "device-check: .dev/$f.tar.xz missing: run scripts/device-pack.sh first, carry .dev"
    exit 2
done
tar -xJf .dev/build.tar.xz
tar -xJf .dev/libs.tar.xz -C /tmp
mkdir -p /usr/share/games && tar -xJf .dev/fortunes.tar.xz -C /usr/share/games
# NCCL: the system's, else the one PyTorch's wheels bring.
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' \
       2>/dev/null || true)
export LD_LIBRARY_PATH=/tmp/libs${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)"
git log --oneline -1 2>/dev/null || true
echo "unpacked in $(( $(date +%s) - t0 )) s"
rc=0
if [ "$tests" != none ]; then
    MG_BIN=build/bin ./build/tests/mgtest $tests || rc=1
fi
[ -n "$gpu_only" ] && { bash bench/gpu.sh --only "$gpu_only" --repeat "$repeat" \
                          ${before:+--before "$before"} || rc=1; }
[ -n "$nccl_only" ] && { bash bench/gpu_nccl.sh --only "$nccl_only" || rc=1; }
echo "device-check: done in $(( $(date +%s) - t0 )) s, status $rc"
exit $rc
