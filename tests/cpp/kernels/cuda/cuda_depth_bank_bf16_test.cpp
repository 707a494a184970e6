// The bf16 depth bank on CUDA (--depth-bank-dtype bfloat16, the `auto` choice for a bf16
// checkpoint): the rounding an entry gets on its way in (copy F32 -> BF16) is bit for bit
// f32_to_bf16's, special values included; the backend and its registration both say BF16; and
// the depth ops refuse a bank of any other dtype by name. The depth ops' results on a bf16 bank
// are compared with the CPU backend's in cuda_depth_modes_test, cuda_attention_depth_test and
// cuda_depth_weights_test; the whole forward in cuda_model_test.
// RoundingMatchesF32ToBf16 runs without a GPU (the device function compiled for the host); the
// rest skip there.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/backend_registry.h"
#include "kernels/cuda/cuda_bf16_round.h"
#include "kernels/cuda/cuda_registration.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

// Values where the rounding has something to decide: ties to even both ways (0x8000 low
// halves over odd and even kept halves), just below and above a tie, the largest finite float
// (rounds to infinity), denormals (the smallest, a tie among them, the largest), infinities,
// quiet and signalling NaNs with payloads of either sign, signed zeros; then random patterns.
std::vector<float> rounding_cases(size_t random_count) {
  std::vector<float> v;
  for (uint32_t bits :
       {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0xbf818000u, 0xbf808000u, 0x7f7fffffu,
        0xff7fffffu, 0x7f7f8000u, 0x00000001u, 0x00008000u, 0x00018000u, 0x007fffffu, 0x807fffffu,
        0x80008000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffa00001u,
        0x7fbfffffu, 0x7f80ffffu, 0x00000000u, 0x80000000u}) {
    v.push_back(from_bits(bits));
  }
  std::mt19937 rng(7);
  for (size_t i = 0; i < random_count; ++i) v.push_back(from_bits(static_cast<uint32_t>(rng())));
  return v;
}

// The device function's logic (the same source compiled for the host) against f32_to_bf16 on
// every pattern of the upper 16 bits (every sign, exponent and kept mantissa) with the lower
// halves where rounding decides (0, 1, just below / at / above the tie, all ones), plus the
// special and random values.
TEST(CudaDepthBankBf16, RoundingMatchesF32ToBf16) {
  for (uint32_t high = 0; high <= 0xffffu; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float f = from_bits(high << 16 | low);
      ASSERT_EQ(cuda::round_to_bf16_bits(f), f32_to_bf16(f))
          << "bits 0x" << std::hex << (high << 16 | low);
    }
  }
  for (float f : rounding_cases(100000))
    ASSERT_EQ(cuda::round_to_bf16_bits(f), f32_to_bf16(f)) << "bits 0x" << std::hex << bits_of(f);
}

TEST(CudaDepthBankBf16, BackendAndRegistrationTakeABf16Bank) {
  // The registration's trait needs no GPU; --depth-bank-dtype auto asks it before any backend
  // exists (engine/sched/model_execution.cpp; EngineArgs.CudaDepthBank... checks the choice).
  register_cuda_backend();
  const BackendTraits traits = backend_traits("cuda");
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::I32}) {
    const bool want = dtype == DType::F32 || dtype == DType::BF16;
    EXPECT_EQ(traits.capabilities.depth_bank_dtypes.contains(dtype), want) << dtype_name(dtype);
  }
  SKIP_WITHOUT_CUDA();
  CudaBackend be;
  EXPECT_EQ(&be.capabilities(), &cuda_backend_capabilities());
  EXPECT_TRUE(be.capabilities().depth_bank_dtypes.contains(DType::BF16));
  EXPECT_FALSE(be.capabilities().depth_bank_dtypes.contains(DType::F16));
}

