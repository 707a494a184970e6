// CudaBackend construction, memory ops, batch metadata upload and the factory.
//
// Memory: alloc() draws from the caching allocator (cuda_allocator.h) and zero-fills with
// cudaMemsetAsync on the backend stream; upload() makes an exact-size cudaMalloc copy
// (weights are large and permanent, so they bypass the allocator's size rounding) and keeps
// the dtype. Both are freed through Tensor::owner and never throw from the deleter. copy()
// is a device-to-device memcpy, or, F32 into BF16 (a bf16 depth bank's entry), a rounding
// kernel bit-exact with f32_to_bf16.
//
// prepare_batch packs token_ids, positions, slot_mapping, seq_of_token (derived),
// query_start, context_len, a [num_seqs, max_blocks] block table (rows padded with 0) and
// attention's dispatch (flash-decoding's row list, the prefill tiles) into one pinned buffer
// and sends it with a single cudaMemcpyAsync. Host-side facts the ops validate against (token
// id range) are kept on the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <span>
#include <utility>

#include "kernels/cuda/cuda_attention_merge.h"
#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres {
bool cuda_device_available() {
  try {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      cudaGetLastError();  // no driver / no device: clear and answer false
      return false;
    }
    return count > 0;
  } catch (...) {
    return false;
  }
}

size_t cuda_free_memory_bytes(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    throw Error("CUDA device " + std::to_string(device) + " is not visible (" +
                std::to_string(count) + " devices)");
  }
  cuda::ScopedDevice on_device(device);
  ATTNRES_CHECK(on_device.ok(), "cannot select CUDA device " + std::to_string(device));
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

const BackendCapabilities& cuda_backend_capabilities() {
  static const BackendCapabilities capabilities{
      .kv_cache_dtypes = {DType::F32, DType::BF16},
      .depth_bank_dtypes = {DType::F32, DType::BF16},
      .bf16_linear_inputs = true,
      .prefers_bf16_linear_inputs = true,
      .step_graphs = true,
      .fuses_linear_residual = true,
      .samples_asynchronously = true,
  };
  return capabilities;
}

CudaBackend::CudaBackend(int device) : impl_(std::make_unique<Impl>()) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Error(std::string("no CUDA device available") +
                (err != cudaSuccess ? std::string(": ") + cudaGetErrorString(err) : ""));
  }
  if (device < 0 || device >= count)
    throw Error("CUDA device " + std::to_string(device) + " does not exist (" +
                std::to_string(count) + " devices)");
  Impl& im = *impl_;
  im.device = device;
  CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  im.device_name =
      std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  im.sm_count = prop.multiProcessorCount;
  im.programmatic_launch_supported = prop.major >= 9;
  im.launch->programmatic =
      im.programmatic_launch_supported && cuda::programmatic_launch_wanted_by_env();
  im.gemv_levers->deep = cuda::gemv_lever_wanted_by_env("ATTNRES_CUDA_GEMV_DEEP");
  im.gemv_levers->weight_prefetch = cuda::gemv_lever_wanted_by_env("ATTNRES_CUDA_PDL_PREFETCH");
  im.gemv_levers->bulk = cuda::gemv_lever_wanted_by_env("ATTNRES_CUDA_GEMV_BULK");
  im.attention_last_block_merge =
      cuda::gemv_lever_wanted_by_env("ATTNRES_CUDA_ATTN_LAST_BLOCK_MERGE");
  im.depth_phase1_grouped = cuda::gemv_lever_wanted_by_env("ATTNRES_CUDA_PHASE1_GROUPED");
  im.persistent_mlp = cuda::gemv_lever_wanted_by_env("ATTNRES_CUDA_PERSISTENT_MLP");
  im.bank_push_epilogue = cuda::gemv_lever_wanted_by_env("ATTNRES_CUDA_BANK_PUSH_EPILOGUE");
  CUDA_CHECK(cudaStreamCreateWithFlags(&im.stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&im.meta_copied, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&im.rows_copied, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&im.sample_ids_copied, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(im.meta_copied, im.stream));
  CUDA_CHECK(cudaEventRecord(im.rows_copied, im.stream));
  im.allocator = std::make_shared<cuda::CachingAllocator>(device);
  CUBLAS_CHECK(cublasCreate(&im.cublas));
  CUBLAS_CHECK(cublasSetStream(im.cublas, im.stream));
  // A fixed workspace (cuBLAS otherwise allocates its own, which graph capture forbids).
  im.cublas_workspace_bytes = size_t{32} << 20;
  CUDA_CHECK(cudaMalloc(&im.cublas_workspace, im.cublas_workspace_bytes));
  CUBLAS_CHECK(cublasSetWorkspace(im.cublas, im.cublas_workspace, im.cublas_workspace_bytes));
  // CUBLAS_DEFAULT_MATH: no TF32 for f32 GEMMs (the compute type says 32F explicitly too).
  CUBLAS_CHECK(cublasSetMathMode(im.cublas, CUBLAS_DEFAULT_MATH));
  im.lt_gemm = std::make_unique<cuda::LtGemm>(im.cublas_workspace, im.cublas_workspace_bytes);
  // The attention lever's counters (cuda_attention_merge.h), zeroed on the stream so that every
  // launch is ordered after it (the stream does not sync with the legacy stream of cudaMemset).
  im.attention_split_counter_capacity = cuda::attention_split_counter_bound(im.sm_count);
  const size_t counter_bytes =
      static_cast<size_t>(im.attention_split_counter_capacity) * sizeof(int32_t);
  CUDA_CHECK(cudaMalloc(&im.attention_split_counters, counter_bytes));
  CUDA_CHECK(cudaMemsetAsync(im.attention_split_counters, 0, counter_bytes, im.stream));
  // The persistent MLP's barrier words (cuda_persistent_mlp.cu), zeroed the same way.
  const size_t barrier_bytes = cuda::kPersistentMlpBarrierWords * sizeof(unsigned);
  CUDA_CHECK(cudaMalloc(&im.persistent_mlp_barrier, barrier_bytes));
  CUDA_CHECK(cudaMemsetAsync(im.persistent_mlp_barrier, 0, barrier_bytes, im.stream));
}

