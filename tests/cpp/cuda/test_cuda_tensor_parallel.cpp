// The NCCL path on one GPU (issue #7: "with the CUDA backend on one GPU, the NCCL path runs
// with TP = 1"): a tensor-parallel group of one CUDA rank whose communicator is NCCL. Every
// collective still runs (all-reduce after o_proj / down_proj, all-gather of the LM head
// slices; with sequence-parallel prefill also the all-gather of each sublayer's input and the
// reduce-scatter of its output), so the logits exercise NCCL end to end. Reference: the CPU
// backend's single-device forward on the same F32 random weights; tolerance 1e-4 relative
// (f32 everywhere; summation order differs). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/model/random_weights.h"
#include "engine/parallel/nccl_communicator.h"
#include "engine/parallel/tensor_parallel_runner.h"
#include "engine/sched/batch_builder.h"
#include "engine/sched/transformer_runner.h"
#include "tests/cpp/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

ModelConfig tp_config() {
  nlohmann::json j = {{"model_type", "qwen3_attnres"},
                      {"hidden_size", 64},
                      {"intermediate_size", 96},
                      {"num_hidden_layers", 4},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 16},
                      {"vocab_size", 101},
                      {"max_position_embeddings", 512},
                      {"rms_norm_eps", 1e-6},
                      {"tie_word_embeddings", true},
                      {"attnres_mode", "block"},
                      {"attnres_num_blocks", 2},
                      {"attnres_gate_type", "bias"}};
  return ModelConfig::from_json(j, "nccl test config");
}

std::vector<float> run(ModelRunner& runner, const std::vector<int32_t>& ids, int prefill) {
  const int block_size = 16;
  BlockManager blocks((static_cast<int>(ids.size()) + block_size - 1) / block_size, block_size);
  SequenceBlocks seq;
  blocks.append(seq, static_cast<int>(ids.size()));
  std::vector<float> all, step;
  for (int done = 0; done < static_cast<int>(ids.size());) {
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

TEST(CudaTensorParallel, NcclGroupOfOneMatchesTheCpuForward) {
  SKIP_WITHOUT_CUDA();
  const ModelConfig config = tp_config();
  const ModelWeights weights = make_random_weights(config, {DType::F32, 21, true});
  std::mt19937 rng(3);
  std::vector<int32_t> ids(70);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % config.vocab_size);
  const int blocks = 5;

  auto cpu = make_cpu_backend(1);
  Transformer reference(config, weights, *cpu);
  TransformerRunner reference_runner(reference, blocks, 16);
  const std::vector<float> want = run(reference_runner, ids, 64);

  for (int sp : {0, 1}) {
    TensorParallelOptions options;
    options.size = 1;
    options.num_kv_blocks = blocks;
    options.sequence_parallel_min_tokens = sp;
    options.make_backend = [](int rank) { return make_cuda_backend(rank); };
    auto group = NcclGroup::create({0});
    options.make_communicator = [group](int rank, Backend& backend) {
      return group->communicator(rank, backend);
    };
    TensorParallelRunner tp(config, weights, options);
    EXPECT_NE(tp.backend_name().find("nccl"), std::string::npos);
    const std::vector<float> got = run(tp, ids, 64);
    ASSERT_EQ(got.size(), want.size());
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i]));
      diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
      scale = std::max(scale, static_cast<double>(std::abs(want[i])));
    }
    EXPECT_LT(diff / scale, 1e-4) << "sequence-parallel " << sp;
    EXPECT_EQ(tp.rank_model(0).last_footprint().sequence_parallel, false);  // last: decode
  }
}

}  // namespace
}  // namespace attnres::test
