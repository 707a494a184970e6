// A small model config for the depth-plan tests: `layers` decoder layers in `blocks` AttnRes
// blocks (mode None: a plain qwen3).
#pragma once

#include <nlohmann/json.hpp>

#include "engine/model/model_config.h"

namespace attnres::test {

inline ModelConfig config(AttnResMode mode, int layers, int blocks) {
  nlohmann::json j = {{"model_type", mode == AttnResMode::None ? "qwen3" : "qwen3_attnres"},
                      {"hidden_size", 64},
                      {"intermediate_size", 128},
                      {"num_hidden_layers", layers},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 16},
                      {"vocab_size", 100},
                      {"max_position_embeddings", 128},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"tie_word_embeddings", true}};
  if (mode != AttnResMode::None) {
    j["attnres_mode"] = mode == AttnResMode::Block ? "block" : "full";
    j["attnres_num_blocks"] = blocks;
    j["attnres_gate_type"] = "bias";
  }
  return ModelConfig::from_json(j, "test config");
}

}  // namespace attnres::test
