// CPU backend ops (linear, embedding, rms_norm, qk_norm_rope, swiglu, add_inplace,
// gather_rows) against naive double-precision references on seeded random inputs. Weights in
// bf16 / f16 are compared against the reference computed from the same stored values widened,
// so every dtype keeps an f32-rounding tolerance (~1e-5 relative).
#include <gtest/gtest.h>

#include <cstring>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/engine/core/vm_flags.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

const DType kWeightTypes[] = {DType::F32, DType::BF16, DType::F16};

// --- linear ---

void check_linear(Backend& be, int64_t r_dim, int64_t k_dim, int64_t n_dim, DType wt,
                  bool with_bias, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor x = random_tensor({r_dim, k_dim}, DType::F32, rng);
  Tensor w = random_tensor({n_dim, k_dim}, wt, rng);
  Tensor bias = random_tensor({n_dim}, DType::F32, rng);
  Tensor out = be.alloc({r_dim, n_dim}, DType::F32);
  be.linear(x, w, with_bias ? &bias : nullptr, out);
  const auto xv = values(x), wv = values(w), bv = values(bias);
  std::vector<double> ref(r_dim * n_dim), scale(r_dim * n_dim);
  for (int64_t r = 0; r < r_dim; ++r)
    for (int64_t o = 0; o < n_dim; ++o) {
      double s = with_bias ? bv[o] : 0.0, a = with_bias ? std::fabs(bv[o]) : 0.0;
      for (int64_t k = 0; k < k_dim; ++k) {
        s += xv[r * k_dim + k] * wv[o * k_dim + k];
        a += std::fabs(xv[r * k_dim + k] * wv[o * k_dim + k]);
      }
      ref[r * n_dim + o] = s;
      scale[r * n_dim + o] = a;
    }
  EXPECT_TRUE(all_close(out, ref, 1e-5, 0.0, &scale))
      << "R=" << r_dim << " K=" << k_dim << " N=" << n_dim << " " << name(wt)
      << (with_bias ? " bias" : "");
}

TEST(CpuLinear, MatchesReferenceEveryDtypeAndRowCount) {
  auto be = make_cpu_backend(3);
  const int64_t shapes[][2] = {{17, 5}, {64, 48}, {100, 67}, {513, 131}, {1536, 40}, {8, 1}};
  uint32_t seed = 1;
  for (DType wt : kWeightTypes)
    for (int64_t r : {1, 2, 3, 4, 5, 6, 7, 8, 9, 37})
      for (auto& s : shapes) {
        check_linear(*be, r, s[0], s[1], wt, (seed % 2) == 0, seed);
        ++seed;
      }
}

TEST(CpuLinear, PrefillSizedRowsManyShapesAndSingleThread) {
  auto be3 = make_cpu_backend(3);
  auto be1 = make_cpu_backend(1);
  check_linear(*be3, 130, 700, 97, DType::BF16, true, 7);  // several k blocks, odd tails
  check_linear(*be3, 64, 512, 1536, DType::F16, false, 8);
  check_linear(*be3, 300, 1100, 13, DType::F32, true, 11);  // 2 row chunks, 3 k blocks, 1 tile each
  check_linear(*be1, 37, 300, 33, DType::F32, true, 9);
  check_linear(*be1, 3, 300, 33, DType::BF16, true, 10);
}

