#include "engine/core/quant_search.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/dtype.h"
#include "engine/core/error.h"

#if defined(__AVX512F__)
// g++ 12 reports -W(maybe-)uninitialized inside its own AVX-512 intrinsics (GCC PR105593),
// as kernels/cpu/cpu_simd.h notes; silence it for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

// Built with -ffp-contract=off (engine/core/CMakeLists.txt): a fused multiply-add would round
// differently from the separate operations the rule (and the NumPy quantizer) is defined by.
//
// Speed: quantizing a model at load runs this for every block (~17M blocks at 0.6B), so the
// error loops are written lane by lane (kLanes independent accumulators, which the compiler
// turns into vector code without reordering any sum), and a candidate whose error provably
// cannot beat the absmax / min-max choice is skipped unevaluated; skipping never changes the
// choice.

namespace attnres {
namespace {

constexpr int kLanes = 8;
constexpr int kSymFirst = -10, kSymLast = 10;  // symmetric: denominators qmax + i / 5
constexpr int kAsymFirst = -3, kAsymLast = 3;  // asymmetric: denominators qmax + 2 i / 5
constexpr int kCandPad = 48;                   // room for either list, in whole vectors of 16

// f16 rounding as f32_to_f16 does it (nearest, ties to even, overflow to infinity), in one
// conversion instruction where the compiler has _Float16 for the target (GCC 12; clang 14 on
// x86 has not), else by f32_to_f16 itself.
#if defined(__FLT16_MANT_DIG__)
float f16_round(float v) { return static_cast<float>(static_cast<_Float16>(v)); }
#else
float f16_round(float v) { return f16_to_f32(f32_to_f16(v)); }
#endif

void check_block(int n, int qmax) {
  ATTNRES_CHECK(n > 0 && n % kLanes == 0 && n <= kQuantSearchMaxBlock && qmax >= 1,
                "quant search: a block of " + std::to_string(n) + " with qmax " +
                    std::to_string(qmax) + " (blocks are positive multiples of 8, at most " +
                    std::to_string(kQuantSearchMaxBlock) + ", qmax >= 1)");
}

float checked(float f16_value, float unrounded) {
  if (!std::isfinite(f16_value))
    throw Error("quantize: a block's scale " + std::to_string(unrounded) + " overflows f16");
  return f16_value;
}

double add_lanes(const double (&acc)[kLanes]) {
  double total = acc[0];
  for (int l = 1; l < kLanes; ++l) total += acc[l];
  return total;
}

#if defined(__AVX512F__)
// Blocks of 16 (Q6_K256's sub-blocks) and 32 (both B32 formats, Q4_K256) with AVX-512: the
// same operations, lane by lane, as the portable loops below (a lane of eight doubles per
// accumulator, the vectors of eight weights added in order), so the results are identical.
inline __m512d lo_pd(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
inline __m512d hi_pd(__m512 v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

template <int N>
struct BlockV {
  static constexpr int kVecs = N / 16;
  __m512 x[kVecs];
  __m512d xd[2 * kVecs];  // x widened, weights 8 k .. 8 k + 7
  explicit BlockV(const float* p) {
    for (int v = 0; v < kVecs; ++v) {
      x[v] = _mm512_loadu_ps(p + 16 * v);
      xd[2 * v] = lo_pd(x[v]);
      xd[2 * v + 1] = hi_pd(x[v]);
    }
  }
};

inline __m512 round_clamp(__m512 r, __m512 lo, __m512 hi) {
  r = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_min_ps(_mm512_max_ps(r, lo), hi);
}
// add_lanes in registers (a store and eight scalar loads would stall on store forwarding).
[[gnu::always_inline]] inline double sum_lanes(__m512d acc) {
  const __m128d p0 = _mm512_castpd512_pd128(acc);
  double total = _mm_cvtsd_f64(p0);
  total += _mm_cvtsd_f64(_mm_unpackhi_pd(p0, p0));
  for (const __m128d pair : {_mm512_extractf64x2_pd(acc, 1), _mm512_extractf64x2_pd(acc, 2),
                             _mm512_extractf64x2_pd(acc, 3)}) {
    total += _mm_cvtsd_f64(pair);
    total += _mm_cvtsd_f64(_mm_unpackhi_pd(pair, pair));
  }
  return total;
}
// sum over the block of (x - w)^2, w[v] the weights of x[v].
template <int N>
[[gnu::always_inline]] inline double sq_error_v(const BlockV<N>& b, const __m512* w) {
  __m512d e[2 * BlockV<N>::kVecs];
  for (int v = 0; v < BlockV<N>::kVecs; ++v) {
    e[2 * v] = _mm512_sub_pd(b.xd[2 * v], lo_pd(w[v]));
    e[2 * v + 1] = _mm512_sub_pd(b.xd[2 * v + 1], hi_pd(w[v]));
  }
  __m512d acc = _mm512_mul_pd(e[0], e[0]);
  for (int k = 1; k < 2 * BlockV<N>::kVecs; ++k)
    acc = _mm512_add_pd(acc, _mm512_mul_pd(e[k], e[k]));
  return sum_lanes(acc);
}
template <int N>
double sym_error_v(const BlockV<N>& b, float qmax, float d) {
  const __m512 vd = _mm512_set1_ps(d), hi = _mm512_set1_ps(qmax), lo = _mm512_set1_ps(-qmax);
  __m512 w[BlockV<N>::kVecs];
  for (int v = 0; v < BlockV<N>::kVecs; ++v)
    w[v] = _mm512_mul_ps(vd, round_clamp(_mm512_div_ps(b.x[v], vd), lo, hi));
  return sq_error_v(b, w);
}
template <int N>
[[gnu::always_inline]] inline void asym_q_v(const BlockV<N>& b, float qmax, float d, float m,
                                            __m512* q) {
  const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
  const __m512 hi = _mm512_set1_ps(qmax), lo = _mm512_setzero_ps();
  for (int v = 0; v < BlockV<N>::kVecs; ++v)
    q[v] = round_clamp(_mm512_div_ps(_mm512_sub_ps(b.x[v], vm), vd), lo, hi);
}
template <int N>
[[gnu::always_inline]] inline double asym_error_of_q(const BlockV<N>& b, float d, float m,
                                                     const __m512* q) {
  const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
  __m512 w[BlockV<N>::kVecs];
  for (int v = 0; v < BlockV<N>::kVecs; ++v) w[v] = _mm512_add_ps(_mm512_mul_ps(vd, q[v]), vm);
  return sq_error_v(b, w);
}
template <int N>
double asym_error_v(const BlockV<N>& b, float qmax, float d, float m) {
  __m512 q[BlockV<N>::kVecs];
  asym_q_v(b, qmax, d, m, q);
  return asym_error_of_q(b, d, m, q);
}
// asym_error_v, and S(q), S(q^2), S(xq) of (d, m)'s q, each in the lane order.
template <int N>
double asym_error_sums_v(const BlockV<N>& b, float qmax, float d, float m, double* s_q,
                         double* s_qq, double* s_xq) {
  __m512 q[BlockV<N>::kVecs];
  asym_q_v(b, qmax, d, m, q);
  __m512d qd[2 * BlockV<N>::kVecs];
  for (int v = 0; v < BlockV<N>::kVecs; ++v) {
    qd[2 * v] = lo_pd(q[v]);
    qd[2 * v + 1] = hi_pd(q[v]);
  }
  __m512d aq = qd[0], aqq = _mm512_mul_pd(qd[0], qd[0]), axq = _mm512_mul_pd(b.xd[0], qd[0]);
  for (int k = 1; k < 2 * BlockV<N>::kVecs; ++k) {
    aq = _mm512_add_pd(aq, qd[k]);
    aqq = _mm512_add_pd(aqq, _mm512_mul_pd(qd[k], qd[k]));
    axq = _mm512_add_pd(axq, _mm512_mul_pd(b.xd[k], qd[k]));
  }
  *s_q = sum_lanes(aq);
  *s_qq = sum_lanes(aqq);
  *s_xq = sum_lanes(axq);
  return asym_error_of_q(b, d, m, q);
}

inline __m512 f16_round16(__m512 v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// symmetric_candidates (below) sixteen at a time (any block size: it reads one weight).
int symmetric_candidates_v(float xt, float amax, float qmax, float d0, double e0, const float* den,
                           int count, float* out) {
  alignas(64) float dv[kCandPad + 16];
  dv[0] = d0;
  for (int k = 0; k < count; k += 16)
    _mm512_storeu_ps(dv + 1 + k,
                     f16_round16(_mm512_div_ps(_mm512_set1_ps(amax), _mm512_loadu_ps(den + k))));
  const __m512 vx = _mm512_set1_ps(xt), hi = _mm512_set1_ps(qmax), lo = _mm512_set1_ps(-qmax);
  const __m512d vxd = _mm512_set1_pd(xt), ve0 = _mm512_set1_pd(e0);
  int out_count = 0;
  for (int k = 0; k < count; k += 16) {
    const __m512 d = _mm512_loadu_ps(dv + 1 + k), prev = _mm512_loadu_ps(dv + k);
    __mmask16 keep = static_cast<__mmask16>(count - k >= 16 ? 0xffff : (1u << (count - k)) - 1);
    keep &= _mm512_cmp_ps_mask(d, _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
    keep &= _mm512_cmp_ps_mask(d, prev, _CMP_NEQ_UQ);
    keep &= _mm512_cmp_ps_mask(d, _mm512_set1_ps(d0), _CMP_NEQ_UQ);
    const __m512 w = _mm512_mul_ps(d, round_clamp(_mm512_div_ps(vx, d), lo, hi));
    const __m512d e_lo = _mm512_sub_pd(vxd, lo_pd(w)), e_hi = _mm512_sub_pd(vxd, hi_pd(w));
    const __mmask8 t_lo = _mm512_cmp_pd_mask(_mm512_mul_pd(e_lo, e_lo), ve0, _CMP_LT_OQ);
    const __mmask8 t_hi = _mm512_cmp_pd_mask(_mm512_mul_pd(e_hi, e_hi), ve0, _CMP_LT_OQ);
    keep &= static_cast<__mmask16>(t_lo | (t_hi << 8));
    // Compressed in a register, then stored whole (out has room): a compressing store to
    // memory is microcoded and slow on some cores (AMD Zen 4).
    _mm512_storeu_ps(out + out_count, _mm512_maskz_compress_ps(keep, d));
    out_count += __builtin_popcount(keep);
  }
  return out_count;
}

// sym_error of each of d[0 .. count) (count <= kCandPad) into e, sixteen candidates at a time,
// one candidate per lane: lane by lane the operations of sym_error, in its order (the term of
// weight j added to the accumulator of lane j % 8, the accumulators then added in order 0..7),
// with no horizontal sum per candidate.
template <int N>
void sym_errors_v(const float* x, float qmax, const float* d, int count, double* e) {
  const __m512 hi = _mm512_set1_ps(qmax), lo = _mm512_set1_ps(-qmax);
  for (int k = 0; k < count; k += 16) {
    const __mmask16 live =
        static_cast<__mmask16>(count - k >= 16 ? 0xffff : (1u << (count - k)) - 1);
    // Lanes past count take 1 (ignored); a scale of 0 gives q = 0, so w = 0, as sym_error.
    const __m512 vd = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), live, d + k);
    const __mmask16 nonzero = _mm512_cmp_ps_mask(vd, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    __m512d acc_lo[kLanes], acc_hi[kLanes];
#pragma GCC unroll 32  // the accumulators stay in registers
    for (int j = 0; j < N; ++j) {
      const __m512 vx = _mm512_set1_ps(x[j]);
      const __m512 q = round_clamp(_mm512_maskz_div_ps(nonzero, vx, vd), lo, hi);
      const __m512 w = _mm512_maskz_mul_ps(nonzero, vd, q);
      const __m512d xd = _mm512_set1_pd(static_cast<double>(x[j]));
      const __m512d e_lo = _mm512_sub_pd(xd, lo_pd(w)), e_hi = _mm512_sub_pd(xd, hi_pd(w));
      const __m512d t_lo = _mm512_mul_pd(e_lo, e_lo), t_hi = _mm512_mul_pd(e_hi, e_hi);
      if (j < kLanes) {  // 0 + t == t: the first term starts the lane's sum
        acc_lo[j] = t_lo;
        acc_hi[j] = t_hi;
      } else {
        acc_lo[j % kLanes] = _mm512_add_pd(acc_lo[j % kLanes], t_lo);
        acc_hi[j % kLanes] = _mm512_add_pd(acc_hi[j % kLanes], t_hi);
      }
    }
    __m512d total_lo = acc_lo[0], total_hi = acc_hi[0];
    for (int l = 1; l < kLanes; ++l) {
      total_lo = _mm512_add_pd(total_lo, acc_lo[l]);
      total_hi = _mm512_add_pd(total_hi, acc_hi[l]);
    }
    alignas(64) double out[16];
    _mm512_store_pd(out, total_lo);
    _mm512_store_pd(out + 8, total_hi);
    for (int c = 0; c < 16 && k + c < count; ++c) e[k + c] = out[c];
  }
}
#endif

// The header's error of scale d (q = 0 when d == 0).
double sym_error(const float* x, int n, float qmax, float d) {
  double acc[kLanes] = {};
  if (d == 0.0f) {
    for (int j = 0; j < n; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const double e = static_cast<double>(x[j + l]);
        acc[l] += e * e;
      }
    }
    return add_lanes(acc);
  }
  for (int j = 0; j < n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float q = std::min(std::max(std::nearbyint(x[j + l] / d), -qmax), qmax);
      const double e = static_cast<double>(x[j + l]) - static_cast<double>(d * q);
      acc[l] += e * e;
    }
  }
  return add_lanes(acc);
}

// One weight's term of sym_error: a lower bound of the whole sum (the sum adds it to
// non-negative terms, and rounding an addition of non-negative values never goes below
// either of them).
double sym_term(float x, float qmax, float d) {
  const float q = d == 0.0f ? 0.0f : std::min(std::max(std::nearbyint(x / d), -qmax), qmax);
  const double e = static_cast<double>(x) - static_cast<double>(d * q);
  return e * e;
}

float asym_q(float x, float qmax, float d, float m) {
  return std::min(std::max(std::nearbyint((x - m) / d), 0.0f), qmax);
}

// The header's error of (d, m) for d > 0.
double asym_error(const float* x, int n, float qmax, float d, float m) {
  double acc[kLanes] = {};
  for (int j = 0; j < n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float q = asym_q(x[j + l], qmax, d, m);
      const double e = static_cast<double>(x[j + l]) - static_cast<double>(d * q + m);
      acc[l] += e * e;
    }
  }
  return add_lanes(acc);
}

double asym_error_d0(const float* x, int n, float m) {  // d == 0: every q is 0, w = m
  double acc[kLanes] = {};
  for (int j = 0; j < n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double e = static_cast<double>(x[j + l]) - static_cast<double>(m);
      acc[l] += e * e;
    }
  }
  return add_lanes(acc);
}

// S(q), S(q^2) (both exact) and S(xq) (lane order) of the q that (d, m) gives, d > 0.
void asym_sums(const float* x, int n, float qmax, float d, float m, double* s_q, double* s_qq,
               double* s_xq) {
  double sq[kLanes] = {}, sqq[kLanes] = {}, sxq[kLanes] = {};
  for (int j = 0; j < n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double q = asym_q(x[j + l], qmax, d, m);
      sq[l] += q;
      sqq[l] += q * q;
      sxq[l] += static_cast<double>(x[j + l]) * q;
    }
  }
  *s_q = add_lanes(sq);
  *s_qq = add_lanes(sqq);
  *s_xq = add_lanes(sxq);
}

