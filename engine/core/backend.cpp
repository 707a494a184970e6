// Backend's public ops: each checks what its contract in backend.h says of the operands (their
// shapes and dtypes against each other and the batch, which may alias which), once for every
// backend, then calls the backend's body (<op>_impl). What a body still checks is its device's
// own: that the tensors live on its device, the dtypes and sizes its kernels take.
#include "engine/core/backend.h"

#include <algorithm>
#include <string>

#include "engine/core/sample_bitmask.h"

namespace attnres {
namespace {

int64_t rows_of(const Tensor& t) {
  if (t.rank() == 0) return 1;
  return t.dim(-1) ? t.numel() / t.dim(-1) : 0;
}

std::string described(const Tensor& t) {
  return shape_str(t.shape) + " " + std::string(dtype_name(t.dtype));
}

// t has rank >= 1 and last dimension n.
void check_last_dim(const Tensor& t, int64_t n, const char* what) {
  ATTNRES_CHECK(t.rank() >= 1 && t.dim(-1) == n, std::string(what) + " " + shape_str(t.shape) +
                                                     ": last dim must be " + std::to_string(n));
}

// The same, of dtype F32.
void check_f32(const Tensor& t, int64_t n, const char* what) {
  check_last_dim(t, n, what);
  ATTNRES_CHECK(t.dtype == DType::F32, std::string(what) + " must be F32, got " + described(t));
}

// The same, F32 or BF16: a tensor linear_input_dtype may have made BF16.
void check_f32_or_bf16(const Tensor& t, int64_t n, const char* what) {
  check_last_dim(t, n, what);
  ATTNRES_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16,
                std::string(what) + " must be F32 or BF16, got " + described(t));
}

// A vector of n values of a float dtype (gains, biases, inverse frequencies).
void check_float_vector(const Tensor& t, int64_t n, const char* what) {
  ATTNRES_CHECK(
      t.numel() == n && t.dtype != DType::I32 && !is_block_quantized(t.dtype),
      std::string(what) + " " + described(t) + ": expected " + std::to_string(n) + " float values");
}

bool apart(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.data);
  const auto* b0 = static_cast<const char*>(b.data);
  return a.nbytes() == 0 || b.nbytes() == 0 || a0 + a.nbytes() <= b0 || b0 + b.nbytes() <= a0;
}

// An op's out that may be BF16 (a linear's input rows): then apart from the f32 input `in`,
// which an f32 out may alias where the op says so.
void check_activation_out(const Tensor& out, int64_t n, const Tensor& in, const char* what) {
  check_f32_or_bf16(out, n, what);
  ATTNRES_CHECK(out.dtype == DType::F32 || apart(out, in),
                std::string(what) + ": a BF16 out must not overlap the input");
}

// A weight the backend reads as stored (BackendCapabilities::weight_dtypes); a BF16 x only
// with BF16 weights on a backend that takes bf16 linear inputs (both are read in one type).
void check_linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out,
                  const BackendCapabilities& caps) {
  ATTNRES_CHECK(w.rank() == 2, "linear w " + shape_str(w.shape));
  ATTNRES_CHECK(caps.weight_dtypes.contains(w.dtype),
                "linear w " + described(w) + ": not a weight dtype of this backend");
  const int64_t n_dim = w.dim(0), k_dim = w.dim(1);
  check_f32_or_bf16(x, k_dim, "linear x");
  ATTNRES_CHECK(x.dtype == DType::F32 || (w.dtype == DType::BF16 && caps.bf16_linear_inputs),
                "linear: a BF16 x needs BF16 weights on a backend that takes bf16 linear "
                "inputs, got w " +
                    described(w));
  check_f32(out, n_dim, "linear out");
  ATTNRES_CHECK(rows_of(out) == rows_of(x), "linear x " + shape_str(x.shape) + " out " +
                                                shape_str(out.shape) + " w " + shape_str(w.shape));
  ATTNRES_CHECK(x.data != out.data || rows_of(x) == 0, "linear: out must not alias x");
  if (bias && bias->defined()) check_float_vector(*bias, n_dim, "linear bias");
}

