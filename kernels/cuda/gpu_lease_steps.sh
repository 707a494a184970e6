# The steps of a GPU lease (sourced by kernels/cuda/gpu_lease.sh, which runs each one under
# its own timeout and judges it by its exit status: 0 passes, 77 skips after printing
# "SKIP: reason", anything else fails). LEASE_DEVICE is cuda on the GPU machine and cpu for the
# rehearsal on a build machine; each step says what it does in each.

staged=build-cuda/device                 # what `gpu_lease.sh stage` packed (carried)
unpacked=/tmp/attnres-gpu-binaries       # its binaries, unpacked once per machine
site=/tmp/attnres-site                   # its wheels, installed once per machine

# Each step's timeout in seconds (LEASE_TIMEOUT_<step> overrides it). The figures come from the
# H200 run of 2026-11-28 where a step ran there (ops ~80 s, peer ~60 s with its checkpoint
# written, bench ~40 s; memcheck ~50 s; racecheck was cut off at 50 s), else from the CPU.
step_timeout() {
  local var="LEASE_TIMEOUT_$1" default
  case $1 in
    e2e) default=240 ;;
    nccl) default=90 ;;
    variants) default=180 ;;
    peer) default=150 ;;
    ops) default=150 ;;
    memcheck) default=180 ;;
    racecheck_*) default=180 ;;
    synccheck|initcheck) default=120 ;;
    bench|prefill) default=120 ;;
    ncu|peerbench) default=150 ;;
    *) default=120 ;;
  esac
  echo "${!var:-$default}"
}

skip() { echo "SKIP: $*"; exit 77; }

# gVisor reports kernel 4.4.0; ncu and compute-sanitizer fail there (the device tool's
# KINDS.md): those steps skip instead of spending the lease on a known failure.
under_gvisor() { [ "$(uname -r)" = "4.4.0" ]; }

# Where the binaries are: the unpacked stage on the GPU machine, the build tree in a rehearsal.
bin_dir() {
  if [ "$LEASE_DEVICE" = cpu ]; then
    echo "${ATTNRES_BUILD_DIR:-$PWD/build}"
  else
    echo "$unpacked"
  fi
}

attnres_bin() {
  if [ "$LEASE_DEVICE" = cpu ]; then echo "$(bin_dir)/server/cli/attnres"; else echo "$unpacked/attnres"; fi
}

# The environment every step runs in (no installs: lease_setup did those).
lease_environment() {
  export PYTHONUNBUFFERED=1
  export ATTNRES_ASSETS_DIR="$PWD/engine/model/assets"  # the built-in models
  # NCCL on one machine: loopback only, no InfiniBand probing, and a bounded wait.
  export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
  if [ "$LEASE_DEVICE" = cuda ]; then
    export PATH=$PATH:/usr/local/cuda/bin  # compute-sanitizer, ncu
    local nccl_dir
    nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
    export LD_LIBRARY_PATH="$unpacked/lib:/usr/local/cuda/lib64:${nccl_dir:+$nccl_dir:}${LD_LIBRARY_PATH:-}"
    [ -d "$site" ] && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  return 0
}

# Once per lease, before the steps: what the machine is, the binaries unpacked, the wheels
# installed. A failure here is reported and the steps still run (each fails on what it lacks).
lease_setup() {
  echo "device: $LEASE_DEVICE; kernel $(uname -r)$(under_gvisor && echo ' (gVisor: ncu and compute-sanitizer steps skip)')"
  lease_environment
  if [ "$LEASE_DEVICE" = cpu ]; then
    [ -x "$(attnres_bin)" ] || { echo "no $(attnres_bin): build first (docker/build.sh)"; return 1; }
    return 0
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv || true
  local status=0
  if [ ! -f "$unpacked/.unpacked" ] || [ "$staged/binaries.tar.xz" -nt "$unpacked/.unpacked" ]; then
    rm -rf "$unpacked" && mkdir -p "$unpacked"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$staged/binaries.tar.xz" "$unpacked" && touch "$unpacked/.unpacked" \
      || { echo "setup: unpacking $staged/binaries.tar.xz failed"; status=1; }
  fi
  if ls "$staged"/wheels/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$staged"/wheels/*.whl || { echo "setup: installing the wheels failed"; status=1; }
  else
    echo "setup: no wheels in $staged/wheels (stage fetches them)"; status=1
  fi
  return $status
}

# The server end to end: the HTTP suites with the official openai client, the gRPC-backed fault
# isolation suite, streaming, logprobs, n > 1, stop strings, depth attention, prefix caching, and
# the structured-output / tool-call suites where they exist (tests/python/server_process.py
# appends $ATTNRES_TEST_SERVER_ARGS to every server it starts). E2E_TESTS picks the files.
step_e2e() {
  local build=/tmp/attnres-e2e
  mkdir -p "$build/server/cli"
  ln -sf "$(attnres_bin)" "$build/server/cli/attnres"
  local tests=${E2E_TESTS:-}
  if [ -z "$tests" ]; then
    tests="tests/python/test_http_api.py tests/python/test_http_errors.py
           tests/python/test_device_sampling.py tests/python/test_depth_modes_server.py
           tests/python/test_prefix_caching.py tests/python/test_fault_isolation.py"
    for extra in tests/python/test_structured_output*.py tests/python/test_tool_calls*.py; do
      [ -f "$extra" ] && tests="$tests $extra"
    done
  fi
  # shellcheck disable=SC2086
  ATTNRES_BUILD_DIR=$build ATTNRES_TEST_SERVER_ARGS="${E2E_SERVER_ARGS:---device $LEASE_DEVICE}" \
    python3 -m pytest -q -p no:cacheprovider -x --durations=5 $tests ${E2E_PYTEST_ARGS:-}
}