// A row's result must not depend on which other rows share the call: bit for bit, a batch of
// rows (the packed GEMM above 8 rows, the GEMV up to 8) equals each row computed alone (the
// GEMV), whatever the thread count. This is what makes server output independent of batching
// and a prefill round exactly like decoding. 300 x 1100 spans two row chunks, three k blocks
// and a scalar tail in the GEMM.
TEST(CpuLinear, BatchInvariantRowsAreBitwiseIdentical) {
  auto be2 = make_cpu_backend(2);
  auto be1 = make_cpu_backend(1);
  std::mt19937 rng(21);
  const int64_t shapes[][3] = {{37, 300, 130}, {300, 1100, 45}, {8, 300, 130}, {9, 64, 7}};
  for (DType wt : kWeightTypes) {
    for (auto& shape : shapes) {
      const int64_t rows = shape[0], k_dim = shape[1], n_dim = shape[2];
      Tensor x = random_tensor({rows, k_dim}, DType::F32, rng);
      Tensor w = random_tensor({n_dim, k_dim}, wt, rng);
      Tensor bias = random_tensor({n_dim}, DType::F32, rng);
      Tensor all = be2->alloc({rows, n_dim}, DType::F32);
      be2->linear(x, w, &bias, all);
      for (int64_t r = 0; r < rows; ++r) {
        Tensor one = be1->alloc({1, n_dim}, DType::F32);
        Tensor xr = x.rows(r, r + 1);
        be1->linear(xr, w, &bias, one);
        ASSERT_EQ(0, std::memcmp(one.data, all.rows(r, r + 1).data, n_dim * sizeof(float)))
            << name(wt) << " " << rows << "x" << k_dim << "x" << n_dim << " row " << r;
      }
    }
  }
}

TEST(CpuLinear, RejectsShapeMismatch) {
  auto be = make_cpu_backend(1);
  Tensor x = Tensor::empty({2, 8}, DType::F32), w = Tensor::empty({4, 9}, DType::BF16);
  Tensor out = Tensor::empty({2, 4}, DType::F32);
  EXPECT_THROW(be->linear(x, w, nullptr, out), std::logic_error);
}

// Buffers kept across steps: zero-filled as alloc's, and from 1 MB on in memory that asks for
// huge pages (the depth bank and the Phase-1 state are read many times per step).
TEST(CpuAllocKept, LargeBuffersAskForHugePagesSmallOnesDoNot) {
  auto be = make_cpu_backend(1);
  const Tensor large = be->alloc_kept({3, 1 << 18}, DType::BF16);  // 1.5 MB
  const Tensor small = be->alloc_kept({1000}, DType::F32);
  for (const Tensor* t : {&large, &small}) {
    ASSERT_EQ(t->nbytes(), static_cast<size_t>(t->numel()) * dtype_size(t->dtype));
    const auto* bytes = static_cast<const unsigned char*>(t->data);
    for (size_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(bytes[i], 0) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 64, 0u);
  }
  if (!test_memory::thp_available()) GTEST_SKIP() << "this kernel has no transparent huge pages";
  EXPECT_TRUE(test_memory::advised_huge(large.data)) << test_memory::vm_flags_at(large.data);
  EXPECT_FALSE(test_memory::advised_huge(small.data)) << test_memory::vm_flags_at(small.data);
}

TEST(CpuTestUtil, ToleranceCheckCanFail) {  // the comparator itself must catch a small error
  Tensor t = Tensor::empty({3}, DType::F32);
  t.ptr<float>()[0] = 1.0f, t.ptr<float>()[1] = 2.0f, t.ptr<float>()[2] = 3.0f + 1e-3f;
  EXPECT_FALSE(all_close(t, {1.0, 2.0, 3.0}, 1e-5));
  EXPECT_TRUE(all_close(t, {1.0, 2.0, 3.001}, 1e-5));
}

// --- embedding ---

TEST(CpuEmbedding, GathersAndWidensEveryDtype) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(11);
  for (DType wt : kWeightTypes)
    for (int64_t d : {1, 7, 64, 515}) {
      Tensor table = random_tensor({50, d}, wt, rng);
      BatchMeta batch;
      batch.token_ids = {0, 49, 3, 3, 17};
      batch.num_tokens = 5;
      Tensor out = be->alloc({5, d}, DType::F32);
      be->embedding(table, batch, out);
      const auto tv = values(table);
      std::vector<double> ref;
      for (int id : batch.token_ids)
        for (int64_t i = 0; i < d; ++i) ref.push_back(tv[id * d + i]);
      EXPECT_TRUE(all_close(out, ref, 0.0)) << name(wt) << " d=" << d;  // exact
      batch.token_ids[2] = 50;
      EXPECT_THROW(be->embedding(table, batch, out), std::logic_error);
      batch.token_ids[2] = -1;
      EXPECT_THROW(be->embedding(table, batch, out), std::logic_error);
    }
}

