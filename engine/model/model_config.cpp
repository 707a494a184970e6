#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/json_fields.h"

namespace attnres {
namespace {

using nlohmann::json;

using Fields = JsonFields<json>;

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

int required_positive_int(const Fields& fields, const std::string& key) {
  if (!fields.find(key)) fields.fail(key, "missing (required, a positive integer)");
  return static_cast<int>(*fields.integer(key, 1, kMaxInt));
}

int positive_int_or(const Fields& fields, const std::string& key, int fallback) {
  auto v = fields.integer(key, 1, kMaxInt);
  return v ? static_cast<int>(*v) : fallback;
}

float positive_float_or(const Fields& fields, const std::string& key, float fallback) {
  auto v = fields.number(key, NumberRange::positive());
  return v ? static_cast<float>(*v) : fallback;
}

std::optional<float> optional_float(const Fields& fields, const std::string& key,
                                    NumberRange range = {}) {
  auto v = fields.number(key, range);
  if (!v) return std::nullopt;
  return static_cast<float>(*v);
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  json parsed;
  try {
    parsed = json::parse(text.str());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number overflow
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!parsed.is_object()) throw Error(path + ": expected a JSON object at the top level");
  return parsed;
}

const char* kSupportedModelTypes = "qwen3_attnres, qwen3, qwen2, llama, mistral";

Architecture parse_architecture(const Fields& config, const std::string& model_type) {
  if (model_type == "qwen3_attnres") return Architecture::Qwen3AttnRes;
  if (model_type == "qwen3") return Architecture::Qwen3;
  if (model_type == "qwen2") return Architecture::Qwen2;
  if (model_type == "llama" || model_type == "mistral") return Architecture::Llama;
  config.fail("model_type", "unsupported model_type '" + model_type +
                                "' (supported: " + kSupportedModelTypes + ")");
}

// The base the architectures' transformers config classes use when a config gives none
// (LlamaConfig, Qwen2Config and Qwen3Config all default to 10000).
float default_rope_theta(Architecture) { return 10000.f; }

const char* kSupportedRopeTypes = "default, linear, dynamic, llama3, yarn";

// Every key transformers reads inside rope_parameters / rope_scaling for the supported
// types. Another key is rejected rather than ignored: it could be one that changes the
// frequencies in the checkpoint's own code.
bool is_known_rope_key(const std::string& key) {
  static const std::set<std::string> kKeys = {"rope_type",
                                              "type",
                                              "rope_theta",
                                              "factor",
                                              "low_freq_factor",
                                              "high_freq_factor",
                                              "beta_fast",
                                              "beta_slow",
                                              "mscale",
                                              "mscale_all_dim",
                                              "truncate",
                                              "attention_factor",
                                              "partial_rotary_factor",
                                              "original_max_position_embeddings"};
  return kKeys.count(key) > 0;
}

// yarn's optional fields, with transformers' defaults (beta_fast / beta_slow use
// `value or default`, so 0 also means the default).
void parse_yarn(const Fields& fields, RopeScaling& scaling) {
  scaling.beta_fast = static_cast<float>(fields.number("beta_fast").value_or(0));
  scaling.beta_slow = static_cast<float>(fields.number("beta_slow").value_or(0));
  if (scaling.beta_fast == 0) scaling.beta_fast = 32;
  if (scaling.beta_slow == 0) scaling.beta_slow = 1;
  scaling.truncate = fields.boolean("truncate").value_or(true);
  if (fields.find("attention_factor")) {
    scaling.attention_factor = positive_float_or(fields, "attention_factor", 1);
    return;
  }
  // DeepSeek-style configs give the ratio of two mscales instead of the factor itself.
  double mscale = fields.number("mscale").value_or(0);
  double mscale_all_dim = fields.number("mscale_all_dim").value_or(0);
  double factor = scaling.factor;
  scaling.attention_factor =
      static_cast<float>(mscale != 0 && mscale_all_dim != 0
                             ? yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                             : yarn_mscale(factor, 1));
}

// rope_theta and the scaling, from either form, chosen as transformers 5 does when it
// converts a config (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict):
//   - the scaling object is rope_scaling when it is a non-empty object, else
//     rope_parameters;
//   - theta is that object's rope_theta, else the top-level rope_theta, else the
//     architecture's default;
//   - llama3 / yarn take original_max_position_embeddings from the top level when it is
//     there, else from the object, else max_position_embeddings.
void parse_rope(const Fields& config, const std::string& origin, ModelConfig& cfg) {
  const json* legacy = config.find("rope_scaling");
  const json* current = config.find("rope_parameters");
  if (legacy && !legacy->is_object())
    config.fail("rope_scaling", "expected an object or null, got " + json_value_text(*legacy));
  if (current && !current->is_object())
    config.fail("rope_parameters", "expected an object or null, got " + json_value_text(*current));
  bool use_legacy = legacy && !legacy->empty();
  const json empty = json::object();
  const json& object = use_legacy ? *legacy : current ? *current : empty;
  const std::string name = use_legacy ? "rope_scaling" : "rope_parameters";
  const std::string where = origin + " (" + name + ")";
  Fields fields(object, JsonFieldOptions::with_origin(where));

  if (fields.find("rope_theta")) {
    cfg.rope_theta = positive_float_or(fields, "rope_theta", 0);
    cfg.rope_source = name + ".rope_theta";
  } else if (config.find("rope_theta")) {
    cfg.rope_theta = positive_float_or(config, "rope_theta", 0);
    cfg.rope_source = "rope_theta";
  } else {
    cfg.rope_theta = default_rope_theta(cfg.arch);
    cfg.rope_source = "default theta";
  }

  // Transformers writes "rope_type" since 4.43 and "type" before; either may appear.
  std::optional<std::string> type = fields.string("rope_type");
  if (!type) type = fields.string("type");
  if (!type) type = "default";
  const std::set<std::string> supported = {"default", "linear", "dynamic", "llama3", "yarn"};
  if (!supported.count(*type)) {
    config.fail(name,
                "unsupported rope_type '" + *type + "' (supported: " + kSupportedRopeTypes + ")");
  }
  for (const auto& [key, value] : object.items()) {
    if (value.is_object()) {
      fields.fail(key, "an object: per-layer-type rope parameters are not supported");
    }
    if (!is_known_rope_key(key)) {
      fields.fail(key, "not a rope parameter the engine knows (supported rope types: " +
                           std::string(kSupportedRopeTypes) + ")");
    }
  }
  for (const Fields* reader : {static_cast<const Fields*>(&fields), &config}) {
    auto partial = reader->number("partial_rotary_factor");
    if (partial && *partial != 1.0) {
      reader->fail(
          "partial_rotary_factor",
          "got " + std::to_string(*partial) + ", but partial rotary embeddings are not supported");
    }
  }
  if (*type == "default") return;

  RopeScaling scaling;
  scaling.type = *type;
  if (!fields.find("factor")) fields.fail("factor", "missing (required for " + *type + ")");
  scaling.factor = positive_float_or(fields, "factor", 1);
  if (*type == "llama3" || *type == "yarn") {
    auto top_level = config.integer("original_max_position_embeddings", 1, kMaxInt);
    auto inside = fields.integer("original_max_position_embeddings", 1, kMaxInt);
    scaling.original_max_position_embeddings =
        static_cast<int>(top_level.value_or(inside.value_or(cfg.max_position_embeddings)));
  }
  if (*type == "llama3") {
    for (const char* key : {"low_freq_factor", "high_freq_factor"}) {
      if (!fields.find(key)) fields.fail(key, "missing (required for llama3)");
    }
    scaling.low_freq_factor = positive_float_or(fields, "low_freq_factor", 1);
    scaling.high_freq_factor = positive_float_or(fields, "high_freq_factor", 4);
    if (scaling.high_freq_factor <= scaling.low_freq_factor) {
      fields.fail("high_freq_factor", "got " + std::to_string(scaling.high_freq_factor) +
                                          ", expected a value greater than low_freq_factor (" +
                                          std::to_string(scaling.low_freq_factor) + ")");
    }
  }
  if (*type == "yarn") parse_yarn(fields, scaling);
  cfg.rope_scaling = scaling;
}

// The qwen3_attnres fields (docs/ATTNRES.md §2a/2b/2d). Absent keys take the open-attnres code's
// defaults: mode "block", 8 blocks, gate "bias", no null source.
constexpr std::pair<const char*, AttnResMode> kAttnResModes[] = {
    {"block", AttnResMode::Block},       {"full", AttnResMode::Full},
    {"delta", AttnResMode::Delta},       {"delta_block", AttnResMode::DeltaBlock},
    {"delta_v", AttnResMode::DeltaV},    {"first_layer", AttnResMode::FirstLayer},
    {"pre_gated", AttnResMode::PreGated}};
constexpr std::pair<const char*, AttnResGate> kAttnResGates[] = {
    {"bias", AttnResGate::Bias},
    {"sigmoid_scalar", AttnResGate::SigmoidScalar},
    {"sigmoid_vector", AttnResGate::SigmoidVector},
    {"learnable_alpha", AttnResGate::LearnableAlpha}};

template <class Enum, size_t N>
Enum parse_choice(const Fields& config, const char* key, const std::string& value,
                  const std::pair<const char*, Enum> (&choices)[N]) {
  std::string names;
  for (const auto& [name, e] : choices) {
    if (value == name) return e;
    names += std::string(names.empty() ? "" : ", ") + name;
  }
  config.fail(key, "expected one of " + names + ", got \"" + value + "\"");
}

void parse_attnres(const Fields& config, ModelConfig& cfg) {
  const std::string mode = config.string("attnres_mode").value_or("block");
  cfg.attnres_mode = parse_choice(config, "attnres_mode", mode, kAttnResModes);
  auto blocks = config.integer("attnres_num_blocks", 1, kMaxInt);
  const bool uses_blocks =
      cfg.attnres_mode == AttnResMode::Block || cfg.attnres_mode == AttnResMode::DeltaBlock;
  // More blocks than layers means one layer per block; modes without blocks ignore the field
  // (every layer is its own block, as far as layers_per_block() goes).
  cfg.attnres_num_blocks =
      uses_blocks ? static_cast<int>(std::min<int64_t>(blocks.value_or(8), cfg.num_layers))
                  : cfg.num_layers;
  std::optional<std::string> gate = config.string("attnres_gate_type");
  if (gate) cfg.attnres_gate = parse_choice(config, "attnres_gate_type", *gate, kAttnResGates);
  cfg.attnres_gate_type = gate.value_or("");
  cfg.attnres_use_null_source = config.boolean("attnres_use_null_source").value_or(false);
}

}  // namespace

std::string_view architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::Qwen3AttnRes:
      return "qwen3_attnres";
    case Architecture::Qwen3:
      return "qwen3";
    case Architecture::Qwen2:
      return "qwen2";
    case Architecture::Llama:
      return "llama";
  }
  return "?";
}

