// CudaBackend's decode projections with the sublayer's PreNorm as their prologue
// (prenorm_linear_many, prenorm_linear_swiglu: cuda_gemv_prenorm.cu), the attention front
// whole, RoPE and the KV store as the QKV GEMV's epilogue (prenorm_qkv_rope_store:
// cuda_gemv_rope.cu), and, under the persistent MLP lever, the MLP sublayer whole
// (prenorm_mlp_residual: cuda_persistent_mlp.cu).
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

std::optional<cuda::GemvPrenorm> cuda_ops::gemv_prenorm(const Backend::PrenormArgs& in) {
  const Tensor& partial = *in.partial;
  check_cuda(partial, "prenorm partial");
  check_cuda(*in.normed, "prenorm normed");
  check_cuda(*in.gain, "prenorm gain");
  cuda::GemvPrenorm g;
  g.partial = f32(partial);
  g.gain = in.gain->data;
  g.gain_dtype = in.gain->dtype;
  g.eps = in.eps;
  const Backend::DepthMixArgs& mix = in.mix;
  if (!mix.m) return g;  // the plain pre-norm: h = p
  if (!is_plain_mix(mix)) return std::nullopt;
  check_cuda(*mix.m, "prenorm m");
  check_cuda(*mix.s, "prenorm s");
  check_cuda(*mix.o, "prenorm o");
  check_cuda(*mix.query, "prenorm query");
  g.m = f32(*mix.m);
  g.s = f32(*mix.s);
  g.o = f32(*mix.o);
  g.query = f32(*mix.query);
  g.bias = mix.bias;
  g.mix_eps = mix.mix_eps;
  return g;
}

void CudaBackend::prenorm_linear_many_impl(const PrenormArgs& in,
                                           std::span<const LinearTarget> targets) {
  Impl& im = on_device();
  const std::optional<cuda::GemvPrenorm> prenorm = gemv_prenorm(in);
  bool fused = prenorm && !targets.empty() && targets.size() <= cuda::kMaxGemvSegments;
  cuda::GemvSegments segments;
  for (const LinearTarget& t : targets) {
    // The linears' checks, with the partial standing for x (the normed rows' shape).
    const auto seg = gemv_segment(*in.partial, *t.w, t.bias, *t.out, targets[0].w->dtype);
    fused = fused && seg.has_value();
    if (fused) segments.seg[segments.count++] = *seg;
  }
  const int64_t rows = rows_of(*in.partial);
  if (fused && rows > 0 &&
      cuda::launch_gemv_prenorm_many(*prenorm, rows, in.partial->dim(-1), targets[0].w->dtype,
                                     segments, im.stream)) {
    return;
  }
  Backend::prenorm_linear_many_impl(in, targets);  // prefill, or a mix the prologue does not take
}

void CudaBackend::prenorm_linear_swiglu_impl(const PrenormArgs& in, const Tensor& w_gate,
                                             const Tensor* b_gate, const Tensor& w_up,
                                             const Tensor* b_up, Tensor& gate, Tensor& up,
                                             Tensor& out) {
  Impl& im = on_device();
  const std::optional<cuda::GemvPrenorm> prenorm = gemv_prenorm(in);
  const auto g = gemv_segment(*in.partial, w_gate, b_gate, gate, w_gate.dtype);
  const auto u = gemv_segment(*in.partial, w_up, b_up, up, w_gate.dtype);
  check_cuda(out, "linear_swiglu out");  // BF16 in a prefill
  const int64_t rows = rows_of(*in.partial);
  if (prenorm && g && u && rows > 0 && out.dtype == DType::F32 &&
      cuda::launch_gemv_prenorm_swiglu(*prenorm, rows, in.partial->dim(-1), w_gate.dtype, *g, *u,
                                       f32(out), im.stream)) {
    return;
  }
  Backend::prenorm_linear_swiglu_impl(in, w_gate, b_gate, w_up, b_up, gate, up, out);
}

