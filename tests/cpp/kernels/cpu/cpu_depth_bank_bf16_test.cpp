// The bf16 depth bank (--depth-bank-dtype bfloat16) on the CPU: copy() rounds an f32 entry
// exactly like f32_to_bf16 (the vector path included, special values too), and every depth op
// reading a bf16 bank (Phase 1 with 1 to 10 queries, Phase 2's newer entries, the
// introspection weights) gives bit for bit what it gives on an f32 bank holding the same
// rounded values: the rows are widened exactly in registers, and nothing else changes. The
// f32 ops themselves are checked against double-precision references in the other depth tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_simd.h"
#include "tests/cpp/kernels/cpu/depth_modes_reference.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Values where the rounding has something to decide: ties to even both ways, the largest
// finite float (rounds to infinity), denormals, infinities, NaNs with payloads, signed zeros;
// then random bit patterns.
std::vector<float> rounding_cases(size_t random_count) {
  std::vector<float> v;
  for (uint32_t bits :
       {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0xbf818000u, 0x7f7fffffu, 0xff7fffffu,
        0x00000001u, 0x00008000u, 0x00018000u, 0x807fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
        0x7f800001u, 0xffa00001u, 0x00000000u, 0x80000000u}) {
    v.push_back(from_bits(bits));
  }
  std::mt19937 rng(7);
  for (size_t i = 0; i < random_count; ++i) v.push_back(from_bits(static_cast<uint32_t>(rng())));
  return v;
}

TEST(CpuDepthBankBf16, StoreRowRoundsLikeTheScalarConversion) {
  // 18 special values + 1000 random: not a multiple of any vector width, so the tail runs too.
  const std::vector<float> x = rounding_cases(1000);
  std::vector<uint16_t> got(x.size());
  cpu::store_row_bf16(got.data(), x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], 4);
    ASSERT_EQ(got[i], f32_to_bf16(x[i])) << "element " << i << " bits 0x" << std::hex << bits;
  }
}

TEST(CpuDepthBankBf16, CopyRoundsF32IntoBf16AndRefusesOtherConversions) {
  auto be = make_cpu_backend(2);
  const std::vector<float> x = rounding_cases(70000);  // more than one parallel chunk
  const int64_t n = static_cast<int64_t>(x.size());
  Tensor src = be->alloc({n}, DType::F32);
  std::memcpy(src.data, x.data(), x.size() * 4);
  Tensor dst = be->alloc({n}, DType::BF16);
  be->copy(src, dst);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(dst.ptr<uint16_t>()[i], f32_to_bf16(x[i])) << "element " << i;
  }
  Tensor back = be->alloc({n}, DType::F32);
  EXPECT_THROW(be->copy(dst, back), std::logic_error);  // bf16 -> f32 is not a bank write
  Tensor half = be->alloc({n}, DType::F16);
  EXPECT_THROW(be->copy(src, half), std::logic_error);
  EXPECT_TRUE(be->capabilities().depth_bank_dtypes.contains(DType::BF16));
  EXPECT_FALSE(be->capabilities().depth_bank_dtypes.contains(DType::F16));
}

// add_inplace_push (the residual add that also writes the pushed bank entry) in one pass
// gives the bits of its default, add_inplace then copy: the sum, and the entry rounded from
// the sum (the cumulative modes) or from the addend (the delta modes). Both sizes have a
// tail; 70000 spans several parallel chunks.
TEST(CpuDepthBankBf16, AddInplacePushIsTheAddThenTheCopy) {
  auto be = make_cpu_backend(2);
  for (const int64_t n : {int64_t{37}, int64_t{70000}}) {
    const std::vector<float> x0 = rounding_cases(static_cast<size_t>(n) - 18);
    std::vector<float> y0(x0.size());
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& v : y0) v = normal(rng);
    for (const auto pushed : {Backend::PushedRow::Sum, Backend::PushedRow::Addend}) {
      SCOPED_TRACE("n " + std::to_string(n) +
                   (pushed == Backend::PushedRow::Sum ? " sum" : " addend"));
      Tensor y = be->alloc({n}, DType::F32);
      std::memcpy(y.data, y0.data(), y0.size() * 4);
      Tensor fused_x = be->alloc({n}, DType::F32), plain_x = be->alloc({n}, DType::F32);
      std::memcpy(fused_x.data, x0.data(), x0.size() * 4);
      std::memcpy(plain_x.data, x0.data(), x0.size() * 4);
      Tensor fused_entry = be->alloc({n}, DType::BF16), plain_entry = be->alloc({n}, DType::BF16);
      be->add_inplace_push(fused_x, y, fused_entry, pushed);
      be->add_inplace(plain_x, y);  // the Backend default: add_inplace, then copy
      be->copy(pushed == Backend::PushedRow::Sum ? plain_x : y, plain_entry);
      ASSERT_EQ(std::memcmp(fused_x.data, plain_x.data, fused_x.nbytes()), 0);
      ASSERT_EQ(std::memcmp(fused_entry.data, plain_entry.data, fused_entry.nbytes()), 0);
      // And against the scalar definition, so that the default itself is checked too.
      for (int64_t i = 0; i < n; ++i) {
        const float sum = x0[i] + y0[i];
        ASSERT_EQ(std::memcmp(fused_x.ptr<float>() + i, &sum, 4), 0) << "element " << i;
        const float pushed_value = pushed == Backend::PushedRow::Sum ? sum : y0[i];
        ASSERT_EQ(fused_entry.ptr<uint16_t>()[i], f32_to_bf16(pushed_value)) << "element " << i;
      }
    }
  }
  // An f32 entry is a plain copy; a mismatched entry is refused.
  Tensor x = be->alloc({3}, DType::F32), y = be->alloc({3}, DType::F32);
  for (int i = 0; i < 3; ++i) {
    x.ptr<float>()[i] = 1.0f + static_cast<float>(i);
    y.ptr<float>()[i] = 0.5f;
  }
  Tensor entry = be->alloc({3}, DType::F32);
  be->add_inplace_push(x, y, entry, Backend::PushedRow::Addend);
  EXPECT_EQ(x.ptr<float>()[2], 3.5f);
  EXPECT_EQ(entry.ptr<float>()[2], 0.5f);
  Tensor wrong = be->alloc({4}, DType::BF16);
  EXPECT_THROW(be->add_inplace_push(x, y, wrong, Backend::PushedRow::Sum), std::logic_error);
}

