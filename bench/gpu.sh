#!/usr/bin/env bash
# bench/gpu.sh — GPU training (issue 15) against PyTorch in one run, on a
# machine with an NVIDIA GPU, a CUDA build of multigrad (make finds the
# toolkit) and PyTorch with CUDA:
#
# 1. gpt-mini (4 layers, dim 128, context 128, batch 32) and the 85M shape
#    (12 layers, dim 768, 12 heads, context 256, batch 16) trained with
#    models.md's AdamW and clipping, float32 with TF32 off, by
#    `bench/gpt --device cuda` (which also prints the GPU's measured SGEMM
#    peak and the model's achieved TFLOP/s against it) and by
#    bench/gpu_gpt_torch.py (eager; attention written out, and through
#    F.scaled_dot_product_attention). Tokens/s of the steps after the
#    first; --repeat runs of each, alternating. Then both shapes with
#    bfloat16 GEMMs (`bench/gpt --bf16`) against PyTorch's bfloat16
#    autocast (`gpu_gpt_torch.py --bf16`, both attentions). Sections
#    bf16big and f32big: the 85M shape alone, bfloat16 against autocast
#    and float32 against eager, both with SDPA (issue 36's targets),
#    alternating, with --before's build beside this one; bf16gemm: the
#    85M shape in bfloat16 with MG_ATTENTION=gemm (attention as batched
#    GEMMs, auto's choice before the tensor-core kernels) against
#    autocast. Section profile:
#    one 85M run under MG_DK_PROFILE=1 in each precision (the "bf16
#    rounding" rows: the GPU time spent rounding GEMM operands).
# 2. The image models (mlp, lenet-d2l, lenet5), one epoch of Fashion-MNIST
#    each with models.md's defaults: `bench/train --device cuda` against
#    `bench/train_torch.py --device cuda` (batches gathered on the host and
#    copied in on both sides).
# 3. mgtrain gpt-mini on the GPU: one process, DDP on 2 ranks sharing the
#    GPU (their buckets reduced through the host), ZeRO-3, ZeRO-2 with
#    --offload cpu and a 2-stage pipeline on the same 2 ranks, a parameter
#    server on 3 (synchronous, and fully asynchronous with each push
#    clipped), and --bf16.
# 4. mgbench all_reduce and all_gather on 2 ranks with the buffers on the
#    GPU (staged through the host) beside the same in host memory.
# 5. Attention alone (issue 36): `bench/attention` with the fused kernel
#    and with the batched GEMMs against bench/attention_torch.py (SDPA),
#    4096 tokens of 12 heads of 64 at T = 256, 1024 and 4096, float32 and
#    bfloat16 (section attention16: bfloat16 alone).
#
# 6. bench/gpu_nccl.sh: collectives and DDP through NCCL.
#
#   bench/gpu.sh [--repeat N] [--bin DIR] [--data DIR] [--only LIST] [--before GPT]
#     --bin DIR holds gpt, train, attention, mgtrain and mgrun (default
#     build/bench and build/bin); --data is the Fashion-MNIST directory
#     (default /usr/share/datasets/fashion-mnist); --only runs the sections
#     named in LIST (comma-separated: gpt, bf16, bf16big, f32big, bf16gemm,
#     profile, images, mgtrain, mgbench, attention, attention16, nccl), for a GPU lent for
#     minutes; --before is bench/gpt of an earlier build (made in a
#     worktree) that bf16big and f32big run too
set -uo pipefail
cd "$(dirname "$0")/.."

repeat=2
bench=build/bench
tools=build/bin
data=/usr/share/datasets/fashion-mnist
only=gpt,bf16,bf16big,f32big,bf16gemm,profile,images,mgtrain,mgbench,attention,nccl
before=
while [ $# -gt 0 ]; do
    case "$1" in
    --repeat) repeat=$2; shift 2 ;;
    --bin) bench=$2; tools=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    *) echo "usage: bench/gpu.sh [--repeat N] [--bin DIR] [--data DIR] [--only LIST]" \
            "[--before GPT]" >&2
       exit 2 ;;
    esac
done
want() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv || exit 1
lscpu | grep "Model name"
big="--layers 12 --dim 768 --heads 12 --ctx 256 --batch 16 --steps 20"
want gpt && for r in $(seq "$repeat"); do
    echo "== run $r: gpt-mini, multigrad"; "$bench/gpt" --device cuda --steps 50 --no-eval | grep -v -E "^# (cpu|gemm|conv|threads):"
    for a in manual sdpa; do
        echo "== run $r: gpt-mini, torch ($a)"; python3 bench/gpu_gpt_torch.py --steps 50 --attn $a | tail -1
    done
    echo "== run $r: 85M, multigrad"; "$bench/gpt" --device cuda $big --no-eval | tail -1
    for a in manual sdpa; do
        echo "== run $r: 85M, torch ($a)"; python3 bench/gpu_gpt_torch.py $big --attn $a | tail -1
    done
