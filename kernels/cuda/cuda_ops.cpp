// CudaBackend ops: validate shapes / dtypes / devices on the host (ATTNRES_CHECK, like the
// CPU reference), then launch on the backend stream. Batch metadata comes from the device
// buffers prepare_batch filled; the checks that need the cache shape (slots, block ids,
// positions against block tables) run on the host once per prepared batch and cache shape.
//
// linear: up to 8 rows (decode) run the GEMV kernel of cuda_gemv.cu (x stays f32, bias
// fused, matches the CPU to f32 rounding). More rows go through cuBLAS. Weights are [N, K]
// row-major, which is column-major [K, N]; x [R, K] row-major is column-major [K, R]; out [R, N]
// row-major is column-major [N, R]. So
//   out_cm[N, R] = W_cm^T [N, K] * x_cm [K, R]:  cublasGemmEx(OP_T, OP_N, m=N, n=R, k=K,
//   A=W lda=K, B=x ldb=K, C=out ldc=N)
// F32 weights: an f32 GEMM with CUBLAS_COMPUTE_32F (no TF32), matching the CPU to f32
// rounding. BF16 / F16 weights: cuBLAS needs A and B of one type, so an f32 x is first rounded
// to the weight dtype into a scratch buffer (launch_convert_from_f32); the GEMM accumulates
// in f32 and writes f32. A bf16 x (linear_input_dtype: the forward had its producer write it
// rounded, the same bits) goes to the GEMM as it is, whatever its row count. That rounding of the
// activations (the CPU keeps them f32) makes the result match the CPU to bf16 precision (~1e-3
// relative), not f32. The GEMM is cuBLASLt's (cuda_lt_gemm.h) with an f32 bias in its epilogue; a
// bias of another dtype is a separate small kernel (the model widens its biases to f32 at load, so
// that is rare).
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres {
static_assert(cuda::kMaxNewerSources == Backend::kMaxNewerSources,
              "the Phase-2 kernel's register arrays hold every newer entry the op accepts");
namespace {

int64_t rows_of(const Tensor& t) {
  if (t.rank() == 0) return 1;
  return t.dim(-1) ? t.numel() / t.dim(-1) : 0;
}

void check_cuda(const Tensor& t, const char* what) {
  ATTNRES_CHECK(t.defined() || t.numel() == 0, std::string(what) + " is undefined");
  ATTNRES_CHECK(t.device == Device::CUDA, std::string(what) + " is not a CUDA tensor");
}

// A CUDA f32 tensor whose last dimension is n.
void check_f32_rows(const Tensor& t, int64_t n, const char* what) {
  check_cuda(t, what);
  ATTNRES_CHECK(t.dtype == DType::F32,
                std::string(what) + " must be F32, got " + std::string(dtype_name(t.dtype)));
  ATTNRES_CHECK(t.rank() >= 1 && t.dim(-1) == n, std::string(what) + " " + shape_str(t.shape) +
                                                     ": last dim must be " + std::to_string(n));
}

// A CUDA vector of n floats of any float dtype (gains, biases).
void check_float_vector(const Tensor& t, int64_t n, const char* what) {
  check_cuda(t, what);
  ATTNRES_CHECK(t.numel() == n && t.dtype != DType::I32,
                std::string(what) + " " + shape_str(t.shape) + " " +
                    std::string(dtype_name(t.dtype)) + ": expected " + std::to_string(n) +
                    " float values");
}

// A CUDA depth bank (or a view of its entries) whose last dimension is d, of a dtype the depth
// kernels read (cuda_backend_capabilities().depth_bank_dtypes: F32, BF16).
void check_bank(const Tensor& t, int64_t d, const char* what) {
  check_cuda(t, what);
  ATTNRES_CHECK(cuda_backend_capabilities().depth_bank_dtypes.contains(t.dtype),
                std::string(what) + " is " + std::string(dtype_name(t.dtype)) +
                    ": the CUDA depth ops read an F32 or BF16 bank");
  ATTNRES_CHECK(t.rank() >= 1 && t.dim(-1) == d, std::string(what) + " " + shape_str(t.shape) +
                                                     ": last dim must be " + std::to_string(d));
}

// A linear's x: a CUDA tensor whose last dimension is k, F32, or BF16 (linear_input_dtype).
void check_linear_input(const Tensor& x, int64_t k, const char* what) {
  check_cuda(x, what);
  ATTNRES_CHECK(
      x.dtype == DType::F32 || x.dtype == DType::BF16,
      std::string(what) + " must be F32 or BF16, got " + std::string(dtype_name(x.dtype)));
  ATTNRES_CHECK(x.rank() >= 1 && x.dim(-1) == k, std::string(what) + " " + shape_str(x.shape) +
                                                     ": last dim must be " + std::to_string(k));
}

// An op's out that may hold a linear's input: F32, or BF16 (then apart from the op's f32
// input `in`, which an f32 out may alias).
void check_activation_out(const Tensor& out, int64_t n, const Tensor& in, const char* what) {
  check_linear_input(out, n, what);
  if (out.dtype == DType::F32) return;
  const auto* o0 = static_cast<const char*>(out.data);
  const auto* i0 = static_cast<const char*>(in.data);
  ATTNRES_CHECK(
      out.nbytes() == 0 || in.nbytes() == 0 || o0 + out.nbytes() <= i0 || i0 + in.nbytes() <= o0,
      std::string(what) + ": a BF16 out must not overlap the input");
}

float* f32(Tensor& t) { return t.ptr<float>(); }
const float* f32(const Tensor& t) { return t.ptr<float>(); }

}  // namespace

void CudaBackend::embedding(const Tensor& table, const BatchMeta& batch, Tensor& out) {
  Impl& im = on_device();
  check_cuda(table, "embedding table");
  ATTNRES_CHECK(table.rank() == 2, "embedding table " + shape_str(table.shape));
  const int64_t vocab = table.dim(0), d = table.dim(1);
  check_f32_rows(out, d, "embedding out");
  const int64_t T = rows_of(out);
  ATTNRES_CHECK(T == batch.num_tokens && static_cast<int64_t>(batch.token_ids.size()) == T,
                "embedding: T mismatch");
  im.ensure_prepared(*this, batch);
  if (T == 0) return;
  // Ids were range-summarised on the host in prepare_batch: a bad id never reaches the GPU.
  if (im.min_token_id < 0 || im.max_token_id >= vocab) {
    const int32_t bad = im.min_token_id < 0 ? im.min_token_id : im.max_token_id;
    ATTNRES_CHECK(false, "embedding: token id " + std::to_string(bad) +
                             " outside the vocabulary of " + std::to_string(vocab));
  }
  cuda::launch_embedding(table.data, table.dtype, im.token_ids, T, d, f32(out), im.stream);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& gain, float eps, Tensor& out) {
  ATTNRES_CHECK(x.rank() >= 1, "rms_norm x " + shape_str(x.shape));
  const int64_t n = x.dim(-1);
  check_f32_rows(x, n, "rms_norm x");
  check_activation_out(out, n, x, "rms_norm out");
  ATTNRES_CHECK(out.numel() == x.numel(),
                "rms_norm x " + shape_str(x.shape) + " out " + shape_str(out.shape));
  check_float_vector(gain, n, "rms_norm gain");
  cuda::launch_rms_norm(f32(x), gain.data, gain.dtype, eps, rows_of(x), n, out.data, out.dtype,
                        on_device().stream);
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  Impl& im = on_device();
  check_cuda(w, "linear w");
  ATTNRES_CHECK(w.rank() == 2, "linear w " + shape_str(w.shape));
  const int64_t n_dim = w.dim(0), k_dim = w.dim(1);
  check_linear_input(x, k_dim, "linear x");
  check_f32_rows(out, n_dim, "linear out");
  const int64_t r_dim = rows_of(x);
  ATTNRES_CHECK(rows_of(out) == r_dim, "linear x " + shape_str(x.shape) + " out " +
                                           shape_str(out.shape) + " w " + shape_str(w.shape));
  ATTNRES_CHECK(x.data != out.data || r_dim == 0, "linear: out must not alias x");
  const bool bf16_x = x.dtype == DType::BF16;
  ATTNRES_CHECK(!bf16_x || w.dtype == DType::BF16,
                "linear: a BF16 x needs BF16 weights (the GEMM reads both in one type), got w " +
                    std::string(dtype_name(w.dtype)));
  if (bias) check_float_vector(*bias, n_dim, "linear bias");
  if (r_dim == 0 || n_dim == 0) return;
  // decode: f32 x, bias fused, one launch
  if (r_dim <= cuda::kMaxGemvRows && k_dim > 0 && !bf16_x) {
    cuda::launch_gemv(f32(x), r_dim, w.data, w.dtype, bias ? bias->data : nullptr,
                      bias ? bias->dtype : DType::F32, k_dim, n_dim, f32(out), im.stream);
    return;
  }
  if (k_dim == 0) {  // empty sum: out = bias or 0
    fill_zero(out);
  } else {
    ATTNRES_CHECK(n_dim <= INT32_MAX && k_dim <= INT32_MAX && r_dim <= INT32_MAX,
                  "linear: dimension too large for cuBLAS int arguments");
    const int m = static_cast<int>(n_dim), n = static_cast<int>(r_dim), k = static_cast<int>(k_dim);
    const float alpha = 1.0f, beta = 0.0f;
    const void* b_ptr = x.data;
    cudaDataType_t ab_type = CUDA_R_32F;
    if (bf16_x) {
      ab_type = CUDA_R_16BF;  // rounded by its producer: no conversion
    } else if (w.dtype == DType::BF16 || w.dtype == DType::F16) {
      ab_type = w.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
      const size_t bytes = static_cast<size_t>(r_dim * k_dim) * 2;
      if (bytes > im.act_scratch_bytes) {
        const size_t grown = std::max(bytes, im.act_scratch_bytes * 2);
        im.act_scratch = im.raw_alloc(grown);  // stream-ordered reuse of the old block is safe
        im.act_scratch_bytes = grown;
      }
      cuda::launch_convert_from_f32(f32(x), im.act_scratch.get(), w.dtype, r_dim * k_dim,
                                    im.stream);
      b_ptr = im.act_scratch.get();
    } else {
      ATTNRES_CHECK(w.dtype == DType::F32,
                    "linear w dtype " + std::string(dtype_name(w.dtype)) + " is not supported");
    }
    // cuBLASLt, an f32 bias in its epilogue; cublasGemmEx where it has no algorithm.
    const float* epilogue_bias =
        bias && bias->dtype == DType::F32 ? static_cast<const float*>(bias->data) : nullptr;
    const cuda::LtGemmArgs gemm{r_dim, k_dim,         n_dim,   ab_type, w.data,
                                b_ptr, epilogue_bias, nullptr, f32(out)};
    im.launch->cublas_calls.fetch_add(1, std::memory_order_relaxed);
    if (im.lt_gemm->run(gemm, im.stream)) {
      if (epilogue_bias) return;
    } else {
      CUBLAS_CHECK(cublasGemmEx(im.cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w.data,
                                ab_type, k, b_ptr, ab_type, k, &beta, out.data, CUDA_R_32F, m,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
  if (bias) cuda::launch_add_bias(f32(out), bias->data, bias->dtype, r_dim, n_dim, im.stream);
}

void CudaBackend::linear_residual(const Tensor& x, const Tensor& w, const Tensor* bias,
                                  const Tensor& residual, Tensor& out) {
  Impl& im = on_device();
  check_cuda(residual, "linear_residual residual");
  check_cuda(out, "linear_residual out");
  check_cuda(x, "linear_residual x");
  check_residual_operands(x, residual, out);
  check_cuda(w, "linear w");
  ATTNRES_CHECK(w.rank() == 2, "linear w " + shape_str(w.shape));
  const int64_t n_dim = w.dim(0), k_dim = w.dim(1);
  check_linear_input(x, k_dim, "linear x");
  check_f32_rows(out, n_dim, "linear out");
  const int64_t r_dim = rows_of(x);
  ATTNRES_CHECK(rows_of(out) == r_dim, "linear x " + shape_str(x.shape) + " out " +
                                           shape_str(out.shape) + " w " + shape_str(w.shape));
  if (bias) check_float_vector(*bias, n_dim, "linear bias");
  // prefill (or a bf16 x): cuBLAS, then the add
  if (r_dim > cuda::kMaxGemvRows || k_dim == 0 || x.dtype != DType::F32) {
    Backend::linear_residual(x, w, bias, residual, out);
    return;
  }
  cuda::launch_gemv_residual(f32(x), r_dim, w.data, w.dtype, bias ? bias->data : nullptr,
                             bias ? bias->dtype : DType::F32, k_dim, n_dim, f32(residual), f32(out),
                             im.stream);
}

namespace {

// A decode-sized GEMV segment for linear_many / linear_swiglu, after the checks linear() does;
// nullopt when the fused launch does not apply (more rows than the GEMV takes, an empty
// reduction, a weight dtype other than the first segment's, or a bf16 x).
std::optional<cuda::GemvSegment> gemv_segment(const Tensor& x, const Tensor& w, const Tensor* bias,
                                              Tensor& out, DType first_dtype) {
  check_cuda(w, "linear w");
  ATTNRES_CHECK(w.rank() == 2, "linear w " + shape_str(w.shape));
  const int64_t n_dim = w.dim(0), k_dim = w.dim(1);
  check_linear_input(x, k_dim, "linear x");
  check_f32_rows(out, n_dim, "linear out");
  ATTNRES_CHECK(rows_of(out) == rows_of(x), "linear x " + shape_str(x.shape) + " out " +
                                                shape_str(out.shape) + " w " + shape_str(w.shape));
  ATTNRES_CHECK(x.data != out.data || rows_of(x) == 0, "linear: out must not alias x");
  if (bias) check_float_vector(*bias, n_dim, "linear bias");
  if (rows_of(x) > cuda::kMaxGemvRows || k_dim == 0 || w.dtype != first_dtype ||
      x.dtype != DType::F32)
    return std::nullopt;
  return cuda::GemvSegment{
      w.data, bias ? bias->data : nullptr, bias ? bias->dtype : DType::F32, n_dim, f32(out),
      nullptr};
}

}  // namespace

void CudaBackend::linear_many(const Tensor& x, std::span<const LinearTarget> targets) {
  Impl& im = on_device();
  cuda::GemvSegments segments;
  bool fused = !targets.empty() && targets.size() <= cuda::kMaxGemvSegments;
  for (const LinearTarget& t : targets) {
    const auto seg = gemv_segment(x, *t.w, t.bias, *t.out, targets[0].w->dtype);
    fused = fused && seg.has_value();
    if (fused) segments.seg[segments.count++] = *seg;
  }
  if (!fused || rows_of(x) == 0) {  // the prefill path: cuBLAS per target
    Backend::linear_many(x, targets);
    return;
  }
  cuda::launch_gemv_many(f32(x), rows_of(x), x.dim(-1), targets[0].w->dtype, segments, im.stream);
}

void CudaBackend::linear_swiglu(const Tensor& x, const Tensor& w_gate, const Tensor* b_gate,
                                const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up,
                                Tensor& out) {
  Impl& im = on_device();
  const auto g = gemv_segment(x, w_gate, b_gate, gate, w_gate.dtype);
  const auto u = gemv_segment(x, w_up, b_up, up, w_gate.dtype);
  // A prefill's out may be BF16: the down projection's input, rounded by swiglu's store.
  check_linear_input(out, w_gate.dim(0), "linear_swiglu out");
  ATTNRES_CHECK(rows_of(out) == rows_of(x) && w_up.dim(0) == w_gate.dim(0),
                "linear_swiglu: gate " + shape_str(w_gate.shape) + " up " + shape_str(w_up.shape) +
                    " out " + shape_str(out.shape));
  if (!g || !u || rows_of(x) == 0 || out.dtype != DType::F32) {  // prefill: two GEMMs, swiglu
    Backend::linear_swiglu(x, w_gate, b_gate, w_up, b_up, gate, up, out);
    return;
  }
  cuda::launch_gemv_swiglu(f32(x), rows_of(x), x.dim(-1), w_gate.dtype, *g, *u, f32(out),
                           im.stream);
}

namespace {

// qk_norm_rope's checks; the kernel's parameters (all but the cache's).
cuda::RopeStoreParams checked_rope(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                                   const Tensor* k_gain, float eps, const Tensor& inv_freq,
                                   const BatchMeta& batch) {
  const int64_t hd = head_dim;
  ATTNRES_CHECK(hd > 0 && hd % 2 == 0, "qk_norm_rope head_dim " + std::to_string(hd));
  ATTNRES_CHECK(q.rank() >= 1 && k.rank() >= 1 && q.dim(-1) % hd == 0 && k.dim(-1) % hd == 0,
                "qk_norm_rope q " + shape_str(q.shape) + " k " + shape_str(k.shape));
  check_f32_rows(q, q.dim(-1), "qk_norm_rope q");
  check_f32_rows(k, k.dim(-1), "qk_norm_rope k");
  const int64_t T = rows_of(q);
  ATTNRES_CHECK(
      rows_of(k) == T && T == batch.num_tokens && static_cast<int64_t>(batch.positions.size()) == T,
      "qk_norm_rope: T mismatch");
  check_cuda(inv_freq, "qk_norm_rope inv_freq");
  ATTNRES_CHECK(inv_freq.dtype == DType::F32 && inv_freq.numel() == hd / 2,
                "qk_norm_rope inv_freq " + shape_str(inv_freq.shape) + " must be F32 [hd / 2]");
  const bool has_qg = q_gain && q_gain->defined(), has_kg = k_gain && k_gain->defined();
  if (has_qg) check_float_vector(*q_gain, hd, "q_gain");
  if (has_kg) check_float_vector(*k_gain, hd, "k_gain");
  cuda::RopeStoreParams p;
  p.q = f32(q);
  p.k = f32(k);
  p.num_tokens = T;
  p.hq = static_cast<int>(q.dim(-1) / hd);
  p.hkv = static_cast<int>(k.dim(-1) / hd);
  p.head_dim = static_cast<int>(hd);
  p.q_gain = has_qg ? q_gain->data : nullptr;
  p.q_gain_dtype = has_qg ? q_gain->dtype : DType::F32;
  p.k_gain = has_kg ? k_gain->data : nullptr;
  p.k_gain_dtype = has_kg ? k_gain->dtype : DType::F32;
  p.eps = eps;
  p.inv_freq = f32(inv_freq);
  return p;
}

}  // namespace

namespace {

// The Phase-2 merge without the §2d switches or newer entries (block mode's): the one
// launch_depth_phase2_prenorm and the GEMV's PreNorm prologue compute.
bool is_plain_mix(const Backend::DepthMixArgs& mix) {
  return mix.partial_is_source && !mix.newer && !mix.adds_partial && !mix.null_source &&
         mix.gate == Backend::DepthGate::None;
}

// The GEMV prologue's form of a PreNorm (cuda_gemv_prenorm.cu), after depth_phase2_prenorm's
// checks on what it reads; nullopt for a mix the prologue does not compute (the §2d switches,
// newer entries), which the two-launch default then runs.
std::optional<cuda::GemvPrenorm> gemv_prenorm(const Backend::PrenormArgs& in) {
  ATTNRES_CHECK(in.partial && in.gain && in.normed,
                "prenorm: partial, gain and normed are required");
  const Tensor& partial = *in.partial;
  ATTNRES_CHECK(partial.rank() >= 1, "prenorm partial " + shape_str(partial.shape));
  const int64_t d = partial.dim(-1), T = rows_of(partial);
  check_f32_rows(partial, d, "prenorm partial");
  check_linear_input(*in.normed, d, "prenorm normed");
  ATTNRES_CHECK(
      in.normed->numel() == partial.numel(),
      "prenorm normed " + shape_str(in.normed->shape) + " partial " + shape_str(partial.shape));
  check_float_vector(*in.gain, d, "prenorm gain");
  cuda::GemvPrenorm g;
  g.partial = f32(partial);
  g.gain = in.gain->data;
  g.gain_dtype = in.gain->dtype;
  g.eps = in.eps;
  const Backend::DepthMixArgs& mix = in.mix;
  if (!mix.m) return g;  // the plain pre-norm: h = p
  if (!is_plain_mix(mix)) return std::nullopt;
  ATTNRES_CHECK(mix.s && mix.o && mix.query, "prenorm: m given without s, o or the query");
  check_cuda(*mix.m, "prenorm m");
  check_cuda(*mix.s, "prenorm s");
  ATTNRES_CHECK(mix.m->dtype == DType::F32 && mix.s->dtype == DType::F32 && mix.m->numel() == T &&
                    mix.s->numel() == T,
                "prenorm m " + shape_str(mix.m->shape) + " s " + shape_str(mix.s->shape));
  check_f32_rows(*mix.o, d, "prenorm o");
  ATTNRES_CHECK(mix.o->numel() == T * d, "prenorm o " + shape_str(mix.o->shape));
  check_f32_rows(*mix.query, d, "prenorm query");
  ATTNRES_CHECK(mix.query->numel() == d, "prenorm query " + shape_str(mix.query->shape));
  g.m = f32(*mix.m);
  g.s = f32(*mix.s);
  g.o = f32(*mix.o);
  g.query = f32(*mix.query);
  g.bias = mix.bias;
  g.mix_eps = mix.mix_eps;
  return g;
}

}  // namespace

void CudaBackend::prenorm_linear_many(const PrenormArgs& in,
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
  Backend::prenorm_linear_many(in, targets);  // prefill, or a mix the prologue does not take
}

void CudaBackend::prenorm_linear_swiglu(const PrenormArgs& in, const Tensor& w_gate,
                                        const Tensor* b_gate, const Tensor& w_up,
                                        const Tensor* b_up, Tensor& gate, Tensor& up, Tensor& out) {
  Impl& im = on_device();
  const std::optional<cuda::GemvPrenorm> prenorm = gemv_prenorm(in);
  const auto g = gemv_segment(*in.partial, w_gate, b_gate, gate, w_gate.dtype);
  const auto u = gemv_segment(*in.partial, w_up, b_up, up, w_gate.dtype);
  check_linear_input(out, w_gate.dim(0), "linear_swiglu out");  // BF16 in a prefill
  ATTNRES_CHECK(rows_of(out) == rows_of(*in.partial) && w_up.dim(0) == w_gate.dim(0),
                "linear_swiglu: gate " + shape_str(w_gate.shape) + " up " + shape_str(w_up.shape) +
                    " out " + shape_str(out.shape));
  const int64_t rows = rows_of(*in.partial);
  if (prenorm && g && u && rows > 0 && out.dtype == DType::F32 &&
      cuda::launch_gemv_prenorm_swiglu(*prenorm, rows, in.partial->dim(-1), w_gate.dtype, *g, *u,
                                       f32(out), im.stream)) {
    return;
  }
  Backend::prenorm_linear_swiglu(in, w_gate, b_gate, w_up, b_up, gate, up, out);
}

void CudaBackend::qk_norm_rope(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                               const Tensor* k_gain, float eps, const Tensor& inv_freq,
                               const BatchMeta& batch) {
  Impl& im = on_device();
  const cuda::RopeStoreParams p =
      checked_rope(q, k, head_dim, q_gain, k_gain, eps, inv_freq, batch);
  im.ensure_prepared(*this, batch);
  cuda::launch_qk_norm_rope(p.q, p.k, p.num_tokens, p.hq, p.hkv, p.head_dim, p.q_gain,
                            p.q_gain_dtype, p.k_gain, p.k_gain_dtype, p.eps, p.inv_freq,
                            im.positions, im.stream);
}

namespace {

void check_cache(const KvCacheLayer& cache) {
  ATTNRES_CHECK(cache.k.rank() == 4 && cache.k.shape == cache.v.shape,
                "kv cache k " + shape_str(cache.k.shape) + " v " + shape_str(cache.v.shape));
  ATTNRES_CHECK(cache.k.dtype == cache.v.dtype &&
                    cuda_backend_capabilities().kv_cache_dtypes.contains(cache.k.dtype),
                "the CUDA kv cache must be F32 or BF16 (k " +
                    std::string(dtype_name(cache.k.dtype)) + ", v " +
                    std::string(dtype_name(cache.v.dtype)) + ")");
  ATTNRES_CHECK(cache.k.device == Device::CUDA && cache.v.device == Device::CUDA,
                "kv cache must be on the CUDA device");
}

// The host-side checks the CPU makes inline: every slot inside the cache, every block id
// valid, every position inside its sequence's context and block table.
void validate_batch_against_cache(const BatchMeta& batch, int64_t num_blocks, int64_t block_size) {
  const int64_t slots = num_blocks * block_size;
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int64_t slot = batch.slot_mapping[t];
    ATTNRES_CHECK(slot >= 0 && slot < slots, "store_kv slot " + std::to_string(slot) +
                                                 " out of range " + std::to_string(slots));
  }
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const auto& table = batch.block_tables[s];
    for (int64_t b : table)
      ATTNRES_CHECK(b >= 0 && b < num_blocks, "attention: block id " + std::to_string(b));
    for (int64_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) {
      const int64_t pos = batch.positions[t];
      ATTNRES_CHECK(pos >= 0 && pos < batch.context_len[s] &&
                        pos < static_cast<int64_t>(table.size()) * block_size,
                    "attention: position " + std::to_string(pos) + " outside the context");
    }
  }
}

// store_kv's checks; the cache row's values (Hkv * hd).
int64_t check_store_kv(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                       const KvCacheLayer& cache) {
  check_cache(cache);
  const int64_t row = cache.k.dim(2) * cache.k.dim(3);  // Hkv * hd
  check_f32_rows(k, row, "store_kv k");
  check_f32_rows(v, row, "store_kv v");
  const int64_t T = rows_of(k);
  ATTNRES_CHECK(rows_of(v) == T && T == batch.num_tokens &&
                    static_cast<int64_t>(batch.slot_mapping.size()) == T,
                "store_kv: T mismatch");
  return row;
}

}  // namespace

void CudaBackend::Impl::validate_against_cache(const BatchMeta& batch, const KvCacheLayer& cache) {
  if (validated_num_blocks == cache.k.dim(0) && validated_block_size == cache.k.dim(1)) return;
  validate_batch_against_cache(batch, cache.k.dim(0), cache.k.dim(1));
  validated_num_blocks = cache.k.dim(0);
  validated_block_size = cache.k.dim(1);
}

void CudaBackend::store_kv(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                           KvCacheLayer& cache) {
  Impl& im = on_device();
  const int64_t row = check_store_kv(k, v, batch, cache);
  im.ensure_prepared(*this, batch);
  im.validate_against_cache(batch, cache);
  cuda::launch_store_kv(f32(k), f32(v), im.slot_mapping, rows_of(k), row, cache.k.data,
                        cache.v.data, cache.k.dtype, im.stream);
}

void CudaBackend::qk_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, int head_dim,
                                     const Tensor* q_gain, const Tensor* k_gain, float eps,
                                     const Tensor& inv_freq, const BatchMeta& batch,
                                     KvCacheLayer& cache) {
  Impl& im = on_device();
  cuda::RopeStoreParams p = checked_rope(q, k, head_dim, q_gain, k_gain, eps, inv_freq, batch);
  check_store_kv(k, v, batch, cache);
  ATTNRES_CHECK(cache.k.dim(3) == head_dim, "qk_norm_rope_store head_dim " +
                                                std::to_string(head_dim) + " vs cache " +
                                                shape_str(cache.k.shape));
  im.ensure_prepared(*this, batch);
  im.validate_against_cache(batch, cache);
  p.v = f32(v);
  p.positions = im.positions;
  p.slots = im.slot_mapping;
  p.k_cache = cache.k.data;
  p.v_cache = cache.v.data;
  p.cache_dtype = cache.k.dtype;
  cuda::launch_qk_norm_rope_store(p, im.stream);
}

void CudaBackend::prenorm_qkv_rope_store(const PrenormArgs& in,
                                         std::span<const LinearTarget, 3> qkv,
                                         const RopeStoreArgs& rope) {
  Impl& im = on_device();
  ATTNRES_CHECK(in.partial && in.normed && rope.inv_freq && rope.batch && rope.cache,
                "prenorm_qkv_rope_store: partial, normed, inv_freq, batch and cache are required");
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
  ATTNRES_CHECK(cache.k.dim(3) == rope.head_dim, "prenorm_qkv_rope_store head_dim " +
                                                     std::to_string(rope.head_dim) + " vs cache " +
                                                     shape_str(cache.k.shape));
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
      if (!with_prologue) depth_phase2_prenorm(in.mix, *in.partial, *in.gain, in.eps, *in.normed);
      cuda::launch_gemv_rope(args, im.stream);
      return;
    }
  }
  Backend::prenorm_qkv_rope_store(in, qkv, rope);  // prefill, or shapes the kernel declines
}

