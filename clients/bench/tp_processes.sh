#!/usr/bin/env bash
# Tensor parallelism on the CPU, side by side in one sitting: one process (TP 1), TP 2 as
# threads of one process, and TP 2 / TP 4 as processes under mpirun (docs/PARALLELISM.md),
# alternated for REPS rounds on the same model with `attnres bench latency` (prefill tokens/s,
# decode ms per step). Prints one line per run for docs/BENCHMARKS.md.
#   clients/bench/tp_processes.sh [MODEL] [REPS]      (default builtin:attnres-100m, 2)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
model=${1:-builtin:attnres-100m}
reps=${2:-2}
attnres=${ATTNRES_BUILD_DIR:-$repo/build}/server/cli/attnres
bench=(bench latency --model "$model" --batch 1 --input-len 128 --output-len 32 --iters 3)
# mpirun as root (containers, CI) and with more ranks than cores (-np 4 on 2 cores).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
mpirun=(mpirun --mca btl self,vader --bind-to none)

configs=(
  "tp1|${attnres} ${bench[*]}"
  "tp2-threads|${attnres} ${bench[*]} --tensor-parallel-size 2"
  "tp2-processes|${mpirun[*]} -np 2 ${attnres} ${bench[*]} --tensor-parallel-size 2"
  "tp4-processes|${mpirun[*]} -np 4 ${attnres} ${bench[*]} --tensor-parallel-size 4"
)
printf "%-16s %4s %14s %16s\n" config rep "prefill tok/s" "decode ms/step"
for rep in $(seq "$reps"); do
  for entry in "${configs[@]}"; do
    name=${entry%%|*}
    command=${entry#*|}
    # The results line: "<model> <prefill tok/s> <decode ms/step> ..." (bench latency's table).
    line=$($command 2>/dev/null | grep -E "^built-in|^/" | tail -n 1)
    read -r _ prefill decode _ <<<"$line"
    printf "%-16s %4s %14s %16s\n" "$name" "$rep" "$prefill" "$decode"
  done
done
