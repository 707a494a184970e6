// ModelConfig / GenerationDefaults: what each model_type implies, defaults, and one test per
// config defect, each checking that the message names the file and the field.
#include "engine/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "tests/cpp/engine/model/tiny_model.h"

namespace attnres {
namespace {

using test_files::error_of;
using test_files::json;
using test_files::TempDir;
using test_files::TinyModel;
using test_files::TinyModelOptions;
using test_files::write_json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

json tiny_config(const std::string& model_type = "qwen3_attnres") {
  TinyModelOptions o;
  o.model_type = model_type;
  return TinyModel(o).config;
}

std::string config_error(const json& config) {
  return error_of([&] { ModelConfig::from_json(config, "dir/config.json"); });
}

TEST(ModelConfig, ParsesQwen3AttnRes) {
  json c = tiny_config();
  c["eos_token_id"] = {3, 7};
  ModelConfig cfg = ModelConfig::from_json(c, "config.json");
  EXPECT_EQ(cfg.arch, Architecture::Qwen3AttnRes);
  EXPECT_EQ(cfg.hidden_size, 8);
  EXPECT_EQ(cfg.intermediate_size, 12);
  EXPECT_EQ(cfg.num_layers, 4);
  EXPECT_EQ(cfg.num_heads, 2);
  EXPECT_EQ(cfg.num_kv_heads, 1);
  EXPECT_EQ(cfg.head_dim, 4);
  EXPECT_EQ(cfg.vocab_size, 16);
  EXPECT_EQ(cfg.max_position_embeddings, 128);
  EXPECT_FLOAT_EQ(cfg.rms_norm_eps, 1e-6f);
  EXPECT_EQ(cfg.rope_theta, 10000.f);
  EXPECT_FALSE(cfg.rope_scaling);
  EXPECT_TRUE(cfg.tie_word_embeddings);
  EXPECT_TRUE(cfg.qk_norm);
  EXPECT_FALSE(cfg.attention_bias);
  EXPECT_EQ(cfg.attnres_mode, AttnResMode::Block);
  EXPECT_EQ(cfg.attnres_num_blocks, 2);
  EXPECT_EQ(cfg.layers_per_block(), 2);
  EXPECT_EQ(cfg.attnres_gate_type, "bias");
  EXPECT_EQ(cfg.torch_dtype, "bfloat16");
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(3, 7));
  EXPECT_EQ(cfg.bos_token_id, 1);
  EXPECT_THAT(cfg.summary(), HasSubstr("qwen3_attnres (attnres block, 2 blocks of 2 layers"));
}

TEST(ModelConfig, LayersPerBlockRoundsUpAndFullModeIsOnePerLayer) {
  json c = tiny_config();
  c["num_hidden_layers"] = 7;
  c["attnres_num_blocks"] = 3;
  EXPECT_EQ(ModelConfig::from_json(c, "c").layers_per_block(), 3);  // ceil(7/3)
  c["attnres_mode"] = "full";
  c.erase("attnres_num_blocks");
  ModelConfig full = ModelConfig::from_json(c, "c");
  EXPECT_EQ(full.attnres_mode, AttnResMode::Full);
  EXPECT_EQ(full.attnres_num_blocks, 7);
  EXPECT_EQ(full.layers_per_block(), 1);
}

TEST(ModelConfig, DefaultsHeadDimAndKvHeadsAndBiasRulesPerArchitecture) {
  json c = tiny_config("qwen2");
  c.erase("head_dim");
  c.erase("num_key_value_heads");
  c.erase("attention_bias");
  c["eos_token_id"] = 5;
  ModelConfig qwen2 = ModelConfig::from_json(c, "c");
  EXPECT_EQ(qwen2.arch, Architecture::Qwen2);
  EXPECT_EQ(qwen2.head_dim, 4);  // 8 / 2
  EXPECT_EQ(qwen2.num_kv_heads, 2);
  EXPECT_TRUE(qwen2.attention_bias);
  EXPECT_FALSE(qwen2.o_proj_bias);
  EXPECT_FALSE(qwen2.qk_norm);
  EXPECT_EQ(qwen2.attnres_mode, AttnResMode::None);
  EXPECT_THAT(qwen2.eos_token_ids, ElementsAre(5));

  json l = tiny_config("llama");
  l["attention_bias"] = true;
  l["mlp_bias"] = true;
  ModelConfig llama = ModelConfig::from_json(l, "c");
  EXPECT_TRUE(llama.attention_bias);
  EXPECT_TRUE(llama.o_proj_bias);
  EXPECT_TRUE(llama.mlp_bias);
  EXPECT_FALSE(llama.qk_norm);

  json m = tiny_config("mistral");
  m["sliding_window"] = nullptr;
  EXPECT_EQ(ModelConfig::from_json(m, "c").arch, Architecture::Llama);
  EXPECT_TRUE(ModelConfig::from_json(tiny_config("qwen3"), "c").qk_norm);
}

TEST(ModelConfig, RejectsUnsupportedModelType) {
  json c = tiny_config();
  c["model_type"] = "gpt2";
  EXPECT_THAT(config_error(c),
              AllOf(HasSubstr("dir/config.json: field model_type: unsupported model_type 'gpt2'"),
                    HasSubstr("supported: qwen3_attnres, qwen3, qwen2, llama")));
  c.erase("model_type");
  EXPECT_THAT(config_error(c), HasSubstr("dir/config.json: field model_type: missing"));
}

TEST(ModelConfig, RejectsMissingRequiredFields) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size"}) {
    json c = tiny_config();
    c.erase(field);
    EXPECT_THAT(config_error(c),
                HasSubstr("dir/config.json: field " + std::string(field) + ": missing"));
  }
}

