// How a model is split across ranks (engine/runner/tensor_parallel.h): head and KV-head
// assignment with GQA (KV heads replicated when there are fewer than ranks), which slices are
// zero-copy views of the checkpoint's tensors, that row-parallel slices hold exactly the right
// columns, padded LM head slices, biases of row-parallel layers on rank 0 only, and the
// errors for models that cannot be split.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/model/random_weights.h"
#include "engine/runner/tensor_parallel.h"

namespace attnres {
namespace {

ModelConfig config(int heads, int kv_heads, int ffn, int vocab, bool o_bias = false) {
  nlohmann::json j = {{"model_type", "llama"},           {"hidden_size", 32},
                      {"num_hidden_layers", 2},          {"num_attention_heads", heads},
                      {"num_key_value_heads", kv_heads}, {"head_dim", 8},
                      {"intermediate_size", ffn},        {"vocab_size", vocab},
                      {"max_position_embeddings", 64},   {"tie_word_embeddings", true},
                      {"attention_bias", o_bias},        {"mlp_bias", o_bias}};
  return ModelConfig::from_json(j, "test config");
}

float at(const Tensor& t, int64_t row, int64_t col) {
  return element_as_float(t, row * t.dim(1) + col);
}

TEST(TensorParallelShard, SplitsHeadsAndReplicatesKvHeadsWhenFewerThanRanks) {
  const ModelConfig c = config(8, 2, 64, 100);
  for (int r = 0; r < 4; ++r) {
    const TensorParallelShard s = shard_of(c, r, 4);
    EXPECT_EQ(s.num_heads, 2);
    EXPECT_EQ(s.first_head, 2 * r);
    EXPECT_EQ(s.num_kv_heads, 1);
    EXPECT_EQ(s.first_kv_head, r / 2) << "query heads 2r, 2r+1 read KV head r/2";
    EXPECT_EQ(s.intermediate, 16);
    EXPECT_EQ(s.vocab_slice, 25);
  }
  const ModelConfig wide = config(8, 4, 64, 100);
  const TensorParallelShard s = shard_of(wide, 1, 2);
  EXPECT_EQ(s.num_heads, 4);
  EXPECT_EQ(s.num_kv_heads, 2);
  EXPECT_EQ(s.first_kv_head, 2);
}

TEST(TensorParallelShard, UnevenVocabularyIsPadded) {
  const ModelConfig c = config(4, 2, 64, 10);
  const TensorParallelShard last = shard_of(c, 3, 4);
  EXPECT_EQ(last.vocab_slice, 3);
  EXPECT_EQ(last.vocab_begin, 9);
  EXPECT_EQ(last.vocab_end, 10);
  EXPECT_EQ(local_config(c, last).vocab_size, 3);
}

TEST(TensorParallelShard, RejectsModelsThatCannotBeSplit) {
  auto message = [](const ModelConfig& c, int size) {
    try {
      check_tensor_parallel(c, size);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(config(6, 2, 64, 100), 4).find("num_attention_heads 6"), std::string::npos);
  EXPECT_NE(message(config(12, 3, 64, 100), 2).find("num_key_value_heads 3"), std::string::npos);
  EXPECT_NE(message(config(8, 2, 66, 100), 4).find("intermediate_size 66"), std::string::npos);
  EXPECT_NE(message(config(8, 2, 64, 100), 0).find("must be >= 1"), std::string::npos);
  EXPECT_EQ(message(config(6, 3, 66, 100), 1), "");  // one rank takes anything
}

TEST(ShardWeights, ColumnSlicesAreViewsAndRowSlicesHoldTheirColumns) {
  const ModelConfig c = config(4, 2, 64, 10, /*o_bias=*/true);
  const ModelWeights full = make_random_weights(c, {DType::BF16, 3, false});
  const int P = 2;
  for (int r = 0; r < P; ++r) {
    const TensorParallelShard s = shard_of(c, r, P);
    const ModelWeights w = shard_weights(full, c, s);
    const LayerWeights& l = w.layers[1];
    const LayerWeights& f = full.layers[1];
    const int64_t hd = c.head_dim, d = c.hidden_size;
    // Column-parallel: views into the full tensors (no copy).
    EXPECT_EQ(l.q_proj.shape, (Shape{2 * hd, d}));
    EXPECT_EQ(l.q_proj.data, static_cast<char*>(f.q_proj.data) + r * 2 * hd * d * 2);
    EXPECT_EQ(l.k_proj.data, static_cast<char*>(f.k_proj.data) + r * hd * d * 2);
    EXPECT_EQ(l.gate_proj.data, static_cast<char*>(f.gate_proj.data) + r * 32 * d * 2);
    EXPECT_EQ(w.embed_tokens.data, full.embed_tokens.data);
    // Row-parallel: the rank's input columns, exactly.
    EXPECT_EQ(l.o_proj.shape, (Shape{d, 2 * hd}));
    EXPECT_EQ(l.down_proj.shape, (Shape{d, 32}));
    for (int64_t row = 0; row < d; ++row) {
      for (int64_t col = 0; col < 2 * hd; ++col) {
        ASSERT_EQ(at(l.o_proj, row, col), at(f.o_proj, row, r * 2 * hd + col));
      }
      for (int64_t col = 0; col < 32; ++col) {
        ASSERT_EQ(at(l.down_proj, row, col), at(f.down_proj, row, r * 32 + col));
      }
    }
    // Biases after a row-parallel sum are added once: on rank 0.
    EXPECT_EQ(l.o_bias.defined(), r == 0);
    EXPECT_EQ(l.down_bias.defined(), r == 0);
    EXPECT_EQ(l.q_bias.shape, (Shape{2 * hd}));
    EXPECT_EQ(l.up_bias.shape, (Shape{32}));
    // Tied LM head, vocab 10 split in slices of 5: views of the embedding rows.
    EXPECT_EQ(w.lm_head.shape, (Shape{5, d}));
    EXPECT_EQ(w.lm_head.data, static_cast<char*>(full.embed_tokens.data) + r * 5 * d * 2);
  }
}

TEST(ShardWeights, PaddedLmHeadSliceEndsInZeroRows) {
  const ModelConfig c = config(4, 2, 64, 10);
  const ModelWeights full = make_random_weights(c, {DType::F32, 5, false});
  const ModelWeights w = shard_weights(full, c, shard_of(c, 3, 4));  // rows 9 + 2 padding
  ASSERT_EQ(w.lm_head.shape, (Shape{3, 32}));
  for (int64_t col = 0; col < 32; ++col) {
    EXPECT_EQ(at(w.lm_head, 0, col), at(full.lm_head, 9, col));
    EXPECT_EQ(at(w.lm_head, 1, col), 0.0f);
    EXPECT_EQ(at(w.lm_head, 2, col), 0.0f);
  }
}

}  // namespace
}  // namespace attnres
