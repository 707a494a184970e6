// The producers of a linear's input rows write them in bf16 when the backend asks for it
// (CpuBackend::linear_input_dtype, bf16 linear inputs with bf16 weights): rms_norm,
// depth_phase2_prenorm (single and pair, every mode and count of newer entries, f32 and bf16
// banks), attention (f32 and bf16 caches) and swiglu. Each bf16 output must equal the same
// op's f32 output rounded to nearest even (f32_to_bf16), bit for bit: what linear did itself
// before, in a rounding pass of its own. These ops run on any build; the whole forward with
// bf16 linear inputs (which needs AVX512_BF16) is checked in
// tests/cpp/engine/runner/bf16_activations_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/kernels/cpu/depth_modes_reference.h"
#include "tests/cpp/kernels/cpu/paged_kv_steps.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

constexpr float kEps = 1e-6f, kNormEps = 1e-5f;

// got (bf16) equals want (f32) rounded, element by element. The callers' inputs are random
// and non-zero, and got starts as a NaN pattern, so an element the op did not write fails.
::testing::AssertionResult equals_rounded(const Tensor& got, const Tensor& want) {
  if (got.dtype != DType::BF16 || want.dtype != DType::F32 || got.numel() != want.numel())
    return ::testing::AssertionFailure() << "dtypes or sizes differ";
  const uint16_t* g = got.ptr<uint16_t>();
  const float* w = want.ptr<float>();
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (g[i] != f32_to_bf16(w[i]))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << want.numel() << ": got bf16 " << bf16_to_f32(g[i])
             << ", f32 " << w[i] << " rounds to " << bf16_to_f32(f32_to_bf16(w[i]));
  }
  return ::testing::AssertionSuccess();
}

// A bf16 tensor of the shape filled with a pattern no op writes (so an unwritten element
// fails the comparison).
Tensor poisoned_bf16(Backend& be, const Shape& shape) {
  Tensor t = be.alloc(shape, DType::BF16);
  std::fill_n(t.ptr<uint16_t>(), t.numel(), uint16_t{0x7fc1});  // a NaN
  return t;
}

TEST(CpuBf16Outputs, RmsNormEveryGainDtype) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(5);
  for (int64_t n : {37, 512, 1024}) {
    for (int64_t rows : {1, 3, 40}) {
      for (DType gdt : {DType::F32, DType::BF16, DType::F16}) {
        const Tensor x = random_tensor({rows, n}, DType::F32, rng, -3.0f, 3.0f);
        const Tensor gain = random_tensor({n}, gdt, rng, 0.5f, 1.5f);
        Tensor want = be->alloc({rows, n}, DType::F32);
        be->rms_norm(x, gain, kNormEps, want);
        Tensor got = poisoned_bf16(*be, {rows, n});
        be->rms_norm(x, gain, kNormEps, got);
        EXPECT_TRUE(equals_rounded(got, want)) << n << " x " << rows << " gain " << name(gdt);
      }
    }
  }
}

TEST(CpuBf16Outputs, Swiglu) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(6);
  // 37: a scalar tail; 3 x 12000: several parallel chunks, the last partial.
  for (const Shape& shape : {Shape{1, 37}, Shape{5, 37}, Shape{3, 12000}}) {
    const Tensor gate = random_tensor(shape, DType::F32, rng, -6.0f, 6.0f);
    const Tensor up = random_tensor(shape, DType::F32, rng, -2.0f, 2.0f);
    Tensor want = be->alloc(shape, DType::F32);
    be->swiglu(gate, up, want);
    Tensor got = poisoned_bf16(*be, shape);
    be->swiglu(gate, up, got);
    EXPECT_TRUE(equals_rounded(got, want)) << shape_str(shape);
  }
}