CudaBackend::~CudaBackend() {
  // Never throws: errors at teardown are ignored. May run on any thread.
  Impl& im = *impl_;
  cuda::ScopedDevice on_device(im.device);
  if (im.stream) cudaStreamSynchronize(im.stream);
  im.lt_gemm.reset();
  if (im.cublas) cublasDestroy(im.cublas);
  if (im.cublas_workspace) cudaFree(im.cublas_workspace);
  if (im.attention_split_counters) cudaFree(im.attention_split_counters);
  if (im.persistent_mlp_barrier) cudaFree(im.persistent_mlp_barrier);
  im.meta_host.reset();  // (a live CudaGraph may still hold them)
  im.rows_host.reset();
  im.sample_host.reset();
  if (im.meta_copied) cudaEventDestroy(im.meta_copied);
  if (im.rows_copied) cudaEventDestroy(im.rows_copied);
  if (im.sample_ids_copied) cudaEventDestroy(im.sample_ids_copied);
  im.meta_device.reset();
  im.rows_device.reset();
  im.act_scratch.reset();
  im.sample_device.reset();
  im.sample_counts.reset();
  if (im.stream) cudaStreamDestroy(im.stream);
  // The allocator lives on while tensors from alloc() do (their deleters hold it).
}

CudaBackend::Impl& CudaBackend::on_device() {
  impl_->use_device();
  cuda::make_launch_context_current(impl_->launch);
  cuda::make_gemv_levers_current(impl_->gemv_levers);
  return *impl_;
}

DType CudaBackend::linear_input_dtype(int64_t rows, DType weight_dtype) const {
  return bf16_linear_inputs() && rows > cuda::kMaxGemvRows && weight_dtype == DType::BF16
             ? DType::BF16
             : DType::F32;
}