void CudaBackend::attention(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
                            int head_dim, float scale, Tensor& out) {
  Impl& im = on_device();
  check_cache(cache);
  const int64_t hd = head_dim, hkv = cache.k.dim(2);
  ATTNRES_CHECK(hd > 0 && cache.k.dim(3) == hd, "attention head_dim " + std::to_string(hd) +
                                                    " vs cache " + shape_str(cache.k.shape));
  ATTNRES_CHECK(hd <= cuda::kMaxAttentionHeadDim,
                "attention: head_dim " + std::to_string(hd) + " above the CUDA kernel's 256");
  ATTNRES_CHECK(q.rank() >= 1 && q.dim(-1) % hd == 0, "attention q " + shape_str(q.shape));
  const int64_t hq = q.dim(-1) / hd;
  ATTNRES_CHECK(hq % hkv == 0, "attention: Hq must be a multiple of Hkv");
  check_f32_rows(q, hq * hd, "attention q");
  check_activation_out(out, hq * hd, q, "attention out");
  const int64_t T = rows_of(q);
  ATTNRES_CHECK(rows_of(out) == T && T == batch.num_tokens &&
                    static_cast<int64_t>(batch.positions.size()) == T,
                "attention: T mismatch");
  ATTNRES_CHECK(q.data != out.data || T == 0, "attention: out must not alias q");
  im.ensure_prepared(*this, batch);
  im.validate_against_cache(batch, cache);
  // Prefill chunks (a sequence with at least kPrefillMinRows rows) on tensor cores, every
  // other row by flash-decoding; the prepared batch holds the plan (cuda_attention_dispatch.h).
  // A shape the prefill kernel does not take leaves every row to flash-decoding.
  const cuda::AttentionDispatch& dispatch = im.attention_dispatch;
  const bool use_prefill = !dispatch.tiles.empty() &&
                           cuda::prefill_attention_supports(static_cast<int>(hd), cache.k.dtype,
                                                            cache.k.data, cache.v.data) &&
                           reinterpret_cast<uintptr_t>(q.data) % 8 == 0 &&
                           reinterpret_cast<uintptr_t>(out.data) % 8 == 0;
  cuda::PagedCacheAttention common;
  common.q = f32(q);
  common.k_cache = cache.k.data;
  common.v_cache = cache.v.data;
  common.kv_dtype = cache.k.dtype;
  common.positions = im.positions;
  common.block_table = im.block_table;
  common.max_blocks = im.max_blocks;
  common.hq = static_cast<int>(hq);
  common.hkv = static_cast<int>(hkv);
  common.head_dim = static_cast<int>(hd);
  common.block_size = static_cast<int>(cache.k.dim(1));
  common.scale = scale;
  common.out = out.data;
  common.out_dtype = out.dtype;
  if (use_prefill) {
    cuda::PrefillAttentionArgs pre;
    static_cast<cuda::PagedCacheAttention&>(pre) = common;
    pre.tiles = im.prefill_tiles;
    pre.num_tiles = static_cast<int>(dispatch.tiles.size());
    cuda::launch_prefill_attention(pre, im.stream);
    if (dispatch.decode_rows.empty()) return;
  }
  cuda::PagedAttentionArgs args;
  static_cast<cuda::PagedCacheAttention&>(args) = common;
  args.seq_of_token = im.seq_of_token;
  args.num_tokens = use_prefill ? static_cast<int64_t>(dispatch.decode_rows.size()) : T;
  args.rows = use_prefill ? im.decode_rows : nullptr;
  // Split the context across CTAs when the batch alone cannot fill the GPU (decode at small
  // batch); the partial results live in scratch until the merge kernel has read them (the
  // block returns to the cache when `partials` dies, stream-ordered like every tensor).
  int max_context = 0;
  if (use_prefill) {
    max_context = dispatch.decode_max_context;
  } else {
    for (int32_t pos : batch.positions) max_context = std::max(max_context, pos + 1);
  }
  const cuda::AttentionSplitPlan plan =
      cuda::plan_attention_splits(args.num_tokens, args.hq, args.hkv, max_context, im.sm_count);
  args.num_splits = plan.num_splits;
  args.split_len = plan.split_len;
  std::shared_ptr<void> partials;
  if (const int64_t floats = cuda::attention_partial_floats(args); floats > 0) {
    partials = im.raw_alloc(static_cast<size_t>(floats) * sizeof(float));
    args.partials = static_cast<float*>(partials.get());
  }
  cuda::launch_paged_attention(args, im.stream);
}

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  ATTNRES_CHECK(gate.rank() >= 1, "swiglu gate " + shape_str(gate.shape));
  const int64_t n = gate.dim(-1);
  check_f32_rows(gate, n, "swiglu gate");
  check_f32_rows(up, n, "swiglu up");
  check_activation_out(out, n, gate, "swiglu out");
  check_activation_out(out, n, up, "swiglu out");
  const int64_t total = gate.numel();
  ATTNRES_CHECK(up.numel() == total && out.numel() == total, "swiglu: shape mismatch");
  cuda::launch_swiglu(f32(gate), f32(up), out.data, out.dtype, total, on_device().stream);
}

