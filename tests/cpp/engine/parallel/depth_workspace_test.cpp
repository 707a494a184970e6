// The Transformer keeps its depth bank and Phase-1 buffers across forwards (transformer.h,
// DepthWorkspace): a later, smaller step reads a bank that still holds an earlier step's
// values. Every mode must give bit for bit the logits of a fresh model, which fails if any
// step read a bank entry or Phase-1 row it had not written first (delta_block's open entry
// summing into an old value, say).
#include <gtest/gtest.h>

#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/sched/transformer_runner.h"
#include "tests/cpp/engine/parallel/parallel_test_util.h"

namespace attnres {
namespace {

using test::random_ids;
using test::run_prefill_then_decode;

struct Mode {
  const char* name;
  const char* mode;
  const char* gate;
  bool null_source;
  bool final_mix;
};

class DepthWorkspace : public ::testing::TestWithParam<Mode> {};

TEST_P(DepthWorkspace, AStepAfterALargerOneMatchesAFreshModel) {
  const Mode m = GetParam();
  const ModelConfig config = test::tp_test_config(m.mode, m.gate, m.null_source);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 17, m.final_mix});
  const int block_size = 16;
  const std::vector<int32_t> first = random_ids(40, config.vocab_size, 3);
  const std::vector<int32_t> second = random_ids(12, config.vocab_size, 4);

  auto fresh_backend = make_cpu_backend(1);
  Transformer fresh(config, weights, *fresh_backend);
  TransformerRunner fresh_runner(fresh, 1, block_size);
  const std::vector<float> want = run_prefill_then_decode(fresh_runner, second, 9, block_size);

  auto backend = make_cpu_backend(1);
  Transformer reused(config, weights, *backend);
  TransformerRunner earlier(reused, 3, block_size);
  run_prefill_then_decode(earlier, first, 37, block_size);  // fills the kept buffers
  TransformerRunner later(reused, 1, block_size);
  const std::vector<float> got = run_prefill_then_decode(later, second, 9, block_size);
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(
    EveryMode, DepthWorkspace,
    ::testing::Values(Mode{"block", "block", "bias", false, false},
                      Mode{"block_final_mix", "block", "bias", false, true},
                      Mode{"full", "full", "bias", false, false},
                      Mode{"delta", "delta", "bias", true, false},
                      Mode{"delta_block", "delta_block", "sigmoid_scalar", true, false},
                      Mode{"delta_v", "delta_v", "sigmoid_vector", true, false},
                      Mode{"first_layer", "first_layer", "bias", false, false},
                      Mode{"pre_gated", "pre_gated", "bias", false, false}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace attnres
