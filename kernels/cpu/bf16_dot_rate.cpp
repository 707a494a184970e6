#include "kernels/cpu/bf16_dot_rate.h"

#include <algorithm>
#include <chrono>

#include "kernels/cpu/cpu_linear_dot.h"

namespace attnres::cpu {

#if defined(__AVX512BF16__)
namespace {

constexpr int kIterations = 4096;  // x 8 chains: ~10 us per loop at 1 instruction per cycle
constexpr int kRounds = 9;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Eight independent accumulator chains of one instruction each, kept in registers by the
// empty asm (which also stops the compiler from folding the identical chains into one).
template <class Step>
double time_chains(Step step) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
         a7 = a0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kIterations; ++i) {
    a0 = step(a0), a1 = step(a1), a2 = step(a2), a3 = step(a3);
    a4 = step(a4), a5 = step(a5), a6 = step(a6), a7 = step(a7);
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),
                     "+v"(a6), "+v"(a7));
  }
  return seconds_since(t0);
}

double measure() {
  const __m512 x = _mm512_set1_ps(1.0f);
  const __m512i xb = _mm512_set1_epi16(0x3f80);  // bf16 1.0
  const __m512bh pair = reinterpret_cast<const __m512bh&>(xb);
  double fma_s = 1e30, dot_s = 1e30;
  for (int r = 0; r < kRounds; ++r) {
    fma_s = std::min(fma_s, time_chains([&](__m512 a) { return _mm512_fmadd_ps(x, x, a); }));
    dot_s = std::min(dot_s, time_chains([&](__m512 a) { return _mm512_dpbf16_ps(a, pair, pair); }));
  }
  // Per instruction: 16 f32 multiply-adds against 32 bf16 ones.
  return (32.0 / dot_s) / (16.0 / fma_s);
}

}  // namespace

double bf16_dot_speedup() {
  static const double speedup = measure();
  return speedup;
}
#else
double bf16_dot_speedup() { return 0.0; }
#endif

}  // namespace attnres::cpu
