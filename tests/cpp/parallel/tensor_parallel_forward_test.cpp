// The tensor-parallel runner against the single-device runner on the same random weights:
// a prefill step then decode steps, at P = 1, 2, 4, with and without sequence-parallel
// prefill, for the AttnRes variants and a plain model. The logits must agree to f32
// summation-order noise (the only difference is the order of the all-reduce sums), and
// under sequence parallelism each rank's depth bank must be 1/P of the unsharded one.
// (The end-to-end checks against the NumPy reference on checkpoints are
// tests/python/test_tensor_parallel.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/parallel/in_process_communicator.h"
#include "engine/parallel/tensor_parallel_runner.h"
#include "engine/sched/batch_builder.h"
#include "engine/sched/transformer_runner.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnres {
namespace {

struct Variant {
  const char* name;
  const char* mode;  // "block", "full", or "" (plain qwen3)
  bool final_mix;
};

ModelConfig make_config(const Variant& v) {
  nlohmann::json j = {{"model_type", *v.mode ? "qwen3_attnres" : "qwen3"},
                      {"hidden_size", 64},
                      {"num_hidden_layers", 4},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 16},
                      {"intermediate_size", 96},
                      {"vocab_size", 301},  // uneven: padded slices at P = 2 and 4
                      {"max_position_embeddings", 4096},
                      {"tie_word_embeddings", true},
                      {"rms_norm_eps", 1e-6}};
  if (*v.mode) {
    j["attnres_mode"] = v.mode;
    j["attnres_num_blocks"] = 2;
    j["attnres_gate_type"] = "bias";
  }
  return ModelConfig::from_json(j, std::string("test config ") + v.name);
}

std::vector<int32_t> random_ids(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

// Prefill `prefill` tokens (logits of every position), then one decode step per remaining
// token; returns all logits rows.
std::vector<float> run(ModelRunner& runner, const std::vector<int32_t>& ids, int prefill,
                       int block_size) {
  BlockManager blocks((static_cast<int>(ids.size()) + block_size - 1) / block_size, block_size);
  SequenceBlocks seq;
  blocks.append(seq, static_cast<int>(ids.size()));
  std::vector<float> all, step;
  int done = 0;
  while (done < static_cast<int>(ids.size())) {
    const int count = done == 0 ? prefill : 1;
    BatchMeta batch;
    add_to_batch(batch, seq, std::span(ids).subspan(done, count), block_size);
    std::vector<int32_t> rows(count);
    for (int i = 0; i < count; ++i) rows[i] = i;
    runner.execute(batch, rows, step);
    all.insert(all.end(), step.begin(), step.end());
    done += count;
  }
  return all;
}

TensorParallelOptions cpu_options(int P, int blocks, int block_size, int sp_min_tokens) {
  TensorParallelOptions o;
  o.size = P;
  o.num_kv_blocks = blocks;
  o.block_size = block_size;
  o.sequence_parallel_min_tokens = sp_min_tokens;
  o.make_backend = [](int) { return make_cpu_backend(1); };
  auto group = InProcessGroup::create(P);
  o.make_communicator = [group](int rank, Backend&) { return group->communicator(rank); };
  return o;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  return diff / scale;
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
  const std::vector<float> want = run(single_runner, ids, prefill, block_size);
  ASSERT_EQ(want.size(), static_cast<size_t>(n) * config.vocab_size);

  for (int P : {1, 2, 4}) {
    for (int sp : {0, 1}) {
      TensorParallelRunner tp(config, weights, cpu_options(P, blocks, block_size, sp));
      EXPECT_EQ(tp.vocab_size(), config.vocab_size);
      const std::vector<float> got = run(tp, ids, prefill, block_size);
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
  const std::vector<float> want = run(single_runner, ids, n, block_size);
  const size_t unsharded = single.last_footprint().bank_bytes;
  // bank_capacity entries x n rows x d x 4 bytes.
  EXPECT_EQ(unsharded, static_cast<size_t>(single.plan().bank_capacity) * n * 64 * 4);

  for (int P : {2, 4}) {
    TensorParallelRunner tp(config, weights, cpu_options(P, blocks, block_size, 256));
    const std::vector<float> got = run(tp, ids, n, block_size);
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
  TensorParallelRunner tp(config, weights, cpu_options(2, 4, 16, 8));
  const std::vector<int32_t> ids = random_ids(12, config.vocab_size, 7);
  run(tp, ids, 10, 16);  // 10-token prefill (sharded), then two decode steps
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

}  // namespace
}  // namespace attnres
