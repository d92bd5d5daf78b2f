#!/bin/sh
# bench/plan_published.sh — mgplan on the shapes and clusters of published
# training runs (docs/PLANNING.md compares its choices with theirs): the
# recommendation, its reason, and where the published layout ranks among
# the planner's plans with its predicted step time. Simulation only: every
# rate is given as a figure (a GPU's sustained FLOP/s and memory rate, the
# links' bandwidth and latency), nothing is measured.
set -e
cd "$(dirname "$0")/.."
make -s tools >/dev/null
P=build/bin/mgplan
# A100 80 GB, 8 a node over NVLink (250 GB/s, 5 us), 200 Gb/s InfiniBand a GPU.
A100="--flops 150e12 --mem-bw 1.5e12 --intra-bw 250 --intra-latency 5 --inter-bw 200 --inter-latency 5 --memory 80G --optimizer adam"
# V100 32 GB, 8 a node over NVLink (150 GB/s), 100 Gb/s between nodes.
V100="--flops 40e12 --mem-bw 0.8e12 --intra-bw 150 --intra-latency 5 --inter-bw 100 --inter-latency 5 --memory 32G --optimizer adam"
case_() {   # name, published mesh and zero, mgplan flags
    name=$1 mesh=$2 zero=$3; shift 3
    echo "## $name (published: $mesh, zero $zero)"
    $P "$@" --top 1 2>&1 | grep -E "^recommended|because" | sed 's/^/  /'
    $P "$@" --mesh "$mesh" --zero "$zero" --top 1 2>&1 | grep -E "^  1 " |
        awk '{printf "  the published layout at its best: %s, %.0f ms a step, %.0f MB a rank%s\n", $2 " " $4 " M=" $5 " rc=" $7 " sp=" $8, $(NF-6), $(NF-7), $(NF-7) ~ /!/ ? " (does not fit)" : ""}'
}
G="--model gpt-mini"
case_ "Megatron-LM 2021 Table 1, 1.7B on 32 A100" dp=32,pp=1,tp=1 0 $G --layers 24 --dim 2304 --heads 24 --ctx 2048 --vocab 51200 --batch 512 --ranks-per-node 8 --nodes 4 $A100
case_ "Megatron-LM 2021 Table 1, 7.5B on 128 A100" dp=32,pp=1,tp=4 0 $G --layers 36 --dim 4096 --heads 32 --ctx 2048 --vocab 51200 --batch 512 --ranks-per-node 8 --nodes 16 $A100
case_ "Megatron-LM 2021 Table 1, 18.4B on 256 A100" dp=32,pp=1,tp=8 0 $G --layers 40 --dim 6144 --heads 48 --ctx 2048 --vocab 51200 --batch 1024 --ranks-per-node 8 --nodes 32 $A100
case_ "Megatron-LM 2021 Table 1, 39.1B on 512 A100" dp=32,pp=2,tp=8 0 $G --layers 48 --dim 8192 --heads 64 --ctx 2048 --vocab 51200 --batch 1536 --ranks-per-node 8 --nodes 64 $A100
case_ "Megatron-LM GPT-3 175B on 1024 A100" dp=8,pp=16,tp=8 0 $G --layers 96 --dim 12288 --heads 96 --ctx 2048 --vocab 51200 --batch 1536 --ranks-per-node 8 --nodes 128 $A100
case_ "BLOOM 176B on 384 A100 (4x100 Gb/s a node)" dp=8,pp=12,tp=4 1 $G --layers 70 --dim 14336 --heads 112 --ctx 2048 --vocab 250880 --batch 2048 --ranks-per-node 8 --nodes 48 --flops 150e12 --mem-bw 1.5e12 --intra-bw 250 --intra-latency 5 --inter-bw 50 --inter-latency 5 --memory 80G --optimizer adam
case_ "torchtitan Llama-2 7B on 64 A100 (FSDP)" dp=64,pp=1,tp=1 3 $G --layers 32 --dim 4096 --heads 32 --ctx 2048 --vocab 32000 --batch 512 --ranks-per-node 8 --nodes 8 $A100
case_ "DeepSpeed ZeRO tutorial, GPT-2 1.5B on 8 V100" dp=8,pp=1,tp=1 1 $G --layers 48 --dim 1600 --heads 16 --ctx 1024 --vocab 50304 --batch 8 --ranks-per-node 8 --nodes 1 $V100
