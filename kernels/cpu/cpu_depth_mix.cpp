// Depth attention (ATTNRES.md §3), the two-phase form.
//
// Phase 1 (once per group: the S sublayers whose sources start with the same bank entries),
// per token t:
//   logit[l, j] = queries[l] . bank[j, t] / rms(bank[j, t])      rms(x) = sqrt(mean(x^2) + eps)
//   m[l, t] = max_j logit,  s[l, t] = sum_j e^(logit - m),  o[l, t] = sum_j e^(logit - m) bank[j,
//   t]
// Layout: queries [S, d], bank [>= n, T, d] (first n live), m, s [S, T], o [S, T, d], all f32
// but the bank, which may be bf16 (--depth-bank-dtype): its rows are widened in registers, so
// the result equals an f32 bank's holding the same rounded values, bit for bit.
// Parallel over tokens; per token two passes over its n bank rows. The first computes each
// row's sum of squares and all S dot products together (S + 1 accumulator chains per vector
// of the row), two rows at a time so that each query vector is loaded once for both; then a
// softmax per query over the n logits (vexp); the second pass sums the weighted rows into all
// S outputs at once, register-blocked (the token's rows, n x 4 KB at
// d 1024, are still in L2 from the first pass). The first pass prefetches each next row: a
// token's rows are T x d floats apart, where the hardware prefetchers stop. (One pass with
// online-softmax updates of o instead, a46e30c, read and wrote all S o rows per source and
// took half as long again: docs/BENCHMARKS.md.)
//
// Phase 2 fused with the sublayer's PreNorm, per token (p = partial row, o/m/s this
// sublayer's Phase-1 rows):
//   q = query . p / rms(p) + bias;  M = max(m, q);  a = e^(m - M), b = e^(q - M)
//   h = (a o + b p) / (a s + b);   out = h / rms(h) * prenorm_gain
// Pass 1 reads p (dot + sum of squares), pass 2 writes h into out while summing h^2, pass 3
// scales out in place. Every write of out[i] follows the reads of p[i] and o[i], so out may
// alias p. With no bank (m null: a plain pre-norm model, or an unmixed sublayer) h = p.
// Newer bank entries (pushed after the group's Phase 1; the full-family modes' groups span
// several sublayers whose banks share a prefix) are merged per token: their logits in one
// pass (one query load per vector for all k rows), then a o + sum_k w_k b_k formed in
// registers inside pass 2, where a o stood. Each token's passes prefetch the next token's
// rows.
//
// The open-attnres modes (ATTNRES.md §2d) are switches of the same two ops: Phase 1 may gate
// every source by sigmoid(gate logits[t]) first (pre_gated: the gated row is formed in
// registers for the logits, and the weighted sum of the bare rows is gated once); Phase 2 may
// drop the partial as a source, merge a null source with a constant logit, add the partial to
// the mix (delta modes) and blend x and the mix with a scalar or per-element gate. Those cases
// take a general element-wise pass 2; 2a/2b keep the plain one.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/thread_scratch.h"

