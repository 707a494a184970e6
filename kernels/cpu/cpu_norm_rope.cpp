// rms_norm and qk_norm_rope.
//
// rms_norm: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * gain, f32 rows [R, n], gain [n] in
// any float dtype (widened in registers). Two passes over the row (sum of squares, then
// scale), both in L1; because pass 2 reads x[i] before writing out[i], x and out may alias.
// out may be bf16 (a linear's input rows, CpuBackend::linear_input_dtype): the f32 result
// rounded at the store. Parallel over rows when there are enough of them.
//
// qk_norm_rope: in place on q [T, Hq * hd] and k [T, Hkv * hd]. Per head of hd values:
// optional RMSNorm with a per-head gain [hd] (Qwen3 q_norm / k_norm), then the rotate-half
// rotary embedding: with x1 = x[:hd/2], x2 = x[hd/2:], angle_i = pos * inv_freq[i],
//   out1 = x1 cos - x2 sin,  out2 = x2 cos + x1 sin.
// The cos/sin table is computed once per token (shared by all its heads) in double from
// the f32 inv_freq, then rounded to f32, so it matches a float64 reference to f32 rounding;
// and once per forward: the backend keeps the last call's table, which every later layer of
// the step (same positions, same frequencies) reads again (the sincos were 0.7% of a 100M
// prefill's samples).
#include <cmath>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_simd.h"

namespace attnres {
namespace {

using cpu::kLanes;
using cpu::VecF;

// OutT: float, or uint16_t for bf16 rows (a linear's input, CpuBackend::linear_input_dtype).
template <DType G, class OutT>
void rms_norm_row(const float* x, const cpu::StoredT<G>* gain, float eps, int64_t n, OutT* out) {
  const float inv_rms = 1.0f / std::sqrt(cpu::sum_squares_f32(x, n) / static_cast<float>(n) + eps);
  const VecF vs = cpu::vset1(inv_rms);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    cpu::vstore_as(out + i, cpu::vmul(cpu::vmul(cpu::vload(x + i), vs), cpu::vload_w<G>(gain + i)));
  for (; i < n; ++i) cpu::store_as(out + i, x[i] * inv_rms * cpu::load_scalar<G>(gain + i));
}

template <DType G, class OutT>
void rms_norm_rows(const float* x, const void* gain, float eps, int64_t rows, int64_t n, OutT* out,
                   cpu::WorkerPool& pool) {
  const auto* g = static_cast<const cpu::StoredT<G>*>(gain);
  const bool parallel = pool.size() > 1 && rows > 1 && rows * n >= (1 << 14);
  pool.parallel_for(rows, parallel,
                    [&](int64_t r) { rms_norm_row<G>(x + r * n, g, eps, n, out + r * n); });
}

template <DType G>
void rms_norm_into(const Tensor& x, const void* gain, float eps, int64_t rows, int64_t n,
                   Tensor& out, cpu::WorkerPool& pool) {
  if (out.dtype == DType::BF16) {
    rms_norm_rows<G>(x.ptr<float>(), gain, eps, rows, n, out.ptr<uint16_t>(), pool);
  } else {
    rms_norm_rows<G>(x.ptr<float>(), gain, eps, rows, n, out.ptr<float>(), pool);
  }
}

// In place: optional per-head RMSNorm (gain may be empty), then rotate-half RoPE.
void norm_rope_head(float* x, int64_t hd, const std::vector<float>& gain, float eps,
                    const float* cos_t, const float* sin_t) {
  if (!gain.empty()) {
    const float inv_rms =
        1.0f / std::sqrt(cpu::sum_squares_f32(x, hd) / static_cast<float>(hd) + eps);
    for (int64_t i = 0; i < hd; ++i) x[i] = x[i] * inv_rms * gain[i];
  }
  const int64_t half = hd / 2;
  float* x1 = x;
  float* x2 = x + half;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x1[i], b = x2[i];
    x1[i] = a * cos_t[i] - b * sin_t[i];
    x2[i] = b * cos_t[i] + a * sin_t[i];
  }
}

}  // namespace

