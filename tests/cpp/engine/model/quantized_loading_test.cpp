// Quantized weights at load: --quantization (quantize_model_weights), checkpoints written by
// `attnres quantize` (read back zero-copy, validated), and compressed-tensors configs and
// tensors we refuse. Checkpoints are written here by the test's own safetensors writer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/quant_format.h"
#include "engine/model/loaded_model.h"
#include "engine/model/model_weights.h"
#include "engine/model/quantize_weights.h"
#include "engine/model/quantized_checkpoint.h"
#include "engine/model/quantized_tensors.h"
#include "engine/model/weight_store.h"
#include "tests/cpp/engine/model/checkpoint_writer.h"

namespace attnres {
namespace {

using namespace test_files;
using ::testing::HasSubstr;

// A plain qwen3 with widths that are multiples of 32: d = 64, ffn = 96, 2 heads of 32
// (1 kv head), vocab 40, 2 layers, tied.
constexpr int64_t kD = 64, kFfn = 96, kHd = 32, kHeads = 2, kKv = 1, kVocab = 40, kLayers = 2;

json qwen3_config(bool tied = true) {
  return {{"model_type", "qwen3"},
          {"hidden_size", kD},
          {"intermediate_size", kFfn},
          {"num_hidden_layers", kLayers},
          {"num_attention_heads", kHeads},
          {"num_key_value_heads", kKv},
          {"head_dim", kHd},
          {"vocab_size", kVocab},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", tied},
          {"torch_dtype", "bfloat16"}};
}

struct Matrix {
  std::string name;
  Shape shape;
};

std::vector<Matrix> matrices(bool tied = true) {
  std::vector<Matrix> m = {{"model.embed_tokens.weight", {kVocab, kD}}};
  if (!tied) m.push_back({"lm_head.weight", {kVocab, kD}});
  for (int i = 0; i < kLayers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    m.push_back({p + "self_attn.q_proj.weight", {kHeads * kHd, kD}});
    m.push_back({p + "self_attn.k_proj.weight", {kKv * kHd, kD}});
    m.push_back({p + "self_attn.v_proj.weight", {kKv * kHd, kD}});
    m.push_back({p + "self_attn.o_proj.weight", {kD, kHeads * kHd}});
    m.push_back({p + "mlp.gate_proj.weight", {kFfn, kD}});
    m.push_back({p + "mlp.up_proj.weight", {kFfn, kD}});
    m.push_back({p + "mlp.down_proj.weight", {kD, kFfn}});
  }
  return m;
}

// The format the recipe gives the matrix `name` in these kLayers = 2 models: under int4 the
// embedding, the LM head and layer 1's v_proj / down_proj (Q4_K_M's more-bits rule keeps the
// last eighth of the layers) are Q6_B32.
DType format_of(DType recipe, const std::string& name) {
  static_assert(kLayers == 2);
  const bool six = name == "model.embed_tokens.weight" || name == "lm_head.weight" ||
                   name == "model.layers.1.self_attn.v_proj.weight" ||
                   name == "model.layers.1.mlp.down_proj.weight";
  return recipe == DType::Q4_B32 && six ? DType::Q6_B32 : recipe;
}

std::vector<Matrix> gains() {
  std::vector<Matrix> g = {{"model.norm.weight", {kD}}};
  for (int i = 0; i < kLayers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    g.push_back({p + "input_layernorm.weight", {kD}});
    g.push_back({p + "post_attention_layernorm.weight", {kD}});
    g.push_back({p + "self_attn.q_norm.weight", {kHd}});
    g.push_back({p + "self_attn.k_norm.weight", {kHd}});
  }
  return g;
}

// Deterministic weights of varied magnitude per row (so blocks get different scales).
std::vector<float> values_of(const std::string& name, const Shape& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  std::vector<float> v(n);
  const size_t salt = std::hash<std::string>{}(name) % 97;
  for (size_t i = 0; i < n; ++i)
    v[i] = std::sin(0.37f * static_cast<float>(i + salt)) * (1.0f + static_cast<float>(i % 7));
  return v;
}

// The BF16 matrix as the engine holds it, for quantize_matrix.
Tensor bf16_tensor(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::BF16);
  for (size_t i = 0; i < v.size(); ++i) set_element_from_float(t, static_cast<int64_t>(i), v[i]);
  return t;
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data), t.nbytes());
}

