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
# The sanitizer steps' timeouts add up, with the setup, to one 540-s lease in the order
# racecheck_probe racecheck_norms racecheck_decode racecheck_attention synccheck initcheck
# cluster_repeat memcheck
# (docs/RELIABILITY.md "GPU sanitizers" sizes them).
step_timeout() {
  local var="LEASE_TIMEOUT_$1" default
  case $1 in
    e2e) default=240 ;;
    nccl) default=90 ;;
    variants) default=180 ;;
    peer) default=150 ;;
    ops) default=150 ;;
    memcheck) default=120 ;;
    racecheck_probe|cluster_repeat) default=30 ;;
    racecheck_decode|racecheck_attention) default=100 ;;
    racecheck_*) default=80 ;;
    synccheck) default=40 ;;
    initcheck) default=50 ;;
    bench|prefill) default=120 ;;
    levers) default=360 ;;
    levers_tests) default=420 ;;
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

# compute-sanitizer over the CUDA tests. The sanitizer-sized suite (CudaSanitizerSized.*, in
# the test files of the kernels they cover, plus full-size tests that are already small) runs
# every CUDA kernel family at the smallest shapes that reach each of its paths; its three
# groups by kernel family are racecheck's three steps (racecheck is slow per launch).
sanitized_norms='CudaSanitizerSized.Norms*:CudaSanitizerSized.Depth*:CudaOps.QkNormRope'
sanitized_decode='CudaSanitizerSized.Decode*'
sanitized_attention='CudaSanitizerSized.Attention*:CudaSanitizerSized.Sample*'
sanitized_attention+=':CudaSample.RowsTheHostWouldRefuseGetTheirCodes'
# Kernels without shared memory or barriers (nothing for racecheck or synccheck to see):
# embedding, swiglu, add, gather, the bf16 rounding, the plain GEMVs.
sanitized_elementwise='CudaOps.Embedding:CudaOps.SwigluAndAdd:CudaOps.GatherRows'
sanitized_elementwise+=':CudaDepthBankBf16.CopyRoundsLikeF32ToBf16:CudaOps.LinearManyAndLinearSwiglu'
sanitized_all="$sanitized_norms:$sanitized_decode:$sanitized_attention"

