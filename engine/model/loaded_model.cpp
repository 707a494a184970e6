#include "engine/model/loaded_model.h"

#include <cstdlib>
#include <filesystem>

#include "engine/core/error.h"
#include "engine/model/random_weights.h"
#include "engine/model/weight_store.h"

namespace attnres {
namespace fs = std::filesystem;

namespace {

// A chat template for the demo model (GPT-2's tokenizer ships none).
constexpr const char* kDemoChatTemplate =
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";

struct BuiltinShape {
  const char* name;
  nlohmann::json config;
  bool final_mix;
};

// The released open-attnres checkpoints' RoPE: theta 10000, 4096 positions.
nlohmann::json shape_config(const char* model_type, int d, int layers, int heads, int kv_heads,
                            int head_dim, int ffn, int vocab, int blocks, bool tied = true,
                            const char* mode = "block") {
  nlohmann::json c = {{"model_type", model_type},
                      {"hidden_size", d},
                      {"num_hidden_layers", layers},
                      {"num_attention_heads", heads},
                      {"num_key_value_heads", kv_heads},
                      {"head_dim", head_dim},
                      {"intermediate_size", ffn},
                      {"vocab_size", vocab},
                      {"max_position_embeddings", 4096},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"tie_word_embeddings", tied},
                      {"hidden_act", "silu"},
                      {"torch_dtype", "bfloat16"},
                      {"bos_token_id", 50256},
                      {"eos_token_id", 50256}};
  if (blocks > 0) {
    c["attnres_mode"] = mode;
    c["attnres_num_blocks"] = blocks;
    c["attnres_gate_type"] = "bias";
    c["attnres_recency_bias_init"] = 0.0;
  }
  return c;
}

// The demo model: small enough to start in a second on a laptop. Untied, because a random
// tied LM head mostly predicts the input token again. It is no released checkpoint's shape,
// so it keeps Qwen3's long context (40960 positions, theta 1e6): long-prompt tests and
// demos need it.
nlohmann::json demo_config() {
  nlohmann::json c = shape_config("qwen3_attnres", 256, 8, 8, 4, 32, 768, 50257, 4, false);
  c["max_position_embeddings"] = 40960;
  c["rope_theta"] = 1000000.0;
  return c;
}

std::vector<BuiltinShape> builtin_shapes() {
  return {
      {"demo", demo_config(), false},
      {"attnres-100m", shape_config("qwen3_attnres", 512, 12, 8, 4, 64, 1536, 151936, 4), false},
      {"plain-100m", shape_config("qwen3", 512, 12, 8, 4, 64, 1536, 151936, 0), false},
      {"attnres-0.6b", shape_config("qwen3_attnres", 1024, 28, 16, 8, 64, 3072, 151936, 8), false},
      {"plain-0.6b", shape_config("qwen3", 1024, 28, 16, 8, 64, 3072, 151936, 0), false},
      // The open-attnres paper's best 0.6B result is a delta mode (docs/ATTNRES.md §2d).
      {"attnres-delta-100m",
       shape_config("qwen3_attnres", 512, 12, 8, 4, 64, 1536, 151936, 4, true, "delta"), false},
      {"attnres-delta-0.6b",
       shape_config("qwen3_attnres", 1024, 28, 16, 8, 64, 3072, 151936, 8, true, "delta"), false},
  };
}

// "SHAPE@MODE[+GATE]": a built-in AttnRes shape with another attnres_mode (and gate), e.g.
// attnres-100m@delta_v+sigmoid_vector, for comparing every mode at one shape. Every tensor
// the mode reads is drawn by make_random_weights.
void apply_mode_suffix(const std::string& suffix, BuiltinShape& shape) {
  if (shape.config["model_type"] != "qwen3_attnres") {
    throw Error(std::string("built-in model '") + shape.name + "' has no AttnRes to set a mode on");
  }
  const size_t plus = suffix.find('+');
  shape.config["attnres_mode"] = suffix.substr(0, plus);
  if (plus != std::string::npos) shape.config["attnres_gate_type"] = suffix.substr(plus + 1);
}

void load_tokenizer(LoadedModel& model, const std::string& dir) {
  const fs::path tokenizer_json = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(tokenizer_json)) {
    throw Error(dir + ": no tokenizer.json (a Hugging Face tokenizer file is required)");
  }
  model.tokenizer = Tokenizer::load(tokenizer_json.string());
  const fs::path tokenizer_config = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(tokenizer_config)) {
    model.tokenizer_config = TokenizerConfig::load(tokenizer_config.string());
  }
  if (model.tokenizer_config.chat_template) {
    model.chat_template = ChatTemplate::parse(*model.tokenizer_config.chat_template);
  }
}

}  // namespace

