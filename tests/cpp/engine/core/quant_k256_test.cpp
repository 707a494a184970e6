// The super-block formats Q4_K256 and Q6_K256 (engine/core/quant_format.h): the stored bytes
// decoded here from the layout's words match dequantize_row; the codes are the nearest ones
// for the stored scales; the refinement never ends above the unrefined integer scales' error;
// edge blocks (all zero, all positive, mixed magnitudes) and refusals. The NumPy reference
// (tests/reference/quantized_formats.py) checks the quantizer's choices bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "engine/core/quant_search.h"

namespace attnres {
namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

float f16_round(float v) { return f16_to_f32(f32_to_f16(v)); }

// Blocks of 32 with different magnitudes and offsets, a few blocks 1000x smaller than the
// super-block's largest (their integer scales round to 0 or 1).
std::vector<float> random_row(int64_t cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), mag(0.05f, 2.0f), off(-0.5f, 0.5f);
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float m = b % 7 == 3 ? 0.001f : mag(rng), o = b % 5 == 2 ? 0.0f : off(rng);
    for (int j = 0; j < 32; ++j) x[b * 32 + j] = u(rng) * m + o * m;
  }
  return x;
}

struct Q4kBlock {
  int sc, mn;
  float d, dmin;
  int q[32];
};

// Block b of a Q4_K256 row, decoded from the layout's words.
Q4kBlock decode_q4k(const uint8_t* row, int64_t cols, int64_t b) {
  const uint8_t* p = row + cols / 2 + 16 * (b / 8);
  const int j = static_cast<int>(b % 8);
  Q4kBlock k{};
  k.d = f16_at(p);
  k.dmin = f16_at(p + 2);
  k.sc = p[4 + j] & 63;
  const int low = j < 4 ? p[12 + j] & 15 : p[12 + j - 4] >> 4;
  k.mn = low | (p[4 + j] >> 6) << 4;
  for (int t = 0; t < 16; ++t) {
    k.q[t] = row[16 * b + t] & 15;
    k.q[t + 16] = row[16 * b + t] >> 4;
  }
  return k;
}

TEST(QuantK256, RowBytesAreTheFormatsBits) {
  EXPECT_EQ(quant_row_bytes(DType::Q4_K256, 1024), 1024u * 9 / 16);     // 4.5 bits
  EXPECT_EQ(quant_row_bytes(DType::Q6_K256, 1024), 1024u * 105 / 128);  // 6.5625 bits
  EXPECT_EQ(quant_row_multiple(DType::Q4_K256), 256);
  EXPECT_EQ(quant_row_multiple(DType::Q4_B32), 32);
  for (const DType f : {DType::Q4_K256, DType::Q6_K256}) {
    EXPECT_THROW(quant_row_bytes(f, 288), Error);
    EXPECT_THROW(quant_row_bytes(f, 0), Error);
  }
}

TEST(QuantK256, Q4kStoresNearestCodesForItsScales) {
  std::mt19937 rng(5);
  for (const int64_t cols : {256, 768}) {
    for (int rep = 0; rep < 20; ++rep) {
      const std::vector<float> x = random_row(cols, rng);
      std::vector<uint8_t> row(quant_row_bytes(DType::Q4_K256, cols));
      quantize_row(DType::Q4_K256, x.data(), cols, row.data());
      std::vector<float> back(static_cast<size_t>(cols));
      dequantize_row(DType::Q4_K256, row.data(), cols, back.data());
      for (int64_t b = 0; b < cols / 32; ++b) {
        const Q4kBlock k = decode_q4k(row.data(), cols, b);
        const float big_d = k.d * static_cast<float>(k.sc),
                    big_m = k.dmin * static_cast<float>(k.mn);
        EXPECT_GE(k.d, 0.0f);
        EXPECT_GE(k.dmin, 0.0f);
        for (int t = 0; t < 32; ++t) {
          const float xv = x[b * 32 + t];
          const float nearest =
              big_d == 0.0f ? 0.0f : std::clamp(std::nearbyint((xv + big_m) / big_d), 0.0f, 15.0f);
          ASSERT_EQ(k.q[t], static_cast<int>(nearest)) << "block " << b << " weight " << t;
          ASSERT_EQ(back[b * 32 + t], big_d * static_cast<float>(k.q[t]) - big_m);
        }
      }
    }
  }
}

