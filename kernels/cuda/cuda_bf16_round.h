// f32 -> bf16 rounding for the device, bit for bit as f32_to_bf16 (engine/core/dtype.h): round
// to nearest even; a NaN keeps its sign and top payload bits and is made quiet (0x40), where
// the hardware conversion (__float2bfloat16_rn) would return one canonical NaN. How an entry
// enters a bf16 depth bank (CudaBackend::copy), so that the CUDA bank holds the CPU's bits.
// Compiles for the host too (g++ or nvcc), so a host test checks it against f32_to_bf16.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define ATTNRES_HOST_DEVICE __host__ __device__
#else
#define ATTNRES_HOST_DEVICE
#endif

namespace attnres::cuda {

ATTNRES_HOST_DEVICE inline uint16_t round_to_bf16_bits(float f) {
#ifdef __CUDA_ARCH__
  const uint32_t bits = __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
#endif
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace attnres::cuda

#undef ATTNRES_HOST_DEVICE