// linear_residual's operand rules: residual and out of one shape and F32, out either residual
// itself or apart from it, x apart from both.
void check_residual_operands(const Tensor& x, const Tensor& residual, const Tensor& out) {
  ATTNRES_CHECK(
      residual.shape == out.shape && residual.dtype == DType::F32 && out.dtype == DType::F32,
      "linear_residual: residual " + described(residual) + " and out " + described(out) +
          " must be F32 of one shape");
  ATTNRES_CHECK(out.data == residual.data || apart(out, residual),
                "linear_residual: out must be the residual itself or not overlap it");
  ATTNRES_CHECK(apart(x, out) && apart(x, residual),
                "linear_residual: x must not overlap out or the residual");
}

void check_linear_swiglu(const Tensor& x, const Tensor& w_gate, const Tensor* b_gate,
                         const Tensor& w_up, const Tensor* b_up, const Tensor& gate,
                         const Tensor& up, const Tensor& out, const BackendCapabilities& caps) {
  check_linear(x, w_gate, b_gate, gate, caps);
  check_linear(x, w_up, b_up, up, caps);
  ATTNRES_CHECK(w_up.dim(0) == w_gate.dim(0),
                "linear_swiglu: gate " + shape_str(w_gate.shape) + " up " + shape_str(w_up.shape));
  check_activation_out(out, w_gate.dim(0), gate, "linear_swiglu out");
  check_activation_out(out, w_gate.dim(0), up, "linear_swiglu out");
  ATTNRES_CHECK(rows_of(out) == rows_of(x),
                "linear_swiglu: x " + shape_str(x.shape) + " out " + shape_str(out.shape));
}

void check_rope(const Tensor& q, const Tensor& k, int head_dim, const Tensor* q_gain,
                const Tensor* k_gain, const Tensor& inv_freq, const BatchMeta& batch) {
  const int64_t hd = head_dim;
  ATTNRES_CHECK(hd > 0 && hd % 2 == 0, "qk_norm_rope head_dim " + std::to_string(hd));
  ATTNRES_CHECK(q.rank() >= 1 && k.rank() >= 1 && q.dim(-1) % hd == 0 && k.dim(-1) % hd == 0,
                "qk_norm_rope q " + shape_str(q.shape) + " k " + shape_str(k.shape));
  check_f32(q, q.dim(-1), "qk_norm_rope q");
  check_f32(k, k.dim(-1), "qk_norm_rope k");
  const int64_t T = rows_of(q);
  ATTNRES_CHECK(
      rows_of(k) == T && T == batch.num_tokens && static_cast<int64_t>(batch.positions.size()) == T,
      "qk_norm_rope: T mismatch");
  check_float_vector(inv_freq, hd / 2, "qk_norm_rope inv_freq");
  if (q_gain && q_gain->defined()) check_float_vector(*q_gain, hd, "q_gain");
  if (k_gain && k_gain->defined()) check_float_vector(*k_gain, hd, "k_gain");
}

// A KV cache layer: K and V [blocks, block, Hkv, hd] of one shape and one dtype the backend
// stores (BackendCapabilities::kv_cache_dtypes).
void check_cache(const KvCacheLayer& cache, const BackendCapabilities& caps) {
  ATTNRES_CHECK(cache.k.rank() == 4 && cache.k.shape == cache.v.shape,
                "kv cache k " + shape_str(cache.k.shape) + " v " + shape_str(cache.v.shape));
  ATTNRES_CHECK(cache.k.dtype == cache.v.dtype && caps.kv_cache_dtypes.contains(cache.k.dtype),
                "kv cache k " + described(cache.k) + " v " + described(cache.v) +
                    ": not a cache dtype of this backend");
}

void check_store_kv(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                    const KvCacheLayer& cache, const BackendCapabilities& caps) {
  check_cache(cache, caps);
  const int64_t row = cache.k.dim(2) * cache.k.dim(3);  // Hkv * hd
  check_f32(k, row, "store_kv k");
  check_f32(v, row, "store_kv v");
  const int64_t T = rows_of(k);
  ATTNRES_CHECK(rows_of(v) == T && T == batch.num_tokens &&
                    static_cast<int64_t>(batch.slot_mapping.size()) == T,
                "store_kv: T mismatch");
}