// f32(qmax + num i / den) for i in [first, last], i != 0, computed once per thread and qmax;
// padded with 1 to kCandPad entries.
template <int kFirst, int kLast, int kNum, int kDen>
const float* denominators(int qmax) {
  static_assert(kLast - kFirst <= kCandPad);
  thread_local int cached = 0;
  thread_local float den[kCandPad];
  if (cached != qmax) {
    int k = 0;
    for (int i = kFirst; i <= kLast; ++i)
      if (i != 0) den[k++] = static_cast<float>(qmax + (kNum * i) / static_cast<double>(kDen));
    while (k < kCandPad) den[k++] = 1.0f;
    cached = qmax;
  }
  return den;
}

// The symmetric candidates after d0 (amax's f16 scales, in order) that can change the choice,
// into out; returns their number. Left out: a value f16 cannot hold, one equal to d0 or to
// the candidate before it (its error is known already), and one whose term of the weight
// xt = x[top] alone reaches d0's error e0 (smaller scales clip the largest weight; its term
// is a lower bound of the error, see sym_term, so such a candidate cannot be chosen).
int symmetric_candidates(float xt, float amax, float qmax, float d0, double e0, const float* den,
                         int count, float* out) {
  int out_count = 0;
  float prev = d0;
  for (int k = 0; k < count; ++k) {
    const float d = f16_round(amax / den[k]);
    const bool keep = std::isfinite(d) && d != prev && d != d0 && sym_term(xt, qmax, d) < e0;
    prev = d;
    if (keep) out[out_count++] = d;
  }
  return out_count;
}

