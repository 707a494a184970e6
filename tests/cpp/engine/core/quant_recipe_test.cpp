// The quantization recipes' choice of format per matrix (engine/core/quant_format.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "engine/core/quant_format.h"

namespace attnres {
namespace {

std::string layer_matrix(int i, const std::string& proj) {
  return "model.layers." + std::to_string(i) + "." + proj + ".weight";
}

// The layers whose attn_v and ffn_down llama-quantize wrote as q6_K in its Q4_K_M file of the
// 28-layer plain-0.6b checkpoint (its log, clients/bench/llama_cpp/make_models.sh).
const std::set<int> kQ4KMSixBitLayersOf28 = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27};

TEST(QuantRecipe, Int4KeepsQ4KMsSixBitMatricesAtSixBits) {
  for (int i = 0; i < 28; ++i) {
    const bool six = kQ4KMSixBitLayersOf28.count(i) > 0;
    for (const char* proj : {"self_attn.v_proj", "mlp.down_proj"}) {
      const std::string name = layer_matrix(i, proj);
      // Rows of 1024 / 3072 weights: the super-block formats; rows of 992: the B32 ones.
      EXPECT_EQ(recipe_matrix_format(DType::Q4_B32, matrix_role(name, 28), 1024),
                six ? DType::Q6_K256 : DType::Q4_K256)
          << name;
      EXPECT_EQ(recipe_matrix_format(DType::Q4_B32, matrix_role(name, 28), 992),
                six ? DType::Q6_B32 : DType::Q4_B32)
          << name;
      EXPECT_EQ(recipe_matrix_format(DType::Q8_B32, matrix_role(name, 28), 1024), DType::Q8_B32);
    }
    for (const char* proj : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj"}) {
      EXPECT_EQ(matrix_role(layer_matrix(i, proj), 28), MatrixRole::Projection);
    }
  }
  for (const char* head : {"model.embed_tokens.weight", "lm_head.weight"}) {
    EXPECT_EQ(recipe_matrix_format(DType::Q4_B32, matrix_role(head, 28), 3072), DType::Q6_K256);
    EXPECT_EQ(recipe_matrix_format(DType::Q4_B32, matrix_role(head, 28), 480), DType::Q6_B32);
    EXPECT_EQ(recipe_matrix_format(DType::Q8_B32, matrix_role(head, 28), 1024), DType::Q8_B32);
  }
}

TEST(QuantRecipe, FormatsListEveryFormatTheRecipeStores) {
  const std::vector<DType> int4 = recipe_formats(DType::Q4_B32);
  for (const MatrixRole role :
       {MatrixRole::Projection, MatrixRole::SensitiveProjection, MatrixRole::EmbeddingOrHead}) {
    for (const int64_t cols : {256, 288, 1024, 3072}) {
      EXPECT_NE(
          std::find(int4.begin(), int4.end(), recipe_matrix_format(DType::Q4_B32, role, cols)),
          int4.end());
    }
  }
  EXPECT_EQ(recipe_formats(DType::Q8_B32), std::vector<DType>{DType::Q8_B32});
}

TEST(QuantRecipe, SmallModelsAndOddNames) {
  // 2 layers: n / 8 = 0, 7 n / 8 = 1, so layer 1 only; 1 layer: 7 n / 8 = 0, so layer 0.
  EXPECT_EQ(matrix_role(layer_matrix(0, "mlp.down_proj"), 2), MatrixRole::Projection);
  EXPECT_EQ(matrix_role(layer_matrix(1, "mlp.down_proj"), 2), MatrixRole::SensitiveProjection);
  EXPECT_EQ(matrix_role(layer_matrix(0, "self_attn.v_proj"), 1), MatrixRole::SensitiveProjection);
  for (const char* name :
       {"model.layers.x.mlp.down_proj.weight", "model.layers..mlp.down_proj.weight",
        "model.layers.1.mlp.down_proj.bias", "layers.1.mlp.down_proj.weight",
        "model.norm.weight"}) {
    EXPECT_EQ(matrix_role(name, 2), MatrixRole::Projection) << name;
  }
}

}  // namespace
}  // namespace attnres
