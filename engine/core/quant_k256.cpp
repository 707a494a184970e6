// Built with -ffp-contract=off (CMakeLists.txt): D q - M and the scale divisions below are the
// separately rounded operations quant_format.h defines, never fused.
#include "engine/core/quant_k256.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/dtype.h"
#include "engine/core/quant_format.h"
#include "engine/core/quant_packing.h"
#include "engine/core/quant_search.h"

namespace attnres {
namespace {

using quant_packing::code6;
using quant_packing::nibble;
using quant_packing::pack_high_bits;
using quant_packing::pack_nibbles;

constexpr int kBlocks = static_cast<int>(kQuantSuperBlock / kQuantBlock);  // 8
constexpr int kSub16 = static_cast<int>(kQuantSuperBlock / 16);            // 16
constexpr int kDeltas[] = {-1, 1, -2, 2};

float f16_round(float v) { return f16_to_f32(f32_to_f16(v)); }

void store_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

uint16_t load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// nearbyint(v / unit) clamped to [0, top]; 0 where unit == 0.
int integer_scale(float v, float unit, int top) {
  if (unit == 0.0f) return 0;
  return static_cast<int>(std::clamp(std::nearbyint(v / unit), 0.0f, static_cast<float>(top)));
}

// A block's refinement errors by candidate: the second pass and the deltas after a kept one
// revisit candidates whose error (a pure function of the candidate) is known already.
class ErrorMemo {
 public:
  template <typename Error>
  double operator()(int key, const Error& error) {
    for (int k = 0; k < count_; ++k)
      if (keys_[k] == key) return errors_[k];
    const double e = error();
    if (count_ < kSize) {
      keys_[count_] = key;
      errors_[count_++] = e;
    }
    return e;
  }

