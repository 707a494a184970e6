// CudaBackend store_kv and attention (the kernels: cuda_attention.cu, flash-decoding, and
// cuda_prefill_attention.cu, the tensor-core prefill; cuda_attention_dispatch.h plans which).
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_attention_merge.h"
#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_op_checks.h"

namespace attnres {
using namespace cuda_ops;

void cuda_ops::check_cache(const KvCacheLayer& cache) {
  ATTNRES_CHECK(cache.k.device == Device::CUDA && cache.v.device == Device::CUDA,
                "kv cache must be on the CUDA device");
}

namespace {

// The host-side checks the CPU makes inline: every slot inside the cache, every block id
// valid, every position inside its sequence's context and block table.
void validate_batch_against_cache(const BatchMeta& batch, int64_t num_blocks, int64_t block_size) {
  const int64_t slots = num_blocks * block_size;
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int64_t slot = batch.slot_mapping[t];
    ATTNRES_CHECK(slot >= 0 && slot < slots, "store_kv slot " + std::to_string(slot) +
                                                 " out of range " + std::to_string(slots));
  }
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const auto& table = batch.block_tables[s];
    for (int64_t b : table)
      ATTNRES_CHECK(b >= 0 && b < num_blocks, "attention: block id " + std::to_string(b));
    for (int64_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) {
      const int64_t pos = batch.positions[t];
      ATTNRES_CHECK(pos >= 0 && pos < batch.context_len[s] &&
                        pos < static_cast<int64_t>(table.size()) * block_size,
                    "attention: position " + std::to_string(pos) + " outside the context");
    }
  }
}

}  // namespace

int64_t cuda_ops::check_store_kv(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                                 const KvCacheLayer& cache) {
  check_cache(cache);
  check_cuda(k, "store_kv k");
  check_cuda(v, "store_kv v");
  (void)batch;                             // Backend checked its slots against k and v
  return cache.k.dim(2) * cache.k.dim(3);  // Hkv * hd
}

void CudaBackend::Impl::validate_against_cache(const BatchMeta& batch, const KvCacheLayer& cache) {
  if (validated_num_blocks == cache.k.dim(0) && validated_block_size == cache.k.dim(1)) return;
  validate_batch_against_cache(batch, cache.k.dim(0), cache.k.dim(1));
  validated_num_blocks = cache.k.dim(0);
  validated_block_size = cache.k.dim(1);
}

void CudaBackend::store_kv_impl(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                                KvCacheLayer& cache) {
  Impl& im = on_device();
  const int64_t row = check_store_kv(k, v, batch, cache);
  im.ensure_prepared(*this, batch);
  im.validate_against_cache(batch, cache);
  cuda::launch_store_kv(f32(k), f32(v), im.slot_mapping, rows_of(k), row, cache.k.data,
                        cache.v.data, cache.k.dtype, im.stream);
}

void CudaBackend::attention_impl(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
                                 int head_dim, float scale, Tensor& out) {
  Impl& im = on_device();
  check_cache(cache);
  const int64_t hd = head_dim, hkv = cache.k.dim(2);
  ATTNRES_CHECK(hd <= cuda::kMaxAttentionHeadDim,
                "attention: head_dim " + std::to_string(hd) + " above the CUDA kernel's 256");
  const int64_t hq = q.dim(-1) / hd;
  check_cuda(q, "attention q");
  check_cuda(out, "attention out");
  const int64_t T = rows_of(q);
  im.ensure_prepared(*this, batch);
  im.validate_against_cache(batch, cache);
  // Prefill chunks (a sequence with at least kPrefillMinRows rows) on tensor cores, every
  // other row by flash-decoding; the prepared batch holds the plan (cuda_attention_dispatch.h).
  // A shape the prefill kernel does not take leaves every row to flash-decoding.
  const cuda::AttentionDispatch& dispatch = im.attention_dispatch;
  const bool use_prefill = !dispatch.tiles.empty() &&
                           cuda::prefill_attention_supports(static_cast<int>(hd), cache.k.dtype,
                                                            cache.k.data, cache.v.data) &&
                           reinterpret_cast<uintptr_t>(q.data) % 8 == 0 &&
                           reinterpret_cast<uintptr_t>(out.data) % 8 == 0;
  cuda::PagedCacheAttention common;
  common.q = f32(q);
  common.k_cache = cache.k.data;
  common.v_cache = cache.v.data;
  common.kv_dtype = cache.k.dtype;
  common.positions = im.positions;
  common.block_table = im.block_table;
  common.max_blocks = im.max_blocks;
  common.hq = static_cast<int>(hq);
  common.hkv = static_cast<int>(hkv);
  common.head_dim = static_cast<int>(hd);
  common.block_size = static_cast<int>(cache.k.dim(1));
  common.scale = scale;
  common.out = out.data;
  common.out_dtype = out.dtype;
  if (use_prefill) {
    cuda::PrefillAttentionArgs pre;
    static_cast<cuda::PagedCacheAttention&>(pre) = common;
    pre.tiles = im.prefill_tiles;
    pre.num_tiles = static_cast<int>(dispatch.tiles.size());
    cuda::launch_prefill_attention(pre, im.stream);
    if (dispatch.decode_rows.empty()) return;
  }
  cuda::PagedAttentionArgs args;
  static_cast<cuda::PagedCacheAttention&>(args) = common;
  args.seq_of_token = im.seq_of_token;
  args.num_tokens = use_prefill ? static_cast<int64_t>(dispatch.decode_rows.size()) : T;
  args.rows = use_prefill ? im.decode_rows : nullptr;
  // Split the context across CTAs when the batch alone cannot fill the GPU (decode at small
  // batch); the partial results live in scratch until the merge kernel has read them (the
  // block returns to the cache when `partials` dies, stream-ordered like every tensor).
  int max_context = 0;
  if (use_prefill) {
    max_context = dispatch.decode_max_context;
  } else {
    for (int32_t pos : batch.positions) max_context = std::max(max_context, pos + 1);
  }
  const cuda::AttentionSplitPlan plan =
      cuda::plan_attention_splits(args.num_tokens, args.hq, args.hkv, max_context, im.sm_count);
  args.num_splits = plan.num_splits;
  args.split_len = plan.split_len;
  std::shared_ptr<void> partials;
  if (const int64_t floats = cuda::attention_partial_floats(args); floats > 0) {
    partials = im.raw_alloc(static_cast<size_t>(floats) * sizeof(float));
    args.partials = static_cast<float*>(partials.get());
  }
  // The last-block merge lever: the split CTAs merge, no merge kernel (cuda_attention_merge.h).
  cuda::AttentionSplitCounters counters;
  if (im.attention_last_block_merge)
    counters = {im.attention_split_counters, im.attention_split_counter_capacity};
  cuda::launch_paged_attention(args, counters, im.stream);
}

}  // namespace attnres
