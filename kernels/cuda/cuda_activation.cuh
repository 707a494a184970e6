// Stores of a linear's input rows by the kernels that produce them (Backend::
// linear_input_dtype): f32 as computed, or bf16, rounded to nearest even by round_to_bf16_bits
// (cuda_bf16_round.h) from the same f32 value. So a GEMM reads the bits it read when linear
// converted its f32 input itself (launch_convert_from_f32 rounds with the same function), and
// the [T, K] conversion pass before each prefill GEMM goes away.
// O, the stored type: float, or uint16_t holding the bf16 bits.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_bf16_round.h"
#include "kernels/cuda/cuda_common.cuh"

namespace attnres::cuda {

__device__ __forceinline__ void store_activation(float* dst, float x) { *dst = x; }
__device__ __forceinline__ void store_activation(uint16_t* dst, float x) {
  *dst = round_to_bf16_bits(x);
}

// Two consecutive elements; dst aligned to the pair (8 bytes for f32, 4 for bf16).
__device__ __forceinline__ void store_activation_pair(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}
__device__ __forceinline__ void store_activation_pair(uint16_t* dst, float a, float b) {
  // Little-endian: the lower-addressed element is the low half of the word.
  *reinterpret_cast<uint32_t*>(dst) =
      round_to_bf16_bits(a) | static_cast<uint32_t>(round_to_bf16_bits(b)) << 16;
}

// Element i of an output whose dtype a launch picks at run time (the attention kernels: a
// template parameter there would double instantiations that are already many). The branch is
// uniform across the grid.
__device__ __forceinline__ void store_activation(void* out, bool bf16, int64_t i, float x) {
  if (bf16) {
    store_activation(static_cast<uint16_t*>(out) + i, x);
  } else {
    store_activation(static_cast<float*>(out) + i, x);
  }
}

// Calls f(O{}) with O the storage of an activation of `dtype`: float (F32) or uint16_t (BF16).
template <class F>
void dispatch_activation_dtype(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::F32:
      f(float{});
      return;
    case DType::BF16:
      f(uint16_t{});
      return;
    default:
      throw Error(std::string(what) + ": an output of " + std::string(dtype_name(dtype)) +
                  " is not supported (F32, BF16)");
  }
}

}  // namespace attnres::cuda
