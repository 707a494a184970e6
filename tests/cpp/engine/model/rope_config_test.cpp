// rope_theta / rope scaling / dtype in both config forms: transformers 4.x (top-level
// rope_theta, rope_scaling, torch_dtype) and transformers 5 (rope_parameters, dtype), for
// each plain architecture, with transformers 5's precedence when both are present, and one
// test per defect checking that the message names the file and the field. The numbers
// themselves are checked against an independent NumPy reference by
// tests/python/test_engine_parity.py; here only the properties each formula promises.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "engine/model/model_config.h"
#include "tests/cpp/engine/model/tiny_model.h"

namespace attnres {
namespace {

using test_files::error_of;
using test_files::json;
using test_files::TinyModel;
using test_files::TinyModelOptions;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kHeadDim = 64;

// A plain config in the 4.x form (rope_theta, torch_dtype) with head_dim 64, so that the
// scaled types have dimensions in each of their regimes.
json config_v4(const std::string& model_type) {
  TinyModelOptions o;
  o.model_type = model_type;
  json c = TinyModel(o).config;
  c["head_dim"] = kHeadDim;
  c["max_position_embeddings"] = 4096;
  return c;
}

// The same model in transformers 5's form: rope_parameters and dtype, nothing top-level.
json config_v5(const std::string& model_type, json rope_parameters) {
  json c = config_v4(model_type);
  c.erase("rope_theta");
  c.erase("torch_dtype");
  c["dtype"] = "bfloat16";
  c["rope_parameters"] = std::move(rope_parameters);
  return c;
}

ModelConfig parse(const json& c) { return ModelConfig::from_json(c, "dir/config.json"); }

std::string config_error(const json& c) {
  return error_of([&] { parse(c); });
}

std::vector<float> unscaled(float theta) {
  std::vector<float> f(kHeadDim / 2);
  for (int i = 0; i < kHeadDim / 2; ++i) f[i] = 1.0f / std::pow(theta, 2.0f * i / kHeadDim);
  return f;
}

class RopeForms : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(PlainArchitectures, RopeForms,
                         ::testing::Values("qwen3", "qwen2", "llama", "mistral"));

TEST_P(RopeForms, DefaultRopeFromEitherForm) {
  json v4 = config_v4(GetParam());
  v4["rope_theta"] = 1000000.0;
  json v5 = config_v5(GetParam(), {{"rope_type", "default"}, {"rope_theta", 1000000.0}});
  for (const json& c : {v4, v5}) {
    ModelConfig cfg = parse(c);
    EXPECT_EQ(cfg.rope_theta, 1e6f);
    EXPECT_FALSE(cfg.rope_scaling);
    EXPECT_EQ(cfg.rope_attention_factor(), 1.0f);
    EXPECT_EQ(cfg.torch_dtype, "bfloat16");
    EXPECT_EQ(cfg.rope_inv_freq(), unscaled(1e6f));
  }
  EXPECT_EQ(parse(v4).rope_source, "rope_theta");
  EXPECT_EQ(parse(v5).rope_source, "rope_parameters.rope_theta");
}

TEST_P(RopeForms, EveryScaledTypeReadsTheSameFromEitherForm) {
  const json cases[] = {
      {{"rope_type", "linear"}, {"factor", 2.0}},
      {{"rope_type", "dynamic"}, {"factor", 4.0}},
      {{"rope_type", "llama3"},
       {"factor", 8.0},
       {"low_freq_factor", 1.0},
       {"high_freq_factor", 4.0},
       {"original_max_position_embeddings", 1024}},
      {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024}},
  };
  for (const json& scaling : cases) {
    json v4 = config_v4(GetParam());
    v4["rope_theta"] = 500000.0;
    v4["rope_scaling"] = scaling;
    json params = scaling;
    params["rope_theta"] = 500000.0;
    ModelConfig a = parse(v4), b = parse(config_v5(GetParam(), params));
    SCOPED_TRACE(scaling.dump());
    ASSERT_TRUE(a.rope_scaling && b.rope_scaling);
    EXPECT_EQ(a.rope_scaling->type, scaling["rope_type"].get<std::string>());
    EXPECT_EQ(b.rope_scaling->type, a.rope_scaling->type);
    EXPECT_EQ(a.rope_theta, 500000.f);
    EXPECT_EQ(b.rope_theta, 500000.f);
    EXPECT_EQ(a.rope_inv_freq(), b.rope_inv_freq());
    EXPECT_EQ(a.rope_attention_factor(), b.rope_attention_factor());
    EXPECT_THAT(b.summary(), AllOf(HasSubstr("rope_theta=500000 (rope_parameters.rope_theta)"),
                                   HasSubstr("rope=" + a.rope_scaling->type)));
  }
}

TEST_P(RopeForms, MissingThetaFallsBackToTheArchitectureDefault) {
  json v4 = config_v4(GetParam());
  v4.erase("rope_theta");
  json v5 = config_v5(GetParam(), {{"rope_type", "default"}});
  for (const json& c : {v4, v5}) {
    ModelConfig cfg = parse(c);
    EXPECT_EQ(cfg.rope_theta, 10000.f);
    EXPECT_EQ(cfg.rope_source, "default theta");
    EXPECT_THAT(cfg.summary(), HasSubstr("rope_theta=10000 (default theta) rope=default"));
  }
}

TEST(RopeConfig, DtypeAndTorchDtype) {
  json c = config_v4("qwen3");
  EXPECT_EQ(parse(c).torch_dtype, "bfloat16");
  c.erase("torch_dtype");
  c["dtype"] = "float32";
  EXPECT_EQ(parse(c).torch_dtype, "float32");
  c["torch_dtype"] = "bfloat16";  // both: transformers 5 keeps dtype
  EXPECT_EQ(parse(c).torch_dtype, "float32");
  EXPECT_THAT(parse(c).summary(), HasSubstr(" float32"));
  c["dtype"] = 32;
  EXPECT_THAT(config_error(c), HasSubstr("dir/config.json: field dtype: expected a string"));
}

// Transformers 5 (convert_rope_params_to_dict): a non-empty rope_scaling replaces
// rope_parameters; theta comes from the chosen object, else the top-level rope_theta.
TEST(RopeConfig, BothFormsPresentFollowTransformers5) {
  json c = config_v5("qwen3", {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1e6}});
  c["rope_theta"] = 5e5;
  ModelConfig cfg = parse(c);
  EXPECT_EQ(cfg.rope_theta, 1e6f);  // rope_parameters' own theta beats the top-level one
  EXPECT_EQ(cfg.rope_scaling->type, "linear");

  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  cfg = parse(c);
  EXPECT_EQ(cfg.rope_scaling->type, "yarn");  // rope_scaling wins
  EXPECT_EQ(cfg.rope_theta, 5e5f);            // and theta is the top-level one
  EXPECT_EQ(cfg.rope_source, "rope_theta");

