// Depth-attention weights of one mixing step, for introspection (docs/ATTNRES.md §5), per token t:
//   logit_j = query . src_j / rms(src_j)  (+ bias for the partial)  rms(x) = sqrt(mean(x^2) + eps)
//   out[t, j] = softmax_j(logit)
// over the sources [null (constant logit)?] + bank[0, n) + [partial?] (docs/ATTNRES.md §2d); under
// pre_gated each bank source is sigmoid(gate logits[t]) * bank[j, t] first.
// Layout: query [d], bank [>= n, T, d] (first n live; f32 or bf16), partial [T, d],
// out [T, width], f32.
// The forward runs it only for steps where some request asked for the weights, so it favours
// clarity over the two-phase fusion of cpu_depth_mix.cpp: one pass per source computes the dot
// product and the sum of squares together (the same arithmetic as Phase 1's logits), then a
// max-subtracted softmax over the n + 1 logits. Parallel over tokens.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_simd.h"

namespace attnres {
namespace {

// query . x / rms(x), accumulated in f32 vectors like Phase 1; x f32 or (a bf16 bank's row)
// bf16, widened exactly.
template <DType B>
float source_logit(const float* query, const cpu::StoredT<B>* x, int64_t d, float eps) {
  cpu::VecF dot = cpu::vzero(), sq = cpu::vzero();
  int64_t i = 0;
  for (; i + cpu::kLanes <= d; i += cpu::kLanes) {
    const cpu::VecF xv = cpu::vload_w<B>(x + i);
    sq = cpu::vfma(xv, xv, sq);
    dot = cpu::vfma(cpu::vload(query + i), xv, dot);
  }
  float dot_sum = cpu::hsum(dot), ss = cpu::hsum(sq);
  for (; i < d; ++i) {
    const float xi = cpu::load_scalar<B>(x + i);  // explicit FMAs: see dots_and_squares
    dot_sum = std::fma(query[i], xi, dot_sum);
    ss = std::fma(xi, xi, ss);
  }
  return dot_sum / std::sqrt(ss / static_cast<float>(d) + eps);
}

// The logit of bank entry j at token t (pre_gated: of sigmoid(gate) * entry, formed in
// `gated`).
template <DType B>
float bank_logit(const float* query, const Tensor& bank, int j, int64_t t, int64_t t_dim, int64_t d,
                 float eps, const float* gate_row, std::vector<float>& gated) {
  const cpu::StoredT<B>* src =
      static_cast<const cpu::StoredT<B>*>(bank.data) + (static_cast<int64_t>(j) * t_dim + t) * d;
  if (!gate_row) return source_logit<B>(query, src, d, eps);
  gated.resize(d);
  for (int64_t i = 0; i < d; ++i) {
    gated[i] = cpu::load_scalar<B>(src + i) / (1.0f + std::exp(-gate_row[i]));
  }
  return source_logit<DType::F32>(query, gated.data(), d, eps);
}

}  // namespace

void CpuBackend::depth_weights_impl(const Tensor& query, const Tensor& bank, int n,
                                    const Tensor& partial, float bias, float eps, Tensor& out,
                                    const DepthSourceSwitches& sources) {
  const int64_t t_dim = partial.dim(0), d = partial.dim(1);
  cpu::check_on_cpu(partial, "depth_weights partial");
  cpu::check_on_cpu(query, "depth_weights query");
  cpu::check_on_cpu(bank, "depth_weights bank");
  cpu::check_on_cpu(out, "depth_weights out");
  const int width = sources.width(n);
  const Tensor* gate = sources.source_gate_logits;
  if (gate) cpu::check_on_cpu(*gate, "depth_weights source gate");

  const float* qp = query.ptr<float>();
  const float* pp = partial.ptr<float>();
  const float* gp = gate ? gate->ptr<float>() : nullptr;
  float* op = out.ptr<float>();
  const int first_bank = sources.has_null ? 1 : 0;
  const bool parallel = threads_ > 1 && t_dim > 1;
  pool_->parallel_for(t_dim, parallel, [&](int64_t t) {
    float* w = op + t * width;
    std::vector<float> gated;  // pre_gated: sigmoid(gate) * source, one source at a time
    if (sources.has_null) w[0] = sources.null_logit;
    const float* gate_row = gp ? gp + t * d : nullptr;
    for (int j = 0; j < n; ++j) {
      w[first_bank + j] =
          bank.dtype == DType::BF16
              ? bank_logit<DType::BF16>(qp, bank, j, t, t_dim, d, eps, gate_row, gated)
              : bank_logit<DType::F32>(qp, bank, j, t, t_dim, d, eps, gate_row, gated);
    }
    if (sources.partial_is_source) {
      w[width - 1] = source_logit<DType::F32>(qp, pp + t * d, d, eps) + bias;
    }
    const float big = *std::max_element(w, w + width);
    float sum = 0.0f;
    for (int j = 0; j < width; ++j) sum += (w[j] = std::exp(w[j] - big));
    const float inv = 1.0f / sum;
    for (int j = 0; j < width; ++j) w[j] *= inv;
  });
}

}  // namespace attnres