 private:
  static constexpr int kSize = 24;  // more than a block's 1 + 2 x 8 tries
  int keys_[kSize];
  double errors_[kSize];
  int count_ = 0;
};

// Tries value + delta for each delta in kDeltas (inside [0, top]), keeping it when error()
// of the candidate is strictly below best.
template <typename Error>
void refine(int& value, int top, double& best, const Error& error) {
  for (const int delta : kDeltas) {
    const int candidate = value + delta;
    if (candidate < 0 || candidate > top) continue;
    const double e = error(candidate);
    if (e < best) {
      best = e;
      value = candidate;
    }
  }
}

void quantize_q4k_super(const float* x, uint8_t* packed, uint8_t* params) {
  float dj[kBlocks], mj[kBlocks];
  for (int j = 0; j < kBlocks; ++j) {
    const float* xb = x + kQuantBlock * j;
    const auto [d, m] = choose_asymmetric_scale(xb, kQuantBlock, 15);
    dj[j] = m <= 0.0f ? d : f16_round(*std::max_element(xb, xb + kQuantBlock) / 15.0f);
    mj[j] = m < 0.0f ? -m : 0.0f;
  }
  const float d = f16_round(*std::max_element(dj, dj + kBlocks) / 63.0f);
  const float dmin = f16_round(*std::max_element(mj, mj + kBlocks) / 63.0f);
  int sc[kBlocks], mn[kBlocks];
  for (int j = 0; j < kBlocks; ++j) {
    sc[j] = integer_scale(dj[j], d, 63);
    mn[j] = integer_scale(mj[j], dmin, 63);
  }
  for (int j = 0; j < kBlocks; ++j) {
    const float* xb = x + kQuantBlock * j;
    ErrorMemo memo;
    const auto error = [&](int s, int m) {
      return memo(s * 64 + m, [&] {
        return asymmetric_error(xb, kQuantBlock, 15, d * static_cast<float>(s),
                                -(dmin * static_cast<float>(m)));
      });
    };
    double best = error(sc[j], mn[j]);
    for (int pass = 0; pass < 2; ++pass) {
      refine(sc[j], 63, best, [&](int s) { return error(s, mn[j]); });
      refine(mn[j], 63, best, [&](int m) { return error(sc[j], m); });
    }
    const float big_d = d * static_cast<float>(sc[j]), big_m = dmin * static_cast<float>(mn[j]);
    uint8_t q[kQuantBlock];
    for (int t = 0; t < kQuantBlock; ++t) {
      const float v = big_d == 0.0f ? 0.0f : std::nearbyint((xb[t] + big_m) / big_d);
      q[t] = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
    }
    pack_nibbles(q, packed + 16 * j);
  }
  store_f16(params, d);
  store_f16(params + 2, dmin);
  for (int j = 0; j < kBlocks; ++j) params[4 + j] = static_cast<uint8_t>(sc[j] | (mn[j] >> 4) << 6);
  for (int i = 0; i < 4; ++i)
    params[12 + i] = static_cast<uint8_t>((mn[i] & 15) | (mn[i + 4] & 15) << 4);
}

void quantize_q6k_super(const float* x, uint8_t* low, uint8_t* high, uint8_t* sc_out,
                        uint8_t* d_out) {
  float si[kSub16];
  for (int i = 0; i < kSub16; ++i) si[i] = choose_symmetric_scale(x + 16 * i, 16, 31);
  const float d = f16_round(*std::max_element(si, si + kSub16) / 255.0f);
  int sc[kSub16];
  for (int i = 0; i < kSub16; ++i) {
    sc[i] = integer_scale(si[i], d, 255);
    ErrorMemo memo;
    const auto error = [&](int s) {
      return memo(s,
                  [&] { return symmetric_error(x + 16 * i, 16, 31, d * static_cast<float>(s)); });
    };
    double best = error(sc[i]);
    for (int pass = 0; pass < 2; ++pass) refine(sc[i], 255, best, error);
    sc_out[i] = static_cast<uint8_t>(sc[i]);
  }
  for (int b = 0; b < kBlocks; ++b) {
    uint8_t q[kQuantBlock];
    for (int t = 0; t < kQuantBlock; ++t) {
      const float big_d = d * static_cast<float>(sc[2 * b + t / 16]);
      const float v = big_d == 0.0f ? 0.0f : std::nearbyint(x[kQuantBlock * b + t] / big_d);
      q[t] = static_cast<uint8_t>(32 + static_cast<int>(std::clamp(v, -31.0f, 31.0f)));
    }
    pack_nibbles(q, low + 16 * b);
    pack_high_bits(q, high + 8 * b);
  }
  store_f16(d_out, d);
}

}  // namespace

void quantize_q4k_row(const float* x, int64_t cols, uint8_t* row) {
  uint8_t* params = row + quant_scales_offset(DType::Q4_K256, cols);
  for (int64_t s = 0; s < cols / kQuantSuperBlock; ++s)
    quantize_q4k_super(x + kQuantSuperBlock * s, row + kQuantSuperBlock / 2 * s, params + 16 * s);
}

void dequantize_q4k_row(const uint8_t* row, int64_t cols, float* out) {
  const uint8_t* params = row + quant_scales_offset(DType::Q4_K256, cols);
  for (int64_t b = 0; b < cols / kQuantBlock; ++b) {
    const auto [d, m] =
        q4k_block_params(params + 16 * (b / kBlocks), static_cast<int>(b % kBlocks));
    for (int t = 0; t < kQuantBlock; ++t)
      out[kQuantBlock * b + t] = d * static_cast<float>(nibble(row + 16 * b, t)) + m;
  }
}

void quantize_q6k_row(const float* x, int64_t cols, uint8_t* row) {
  uint8_t* high = row + quant_highs_offset(DType::Q6_K256, cols);
  uint8_t* sc = row + quant_scales_offset(DType::Q6_K256, cols);
  uint8_t* d = row + quant_super_scales_offset(DType::Q6_K256, cols);
  for (int64_t s = 0; s < cols / kQuantSuperBlock; ++s)
    quantize_q6k_super(x + kQuantSuperBlock * s, row + kQuantSuperBlock / 2 * s,
                       high + kQuantSuperBlock / 4 * s, sc + kSub16 * s, d + 2 * s);
}

void dequantize_q6k_row(const uint8_t* row, int64_t cols, float* out) {
  const uint8_t* high = row + quant_highs_offset(DType::Q6_K256, cols);
  const uint8_t* sc = row + quant_scales_offset(DType::Q6_K256, cols);
  const uint8_t* dp = row + quant_super_scales_offset(DType::Q6_K256, cols);
  for (int64_t b = 0; b < cols / kQuantBlock; ++b) {
    const float d = f16_to_f32(load_f16(dp + 2 * (b / kBlocks)));
    for (int t = 0; t < kQuantBlock; ++t) {
      const float scale = d * static_cast<float>(sc[2 * b + t / 16]);
      out[kQuantBlock * b + t] =
          scale * static_cast<float>(code6(row + 16 * b, high + 8 * b, t) - 32);
    }
  }
}

}  // namespace attnres