namespace attnres {
namespace {

using cpu::kLanes;
using cpu::VecF;

constexpr int kMaxFusedS = 8;  // sublayers whose dots share one pass; more are done in groups

// A depth-bank element: f32, or bf16 (--depth-bank-dtype), widened exactly in registers.
template <DType B>
using BankT = cpu::StoredT<B>;

// For each of R rows x_r: dots[r * S + l] = queries[l] . x_r for l < S, in the same pass as
// ss[r] = sum of x_r^2. Gated (pre_gated), x_r is sig * row_r, formed in registers. B: the
// rows' element type. R = 2 loads each query vector once for both rows: with one row, the S
// query loads per vector made Phase 1's logit pass load-bound (S + 1 loads for S + 1 FMAs;
// two rows take S + 2 for 2S + 2). Each row's accumulators see the same operations in the
// same order whatever R, so R does not change a bit.
// `next` (entries may be null): rows to prefetch, one cache line at a time. Bank rows of one
// token are T * d elements apart, each its own page at d 1024 (f32), and the hardware
// prefetchers stop at page boundaries: without this every row starts with cache misses.
template <int R, int S, bool Gated, DType B>
void dots_and_squares(const float* queries, int64_t d, const BankT<B>* const* rows, float* dots,
                      float* ss, const float* sig, const BankT<B>* const* next) {
  constexpr int64_t kElementBytes = sizeof(BankT<B>);
  VecF acc[R][S], sq[R];
  for (int r = 0; r < R; ++r) {
    sq[r] = cpu::vzero();
    for (int l = 0; l < S; ++l) acc[r][l] = cpu::vzero();
  }
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    if (i * kElementBytes % 64 == 0) {
      for (int r = 0; r < R; ++r)
        if (next[r]) __builtin_prefetch(next[r] + i, 0, 3);
    }
    VecF x[R];
    for (int r = 0; r < R; ++r) {
      x[r] = cpu::vload_w<B>(rows[r] + i);
      if constexpr (Gated) x[r] = cpu::vmul(x[r], cpu::vload(sig + i));
      sq[r] = cpu::vfma(x[r], x[r], sq[r]);
    }
    for (int l = 0; l < S; ++l) {
      const VecF q = cpu::in_register(cpu::vload(queries + l * d + i));  // once for R rows
      for (int r = 0; r < R; ++r) acc[r][l] = cpu::vfma(q, x[r], acc[r][l]);
    }
  }
  for (int r = 0; r < R; ++r) {
    ss[r] = cpu::hsum(sq[r]);
    for (int l = 0; l < S; ++l) dots[r * S + l] = cpu::hsum(acc[r][l]);
  }
  // The tail in explicit FMAs, like the vectors: left to -ffp-contract, whether a product
  // fuses would depend on how each template instance vectorises the loop over l.
  for (; i < d; ++i) {
    for (int r = 0; r < R; ++r) {
      const float v = cpu::load_scalar<B>(rows[r] + i);
      const float x = Gated ? v * sig[i] : v;
      ss[r] = std::fma(x, x, ss[r]);
      for (int l = 0; l < S; ++l)
        dots[r * S + l] = std::fma(queries[l * d + i], x, dots[r * S + l]);
    }
  }
}

// One token's bank rows, gated or not: the row itself, or (pre_gated) sigmoid(gate) * row.
template <DType B>
struct TokenSources {
  const BankT<B>* bank = nullptr;  // bank[0, T, d] at this token's row
  int64_t entry_stride = 0;        // T * d: from one entry's row to the next's
  const float* sig = nullptr;      // pre_gated: sigmoid(gate logits[t]) [d], else null
  const BankT<B>* row(int j) const { return bank + j * entry_stride; }
};

// o[l] = sum_j w[l * n + j] * source_j over the d elements, for l < S; o[l] starts at
// o + l * o_stride. Register-blocked: C vectors of all S output rows are held in S x C
// accumulators while every source's C vectors are loaded once, so o is written once and the
// sources are read from L1/L2 once per block of C vectors (an online-softmax update would
// read and write all S o rows once per source instead). Gated, the sum is over the bare rows
// and multiplied by sig once at the end: sum_j w_j (sig * row_j) = sig * sum_j w_j row_j.
template <int S, int C, bool Gated, DType B>
int64_t weighted_sum_block(const TokenSources<B>& src, int n, const float* w, int64_t d, float* o,
                           int64_t o_stride, int64_t i) {
  for (; i + C * kLanes <= d; i += C * kLanes) {
    VecF acc[S][C];
    for (int l = 0; l < S; ++l)
      for (int c = 0; c < C; ++c) acc[l][c] = cpu::vzero();
    for (int j = 0; j < n; ++j) {
      const BankT<B>* row = src.row(j) + i;
      VecF x[C];
      for (int c = 0; c < C; ++c) x[c] = cpu::vload_w<B>(row + c * kLanes);
      for (int l = 0; l < S; ++l) {
        const VecF wl = cpu::vset1(w[l * n + j]);
        for (int c = 0; c < C; ++c) acc[l][c] = cpu::vfma(wl, x[c], acc[l][c]);
      }
    }
    for (int l = 0; l < S; ++l) {
      for (int c = 0; c < C; ++c) {
        VecF v = acc[l][c];
        if constexpr (Gated) v = cpu::vmul(v, cpu::vload(src.sig + i + c * kLanes));
        cpu::vstore(o + l * o_stride + i + c * kLanes, v);
      }
    }
  }
  return i;
}

template <int S, bool Gated, DType B>
void weighted_sum(const TokenSources<B>& src, int n, const float* w, int64_t d, float* o,
                  int64_t o_stride) {
  constexpr int C = S >= 5 ? 3 : 4;  // S x C accumulators + C loads within 32 registers
  int64_t i = weighted_sum_block<S, C, Gated, B>(src, n, w, d, o, o_stride, 0);
  i = weighted_sum_block<S, 1, Gated, B>(src, n, w, d, o, o_stride, i);
  for (; i < d; ++i) {  // the scalar tail
    for (int l = 0; l < S; ++l) {
      float acc = 0.0f;
      for (int j = 0; j < n; ++j)
        acc = std::fma(w[l * n + j], cpu::load_scalar<B>(src.row(j) + i), acc);
      o[l * o_stride + i] = Gated ? acc * src.sig[i] : acc;
    }
  }
}

// logits[r] = query . rows[r] / rms(rows[r]) for R rows in one pass (each query vector loaded
// once for all of them): sources' depth logits before any bias. next[r] (may be null): rows to
// prefetch meanwhile, the next token's rows of the same sources. Each row sees the same
// operations whatever R, so its logit keeps its bits.
template <int R, DType B>
void rows_logit(const float* query, int64_t d, const BankT<B>* const* rows, float eps,
                const BankT<B>* const* next, float* logits) {
  float dots[R], ss[R];
  dots_and_squares<R, 1, false, B>(query, d, rows, dots, ss, nullptr, next);
  for (int r = 0; r < R; ++r) logits[r] = dots[r] / std::sqrt(ss[r] / static_cast<float>(d) + eps);
}

// The same for one f32 row (the partial).
float row_logit(const float* query, int64_t d, const float* x, float eps,
                const float* next = nullptr) {
  float logit;
  rows_logit<1, DType::F32>(query, d, &x, eps, &next, &logit);
  return logit;
}

// The PreNorm's last pass over a token's h (d values, their sum of squares hss): h = h /
// rms(h) * gain, in place.
void scale_by_rms(float* h, float hss, const float* gain, int64_t d, float eps) {
  const float inv_rms = 1.0f / std::sqrt(hss / static_cast<float>(d) + eps);
  const VecF vs = cpu::vset1(inv_rms);
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes)
    cpu::vstore(h + i, cpu::vmul(cpu::vmul(cpu::vload(h + i), vs), cpu::vload(gain + i)));
  for (; i < d; ++i) h[i] = h[i] * inv_rms * gain[i];
}

