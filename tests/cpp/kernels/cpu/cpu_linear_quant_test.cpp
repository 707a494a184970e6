// Block-quantized weights on the CPU backend (DType::Q8_B32 / Q6_B32 / Q4_B32 / Q6_K256 /
// Q4_K256): the formats' quantize / dequantize round trip (engine/core/quant_format.h), the
// activation quantization, linear (GEMV and GEMM paths, with and without bias, linear_many /
// linear_swiglu) against a double-precision reference built from dequantize_matrix and the
// activation quantization redone in double, the defined arithmetic and batch and thread-count
// invariance bit for bit, and embedding of a quantized table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_linear_quant.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres {
namespace {

constexpr DType kFormats[] = {DType::Q8_B32, DType::Q6_B32, DType::Q4_B32, DType::Q6_K256,
                              DType::Q4_K256};

// k rounded up to a row length `format` allows (a multiple of 32, K256: of 256).
int64_t cols_for(DType format, int64_t k) {
  const int64_t m = quant_row_multiple(format);
  return (k + m - 1) / m * m;
}

// The row lengths a test runs: `b32` for the B32 formats; for the K256 ones one super-block,
// and odd numbers of them (the AVX-512 GEMV reads 2 super-blocks' params at a time: its last
// chunk is then one).
std::vector<int64_t> ks_for(DType format, std::initializer_list<int64_t> b32) {
  if (quant_row_multiple(format) == 256) return {256, 768, 1280};
  return b32;
}

// Q4_K256's block j (0..7) of a super-block's params p as quant_format.h lays them out:
// D = d sc_j and -M = -(dmin mn_j), decoded here independently of the kernels and
// q4k_block_params.
BlockScaleMin q4k_params_by_hand(const uint8_t* p, int j) {
  uint16_t d, dmin;
  std::memcpy(&d, p, 2);
  std::memcpy(&dmin, p + 2, 2);
  const int sc = p[4 + j] % 64;
  const int mn = (j < 4 ? p[12 + j] % 16 : p[8 + j] / 16) + 16 * (p[4 + j] / 64);
  return {f16_to_f32(d) * static_cast<float>(sc), -(f16_to_f32(dmin) * static_cast<float>(mn))};
}

std::vector<float> random_floats(int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = dist(rng);
  return v;
}

Tensor f32_tensor(const Shape& shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

// Weights whose blocks have different magnitudes and offsets (every scale and min non-zero).
Tensor random_weights(int64_t n, int64_t k, std::mt19937& rng) {
  std::vector<float> v = random_floats(n * k, rng, -1.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.05f, 2.0f), off(-0.5f, 0.5f);
  for (int64_t b = 0; b < n * k / 32; ++b) {
    const float m = mag(rng), o = off(rng);
    for (int j = 0; j < 32; ++j) v[b * 32 + j] = v[b * 32 + j] * m + o;
  }
  return f32_tensor({n, k}, v);
}

// Activations with an outlier channel, as LLM hidden states have.
std::vector<float> random_activations(int64_t r, int64_t k, std::mt19937& rng) {
  std::vector<float> x = random_floats(r * k, rng, -2.0f, 2.0f);
  for (int64_t i = 0; i < r; ++i) x[i * k + (7 % k)] *= 20.0f;
  return x;
}

double f16_round(double v) { return f16_to_f32(f32_to_f16(static_cast<float>(v))); }
double stored_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// --- the formats ---

TEST(QuantFormat, Q8RoundTripWithinHalfAStep) {
  std::mt19937 rng(11);
  const int64_t k = 320;
  for (int rep = 0; rep < 20; ++rep) {
    Tensor w = random_weights(1, k, rng);
    const float* x = w.ptr<float>();
    std::vector<uint8_t> row(quant_row_bytes(DType::Q8_B32, k));
    quantize_row(DType::Q8_B32, x, k, row.data());
    std::vector<float> back(k);
    dequantize_row(DType::Q8_B32, row.data(), k, back.data());
    for (int64_t b = 0; b < k / 32; ++b) {
      double amax = 0.0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(double{x[b * 32 + j]}));
      const double d = stored_f16(row.data() + k + 2 * b);  // the search's choice
      EXPECT_LE(d, f16_round(amax / 125.0)) << b;           // the candidates lie in
      EXPECT_GE(d, f16_round(amax / 129.0)) << b;           // [amax / (127 + 2), amax / (127 - 2)]
      for (int j = 0; j < 32; ++j) {
        const int64_t i = b * 32 + j;
        const double q = back[i] / d;
        EXPECT_EQ(q, std::nearbyint(q)) << i;  // an integer multiple of the block's scale
        EXPECT_LE(std::fabs(q), 127.0) << i;
        // Half a step, plus what clamping at 127 costs where d is below amax / 127.
        EXPECT_LE(std::fabs(x[i] - back[i]), d / 2 + std::max(0.0, amax - 127.0 * d) + 1e-7) << i;
      }
    }
  }
}

TEST(QuantFormat, Q6RoundTripWithinHalfAStep) {
  std::mt19937 rng(13);
  const int64_t k = 320;
  for (int rep = 0; rep < 20; ++rep) {
    Tensor w = random_weights(1, k, rng);
    const float* x = w.ptr<float>();
    std::vector<uint8_t> row(quant_row_bytes(DType::Q6_B32, k));
    ASSERT_EQ(row.size(), static_cast<size_t>(k / 2 + k / 4 + 2 * k / 32));  // 6.5 bits
    quantize_row(DType::Q6_B32, x, k, row.data());
    std::vector<float> back(k);
    dequantize_row(DType::Q6_B32, row.data(), k, back.data());
    for (int64_t b = 0; b < k / 32; ++b) {
      double amax = 0.0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(double{x[b * 32 + j]}));
      // The search's choice, among amax / (31 + i / 5), |i| <= 10 (engine/core/quant_search.h).
      const double d = stored_f16(row.data() + quant_scales_offset(DType::Q6_B32, k) + 2 * b);
      EXPECT_LE(d, f16_round(amax / 29.0)) << b;
      EXPECT_GE(d, f16_round(amax / 33.0)) << b;
      for (int j = 0; j < 32; ++j) {
        const int64_t i = b * 32 + j;
        const double q = back[i] / d;
        EXPECT_EQ(q, std::nearbyint(q)) << i;
        EXPECT_LE(std::fabs(q), 31.0) << i;
        EXPECT_LE(std::fabs(x[i] - back[i]), d / 2 + std::max(0.0, amax - 31.0 * d) + 1e-7) << i;
      }
    }
  }
}