// The first candidate of strictly smallest error, in order, starting from (best, best_e);
// errors(cands, count, e) computes every candidate's error first, with no dependency between
// candidates (they overlap in the CPU).
template <class Cand, class Errors>
Cand pick(Cand best, double best_e, const Cand* cands, int count, Errors errors) {
  double e[kCandPad];
  errors(cands, count, e);
  for (int k = 0; k < count; ++k) {
    if (e[k] < best_e) {
      best_e = e[k];
      best = cands[k];
    }
  }
  return best;
}

// The symmetric search; error(d) is sym_error for d != 0, errors(d, count, e) sym_error (any
// d) of each d[k] into e[k], candidates(...) is symmetric_candidates.
template <class Error, class Errors, class Candidates>
float symmetric_search(const float* x, int n, int qmax, Error error, Errors errors,
                       Candidates candidates) {
  const float qm = static_cast<float>(qmax);
  int top = 0;  // the first weight of largest magnitude
  for (int j = 1; j < n; ++j)
    if (std::fabs(x[j]) > std::fabs(x[top])) top = j;
  const float amax = std::fabs(x[top]);
  const float d0 = checked(f16_round(amax / qm), amax / qm);
  const double e0 = d0 == 0.0f ? sym_error(x, n, qm, 0.0f) : error(d0);
  if (e0 == 0.0) return d0;
  float cands[kCandPad];
  const int count =
      candidates(x[top], amax, qm, d0, e0, denominators<kSymFirst, kSymLast, 1, 5>(qmax),
                 kSymLast - kSymFirst, cands);
  return pick(d0, e0, cands, count, errors);
}