# Tensor parallelism's NCCL path with one GPU (TP = 1) against the CPU forward.
step_nccl() {
  [ "$LEASE_DEVICE" = cuda ] || skip "NCCL needs the CUDA build (no GPU in a rehearsal)"
  "$unpacked/attnres_cuda_tensor_parallel_tests"
}

# Every checkpoint variant on the device against the CPU (logits and greedy tokens).
step_variants() {
  python3 tests/gpu/variant_parity.py --attnres "$(attnres_bin)" \
    --devices "$LEASE_DEVICE,cpu" --json "$LEASE_LOGS/variant_parity.json" \
    ${VARIANTS:+--variants "$VARIANTS"}
}

# The transformers peer: a Qwen3-0.6B-shape checkpoint written by transformers, 64 greedy
# tokens and every position's logits, the argmax over the ids the tokenizer can decode.
step_peer() {
  python3 -c 'import torch, transformers' 2> /dev/null || skip "no torch / transformers here"
  local peer=/tmp/attnres-peer-0.6b
  [ -f "$peer/model.safetensors" ] || python3 clients/bench/transformers/make_peer_model.py "$peer"
  python3 clients/bench/transformers/peer_check.py "$peer" --attnres "$(attnres_bin)" \
    --device "$LEASE_DEVICE" --json "$LEASE_LOGS/peer_check.json"
}

cuda_only() {
  [ "$LEASE_DEVICE" = cuda ] || skip "$1 needs the CUDA build (no GPU in a rehearsal)"
}

step_ops() {
  cuda_only ops
  "$unpacked/attnres_cuda_tests"
}

# compute-sanitizer over the CUDA tests: $1 the tool, $2 the gtest filter.
sanitize() {
  cuda_only "compute-sanitizer"
  under_gvisor && skip "compute-sanitizer refuses the device under gVisor"
  compute-sanitizer --tool "$1" --error-exitcode 9 "$unpacked/attnres_cuda_tests" --gtest_filter="$2"
}

# memcheck over every suite but the test that provokes failed captures on purpose: its
# cudaStreamSynchronize and cudaMalloc inside a capture are API errors the sanitizer counts.
step_memcheck() {
  sanitize memcheck "${MEMCHECK_FILTER:-*-CudaGraph.CallsThatCannotBeCapturedFailTheCapture}"
}
# racecheck is slow (over 50 s for four CudaOps tests on the H200), so it runs in three groups,
# each a step of its own: the norm, RoPE and depth-mix kernels; the fused decode GEMVs (the
# PreNorm prologue's barriers, the QKV GEMV's cluster exchange) and bf16 activations; the
# attention kernels (paged decode, split merge, prefill) and sampling's cluster merges.
step_racecheck_norms() {
  sanitize racecheck "${RACECHECK_FILTER:-CudaOps.*:CudaDepthBankBf16.*:CudaDepthModes.*}"
}
step_racecheck_decode() {
  sanitize racecheck "${RACECHECK_FILTER:-CudaFusedDecode.*:CudaBf16Activations.*}"
}
step_racecheck_attention() {
  sanitize racecheck "${RACECHECK_FILTER:-CudaFlashAttention.*:CudaPrefillAttention.*:CudaSample*}"
}
step_synccheck() { sanitize synccheck "${SYNCCHECK_FILTER:-CudaOps.*:CudaFusedDecode.*:CudaFlashAttention.*:CudaPrefillAttention.*:CudaSample*}"; }
step_initcheck() { sanitize initcheck "${INITCHECK_FILTER:-CudaOps.*:CudaFusedDecode.*:CudaFlashAttention.*:CudaPrefillAttention.*:CudaSample*}"; }

# Decode-step timing against the weight-read floor (bf16 and f32 KV cache, PDL off).
step_bench() {
  cuda_only bench
  "$unpacked/bench_cuda_backend"
  "$unpacked/bench_cuda_backend" --only step --kv-dtype float32
  "$unpacked/bench_cuda_backend" --only step --pdl off
}

# Prefill: the attention kernels on prefill chunks, then 1K and 8K-token prompts of the twins
# against the bf16 GEMM rate of the same run.
step_prefill() {
  cuda_only prefill
  "$unpacked/bench_cuda_backend" --only prefill-attention
  "$unpacked/bench_cuda_backend" --only prefill --steps 5 --linear-input-dtype both
}

# Every kernel's duration under Nsight Compute (clocks left alone), printed as each is
# profiled, so a timeout still leaves the first ones.
step_ncu() {
  cuda_only ncu
  under_gvisor && skip "ncu cannot read the counters under gVisor"
  ncu --clock-control none --metrics gpu__time_duration.sum --launch-count "${NCU_KERNELS:-800}" \
    "$unpacked/bench_cuda_backend" --only step --steps 2
}

# The peer's speed, same GPU, same run: the Qwen3-0.6B-shape checkpoint under our engine (decode
# at context 1024, prefill) and under transformers (static cache, compiled for minutes).
step_peerbench() {
  cuda_only peerbench
  local peer=/tmp/attnres-peer-0.6b
  [ -f "$peer/model.safetensors" ] || python3 clients/bench/transformers/make_peer_model.py "$peer"
  "$unpacked/bench_cuda_backend" --model "$peer" --only step --context 1024
  "$unpacked/bench_cuda_backend" --model "$peer" --only prefill --steps 5
  python3 clients/bench/transformers/bench_transformers.py "$peer" --json "$LEASE_LOGS/transformers.json"
}