void CudaBackend::prenorm_mlp_residual_impl(const PrenormArgs& in, const Tensor& w_gate,
                                            const Tensor* b_gate, const Tensor& w_up,
                                            const Tensor* b_up, Tensor& gate, Tensor& up,
                                            Tensor& act, const Tensor& w_down,
                                            const Tensor* b_down, const Tensor& residual,
                                            Tensor& out) {
  Impl& im = on_device();
  if (im.persistent_mlp) {
    // The checks of the calls it stands for: the linears (the partial standing for the normed
    // rows, act for down's x), the PreNorm's (gemv_prenorm) and the residual's.
    const std::optional<cuda::GemvPrenorm> prenorm = gemv_prenorm(in);
    const auto g = gemv_segment(*in.partial, w_gate, b_gate, gate, w_gate.dtype);
    const auto u = gemv_segment(*in.partial, w_up, b_up, up, w_gate.dtype);
    auto d = gemv_segment(act, w_down, b_down, out, w_gate.dtype);
    check_cuda(residual, "prenorm_mlp_residual residual");
    const int64_t rows = rows_of(*in.partial);
    if (prenorm && g && u && d && rows > 0) {
      cuda::PersistentMlpArgs args;
      args.prenorm = *prenorm;
      args.rows = rows;
      args.d = in.partial->dim(-1);
      args.intermediate = w_gate.dim(0);
      args.w_dtype = w_gate.dtype;
      args.gate = *g;
      args.up = *u;
      args.act = f32(act);
      args.down = *d;
      args.down.residual = f32(residual);
      args.barrier = im.persistent_mlp_barrier;
      if (cuda::launch_persistent_mlp(args, im.stream)) return;
    }
  }
  // The lever off, a prefill, or shapes the kernel declines: the two ops, as CUDA runs them.
  Backend::prenorm_mlp_residual_impl(in, w_gate, b_gate, w_up, b_up, gate, up, act, w_down, b_down,
                                     residual, out);
}

void CudaBackend::prenorm_qkv_rope_store_impl(const PrenormArgs& in,
                                              std::span<const LinearTarget, 3> qkv,
                                              const RopeStoreArgs& rope) {
  Impl& im = on_device();
  const BatchMeta& batch = *rope.batch;
  KvCacheLayer& cache = *rope.cache;
  // The checks of the calls it stands for: the linears (the partial standing for the normed
  // rows), qk_norm_rope, store_kv, and the PreNorm's (gemv_prenorm).
  cuda::GemvRopeArgs args;
  bool fused = true;
  for (const LinearTarget& t : qkv) {
    const auto seg = gemv_segment(*in.partial, *t.w, t.bias, *t.out, qkv[0].w->dtype);
    fused = fused && seg.has_value();
    if (fused) args.qkv.seg[args.qkv.count++] = *seg;
  }
  args.rope = checked_rope(*qkv[0].out, *qkv[1].out, rope.head_dim, rope.q_gain, rope.k_gain,
                           rope.eps, *rope.inv_freq, batch);
  check_store_kv(*qkv[1].out, *qkv[2].out, batch, cache);
  const std::optional<cuda::GemvPrenorm> prenorm = gemv_prenorm(in);
  args.rows = rows_of(*in.partial);
  args.K = in.partial->dim(-1);
  args.w_dtype = qkv[0].w->dtype;
  args.rope.v = f32(*qkv[2].out);
  args.rope.cache_dtype = cache.k.dtype;
  args.rope.k_cache = cache.k.data;
  args.rope.v_cache = cache.v.data;
  if (fused) {
    // The PreNorm as the prologue: one launch.
    args.prenorm = prenorm ? &*prenorm : nullptr;
    const bool with_prologue = prenorm && cuda::gemv_rope_takes(args);
    // A mix the prologue does not compute: the PreNorm's own launch, then the GEMV from normed.
    args.prenorm = with_prologue ? &*prenorm : nullptr;
    args.x = with_prologue ? nullptr : f32(*in.normed);
    if (with_prologue || cuda::gemv_rope_takes(args)) {
      im.ensure_prepared(*this, batch);
      im.validate_against_cache(batch, cache);
      args.rope.positions = im.positions;
      args.rope.slots = im.slot_mapping;
      if (!with_prologue) {
        depth_phase2_prenorm_impl(in.mix, *in.partial, *in.gain, in.eps, *in.normed);
      }
      cuda::launch_gemv_rope(args, im.stream);
      return;
    }
  }
  Backend::prenorm_qkv_rope_store_impl(in, qkv, rope);  // prefill, or shapes the kernel declines
}

}  // namespace attnres