TEST(ModelConfig, RejectsWrongTypes) {
  json c = tiny_config();
  c["hidden_size"] = "8";
  EXPECT_THAT(
      config_error(c),
      HasSubstr("dir/config.json: field hidden_size: expected an integer, got the string \"8\""));
  c = tiny_config();
  c["rope_theta"] = "big";
  EXPECT_THAT(config_error(c), HasSubstr("field rope_theta: expected a number"));
  c = tiny_config();
  c["tie_word_embeddings"] = 1;
  EXPECT_THAT(config_error(c), HasSubstr("field tie_word_embeddings: expected true or false"));
  c = tiny_config();
  c["eos_token_id"] = {1, "two"};
  EXPECT_THAT(config_error(c),
              HasSubstr("field eos_token_id[1]: expected a token id, got the string \"two\""));
  c = tiny_config();
  c["head_dim"] = 4.5;
  EXPECT_THAT(config_error(c),
              HasSubstr("field head_dim: expected an integer, got the number 4.5"));
}

TEST(ModelConfig, RejectsNonPositiveSizes) {
  json c = tiny_config();
  c["intermediate_size"] = 0;
  EXPECT_THAT(
      config_error(c),
      HasSubstr(
          "dir/config.json: field intermediate_size: got 0, expected a value in [1, 2147483647]"));
  c = tiny_config();
  c["rms_norm_eps"] = -1e-6;
  EXPECT_THAT(config_error(c), HasSubstr("field rms_norm_eps: got -1e-06, expected a value > 0"));
}

TEST(ModelConfig, RejectsHeadsNotDivisibleByKvHeads) {
  json c = tiny_config();
  c["num_attention_heads"] = 3;
  c["num_key_value_heads"] = 2;
  EXPECT_THAT(config_error(c),
              HasSubstr("dir/config.json: field num_attention_heads: got 3, expected a multiple "
                        "of num_key_value_heads (2)"));
}

TEST(ModelConfig, RejectsOddHeadDim) {
  json c = tiny_config();
  c["head_dim"] = 5;
  EXPECT_THAT(config_error(c),
              HasSubstr("dir/config.json: field head_dim: got 5, expected an even value"));
  c.erase("head_dim");
  c["hidden_size"] = 6;
  c["num_attention_heads"] = 2;  // 6 / 2 = 3
  EXPECT_THAT(config_error(c), HasSubstr("got 3 (hidden_size / num_attention_heads)"));
}

