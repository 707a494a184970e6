// The CUDA implementation of attnres::Backend (engine/core/backend.h). A plain C++ header:
// it names no CUDA type beyond opaque forward declarations, so g++-compiled code (the CLI,
// the server, tests) can include it. Link the CMake target `attnres_kernels_cuda`; code that
// must build without CUDA guards its use with `#ifdef ATTNRES_HAVE_CUDA` (that definition is
// PUBLIC on the target).
//
// Contract (same as the CPU backend, which is the reference):
// - f32 activations on the device (a linear's input rows bf16 where linear_input_dtype says
//   so); weights F32 / BF16 / F16 read as stored. The KV cache is F32 or BF16, the depth
//   bank too (cuda_backend_capabilities).
// - One CUDA stream per backend; every op is queued on it; synchronize() waits for it and
//   download() copies to the host and waits. Any thread may drive the backend (one at a
//   time): each call first makes the backend's device current on the calling thread.
// - alloc() hands out zero-filled device memory from a caching allocator (best fit over
//   cached segments, cut and merged: cuda_allocator.h): Transformer::forward allocates its scratch
//   every step and a cudaMalloc / cudaFree per step would dominate decode. Tensors own their memory
//   through Tensor::owner and may outlive the backend.
// - linear: up to 8 rows (decode) use a GEMV kernel with f32 activations (CPU-exact up to
//   summation order). More rows use cuBLAS; with BF16 / F16 weights the activations are
//   first rounded to the weight dtype (cuBLAS needs A and B of one type; accumulation and
//   output stay f32), so those rows match the CPU to bf16 precision, not f32.
// - Batches (kernels/cuda/NOTES.md, "Batch invariance"): deterministic (the same step gives
//   the same bits), not batch-invariant: a row's result depends on whether its step had
//   <= 8 rows, and cuBLAS picks kernels by shape. As vLLM by default; the CPU is both.
//
// Files: cuda_backend.cpp (memory, batch metadata, factory), the op bodies (validation and
// dispatch) beside their kernels: cuda_linear_ops.cpp (linear through the GEMV or cuBLAS),
// cuda_prenorm_ops.cpp, cuda_norm_rope_ops.cpp, cuda_attention_ops.cpp, cuda_depth_ops.cpp,
// cuda_elementwise_ops.cpp, cuda_sampling_ops.cpp (their shared checks: cuda_op_checks.h);
// cuda_allocator.cpp (caching allocator and CUDA graph
// memory pools), cuda_graph.cpp (capture_graph, CudaGraph), cuda_launch.cpp (programmatic
// dependent launch switch, launch counts; the launch itself: cuda_common.cuh), and the
// kernels: cuda_elementwise.cu, cuda_gemv.cu, cuda_norm_rope.cu, cuda_attention.cu,
// cuda_depth_mix.cu, cuda_depth_weights.cu. gpu_lease.sh: what a GPU lease runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "engine/core/backend.h"
#include "kernels/cuda/cuda_allocator.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace attnres {

// True when the CUDA runtime sees at least one device. Never throws or aborts: no driver,
// no device or any other runtime error answers false.
bool cuda_device_available();

// Free memory of `device` now (cudaMemGetInfo), what a fractional --kv-cache-memory is a
// fraction of on CUDA (BackendTraits::kv_memory_bytes). Creates the device's primary context
// if there is none yet (the backend then reuses it), so the runtime's own share is already
// taken. Leaves the calling thread's current device as it was. Throws attnres::Error when
// the device cannot be queried.
size_t cuda_free_memory_bytes(int device);

// The CUDA backend's capabilities, the one object its instances and its registration share
// (so --kv-cache-dtype and --depth-bank-dtype auto pick bf16 for a bf16 checkpoint): a KV cache
// and a depth bank of F32 or BF16 (store_kv and copy round to nearest even, as the CPU does; the
// kernels widen in registers); bf16 linear inputs, preferred (above 8 rows the cuBLASLt GEMM
// reads bf16 either way: the producers write it instead of linear converting, the same bits);
// CUDA graphs; linear_residual fused (<= 8 rows); sampling asynchronous.
const BackendCapabilities& cuda_backend_capabilities();

class CudaGraph;

