// Backend::depth_weights on the CPU against a direct double-precision softmax over
// bank[0..n) + partial (the partial last, the bias on its logit alone). Dead bank entries are
// NaN, so reading past the n live ones fails the comparison; logits up to ~50 check that the
// softmax subtracts its max.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// weights[t, j] = softmax_j(q . src_j / rms(src_j) + (j == n ? bias : 0)).
std::vector<double> reference_weights(const std::vector<double>& bank, int n, int64_t t_dim,
                                      int64_t d, const std::vector<double>& q,
                                      const std::vector<double>& partial, double bias, double eps) {
  std::vector<double> out;
  for (int64_t t = 0; t < t_dim; ++t) {
    std::vector<double> logit;
    for (int j = 0; j <= n; ++j) {
      const double* x = j < n ? bank.data() + (j * t_dim + t) * d : partial.data() + t * d;
      double dot = 0, ss = 0;
      for (int64_t i = 0; i < d; ++i) {
        dot += q[i] * x[i];
        ss += x[i] * x[i];
      }
      logit.push_back(dot / std::sqrt(ss / d + eps) + (j == n ? bias : 0.0));
    }
    const double big = *std::max_element(logit.begin(), logit.end());
    double sum = 0;
    for (double& l : logit) sum += (l = std::exp(l - big));
    for (double l : logit) out.push_back(l / sum);
  }
  return out;
}

TEST(CpuDepthWeights, SoftmaxOverBankAndPartialWithBiasOnThePartial) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(11);
  const float eps = 1e-6f;
  for (int64_t d : {5, 67, 128})
    for (int n : {1, 2, 5, 9})
      for (float q_scale : {0.3f, 8.0f}) {  // soft weights, and logits of tens
        const int64_t t_dim = 7;
        Tensor bank = random_tensor({n + 2, t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
        std::fill(bank.ptr<float>() + n * t_dim * d, bank.ptr<float>() + (n + 2) * t_dim * d,
                  kNaN);  // dead entries: must never be read
        Tensor partial = random_tensor({t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
        Tensor query = random_tensor({d}, DType::F32, rng, -q_scale, q_scale);
        const float bias = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
        Tensor out = be->alloc({t_dim, n + 1}, DType::F32);
        be->depth_weights(query, bank, n, partial, bias, eps, out);
        const auto want =
            reference_weights(values(bank), n, t_dim, d, values(query), values(partial), bias, eps);
        EXPECT_TRUE(all_close(out, want, 2e-5, 1e-6))
            << "d=" << d << " n=" << n << " q_scale=" << q_scale;
        for (int64_t t = 0; t < t_dim; ++t) {  // each row is a distribution
          double sum = 0;
          for (int j = 0; j <= n; ++j) sum += out.ptr<float>()[t * (n + 1) + j];
          EXPECT_NEAR(sum, 1.0, 1e-5);
        }
      }
}

TEST(CpuDepthWeights, TheBiasMovesWeightOntoThePartialOnly) {
  // Same inputs with a large bias: the partial's weight grows, the bank entries keep their
  // ratios (the bias is on the partial's logit alone).
  auto be = make_cpu_backend(1);
  std::mt19937 rng(12);
  const int64_t t_dim = 2, d = 32;
  const int n = 3;
  Tensor bank = random_tensor({n, t_dim, d}, DType::F32, rng);
  Tensor partial = random_tensor({t_dim, d}, DType::F32, rng);
  Tensor query = random_tensor({d}, DType::F32, rng);
  Tensor plain = be->alloc({t_dim, n + 1}, DType::F32),
         biased = be->alloc({t_dim, n + 1}, DType::F32);
  be->depth_weights(query, bank, n, partial, 0.0f, 1e-6f, plain);
  be->depth_weights(query, bank, n, partial, 3.0f, 1e-6f, biased);
  for (int64_t t = 0; t < t_dim; ++t) {
    const float* a = plain.ptr<float>() + t * (n + 1);
    const float* b = biased.ptr<float>() + t * (n + 1);
    EXPECT_GT(b[n], a[n]);
    for (int j = 1; j < n; ++j) EXPECT_NEAR(b[j] / b[0], a[j] / a[0], 1e-4);
  }
}

TEST(CpuDepthWeights, RejectsMismatchedShapes) {
  auto be = make_cpu_backend(1);
  Tensor bank = be->alloc({2, 3, 8}, DType::F32), partial = be->alloc({3, 8}, DType::F32);
  Tensor query = be->alloc({8}, DType::F32);
  Tensor wrong_width = be->alloc({3, 2}, DType::F32);  // n = 2 needs 3 columns
  EXPECT_THROW(be->depth_weights(query, bank, 2, partial, 0.0f, 1e-6f, wrong_width),
               std::logic_error);
  Tensor out = be->alloc({3, 4}, DType::F32);
  EXPECT_THROW(be->depth_weights(query, bank, 3, partial, 0.0f, 1e-6f, out),  // only 2 live
               std::logic_error);
}

}  // namespace
}  // namespace attnres::test
