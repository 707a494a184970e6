// CudaBackend's private state (the pimpl), shared by cuda_backend.cpp and the op bodies
// (cuda_*_ops.cpp).
// Not for use outside kernels/cuda.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>

#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_attention_dispatch.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_gemv_levers.h"
#include "kernels/cuda/cuda_launch.h"
#include "kernels/cuda/cuda_lt_gemm.h"

namespace attnres {

struct CudaBackend::Impl {
  int device = 0;
  std::string device_name;
  int sm_count = 1;  // multiprocessors: how many CTAs fill the GPU (attention's context split)
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* cublas_workspace = nullptr;  // fixed workspace: no cuBLAS allocation inside a graph
  size_t cublas_workspace_bytes = 0;
  std::shared_ptr<cuda::CachingAllocator> allocator;
  // PDL on / off and the launch counts (cuda_launch.h); current on the thread during an op.
  std::shared_ptr<cuda::LaunchContext> launch = std::make_shared<cuda::LaunchContext>();
  bool programmatic_launch_supported = false;  // compute capability 9.0+
  // The decode GEMVs' levers (cuda_gemv_levers.h); current on the thread during an op.
  std::shared_ptr<cuda::GemvLevers> gemv_levers = std::make_shared<cuda::GemvLevers>();
  // Attention's lever (cuda_attention_merge.h): the split merge in the attention kernel's last
  // split CTA, on counters allocated and zeroed when the backend is built,
  // attention_split_counter_bound(sm_count) of them, left at 0 by every launch, so eager
  // launches and graph replays share them.
  bool attention_last_block_merge = false;
  int32_t* attention_split_counters = nullptr;
  int64_t attention_split_counter_capacity = 0;
  // Depth attention's lever (cuda_depth_phase1_grouped.cu): Phase 1 reads its bank entries in
  // groups, a reduction per group instead of per entry.
  bool depth_phase1_grouped = false;
  // The persistent MLP lever (cuda_persistent_mlp.cu): the MLP sublayer of a decode step as
  // one launch, its grid-wide barrier on kPersistentMlpBarrierWords words allocated and zeroed
  // when the backend is built and left at their start state by every launch (the arrivals at
  // 0), so eager launches and graph replays share them.
  bool persistent_mlp = false;
  unsigned* persistent_mlp_barrier = nullptr;
  // The bank-push lever (CudaBackend::set_bank_push_epilogue): linear_residual_push's entry
  // stored by the GEMV's epilogue.
  bool bank_push_epilogue = false;

  // --- the prepared batch (prepare_batch) ---
  // One pinned staging buffer packs every metadata array; one cudaMemcpyAsync moves it to
  // meta_device. meta_copied is recorded after that copy (and after a graph replay, whose
  // copies read the buffer too): the staging buffer is rewritten only once the previous copy
  // has finished reading it. Shared so that a CUDA graph keeps the buffer its copies read.
  std::shared_ptr<void> meta_host;  // pinned_host()
  size_t meta_host_bytes = 0;
  std::shared_ptr<void> meta_device;
  size_t meta_device_bytes = 0;
  cudaEvent_t meta_copied = nullptr;
  const BatchMeta* prepared = nullptr;  // identity of the batch last prepared
  int num_tokens = 0, num_seqs = 0, max_blocks = 0;
  int32_t min_token_id = 0, max_token_id = 0;
  // Device views into meta_device.
  int32_t* token_ids = nullptr;     // [T]
  int32_t* positions = nullptr;     // [T]
  int32_t* slot_mapping = nullptr;  // [T]
  int32_t* seq_of_token = nullptr;  // [T]
  int32_t* query_start = nullptr;   // [S + 1]
  int32_t* context_len = nullptr;   // [S]
  int32_t* block_table = nullptr;   // [S, max_blocks], padded with 0
  // Which attention kernel takes which rows (cuda_attention_dispatch.h): the host plan, and
  // on the device its row list (null when every row is flash-decoding's) and tiles.
  cuda::AttentionDispatch attention_dispatch;
  int prefill_min_rows = cuda::kPrefillMinRows;
  int32_t* decode_rows = nullptr;
  cuda::PrefillTile* prefill_tiles = nullptr;
  // The (num_blocks, block_size) the prepared batch was last validated against.
  int64_t validated_num_blocks = -1, validated_block_size = -1;
  // The host-side checks of the prepared batch against a cache of this shape (slots, block
  // ids, positions), once per prepared batch and cache shape (cuda_attention_ops.cpp).
  void validate_against_cache(const BatchMeta& batch, const KvCacheLayer& cache);