TEST(ModelConfig, RejectsBadAttnResFields) {
  json c = tiny_config();
  c["attnres_mode"] = "sparse";
  EXPECT_THAT(config_error(c),
              HasSubstr("dir/config.json: field attnres_mode: expected one of block, full, delta, "
                        "delta_block, delta_v, first_layer, pre_gated, got \"sparse\""));
  c = tiny_config();
  c["attnres_num_blocks"] = 0;
  EXPECT_THAT(config_error(c),
              HasSubstr("field attnres_num_blocks: got 0, expected a value in [1, "));
  c = tiny_config();
  c["attnres_gate_type"] = "sigmoid";
  EXPECT_THAT(config_error(c),
              HasSubstr("field attnres_gate_type: expected one of bias, sigmoid_scalar, "
                        "sigmoid_vector, learnable_alpha, got \"sigmoid\""));
  c = tiny_config();
  c["attnres_use_null_source"] = "yes";
  EXPECT_THAT(config_error(c), HasSubstr("field attnres_use_null_source: expected true or false"));
}

TEST(ModelConfig, MissingAttnResKeysTakeTheCodesDefaults) {
  json c = tiny_config();
  c.erase("attnres_mode");
  c.erase("attnres_num_blocks");
  c.erase("attnres_gate_type");
  c["num_hidden_layers"] = 16;
  ModelConfig cfg = ModelConfig::from_json(c, "c");
  EXPECT_EQ(cfg.attnres_mode, AttnResMode::Block);
  EXPECT_EQ(cfg.attnres_num_blocks, 8);
  EXPECT_EQ(cfg.layers_per_block(), 2);
  EXPECT_EQ(cfg.attnres_gate, AttnResGate::Bias);
  EXPECT_EQ(cfg.attnres_gate_type, "");
  EXPECT_FALSE(cfg.attnres_use_null_source);
  c["attnres_num_blocks"] = 40;  // more blocks than layers: one layer per block
  EXPECT_EQ(ModelConfig::from_json(c, "c").layers_per_block(), 1);
}

TEST(ModelConfig, ReadsEveryModeGateAndNullSource) {
  json c = tiny_config();
  c["attnres_mode"] = "delta_v";
  c["attnres_gate_type"] = "sigmoid_vector";
  c["attnres_use_null_source"] = true;
  ModelConfig cfg = ModelConfig::from_json(c, "c");
  EXPECT_EQ(cfg.attnres_mode, AttnResMode::DeltaV);
  EXPECT_EQ(cfg.attnres_gate, AttnResGate::SigmoidVector);
  EXPECT_TRUE(cfg.attnres_use_null_source);
  EXPECT_EQ(cfg.attnres_num_blocks, cfg.num_layers);  // delta ignores attnres_num_blocks
  EXPECT_THAT(cfg.summary(), HasSubstr("attnres delta_v"));
  EXPECT_THAT(cfg.summary(), HasSubstr("gate sigmoid_vector, null source"));
  for (const char* mode : {"delta", "delta_block", "first_layer", "pre_gated", "full", "block"}) {
    c["attnres_mode"] = mode;
    EXPECT_EQ(attnres_mode_name(ModelConfig::from_json(c, "c").attnres_mode), mode);
  }
  for (const char* gate : {"bias", "sigmoid_scalar", "learnable_alpha"}) {
    c["attnres_gate_type"] = gate;
    EXPECT_EQ(attnres_gate_name(ModelConfig::from_json(c, "c").attnres_gate), gate);
  }
}

