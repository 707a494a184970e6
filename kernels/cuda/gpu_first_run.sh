#!/usr/bin/env bash
# First GPU run of the CUDA backend, in two halves.
#
#   kernels/cuda/gpu_first_run.sh stage   # on the build machine (no GPU needed): builds
#                                         # attnres_cuda_tests + bench_cuda_backend into
#                                         # build-cuda/ (git-ignored) and copies them with the
#                                         # non-CUDA shared libraries they need into
#                                         # build-cuda/device/
#   kernels/cuda/gpu_first_run.sh run     # on the GPU machine, from the repository root, with
#                                         # build-cuda/device carried: tests, sanitizers, bench;
#                                         # logs under $OUT (or /tmp)
#
# Through the device tool (STEPS="1 2 3" etc. to fit the 10-minute command limit):
# run(command="bash kernels/cuda/gpu_first_run.sh run",
#                              carry=["build-cuda/device"])
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-}
build=${BUILD_DIR:-build-cuda}  # stage: where to build (run ignores it)
dev=build-cuda/device
case "$mode" in
  stage)
    export PATH=$PATH:/usr/local/cuda/bin
    # Portable CPU code: the device machine's CPU may lack this one's ISA extensions.
    cmake -S . -B "$build" -G Ninja -DATTNRES_CPU_ARCH=x86-64-v3 > /dev/null
    ninja -C "$build" -j"${JOBS:-1}" attnres_cuda_tests bench_cuda_backend attnres_cuda_tensor_parallel_tests
    rm -rf "$dev" && mkdir -p "$dev"
    # Compressed: the three binaries carry ~85 MB of sm_90a kernels between them, over the
    # device tool's 64 MiB carry limit; xz takes them to ~14 MB. `run` unpacks them.
    tar -C "$build"/tests/cpp/kernels/cuda -cf - attnres_cuda_tests bench_cuda_backend \
      attnres_cuda_tensor_parallel_tests | xz -T0 -6 > "$dev/binaries.tar.xz"
    # libnccl is too large to carry (~200 MB): the run uses the GPU machine's own (PyTorch's
    # nvidia-nccl wheel or the CUDA toolkit's).
    for lib in libutf8proc.so.2; do
      cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" "$dev/"
    done
    ls -la "$dev"
    ;;
  run)
    out=${OUT:-/tmp}
    export PATH=$PATH:/usr/local/cuda/bin  # compute-sanitizer
    nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
    libs="$PWD/$dev"
    export LD_LIBRARY_PATH="$libs:/usr/local/cuda/lib64:${nccl_dir:+$nccl_dir:}${LD_LIBRARY_PATH:-}"
    # The staged binaries, unpacked (python's tarfile: no xz tool needed on the device).
    dev=/tmp/attnres-gpu-binaries
    rm -rf "$dev" && mkdir -p "$dev"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$libs/binaries.tar.xz" "$dev"
    export ATTNRES_ASSETS_DIR="$PWD/engine/model/assets"  # the bench's built-in models
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt" || true
    # STEPS picks the numbered steps below (default all); one device command may run 10
    # minutes, so a session runs e.g. STEPS="1 2 3" and then STEPS="4 5 6 7".
    steps=" ${STEPS:-1 2 3 4 5 6 7} "
    want() { [[ "$steps" == *" $1 "* ]]; }
    if want 1; then
      # 1. Every op and the whole forward against the CPU backend (bf16 KV cache and depth bank,
      #    flash-decoding attention, fused q/k/v and gate/up GEMVs, sampling: CudaFlashAttention.*,
      #    CudaDepthBankBf16.*, CudaOps.LinearManyAndLinearSwiglu, CudaSample*, the cuBLASLt prefill
      #    GEMM with bias / residual epilogues: CudaLtGemm.*); decode steps
      #    replayed as graphs through the runner (CudaDecodeGraphs.*); CUDA graphs (CudaGraph.*),
      #    the batch contract (CudaBatchInvariance.*, which prints whether 16 rows equal 1),
      #    the device guard from a second thread and the KV memory query (CudaMemory.*).
      #    Added 2026-11-25 (all bit for bit against their unfused paths, and the CPU):
      #    CudaFusedDecode.* (QKV GEMV + RoPE + store, one cluster per head), CudaBf16Activations.*,
      #    CudaAsyncScheduling.* and CudaSample.Async*, CudaPrefillAttention.*, CudaLaunch*.
      "$dev/attnres_cuda_tests" 2>&1 | tee "$out/test.log" \
        | grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED \] [0-9]+ tests|Failure|rror|batch-mates:" || true
    fi
    if want 2; then
      # 2. Out-of-bounds accesses and shared-memory races (ops, memory and graphs; the graph
      #    tests' tiny model runs a few forwards; the bigger model tests are slow under it).
      compute-sanitizer --tool memcheck --error-exitcode 9 "$dev/attnres_cuda_tests" \
        --gtest_filter='CudaOps.*:CudaMemory.*:CudaGraph.*:*CudaDecodeGraphs.*:CudaFusedDecode.QkvRopeStore*:CudaPrefillAttention.*:CudaSample*' \
        > "$out/memcheck.log" 2>&1 \
        && echo "memcheck: clean" || echo "memcheck: FAILED (see memcheck.log)"
      compute-sanitizer --tool racecheck --error-exitcode 9 "$dev/attnres_cuda_tests" \
        --gtest_filter='CudaOps.RmsNorm:CudaOps.DepthPhase*:CudaOps.DepthWeights:CudaOps.QkNormRope' \
        > "$out/racecheck.log" 2>&1 && echo "racecheck: clean" || echo "racecheck: FAILED (see racecheck.log)"
    fi
    if want 3; then
      # 3. Tensor parallelism's NCCL path with one GPU (TP = 1) against the CPU forward.
      "$dev/attnres_cuda_tensor_parallel_tests" 2>&1 | tee "$out/test_tp.log" \
        | grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED \] [0-9]+ tests|Failure|rror" || true
    fi
    if want 4; then
      # 4. Decode-step timing against the weight-read floor.
      #    The decode step with a bf16 KV cache (the default) and an f32 one, and the attention
      #    kernel alone against the copy bandwidth.
      "$dev/bench_cuda_backend" 2>&1 | tee "$out/bench.log" || echo "bench: FAILED"
      "$dev/bench_cuda_backend" --only step --kv-dtype float32 2>&1 | tee "$out/bench_f32kv.log" \
        || echo "bench (f32 KV): FAILED"
      "$dev/bench_cuda_backend" --only step --pdl off 2>&1 | tee "$out/bench_pdl_off.log" \
        || echo "bench (PDL off): FAILED"
    fi
    if want 5; then
      # 5. Issue #13's acceptance shape: the twins' decode at context 1024.
      "$dev/bench_cuda_backend" --only step --context 1024 2>&1 | tee "$out/bench_ctx1024.log" \
        || echo "bench (context 1024): FAILED"
    fi
    if want 6; then
      # 6. Prefill (issue #14): the attention kernels on prefill chunks, then 1K and 8K-token
      #    prompts of the twins against the bf16 GEMM rate of the same run.
      "$dev/bench_cuda_backend" --only prefill-attention 2>&1 | tee "$out/bench_prefill_attention.log" \
        || echo "bench (prefill attention): FAILED"
      "$dev/bench_cuda_backend" --only prefill --steps 5 --bf16-act both 2>&1 | tee "$out/bench_prefill.log" \
        || echo "bench (prefill): FAILED"
    fi
    if want 7; then
      # 7. The peer, same GPU, same run (issues #13, #14): a Qwen3-0.6B-shape checkpoint written
      #    by transformers, under our engine and under transformers (static cache, compiled for
      #    minutes).
      peer=/tmp/attnres-peer-0.6b
      [ -f "$peer/model.safetensors" ] || python3 clients/bench/transformers/make_peer_model.py "$peer"
      "$dev/bench_cuda_backend" --model "$peer" --only step --context 1024 2>&1 \
        | tee "$out/bench_peer_ours.log" || echo "bench (peer, ours): FAILED"
      "$dev/bench_cuda_backend" --model "$peer" --only prefill --steps 5 2>&1 \
        | tee -a "$out/bench_peer_ours.log" || echo "bench (peer prefill, ours): FAILED"
      python3 clients/bench/transformers/bench_transformers.py "$peer" --json "$out/transformers.json" \
        2>&1 | grep -v -i warn | tee "$out/bench_peer_transformers.log" \
        || echo "bench (peer, transformers): FAILED"
    fi
    ;;
  *)
    echo "usage: $0 stage|run" >&2
    exit 2
    ;;
esac