// Prefill chunks over cached prefixes, decodes and several sequences in one step, GQA.
TEST(CpuBf16Outputs, AttentionF32AndBf16Caches) {
  for (DType cache_dtype : {DType::F32, DType::BF16}) {
    for (int hd : {64, 36}) {  // 36: a scalar tail
      auto be = make_cpu_backend(2);
      std::mt19937 rng(7 + hd);
      constexpr int kBlockSize = 4, kBlocks = 48, hq = 8, hkv = 2;
      const int row = hkv * hd;
      KvCacheLayer cache{be->alloc({kBlocks, kBlockSize, hkv, hd}, cache_dtype),
                         be->alloc({kBlocks, kBlockSize, hkv, hd}, cache_dtype)};
      const std::vector<SeqSpec> seqs = {{0, 9}, {21, 1}, {5, 7}};
      std::vector<std::vector<int32_t>> tables(seqs.size());
      std::vector<Tensor> k_all, v_all;
      int next_block = 0;
      for (size_t s = 0; s < seqs.size(); ++s) {
        const int len = seqs[s].cached + seqs[s].chunk;
        for (int b = 0; b < (len + kBlockSize - 1) / kBlockSize; ++b) tables[s].push_back(next_block++);
        k_all.push_back(random_tensor({len, row}, DType::F32, rng));
        v_all.push_back(random_tensor({len, row}, DType::F32, rng));
      }
      store_paged_step(*be, seqs, tables, kBlockSize, row, k_all, v_all, cache, true);
      const BatchMeta batch =
          store_paged_step(*be, seqs, tables, kBlockSize, row, k_all, v_all, cache, false);
      const Tensor q = random_tensor({batch.num_tokens, hq * hd}, DType::F32, rng, -2.0f, 2.0f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      Tensor want = be->alloc({batch.num_tokens, hq * hd}, DType::F32);
      be->attention(q, cache, batch, hd, scale, want);
      Tensor got = poisoned_bf16(*be, {batch.num_tokens, hq * hd});
      be->attention(q, cache, batch, hd, scale, got);
      EXPECT_TRUE(equals_rounded(got, want)) << name(cache_dtype) << " cache, hd " << hd;
    }
  }
}

// Every switch combination with and without a Phase-1 state and every count of newer
// entries, f32 and bf16 banks; the pair (delta_v) with both outputs in bf16; and a mix that
// does not mix (the plain PreNorm, rms_norm's path).
TEST(CpuBf16Outputs, DepthPhase2SingleAndPair) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(8);
  const int64_t t_dim = 5, d = 37;
  int checked = 0;
  for (bool stateless : {false, true}) {
    for (int k = stateless ? 1 : 0; k <= Backend::kMaxNewerSources; ++k) {
      const int before = stateless ? 0 : 1 + k % 2;
      const int n = before + k;
      for (ModeCase c : newer_mode_cases(k)) {
        const ModeInputs base = ModeInputs::random(n, t_dim, d, rng);
        for (DType bank_dtype : {DType::F32, DType::BF16}) {
          Tensor bank = base.bank;
          if (bank_dtype == DType::BF16) {
            bank = be->alloc(base.bank.shape, DType::BF16);
            be->copy(base.bank, bank);
          }
          const Tensor queries = random_tensor({2, d}, DType::F32, rng, -0.5f, 0.5f);
          Tensor m = be->alloc({2, t_dim}, DType::F32), s = be->alloc({2, t_dim}, DType::F32);
          Tensor o = be->alloc({2, t_dim, d}, DType::F32);
          if (before > 0) be->depth_phase1(queries, bank, before, kEps, m, s, o);
          const Tensor newer = bank.rows(before, n);
          ModeInputs in_a = base, in_b = base;
          in_a.query = queries.row(0);
          in_b.query = queries.row(1);
          Tensor ma = m.row(0), sa = s.row(0), oa = o.row(0);
          Tensor mb = m.row(1), sb = s.row(1), ob = o.row(1);
          Backend::DepthMixArgs a = mode_args(c, in_a, ma, sa, oa, kEps, &newer);
          Backend::DepthMixArgs b = mode_args(c, in_b, mb, sb, ob, kEps, &newer);
          if (stateless) a.m = a.s = a.o = b.m = b.s = b.o = nullptr;
          const std::string what = c.describe() + (stateless ? " stateless" : " stateful") +
                                   " k " + std::to_string(k) + " bank " + name(bank_dtype);
          Tensor want_a = be->alloc({t_dim, d}, DType::F32);
          Tensor want_b = be->alloc({t_dim, d}, DType::F32);
          be->depth_phase2_prenorm(a, base.partial, base.gain, kNormEps, want_a);
          be->depth_phase2_prenorm(b, base.partial, base.gain, kNormEps, want_b);
          Tensor got = poisoned_bf16(*be, {t_dim, d});
          be->depth_phase2_prenorm(a, base.partial, base.gain, kNormEps, got);
          EXPECT_TRUE(equals_rounded(got, want_a)) << what << ": single";
          Tensor got_a = poisoned_bf16(*be, {t_dim, d}), got_b = poisoned_bf16(*be, {t_dim, d});
          be->depth_phase2_prenorm_pair(a, b, base.partial, base.gain, kNormEps, got_a, got_b);
          EXPECT_TRUE(equals_rounded(got_a, want_a)) << what << ": pair, stream a";
          EXPECT_TRUE(equals_rounded(got_b, want_b)) << what << ": pair, stream b";
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 50);
  // No Phase-1 state and no newer entries: h = p, the PreNorm alone.
  const ModeInputs base = ModeInputs::random(1, t_dim, d, rng);
  Backend::DepthMixArgs plain;
  Tensor want = be->alloc({t_dim, d}, DType::F32);
  be->depth_phase2_prenorm(plain, base.partial, base.gain, kNormEps, want);
  Tensor got = poisoned_bf16(*be, {t_dim, d});
  be->depth_phase2_prenorm(plain, base.partial, base.gain, kNormEps, got);
  EXPECT_TRUE(equals_rounded(got, want)) << "no mix";
}

// A bf16 out must not overlap the partial it is formed from (rows of different widths).
TEST(CpuBf16Outputs, DepthPhase2RefusesABf16OutOverThePartial) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(9);
  const int64_t t_dim = 4, d = 32;
  const ModeInputs base = ModeInputs::random(2, t_dim, d, rng);
  const Tensor query = random_tensor({1, d}, DType::F32, rng);
  Tensor m = be->alloc({1, t_dim}, DType::F32), s = be->alloc({1, t_dim}, DType::F32);
  Tensor o = be->alloc({1, t_dim, d}, DType::F32);
  be->depth_phase1(query, base.bank, 2, kEps, m, s, o);
  Backend::DepthMixArgs mix;
  mix.query = &query;
  mix.partial_is_source = true;
  mix.m = &m, mix.s = &s, mix.o = &o;
  Tensor over = base.partial;
  over.dtype = DType::BF16;  // the partial's own first half, viewed as bf16 rows
  EXPECT_THROW(be->depth_phase2_prenorm(mix, base.partial, base.gain, kNormEps, over),
               std::logic_error);
}

}  // namespace
}  // namespace attnres::test