// The stored bits of Q6_B32 as quant_format.h lays them out, for one block: weight j's q (its
// value / d + 32) in the low nibbles (Q4_B32's order) and the 2-bit high array.
TEST(QuantFormat, Q6StoresTheDocumentedLayout) {
  const int64_t k = 64;
  std::vector<float> x(k);
  for (int64_t i = 0; i < k; ++i) x[i] = static_cast<float>((i * 7) % 63 - 31);  // q = x + 32
  x[33] = 31.0f;  // block 1's max |x|: d = 1 in both blocks
  std::vector<uint8_t> row(quant_row_bytes(DType::Q6_B32, k));
  quantize_row(DType::Q6_B32, x.data(), k, row.data());
  for (int64_t i = 0; i < k; ++i) {
    const int64_t b = i / 32, j = i % 32;
    const int q = static_cast<int>(x[i]) + 32;
    const uint8_t low = row[16 * b + j % 16];
    EXPECT_EQ((j < 16 ? low : low >> 4) & 15, q & 15) << i;
    EXPECT_EQ(row[k / 2 + 8 * b + j % 8] >> (2 * (j / 8)) & 3, q >> 4) << i;
  }
  uint16_t d;
  std::memcpy(&d, row.data() + k / 2 + k / 4 + 2, 2);
  EXPECT_EQ(f16_to_f32(d), 1.0f);
}

TEST(QuantFormat, Q4RoundTripWithinHalfAStep) {
  std::mt19937 rng(12);
  const int64_t k = 320;
  for (int rep = 0; rep < 20; ++rep) {
    Tensor w = random_weights(1, k, rng);
    const float* x = w.ptr<float>();
    std::vector<uint8_t> row(quant_row_bytes(DType::Q4_B32, k));
    quantize_row(DType::Q4_B32, x, k, row.data());
    std::vector<float> back(k);
    dequantize_row(DType::Q4_B32, row.data(), k, back.data());
    for (int64_t b = 0; b < k / 32; ++b) {
      double lo = x[b * 32], hi = x[b * 32];
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, double{x[b * 32 + j]});
        hi = std::max(hi, double{x[b * 32 + j]});
      }
      // The search's choice (engine/core/quant_search.h).
      const double d = stored_f16(row.data() + k / 2 + 2 * b);
      const double m = stored_f16(row.data() + k / 2 + 2 * (k / 32) + 2 * b);
      for (int j = 0; j < 32; ++j) {
        const int64_t i = b * 32 + j;
        const double q = (back[i] - m) / d;
        EXPECT_NEAR(q, std::nearbyint(q), 1e-3) << i;
        EXPECT_GE(std::nearbyint(q), 0.0) << i;
        EXPECT_LE(std::nearbyint(q), 15.0) << i;
        // Half a step, plus how far the ends lie outside [m, m + 15 d].
        const double slack = std::max(0.0, m - lo) + std::max(0.0, hi - (m + 15.0 * d));
        EXPECT_LE(std::fabs(x[i] - back[i]), d / 2 + slack + 1e-6) << i;
      }
    }
  }
}