TEST(QuantK256, Q4kRefinementNeverAboveTheUnrefinedScales) {
  std::mt19937 rng(6);
  double refined_total = 0, unrefined_total = 0;
  for (int rep = 0; rep < 40; ++rep) {
    const std::vector<float> x = random_row(256, rng);
    std::vector<uint8_t> row(quant_row_bytes(DType::Q4_K256, 256));
    quantize_row(DType::Q4_K256, x.data(), 256, row.data());
    float dj[8], mj[8];
    for (int j = 0; j < 8; ++j) {
      const float* xb = x.data() + 32 * j;
      const auto [d, m] = choose_asymmetric_scale(xb, 32, 15);
      dj[j] = m <= 0.0f ? d : f16_round(*std::max_element(xb, xb + 32) / 15.0f);
      mj[j] = m < 0.0f ? -m : 0.0f;
    }
    const float d = f16_round(*std::max_element(dj, dj + 8) / 63.0f);
    const float dmin = f16_round(*std::max_element(mj, mj + 8) / 63.0f);
    for (int j = 0; j < 8; ++j) {
      const Q4kBlock k = decode_q4k(row.data(), 256, j);
      ASSERT_EQ(k.d, d);
      ASSERT_EQ(k.dmin, dmin);
      const float sc0 = d == 0.0f ? 0.0f : std::clamp(std::nearbyint(dj[j] / d), 0.0f, 63.0f);
      const float mn0 = dmin == 0.0f ? 0.0f : std::clamp(std::nearbyint(mj[j] / dmin), 0.0f, 63.0f);
      const double unrefined = asymmetric_error(x.data() + 32 * j, 32, 15, d * sc0, -(dmin * mn0));
      const double refined =
          asymmetric_error(x.data() + 32 * j, 32, 15, d * static_cast<float>(k.sc),
                           -(dmin * static_cast<float>(k.mn)));
      ASSERT_LE(refined, unrefined) << "block " << j;
      EXPECT_LE(std::abs(k.sc - sc0), 4);  // two passes of steps up to 2
      refined_total += refined;
      unrefined_total += unrefined;
    }
  }
  EXPECT_LT(refined_total, unrefined_total);  // it finds something on 320 random blocks
}

TEST(QuantK256, Q6kStoresNearestCodesForItsScales) {
  std::mt19937 rng(7);
  for (const int64_t cols : {256, 768}) {
    for (int rep = 0; rep < 20; ++rep) {
      const std::vector<float> x = random_row(cols, rng);
      std::vector<uint8_t> row(quant_row_bytes(DType::Q6_K256, cols));
      quantize_row(DType::Q6_K256, x.data(), cols, row.data());
      std::vector<float> back(static_cast<size_t>(cols));
      dequantize_row(DType::Q6_K256, row.data(), cols, back.data());
      const uint8_t* high = row.data() + cols / 2;
      const uint8_t* sc = row.data() + cols / 2 + cols / 4;
      const uint8_t* dp = sc + cols / 16;
      double refined = 0, unrefined = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const int64_t b = k / 32, t = k % 32;
        const int low = t < 16 ? row[16 * b + t] & 15 : row[16 * b + t - 16] >> 4;
        const int top = high[8 * b + t % 8] >> (2 * (t / 8)) & 3;
        const int q = low | top << 4;
        const float d = f16_at(dp + 2 * (k / 256));
        const float big_d = d * static_cast<float>(sc[k / 16]);
        const float nearest =
            big_d == 0.0f ? 0.0f : std::clamp(std::nearbyint(x[k] / big_d), -31.0f, 31.0f);
        ASSERT_EQ(q - 32, static_cast<int>(nearest)) << "weight " << k;
        ASSERT_EQ(back[k], big_d * static_cast<float>(q - 32));
      }
      for (int64_t i = 0; i < cols / 16; ++i) {
        const float s = choose_symmetric_scale(x.data() + 16 * i, 16, 31);
        float smax = 0;
        for (int64_t u = (i / 16) * 16; u < (i / 16) * 16 + 16; ++u)
          smax = std::max(smax, choose_symmetric_scale(x.data() + 16 * u, 16, 31));
        const float d = f16_round(smax / 255.0f);
        ASSERT_EQ(f16_at(dp + 2 * (i / 16)), d);
        const float sc0 = d == 0.0f ? 0.0f : std::clamp(std::nearbyint(s / d), 0.0f, 255.0f);
        const double e0 = symmetric_error(x.data() + 16 * i, 16, 31, d * sc0);
        const double e = symmetric_error(x.data() + 16 * i, 16, 31, d * static_cast<float>(sc[i]));
        ASSERT_LE(e, e0) << "sub-block " << i;
        refined += e;
        unrefined += e0;
      }
      EXPECT_LE(refined, unrefined);
    }
  }
}