// The asymmetric search; error(d, m) is asym_error and error_sums(d, m, ...) asym_error_sums,
// d != 0.
template <class Error, class ErrorSums>
AsymmetricScale asymmetric_search(const float* x, int n, int qmax, Error error,
                                  ErrorSums error_sums) {
  const float qm = static_cast<float>(qmax);
  int lo = 0, hi = 0;  // the first smallest and largest weights
  for (int j = 1; j < n; ++j) {
    if (x[j] < x[lo]) lo = j;
    if (x[j] > x[hi]) hi = j;
  }
  const float m0 = checked(f16_round(x[lo]), x[lo]);
  // m0 can round above every weight of a block of equal values: then the scale is 0, not
  // negative (scales are >= 0).
  const float range = std::max(x[hi] - m0, 0.0f);
  const float d0 = checked(f16_round(range / qm), range / qm);

  // The candidates in order with their errors; a refit's error is computed afterwards, in
  // one pass over them all (NaN until then).
  constexpr int kMax = 2 * (kAsymLast - kAsymFirst + 1);
  AsymmetricScale cands[kMax];
  double errs[kMax];
  int count = 0;
  double sx[kLanes] = {};
  for (int j = 0; j < n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) sx[l] += static_cast<double>(x[j + l]);
  const double sum_x = add_lanes(sx), dn = static_cast<double>(n);
  const float* den = denominators<kAsymFirst, kAsymLast, 2, 5>(qmax);
  double e0 = 0.0;
  for (int i = kAsymFirst, k = 0; i <= kAsymLast; ++i) {
    const float d = i == 0 ? d0 : f16_round(range / den[k++]);
    if (!std::isfinite(d)) continue;
    if (d == 0.0f) {  // every q is 0: no refit (det == 0)
      const double e = asym_error_d0(x, n, m0);
      if (i == 0) {
        e0 = e;
      } else {
        cands[count] = {d, m0};
        errs[count++] = e;
      }
      continue;
    }
    double s_q, s_qq, s_xq;
    const double e = error_sums(d, m0, &s_q, &s_qq, &s_xq);
    if (i == 0) {
      e0 = e;
    } else {
      cands[count] = {d, m0};
      errs[count++] = e;
    }
    // The least-squares (d, m) for this candidate's q.
    const double det = dn * s_qq - s_q * s_q;
    if (!(det > 0.0)) continue;
    const double fd = (dn * s_xq - s_q * sum_x) / det, fm = (s_qq * sum_x - s_q * s_xq) / det;
    // Beyond f16 either way; the bound keeps the conversion to float defined.
    if (!(std::fabs(fd) < 1e30 && std::fabs(fm) < 1e30)) continue;
    const float fit_d = f16_round(static_cast<float>(fd));
    const float fit_m = f16_round(static_cast<float>(fm));
    if (!(fit_d > 0.0f && std::isfinite(fit_d) && std::isfinite(fit_m))) continue;
    // Neighbouring candidates often give the same q, so the same refit: its error is known.
    bool seen = fit_d == d0 && fit_m == m0;
    for (int k = 0; k < count && !seen; ++k) seen = cands[k].d == fit_d && cands[k].m == fit_m;
    if (!seen) {
      cands[count] = {fit_d, fit_m};
      errs[count++] = NAN;
    }
  }
  for (int k = 0; k < count; ++k)
    if (std::isnan(errs[k])) errs[k] = error(cands[k].d, cands[k].m);
  AsymmetricScale best{d0, m0};
  double best_e = e0;
  for (int k = 0; k < count; ++k) {
    if (errs[k] < best_e) {
      best_e = errs[k];
      best = cands[k];
    }
  }
  return best;
}

