// Shared helpers for the CPU kernel tests: seeded random tensors in any dtype, the f32
// (double) view of their stored values, and a tolerance check that reports the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnres::test {

// Uniform(lo, hi) values stored as `dtype` (rounded the way the converters round).
inline Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937& rng, float lo = -1.0f,
                            float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) set_element_from_float(t, i, dist(rng));
  return t;
}

// The stored values widened to double: what the reference computes with.
inline std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = element_as_float(t, i);
  return v;
}

// Passes when |got[i] - ref[i]| <= rtol * (|ref[i]| + scale[i]) + atol for every i; scale
// (optional) is the magnitude of the terms that were summed (e.g. sum_k |x_k w_k|).
inline ::testing::AssertionResult all_close(const Tensor& got, const std::vector<double>& ref,
                                            double rtol, double atol = 0.0,
                                            const std::vector<double>* scale = nullptr) {
  if (got.numel() != static_cast<int64_t>(ref.size()))
    return ::testing::AssertionFailure() << "size " << got.numel() << " vs " << ref.size();
  const std::vector<double> g = values(got);
  double worst = 0.0;
  int64_t worst_i = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double bound = rtol * (std::fabs(ref[i]) + (scale ? (*scale)[i] : 0.0)) + atol;
    const double err = std::fabs(g[i] - ref[i]);
    if (!(err <= bound) && (worst_i < 0 || err / bound > worst)) {
      worst = err / bound;
      worst_i = static_cast<int64_t>(i);
    }
  }
  if (worst_i < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << worst_i << ": got " << g[worst_i] << " want " << ref[worst_i]
         << " (error " << worst << "x the tolerance)";
}

inline const char* name(DType t) { return dtype_name(t).data(); }

}  // namespace attnres::test
