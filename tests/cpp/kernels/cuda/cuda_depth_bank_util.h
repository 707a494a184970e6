// The depth bank in either dtype for the CUDA depth tests: the same f32 host values stored as
// an F32 bank, or rounded into a BF16 bank by each backend's own copy() (how the forward fills
// it). The CPU backend reads a bf16 bank exactly as an f32 bank of the rounded values
// (tests/cpp/kernels/cpu/cpu_depth_bank_bf16_test.cpp), so the CUDA ops compare against the CPU
// op on the CPU's bf16 bank with the f32 tolerances.
#pragma once

#include <cstring>
#include <string>

#include "engine/core/backend.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {

inline constexpr DType kBankDtypes[] = {DType::F32, DType::BF16};

// host_f32 (a host tensor) as a bank of `dtype` on `be`.
inline Tensor bank_on(Backend& be, const Tensor& host_f32, DType dtype) {
  const Tensor f32 = be.upload(host_f32);
  if (dtype == DType::F32) return f32;
  Tensor bank = be.alloc(f32.shape, dtype);
  be.copy(f32, bank);
  return bank;
}

// The two backends' banks of the same values hold the same bits (bf16: the same rounding).
inline ::testing::AssertionResult same_bank_bits(Backend& cpu, const Tensor& cpu_bank, Backend& gpu,
                                                 const Tensor& gpu_bank) {
  const Tensor a = to_host(cpu, cpu_bank), b = to_host(gpu, gpu_bank);
  if (a.dtype != b.dtype || a.nbytes() != b.nbytes())
    return ::testing::AssertionFailure() << "dtype or size differs";
  if (std::memcmp(a.data, b.data, a.nbytes()) != 0)
    return ::testing::AssertionFailure() << std::string(dtype_name(a.dtype)) << " banks differ";
  return ::testing::AssertionSuccess();
}

}  // namespace attnres::test
