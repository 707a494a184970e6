#!/usr/bin/env bash
# Configures and builds everything (the CUDA backend too when nvcc is found) into build/.
# Extra arguments go to cmake's configure step, e.g. -DATTNRES_ENABLE_CUDA=OFF.
# ATTNRES_BUILD_TARGETS (space-separated, e.g. "attnres") builds only those targets.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${ATTNRES_BUILD_DIR:-$repo/build}
# nvcc lives outside PATH in the standard CUDA install.
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
# ccache, when installed, makes rebuilds (and builds of several worktrees) cheap.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
targets=()
for t in ${ATTNRES_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
