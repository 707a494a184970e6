// Backend::depth_weights on CUDA against the CPU backend (the reference, itself tested against
// a double-precision softmax in tests/cpp/kernels), and the depth-mix weights a whole forward
// reports (Transformer::forward with a DepthWeightsRequest) on both backends, each on an F32 and
// a BF16 depth bank. Skips without a GPU. Tolerance: 2e-5 relative plus 2e-5 x the rms of the
// weights for the op (f32 arithmetic, only the summation order differs; the two backends' bf16
// banks hold the same bits); for the model with f32 weights 1e-4 absolute, 1e-3 with a bf16
// bank (a bank element the two backends computed a rounding error apart can round to
// neighbouring bf16 values, 2^-8 apart, and move a logit by ~1e-3 of itself).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "tests/cpp/kernels/cuda/cuda_depth_bank_util.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

void check_depth_weights(int n, int64_t T, int64_t d, float q_scale, uint32_t seed,
                         DType bank_dtype) {
  SCOPED_TRACE("n " + std::to_string(n) + " T " + std::to_string(T) + " d " + std::to_string(d) +
               " q_scale " + std::to_string(q_scale) + " bank " +
               std::string(dtype_name(bank_dtype)));
  CpuBackend cpu(2);
  CudaBackend gpu(0);
  std::mt19937 rng(seed);
  Tensor bank_host = random_host({n + 1, T, d}, DType::F32, rng, -2.0f, 2.0f);
  for (int64_t i = n * T * d; i < (n + 1) * T * d; ++i) bank_host.ptr<float>()[i] = kNaN;  // dead
  const Tensor bank = bank_on(cpu, bank_host, bank_dtype);
  const Tensor bank_d = bank_on(gpu, bank_host, bank_dtype);
  ASSERT_TRUE(same_bank_bits(cpu, bank, gpu, bank_d));
  Tensor partial = random_host({T, d}, DType::F32, rng, -2.0f, 2.0f);
  Tensor query = random_host({d}, DType::F32, rng, -q_scale, q_scale);
  Tensor ref = Tensor::empty({T, n + 1}, DType::F32);
  cpu.depth_weights(query, bank, n, partial, 0.7f, 1e-6f, ref);
  Tensor out = device_nan(gpu, {T, n + 1});
  gpu.depth_weights(gpu.upload(query), bank_d, n, gpu.upload(partial), 0.7f, 1e-6f, out);
  EXPECT_TRUE(close_to(to_host(gpu, out), ref, 2e-5));
}

// d 1 and 67 take the kernel's scalar path, 1024 and 8192 its 16-byte loads.
TEST(CudaOps, DepthWeights) {
  SKIP_WITHOUT_CUDA();
  for (DType bank : kBankDtypes) {
    uint32_t seed = 500;
    for (int n : {1, 2, 5, 17})
      for (int64_t d : {1, 67, 1024}) check_depth_weights(n, 3, d, 1.0f, seed++, bank);
    check_depth_weights(4, 9, 8192, 1.0f, seed++, bank);
    check_depth_weights(6, 5, 512, 0.2f, seed++, bank);  // logits of tens: softmax subtracts max
  }
}

// Sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers"): depth_weights_kernel's scalar path
// (d 67) and 16-byte loads (d 64), one source and several, on each bank dtype.
TEST(CudaSanitizerSized, DepthWeights) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 800;
  check_depth_weights(1, 2, 67, 1.0f, seed++, DType::F32);
  check_depth_weights(5, 3, 67, 1.0f, seed++, DType::BF16);
  check_depth_weights(1, 2, 64, 1.0f, seed++, DType::BF16);
  check_depth_weights(5, 3, 64, 1.0f, seed++, DType::F32);
}

TEST(CudaModel, DepthWeightsOfAForward) {
  SKIP_WITHOUT_CUDA();
  for (DType bank_dtype : kBankDtypes)
    for (bool final_mix : {false, true}) {
      SCOPED_TRACE(std::string(final_mix ? "final mix (2b)" : "cumulative (2a)") + " bank " +
                   std::string(dtype_name(bank_dtype)));
      const ModelConfig config = small_config("block", 4, 2);
      RandomWeightOptions opt;
      opt.dtype = DType::F32;
      opt.seed = 9;
      opt.final_mix = final_mix;
      const ModelWeights weights = make_random_weights(config, opt);
      CpuBackend cpu(2);
      CudaBackend gpu(0);
      Transformer cpu_model(config, weights, cpu, {}, bank_dtype);
      Transformer gpu_model(config, weights, gpu, {}, bank_dtype);
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
          EXPECT_NEAR(got[i], want[i], bank_dtype == DType::F32 ? 1e-4 : 1e-3) << "cell " << i;
        }
      }
    }
}

}  // namespace
}  // namespace attnres::test
