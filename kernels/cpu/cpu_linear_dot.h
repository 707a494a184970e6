// The arithmetic of a CPU linear's dot products, one policy per kind of input (cpu_linear.cpp
// runs its GEMV and its packed GEMM over either, so a row rounds the same in both: batch
// invariance). Each policy says what an element of x, of the weights and of a packed panel
// is, how many elements one vector step covers, and the step itself:
//
// F32Dot<W>: x in f32, the weights (f32 / bf16 / f16) widened exactly. A step is kLanes
//   elements; lane l accumulates acc = fma(w[k + l], x[k + l], acc).
// Bf16Dot: x rounded to bf16 (nearest even, as f32_to_bf16), bf16 weights, AVX512_BF16's
//   vdpbf16ps. A step is 32 elements; lane l accumulates the pair (2l, 2l + 1):
//     acc = fma(w[k + 2l], x[k + 2l], fma(w[k + 2l + 1], x[k + 2l + 1], acc))
//   (a product of two bf16 values is exact in f32, so each add rounds once, odd element
//   first; measured bit for bit against vdpbf16ps on Zen 4, and what Intel's SDM specifies,
//   denormal inputs and results aside, which the instruction flushes to zero).
// Both then take the 16 (kLanes) lane sums through the fixed hsum tree, add the elements past
// the last whole step one by one in order (fma), and the bias last.
//
// Why two kinds: a core that runs vdpbf16ps at the rate of f32 FMAs (Zen 4: one 512-bit
// instruction per cycle either way) does twice the multiply-adds per cycle with bf16 inputs,
// and prefill is GEMM-bound. Rounding a linear's input to bf16 is what a bf16 model's own
// PyTorch code does (its activations are bf16), and what llama.cpp does for bf16 weights.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/core/dtype.h"
#include "kernels/cpu/cpu_simd.h"

namespace attnres::cpu {

template <DType W>
struct F32Dot {
  using XT = float;          // an element of x as the kernels read it
  using WT = StoredT<W>;     // an element of the weights as stored
  using PanelT = float;      // an element of a packed GEMM panel (widened once)
  using XVec = VecF;
  using WVec = VecF;
  static constexpr int64_t kStep = kLanes;  // elements per vector step
  static constexpr bool kPackFree = false;   // the GEMM packs panels (widened once)
  // Whether a one-row GEMV reads one weight row at a time (cpu_linear.cpp, gemv): no. With
  // AVX-512 it was no clear gain on Zen 4 (bf16 weights, 0.6B decode: faster in 6 of 11
  // alternated pairs, slower in 3; docs/BENCHMARKS.md), one FMA chain per output at 4 cycles
  // a 16-element step being close to the stream's pace; with AVX2's 8 lanes it would be slower.
  static constexpr bool kOneRowAtATime = false;

  static XVec load_x(const XT* p) { return vload(p); }
  static WVec load_w(const WT* p) { return vload_w<W>(p); }
  static WVec load_panel(const PanelT* p) { return vload(p); }
  // One step's elements of a weight row into a panel (exact: the widening is).
  static void pack(const WT* src, PanelT* dst) { vstore(dst, vload_w<W>(src)); }
  static void pack_zero(PanelT* dst) { vstore(dst, vzero()); }
  static VecF dot(VecF acc, WVec w, XVec x) { return vfma(w, x, acc); }
  // One element past the last whole step.
  static float tail(float s, const WT* w, const XT* x) { return std::fma(load_scalar<W>(w), *x, s); }
};

#if defined(__AVX512BF16__)
inline constexpr bool kHasBf16Dot = true;

struct Bf16Dot {
  using XT = uint16_t;
  using WT = uint16_t;
  using PanelT = uint16_t;
  using XVec = __m512i;
  using WVec = __m512i;
  static constexpr int64_t kStep = 32;
  static constexpr bool kPackFree = true;
  // One weight row at a time in a one-row GEMV: 64 bytes per vdpbf16ps keep the chain ahead.
  static constexpr bool kOneRowAtATime = true;

  static XVec load_x(const XT* p) { return _mm512_loadu_si512(p); }
  static WVec load_w(const WT* p) { return _mm512_loadu_si512(p); }
  static WVec load_panel(const PanelT* p) { return _mm512_load_si512(p); }
  static void pack(const WT* src, PanelT* dst) { _mm512_store_si512(dst, _mm512_loadu_si512(src)); }
  static void pack_zero(PanelT* dst) { _mm512_store_si512(dst, _mm512_setzero_si512()); }
  static VecF dot(VecF acc, WVec w, XVec x) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(w), reinterpret_cast<__m512bh&>(x));
  }
  static float tail(float s, const WT* w, const XT* x) {
    return std::fma(bf16_to_f32(*w), bf16_to_f32(*x), s);
  }
};
#else
inline constexpr bool kHasBf16Dot = false;
#endif

// Bf16Dot's arithmetic for one output, in scalar code: the definition the kernels are tested
// against bit for bit (denormals aside), whatever the build. x and w are bf16, k elements;
// bias may be null.
inline float bf16_dot_reference(const uint16_t* x, const uint16_t* w, int64_t k,
                                const float* bias) {
  constexpr int kPairLanes = 16;
  float lanes[kPairLanes] = {};
  const int64_t whole = k / (2 * kPairLanes) * (2 * kPairLanes);
  for (int64_t b = 0; b < whole; b += 2 * kPairLanes) {
    for (int l = 0; l < kPairLanes; ++l) {
      const int64_t e = b + 2 * l;
      lanes[l] = std::fma(bf16_to_f32(w[e + 1]), bf16_to_f32(x[e + 1]), lanes[l]);
      lanes[l] = std::fma(bf16_to_f32(w[e]), bf16_to_f32(x[e]), lanes[l]);
    }
  }
  // hsum's tree (cpu_simd.h): lane i + lane i+8, then i + i+4, then (0 + 2) and (1 + 3).
  float h8[8], h4[4];
  for (int i = 0; i < 8; ++i) h8[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) h4[i] = h8[i] + h8[i + 4];
  float s = (h4[0] + h4[2]) + (h4[1] + h4[3]);
  for (int64_t e = whole; e < k; ++e) s = std::fma(bf16_to_f32(w[e]), bf16_to_f32(x[e]), s);
  return bias ? s + *bias : s;
}

}  // namespace attnres::cpu