// --- rms_norm ---

std::vector<double> ref_rms_norm(const std::vector<double>& x, const std::vector<double>& g,
                                 int64_t rows, int64_t n, double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[r * n + i] * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = x[r * n + i] * inv * g[i];
  }
  return out;
}

TEST(CpuRmsNorm, MatchesReferenceAndAllowsAliasing) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(21);
  for (DType gt : kWeightTypes)
    for (int64_t rows : {1, 3, 37})
      for (int64_t n : {1, 15, 64, 513}) {
        Tensor x = random_tensor({rows, n}, DType::F32, rng, -3.0f, 3.0f);
        Tensor g = random_tensor({n}, gt, rng, 0.5f, 1.5f);
        const auto ref = ref_rms_norm(values(x), values(g), rows, n, 1e-6);
        Tensor out = be->alloc({rows, n}, DType::F32);
        be->rms_norm(x, g, 1e-6f, out);
        EXPECT_TRUE(all_close(out, ref, 1e-5, 1e-6)) << name(gt) << " " << rows << "x" << n;
        be->rms_norm(x, g, 1e-6f, x);  // in place
        EXPECT_TRUE(all_close(x, ref, 1e-5, 1e-6)) << "aliased " << rows << "x" << n;
      }
}

// --- qk_norm_rope ---

void ref_norm_rope(std::vector<double>& x, int64_t heads, int64_t hd, const std::vector<double>* g,
                   double eps, const std::vector<double>& freq, const std::vector<int>& pos) {
  const int64_t t_dim = static_cast<int64_t>(pos.size()), half = hd / 2;
  for (int64_t t = 0; t < t_dim; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      double* v = x.data() + (t * heads + h) * hd;
      if (g) {
        double ss = 0;
        for (int64_t i = 0; i < hd; ++i) ss += v[i] * v[i];
        const double inv = 1.0 / std::sqrt(ss / hd + eps);
        for (int64_t i = 0; i < hd; ++i) v[i] = v[i] * inv * (*g)[i];
      }
      for (int64_t i = 0; i < half; ++i) {
        const double a = pos[t] * freq[i], c = std::cos(a), s = std::sin(a);
        const double x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
      }
    }
}

TEST(CpuQkNormRope, MatchesReferenceWithAndWithoutGains) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(31);
  for (int64_t hd : {10, 64, 128})
    for (bool gains : {false, true})
      for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 2}, {3, 3}, {8, 1}}) {
        BatchMeta batch;
        batch.positions = {0, 1, 2, 77, 1000, 32767};
        batch.num_tokens = 6;
        const int64_t t_dim = 6;
        Tensor q = random_tensor({t_dim, hq * hd}, DType::F32, rng);
        Tensor k = random_tensor({t_dim, hkv * hd}, DType::F32, rng);
        Tensor qg = random_tensor({hd}, DType::BF16, rng, 0.5f, 1.5f);
        Tensor kg = random_tensor({hd}, DType::F32, rng, 0.5f, 1.5f);
        Tensor freq = Tensor::empty({hd / 2}, DType::F32);
        for (int64_t i = 0; i < hd / 2; ++i)
          freq.ptr<float>()[i] = static_cast<float>(std::pow(1e6, -2.0 * i / hd));
        auto qref = values(q), kref = values(k);
        const auto qgv = values(qg), kgv = values(kg);
        ref_norm_rope(qref, hq, hd, gains ? &qgv : nullptr, 1e-6, values(freq), batch.positions);
        ref_norm_rope(kref, hkv, hd, gains ? &kgv : nullptr, 1e-6, values(freq), batch.positions);
        be->qk_norm_rope(q, k, static_cast<int>(hd), gains ? &qg : nullptr, gains ? &kg : nullptr,
                         1e-6f, freq, batch);
        // Rotation is norm-preserving: tolerance relative to the head's scale (~1).
        EXPECT_TRUE(all_close(q, qref, 1e-5, 1e-5)) << "q hd=" << hd << " gains=" << gains;
        EXPECT_TRUE(all_close(k, kref, 1e-5, 1e-5)) << "k hd=" << hd << " gains=" << gains;
      }
}