  c.erase("rope_theta");
  EXPECT_EQ(parse(c).rope_theta, 10000.f);  // rope_parameters' theta went with its object

  c["rope_scaling"] = json::object();  // empty: rope_parameters is used
  EXPECT_EQ(parse(c).rope_scaling->type, "linear");
  c["rope_scaling"] = nullptr;
  EXPECT_EQ(parse(c).rope_scaling->type, "linear");
  c["rope_scaling"] = {{"type", "default"}};  // non-empty, so it wins, and is unscaled
  EXPECT_FALSE(parse(c).rope_scaling);
}

TEST(RopeConfig, OriginalContextDefaultsToMaxPositionsAndTopLevelWins) {
  json c = config_v5("qwen3", {{"rope_type", "yarn"}, {"factor", 4.0}});
  EXPECT_EQ(parse(c).rope_scaling->original_max_position_embeddings, 4096);
  c["rope_parameters"]["original_max_position_embeddings"] = 1024;
  EXPECT_EQ(parse(c).rope_scaling->original_max_position_embeddings, 1024);
  c["original_max_position_embeddings"] = 2048;  // Phi-3 style: transformers prefers it
  EXPECT_EQ(parse(c).rope_scaling->original_max_position_embeddings, 2048);
}

TEST(RopeConfig, LinearDividesEveryFrequency) {
  ModelConfig cfg = parse(config_v5("llama", {{"rope_type", "linear"}, {"factor", 2.0}}));
  std::vector<float> f = cfg.rope_inv_freq(), base = unscaled(10000.f);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], base[i] / 2.0f);
}

// Dynamic NTK only rescales past max_position_embeddings, which the engine never admits.
TEST(RopeConfig, DynamicIsUnscaledWithinTheContext) {
  ModelConfig cfg = parse(config_v5("llama", {{"rope_type", "dynamic"}, {"factor", 4.0}}));
  EXPECT_EQ(cfg.rope_inv_freq(), unscaled(10000.f));
  EXPECT_EQ(cfg.rope_attention_factor(), 1.0f);
}

