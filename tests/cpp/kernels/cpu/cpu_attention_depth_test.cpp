// store_kv + paged causal GQA attention, and the two-phase depth attention, against direct
// double-precision references. Unwritten KV slots and dead bank entries are filled with NaN,
// so reading anything outside the causal window / the live bank fails the comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/kernels/cpu/paged_kv_steps.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void fill(Tensor& t, float v) { std::fill(t.ptr<float>(), t.ptr<float>() + t.numel(), v); }

// --- attention ---

void check_attention(int hq, int hkv, int hd, int block_size, const std::vector<SeqSpec>& seqs,
                     uint32_t seed) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(seed);
  const int num_blocks = 128, row = hkv * hd;
  KvCacheLayer cache{be->alloc({num_blocks, block_size, hkv, hd}, DType::F32),
                     be->alloc({num_blocks, block_size, hkv, hd}, DType::F32)};
  fill(cache.k, kNaN);
  fill(cache.v, kNaN);
  std::vector<int> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);  // non-contiguous tables

  const int ns = static_cast<int>(seqs.size());
  std::vector<std::vector<int32_t>> tables(ns);
  std::vector<Tensor> k_all(ns), v_all(ns);
  for (int s = 0; s < ns; ++s) {
    const int len = seqs[s].cached + seqs[s].chunk;
    for (int b = 0; b < (len + block_size - 1) / block_size; ++b) {
      tables[s].push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    k_all[s] = random_tensor({len, row}, DType::F32, rng);
    v_all[s] = random_tensor({len, row}, DType::F32, rng);
  }

  store_paged_step(*be, seqs, tables, block_size, row, k_all, v_all, cache, true);
  const BatchMeta batch =
      store_paged_step(*be, seqs, tables, block_size, row, k_all, v_all, cache, false);

  const int t_dim = batch.num_tokens;
  Tensor q = random_tensor({t_dim, hq * hd}, DType::F32, rng, -2.0f, 2.0f);
  Tensor out = be->alloc({t_dim, hq * hd}, DType::F32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  be->attention(q, cache, batch, hd, scale, out);

  const auto qv = values(q);
  std::vector<double> ref(static_cast<size_t>(t_dim) * hq * hd);
  for (int s = 0; s < ns; ++s) {
    const auto kv = values(k_all[s]), vv = values(v_all[s]);
    for (int t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t)
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / (hq / hkv), ctx = batch.positions[t] + 1;
        std::vector<double> sc(ctx);
        for (int p = 0; p < ctx; ++p) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += qv[(t * hq + h) * hd + i] * kv[p * row + kvh * hd + i];
          sc[p] = d * scale;
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double den = 0;
        for (double& x : sc) den += (x = std::exp(x - mx));
        for (int i = 0; i < hd; ++i) {
          double acc = 0;
          for (int p = 0; p < ctx; ++p) acc += sc[p] * vv[p * row + kvh * hd + i];
          ref[(t * hq + h) * hd + i] = acc / den;
        }
      }
  }
  EXPECT_TRUE(all_close(out, ref, 1e-5, 1e-6))
      << "hq=" << hq << " hkv=" << hkv << " hd=" << hd << " block=" << block_size;
}

TEST(CpuAttention, PagedCausalGqaWithCachedPrefixes) {
  // A fresh prefill, a decode after a long prefix, a prefill chunk after a cached prefix,
  // a one-token sequence, and a chunk whose contexts span several 16-key score blocks, in one
  // batch; head sizes with a scalar tail (24) and more than one register tile (128).
  const std::vector<SeqSpec> seqs = {{0, 9}, {21, 1}, {5, 7}, {0, 1}, {30, 12}};
  uint32_t seed = 100;
  for (auto [hq, hkv] : {std::pair<int, int>{4, 4}, {4, 2}, {8, 2}})
    for (int hd : {16, 24, 64, 128})
      for (int block_size : {1, 4, 16}) check_attention(hq, hkv, hd, block_size, seqs, seed++);
}