TEST(QuantFormat, RefusesNonFiniteWeightsAndOverflowingScales) {
  for (DType f : kFormats) {
    const int64_t k = cols_for(f, 64);
    const std::vector<float> x(k, 0.5f);
    std::vector<uint8_t> row(quant_row_bytes(f, k));
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      std::vector<float> y = x;
      y[40] = bad;
      EXPECT_THROW(quantize_row(f, y.data(), k, row.data()), Error) << test::name(f);
    }
    std::vector<float> huge = x;
    huge[3] = 1e7f;  // a scale of ~8e4 (Q8) / ~7e5 (Q4): beyond f16
    EXPECT_THROW(quantize_row(f, huge.data(), k, row.data()), Error) << test::name(f);
    EXPECT_THROW(quant_row_bytes(f, 48), Error);
  }
}

TEST(QuantFormat, AllZeroBlockIsExact) {
  for (DType f : kFormats) {
    const int64_t k = cols_for(f, 64);
    std::vector<float> x(k, 0.0f), back(k, 1.0f);
    x[40] = 0.25f;  // the second block is not zero
    std::vector<uint8_t> row(quant_row_bytes(f, k));
    quantize_row(f, x.data(), k, row.data());
    dequantize_row(f, row.data(), k, back.data());
    for (int j = 0; j < 32; ++j) EXPECT_EQ(back[j], 0.0f) << test::name(f) << " " << j;
  }
}

// --- the activation quantization ---

// Its definition in double: dx = f32(amax / 127) (f32 division is correctly rounded, as is
// this one rounded once more to f32), qx = the integer nearest x / dx, ties to even. The
// kernel divides in f32: the two may differ only where x / dx is within f32 rounding of a
// tie, which this reports instead of comparing.
struct ActRef {
  double d;
  std::vector<double> q;
  std::vector<bool> near_tie;
};
ActRef activation_reference(const float* x) {
  double amax = 0.0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(double{x[j]}));
  ActRef a{static_cast<float>(amax / 127.0), std::vector<double>(32), std::vector<bool>(32)};
  for (int j = 0; j < 32; ++j) {
    const double v = a.d == 0.0 ? 0.0 : x[j] / a.d;
    a.q[j] = std::clamp(std::nearbyint(v), -127.0, 127.0);
    a.near_tie[j] = std::fabs(std::fabs(v - std::trunc(v)) - 0.5) < 1e-6 * std::fabs(v) + 1e-9;
  }
  return a;
}