// The logits of rows [j, j + R) for the S queries, into logits[l * n + j + r]; prefetches
// the R rows after them.
template <int R, int S, bool Gated, DType B>
void rows_logits(const float* queries, const TokenSources<B>& src, int n, int j, int64_t d,
                 float eps, float* logits) {
  const BankT<B>* rows[R];
  const BankT<B>* next[R];
  for (int r = 0; r < R; ++r) {
    rows[r] = src.row(j + r);
    next[r] = j + R + r < n ? src.row(j + R + r) : nullptr;
  }
  float dots[R * S], ss[R];
  dots_and_squares<R, S, Gated, B>(queries, d, rows, dots, ss, src.sig, next);
  for (int r = 0; r < R; ++r) {
    const float inv_rms = 1.0f / std::sqrt(ss[r] / static_cast<float>(d) + eps);
    for (int l = 0; l < S; ++l) logits[l * n + j + r] = dots[r * S + l] * inv_rms;
  }
}

// Phase 1 of one token for S queries, in two passes over its n bank rows: the logits (every
// row read once for all S dot products and its sum of squares), a softmax per query, then
// the weighted sums. logits is scratch of S * n floats.
template <int S, bool Gated, DType B>
void phase1_token(const float* queries, const TokenSources<B>& src, int n, int64_t d, float eps,
                  float* logits, float* m, float* s, int64_t ms_stride, float* o,
                  int64_t o_stride) {
  int j = 0;
  for (; j + 2 <= n; j += 2) rows_logits<2, S, Gated, B>(queries, src, n, j, d, eps, logits);
  if (j < n) rows_logits<1, S, Gated, B>(queries, src, n, j, d, eps, logits);
  for (int l = 0; l < S; ++l) {
    float* lg = logits + l * n;
    m[l * ms_stride] = *std::max_element(lg, lg + n);
    s[l * ms_stride] = cpu::softmax_numerators(lg, n);  // lg becomes e^(logit - m)
  }
  weighted_sum<S, Gated, B>(src, n, logits, d, o, o_stride);
}

