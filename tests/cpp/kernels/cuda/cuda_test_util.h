// Helpers for the CUDA backend tests: every op is run on the CPU backend (the reference)
// and the CUDA backend on the same random host inputs, and the outputs are compared.
// CUDA outputs are poisoned with NaN before each op, so an element the kernel forgot to
// write fails the comparison (NaN never passes).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace attnres::test {

#define SKIP_WITHOUT_CUDA()                                                                      \
  do {                                                                                           \
    if (!::attnres::cuda_device_available())                                                     \
      GTEST_SKIP() << "no CUDA device: the CUDA backend tests need a GPU (they compile anyway)"; \
  } while (0)

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Uniform(lo, hi) values stored as `dtype`.
inline Tensor random_host(const Shape& shape, DType dtype, std::mt19937& rng, float lo = -1.0f,
                          float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) set_element_from_float(t, i, dist(rng));
  return t;
}

inline Tensor filled_host(const Shape& shape, float v) {
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = v;
  return t;
}

// A device copy of a host tensor (a fresh buffer each time).
inline Tensor to_device(Backend& be, const Tensor& host) { return be.upload(host); }

// A device f32 tensor full of NaN: the poisoned output of an op under test.
inline Tensor device_nan(Backend& be, const Shape& shape) {
  return be.upload(filled_host(shape, kNaN));
}

// A host copy of a device tensor.
inline Tensor to_host(Backend& be, const Tensor& dev) {
  Tensor t = Tensor::empty(dev.shape, dev.dtype);
  be.download(dev, t.data);
  return t;
}

// A host deep copy of a host tensor (the CPU backend works in place on its inputs).
inline Tensor clone_host(const Tensor& h) {
  Tensor t = Tensor::empty(h.shape, h.dtype);
  if (h.nbytes()) std::memcpy(t.data, h.data, h.nbytes());
  return t;
}

// Elementwise: |got - ref| <= rtol * |ref| + atol_frac * rms(ref), NaN fails; also reports
// the relative L2 error. rtol is the op's stated tolerance.
inline ::testing::AssertionResult close_to(const Tensor& got, const Tensor& ref, double rtol,
                                           double atol_frac = 1.0) {
  if (got.numel() != ref.numel())
    return ::testing::AssertionFailure() << "size " << got.numel() << " vs " << ref.numel();
  const int64_t n = ref.numel();
  double ss_ref = 0.0, ss_diff = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = element_as_float(ref, i);
    ss_ref += r * r;
  }
  const double rms_ref = n ? std::sqrt(ss_ref / static_cast<double>(n)) : 0.0;
  const double atol = rtol * atol_frac * rms_ref + 1e-30;
  double worst = 0.0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double g = element_as_float(got, i), r = element_as_float(ref, i);
    const double err = std::fabs(g - r);
    ss_diff += (g - r) * (g - r);
    const double bound = rtol * std::fabs(r) + atol;
    if (!(err <= bound) && (worst_i < 0 || !(err / bound <= worst))) {
      worst = std::isnan(err) ? INFINITY : err / bound;
      worst_i = i;
    }
  }
  const double rel_l2 = ss_ref > 0 ? std::sqrt(ss_diff / ss_ref) : std::sqrt(ss_diff);
  if (worst_i < 0) return ::testing::AssertionSuccess() << "rel L2 " << rel_l2;
  return ::testing::AssertionFailure()
         << "element " << worst_i << " of " << n << ": got " << element_as_float(got, worst_i)
         << " want " << element_as_float(ref, worst_i) << " (" << worst << "x the tolerance rtol "
         << rtol << "); rel L2 error " << rel_l2;
}

// The same dtype, shape and bytes (stored values bit for bit, NaN payloads included).
inline ::testing::AssertionResult same_bytes(const Tensor& got, const Tensor& ref) {
  if (got.dtype != ref.dtype || got.shape != ref.shape)
    return ::testing::AssertionFailure()
           << "dtype / shape " << dtype_name(got.dtype) << " " << shape_str(got.shape) << " vs "
           << dtype_name(ref.dtype) << " " << shape_str(ref.shape);
  const auto* g = static_cast<const unsigned char*>(got.data);
  const auto* r = static_cast<const unsigned char*>(ref.data);
  const size_t elem = dtype_size(ref.dtype);
  for (size_t i = 0; i < ref.nbytes(); ++i)
    if (g[i] != r[i])
      return ::testing::AssertionFailure()
             << "element " << i / elem << " differs: got " << element_as_float(got, i / elem)
             << " want " << element_as_float(ref, i / elem);
  return ::testing::AssertionSuccess();
}

// ||got - ref|| / ||ref|| <= tol (for whole-model logits, where single elements near zero
// carry no meaning).
inline ::testing::AssertionResult rel_l2_close(const Tensor& got, const Tensor& ref, double tol) {
  if (got.numel() != ref.numel())
    return ::testing::AssertionFailure() << "size " << got.numel() << " vs " << ref.numel();
  double ss_ref = 0.0, ss_diff = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = element_as_float(got, i), r = element_as_float(ref, i);
    ss_ref += r * r;
    ss_diff += (g - r) * (g - r);
  }
  const double rel = std::sqrt(ss_diff / std::max(ss_ref, 1e-300));
  if (rel <= tol) return ::testing::AssertionSuccess() << "rel L2 " << rel;
  return ::testing::AssertionFailure() << "rel L2 error " << rel << " > " << tol;
}

}  // namespace attnres::test