void check_rope_store(const Tensor& q, const Tensor& k, const Tensor& v, int head_dim,
                      const Tensor* q_gain, const Tensor* k_gain, const Tensor& inv_freq,
                      const BatchMeta& batch, const KvCacheLayer& cache,
                      const BackendCapabilities& caps) {
  check_rope(q, k, head_dim, q_gain, k_gain, inv_freq, batch);
  check_store_kv(k, v, batch, cache, caps);
  ATTNRES_CHECK(cache.k.dim(3) == head_dim, "qk_norm_rope_store head_dim " +
                                                std::to_string(head_dim) + " vs cache " +
                                                shape_str(cache.k.shape));
}

// The entries a depth op reads of a bank [>= n, T, d] (n >= 1), F32 or a dtype of
// BackendCapabilities::depth_bank_dtypes.
void check_bank(const Tensor& bank, int n, int64_t d, const BackendCapabilities& caps,
                const char* what) {
  ATTNRES_CHECK(bank.rank() == 3 && n >= 1 && bank.dim(0) >= n,
                std::string(what) + " " + shape_str(bank.shape) + " n " + std::to_string(n));
  check_last_dim(bank, d, what);
  ATTNRES_CHECK(bank.dtype == DType::F32 || caps.depth_bank_dtypes.contains(bank.dtype),
                std::string(what) + " " + described(bank) + ": not a bank dtype of this backend");
}

void check_phase2(const Backend::DepthMixArgs& mix, const Tensor& partial,
                  const Tensor& prenorm_gain, const Tensor& out, const BackendCapabilities& caps) {
  ATTNRES_CHECK(partial.rank() >= 1, "depth_phase2 partial " + shape_str(partial.shape));
  const int64_t d = partial.dim(-1), T = rows_of(partial);
  check_f32(partial, d, "depth_phase2 partial");
  check_activation_out(out, d, partial, "depth_phase2 out");
  ATTNRES_CHECK(out.numel() == partial.numel(), "depth_phase2 out " + shape_str(out.shape));
  check_float_vector(prenorm_gain, d, "depth_phase2 gain");
  if (!mix.m && !mix.newer) return;  // the plain pre-norm: h = p
  ATTNRES_CHECK(mix.m || caps.mixes_without_phase1,
                "depth_phase2: newer entries without a Phase-1 state (this backend does not "
                "mix without Phase 1)");
  if (mix.partial_is_source || mix.newer) {
    ATTNRES_CHECK(mix.query != nullptr,
                  "depth_phase2: the partial or a newer bank entry is a source but has no query");
    check_f32(*mix.query, d, "depth_phase2 query");
    ATTNRES_CHECK(mix.query->numel() == d, "depth_phase2 query " + shape_str(mix.query->shape));
  }
  if (mix.newer) {
    check_bank(*mix.newer, 1, d, caps, "depth_phase2 newer entries");
    ATTNRES_CHECK(mix.newer->dim(0) <= Backend::kMaxNewerSources && mix.newer->dim(1) == T,
                  "depth_phase2 newer entries " + shape_str(mix.newer->shape));
  }
  if (!mix.m) {
    ATTNRES_CHECK(!mix.s && !mix.o, "depth_phase2: s / o given without m");
  } else {
    ATTNRES_CHECK(mix.s && mix.o, "depth_phase2: m given without s / o");
    ATTNRES_CHECK(mix.m->dtype == DType::F32 && mix.s->dtype == DType::F32 && mix.m->numel() == T &&
                      mix.s->numel() == T,
                  "depth_phase2 m " + shape_str(mix.m->shape) + " s " + shape_str(mix.s->shape));
    check_f32(*mix.o, d, "depth_phase2 o");
    ATTNRES_CHECK(mix.o->numel() == T * d, "depth_phase2 o " + shape_str(mix.o->shape));
  }
  if (mix.null_source) {
    check_f32(*mix.null_source, d, "depth_phase2 null source");
    ATTNRES_CHECK(mix.null_source->numel() == d,
                  "depth_phase2 null source " + shape_str(mix.null_source->shape));
  }
  if (mix.gate == Backend::DepthGate::Vector) {
    ATTNRES_CHECK(mix.gate_logits != nullptr, "depth_phase2: vector gate without gate logits");
    check_f32(*mix.gate_logits, d, "depth_phase2 gate logits");
    ATTNRES_CHECK(mix.gate_logits->numel() == T * d,
                  "depth_phase2 gate logits " + shape_str(mix.gate_logits->shape));
  }
}