template <DType B>
using Phase1Token = void (*)(const float*, const TokenSources<B>&, int, int64_t, float, float*,
                             float*, float*, int64_t, float*, int64_t);
template <bool Gated, DType B>
constexpr Phase1Token<B> kPhase1Token[kMaxFusedS] = {
    phase1_token<1, Gated, B>, phase1_token<2, Gated, B>, phase1_token<3, Gated, B>,
    phase1_token<4, Gated, B>, phase1_token<5, Gated, B>, phase1_token<6, Gated, B>,
    phase1_token<7, Gated, B>, phase1_token<8, Gated, B>};

// depth_phase1's per-token loop over a bank of element type B (arguments validated).
template <DType B>
void phase1_tokens(cpu::WorkerPool& pool, bool parallel, const float* qp, int64_t s_dim,
                   const BankT<B>* bp, int n, int64_t t_dim, int64_t d, float eps, const float* gp,
                   float* mp, float* sp, float* op) {
  pool.parallel_for(t_dim, parallel, [&](int64_t t) {
    TokenSources<B> src{bp + t * d, t_dim * d, nullptr};
    if (gp) {  // pre_gated: every source is sigmoid(gate logits[t]) * row
      float* sig = cpu::thread_scratch(cpu::ScratchSlot::DepthSigmoid, static_cast<size_t>(d));
      cpu::sigmoid_f32(gp + t * d, sig, d);
      src.sig = sig;
    }
    float* logits = cpu::thread_scratch(cpu::ScratchSlot::DepthLogits,
                                        static_cast<size_t>(kMaxFusedS) * static_cast<size_t>(n));
    for (int64_t l0 = 0; l0 < s_dim; l0 += kMaxFusedS) {
      const int group = static_cast<int>(std::min<int64_t>(kMaxFusedS, s_dim - l0));
      const Phase1Token<B> token =
          gp ? kPhase1Token<true, B>[group - 1] : kPhase1Token<false, B>[group - 1];
      token(qp + l0 * d, src, n, d, eps, logits, mp + l0 * t_dim + t, sp + l0 * t_dim + t, t_dim,
            op + (l0 * t_dim + t) * d, t_dim * d);
    }
  });
}

}  // namespace

void CpuBackend::depth_phase1(const Tensor& queries, const Tensor& bank, int n, float eps,
                              Tensor& m, Tensor& s, Tensor& o, const Tensor* source_gate_logits) {
  ATTNRES_CHECK(queries.rank() == 2, "depth_phase1 queries " + shape_str(queries.shape));
  const int64_t s_dim = queries.dim(0), d = queries.dim(1);
  cpu::check_f32_rows(queries, d, "depth_phase1 queries");
  ATTNRES_CHECK(bank.rank() == 3 && n >= 1 && bank.dim(0) >= n,
                "depth_phase1 bank " + shape_str(bank.shape) + " n " + std::to_string(n));
  cpu::check_bank_rows(bank, d, "depth_phase1 bank");
  const int64_t t_dim = bank.dim(1);
  ATTNRES_CHECK(m.numel() == s_dim * t_dim && s.numel() == s_dim * t_dim && m.dtype == DType::F32 &&
                    s.dtype == DType::F32,
                "depth_phase1 m " + shape_str(m.shape) + " s " + shape_str(s.shape));
  cpu::check_f32_rows(o, d, "depth_phase1 o");
  ATTNRES_CHECK(o.numel() == s_dim * t_dim * d, "depth_phase1 o " + shape_str(o.shape));
  const Tensor* gate = source_gate_logits;
  if (gate) {
    cpu::check_f32_rows(*gate, d, "depth_phase1 source gate");
    ATTNRES_CHECK(gate->numel() == t_dim * d, "depth_phase1 source gate " + shape_str(gate->shape));
  }
  const float* gp = gate ? gate->ptr<float>() : nullptr;
  const bool parallel = threads_ > 1 && t_dim > 1;
  float* mp = m.ptr<float>();
  float* sp = s.ptr<float>();
  float* op = o.ptr<float>();
  if (bank.dtype == DType::BF16) {
    phase1_tokens<DType::BF16>(*pool_, parallel, queries.ptr<float>(), s_dim,
                               bank.ptr<uint16_t>(), n, t_dim, d, eps, gp, mp, sp, op);
  } else {
    phase1_tokens<DType::F32>(*pool_, parallel, queries.ptr<float>(), s_dim, bank.ptr<float>(), n,
                              t_dim, d, eps, gp, mp, sp, op);
  }
}