std::string_view attnres_mode_name(AttnResMode mode) {
  switch (mode) {
    case AttnResMode::None:
      return "none";
    case AttnResMode::Block:
      return "block";
    case AttnResMode::Full:
      return "full";
    case AttnResMode::Delta:
      return "delta";
    case AttnResMode::DeltaBlock:
      return "delta_block";
    case AttnResMode::DeltaV:
      return "delta_v";
    case AttnResMode::FirstLayer:
      return "first_layer";
    case AttnResMode::PreGated:
      return "pre_gated";
  }
  return "?";
}

std::string_view attnres_gate_name(AttnResGate gate) {
  for (const auto& [name, g] : kAttnResGates) {
    if (g == gate) return name;
  }
  return "?";
}

bool attnres_is_delta(AttnResMode mode) {
  return mode == AttnResMode::Delta || mode == AttnResMode::DeltaBlock ||
         mode == AttnResMode::DeltaV;
}

bool attnres_mode_has_gate(AttnResMode mode) {
  return mode != AttnResMode::None && mode != AttnResMode::FirstLayer &&
         mode != AttnResMode::PreGated;
}

GenerationDefaults GenerationDefaults::from_json(const json& json, const std::string& origin) {
  if (!json.is_object()) throw Error(origin + ": expected a JSON object at the top level");
  Fields fields(json, JsonFieldOptions::with_origin(origin));
  GenerationDefaults gen;
  gen.temperature = optional_float(fields, "temperature", NumberRange::non_negative());
  gen.top_p = optional_float(fields, "top_p", {0, 1, /*lo_open=*/true});
  gen.min_p = optional_float(fields, "min_p", {0, 1});
  gen.repetition_penalty = optional_float(fields, "repetition_penalty", NumberRange::positive());
  // top_k 0 means "disabled" in transformers.
  if (auto k = fields.integer("top_k", 0, kMaxInt)) gen.top_k = static_cast<int>(*k);
  if (auto n = fields.integer("max_new_tokens", 1, kMaxInt)) {
    gen.max_new_tokens = static_cast<int>(*n);
  }
  gen.do_sample = fields.boolean("do_sample");
  gen.eos_token_ids = fields.token_ids("eos_token_id");
  gen.bos_token_id = fields.token_id("bos_token_id");
  gen.pad_token_id = fields.token_id("pad_token_id");
  return gen;
}

