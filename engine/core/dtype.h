// Element types the engine stores: f32 for activations on the CPU, bf16 / f16 for weights
// as checkpoints ship them. Conversions are bit-exact with PyTorch (bf16: round to nearest
// even on the way down, plain shift on the way up).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace attnres {

// Q8_B32, Q6_B32, Q4_B32, Q6_K256 and Q4_K256 are block-quantized weight formats
// (engine/core/quant_format.h): a tensor of them is [rows, cols] logically, each row stored as
// blocks of 32 weights (K256: super-blocks of 256). They have no element size: size them with
// nbytes_of / quant_row_bytes, never dtype_size.
enum class DType : uint8_t { F32, BF16, F16, I32, Q8_B32, Q4_B32, Q6_B32, Q4_K256, Q6_K256 };

constexpr bool is_block_quantized(DType t) {
  return t == DType::Q8_B32 || t == DType::Q6_B32 || t == DType::Q4_B32 ||
         t == DType::Q4_K256 || t == DType::Q6_K256;
}

// Bytes of one element; 0 for the block-quantized formats (above).
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
    case DType::F16:
      return 2;
    case DType::Q8_B32:
    case DType::Q6_B32:
    case DType::Q4_B32:
    case DType::Q4_K256:
    case DType::Q6_K256:
      return 0;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::Q8_B32:
      return "Q8_B32";
    case DType::Q4_B32:
      return "Q4_B32";
    case DType::Q6_B32:
      return "Q6_B32";
    case DType::Q4_K256:
      return "Q4_K256";
    case DType::Q6_K256:
      return "Q6_K256";
  }
  return "?";
}

// The vLLM-style names of a storage dtype (--kv-cache-dtype, --depth-bank-dtype):
// F32 <-> "float32", BF16 <-> "bfloat16"; other dtypes are named by dtype_name.
std::string storage_dtype_name(DType dtype);
// Throws, naming `what` (the flag), on anything but those two names, "auto" included: the
// engine resolves "auto" against the model and backend before it gets here.
DType storage_dtype_from_name(const std::string& name, std::string_view what);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// IEEE half <-> float without relying on F16C (the CPU kernels use F16C where it exists).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((bits >> 23) & 0xffu) - 127 + 15;
  uint32_t mant = bits & 0x7fffffu;
  if (((bits >> 23) & 0xffu) == 0xffu)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | static_cast<uint32_t>(exp) << 10 | mant >> 13;
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(half);
}

}  // namespace attnres