Vocabulary LoadedModel::vocabulary() const {
  return Vocabulary::of(config.vocab_size, tokenizer ? tokenizer->vocab_size() : config.vocab_size);
}

std::vector<int32_t> LoadedModel::eos_token_ids() const {
  if (!config.generation.eos_token_ids.empty()) return config.generation.eos_token_ids;
  if (!config.eos_token_ids.empty()) return config.eos_token_ids;
  if (tokenizer && !tokenizer_config.eos_token.empty()) {
    if (auto id = tokenizer->token_to_id(tokenizer_config.eos_token)) return {*id};
  }
  return {};
}

std::string assets_dir() {
  if (const char* env = std::getenv("ATTNRES_ASSETS_DIR")) return env;
  return std::string(ATTNRES_SOURCE_DIR) + "/engine/model/assets";
}

LoadedModel load_model(const std::string& model_dir, const ModelLoadOptions& options) {
  if (!fs::is_directory(model_dir)) throw Error("model directory not found: " + model_dir);
  LoadedModel model;
  model.source = model_dir;
  model.config = ModelConfig::load(model_dir);
  WeightStore store = WeightStore::open(model_dir);
  model.weights = ModelWeights::load(model.config, store);
  if (auto format = quantization_for(options.quantization, model.config)) {
    // The float matrices' mapped pages leave this process's memory once quantized.
    model.quantized = quantize_model_weights(model.weights, *format, options.threads,
                                             [&store](const Tensor& t) { store.release_pages(t); });
  }
  load_tokenizer(model, model_dir);
  if (model.tokenizer->vocab_size() > model.config.vocab_size) {
    throw Error(model_dir + ": tokenizer.json has " +
                std::to_string(model.tokenizer->vocab_size()) +
                " tokens but config.json vocab_size is " + std::to_string(model.config.vocab_size));
  }
  return model;
}

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const BuiltinShape& s : builtin_shapes()) names.push_back(s.name);
  return names;
}

namespace {

// The built-in shape `name` ("attnres-100m", "attnres-100m@delta"), its mode suffix applied.
BuiltinShape find_builtin_shape(const std::string& name) {
  const size_t at = name.find('@');
  const std::string base = name.substr(0, at);
  for (BuiltinShape shape : builtin_shapes()) {
    if (base != shape.name) continue;
    if (at != std::string::npos) apply_mode_suffix(name.substr(at + 1), shape);
    return shape;
  }
  std::string known;
  for (const std::string& n : builtin_model_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown built-in model '" + name + "' (known: " + known + ")");
}

}  // namespace

nlohmann::json builtin_model_config(const std::string& name) {
  return find_builtin_shape(name).config;
}

LoadedModel load_builtin_model(const std::string& name, const ModelLoadOptions& options) {
  const BuiltinShape shape = find_builtin_shape(name);
  LoadedModel model;
  model.source = "built-in:" + name;
  model.config = ModelConfig::from_json(shape.config, model.source);
  model.config.model_dir = model.source;
  model.weights = make_random_weights(model.config, {DType::BF16, /*seed=*/1234, shape.final_mix});
  if (auto format = quantization_for(options.quantization, model.config)) {
    // The arena chunks stay for the gains they also hold: their matrices' pages go.
    model.quantized =
        quantize_model_weights(model.weights, *format, options.threads, drop_resident_pages);
  }
  load_tokenizer(model, assets_dir() + "/gpt2");
  model.tokenizer_config.chat_template = kDemoChatTemplate;
  model.tokenizer_config.eos_token = "<|endoftext|>";
  model.tokenizer_config.bos_token = "<|endoftext|>";
  model.chat_template = ChatTemplate::parse(kDemoChatTemplate);
  return model;
}

LoadedModel load_model_arg(const std::string& arg, const ModelLoadOptions& options) {
  if (arg.empty()) return load_builtin_model("demo", options);
  if (arg.rfind("builtin:", 0) == 0) return load_builtin_model(arg.substr(8), options);
  return load_model(arg, options);
}

}  // namespace attnres