ModelConfig ModelConfig::from_json(const json& config, const std::string& origin) {
  if (!config.is_object()) throw Error(origin + ": expected a JSON object at the top level");
  Fields fields(config, JsonFieldOptions::with_origin(origin));
  ModelConfig cfg;
  std::optional<std::string> model_type = fields.string("model_type");
  if (!model_type) {
    fields.fail("model_type", std::string("missing (supported: ") + kSupportedModelTypes + ")");
  }
  cfg.model_type = *model_type;
  cfg.arch = parse_architecture(fields, cfg.model_type);

  cfg.quantization = CheckpointQuantization::from_json(config, origin);
  std::string act = fields.string("hidden_act").value_or("silu");
  if (act != "silu") fields.fail("hidden_act", "expected \"silu\", got \"" + act + "\"");
  if (fields.boolean("use_sliding_window").value_or(false)) {
    fields.fail("use_sliding_window", "true, but sliding-window attention is not supported");
  }
  // Mistral has no use_sliding_window switch: a non-null sliding_window means it is on.
  if (cfg.model_type == "mistral" && fields.find("sliding_window")) {
    fields.fail("sliding_window",
                "got " + config.at("sliding_window").dump() +
                    ", but sliding-window attention is not supported (expected null)");
  }

  cfg.hidden_size = required_positive_int(fields, "hidden_size");
  cfg.intermediate_size = required_positive_int(fields, "intermediate_size");
  cfg.num_layers = required_positive_int(fields, "num_hidden_layers");
  cfg.num_heads = required_positive_int(fields, "num_attention_heads");
  cfg.vocab_size = required_positive_int(fields, "vocab_size");
  cfg.num_kv_heads = positive_int_or(fields, "num_key_value_heads", cfg.num_heads);
  if (cfg.num_heads % cfg.num_kv_heads != 0) {
    fields.fail("num_attention_heads", "got " + std::to_string(cfg.num_heads) +
                                           ", expected a multiple of num_key_value_heads (" +
                                           std::to_string(cfg.num_kv_heads) + ")");
  }
  // Larger than any published model's (256 is the largest seen); it bounds the per-head
  // buffers (RoPE frequencies, attention scratch) a config alone would size. Found by
  // tests/fuzz/config_json_fuzzer: head_dim 1633333346 asked for 3 GB of frequencies.
  constexpr int kMaxHeadDim = 1024;
  if (fields.find("head_dim")) {
    cfg.head_dim = static_cast<int>(*fields.integer("head_dim", 1, kMaxHeadDim));
  } else {
    if (cfg.hidden_size % cfg.num_heads != 0) {
      fields.fail("head_dim", "absent, and hidden_size (" + std::to_string(cfg.hidden_size) +
                                  ") is not a multiple of num_attention_heads (" +
                                  std::to_string(cfg.num_heads) + ")");
    }
    cfg.head_dim = cfg.hidden_size / cfg.num_heads;
    if (cfg.head_dim > kMaxHeadDim) {
      fields.fail("head_dim", "absent, and hidden_size / num_attention_heads gives " +
                                  std::to_string(cfg.head_dim) + ", more than " +
                                  std::to_string(kMaxHeadDim));
    }
  }
  if (cfg.head_dim % 2 != 0) {
    fields.fail("head_dim",
                "got " + std::to_string(cfg.head_dim) +
                    (fields.find("head_dim") ? "" : " (hidden_size / num_attention_heads)") +
                    ", expected an even value for rotary embeddings");
  }
  // Defaults are those of the transformers config classes.
  int default_max_pos = cfg.arch == Architecture::Llama ? 2048 : 32768;
  cfg.max_position_embeddings = positive_int_or(fields, "max_position_embeddings", default_max_pos);
  cfg.rms_norm_eps = positive_float_or(fields, "rms_norm_eps", 1e-6f);
  parse_rope(fields, origin, cfg);
  cfg.tie_word_embeddings = fields.boolean("tie_word_embeddings").value_or(false);

  bool attention_bias = fields.boolean("attention_bias").value_or(false);
  switch (cfg.arch) {
    case Architecture::Qwen2:  // q, k, v always carry a bias; o never does
      cfg.attention_bias = true;
      cfg.o_proj_bias = false;
      break;
    case Architecture::Llama:
    case Architecture::Qwen3:
    case Architecture::Qwen3AttnRes:
      cfg.attention_bias = attention_bias;
      cfg.o_proj_bias = attention_bias;
      break;
  }
  cfg.mlp_bias = cfg.arch == Architecture::Llama && fields.boolean("mlp_bias").value_or(false);
  cfg.qk_norm = cfg.arch == Architecture::Qwen3 || cfg.arch == Architecture::Qwen3AttnRes;
  if (cfg.arch == Architecture::Qwen3AttnRes) parse_attnres(fields, cfg);

  // Transformers 5 writes "dtype", 4.x "torch_dtype"; like transformers 5, dtype wins.
  cfg.torch_dtype = fields.string("dtype").value_or(fields.string("torch_dtype").value_or(""));
  cfg.eos_token_ids = fields.token_ids("eos_token_id");
  cfg.bos_token_id = fields.token_id("bos_token_id");
  return cfg;
}