void CudaBackend::add_inplace(Tensor& x, const Tensor& y) {
  ATTNRES_CHECK(x.shape == y.shape && x.dtype == DType::F32 && y.dtype == DType::F32,
                "add_inplace x " + shape_str(x.shape) + " y " + shape_str(y.shape));
  check_cuda(x, "add_inplace x");
  check_cuda(y, "add_inplace y");
  cuda::launch_add_inplace(f32(x), f32(y), x.numel(), on_device().stream);
}

void CudaBackend::gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  Impl& im = on_device();
  ATTNRES_CHECK(x.rank() >= 1 && out.rank() >= 1 && x.dtype == out.dtype,
                "gather_rows x " + shape_str(x.shape) + " out " + shape_str(out.shape));
  check_cuda(x, "gather_rows x");
  check_cuda(out, "gather_rows out");
  const int64_t r_dim = x.dim(0);
  const int64_t n_out = static_cast<int64_t>(rows.size());
  ATTNRES_CHECK(out.dim(0) == n_out &&
                    (r_dim == 0 || out.numel() / std::max<int64_t>(n_out, 1) == x.numel() / r_dim),
                "gather_rows x " + shape_str(x.shape) + " out " + shape_str(out.shape));
  ATTNRES_CHECK(x.data != out.data || n_out == 0, "gather_rows: x and out must not alias");
  for (int64_t i = 0; i < n_out; ++i)
    ATTNRES_CHECK(rows[i] >= 0 && rows[i] < r_dim, "gather_rows: row " + std::to_string(rows[i]));
  const size_t row_bytes = r_dim ? x.nbytes() / static_cast<size_t>(r_dim) : 0;
  if (n_out == 0 || row_bytes == 0) return;

  // Upload the row ids through a pinned buffer (reused once the previous copy is done).
  const size_t count = static_cast<size_t>(n_out);
  if (im.capturing()) {
    // See Impl::meta_staged_in_capture.
    ATTNRES_CHECK(!im.rows_staged_in_capture,
                  "gather_rows: a captured step may gather host rows once (every copy in the "
                  "graph would read the last rows staged)");
    ATTNRES_CHECK(count <= im.rows_host_count,
                  "gather_rows: these rows need a larger pinned staging buffer, which cannot be "
                  "allocated during a graph capture: run the step eagerly once first");
    im.rows_staged_in_capture = true;
  } else {
    CUDA_CHECK(cudaEventSynchronize(im.rows_copied));  // an eager copy's or a replay's
  }
  if (count > im.rows_host_count) {
    const size_t grown = std::max(count, im.rows_host_count * 2);
    im.rows_host.reset();
    im.rows_host_count = 0;
    im.rows_host = im.pinned_host(grown * sizeof(int32_t));
    im.rows_host_count = grown;
  }
  if (count > im.rows_device_count) {
    const size_t grown = std::max(count, im.rows_device_count * 2);
    im.rows_device = im.raw_alloc(grown * sizeof(int32_t));
    im.rows_device_count = grown;
  }
  int32_t* rows_host = static_cast<int32_t*>(im.rows_host.get());
  std::copy(rows.begin(), rows.end(), rows_host);
  im.rows_staged = n_out;
  int32_t* rows_dev = static_cast<int32_t*>(im.rows_device.get());
  CUDA_CHECK(cudaMemcpyAsync(rows_dev, rows_host, count * sizeof(int32_t), cudaMemcpyHostToDevice,
                             im.stream));
  if (!im.capturing()) CUDA_CHECK(cudaEventRecord(im.rows_copied, im.stream));  // not in a graph
  cuda::launch_gather_rows(x.data, rows_dev, n_out, row_bytes, out.data, im.stream);
}

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