void write_float_checkpoint(const TempDir& dir, bool tied = true) {
  write_json(dir.file("config.json"), qwen3_config(tied));
  SafetensorsWriter w;
  for (const Matrix& m : matrices(tied)) w.add(m.name, "BF16", m.shape, values_of(m.name, m.shape));
  for (const Matrix& g : gains()) w.add(g.name, "BF16", g.shape, values_of(g.name, g.shape));
  w.write(dir.file("model.safetensors"));
}

// A checkpoint in our quantized layout, written independently of quantized_checkpoint.cpp:
// U8 [rows, row_bytes] per matrix with {"format", "shape"} metadata, each matrix in the
// format the recipe `format` gives it. `edit` may corrupt it.
template <class Edit>
void write_quantized_checkpoint_by_hand(const TempDir& dir, DType format, Edit edit) {
  json config = qwen3_config();
  config["quantization_config"] = {{"quant_method", "attnres"},
                                   {"format", quant_format_name(format)}};
  SafetensorsWriter w;
  for (const Matrix& m : matrices()) {
    const DType f = format_of(format, m.name);
    const Tensor q = quantize_matrix(bf16_tensor(values_of(m.name, m.shape), m.shape), f);
    const int64_t row_bytes = static_cast<int64_t>(quant_row_bytes(f, m.shape[1]));
    w.add_raw(m.name, "U8", {m.shape[0], row_bytes}, bytes_of(q));
    w.metadata(m.name, json{{"format", quant_format_name(f)}, {"shape", m.shape}}.dump());
  }
  for (const Matrix& g : gains()) w.add(g.name, "BF16", g.shape, values_of(g.name, g.shape));
  edit(config, w);
  write_json(dir.file("config.json"), config);
  w.write(dir.file("model.safetensors"));
}

ModelWeights load_weights(const TempDir& dir) {
  return ModelWeights::load(ModelConfig::load(dir.path()), WeightStore::open(dir.path()));
}

// The matrix of `w` named `name` (the layout of matrices()).
const Tensor& matrix_of(const ModelWeights& w, const std::string& name) {
  if (name == "model.embed_tokens.weight") return w.embed_tokens;
  if (name == "lm_head.weight") return w.lm_head;
  const int layer = std::atoi(name.c_str() + std::strlen("model.layers."));
  const LayerWeights& l = w.layers[layer];
  for (auto [suffix, t] : {std::pair{"q_proj.weight", &l.q_proj},
                           {"k_proj.weight", &l.k_proj},
                           {"v_proj.weight", &l.v_proj},
                           {"o_proj.weight", &l.o_proj},
                           {"gate_proj.weight", &l.gate_proj},
                           {"up_proj.weight", &l.up_proj},
                           {"down_proj.weight", &l.down_proj}}) {
    if (name.ends_with(suffix)) return *t;
  }
  throw std::runtime_error("no matrix " + name);
}

class QuantizeAtLoad : public ::testing::TestWithParam<DType> {};