TEST(RopeConfig, YarnKeepsFastDimensionsAndDividesSlowOnes) {
  // theta 10000, original context 1024, hd 64: the ramp runs from floor(5.66) = 5
  // (beta_fast 32) to ceil(17.7) = 18 (beta_slow 1), inside the 32 dimensions.
  json p = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024}};
  ModelConfig cfg = parse(config_v5("qwen3", p));
  std::vector<float> f = cfg.rope_inv_freq(), base = unscaled(10000.f);
  double low = std::floor(64 * std::log(1024 / (32 * 2 * M_PI)) / (2 * std::log(10000.0)));
  for (int i = 0; i < kHeadDim / 2; ++i) {
    if (i <= low) {
      EXPECT_FLOAT_EQ(f[i], base[i]) << i;  // extrapolated: kept
    } else {
      EXPECT_LT(f[i], base[i]) << i;  // on the ramp: partly divided
    }
  }
  EXPECT_NEAR(cfg.rope_attention_factor(), 0.1 * std::log(4.0) + 1.0, 1e-6);

  p["original_max_position_embeddings"] = 64;  // ramp ends inside: last dims fully divided
  f = parse(config_v5("qwen3", p)).rope_inv_freq();
  EXPECT_FLOAT_EQ(f.back(), base.back() / 4.0f);

  p["truncate"] = false;  // fractional bounds move the ramp
  EXPECT_NE(parse(config_v5("qwen3", p)).rope_inv_freq(), f);
  p["beta_fast"] = 0;  // transformers reads `beta_fast or 32`
  p["beta_slow"] = 0;
  p.erase("truncate");
  EXPECT_EQ(parse(config_v5("qwen3", p)).rope_inv_freq(), f);
}

TEST(RopeConfig, YarnAttentionFactor) {
  json p = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5}};
  EXPECT_EQ(parse(config_v5("qwen3", p)).rope_attention_factor(), 1.5f);
  p.erase("attention_factor");
  p["mscale"] = 1.0;
  p["mscale_all_dim"] = 0.5;  // DeepSeek style: the ratio of two mscales
  double want = (0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1);
  EXPECT_NEAR(parse(config_v5("qwen3", p)).rope_attention_factor(), want, 1e-6);
  p["factor"] = 1.0;  // no scaling, no attention factor
  EXPECT_EQ(parse(config_v5("qwen3", p)).rope_attention_factor(), 1.0f);
  EXPECT_THAT(parse(config_v5("qwen3", p)).summary(), HasSubstr("attention_factor=1"));
}

TEST(RopeConfig, ErrorsNameTheFileAndTheField) {
  json c = config_v5("qwen3", {{"rope_type", "longrope"}, {"factor", 4.0}});
  EXPECT_THAT(config_error(c),
              HasSubstr("dir/config.json: field rope_parameters: unsupported rope_type "
                        "'longrope' (supported: default, linear, dynamic, llama3, yarn)"));
  c = config_v4("llama");
  c["rope_scaling"] = {{"type", "su"}, {"factor", 4.0}};
  EXPECT_THAT(config_error(c), HasSubstr("field rope_scaling: unsupported rope_type 'su'"));

  c = config_v5("qwen3", {{"rope_type", "yarn"}});
  EXPECT_THAT(config_error(c), HasSubstr("dir/config.json (rope_parameters): field factor: "
                                         "missing (required for yarn)"));
  c = config_v5("qwen3", {{"rope_type", "linear"}, {"factor", 0}});
  EXPECT_THAT(config_error(c),
              HasSubstr("(rope_parameters): field factor: got 0, expected a value > 0"));
  c = config_v5("qwen3", {{"rope_type", "default"}, {"rope_theta", "big"}});
  EXPECT_THAT(config_error(c), HasSubstr("(rope_parameters): field rope_theta: expected a number"));
  c = config_v5("qwen3", {{"rope_type", "default"}, {"rope_theta", -1.0}});
  EXPECT_THAT(config_error(c),
              HasSubstr("(rope_parameters): field rope_theta: got -1, expected a value > 0"));
  c = config_v5("qwen3", {{"rope_type", "default"}, {"short_factor", {1.0}}});
  EXPECT_THAT(config_error(c),
              HasSubstr("(rope_parameters): field short_factor: not a rope parameter"));
  c = config_v5("qwen3", {{"full_attention", {{"rope_type", "default"}}}});
  EXPECT_THAT(config_error(c), HasSubstr("field full_attention: an object: per-layer-type"));
  c = config_v5("qwen3", {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}});
  EXPECT_THAT(config_error(c),
              HasSubstr("(rope_parameters): field partial_rotary_factor: got "
                        "0.500000, but partial rotary embeddings are not supported"));
  c = config_v4("qwen3");
  c["partial_rotary_factor"] = 0.25;
  EXPECT_THAT(config_error(c), HasSubstr("dir/config.json: field partial_rotary_factor:"));
  c = config_v4("qwen3");
  c["rope_parameters"] = "yarn";
  EXPECT_THAT(
      config_error(c),
      HasSubstr("field rope_parameters: expected an object or null, got the string \"yarn\""));
  c = config_v5("qwen3", {{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", "yes"}});
  EXPECT_THAT(config_error(c), HasSubstr("field truncate: expected true or false"));
  c = config_v5("qwen3", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}});
  EXPECT_THAT(config_error(c), HasSubstr("field high_freq_factor: missing (required for llama3)"));
}

}  // namespace
}  // namespace attnres