done
want bf16 && for r in $(seq "$repeat"); do
    for shape in "--steps 50" "$big"; do
        echo "== run $r: bf16 $shape, multigrad"
        "$bench/gpt" --device cuda --bf16 $shape --no-eval | grep -E "^# device|^gpt-mini"
        for a in manual sdpa; do
            echo "== run $r: bf16 $shape, torch autocast ($a)"
            python3 bench/gpu_gpt_torch.py $shape --attn $a --bf16 | tail -1
        done
    done
done
# The 85M shape in one precision ("--bf16" or ""): this build, --before's,
# PyTorch with SDPA, repeat times in turn.
big_runs() {
    local p=$1 name=${1:+bf16}
    for r in $(seq "$repeat"); do
        echo "== run $r: ${name:-float32} 85M, multigrad"
        "$bench/gpt" --device cuda $p $big --no-eval | grep -E "^# device|^gpt-mini"
        if [ -n "$before" ]; then
            echo "== run $r: ${name:-float32} 85M, multigrad before ($before)"
            "$before" --device cuda $p $big --no-eval | grep -E "^gpt-mini"
        fi
        echo "== run $r: ${name:-float32} 85M, torch ${name:+autocast }(sdpa)"
        python3 bench/gpu_gpt_torch.py $big --attn sdpa $p | tail -1
    done
}
want bf16big && big_runs --bf16
want f32big && big_runs ""
want bf16gemm && (echo "== MG_ATTENTION=gemm"; export MG_ATTENTION=gemm; big_runs --bf16)
want profile && for p in --bf16 ""; do
    echo "== ${p:-float32} 85M, multigrad, MG_DK_PROFILE=1"
    MG_DK_PROFILE=1 "$bench/gpt" --device cuda $p $big --no-eval 2>&1 | grep -E "^# (device|  )"
done
want images && for r in $(seq "$repeat"); do
    echo "== run $r: image models, multigrad"
    "$bench/train" --device cuda --data "$data" | grep -v -E "^# (cpu|gemm|conv|threads):"
    echo "== run $r: image models, torch"; python3 bench/train_torch.py --device cuda --data "$data"
done
if want mgtrain; then
    g="--model gpt-mini --steps 200 --eval-every 200"
    echo "== mgtrain gpt-mini, one process"; "$tools/mgtrain" $g --device cuda | tail -1
    echo "== mgtrain gpt-mini, DDP on 2 ranks sharing the GPU"
    "$tools/mgrun" -n 2 "$tools/mgtrain" $g --device cuda --parallel ddp | tail -1
    echo "== mgtrain gpt-mini, ZeRO-3 on 2 ranks sharing the GPU"
    "$tools/mgrun" -n 2 "$tools/mgtrain" $g --device cuda --parallel ddp --zero 3 | tail -1
    echo "== mgtrain gpt-mini, ZeRO-2 on 2 ranks sharing the GPU, the optimizer on the host"
    "$tools/mgrun" -n 2 "$tools/mgtrain" $g --device cuda --parallel ddp --zero 2 --offload cpu | tail -1
    echo "== mgtrain gpt-mini, a pipeline of 2 stages sharing the GPU"
    "$tools/mgrun" -n 2 "$tools/mgtrain" $g --device cuda --mesh pp=2 | tail -1
    echo "== mgtrain gpt-mini, a parameter server (2 workers, 1 server) sharing the GPU"
    "$tools/mgrun" -n 3 "$tools/mgtrain" $g --device cuda --parallel ps | tail -1
    echo "== mgtrain gpt-mini, the same fully asynchronous, each push clipped"
    "$tools/mgrun" -n 3 "$tools/mgtrain" $g --device cuda --parallel ps --staleness inf \
        --clip-grad 1 | tail -1
    echo "== mgtrain gpt-mini, one process, --bf16"; "$tools/mgtrain" $g --device cuda --bf16 | tail -1
fi
want mgbench && for where in "--device cuda" ""; do
    echo "== mgbench, buffers ${where:-in host memory}"
    "$tools/mgbench" -n 2 all_reduce all_gather -b 1M -e 256M -f 4 -i 10 $where | grep -v "^#  "
done
{ want attention || want attention16; } && for T in 256 1024 4096; do
    for p in "" "--bf16"; do
        [ -z "$p" ] && ! want attention && continue
        echo "== attention alone, T $T ${p:-float32}: fused, gemm, torch sdpa"
        "$bench/attention" --T "$T" --batch $((4096 / T)) $p
        "$bench/attention" --T "$T" --batch $((4096 / T)) $p --gemm
        python3 bench/attention_torch.py --T "$T" --batch $((4096 / T)) $p
    done
done
# (the last line: a section not asked for is no failure)
if want nccl; then bash bench/gpu_nccl.sh --bin "$tools" --data "$data"; fi
