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
// several sublayers whose banks share a prefix) are merged per token: their logits in pass 1,
// with the partial's (one query load per vector for all k + 1 rows), then a o + sum_k w_k b_k
// formed in registers inside pass 2, where a o stood. k is a template argument of the token
// kernel, chosen once per call, so that the merge has no test per row and vector. Each
// token's passes prefetch the next token's rows.
// With no Phase-1 state (m, s, o null: a group whose shared prefix is one entry skips Phase 1),
// the first newer entry is the state: m its logit, formed as Phase 1 forms it, s = 1, o the
// entry itself, read in the bank's dtype. Phase 1 over one entry gives exactly those values
// (e^0 = 1, 1 * x = x), so the result is the same bits, without Phase 1 writing S o rows that
// each hold a copy of the entry.
//
// The open-attnres modes (ATTNRES.md §2d) are switches of the same two ops: Phase 1 may gate
// every source by sigmoid(gate logits[t]) first (pre_gated: the gated row is formed in
// registers for the logits, and the weighted sum of the bare rows is gated once); Phase 2 may
// drop the partial as a source, merge a null source with a constant logit, add the partial to
// the mix (delta modes) and blend x and the mix with a scalar or per-element gate. Those cases
// take a general element-wise pass 2; 2a/2b keep the plain one.
#include <algorithm>
#include <cmath>
#include <type_traits>
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

// The rows one logit pass reads: R rows of element type B (bank entries) and then P f32 rows
// (Phase 2's partial, whose logit takes the same query as the newer entries'), with the rows
// to prefetch meanwhile (entries may be null). Bank rows of one token are T * d elements
// apart, each its own page at d 1024 (f32), and the hardware prefetchers stop at page
// boundaries: without the prefetches every row starts with cache misses.
template <int R, int P, DType B>
struct RowSet {
  static constexpr int kBankRows = R, kF32Rows = P, N = R + P;
  const BankT<B>* rows[R > 0 ? R : 1] = {};
  const float* f32_rows[P > 0 ? P : 1] = {};
  const BankT<B>* next_rows[R > 0 ? R : 1] = {};
  const float* next_f32_rows[P > 0 ? P : 1] = {};

  // x[r] = the vector at element i of row r, for all N rows. (Two loops, not a test of r per
  // row: with one, Phase 1's logit pass ran 3-5% slower.)
  void load(VecF* x, int64_t i) const {
    for (int r = 0; r < R; ++r) x[r] = cpu::vload_w<B>(rows[r] + i);
    for (int r = 0; r < P; ++r) x[R + r] = cpu::vload(f32_rows[r] + i);
  }
  void load_scalar(float* x, int64_t i) const {
    for (int r = 0; r < R; ++r) x[r] = cpu::load_scalar<B>(rows[r] + i);
    for (int r = 0; r < P; ++r) x[R + r] = f32_rows[r][i];
  }
};