TEST(QuantActivations, BlockMatchesTheDoubleDefinition) {
  std::mt19937 rng(21);
  int compared = 0;
  for (int rep = 0; rep < 2000; ++rep) {
    std::vector<float> x = random_floats(32, rng, -3.0f, 3.0f);
    if (rep % 7 == 0) x[rep % 32] *= 100.0f;
    if (rep % 11 == 0) x.assign(32, 0.0f);
    int8_t q[32];
    const float d = cpu::quantize_activation_block(x.data(), q);
    const ActRef ref = activation_reference(x.data());
    ASSERT_EQ(double{d}, ref.d);
    for (int j = 0; j < 32; ++j) {
      if (ref.near_tie[j]) {
        EXPECT_LE(std::fabs(q[j] - ref.q[j]), 1.0);
      } else {
        EXPECT_EQ(static_cast<double>(q[j]), ref.q[j]) << "x " << x[j] << " d " << d;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 60000);
}

// x / dx exactly k + 1/2 rounds to the even neighbour, as the header defines (the test above
// skips ties). These happen in models: a bf16 checkpoint's first-layer activations (RMSNorm of
// an embedding row times bf16 gains) often land on them.
TEST(QuantActivations, ExactTiesRoundToEven) {
  for (const float scale : {1.0f, 0x1p-7f, 0x1p+5f}) {  // dx = scale, exactly
    // x / dx: the block's largest magnitude (127) and ties around it.
    const float ratios[] = {127.0f, 0.5f,    1.5f,  2.5f,   -0.5f, -1.5f,  -2.5f,  3.5f,
                            126.5f, -126.5f, 64.5f, -63.5f, 17.5f, -18.5f, 100.5f, 5.0f};
    const int8_t want[] = {127, 0, 2, 2, 0, -2, -2, 4, 126, -126, 64, -64, 18, -18, 100, 5};
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = ratios[j % 16] * scale;
    int8_t q[32];
    ASSERT_EQ(cpu::quantize_activation_block(x, q), scale);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q[j], want[j % 16]) << "x / dx " << ratios[j % 16];
  }
}

// --- linear ---

// out[r, o] in double from the dequantized weights and the activations quantized in double,
// and for each output the tolerance: rtol times the magnitude of the float terms the kernel
// adds (each block's scaled integer sum and min term), plus, for a qx the kernel may round the
// other way (a near tie), that element's product.
struct LinearRef {
  std::vector<double> out, tol;
};
LinearRef linear_reference(const std::vector<float>& x, int64_t r_dim, const Tensor& wq,
                           const float* bias, double rtol) {
  const int64_t n = wq.dim(0), k = wq.dim(1);
  const Tensor wd = dequantize_matrix(wq);
  const float* w = wd.ptr<float>();
  const size_t row_bytes = quant_row_bytes(wq.dtype, k);
  const size_t scales = quant_scales_offset(wq.dtype, k);
  const bool k256 = wq.dtype == DType::Q4_K256;
  LinearRef ref{std::vector<double>(r_dim * n), std::vector<double>(r_dim * n)};
  for (int64_t r = 0; r < r_dim; ++r) {
    std::vector<ActRef> acts;
    for (int64_t b = 0; b < k / 32; ++b) acts.push_back(activation_reference(&x[r * k + b * 32]));
    for (int64_t o = 0; o < n; ++o) {
      const uint8_t* row = wq.ptr<const uint8_t>() + o * row_bytes;
      double sum = 0.0, mag = 0.0, ties = 0.0;
      for (int64_t b = 0; b < k / 32; ++b) {
        const ActRef& a = acts[b];
        double m = 0.0;
        if (wq.dtype == DType::Q4_B32) {
          uint16_t mh;
          std::memcpy(&mh, row + quant_mins_offset(wq.dtype, k) + 2 * b, 2);
          m = f16_to_f32(mh);
        } else if (k256) {
          m = q4k_params_by_hand(row + scales + 16 * (b / 8), static_cast<int>(b % 8)).m;
        }
        double abs_q = 0.0, sx = 0.0, abs_x = 0.0;
        for (int j = 0; j < 32; ++j) {
          const double wv = w[o * k + b * 32 + j];
          sum += wv * (a.d * a.q[j]);
          abs_q += std::fabs((wv - m) * a.q[j]);
          sx += a.q[j];
          abs_x += std::fabs(a.q[j]);
          if (a.near_tie[j]) ties += std::fabs(wv) * a.d;
        }
        mag += abs_q * a.d + std::fabs(m * a.d * sx);
        // Q4_K256's dequantized weights are f32(D q - M), rounded: the kernel's exact D q and
        // M terms may differ from them by 2^-24 (|D q| + M) per weight.
        if (k256) mag += std::fabs(m) * a.d * abs_x;
      }
      if (bias) {
        sum += bias[o];
        mag += std::fabs(bias[o]);
      }
      ref.out[r * n + o] = sum;
      ref.tol[r * n + o] = rtol * mag + ties;
    }
  }
  return ref;
}

::testing::AssertionResult matches(const Tensor& got, const LinearRef& ref) {
  const float* g = got.ptr<float>();
  for (size_t i = 0; i < ref.out.size(); ++i) {
    if (!(std::fabs(g[i] - ref.out[i]) <= ref.tol[i]))
      return ::testing::AssertionFailure() << "element " << i << ": got " << g[i] << " want "
                                           << ref.out[i] << " tolerance " << ref.tol[i];
  }
  return ::testing::AssertionSuccess();
}

// The float part (cpu_linear_quant.h): per block, the f32 conversion of the (exact) integer
// sum is exact, the scale dw * dx rounds once, the fma once, the min term's dx * sum qx and
// its fma once each (Q6_K256: the f32 conversion of the block's integer sum may round too,
// by 2^-24 of a term bounded as the block's share of the magnitude): a chain of at most
// 2 K / 32 fmas and the bias, each rounding by 2^-24 of a partial sum bounded by the magnitude
// above. 1e-6 * (K / 32 + 8) covers that with margin.
double rtol_for(int64_t k) { return 1e-6 * static_cast<double>(k / 32 + 8); }

TEST(CpuLinearQuant, MatchesTheReferenceOnEveryPath) {
  std::mt19937 rng(31);
  auto be = make_cpu_backend(2);
  // K: one block (a partial step everywhere), an odd number of blocks, whole AVX-512 steps
  // plus one and three blocks; N: below and past the GEMM's output tile and the GEMV chunk.
  const int64_t ns[] = {1, 5, 37, 70};
  const int64_t rs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 38};
  for (DType f : kFormats) {
    for (int64_t k : ks_for(f, {32, 96, 416, 1120})) {
      for (int64_t n : ns) {
        const Tensor wq = quantize_matrix(random_weights(n, k, rng), f);
        const std::vector<float> bias_v = random_floats(n, rng, -1.0f, 1.0f);
        const Tensor bias = f32_tensor({n}, bias_v);
        for (int64_t r : rs) {
          const std::vector<float> x = random_activations(r, k, rng);
          const Tensor xt = f32_tensor({r, k}, x);
          for (const bool with_bias : {false, true}) {
            Tensor out = Tensor::empty({r, n}, DType::F32);
            be->linear(xt, wq, with_bias ? &bias : nullptr, out);
            const LinearRef ref =
                linear_reference(x, r, wq, with_bias ? bias_v.data() : nullptr, rtol_for(k));
            EXPECT_TRUE(matches(out, ref)) << test::name(f) << " R " << r << " K " << k << " N "
                                           << n << (with_bias ? " bias" : "");
          }
        }
      }
    }
  }
}

