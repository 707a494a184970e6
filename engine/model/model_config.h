// The model's hyperparameters, read from a Hugging Face model directory: config.json (the
// architecture) and generation_config.json (sampling defaults, optional). Every defect that
// would make the engine compute something else than the checkpoint's own code is rejected
// here with an attnres::Error naming the file, the field, what was found and what was
// expected; nothing downstream re-validates the config.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/checkpoint_quantization.h"
#include "engine/model/rope_frequencies.h"

namespace attnres {

enum class Architecture { Qwen3AttnRes, Qwen3, Qwen2, Llama };  // "mistral" loads as Llama
// attnres_mode (docs/ATTNRES.md §2a/2b/2d). Block and Full are the cumulative / block-sum mixes;
// Delta, DeltaBlock and DeltaV attend over sublayer outputs (or block deltas) and add the
// mix to the running residual; FirstLayer mixes [x, layer 0's MLP output]; PreGated gates
// the delta sources before the softmax.
enum class AttnResMode { None, Block, Full, Delta, DeltaBlock, DeltaV, FirstLayer, PreGated };
// attnres_gate_type (docs/ATTNRES.md §2d): how the mix is blended with the running residual.
enum class AttnResGate { Bias, SigmoidScalar, SigmoidVector, LearnableAlpha };

// generation_config.json; unset fields stay nullopt (or empty).
struct GenerationDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k, max_new_tokens;
  std::optional<bool> do_sample;
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id, pad_token_id;

  static GenerationDefaults from_json(const nlohmann::json& json, const std::string& origin);
};

struct ModelConfig {
  std::string model_dir, model_type;
  Architecture arch = Architecture::Llama;
  int hidden_size = 0, intermediate_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0,
      head_dim = 0, vocab_size = 0, max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f, rope_theta = 10000.f;
  // From rope_parameters (transformers 5) or rope_theta / rope_scaling (4.x); unset for
  // "default". rope_source says which fields they came from, for the startup log.
  std::optional<RopeScaling> rope_scaling;
  std::string rope_source;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q,k,v biases (qwen2: always; llama/qwen3: config attention_bias)
  bool o_proj_bias = false;     // llama/qwen3: config attention_bias; qwen2: never
  bool mlp_bias = false;        // llama: config mlp_bias (gate, up, down)
  bool qk_norm = false;         // qwen3 family: per-head RMSNorm on q and k before RoPE
  AttnResMode attnres_mode = AttnResMode::None;
  // block / delta_block: from config (default 8, capped at num_layers); every other
  // AttnRes mode: num_layers (it ignores the field); none: 0.
  int attnres_num_blocks = 0;
  std::string attnres_gate_type;                 // as written in config.json, "" when absent
  AttnResGate attnres_gate = AttnResGate::Bias;  // absent: the code's default, "bias"
  bool attnres_use_null_source = false;          // as written; only delta modes read it
  std::string torch_dtype;  // dtype (5.x) or torch_dtype (4.x) as written, "" when absent
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  GenerationDefaults generation;
  // config.json's quantization_config: how the checkpoint stores quantized matrices (unset:
  // every weight is a float tensor).
  std::optional<CheckpointQuantization> quantization;

  // P = ceil(L / num_blocks): decoder layers per AttnRes block (full: 1; none: L).
  int layers_per_block() const;
  // RoPE inverse frequencies [head_dim / 2], with rope_scaling applied.
  std::vector<float> rope_inv_freq() const;
  // What transformers multiplies cos and sin by (yarn; 1 otherwise).
  float rope_attention_factor() const;

  // config.json (+ generation_config.json when present) from a model directory.
  static ModelConfig load(const std::string& model_dir);
  // origin names the source in error messages (usually the config.json path).
  static ModelConfig from_json(const nlohmann::json& config, const std::string& origin);
  // One line for logs: "qwen3_attnres (block, 4 blocks, gate bias): L=12 d=768 ...".
  std::string summary() const;
};

std::string_view architecture_name(Architecture arch);
std::string_view attnres_mode_name(AttnResMode mode);
std::string_view attnres_gate_name(AttnResGate gate);
// delta, delta_block, delta_v: h = x + mix(sources), the only modes with a null source.
bool attnres_is_delta(AttnResMode mode);
// Modes whose sublayer mixes go through attnres_gate_type's gate (all but first_layer and
// pre_gated, which have none).
bool attnres_mode_has_gate(AttnResMode mode);

}  // namespace attnres
