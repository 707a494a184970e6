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

void CudaBackend::depth_phase1_impl(const Tensor& queries, const Tensor& bank, int n, float eps,
                                    Tensor& m, Tensor& s, Tensor& o,
                                    const Tensor* source_gate_logits) {
  const int64_t s_dim = queries.dim(0), d = queries.dim(1);
  check_cuda(queries, "depth_phase1 queries");
  check_cuda(bank, "depth_phase1 bank");
  const int64_t T = bank.dim(1);
  check_cuda(m, "depth_phase1 m");
  check_cuda(s, "depth_phase1 s");
  check_cuda(o, "depth_phase1 o");
  if (source_gate_logits) check_cuda(*source_gate_logits, "depth_phase1 source gate");
  const Impl& im = on_device();
  const float* gate = source_gate_logits ? f32(*source_gate_logits) : nullptr;
  const int queries_n = static_cast<int>(s_dim);
  if (im.depth_phase1_grouped &&
      cuda::launch_depth_phase1_grouped(f32(queries), queries_n, bank.data, bank.dtype, n, T, d,
                                        eps, f32(m), f32(s), f32(o), gate, im.stream))
    return;
  cuda::launch_depth_phase1(f32(queries), queries_n, bank.data, bank.dtype, n, T, d, eps, f32(m),
                            f32(s), f32(o), gate, im.stream);
}

void CudaBackend::depth_phase2_prenorm_impl(const DepthMixArgs& mix, const Tensor& partial,
                                            const Tensor& prenorm_gain, float norm_eps,
                                            Tensor& out) {
  const int64_t d = partial.dim(-1);
  check_cuda(partial, "depth_phase2 partial");
  check_cuda(out, "depth_phase2 out");
  const int64_t T = rows_of(partial);
  // Backend refused newer entries without a Phase-1 state (capabilities: mixes_without_phase1).
  const bool mixing = mix.m != nullptr;
  if (!mixing) return rms_norm_impl(partial, prenorm_gain, norm_eps, out);  // h = p

  if (mix.partial_is_source || mix.newer) check_cuda(*mix.query, "depth_phase2 query");
  if (mix.newer) check_cuda(*mix.newer, "depth_phase2 newer entries");
  check_cuda(*mix.m, "depth_phase2 m");
  check_cuda(*mix.s, "depth_phase2 s");
  check_cuda(*mix.o, "depth_phase2 o");
  check_cuda(prenorm_gain, "depth_phase2 gain");
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
    check_cuda(*mix.null_source, "depth_phase2 null source");
    p.null_source = f32(*mix.null_source);
    p.null_logit = mix.null_logit;
  }
  p.gate = mix.gate == DepthGate::Scalar ? 1 : mix.gate == DepthGate::Vector ? 2 : 0;
  p.gate_blend = mix.gate_blend;
  if (mix.gate == DepthGate::Vector) {
    check_cuda(*mix.gate_logits, "depth_phase2 gate logits");
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

void CudaBackend::depth_weights_impl(const Tensor& query, const Tensor& bank, int n,
                                     const Tensor& partial, float bias, float eps, Tensor& out,
                                     const DepthSourceSwitches& sources) {
  const int64_t T = partial.dim(0), d = partial.dim(1);
  check_cuda(partial, "depth_weights partial");
  check_cuda(query, "depth_weights query");
  check_cuda(bank, "depth_weights bank");
  check_cuda(out, "depth_weights out");
  cuda::DepthWeightsParams p;
  if (sources.source_gate_logits) {
    check_cuda(*sources.source_gate_logits, "depth_weights source gate");
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