// The header's arithmetic, redone here with scalar code from the stored bytes and
// quantize_activation_block (checked above against its double definition): acc = 0; per
// block acc = fma(I_b, f32(dw_b dx_b), acc) (Q4_B32, Q4_K256: then acc = fma(m_b, f32(dx_b
// sum qx), acc), Q4_K256's dw_b and m_b decoded by q4k_params_by_hand; Q6_B32: I_b = sum
// (q - 32) qx; Q6_K256: I_b = sum over the block's two sub-blocks of sc_i sum (q - 32) qx, and
// the scale f32(d_s dx_b) with d_s the super-block's f16 scale); out = acc (+ bias). The
// integer sums are exact, so every kernel must match it bit for bit.
std::vector<float> canonical_linear(const std::vector<float>& x, int64_t r_dim, const Tensor& wq,
                                    const float* bias) {
  const int64_t n = wq.dim(0), k = wq.dim(1), blocks = k / 32;
  const size_t row_bytes = quant_row_bytes(wq.dtype, k);
  const bool k256 = wq.dtype == DType::Q4_K256;
  const bool q4 = wq.dtype == DType::Q4_B32 || k256;
  std::vector<float> out(r_dim * n);
  for (int64_t r = 0; r < r_dim; ++r) {
    std::vector<int8_t> qx(k);
    std::vector<float> dx(blocks);
    for (int64_t b = 0; b < blocks; ++b)
      dx[b] = cpu::quantize_activation_block(&x[r * k + b * 32], &qx[b * 32]);
    for (int64_t o = 0; o < n; ++o) {
      const uint8_t* row = wq.ptr<const uint8_t>() + o * row_bytes;
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        // The sums in double (exact: |sum| < 2^26): GCC 12 vectorizes an int8 x int8 sum of
        // products for AVX-512 VNNI targets wrongly (off by 128 x the first operand's sum).
        double half[2] = {0.0, 0.0}, sx = 0.0;  // sum qw qx over weights 0..15, 16..31
        for (int j = 0; j < 32; ++j) {
          int qw = static_cast<int8_t>(row[32 * b + j]);
          if (wq.dtype != DType::Q8_B32)  // Q4_B32's nibbles, and Q6_B32's low 4 bits
            qw = j < 16 ? row[16 * b + j] & 15 : row[16 * b + j - 16] >> 4;
          if (wq.dtype == DType::Q6_B32 || wq.dtype == DType::Q6_K256)
            qw = (qw | (row[quant_highs_offset(wq.dtype, k) + 8 * b + j % 8] >> (2 * (j / 8)) & 3)
                           << 4) -
                 32;
          half[j / 16] += static_cast<double>(qw) * qx[b * 32 + j];
          sx += qx[b * 32 + j];
        }
        double sum;
        float scale, m = 0.0f;
        if (wq.dtype == DType::Q6_K256) {  // u8 sub-block scales, f16 super-block scale
          const uint8_t* sc = row + quant_scales_offset(wq.dtype, k) + 2 * b;
          sum = sc[0] * half[0] + sc[1] * half[1];
          scale = static_cast<float>(
              stored_f16(row + quant_super_scales_offset(wq.dtype, k) + 2 * (b / 8)) * dx[b]);
        } else {
          sum = half[0] + half[1];
          float dw = static_cast<float>(stored_f16(row + quant_scales_offset(wq.dtype, k) + 2 * b));
          if (wq.dtype == DType::Q4_B32) {
            m = static_cast<float>(stored_f16(row + quant_mins_offset(wq.dtype, k) + 2 * b));
          } else if (k256) {
            const BlockScaleMin p = q4k_params_by_hand(
                row + quant_scales_offset(wq.dtype, k) + 16 * (b / 8), static_cast<int>(b % 8));
            dw = p.d;
            m = p.m;
          }
          scale = dw * dx[b];
        }
        acc = std::fma(static_cast<float>(sum), scale, acc);
        if (q4) acc = std::fma(m, dx[b] * static_cast<float>(sx), acc);
      }
      out[r * n + o] = bias ? acc + bias[o] : acc;
    }
  }
  return out;
}

