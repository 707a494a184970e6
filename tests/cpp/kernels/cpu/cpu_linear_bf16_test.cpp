// bf16 linear inputs (CpuBackend::set_bf16_linear_inputs, cpu_linear_dot.h: Bf16Dot): with bf16
// weights, every output element must be, bit for bit, the scalar definition
// bf16_dot_reference over the input row rounded to bf16: lane l of each 32-element step adds the
// odd element's product, then the even one's (one rounding each), the 16 lanes go through
// hsum's tree, the elements past the last whole step are added in order, the bias last. Bit
// equality with one per-row definition is batch invariance (the GEMV up to 8 rows, the packed
// GEMM above, any thread count, row chunks and k blocks) and prefill-equals-decode at once.
// The definition itself is checked against a double-precision dot of the same rounded values.
// Where the build has no AVX512_BF16 the kernels do not exist: the tests skip, except the one
// that the setting is then refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/bf16_dot_rate.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_linear_dot.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

std::vector<uint16_t> rounded_row(const Tensor& x, int64_t r) {
  const int64_t k = x.dim(1);
  std::vector<uint16_t> row(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) row[i] = f32_to_bf16(x.ptr<float>()[r * k + i]);
  return row;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Runs an R x K x N linear with bf16 inputs on `threads` threads and compares every element's
// bits with the definition. x holds values bf16 cannot represent, so the rounding counts.
void expect_definition(int threads, int64_t r_dim, int64_t k_dim, int64_t n_dim, bool with_bias,
                       uint32_t seed) {
  CpuBackend be(threads);
  be.set_bf16_linear_inputs(true);
  std::mt19937 rng(seed);
  const Tensor x = random_tensor({r_dim, k_dim}, DType::F32, rng, -2.0f, 2.0f);
  const Tensor w = random_tensor({n_dim, k_dim}, DType::BF16, rng);
  const Tensor bias = random_tensor({n_dim}, DType::F32, rng);
  Tensor out = be.alloc({r_dim, n_dim}, DType::F32);
  be.linear(x, w, with_bias ? &bias : nullptr, out);
  const auto* wp = w.ptr<uint16_t>();
  for (int64_t r = 0; r < r_dim; ++r) {
    const std::vector<uint16_t> xr = rounded_row(x, r);
    for (int64_t o = 0; o < n_dim; ++o) {
      const float want = cpu::bf16_dot_reference(xr.data(), wp + o * k_dim, k_dim,
                                                 with_bias ? bias.ptr<float>() + o : nullptr);
      const float got = out.ptr<float>()[r * n_dim + o];
      ASSERT_EQ(bits(got), bits(want))
          << "R=" << r_dim << " K=" << k_dim << " N=" << n_dim << " threads=" << threads
          << (with_bias ? " bias" : "") << ": row " << r << " output " << o << " got " << got
          << " want " << want;
    }
  }
}

TEST(Bf16LinearInputs, EveryElementIsTheScalarDefinitionBitForBit) {
  if (!CpuBackend::bf16_linear_inputs_supported()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  // K: whole steps (32, 512), a partial step only (1, 20), a tail after whole steps (40, 100,
  // 1100), two k blocks of the GEMM with a tail (4200: its accumulators spill between blocks).
  // N: below, at and past the GEMM's 8-output tile. R: every GEMV row count and GEMM row
  // counts that leave partial 3-row blocks.
  const int64_t ks[] = {1, 20, 32, 40, 100, 512, 1100, 4200};
  const int64_t ns[] = {1, 5, 6, 8, 13};
  const int64_t rs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 37};
  uint32_t seed = 1;
  for (int64_t k : ks)
    for (int64_t n : ns)
      for (int64_t r : rs) {
        expect_definition(2, r, k, n, seed % 2 == 0, seed);
        ++seed;
      }
}

TEST(Bf16LinearInputs, ThreadCountsRowChunksAndWideOutputs) {
  if (!CpuBackend::bf16_linear_inputs_supported()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  expect_definition(1, 130, 4500, 97, true, 101);  // one thread, 2 k blocks, tails everywhere
  expect_definition(3, 64, 512, 1536, false, 102);  // three threads over many tiles
  // Row chunks (half the L2: at most 1 MiB on the machines here) of 2200-byte rows hold at most
  // 476 rows: 600 rows take two chunks or more.
  expect_definition(2, 600, 1100, 13, true, 103);
  expect_definition(2, 1, 151, 3000, true, 104);  // a GEMV over many output chunks
}

// The definition is the dot product it claims to be: against double precision over the same
// rounded values, within f32 summation error (relative to the sum of |terms|).
TEST(Bf16LinearInputs, TheDefinitionIsADotProductOfTheRoundedValues) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (int64_t k : {1, 31, 32, 33, 64, 1000}) {
    std::vector<uint16_t> x(k), w(k);
    for (int64_t i = 0; i < k; ++i) x[i] = f32_to_bf16(dist(rng)), w[i] = f32_to_bf16(dist(rng));
    const float bias = 0.25f;
    double want = bias, scale = std::fabs(bias);
    for (int64_t i = 0; i < k; ++i) {
      const double term = static_cast<double>(bf16_to_f32(x[i])) * bf16_to_f32(w[i]);
      want += term;
      scale += std::fabs(term);
    }
    EXPECT_NEAR(cpu::bf16_dot_reference(x.data(), w.data(), k, &bias), want, 1e-6 * scale)
        << "K=" << k;
  }
}

// Off by default (f32 inputs: the exact path the rest of the suite checks), and on only for bf16
// weights: f32 and f16 weights keep f32 inputs bit for bit.
TEST(Bf16LinearInputs, OffByDefaultAndOnlyForBf16Weights) {
  CpuBackend off(2);
  EXPECT_FALSE(off.bf16_linear_inputs());
  if (!CpuBackend::bf16_linear_inputs_supported()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  CpuBackend on(2);
  on.set_bf16_linear_inputs(true);
  EXPECT_TRUE(on.bf16_linear_inputs());
  std::mt19937 rng(9);
  const Tensor x = random_tensor({20, 96}, DType::F32, rng, -2.0f, 2.0f);
  for (DType wt : {DType::F32, DType::BF16, DType::F16}) {
    const Tensor w = random_tensor({7, 96}, wt, rng);
    Tensor a = off.alloc({20, 7}, DType::F32), b = on.alloc({20, 7}, DType::F32);
    off.linear(x, w, nullptr, a);
    on.linear(x, w, nullptr, b);
    const bool same = std::memcmp(a.data, b.data, a.nbytes()) == 0;
    EXPECT_EQ(same, wt != DType::BF16) << name(wt);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// linear_many and linear_swiglu round x once for all their weights: every output is what one
// linear per weight gives, bit for bit, at decode and prefill row counts, with biases stored
// as f32 and as bf16 and none; a weight that is not bf16 among them takes the per-weight path.
TEST(Bf16LinearInputs, ManyAndSwigluRoundOnceWithTheSameBits) {
  if (!CpuBackend::bf16_linear_inputs_supported()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  CpuBackend be(2);
  be.set_bf16_linear_inputs(true);
  std::mt19937 rng(17);
  const int64_t k = 200;
  for (int64_t r : {1, 7, 64, 130}) {
    const Tensor x = random_tensor({r, k}, DType::F32, rng, -2.0f, 2.0f);
    const Tensor wq = random_tensor({48, k}, DType::BF16, rng);
    const Tensor wk = random_tensor({16, k}, DType::BF16, rng);
    const Tensor wv = random_tensor({16, k}, DType::BF16, rng);
    const Tensor bq = random_tensor({48}, DType::F32, rng);
    const Tensor bv = random_tensor({16}, DType::BF16, rng);
    Tensor q = be.alloc({r, 48}, DType::F32), kk = be.alloc({r, 16}, DType::F32),
           v = be.alloc({r, 16}, DType::F32);
    const Backend::LinearTarget qkv[3] = {{&wq, &bq, &q}, {&wk, nullptr, &kk}, {&wv, &bv, &v}};
    be.linear_many(x, qkv);
    Tensor q1 = be.alloc({r, 48}, DType::F32), k1 = be.alloc({r, 16}, DType::F32),
           v1 = be.alloc({r, 16}, DType::F32);
    be.linear(x, wq, &bq, q1);
    be.linear(x, wk, nullptr, k1);
    be.linear(x, wv, &bv, v1);
    EXPECT_TRUE(same_bits(q, q1) && same_bits(kk, k1) && same_bits(v, v1)) << "R=" << r;

    Tensor gate = be.alloc({r, 16}, DType::F32), up = be.alloc({r, 16}, DType::F32),
           out = be.alloc({r, 16}, DType::F32);
    be.linear_swiglu(x, wk, nullptr, wv, &bv, gate, up, out);
    Tensor gate1 = be.alloc({r, 16}, DType::F32), up1 = be.alloc({r, 16}, DType::F32),
           out1 = be.alloc({r, 16}, DType::F32);
    be.linear(x, wk, nullptr, gate1);
    be.linear(x, wv, &bv, up1);
    be.swiglu(gate1, up1, out1);
    EXPECT_TRUE(same_bits(out, out1) && same_bits(gate, gate1)) << "R=" << r;

    const Tensor wf = random_tensor({16, k}, DType::F32, rng);  // mixed dtypes: per weight
    Tensor a = be.alloc({r, 48}, DType::F32), f = be.alloc({r, 16}, DType::F32),
           f1 = be.alloc({r, 16}, DType::F32);
    const Backend::LinearTarget mixed[2] = {{&wq, &bq, &a}, {&wf, nullptr, &f}};
    be.linear_many(x, mixed);
    be.linear(x, wf, nullptr, f1);
    EXPECT_TRUE(same_bits(a, q1) && same_bits(f, f1)) << "R=" << r;
  }
  // Operands are checked per weight: a weight of another K is refused.
  const Tensor x = random_tensor({3, k}, DType::F32, rng);
  const Tensor w = random_tensor({8, k}, DType::BF16, rng);
  const Tensor w_short = random_tensor({8, k - 1}, DType::BF16, rng);
  Tensor o1 = be.alloc({3, 8}, DType::F32), o2 = be.alloc({3, 8}, DType::F32);
  const Backend::LinearTarget bad[2] = {{&w, nullptr, &o1}, {&w_short, nullptr, &o2}};
  EXPECT_THROW(be.linear_many(x, bad), std::logic_error);
}

TEST(Bf16LinearInputs, RefusedWhereTheBuildHasNoBf16Dot) {
  if (CpuBackend::bf16_linear_inputs_supported()) GTEST_SKIP() << "this build has AVX512_BF16";
  CpuBackend be(1);
  EXPECT_THROW(be.set_bf16_linear_inputs(true), std::logic_error);
  EXPECT_FALSE(CpuBackend::bf16_linear_inputs_faster());
  EXPECT_EQ(cpu::bf16_dot_speedup(), 0.0);
}

// The measured rate: a finite ratio in a range real cores give (Zen 4: 2, the Xeon VM: 0.5),
// the same on every call (measured once), and what bf16_linear_inputs_faster() decides on.
TEST(Bf16LinearInputs, TheDotProductRateIsMeasuredOnce) {
  if (!CpuBackend::bf16_linear_inputs_supported()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  const double speedup = cpu::bf16_dot_speedup();
  EXPECT_GT(speedup, 0.1);
  EXPECT_LT(speedup, 10.0);
  EXPECT_EQ(cpu::bf16_dot_speedup(), speedup);
  EXPECT_EQ(CpuBackend::bf16_linear_inputs_faster(), speedup >= 1.5);
}

}  // namespace
}  // namespace attnres::test
