// The quantizer's per-block scale (and min) search (engine/core/quant_search.h): the choice
// equals a plain evaluation of the documented candidate list, it never has a larger squared
// error than the absmax / min-max rule on any block (random and adversarial ones), it comes
// close to an exhaustive search over f16 values, and quantize_row stores what it chose.
// This file is built with -ffp-contract=off, as the search is: the errors below are the
// search's own, separately rounded operations.
#include "engine/core/quant_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "engine/core/quant_format.h"

namespace attnres {
namespace {

using Block = std::vector<float>;

float f16r(double v) { return f16_to_f32(f32_to_f16(static_cast<float>(v))); }

// The header's error, written out again: q, the weight read back, the lane-order sum.
double error_of(const Block& x, int qmax, float d, float m, bool symmetric) {
  double lanes[8] = {};
  for (size_t j = 0; j < x.size(); ++j) {
    float q = 0.0f;
    if (d != 0.0f) {
      const float r = std::nearbyint(symmetric ? x[j] / d : (x[j] - m) / d);
      q = std::clamp(r, symmetric ? -static_cast<float>(qmax) : 0.0f, static_cast<float>(qmax));
    }
    const float prod = d * q;
    const float w = symmetric ? prod : prod + m;
    const double e = static_cast<double>(x[j]) - static_cast<double>(w);
    lanes[j % 8] = lanes[j % 8] + e * e;
  }
  double total = 0.0;
  for (double l : lanes) total = total + l;
  return total;
}

float absmax_scale(const Block& x, int qmax) {
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  return f16r(amax / static_cast<float>(qmax));
}

struct MinMax {
  float d, m;
};
MinMax minmax_scale(const Block& x, int qmax) {
  const float lo = *std::min_element(x.begin(), x.end());
  const float hi = *std::max_element(x.begin(), x.end());
  const float m = f16r(lo);
  return {f16r(std::max(hi - m, 0.0f) / static_cast<float>(qmax)), m};
}

// The documented candidate lists, evaluated one by one: the first with the smallest error.
float brute_symmetric(const Block& x, int qmax) {
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  std::vector<float> cands = {f16r(amax / static_cast<float>(qmax))};
  for (int i = -10; i <= 10; ++i)
    if (i != 0) cands.push_back(f16r(amax / static_cast<float>(qmax + i / 5.0)));
  float best = cands[0];
  double best_e = error_of(x, qmax, best, 0.0f, true);
  for (float d : cands) {
    if (!std::isfinite(d)) continue;
    const double e = error_of(x, qmax, d, 0.0f, true);
    if (e < best_e) best = d, best_e = e;
  }
  return best;
}

std::vector<float> q_of(const Block& x, int qmax, float d, float m) {
  std::vector<float> q(x.size(), 0.0f);
  if (d != 0.0f)
    for (size_t j = 0; j < x.size(); ++j)
      q[j] = std::clamp(std::nearbyint((x[j] - m) / d), 0.0f, static_cast<float>(qmax));
  return q;
}

double lane_sum(const std::vector<double>& t) {
  double lanes[8] = {};
  for (size_t j = 0; j < t.size(); ++j) lanes[j % 8] = lanes[j % 8] + t[j];
  double total = 0.0;
  for (double l : lanes) total = total + l;
  return total;
}

MinMax brute_asymmetric(const Block& x, int qmax) {
  const MinMax mm = minmax_scale(x, qmax);
  const float hi = *std::max_element(x.begin(), x.end());
  const float r = std::max(hi - mm.m, 0.0f);
  std::vector<MinMax> cands = {mm};
  for (int i = -3; i <= 3; ++i) {
    MinMax c = mm;
    if (i != 0) {
      c = {f16r(r / static_cast<float>(qmax + 2 * i / 5.0)), mm.m};
      if (!std::isfinite(c.d)) continue;
      cands.push_back(c);
    }
    const std::vector<float> q = q_of(x, qmax, c.d, c.m);
    const double n = static_cast<double>(x.size());
    double sq = 0.0, sqq = 0.0;
    std::vector<double> xs, xq;
    for (size_t j = 0; j < x.size(); ++j) {
      sq += q[j];
      sqq += double{q[j]} * q[j];
      xs.push_back(x[j]);
      xq.push_back(double{x[j]} * q[j]);
    }
    const double det = n * sqq - sq * sq;
    if (!(det > 0.0)) continue;
    const double sx = lane_sum(xs), sxq = lane_sum(xq);
    const double d = (n * sxq - sq * sx) / det, m = (sqq * sx - sq * sxq) / det;
    if (std::fabs(d) >= 1e30 || std::fabs(m) >= 1e30) continue;
    const MinMax fit{f16r(d), f16r(m)};
    if (fit.d > 0.0f && std::isfinite(fit.d) && std::isfinite(fit.m)) cands.push_back(fit);
  }
  MinMax best = cands[0];
  double best_e = error_of(x, qmax, best.d, best.m, false);
  for (const MinMax& c : cands) {
    const double e = error_of(x, qmax, c.d, c.m, false);
    if (e < best_e) best = c, best_e = e;
  }
  return best;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string show(const Block& x) {
  std::string s;
  for (float v : x) s += std::to_string(v) + " ";
  return s;
}

Block gaussian(std::mt19937& rng, float scale, float offset = 0.0f, int n = 32) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  Block b(static_cast<size_t>(n));
  for (float& v : b) v = g(rng) * scale + offset;
  return b;
}

// Random blocks of many scales and offsets, then the adversarial ones.
std::vector<Block> test_blocks() {
  std::mt19937 rng(5);
  std::vector<Block> blocks;
  for (float scale : {0.02f, 1.0f, 300.0f, 3e-5f})
    for (int i = 0; i < 60; ++i) blocks.push_back(gaussian(rng, scale, i % 3 == 0 ? scale : 0.0f));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int i = 0; i < 30; ++i) {
    Block b(32);
    for (float& v : b) v = u(rng);
    blocks.push_back(b);
  }
  blocks.push_back(Block(32, 0.0f));
  for (float c : {1.0f, -3.5f, 0.1f, 1.00048828125f, 1.0007f, -1.0007f, 7e-8f, 65500.0f})
    blocks.push_back(Block(32, c));  // 1.0007 rounds up to an f16 above it: min-max's m > max
  for (float big : {10.0f, 1000.0f, -50.0f}) {  // one outlier among small weights
    Block b = gaussian(rng, 0.01f);
    b[13] = big;
    blocks.push_back(b);
  }
  for (float tiny : {1e-6f, 1e-7f, 3e-8f, 1e-9f, 1e-30f})  // f16 subnormal scales, underflow
    blocks.push_back(gaussian(rng, tiny));
  Block two(32);  // two values: every q at an end of the range
  for (int j = 0; j < 32; ++j) two[j] = j % 2 ? 0.75f : -0.25f;
  blocks.push_back(two);
  Block ties(32);  // x / d0 on half-integers
  for (int j = 0; j < 32; ++j) ties[j] = (j % 2 ? 1.0f : -1.0f) * (j == 0 ? 127.0f : j + 0.5f);
  blocks.push_back(ties);
  Block huge = gaussian(rng, 1.0f);  // absmax scale just under f16's largest, 65504
  huge[5] = 127.0f * 65519.0f;
  huge[6] = -15.0f * 65000.0f;
  blocks.push_back(huge);
  return blocks;
}

TEST(QuantSearch, SymmetricEqualsTheDocumentedCandidateListAndNeverLosesToAbsmax) {
  for (int qmax : {127, 31}) {
    for (const Block& x : test_blocks()) {
      float amax = 0.0f;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      if (!std::isfinite(f16r(amax / static_cast<float>(qmax)))) continue;  // refused: below
      const float d = choose_symmetric_scale(x.data(), 32, qmax);
      EXPECT_EQ(d, brute_symmetric(x, qmax)) << qmax << ": " << show(x);
      EXPECT_EQ(d, f16r(d));
      EXPECT_GE(d, 0.0f);
      const double e = error_of(x, qmax, d, 0.0f, true);
      EXPECT_EQ(e, symmetric_error(x.data(), 32, qmax, d));
      EXPECT_LE(e, error_of(x, qmax, absmax_scale(x, qmax), 0.0f, true)) << show(x);
    }
  }
}

TEST(QuantSearch, AsymmetricEqualsTheDocumentedCandidateListAndNeverLosesToMinMax) {
  for (const Block& x : test_blocks()) {
    const MinMax mm = minmax_scale(x, 15);
    if (!std::isfinite(mm.d) || !std::isfinite(mm.m)) continue;
    const AsymmetricScale s = choose_asymmetric_scale(x.data(), 32, 15);
    const MinMax want = brute_asymmetric(x, 15);
    EXPECT_EQ(s.d, want.d) << show(x);
    EXPECT_EQ(s.m, want.m) << show(x);
    EXPECT_EQ(s.d, f16r(s.d));
    EXPECT_EQ(s.m, f16r(s.m));
    EXPECT_GE(s.d, 0.0f) << show(x);  // never negative, even where m0 rounded above the block
    const double e = error_of(x, 15, s.d, s.m, false);
    EXPECT_EQ(e, asymmetric_error(x.data(), 32, 15, s.d, s.m));
    EXPECT_LE(e, error_of(x, 15, mm.d, mm.m, false)) << show(x);
  }
}

// Blocks of 16 (Q6_K256's sub-blocks) take their own vector path where the build has
// AVX-512 and the portable loops elsewhere: both must equal the documented rule.
TEST(QuantSearch, BlocksOf16FollowTheDocumentedRule) {
  for (const Block& whole : test_blocks()) {
    for (const Block& x :
         {Block(whole.begin(), whole.begin() + 16), Block(whole.begin() + 16, whole.end())}) {
      for (int qmax : {31, 127}) {
        if (!std::isfinite(absmax_scale(x, qmax))) continue;
        const float d = choose_symmetric_scale(x.data(), 16, qmax);
        EXPECT_EQ(d, brute_symmetric(x, qmax)) << qmax << ": " << show(x);
        for (float scale : {d, 0.0f, absmax_scale(x, qmax), d * 1.5f, d * 0.25f})
          EXPECT_EQ(symmetric_error(x.data(), 16, qmax, scale),
                    error_of(x, qmax, scale, 0.0f, true))
              << scale << ": " << show(x);
      }
      const MinMax mm = minmax_scale(x, 15);
      if (!std::isfinite(mm.d) || !std::isfinite(mm.m)) continue;
      const AsymmetricScale s = choose_asymmetric_scale(x.data(), 16, 15);
      const MinMax want = brute_asymmetric(x, 15);
      EXPECT_EQ(s.d, want.d) << show(x);
      EXPECT_EQ(s.m, want.m) << show(x);
      for (const MinMax c : {MinMax{s.d, s.m}, mm, MinMax{0.0f, mm.m}, MinMax{mm.d * 0.5f, mm.m}})
        EXPECT_EQ(asymmetric_error(x.data(), 16, 15, c.d, c.m), error_of(x, 15, c.d, c.m, false))
            << c.d << " " << c.m << ": " << show(x);
    }
  }
}

// What the search buys on Gaussian blocks, against the best of every f16 scale (symmetric)
// and of a window of f16 scales and mins around the min-max choice (asymmetric).
TEST(QuantSearch, GaussianBlocksGetMostOfWhatAnExhaustiveSearchFinds) {
  std::mt19937 rng(9);
  double chosen8 = 0, absmax8 = 0, best8 = 0, chosen4 = 0, minmax4 = 0, best4 = 0;
  for (int b = 0; b < 12; ++b) {
    const Block x = gaussian(rng, 0.02f);
    chosen8 += error_of(x, 127, choose_symmetric_scale(x.data(), 32, 127), 0.0f, true);
    absmax8 += error_of(x, 127, absmax_scale(x, 127), 0.0f, true);
    double best = INFINITY;
    for (uint16_t h = 1; h < 0x7c00; ++h)
      best = std::min(best, error_of(x, 127, f16_to_f32(h), 0.0f, true));
    best8 += best;

    const AsymmetricScale s = choose_asymmetric_scale(x.data(), 32, 15);
    const MinMax mm = minmax_scale(x, 15);
    const double e4 = error_of(x, 15, s.d, s.m, false);
    chosen4 += e4;
    minmax4 += error_of(x, 15, mm.d, mm.m, false);
    best = INFINITY;
    const auto code = [](float v) { return static_cast<int>(f32_to_f16(v)); };
    for (int dc = code(mm.d) - 160; dc <= code(mm.d) + 60; ++dc) {
      for (int mc = code(std::fabs(mm.m)) - 160; mc <= code(std::fabs(mm.m)) + 160; mc += 2) {
        float m = f16_to_f32(static_cast<uint16_t>(mc));
        if (mm.m < 0) m = -m;
        best = std::min(best, error_of(x, 15, f16_to_f32(static_cast<uint16_t>(dc)), m, false));
      }
    }
    best4 += std::min(best, e4);  // the best known: the window's or the search's
  }
  // The search closes most of the gap between the plain rule and the exhaustive searches.
  const std::string got = "int8: absmax " + fmt(absmax8) + ", chosen " + fmt(chosen8) +
                          ", exhaustive " + fmt(best8) + "; int4: min-max " + fmt(minmax4) +
                          ", chosen " + fmt(chosen4) + ", window " + fmt(best4);
  EXPECT_LE(best8, chosen8) << got;  // every f16 scale includes the chosen one
  EXPECT_LT(chosen8, 0.95 * absmax8) << got;
  EXPECT_LT(chosen4, 0.85 * minmax4) << got;
  EXPECT_LT(chosen8 - best8, 0.6 * (absmax8 - best8)) << got;
  EXPECT_LT(chosen4 - best4, 0.6 * (minmax4 - best4)) << got;
  std::printf("%s\n", got.c_str());
}

TEST(QuantSearch, F16OverflowEdge) {
  Block x(32, 1.0f);
  // amax / 127 rounds to 65504, f16's largest; the smaller denominators overflow and are
  // skipped.
  x[3] = 127.0f * 65519.0f;
  const float d = choose_symmetric_scale(x.data(), 32, 127);
  EXPECT_TRUE(std::isfinite(d));
  EXPECT_LE(error_of(x, 127, d, 0.0f, true), error_of(x, 127, 65504.0f, 0.0f, true));
  x[3] = 127.0f * 65520.0f;  // rounds to infinity: refused, as before the search
  EXPECT_THROW(choose_symmetric_scale(x.data(), 32, 127), Error);
  Block y(32, 0.0f);
  y[0] = 15.0f * 65519.0f;
  const AsymmetricScale s = choose_asymmetric_scale(y.data(), 32, 15);
  EXPECT_TRUE(std::isfinite(s.d) && std::isfinite(s.m));
  y[0] = 15.0f * 65520.0f;
  EXPECT_THROW(choose_asymmetric_scale(y.data(), 32, 15), Error);
  y[0] = -70000.0f;  // a min f16 cannot hold
  EXPECT_THROW(choose_asymmetric_scale(y.data(), 32, 15), Error);
  EXPECT_THROW(choose_symmetric_scale(y.data(), 12, 127), std::logic_error);  // not 8k
}

TEST(QuantSearch, QuantizeRowStoresTheChosenScalesAndNearestQ) {
  std::mt19937 rng(3);
  const Block x = gaussian(rng, 0.5f, 0.1f, 64);
  {
    std::vector<uint8_t> row(quant_row_bytes(DType::Q8_B32, 64));
    quantize_row(DType::Q8_B32, x.data(), 64, row.data());
    for (int b = 0; b < 2; ++b) {
      uint16_t h;
      std::memcpy(&h, row.data() + 64 + 2 * b, 2);
      const float d = choose_symmetric_scale(x.data() + 32 * b, 32, 127);
      EXPECT_EQ(f16_to_f32(h), d);
      for (int j = 0; j < 32; ++j) {
        const float want = std::clamp(std::nearbyint(x[32 * b + j] / d), -127.0f, 127.0f);
        EXPECT_EQ(static_cast<int8_t>(row[32 * b + j]), static_cast<int>(want));
      }
    }
  }
  std::vector<uint8_t> row(quant_row_bytes(DType::Q4_B32, 64));
  quantize_row(DType::Q4_B32, x.data(), 64, row.data());
  for (int b = 0; b < 2; ++b) {
    uint16_t dh, mh;
    std::memcpy(&dh, row.data() + 32 + 2 * b, 2);
    std::memcpy(&mh, row.data() + 36 + 2 * b, 2);
    const AsymmetricScale s = choose_asymmetric_scale(x.data() + 32 * b, 32, 15);
    EXPECT_EQ(f16_to_f32(dh), s.d);
    EXPECT_EQ(f16_to_f32(mh), s.m);
    for (int j = 0; j < 16; ++j) {
      const uint8_t byte = row[16 * b + j];
      for (int half = 0; half < 2; ++half) {
        const float xv = x[32 * b + j + 16 * half];
        const float want = std::clamp(std::nearbyint((xv - s.m) / s.d), 0.0f, 15.0f);
        EXPECT_EQ(half ? byte >> 4 : byte & 0x0f, static_cast<int>(want));
      }
    }
  }
}

}  // namespace
}  // namespace attnres
