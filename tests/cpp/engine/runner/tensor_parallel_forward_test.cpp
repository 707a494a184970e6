// The tensor-parallel runner against the single-device runner on the same random weights:
// a prefill step then decode steps, at P = 1, 2, 4, with and without sequence-parallel
// prefill, for the AttnRes variants and a plain model. The logits must agree to f32
// summation-order noise (the only difference is the order of the all-reduce sums), and
// under sequence parallelism each rank's depth bank must be 1/P of the unsharded one.
// (The end-to-end checks against the NumPy reference on checkpoints are
// tests/python/test_tensor_parallel.py.)
#include <gtest/gtest.h>

#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/transformer_runner.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres {
namespace {

using test::cpu_tensor_parallel_options;
using test::random_ids;
using test::relative_error;
using test::run_prefill_then_decode;

struct Variant {
  const char* name;
  const char* mode;  // an attnres_mode, or "" (plain qwen3)
  bool final_mix;
  const char* gate = "bias";
  bool null_source = false;
};

ModelConfig make_config(const Variant& v) {
  return test::tp_test_config(v.mode, v.gate, v.null_source);
}

class TensorParallelForward : public ::testing::TestWithParam<Variant> {};

TEST_P(TensorParallelForward, MatchesTheSingleDeviceForward) {
  const Variant v = GetParam();
  const ModelConfig config = make_config(v);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 11, v.final_mix});
  const int block_size = 16, n = 40, prefill = 33;
  const std::vector<int32_t> ids = random_ids(n, config.vocab_size, 5);
  const int blocks = (n + block_size - 1) / block_size;

  auto backend = make_cpu_backend(1);
  Transformer single(config, weights, *backend);
  TransformerRunner single_runner(single, blocks, block_size);
  const std::vector<float> want = run_prefill_then_decode(single_runner, ids, prefill, block_size);
  ASSERT_EQ(want.size(), static_cast<size_t>(n) * config.vocab_size);

  for (int P : {1, 2, 4}) {
    for (int sp : {0, 1}) {
      TensorParallelRunner tp(config, weights,
                              cpu_tensor_parallel_options(P, blocks, block_size, sp));
      EXPECT_EQ(tp.vocab_size(), config.vocab_size);
      const std::vector<float> got = run_prefill_then_decode(tp, ids, prefill, block_size);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_LT(relative_error(got, want), 1e-5) << "P=" << P << " sequence-parallel=" << sp;
    }
  }
}

class SequenceParallelBank : public ::testing::TestWithParam<Variant> {};

TEST_P(SequenceParallelBank, IsOneOverPPerRank) {
  const Variant v = GetParam();
  const ModelConfig config = make_config(v);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 12, v.final_mix});
  const int block_size = 16, n = 1024;
  const std::vector<int32_t> ids = random_ids(n, config.vocab_size, 6);
  const int blocks = n / block_size;

  auto backend = make_cpu_backend(1);
  Transformer single(config, weights, *backend);
  TransformerRunner single_runner(single, blocks, block_size);
  const std::vector<float> want = run_prefill_then_decode(single_runner, ids, n, block_size);
  const size_t unsharded = single.last_footprint().bank_bytes;
  // bank_capacity entries x n rows x d x 4 bytes.
  EXPECT_EQ(unsharded, static_cast<size_t>(single.plan().bank_capacity) * n * 64 * 4);

  for (int P : {2, 4}) {
    TensorParallelRunner tp(config, weights,
                            cpu_tensor_parallel_options(P, blocks, block_size, 256));
    const std::vector<float> got = run_prefill_then_decode(tp, ids, n, block_size);
    EXPECT_LT(relative_error(got, want), 1e-5) << "P=" << P;
    for (int r = 0; r < P; ++r) {
      const ForwardFootprint& f = tp.rank_model(r).last_footprint();
      EXPECT_TRUE(f.sequence_parallel);
      EXPECT_EQ(f.rows, n);
      EXPECT_EQ(f.local_rows, n / P);
      EXPECT_EQ(f.bank_bytes * P, unsharded) << "rank " << r << " of " << P;
    }
  }
}

TEST(TensorParallelForwardDecode, DecodeStepsUseTheOrdinaryPath) {
  const ModelConfig config = make_config({"block", "block", false});
  const ModelWeights weights = make_random_weights(config, {DType::F32, 13, false});
  TensorParallelRunner tp(config, weights, cpu_tensor_parallel_options(2, 4, 16, 8));
  const std::vector<int32_t> ids = random_ids(12, config.vocab_size, 7);
  run_prefill_then_decode(tp, ids, 10, 16);  // 10-token prefill (sharded), then two decode steps
  const ForwardFootprint& f = tp.rank_model(1).last_footprint();
  EXPECT_FALSE(f.sequence_parallel);
  EXPECT_EQ(f.local_rows, 1);
}

const auto kAttnResVariants =
    ::testing::Values(Variant{"block", "block", false}, Variant{"block_reset", "block", true},
                      Variant{"full", "full", false});
auto variant_name = [](const auto& info) { return std::string(info.param.name); };
INSTANTIATE_TEST_SUITE_P(AttnRes, TensorParallelForward, kAttnResVariants, variant_name);
INSTANTIATE_TEST_SUITE_P(Plain, TensorParallelForward,
                         ::testing::Values(Variant{"plain", "", false}), variant_name);
INSTANTIATE_TEST_SUITE_P(AttnRes, SequenceParallelBank, kAttnResVariants, variant_name);
// docs/ATTNRES.md §2d under tensor and sequence parallelism: the V stream's gathered input, the
// gates and pre-gates computed on each rank's rows, the null source, block deltas.
INSTANTIATE_TEST_SUITE_P(
    Modes, TensorParallelForward,
    ::testing::Values(Variant{"delta_v", "delta_v", false, "sigmoid_vector", true},
                      Variant{"delta_block", "delta_block", false, "sigmoid_scalar", true},
                      Variant{"pre_gated", "pre_gated", false},
                      Variant{"block_reset_alpha", "block", true, "learnable_alpha"}),
    variant_name);

}  // namespace
}  // namespace attnres