TEST(QuantK256, EdgeBlocks) {
  // An all-zero super-block reads back as zeros; a block of positive weights gets min 0; a
  // super-block of equal values reads back within half a step of its min.
  std::vector<float> x(512, 0.0f);
  for (int t = 0; t < 32; ++t) x[256 + 32 + t] = 0.5f + 0.01f * static_cast<float>(t);
  for (const DType f : {DType::Q4_K256, DType::Q6_K256}) {
    std::vector<uint8_t> row(quant_row_bytes(f, 512));
    quantize_row(f, x.data(), 512, row.data());
    std::vector<float> back(512);
    dequantize_row(f, row.data(), 512, back.data());
    for (int k = 0; k < 256; ++k) ASSERT_EQ(back[k], 0.0f) << dtype_name(f) << " " << k;
    // Within about half a step of max / 15 (Q4_K256, whose min is 0 here) or max / 31.
    for (int t = 0; t < 32; ++t)
      EXPECT_NEAR(back[256 + 32 + t], x[256 + 32 + t], 0.03f) << dtype_name(f) << " " << t;
  }
  std::vector<uint8_t> row(quant_row_bytes(DType::Q4_K256, 512));
  quantize_row(DType::Q4_K256, x.data(), 512, row.data());
  EXPECT_EQ(decode_q4k(row.data(), 512, 9).mn, 0);
  std::vector<float> equal(256, -0.25f);
  quantize_row(DType::Q4_K256, equal.data(), 256, row.data());
  std::vector<float> back(256);
  dequantize_row(DType::Q4_K256, row.data(), 256, back.data());
  // The min is 63 steps of f16(0.25 / 63): within half a step of it.
  for (const float v : back) EXPECT_NEAR(v, -0.25f, 0.25f / 63 / 2);
}

TEST(QuantK256, RefusesNonFiniteWeights) {
  for (const DType f : {DType::Q4_K256, DType::Q6_K256}) {
    std::vector<float> x(256, 0.1f);
    x[77] = std::nanf("");
    std::vector<uint8_t> row(quant_row_bytes(f, 256));
    EXPECT_THROW(quantize_row(f, x.data(), 256, row.data()), Error);
  }
}

TEST(QuantK256, NamesRoundTrip) {
  for (const DType f : {DType::Q4_K256, DType::Q6_K256})
    EXPECT_EQ(quant_tensor_format_from_name(quant_format_name(f), "test"), f);
  EXPECT_EQ(quant_format_name(DType::Q4_K256), "int4k");
  EXPECT_THROW(quant_tensor_format_from_name("int5k", "test"), Error);
}

}  // namespace
}  // namespace attnres
