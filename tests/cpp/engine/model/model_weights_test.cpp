// ModelWeights: full loads of tiny models for each layout (2a, 2b, 2c; tied and untied;
// qwen2 / llama biases) and one test per weight defect, checking file and tensor names.
#include "engine/model/model_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <cmath>

#include "engine/model/random_weights.h"
#include "tests/cpp/engine/core/vm_flags.h"
#include "tests/cpp/engine/model/plan_test_config.h"
#include "tests/cpp/engine/model/tiny_model.h"

namespace attnres {
namespace {

using test_files::error_of;
using test_files::TempDir;
using test_files::TinyModel;
using test_files::TinyModelOptions;
using ::testing::AllOf;
using ::testing::HasSubstr;

ModelWeights load_dir(const TempDir& dir) {
  ModelConfig cfg = ModelConfig::load(dir.path());
  return ModelWeights::load(cfg, WeightStore::open(dir.path()));
}

std::string load_error(const TinyModel& model) {
  TempDir dir;
  model.write(dir);
  return error_of([&] { load_dir(dir); });
}

TEST(ModelWeights, LoadsVariant2aWithTiedEmbeddingsAndGateBiases) {
  TempDir dir;
  TinyModel model;
  model.write(dir);
  ModelWeights w = load_dir(dir);
  ASSERT_EQ(w.layers.size(), 4u);
  EXPECT_EQ(w.dtype, DType::BF16);
  EXPECT_EQ(w.embed_tokens.shape, (Shape{16, 8}));
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data) << "tied: lm_head is the embedding";
  EXPECT_FALSE(w.final_res) << "no final_res_* tensors: variant 2a";
  const LayerWeights& l1 = w.layers[1];
  EXPECT_EQ(l1.q_proj.shape, (Shape{8, 8}));
  EXPECT_EQ(l1.k_proj.shape, (Shape{4, 8}));
  EXPECT_EQ(l1.o_proj.shape, (Shape{8, 8}));
  EXPECT_EQ(l1.up_proj.shape, (Shape{12, 8}));
  EXPECT_EQ(l1.down_proj.shape, (Shape{8, 12}));
  EXPECT_EQ(l1.q_norm.shape, (Shape{4}));
  EXPECT_FALSE(l1.q_bias.defined());
  EXPECT_FALSE(l1.gate_bias.defined());
  ASSERT_TRUE(l1.attn_res && l1.mlp_res);
  EXPECT_EQ(l1.attn_res->proj.shape, (Shape{1, 8}));
  EXPECT_EQ(l1.attn_res->norm.shape, (Shape{8}));
  EXPECT_EQ(l1.attn_res->bias, 1.5f);   // 0.5 + layer
  EXPECT_EQ(l1.mlp_res->bias, -1.25f);  // -0.25 - layer
  // The view is the file's bytes: compare against what the writer encoded.
  Tensor up = WeightStore::open(dir.path()).get("model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(0, std::memcmp(up.data, l1.up_proj.data, up.nbytes()));
  EXPECT_NE(bf16_to_f32(l1.up_proj.ptr<uint16_t>()[0]), 0.f);
}

TEST(ModelWeights, DetectsVariant2bFromFinalMixWeights) {
  TempDir dir;
  TinyModelOptions o;
  o.final_res = true;
  TinyModel(o).write(dir);
  ModelWeights w = load_dir(dir);
  ASSERT_TRUE(w.final_res);
  EXPECT_EQ(w.final_res->proj.shape, (Shape{1, 8}));
  EXPECT_EQ(w.final_res->bias, 2.0f);
}

TEST(ModelWeights, FinalMixWithFullModeIsAnError) {
  TinyModelOptions o;
  o.final_res = true;
  o.attnres_mode = "full";
  EXPECT_THAT(load_error(TinyModel(o)),
              AllOf(HasSubstr("model.safetensors: tensor model.final_res_"),
                    HasSubstr("requires attnres_mode \"block\""), HasSubstr("\"full\"")));
}

TEST(ModelWeights, PartialFinalMixNamesTheMissingTensor) {
  TinyModelOptions o;
  o.final_res = true;
  TinyModel model(o);
  model.weights.remove("model.final_res_norm.weight");
  EXPECT_THAT(load_error(model),
              HasSubstr("tensor model.final_res_norm.weight is missing (expected shape [8]"));
}

TEST(ModelWeights, UntiedLmHeadIsItsOwnTensor) {
  TempDir dir;
  TinyModelOptions o;
  o.tied = false;
  TinyModel(o).write(dir);
  ModelWeights w = load_dir(dir);
  EXPECT_NE(w.lm_head.data, w.embed_tokens.data);
  EXPECT_EQ(w.lm_head.shape, (Shape{16, 8}));

  TinyModel missing(o);
  missing.weights.remove("lm_head.weight");
  EXPECT_THAT(load_error(missing),
              AllOf(HasSubstr("model.safetensors: tensor lm_head.weight is missing"),
                    HasSubstr("tie_word_embeddings false")));
}

// What uploading the weights takes: every tensor of the file but the scalars the loader folds
// into floats (biases, gate logits), and a tied LM head once.
TEST(ModelWeights, TotalBytesCountsEveryTensorOnceAndTheUntiedHeadToo) {
  for (bool tied : {true, false}) {
    TempDir dir;
    TinyModelOptions o;
    o.tied = tied;
    TinyModel(o).write(dir);
    const WeightStore store = WeightStore::open(dir.path());
    size_t expected = 0;
    for (const std::string& name : store.names()) {
      const Tensor t = store.get(name);
      if (t.numel() > 1) expected += t.nbytes();
    }
    EXPECT_EQ(load_dir(dir).total_bytes(), expected) << (tied ? "tied" : "untied");
  }
}

TEST(ModelWeights, TiedCheckpointMayStillCarryLmHead) {
  TempDir dir;
  TinyModel model;
  model.weights.add("lm_head.weight", "BF16", {16, 8});
  model.write(dir);
  ModelWeights w = load_dir(dir);
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
}

TEST(ModelWeights, Variant2cPlainModelsLoadWithTheirBiases) {
  for (const char* type : {"qwen3", "qwen2", "llama"}) {
    SCOPED_TRACE(type);
    TempDir dir;
    TinyModelOptions o;
    o.model_type = type;
    o.dtype = "F16";
    o.tied = std::string(type) != "llama";
    o.mlp_bias = std::string(type) == "llama";
    o.attention_bias = std::string(type) == "llama";
    TinyModel(o).write(dir);
    ModelWeights w = load_dir(dir);
    EXPECT_EQ(w.dtype, DType::F16);
    EXPECT_FALSE(w.layers[0].attn_res);
    EXPECT_FALSE(w.final_res);
    EXPECT_EQ(w.layers[0].q_norm.defined(), std::string(type) == "qwen3");
    EXPECT_EQ(w.layers[0].q_bias.defined(), std::string(type) != "qwen3");
    EXPECT_EQ(w.layers[0].o_bias.defined(), std::string(type) == "llama");
    EXPECT_EQ(w.layers[0].down_bias.defined(), std::string(type) == "llama");
  }
}

TEST(ModelWeights, F32WeightsWithF64GateBias) {
  TempDir dir;
  TinyModelOptions o;
  o.dtype = "F32";
  TinyModel model(o);
  // Gate biases are 0-dim and may be stored in another float dtype than the matrices.
  model.weights.remove("model.layers.2.attn_res_bias");
  model.weights.add("model.layers.2.attn_res_bias", "F64", {}, {-3.5f});
  model.write(dir);
  ModelWeights w = load_dir(dir);
  EXPECT_EQ(w.dtype, DType::F32);
  EXPECT_EQ(w.layers[2].attn_res->bias, -3.5f);
  EXPECT_EQ(
      w.layers[0].attn_res->proj.ptr<float>()[0],
      WeightStore::open(dir.path()).get("model.layers.0.attn_res_proj.weight").ptr<float>()[0]);
}

TEST(ModelWeights, WrongShapeNamesFileTensorFoundAndExpected) {
  TinyModel model;
  model.weights.remove("model.layers.3.mlp.up_proj.weight");
  model.weights.add("model.layers.3.mlp.up_proj.weight", "BF16", {8, 12});
  EXPECT_THAT(load_error(model),
              HasSubstr("model.safetensors: tensor model.layers.3.mlp.up_proj.weight has shape "
                        "[8,12], expected [12,8]"));
}

TEST(ModelWeights, MissingTensorIsNamed) {
  TinyModel model;
  model.weights.remove("model.layers.2.self_attn.k_norm.weight");
  EXPECT_THAT(load_error(model),
              AllOf(HasSubstr("model.safetensors: tensor model.layers.2.self_attn.k_norm.weight "
                              "is missing (expected shape [4] for this qwen3_attnres config")));
}

TEST(ModelWeights, MissingGateBiasIsNamed) {
  TinyModel model;
  model.weights.remove("model.layers.0.mlp_res_bias");
  EXPECT_THAT(load_error(model), AllOf(HasSubstr("tensor model.layers.0.mlp_res_bias is missing"),
                                       HasSubstr("attnres_gate_type \"bias\"")));
}

TEST(ModelWeights, UnexpectedTensorsAreRejected) {
  TinyModel extra_layer;
  extra_layer.weights.add("model.layers.4.mlp.up_proj.weight", "BF16", {12, 8});
  EXPECT_THAT(
      load_error(extra_layer),
      AllOf(HasSubstr("model.safetensors: unexpected tensor model.layers.4.mlp.up_proj.weight"),
            HasSubstr("num_hidden_layers 4")));

  TinyModel stray_null;  // a null source without attnres_use_null_source
  stray_null.weights.add("model.layers.0.attn_null_source", "BF16", {8});
  EXPECT_THAT(load_error(stray_null),
              AllOf(HasSubstr("unexpected tensor model.layers.0.attn_null_source"),
                    HasSubstr("no attnres_use_null_source true")));

  TinyModelOptions plain;
  plain.model_type = "qwen3";
  TinyModel res_on_plain(plain);
  res_on_plain.weights.add("model.layers.0.attn_res_proj.weight", "BF16", {1, 8});
  EXPECT_THAT(load_error(res_on_plain),
              AllOf(HasSubstr("unexpected tensor model.layers.0.attn_res_proj.weight"),
                    HasSubstr("need model_type qwen3_attnres")));
}

TEST(ModelWeights, RotaryInverseFrequencyBuffersAreIgnored) {
  TempDir dir;
  TinyModel model;
  model.weights.add("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2});
  model.write(dir);
  EXPECT_EQ(load_dir(dir).layers.size(), 4u);
}

TEST(ModelWeights, MixedDtypesAreRejected) {
  TinyModel model;
  model.weights.remove("model.layers.1.self_attn.v_proj.weight");
  model.weights.add("model.layers.1.self_attn.v_proj.weight", "F16", {4, 8});
  EXPECT_THAT(load_error(model),
              HasSubstr("model.safetensors: tensor model.layers.1.self_attn.v_proj.weight has "
                        "dtype F16, but model.embed_tokens.weight is BF16"));
}

TEST(ModelWeights, NonFloatWeightsAreRejected) {
  TinyModel fp8;
  fp8.weights.remove("model.layers.0.mlp.gate_proj.weight");
  fp8.weights.add_raw("model.layers.0.mlp.gate_proj.weight", "F8_E4M3", {12, 8},
                      std::string(96, 'x'));
  EXPECT_THAT(load_error(fp8), HasSubstr("model.safetensors: unsupported dtype F8_E4M3 for tensor "
                                         "model.layers.0.mlp.gate_proj.weight"));
  TinyModel int32;
  int32.weights.remove("model.norm.weight");
  int32.weights.add("model.norm.weight", "I32", {8});
  EXPECT_THAT(load_error(int32), HasSubstr("unsupported dtype I32 for tensor model.norm.weight"));
}

TEST(ModelWeights, VocabMismatchBetweenConfigAndEmbedding) {
  TinyModel model;
  model.config["vocab_size"] = 32;
  EXPECT_THAT(load_error(model),
              HasSubstr("tensor model.embed_tokens.weight has shape [16,8], expected [32,8]"));
}

TEST(ModelWeights, ShardedModelLoadsEndToEnd) {
  TempDir dir;
  TinyModel model;
  test_files::write_json(dir.file("config.json"), model.config);
  // Layers 0-1 plus embeddings in shard 1, the rest in shard 2.
  test_files::SafetensorsWriter one, two;
  test_files::json weight_map;
  for (auto& [name, entry] : model.weights.header().items()) {
    bool first = name.rfind("model.layers.0.", 0) == 0 || name.rfind("model.layers.1.", 0) == 0 ||
                 name == "model.embed_tokens.weight";
    auto begin = entry["data_offsets"][0].get<size_t>(),
         end = entry["data_offsets"][1].get<size_t>();
    (first ? one : two)
        .add_raw(name, entry["dtype"], entry["shape"],
                 model.weights.data().substr(begin, end - begin));
    weight_map[name] =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  one.write(dir.file("model-00001-of-00002.safetensors"));
  two.write(dir.file("model-00002-of-00002.safetensors"));
  test_files::write_json(dir.file("model.safetensors.index.json"), {{"weight_map", weight_map}});
  ModelWeights w = load_dir(dir);
  EXPECT_EQ(w.layers[3].mlp_res->bias, -3.25f);
  WeightStore store = WeightStore::open(dir.path());
  EXPECT_THAT(store.file_of("model.layers.3.mlp.up_proj.weight"), HasSubstr("00002-of"));
  EXPECT_THAT(store.file_of("model.layers.1.mlp.up_proj.weight"), HasSubstr("00001-of"));
}

}  // namespace
}  // namespace attnres

namespace attnres {
namespace {

// docs/ATTNRES.md §2d: a tiny model in `mode` with `gate`, and the tensors the open-attnres code
// writes for it added by hand (d = 8).
TinyModel mode_model(const std::string& mode, const std::string& gate, bool null_source) {
  TinyModel m;
  m.config["attnres_mode"] = mode;
  m.config["attnres_gate_type"] = gate;
  m.config["attnres_use_null_source"] = null_source;
  for (int i = 0; i < 4; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* side : {"attn", "mlp"}) {
      const std::string s = p + side;
      if (gate == "sigmoid_scalar") m.weights.add(s + "_res_gate_logit", "BF16", {}, {0.5f});
      if (gate == "learnable_alpha") m.weights.add(s + "_res_alpha", "BF16", {}, {0.25f});
      if (gate == "sigmoid_vector") {
        m.weights.add(s + "_res_gate_proj.weight", "BF16", {8, 8});
        m.weights.add(s + "_res_gate_proj.bias", "BF16", {8});
      }
      if (null_source) m.weights.add(s + "_null_source", "BF16", {8});
      if (mode == "pre_gated") {
        m.weights.add(s + "_pre_gate.weight", "BF16", {8, 8});
        m.weights.add(s + "_pre_gate.bias", "BF16", {8});
      }
    }
    if (mode == "delta_v") {
      m.weights.add(p + "v_res_proj.weight", "BF16", {1, 8});
      m.weights.add(p + "v_res_norm.weight", "BF16", {8});
    }
  }
  return m;
}

ModelWeights load_model(const TinyModel& model) {
  TempDir dir;
  model.write(dir);
  return load_dir(dir);
}

TEST(ModelWeightsModes, ReadsWhatEachModeAndGateReads) {
  ModelWeights scalar = load_model(mode_model("delta", "sigmoid_scalar", true));
  const AttnResWeights& res = *scalar.layers[1].attn_res;
  ASSERT_TRUE(res.gate_blend);
  EXPECT_NEAR(*res.gate_blend, 1.0f / (1.0f + std::exp(-0.5f)), 1e-6f);  // sigmoid(logit)
  EXPECT_TRUE(res.null_source.defined());
  EXPECT_FALSE(res.bias);  // a delta mix has no bias: the tensor is there but unread

  ModelWeights alpha = load_model(mode_model("block", "learnable_alpha", false));
  EXPECT_EQ(alpha.layers[0].mlp_res->gate_blend, 0.25f);
  EXPECT_TRUE(alpha.layers[0].mlp_res->bias);  // block mixes read it under every gate

  ModelWeights v = load_model(mode_model("delta_v", "sigmoid_vector", false));
  ASSERT_TRUE(v.layers[3].v_res);
  EXPECT_EQ(v.layers[3].v_res->proj.shape, (Shape{1, 8}));
  EXPECT_EQ(v.layers[3].attn_res->gate_proj.shape, (Shape{8, 8}));

  ModelWeights pre = load_model(mode_model("pre_gated", "bias", false));
  EXPECT_EQ(pre.layers[2].mlp_res->pre_gate.shape, (Shape{8, 8}));
}

TEST(ModelWeightsModes, TensorsAModeNeverReadsAreAcceptedAndIgnored) {
  // Null sources outside the delta modes; gate weights under pre_gated and first_layer.
  ModelWeights block = load_model(mode_model("block", "bias", true));
  EXPECT_FALSE(block.layers[0].attn_res->null_source.defined());
  ModelWeights pre = load_model(mode_model("pre_gated", "sigmoid_vector", true));
  EXPECT_FALSE(pre.layers[0].attn_res->gate_proj.defined());
  EXPECT_FALSE(pre.layers[0].attn_res->null_source.defined());
  ModelWeights first = load_model(mode_model("first_layer", "sigmoid_scalar", true));
  EXPECT_FALSE(first.layers[0].attn_res->gate_blend);
}

TEST(ModelWeightsModes, MissingTensorOfTheModeIsNamed) {
  TinyModel gate = mode_model("delta", "sigmoid_scalar", false);
  gate.weights.remove("model.layers.1.mlp_res_gate_logit");
  EXPECT_THAT(load_error(gate),
              AllOf(HasSubstr("tensor model.layers.1.mlp_res_gate_logit is missing"),
                    HasSubstr("attnres_gate_type \"sigmoid_scalar\"")));
  TinyModel v = mode_model("delta_v", "bias", false);
  v.weights.remove("model.layers.2.v_res_norm.weight");
  EXPECT_THAT(load_error(v), HasSubstr("tensor model.layers.2.v_res_norm.weight is missing"));
  TinyModel null = mode_model("delta_block", "bias", true);
  null.weights.remove("model.layers.0.attn_null_source");
  EXPECT_THAT(load_error(null), HasSubstr("tensor model.layers.0.attn_null_source is missing"));
  TinyModel pre = mode_model("pre_gated", "bias", false);
  pre.weights.remove("model.layers.3.attn_pre_gate.bias");
  EXPECT_THAT(load_error(pre), HasSubstr("tensor model.layers.3.attn_pre_gate.bias is missing"));
}

TEST(ModelWeightsModes, TensorOfAnotherModeIsRejected) {
  TinyModel v = mode_model("delta", "bias", false);
  v.weights.add("model.layers.0.v_res_proj.weight", "BF16", {1, 8});
  EXPECT_THAT(load_error(v), AllOf(HasSubstr("unexpected tensor model.layers.0.v_res_proj.weight"),
                                   HasSubstr("only attnres_mode \"delta_v\"")));
  TinyModel pre = mode_model("delta", "bias", false);
  pre.weights.add("model.layers.1.mlp_pre_gate.weight", "BF16", {8, 8});
  EXPECT_THAT(load_error(pre), HasSubstr("only attnres_mode \"pre_gated\" has a pre-gate"));
  TinyModel gate = mode_model("delta", "sigmoid_scalar", false);
  gate.weights.add("model.layers.1.mlp_res_alpha", "BF16", {}, {0.5f});
  EXPECT_THAT(load_error(gate), AllOf(HasSubstr("unexpected tensor model.layers.1.mlp_res_alpha"),
                                      HasSubstr("\"sigmoid_scalar\" has no such gate tensor")));
}

// The built-in models' random weights live in memory marked for huge pages, as a checkpoint's
// mapping is (Safetensors.TheMappingAsksForHugePages): the built-in benchmarks see the
// placement users get.
TEST(RandomWeights, LiveInMemoryThatAsksForHugePages) {
  if (!test_memory::thp_available()) GTEST_SKIP() << "this kernel has no transparent huge pages";
  const ModelWeights w = make_random_weights(test::config(AttnResMode::Block, 2, 1), {});
  for (const Tensor* t :
       {&w.embed_tokens, &w.layers[0].q_proj, &w.layers[1].down_proj, &w.final_norm}) {
    EXPECT_TRUE(test_memory::advised_huge(t->data)) << test_memory::vm_flags_at(t->data);
  }
}

}  // namespace
}  // namespace attnres