TEST(CpuLinearQuant, EqualsTheDefinedArithmeticBitForBit) {
  SCOPED_TRACE(cpu::quantized_linear_isa());
  std::mt19937 rng(35);
  auto be = make_cpu_backend(2);
  for (DType f : kFormats) {
    for (int64_t k : ks_for(f, {32, 160, 1056})) {
      const int64_t n = 45;
      const Tensor wq = quantize_matrix(random_weights(n, k, rng), f);
      const std::vector<float> bias_v = random_floats(n, rng, -1.0f, 1.0f);
      const Tensor bias = f32_tensor({n}, bias_v);
      for (int64_t r : {1, 2, 3, 4, 5, 6, 7, 8, 9, 31}) {
        const std::vector<float> x = random_activations(r, k, rng);
        for (const bool with_bias : {false, true}) {
          Tensor out = Tensor::empty({r, n}, DType::F32);
          be->linear(f32_tensor({r, k}, x), wq, with_bias ? &bias : nullptr, out);
          const std::vector<float> want =
              canonical_linear(x, r, wq, with_bias ? bias_v.data() : nullptr);
          EXPECT_EQ(0, std::memcmp(out.ptr<float>(), want.data(), want.size() * 4))
              << test::name(f) << " R " << r << " K " << k << (with_bias ? " bias" : "");
        }
      }
    }
  }
}

// Q4_K256 rows of arbitrary bytes (every bit of the 6-bit scales and mins, in every block
// position, set and clear; d and dmin positive f16 of varied exponents) give the defined
// arithmetic's bits on every path; q4k_block_params reads them as the layout says.
TEST(CpuLinearQuant, Q4K256ReadsEveryParamBit) {
  SCOPED_TRACE(cpu::quantized_linear_isa());
  std::mt19937 rng(37);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.25f, 4.0f);
  auto be = make_cpu_backend(2);
  const int64_t n = 37;
  for (const int64_t k : {256, 768, 2304}) {
    Tensor wq = Tensor::empty({n, k}, DType::Q4_K256);
    const size_t row_bytes = quant_row_bytes(DType::Q4_K256, k);
    const size_t params = quant_scales_offset(DType::Q4_K256, k);
    auto* w = wq.ptr<uint8_t>();
    for (int64_t o = 0; o < n; ++o) {
      uint8_t* row = w + o * row_bytes;
      for (size_t i = 0; i < row_bytes; ++i) row[i] = static_cast<uint8_t>(byte(rng));
      for (int64_t s = 0; s < k / 256; ++s) {
        uint8_t* p = row + params + 16 * s;
        const uint16_t d = f32_to_f16(scale(rng) * 0x1p-8f),
                       dmin = f32_to_f16(scale(rng) * 0x1p-6f);
        std::memcpy(p, &d, 2);
        std::memcpy(p + 2, &dmin, 2);
        for (int j = 0; j < 8; ++j) {
          const BlockScaleMin want = q4k_params_by_hand(p, j), got = q4k_block_params(p, j);
          ASSERT_EQ(got.d, want.d) << "row " << o << " super-block " << s << " block " << j;
          ASSERT_EQ(got.m, want.m) << "row " << o << " super-block " << s << " block " << j;
        }
      }
    }
    const std::vector<float> bias_v = random_floats(n, rng, -1.0f, 1.0f);
    const Tensor bias = f32_tensor({n}, bias_v);
    for (int64_t r : {1, 2, 5, 8, 12}) {
      const std::vector<float> x = random_activations(r, k, rng);
      for (const bool with_bias : {false, true}) {
        Tensor out = Tensor::empty({r, n}, DType::F32);
        be->linear(f32_tensor({r, k}, x), wq, with_bias ? &bias : nullptr, out);
        const std::vector<float> want =
            canonical_linear(x, r, wq, with_bias ? bias_v.data() : nullptr);
        EXPECT_EQ(0, std::memcmp(out.ptr<float>(), want.data(), want.size() * 4))
            << "R " << r << " K " << k << (with_bias ? " bias" : "");
      }
    }
  }
}

