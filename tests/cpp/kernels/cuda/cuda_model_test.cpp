// The whole forward on the CPU and CUDA backends with the same random small model: a plain
// qwen3, a qwen3_attnres block model, and one with a final mix (docs/ATTNRES.md §2b). Each runs a
// mixed prefill step (two sequences of different lengths, shuffled block tables) and two
// decode steps; the logits of every step are compared.
// The AttnRes models also run with a BF16 depth bank on both backends (--depth-bank-dtype
// bfloat16, the `auto` choice for a bf16 checkpoint).
// Tolerance: F32 weights 1e-4 relative L2 (f32 everywhere, only summation order differs), 2e-3
// with a bf16 bank (an entry element the two backends computed a rounding error apart can round
// to neighbouring bf16 values, 2^-8 apart, and that difference flows into every later layer);
// BF16 weights 3e-2 relative L2 (linear rounds activations to bf16 on the GPU, the CPU keeps
// them f32, and the difference compounds over the layers).
#include <gtest/gtest.h>

#include <string>

#include <algorithm>
#include <numeric>
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

void compare_model(const ModelConfig& config, DType weight_dtype, bool final_mix, double tol,
                   DType bank_dtype = DType::F32) {
  SCOPED_TRACE(config.summary() + " " + std::string(dtype_name(weight_dtype)) +
               (final_mix ? " final mix" : "") + " bank " + std::string(dtype_name(bank_dtype)));
  RandomWeightOptions opt;
  opt.dtype = weight_dtype;
  opt.seed = 7;
  opt.final_mix = final_mix;
  const ModelWeights weights = make_random_weights(config, opt);
  CpuBackend cpu(2);
  CudaBackend gpu(0);
  Transformer cpu_model(config, weights, cpu, {}, bank_dtype);
  Transformer gpu_model(config, weights, gpu, {}, bank_dtype);
  ASSERT_EQ(gpu_model.depth_bank_dtype(), bank_dtype);
  const int block_size = 4, num_blocks = 24;
  KvCache cpu_cache = KvCache::allocate(cpu, config, num_blocks, block_size);
  KvCache gpu_cache = KvCache::allocate(gpu, config, num_blocks, block_size);

  std::mt19937 rng(5);
  std::vector<int> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::uniform_int_distribution<int32_t> tok(0, config.vocab_size - 1);
  const std::vector<int> prompt_len = {7, 3};
  const int decode_steps = 2;
  std::vector<Seq> seqs(prompt_len.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int len = prompt_len[s] + decode_steps;
    for (int i = 0; i < len; ++i) seqs[s].tokens.push_back(tok(rng));
    for (int b = 0; b < (len + block_size - 1) / block_size; ++b) {
      seqs[s].table.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
  }
  std::vector<int> begin(seqs.size(), 0), end = prompt_len;
  for (int step = 0; step <= decode_steps; ++step) {
    std::vector<int32_t> rows;
    BatchMeta batch = make_step(seqs, begin, end, block_size, rows);
    Tensor ref = cpu_model.forward(batch, cpu_cache, rows);
    Tensor got_d = gpu_model.forward(batch, gpu_cache, rows);
    ASSERT_EQ(got_d.device, Device::CUDA);
    Tensor got = to_host(gpu, got_d);
    EXPECT_TRUE(rel_l2_close(got, ref, tol)) << "step " << step;
    for (size_t s = 0; s < seqs.size(); ++s) {  // the next step feeds one more token each
      begin[s] = end[s];
      end[s] += 1;
    }
  }
}

TEST(CudaModel, PlainQwen3) {
  SKIP_WITHOUT_CUDA();
  const ModelConfig config = small_config("", 3, 0);
  compare_model(config, DType::F32, false, 1e-4);
  compare_model(config, DType::BF16, false, 3e-2);
}

TEST(CudaModel, AttnResBlock) {
  SKIP_WITHOUT_CUDA();
  const ModelConfig config = small_config("block", 4, 2);
  compare_model(config, DType::F32, false, 1e-4);
  compare_model(config, DType::BF16, false, 3e-2);
  compare_model(config, DType::F32, false, 2e-3, DType::BF16);
  compare_model(config, DType::BF16, false, 3e-2, DType::BF16);  // what `auto` serves
}

TEST(CudaModel, AttnResBlockFinalMix) {
  SKIP_WITHOUT_CUDA();
  const ModelConfig config = small_config("block", 4, 2);
  compare_model(config, DType::F32, true, 1e-4);
  compare_model(config, DType::BF16, true, 3e-2);
  compare_model(config, DType::F32, true, 2e-3, DType::BF16);
  compare_model(config, DType::BF16, true, 3e-2, DType::BF16);
}

TEST(CudaModel, EveryAttnResModeGateAndNullSource) {
  SKIP_WITHOUT_CUDA();
  for (DType bank : kBankDtypes) {
    const double tol = bank == DType::F32 ? 1e-4 : 2e-3;
    for (const char* mode : {"block", "full", "delta", "delta_block", "delta_v"})
      for (const char* gate : {"bias", "sigmoid_scalar", "sigmoid_vector", "learnable_alpha"})
        for (bool null_source : {false, true})
          compare_model(small_config(mode, 4, 2, gate, null_source), DType::F32, false, tol, bank);
    compare_model(small_config("block", 4, 2, "sigmoid_vector"), DType::F32, true, tol, bank);
    for (const char* mode : {"first_layer", "pre_gated"})
      compare_model(small_config(mode, 4, 2, "sigmoid_vector", true), DType::F32, false, tol, bank);
    compare_model(small_config("delta_v", 4, 2, "sigmoid_vector", true), DType::BF16, false, 3e-2,
                  bank);
  }
}

}  // namespace
}  // namespace attnres::test