// The backend keeps the last call's cos / sin table for the next layer's call: a call with
// other positions, or other frequencies of the same count, must not get the stale one.
TEST(CpuQkNormRope, ReusesItsTableOnlyForTheSamePositionsAndFrequencies) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(37);
  constexpr int64_t hd = 64, hq = 4, hkv = 2, t_dim = 5;
  auto frequencies = [&](double base) {
    Tensor freq = Tensor::empty({hd / 2}, DType::F32);
    for (int64_t i = 0; i < hd / 2; ++i)
      freq.ptr<float>()[i] = static_cast<float>(std::pow(base, -2.0 * i / hd));
    return freq;
  };
  const Tensor f1 = frequencies(1e6), f2 = frequencies(1e4);
  const std::vector<std::pair<std::vector<int32_t>, const Tensor*>> calls = {
      {{0, 1, 2, 3, 4}, &f1}, {{0, 1, 2, 3, 4}, &f1},  // a reuse
      {{9, 10, 11, 12, 13}, &f1},                        // new positions
      {{9, 10, 11, 12, 13}, &f2},                        // new frequencies
      {{0, 1, 2, 3, 4}, &f1}};
  for (const auto& [positions, freq] : calls) {
    BatchMeta batch;
    batch.positions = positions;
    batch.num_tokens = static_cast<int>(t_dim);
    Tensor q = random_tensor({t_dim, hq * hd}, DType::F32, rng);
    Tensor k = random_tensor({t_dim, hkv * hd}, DType::F32, rng);
    auto qref = values(q), kref = values(k);
    ref_norm_rope(qref, hq, hd, nullptr, 1e-6, values(*freq), batch.positions);
    ref_norm_rope(kref, hkv, hd, nullptr, 1e-6, values(*freq), batch.positions);
    be->qk_norm_rope(q, k, static_cast<int>(hd), nullptr, nullptr, 1e-6f, *freq, batch);
    EXPECT_TRUE(all_close(q, qref, 1e-5, 1e-5)) << "q at position " << positions[0];
    EXPECT_TRUE(all_close(k, kref, 1e-5, 1e-5)) << "k at position " << positions[0];
  }
}

// --- element-wise ---

TEST(CpuElementwise, SwigluAddGather) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(41);
  for (int64_t n : {1, 17, 300, 40000}) {
    Tensor g = random_tensor({2, n}, DType::F32, rng, -8.0f, 8.0f);
    Tensor u = random_tensor({2, n}, DType::F32, rng);
    Tensor out = be->alloc({2, n}, DType::F32);
    be->swiglu(g, u, out);
    const auto gv = values(g), uv = values(u);
    std::vector<double> ref(gv.size()), sum(gv.size());
    for (size_t i = 0; i < gv.size(); ++i) {
      ref[i] = gv[i] / (1.0 + std::exp(-gv[i])) * uv[i];
      sum[i] = gv[i] + uv[i];
    }
    EXPECT_TRUE(all_close(out, ref, 1e-5, 1e-7)) << "swiglu n=" << n;
    be->add_inplace(g, u);
    EXPECT_TRUE(all_close(g, sum, 1e-6, 1e-7)) << "add n=" << n;

    Tensor x = random_tensor({5, n}, DType::F32, rng);
    const std::vector<int32_t> rows = {4, 0, 4, 2};
    Tensor gathered = be->alloc({4, n}, DType::F32);
    be->gather_rows(x, rows, gathered);
    const auto xv = values(x);
    std::vector<double> gref;
    for (int r : rows)
      for (int64_t i = 0; i < n; ++i) gref.push_back(xv[r * n + i]);
    EXPECT_TRUE(all_close(gathered, gref, 0.0)) << "gather n=" << n;
    const std::vector<int32_t> bad = {5};
    Tensor one = be->alloc({1, n}, DType::F32);
    EXPECT_THROW(be->gather_rows(x, bad, one), std::logic_error);
  }
}

}  // namespace
}  // namespace attnres::test
