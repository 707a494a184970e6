// A small model config for the depth-plan tests: `layers` decoder layers in `blocks` AttnRes
// blocks (mode None: a plain qwen3).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/model/model_config.h"

namespace attnres::test {

// gate: an attnres_gate_type value; null_source: attnres_use_null_source.
inline ModelConfig config(AttnResMode mode, int layers, int blocks, const char* gate = "bias",
                          bool null_source = false) {
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
    j["attnres_mode"] = std::string(attnres_mode_name(mode));
    j["attnres_num_blocks"] = blocks;
    j["attnres_gate_type"] = gate;
    j["attnres_use_null_source"] = null_source;
  }
  return ModelConfig::from_json(j, "test config");
}

}  // namespace attnres::test
