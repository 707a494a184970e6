// The 4-bit and 6-bit codes of one block of 32 weights as quant_format.h lays them out: low
// nibbles (byte j: code j in bits 0..3, code j + 16 in bits 4..7) and, for 6-bit codes, the top
// two bits (byte j: bits 4..5 of code j + 8 i in bits 2 i, 2 i + 1). Shared by the formats'
// quantizers and dequantizers.
#pragma once

#include <cstdint>

namespace attnres::quant_packing {

inline void pack_nibbles(const uint8_t* q, uint8_t* low16) {
  for (int j = 0; j < 16; ++j) low16[j] = static_cast<uint8_t>((q[j] & 15) | (q[j + 16] & 15) << 4);
}

inline void pack_high_bits(const uint8_t* q, uint8_t* high8) {
  for (int j = 0; j < 8; ++j) {
    uint8_t h = 0;
    for (int i = 0; i < 4; ++i) h = static_cast<uint8_t>(h | (q[j + 8 * i] >> 4) << (2 * i));
    high8[j] = h;
  }
}

inline int nibble(const uint8_t* low16, int j) { return low16[j % 16] >> (j < 16 ? 0 : 4) & 15; }

inline int code6(const uint8_t* low16, const uint8_t* high8, int j) {
  return nibble(low16, j) | (high8[j % 8] >> (2 * (j / 8)) & 3) << 4;
}

}  // namespace attnres::quant_packing