void CudaBackend::set_programmatic_launch(bool on) {
  impl_->launch->programmatic = on && impl_->programmatic_launch_supported;
}
bool CudaBackend::programmatic_launch() const { return impl_->launch->programmatic; }
void CudaBackend::set_gemv_deep(bool on) { impl_->gemv_levers->deep = on; }
bool CudaBackend::gemv_deep() const { return impl_->gemv_levers->deep; }
void CudaBackend::set_gemv_weight_prefetch(bool on) { impl_->gemv_levers->weight_prefetch = on; }
bool CudaBackend::gemv_weight_prefetch() const { return impl_->gemv_levers->weight_prefetch; }
void CudaBackend::set_gemv_bulk(bool on) { impl_->gemv_levers->bulk = on; }
bool CudaBackend::gemv_bulk() const { return impl_->gemv_levers->bulk; }
void CudaBackend::set_attention_last_block_merge(bool on) {
  impl_->attention_last_block_merge = on;
}
bool CudaBackend::attention_last_block_merge() const { return impl_->attention_last_block_merge; }
void CudaBackend::set_depth_phase1_grouped(bool on) { impl_->depth_phase1_grouped = on; }
bool CudaBackend::depth_phase1_grouped() const { return impl_->depth_phase1_grouped; }
void CudaBackend::set_persistent_mlp(bool on) { impl_->persistent_mlp = on; }
bool CudaBackend::persistent_mlp() const { return impl_->persistent_mlp; }
void CudaBackend::set_bank_push_epilogue(bool on) { impl_->bank_push_epilogue = on; }
bool CudaBackend::bank_push_epilogue() const { return impl_->bank_push_epilogue; }
CudaBackend::LaunchCounts CudaBackend::launch_counts() const {
  return {impl_->launch->kernels.load(), impl_->launch->cublas_calls.load()};
}

std::string CudaBackend::name() const { return "cuda(" + impl_->device_name + ")"; }
CUstream_st* CudaBackend::stream() const { return impl_->stream; }
int CudaBackend::device_index() const { return impl_->device; }
size_t CudaBackend::allocated_bytes() const { return impl_->allocator->in_use_bytes(); }
size_t CudaBackend::cached_free_bytes() const { return impl_->allocator->cached_free_bytes(); }
cuda::CachingAllocator::Stats CudaBackend::allocator_stats() const {
  return impl_->allocator->stats();
}
size_t CudaBackend::graph_pool_free_bytes() const {
  return impl_->allocator->graph_pool_free_bytes();
}
void CudaBackend::release_cached_memory() {
  synchronize();  // (the allocator's cudaFree calls select its device themselves)
  impl_->allocator->release_cached();
}

Tensor CudaBackend::alloc(const Shape& shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  t.device = Device::CUDA;
  const size_t bytes = t.nbytes();
  if (bytes == 0) return t;  // data stays null, like an empty CPU tensor's view
  Impl& im = on_device();
  t.owner = im.raw_alloc(bytes);
  t.data = t.owner.get();
  CUDA_CHECK(cudaMemsetAsync(t.data, 0, bytes, im.stream));
  return t;
}

Tensor CudaBackend::upload(const Tensor& host) {
  if (host.device == Device::CUDA) return host;  // already here
  const size_t bytes = host.nbytes();
  Tensor t;
  t.shape = host.shape;
  t.dtype = host.dtype;
  t.device = Device::CUDA;
  if (bytes == 0) return t;
  ATTNRES_CHECK(host.data != nullptr, "upload of an undefined tensor " + shape_str(host.shape));
  Impl& im = on_device();
  void* ptr = nullptr;
  CUDA_CHECK(cudaMalloc(&ptr, bytes));
  // The last reference may drop on any thread: free on the device the memory lives on.
  t.owner = std::shared_ptr<void>(ptr, [device = im.device](void* p) {
    cuda::ScopedDevice on_device(device);
    cudaFree(p);  // never throws
  });
  t.data = ptr;
  CUDA_CHECK(cudaMemcpyAsync(ptr, host.data, bytes, cudaMemcpyHostToDevice, im.stream));
  // The host tensor may be freed as soon as we return: wait for the copy (load time only).
  CUDA_CHECK(cudaStreamSynchronize(im.stream));
  return t;
}