class CudaBackend : public Backend {
 public:
  // Selects `device` (cudaSetDevice), creates the stream and the cuBLAS handle. Throws
  // attnres::Error when there is no usable device.
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::CUDA; }
  std::string name() const override;
  // cuda_backend_capabilities(), above.
  const BackendCapabilities& capabilities() const override { return cuda_backend_capabilities(); }

  // With bf16 linear inputs on (Backend::set_bf16_linear_inputs), BF16 for more than 8 rows
  // (the cuBLASLt path) read by bf16 weights: the producers then write the GEMM's bf16 input
  // themselves, the bits linear's conversion gives with them off (kernels/cuda/NOTES.md, "bf16
  // activations into the prefill GEMMs"). F32 otherwise.
  DType linear_input_dtype(int64_t rows, DType weight_dtype) const override;

  Tensor alloc(const Shape& shape, DType dtype) override;
  Tensor upload(const Tensor& host) override;
  void download(const Tensor& src, void* host_dst) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void fill_zero(Tensor& dst) override;
  void synchronize() override;
  void prepare_batch(const BatchMeta& batch) override;
  // Query rows a sequence needs for the tensor-core prefill attention (cuda_attention_dispatch.h;
  // default kPrefillMinRows). For benchmarks and tests: INT32_MAX keeps every row on
  // flash-decoding, 1 sends every row to the prefill kernel. Applies from the next prepare_batch.
  void set_prefill_min_rows(int rows);

  // Backend::sample, and the same with ctas_per_row CTAs per row (1, 2, 4 or 8; 0:
  // cuda::plan_sample_ctas_per_row picks, as sample_impl does), so tests can compare the splits.
  using Backend::sample;
  void sample(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out, int ctas_per_row);
  void wait_sampled() override;

  // Captures the work `record` queues on this backend's stream into a CUDA graph (see
  // CudaGraph). Warm up first: run the same step eagerly once, so that the caching allocator
  // and the pinned staging buffers already have what the step needs. The capture is strict
  // (cudaStreamCaptureModeThreadLocal): a call on this thread that cannot be captured (a
  // synchronize, a download, an upload's cudaMalloc, a pinned allocation) fails it with an
  // error instead of running once at capture time and being missing from every replay.
  // Throws what `record` threw, or attnres::Error; the backend stays usable either way.
  std::unique_ptr<CudaGraph> capture_graph(const std::function<void()>& record);
  // The Backend's step graphs (engine/runner/decode_graphs.h) are these CUDA graphs.
  std::unique_ptr<StepGraph> capture_step_graph(const std::function<void()>& record) override;

  // Programmatic dependent launch (kernels/cuda/cuda_launch.h): each kernel may be scheduled
  // while the one ahead of it finishes, and waits for it on the GPU. On by default where the
  // device has it (compute capability 9.0+) unless ATTNRES_CUDA_PDL=0; set_programmatic_launch
  // switches it for launches (and graph captures) from now on; asking for it on an older
  // device leaves it off. Results are the same bits either way.
  void set_programmatic_launch(bool on);
  bool programmatic_launch() const;
  // The decode GEMVs' levers (kernels/cuda/cuda_gemv_levers.h, NOTES.md "GEMV levers"), off
  // unless their environment variable is set when the backend is built; each setter switches
  // its lever for launches (and graph captures) from now on. Same bits either way.
  void set_gemv_deep(bool on);  // ATTNRES_CUDA_GEMV_DEEP
  bool gemv_deep() const;
  void set_gemv_weight_prefetch(bool on);  // ATTNRES_CUDA_PDL_PREFETCH
  bool gemv_weight_prefetch() const;
  void set_gemv_bulk(bool on);  // ATTNRES_CUDA_GEMV_BULK
  bool gemv_bulk() const;
  // Attention's lever (NOTES.md "GEMV levers"): a split decode attention merges its splits in
  // its last CTA to finish instead of in a merge kernel, a launch fewer per layer.
  void set_attention_last_block_merge(bool on);  // ATTNRES_CUDA_ATTN_LAST_BLOCK_MERGE
  bool attention_last_block_merge() const;
  // Depth attention's lever (NOTES.md "GEMV levers"): Phase 1 loads a group of bank entries
  // before it reduces their sums, one barrier pair per group instead of per entry.
  void set_depth_phase1_grouped(bool on);  // ATTNRES_CUDA_PHASE1_GROUPED
  bool depth_phase1_grouped() const;
  // The persistent MLP lever (NOTES.md "GEMV levers"): prenorm_mlp_residual at <= 8 rows as one
  // cooperative launch (PreNorm, gate / up with SwiGLU, a grid-wide barrier, down with the
  // residual add) instead of two, a launch fewer per MLP sublayer. Same bits either way.
  void set_persistent_mlp(bool on);  // ATTNRES_CUDA_PERSISTENT_MLP
  bool persistent_mlp() const;
  // The bank-push lever (NOTES.md "GEMV levers"): linear_residual_push on the GEMV path stores
  // the bf16 depth-bank entry from the GEMV's residual epilogue, a launch fewer per push.
  void set_bank_push_epilogue(bool on);  // ATTNRES_CUDA_BANK_PUSH_EPILOGUE
  bool bank_push_epilogue() const;
  // Launches so far: kernels of kernels/cuda (a captured launch counts once, at capture; a
  // graph replay adds none), and calls into cuBLAS (each runs one or more kernels of its own).
  struct LaunchCounts {
    uint64_t kernels = 0;
    uint64_t cublas_calls = 0;
  };
  LaunchCounts launch_counts() const;

  // The stream every op runs on (for timing with events).
  CUstream_st* stream() const;
  int device_index() const;
  // Device bytes held by the caching allocator: in use, cached free for reuse, and free but
  // held for live CUDA graphs (cuda_allocator.h).
  size_t allocated_bytes() const;
  size_t cached_free_bytes() const;
  size_t graph_pool_free_bytes() const;
  // Returns every cached free block to the driver (cudaFree).
  void release_cached_memory();
  // The caching allocator's counters (reserved, peaks, segments, raw allocations / frees).
  cuda::CachingAllocator::Stats allocator_stats() const;

  struct Impl;  // cuda_backend_internal.h

 protected:
  // The op bodies (Backend checks the operands first: engine/core/backend.cpp; a body checks
  // that they are CUDA tensors of the dtypes and sizes its kernels take).
  void embedding_impl(const Tensor& table, const BatchMeta& batch, Tensor& out) override;
  void rms_norm_impl(const Tensor& x, const Tensor& gain, float eps, Tensor& out) override;
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override;
  // Decode-sized (<= 8 rows): the residual add in the GEMV's epilogue, the bits of linear then
  // add_inplace; more rows take the Backend's default (cuBLAS, then the add).
  void linear_residual_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                            const Tensor& residual, Tensor& out) override;
  // With the bank-push lever on, decode-sized (<= 8 rows, f32 x) into a BF16 entry: the
  // entry's rounding in the same GEMV epilogue, one launch; anything else the default
  // (linear_residual, then copy).
  void linear_residual_push_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                                 const Tensor& residual, Tensor& out, Tensor& entry) override;
  // Decode-sized (<= 8 rows): one GEMV launch for every target, and gate / up with SwiGLU as
  // its epilogue; more rows take the Backend's defaults (cuBLAS per weight).
  void linear_many_impl(const Tensor& x, std::span<const LinearTarget> targets) override;
  void linear_swiglu_impl(const Tensor& x, const Tensor& w_gate, const Tensor* b_gate,
                          const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up,
                          Tensor& out) override;
  // Decode-sized (<= 8 rows), the plain pre-norm or the plain Phase-2 merge: the PreNorm as
  // the GEMV's prologue (one launch, `normed` never written); anything else the defaults.
  void prenorm_linear_many_impl(const PrenormArgs& in,
                                std::span<const LinearTarget> targets) override;
  void prenorm_linear_swiglu_impl(const PrenormArgs& in, const Tensor& w_gate, const Tensor* b_gate,
                                  const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up,
                                  Tensor& out) override;
  // Decode-sized (<= 8 rows, F32 / BF16 weights, head_dim <= 256): RoPE, the q / k norms and
  // the KV store as the QKV GEMV's epilogue (cuda_gemv_rope.cu), with the PreNorm as its
  // prologue where prenorm_linear_many would take it (one launch), else after the PreNorm's own
  // launch (two); anything else the default (prenorm_linear_many, then qk_norm_rope_store).
  void prenorm_qkv_rope_store_impl(const PrenormArgs& in, std::span<const LinearTarget, 3> qkv,
                                   const RopeStoreArgs& rope) override;
  // With the persistent MLP lever on, decode-sized (<= 8 rows, the shapes
  // cuda::persistent_mlp_takes takes): the whole MLP sublayer in one launch
  // (cuda_persistent_mlp.cu); anything else, or the lever off, the default
  // (prenorm_linear_swiglu, then linear_residual: two launches).
  void prenorm_mlp_residual_impl(const PrenormArgs& in, const Tensor& w_gate, const Tensor* b_gate,
                                 const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up,
                                 Tensor& act, const Tensor& w_down, const Tensor* b_down,
                                 const Tensor& residual, Tensor& out) override;
  void qk_norm_rope_impl(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                         const Tensor* k_gain, float eps, const Tensor& inv_freq,
                         const BatchMeta& batch) override;
  void store_kv_impl(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                     KvCacheLayer& cache) override;
  // One launch: RoPE of q and k, and the roped k and v into the cache.
  void qk_norm_rope_store_impl(Tensor& q, Tensor& k, const Tensor& v, int head_dim,
                               const Tensor* q_gain, const Tensor* k_gain, float eps,
                               const Tensor& inv_freq, const BatchMeta& batch,
                               KvCacheLayer& cache) override;
  void attention_impl(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
                      int head_dim, float scale, Tensor& out) override;
  void swiglu_impl(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void add_inplace_impl(Tensor& x, const Tensor& y) override;
  void gather_rows_impl(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override;
  void depth_phase1_impl(const Tensor& queries, const Tensor& bank, int n, float eps, Tensor& m,
                         Tensor& s, Tensor& o, const Tensor* source_gate_logits) override;
  void depth_phase2_prenorm_impl(const DepthMixArgs& mix, const Tensor& partial,
                                 const Tensor& prenorm_gain, float norm_eps, Tensor& out) override;
  void depth_weights_impl(const Tensor& query, const Tensor& bank, int n, const Tensor& partial,
                          float bias, float eps, Tensor& out,
                          const DepthSourceSwitches& sources) override;
  // cuda_sampling.cu, launched from cuda_sampling_ops.cpp; not inside a graph capture.
  void sample_impl(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) override;
  // Async scheduling: the same work queued, the ids' D2H copy into the pinned staging
  // followed by an event; wait_sampled() waits for that event and copies them into `out`.
  void sample_async_impl(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) override;

 private:
  // *impl_, after making this backend's device current on the calling thread. The runtime's
  // current device is per host thread and a new thread starts on device 0: the backend is
  // built on one thread (the CLI's main thread, which the constructor's cudaSetDevice covers)
  // and driven from another (the engine thread), so every entry point that calls the runtime
  // goes through here. Costs a cudaGetDevice (thread-local state); cudaSetDevice only on a
  // mismatch. The previous device is not restored.
  Impl& on_device();
  // sample() and sample_async(): queues the upload, the kernel and the ids' copy back; `wait`
  // waits for them, else wait_sampled() does.
  void queue_sample(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out,
                    int ctas_per_row, bool wait);

  std::unique_ptr<Impl> impl_;
};

// Work captured from a CudaBackend's stream (CudaBackend::capture_graph), replayed on it.
// A replay runs exactly the captured kernels and copies on the captured buffers; none of the
// ops' host-side checks run again. Its metadata copies read the pinned staging buffers when
// they run, so a replay computes the batch last packed there: the captured one, or another
// of the same layout that prepare_batch packed since (how a graph runner would reuse a
// graph; gather_rows' row ids have no such path yet and stay the last ones staged). replay()
// refuses once a staging buffer was regrown, or when the batch prepared last has another
// layout (tokens, sequences, block-table width).
// The graph holds what its replays use that the backend could otherwise free or reuse: its
// memory pool (no block allocated or in use during the capture goes to anyone else while the
// graph lives: cuda_allocator.h) and the staging buffers its copies read. Everything else a
// replay reads (weights, KV cache, the forward's kept workspaces) is the caller's to keep
// alive. Destroy it before its backend (a replay uses the backend's stream and events).
class CudaGraph : public StepGraph {
 public:
  struct Impl;
  explicit CudaGraph(std::unique_ptr<Impl> impl);
  ~CudaGraph() override;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Queues one replay on the backend's stream (asynchronous, like every op).
  void replay() override;
  // True once a staging buffer the graph's copies read was regrown (replay() refuses).
  bool stale() const override;

 private:
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<Backend> make_cuda_backend(int device = 0);

}  // namespace attnres