#if defined(__AVX512F__)
// The searches and errors on BlockV<N>.
template <int N>
float choose_symmetric_v(const float* x, int qmax) {
  const BlockV<N> b(x);
  const float qm = static_cast<float>(qmax);
  return symmetric_search(
      x, N, qmax, [&](float d) { return sym_error_v(b, qm, d); },
      [&](const float* d, int count, double* e) { sym_errors_v<N>(x, qm, d, count, e); },
      symmetric_candidates_v);
}
template <int N>
AsymmetricScale choose_asymmetric_v(const float* x, int qmax) {
  const BlockV<N> b(x);
  const float qm = static_cast<float>(qmax);
  return asymmetric_search(
      x, N, qmax, [&](float d, float m) { return asym_error_v(b, qm, d, m); },
      [&](float d, float m, double* s_q, double* s_qq, double* s_xq) {
        return asym_error_sums_v(b, qm, d, m, s_q, s_qq, s_xq);
      });
}
#endif

}  // namespace

double symmetric_error(const float* x, int n, int qmax, float d) {
  check_block(n, qmax);
  const float qm = static_cast<float>(qmax);
#if defined(__AVX512F__)
  if (d != 0.0f && n == 16) return sym_error_v(BlockV<16>(x), qm, d);
  if (d != 0.0f && n == 32) return sym_error_v(BlockV<32>(x), qm, d);
#endif
  return sym_error(x, n, qm, d);
}