void CudaBackend::download(const Tensor& src, void* host_dst) {
  ATTNRES_CHECK(src.device == Device::CUDA, "download of a non-CUDA tensor");
  const size_t bytes = src.nbytes();
  if (bytes) {
    ATTNRES_CHECK(src.data && host_dst, "download: null pointer");
  }
  Impl& im = on_device();
  if (bytes)
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src.data, bytes, cudaMemcpyDeviceToHost, im.stream));
  CUDA_CHECK(cudaStreamSynchronize(im.stream));
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  // F32 into BF16: an entry entering a bf16 depth bank, rounded as f32_to_bf16 rounds it.
  const bool to_bf16 = src.dtype == DType::F32 && dst.dtype == DType::BF16;
  ATTNRES_CHECK(src.shape == dst.shape && (src.dtype == dst.dtype || to_bf16),
                "copy " + shape_str(src.shape) + " " + std::string(dtype_name(src.dtype)) + " -> " +
                    shape_str(dst.shape) + " " + std::string(dtype_name(dst.dtype)));
  ATTNRES_CHECK(src.device == Device::CUDA && dst.device == Device::CUDA,
                "copy: both tensors must be on the CUDA device");
  const size_t src_bytes = src.nbytes(), dst_bytes = dst.nbytes();
  if (src_bytes == 0 || (src.data == dst.data && !to_bf16)) return;
  const char* s = static_cast<const char*>(src.data);
  const char* d = static_cast<const char*>(dst.data);
  ATTNRES_CHECK(s + src_bytes <= d || d + dst_bytes <= s,
                "copy: overlapping source and destination");
  Impl& im = on_device();
  if (to_bf16) {
    cuda::launch_round_to_bf16(src.ptr<float>(), static_cast<uint16_t*>(dst.data), src.numel(),
                               im.stream);
    return;
  }
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src_bytes, cudaMemcpyDeviceToDevice, im.stream));
}

void CudaBackend::fill_zero(Tensor& dst) {
  ATTNRES_CHECK(dst.device == Device::CUDA, "fill_zero of a non-CUDA tensor");
  if (dst.nbytes()) CUDA_CHECK(cudaMemsetAsync(dst.data, 0, dst.nbytes(), on_device().stream));
}

void CudaBackend::synchronize() { CUDA_CHECK(cudaStreamSynchronize(on_device().stream)); }

