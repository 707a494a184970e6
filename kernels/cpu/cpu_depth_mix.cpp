// Depth attention (docs/ATTNRES.md §3), the two-phase form.
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
// online-softmax updates of o instead reads and writes all S o rows per source and takes half
// as long again: docs/perf-log/twin-gap.md.)
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
// delta_v's attention step mixes twice over the same sources, once with its K stream's query
// and once with its V stream's (depth_phase2_prenorm_pair): one region, and per token one
// logit pass for both queries (each row's sum of squares once) and one pass 2 loading the
// partial's and the newer entries' vectors once for both outputs. Each stream's arithmetic is
// a single call's, so the pair gives the same bits as two calls.
// With no Phase-1 state (m, s, o null: a group whose shared prefix is one entry skips Phase 1),
// the first newer entry is the state: m its logit, formed as Phase 1 forms it, s = 1, o the
// entry itself, read in the bank's dtype. Phase 1 over one entry gives exactly those values
// (e^0 = 1, 1 * x = x), so the result is the same bits, without Phase 1 writing S o rows that
// each hold a copy of the entry.
//
// The open-attnres modes (docs/ATTNRES.md §2d) are switches of the same two ops: Phase 1 may gate
// every source by sigmoid(gate logits[t]) first (pre_gated: the gated row is formed in
// registers for the logits, and the weighted sum of the bare rows is gated once); Phase 2 may
// drop the partial as a source, merge a null source with a constant logit, add the partial to
// the mix (delta modes) and blend x and the mix with a scalar or per-element gate. Those cases
// take a general element-wise pass 2; 2a/2b keep the plain one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
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