// copy F32 -> BF16 on the GPU gives f32_to_bf16's bits: vector path (aligned, 4 elements at a
// time) plus a scalar tail, and an unaligned view (scalar throughout). More than one grid's
// worth of elements is not needed: the kernels are grid-stride loops.
TEST(CudaDepthBankBf16, CopyRoundsLikeF32ToBf16) {
  SKIP_WITHOUT_CUDA();
  CudaBackend be;
  const std::vector<float> x = rounding_cases(70001);  // 25 + 70001: not a multiple of 4
  const int64_t n = static_cast<int64_t>(x.size());
  Tensor host = Tensor::empty({n}, DType::F32);
  std::memcpy(host.data, x.data(), x.size() * 4);
  const Tensor src = be.upload(host);
  for (int64_t offset : {0, 1, 3}) {  // 1, 3: source and destination off 16 / 8 bytes
    SCOPED_TRACE("offset " + std::to_string(offset));
    const Tensor from = src.rows(offset, n);
    Tensor to_all = be.alloc({n}, DType::BF16);
    Tensor to = to_all.rows(offset, n);
    be.copy(from, to);
    const Tensor got = to_host(be, to);
    for (int64_t i = 0; i < to.numel(); ++i) {
      ASSERT_EQ(got.ptr<uint16_t>()[i], f32_to_bf16(x[offset + i]))
          << "element " << i << " bits 0x" << std::hex << bits_of(x[offset + i]);
    }
  }
  // What the bank needs from copy and nothing more: bf16 -> f32 and f32 -> f16 are refused.
  Tensor bf16 = be.alloc({n}, DType::BF16), f32 = be.alloc({n}, DType::F32);
  EXPECT_THROW(be.copy(bf16, f32), std::logic_error);
  Tensor f16 = be.alloc({n}, DType::F16);
  EXPECT_THROW(be.copy(src, f16), std::logic_error);
  Tensor other_shape = be.alloc({n - 1}, DType::BF16);
  EXPECT_THROW(be.copy(src, other_shape), std::logic_error);
  // Same-dtype copies stay plain copies: a bf16 tensor copies bit for bit.
  Tensor rounded = be.alloc({n}, DType::BF16), again = be.alloc({n}, DType::BF16);
  be.copy(src, rounded);
  be.copy(rounded, again);
  const Tensor want = to_host(be, rounded), got = to_host(be, again);
  EXPECT_EQ(std::memcmp(want.data, got.data, want.nbytes()), 0);
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A bank of any dtype but F32 / BF16 is refused before a launch, naming the dtype.
TEST(CudaDepthBankBf16, DepthOpsRefuseAnF16Bank) {
  SKIP_WITHOUT_CUDA();
  CudaBackend be;
  std::mt19937 rng(31);
  const int64_t T = 2, d = 16;
  const Tensor bank = be.upload(random_host({3, T, d}, DType::F16, rng));
  const Tensor queries = be.upload(random_host({1, d}, DType::F32, rng));
  const Tensor query = be.upload(random_host({d}, DType::F32, rng));
  const Tensor partial = be.upload(random_host({T, d}, DType::F32, rng));
  const Tensor gain = be.upload(random_host({d}, DType::BF16, rng));
  Tensor m = be.alloc({1, T}, DType::F32), s = be.alloc({1, T}, DType::F32);
  Tensor o = be.alloc({1, T, d}, DType::F32);
  const std::string phase1 = message_of([&] { be.depth_phase1(queries, bank, 2, 1e-6f, m, s, o); });
  EXPECT_NE(phase1.find("depth_phase1 bank is F16"), std::string::npos) << phase1;

  Tensor ml = m.row(0), sl = s.row(0), ol = o.row(0);
  const Tensor newer = bank.rows(2, 3);
  Backend::DepthMixArgs mix;
  mix.m = &ml, mix.s = &sl, mix.o = &ol, mix.query = &query, mix.newer = &newer;
  Tensor out = be.alloc({T, d}, DType::F32);
  const std::string phase2 =
      message_of([&] { be.depth_phase2_prenorm(mix, partial, gain, 1e-6f, out); });
  EXPECT_NE(phase2.find("depth_phase2 newer entries is F16"), std::string::npos) << phase2;

  Tensor weights = be.alloc({T, 3}, DType::F32);
  const std::string introspection =
      message_of([&] { be.depth_weights(query, bank, 2, partial, 0.0f, 1e-6f, weights); });
  EXPECT_NE(introspection.find("depth_weights bank is F16"), std::string::npos) << introspection;
}

}  // namespace
}  // namespace attnres::test
