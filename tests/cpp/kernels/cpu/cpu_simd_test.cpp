// The SIMD vocabulary's horizontal sums: hsum_many (hsum16 on AVX-512) must round exactly like
// hsum, one vector at a time, because the prefill GEMM reduces with the one and the decode GEMV
// with the other (batch invariance). The inputs mix magnitudes so that the order of the adds
// shows in the result; the test checks that it does (a different order gives other bits), so
// an equality that holds for any order cannot pass it by accident.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_simd.h"

namespace attnres::test {
namespace {

using cpu::kLanes;
using cpu::VecF;

std::vector<float> order_sensitive_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
  return v;
}

TEST(CpuSimd, HsumManyRoundsLikeHsumOneAtATime) {
  for (int n : {1, 5, 16, 24, 33}) {
    const auto values = order_sensitive_values(static_cast<size_t>(n) * kLanes, 100 + n);
    VecF vectors[33];  // a plain array: std::vector would drop VecF's alignment attribute
    for (int j = 0; j < n; ++j) vectors[j] = cpu::vload(values.data() + j * kLanes);
    std::vector<float> many(n);
    cpu::hsum_many(vectors, n, many.data());
    int order_shows = 0;
    for (int j = 0; j < n; ++j) {
      const float one = cpu::hsum(vectors[j]);
      EXPECT_EQ(0, std::memcmp(&one, &many[j], sizeof(float))) << "n " << n << " vector " << j;
      float sequential = 0.0f;
      for (int l = 0; l < kLanes; ++l) sequential += values[j * kLanes + l];
      order_shows += sequential != one;
    }
    if (kLanes > 2 && n >= 16) {
      EXPECT_GT(order_shows, 0) << "inputs too tame to test the order";
    }
  }
}

// vexp against std::exp (double) over the softmax range and a little beyond: within 4 ulp
// (relative 2.4e-7) where the result is a normal float; clamped inputs saturate.
TEST(CpuSimd, VexpIsWithinFourUlpOfExp) {
  std::vector<float> xs;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.34657359f, 0.34657359f}) xs.push_back(x);
  while (xs.size() % kLanes) xs.push_back(0.0f);
  double worst = 0.0;
  for (size_t i = 0; i < xs.size(); i += kLanes) {
    alignas(64) float got[kLanes];
    cpu::vstore(got, cpu::vexp(cpu::vload(xs.data() + i)));
    for (int l = 0; l < kLanes; ++l) {
      const double want = std::exp(static_cast<double>(xs[i + l]));
      worst = std::max(worst, std::fabs(got[l] - want) / want);
    }
  }
  EXPECT_LT(worst, 4 * 5.96e-8) << "worst relative error";
  alignas(64) float far[kLanes];
  cpu::vstore(far, cpu::vexp(cpu::vset1(-1000.0f)));
  EXPECT_LT(far[0], 1e-37f);
  EXPECT_GE(far[0], 0.0f);
}

// softmax_numerators: e^(x - max) and their sum, for lengths with and without a tail.
TEST(CpuSimd, SoftmaxNumeratorsAndSum) {
  for (int n : {1, 7, 16, 37}) {
    auto x = order_sensitive_values(n, 300 + n);
    for (float& v : x) v = std::fmod(v, 30.0f);
    const auto orig = x;
    const float mx = *std::max_element(orig.begin(), orig.end());
    const float sum = cpu::softmax_numerators(x.data(), n);
    double want_sum = 0.0;
    for (int i = 0; i < n; ++i) {
      const double want = std::exp(static_cast<double>(orig[i] - mx));  // the f32 difference
      want_sum += want;
      EXPECT_NEAR(x[i], want, 4e-7 * want + 1e-30) << "n " << n << " i " << i;
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << "n " << n;
  }
}

#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
// Our explicit tree is GCC's _mm512_reduce_add_ps (so decode results did not change with it).
TEST(CpuSimd, HsumIsGccsReduceAdd) {
  const auto values = order_sensitive_values(64 * kLanes, 7);
  for (int j = 0; j < 64; ++j) {
    const VecF v = cpu::vload(values.data() + j * kLanes);
    const float ours = cpu::hsum(v), gcc = _mm512_reduce_add_ps(v);
    EXPECT_EQ(0, std::memcmp(&ours, &gcc, sizeof(float))) << "vector " << j;
  }
}
#endif

}  // namespace
}  // namespace attnres::test