TEST(CpuAttention, RejectsPositionOutsideTable) {
  auto be = make_cpu_backend(1);
  KvCacheLayer cache{be->alloc({4, 4, 1, 8}, DType::F32), be->alloc({4, 4, 1, 8}, DType::F32)};
  const BatchMeta b = single_token_step(4, 4, {2});  // one block: positions 0..3 only
  Tensor q = be->alloc({1, 8}, DType::F32), out = be->alloc({1, 8}, DType::F32);
  EXPECT_THROW(be->attention(q, cache, b, 8, 1.0f, out), std::logic_error);
}

// --- depth attention ---

double rms(const double* x, int64_t d, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
  return std::sqrt(ss / d + eps);
}

double dot(const double* a, const double* b, int64_t d) {
  double s = 0;
  for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

// out[t] = rms_norm(softmax-weighted sum of {bank[0..n), p}, gain) for sublayer query q.
std::vector<double> ref_depth(const std::vector<double>& bank, int n, int64_t t_dim, int64_t d,
                              const double* q, double bias, const std::vector<double>& p,
                              const std::vector<double>& gain, double eps, double norm_eps) {
  std::vector<double> out(t_dim * d);
  for (int64_t t = 0; t < t_dim; ++t) {
    std::vector<const double*> src;
    for (int j = 0; j < n; ++j) src.push_back(bank.data() + (j * t_dim + t) * d);
    src.push_back(p.data() + t * d);
    std::vector<double> logit(src.size());
    for (size_t j = 0; j < src.size(); ++j)
      logit[j] = dot(q, src[j], d) / rms(src[j], d, eps) + (j == src.size() - 1 ? bias : 0.0);
    const double mx = *std::max_element(logit.begin(), logit.end());
    double den = 0;
    for (double& l : logit) den += (l = std::exp(l - mx));
    std::vector<double> h(d, 0.0);
    for (size_t j = 0; j < src.size(); ++j)
      for (int64_t i = 0; i < d; ++i) h[i] += logit[j] / den * src[j][i];
    const double r = rms(h.data(), d, norm_eps);
    for (int64_t i = 0; i < d; ++i) out[t * d + i] = h[i] / r * gain[i];
  }
  return out;
}

TEST(CpuDepthMix, TwoPhaseEqualsDirectSoftmax) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(7);
  const float eps = 1e-6f, norm_eps = 1e-5f;
  for (int64_t d : {67, 128})
    for (int n = 1; n <= 6; ++n)
      for (int64_t s_dim : {1, 2, 3, 4, 7, 10})  // 10: more than one fused group of 8
        for (double target : {3.0, 50.0}) {   // largest |logit| in the test
          const int64_t t_dim = 5;
          Tensor bank = random_tensor({n + 1, t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
          std::fill(bank.ptr<float>() + n * t_dim * d, bank.ptr<float>() + (n + 1) * t_dim * d,
                    kNaN);  // dead entry: must never be read
          Tensor partial = random_tensor({t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
          Tensor queries = random_tensor({s_dim, d}, DType::F32, rng);
          Tensor gain = random_tensor({d}, DType::BF16, rng, 0.5f, 1.5f);
          // Rescale the queries so the largest |logit| over bank and partial is `target`.
          const auto bv0 = values(bank), pv0 = values(partial);
          for (int64_t l = 0; l < s_dim; ++l) {
            float* ql = queries.ptr<float>() + l * d;
            std::vector<double> qd(ql, ql + d);
            double mx = 0;
            for (int64_t t = 0; t < t_dim; ++t) {
              for (int j = 0; j < n; ++j) {
                const double* x = bv0.data() + (j * t_dim + t) * d;
                mx = std::max(mx, std::fabs(dot(qd.data(), x, d) / rms(x, d, eps)));
              }
              const double* x = pv0.data() + t * d;
              mx = std::max(mx, std::fabs(dot(qd.data(), x, d) / rms(x, d, eps)));
            }
            for (int64_t i = 0; i < d; ++i) ql[i] = static_cast<float>(ql[i] * target / mx);
          }
          Tensor m = be->alloc({s_dim, t_dim}, DType::F32),
                 s = be->alloc({s_dim, t_dim}, DType::F32);
          Tensor o = be->alloc({s_dim, t_dim, d}, DType::F32);
          be->depth_phase1(queries, bank, n, eps, m, s, o);
          const auto bv = values(bank), pv = values(partial), qv = values(queries),
                     gv = values(gain);
          for (int64_t l = 0; l < s_dim; ++l) {
            Tensor ml = m.row(l), sl = s.row(l), ol = o.row(l), ql = queries.row(l);
            Backend::DepthMixArgs mix;
            mix.m = &ml, mix.s = &sl, mix.o = &ol, mix.query = &ql;
            mix.bias = 0.25f * static_cast<float>(l);
            mix.mix_eps = eps;
            Tensor out = be->alloc({t_dim, d}, DType::F32);
            be->depth_phase2_prenorm(mix, partial, gain, norm_eps, out);
            const auto ref =
                ref_depth(bv, n, t_dim, d, qv.data() + l * d, mix.bias, pv, gv, eps, norm_eps);
            // Logits up to 50 carry ~50 * 2^-24 * sqrt(d) of f32 rounding into the weights.
            EXPECT_TRUE(all_close(out, ref, 1e-5, target > 10 ? 4e-5 : 1e-5))
                << "d=" << d << " n=" << n << " S=" << s_dim << " l=" << l
                << " |logit|<=" << target;
          }
        }
}

TEST(CpuDepthMix, NoMixIsPlainRmsNormAndOutMayAliasPartial) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(8);
  const int64_t t_dim = 3, d = 45;
  Tensor partial = random_tensor({t_dim, d}, DType::F32, rng, -2.0f, 2.0f);
  Tensor gain = random_tensor({d}, DType::F32, rng, 0.5f, 1.5f);
  Tensor query = random_tensor({d}, DType::F32, rng);
  Tensor expected = be->alloc({t_dim, d}, DType::F32), out = be->alloc({t_dim, d}, DType::F32);
  be->rms_norm(partial, gain, 1e-6f, expected);
  const auto want = values(expected);

  Backend::DepthMixArgs none;  // plain pre-norm model
  be->depth_phase2_prenorm(none, partial, gain, 1e-6f, out);
  EXPECT_TRUE(all_close(out, want, 0.0));
  Backend::DepthMixArgs empty_bank;  // query given but no bank yet: h = p
  empty_bank.query = &query;
  be->depth_phase2_prenorm(empty_bank, partial, gain, 1e-6f, out);
  EXPECT_TRUE(all_close(out, want, 0.0));

  // With a bank, writing over the partial in place gives the same result as a separate out.
  Tensor bank = random_tensor({2, t_dim, d}, DType::F32, rng);
  Tensor queries = query.reshape({1, d});
  Tensor m = be->alloc({1, t_dim}, DType::F32), s = be->alloc({1, t_dim}, DType::F32);
  Tensor o = be->alloc({1, t_dim, d}, DType::F32);
  be->depth_phase1(queries, bank, 2, 1e-6f, m, s, o);
  Tensor ml = m.row(0), sl = s.row(0), ol = o.row(0);
  Backend::DepthMixArgs mix;
  mix.m = &ml, mix.s = &sl, mix.o = &ol, mix.query = &query;
  be->depth_phase2_prenorm(mix, partial, gain, 1e-6f, out);
  be->depth_phase2_prenorm(mix, partial, gain, 1e-6f, partial);
  EXPECT_TRUE(all_close(partial, values(out), 0.0));
}

}  // namespace
}  // namespace attnres::test
