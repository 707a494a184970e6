// The depth ops' docs/ATTNRES.md §2d switches, written out directly in double precision for the
// op tests (CPU here, CUDA in tests/cpp/kernels/cuda): one softmax over the listed sources, the
// residual base, the gate, the PreNorm. Independent of the two-phase form the ops use.
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {

// One combination of the switches.
struct ModeCase {
  bool partial_is_source = true;
  bool adds_partial = false;
  bool null_source = false;
  Backend::DepthGate gate = Backend::DepthGate::None;
  bool pre_gated = false;
  // The last `newer` of the n bank sources are left out of Phase 1 and merged by Phase 2 (a
  // step late in its group). Never with pre_gated, whose steps are groups of their own.
  int newer = 0;

  std::string describe() const {
    const char* gates[] = {"none", "scalar", "vector"};
    return std::string("partial source ") + (partial_is_source ? "yes" : "no") + ", adds partial " +
           (adds_partial ? "yes" : "no") + ", null " + (null_source ? "yes" : "no") + ", gate " +
           gates[static_cast<int>(gate)] + ", pre-gated " + (pre_gated ? "yes" : "no") +
           ", newer " + std::to_string(newer);
  }
};

inline std::vector<ModeCase> all_mode_cases() {
  std::vector<ModeCase> cases;
  for (bool partial : {true, false})
    for (bool adds : {false, true})
      for (bool null : {false, true})
        for (auto gate :
             {Backend::DepthGate::None, Backend::DepthGate::Scalar, Backend::DepthGate::Vector})
          for (bool pre : {false, true}) cases.push_back({partial, adds, null, gate, pre});
  return cases;
}

// Every combination without pre_gated, with `newer` newer entries.
inline std::vector<ModeCase> newer_mode_cases(int newer) {
  std::vector<ModeCase> cases;
  for (ModeCase c : all_mode_cases()) {
    if (c.pre_gated) continue;
    c.newer = newer;
    cases.push_back(c);
  }
  return cases;
}

// Random inputs, every value non-zero and O(1). The bank has one dead entry past n (NaN) so
// that reading it fails the comparison.
struct ModeInputs {
  Tensor bank, partial, query, gain, null_source, gate_logits;
  float bias = 0.0f, null_logit = 0.0f, gate_blend = 0.0f;

  static ModeInputs random(int n, int64_t t_dim, int64_t d, std::mt19937& rng) {
    ModeInputs in;
    in.bank = random_tensor({n + 1, t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
    float* dead = in.bank.ptr<float>() + n * t_dim * d;
    std::fill(dead, dead + t_dim * d, std::nanf(""));
    in.partial = random_tensor({t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
    in.query = random_tensor({d}, DType::F32, rng, -0.5f, 0.5f);
    in.gain = random_tensor({d}, DType::BF16, rng, 0.5f, 1.5f);
    in.null_source = random_tensor({d}, DType::F32, rng, -1.0f, 1.0f);
    in.gate_logits = random_tensor({t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    in.bias = u(rng);
    in.null_logit = u(rng);
    in.gate_blend = 0.5f + 0.4f * u(rng);
    return in;
  }
};

inline double sigmoid_of(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The sources of token t in the op's order ([null] + bank + [partial]) and their logits.
inline void reference_sources(const ModeCase& c, const ModeInputs& in, int n, int64_t t, float eps,
                              std::vector<std::vector<double>>& src, std::vector<double>& logit) {
  const std::vector<double> b = values(in.bank), p = values(in.partial), q = values(in.query),
                            nv = values(in.null_source), gl = values(in.gate_logits);
  const int64_t t_dim = in.partial.dim(0), d = in.partial.dim(1);
  auto logit_of = [&](const std::vector<double>& x) {
    double dot = 0, ss = 0;
    for (int64_t i = 0; i < d; ++i) dot += q[i] * x[i], ss += x[i] * x[i];
    return dot / std::sqrt(ss / static_cast<double>(d) + eps);
  };
  src.clear();
  logit.clear();
  if (c.null_source) {
    src.push_back(nv);
    logit.push_back(in.null_logit);
  }
  for (int j = 0; j < n; ++j) {
    std::vector<double> x(b.begin() + (j * t_dim + t) * d, b.begin() + (j * t_dim + t + 1) * d);
    if (c.pre_gated)
      for (int64_t i = 0; i < d; ++i) x[i] *= sigmoid_of(gl[t * d + i]);
    logit.push_back(logit_of(x));
    src.push_back(x);
  }
  if (c.partial_is_source) {
    std::vector<double> x(p.begin() + t * d, p.begin() + (t + 1) * d);
    logit.push_back(logit_of(x) + in.bias);
    src.push_back(x);
  }
}

inline std::vector<double> softmax_of(std::vector<double> logit) {
  double big = logit[0], sum = 0;
  for (double l : logit) big = std::max(big, l);
  for (double& l : logit) sum += (l = std::exp(l - big));
  for (double& l : logit) l /= sum;
  return logit;
}

// depth_phase2_prenorm's output [T, d].
inline std::vector<double> reference_mix(const ModeCase& c, const ModeInputs& in, int n, float eps,
                                         float norm_eps) {
  const int64_t t_dim = in.partial.dim(0), d = in.partial.dim(1);
  const std::vector<double> p = values(in.partial), g = values(in.gain),
                            gl = values(in.gate_logits);
  std::vector<double> out(t_dim * d);
  for (int64_t t = 0; t < t_dim; ++t) {
    std::vector<std::vector<double>> src;
    std::vector<double> logit;
    reference_sources(c, in, n, t, eps, src, logit);
    const std::vector<double> alpha = softmax_of(logit);
    std::vector<double> h(d);
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) {
      const double x = p[t * d + i];
      double hm = 0;
      for (size_t j = 0; j < src.size(); ++j) hm += alpha[j] * src[j][i];
      if (c.adds_partial) hm += x;
      double s = 1.0;  // the gate's weight on the mix
      if (c.gate == Backend::DepthGate::Scalar) s = in.gate_blend;
      if (c.gate == Backend::DepthGate::Vector) s = sigmoid_of(gl[t * d + i]);
      h[i] = (1 - s) * x + s * hm;
      ss += h[i] * h[i];
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + norm_eps);
    for (int64_t i = 0; i < d; ++i) out[t * d + i] = h[i] * inv * g[i];
  }
  return out;
}

// depth_weights' output [T, width].
inline std::vector<double> reference_weights(const ModeCase& c, const ModeInputs& in, int n,
                                             float eps) {
  std::vector<double> out;
  for (int64_t t = 0; t < in.partial.dim(0); ++t) {
    std::vector<std::vector<double>> src;
    std::vector<double> logit;
    reference_sources(c, in, n, t, eps, src, logit);
    for (double a : softmax_of(logit)) out.push_back(a);
  }
  return out;
}

// The op arguments for case c over one row of Phase-1 outputs; newer (case c.newer > 0) is
// the view of the bank's entries [n - c.newer, n).
inline Backend::DepthMixArgs mode_args(const ModeCase& c, const ModeInputs& in, const Tensor& m,
                                       const Tensor& s, const Tensor& o, float eps,
                                       const Tensor* newer = nullptr) {
  Backend::DepthMixArgs mix;
  mix.m = &m, mix.s = &s, mix.o = &o, mix.query = &in.query;
  mix.newer = c.newer > 0 ? newer : nullptr;
  mix.bias = in.bias;
  mix.mix_eps = eps;
  mix.partial_is_source = c.partial_is_source;
  mix.adds_partial = c.adds_partial;
  if (c.null_source) {
    mix.null_source = &in.null_source;
    mix.null_logit = in.null_logit;
  }
  mix.gate = c.gate;
  mix.gate_blend = in.gate_blend;
  mix.gate_logits = &in.gate_logits;
  return mix;
}

}  // namespace attnres::test