# Every pattern of the gtest filter $1 names at least one test of attnres_cuda_tests (a test
# renamed away from a filter would drop out of the sanitizer runs without a word).
check_filter() {
  local binary=$unpacked/attnres_cuda_tests listed pattern
  [ "$LEASE_DEVICE" = cpu ] && binary=$(bin_dir)/tests/cpp/kernels/cuda/attnres_cuda_tests
  [ -x "$binary" ] || { echo "no $binary: the filter is not checked"; return 0; }
  local IFS=':'
  for pattern in ${1#-}; do
    [ -z "$pattern" ] && continue
    listed=$("$binary" --gtest_list_tests --gtest_filter="$pattern" | grep -c '^  ' || true)
    if [ "$listed" -eq 0 ]; then
      echo "the filter's pattern $pattern names no test of $binary"
      return 1
    fi
    echo "filter pattern $pattern: $listed tests"
  done
}

# compute-sanitizer --tool $1 over attnres_cuda_tests --gtest_filter=$2 (further arguments go to
# compute-sanitizer). Fails on any error the tool counts, on any hazard racecheck displays
# (its summary counts warnings apart from errors: a warning fails too, whatever
# --error-exitcode counts), and on a failing test. The rehearsal checks the filter and skips.
sanitize() {
  local tool=$1 filter=$2
  shift 2
  check_filter "$filter" || return 1
  cuda_only "compute-sanitizer"
  under_gvisor && skip "compute-sanitizer refuses the device under gVisor"
  compute-sanitizer --version | tail -n1
  local out rc
  out=$(mktemp)
  set +e
  CUDA_MODULE_LOADING=LAZY compute-sanitizer --tool "$tool" --error-exitcode 9 "$@" \
    "$unpacked/attnres_cuda_tests" --gtest_filter="$filter" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$tool" = racecheck ] && grep -Eq 'RACECHECK SUMMARY: [1-9]' "$out"; then
    echo "racecheck displayed hazards (see above)"
    [ "$rc" -eq 0 ] && rc=8
  fi
  grep -E '(ERROR|RACECHECK) SUMMARY' "$out" || echo "no sanitizer summary: the run did not finish"
  return "$rc"
}

# memcheck over every suite but the test that provokes failed captures on purpose: its
# cudaStreamSynchronize and cudaMalloc inside a capture are API errors the sanitizer counts.
# At the tests' real shapes (out-of-bounds bugs depend on sizes); the last step of a sanitizer
# lease, so a timeout costs only its own tail.
step_memcheck() {
  sanitize memcheck "${MEMCHECK_FILTER:-*-CudaGraph.CallsThatCannotBeCapturedFailTheCapture}"
}
# racecheck in three groups by kernel family, each a step of its own: the norms, RoPE and
# depth-mix kernels; the fused decode GEMVs (the PreNorm prologue's barriers, the QKV GEMV's
# cluster exchange through distributed shared memory); the attention kernels (paged decode,
# split merge, prefill) and sampling's cluster merges.
step_racecheck_norms() { sanitize racecheck "${RACECHECK_FILTER:-$sanitized_norms}"; }
step_racecheck_decode() { sanitize racecheck "${RACECHECK_FILTER:-$sanitized_decode}"; }
step_racecheck_attention() { sanitize racecheck "${RACECHECK_FILTER:-$sanitized_attention}"; }
# What racecheck sees of distributed shared memory (attnres_cuda_sanitizer_probes, planted
# races): the block-local race must be reported (else racecheck finds nothing on this machine
# and its steps prove nothing) and the exchange behind a cluster barrier must not; whether the
# unsynchronized cluster exchange is reported is the answer, printed as a line of its own.
step_racecheck_probe() {
  cuda_only racecheck_probe
  under_gvisor && skip "compute-sanitizer refuses the device under gVisor"
  local probe="$unpacked/attnres_cuda_sanitizer_probes" kernel hazards status=0 out
  out=$(mktemp)
  for kernel in block_race cluster_race cluster_sync; do
    echo "== racecheck $kernel"
    compute-sanitizer --tool racecheck "$probe" "$kernel" > "$out" 2>&1 || true
    cat "$out"
    hazards=$(sed -nE 's/.*RACECHECK SUMMARY: ([0-9]+) hazard.*/\1/p' "$out")
    echo "$kernel: ${hazards:-no summary} hazards"
    case $kernel in
      block_race)
        [ "${hazards:-0}" -gt 0 ] || { echo "the planted block race was not reported"; status=1; }
        ;;
      cluster_sync)
        [ "${hazards:-1}" -eq 0 ] || { echo "a synchronized cluster exchange was reported"; status=1; }
        ;;
      cluster_race)
        if [ "${hazards:-0}" -gt 0 ]; then
          echo "ANSWER: racecheck reports a distributed-shared-memory race across a cluster"
        else
          echo "ANSWER: racecheck does not report a distributed-shared-memory race across a cluster"
        fi
        ;;
    esac
  done
  return $status
}
# synccheck (barriers reached by part of a block or cluster, bad __syncwarp masks) and initcheck
# (reads of device memory nothing wrote) over the whole sanitizer-sized suite.
step_synccheck() { sanitize synccheck "${SYNCCHECK_FILTER:-$sanitized_all}"; }
step_initcheck() {
  sanitize initcheck "${INITCHECK_FILTER:-$sanitized_all:$sanitized_elementwise}"
}

# The two kernels whose blocks exchange data through distributed shared memory (the QKV GEMV's
# RoPE epilogue, sampling's merges), natively and many times over: each run compares the
# cluster's result bit for bit with a path that has no exchange (the two-launch QKV path, the
# one-CTA sample), so a missing or misplaced cluster barrier that timing exposes fails it.
step_cluster_repeat() {
  local filter='CudaSanitizerSized.DecodeQkvRopeCluster:CudaSanitizerSized.SampleClusterMerges'
  check_filter "$filter" || return 1
  cuda_only cluster_repeat
  "$unpacked/attnres_cuda_tests" --gtest_repeat="${CLUSTER_REPEAT:-20}" --gtest_brief=1 \
    --gtest_filter="$filter"
}

