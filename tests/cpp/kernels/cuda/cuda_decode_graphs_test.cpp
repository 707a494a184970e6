// Decode steps replayed as real CUDA graphs through the runner (engine/runner/decode_graphs.h):
// the same schedule as tests/cpp/engine/runner/decode_graphs_test.cpp (batches of 1..9
// sequences moving between buckets, contexts crossing block boundaries, prefill steps between),
// so graphs are replayed with changing batches. Each step's logits against the same CUDA model
// run eagerly (--enforce-eager) and against the CPU backend. Needs a GPU (skips without one).
// Tolerances: graph vs eager 1e-5 relative L2 (f32 weights; up to 8 rows the GEMV sums each
// row in one order whatever the batch, so the two should agree to the bit, and the test
// prints whether they did); vs the CPU 1e-4 (cuda_model_test.cpp's f32 bound).
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/transformer_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/cpp/engine/runner/decode_graphs_test_util.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

Tensor host_logits(const StepResult& r, int vocab) {
  Tensor t = Tensor::empty({static_cast<int64_t>(r.logits.size()) / vocab, vocab}, DType::F32);
  std::copy(r.logits.begin(), r.logits.end(), t.ptr<float>());
  return t;
}

class CudaDecodeGraphs : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaDecodeGraphs, ReplaysWithChangingBatchesMatchEagerAndTheCpu) {
  SKIP_WITHOUT_CUDA();
  const ModelConfig config = small_config(GetParam(), 4, 2);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 21});
  const int block_size = 4, blocks = 64;
  CudaBackend graph_backend, eager_backend;
  auto cpu = make_cpu_backend(1);
  Transformer graph_model(config, weights, graph_backend),
      eager_model(config, weights, eager_backend), cpu_model(config, weights, *cpu);
  TransformerRunner graphs(graph_model, blocks, block_size, RunnerOptions{DType::F32, 8});
  TransformerRunner eager(eager_model, blocks, block_size, RunnerOptions{DType::F32, 0});
  TransformerRunner reference(cpu_model, blocks, block_size);
  ASSERT_NE(graphs.decode_graphs(), nullptr);
  ASSERT_EQ(eager.decode_graphs(), nullptr);

  DecodeSchedule schedule(config.vocab_size, blocks, block_size, 9, 11);
  const std::vector<std::vector<int>> rounds = decode_rounds();
  StepResult got, want, oracle;
  int bitwise = 0;
  for (size_t step = 0; step < schedule.steps(rounds); ++step) {
    const StepBatch batch = schedule.next(rounds);
    graphs.execute(batch, got);
    eager.execute(batch, want);
    reference.execute(batch, oracle);
    const Tensor g = host_logits(got, config.vocab_size), e = host_logits(want, config.vocab_size),
                 c = host_logits(oracle, config.vocab_size);
    EXPECT_TRUE(rel_l2_close(g, e, 1e-5)) << "step " << step << " against eager";
    EXPECT_TRUE(rel_l2_close(g, c, 1e-4)) << "step " << step << " against the CPU";
    bitwise += got.logits == want.logits;
  }
  const DecodeGraphs& dg = *graphs.decode_graphs();
  EXPECT_TRUE(dg.capture_error().empty()) << dg.capture_error();
  EXPECT_GT(dg.graphs_captured(), 3);
  EXPECT_GT(dg.replays(), dg.graphs_captured());
  std::printf(
      "decode graphs (%s): %d captured, %d replays; %d of %zu steps bit for bit equal "
      "to eager\n",
      *GetParam() ? GetParam() : "plain", dg.graphs_captured(), dg.replays(), bitwise,
      schedule.steps(rounds));
}

INSTANTIATE_TEST_SUITE_P(PlainAndAttnRes, CudaDecodeGraphs,
                         ::testing::Values("", "full", "delta_v"), [](const auto& info) {
                           return std::string(*info.param ? info.param : "plain");
                         });

}  // namespace
}  // namespace attnres::test