namespace {

// The bank side of token t's mix, the Phase-1 state (m, s, o) with the newer entries merged
// in (ATTNRES.md §3's Phase 2, with k newer entries where the paper has one partial). The
// caller adds the other sources: weight(l) = e^(l - big) / den of a logit l, and the bank
// side's part of h_mix is scale * at(i): o itself (scale e^(m - big) / den) when there are no
// newer entries, else c o + sum_j w_j row_j (scale 1), formed in registers inside the
// caller's one pass over the token (a merged row written out and read back cost a store and
// a load per vector).
struct BankSide {
  float den = 0.0f;  // the whole softmax denominator, in units of e^(x - big)
  float scale = 1.0f;
  const float* o = nullptr;
  int k = 0;  // newer rows
  bool bf16 = false;
  const void* rows[Backend::kMaxNewerSources] = {};
  float c = 0.0f;                           // o's weight, k > 0
  float w[Backend::kMaxNewerSources] = {};  // the rows' weights
  VecF vc = cpu::vzero();
  VecF vw[Backend::kMaxNewerSources];

  VecF at(int64_t i) const {
    if (k == 0) return cpu::vload(o + i);
    return bf16 ? merged<DType::BF16>(i) : merged<DType::F32>(i);
  }
  float at_scalar(int64_t i) const {
    if (k == 0) return o[i];
    return bf16 ? merged_scalar<DType::BF16>(i) : merged_scalar<DType::F32>(i);
  }

 private:
  template <DType B>
  VecF merged(int64_t i) const {
    VecF acc = cpu::vmul(vc, cpu::vload(o + i));
    for (int j = 0; j < k; ++j)
      acc = cpu::vfma(vw[j], cpu::vload_w<B>(static_cast<const BankT<B>*>(rows[j]) + i), acc);
    return acc;
  }
  template <DType B>
  float merged_scalar(int64_t i) const {
    float acc = o[i] * c;
    for (int j = 0; j < k; ++j)
      acc = std::fma(w[j], cpu::load_scalar<B>(static_cast<const BankT<B>*>(rows[j]) + i), acc);
    return acc;
  }
};

// The newer bank entries of a Phase 2 (f32 or bf16, like the bank).
class NewerMerge {
 public:
  NewerMerge(const Tensor* newer, const float* query, int64_t t_dim, int64_t d, float eps)
      : base_(newer ? newer->data : nullptr),
        bf16_(newer && newer->dtype == DType::BF16),
        k_(newer ? static_cast<int>(newer->dim(0)) : 0),
        query_(query),
        t_dim_(t_dim),
        d_(d),
        eps_(eps) {}

  // The newer entries' logits of token t, into logits[0, k), prefetching token t + 1's rows.
  // Returns k.
  int logits(int64_t t, float* logits) const {
    if (bf16_) return logits_of<DType::BF16>(t, logits);
    return logits_of<DType::F32>(t, logits);
  }

