// Backend::depth_weights on CUDA against the CPU backend (the reference, itself tested against
// a double-precision softmax in tests/cpp/kernels), and the depth-mix weights a whole forward
// reports (Transformer::forward with a DepthWeightsRequest) on both backends. Skips without a
// GPU. Tolerance: 2e-5 relative plus 2e-5 x the rms of the weights for the op (f32, only the
// summation order differs); 1e-4 for the model with f32 weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

void check_depth_weights(int n, int64_t T, int64_t d, float q_scale, uint32_t seed) {
  SCOPED_TRACE("n " + std::to_string(n) + " T " + std::to_string(T) + " d " + std::to_string(d) +
               " q_scale " + std::to_string(q_scale));
  CpuBackend cpu(2);
  CudaBackend gpu(0);
  std::mt19937 rng(seed);
  Tensor bank = random_host({n + 1, T, d}, DType::F32, rng, -2.0f, 2.0f);
  for (int64_t i = n * T * d; i < (n + 1) * T * d; ++i) bank.ptr<float>()[i] = kNaN;  // dead
  Tensor partial = random_host({T, d}, DType::F32, rng, -2.0f, 2.0f);
  Tensor query = random_host({d}, DType::F32, rng, -q_scale, q_scale);
  Tensor ref = Tensor::empty({T, n + 1}, DType::F32);
  cpu.depth_weights(query, bank, n, partial, 0.7f, 1e-6f, ref);
  Tensor out = device_nan(gpu, {T, n + 1});
  gpu.depth_weights(gpu.upload(query), gpu.upload(bank), n, gpu.upload(partial), 0.7f, 1e-6f, out);
  EXPECT_TRUE(close_to(to_host(gpu, out), ref, 2e-5));
}

TEST(CudaOps, DepthWeights) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 500;
  for (int n : {1, 2, 5, 17})
    for (int64_t d : {1, 67, 1024}) check_depth_weights(n, 3, d, 1.0f, seed++);
  check_depth_weights(4, 9, 8192, 1.0f, seed++);
  check_depth_weights(6, 5, 512, 0.2f, seed++);  // logits of tens: the softmax subtracts its max
}

TEST(CudaModel, DepthWeightsOfAForward) {
  SKIP_WITHOUT_CUDA();
  for (bool final_mix : {false, true}) {
    SCOPED_TRACE(final_mix ? "final mix (2b)" : "cumulative (2a)");
    const ModelConfig config = small_config("block", 4, 2);
    RandomWeightOptions opt;
    opt.dtype = DType::F32;
    opt.seed = 9;
    opt.final_mix = final_mix;
    const ModelWeights weights = make_random_weights(config, opt);
    CpuBackend cpu(2);
    CudaBackend gpu(0);
    Transformer cpu_model(config, weights, cpu), gpu_model(config, weights, gpu);
    KvCache cpu_cache = KvCache::allocate(cpu, config, 4, 4);
    KvCache gpu_cache = KvCache::allocate(gpu, config, 4, 4);
    BatchMeta batch;  // one 6-token prompt in blocks 2 and 0
    batch.num_tokens = 6;
    batch.token_ids = {5, 17, 3, 99, 42, 8};
    batch.positions = {0, 1, 2, 3, 4, 5};
    batch.slot_mapping = {8, 9, 10, 11, 0, 1};
    batch.query_start = {0, 6};
    batch.context_len = {6};
    batch.block_tables = {{2, 0}};
    const std::vector<int32_t> logit_rows = {5}, depth_rows = {5, 0, 3, 3};
    std::vector<float> want, got;
    const DepthWeightsRequest cpu_req{depth_rows, &want}, gpu_req{depth_rows, &got};
    cpu_model.forward(batch, cpu_cache, logit_rows, &cpu_req);
    gpu_model.forward(batch, gpu_cache, logit_rows, &gpu_req);
    const DepthAttentionLayout& layout = cpu_model.depth_attention_layout();
    ASSERT_EQ(want.size(), depth_rows.size() * layout.rows() * layout.cols());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << "cell " << i;
      } else {
        EXPECT_NEAR(got[i], want[i], 1e-4) << "cell " << i;
      }
    }
  }
}

}  // namespace
}  // namespace attnres::test
