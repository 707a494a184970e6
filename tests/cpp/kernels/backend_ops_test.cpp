// The core ops written once and run on every backend this binary registers ("cpu", "cuda"),
// each against a double-precision reference computed here on the host, never against another
// backend. Inputs go in through Backend::upload and come back through Backend::download, so
// the same code runs in host memory and on a device. A backend that is not registered in this
// binary, or whose device is absent, skips with the reason.
//
// Compiled into attnres_cpu_kernels_tests (registers the CPU backend) and attnres_cuda_tests
// (ATTNRES_BACKEND_OPS_TEST_CUDA: registers the CUDA one too).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/backend_registry.h"
#include "engine/core/tensor.h"
#include "kernels/cpu/cpu_registration.h"
#ifdef ATTNRES_BACKEND_OPS_TEST_CUDA
#include "kernels/cuda/cuda_registration.h"
#endif

namespace attnres {
namespace {

class BackendOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    register_cpu_backend();
#ifdef ATTNRES_BACKEND_OPS_TEST_CUDA
    register_cuda_backend();
#endif
    const std::string& name = GetParam();
    if (!has_backend(name)) GTEST_SKIP() << "backend \"" << name << "\" is not in this build";
    const BackendTraits traits = backend_traits(name);
    if (traits.device_available && !traits.device_available())
      GTEST_SKIP() << "backend \"" << name << "\" has no device here";
    be_ = make_backend(name);
  }

  // Uniform values in +-[0.05, 1] (never zero, so a dropped term always shows), stored as dtype.
  Tensor random_host(const Shape& shape, DType dtype = DType::F32) {
    Tensor t = Tensor::empty(shape, dtype);
    std::uniform_real_distribution<float> magnitude(0.05f, 1.0f);
    std::bernoulli_distribution negative(0.5);
    for (int64_t i = 0; i < t.numel(); ++i)
      set_element_from_float(t, i, negative(rng_) ? -magnitude(rng_) : magnitude(rng_));
    return t;
  }

  // A device f32 tensor of NaN: an element the op forgets to write fails every comparison.
  Tensor nan_output(const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = std::nanf("");
    return be_->upload(t);
  }

  std::vector<double> download(const Tensor& dev) {
    Tensor host = Tensor::empty(dev.shape, dev.dtype);
    be_->download(dev, host.data);
    std::vector<double> out(static_cast<size_t>(host.numel()));
    for (int64_t i = 0; i < host.numel(); ++i) out[i] = element_as_float(host, i);
    return out;
  }

  std::unique_ptr<Backend> be_;
  std::mt19937 rng_{20261207};
};

double at(const Tensor& host, int64_t i) { return element_as_float(host, i); }

// |got[i] - ref[i]| <= bound[i], NaN fails; reports the first few offenders.
::testing::AssertionResult within(const std::vector<double>& got, const std::vector<double>& ref,
                                  const std::vector<double>& bound) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << got.size() << " values, expected " << ref.size();
  int bad = 0;
  auto failure = ::testing::AssertionFailure();
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]);
    if (err <= bound[i]) continue;  // false for NaN
    if (++bad <= 5)
      failure << "[" << i << "] got " << got[i] << " want " << ref[i] << " (bound " << bound[i]
              << "); ";
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return failure << bad << " of " << ref.size() << " out of bounds";
}

// f32 rounding of a value: a relative bound plus a floor for values near zero.
std::vector<double> f32_bound(const std::vector<double>& ref, double rtol) {
  std::vector<double> b(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) b[i] = rtol * std::fabs(ref[i]) + 1e-7;
  return b;
}

TEST_P(BackendOps, RmsNorm) {
  const int64_t rows = 5, n = 333;
  const float eps = 1e-6f;
  Tensor x = random_host({rows, n});
  Tensor gain = random_host({n}, DType::BF16);
  std::vector<double> ref(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += at(x, r * n + i) * at(x, r * n + i);
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) ref[r * n + i] = at(x, r * n + i) * inv * at(gain, i);
  }
  Tensor x_d = be_->upload(x), gain_d = be_->upload(gain), out = nan_output({rows, n});
  be_->rms_norm(x_d, gain_d, eps, out);
  // A sum of n f32 squares and a product of three roundings: 1e-5 relative.
  EXPECT_TRUE(within(download(out), ref, f32_bound(ref, 1e-5)));
}

// out = x W^T + bias with W in `wdt`, for `rows` rows. The bound is relative to the sum of the
// absolute products (what rounding scales with): 1e-5 of it in f32; 4e-3 where a device may
// round x to bf16 to meet bf16 weights in a GEMM (2^-9 relative per product, kernels/cuda
// does for more than 8 rows).
void check_linear(const Tensor& x, const Tensor& w, const Tensor& bias, double rtol,
                  const std::vector<double>& got) {
  const int64_t rows = x.dim(0), in = x.dim(1), outs = w.dim(0);
  std::vector<double> ref(rows * outs), bound(rows * outs);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < outs; ++o) {
      double sum = at(bias, o), abs_sum = std::fabs(at(bias, o));
      for (int64_t i = 0; i < in; ++i) {
        const double p = at(x, r * in + i) * at(w, o * in + i);
        sum += p;
        abs_sum += std::fabs(p);
      }
      ref[r * outs + o] = sum;
      bound[r * outs + o] = rtol * abs_sum + 1e-7;
    }
  EXPECT_TRUE(within(got, ref, bound)) << rows << " rows";
}