  // big must already cover m and every logit; den the other sources' terms.
  BankSide finish(int64_t t, float m, float s, const float* o, const float* logits, float big,
                  float others_den) const {
    BankSide side;
    const float a = std::exp(m - big);
    float den = a * s + others_den;
    float w[Backend::kMaxNewerSources];
    for (int j = 0; j < k_; ++j) den += (w[j] = std::exp(logits[j] - big));
    side.den = den;
    side.o = o;
    const float inv_den = 1.0f / den;
    if (k_ == 0) {
      side.scale = a * inv_den;
      return side;
    }
    side.k = k_;
    side.bf16 = bf16_;
    side.c = a * inv_den;
    side.vc = cpu::vset1(side.c);
    for (int j = 0; j < k_; ++j) {
      side.w[j] = w[j] * inv_den;
      side.vw[j] = cpu::vset1(side.w[j]);
      side.rows[j] = bf16_ ? static_cast<const void*>(row<DType::BF16>(j, t))
                           : static_cast<const void*>(row<DType::F32>(j, t));
    }
    return side;
  }

 private:
  template <DType B>
  const BankT<B>* row(int j, int64_t t) const {
    return static_cast<const BankT<B>*>(base_) + (j * t_dim_ + t) * d_;
  }
  // All k rows in one pass (R = k): one row at a time loaded the query vector once per row,
  // two loads per two FMAs, and this VM's cores take one 512-bit load per cycle.
  template <int R, DType B>
  void newer_logits(int64_t t, float* logits) const {
    const bool has_next = t + 1 < t_dim_;
    const BankT<B>* rows[R];
    const BankT<B>* next[R];
    for (int j = 0; j < R; ++j) {
      rows[j] = row<B>(j, t);
      next[j] = has_next ? row<B>(j, t + 1) : nullptr;
    }
    rows_logit<R, B>(query_, d_, rows, eps_, next, logits);
  }
  // newer_logits<k_>, for 1 <= k_ <= R.
  template <int R, DType B>
  void logits_upto(int64_t t, float* logits) const {
    if constexpr (R > 1) {
      if (k_ < R) return logits_upto<R - 1, B>(t, logits);
    }
    newer_logits<R, B>(t, logits);
  }
  template <DType B>
  int logits_of(int64_t t, float* logits) const {
    if (k_ > 0) logits_upto<Backend::kMaxNewerSources, B>(t, logits);
    return k_;
  }
  const void* base_;
  bool bf16_;
  int k_;
  const float* query_;
  int64_t t_dim_, d_;
  float eps_;
};

}  // namespace

