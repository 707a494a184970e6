// Rotary-embedding frequencies for every rope type the engine serves, computed as
// transformers' modeling_rope_utils computes them (docs/ROPE.md has the formulas and
// the choice made for "dynamic"). The config side (which keys, which form, defaults) is
// read by ModelConfig; these functions only turn the resolved values into numbers.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace attnres {

// The resolved scaling of rope_parameters (transformers 5) or rope_scaling (4.x). Only
// set for types other than "default"; every field the type uses is filled in, defaults
// included, so the numbers below never look at config.json again.
struct RopeScaling {
  std::string type;  // "linear", "dynamic", "llama3" or "yarn"
  float factor = 1;
  // llama3
  float low_freq_factor = 1, high_freq_factor = 4;
  // llama3 and yarn: the pre-training context (defaults to max_position_embeddings).
  int original_max_position_embeddings = 8192;
  // yarn: the ramp's rotation bounds, whether they are rounded to whole dimensions, and
  // the factor cos and sin are multiplied by (resolved from attention_factor, or from
  // mscale / mscale_all_dim, or 0.1 ln(factor) + 1).
  float beta_fast = 32, beta_slow = 1;
  bool truncate = true;
  float attention_factor = 1;
};

// inv_freq [head_dim / 2] for base theta with the scaling applied. "dynamic" gives the
// unscaled frequencies: transformers only rescales past max_position_embeddings, a
// context the engine never admits (docs/ROPE.md).
std::vector<float> rope_inv_freq(int head_dim, float theta,
                                 const std::optional<RopeScaling>& scaling);

// The factor transformers multiplies cos and sin by (yarn; 1 for every other type). It
// scales both q and k, so attention logits grow by its square.
float rope_attention_factor(const std::optional<RopeScaling>& scaling);

// yarn's default attention factor for a factor and an mscale: 0.1 mscale ln(factor) + 1,
// or 1 when factor <= 1.
double yarn_mscale(double factor, double mscale);

}  // namespace attnres
