#include "engine/model/random_weights.h"

#include <cmath>

#include "engine/core/huge_page_arena.h"

namespace attnres {
namespace {

// splitmix64: tiny, fast, and identical on every platform (std distributions are not).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float symmetric() {
    return static_cast<float>(next() >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
};

class Filler {
 public:
  Filler(DType dtype, uint64_t seed) : dtype_(dtype), rng_{seed} {}

  // Uniform values with standard deviation `std` around `mean`, in huge pages (the weights a
  // decode step streams: HugePageArena says why).
  Tensor make(const Shape& shape, float std, float mean = 0.0f) {
    Tensor t = arena_.empty(shape, dtype_);
    const float half_width = std * std::sqrt(3.0f);
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) {
      set_element_from_float(t, i, mean + half_width * rng_.symmetric());
    }
    return t;
  }
  float scalar(float std) { return std * std::sqrt(3.0f) * rng_.symmetric(); }

 private:
  DType dtype_;
  Rng rng_;
  HugePageArena arena_;
};

AttnResWeights make_depth(Filler& fill, int64_t d) {
  // Large enough that depth weights are far from uniform, as in trained checkpoints.
  return AttnResWeights{fill.make({1, d}, 0.5f / std::sqrt(static_cast<float>(d)) * 4.0f),
                        fill.make({d}, 0.1f, 1.0f), fill.scalar(1.0f)};
}

// What a sublayer's mode and gate read besides the query (docs/ATTNRES.md §2d), as the loader
// would leave it: only the tensors the mode reads.
void add_mode_weights(Filler& fill, const ModelConfig& c, AttnResWeights& res) {
  const int64_t d = c.hidden_size;
  const float in_std = 1.0f / std::sqrt(static_cast<float>(d));
  const bool reads_bias =
      c.attnres_mode == AttnResMode::Block || c.attnres_mode == AttnResMode::Full;
  if (!reads_bias || c.attnres_gate_type.empty()) res.bias = std::nullopt;
  if (attnres_mode_has_gate(c.attnres_mode)) {
    switch (c.attnres_gate) {
      case AttnResGate::Bias:
        break;
      case AttnResGate::SigmoidScalar:
        res.gate_blend = 1.0f / (1.0f + std::exp(-fill.scalar(1.0f)));
        break;
      case AttnResGate::LearnableAlpha:
        res.gate_blend = 0.5f + fill.scalar(0.2f);
        break;
      case AttnResGate::SigmoidVector:
        res.gate_proj = fill.make({d, d}, in_std);
        res.gate_bias = fill.make({d}, 0.5f);
        break;
    }
  }
  if (attnres_is_delta(c.attnres_mode) && c.attnres_use_null_source) {
    res.null_source = fill.make({d}, 1.0f);
  }
  if (c.attnres_mode == AttnResMode::PreGated) {
    res.pre_gate = fill.make({d, d}, in_std);
    res.pre_gate_bias = fill.make({d}, 0.5f);
  }
}

}  // namespace

ModelWeights make_random_weights(const ModelConfig& c, const RandomWeightOptions& options) {
  Filler fill(options.dtype, options.seed);
  const int64_t d = c.hidden_size, ffn = c.intermediate_size, hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  const float in_std = 1.0f / std::sqrt(static_cast<float>(d));
  ModelWeights w;
  w.dtype = options.dtype;
  w.embed_tokens = fill.make({c.vocab_size, d}, 1.0f);
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights l;
    l.input_norm = fill.make({d}, 0.1f, 1.0f);
    l.q_proj = fill.make({q_width, d}, in_std);
    l.k_proj = fill.make({kv_width, d}, in_std);
    l.v_proj = fill.make({kv_width, d}, in_std);
    l.o_proj = fill.make({d, q_width}, 1.0f / std::sqrt(static_cast<float>(q_width)));
    if (c.qk_norm) {
      l.q_norm = fill.make({hd}, 0.1f, 1.0f);
      l.k_norm = fill.make({hd}, 0.1f, 1.0f);
    }
    if (c.attention_bias) {
      l.q_bias = fill.make({q_width}, 0.1f);
      l.k_bias = fill.make({kv_width}, 0.1f);
      l.v_bias = fill.make({kv_width}, 0.1f);
    }
    if (c.o_proj_bias) l.o_bias = fill.make({d}, 0.1f);
    l.post_attention_norm = fill.make({d}, 0.1f, 1.0f);
    l.gate_proj = fill.make({ffn, d}, in_std);
    l.up_proj = fill.make({ffn, d}, in_std);
    l.down_proj = fill.make({d, ffn}, 1.0f / std::sqrt(static_cast<float>(ffn)));
    if (c.mlp_bias) {
      l.gate_bias = fill.make({ffn}, 0.1f);
      l.up_bias = fill.make({ffn}, 0.1f);
      l.down_bias = fill.make({d}, 0.1f);
    }
    if (c.attnres_mode != AttnResMode::None) {
      l.attn_res = make_depth(fill, d);
      l.mlp_res = make_depth(fill, d);
      add_mode_weights(fill, c, *l.attn_res);
      add_mode_weights(fill, c, *l.mlp_res);
      if (c.attnres_mode == AttnResMode::DeltaV) l.v_res = make_depth(fill, d);
    }
    w.layers.push_back(std::move(l));
  }
  w.final_norm = fill.make({d}, 0.1f, 1.0f);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : fill.make({c.vocab_size, d}, in_std);
  if (options.final_mix) {
    w.final_res = make_depth(fill, d);
    if (c.attnres_gate_type.empty()) w.final_res->bias = std::nullopt;
  }
  return w;
}

}  // namespace attnres