// Backend::sample (cuda_sampling.cu). The parameters and ids go up in one copy from the
// persistent pinned staging, the ids come back into it, and the call waits for them (the
// engine reads them next). No allocation once the staging has grown to the batch.
// Not capturable, and not meant to be (kernels/cuda/NOTES.md, "Sampling"): the decode graphs
// end before the LM head, and a graph would replay the parameters of the step it captured.
void CudaBackend::sample(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) {
  sample(logits, batch, out, 0);
}

// The same queued work as sample(); the wait moves to wait_sampled(), so the host can prepare
// the next step while this one's forward and sampling run (async scheduling).
void CudaBackend::sample_async(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) {
  queue_sample(logits, batch, out, 0, /*wait=*/false);
}

void CudaBackend::wait_sampled() {
  Impl& im = on_device();
  if (!im.sample_pending) return;
  im.sample_pending = false;
  CUDA_CHECK(cudaEventSynchronize(im.sample_ids_copied));
  std::memcpy(im.sample_out.data(), static_cast<char*>(im.sample_host.get()) + im.sample_out_offset,
              im.sample_out.size_bytes());
  im.sample_out = {};
}

void CudaBackend::sample(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out,
                         int ctas_per_row) {
  queue_sample(logits, batch, out, ctas_per_row, /*wait=*/true);
}

