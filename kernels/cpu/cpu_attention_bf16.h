// CPU attention's bf16 arithmetic (cpu_attention.cpp), taken over a bf16 KV cache when the
// backend takes bf16 inputs (CpuBackend::set_bf16_linear_inputs: --linear-input-dtype, whose
// `auto` picks it where vdpbf16ps runs at twice the f32 FMA rate, e.g. Zen 4). The query and
// the softmax numerators are rounded to bf16 and meet the cache's bf16 K and V rows in
// vdpbf16ps, with f32 accumulation: what a bf16 model's own PyTorch code does (its q is bf16,
// and SDPA's fused kernels round P to bf16 for the V product), what our CUDA prefill kernel
// does (cuda_prefill_attention.cu), and what llama.cpp does over a bf16 cache. It takes half
// the multiply instructions of the f32 path and no K widening: at 4096 tokens attention was
// 62% of a 100M prefill (docs/BENCHMARKS.md).
//
// The definition, per query row q (hd elements) over its ctx keys (the kernels are tested
// against attention_bf16_reference bit for bit; vdpbf16ps flushes denormals, the reference
// does not, which random tests never reach):
//   score_p = bf16_dot_reference(bf16(q), k_p, hd32) * scale, with q and k zero-padded to
//             hd32 = hd rounded up to a multiple of 32 (cpu_linear_dot.h: Bf16Dot's order:
//             16 lanes of pair chains over the 32-element steps, the last one padded, then the
//             hsum tree; the padding adds exact zeros)
//   w_p = e^(score_p - max) and den = their f32 sum (cpu::softmax_numerators, unrounded)
//   out[e] = acc[e] / den (times the reciprocal), acc[e] over the key pairs (p, p + 1) from
//             key 0 in order: acc = fma(bf16(w_p), v_p[e], fma(bf16(w_p+1), v_p+1[e], acc)),
//             an odd last key paired with weight 0 and a zero row.
// Per element one chain whatever else the call holds, so decode and prefill round alike.
// A head size that is not a multiple of 32 (open_llama_3b's 100, say) takes its last step with
// masked loads and stores, not in scalar code: the same chains.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/core/dtype.h"
#include "kernels/cpu/cpu_linear_dot.h"
#include "kernels/cpu/cpu_simd.h"

namespace attnres::cpu {

// A row's softmax numerators rounded to bf16 (f32_to_bf16), n of them and a 0 after an odd
// last one: key pair j is elements 2j and 2j + 1, side by side as vdpbf16ps reads a pair.
inline void pack_weight_pairs(const float* w, int64_t n, uint16_t* pairs) {
  store_row_bf16(pairs, w, n);
  if (n % 2 != 0) pairs[n] = 0;
}

// One element's step over key pair `pair` (two bf16 weights): the definition above, in scalar
// code. v_first / v_second: the pair's two rows at this element (0 for an odd last key's
// missing one).
inline float weight_pair_fma(const uint16_t* pair, float v_first, float v_second, float acc) {
  return std::fma(bf16_to_f32(pair[0]), v_first, std::fma(bf16_to_f32(pair[1]), v_second, acc));
}

// The definition for one query row, in scalar code, on any build: out[hd] from q (f32, rounded
// here), its ctx keys' K and V rows (bf16), and the scale.
inline void attention_bf16_reference(const float* q, const uint16_t* const* k,
                                     const uint16_t* const* v, int64_t ctx, int64_t hd,
                                     float scale, float* out) {
  const int64_t hd32 = (hd + 31) / 32 * 32;
  std::vector<uint16_t> qb(static_cast<size_t>(hd32), 0), kb(qb.size(), 0);
  std::vector<float> w(static_cast<size_t>(ctx));
  std::vector<uint16_t> pairs(static_cast<size_t>(ctx + 1));
  for (int64_t e = 0; e < hd; ++e) qb[e] = f32_to_bf16(q[e]);
  for (int64_t p = 0; p < ctx; ++p) {
    std::copy(k[p], k[p] + hd, kb.begin());
    w[p] = bf16_dot_reference(kb.data(), qb.data(), hd32, nullptr) * scale;
  }
  const float den = softmax_numerators(w.data(), ctx);
  pack_weight_pairs(w.data(), ctx, pairs.data());
  for (int64_t e = 0; e < hd; ++e) {
    float acc = 0.0f;
    for (int64_t j = 0; 2 * j < ctx; ++j) {
      const float second = 2 * j + 1 < ctx ? bf16_to_f32(v[2 * j + 1][e]) : 0.0f;
      acc = weight_pair_fma(pairs.data() + 2 * j, bf16_to_f32(v[2 * j][e]), second, acc);
    }
    out[e] = acc;
  }
  const float inv = 1.0f / den;
  for (int64_t e = 0; e < hd; ++e) out[e] *= inv;
}

#if defined(__AVX512BF16__)

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<const __m512bh&>(x); }