// Q6_K256's block sums reach 255 x 31 x 127 x 32 > 2^24 where weights and activations are
// all near their block's largest: f32(I_b) then rounds, as the definition has it, alike in the
// GEMV and the GEMM.
TEST(CpuLinearQuant, Q6K256LargeBlockSumsRoundAsDefined) {
  std::mt19937 rng(37);
  auto be = make_cpu_backend(2);
  const int64_t k = 768, n = 37;
  std::vector<float> w = random_floats(n * k, rng, 0.8f, 1.0f);
  const Tensor wq = quantize_matrix(f32_tensor({n, k}, w), DType::Q6_K256);
  const Tensor wd = dequantize_matrix(wq);
  for (int64_t r : {1, 3, 8, 9, 20}) {
    const std::vector<float> x = random_floats(r * k, rng, 0.9f, 1.0f);
    // Output 0's first block, row 0: I_b = sum w qx / d_s (w = d_s sc (q - 32) exactly).
    int8_t qx[32];
    cpu::quantize_activation_block(x.data(), qx);
    const double ds =
        stored_f16(wq.ptr<const uint8_t>() + quant_super_scales_offset(DType::Q6_K256, k));
    double ib = 0.0;
    for (int j = 0; j < 32; ++j) ib += wd.ptr<float>()[j] / ds * qx[j];
    EXPECT_GT(ib, 0x1p24);
    Tensor out = Tensor::empty({r, n}, DType::F32);
    be->linear(f32_tensor({r, k}, x), wq, nullptr, out);
    const std::vector<float> want = canonical_linear(x, r, wq, nullptr);
    EXPECT_EQ(0, std::memcmp(out.ptr<float>(), want.data(), want.size() * 4)) << "R " << r;
  }
}

// A row's outputs do not depend on how many rows share the call (GEMV for up to 8, GEMM
// above), where it sits in the batch, or the thread count: the same bits.
TEST(CpuLinearQuant, BatchAndThreadInvariantBitForBit) {
  std::mt19937 rng(41);
  auto be2 = make_cpu_backend(2);
  auto be1 = make_cpu_backend(1);
  const int64_t n = 75, rows = 64;
  for (DType f : kFormats) {
    const int64_t k = cols_for(f, 288);
    const Tensor wq = quantize_matrix(random_weights(n, k, rng), f);
    const Tensor bias = f32_tensor({n}, random_floats(n, rng, -1.0f, 1.0f));
    const std::vector<float> x = random_activations(rows, k, rng);
    std::vector<float> alone(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      const Tensor xr =
          f32_tensor({1, k}, std::vector<float>(x.begin() + r * k, x.begin() + (r + 1) * k));
      Tensor out = Tensor::empty({1, n}, DType::F32);
      be2->linear(xr, wq, &bias, out);
      std::copy(out.ptr<float>(), out.ptr<float>() + n, alone.begin() + r * n);
    }
    for (int64_t batch = 1; batch <= rows; ++batch) {
      const int64_t first = (batch * 7) % (rows - batch + 1);  // a varying offset
      const Tensor xb = f32_tensor(
          {batch, k}, std::vector<float>(x.begin() + first * k, x.begin() + (first + batch) * k));
      for (Backend* be : {be2.get(), be1.get()}) {
        Tensor out = Tensor::empty({batch, n}, DType::F32);
        be->linear(xb, wq, &bias, out);
        ASSERT_EQ(0, std::memcmp(out.ptr<float>(), alone.data() + first * n, batch * n * 4))
            << test::name(f) << " batch " << batch << " at row " << first << ", " << be->name();
      }
    }
  }
}