void CpuBackend::depth_phase2_prenorm(const DepthMixArgs& mix, const Tensor& partial,
                                      const Tensor& prenorm_gain, float norm_eps, Tensor& out) {
  ATTNRES_CHECK(partial.rank() >= 1, "depth_phase2 partial " + shape_str(partial.shape));
  const int64_t d = partial.dim(-1);
  cpu::check_f32_rows(partial, d, "depth_phase2 partial");
  cpu::check_f32_rows(out, d, "depth_phase2 out");
  const int64_t t_dim = cpu::rows_of(partial);
  ATTNRES_CHECK(out.numel() == partial.numel(), "depth_phase2 out " + shape_str(out.shape));
  const bool mixing = mix.m != nullptr;
  if (!mixing) return rms_norm(partial, prenorm_gain, norm_eps, out);  // h = p

  if (mix.partial_is_source || mix.newer) {
    ATTNRES_CHECK(mix.query != nullptr,
                  "depth_phase2: the partial or a newer bank entry is a source but has no query");
    cpu::check_f32_rows(*mix.query, d, "depth_phase2 query");
    ATTNRES_CHECK(mix.query->numel() == d, "depth_phase2 query " + shape_str(mix.query->shape));
  }
  if (mix.newer) {
    cpu::check_bank_rows(*mix.newer, d, "depth_phase2 newer entries");
    ATTNRES_CHECK(mix.newer->rank() == 3 && mix.newer->dim(0) >= 1 &&
                      mix.newer->dim(0) <= kMaxNewerSources && mix.newer->dim(1) == t_dim,
                  "depth_phase2 newer entries " + shape_str(mix.newer->shape));
  }
  ATTNRES_CHECK(mix.s && mix.o, "depth_phase2: m given without s / o");
  ATTNRES_CHECK(mix.m->dtype == DType::F32 && mix.s->dtype == DType::F32 &&
                    mix.m->numel() == t_dim && mix.s->numel() == t_dim,
                "depth_phase2 m " + shape_str(mix.m->shape) + " s " + shape_str(mix.s->shape));
  cpu::check_f32_rows(*mix.o, d, "depth_phase2 o");
  ATTNRES_CHECK(mix.o->numel() == t_dim * d, "depth_phase2 o " + shape_str(mix.o->shape));
  if (mix.null_source) {
    cpu::check_f32_rows(*mix.null_source, d, "depth_phase2 null source");
    ATTNRES_CHECK(mix.null_source->numel() == d,
                  "depth_phase2 null source " + shape_str(mix.null_source->shape));
  }
  if (mix.gate == DepthGate::Vector) {
    ATTNRES_CHECK(mix.gate_logits != nullptr, "depth_phase2: vector gate without gate logits");
    cpu::check_f32_rows(*mix.gate_logits, d, "depth_phase2 gate logits");
    ATTNRES_CHECK(mix.gate_logits->numel() == t_dim * d,
                  "depth_phase2 gate logits " + shape_str(mix.gate_logits->shape));
  }
  const bool plain_mix =
      mix.partial_is_source && !mix.adds_partial && !mix.null_source && mix.gate == DepthGate::None;
  if (!plain_mix) return depth_phase2_general(mix, partial, prenorm_gain, norm_eps, out);
  const std::vector<float> gain = cpu::widen_vector(prenorm_gain, d, "depth_phase2 gain");

  const float* qv = mix.query->ptr<float>();
  const float* mp = mix.m->ptr<float>();
  const float* sp = mix.s->ptr<float>();
  const float* opp = mix.o->ptr<float>();
  const float* pp = partial.ptr<float>();
  float* outp = out.ptr<float>();
  const NewerMerge newer(mix.newer, qv, t_dim, d, mix.mix_eps);
  const bool parallel = threads_ > 1 && t_dim > 1;
  pool_->parallel_for(t_dim, parallel, [&](int64_t t) {
    const float* p = pp + t * d;
    float* h = outp + t * d;
    // Token t + 1's rows are prefetched while this token's are read: each row is a page of
    // its own at d 1024, where the hardware prefetchers stop.
    const bool has_next = t + 1 < t_dim;
    const float q =
        row_logit(qv, d, p, mix.mix_eps, has_next ? p + d : nullptr) + mix.bias;
    float logits[kMaxNewerSources];
    float big = std::max(mp[t], q);
    for (int j = 0, k = newer.logits(t, logits); j < k; ++j) big = std::max(big, logits[j]);
    const float b = std::exp(q - big);
    const BankSide bank = newer.finish(t, mp[t], sp[t], opp + t * d, logits, big, b);
    const float wb = b / bank.den;
    const VecF va = cpu::vset1(bank.scale), vb = cpu::vset1(wb);
    VecF hsq = cpu::vzero();
    int64_t i = 0;
    const float* o_next = has_next ? opp + (t + 1) * d : nullptr;
    for (; i + kLanes <= d; i += kLanes) {
      if (o_next) __builtin_prefetch(o_next + i, 0, 3);
      const VecF hv = cpu::vfma(va, bank.at(i), cpu::vmul(vb, cpu::vload(p + i)));
      hsq = cpu::vfma(hv, hv, hsq);
      cpu::vstore(h + i, hv);
    }
    float hss = cpu::hsum(hsq);
    for (; i < d; ++i) {
      h[i] = bank.scale * bank.at_scalar(i) + wb * p[i];
      hss += h[i] * h[i];
    }
    scale_by_rms(h, hss, gain.data(), d, norm_eps);
  });
}