void CudaBackend::queue_sample(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out,
                               int ctas_per_row, bool wait) {
  // A call still in flight reads and writes the staging rewritten below: finish it first.
  wait_sampled();
  const int64_t rows = static_cast<int64_t>(batch.rows.size());
  ATTNRES_CHECK(logits.rank() == 2 && logits.dim(0) >= rows,
                "sample: logits " + shape_str(logits.shape) + " for " + std::to_string(rows) +
                    " rows (expected F32 [>= rows, vocab])");
  const int64_t vocab = logits.dim(1);
  check_f32_rows(logits, vocab, "sample: logits");
  ATTNRES_CHECK(
      static_cast<int64_t>(out.size()) == rows,
      "sample: " + std::to_string(out.size()) + " outputs for " + std::to_string(rows) + " rows");
  ATTNRES_CHECK(vocab > 0 && vocab < (int64_t{1} << 20),
                "sample: a vocabulary of " + std::to_string(vocab) +
                    " (the kernel's fixed-point masses need fewer than 2^20 ids)");
  if (rows == 0) return;
  // The CPU op's checks (sample_row), here on the host before anything is launched.
  const int64_t num_ids = static_cast<int64_t>(batch.token_ids.size());
  for (int32_t id : batch.token_ids) {
    ATTNRES_CHECK(id >= 0 && id < vocab, "sample: token id " + std::to_string(id) +
                                             " outside vocab " + std::to_string(vocab));
  }
  bool needs_counts = false;
  for (int64_t r = 0; r < rows; ++r) {
    const SampleRow& row = batch.rows[r];
    for (auto [begin, count] : {std::pair{row.prompt_begin, row.prompt_count},
                                std::pair{row.output_begin, row.output_count},
                                std::pair{row.blocked_begin, row.blocked_count}}) {
      ATTNRES_CHECK(begin >= 0 && count >= 0 && int64_t{begin} + count <= num_ids,
                    "sample: ids [" + std::to_string(begin) + ", +" + std::to_string(count) +
                        ") outside the batch's " + std::to_string(num_ids) + " ids");
    }
    needs_counts = needs_counts || row.presence_penalty != 0.0f || row.frequency_penalty != 0.0f;
  }
  Impl& im = on_device();
  ATTNRES_CHECK(!im.capturing(), "sample: cannot run inside a CUDA graph capture");
  if (ctas_per_row == 0) ctas_per_row = cuda::plan_sample_ctas_per_row(rows, vocab, im.sm_count);

  // Staging: grown (rarely), never shrunk. The last call was waited for, so nothing reads it.
  const cuda::SampleStagingLayout layout = cuda::sample_staging_layout(rows, num_ids);
  if (layout.total_bytes > im.sample_host_bytes) {
    const size_t grown = cuda::grown_staging_bytes(im.sample_host_bytes, layout.total_bytes);
    im.sample_host.reset();  // freed first: the peak is the new one alone
    im.sample_host_bytes = 0;
    im.sample_host = im.pinned_host(grown);
    im.sample_host_bytes = grown;
  }
  if (layout.total_bytes > im.sample_device_bytes) {
    const size_t grown = cuda::grown_staging_bytes(im.sample_device_bytes, layout.total_bytes);
    im.sample_device = im.raw_alloc(grown);  // the old block returns to the cache
    im.sample_device_bytes = grown;
  }
  const size_t counts_bytes =
      needs_counts ? static_cast<size_t>(rows * vocab) * sizeof(int32_t) : 0;
  if (counts_bytes > im.sample_counts_bytes) {
    const size_t grown = cuda::grown_staging_bytes(im.sample_counts_bytes, counts_bytes);
    im.sample_counts = im.raw_alloc(grown);
    im.sample_counts_bytes = grown;
    CUDA_CHECK(cudaMemsetAsync(im.sample_counts.get(), 0, grown, im.stream));
  }

  char* host = static_cast<char*>(im.sample_host.get());
  char* device = static_cast<char*>(im.sample_device.get());
  std::memcpy(host, batch.rows.data(), batch.rows.size() * sizeof(SampleRow));
  if (num_ids) {
    std::memcpy(host + layout.ids_offset, batch.token_ids.data(),
                static_cast<size_t>(num_ids) * sizeof(int32_t));
  }
  CUDA_CHECK(cudaMemcpyAsync(device, host, layout.upload_bytes, cudaMemcpyHostToDevice, im.stream));
  // Null until a call has a penalty row: only such rows read counts.
  int32_t* counts = static_cast<int32_t*>(im.sample_counts.get());
  cuda::launch_sample(
      f32(logits), rows, vocab, batch.decodable, reinterpret_cast<const SampleRow*>(device),
      reinterpret_cast<const int32_t*>(device + layout.ids_offset), counts,
      reinterpret_cast<int32_t*>(device + layout.out_offset), ctas_per_row, im.stream);
  const size_t out_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  CUDA_CHECK(cudaMemcpyAsync(host + layout.out_offset, device + layout.out_offset, out_bytes,
                             cudaMemcpyDeviceToHost, im.stream));
  if (!wait) {
    CUDA_CHECK(cudaEventRecord(im.sample_ids_copied, im.stream));
    im.sample_out = out;
    im.sample_out_offset = layout.out_offset;
    im.sample_pending = true;
    return;
  }
  CUDA_CHECK(cudaStreamSynchronize(im.stream));
  std::memcpy(out.data(), host + layout.out_offset, out_bytes);
}

}  // namespace attnres
