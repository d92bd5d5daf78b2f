#!/bin/bash
# How long a job of two nodes (two mgruns --nnodes 2 on this host, as on
# two hosts) takes to end when something goes wrong on one node: the
# seconds from the start until the last mgrun exits, for this build's
# mgrun and, beside it, another build's (e.g. one from before the nodes'
# board, tools/mgrun_board.h), each capped at CAP seconds.
#
#   bench/nodes.sh [BIN] [OTHER_BIN]     (default build/bin; no other)
#
# Cases (workers: mgtrain --model mlp under --parallel ddp or ps):
#   stopped    node 1's worker is stopped (SIGSTOP) 4 s in; node 0's names it
#              after MG_PEER_TIMEOUT and fails
#   shape      node 1 started with -n 1, node 0 with -n 2
#   rank       --nnodes 3: node 0, node 1, and a second node 1
#   restart    rank 3 exits 7 on the first attempt, --max-restarts 1
#   mistake    --parallel ps --batch 128 on 4 ranks (3 workers: refused by
#              every rank)
# MG_PEER_TIMEOUT=5, MG_TIMEOUT=$CAP (its default, 300 s, is what a user
# waits without one). Prints one row per case and build.
set -u
BIN=${1:-build/bin}
OTHER=${2:-}
CAP=${CAP:-60}
export MG_PEER_TIMEOUT=5 MG_TIMEOUT=$CAP MG_JOB_SECRET=0123456789abcdef0123456789abcdef
unset OPENBLAS_CORETYPE
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# run BIN CASE: the seconds until every mgrun of the case has exited.
run() {
    local bin=$1 case=$2 port=$((20000 + RANDOM % 20000)) pids=() t0 n0=2 n1=2 nn=2
    local train="$bin/mgtrain --model mlp --parallel ddp --epochs 30 --quiet"
    local cmd=$train extra=""
    case $case in
        stopped) n0=1 n1=1 ;;
        shape) n1=1 ;;
        rank) nn=3 n0=1 n1=1 ;;
        restart) cmd="sh -c 'if [ \$RANK = 3 ] && [ \$MG_RESTART_COUNT = 0 ]; then exit 7; fi; \
exec $bin/mgtrain --model mlp --parallel ddp --epochs 1 --quiet'"; extra="--max-restarts 1" ;;
        mistake) cmd="$bin/mgtrain --model mlp --parallel ps --batch 128 --epochs 1" ;;
    esac
    t0=$(date +%s.%N)
    eval "timeout $CAP $bin/mgrun --nnodes $nn --node-rank 0 --master-port $port -n $n0 $extra \
        $cmd" > "$dir/n0" 2>&1 &
    pids+=($!)
    eval "timeout $CAP $bin/mgrun --nnodes $nn --node-rank 1 --master-port $port -n $n1 $extra \
        $cmd" > "$dir/n1" 2>&1 &
    pids+=($!)
    if [ "$case" = rank ]; then
        sleep 1
        eval "timeout $CAP $bin/mgrun --nnodes 3 --node-rank 1 --master-port $port -n 1 $cmd" \
            > "$dir/n2" 2>&1 &
        pids+=($!)
    fi
    if [ "$case" = stopped ]; then   # node 1's worker (rank 1)
        sleep 4
        kill -STOP "$(pgrep -f -x "$train" | while read -r p; do
            grep -qz '^RANK=1$' /proc/"$p"/environ && echo "$p"; done)"
    fi
    for p in "${pids[@]}"; do wait "$p"; done
    pkill -KILL -f "mgtrain --model mlp --parallel" 2>/dev/null
    awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f\n", a - b }'
}

cpu() { grep -m1 "^$1\s*:" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
printf '# %s; %s (family %s model %s), %s vCPUs; MG_PEER_TIMEOUT=5, cap %s s\n' \
    "$(date -u +%F)" "$(cpu 'model name')" "$(cpu 'cpu family')" "$(cpu model)" "$(nproc)" "$CAP"
printf '# command: bench/nodes.sh %s %s\n' "$BIN" "$OTHER"
printf '%-10s %12s %12s\n' case "$BIN" "${OTHER:--}"
for c in stopped shape rank restart mistake; do
    a=$(run "$BIN" $c)
    b=-
    [ -n "$OTHER" ] && b=$(run "$OTHER" $c)
    [ "$b" != - ] && b=$(printf '%.2f' "$b")
    printf '%-10s %12.2f %12s\n' $c "$a" "$b"
done
