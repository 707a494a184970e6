// Depth-attention weights under tensor parallelism: the TensorParallelRunner's weights of a
// prefill step (rows in any order, one twice) and of a decode step against the single-device
// runner on the same random weights, at P = 2 and 4, with and without sequence-parallel
// prefill (where each rank holds only its slice of the rows and the weights are gathered).
// The depth mix is per token and replicated on every rank, so the only difference is the
// summation order of the all-reduces upstream: 1e-5 absolute on weights in [0, 1].
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/transformer_runner.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres {
namespace {

ModelConfig make_config(const char* mode) { return test::tp_test_config(mode); }

// A 21-token prefill (depth rows out of order, one repeated), then one decode step; returns the
// weights of both steps, concatenated.
std::vector<float> depth_weights_of(ModelRunner& runner, int block_size) {
  std::mt19937_64 rng(3);
  std::vector<int32_t> ids(22);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 301);
  BlockManager blocks(2, block_size);
  SequenceBlocks seq;
  blocks.append(seq, static_cast<int>(ids.size()));
  std::vector<float> all;
  StepResult result;
  StepBatch prefill;
  add_to_batch(prefill.meta, seq, std::span(ids).first(21), block_size);
  prefill.logit_rows = {20};
  prefill.depth_rows = {20, 0, 13, 13, 7};
  runner.execute(prefill, result);
  all = result.depth_weights;
  StepBatch decode;
  add_to_batch(decode.meta, seq, std::span(ids).subspan(21, 1), block_size);
  decode.logit_rows = {0};
  decode.depth_rows = {0};
  runner.execute(decode, result);
  all.insert(all.end(), result.depth_weights.begin(), result.depth_weights.end());
  return all;
}

TensorParallelOptions cpu_options(int P, int sp_min_tokens) {
  return test::cpu_tensor_parallel_options(P, 2, 16, sp_min_tokens);
}

TEST(TensorParallelDepthWeights, MatchTheSingleDevice) {
  for (const char* mode : {"block", "full"}) {
    for (bool final_mix : {false, true}) {
      if (final_mix && std::string(mode) == "full") continue;  // 2b is block mode only
      SCOPED_TRACE(std::string(mode) + (final_mix ? " final mix" : ""));
      const ModelConfig config = make_config(mode);
      const ModelWeights weights = make_random_weights(config, {DType::F32, 17, final_mix});
      auto backend = make_cpu_backend(1);
      Transformer single(config, weights, *backend);
      TransformerRunner single_runner(single, 2, 16);
      const std::vector<float> want = depth_weights_of(single_runner, 16);
      const DepthAttentionLayout layout = single_runner.depth_attention_layout();
      ASSERT_EQ(want.size(), 6u * layout.rows() * layout.cols());
      for (int P : {2, 4}) {
        for (int sp : {0, 8}) {
          TensorParallelRunner tp(config, weights, cpu_options(P, sp));
          EXPECT_EQ(tp.depth_attention_layout().sources, layout.sources);
          const std::vector<float> got = depth_weights_of(tp, 16);
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < want.size(); ++i) {
            if (std::isnan(want[i])) {
              EXPECT_TRUE(std::isnan(got[i])) << "P=" << P << " sp=" << sp << " cell " << i;
            } else {
              EXPECT_NEAR(got[i], want[i], 1e-5) << "P=" << P << " sp=" << sp << " cell " << i;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnres
