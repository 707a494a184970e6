// store_kv and causal GQA attention over a paged KV cache.
//
// Cache layout (per layer): K, V [num_blocks, block_size, Hkv, hd] f32 or bf16; token
// position p of sequence s lives in physical block block_tables[s][p / block_size] at offset
// p % block_size. A query token t (row t of q [T, Hq * hd]) of sequence s attends to
// positions 0..positions[t] inclusive, which covers both a cached prefix and the tokens of
// this step (store_kv runs first). Query head h reads KV head h / (Hq / Hkv).
//
// One work item per (token, query head), parallel over all of them: each item walks the
// sequence's blocks once for the scores (q . k * scale, kept in a per-thread buffer), takes
// the max, exponentiates, and accumulates the weighted V rows — an exact two-pass softmax in
// f32. KV rows are hd contiguous values, so every dot / axpy is a straight SIMD loop; a bf16
// cache (--kv-cache-dtype bfloat16) is rounded to nearest even by store_kv and widened in
// registers by the same loops (cpu::dot_w / scale_add_w), so its attention equals the f32
// cache's over K/V rounded to bf16, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_simd.h"

namespace attnres {
namespace {

void check_cache(const KvCacheLayer& cache) {
  ATTNRES_CHECK(cache.k.rank() == 4 && cache.k.shape == cache.v.shape,
                "kv cache k " + shape_str(cache.k.shape) + " v " + shape_str(cache.v.shape));
  ATTNRES_CHECK(cache.k.dtype == cache.v.dtype &&
                    (cache.k.dtype == DType::F32 || cache.k.dtype == DType::BF16),
                "the CPU kv cache must be F32 or BF16");
  ATTNRES_CHECK(cache.k.device == Device::CPU && cache.v.device == Device::CPU,
                "kv cache must be on the CPU");
}

// dst[i] = x[i] rounded to bf16 (nearest even, as f32_to_bf16).
void store_row_bf16(uint16_t* dst, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(x[i]);
}

// One layer's attention over a cache stored as W (the body of CpuBackend::attention).
template <DType W>
void attend(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
            const std::vector<int32_t>& seq_of, int64_t max_ctx, int64_t hd, int64_t hq,
            int64_t group, float scale, cpu::WorkerPool& pool, int threads, Tensor& out) {
  using S = cpu::StoredT<W>;
  const int64_t hkv = cache.k.dim(2), block_size = cache.k.dim(1);
  const S* kc = cache.k.ptr<S>();
  const S* vc = cache.v.ptr<S>();
  const int64_t t_dim = cpu::rows_of(q);
  const int64_t items = t_dim * hq;
  cpu::DynamicSchedule schedule(items, 4);
  pool.run(threads > 1 && items > 1 ? threads : 1, [&](int, int) {
    std::vector<float> scores(static_cast<size_t>(max_ctx));
    for (int64_t item : schedule.claims()) {
      const int64_t t = item / hq, h = item % hq, kvh = h / group;
      const auto& table = batch.block_tables[seq_of[t]];
      const int64_t ctx = batch.positions[t] + 1;
      const float* qh = q.ptr<float>() + t * hq * hd + h * hd;
      float* oh = out.ptr<float>() + t * hq * hd + h * hd;
      float max_score = -INFINITY;
      for (int64_t p = 0; p < ctx; ++p) {
        const int64_t slot = table[p / block_size] * block_size + p % block_size;
        const float sc = cpu::dot_w<W>(qh, kc + (slot * hkv + kvh) * hd, hd) * scale;
        scores[p] = sc;
        max_score = std::max(max_score, sc);
      }
      float denom = 0.0f;
      for (int64_t p = 0; p < ctx; ++p) {
        scores[p] = std::exp(scores[p] - max_score);
        denom += scores[p];
      }
      std::fill(oh, oh + hd, 0.0f);
      for (int64_t p = 0; p < ctx; ++p) {
        const int64_t slot = table[p / block_size] * block_size + p % block_size;
        cpu::scale_add_w<W>(oh, 1.0f, scores[p], vc + (slot * hkv + kvh) * hd, hd);
      }
      const float inv = 1.0f / denom;
      for (int64_t i = 0; i < hd; ++i) oh[i] *= inv;
    }
  });
}

}  // namespace

void CpuBackend::store_kv(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                          KvCacheLayer& cache) {
  check_cache(cache);
  const int64_t row = cache.k.dim(2) * cache.k.dim(3);  // Hkv * hd
  const int64_t slots = cache.k.dim(0) * cache.k.dim(1);
  cpu::check_f32_rows(k, row, "store_kv k");
  cpu::check_f32_rows(v, row, "store_kv v");
  const int64_t t_dim = cpu::rows_of(k);
  ATTNRES_CHECK(cpu::rows_of(v) == t_dim && t_dim == batch.num_tokens &&
                    static_cast<int64_t>(batch.slot_mapping.size()) == t_dim,
                "store_kv: T mismatch");
  const bool bf16 = cache.k.dtype == DType::BF16;
  for (int64_t t = 0; t < t_dim; ++t) {
    const int64_t slot = batch.slot_mapping[t];
    ATTNRES_CHECK(slot >= 0 && slot < slots, "store_kv slot " + std::to_string(slot) +
                                                 " out of range " + std::to_string(slots));
    if (bf16) {
      store_row_bf16(cache.k.ptr<uint16_t>() + slot * row, k.ptr<float>() + t * row, row);
      store_row_bf16(cache.v.ptr<uint16_t>() + slot * row, v.ptr<float>() + t * row, row);
    } else {
      std::memcpy(cache.k.ptr<float>() + slot * row, k.ptr<float>() + t * row, row * 4);
      std::memcpy(cache.v.ptr<float>() + slot * row, v.ptr<float>() + t * row, row * 4);
    }
  }
}

void CpuBackend::attention(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
                           int head_dim, float scale, Tensor& out) {
  check_cache(cache);
  const int64_t hd = head_dim, hkv = cache.k.dim(2), block_size = cache.k.dim(1);
  const int64_t num_blocks = cache.k.dim(0);
  ATTNRES_CHECK(hd > 0 && cache.k.dim(3) == hd, "attention head_dim " + std::to_string(hd) +
                                                    " vs cache " + shape_str(cache.k.shape));
  ATTNRES_CHECK(q.rank() >= 1 && q.dim(-1) % hd == 0, "attention q " + shape_str(q.shape));
  const int64_t hq = q.dim(-1) / hd;
  ATTNRES_CHECK(hq % hkv == 0, "attention: Hq must be a multiple of Hkv");
  const int64_t group = hq / hkv;
  cpu::check_f32_rows(q, hq * hd, "attention q");
  cpu::check_f32_rows(out, hq * hd, "attention out");
  const int64_t t_dim = cpu::rows_of(q);
  ATTNRES_CHECK(cpu::rows_of(out) == t_dim && t_dim == batch.num_tokens &&
                    static_cast<int64_t>(batch.positions.size()) == t_dim,
                "attention: T mismatch");
  const int num_seqs = batch.num_seqs();
  ATTNRES_CHECK(static_cast<int>(batch.query_start.size()) == num_seqs + 1 &&
                    static_cast<int>(batch.block_tables.size()) == num_seqs &&
                    batch.query_start[0] == 0 && batch.query_start[num_seqs] == t_dim,
                "attention: query_start / block_tables do not match the batch");

  // Token -> sequence, validating every position against its block table up front.
  std::vector<int32_t> seq_of(static_cast<size_t>(t_dim));
  int64_t max_ctx = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const auto& table = batch.block_tables[s];
    for (int64_t b : table)
      ATTNRES_CHECK(b >= 0 && b < num_blocks, "attention: block id " + std::to_string(b));
    ATTNRES_CHECK(batch.query_start[s] <= batch.query_start[s + 1], "attention: query_start");
    for (int64_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) {
      const int64_t pos = batch.positions[t];
      ATTNRES_CHECK(pos >= 0 && pos < batch.context_len[s] &&
                        pos < static_cast<int64_t>(table.size()) * block_size,
                    "attention: position " + std::to_string(pos) + " outside the context");
      seq_of[t] = s;
      max_ctx = std::max(max_ctx, pos + 1);
    }
  }

  if (cache.k.dtype == DType::BF16) {
    attend<DType::BF16>(q, cache, batch, seq_of, max_ctx, hd, hq, group, scale, *pool_, threads_,
                        out);
  } else {
    attend<DType::F32>(q, cache, batch, seq_of, max_ctx, hd, hq, group, scale, *pool_, threads_,
                       out);
  }
}

}  // namespace attnres
