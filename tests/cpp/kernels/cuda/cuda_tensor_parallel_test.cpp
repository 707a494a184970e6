// The NCCL path on one GPU (issue #7: "with the CUDA backend on one GPU, the NCCL path runs
// with TP = 1"): a tensor-parallel group of one CUDA rank whose communicator is NCCL. Every
// collective still runs (all-reduce after o_proj / down_proj, all-gather of the LM head
// slices; with sequence-parallel prefill also the all-gather of each sublayer's input and the
// reduce-scatter of its output), so the logits exercise NCCL end to end. Reference: the CPU
// backend's single-device forward on the same F32 random weights; tolerance 1e-4 relative
// (f32 everywhere; summation order differs). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/model/random_weights.h"
#include "engine/runner/transformer_runner.h"
#include "kernels/cuda/nccl_communicator.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

TEST(CudaTensorParallel, NcclGroupOfOneMatchesTheCpuForward) {
  SKIP_WITHOUT_CUDA();
  const ModelConfig config = tp_test_config("block");
  const ModelWeights weights = make_random_weights(config, {DType::F32, 21, true});
  const std::vector<int32_t> ids = random_ids(70, config.vocab_size, 3);
  const int blocks = 5;

  auto cpu = make_cpu_backend(1);
  Transformer reference(config, weights, *cpu);
  TransformerRunner reference_runner(reference, blocks, 16);
  const std::vector<float> want = run_prefill_then_decode(reference_runner, ids, 64, 16);

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
    const std::vector<float> got = run_prefill_then_decode(tp, ids, 64, 16);
    ASSERT_EQ(got.size(), want.size());
    for (float v : got) ASSERT_TRUE(std::isfinite(v));
    EXPECT_LT(relative_error(got, want), 1e-4) << "sequence-parallel " << sp;
    EXPECT_EQ(tp.rank_model(0).last_footprint().sequence_parallel, false);  // last: decode
  }
}

}  // namespace
}  // namespace attnres::test