void CudaBackend::prepare_batch(const BatchMeta& batch) {
  Impl& im = on_device();
  const int64_t T = batch.num_tokens;
  const int S = batch.num_seqs();
  ATTNRES_CHECK(T >= 0 && static_cast<int64_t>(batch.token_ids.size()) == T,
                "prepare_batch: token_ids size");
  ATTNRES_CHECK(static_cast<int64_t>(batch.positions.size()) == T &&
                    static_cast<int64_t>(batch.slot_mapping.size()) == T,
                "prepare_batch: positions / slot_mapping size");
  ATTNRES_CHECK(static_cast<int>(batch.query_start.size()) == S + 1 &&
                    static_cast<int>(batch.block_tables.size()) == S,
                "prepare_batch: query_start / block_tables do not match context_len");
  ATTNRES_CHECK(batch.query_start[0] == 0 && batch.query_start[S] == T,
                "prepare_batch: query_start must run from 0 to T");
  // Every index written into the staging buffer below is checked first: non-decreasing
  // query_start from 0 to T keeps each sequence's rows of seq_of_token inside [0, T). (Checked
  // inside the writing loop, a query_start of [0, 100, 5] with T = 5 would write 100 entries
  // before failing.) Nothing is changed before these checks pass, so a refused batch leaves the
  // previously prepared one intact.
  for (int s = 0; s < S; ++s)
    ATTNRES_CHECK(batch.query_start[s] <= batch.query_start[s + 1],
                  "prepare_batch: query_start decreases at sequence " + std::to_string(s));
  int max_blocks = 1;  // at least one column so the table pointer is never null
  for (const auto& table : batch.block_tables)
    max_blocks = std::max(max_blocks, static_cast<int>(table.size()));

  // Which attention kernel computes which rows: planned once here for every layer's call.
  cuda::AttentionDispatch dispatch = cuda::plan_attention_dispatch(
      batch.query_start, std::span<const int32_t>(batch.positions.data(), T), im.prefill_min_rows);
  const int64_t num_decode_rows = static_cast<int64_t>(dispatch.decode_rows.size());
  const int64_t tile_words = static_cast<int64_t>(dispatch.tiles.size()) *
                             static_cast<int64_t>(sizeof(cuda::PrefillTile) / sizeof(int32_t));

  // Layout of the packed int32 buffer (offsets in elements).
  const int64_t off_ids = 0, off_pos = T, off_slot = 2 * T, off_seq = 3 * T, off_qs = 4 * T;
  const int64_t off_ctx = off_qs + S + 1, off_tab = off_ctx + S;
  const int64_t off_decode = off_tab + static_cast<int64_t>(S) * max_blocks;
  const int64_t off_tiles = off_decode + num_decode_rows;
  const int64_t total = off_tiles + tile_words;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(total, 1)) * sizeof(int32_t);

  if (im.capturing()) {
    // See Impl::meta_staged_in_capture.
    ATTNRES_CHECK(!im.meta_staged_in_capture,
                  "prepare_batch: a captured step may prepare one batch (every copy in the graph "
                  "would read the last one packed)");
    ATTNRES_CHECK(bytes <= im.meta_host_bytes,
                  "prepare_batch: this batch needs a larger pinned staging buffer, which cannot "
                  "be allocated during a graph capture: run the step eagerly once first");
    im.meta_staged_in_capture = true;
  } else {
    // The previous copy (an eager step's or a replay's) must be done reading the staging
    // buffer before we rewrite it.
    CUDA_CHECK(cudaEventSynchronize(im.meta_copied));
  }
  if (bytes > im.meta_host_bytes) {
    const size_t grown = std::max(bytes, im.meta_host_bytes * 2);
    im.meta_host.reset();  // freed first: the peak is the new one alone
    im.meta_host_bytes = 0;
    im.meta_host = im.pinned_host(grown);
    im.meta_host_bytes = grown;
  }
  if (bytes > im.meta_device_bytes) {
    const size_t grown = std::max(bytes, im.meta_device_bytes * 2);
    im.meta_device = im.raw_alloc(grown);  // the old block returns to the cache (stream-ordered)
    im.meta_device_bytes = grown;
  }

  int32_t* h = static_cast<int32_t*>(im.meta_host.get());
  int32_t min_id = 0, max_id = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = batch.token_ids[t];
    min_id = t == 0 ? id : std::min(min_id, id);
    max_id = t == 0 ? id : std::max(max_id, id);
  }
  std::memcpy(h + off_ids, batch.token_ids.data(), T * sizeof(int32_t));
  std::memcpy(h + off_pos, batch.positions.data(), T * sizeof(int32_t));
  std::memcpy(h + off_slot, batch.slot_mapping.data(), T * sizeof(int32_t));
  for (int s = 0; s < S; ++s)
    for (int32_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) h[off_seq + t] = s;
  std::memcpy(h + off_qs, batch.query_start.data(), (S + 1) * sizeof(int32_t));
  if (S) std::memcpy(h + off_ctx, batch.context_len.data(), S * sizeof(int32_t));
  for (int s = 0; s < S; ++s) {
    const auto& table = batch.block_tables[s];
    int32_t* row = h + off_tab + static_cast<int64_t>(s) * max_blocks;
    std::fill(row, row + max_blocks, 0);
    std::copy(table.begin(), table.end(), row);
  }

  std::copy(dispatch.decode_rows.begin(), dispatch.decode_rows.end(), h + off_decode);
  if (tile_words) std::memcpy(h + off_tiles, dispatch.tiles.data(), tile_words * sizeof(int32_t));

  int32_t* d = static_cast<int32_t*>(im.meta_device.get());
  CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, im.stream));
  if (!im.capturing()) CUDA_CHECK(cudaEventRecord(im.meta_copied, im.stream));  // not in a graph

  im.prepared = &batch;
  im.num_tokens = static_cast<int>(T);
  im.num_seqs = S;
  im.max_blocks = max_blocks;
  im.min_token_id = min_id;
  im.max_token_id = max_id;
  im.token_ids = d + off_ids;
  im.positions = d + off_pos;
  im.slot_mapping = d + off_slot;
  im.seq_of_token = d + off_seq;
  im.query_start = d + off_qs;
  im.context_len = d + off_ctx;
  im.block_table = d + off_tab;
  im.decode_rows = num_decode_rows ? d + off_decode : nullptr;
  im.prefill_tiles = tile_words ? reinterpret_cast<cuda::PrefillTile*>(d + off_tiles) : nullptr;
  im.attention_dispatch = std::move(dispatch);
  im.validated_num_blocks = im.validated_block_size = -1;
}

void CudaBackend::set_prefill_min_rows(int rows) {
  ATTNRES_CHECK(rows >= 1, "set_prefill_min_rows: " + std::to_string(rows) + " (must be >= 1)");
  impl_->prefill_min_rows = rows;
  impl_->prepared = nullptr;  // the next op re-plans the batch
}

std::shared_ptr<void> CudaBackend::Impl::pinned_host(size_t bytes) const {
  void* ptr = nullptr;
  CUDA_CHECK(cudaMallocHost(&ptr, bytes));
  return std::shared_ptr<void>(ptr, [device = device](void* p) {
    cuda::ScopedDevice on_device(device);
    cudaFreeHost(p);  // never throws
  });
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

}  // namespace attnres