TEST_P(BackendOps, LinearWithBias) {
  const int64_t in = 257, outs = 71;
  for (DType wdt : {DType::F32, DType::BF16}) {
    for (int64_t rows : {1, 13}) {
      Tensor x = random_host({rows, in});
      Tensor w = random_host({outs, in}, wdt);
      Tensor bias = random_host({outs}, wdt);
      Tensor x_d = be_->upload(x), w_d = be_->upload(w), bias_d = be_->upload(bias);
      Tensor out = nan_output({rows, outs});
      be_->linear(x_d, w_d, &bias_d, out);
      const double rtol = wdt == DType::BF16 && rows > 8 ? 4e-3 : 1e-5;
      SCOPED_TRACE(dtype_name(wdt));
      check_linear(x, w, bias, rtol, download(out));
    }
  }
}

TEST_P(BackendOps, Swiglu) {
  const int64_t rows = 3, n = 301;
  Tensor gate = random_host({rows, n}), up = random_host({rows, n});
  std::vector<double> ref(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) {
    const double g = at(gate, i);
    ref[i] = g / (1.0 + std::exp(-g)) * at(up, i);
  }
  Tensor gate_d = be_->upload(gate), up_d = be_->upload(up), out = nan_output({rows, n});
  be_->swiglu(gate_d, up_d, out);
  // f32 exp (fast-math exp on a device) and three roundings: 1e-5 relative.
  EXPECT_TRUE(within(download(out), ref, f32_bound(ref, 1e-5)));
}

TEST_P(BackendOps, AddInplace) {
  const int64_t rows = 4, n = 129;
  Tensor x = random_host({rows, n}), y = random_host({rows, n});
  std::vector<double> ref(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) ref[i] = at(x, i) + at(y, i);
  Tensor x_d = be_->upload(x), y_d = be_->upload(y);
  be_->add_inplace(x_d, y_d);
  // One f32 addition: within half an ulp of the sum's magnitude bound |x| + |y|.
  std::vector<double> bound(ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    bound[i] = 6e-8 * (std::fabs(at(x, i)) + std::fabs(at(y, i)));
  EXPECT_TRUE(within(download(x_d), ref, bound));
}

TEST_P(BackendOps, EmbeddingWidensTheRows) {
  const int64_t vocab = 37, d = 133;
  Tensor table = random_host({vocab, d}, DType::BF16);
  BatchMeta batch;
  batch.token_ids = {0, 36, 5, 5, 17, 2};
  batch.num_tokens = static_cast<int>(batch.token_ids.size());
  for (int t = 0; t < batch.num_tokens; ++t) {
    batch.positions.push_back(t);
    batch.slot_mapping.push_back(t);
  }
  batch.query_start = {0, batch.num_tokens};
  batch.context_len = {batch.num_tokens};
  batch.block_tables = {{0}};
  std::vector<double> ref;
  for (int32_t id : batch.token_ids)
    for (int64_t i = 0; i < d; ++i) ref.push_back(at(table, id * d + i));
  Tensor table_d = be_->upload(table), out = nan_output({batch.num_tokens, d});
  be_->prepare_batch(batch);
  be_->embedding(table_d, batch, out);
  // bf16 widens to f32 exactly.
  EXPECT_TRUE(within(download(out), ref, std::vector<double>(ref.size(), 0.0)));
}

TEST_P(BackendOps, GatherRows) {
  const int64_t rows = 9, n = 65;
  Tensor x = random_host({rows, n});
  const std::vector<int32_t> picks = {8, 0, 3, 3, 7};
  std::vector<double> ref;
  for (int32_t r : picks)
    for (int64_t i = 0; i < n; ++i) ref.push_back(at(x, r * n + i));
  Tensor x_d = be_->upload(x), out = nan_output({static_cast<int64_t>(picks.size()), n});
  be_->gather_rows(x_d, picks, out);
  EXPECT_TRUE(within(download(out), ref, std::vector<double>(ref.size(), 0.0)));  // a copy
}

// The checks of Backend's public ops (engine/core/backend.cpp) run before any backend's body,
// on every backend: a mismatch is a caller's bug, reported by attnres::internal_error as a
// std::logic_error whose message names the op.
::testing::AssertionResult refused(const std::function<void()>& op, const std::string& op_name) {
  try {
    op();
  } catch (const std::logic_error& e) {
    if (std::string(e.what()).find(op_name) != std::string::npos)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "the message does not name " << op_name << ": " << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << op_name << " threw another type: " << e.what();
  }
  return ::testing::AssertionFailure() << op_name << " accepted the mismatch";
}

TEST_P(BackendOps, MismatchesAreRefusedBeforeTheBody) {
  Tensor x_host = random_host({2, 8});
  Tensor x = be_->upload(x_host), y = be_->upload(random_host({2, 9}));
  EXPECT_TRUE(refused([&] { be_->add_inplace(x, y); }, "add_inplace"));
  std::vector<double> unchanged(static_cast<size_t>(x_host.numel()));
  for (int64_t i = 0; i < x_host.numel(); ++i) unchanged[i] = at(x_host, i);
  EXPECT_TRUE(within(download(x), unchanged, std::vector<double>(unchanged.size(), 0.0)))
      << "the refused add_inplace wrote x";
  Tensor w = be_->upload(random_host({4, 7}));  // in 7 against x's 8
  Tensor out = nan_output({2, 4});
  EXPECT_TRUE(refused([&] { be_->linear(x, w, nullptr, out); }, "linear"));
  Tensor gain = be_->upload(random_host({5}));  // n 5 against x's 8
  Tensor normed = nan_output({2, 8});
  EXPECT_TRUE(refused([&] { be_->rms_norm(x, gain, 1e-6f, normed); }, "rms_norm"));
  Tensor gathered = nan_output({1, 8});
  const std::vector<int32_t> outside = {2};  // x has rows 0 and 1
  EXPECT_TRUE(refused([&] { be_->gather_rows(x, outside, gathered); }, "gather_rows"));
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, BackendOps, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace attnres