void CpuBackend::rms_norm_impl(const Tensor& x, const Tensor& gain, float eps, Tensor& out) {
  cpu::check_on_cpu(x, "rms_norm x");
  cpu::check_on_cpu(out, "rms_norm out");
  cpu::check_on_cpu(gain, "rms_norm gain");
  const int64_t n = x.dim(-1);
  const int64_t rows = cpu::rows_of(x);
  switch (gain.dtype) {
    case DType::F32:
      return rms_norm_into<DType::F32>(x, gain.data, eps, rows, n, out, *pool_);
    case DType::BF16:
      return rms_norm_into<DType::BF16>(x, gain.data, eps, rows, n, out, *pool_);
    case DType::F16:
      return rms_norm_into<DType::F16>(x, gain.data, eps, rows, n, out, *pool_);
    default:
      ATTNRES_CHECK(false, "rms_norm gain dtype " + std::string(dtype_name(gain.dtype)));
  }
}

void CpuBackend::qk_norm_rope_impl(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                                   const Tensor* k_gain, float eps, const Tensor& inv_freq,
                                   const BatchMeta& batch) {
  const int64_t hd = head_dim;
  cpu::check_on_cpu(q, "qk_norm_rope q");
  cpu::check_on_cpu(k, "qk_norm_rope k");
  const int64_t t_dim = cpu::rows_of(q);
  const int64_t hq = q.dim(-1) / hd, hkv = k.dim(-1) / hd, half = hd / 2;
  std::vector<float> freq = cpu::widen_vector(inv_freq, half, "qk_norm_rope inv_freq");
  const std::vector<float> qg =
      q_gain && q_gain->defined() ? cpu::widen_vector(*q_gain, hd, "q_gain") : std::vector<float>{};
  const std::vector<float> kg =
      k_gain && k_gain->defined() ? cpu::widen_vector(*k_gain, hd, "k_gain") : std::vector<float>{};
  const RopeTable& table = rope_table(batch.positions, std::move(freq));
  const bool parallel = threads_ > 1 && t_dim > 1;
  pool_->run(parallel ? threads_ : 1, [&](int tid, int team) {
    for (int64_t t : cpu::static_block(t_dim, tid, team)) {
      const float* cos_t = table.cos.data() + t * half;
      const float* sin_t = table.sin.data() + t * half;
      float* qt = q.ptr<float>() + t * hq * hd;
      for (int64_t h = 0; h < hq; ++h) norm_rope_head(qt + h * hd, hd, qg, eps, cos_t, sin_t);
      float* kt = k.ptr<float>() + t * hkv * hd;
      for (int64_t h = 0; h < hkv; ++h) norm_rope_head(kt + h * hd, hd, kg, eps, cos_t, sin_t);
    }
  });
}

const CpuBackend::RopeTable& CpuBackend::rope_table(const std::vector<int32_t>& positions,
                                                    std::vector<float> inv_freq) {
  RopeTable& table = rope_table_;
  if (table.positions == positions && table.inv_freq == inv_freq) return table;
  const int64_t t_dim = static_cast<int64_t>(positions.size());
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  table.positions.clear();  // invalid until filled
  table.cos.resize(static_cast<size_t>(t_dim * half));
  table.sin.resize(table.cos.size());
  const bool parallel = threads_ > 1 && t_dim > 1;
  pool_->run(parallel ? threads_ : 1, [&](int tid, int team) {
    for (int64_t t : cpu::static_block(t_dim, tid, team)) {
      const double pos = positions[t];
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos * static_cast<double>(inv_freq[i]);
        table.cos[t * half + i] = static_cast<float>(std::cos(angle));
        table.sin[t * half + i] = static_cast<float>(std::sin(angle));
      }
    }
  });
  table.inv_freq = std::move(inv_freq);
  table.positions = positions;
  return table;
}

}  // namespace attnres