void check_prenorm(const Backend::PrenormArgs& in) {
  ATTNRES_CHECK(in.partial && in.gain && in.normed,
                "prenorm: partial, gain and normed are required");
  check_f32_or_bf16(*in.normed, in.partial->rank() >= 1 ? in.partial->dim(-1) : 0,
                    "prenorm normed");
  ATTNRES_CHECK(
      in.normed->numel() == in.partial->numel(),
      "prenorm normed " + shape_str(in.normed->shape) + " partial " + shape_str(in.partial->shape));
}

// A gate of the bank's sources (pre_gated): [T, d] f32.
void check_source_gate(const Tensor* gate, int64_t T, int64_t d, const char* what) {
  if (!gate) return;
  check_f32(*gate, d, what);
  ATTNRES_CHECK(gate->numel() == T * d, std::string(what) + " " + shape_str(gate->shape));
}

}  // namespace

void Backend::embedding(const Tensor& table, const BatchMeta& batch, Tensor& out) {
  ATTNRES_CHECK(table.rank() == 2, "embedding table " + shape_str(table.shape));
  const int64_t vocab = table.dim(0);
  check_f32(out, table.dim(1), "embedding out");
  const int64_t T = rows_of(out);
  ATTNRES_CHECK(T == batch.num_tokens && static_cast<int64_t>(batch.token_ids.size()) == T,
                "embedding: T mismatch");
  for (int32_t id : batch.token_ids)
    ATTNRES_CHECK(id >= 0 && id < vocab, "embedding: token id " + std::to_string(id) +
                                             " outside the vocabulary of " + std::to_string(vocab));
  embedding_impl(table, batch, out);
}

void Backend::rms_norm(const Tensor& x, const Tensor& gain, float eps, Tensor& out) {
  ATTNRES_CHECK(x.rank() >= 1, "rms_norm x " + shape_str(x.shape));
  const int64_t n = x.dim(-1);
  check_f32(x, n, "rms_norm x");
  check_activation_out(out, n, x, "rms_norm out");
  ATTNRES_CHECK(out.numel() == x.numel(),
                "rms_norm x " + shape_str(x.shape) + " out " + shape_str(out.shape));
  check_float_vector(gain, n, "rms_norm gain");
  rms_norm_impl(x, gain, eps, out);
}

void Backend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  check_linear(x, w, bias, out, capabilities());
  linear_impl(x, w, bias, out);
}

void Backend::linear_residual(const Tensor& x, const Tensor& w, const Tensor* bias,
                              const Tensor& residual, Tensor& out) {
  check_residual_operands(x, residual, out);
  check_linear(x, w, bias, out, capabilities());
  linear_residual_impl(x, w, bias, residual, out);
}

void Backend::linear_residual_push(const Tensor& x, const Tensor& w, const Tensor* bias,
                                   const Tensor& residual, Tensor& out, Tensor& entry) {
  check_residual_operands(x, residual, out);
  check_linear(x, w, bias, out, capabilities());
  ATTNRES_CHECK(entry.shape == out.shape && (entry.dtype == DType::F32 ||
                                             capabilities().depth_bank_dtypes.contains(entry.dtype)),
                "linear_residual_push entry " + described(entry) + " for out " + described(out));
  ATTNRES_CHECK(apart(entry, x) && apart(entry, residual) && apart(entry, out),
                "linear_residual_push: entry must not overlap x, the residual or out");
  linear_residual_push_impl(x, w, bias, residual, out, entry);
}

void Backend::linear_many(const Tensor& x, std::span<const LinearTarget> targets) {
  for (const LinearTarget& t : targets) {
    ATTNRES_CHECK(t.w && t.out, "linear_many: a target without a weight or an out");
    check_linear(x, *t.w, t.bias, *t.out, capabilities());
  }
  linear_many_impl(x, targets);
}

void Backend::linear_swiglu(const Tensor& x, const Tensor& w_gate, const Tensor* b_gate,
                            const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up,
                            Tensor& out) {
  check_linear_swiglu(x, w_gate, b_gate, w_up, b_up, gate, up, out, capabilities());
  linear_swiglu_impl(x, w_gate, b_gate, w_up, b_up, gate, up, out);
}