// Phase 2 with the §2d switches (validated by depth_phase2_prenorm), per token: the extra
// sources' logits, the online-softmax merge with the bank's (m, s, o) and the newer entries,
// the residual base, the gate, then the PreNorm. Element by element (a vector of them at a
// time): each out[i] is written after p[i] (and the bank side's [i], the null source and the
// gate logit) are read, so out may alias p.
void CpuBackend::depth_phase2_general(const DepthMixArgs& mix, const Tensor& partial,
                                      const Tensor& prenorm_gain, float norm_eps, Tensor& out) {
  const int64_t d = partial.dim(-1);
  const int64_t t_dim = cpu::rows_of(partial);
  const std::vector<float> gain = cpu::widen_vector(prenorm_gain, d, "depth_phase2 gain");
  const float* qv = mix.partial_is_source ? mix.query->ptr<float>() : nullptr;
  const float* nv = mix.null_source ? mix.null_source->ptr<float>() : nullptr;
  const float* gl = mix.gate == DepthGate::Vector ? mix.gate_logits->ptr<float>() : nullptr;
  const float* mp = mix.m->ptr<float>();
  const float* sp = mix.s->ptr<float>();
  const float* opp = mix.o->ptr<float>();
  const float* pp = partial.ptr<float>();
  float* outp = out.ptr<float>();
  const NewerMerge newer(mix.newer, mix.newer ? mix.query->ptr<float>() : nullptr, t_dim, d,
                         mix.mix_eps);
  const bool parallel = threads_ > 1 && t_dim > 1;
  pool_->parallel_for(t_dim, parallel, [&](int64_t t) {
    const float* p = pp + t * d;
    float* h = outp + t * d;
    float big = mp[t], q = 0.0f;
    if (qv) {
      q = row_logit(qv, d, p, mix.mix_eps) + mix.bias;
      big = std::max(big, q);
    }
    float logits[kMaxNewerSources];
    for (int j = 0, k = newer.logits(t, logits); j < k; ++j) big = std::max(big, logits[j]);
    if (nv) big = std::max(big, mix.null_logit);
    const float b = qv ? std::exp(q - big) : 0.0f;
    const float c = nv ? std::exp(mix.null_logit - big) : 0.0f;
    const BankSide bank = newer.finish(t, mp[t], sp[t], opp + t * d, logits, big, b + c);
    const float wa = bank.scale, wb = b / bank.den, wc = c / bank.den;
    const float* glt = gl ? gl + t * d : nullptr;
    // Vectors first (the switches are the same for every element: the branches predict),
    // then the scalar tail.
    const VecF vwa = cpu::vset1(wa), vwb = cpu::vset1(wb), vwc = cpu::vset1(wc);
    const VecF vblend = cpu::vset1(mix.gate_blend), one = cpu::vset1(1.0f);
    VecF hsq = cpu::vzero();
    // Token t + 1's partial and Phase-1 rows, prefetched meanwhile (see the plain path).
    const bool has_next = t + 1 < t_dim;
    const float* p_next = has_next ? p + d : nullptr;
    const float* o_next = has_next ? opp + (t + 1) * d : nullptr;
    int64_t i = 0;
    for (; i + kLanes <= d; i += kLanes) {
      if (has_next) {
        __builtin_prefetch(p_next + i, 0, 3);
        __builtin_prefetch(o_next + i, 0, 3);
      }
      const VecF x = cpu::vload(p + i);
      VecF hm = cpu::vfma(vwa, bank.at(i), cpu::vmul(vwb, x));
      if (nv) hm = cpu::vfma(vwc, cpu::vload(nv + i), hm);
      if (mix.adds_partial) hm = cpu::vadd(hm, x);
      VecF hv = hm;
      if (mix.gate == DepthGate::Scalar) {
        hv = cpu::vfma(vblend, cpu::vsub(hm, x), x);
      } else if (glt) {  // x + (hm - x) * sigmoid(gate logit)
        const VecF den = cpu::vadd(one, cpu::vexp(cpu::vsub(cpu::vzero(), cpu::vload(glt + i))));
        hv = cpu::vadd(x, cpu::vdiv(cpu::vsub(hm, x), den));
      }
      cpu::vstore(h + i, hv);
      hsq = cpu::vfma(hv, hv, hsq);
    }
    float hss = cpu::hsum(hsq);
    for (; i < d; ++i) {
      const float x = p[i];
      float hm = wa * bank.at_scalar(i) + wb * x;
      if (nv) hm += wc * nv[i];
      if (mix.adds_partial) hm += x;
      float hv = hm;
      if (mix.gate == DepthGate::Scalar) {
        hv = x + mix.gate_blend * (hm - x);
      } else if (glt) {
        hv = x + (hm - x) / (1.0f + std::exp(-glt[i]));
      }
      h[i] = hv;
      hss += hv * hv;
    }
    scale_by_rms(h, hss, gain.data(), d, norm_eps);
  });
}

}  // namespace attnres