// linear_many (one quantization of x for all the targets) and linear_swiglu give the same
// bits as separate linears.
TEST(CpuLinearQuant, ManyAndSwigluEqualSeparateLinears) {
  std::mt19937 rng(51);
  auto be = make_cpu_backend(2);
  const int64_t k = 256, n1 = 48, n2 = 80;
  for (DType f : kFormats) {
    for (int64_t r : {3, 20}) {
      const Tensor w1 = quantize_matrix(random_weights(n1, k, rng), f);
      const Tensor w2 = quantize_matrix(random_weights(n2, k, rng), f);
      const Tensor b2 = f32_tensor({n2}, random_floats(n2, rng, -1.0f, 1.0f));
      const Tensor x = f32_tensor({r, k}, random_activations(r, k, rng));
      Tensor a1 = Tensor::empty({r, n1}, DType::F32), a2 = Tensor::empty({r, n2}, DType::F32);
      be->linear(x, w1, nullptr, a1);
      be->linear(x, w2, &b2, a2);
      Tensor m1 = Tensor::empty({r, n1}, DType::F32), m2 = Tensor::empty({r, n2}, DType::F32);
      const Backend::LinearTarget targets[] = {{&w1, nullptr, &m1}, {&w2, &b2, &m2}};
      be->linear_many(x, targets);
      EXPECT_EQ(0, std::memcmp(a1.data, m1.data, r * n1 * 4)) << test::name(f);
      EXPECT_EQ(0, std::memcmp(a2.data, m2.data, r * n2 * 4)) << test::name(f);

      const Tensor wu = quantize_matrix(random_weights(n1, k, rng), f);
      Tensor g = Tensor::empty({r, n1}, DType::F32), u = Tensor::empty({r, n1}, DType::F32);
      Tensor s = Tensor::empty({r, n1}, DType::F32), gs = Tensor::empty({r, n1}, DType::F32);
      Tensor us = Tensor::empty({r, n1}, DType::F32), ss = Tensor::empty({r, n1}, DType::F32);
      be->linear_swiglu(x, w1, nullptr, wu, nullptr, g, u, s);
      be->linear(x, w1, nullptr, gs);
      be->linear(x, wu, nullptr, us);
      be->swiglu(gs, us, ss);
      EXPECT_EQ(0, std::memcmp(s.data, ss.data, r * n1 * 4)) << test::name(f);
    }
  }
}

// A non-finite activation makes its row's outputs NaN (as an f32 product would), and only
// its row's.
TEST(CpuLinearQuant, NonFiniteActivationsGiveNaNRows) {
  std::mt19937 rng(71);
  auto be = make_cpu_backend(2);
  const int64_t n = 40;
  for (DType f : kFormats) {
    const int64_t k = cols_for(f, 128);
    const Tensor wq = quantize_matrix(random_weights(n, k, rng), f);
    for (int64_t r : {1, 5, 12}) {
      std::vector<float> x = random_activations(r, k, rng);
      x[(r - 1) * k + 70] =
          r % 2 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
      Tensor out = Tensor::empty({r, n}, DType::F32);
      be->linear(f32_tensor({r, k}, x), wq, nullptr, out);
      const std::vector<float> want = canonical_linear(x, r - 1, wq, nullptr);
      EXPECT_EQ(0, std::memcmp(out.ptr<float>(), want.data(), want.size() * 4)) << test::name(f);
      for (int64_t o = 0; o < n; ++o)
        EXPECT_TRUE(std::isnan(out.ptr<float>()[(r - 1) * n + o])) << test::name(f) << " " << o;
    }
  }
}

TEST(CpuLinearQuant, BackendAcceptsTheFormats) {
  auto be = make_cpu_backend(1);
  for (DType f : kFormats) {
    EXPECT_TRUE(be->capabilities().weight_dtypes.contains(f));
    EXPECT_EQ(be->linear_input_dtype(1, f), DType::F32);
    EXPECT_EQ(be->linear_input_dtype(64, f), DType::F32);
  }
  EXPECT_FALSE(be->capabilities().weight_dtypes.contains(DType::I32));
}

// The kernels the build runs: AVX-512 VNNI's GEMV / GEMM where it targets them (as the
// native builds on this project's CPUs do), so that the tests above check those paths.
TEST(CpuLinearQuant, RunsTheBuildsWidestKernel) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
  EXPECT_STREQ(cpu::quantized_linear_isa(), "avx512-vnni");
#elif defined(__AVX2__)
  EXPECT_STREQ(cpu::quantized_linear_isa(), "avx2");
#else
  EXPECT_STREQ(cpu::quantized_linear_isa(), "scalar");
#endif
}

TEST(CpuEmbeddingQuant, RowsAreTheDequantizedTable) {
  std::mt19937 rng(61);
  auto be = make_cpu_backend(2);
  const int64_t vocab = 300;
  for (DType f : kFormats) {
    const int64_t d = cols_for(f, 160);
    const Tensor table = quantize_matrix(random_weights(vocab, d, rng), f);
    const Tensor deq = dequantize_matrix(table);
    for (int t_dim : {1, 5, 300}) {
      BatchMeta batch;
      batch.num_tokens = t_dim;
      for (int t = 0; t < t_dim; ++t)
        batch.token_ids.push_back(static_cast<int32_t>((t * 37 + 11) % vocab));
      Tensor out = Tensor::empty({t_dim, d}, DType::F32);
      be->embedding(table, batch, out);
      for (int t = 0; t < t_dim; ++t)
        ASSERT_EQ(0, std::memcmp(out.ptr<float>() + t * d,
                                 deq.ptr<float>() + batch.token_ids[t] * d, d * 4))
            << test::name(f) << " token " << t;
    }
  }
}

}  // namespace
}  // namespace attnres