TEST(ModelConfig, RopeScaling) {
  json c = tiny_config("llama");
  c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  EXPECT_THAT(config_error(c),
              HasSubstr("dir/config.json: field rope_scaling: unsupported rope_type 'longrope'"));
  c["rope_scaling"] = {{"type", "default"}};
  EXPECT_FALSE(ModelConfig::from_json(c, "c").rope_scaling);
  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_THAT(config_error(c), HasSubstr("(rope_scaling): field low_freq_factor: missing"));

  // Llama 3.2's values: base 500000, head_dim 64 here.
  c["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 32.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  c["rope_theta"] = 500000.0;
  c["head_dim"] = 64;
  ModelConfig cfg = ModelConfig::from_json(c, "c");
  ASSERT_TRUE(cfg.rope_scaling);
  EXPECT_EQ(cfg.rope_scaling->factor, 32.f);
  std::vector<float> f = cfg.rope_inv_freq();
  ASSERT_EQ(f.size(), 32u);
  EXPECT_FLOAT_EQ(f[0], 1.f);  // short wavelengths are kept
  float base_last = 1.f / std::pow(500000.f, 62.f / 64.f);
  EXPECT_FLOAT_EQ(f[31], base_last / 32.f);                // long wavelengths slowed by factor
  for (int i = 1; i < 32; ++i) EXPECT_LT(f[i], f[i - 1]);  // the ramp keeps them ordered

  c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  std::vector<float> lin = ModelConfig::from_json(c, "c").rope_inv_freq();
  EXPECT_FLOAT_EQ(lin[0], 0.5f);
}

TEST(ModelConfig, RejectsSlidingWindowAndOtherActivations) {
  json c = tiny_config("qwen2");
  c["use_sliding_window"] = true;
  EXPECT_THAT(config_error(c),
              HasSubstr("dir/config.json: field use_sliding_window: true, but sliding-window"));
  c = tiny_config("mistral");
  c["sliding_window"] = 4096;
  EXPECT_THAT(config_error(c), HasSubstr("field sliding_window: got 4096, but sliding-window"));
  c = tiny_config();
  c["hidden_act"] = "gelu";
  EXPECT_THAT(config_error(c),
              HasSubstr("dir/config.json: field hidden_act: expected \"silu\", got \"gelu\""));
  c = tiny_config();
  c["quantization_config"] = {{"quant_method", "gptq"}};
  EXPECT_THAT(config_error(c),
              HasSubstr("dir/config.json: quantization_config.quant_method: \"gptq\" is not read"));
}

TEST(ModelConfig, LoadsGenerationConfigFromTheDirectory) {
  TempDir dir;
  write_json(dir.file("config.json"), tiny_config());
  write_json(dir.file("generation_config.json"), {{"temperature", 0.6},
                                                  {"top_p", 0.95},
                                                  {"top_k", 20},
                                                  {"do_sample", true},
                                                  {"eos_token_id", {3, 4}},
                                                  {"pad_token_id", 0},
                                                  {"bos_token_id", nullptr},
                                                  {"transformers_version", "4.51.0"}});
  ModelConfig cfg = ModelConfig::load(dir.path());
  EXPECT_EQ(cfg.model_dir, dir.path());
  EXPECT_FLOAT_EQ(*cfg.generation.temperature, 0.6f);
  EXPECT_FLOAT_EQ(*cfg.generation.top_p, 0.95f);
  EXPECT_EQ(cfg.generation.top_k, 20);
  EXPECT_EQ(cfg.generation.do_sample, true);
  EXPECT_THAT(cfg.generation.eos_token_ids, ElementsAre(3, 4));
  EXPECT_EQ(cfg.generation.pad_token_id, 0);
  EXPECT_FALSE(cfg.generation.bos_token_id);
  EXPECT_FALSE(cfg.generation.min_p);
  EXPECT_FALSE(cfg.generation.repetition_penalty);
  EXPECT_FALSE(cfg.generation.max_new_tokens);
}

TEST(ModelConfig, GenerationConfigIsOptionalButValidated) {
  TempDir dir;
  write_json(dir.file("config.json"), tiny_config());
  EXPECT_FALSE(ModelConfig::load(dir.path()).generation.temperature);
  write_json(dir.file("generation_config.json"), {{"temperature", "hot"}});
  EXPECT_THAT(
      error_of([&] { ModelConfig::load(dir.path()); }),
      HasSubstr(
          "generation_config.json: field temperature: expected a number, got the string \"hot\""));
  write_json(dir.file("generation_config.json"), {{"top_p", 1.5}});
  EXPECT_THAT(
      error_of([&] { ModelConfig::load(dir.path()); }),
      HasSubstr("generation_config.json: field top_p: got 1.5, expected a value in (0, 1]"));
}

// Found by tests/fuzz/config_json_fuzzer: a huge head_dim sized gigabytes of RoPE frequencies.
TEST(ModelConfig, AbsurdHeadDimIsAnErrorNamingTheField) {
  TempDir dir;
  test_files::write_bytes(dir.file("config.json"),
                          R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 2, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "head_dim": 1633333346,
                              "vocab_size": 512})");
  EXPECT_THAT(error_of([&] { ModelConfig::load(dir.path()); }),
              AllOf(HasSubstr("field head_dim: got 1633333346, expected a value in [1, 1024]")));
}