  // --- gather_rows: rows from the host, through their own pinned buffer ---
  std::shared_ptr<void> rows_host;  // pinned_host(), int32 row ids
  size_t rows_host_count = 0;
  int64_t rows_staged = 0;  // how many the last gather_rows staged
  std::shared_ptr<void> rows_device;
  size_t rows_device_count = 0;
  cudaEvent_t rows_copied = nullptr;

  // --- sample (cuda_sampling_ops.cpp): persistent staging, grown when a call needs more ---
  // sample_host (pinned) and sample_device share cuda::sample_staging_layout: the rows'
  // parameters and ids go up in one copy, the ids come back into the same buffer. sample()
  // synchronizes before it returns, so the next call may rewrite both.
  std::shared_ptr<void> sample_host;  // pinned_host()
  size_t sample_host_bytes = 0;
  std::shared_ptr<void> sample_device;
  size_t sample_device_bytes = 0;
  // Presence / frequency scratch, [rows, vocab] int32 for the largest call with such a
  // penalty: zeroed once when allocated, left zero by every launch.
  std::shared_ptr<void> sample_counts;
  size_t sample_counts_bytes = 0;
  // sample_async: the ids of the call in flight land in sample_host at sample_out_offset;
  // sample_ids_copied is recorded after their D2H copy. wait_sampled() waits for it and copies
  // them into sample_out. A pending call is waited for before the staging is rewritten.
  cudaEvent_t sample_ids_copied = nullptr;
  bool sample_pending = false;
  size_t sample_out_offset = 0;
  std::span<int32_t> sample_out;

  // --- linear: activations converted to the weight dtype ---
  std::shared_ptr<void> act_scratch;
  size_t act_scratch_bytes = 0;
  // The prefill GEMMs, bias in the epilogue (cuda_lt_gemm.h); shares cublas_workspace.
  std::unique_ptr<cuda::LtGemm> lt_gemm;

  // --- CUDA graph capture (cuda_graph.cpp) ---
  // True while the stream is being captured (capture_graph): the staging events are then
  // neither waited on (illegal during capture; capture_graph waits before it begins) nor
  // recorded (CudaGraph::replay records them). A captured H2D copy reads its pinned staging
  // buffer at replay time, so a capture may stage each buffer once (a second staging would
  // leave both copies reading the second's data) and may not grow it (no pinned allocation
  // during a capture): both are refused with an error.
  bool meta_staged_in_capture = false, rows_staged_in_capture = false;
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
           status != cudaStreamCaptureStatusNone;
  }
  // Makes the backend's device current on the calling thread (CudaBackend::on_device).
  void use_device() const {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device)
      CUDA_CHECK(cudaSetDevice(device));
  }
  // Pinned host memory for staging (cudaMallocHost), freed with cudaFreeHost.
  std::shared_ptr<void> pinned_host(size_t bytes) const;
  // Device memory of at least `bytes` from the caching allocator, not zeroed.
  std::shared_ptr<void> raw_alloc(size_t bytes) { return allocator->allocate(bytes); }
  // Re-prepares when an op is handed a batch other than the one last prepared.
  void ensure_prepared(CudaBackend& self, const BatchMeta& batch) {
    if (prepared != &batch || num_tokens != batch.num_tokens) self.prepare_batch(batch);
  }
};

}  // namespace attnres
