// depth_phase2_prenorm_pair (delta_v's K and V streams in one pass) against two
// depth_phase2_prenorm calls, bit for bit, and against the direct double-precision softmax
// (depth_modes_reference.h), for every switch combination the pair can meet: with and without
// a Phase-1 state, every count of newer entries (each a kernel instance of its own), f32 and
// bf16 banks, queries that are neighbouring rows (the forward's) or anywhere else.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/kernels/cpu/depth_modes_reference.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

constexpr float kEps = 1e-6f, kNormEps = 1e-5f;

// Phase 1 of three queries over a bank's first n entries, and the inputs seen by each query
// (its own query and null logit; the sources shared).
struct ThreeStreams {
  Tensor queries, m, s, o;
  ModeInputs in[3];

  ThreeStreams(Backend& be, const ModeInputs& base, const Tensor& bank, int n, std::mt19937& rng) {
    const int64_t t_dim = base.partial.dim(0), d = base.partial.dim(1);
    queries = random_tensor({3, d}, DType::F32, rng, -0.5f, 0.5f);
    m = be.alloc({3, t_dim}, DType::F32), s = be.alloc({3, t_dim}, DType::F32);
    o = be.alloc({3, t_dim, d}, DType::F32);
    if (n > 0) be.depth_phase1(queries, bank, n, kEps, m, s, o);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int l = 0; l < 3; ++l) {
      in[l] = base;
      in[l].query = queries.row(l);
      in[l].null_logit = u(rng);
    }
  }
};