// folded[r][i] for r < R, i < count: the lane chains of bf16_dot_reference(k_i, q_r, hd) over
// the whole 32-element steps (each K vector loaded once for all R rows, four keys at a time;
// past count the last key is computed again and dropped). The hsum and the tail follow.
template <int R, int KeyBlock>
void fold_rows_bf16(const uint16_t* const* q, const uint16_t* const* k, int64_t count, int64_t hd,
                    VecF (*folded)[KeyBlock]) {
  constexpr int kKeys = 4;
  for (int64_t i = 0; i < count; i += kKeys) {
    const uint16_t* kp[kKeys];
    for (int j = 0; j < kKeys; ++j) kp[j] = k[std::min<int64_t>(i + j, count - 1)];
    VecF acc[R][kKeys];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kKeys; ++j) acc[r][j] = vzero();
    int64_t e = 0;
    for (; e + 32 <= hd; e += 32) {
      __m512i kv[kKeys];
      for (int j = 0; j < kKeys; ++j) kv[j] = _mm512_loadu_si512(kp[j] + e);
      for (int r = 0; r < R; ++r) {
        const __m512i qv = _mm512_loadu_si512(q[r] + e);
        for (int j = 0; j < kKeys; ++j)
          acc[r][j] = _mm512_dpbf16_ps(acc[r][j], as_bh(kv[j]), as_bh(qv));
      }
    }
    if (e < hd) {  // the last hd - e elements, the rest of the step zeros
      const auto mask = static_cast<__mmask32>((uint64_t{1} << (hd - e)) - 1);
      __m512i kv[kKeys];
      for (int j = 0; j < kKeys; ++j) kv[j] = _mm512_maskz_loadu_epi16(mask, kp[j] + e);
      for (int r = 0; r < R; ++r) {
        const __m512i qv = _mm512_maskz_loadu_epi16(mask, q[r] + e);
        for (int j = 0; j < kKeys; ++j)
          acc[r][j] = _mm512_dpbf16_ps(acc[r][j], as_bh(kv[j]), as_bh(qv));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kKeys && i + j < count; ++j) folded[r][i + j] = acc[r][j];
  }
}

// vdpbf16ps's operand for a key pair over 16 elements: element e of the first row and of the
// second, side by side. From two 32-element loads: the first 16 elements (kLow) or the last.
inline __m512i interleave_pair(__m512i first, __m512i second, bool high) {
  const __m512i idx =
      high ? _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55,
                              23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16)
           : _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                              38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  return _mm512_permutex2var_epi16(first, idx, second);
}

// oh[r][e] for e in [e0, e0 + 32 * C2), r < R: the chains over key pairs [j_begin, j_end) (pair j:
// rows vrow[2j], vrow[2j + 1]; weights pairs[r] + 2j), from zero or from oh's values. Each V
// vector is loaded and interleaved once for all R rows.
// Masked (C2 = 1): only the first `left` (< 32) elements exist; loads and stores stop there.
template <int R, int C2, bool Masked = false>
void weighted_pairs_block(const uint16_t* const* pairs, const uint16_t* const* vrow,
                          int64_t j_begin, int64_t j_end, int64_t e0, bool from_zero,
                          float* const* oh, int64_t prefetch_keys, int64_t left = 32 * C2) {
  constexpr int C = 2 * C2;  // 16-lane accumulators per row
  static_assert(!Masked || C2 == 1);
  const auto load_mask = static_cast<__mmask32>((uint64_t{1} << std::min<int64_t>(left, 32)) - 1);
  __mmask16 lane_mask[C];  // the elements of accumulator c that exist
  for (int c = 0; c < C; ++c) {
    const int64_t in_c = std::clamp<int64_t>(left - c * kLanes, 0, kLanes);
    lane_mask[c] = static_cast<__mmask16>((1u << in_c) - 1u);
  }
  auto load_v = [&](const uint16_t* p) {
    return Masked ? _mm512_maskz_loadu_epi16(load_mask, p) : _mm512_loadu_si512(p);
  };
  VecF acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float* o = oh[r] + e0 + c * kLanes;
      acc[r][c] = from_zero ? vzero() : Masked ? _mm512_maskz_loadu_ps(lane_mask[c], o) : vload(o);
    }
  for (int64_t j = j_begin; j < j_end; ++j) {
    const uint16_t* first = vrow[2 * j] + e0;
    const uint16_t* second = vrow[2 * j + 1] + e0;
    if (2 * (j + 1) + prefetch_keys < 2 * j_end) {
      for (int c = 0; c < C2; ++c) {
        __builtin_prefetch(vrow[2 * j + prefetch_keys] + e0 + 32 * c, 0, 2);
        __builtin_prefetch(vrow[2 * j + 1 + prefetch_keys] + e0 + 32 * c, 0, 2);
      }
    }
    __m512i x[C];
    for (int c = 0; c < C2; ++c) {
      const __m512i a = load_v(first + 32 * c), b = load_v(second + 32 * c);
      x[2 * c] = interleave_pair(a, b, false);
      x[2 * c + 1] = interleave_pair(a, b, true);
    }
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, pairs[r] + 2 * j, sizeof pair);
      const __m512i w = _mm512_set1_epi32(pair);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_bh(w), as_bh(x[c]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float* o = oh[r] + e0 + c * kLanes;
      if constexpr (Masked) {
        _mm512_mask_storeu_ps(o, lane_mask[c], acc[r][c]);
      } else {
        vstore(o, acc[r][c]);
      }
    }
}

// The same over all hd elements: blocks of 64, then of 32, then the elements left in a masked
// block of 32.
template <int R>
void weighted_pairs(const uint16_t* const* pairs, const uint16_t* const* vrow, int64_t j_begin,
                    int64_t j_end, int64_t hd, bool from_zero, float* const* oh,
                    int64_t prefetch_keys) {
  int64_t e0 = 0;
  for (; e0 + 64 <= hd; e0 += 64)
    weighted_pairs_block<R, 2>(pairs, vrow, j_begin, j_end, e0, from_zero, oh, prefetch_keys);
  for (; e0 + 32 <= hd; e0 += 32)
    weighted_pairs_block<R, 1>(pairs, vrow, j_begin, j_end, e0, from_zero, oh, prefetch_keys);
  if (e0 < hd)
    weighted_pairs_block<R, 1, true>(pairs, vrow, j_begin, j_end, e0, from_zero, oh,
                                     prefetch_keys, hd - e0);
}

#endif  // __AVX512BF16__

}  // namespace attnres::cpu
