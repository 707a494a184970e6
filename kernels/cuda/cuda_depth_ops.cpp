// CudaBackend depth ops: depth_phase1, depth_phase2_prenorm (cuda_depth_mix.cu) and
// depth_weights (cuda_depth_weights.cu).
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_op_checks.h"

namespace attnres {
using namespace cuda_ops;

static_assert(cuda::kMaxNewerSources == Backend::kMaxNewerSources,
              "the Phase-2 kernel's register arrays hold every newer entry the op accepts");

void CudaBackend::depth_phase1(const Tensor& queries, const Tensor& bank, int n, float eps,
                               Tensor& m, Tensor& s, Tensor& o, const Tensor* source_gate_logits) {
  ATTNRES_CHECK(queries.rank() == 2, "depth_phase1 queries " + shape_str(queries.shape));
  const int64_t s_dim = queries.dim(0), d = queries.dim(1);
  check_f32_rows(queries, d, "depth_phase1 queries");
  ATTNRES_CHECK(bank.rank() == 3 && n >= 1 && bank.dim(0) >= n,
                "depth_phase1 bank " + shape_str(bank.shape) + " n " + std::to_string(n));
  check_bank(bank, d, "depth_phase1 bank");
  const int64_t T = bank.dim(1);
  check_cuda(m, "depth_phase1 m");
  check_cuda(s, "depth_phase1 s");
  ATTNRES_CHECK(m.numel() == s_dim * T && s.numel() == s_dim * T && m.dtype == DType::F32 &&
                    s.dtype == DType::F32,
                "depth_phase1 m " + shape_str(m.shape) + " s " + shape_str(s.shape));
  check_f32_rows(o, d, "depth_phase1 o");
  ATTNRES_CHECK(o.numel() == s_dim * T * d, "depth_phase1 o " + shape_str(o.shape));
  if (source_gate_logits) {
    check_f32_rows(*source_gate_logits, d, "depth_phase1 source gate");
    ATTNRES_CHECK(source_gate_logits->numel() == T * d,
                  "depth_phase1 source gate " + shape_str(source_gate_logits->shape));
  }
  cuda::launch_depth_phase1(
      f32(queries), static_cast<int>(s_dim), bank.data, bank.dtype, n, T, d, eps, f32(m), f32(s),
      f32(o), source_gate_logits ? f32(*source_gate_logits) : nullptr, on_device().stream);
}

void CudaBackend::depth_phase2_prenorm(const DepthMixArgs& mix, const Tensor& partial,
                                       const Tensor& prenorm_gain, float norm_eps, Tensor& out) {
  ATTNRES_CHECK(partial.rank() >= 1, "depth_phase2 partial " + shape_str(partial.shape));
  const int64_t d = partial.dim(-1);
  check_f32_rows(partial, d, "depth_phase2 partial");
  check_activation_out(out, d, partial, "depth_phase2 out");
  const int64_t T = rows_of(partial);
  ATTNRES_CHECK(out.numel() == partial.numel(), "depth_phase2 out " + shape_str(out.shape));
  ATTNRES_CHECK(mix.m != nullptr || mix.newer == nullptr,
                "depth_phase2: newer entries without a Phase-1 state (not on this backend: "
                "mixes_without_phase1)");
  const bool mixing = mix.m != nullptr;
  if (!mixing) return rms_norm(partial, prenorm_gain, norm_eps, out);  // h = p

  if (mix.partial_is_source || mix.newer) {
    ATTNRES_CHECK(mix.query != nullptr,
                  "depth_phase2: the partial or a newer bank entry is a source but has no query");
    check_f32_rows(*mix.query, d, "depth_phase2 query");
    ATTNRES_CHECK(mix.query->numel() == d, "depth_phase2 query " + shape_str(mix.query->shape));
  }
  if (mix.newer) {
    check_bank(*mix.newer, d, "depth_phase2 newer entries");
    ATTNRES_CHECK(mix.newer->rank() == 3 && mix.newer->dim(0) >= 1 &&
                      mix.newer->dim(0) <= kMaxNewerSources && mix.newer->dim(1) == T,
                  "depth_phase2 newer entries " + shape_str(mix.newer->shape));
  }
  ATTNRES_CHECK(mix.s && mix.o, "depth_phase2: m given without s / o");
  check_cuda(*mix.m, "depth_phase2 m");
  check_cuda(*mix.s, "depth_phase2 s");
  ATTNRES_CHECK(mix.m->dtype == DType::F32 && mix.s->dtype == DType::F32 && mix.m->numel() == T &&
                    mix.s->numel() == T,
                "depth_phase2 m " + shape_str(mix.m->shape) + " s " + shape_str(mix.s->shape));
  check_f32_rows(*mix.o, d, "depth_phase2 o");
  ATTNRES_CHECK(mix.o->numel() == T * d, "depth_phase2 o " + shape_str(mix.o->shape));
  check_float_vector(prenorm_gain, d, "depth_phase2 gain");
  if (is_plain_mix(mix)) {
    cuda::launch_depth_phase2_prenorm(f32(*mix.m), f32(*mix.s), f32(*mix.o), f32(*mix.query),
                                      mix.bias, mix.mix_eps, f32(partial), prenorm_gain.data,
                                      prenorm_gain.dtype, norm_eps, T, d, out.data, out.dtype,
                                      on_device().stream);
    return;
  }
  cuda::DepthPhase2Params p;
  p.m = f32(*mix.m);
  p.s = f32(*mix.s);
  p.o = f32(*mix.o);
  p.query = mix.partial_is_source || mix.newer ? f32(*mix.query) : nullptr;
  p.partial_is_source = mix.partial_is_source;
  if (mix.newer) {
    p.newer = mix.newer->data;
    p.newer_dtype = mix.newer->dtype;
    p.num_newer = static_cast<int>(mix.newer->dim(0));
  }
  p.bias = mix.bias;
  p.mix_eps = mix.mix_eps;
  p.adds_partial = mix.adds_partial;
  if (mix.null_source) {
    check_f32_rows(*mix.null_source, d, "depth_phase2 null source");
    ATTNRES_CHECK(mix.null_source->numel() == d,
                  "depth_phase2 null source " + shape_str(mix.null_source->shape));
    p.null_source = f32(*mix.null_source);
    p.null_logit = mix.null_logit;
  }
  p.gate = mix.gate == DepthGate::Scalar ? 1 : mix.gate == DepthGate::Vector ? 2 : 0;
  p.gate_blend = mix.gate_blend;
  if (mix.gate == DepthGate::Vector) {
    ATTNRES_CHECK(mix.gate_logits != nullptr, "depth_phase2: vector gate without gate logits");
    check_f32_rows(*mix.gate_logits, d, "depth_phase2 gate logits");
    ATTNRES_CHECK(mix.gate_logits->numel() == T * d,
                  "depth_phase2 gate logits " + shape_str(mix.gate_logits->shape));
    p.gate_logits = f32(*mix.gate_logits);
  }
  p.partial = f32(partial);
  p.gain = prenorm_gain.data;
  p.gain_dtype = prenorm_gain.dtype;
  p.norm_eps = norm_eps;
  p.num_tokens = T;
  p.d = d;
  p.out = out.data;
  p.out_dtype = out.dtype;
  if (out.dtype != DType::F32 && d > cuda::kMaxPhase2StagedBf16Row) {
    // A row too long for the kernel's shared-memory staging: f32 into scratch, then rounded
    // (the same bits, one more pass).
    Tensor wide = alloc(out.shape, DType::F32);
    p.out = wide.data;
    p.out_dtype = DType::F32;
    cuda::launch_depth_phase2_general(p, on_device().stream);
    copy(wide, out);
    return;
  }
  cuda::launch_depth_phase2_general(p, on_device().stream);
}

void CudaBackend::depth_weights(const Tensor& query, const Tensor& bank, int n,
                                const Tensor& partial, float bias, float eps, Tensor& out,
                                const DepthSourceSwitches& sources) {
  ATTNRES_CHECK(partial.rank() == 2, "depth_weights partial " + shape_str(partial.shape));
  const int64_t T = partial.dim(0), d = partial.dim(1);
  check_f32_rows(partial, d, "depth_weights partial");
  check_f32_rows(query, d, "depth_weights query");
  ATTNRES_CHECK(query.numel() == d, "depth_weights query " + shape_str(query.shape));
  ATTNRES_CHECK(bank.rank() == 3 && n >= 1 && bank.dim(0) >= n && bank.dim(1) == T,
                "depth_weights bank " + shape_str(bank.shape) + " n " + std::to_string(n) + " T " +
                    std::to_string(T));
  check_bank(bank, d, "depth_weights bank");
  check_f32_rows(out, sources.width(n), "depth_weights out");
  ATTNRES_CHECK(rows_of(out) == T, "depth_weights out " + shape_str(out.shape));
  cuda::DepthWeightsParams p;
  if (sources.source_gate_logits) {
    check_f32_rows(*sources.source_gate_logits, d, "depth_weights source gate");
    ATTNRES_CHECK(sources.source_gate_logits->numel() == T * d,
                  "depth_weights source gate " + shape_str(sources.source_gate_logits->shape));
    p.source_gate_logits = f32(*sources.source_gate_logits);
  }
  p.query = f32(query);
  p.bank = bank.data;
  p.bank_dtype = bank.dtype;
  p.n = n;
  p.partial = sources.partial_is_source ? f32(partial) : nullptr;
  p.bias = bias;
  p.has_null = sources.has_null;
  p.null_logit = sources.null_logit;
  p.eps = eps;
  p.num_tokens = T;
  p.d = d;
  p.out = f32(out);
  cuda::launch_depth_weights(p, on_device().stream);
}

}  // namespace attnres