double asymmetric_error(const float* x, int n, int qmax, float d, float m) {
  check_block(n, qmax);
  if (d == 0.0f) return asym_error_d0(x, n, m);
  const float qm = static_cast<float>(qmax);
#if defined(__AVX512F__)
  if (n == 16) return asym_error_v(BlockV<16>(x), qm, d, m);
  if (n == 32) return asym_error_v(BlockV<32>(x), qm, d, m);
#endif
  return asym_error(x, n, qm, d, m);
}

float choose_symmetric_scale(const float* x, int n, int qmax) {
  check_block(n, qmax);
#if defined(__AVX512F__)
  if (n == 16) return choose_symmetric_v<16>(x, qmax);
  if (n == 32) return choose_symmetric_v<32>(x, qmax);
#endif
  const float qm = static_cast<float>(qmax);
  return symmetric_search(
      x, n, qmax, [&](float d) { return sym_error(x, n, qm, d); },
      [&](const float* d, int count, double* e) {
        for (int k = 0; k < count; ++k) e[k] = sym_error(x, n, qm, d[k]);
      },
      symmetric_candidates);
}

AsymmetricScale choose_asymmetric_scale(const float* x, int n, int qmax) {
  check_block(n, qmax);
#if defined(__AVX512F__)
  if (n == 16) return choose_asymmetric_v<16>(x, qmax);
  if (n == 32) return choose_asymmetric_v<32>(x, qmax);
#endif
  const float qm = static_cast<float>(qmax);
  return asymmetric_search(
      x, n, qmax, [&](float d, float m) { return asym_error(x, n, qm, d, m); },
      [&](float d, float m, double* s_q, double* s_qq, double* s_xq) {
        asym_sums(x, n, qm, d, m, s_q, s_qq, s_xq);
        return asym_error(x, n, qm, d, m);
      });
}

}  // namespace attnres
