// Each rope type's inverse frequencies, in the precision transformers uses: the
// per-dimension tables in float32, the scalar bounds (yarn's correction range) in double,
// so that the engine's frequencies round like the checkpoint's own code.
#include "engine/model/rope_frequencies.h"

#include <algorithm>
#include <cmath>

namespace attnres {
namespace {

constexpr double kPi = 3.14159265358979323846;

// theta ** (2i / dim) in float32, as torch evaluates base ** (arange(0, dim, 2) / dim).
std::vector<float> base_powers(int head_dim, float theta) {
  std::vector<float> powers(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    powers[i] = std::pow(theta, exponent);
  }
  return powers;
}

// llama3: long wavelengths slowed by factor, short ones kept, a smooth ramp between.
void apply_llama3(const RopeScaling& rs, std::vector<float>& inv_freq) {
  const float pi = static_cast<float>(kPi);
  float old_len = static_cast<float>(rs.original_max_position_embeddings);
  float low_freq_wavelen = old_len / rs.low_freq_factor;
  float high_freq_wavelen = old_len / rs.high_freq_factor;
  for (float& f : inv_freq) {
    float wavelen = 2 * pi / f;
    if (wavelen > low_freq_wavelen) {
      f /= rs.factor;
    } else if (wavelen >= high_freq_wavelen) {
      float smooth =
          (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      f = (1 - smooth) * f / rs.factor + smooth * f;
    }
  }
}

// The (fractional) dimension whose wavelength makes num_rotations turns over the
// pre-training context.
double yarn_correction_dim(double num_rotations, int dim, double base, double context) {
  return dim * std::log(context / (num_rotations * 2 * kPi)) / (2 * std::log(base));
}

// yarn: dimensions that turn more than beta_fast times over the pre-training context keep
// their frequency (extrapolation), those turning fewer than beta_slow times are divided by
// factor (interpolation), with a linear ramp between.
std::vector<float> yarn_inv_freq(int head_dim, float theta, const RopeScaling& rs) {
  const std::vector<float> powers = base_powers(head_dim, theta);
  const double context = rs.original_max_position_embeddings;
  double low = yarn_correction_dim(rs.beta_fast, head_dim, theta, context);
  double high = yarn_correction_dim(rs.beta_slow, head_dim, theta, context);
  if (rs.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(head_dim - 1));
  if (low == high) high += 0.001;  // a one-point ramp would divide by zero
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  std::vector<float> inv_freq(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
    float keep = 1.0f - ramp;  // the share of the unscaled frequency
    float extrapolated = 1.0f / powers[i];
    float interpolated = 1.0f / (rs.factor * powers[i]);
    inv_freq[i] = interpolated * (1.0f - keep) + extrapolated * keep;
  }
  return inv_freq;
}

}  // namespace

std::vector<float> rope_inv_freq(int head_dim, float theta,
                                 const std::optional<RopeScaling>& scaling) {
  if (scaling && scaling->type == "yarn") return yarn_inv_freq(head_dim, theta, *scaling);
  std::vector<float> inv_freq = base_powers(head_dim, theta);
  for (float& f : inv_freq) f = 1.0f / f;
  if (!scaling) return inv_freq;
  if (scaling->type == "linear") {
    for (float& f : inv_freq) f /= scaling->factor;
  } else if (scaling->type == "llama3") {
    apply_llama3(*scaling, inv_freq);
  }
  // "dynamic": unscaled within max_position_embeddings, the engine's context limit.
  return inv_freq;
}

float rope_attention_factor(const std::optional<RopeScaling>& scaling) {
  return scaling && scaling->type == "yarn" ? scaling->attention_factor : 1.0f;
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

}  // namespace attnres
