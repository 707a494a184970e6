// CudaBackend's private state (the pimpl), shared by cuda_backend.cpp and cuda_ops.cpp.
// Not for use outside kernels/cuda.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace attnres {

struct CudaBackend::Impl {
  int device = 0;
  std::string device_name;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* cublas_workspace = nullptr;  // fixed workspace: no cuBLAS allocation inside a graph
  size_t cublas_workspace_bytes = 0;
  std::shared_ptr<cuda::CachingAllocator> allocator;

  // --- the prepared batch (prepare_batch) ---
  // One pinned staging buffer packs every metadata array; one cudaMemcpyAsync moves it to
  // meta_device. meta_copied is recorded after that copy: the staging buffer is rewritten
  // only once the previous copy has finished reading it.
  void* meta_host = nullptr;  // cudaMallocHost
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
  // The (num_blocks, block_size) the prepared batch was last validated against.
  int64_t validated_num_blocks = -1, validated_block_size = -1;

  // --- gather_rows: rows from the host, through their own pinned buffer ---
  int32_t* rows_host = nullptr;
  size_t rows_host_count = 0;
  std::shared_ptr<void> rows_device;
  size_t rows_device_count = 0;
  cudaEvent_t rows_copied = nullptr;

  // --- linear: activations converted to the weight dtype ---
  std::shared_ptr<void> act_scratch;
  size_t act_scratch_bytes = 0;

  // True while the stream is being captured into a CUDA graph: the staging events are then
  // neither waited on (illegal during capture) nor recorded (they keep guarding eager
  // steps only). A captured step's H2D copies read the pinned staging buffers at replay
  // time: a replay uses whatever batch was last packed there, and a graph is only valid
  // while no later prepare_batch / gather_rows has to grow those buffers. Replays are not
  // ordered against host rewrites of staging: synchronize() before packing a new batch.
  // (The bench captures and replays one fixed batch; a serving graph runner is to come.)
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
  // Device memory of at least `bytes` from the caching allocator, not zeroed.
  std::shared_ptr<void> raw_alloc(size_t bytes) { return allocator->allocate(bytes); }
  // Re-prepares when an op is handed a batch other than the one last prepared.
  void ensure_prepared(CudaBackend& self, const BatchMeta& batch) {
    if (prepared != &batch || num_tokens != batch.num_tokens) self.prepare_batch(batch);
  }
};

}  // namespace attnres
