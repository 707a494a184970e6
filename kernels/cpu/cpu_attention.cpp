// store_kv and causal GQA attention over a paged KV cache.
//
// Cache layout (per layer): K, V [num_blocks, block_size, Hkv, hd] f32 or bf16; token
// position p of sequence s lives in physical block block_tables[s][p / block_size] at offset
// p % block_size. A query token t (row t of q [T, Hq * hd]) of sequence s attends to
// positions 0..positions[t] inclusive, which covers both a cached prefix and the tokens of
// this step (store_kv runs first). Query head h reads KV head h / (Hq / Hkv).
//
// One work item per (tile of up to kTileTokens consecutive query tokens of a sequence, KV
// head), parallel over all of them. Its rows are the tile's query heads of that KV head; for
// them it computes the scores (q . k * scale, kept in a per-thread buffer), takes each row's
// max, exponentiates, and accumulates the weighted V rows: an exact two-pass softmax in f32.
// The rows share the loads: a block of 16 K rows is widened to f32 once and each K vector
// feeds kRowBlock rows' dot products; each V vector feeds kRowBlock rows' sums. Items run in
// KV-head-major order, so the K / V rows of the head the threads work on stay in L2 (token-
// major, every item touched every head's rows: a 512-token 0.6B layer's 2 MB of K / V came
// from L3 for each item). Every row's
// arithmetic is what it would be alone (the same FMA chains in the same order), so decode and
// prefill round alike. A bf16 cache (--kv-cache-dtype bfloat16) is rounded to nearest even by
// store_kv and widened exactly, so its attention equals the f32 cache's over K/V rounded to
// bf16, bit for bit. (Per (token, KV head) items, each K / V row widened per query head, took
// 18% of a 512-token 0.6B prefill once the linears used bf16 inputs: docs/BENCHMARKS.md.)
// The K and V rows are prefetched kPrefetchKeys keys ahead (a head's rows are strided across
// pages): 1.5-1.9x faster decode at 4096 tokens of context.
// With bf16 inputs over a bf16 cache (CpuBackend::set_bf16_linear_inputs), the same items and
// row blocks run cpu_attention_bf16.h's arithmetic instead: q rounded to bf16 once per item,
// scores by vdpbf16ps against K as stored (no widening), and the V sum from bf16 weights a key
// pair per instruction.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_attention_bf16.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_simd.h"

namespace attnres {
namespace {

// The cache's shape and dtype are Backend's checks (backend.cpp); its device is this one's.
void check_cache(const KvCacheLayer& cache) {
  ATTNRES_CHECK(cache.k.device == Device::CPU && cache.v.device == Device::CPU,
                "kv cache must be on the CPU");
}

constexpr int64_t kKeyBlock = 16;   // keys whose scores share one hsum_many per row
constexpr int64_t kOutVecs = 4;     // output vectors per row kept in registers across keys
constexpr int64_t kTileTokens = 8;  // query tokens of one sequence per work item
constexpr int kRowBlock = 4;        // query rows (tokens x heads) sharing each K / V load

using cpu::kLanes;
using cpu::VecF;

// Keys ahead whose K / V rows are prefetched into L2 while the current ones are multiplied.
// A KV head's rows of consecutive positions are Hkv * hd elements apart (2 KB at the 0.6B
// shape in bf16), so a head's scan touches a new page every few keys, where the hardware
// prefetchers stop: without these a long-context decode ran at 57% of the bandwidth floor.
constexpr int64_t kPrefetchKeys = 32;

// Asks for the cache lines of [p, p + bytes) into L2 (prefetcht1).
inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 2);
}