void Backend::qk_norm_rope(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                           const Tensor* k_gain, float eps, const Tensor& inv_freq,
                           const BatchMeta& batch) {
  check_rope(q, k, head_dim, q_gain, k_gain, inv_freq, batch);
  qk_norm_rope_impl(q, k, head_dim, q_gain, k_gain, eps, inv_freq, batch);
}

void Backend::store_kv(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                       KvCacheLayer& cache) {
  check_store_kv(k, v, batch, cache, capabilities());
  store_kv_impl(k, v, batch, cache);
}

void Backend::qk_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, int head_dim,
                                 const Tensor* q_gain, const Tensor* k_gain, float eps,
                                 const Tensor& inv_freq, const BatchMeta& batch,
                                 KvCacheLayer& cache) {
  check_rope_store(q, k, v, head_dim, q_gain, k_gain, inv_freq, batch, cache, capabilities());
  qk_norm_rope_store_impl(q, k, v, head_dim, q_gain, k_gain, eps, inv_freq, batch, cache);
}

void Backend::attention(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
                        int head_dim, float scale, Tensor& out) {
  check_cache(cache, capabilities());
  const int64_t hd = head_dim, hkv = cache.k.dim(2);
  ATTNRES_CHECK(hd > 0 && cache.k.dim(3) == hd, "attention head_dim " + std::to_string(hd) +
                                                    " vs cache " + shape_str(cache.k.shape));
  ATTNRES_CHECK(q.rank() >= 1 && q.dim(-1) % hd == 0, "attention q " + shape_str(q.shape));
  const int64_t hq = q.dim(-1) / hd;
  ATTNRES_CHECK(hkv > 0 && hq % hkv == 0, "attention: Hq must be a multiple of Hkv");
  check_f32(q, hq * hd, "attention q");
  check_f32_or_bf16(out, hq * hd, "attention out");
  const int64_t T = rows_of(q);
  ATTNRES_CHECK(rows_of(out) == T && T == batch.num_tokens &&
                    static_cast<int64_t>(batch.positions.size()) == T,
                "attention: T mismatch");
  ATTNRES_CHECK(apart(q, out), "attention: out must not alias q");
  attention_impl(q, cache, batch, head_dim, scale, out);
}

void Backend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  ATTNRES_CHECK(gate.rank() >= 1, "swiglu gate " + shape_str(gate.shape));
  const int64_t n = gate.dim(-1);
  check_f32(gate, n, "swiglu gate");
  check_f32(up, n, "swiglu up");
  check_activation_out(out, n, gate, "swiglu out");
  check_activation_out(out, n, up, "swiglu out");
  ATTNRES_CHECK(up.numel() == gate.numel() && out.numel() == gate.numel(),
                "swiglu: shape mismatch");
  swiglu_impl(gate, up, out);
}

void Backend::add_inplace(Tensor& x, const Tensor& y) {
  ATTNRES_CHECK(x.shape == y.shape && x.dtype == DType::F32 && y.dtype == DType::F32,
                "add_inplace x " + described(x) + " y " + described(y));
  add_inplace_impl(x, y);
}

void Backend::add_inplace_push(Tensor& x, const Tensor& y, Tensor& entry, PushedRow pushed) {
  ATTNRES_CHECK(x.shape == y.shape && x.dtype == DType::F32 && y.dtype == DType::F32,
                "add_inplace_push x " + described(x) + " y " + described(y));
  ATTNRES_CHECK(entry.shape == x.shape && (entry.dtype == DType::F32 ||
                                           capabilities().depth_bank_dtypes.contains(entry.dtype)),
                "add_inplace_push entry " + described(entry));
  add_inplace_push_impl(x, y, entry, pushed);
}

