// The super-block formats Q4_K256 and Q6_K256 (engine/core/quant_format.h defines their
// layouts and the quantization rule): one row's quantizer and dequantizer, called by
// quantize_row / dequantize_row once the row is checked.
#pragma once

#include <cstdint>

namespace attnres {

void quantize_q4k_row(const float* x, int64_t cols, uint8_t* row);
void dequantize_q4k_row(const uint8_t* row, int64_t cols, float* out);
void quantize_q6k_row(const float* x, int64_t cols, uint8_t* row);
void dequantize_q6k_row(const uint8_t* row, int64_t cols, float* out);

}  // namespace attnres
