// linear_residual on CUDA: the residual add as the GEMV's epilogue (<= 8 rows), the Backend's
// default (cuBLAS, then the add) above. Against the CPU op (the oracle) at linear's tolerance,
// and bit for bit against the GPU's own separate ops (linear, then add_inplace), which round
// the same sums in the same order; then whole forwards of every AttnRes mode, whose logits
// must equal bit for bit those of the same backend with the fusion turned off.
// Tolerance against the CPU: 1e-5 (f32 x, f32 accumulation; only the summation order differs)
// up to 8 rows; 1e-2 for bf16 weights above (cuBLAS reads x rounded to bf16).
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

TEST(CudaResidualEpilogue, MatchesTheCpuAndTheSeparateOps) {
  SKIP_WITHOUT_CUDA();
  CpuBackend cpu(2);
  CudaBackend gpu(0);
  std::mt19937 rng(41);
  struct Shape2 {
    int64_t k, n;
  };
  // o_proj of the hd-64 and Qwen3-0.6B shapes, down_proj, and a K that takes the scalar loop.
  for (const Shape2 s :
       {Shape2{1024, 1024}, Shape2{2048, 1024}, Shape2{3072, 1024}, Shape2{37, 40}}) {
    for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 12}) {
      for (DType wdt : {DType::F32, DType::BF16}) {
        for (bool in_place : {false, true}) {
          const std::string what = std::to_string(rows) + "x" + std::to_string(s.k) + "->" +
                                   std::to_string(s.n) + " " + std::string(dtype_name(wdt)) +
                                   (in_place ? " out == residual" : " out apart");
          const double tol = wdt == DType::F32 || rows <= 8 ? 1e-5 : 1e-2;
          const Tensor x = random_host({rows, s.k}, DType::F32, rng);
          const Tensor w = random_host({s.n, s.k}, wdt, rng);
          const Tensor bias = random_host({s.n}, wdt, rng);
          // The residual at the scale of a hidden state, so the add is not lost in rounding.
          const Tensor residual = random_host({rows, s.n}, DType::F32, rng, -4.0f, 4.0f);

          Tensor want = clone_host(residual);
          cpu.linear_residual(x, w, &bias, want, want);

          const Tensor xd = gpu.upload(x), wd = gpu.upload(w), bd = gpu.upload(bias);
          const Tensor rd = gpu.upload(residual);
          Tensor got = in_place ? gpu.upload(residual) : device_nan(gpu, {rows, s.n});
          gpu.linear_residual(xd, wd, &bd, in_place ? got : rd, got);
          const Tensor got_host = to_host(gpu, got);
          EXPECT_TRUE(close_to(got_host, want, tol)) << what;

          // The separate ops on the GPU: the same bits.
          Tensor separate = device_nan(gpu, {rows, s.n});
          gpu.linear(xd, wd, &bd, separate);
          gpu.add_inplace(separate, rd);
          EXPECT_TRUE(same_bytes(got_host, to_host(gpu, separate))) << what;
        }
      }
    }
  }
}

TEST(CudaResidualEpilogue, RefusesOverlaps) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu(0);
  const Tensor x = gpu.alloc({2, 8}, DType::F32), w = gpu.alloc({4, 8}, DType::F32);
  Tensor both = gpu.alloc({3, 4}, DType::F32);
  Tensor residual = both.rows(0, 2), shifted = both.rows(1, 3);
  EXPECT_THROW(gpu.linear_residual(x, w, nullptr, residual, shifted), std::logic_error);
  Tensor host_out = Tensor::empty({2, 4}, DType::F32);
  EXPECT_THROW(gpu.linear_residual(x, w, nullptr, residual, host_out), std::logic_error);
}

// The same backend with the fusion off: linear_residual is the Backend's default, the
// separate linear and add_inplace the forward ran before the epilogue existed.
class UnfusedCudaBackend : public CudaBackend {
 public:
  void linear_residual_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                            const Tensor& residual, Tensor& out) override {
    Backend::linear_residual_impl(x, w, bias, residual, out);
  }
};

// A prefill step of 8 sequences (26 rows: the cuBLAS path), then decode steps of all 8 (the
// epilogue at 8 rows) and of 3 of them.
void compare_fused_and_unfused(const ModelConfig& config, DType weight_dtype, bool final_mix) {
  SCOPED_TRACE(config.summary() + " " + std::string(dtype_name(weight_dtype)) +
               (final_mix ? " final mix" : ""));
  RandomWeightOptions opt;
  opt.dtype = weight_dtype;
  opt.seed = 13;
  opt.final_mix = final_mix;
  const ModelWeights weights = make_random_weights(config, opt);
  CpuBackend cpu(2);
  CudaBackend fused(0);
  UnfusedCudaBackend unfused;
  Transformer cpu_model(config, weights, cpu);
  Transformer fused_model(config, weights, fused);
  Transformer unfused_model(config, weights, unfused);
  const int block_size = 4, num_blocks = 64;
  KvCache cpu_cache = KvCache::allocate(cpu, config, num_blocks, block_size);
  KvCache fused_cache = KvCache::allocate(fused, config, num_blocks, block_size);
  KvCache unfused_cache = KvCache::allocate(unfused, config, num_blocks, block_size);

  std::mt19937 rng(17);
  const std::vector<int> prompts = {3, 1, 4, 1, 5, 2, 6, 4};
  const int decode_steps = 4;
  std::vector<int> lengths;
  for (int p : prompts) lengths.push_back(p + decode_steps);
  const std::vector<Seq> seqs =
      random_sequences(lengths, block_size, num_blocks, config.vocab_size, rng);
  std::vector<int> begin(seqs.size(), 0), end = prompts;
  for (int step = 0; step <= decode_steps; ++step) {
    // Steps 3 and 4 feed sequences 0, 3 and 7 only.
    std::vector<Seq> active;
    std::vector<int> b, e, which;
    for (size_t s = 0; s < seqs.size(); ++s) {
      if (step >= 3 && s != 0 && s != 3 && s != 7) continue;
      active.push_back(seqs[s]);
      b.push_back(begin[s]);
      e.push_back(end[s]);
      which.push_back(static_cast<int>(s));
    }
    std::vector<int32_t> rows;
    const BatchMeta batch = make_step(active, b, e, block_size, rows);
    const Tensor ref = cpu_model.forward(batch, cpu_cache, rows);
    const Tensor got = to_host(fused, fused_model.forward(batch, fused_cache, rows));
    const Tensor separate = to_host(unfused, unfused_model.forward(batch, unfused_cache, rows));
    EXPECT_TRUE(same_bytes(got, separate))
        << "step " << step << " (" << batch.num_tokens << " rows)";
    EXPECT_TRUE(rel_l2_close(got, ref, weight_dtype == DType::F32 ? 1e-4 : 3e-2))
        << "step " << step;
    for (int s : which) {
      begin[s] = end[s];
      end[s] += 1;
    }
  }
}

TEST(CudaResidualEpilogue, EveryModeGivesTheUnfusedLogits) {
  SKIP_WITHOUT_CUDA();
  for (DType wdt : {DType::F32, DType::BF16}) {
    compare_fused_and_unfused(small_config("", 4, 0), wdt, false);
    compare_fused_and_unfused(small_config("block", 4, 2), wdt, true);
    for (const char* mode :
         {"block", "full", "delta", "delta_block", "delta_v", "first_layer", "pre_gated"}) {
      compare_fused_and_unfused(small_config(mode, 4, 2, "sigmoid_vector", true), wdt, false);
    }
  }
}

}  // namespace
}  // namespace attnres::test