// For each of the N rows x_r of `set`: dots[r * S + l] = queries[l] . x_r for l < S, in the
// same pass as ss[r] = sum of x_r^2. Gated (pre_gated), x_r is sig * row_r, formed in
// registers. Two or more rows load each query vector once for all of them: with one row, the
// S query loads per vector made Phase 1's logit pass load-bound (S + 1 loads for S + 1 FMAs;
// two rows take S + 2 for 2S + 2). Each row's accumulators see the same operations in the
// same order whatever the other rows, so neither N nor a row's company changes a bit.
template <int S, bool Gated, class Rows>
void dots_and_squares(const float* queries, int64_t d, const Rows& set, float* dots, float* ss,
                      const float* sig) {
  constexpr int N = Rows::N;
  VecF acc[N][S], sq[N];
  for (int r = 0; r < N; ++r) {
    sq[r] = cpu::vzero();
    for (int l = 0; l < S; ++l) acc[r][l] = cpu::vzero();
  }
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    // Each next row's cache line at i, once per line. Written out here, not as a RowSet
    // method: GCC finds such a method free of side effects and drops the call.
    if (i * static_cast<int64_t>(sizeof(*set.rows[0])) % 64 == 0) {
      for (int r = 0; r < Rows::kBankRows; ++r)
        if (set.next_rows[r]) __builtin_prefetch(set.next_rows[r] + i, 0, 3);
    }
    if (i * static_cast<int64_t>(sizeof(float)) % 64 == 0) {
      for (int r = 0; r < Rows::kF32Rows; ++r)
        if (set.next_f32_rows[r]) __builtin_prefetch(set.next_f32_rows[r] + i, 0, 3);
    }
    VecF x[N];
    set.load(x, i);
    for (int r = 0; r < N; ++r) {
      if constexpr (Gated) x[r] = cpu::vmul(x[r], cpu::vload(sig + i));
      sq[r] = cpu::vfma(x[r], x[r], sq[r]);
    }
    for (int l = 0; l < S; ++l) {
      const VecF q = cpu::in_register(cpu::vload(queries + l * d + i));  // once for N rows
      for (int r = 0; r < N; ++r) acc[r][l] = cpu::vfma(q, x[r], acc[r][l]);
    }
  }
  for (int r = 0; r < N; ++r) {
    ss[r] = cpu::hsum(sq[r]);
    for (int l = 0; l < S; ++l) dots[r * S + l] = cpu::hsum(acc[r][l]);
  }
  // The tail in explicit FMAs, like the vectors: left to -ffp-contract, whether a product
  // fuses would depend on how each template instance vectorises the loop over l.
  for (; i < d; ++i) {
    float v[N];
    set.load_scalar(v, i);
    for (int r = 0; r < N; ++r) {
      const float x = Gated ? v[r] * sig[i] : v[r];
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
  RowSet<R, 0, B> set;
  for (int r = 0; r < R; ++r) {
    set.rows[r] = src.row(j + r);
    set.next_rows[r] = j + R + r < n ? src.row(j + R + r) : nullptr;
  }
  float dots[R * S], ss[R];
  dots_and_squares<S, Gated>(queries, d, set, dots, ss, src.sig);
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

// One Phase 2 call's operands (validated). Each token's work reads them into locals: read
// through the DepthMixArgs inside the pass, every vector reloaded its pointers, because a
// store into out might, as far as the compiler knew, have changed them.
struct Phase2Operands {
  const float* query = nullptr;  // the partial's and the newer entries' query, or null
  bool partial_is_source = false;
  const float* m = nullptr;            // [T], or null: no Phase-1 state (newer entry 0 is it)
  const float* s = nullptr;            // [T]
  const float* o = nullptr;            // [T, d]
  const void* newer = nullptr;         // [K, T, d] in the bank's dtype, K the kernel's
  const float* p = nullptr;            // the partial [T, d]
  float* out = nullptr;                // [T, d], may alias p
  const float* gain = nullptr;         // the PreNorm's [d], widened
  const float* null_source = nullptr;  // [d], or null
  const float* gate_logits = nullptr;  // [T, d] with DepthGate::Vector, else null
  int64_t t_dim = 0, d = 0;
  float bias = 0.0f, mix_eps = 0.0f, norm_eps = 0.0f, null_logit = 0.0f, gate_blend = 0.0f;
  bool adds_partial = false;
  Backend::DepthGate gate = Backend::DepthGate::None;

  template <DType B>
  const BankT<B>* newer_row(int j, int64_t t) const {
    return static_cast<const BankT<B>*>(newer) + (j * t_dim + t) * d;
  }
};

// The logits of token t's sources that take the step's query, before any bias, in one pass
// (the query loaded once per vector for all rows): its K newer bank entries into logits[0, K)
// and, with P = 1, the partial into logits[K]. Token t + 1's rows are prefetched meanwhile:
// each row is a page of its own at d 1024, where the hardware prefetchers stop. A row's logit
// does not depend on which rows share its pass (dots_and_squares). FirstAsPhase1: entry 0's
// logit is formed as Phase 1 forms it (times the reciprocal rms, not divided by the rms), for
// the stateless mix, whose entry 0 stands for a Phase 1 over it.
template <int K, int P, DType B, bool FirstAsPhase1 = false>
void query_logits(const Phase2Operands& op, int64_t t, float* logits) {
  static_assert(K + P > 0);
  RowSet<K, P, B> set;
  const bool has_next = t + 1 < op.t_dim;
  for (int j = 0; j < K; ++j) {
    set.rows[j] = op.newer_row<B>(j, t);
    set.next_rows[j] = has_next ? op.newer_row<B>(j, t + 1) : nullptr;
  }
  if constexpr (P == 1) {
    set.f32_rows[0] = op.p + t * op.d;
    set.next_f32_rows[0] = has_next ? op.p + (t + 1) * op.d : nullptr;
  }
  float dots[K + P], ss[K + P];
  dots_and_squares<1, false>(op.query, op.d, set, dots, ss, nullptr);
  for (int r = 0; r < K + P; ++r) {
    const float rms = std::sqrt(ss[r] / static_cast<float>(op.d) + op.mix_eps);
    logits[r] = FirstAsPhase1 && r == 0 ? dots[r] * (1.0f / rms) : dots[r] / rms;
  }
}

// Token t's softmax over its sources: ATTNRES.md §3's Phase 2, with K newer bank entries
// where the paper has one partial, and the §2d partial and null sources. wb and wc weigh the
// partial and the null source; the bank side's part of h_mix is scale * at(i): o itself
// (scale e^(m - big) / den) when K = 0, else c o + sum_j w_j row_j (scale 1), formed in
// registers inside the caller's one pass over the token (a merged row written out and read
// back cost a store and a load per vector). K is a template argument so that the merge is
// unrolled, without a test per row and vector. Stateless: newer entry 0 is the Phase-1 state
// (o, in the bank's dtype) and the K merged rows are entries 1..K.
template <int K, DType B, bool Stateless>
struct TokenMix {
  using StateT = std::conditional_t<Stateless, BankT<B>, float>;
  static constexpr int kRows = K > 0 ? K : 1;
  static constexpr int kFirst = Stateless ? 1 : 0;  // the first merged row's newer index
  float scale = 1.0f, wb = 0.0f, wc = 0.0f;
  const StateT* o = nullptr;  // token t's Phase-1 row (stateless: its entry)
  float c = 0.0f;             // o's weight, K > 0
  const BankT<B>* rows[kRows] = {};
  float w[kRows] = {};  // the rows' weights
  VecF vc = cpu::vzero();
  VecF vw[kRows];

  TokenMix(const Phase2Operands& op, int64_t t) {
    // [the state entry's,] the merged entries', then the partial's
    float all_logits[kFirst + K + 1];
    constexpr int R = kFirst + K;  // bank rows in the logit pass
    if (op.partial_is_source) {
      query_logits<R, 1, B, Stateless>(op, t, all_logits);
    } else if constexpr (R > 0) {
      query_logits<R, 0, B, Stateless>(op, t, all_logits);
    }
    const float* logits = all_logits + kFirst;
    float m, s;
    if constexpr (Stateless) {  // what Phase 1 over this one entry gives
      m = all_logits[0];
      s = 1.0f;
      o = op.newer_row<B>(0, t);
    } else {
      m = op.m[t];
      s = op.s[t];
      o = op.o + t * op.d;
    }
    float big = m, q = 0.0f;
    if (op.partial_is_source) {
      q = logits[K] + op.bias;
      big = std::max(big, q);
    }
    for (int j = 0; j < K; ++j) big = std::max(big, logits[j]);
    if (op.null_source) big = std::max(big, op.null_logit);
    const float b = op.partial_is_source ? std::exp(q - big) : 0.0f;
    const float e_null = op.null_source ? std::exp(op.null_logit - big) : 0.0f;
    const float a = std::exp(m - big);
    // Explicit FMAs here and in the tails (the vectors' operations, lane for lane): left to
    // -ffp-contract, whether a product fuses could differ between the instances for f32 and
    // bf16 banks, or for different K.
    float den = std::fma(a, s, b + e_null);
    float e[K + 1];
    for (int j = 0; j < K; ++j) den += (e[j] = std::exp(logits[j] - big));
    const float inv_den = 1.0f / den;
    wb = b / den;
    wc = e_null / den;
    if constexpr (K == 0) {
      scale = a * inv_den;
    } else {
      c = a * inv_den;
      vc = cpu::vset1(c);
      for (int j = 0; j < K; ++j) {
        w[j] = e[j] * inv_den;
        vw[j] = cpu::vset1(w[j]);
        rows[j] = op.newer_row<B>(kFirst + j, t);
      }
    }
  }

  VecF state_at(int64_t i) const {
    if constexpr (Stateless) {
      return cpu::vload_w<B>(o + i);
    } else {
      return cpu::vload(o + i);
    }
  }
  float state_scalar(int64_t i) const {
    if constexpr (Stateless) {
      return cpu::load_scalar<B>(o + i);
    } else {
      return o[i];
    }
  }
  VecF at(int64_t i) const {
    if constexpr (K == 0) {
      return state_at(i);
    } else {
      VecF acc = cpu::vmul(vc, state_at(i));
      for (int j = 0; j < K; ++j) acc = cpu::vfma(vw[j], cpu::vload_w<B>(rows[j] + i), acc);
      return acc;
    }
  }
  float at_scalar(int64_t i) const {
    if constexpr (K == 0) {
      return state_scalar(i);
    } else {
      float acc = state_scalar(i) * c;
      for (int j = 0; j < K; ++j) acc = std::fma(w[j], cpu::load_scalar<B>(rows[j] + i), acc);
      return acc;
    }
  }
};

// Phase 2 of token t in the paper's form (the partial a source, no §2d switch), fused with
// the PreNorm: pass 1 is the logit pass, pass 2 writes h into out while summing h^2, pass 3
// scales out in place.
template <int K, DType B, bool Stateless>
void plain_token(const Phase2Operands& op, int64_t t) {
  const int64_t d = op.d;
  const float* p = op.p + t * d;
  float* h = op.out + t * d;
  const TokenMix<K, B, Stateless> mix(op, t);
  const auto* o_next = t + 1 < op.t_dim ? mix.o + d : nullptr;  // prefetched meanwhile
  const VecF va = cpu::vset1(mix.scale), vb = cpu::vset1(mix.wb);
  VecF hsq = cpu::vzero();
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    if (o_next) __builtin_prefetch(o_next + i, 0, 3);
    const VecF hv = cpu::vfma(va, mix.at(i), cpu::vmul(vb, cpu::vload(p + i)));
    hsq = cpu::vfma(hv, hv, hsq);
    cpu::vstore(h + i, hv);
  }
  float hss = cpu::hsum(hsq);
  for (; i < d; ++i) {
    h[i] = std::fma(mix.scale, mix.at_scalar(i), mix.wb * p[i]);
    hss = std::fma(h[i], h[i], hss);
  }
  scale_by_rms(h, hss, op.gain, d, op.norm_eps);
}

// Phase 2 of token t with the §2d switches: the softmax over the sources present, the residual
// base, the gate, then the PreNorm. Element by element (a vector of them at a time): each
// out[i] is written after p[i] (and the bank side's [i], the null source and the gate logit)
// are read, so out may alias p.
template <int K, DType B, bool Stateless>
void general_token(const Phase2Operands& op, int64_t t) {
  const int64_t d = op.d;
  const float* p = op.p + t * d;
  float* h = op.out + t * d;
  const TokenMix<K, B, Stateless> mix(op, t);
  const float* nv = op.null_source;
  const float* glt = op.gate_logits ? op.gate_logits + t * d : nullptr;
  const bool adds_partial = op.adds_partial, scalar_gate = op.gate == Backend::DepthGate::Scalar;
  const float wa = mix.scale, wb = mix.wb, wc = mix.wc, blend = op.gate_blend;
  // Vectors first (the switches are the same for every element: the branches predict),
  // then the scalar tail.
  const VecF vwa = cpu::vset1(wa), vwb = cpu::vset1(wb), vwc = cpu::vset1(wc);
  const VecF vblend = cpu::vset1(blend), one = cpu::vset1(1.0f);
  VecF hsq = cpu::vzero();
  // Token t + 1's partial and Phase-1 rows, prefetched meanwhile.
  const bool has_next = t + 1 < op.t_dim;
  const float* p_next = p + d;
  const auto* o_next = mix.o + d;
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    if (has_next) {
      __builtin_prefetch(p_next + i, 0, 3);
      __builtin_prefetch(o_next + i, 0, 3);
    }
    const VecF x = cpu::vload(p + i);
    VecF hm = cpu::vfma(vwa, mix.at(i), cpu::vmul(vwb, x));
    if (nv) hm = cpu::vfma(vwc, cpu::vload(nv + i), hm);
    if (adds_partial) hm = cpu::vadd(hm, x);
    VecF hv = hm;
    if (scalar_gate) {
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
    float hm = std::fma(wa, mix.at_scalar(i), wb * x);
    if (nv) hm = std::fma(wc, nv[i], hm);
    if (adds_partial) hm += x;
    float hv = hm;
    if (scalar_gate) {
      hv = std::fma(blend, hm - x, x);
    } else if (glt) {
      hv = x + (hm - x) / (1.0f + std::exp(-glt[i]));
    }
    h[i] = hv;
    hss = std::fma(hv, hv, hss);
  }
  scale_by_rms(h, hss, op.gain, d, op.norm_eps);
}

template <bool Plain, bool Stateless, int K, DType B>
void phase2_token(const Phase2Operands& op, int64_t t) {
  if constexpr (Plain) {
    plain_token<K, B, Stateless>(op, t);
  } else {
    general_token<K, B, Stateless>(op, t);
  }
}

// Runs the token kernel over every token, the kernel instance for K = the number of newer
// entries merged (0 <= K <= kMaxNewerSources; stateless, entry 0 is the state and not counted)
// and B the bank's dtype, chosen once per call.
template <bool Plain, bool Stateless, int K = 0>
void phase2_tokens(cpu::WorkerPool& pool, bool parallel, const Phase2Operands& op, int k,
                   bool bf16) {
  if constexpr (K < Backend::kMaxNewerSources - (Stateless ? 1 : 0)) {
    if (k != K) return phase2_tokens<Plain, Stateless, K + 1>(pool, parallel, op, k, bf16);
  }
  if (bf16) {
    pool.parallel_for(op.t_dim, parallel,
                      [&](int64_t t) { phase2_token<Plain, Stateless, K, DType::BF16>(op, t); });
  } else {
    pool.parallel_for(op.t_dim, parallel,
                      [&](int64_t t) { phase2_token<Plain, Stateless, K, DType::F32>(op, t); });
  }
}

}  // namespace