# Decode-step timing against the weight-read floor (bf16 and f32 KV cache, PDL off).
step_bench() {
  cuda_only bench
  "$unpacked/bench_cuda_backend"
  "$unpacked/bench_cuda_backend" --only step --kv-dtype float32
  "$unpacked/bench_cuda_backend" --only step --pdl off
}

# The decode levers (kernels/cuda/NOTES.md "GEMV levers": the GEMVs' three, attention's
# last-block merge, Phase 1 over groups of entries, the persistent MLP, the bf16 bank push in
# the residual GEMV's epilogue), one setting per line: a name, then the environment that
# switches it on (none: the kernels without a lever).
levers_settings() {
  echo "baseline"
  echo "deep ATTNRES_CUDA_GEMV_DEEP=1"
  echo "prefetch ATTNRES_CUDA_PDL_PREFETCH=1"
  echo "both ATTNRES_CUDA_GEMV_DEEP=1 ATTNRES_CUDA_PDL_PREFETCH=1"
  echo "bulk ATTNRES_CUDA_GEMV_BULK=1"
  echo "merge ATTNRES_CUDA_ATTN_LAST_BLOCK_MERGE=1"
  echo "phase1 ATTNRES_CUDA_PHASE1_GROUPED=1"
  echo "persistent ATTNRES_CUDA_PERSISTENT_MLP=1"
  echo "push ATTNRES_CUDA_BANK_PUSH_EPILOGUE=1"
  echo "all ATTNRES_CUDA_GEMV_DEEP=1 ATTNRES_CUDA_PDL_PREFETCH=1 ATTNRES_CUDA_GEMV_BULK=1" \
    "ATTNRES_CUDA_ATTN_LAST_BLOCK_MERGE=1 ATTNRES_CUDA_PHASE1_GROUPED=1" \
    "ATTNRES_CUDA_PERSISTENT_MLP=1 ATTNRES_CUDA_BANK_PUSH_EPILOGUE=1"
}

# The levers measured against one baseline in one run on one card: batch-1 and batch-8 decode
# steps of both 0.6B twins at context 1024 per setting (logs levers-<setting>.log), and a
# summary of each step's time and fraction of the weight-read floor. The rehearsal runs the
# same loop over LEVERS_BENCH (a stand-in for bench_cuda_backend), or skips; levers_tests over
# LEVERS_TESTS (for attnres_cuda_tests).
step_levers() {
  local bench name envs status=0
  if [ "$LEASE_DEVICE" = cuda ]; then
    bench=$unpacked/bench_cuda_backend
  else
    [ -n "${LEVERS_BENCH:-}" ] || skip "levers needs the CUDA build (no GPU in a rehearsal)"
    bench=$LEVERS_BENCH
  fi
  while read -r name envs; do
    echo "== bench, $name: ${envs:-no lever}"
    # shellcheck disable=SC2086
    env $envs "$bench" --only step --context 1024 --batch 1 --batch 8 \
      | tee "$LEASE_LOGS/levers-$name.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done < <(levers_settings)
  levers_summary
  return $status
}

