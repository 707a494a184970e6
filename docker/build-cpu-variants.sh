#!/usr/bin/env bash
# Builds the CPU image's `attnres` once per instruction-set level, so that one image runs the
# kernels a machine can run best: AVX-512 with the bf16 dot product on Zen 4 or Sapphire
# Rapids (about twice the prefill of AVX2 there: docs/BENCHMARKS.md), AVX2 elsewhere.
# docker/attnres-launcher.sh picks among them at start.
#   build-cpu-variants.sh OUT LEVEL...   (most preferred first; the last is the fallback)
# The last level is built whole into /src/build (ATTNRES_BUILD_DIR) as a single-level image
# would be, the gRPC client included; each other level builds only `attnres`, in its own
# folder. Each binary goes to OUT/libexec/attnres-LEVEL, and OUT/libexec/variants lists the
# levels in order of preference. A level is an ATTNRES_CPU_ARCH value (CMakeLists.txt).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$1
shift
[ $# -ge 1 ] || { echo "usage: $0 OUT LEVEL..." >&2; exit 2; }
base=${ATTNRES_BUILD_DIR:-$repo/build}
common=(-DATTNRES_BUILD_TESTS=OFF -DATTNRES_ENABLE_CUDA=OFF)
mkdir -p "$out/libexec"
: > "$out/libexec/variants"
levels=("$@")
last=$((${#levels[@]} - 1))
for i in "${!levels[@]}"; do
  level=${levels[$i]}
  case "$level" in *[!A-Za-z0-9_.+-]*|"") echo "bad level name: '$level'" >&2; exit 2 ;; esac
  if [ "$i" -eq "$last" ]; then
    build=$base
    ATTNRES_BUILD_DIR=$build "$repo/docker/build.sh" "${common[@]}" -DATTNRES_CPU_ARCH="$level"
  else
    build=$base-$level
    ATTNRES_BUILD_DIR=$build ATTNRES_BUILD_TARGETS=attnres "$repo/docker/build.sh" \
      "${common[@]}" -DATTNRES_CPU_ARCH="$level"
  fi
  cp "$build/server/cli/attnres" "$out/libexec/attnres-$level"
  echo "$level" >> "$out/libexec/variants"
done
