#!/usr/bin/env bash
# A GPU lease in one command: stage here, run there within one time budget.
#
#   kernels/cuda/gpu_lease.sh stage
#       On the build machine (no GPU needed): builds the CUDA tests, bench_cuda_backend and the
#       attnres CLI into build-cuda/ and packs them, with the non-CUDA shared libraries they
#       need and the Python wheels the GPU machine lacks, into build-cuda/device/ (the folder a
#       device run carries; under the 64 MiB carry limit).
#
#   kernels/cuda/gpu_lease.sh lease [--device cuda|cpu] [--budget SECONDS] [STEP ...]
#       On the GPU machine, from the repository root, with build-cuda/device carried. Runs the
#       steps in the order given (default: $LEASE_STEPS, else the server's end-to-end proof:
#       e2e nccl variants peer), each under its own timeout and within the whole budget
#       (default 540 s, so a 600 s device call ends with time to pack the logs). Prints one
#       verdict line per step (PASS, FAIL, TIMEOUT or SKIP with its reason and seconds), and
#       on any exit leaves exactly two files in $OUT: verdicts.txt and lease-logs.tar.gz (every
#       step's log), since at most 8 files come back from a device run.
#       --device cpu rehearses the same steps on this machine with the CPU backend and the
#       binaries of $ATTNRES_BUILD_DIR (default build/), so that a typo, a missing file or a
#       wrong path shows here and not in the lease (tests/python/test_gpu_scripts.py).
#
# Steps (kernels/cuda/gpu_lease_steps.sh; LEASE_TIMEOUT_<step>=S overrides one's timeout):
#   e2e        the server's end-to-end suites against `attnres serve --device cuda`
#   nccl       tensor parallelism over NCCL at TP = 1 against the CPU forward
#   variants   every checkpoint variant, CUDA against the CPU (logits, greedy tokens)
#   peer       our logits and greedy tokens against transformers on the same checkpoint
#   ops        every CUDA op and the forward against the CPU backend (attnres_cuda_tests)
#   memcheck, racecheck_norms, racecheck_decode, racecheck_attention, synccheck, initcheck
#              compute-sanitizer over the CUDA tests (skipped under gVisor); racecheck_probe,
#              what racecheck sees of distributed shared memory (docs/RELIABILITY.md);
#   cluster_repeat  the cluster-exchange tests natively, 20 times over
#   bench      decode-step timings against the weight-read floor
#   levers     the decode levers, alone and together, against one baseline (timings)
#   levers_tests  the tests of the kernels the levers change, with each lever setting on
#   prefill    prefill attention and 1K / 8K prompts against the GEMM rate
#   ncu        every kernel of a decode step under Nsight Compute (skipped under gVisor)
#   peerbench  the transformers peer's decode and prefill beside ours on the same checkpoint
#   depth      the depth mix's Phase 1 and Phase 2 alone at prefill shapes against the copy rate
#   depthpeers flash-attn-res and fast-attnres on the same shapes, checked, beside depth's figures
#
# Through the device tool (give it ~40 s more than the budget):
#   run(command="kernels/cuda/gpu_lease.sh lease", carry=["build-cuda/device"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
steps_file="$repo/kernels/cuda/gpu_lease_steps.sh"

