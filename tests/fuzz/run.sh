#!/usr/bin/env bash
# Builds the libFuzzer targets (Clang, ASan + UBSan, in build-fuzz/) and runs each for SECONDS
# (default 10) from a copy of its committed seed corpus (tests/fuzz/corpus/<fuzzer>/), then
# prints its executions. Stops at the first crash, leak, timeout or sanitizer report and exits
# 1; the input that did it is kept in build-fuzz/findings/<fuzzer>/ (turn it into a
# regression test: tests/fuzz/README.md).
#   tests/fuzz/run.sh [SECONDS] [FUZZER...]      (all fuzzers when none is named)
# ATTNRES_FUZZ_TIMEOUT (seconds, default 10) is the time one input may take before it counts as
# a finding; raise it when the fuzzers share the cores with other work (a loaded machine makes
# slow-but-fine inputs look like hangs).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-10}
shift || true
build=${ATTNRES_FUZZ_BUILD_DIR:-$repo/build-fuzz}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DATTNRES_BUILD_FUZZERS=ON -DATTNRES_BUILD_TESTS=OFF -DATTNRES_ENABLE_CUDA=OFF \
  "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzzers

fuzzers=("$@")
if [ ${#fuzzers[@]} -eq 0 ]; then
  for f in "$build"/tests/fuzz/*_fuzzer; do fuzzers+=("$(basename "$f")"); done
fi
status=0
for name in "${fuzzers[@]}"; do
  work=$(mktemp -d)
  cp -r "$repo/tests/fuzz/corpus/$name/." "$work/" 2>/dev/null || true
  findings="$build/findings/$name"
  mkdir -p "$findings"
  log="$build/findings/$name.log"
  # One process, no forking; a leak, a slow input (ATTNRES_FUZZ_TIMEOUT) or >2 GB is a finding too.
  if "$build/tests/fuzz/$name" "$work" -max_total_time="$seconds" -print_final_stats=1 \
      -timeout="${ATTNRES_FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 -artifact_prefix="$findings/" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz: $name: $runs executions in ${seconds}s ($rate/s), no finding"
  else
    echo "fuzz: $name: FINDING (log: $log, input: $findings/)"
    tail -n 40 "$log"
    status=1
  fi
  rm -rf "$work"
done
exit $status