// The folded score vectors of R query rows q[0 .. R) against the keys kf[0 .. count) (f32
// rows of hd: the K rows, widened when stored in bf16): folded[r][i] = dot_w_fold<F32>(q[r],
// kf[i], hd), two keys at a time so that each K vector is loaded once for all R rows. Each
// (row, key) pair runs dot_w_fold's two FMA chains in its order, so the bits are those of
// dot_w_fold over the stored row (widening is exact).
template <int R>
void fold_rows(const float* const* q, const float* const* kf, int64_t count, int64_t hd,
               VecF (*folded)[kKeyBlock]) {
  for (int64_t i = 0; i < count; i += 2) {
    const float* k0 = kf[i];
    const float* k1 = i + 1 < count ? kf[i + 1] : kf[i];  // an odd last key: computed twice
    VecF a0[R][2], a1[R][2];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 2; ++j) a0[r][j] = a1[r][j] = cpu::vzero();
    int64_t e = 0;
    for (; e + 2 * kLanes <= hd; e += 2 * kLanes) {
      const VecF k00 = cpu::vload(k0 + e), k01 = cpu::vload(k0 + e + kLanes);
      const VecF k10 = cpu::vload(k1 + e), k11 = cpu::vload(k1 + e + kLanes);
      for (int r = 0; r < R; ++r) {
        const VecF qa = cpu::vload(q[r] + e), qb = cpu::vload(q[r] + e + kLanes);
        a0[r][0] = cpu::vfma(qa, k00, a0[r][0]);
        a1[r][0] = cpu::vfma(qb, k01, a1[r][0]);
        a0[r][1] = cpu::vfma(qa, k10, a0[r][1]);
        a1[r][1] = cpu::vfma(qb, k11, a1[r][1]);
      }
    }
    for (; e + kLanes <= hd; e += kLanes) {
      const VecF k0v = cpu::vload(k0 + e), k1v = cpu::vload(k1 + e);
      for (int r = 0; r < R; ++r) {
        const VecF qa = cpu::vload(q[r] + e);
        a0[r][0] = cpu::vfma(qa, k0v, a0[r][0]);
        a0[r][1] = cpu::vfma(qa, k1v, a0[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      folded[r][i] = cpu::vadd(a0[r][0], a1[r][0]);
      if (i + 1 < count) folded[r][i + 1] = cpu::vadd(a0[r][1], a1[r][1]);
    }
  }
}

// oh[r][e] for e in [e0, e0 + C * kLanes), r < R: the chain of fma(weights[r][p], v_p[e], .) over
// the keys p in [p_begin, p_end) in order, from zero or (from_zero false) from oh's current
// values; each V vector is loaded and widened once for all R rows.
template <DType W, int R, int C>
void weighted_block(const float* const* weights, const cpu::StoredT<W>* const* vrow,
                    int64_t p_begin, int64_t p_end, int64_t e0, bool from_zero, float* const* oh) {
  VecF acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      acc[r][c] = from_zero ? cpu::vzero() : cpu::vload(oh[r] + e0 + c * kLanes);
  constexpr int64_t kChunkBytes = C * kLanes * static_cast<int64_t>(sizeof(cpu::StoredT<W>));
  for (int64_t p = p_begin; p < p_end; ++p) {
    if (p + kPrefetchKeys < p_end) prefetch_bytes(vrow[p + kPrefetchKeys] + e0, kChunkBytes);
    VecF v[C];
    for (int c = 0; c < C; ++c) v[c] = cpu::vload_w<W>(vrow[p] + e0 + c * kLanes);
    for (int r = 0; r < R; ++r) {
      const VecF w = cpu::vset1(weights[r][p]);
      for (int c = 0; c < C; ++c) acc[r][c] = cpu::vfma(w, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) cpu::vstore(oh[r] + e0 + c * kLanes, acc[r][c]);
}

// oh[r][e] = sum over the keys p in [p_begin, p_end) in order of fma(weights[r][p], v_p[e], .),
// continuing from zero (from_zero) or from oh: per element the same chain of FMAs whatever
// the tiling and however the key range is split, kOutVecs vectors of R rows held in registers
// while the keys stream by.
template <DType W, int R>
void weighted_rows(const float* const* weights, const cpu::StoredT<W>* const* vrow, int64_t p_begin,
                   int64_t p_end, int64_t hd, bool from_zero, float* const* oh) {
  int64_t e0 = 0;
  for (; e0 + kOutVecs * kLanes <= hd; e0 += kOutVecs * kLanes)
    weighted_block<W, R, kOutVecs>(weights, vrow, p_begin, p_end, e0, from_zero, oh);
  for (; e0 + kLanes <= hd; e0 += kLanes)
    weighted_block<W, R, 1>(weights, vrow, p_begin, p_end, e0, from_zero, oh);
  for (; e0 < hd; ++e0) {
    for (int r = 0; r < R; ++r) {
      float acc = from_zero ? 0.0f : oh[r][e0];
      for (int64_t p = p_begin; p < p_end; ++p)
        acc = std::fma(weights[r][p], cpu::load_scalar<W>(vrow[p] + e0), acc);
      oh[r][e0] = acc;
    }
  }
}

// x[i] *= c for i < n: the same product per element as a scalar loop, a vector at a time.
inline void scale_in_place(float* x, int64_t n, float c) {
  const VecF vc = cpu::vset1(c);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) cpu::vstore(x + i, cpu::vmul(cpu::vload(x + i), vc));
  for (; i < n; ++i) x[i] *= c;
}

// Runs F<R> for a block of r rows (1 <= r <= kRowBlock), R chosen once per call.
template <template <int> class F, class... Args>
void for_rows(int r, Args&&... args) {
  switch (r) {
    case 1:
      return F<1>::run(args...);
    case 2:
      return F<2>::run(args...);
    case 3:
      return F<3>::run(args...);
    default:
      return F<4>::run(args...);
  }
}
template <int R>
struct FoldRows {
  static void run(const float* const* q, const float* const* kf, int64_t count, int64_t hd,
                  VecF (*folded)[kKeyBlock]) {
    fold_rows<R>(q, kf, count, hd, folded);
  }
};
template <DType W>
struct WeightedRows {
  template <int R>
  struct Of {
    static void run(const float* const* weights, const cpu::StoredT<W>* const* vrow,
                    int64_t p_begin, int64_t p_end, int64_t hd, bool from_zero, float* const* oh) {
      weighted_rows<W, R>(weights, vrow, p_begin, p_end, hd, from_zero, oh);
    }
  };
};

// Bf16In's two stages (cpu_attention_bf16.h), declared on every build so that attend's
// branches for them parse; defined, and instantiated, only where AVX512_BF16 is.
template <DType W>
void score_block_bf16(const uint16_t* const* q16, const uint16_t* const* krows, int64_t count,
                      int64_t p0, int rows, const int64_t* ctx, int64_t hd, float scale,
                      float* const* srow, VecF (*folded)[kKeyBlock]);
template <DType W>
void weigh_values_bf16(const uint16_t* const* prow, const uint16_t* const* vrows,
                       const uint16_t* zero_row, int rows, const int64_t* ctx, int64_t hd,
                       float* const* orow);

#if defined(__AVX512BF16__)
template <int R>
struct FoldRowsBf16 {
  static void run(const uint16_t* const* q, const uint16_t* const* k, int64_t count, int64_t hd,
                  VecF (*folded)[kKeyBlock]) {
    cpu::fold_rows_bf16<R, kKeyBlock>(q, k, count, hd, folded);
  }
};
template <int R>
struct WeightedPairs {
  static void run(const uint16_t* const* pairs, const uint16_t* const* vrow, int64_t j_begin,
                  int64_t j_end, int64_t hd, bool from_zero, float* const* oh) {
    cpu::weighted_pairs<R>(pairs, vrow, j_begin, j_end, hd, from_zero, oh, kPrefetchKeys);
  }
};

// The scores of keys [p0, p0 + count) (krows: their bf16 K rows) for an item's rows,
// kRowBlock rows at a time: the folded chains, then per row one hsum16, times the scale.
template <DType W>
void score_block_bf16(const uint16_t* const* q16, const uint16_t* const* krows, int64_t count,
                      int64_t p0, int rows, const int64_t* ctx, int64_t hd, float scale,
                      float* const* srow, VecF (*folded)[kKeyBlock]) {
  static_assert(kKeyBlock == 16, "a key block's scores are one hsum16");
  for (int r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int r = std::min(kRowBlock, rows - r0);
    for_rows<FoldRowsBf16>(r, q16 + r0, krows, count, hd, folded);
    for (int j = 0; j < r; ++j) {
      const int64_t valid = std::min(count, ctx[r0 + j] - p0);  // keys this row sees
      if (valid <= 0) continue;
      // The block's sums times the scale, stored once (hsum_many's bits for each); a partial
      // block is padded with zeros first.
      const VecF* sums_of = folded[j];
      VecF padded[kKeyBlock];
      if (valid < kKeyBlock) {
        for (int64_t i = 0; i < kKeyBlock; ++i) padded[i] = i < valid ? folded[j][i] : cpu::vzero();
        sums_of = padded;
      }
      const VecF scaled = cpu::vmul(cpu::hsum16(sums_of), cpu::vset1(scale));
      _mm512_mask_storeu_ps(srow[r0 + j] + p0, static_cast<__mmask16>((1u << valid) - 1u), scaled);
    }
  }
}

// out rows (unscaled) from the rows' weight pairs: the key pairs every row of a block sees for
// the block at once, then each row's later pairs, then its odd last key (weight 0 and a zero
// row beside it).
template <DType W>
void weigh_values_bf16(const uint16_t* const* prow, const uint16_t* const* vrows,
                       const uint16_t* zero_row, int rows, const int64_t* ctx, int64_t hd,
                       float* const* orow) {
  for (int r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int r = std::min(kRowBlock, rows - r0);
    int64_t shared = ctx[r0];
    for (int j = 1; j < r; ++j) shared = std::min(shared, ctx[r0 + j]);
    const int64_t shared_pairs = shared / 2;
    for_rows<WeightedPairs>(r, prow + r0, vrows, int64_t{0}, shared_pairs, hd, true, orow + r0);
    for (int j = 0; j < r; ++j) {
      const int64_t c = ctx[r0 + j];
      if (c / 2 > shared_pairs)
        WeightedPairs<1>::run(prow + r0 + j, vrows, shared_pairs, c / 2, hd, false, orow + r0 + j);
      if (c % 2 != 0) {
        const uint16_t* lone[2] = {vrows[c - 1], zero_row};
        const uint16_t* last = prow[r0 + j] + (c - 1);
        WeightedPairs<1>::run(&last, lone, 0, 1, hd, false, orow + r0 + j);
      }
    }
  }
}
#endif

// What every work item of one attention call reads (attend's arguments).
struct AttendArgs {
  const Tensor& q;
  const KvCacheLayer& cache;
  const BatchMeta& batch;
  const std::vector<int32_t>& seq_of;  // token -> sequence
  int64_t max_ctx, hd, hq, group;
  float scale;
  Tensor& out;
};

// One thread's buffers for its work items (up to kTileTokens x group query rows over up to
// max_ctx keys), and the rows of the item at hand: their q, out, scores, context lengths.
template <DType W, bool Bf16In>
struct AttendItem {
  using S = cpu::StoredT<W>;
  explicit AttendItem(const AttendArgs& a)
      : max_rows(kTileTokens * a.group),
        pair_row(a.max_ctx + 1),  // bf16 weights, padded to whole pairs
        bf16_out(a.out.dtype == DType::BF16) {
    scores.resize(static_cast<size_t>(a.max_ctx * max_rows));
    widened.resize(W == DType::F32 || Bf16In ? 0 : static_cast<size_t>(kKeyBlock * a.hd));
    q16.resize(Bf16In ? static_cast<size_t>(max_rows * a.hd) : 0);
    q16row.resize(Bf16In ? static_cast<size_t>(max_rows) : 0);
    pair_store.resize(Bf16In ? static_cast<size_t>(max_rows * pair_row) : 0);
    prow.resize(Bf16In ? static_cast<size_t>(max_rows) : 0);
    zero_row.assign(Bf16In ? static_cast<size_t>(a.hd) : 0, 0);
    krows.resize(static_cast<size_t>(a.max_ctx));
    vrows.resize(krows.size());
    qrow.resize(static_cast<size_t>(max_rows));
    kf.resize(kKeyBlock);
    orow.resize(qrow.size());
    srow.resize(qrow.size());
    staged.resize(bf16_out ? static_cast<size_t>(max_rows * a.hd) : 0);
    orow16.resize(bf16_out ? qrow.size() : 0);
    ctx.resize(qrow.size());
    denom.resize(qrow.size());
  }
  const int64_t max_rows, pair_row;
  // A bf16 out (the o projection's input rows): the rows are formed in f32 (staged), then
  // rounded into out once scaled.
  const bool bf16_out;
  std::vector<float> scores;
  std::vector<float> widened;  // a key block's K rows as f32 (a bf16 cache, f32 inputs)
  // Bf16In: the rows' q in bf16, and each row's softmax numerators as bf16 key pairs.
  std::vector<uint16_t> q16;
  std::vector<const uint16_t*> q16row;
  std::vector<uint16_t> pair_store;
  std::vector<uint16_t*> prow;
  std::vector<uint16_t> zero_row;
  std::vector<const S*> krows, vrows;
  std::vector<const float*> qrow, kf;
  std::vector<float*> orow, srow;
  std::vector<float> staged;
  std::vector<uint16_t*> orow16;
  std::vector<int64_t> ctx;
  std::vector<float> denom;
  VecF folded[kRowBlock][kKeyBlock];  // fold_rows' output for one row block and key block
  int rows = 0;                       // the item's query rows (tokens x the KV head's query heads)
  int64_t tile_ctx = 0;               // keys the item's last token sees
};

// The rows of the item of tokens [t0, t_end) of sequence s and KV head kvh, and the K / V
// rows of the positions they see.
template <DType W, bool Bf16In>
void item_rows(const AttendArgs& a, int64_t t0, int64_t t_end, int s, int64_t kvh,
               AttendItem<W, Bf16In>& it) {
  using S = cpu::StoredT<W>;
  it.rows = 0;
  it.tile_ctx = 0;
  for (int64_t t = t0; t < t_end; ++t) {
    for (int64_t g = 0; g < a.group; ++g, ++it.rows) {
      const int rows = it.rows;
      const int64_t head_off = t * a.hq * a.hd + (kvh * a.group + g) * a.hd;
      it.qrow[rows] = a.q.ptr<float>() + head_off;
      if (it.bf16_out) {
        it.orow[rows] = it.staged.data() + rows * a.hd;
        it.orow16[rows] = a.out.ptr<uint16_t>() + head_off;
      } else {
        it.orow[rows] = a.out.ptr<float>() + head_off;
      }
      it.srow[rows] = it.scores.data() + rows * a.max_ctx;
      it.ctx[rows] = a.batch.positions[t] + 1;
      if constexpr (Bf16In) {
        uint16_t* qb = it.q16.data() + rows * a.hd;
        cpu::store_row_bf16(qb, it.qrow[rows], a.hd);
        it.q16row[rows] = qb;
        it.prow[rows] = it.pair_store.data() + rows * it.pair_row;
      }
    }
    it.tile_ctx = std::max<int64_t>(it.tile_ctx, a.batch.positions[t] + 1);
  }
  const int64_t hkv = a.cache.k.dim(2), block_size = a.cache.k.dim(1);
  const S* kc = a.cache.k.ptr<S>();
  const S* vc = a.cache.v.ptr<S>();
  const auto& table = a.batch.block_tables[s];
  for (int64_t p = 0; p < it.tile_ctx; ++p) {
    const int64_t slot = table[p / block_size] * block_size + p % block_size;
    it.krows[p] = kc + (slot * hkv + kvh) * a.hd;
    it.vrows[p] = vc + (slot * hkv + kvh) * a.hd;
  }
}

// The item's scores, a 16-key block at a time: the block's K rows as f32, then kRowBlock rows
// at once.
template <DType W, bool Bf16In>
void item_scores(const AttendArgs& a, AttendItem<W, Bf16In>& it) {
  using S = cpu::StoredT<W>;
  const int64_t hd = a.hd;
  for (int64_t p0 = 0; p0 < it.tile_ctx; p0 += kKeyBlock) {
    const int64_t count = std::min(kKeyBlock, it.tile_ctx - p0);
    const int64_t ahead_end = std::min(it.tile_ctx, p0 + kPrefetchKeys + count);
    for (int64_t p = p0 + kPrefetchKeys; p < ahead_end; ++p)
      prefetch_bytes(it.krows[p], hd * static_cast<int64_t>(sizeof(S)));
    if constexpr (Bf16In) {
      score_block_bf16<W>(it.q16row.data(), it.krows.data() + p0, count, p0, it.rows, it.ctx.data(),
                          hd, a.scale, it.srow.data(), it.folded);
      continue;
    }
    for (int64_t i = 0; i < count; ++i) {
      if constexpr (W == DType::F32) {
        it.kf[i] = it.krows[p0 + i];
      } else {
        float* dst = it.widened.data() + i * hd;
        int64_t e = 0;
        for (; e + kLanes <= hd; e += kLanes)
          cpu::vstore(dst + e, cpu::vload_w<W>(it.krows[p0 + i] + e));
        for (; e < hd; ++e) dst[e] = cpu::load_scalar<W>(it.krows[p0 + i] + e);
        it.kf[i] = dst;
      }
    }
    for (int r0 = 0; r0 < it.rows; r0 += kRowBlock) {
      const int r = std::min(kRowBlock, it.rows - r0);
      for_rows<FoldRows>(r, it.qrow.data() + r0, it.kf.data(), count, hd, it.folded);
      for (int j = 0; j < r; ++j) {
        const int64_t valid = std::min(count, it.ctx[r0 + j] - p0);  // keys this row sees
        if (valid <= 0) continue;
        float* sc = it.srow[r0 + j] + p0;
        cpu::hsum_many(it.folded[j], static_cast<int>(valid), sc);
        if (hd % kLanes == 0) {  // no tail: the sums times the scale, a vector at a time
          scale_in_place(sc, valid, a.scale);
        } else {
          for (int64_t i = 0; i < valid; ++i)
            sc[i] = cpu::dot_w_tail<W>(it.qrow[r0 + j], it.krows[p0 + i], hd, sc[i]) * a.scale;
        }
      }
    }
  }
}

// Softmax per row, then the weighted V sum: the keys every row of a block sees, for the block
// at once; each row's later keys (the tile's later tokens) continue its chains. Then each row
// divided by its softmax denominator into out.
template <DType W, bool Bf16In>
void item_values(const AttendArgs& a, AttendItem<W, Bf16In>& it) {
  const int64_t hd = a.hd;
  for (int j = 0; j < it.rows; ++j) it.denom[j] = cpu::softmax_numerators(it.srow[j], it.ctx[j]);
  if constexpr (Bf16In) {
    for (int j = 0; j < it.rows; ++j) cpu::pack_weight_pairs(it.srow[j], it.ctx[j], it.prow[j]);
    weigh_values_bf16<W>(it.prow.data(), it.vrows.data(), it.zero_row.data(), it.rows,
                         it.ctx.data(), hd, it.orow.data());
  } else {
    for (int r0 = 0; r0 < it.rows; r0 += kRowBlock) {
      const int r = std::min(kRowBlock, it.rows - r0);
      int64_t shared = it.ctx[r0];
      for (int j = 1; j < r; ++j) shared = std::min(shared, it.ctx[r0 + j]);
      for_rows<WeightedRows<W>::template Of>(r, it.srow.data() + r0, it.vrows.data(), int64_t{0},
                                             shared, hd, true, it.orow.data() + r0);
      for (int j = r0; j < r0 + r; ++j) {
        if (it.ctx[j] > shared) {
          weighted_rows<W, 1>(it.srow.data() + j, it.vrows.data(), shared, it.ctx[j], hd, false,
                              it.orow.data() + j);
        }
      }
    }
  }
  for (int j = 0; j < it.rows; ++j) {
    scale_in_place(it.orow[j], hd, 1.0f / it.denom[j]);
    if (it.bf16_out) cpu::store_row_bf16(it.orow16[j], it.orow[j], hd);
  }
}

// One layer's attention over a cache stored as W (the body of CpuBackend::attention). A work
// item is up to kTileTokens consecutive query tokens of one sequence and one KV head, i.e.
// tokens x `group` query rows: each K row of a 16-key block is widened once (into f32, for
// all the rows) and each V vector once per block of kRowBlock rows, while the rows' dot
// products and weighted sums run the same chains, in the same order, as one row alone
// (dot_w_fold, hsum, the tail; fma over the keys in order). So what a query computes depends
// only on its q, its positions' K / V and its context length, never on the other rows: decode
// and prefill round alike, bit for bit. Bf16In (a bf16 cache, the backend's bf16 inputs):
// cpu_attention_bf16.h's arithmetic instead, q rounded once per item, K read as stored.
template <DType W, bool Bf16In>
void attend(const AttendArgs& a, cpu::WorkerPool& pool, int threads) {
  // The work items' first tokens: each sequence's query tokens in tiles of kTileTokens.
  std::vector<int32_t> tile_start;
  for (int s = 0; s < a.batch.num_seqs(); ++s)
    for (int32_t t = a.batch.query_start[s]; t < a.batch.query_start[s + 1]; t += kTileTokens)
      tile_start.push_back(t);
  const int64_t tiles = static_cast<int64_t>(tile_start.size());
  const int64_t items = tiles * a.cache.k.dim(2);  // x Hkv
  cpu::DynamicSchedule schedule(items, 2);
  pool.run(threads > 1 && items > 1 ? threads : 1, [&](int, int) {
    AttendItem<W, Bf16In> it(a);
    for (int64_t item : schedule.claims()) {
      const int64_t t0 = tile_start[item % tiles], kvh = item / tiles;
      const int s = a.seq_of[t0];
      const int64_t t_end = std::min<int64_t>(t0 + kTileTokens, a.batch.query_start[s + 1]);
      item_rows(a, t0, t_end, s, kvh, it);
      item_scores(a, it);
      item_values(a, it);
    }
  });
}

}  // namespace

void CpuBackend::store_kv_impl(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                               KvCacheLayer& cache) {
  check_cache(cache);
  const int64_t row = cache.k.dim(2) * cache.k.dim(3);  // Hkv * hd
  const int64_t slots = cache.k.dim(0) * cache.k.dim(1);
  cpu::check_on_cpu(k, "store_kv k");
  cpu::check_on_cpu(v, "store_kv v");
  const int64_t t_dim = cpu::rows_of(k);
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

void CpuBackend::attention_impl(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
                                int head_dim, float scale, Tensor& out) {
  check_cache(cache);
  const int64_t hd = head_dim, hkv = cache.k.dim(2), block_size = cache.k.dim(1);
  const int64_t num_blocks = cache.k.dim(0);
  const int64_t hq = q.dim(-1) / hd;
  const int64_t group = hq / hkv;
  cpu::check_on_cpu(q, "attention q");
  cpu::check_on_cpu(out, "attention out");
  const int64_t t_dim = cpu::rows_of(q);
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

  const AttendArgs args{q, cache, batch, seq_of, max_ctx, hd, hq, group, scale, out};
  if (cache.k.dtype == DType::BF16) {
#if defined(__AVX512BF16__)
    if (bf16_linear_inputs()) {  // bf16 q and weights (cpu_attention_bf16.h)
      attend<DType::BF16, true>(args, *pool_, threads_);
      return;
    }
#endif
    attend<DType::BF16, false>(args, *pool_, threads_);
  } else {
    attend<DType::F32, false>(args, *pool_, threads_);
  }
}

}  // namespace attnres