# The tests of the kernels the levers change, once with each setting but the baseline on (the
# ops step runs them without a lever). A step of its own, so that the timings come back even
# where the tests run out of time.
step_levers_tests() {
  local tests name envs status=0
  local filter='CudaGemvLevers.*:CudaOps.Linear*:CudaFusedDecode.*:CudaBatchInvariance.*:CudaResidualEpilogue.*'
  filter+=':CudaAttentionLastBlockMerge.*:CudaFlashAttention.*:CudaSanitizerSized.Attention*'
  filter+=':CudaPhase1Grouped.*:CudaOps.DepthPhase*:CudaDepthModes.*:CudaDepthBankBf16.*'
  filter+=':CudaPersistentMlp.*:CudaBankPushEpilogue.*:CudaModel.AttnResBlock*'
  if [ "$LEASE_DEVICE" = cuda ]; then
    tests=$unpacked/attnres_cuda_tests
  else
    [ -n "${LEVERS_TESTS:-}" ] || skip "levers_tests needs the CUDA build (no GPU in a rehearsal)"
    tests=$LEVERS_TESTS
  fi
  while read -r name envs; do
    [ -z "$envs" ] && continue
    echo "== tests, $name: $envs"
    # shellcheck disable=SC2086
    env $envs "$tests" --gtest_brief=1 --gtest_filter="$filter" || status=1
  done < <(levers_settings)
  return $status
}

# One line per (setting, model, batch) from the levers-<setting>.log files: the eager and graph
# step times, the graph's fraction of the floor, and the levers the bench says were on.
levers_summary() {
  local name envs
  echo "== levers: setting model batch eager-ms graph-ms floor/graph levers-on"
  while read -r name envs; do
    awk -v setting="$name" '
      /^[A-Za-z0-9._-]+: / { model = $1; sub(/:$/, "", model) }
      / eager [0-9.]+ ms\/step/ { b = $2; sub(/,/, "", b); eager[b] = $6 }
      /; levers:/ { b = $2; sub(/:/, "", b); lv = $0; sub(/.*; levers: /, "", lv); levers[b] = lv }
      / graph [0-9.]+ ms\/step/ {
        b = $2; sub(/,/, "", b); f = $0; sub(/.*floor\/measured /, "", f); sub(/,.*/, "", f)
        printf "LEVERS %-10s %-14s %3s %8s %8s %6s  %s\n", setting, model, b, eager[b], $6, f, levers[b]
      }' "$LEASE_LOGS/levers-$name.log"
  done < <(levers_settings)
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

# The depth mix alone (issue #49): our Phase 1 and Phase 2 at prefill shapes (T 1K and 8K, 2, 4
# and 8 bf16 bank entries, d 1024 and 2048) against the copy rate; its JSON feeds depthpeers.
# Timeouts set here, not in step_timeout, so that this block stands alone.
: "${LEASE_TIMEOUT_depth:=120}"
step_depth() {
  cuda_only depth
  "$unpacked/bench_cuda_backend" --only depth --json "$LEASE_LOGS/depth_ours.json"
}

# The public AttnRes kernels on the same shapes (clients/bench/depth_peers/bench_depth_peers.py):
# flash-attn-res's Phase 1 / Phase 2 and fast-attnres's one-pass mix, each checked against the
# NumPy reference of docs/ATTNRES.md §3 first, then timed beside depth's figures (run depth
# before it). Their wheels (peer_wheels/, staged by `gpu_lease.sh stage`) go into a directory of
# their own, on this step's path only: fast-attnres imports as `attnres`. Triton compiles each
# shape on its first call (one pinned config, no autotuning): hence the longer timeout. The
# rehearsal runs the reference's self-check, then skips.
: "${LEASE_TIMEOUT_depthpeers:=300}"
step_depthpeers() {
  local script=clients/bench/depth_peers/bench_depth_peers.py peer_site=/tmp/attnres-depth-peers
  if [ "$LEASE_DEVICE" != cuda ]; then
    python3 "$script" --self-check
    skip "the peers need CUDA, torch and Triton (the reference's self-check passed)"
  fi
  ls "$staged"/peer_wheels/*.whl > /dev/null 2>&1 \
    || { echo "no wheels in $staged/peer_wheels (gpu_lease.sh stage fetches them)"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$peer_site" "$staged"/peer_wheels/*.whl
  PYTHONPATH="$peer_site${PYTHONPATH:+:$PYTHONPATH}" python3 "$script" \
    --ours "$LEASE_LOGS/depth_ours.json" --json "$LEASE_LOGS/depth_peers.json"
}