TEST(ModelConfig, LoadErrorsNameTheFile) {
  TempDir dir;
  EXPECT_THAT(error_of([&] { ModelConfig::load(dir.path()); }),
              HasSubstr(dir.file("config.json") + ": missing"));
  test_files::write_bytes(dir.file("config.json"), "{ not json");
  EXPECT_THAT(error_of([&] { ModelConfig::load(dir.path()); }),
              AllOf(HasSubstr(dir.file("config.json")), HasSubstr("not valid JSON")));
  // A number past a double's range is nlohmann's out_of_range, not a parse error.
  test_files::write_bytes(dir.file("config.json"), "{\"rope_theta\": 1e99999}");
  EXPECT_THAT(error_of([&] { ModelConfig::load(dir.path()); }),
              AllOf(HasSubstr(dir.file("config.json")), HasSubstr("number overflow")));
}

// The published config.json / generation_config.json of real models, from ../shared when
// the checkout has it beside the repository.
std::string published(const std::string& model) {
  return std::string(ATTNRES_SOURCE_DIR) + "/../shared/data/tokenizers/" + model;
}

TEST(ModelConfig, LoadsPublishedConfigs) {
  if (!std::filesystem::exists(published("qwen3") + "/config.json")) {
    GTEST_SKIP() << "../shared/data/tokenizers not present";
  }
  ModelConfig qwen3 = ModelConfig::load(published("qwen3"));
  EXPECT_EQ(qwen3.arch, Architecture::Qwen3);
  EXPECT_EQ(qwen3.head_dim, 128);
  EXPECT_EQ(qwen3.num_layers, 28);
  EXPECT_EQ(qwen3.rope_theta, 1e6f);
  EXPECT_TRUE(qwen3.tie_word_embeddings);
  EXPECT_THAT(qwen3.eos_token_ids, ElementsAre(151645));
  EXPECT_TRUE(qwen3.generation.temperature.has_value());

  ModelConfig llama = ModelConfig::load(published("llama3.2"));
  EXPECT_EQ(llama.arch, Architecture::Llama);
  ASSERT_TRUE(llama.rope_scaling);
  EXPECT_EQ(llama.rope_scaling->type, "llama3");
  EXPECT_EQ(llama.rope_scaling->factor, 32.f);
  EXPECT_THAT(llama.eos_token_ids, ElementsAre(128001, 128008, 128009));

  ModelConfig tinyllama = ModelConfig::load(published("tinyllama"));
  EXPECT_EQ(tinyllama.head_dim, 64);  // 2048 / 32, no head_dim field
  EXPECT_FALSE(tinyllama.tie_word_embeddings);

  EXPECT_THAT(
      error_of([] { ModelConfig::load(published("gpt2")); }),
      AllOf(HasSubstr("gpt2/config.json: field model_type: unsupported model_type 'gpt2'")));
}

}  // namespace
}  // namespace attnres