ModelConfig ModelConfig::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(model_dir)) throw Error(model_dir + ": not a directory");
  std::string config_path = (fs::path(model_dir) / "config.json").string();
  if (!fs::exists(config_path)) throw Error(config_path + ": missing (every model needs one)");
  ModelConfig cfg = from_json(read_json_file(config_path), config_path);
  cfg.model_dir = model_dir;
  std::string gen_path = (fs::path(model_dir) / "generation_config.json").string();
  if (fs::exists(gen_path)) {
    cfg.generation = GenerationDefaults::from_json(read_json_file(gen_path), gen_path);
  }
  return cfg;
}

int ModelConfig::layers_per_block() const {
  if (attnres_num_blocks <= 0) return num_layers;
  return (num_layers + attnres_num_blocks - 1) / attnres_num_blocks;
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  return attnres::rope_inv_freq(head_dim, rope_theta, rope_scaling);
}

float ModelConfig::rope_attention_factor() const {
  return attnres::rope_attention_factor(rope_scaling);
}

std::string ModelConfig::summary() const {
  std::ostringstream s;
  s << model_type;
  if (attnres_mode != AttnResMode::None) {
    s << " (attnres " << attnres_mode_name(attnres_mode);
    // Only block and delta_block group layers into blocks; the other modes ignore the count.
    if (attnres_mode == AttnResMode::Block || attnres_mode == AttnResMode::DeltaBlock) {
      s << ", " << attnres_num_blocks << " blocks of " << layers_per_block() << " layers";
    }
    s << (attnres_gate_type.empty() ? "" : ", gate " + attnres_gate_type)
      << (attnres_use_null_source ? ", null source" : "") << ")";
  }
  s << ": layers=" << num_layers << " hidden=" << hidden_size << " ffn=" << intermediate_size
    << " heads=" << num_heads << "/" << num_kv_heads << "x" << head_dim << " vocab=" << vocab_size
    << " ctx=" << max_position_embeddings << " rope_theta=" << rope_theta << " (" << rope_source
    << ")";
  if (rope_scaling) {
    const RopeScaling& rs = *rope_scaling;
    s << " rope=" << rs.type << " factor=" << rs.factor;
    if (rs.type == "llama3" || rs.type == "yarn") {
      s << " original_ctx=" << rs.original_max_position_embeddings;
    }
    if (rs.type == "llama3")
      s << " low/high_freq=" << rs.low_freq_factor << "/" << rs.high_freq_factor;
    if (rs.type == "yarn") {
      s << " beta=" << rs.beta_fast << "/" << rs.beta_slow
        << " attention_factor=" << rs.attention_factor << (rs.truncate ? "" : " untruncated");
    }
  } else {
    s << " rope=default";
  }
  s << (tie_word_embeddings ? " tied" : " untied");
  if (!torch_dtype.empty()) s << " " << torch_dtype;
  return s.str();
}

}  // namespace attnres
