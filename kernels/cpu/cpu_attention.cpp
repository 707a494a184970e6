// store_kv and causal GQA attention over a paged KV cache.
//
// Cache layout (per layer): K, V [num_blocks, block_size, Hkv, hd] f32 or bf16; token
// position p of sequence s lives in physical block block_tables[s][p / block_size] at offset
// p % block_size. A query token t (row t of q [T, Hq * hd]) of sequence s attends to
// positions 0..positions[t] inclusive, which covers both a cached prefix and the tokens of
// this step (store_kv runs first). Query head h reads KV head h / (Hq / Hkv).
//
// One work item per (token, KV head), parallel over all of them: each item computes the
// scores of the KV head's query heads (q . k * scale, kept in a per-thread buffer), takes the
// max, exponentiates, and accumulates the weighted V rows — an exact two-pass softmax in f32.
// KV rows are hd contiguous values, so every dot / axpy is a straight SIMD loop; a bf16 cache
// (--kv-cache-dtype bfloat16) is rounded to nearest even by store_kv and widened in registers
// by the same loops, so its attention equals the f32 cache's over K/V rounded to bf16, bit
// for bit.
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

constexpr int64_t kKeyBlock = 16;  // keys whose scores share one hsum_many
constexpr int64_t kOutVecs = 4;    // output vectors per head kept in registers across keys

// Scores of `group` query heads against `count` keys (K rows krow[0 .. count)) of one KV
// head, into scores[g][0 .. count); each score is exactly cpu::dot_w (its folded vector's
// hsum, shared with the block's other keys through hsum_many, plus the scalar tail) * scale.
template <DType W>
void score_block(const float* const* qh, int64_t group, const cpu::StoredT<W>* const* krow,
                 int64_t count, int64_t hd, float scale, float* const* scores) {
  for (int64_t g = 0; g < group; ++g) {
    cpu::VecF folded[kKeyBlock];
    for (int64_t i = 0; i < count; ++i) folded[i] = cpu::dot_w_fold<W>(qh[g], krow[i], hd);
    float sums[kKeyBlock];
    cpu::hsum_many(folded, static_cast<int>(count), sums);
    for (int64_t i = 0; i < count; ++i)
      scores[g][i] = cpu::dot_w_tail<W>(qh[g], krow[i], hd, sums[i]) * scale;
  }
}

// oh[i] = sum over the keys p in order of fma(weights[p], v_p[i], .), from 0: per element the
// same chain of FMAs whatever the tiling, with kOutVecs vectors of oh held in registers while
// the keys stream by.
template <DType W>
void weighted_sum(const float* weights, const cpu::StoredT<W>* const* vrow, int64_t ctx,
                  int64_t hd, float* oh) {
  using cpu::kLanes;
  int64_t i0 = 0;
  for (; i0 + kOutVecs * kLanes <= hd; i0 += kOutVecs * kLanes) {
    cpu::VecF acc[kOutVecs];
    for (int64_t j = 0; j < kOutVecs; ++j) acc[j] = cpu::vzero();
    for (int64_t p = 0; p < ctx; ++p) {
      const cpu::VecF w = cpu::vset1(weights[p]);
      for (int64_t j = 0; j < kOutVecs; ++j)
        acc[j] = cpu::vfma(w, cpu::vload_w<W>(vrow[p] + i0 + j * kLanes), acc[j]);
    }
    for (int64_t j = 0; j < kOutVecs; ++j) cpu::vstore(oh + i0 + j * kLanes, acc[j]);
  }
  for (; i0 + kLanes <= hd; i0 += kLanes) {
    cpu::VecF acc = cpu::vzero();
    for (int64_t p = 0; p < ctx; ++p)
      acc = cpu::vfma(cpu::vset1(weights[p]), cpu::vload_w<W>(vrow[p] + i0), acc);
    cpu::vstore(oh + i0, acc);
  }
  for (; i0 < hd; ++i0) {
    float acc = 0.0f;
    for (int64_t p = 0; p < ctx; ++p)
      acc = std::fma(weights[p], cpu::load_scalar<W>(vrow[p] + i0), acc);
    oh[i0] = acc;
  }
}

// One layer's attention over a cache stored as W (the body of CpuBackend::attention). A work
// item is one token and one KV head with its `group` query heads, so the K / V rows the heads
// share are still in L1 / L2 when the next head reads them. What a query computes depends only on its q, its positions'
// K / V and its context length, never on the other items: decode and prefill round alike.
template <DType W>
void attend(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
            const std::vector<int32_t>& seq_of, int64_t max_ctx, int64_t hd, int64_t hq,
            int64_t group, float scale, cpu::WorkerPool& pool, int threads, Tensor& out) {
  using S = cpu::StoredT<W>;
  const int64_t hkv = cache.k.dim(2), block_size = cache.k.dim(1);
  const S* kc = cache.k.ptr<S>();
  const S* vc = cache.v.ptr<S>();
  const int64_t t_dim = cpu::rows_of(q);
  const int64_t items = t_dim * hkv;
  cpu::DynamicSchedule schedule(items, 2);
  pool.run(threads > 1 && items > 1 ? threads : 1, [&](int, int) {
    std::vector<float> scores(static_cast<size_t>(max_ctx * group));
    std::vector<const S*> krows(static_cast<size_t>(max_ctx)), vrows(krows.size());
    std::vector<const float*> qh(static_cast<size_t>(group));
    std::vector<float*> score_rows(qh.size());
    for (int64_t item : schedule.claims()) {
      const int64_t t = item / hkv, kvh = item % hkv;
      const auto& table = batch.block_tables[seq_of[t]];
      const int64_t ctx = batch.positions[t] + 1;
      for (int64_t p = 0; p < ctx; ++p) {
        const int64_t slot = table[p / block_size] * block_size + p % block_size;
        krows[p] = kc + (slot * hkv + kvh) * hd;
        vrows[p] = vc + (slot * hkv + kvh) * hd;
      }
      for (int64_t g = 0; g < group; ++g) qh[g] = q.ptr<float>() + t * hq * hd + (kvh * group + g) * hd;
      for (int64_t p0 = 0; p0 < ctx; p0 += kKeyBlock) {
        for (int64_t g = 0; g < group; ++g) score_rows[g] = scores.data() + g * max_ctx + p0;
        score_block<W>(qh.data(), group, krows.data() + p0, std::min(kKeyBlock, ctx - p0), hd,
                       scale, score_rows.data());
      }
      for (int64_t g = 0; g < group; ++g) {
        float* sc = scores.data() + g * max_ctx;
        const float denom = cpu::softmax_numerators(sc, ctx);
        float* oh = out.ptr<float>() + t * hq * hd + (kvh * group + g) * hd;
        weighted_sum<W>(sc, vrows.data(), ctx, hd, oh);
        const float inv = 1.0f / denom;
        for (int64_t i = 0; i < hd; ++i) oh[i] *= inv;
      }
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
      cpu::store_row_bf16(cache.k.ptr<uint16_t>() + slot * row, k.ptr<float>() + t * row, row);
      cpu::store_row_bf16(cache.v.ptr<uint16_t>() + slot * row, v.ptr<float>() + t * row, row);
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