// Every case for k newer entries: stateful (Phase 1 over the entries before them), or
// stateless (no Phase-1 state; the first newer entry is the state).
TEST(CpuDepthPhase2Pair, EqualsTwoSingleCallsAndTheDirectSoftmax) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(31);
  const int64_t t_dim = 5, d = 37;  // 37: vectors and a scalar tail
  // The stream pairs: neighbouring rows (a below b), and b two rows before a.
  const std::pair<int, int> pairs[] = {{0, 1}, {2, 0}};
  int checked = 0;
  for (bool stateless : {false, true}) {
    for (int k = stateless ? 1 : 0; k <= Backend::kMaxNewerSources; ++k) {
      const int before = stateless ? 0 : 1 + k % 2;  // entries read by Phase 1
      const int n = before + k;
      for (ModeCase c : newer_mode_cases(k)) {
        const ModeInputs base = ModeInputs::random(n, t_dim, d, rng);
        for (DType dtype : {DType::F32, DType::BF16}) {
          Tensor bank = base.bank;
          if (dtype == DType::BF16) {
            bank = be->alloc(base.bank.shape, DType::BF16);
            be->copy(base.bank, bank);
          }
          ThreeStreams three(*be, base, bank, before, rng);
          const Tensor newer = bank.rows(before, n);
          for (const auto& [la, lb] : pairs) {
            Tensor ma = three.m.row(la), sa = three.s.row(la), oa = three.o.row(la);
            Tensor mb = three.m.row(lb), sb = three.s.row(lb), ob = three.o.row(lb);
            Backend::DepthMixArgs a = mode_args(c, three.in[la], ma, sa, oa, kEps, &newer);
            Backend::DepthMixArgs b = mode_args(c, three.in[lb], mb, sb, ob, kEps, &newer);
            if (stateless) a.m = a.s = a.o = b.m = b.s = b.o = nullptr;
            Tensor want_a = be->alloc({t_dim, d}, DType::F32);
            Tensor want_b = be->alloc({t_dim, d}, DType::F32);
            be->depth_phase2_prenorm(a, base.partial, base.gain, kNormEps, want_a);
            be->depth_phase2_prenorm(b, base.partial, base.gain, kNormEps, want_b);
            Tensor got_a = be->alloc({t_dim, d}, DType::F32);
            Tensor got_b = be->alloc({t_dim, d}, DType::F32);
            be->depth_phase2_prenorm_pair(a, b, base.partial, base.gain, kNormEps, got_a, got_b);
            const std::string what = c.describe() + (stateless ? " stateless" : " stateful") + " " +
                                     name(dtype) + " streams " + std::to_string(la) + "," +
                                     std::to_string(lb);
            EXPECT_TRUE(all_close(got_a, values(want_a), 0.0)) << what << " (a)";
            EXPECT_TRUE(all_close(got_b, values(want_b), 0.0)) << what << " (b)";
            if (dtype == DType::F32) {  // the bank's values as written: the direct softmax
              EXPECT_TRUE(
                  all_close(got_a, reference_mix(c, three.in[la], n, kEps, kNormEps), 1e-5, 1e-5))
                  << what << " (a)";
              EXPECT_TRUE(
                  all_close(got_b, reference_mix(c, three.in[lb], n, kEps, kNormEps), 1e-5, 1e-5))
                  << what << " (b)";
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// A plain pre-norm on one side (no state, no newer entries: h = p) is still the two calls.
TEST(CpuDepthPhase2Pair, APlainPreNormSideIsTheSingleCall) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(32);
  const int64_t t_dim = 4, d = 40;
  const ModeInputs base = ModeInputs::random(2, t_dim, d, rng);
  ThreeStreams three(*be, base, base.bank, 2, rng);
  Tensor ma = three.m.row(0), sa = three.s.row(0), oa = three.o.row(0);
  const Backend::DepthMixArgs a = mode_args(ModeCase{}, three.in[0], ma, sa, oa, kEps);
  const Backend::DepthMixArgs plain{};
  Tensor want_a = be->alloc({t_dim, d}, DType::F32), want_b = be->alloc({t_dim, d}, DType::F32);
  be->depth_phase2_prenorm(a, base.partial, base.gain, kNormEps, want_a);
  be->depth_phase2_prenorm(plain, base.partial, base.gain, kNormEps, want_b);
  Tensor got_a = be->alloc({t_dim, d}, DType::F32), got_b = be->alloc({t_dim, d}, DType::F32);
  be->depth_phase2_prenorm_pair(a, plain, base.partial, base.gain, kNormEps, got_a, got_b);
  EXPECT_TRUE(all_close(got_a, values(want_a), 0.0));
  EXPECT_TRUE(all_close(got_b, values(want_b), 0.0));
}

// The pair shares everything but the query, the Phase-1 rows and the null logit: mixes that
// differ in anything else, or outputs that overlap, are the caller's mistake.
TEST(CpuDepthPhase2Pair, RejectsMixesThatDoNotShareTheirSourcesAndOverlappingOutputs) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(33);
  const int64_t t_dim = 3, d = 16;
  const ModeInputs base = ModeInputs::random(4, t_dim, d, rng);
  ThreeStreams three(*be, base, base.bank, 2, rng);
  Tensor ma = three.m.row(0), sa = three.s.row(0), oa = three.o.row(0);
  Tensor mb = three.m.row(1), sb = three.s.row(1), ob = three.o.row(1);
  ModeCase c;
  c.newer = 2;
  c.null_source = true;
  c.gate = Backend::DepthGate::Vector;
  const Tensor newer = base.bank.rows(2, 4), other_newer = base.bank.rows(1, 3);
  const Tensor other_logits = random_tensor({t_dim, d}, DType::F32, rng);
  const Backend::DepthMixArgs a = mode_args(c, three.in[0], ma, sa, oa, kEps, &newer);
  const Backend::DepthMixArgs b = mode_args(c, three.in[1], mb, sb, ob, kEps, &newer);
  Tensor out_a = be->alloc({t_dim, d}, DType::F32), out_b = be->alloc({t_dim, d}, DType::F32);
  ASSERT_NO_THROW(
      be->depth_phase2_prenorm_pair(a, b, base.partial, base.gain, kNormEps, out_a, out_b));

  std::vector<std::pair<std::string, Backend::DepthMixArgs>> unlike;
  auto differing = [&](const std::string& what, auto change) {
    Backend::DepthMixArgs x = b;
    change(x);
    unlike.push_back({what, x});
  };
  differing("newer entries", [&](auto& x) { x.newer = &other_newer; });
  differing("bias", [](auto& x) { x.bias += 0.5f; });
  differing("mix eps", [](auto& x) { x.mix_eps *= 2.0f; });
  differing("partial source", [](auto& x) { x.partial_is_source = !x.partial_is_source; });
  differing("adds partial", [](auto& x) { x.adds_partial = !x.adds_partial; });
  differing("null source", [](auto& x) { x.null_source = nullptr; });
  differing("gate", [](auto& x) { x.gate = Backend::DepthGate::Scalar; });
  differing("gate logits", [&](auto& x) { x.gate_logits = &other_logits; });
  differing("state", [](auto& x) { x.m = x.s = x.o = nullptr; });
  for (const auto& [what, x] : unlike) {
    EXPECT_THROW(
        be->depth_phase2_prenorm_pair(a, x, base.partial, base.gain, kNormEps, out_a, out_b),
        std::logic_error)
        << what;
  }
  Tensor both = be->alloc({2 * t_dim, d}, DType::F32);
  Tensor lower = both.rows(0, t_dim), straddling = both.rows(t_dim - 1, 2 * t_dim - 1);
  EXPECT_THROW(
      be->depth_phase2_prenorm_pair(a, b, base.partial, base.gain, kNormEps, lower, straddling),
      std::logic_error);
  Tensor partial = be->alloc({t_dim, d}, DType::F32);
  be->copy(base.partial, partial);
  EXPECT_THROW(be->depth_phase2_prenorm_pair(a, b, partial, base.gain, kNormEps, partial, out_b),
               std::logic_error);
}

}  // namespace
}  // namespace attnres::test