stage() {
  export PATH=$PATH:/usr/local/cuda/bin
  local build=${BUILD_DIR:-build-cuda} dev=build-cuda/device
  # Portable CPU code: the device machine's CPU may lack this one's ISA extensions.
  cmake -S . -B "$build" -G Ninja -DATTNRES_CPU_ARCH=x86-64-v3 > /dev/null
  ninja -C "$build" -j"${JOBS:-1}" attnres_cuda_tests bench_cuda_backend \
    attnres_cuda_tensor_parallel_tests attnres_cuda_sanitizer_probes attnres
  rm -rf "$dev" && mkdir -p "$dev"
  # The CLI needs gRPC, Protobuf, Abseil, MPI ... which the GPU machine lacks: their shared
  # libraries travel in lib/, all but the C and C++ runtimes (the device's own are newer) and
  # CUDA's and NCCL's (the device has its own; libnccl, ~200 MB, is too large to carry).
  local bundle
  bundle=$(mktemp -d)
  mkdir -p "$bundle/lib"
  cp "$build"/tests/cpp/kernels/cuda/{attnres_cuda_tests,bench_cuda_backend,attnres_cuda_tensor_parallel_tests} \
    "$build"/tests/cpp/kernels/cuda/attnres_cuda_sanitizer_probes "$build"/server/cli/attnres "$bundle/"
  ldd "$bundle"/attnres* "$bundle"/bench_cuda_backend | awk '$3 ~ /^\// {print $1, $3}' | sort -u \
    | grep -vE '^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^ ]*|libcudart|libcublas|libcublasLt|libnccl)\.' \
    | while read -r name path; do cp -L "$path" "$bundle/lib/$name"; done
  # The binaries carry ~110 MB of sm_90a kernels, over the carry limit; xz takes them to
  # ~20 MB, and the lease unpacks them with Python's tarfile (no xz tool needed there).
  tar -C "$bundle" -cf - . | xz -T0 -6 > "$dev/binaries.tar.xz"
  rm -rf "$bundle"
  # The end-to-end suites' Python packages the GPU machine (Python 3.12, no network) lacks:
  # the openai client, gRPC with its code generator and health service, pytest, jsonschema.
  python3 -m pip download -q --only-binary=:all: --python-version "${WHEELS_PYTHON:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dev/wheels" "openai>=1.0" "grpcio>=1.60" \
    "grpcio-tools>=1.60" "grpcio-health-checking>=1.60" pytest jsonschema \
    || echo "stage: the wheels were not fetched; the e2e step will fail at its imports"
  # The public AttnRes kernels the depthpeers step times (pure Python Triton kernels; torch
  # and Triton are on the GPU machine). Apart from wheels/: fast-attnres imports as `attnres`.
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dev/peer_wheels" \
    "flash-attn-res==0.1.12" "fast-attnres==2.1.0" \
    || echo "stage: the peer wheels were not fetched; the depthpeers step will fail"
  du -sh "$dev" "$dev"/*
}

# Seconds since the lease started.
elapsed() { echo $(( $(date +%s) - lease_start )); }

# Runs one step under its timeout (capped by what is left of the budget) and records its
# verdict. A step that prints "SKIP: reason" and exits 77 is skipped, not failed.
run_step() {
  local name=$1 timeout left rc start log
  timeout=$(step_timeout "$name")
  left=$(( budget - $(elapsed) ))
  if (( left < 20 )); then
    verdict "$name" SKIP 0 "the budget is spent ($(elapsed) of $budget s)"
    return
  fi
  (( timeout > left )) && timeout=$left
  log="$logs/$name.log"
  start=$(date +%s)
  echo "== $name (timeout ${timeout}s, $(elapsed)s into the lease)"
  set +e
  timeout -k 10 "$timeout" bash "$0" __step "$name" > "$log" 2>&1
  rc=$?
  set -e
  local took=$(( $(date +%s) - start ))
  case $rc in
    0) verdict "$name" PASS "$took" "" ;;
    77) verdict "$name" SKIP "$took" "$(grep -m1 '^SKIP: ' "$log" | cut -c7-)" ;;
    124|137) verdict "$name" TIMEOUT "$took" "after ${timeout}s; last line: $(last_line "$log")" ;;
    *) verdict "$name" FAIL "$took" "exit $rc; last line: $(last_line "$log")" ;;
  esac
}

last_line() { grep -v '^[[:space:]]*$' "$1" | tail -n1 | cut -c1-160; }

verdict() {
  local line
  line=$(printf 'VERDICT %-10s %-7s %4ss  %s' "$1" "$2" "$3" "$4")
  echo "$line" | tee -a "$logs/verdicts.txt"
}

# Whatever happened, the logs go back as one archive beside the verdicts.
pack_logs() {
  local out=${OUT:-/tmp/attnres-lease-out}
  mkdir -p "$out"
  [ -f "$logs/verdicts.txt" ] && cp "$logs/verdicts.txt" "$out/verdicts.txt"
  tar -C "$logs" -czf "$out/lease-logs.tar.gz" . 2>/dev/null || true
  echo "== logs: $out/lease-logs.tar.gz ($(elapsed)s into the lease)"
  [ -f "$logs/verdicts.txt" ] && cat "$logs/verdicts.txt"
}

lease() {
  export LEASE_DEVICE=cuda
  budget=${LEASE_BUDGET:-540}
  local steps=()
  while [ $# -gt 0 ]; do
    case $1 in
      --device) LEASE_DEVICE=$2; shift 2 ;;
      --budget) budget=$2; shift 2 ;;
      -*) echo "gpu_lease.sh lease: unknown option $1" >&2; exit 2 ;;
      *) steps+=("$1"); shift ;;
    esac
  done
  [ ${#steps[@]} -eq 0 ] && read -r -a steps <<< "${LEASE_STEPS:-e2e nccl variants peer}"
  lease_start=$(date +%s)
  logs=$(mktemp -d /tmp/attnres-lease-logs.XXXXXX)
  export LEASE_LOGS=$logs
  trap pack_logs EXIT
  # shellcheck source=gpu_lease_steps.sh
  source "$steps_file"
  for name in "${steps[@]}"; do
    if ! declare -F "step_$name" > /dev/null; then
      verdict "$name" FAIL 0 "no such step (kernels/cuda/gpu_lease_steps.sh)"
      continue
    fi
  done
  lease_setup > "$logs/setup.log" 2>&1 || { verdict setup FAIL "$(elapsed)" "see setup.log"; }
  cat "$logs/setup.log"
  for name in "${steps[@]}"; do
    declare -F "step_$name" > /dev/null && run_step "$name"
  done
}

case "${1:-}" in
  stage) stage ;;
  lease) shift; lease "$@" ;;
  __step)
    # One step, in a process of its own so that `timeout` can end it and all it started.
    source "$steps_file"
    lease_environment
    "step_$2"
    ;;
  *)
    echo "usage: $0 stage | lease [--device cuda|cpu] [--budget SECONDS] [STEP ...]" >&2
    exit 2
    ;;
esac