void Backend::gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  ATTNRES_CHECK(x.rank() >= 1 && out.rank() >= 1 && x.dtype == out.dtype,
                "gather_rows x " + described(x) + " out " + described(out));
  const int64_t r_dim = x.dim(0);
  const int64_t n_out = static_cast<int64_t>(rows.size());
  ATTNRES_CHECK(out.dim(0) == n_out &&
                    (r_dim == 0 || out.numel() / std::max<int64_t>(n_out, 1) == x.numel() / r_dim),
                "gather_rows x " + shape_str(x.shape) + " out " + shape_str(out.shape));
  ATTNRES_CHECK(x.data != out.data || n_out == 0, "gather_rows: x and out must not alias");
  for (int32_t row : rows)
    ATTNRES_CHECK(row >= 0 && row < r_dim, "gather_rows: row " + std::to_string(row));
  gather_rows_impl(x, rows, out);
}

void Backend::check_sample_operands(const Tensor& logits, const SampleBatch& batch,
                                    std::span<int32_t> out) {
  const int64_t rows = static_cast<int64_t>(batch.rows.size());
  ATTNRES_CHECK(logits.rank() == 2 && logits.dtype == DType::F32 && logits.dim(0) >= rows,
                "sample: logits " + described(logits) + " for " + std::to_string(rows) + " rows");
  ATTNRES_CHECK(
      static_cast<int64_t>(out.size()) == rows,
      "sample: " + std::to_string(out.size()) + " outputs for " + std::to_string(rows) + " rows");
  const int64_t vocab = logits.dim(1);
  for (int32_t id : batch.token_ids)
    ATTNRES_CHECK(id >= 0 && id < vocab, "sample: token id " + std::to_string(id) +
                                             " outside the vocabulary of " + std::to_string(vocab));
  if (rows > 0) check_sample_bitmask(batch, vocab);
}

void Backend::sample(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) {
  check_sample_operands(logits, batch, out);
  sample_impl(logits, batch, out);
}

void Backend::sample_async(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) {
  check_sample_operands(logits, batch, out);
  sample_async_impl(logits, batch, out);
}

void Backend::depth_phase1(const Tensor& queries, const Tensor& bank, int n, float eps, Tensor& m,
                           Tensor& s, Tensor& o, const Tensor* source_gate_logits) {
  ATTNRES_CHECK(queries.rank() == 2, "depth_phase1 queries " + shape_str(queries.shape));
  const int64_t s_dim = queries.dim(0), d = queries.dim(1);
  check_f32(queries, d, "depth_phase1 queries");
  check_bank(bank, n, d, capabilities(), "depth_phase1 bank");
  const int64_t T = bank.dim(1);
  ATTNRES_CHECK(m.numel() == s_dim * T && s.numel() == s_dim * T && m.dtype == DType::F32 &&
                    s.dtype == DType::F32,
                "depth_phase1 m " + described(m) + " s " + described(s));
  check_f32(o, d, "depth_phase1 o");
  ATTNRES_CHECK(o.numel() == s_dim * T * d, "depth_phase1 o " + shape_str(o.shape));
  check_source_gate(source_gate_logits, T, d, "depth_phase1 source gate");
  depth_phase1_impl(queries, bank, n, eps, m, s, o, source_gate_logits);
}

void Backend::depth_phase2_prenorm(const DepthMixArgs& mix, const Tensor& partial,
                                   const Tensor& prenorm_gain, float norm_eps, Tensor& out) {
  check_phase2(mix, partial, prenorm_gain, out, capabilities());
  depth_phase2_prenorm_impl(mix, partial, prenorm_gain, norm_eps, out);
}

void Backend::depth_phase2_prenorm_pair(const DepthMixArgs& a, const DepthMixArgs& b,
                                        const Tensor& partial, const Tensor& prenorm_gain,
                                        float norm_eps, Tensor& out_a, Tensor& out_b) {
  check_phase2(a, partial, prenorm_gain, out_a, capabilities());
  check_phase2(b, partial, prenorm_gain, out_b, capabilities());
  ATTNRES_CHECK(apart(out_a, out_b) && apart(out_a, partial) && apart(out_b, partial),
                "depth_phase2_prenorm_pair: the outputs overlap each other or the partial");
  depth_phase2_prenorm_pair_impl(a, b, partial, prenorm_gain, norm_eps, out_a, out_b);
}