TEST_P(QuantizeAtLoad, EveryMatrixBecomesQuantizeMatrixOfItsFloatWeights) {
  const DType format = GetParam();
  for (const bool tied : {true, false}) {
    TempDir dir;
    write_float_checkpoint(dir, tied);
    ModelWeights w = load_weights(dir);
    const Tensor norm_before = w.final_norm;
    const QuantizeSummary s = quantize_model_weights(w, format, /*threads=*/3);
    EXPECT_EQ(s.matrices, static_cast<int>(matrices(tied).size()));
    EXPECT_LT(s.bytes_after, s.bytes_before);
    ASSERT_TRUE(w.quant_format.has_value());
    EXPECT_EQ(*w.quant_format, format);
    EXPECT_EQ(w.dtype, DType::BF16);  // what stays float
    double bits = 0, weights = 0;
    for (const Matrix& m : matrices(tied)) {
      const Tensor& t = matrix_of(w, m.name);
      ASSERT_EQ(t.dtype, format_of(format, m.name)) << m.name;
      EXPECT_EQ(t.shape, m.shape) << m.name;
      const Tensor expected =
          quantize_matrix(bf16_tensor(values_of(m.name, m.shape), m.shape), t.dtype);
      EXPECT_EQ(bytes_of(t), bytes_of(expected)) << m.name;
      bits += 8.0 * static_cast<double>(expected.nbytes());
      weights += static_cast<double>(m.shape[0] * m.shape[1]);
    }
    EXPECT_DOUBLE_EQ(s.bits_per_weight, bits / weights);
    // Rows of 64 / 96 weights: the int4 recipe's B32 formats, counted per format.
    const int six = tied ? 3 : 4;
    EXPECT_THAT(s.line(), HasSubstr(format == DType::Q4_B32
                                        ? "to int4 (int4 12, int6 " + std::to_string(six) + "), "
                                        : std::string("to int8, ")));
    // A tied head is the quantized embedding itself, quantized once.
    if (tied) {
      EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
    }
    // Gains stay the mapped bf16 tensors.
    EXPECT_EQ(w.final_norm.data, norm_before.data);
    EXPECT_EQ(w.final_norm.dtype, DType::BF16);
    EXPECT_EQ(w.layers[0].q_norm.dtype, DType::BF16);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizeAtLoad, ::testing::Values(DType::Q8_B32, DType::Q4_B32));

TEST(QuantizationFlag, RefusesWidthsThatAreNotBlocksOf32AndAnotherStoredFormat) {
  ModelConfig cfg = ModelConfig::from_json(qwen3_config(), "config.json");
  EXPECT_FALSE(quantization_for("", cfg).has_value());
  EXPECT_EQ(*quantization_for("int4", cfg), DType::Q4_B32);
  EXPECT_THAT(error_of([&] { quantization_for("int3", cfg); }),
              HasSubstr("--quantization 'int3': expected int8 or int4"));
  json c = qwen3_config();
  c["hidden_size"] = 48;
  cfg = ModelConfig::from_json(c, "config.json");
  EXPECT_THAT(error_of([&] { quantization_for("int8", cfg); }),
              HasSubstr("--quantization int8: hidden_size 48 is not a multiple of 32"));
  c = qwen3_config();
  c["intermediate_size"] = 100;
  cfg = ModelConfig::from_json(c, "config.json");
  EXPECT_THAT(error_of([&] { quantization_for("int4", cfg); }),
              HasSubstr("intermediate_size 100 is not a multiple of 32"));
  c = qwen3_config();
  c["quantization_config"] = {{"quant_method", "attnres"}, {"format", "int8"}};
  cfg = ModelConfig::from_json(c, "config.json");
  EXPECT_EQ(*quantization_for("int8", cfg), DType::Q8_B32);
  EXPECT_THAT(error_of([&] { quantization_for("int4", cfg); }),
              HasSubstr("--quantization int4: the checkpoint is already quantized to int8"));
}

class QuantizedCheckpoint : public ::testing::TestWithParam<DType> {};

TEST_P(QuantizedCheckpoint, LoadsTheStoredRowsWithoutCopying) {
  const DType format = GetParam();
  TempDir dir;
  write_quantized_checkpoint_by_hand(dir, format, [](json&, SafetensorsWriter&) {});
  const WeightStore store = WeightStore::open(dir.path());
  const ModelWeights w = ModelWeights::load(ModelConfig::load(dir.path()), store);
  ASSERT_TRUE(w.quant_format.has_value());
  EXPECT_EQ(*w.quant_format, format);
  for (const Matrix& m : matrices()) {
    const Tensor& t = matrix_of(w, m.name);
    ASSERT_EQ(t.dtype, format_of(format, m.name)) << m.name;
    EXPECT_EQ(t.shape, m.shape);
    EXPECT_EQ(static_cast<const void*>(t.data),
              static_cast<const void*>(store.raw(m.name).data));  // the mapping itself
    EXPECT_EQ(bytes_of(t),
              bytes_of(quantize_matrix(bf16_tensor(values_of(m.name, m.shape), m.shape), t.dtype)));
  }
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedCheckpoint,
                         ::testing::Values(DType::Q8_B32, DType::Q4_B32));

// Byte offset of block `b`'s scale in row `r` of the stored matrix `name` (in `w`'s data).
size_t scale_byte(SafetensorsWriter& w, const std::string& name, DType format, int64_t cols,
                  int64_t r, int64_t b, bool min = false) {
  const size_t begin = w.header()[name]["data_offsets"][0].get<size_t>();
  const size_t at = min ? quant_mins_offset(format, cols) : quant_scales_offset(format, cols);
  return begin + static_cast<size_t>(r) * quant_row_bytes(format, cols) + at + 2 * b;
}

void set_f16(std::string& data, size_t at, uint16_t h) { std::memcpy(&data[at], &h, 2); }

std::string load_error(const TempDir& dir) {
  return error_of([&] { load_weights(dir); });
}

TEST(QuantizedCheckpoint, RefusesCorruptOrMismatchedScales) {
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  {
    TempDir dir;  // a NaN scale
    write_quantized_checkpoint_by_hand(dir, DType::Q8_B32, [&](json&, SafetensorsWriter& w) {
      set_f16(w.data(), scale_byte(w, q, DType::Q8_B32, kD, 3, 1), 0x7e00);
    });
    EXPECT_THAT(load_error(dir), HasSubstr("tensor " + q + ": row 3 block 1 has scale nan"));
  }
  {
    TempDir dir;  // a negative scale
    write_quantized_checkpoint_by_hand(dir, DType::Q4_B32, [&](json&, SafetensorsWriter& w) {
      set_f16(w.data(), scale_byte(w, q, DType::Q4_B32, kD, 0, 0), f32_to_f16(-0.5f));
    });
    EXPECT_THAT(load_error(dir), HasSubstr(q + ": row 0 block 0 has scale -0.5"));
  }
  {
    TempDir dir;  // an infinite min
    write_quantized_checkpoint_by_hand(dir, DType::Q4_B32, [&](json&, SafetensorsWriter& w) {
      set_f16(w.data(), scale_byte(w, q, DType::Q4_B32, kD, 2, 1, true), 0x7c00);
    });
    EXPECT_THAT(load_error(dir), HasSubstr(q + ": row 2 block 1 has a min that is not finite"));
  }
  const std::string embed = "model.embed_tokens.weight";
  {
    TempDir dir;  // a NaN scale in the int4 recipe's int6 embedding
    write_quantized_checkpoint_by_hand(dir, DType::Q4_B32, [&](json&, SafetensorsWriter& w) {
      set_f16(w.data(), scale_byte(w, embed, DType::Q6_B32, kD, 7, 1), 0x7e00);
    });
    EXPECT_THAT(load_error(dir), HasSubstr("tensor " + embed + ": row 7 block 1 has scale nan"));
  }
  {
    TempDir dir;  // an infinite one
    write_quantized_checkpoint_by_hand(dir, DType::Q4_B32, [&](json&, SafetensorsWriter& w) {
      set_f16(w.data(), scale_byte(w, embed, DType::Q6_B32, kD, 39, 0), 0xfc00);
    });
    EXPECT_THAT(load_error(dir), HasSubstr(embed + ": row 39 block 0 has scale -inf"));
  }
}

TEST(QuantizedCheckpoint, RefusesWrongRowBytesShapesAndFormats) {
  const std::string down = "model.layers.0.mlp.down_proj.weight";
  {
    TempDir dir;  // rows of int4 size under an int8 claim
    write_quantized_checkpoint_by_hand(dir, DType::Q8_B32, [&](json&, SafetensorsWriter& w) {
      const Tensor q4 =
          quantize_matrix(bf16_tensor(values_of(down, {kD, kFfn}), {kD, kFfn}), DType::Q4_B32);
      w.remove(down);
      w.add_raw(down, "U8", {kD, static_cast<int64_t>(quant_row_bytes(DType::Q4_B32, kFfn))},
                bytes_of(q4));
    });
    EXPECT_THAT(load_error(dir),
                HasSubstr("tensor " + down + " is stored as [64,60], expected [64,102]"));
  }
  {
    TempDir dir;  // metadata shape disagreeing with the config
    write_quantized_checkpoint_by_hand(dir, DType::Q8_B32, [&](json&, SafetensorsWriter& w) {
      w.metadata(down, json{{"format", "int8"}, {"shape", {kFfn, kD}}}.dump());
    });
    EXPECT_THAT(load_error(dir), HasSubstr(down + " has logical shape [96,64], expected [64,96]"));
  }
  {
    TempDir dir;  // an unknown format in the metadata
    write_quantized_checkpoint_by_hand(dir, DType::Q8_B32, [&](json&, SafetensorsWriter& w) {
      w.metadata(down, json{{"format", "int3"}, {"shape", {kD, kFfn}}}.dump());
    });
    EXPECT_THAT(load_error(dir),
                HasSubstr("__metadata__ format 'int3': expected int8, int6, int4, int6k or int4k"));
  }
  {
    TempDir dir;  // a super-block format on rows that are not a multiple of 256
    write_quantized_checkpoint_by_hand(dir, DType::Q4_B32, [&](json&, SafetensorsWriter& w) {
      w.metadata(down, json{{"format", "int4k"}, {"shape", {kD, kFfn}}}.dump());
    });
    EXPECT_THAT(load_error(dir), HasSubstr(down + " is int4k, whose rows are multiples of 256 "
                                                  "weights; this one has 96"));
  }
  {
    TempDir dir;  // another format than config.json's
    write_quantized_checkpoint_by_hand(dir, DType::Q8_B32, [&](json&, SafetensorsWriter& w) {
      w.metadata(down, json{{"format", "int4"}, {"shape", {kD, kFfn}}}.dump());
    });
    EXPECT_THAT(load_error(dir), HasSubstr(down + " is int4, but config.json's quantization_config "
                                                  "format int8 stores int8 matrices only"));
  }
  const std::string embed = "model.embed_tokens.weight";
  {
    // The int4 recipe reads each matrix in the format its metadata names (int4 or int6), not
    // only the recipe's own choice: a 4-bit embedding and a 6-bit layer-0 down_proj load as
    // stored.
    TempDir dir;
    write_quantized_checkpoint_by_hand(dir, DType::Q4_B32, [&](json&, SafetensorsWriter& w) {
      const Tensor q4 =
          quantize_matrix(bf16_tensor(values_of(embed, {kVocab, kD}), {kVocab, kD}), DType::Q4_B32);
      w.remove(embed);
      w.add_raw(embed, "U8", {kVocab, static_cast<int64_t>(quant_row_bytes(DType::Q4_B32, kD))},
                bytes_of(q4));
      w.metadata(embed, json{{"format", "int4"}, {"shape", {kVocab, kD}}}.dump());
      const Tensor q6 =
          quantize_matrix(bf16_tensor(values_of(down, {kD, kFfn}), {kD, kFfn}), DType::Q6_B32);
      w.remove(down);
      w.add_raw(down, "U8", {kD, static_cast<int64_t>(quant_row_bytes(DType::Q6_B32, kFfn))},
                bytes_of(q6));
      w.metadata(down, json{{"format", "int6"}, {"shape", {kD, kFfn}}}.dump());
    });
    const ModelWeights w = load_weights(dir);
    EXPECT_EQ(matrix_of(w, embed).dtype, DType::Q4_B32);
    EXPECT_EQ(matrix_of(w, down).dtype, DType::Q6_B32);
    const Tensor want =
        quantize_matrix(bf16_tensor(values_of(down, {kD, kFfn}), {kD, kFfn}), DType::Q6_B32);
    EXPECT_EQ(std::memcmp(matrix_of(w, down).data, want.data, want.nbytes()), 0);
  }
  {
    TempDir dir;  // the int4 recipe with an int8 projection
    write_quantized_checkpoint_by_hand(dir, DType::Q4_B32, [&](json&, SafetensorsWriter& w) {
      const Tensor q8 =
          quantize_matrix(bf16_tensor(values_of(down, {kD, kFfn}), {kD, kFfn}), DType::Q8_B32);
      w.remove(down);
      w.add_raw(down, "U8", {kD, static_cast<int64_t>(quant_row_bytes(DType::Q8_B32, kFfn))},
                bytes_of(q8));
      w.metadata(down, json{{"format", "int8"}, {"shape", {kD, kFfn}}}.dump());
    });
    EXPECT_THAT(
        load_error(dir),
        HasSubstr(down + " is int8, but config.json's quantization_config format int4 "
                         "stores int4k, int6k, int4 and int6 matrices only (its own choice for "
                         "this one: int4)"));
  }
  {
    TempDir dir;  // int6 is a tensor format, not a recipe
    write_quantized_checkpoint_by_hand(dir, DType::Q8_B32, [&](json& c, SafetensorsWriter&) {
      c["quantization_config"]["format"] = "int6";
    });
    EXPECT_THAT(load_error(dir),
                HasSubstr("quantization_config.format 'int6': expected int8 or int4"));
  }
  {
    TempDir dir;  // no metadata
    write_quantized_checkpoint_by_hand(dir, DType::Q8_B32, [&](json&, SafetensorsWriter& w) {
      w.header()["__metadata__"].erase(down);
    });
    EXPECT_THAT(load_error(dir), HasSubstr(down + ": no __metadata__ entry names its format"));
  }
  {
    TempDir dir;  // an unknown format in config.json
    write_quantized_checkpoint_by_hand(dir, DType::Q8_B32, [&](json& c, SafetensorsWriter&) {
      c["quantization_config"]["format"] = "q5_k";
    });
    EXPECT_THAT(load_error(dir),
                HasSubstr("quantization_config.format 'q5_k': expected int8 or int4"));
  }
}

TEST(QuantizedCheckpoint, WrittenCheckpointLoadsBackToTheSameTensors) {
  for (const auto& [format, tied] :
       {std::pair{DType::Q8_B32, true}, {DType::Q4_B32, true}, {DType::Q4_B32, false}}) {
    TempDir src, out;
    write_float_checkpoint(src, tied);
    LoadedModel model;
    model.source = src.path();
    model.config = ModelConfig::load(src.path());
    model.weights = ModelWeights::load(model.config, WeightStore::open(src.path()));
    quantize_model_weights(model.weights, format, 2);
    write_quantized_checkpoint(model, out.path());
    const ModelConfig cfg = ModelConfig::load(out.path());
    ASSERT_TRUE(cfg.quantization.has_value());
    EXPECT_EQ(cfg.quantization->format, format);
    const ModelWeights back = ModelWeights::load(cfg, WeightStore::open(out.path()));
    for (const Matrix& m : matrices(tied)) {
      EXPECT_EQ(matrix_of(back, m.name).dtype, format_of(format, m.name)) << m.name;
      EXPECT_EQ(bytes_of(matrix_of(back, m.name)), bytes_of(matrix_of(model.weights, m.name)))
          << m.name;
    }
    EXPECT_EQ(bytes_of(back.final_norm), bytes_of(model.weights.final_norm));
    EXPECT_EQ(bytes_of(back.layers[1].k_norm), bytes_of(model.weights.layers[1].k_norm));
  }
}

// compressed-tensors: the refusals (the conversions themselves are checked against NumPy in
// tests/python/test_quantization.py).
json ct_config(const json& weights, const std::string& format = "pack-quantized") {
  json c = qwen3_config();
  c["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", format},
      {"quantization_status", "compressed"},
      {"ignore", {"lm_head"}},
      {"config_groups",
       {{"group_0",
         {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", nullptr}}}}}};
  return c;
}

json w4(int group = 128) {
  return {{"num_bits", 4},       {"type", "int"},       {"symmetric", true}, {"strategy", "group"},
          {"group_size", group}, {"actorder", nullptr}, {"dynamic", false}};
}

std::string ct_config_error(const json& c) {
  return error_of([&] { ModelConfig::from_json(c, "dir/config.json"); });
}

TEST(CompressedTensorsConfig, ReadsWeightOnlyIntSchemesAndRefusesTheRest) {
  ModelConfig cfg = ModelConfig::from_json(ct_config(w4()), "c");
  ASSERT_TRUE(cfg.quantization.has_value());
  EXPECT_EQ(cfg.quantization->format, DType::Q4_B32);
  EXPECT_EQ(cfg.quantization->scheme.group_size, 128);
  json w8 = {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", "channel"}};
  cfg = ModelConfig::from_json(ct_config(w8, "int-quantized"), "c");
  EXPECT_EQ(cfg.quantization->format, DType::Q8_B32);
  EXPECT_EQ(cfg.quantization->scheme.group_size, 0);

  json w = w4(16);
  EXPECT_THAT(ct_config_error(ct_config(w)), HasSubstr("group_size: 16: only multiples of 32"));
  w = w4();
  w["num_bits"] = 3;
  EXPECT_THAT(ct_config_error(ct_config(w)), HasSubstr("num_bits: 3: only 4 and 8"));
  w = w4();
  w["type"] = "float";
  EXPECT_THAT(ct_config_error(ct_config(w)), HasSubstr("type: \"float\": only integer weights"));
  w = w4();
  w["actorder"] = "group";
  EXPECT_THAT(ct_config_error(ct_config(w)), HasSubstr("actorder: \"group\": activation-ordered"));
  w = w8;
  w["symmetric"] = false;
  EXPECT_THAT(ct_config_error(ct_config(w, "int-quantized")),
              HasSubstr("asymmetric int8 has no exact form"));
  json c = ct_config(w4());
  c["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  EXPECT_THAT(ct_config_error(c), HasSubstr("activation quantization is not supported"));
  EXPECT_THAT(ct_config_error(ct_config(w4(), "float-quantized")),
              HasSubstr("format: \"float-quantized\": compressed-tensors formats read are"));
  c = qwen3_config();
  c["quantization_config"] = {{"quant_method", "awq"}};
  EXPECT_THAT(ct_config_error(c), HasSubstr("\"awq\" is not read"));
}

// A W4A16 pack-quantized checkpoint of the test model; `edit` changes it before writing.
template <class Edit>
void write_ct_w4(const TempDir& dir, Edit edit) {
  json config = ct_config(w4(32));
  SafetensorsWriter w;
  w.add("model.embed_tokens.weight", "BF16", {kVocab, kD});
  for (const Matrix& m : matrices()) {
    if (m.name == "model.embed_tokens.weight") continue;
    const std::string p = m.name.substr(0, m.name.size() - 7);
    const int64_t rows = m.shape[0], cols = m.shape[1];
    std::string packed(static_cast<size_t>(rows * cols / 2), '\0');
    for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<char>(i * 37 % 251);
    w.add_raw(p + ".weight_packed", "I32", {rows, cols / 8}, packed);
    w.add(p + ".weight_scale", "BF16", {rows, cols / 32},
          std::vector<float>(static_cast<size_t>(rows * cols / 32), 0.0625f));
    w.add(p + ".weight_shape", "I32", {2}, {static_cast<float>(rows), static_cast<float>(cols)});
  }
  for (const Matrix& g : gains()) w.add(g.name, "BF16", g.shape);
  edit(config, w);
  write_json(dir.file("config.json"), config);
  w.write(dir.file("model.safetensors"));
}

TEST(CompressedTensorsCheckpoint, ConvertsAndRefusesWhatIsNotExact) {
  {
    TempDir dir;
    write_ct_w4(dir, [](json&, SafetensorsWriter&) {});
    const ModelWeights w = load_weights(dir);
    EXPECT_EQ(w.layers[0].q_proj.dtype, DType::Q4_B32);
    EXPECT_EQ(w.embed_tokens.dtype, DType::BF16);  // not a Linear: stays float
  }
  const std::string p = "model.layers.1.mlp.up_proj";
  {
    TempDir dir;
    write_ct_w4(dir, [&](json&, SafetensorsWriter& w) {
      w.add(p + ".weight_g_idx", "I32", {kD}, std::vector<float>(kD, 0.0f));
    });
    EXPECT_THAT(load_error(dir), HasSubstr(p + ".weight_g_idx: activation-ordered groups"));
  }
  {
    TempDir dir;  // a scale f16 cannot hold exactly (bf16 1e-7 is below f16's normal range)
    write_ct_w4(dir, [&](json&, SafetensorsWriter& w) {
      w.remove(p + ".weight_scale");
      w.add(p + ".weight_scale", "BF16", {kFfn, kD / 32},
            std::vector<float>(static_cast<size_t>(kFfn * kD / 32), 1e-7f));
    });
    EXPECT_THAT(load_error(dir), HasSubstr("is not exactly an f16 value"));
  }
  {
    TempDir dir;
    write_ct_w4(dir, [&](json&, SafetensorsWriter& w) {
      w.remove(p + ".weight_shape");
      w.add(p + ".weight_shape", "I32", {2}, {static_cast<float>(kD), static_cast<float>(kFfn)});
    });
    EXPECT_THAT(load_error(dir), HasSubstr(p + ".weight_shape says the weight is [64,96], "
                                               "expected [96,64]"));
  }
  {
    TempDir dir;  // int8 q = -128 has no exact form in ours
    write_ct_w4(dir, [&](json& c, SafetensorsWriter& w) {
      c = ct_config(
          {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", "channel"}},
          "naive-quantized");
      for (const Matrix& m : matrices()) {
        if (m.name == "model.embed_tokens.weight") continue;
        const std::string q = m.name.substr(0, m.name.size() - 7);
        for (const char* s : {".weight_packed", ".weight_scale", ".weight_shape"}) w.remove(q + s);
        std::string int8(static_cast<size_t>(m.shape[0] * m.shape[1]), '\x05');
        if (q == p) int8[7] = '\x80';
        w.add_raw(q + ".weight", "I8", m.shape, int8);
        w.add(q + ".weight_scale", "F16", {m.shape[0], 1},
              std::vector<float>(static_cast<size_t>(m.shape[0]), 0.125f));
      }
    });
    EXPECT_THAT(load_error(dir), HasSubstr(p + ".weight: row 0 column 7 holds -128"));
  }
}

// The super-block formats' stored f16 scales are checked at load like the blocks' ones.
TEST(QuantizedLoading, CorruptSuperBlockScalesAreRefused) {
  std::vector<float> v(4 * 512);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i)) - 0.1f;
  Tensor w = Tensor::empty({4, 512}, DType::F32);
  std::copy(v.begin(), v.end(), w.ptr<float>());
  struct Case {
    DType format;
    size_t at;  // the f16's byte in row 2
    uint16_t value;
    const char* expected;
  };
  const size_t q4k = quant_scales_offset(DType::Q4_K256, 512);
  const size_t q6k = quant_super_scales_offset(DType::Q6_K256, 512);
  for (const Case& c :
       {Case{DType::Q4_K256, q4k + 16, 0x7e00, "row 2 super-block 1 has scale nan"},
        Case{DType::Q4_K256, q4k, f32_to_f16(-1.0f), "row 2 super-block 0 has scale -1"},
        Case{DType::Q4_K256, q4k + 16 + 2, 0x7c00,
             "row 2 super-block 1 has a min that is not finite"},
        Case{DType::Q6_K256, q6k + 2, 0xfc00, "row 2 super-block 1 has scale -inf"}}) {
    Tensor q = quantize_matrix(w, c.format);
    EXPECT_NO_THROW(validate_quantized_matrix(q, "m"));
    auto* row2 = q.ptr<uint8_t>() + 2 * quant_row_bytes(c.format, 512);
    std::memcpy(row2 + c.at, &c.value, 2);
    EXPECT_THAT(error_of([&] { validate_quantized_matrix(q, "m"); }), HasSubstr(c.expected))
        << dtype_name(c.format);
  }
}

}  // namespace
}  // namespace attnres