// The bank rounded to bf16, and an f32 bank holding exactly those rounded values.
struct TwoBanks {
  Tensor bf16, f32;
  TwoBanks(Backend& be, const Tensor& bank) {
    bf16 = be.alloc(bank.shape, DType::BF16);
    be.copy(bank, bf16);
    f32 = be.alloc(bank.shape, DType::F32);
    for (int64_t i = 0; i < bank.numel(); ++i) f32.ptr<float>()[i] = element_as_float(bf16, i);
  }
};

// NaN-aware bit equality of two f32 tensors.
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel() || a.dtype != DType::F32 || b.dtype != DType::F32)
    return ::testing::AssertionFailure() << "shape or dtype differs";
  if (a.numel() && std::memcmp(a.data, b.data, a.nbytes()) != 0) {
    for (int64_t i = 0; i < a.numel(); ++i) {
      if (std::memcmp(a.ptr<float>() + i, b.ptr<float>() + i, 4) != 0) {
        return ::testing::AssertionFailure()
               << "element " << i << ": " << a.ptr<float>()[i] << " vs " << b.ptr<float>()[i];
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CpuDepthBankBf16, PhaseOneReadsTheWidenedValues) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(21);
  const int64_t t_dim = 5, d = 45;  // d: vectors and a scalar tail
  const int n = 9;
  for (int64_t s_dim : {1, 3, 8, 10}) {  // 10: a group of 8 and one of 2
    for (bool gated : {false, true}) {
      const Tensor bank = random_tensor({n, t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
      const Tensor queries = random_tensor({s_dim, d}, DType::F32, rng, -0.5f, 0.5f);
      const Tensor gate = random_tensor({t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
      const TwoBanks banks(*be, bank);
      Tensor m[2], s[2], o[2];
      for (int k = 0; k < 2; ++k) {
        m[k] = be->alloc({s_dim, t_dim}, DType::F32);
        s[k] = be->alloc({s_dim, t_dim}, DType::F32);
        o[k] = be->alloc({s_dim, t_dim, d}, DType::F32);
        be->depth_phase1(queries, k == 0 ? banks.bf16 : banks.f32, n, 1e-6f, m[k], s[k], o[k],
                         gated ? &gate : nullptr);
      }
      const std::string what = "S " + std::to_string(s_dim) + (gated ? " gated" : "");
      EXPECT_TRUE(same_bits(m[0], m[1])) << what;
      EXPECT_TRUE(same_bits(s[0], s[1])) << what;
      EXPECT_TRUE(same_bits(o[0], o[1])) << what;
    }
  }
}

// Phase 1 over the first n - newer entries, Phase 2 merging the rest, and the introspection
// weights, for every switch combination: a bf16 bank against its widened f32 twin.
TEST(CpuDepthBankBf16, PhaseTwoAndWeightsReadTheWidenedValues) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(22);
  const int64_t t_dim = 4, d = 37;
  const float eps = 1e-6f, norm_eps = 1e-5f;
  std::vector<std::pair<int, ModeCase>> cases;
  for (const ModeCase& c : all_mode_cases()) cases.push_back({3, c});
  for (int newer = 1; newer <= Backend::kMaxNewerSources; ++newer)  // each its own kernel
    for (const ModeCase& c : newer_mode_cases(newer)) cases.push_back({newer + 1 + newer % 3, c});
  for (const auto& [n, c] : cases) {
    const ModeInputs in = ModeInputs::random(n, t_dim, d, rng);
    const TwoBanks banks(*be, in.bank);
    Tensor out[2], weights[2];
    for (int k = 0; k < 2; ++k) {
      const Tensor& bank = k == 0 ? banks.bf16 : banks.f32;
      Tensor m = be->alloc({1, t_dim}, DType::F32), s = be->alloc({1, t_dim}, DType::F32);
      Tensor o = be->alloc({1, t_dim, d}, DType::F32);
      be->depth_phase1(in.query.reshape({1, d}), bank, n - c.newer, eps, m, s, o,
                       c.pre_gated ? &in.gate_logits : nullptr);
      const Tensor newer = bank.rows(n - c.newer, n);
      Tensor ml = m.row(0), sl = s.row(0), ol = o.row(0);
      out[k] = be->alloc({t_dim, d}, DType::F32);
      be->depth_phase2_prenorm(mode_args(c, in, ml, sl, ol, eps, &newer), in.partial, in.gain,
                               norm_eps, out[k]);

      Backend::DepthSourceSwitches sw;
      sw.partial_is_source = c.partial_is_source;
      sw.has_null = c.null_source;
      sw.null_logit = in.null_logit;
      sw.source_gate_logits = c.pre_gated ? &in.gate_logits : nullptr;
      weights[k] = be->alloc({t_dim, sw.width(n)}, DType::F32);
      be->depth_weights(in.query, bank, n, in.partial, in.bias, eps, weights[k], sw);
    }
    EXPECT_TRUE(same_bits(out[0], out[1])) << c.describe() << " n=" << n;
    EXPECT_TRUE(same_bits(weights[0], weights[1])) << c.describe() << " n=" << n;
  }
}

// The bf16 bank is really read as bf16: the same ops on the unrounded f32 bank differ.
TEST(CpuDepthBankBf16, TheRoundingShows) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(23);
  const int64_t t_dim = 3, d = 32;
  const Tensor bank = random_tensor({4, t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
  const Tensor queries = random_tensor({2, d}, DType::F32, rng, -0.5f, 0.5f);
  const TwoBanks banks(*be, bank);
  Tensor m[2], s[2], o[2];
  for (int k = 0; k < 2; ++k) {
    m[k] = be->alloc({2, t_dim}, DType::F32);
    s[k] = be->alloc({2, t_dim}, DType::F32);
    o[k] = be->alloc({2, t_dim, d}, DType::F32);
    be->depth_phase1(queries, k == 0 ? banks.bf16 : bank, 4, 1e-6f, m[k], s[k], o[k]);
  }
  EXPECT_FALSE(same_bits(o[0], o[1]));
  EXPECT_TRUE(all_close(o[0], values(o[1]), 1e-2, 1e-2));
}

// Phase 1 computes the logits of two rows at a time (dots_and_squares<2>) and of an odd last
// row alone; both give the same bits: with n = 2 (one pair), m is the max of the two logits
// each n = 1 Phase 1 (the single-row path) gives as its m. f32 and bf16 banks, gated or not,
// d with a scalar tail.
TEST(CpuDepthBankBf16, PairedRowsGiveTheSingleRowLogits) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(25);
  const int64_t t_dim = 3, d = 45, s_dim = 3;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (bool gated : {false, true}) {
      const Tensor f32 = random_tensor({2, t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
      Tensor bank = be->alloc(f32.shape, dtype);
      be->copy(f32, bank);
      const Tensor queries = random_tensor({s_dim, d}, DType::F32, rng, -0.5f, 0.5f);
      const Tensor gate = random_tensor({t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
      Tensor m[3], s[3], o[3];
      for (int k = 0; k < 3; ++k) {
        m[k] = be->alloc({s_dim, t_dim}, DType::F32);
        s[k] = be->alloc({s_dim, t_dim}, DType::F32);
        o[k] = be->alloc({s_dim, t_dim, d}, DType::F32);
      }
      const Tensor* g = gated ? &gate : nullptr;
      be->depth_phase1(queries, bank, 2, 1e-6f, m[0], s[0], o[0], g);  // the pair
      be->depth_phase1(queries, bank.rows(0, 1), 1, 1e-6f, m[1], s[1], o[1], g);
      be->depth_phase1(queries, bank.rows(1, 2), 1, 1e-6f, m[2], s[2], o[2], g);
      for (int64_t i = 0; i < s_dim * t_dim; ++i) {
        const float single = std::max(m[1].ptr<float>()[i], m[2].ptr<float>()[i]);
        EXPECT_EQ(m[0].ptr<float>()[i], single)
            << name(dtype) << (gated ? " gated" : "") << " element " << i;
      }
    }
  }
}

TEST(CpuDepthBankBf16, RejectsABankOfAnotherDtype) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(24);
  const Tensor bank = random_tensor({2, 2, 16}, DType::F16, rng);
  const Tensor queries = random_tensor({1, 16}, DType::F32, rng);
  Tensor m = be->alloc({1, 2}, DType::F32), s = be->alloc({1, 2}, DType::F32);
  Tensor o = be->alloc({1, 2, 16}, DType::F32);
  EXPECT_THROW(be->depth_phase1(queries, bank, 2, 1e-6f, m, s, o), std::logic_error);
}

}  // namespace
}  // namespace attnres::test
