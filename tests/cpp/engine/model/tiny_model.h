// A tiny but complete model directory (config.json + model.safetensors) for each supported
// layout. The tensor list is written out here by hand from the Hugging Face naming, not
// derived from the loader, so the tests check the loader against an independent spec.
#pragma once

#include <string>
#include <vector>

#include "tests/cpp/engine/model/checkpoint_writer.h"

namespace attnres::test_files {

struct TinyModelOptions {
  std::string model_type = "qwen3_attnres";
  std::string dtype = "BF16";
  std::string attnres_mode = "block";  // qwen3_attnres only
  bool gate_bias = true;
  bool final_res = false;  // variant 2b
  bool tied = true;
  bool attention_bias = false;  // config attention_bias (llama / qwen3)
  bool mlp_bias = false;        // config mlp_bias (llama)
  int num_layers = 4;
};

// d=8, ffn=12, 2 query heads and 1 kv head of dim 4, vocab 16, 2 AttnRes blocks.
struct TinyModel {
  static constexpr int kHidden = 8, kFfn = 12, kHeads = 2, kKvHeads = 1, kHeadDim = 4, kVocab = 16;

  explicit TinyModel(const TinyModelOptions& o = {}) : options(o) {
    config = {{"model_type", o.model_type},
              {"hidden_size", kHidden},
              {"intermediate_size", kFfn},
              {"num_hidden_layers", o.num_layers},
              {"num_attention_heads", kHeads},
              {"num_key_value_heads", kKvHeads},
              {"head_dim", kHeadDim},
              {"vocab_size", kVocab},
              {"max_position_embeddings", 128},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000.0},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", o.tied},
              {"attention_bias", o.attention_bias},
              {"torch_dtype", "bfloat16"},
              {"eos_token_id", 3},
              {"bos_token_id", 1}};
    if (o.model_type == "llama") config["mlp_bias"] = o.mlp_bias;
    if (o.model_type == "qwen3_attnres") {
      config["attnres_mode"] = o.attnres_mode;
      config["attnres_num_blocks"] = 2;
      config["attnres_recency_bias_init"] = 0.0;
      if (o.gate_bias) config["attnres_gate_type"] = "bias";
    }
    add_weights();
  }

  void write(const TempDir& dir) const {
    write_json(dir.file("config.json"), config);
    weights.write(dir.file("model.safetensors"));
  }

  TinyModelOptions options;
  json config;
  SafetensorsWriter weights;

 private:
  void add(const std::string& name, std::vector<int64_t> shape) {
    weights.add(name, options.dtype, shape);
  }
  void add_res(const std::string& prefix, float bias) {
    add(prefix + "_res_proj.weight", {1, kHidden});
    add(prefix + "_res_norm.weight", {kHidden});
    if (options.gate_bias) weights.add(prefix + "_res_bias", options.dtype, {}, {bias});
  }
  void add_weights() {
    const std::string& type = options.model_type;
    bool qk_norm = type == "qwen3" || type == "qwen3_attnres";
    bool qkv_bias = type == "qwen2" || options.attention_bias;
    bool o_bias = type != "qwen2" && options.attention_bias;
    add("model.embed_tokens.weight", {kVocab, kHidden});
    for (int i = 0; i < options.num_layers; ++i) {
      std::string p = "model.layers." + std::to_string(i) + ".";
      add(p + "input_layernorm.weight", {kHidden});
      add(p + "post_attention_layernorm.weight", {kHidden});
      add(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden});
      add(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden});
      add(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden});
      add(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim});
      if (qkv_bias) {
        add(p + "self_attn.q_proj.bias", {kHeads * kHeadDim});
        add(p + "self_attn.k_proj.bias", {kKvHeads * kHeadDim});
        add(p + "self_attn.v_proj.bias", {kKvHeads * kHeadDim});
      }
      if (o_bias) add(p + "self_attn.o_proj.bias", {kHidden});
      if (qk_norm) {
        add(p + "self_attn.q_norm.weight", {kHeadDim});
        add(p + "self_attn.k_norm.weight", {kHeadDim});
      }
      add(p + "mlp.gate_proj.weight", {kFfn, kHidden});
      add(p + "mlp.up_proj.weight", {kFfn, kHidden});
      add(p + "mlp.down_proj.weight", {kHidden, kFfn});
      if (options.mlp_bias) {
        add(p + "mlp.gate_proj.bias", {kFfn});
        add(p + "mlp.up_proj.bias", {kFfn});
        add(p + "mlp.down_proj.bias", {kHidden});
      }
      if (type == "qwen3_attnres") {
        // Distinct, exactly representable biases so the test can tell which went where.
        add_res(p + "attn", 0.5f + static_cast<float>(i));
        add_res(p + "mlp", -0.25f - static_cast<float>(i));
      }
    }
    add("model.norm.weight", {kHidden});
    if (!options.tied) add("lm_head.weight", {kVocab, kHidden});
    if (options.final_res) add_res("model.final", 2.0f);
  }
};

}  // namespace attnres::test_files