void Backend::prenorm_linear_many(const PrenormArgs& in, std::span<const LinearTarget> targets) {
  check_prenorm(in);
  check_phase2(in.mix, *in.partial, *in.gain, *in.normed, capabilities());
  for (const LinearTarget& t : targets) {
    ATTNRES_CHECK(t.w && t.out, "prenorm_linear_many: a target without a weight or an out");
    check_linear(*in.normed, *t.w, t.bias, *t.out, capabilities());
  }
  prenorm_linear_many_impl(in, targets);
}

void Backend::prenorm_linear_swiglu(const PrenormArgs& in, const Tensor& w_gate,
                                    const Tensor* b_gate, const Tensor& w_up, const Tensor* b_up,
                                    Tensor& gate, Tensor& up, Tensor& out) {
  check_prenorm(in);
  check_phase2(in.mix, *in.partial, *in.gain, *in.normed, capabilities());
  check_linear_swiglu(*in.normed, w_gate, b_gate, w_up, b_up, gate, up, out, capabilities());
  prenorm_linear_swiglu_impl(in, w_gate, b_gate, w_up, b_up, gate, up, out);
}

void Backend::prenorm_mlp_residual(const PrenormArgs& in, const Tensor& w_gate,
                                   const Tensor* b_gate, const Tensor& w_up, const Tensor* b_up,
                                   Tensor& gate, Tensor& up, Tensor& act, const Tensor& w_down,
                                   const Tensor* b_down, const Tensor& residual, Tensor& out) {
  check_prenorm(in);
  check_phase2(in.mix, *in.partial, *in.gain, *in.normed, capabilities());
  check_linear_swiglu(*in.normed, w_gate, b_gate, w_up, b_up, gate, up, act, capabilities());
  check_residual_operands(act, residual, out);
  check_linear(act, w_down, b_down, out, capabilities());
  // The scratch the input half writes must outlive its read by the output half.
  ATTNRES_CHECK(apart(out, *in.normed) && apart(out, gate) && apart(out, up),
                "prenorm_mlp_residual: out overlaps the normed, gate or up scratch");
  prenorm_mlp_residual_impl(in, w_gate, b_gate, w_up, b_up, gate, up, act, w_down, b_down,
                            residual, out);
}

void Backend::prenorm_qkv_rope_store(const PrenormArgs& in, std::span<const LinearTarget, 3> qkv,
                                     const RopeStoreArgs& rope) {
  ATTNRES_CHECK(rope.inv_freq && rope.batch && rope.cache,
                "prenorm_qkv_rope_store: inv_freq, batch and cache are required");
  check_prenorm(in);
  check_phase2(in.mix, *in.partial, *in.gain, *in.normed, capabilities());
  for (const LinearTarget& t : qkv) {
    ATTNRES_CHECK(t.w && t.out, "prenorm_qkv_rope_store: a target without a weight or an out");
    check_linear(*in.normed, *t.w, t.bias, *t.out, capabilities());
  }
  check_rope_store(*qkv[0].out, *qkv[1].out, *qkv[2].out, rope.head_dim, rope.q_gain, rope.k_gain,
                   *rope.inv_freq, *rope.batch, *rope.cache, capabilities());
  prenorm_qkv_rope_store_impl(in, qkv, rope);
}

void Backend::depth_weights(const Tensor& query, const Tensor& bank, int n, const Tensor& partial,
                            float bias, float eps, Tensor& out,
                            const DepthSourceSwitches& sources) {
  ATTNRES_CHECK(partial.rank() == 2, "depth_weights partial " + shape_str(partial.shape));
  const int64_t T = partial.dim(0), d = partial.dim(1);
  check_f32(partial, d, "depth_weights partial");
  check_f32(query, d, "depth_weights query");
  ATTNRES_CHECK(query.numel() == d, "depth_weights query " + shape_str(query.shape));
  check_bank(bank, n, d, capabilities(), "depth_weights bank");
  ATTNRES_CHECK(bank.dim(1) == T,
                "depth_weights bank " + shape_str(bank.shape) + " T " + std::to_string(T));
  check_f32(out, sources.width(n), "depth_weights out");
  ATTNRES_CHECK(rows_of(out) == T, "depth_weights out " + shape_str(out.shape));
  check_source_gate(sources.source_gate_logits, T, d, "depth_weights source gate");
  depth_weights_impl(query, bank, n, partial, bias, eps, out, sources);
}

}  // namespace attnres