// For each of the N rows x_r of `set`: dots[r * S + l] = queries[l] . x_r for l < S (query l
// at queries + l * query_stride), in the same pass as ss[r] = sum of x_r^2. Gated
// (pre_gated), x_r is sig * row_r, formed in registers. Two or more rows load each query
// vector once for all of them: with one row, the S query loads per vector made Phase 1's logit
// pass load-bound (S + 1 loads for S + 1 FMAs; two rows take S + 2 for 2S + 2). Each row's
// accumulators see the same operations in the same order whatever the other rows and
// queries, so neither N, S nor a row's company changes a bit.
template <int S, bool Gated, class Rows>
void dots_and_squares(const float* queries, int64_t query_stride, int64_t d, const Rows& set,
                      float* dots, float* ss, const float* sig) {
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
      const VecF q =
          cpu::in_register(cpu::vload(queries + l * query_stride + i));  // once for N rows
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
        dots[r * S + l] = std::fma(queries[l * query_stride + i], x, dots[r * S + l]);
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

// The PreNorm's last pass over a token's h (d values, their sum of squares hss): out = h /
// rms(h) * gain, in place (out == h, f32) or rounded into bf16 rows (a linear's input,
// CpuBackend::linear_input_dtype): the same f32 value either way.
template <class OutT>
inline void scale_by_rms(const float* h, float hss, const float* gain, int64_t d, float eps,
                         OutT* out) {
  const float inv_rms = 1.0f / std::sqrt(hss / static_cast<float>(d) + eps);
  const VecF vs = cpu::vset1(inv_rms);
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes)
    cpu::vstore_as(out + i, cpu::vmul(cpu::vmul(cpu::vload(h + i), vs), cpu::vload(gain + i)));
  for (; i < d; ++i) cpu::store_as(out + i, h[i] * inv_rms * gain[i]);
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
  dots_and_squares<S, Gated>(queries, d, d, set, dots, ss, src.sig);
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

void CpuBackend::depth_phase1_impl(const Tensor& queries, const Tensor& bank, int n, float eps,
                                   Tensor& m, Tensor& s, Tensor& o,
                                   const Tensor* source_gate_logits) {
  const int64_t s_dim = queries.dim(0), d = queries.dim(1);
  cpu::check_on_cpu(queries, "depth_phase1 queries");
  cpu::check_on_cpu(bank, "depth_phase1 bank");
  cpu::check_on_cpu(m, "depth_phase1 m");
  cpu::check_on_cpu(s, "depth_phase1 s");
  cpu::check_on_cpu(o, "depth_phase1 o");
  const int64_t t_dim = bank.dim(1);
  const Tensor* gate = source_gate_logits;
  if (gate) cpu::check_on_cpu(*gate, "depth_phase1 source gate");
  const float* gp = gate ? gate->ptr<float>() : nullptr;
  const bool parallel = threads_ > 1 && t_dim > 1;
  float* mp = m.ptr<float>();
  float* sp = s.ptr<float>();
  float* op = o.ptr<float>();
  if (bank.dtype == DType::BF16) {
    phase1_tokens<DType::BF16>(*pool_, parallel, queries.ptr<float>(), s_dim, bank.ptr<uint16_t>(),
                               n, t_dim, d, eps, gp, mp, sp, op);
  } else {
    phase1_tokens<DType::F32>(*pool_, parallel, queries.ptr<float>(), s_dim, bank.ptr<float>(), n,
                              t_dim, d, eps, gp, mp, sp, op);
  }
}

namespace {

// One Phase 2 stream's operands (validated). Each token's work reads them into locals: read
// through the DepthMixArgs inside the pass, every vector reloaded its pointers, because a
// store into out might, as far as the compiler knew, have changed them. A pair of streams
// (depth_phase2_prenorm_pair) shares everything but the fields marked "per stream".
struct Phase2Operands {
  const float* query = nullptr;  // per stream: the partial's and the newer entries' query, or null
  bool partial_is_source = false;
  const float* m = nullptr;      // per stream: [T], or null: no Phase-1 state (newer entry 0 is it)
  const float* s = nullptr;      // per stream: [T]
  const float* o = nullptr;      // per stream: [T, d]
  const void* newer = nullptr;   // [K, T, d] in the bank's dtype, K the kernel's
  const float* p = nullptr;      // the partial [T, d]
  float* out = nullptr;          // per stream: [T, d], may alias p (one stream only)
  uint16_t* out_bf16 = nullptr;  // per stream, instead of out: bf16 rows [T, d]
  const float* gain = nullptr;   // the PreNorm's [d], widened
  const float* null_source = nullptr;  // [d], or null
  const float* gate_logits = nullptr;  // [T, d] with DepthGate::Vector, else null
  int64_t t_dim = 0, d = 0;
  float bias = 0.0f, mix_eps = 0.0f, norm_eps = 0.0f, gate_blend = 0.0f;
  float null_logit = 0.0f;  // per stream
  bool adds_partial = false;
  Backend::DepthGate gate = Backend::DepthGate::None;

  template <DType B>
  const BankT<B>* newer_row(int j, int64_t t) const {
    return static_cast<const BankT<B>*>(newer) + (j * t_dim + t) * d;
  }
};

// The logits of token t's sources that take a query, before any bias, in one pass (each
// query loaded once per vector for all rows), for S queries (query l at queries + l *
// query_stride; a pair's two streams): its K newer bank entries into logits[l * stride + j]
// for j < K and, with P = 1, the partial into logits[l * stride + K]. Token t + 1's rows are
// prefetched meanwhile: each row is a page of its own at d 1024, where the hardware
// prefetchers stop. A row's logit for one query depends neither on which rows share its pass
// nor on the other queries (dots_and_squares). FirstAsPhase1: entry 0's logit is formed as
// Phase 1 forms it (times the reciprocal rms, not divided by the rms), for the stateless mix,
// whose entry 0 stands for a Phase 1 over it.
template <int K, int P, DType B, bool FirstAsPhase1, int S>
void query_logits(const Phase2Operands& op, int64_t t, const float* queries, int64_t query_stride,
                  float* logits, int stride) {
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
  float dots[(K + P) * S], ss[K + P];
  dots_and_squares<S, false>(queries, query_stride, op.d, set, dots, ss, nullptr);
  for (int r = 0; r < K + P; ++r) {
    const float rms = std::sqrt(ss[r] / static_cast<float>(op.d) + op.mix_eps);
    for (int l = 0; l < S; ++l) {
      const float dot = dots[r * S + l];
      logits[l * stride + r] = FirstAsPhase1 && r == 0 ? dot * (1.0f / rms) : dot / rms;
    }
  }
}

// Token t's softmax over its sources: docs/ATTNRES.md §3's Phase 2, with K newer bank entries
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
  // Logits per query: [the state entry's,] the merged entries', then the partial's.
  static constexpr int kLogits = kFirst + K + 1;
  float scale = 1.0f, wb = 0.0f, wc = 0.0f;
  const StateT* o = nullptr;  // token t's Phase-1 row (stateless: its entry)
  float c = 0.0f;             // o's weight, K > 0
  const BankT<B>* rows[kRows] = {};
  float w[kRows] = {};  // the rows' weights
  VecF vc = cpu::vzero();
  VecF vw[kRows];

  // The logits of S streams' queries (S <= 2: the second's query is op.query + query_stride),
  // kLogits per stream; those not taken (no partial source) are left unset.
  template <int S>
  static void logits_of(const Phase2Operands& op, int64_t t, int64_t query_stride, float* logits) {
    constexpr int R = kFirst + K;  // bank rows in the logit pass
    if (op.partial_is_source) {
      query_logits<R, 1, B, Stateless, S>(op, t, op.query, query_stride, logits, kLogits);
    } else if constexpr (R > 0) {
      query_logits<R, 0, B, Stateless, S>(op, t, op.query, query_stride, logits, kLogits);
    }
  }

  // From one stream's operands and its kLogits logits (logits_of).
  TokenMix(const Phase2Operands& op, int64_t t, const float* all_logits) {
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

// One stream's passes 2 and 3 over token t: vector() / scalar() write h at element i from
// the partial's element x and the stream's mix and return it (the caller sums h^2); finish()
// then scales out by the PreNorm in place. Each out[i] is written after p[i] (and the bank
// side's [i], the null source and the gate logit) are read, so one stream's out may alias p.
// A bf16 out: h is formed in `stage` (d floats of the thread's), and finish() rounds the
// scaled row into out.
// Plain: the paper's form (the partial a source, no §2d switch); otherwise the softmax over
// the sources present, the residual base and the gate, whose switches are the same for every
// element (the branches predict). Const: its weights and row pointers are read in every
// vector of the pass, next to stores into out, and a const object's stay in registers.
template <bool Plain, int K, DType B, bool Stateless>
class StreamPass {
 public:
  using Mix = TokenMix<K, B, Stateless>;

  StreamPass(const Phase2Operands& op, int64_t t, const float* logits, float* stage)
      : mix_(op, t, logits),
        h_(op.out_bf16 ? stage : op.out + t * op.d),
        out_bf16_(op.out_bf16 ? op.out_bf16 + t * op.d : nullptr),
        d_(op.d),
        gain_(op.gain),
        norm_eps_(op.norm_eps),
        nv_(op.null_source),
        glt_(op.gate_logits ? op.gate_logits + t * op.d : nullptr),
        adds_partial_(op.adds_partial),
        scalar_gate_(op.gate == Backend::DepthGate::Scalar),
        blend_(op.gate_blend),
        vwa_(cpu::vset1(mix_.scale)),
        vwb_(cpu::vset1(mix_.wb)),
        vwc_(cpu::vset1(mix_.wc)),
        vblend_(cpu::vset1(op.gate_blend)) {}

  // Token t + 1's Phase-1 row at element i, meanwhile.
  void prefetch_next_state(int64_t i) const { __builtin_prefetch(mix_.o + d_ + i, 0, 3); }

  VecF vector(VecF x, int64_t i) const {
    VecF hv;
    if constexpr (Plain) {
      hv = cpu::vfma(vwa_, mix_.at(i), cpu::vmul(vwb_, x));
    } else {
      VecF hm = cpu::vfma(vwa_, mix_.at(i), cpu::vmul(vwb_, x));
      if (nv_) hm = cpu::vfma(vwc_, cpu::vload(nv_ + i), hm);
      if (adds_partial_) hm = cpu::vadd(hm, x);
      hv = hm;
      if (scalar_gate_) {
        hv = cpu::vfma(vblend_, cpu::vsub(hm, x), x);
      } else if (glt_) {  // x + (hm - x) * sigmoid(gate logit)
        const VecF den =
            cpu::vadd(cpu::vset1(1.0f), cpu::vexp(cpu::vsub(cpu::vzero(), cpu::vload(glt_ + i))));
        hv = cpu::vadd(x, cpu::vdiv(cpu::vsub(hm, x), den));
      }
    }
    cpu::vstore(h_ + i, hv);
    return hv;
  }

  float scalar(float x, int64_t i) const {
    float hv = std::fma(mix_.scale, mix_.at_scalar(i), mix_.wb * x);
    if constexpr (!Plain) {
      if (nv_) hv = std::fma(mix_.wc, nv_[i], hv);
      if (adds_partial_) hv += x;
      if (scalar_gate_) {
        hv = std::fma(blend_, hv - x, x);
      } else if (glt_) {
        hv = x + (hv - x) / (1.0f + std::exp(-glt_[i]));
      }
    }
    h_[i] = hv;
    return hv;
  }

  // hss: the sum of h^2 over the token.
  void finish(float hss) const {
    if (out_bf16_) {
      scale_by_rms(h_, hss, gain_, d_, norm_eps_, out_bf16_);
    } else {
      scale_by_rms(h_, hss, gain_, d_, norm_eps_, h_);
    }
  }

 private:
  const Mix mix_;
  float* const h_;
  uint16_t* const out_bf16_;
  const int64_t d_;
  const float* const gain_;
  const float norm_eps_;
  const float* const nv_;
  const float* const glt_;
  const bool adds_partial_, scalar_gate_;
  const float blend_;
  const VecF vwa_, vwb_, vwc_, vblend_;
};

// Passes 2 and 3 of token t for stream a and (a pair) stream b, the partial's vectors loaded
// once for both. Inlined into phase2_token, where the streams are const locals. (Streams that
// kept their own sums of h^2, in an array or in std::optional, made the plain kernel 5-9%
// slower with an f32 bank at d 1024: bench_cpu_kernels depth.)
template <bool Plain, class Pass>
[[gnu::always_inline]] inline void mix_passes(const Phase2Operands& op, int64_t t, const Pass& a,
                                              const Pass* b) {
  const int64_t d = op.d;
  const float* p = op.p + t * d;
  const bool has_next = t + 1 < op.t_dim;  // token t + 1's rows, prefetched meanwhile
  VecF hsq_a = cpu::vzero(), hsq_b = cpu::vzero();
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    if (has_next) {
      if constexpr (!Plain) __builtin_prefetch(p + d + i, 0, 3);
      a.prefetch_next_state(i);
      if (b) b->prefetch_next_state(i);
    }
    const VecF x = cpu::vload(p + i);
    const VecF ha = a.vector(x, i);
    hsq_a = cpu::vfma(ha, ha, hsq_a);
    if (b) {
      const VecF hb = b->vector(x, i);
      hsq_b = cpu::vfma(hb, hb, hsq_b);
    }
  }
  float hss_a = cpu::hsum(hsq_a), hss_b = cpu::hsum(hsq_b);
  for (; i < d; ++i) {
    const float x = p[i];
    const float ha = a.scalar(x, i);
    hss_a = std::fma(ha, ha, hss_a);
    if (b) {
      const float hb = b->scalar(x, i);
      hss_b = std::fma(hb, hb, hss_b);
    }
  }
  a.finish(hss_a);
  if (b) b->finish(hss_b);
}

// Phase 2 of token t for S streams (S = 2: depth_phase2_prenorm_pair) fused with the
// PreNorm: pass 1 the logit pass (every query in one pass over the rows), then passes 2 and 3
// per stream, the partial's and the bank rows' vectors loaded once for all streams. Each
// stream's operations are the same, in the same order, whatever S: a pair gives the bits of
// two single calls.
template <bool Plain, int K, DType B, bool Stateless, int S>
[[gnu::always_inline]] inline void phase2_token(const Phase2Operands* const* ops,
                                                int64_t query_stride, int64_t t) {
  static_assert(S == 1 || S == 2);
  using Mix = TokenMix<K, B, Stateless>;
  using Pass = StreamPass<Plain, K, B, Stateless>;
  const Phase2Operands& op = *ops[0];  // the operands the streams share
  float logits[S * Mix::kLogits];
  Mix::template logits_of<S>(op, t, query_stride, logits);
  // Bf16 outs: each stream's h in f32 first (phase2_operands makes both streams' outs alike).
  float* stage = op.out_bf16 ? cpu::thread_scratch(cpu::ScratchSlot::DepthRows, S * op.d) : nullptr;
  const Pass a(op, t, logits, stage);
  if constexpr (S == 1) {
    mix_passes<Plain>(op, t, a, static_cast<const Pass*>(nullptr));
  } else {
    const Pass b(*ops[1], t, logits + Mix::kLogits, stage ? stage + op.d : nullptr);
    mix_passes<Plain>(op, t, a, &b);
  }
}

// Runs the token kernel over every token, the kernel instance for K = the number of newer
// entries merged (0 <= K <= kMaxNewerSources; stateless, entry 0 is the state and not counted)
// and B the bank's dtype, chosen once per call.
template <bool Plain, bool Stateless, int S, int K = 0>
void phase2_tokens(cpu::WorkerPool& pool, bool parallel, const Phase2Operands* const* ops,
                   int64_t query_stride, int k, bool bf16) {
  if constexpr (K < Backend::kMaxNewerSources - (Stateless ? 1 : 0)) {
    if (k != K) {
      return phase2_tokens<Plain, Stateless, S, K + 1>(pool, parallel, ops, query_stride, k, bf16);
    }
  }
  const int64_t t_dim = ops[0]->t_dim;
  if (bf16) {
    pool.parallel_for(t_dim, parallel, [&](int64_t t) {
      phase2_token<Plain, K, DType::BF16, Stateless, S>(ops, query_stride, t);
    });
  } else {
    pool.parallel_for(t_dim, parallel, [&](int64_t t) {
      phase2_token<Plain, K, DType::F32, Stateless, S>(ops, query_stride, t);
    });
  }
}

// A mix that mixes: with a Phase-1 state, or newer entries standing for one.
bool mixes(const Backend::DepthMixArgs& mix) { return mix.m != nullptr || mix.newer != nullptr; }

// The operands of one mixing Phase 2 call, validated; gain is the PreNorm's, widened.
Phase2Operands phase2_operands(const Backend::DepthMixArgs& mix, const Tensor& partial,
                               const float* gain, float norm_eps, Tensor& out) {
  // The operands' shapes and dtypes are Backend's checks (backend.cpp); their device is ours.
  const int64_t d = partial.dim(-1);
  const int64_t t_dim = cpu::rows_of(partial);
  // No Phase-1 state but newer entries: the first of them stands for it (the header comment).
  const bool stateless = mix.m == nullptr && mix.newer != nullptr;
  const std::pair<const Tensor*, const char*> operands[] = {
      {&partial, "depth_phase2 partial"},
      {&out, "depth_phase2 out"},
      {mix.query, "depth_phase2 query"},
      {mix.newer, "depth_phase2 newer entries"},
      {mix.m, "depth_phase2 m"},
      {mix.s, "depth_phase2 s"},
      {mix.o, "depth_phase2 o"},
      {mix.null_source, "depth_phase2 null source"},
      {mix.gate_logits, "depth_phase2 gate logits"}};
  for (const auto& [t, what] : operands) {
    if (t) cpu::check_on_cpu(*t, what);
  }
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
  if (out.dtype == DType::BF16) {
    op.out_bf16 = out.ptr<uint16_t>();
  } else {
    op.out = out.ptr<float>();
  }
  op.gain = gain;
  op.null_source = mix.null_source ? mix.null_source->ptr<float>() : nullptr;
  op.gate_logits = mix.gate == Backend::DepthGate::Vector ? mix.gate_logits->ptr<float>() : nullptr;
  op.t_dim = t_dim;
  op.d = d;
  op.bias = mix.bias;
  op.mix_eps = mix.mix_eps;
  op.norm_eps = norm_eps;
  op.null_logit = mix.null_logit;
  op.gate_blend = mix.gate_blend;
  op.adds_partial = mix.adds_partial;
  op.gate = mix.gate;
  return op;
}

// Runs Phase 2 for S streams' operands (ops[1..S) share all but the per-stream fields with
// ops[0], checked by the caller), each newer entry the same for all.
template <int S>
void run_phase2(cpu::WorkerPool& pool, bool parallel, const Phase2Operands* const* ops,
                const Backend::DepthMixArgs& mix, int64_t query_stride) {
  const bool stateless = mix.m == nullptr;
  const bool plain_mix = mix.partial_is_source && !mix.adds_partial && !mix.null_source &&
                         mix.gate == Backend::DepthGate::None;
  // The newer entries merged into the state (stateless: all but the first).
  const int k = (mix.newer ? static_cast<int>(mix.newer->dim(0)) : 0) - (stateless ? 1 : 0);
  const bool bf16 = mix.newer && mix.newer->dtype == DType::BF16;
  if (plain_mix && stateless) {
    phase2_tokens<true, true, S>(pool, parallel, ops, query_stride, k, bf16);
  } else if (plain_mix) {
    phase2_tokens<true, false, S>(pool, parallel, ops, query_stride, k, bf16);
  } else if (stateless) {
    phase2_tokens<false, true, S>(pool, parallel, ops, query_stride, k, bf16);
  } else {
    phase2_tokens<false, false, S>(pool, parallel, ops, query_stride, k, bf16);
  }
}

// Whether two optional tensors are the same view (both absent, or the same memory and shape).
bool same_view(const Tensor* a, const Tensor* b) {
  if (!a || !b) return a == b;
  return a->data == b->data && a->shape == b->shape && a->dtype == b->dtype;
}

}  // namespace

void CpuBackend::depth_phase2_prenorm_impl(const DepthMixArgs& mix, const Tensor& partial,
                                           const Tensor& prenorm_gain, float norm_eps,
                                           Tensor& out) {
  if (!mixes(mix)) return rms_norm_impl(partial, prenorm_gain, norm_eps, out);  // h = p
  const std::vector<float> gain =
      cpu::widen_vector(prenorm_gain, partial.dim(-1), "depth_phase2 gain");
  const Phase2Operands op = phase2_operands(mix, partial, gain.data(), norm_eps, out);
  const Phase2Operands* ops[1] = {&op};
  run_phase2<1>(*pool_, threads_ > 1 && op.t_dim > 1, ops, mix, 0);
}

void CpuBackend::depth_phase2_prenorm_pair_impl(const DepthMixArgs& a, const DepthMixArgs& b,
                                                const Tensor& partial, const Tensor& prenorm_gain,
                                                float norm_eps, Tensor& out_a, Tensor& out_b) {
  if (!mixes(a) || !mixes(b)) {  // a plain pre-norm on either side: nothing to share
    Backend::depth_phase2_prenorm_pair_impl(a, b, partial, prenorm_gain, norm_eps, out_a, out_b);
    return;
  }
  ATTNRES_CHECK((a.m == nullptr) == (b.m == nullptr) && same_view(a.newer, b.newer) &&
                    a.partial_is_source == b.partial_is_source &&
                    a.adds_partial == b.adds_partial && a.bias == b.bias &&
                    a.mix_eps == b.mix_eps && same_view(a.null_source, b.null_source) &&
                    a.gate == b.gate && a.gate_blend == b.gate_blend &&
                    (a.gate != DepthGate::Vector || same_view(a.gate_logits, b.gate_logits)) &&
                    (a.query == nullptr) == (b.query == nullptr),
                "depth_phase2_prenorm_pair: the two mixes differ in more than their query, "
                "Phase-1 rows and null logit");
  const std::vector<float> gain =
      cpu::widen_vector(prenorm_gain, partial.dim(-1), "depth_phase2 gain");
  ATTNRES_CHECK(out_a.dtype == out_b.dtype, "depth_phase2_prenorm_pair: outputs of two dtypes");
  const Phase2Operands op_a = phase2_operands(a, partial, gain.data(), norm_eps, out_a);
  const Phase2Operands op_b = phase2_operands(b, partial, gain.data(), norm_eps, out_b);
  // The second query's place relative to the first's (whole floats: both are f32 arrays).
  const int64_t query_stride =
      op_a.query
          ? (reinterpret_cast<intptr_t>(op_b.query) - reinterpret_cast<intptr_t>(op_a.query)) /
                static_cast<intptr_t>(sizeof(float))
          : 0;
  const Phase2Operands* ops[2] = {&op_a, &op_b};
  run_phase2<2>(*pool_, threads_ > 1 && op_a.t_dim > 1, ops, a, query_stride);
}

}  // namespace attnres