void CpuBackend::depth_phase2_prenorm(const DepthMixArgs& mix, const Tensor& partial,
                                      const Tensor& prenorm_gain, float norm_eps, Tensor& out) {
  ATTNRES_CHECK(partial.rank() >= 1, "depth_phase2 partial " + shape_str(partial.shape));
  const int64_t d = partial.dim(-1);
  cpu::check_f32_rows(partial, d, "depth_phase2 partial");
  cpu::check_f32_rows(out, d, "depth_phase2 out");
  const int64_t t_dim = cpu::rows_of(partial);
  ATTNRES_CHECK(out.numel() == partial.numel(), "depth_phase2 out " + shape_str(out.shape));
  // No Phase-1 state but newer entries: the first of them stands for it (the header comment).
  const bool stateless = mix.m == nullptr && mix.newer != nullptr;
  const bool mixing = mix.m != nullptr || stateless;
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
  if (stateless) {
    ATTNRES_CHECK(!mix.s && !mix.o, "depth_phase2: s / o given without m");
  } else {
    ATTNRES_CHECK(mix.s && mix.o, "depth_phase2: m given without s / o");
    ATTNRES_CHECK(mix.m->dtype == DType::F32 && mix.s->dtype == DType::F32 &&
                      mix.m->numel() == t_dim && mix.s->numel() == t_dim,
                  "depth_phase2 m " + shape_str(mix.m->shape) + " s " + shape_str(mix.s->shape));
    cpu::check_f32_rows(*mix.o, d, "depth_phase2 o");
    ATTNRES_CHECK(mix.o->numel() == t_dim * d, "depth_phase2 o " + shape_str(mix.o->shape));
  }
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
  const std::vector<float> gain = cpu::widen_vector(prenorm_gain, d, "depth_phase2 gain");
  Phase2Operands op;
  op.query = mix.query ? mix.query->ptr<float>() : nullptr;
  op.partial_is_source = mix.partial_is_source;
  if (!stateless) {
    op.m = mix.m->ptr<float>();
    op.s = mix.s->ptr<float>();
    op.o = mix.o->ptr<float>();
  }
  op.newer = mix.newer ? mix.newer->data : nullptr;
  op.p = partial.ptr<float>();
  op.out = out.ptr<float>();
  op.gain = gain.data();
  op.null_source = mix.null_source ? mix.null_source->ptr<float>() : nullptr;
  op.gate_logits = mix.gate == DepthGate::Vector ? mix.gate_logits->ptr<float>() : nullptr;
  op.t_dim = t_dim;
  op.d = d;
  op.bias = mix.bias;
  op.mix_eps = mix.mix_eps;
  op.norm_eps = norm_eps;
  op.null_logit = mix.null_logit;
  op.gate_blend = mix.gate_blend;
  op.adds_partial = mix.adds_partial;
  op.gate = mix.gate;
  // The newer entries merged into the state (stateless: all but the first).
  const int k = (mix.newer ? static_cast<int>(mix.newer->dim(0)) : 0) - (stateless ? 1 : 0);
  const bool bf16 = mix.newer && mix.newer->dtype == DType::BF16;
  const bool parallel = threads_ > 1 && t_dim > 1;
  if (plain_mix && stateless) {
    phase2_tokens<true, true>(*pool_, parallel, op, k, bf16);
  } else if (plain_mix) {
    phase2_tokens<true, false>(*pool_, parallel, op, k, bf16);
  } else if (stateless) {
    phase2_tokens<false, true>(*pool_, parallel, op, k, bf16);
  } else {
    phase2_tokens<false, false>(*pool_, parallel, op, k, bf16);
  }
}

}  // namespace attnres
