// Async scheduling on the GPU (docs/ENGINE_CONTRACT.md, "One step, in order"): the engine over
// a CUDA TransformerRunner (decode graphs on) with the overlap on and off. The requests are all
// submitted before the first step, so both runs build the same batches; CUDA is deterministic
// for a given batch (kernels/cuda/NOTES.md, "Batch invariance"), so the streams must be
// identical token for token: greedy, seeded sampling and penalties on the device, logprobs on
// the host path, n > 1.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/transformer_runner.h"
#include "engine/sched/engine_core.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

std::vector<std::map<int, std::vector<int32_t>>> run_engine(const ModelConfig& config,
                                                            const ModelWeights& weights,
                                                            bool async) {
  CudaBackend backend;
  Transformer model(config, weights, backend);
  TransformerRunner runner(model, 256, 16);
  EngineConfig engine_config;
  engine_config.num_kv_blocks = 256;
  engine_config.block_size = 16;
  engine_config.scheduler.max_model_len = 256;
  engine_config.async_scheduling = async;
  EngineCore engine(engine_config, runner);
  EXPECT_EQ(engine.async_scheduling(), async);
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 12; ++i) {
    EngineRequest r;
    r.request_id = "r";
    r.request_id += std::to_string(i);  // (operator+ trips GCC 12's false -Wrestrict)
    for (int t = 0; t < 5 + 7 * i; ++t) r.prompt_ids.push_back((i * 31 + t * 17) % 100);
    r.params.max_tokens = 10 + 3 * i;
    r.params.temperature = i % 3 == 0 ? 0.0f : 1.5f;
    r.params.seed = 100 + i;
    if (i % 4 == 1) r.params.presence_penalty = 1.0f;
    if (i % 4 == 2) r.params.logprobs = 2;  // a host row: that step's launch waits
    if (i % 5 == 3) r.n = 2;
    SubmitResult submitted = engine.submit(r);
    EXPECT_TRUE(submitted.accepted()) << submitted.message;
    streams.push_back(std::move(submitted.stream));
  }
  for (int steps = 0; engine.step() && steps < 5000; ++steps) {
  }
  std::vector<std::map<int, std::vector<int32_t>>> tokens;
  for (auto& stream : streams) {
    auto& mine = tokens.emplace_back();
    while (std::optional<RequestOutput> out = stream->next()) {
      mine[out->choice_index].insert(mine[out->choice_index].end(), out->token_ids.begin(),
                                     out->token_ids.end());
      EXPECT_TRUE(out->error.empty()) << out->error;
    }
  }
  EXPECT_TRUE(engine.stats().alive);
  return tokens;
}

TEST(CudaAsyncScheduling, SameTokensWithAndWithoutTheOverlap) {
  SKIP_WITHOUT_CUDA();
  const ModelConfig config = small_config("full", 4, 2);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 33});
  const auto want = run_engine(config, weights, false);
  const auto got = run_engine(config, weights, true);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
}

}  // namespace
}  // namespace attnres::test
