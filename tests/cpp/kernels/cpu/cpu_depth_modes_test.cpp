// The open-attnres switches of the depth ops (docs/ATTNRES.md §2d) against a direct
// double-precision softmax over the sources written out here: Phase 1 with pre-gated sources, then
// Phase 2 with every combination of partial-as-source, residual base, null source and gate, plus
// the introspection op's source order ([null] + bank + [partial]).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/kernels/cpu/depth_modes_reference.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

// Every switch combination, with all n bank sources read by Phase 1, and (not pre-gated)
// with the last k of them merged by Phase 2 instead, for every k up to kMaxNewerSources (each
// k is a kernel instance of its own): the result is the one softmax over the same sources
// either way.
TEST(CpuDepthModes, EverySwitchCombinationEqualsTheDirectSoftmax) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(11);
  const int64_t t_dim = 4, d = 37;
  const float eps = 1e-6f, norm_eps = 1e-5f;
  std::vector<std::pair<int, ModeCase>> cases;
  for (int n : {1, 3})
    for (const ModeCase& c : all_mode_cases()) cases.push_back({n, c});
  for (int newer = 1; newer <= Backend::kMaxNewerSources; ++newer)
    for (const ModeCase& c : newer_mode_cases(newer)) cases.push_back({newer + 1 + newer % 3, c});
  for (const auto& [n, c] : cases) {
    const ModeInputs in = ModeInputs::random(n, t_dim, d, rng);
    Tensor m = be->alloc({1, t_dim}, DType::F32), s = be->alloc({1, t_dim}, DType::F32);
    Tensor o = be->alloc({1, t_dim, d}, DType::F32);
    be->depth_phase1(in.query.reshape({1, d}), in.bank, n - c.newer, eps, m, s, o,
                     c.pre_gated ? &in.gate_logits : nullptr);
    const Tensor newer = in.bank.rows(n - c.newer, n);
    Tensor ml = m.row(0), sl = s.row(0), ol = o.row(0);
    const Backend::DepthMixArgs mix = mode_args(c, in, ml, sl, ol, eps, &newer);
    Tensor out = be->alloc({t_dim, d}, DType::F32);
    be->depth_phase2_prenorm(mix, in.partial, in.gain, norm_eps, out);
    const std::vector<double> want = reference_mix(c, in, n, eps, norm_eps);
    EXPECT_TRUE(all_close(out, want, 1e-5, 1e-5)) << c.describe() << " n=" << n;

    // In place over the partial: the same result.
    Tensor p = be->alloc({t_dim, d}, DType::F32);
    be->copy(in.partial, p);
    be->depth_phase2_prenorm(mode_args(c, in, ml, sl, ol, eps, &newer), p, in.gain, norm_eps, p);
    EXPECT_TRUE(all_close(p, values(out), 0.0)) << c.describe() << " in place";
  }
}

// Phase 2 without a Phase-1 state (m, s, o null; Backend::mixes_without_phase1), every bank
// source a newer entry, for every switch combination but pre-gated and every count up to
// kMaxNewerSources (each a kernel instance of its own), from an f32 and a bf16 bank: the bits of
// Phase 1 over the first entry and Phase 2 merging the rest (what the forward runs where it
// keeps Phase 1), and (f32) the direct softmax over the same sources.
TEST(CpuDepthModes, WithoutPhaseOneTheFirstNewerEntryIsTheState) {
  auto be = make_cpu_backend(2);
  ASSERT_TRUE(be->capabilities().mixes_without_phase1);
  std::mt19937 rng(12);
  const int64_t t_dim = 5, d = 37;
  const float eps = 1e-6f, norm_eps = 1e-5f;
  for (int n = 1; n <= Backend::kMaxNewerSources; ++n) {
    for (const ModeCase& c : newer_mode_cases(n - 1)) {
      const ModeInputs in = ModeInputs::random(n, t_dim, d, rng);
      for (DType dtype : {DType::F32, DType::BF16}) {
        Tensor bank = in.bank;
        if (dtype == DType::BF16) {
          bank = be->alloc(in.bank.shape, DType::BF16);
          be->copy(in.bank, bank);
        }
        Tensor m = be->alloc({1, t_dim}, DType::F32), s = be->alloc({1, t_dim}, DType::F32);
        Tensor o = be->alloc({1, t_dim, d}, DType::F32);
        be->depth_phase1(in.query.reshape({1, d}), bank, 1, eps, m, s, o);
        Tensor ml = m.row(0), sl = s.row(0), ol = o.row(0);
        const Tensor rest = bank.rows(1, n);
        Tensor want = be->alloc({t_dim, d}, DType::F32);
        be->depth_phase2_prenorm(mode_args(c, in, ml, sl, ol, eps, &rest), in.partial, in.gain,
                                 norm_eps, want);

        ModeCase all_newer = c;
        all_newer.newer = n;
        const Tensor all = bank.rows(0, n);
        Backend::DepthMixArgs mix = mode_args(all_newer, in, ml, sl, ol, eps, &all);
        mix.m = mix.s = mix.o = nullptr;
        Tensor got = be->alloc({t_dim, d}, DType::F32);
        be->depth_phase2_prenorm(mix, in.partial, in.gain, norm_eps, got);
        const std::string what =
            c.describe() + " n=" + std::to_string(n) + " " + std::string(dtype_name(dtype));
        EXPECT_TRUE(all_close(got, values(want), 0.0)) << what;
        if (dtype == DType::F32) {
          EXPECT_TRUE(all_close(got, reference_mix(c, in, n, eps, norm_eps), 1e-5, 1e-5)) << what;
        }

        // In place over the partial: the same bits.
        Tensor p = be->alloc({t_dim, d}, DType::F32);
        be->copy(in.partial, p);
        be->depth_phase2_prenorm(mix, p, in.gain, norm_eps, p);
        EXPECT_TRUE(all_close(p, values(got), 0.0)) << what << " in place";
      }
    }
  }
}

// Without m, s and o must be absent too: a half-given state is a caller's mistake.
TEST(CpuDepthModes, RejectsAPartialPhaseOneState) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(13);
  const int64_t t_dim = 3, d = 16;
  const ModeInputs in = ModeInputs::random(2, t_dim, d, rng);
  Tensor s = be->alloc({t_dim}, DType::F32), o = be->alloc({t_dim, d}, DType::F32);
  ModeCase c;
  c.newer = 2;
  const Tensor newer = in.bank.rows(0, 2);
  Backend::DepthMixArgs mix = mode_args(c, in, s, s, o, 1e-6f, &newer);
  mix.m = nullptr;
  Tensor out = be->alloc({t_dim, d}, DType::F32);
  EXPECT_THROW(be->depth_phase2_prenorm(mix, in.partial, in.gain, 1e-6f, out), std::logic_error);
}

// Phase 1 of the inputs' query over the first n bank entries: m, s, o of its one row.
struct PhaseOne {
  Tensor m, s, o;
  PhaseOne(Backend& be, const ModeInputs& in, int n) {
    const int64_t t_dim = in.partial.dim(0), d = in.partial.dim(1);
    Tensor m2 = be.alloc({1, t_dim}, DType::F32), s2 = be.alloc({1, t_dim}, DType::F32);
    Tensor o2 = be.alloc({1, t_dim, d}, DType::F32);
    be.depth_phase1(in.query.reshape({1, d}), in.bank, n, 1e-6f, m2, s2, o2);
    m = m2.row(0), s = s2.row(0), o = o2.row(0);
  }
};

TEST(CpuDepthModes, RejectsTooManyOrMisshapedNewerEntries) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(5);
  const int64_t t_dim = 3, d = 16;
  const ModeInputs in = ModeInputs::random(10, t_dim, d, rng);
  PhaseOne phase1(*be, in, 1);
  const Tensor &ml = phase1.m, &sl = phase1.s, &ol = phase1.o;
  ModeCase c;
  c.newer = 1;
  Tensor out = be->alloc({t_dim, d}, DType::F32);
  const Tensor nine = in.bank.rows(1, 10);  // one more than kMaxNewerSources
  EXPECT_THROW(be->depth_phase2_prenorm(mode_args(c, in, ml, sl, ol, 1e-6f, &nine), in.partial,
                                        in.gain, 1e-6f, out),
               std::logic_error);
  const Tensor flat = in.bank.rows(1, 2).reshape({t_dim, d});  // rank 2: not [k, T, d]
  EXPECT_THROW(be->depth_phase2_prenorm(mode_args(c, in, ml, sl, ol, 1e-6f, &flat), in.partial,
                                        in.gain, 1e-6f, out),
               std::logic_error);
}

TEST(CpuDepthModes, GateDirectionMatters) {
  // A gate of 1 gives the mix, a gate of 0 gives x: the blend is not symmetric, so a swapped
  // (1 - s) / s would show.
  auto be = make_cpu_backend(1);
  std::mt19937 rng(12);
  const int64_t t_dim = 2, d = 16;
  const ModeInputs in = ModeInputs::random(2, t_dim, d, rng);
  PhaseOne phase1(*be, in, 2);
  const Tensor &ml = phase1.m, &sl = phase1.s, &ol = phase1.o;
  ModeCase plain{true, false, false, Backend::DepthGate::None, false};
  ModeCase zero{true, false, false, Backend::DepthGate::Scalar, false};
  Tensor mixed = be->alloc({t_dim, d}, DType::F32), gated = be->alloc({t_dim, d}, DType::F32),
         x_only = be->alloc({t_dim, d}, DType::F32);
  be->depth_phase2_prenorm(mode_args(plain, in, ml, sl, ol, 1e-6f), in.partial, in.gain, 1e-6f,
                           mixed);
  Backend::DepthMixArgs one = mode_args(zero, in, ml, sl, ol, 1e-6f);
  one.gate_blend = 1.0f;
  be->depth_phase2_prenorm(one, in.partial, in.gain, 1e-6f, gated);
  EXPECT_TRUE(all_close(gated, values(mixed), 1e-6, 1e-6));
  Backend::DepthMixArgs none = mode_args(zero, in, ml, sl, ol, 1e-6f);
  none.gate_blend = 0.0f;
  be->depth_phase2_prenorm(none, in.partial, in.gain, 1e-6f, gated);
  be->rms_norm(in.partial, in.gain, 1e-6f, x_only);
  EXPECT_TRUE(all_close(gated, values(x_only), 1e-6, 1e-6));
}

TEST(CpuDepthModes, WeightsListNullBankAndPartialInOrder) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(13);
  const int64_t t_dim = 3, d = 29;
  const float eps = 1e-6f;
  const int n = 3;
  for (const ModeCase& c : all_mode_cases()) {
    const ModeInputs in = ModeInputs::random(n, t_dim, d, rng);
    Backend::DepthSourceSwitches sw;
    sw.partial_is_source = c.partial_is_source;
    sw.has_null = c.null_source;
    sw.null_logit = in.null_logit;
    sw.source_gate_logits = c.pre_gated ? &in.gate_logits : nullptr;
    Tensor out = be->alloc({t_dim, sw.width(n)}, DType::F32);
    be->depth_weights(in.query, in.bank, n, in.partial, in.bias, eps, out, sw);
    EXPECT_TRUE(all_close(out, reference_weights(c, in, n, eps), 1e-5, 1e-6)) << c.describe();
  }
}

// Misuse is a bug (ATTNRES_CHECK: std::logic_error), not a user error.
TEST(CpuDepthModes, RejectsAPartialSourceWithoutQueryAndAVectorGateWithoutLogits) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(14);
  const ModeInputs in = ModeInputs::random(1, 2, 8, rng);
  Tensor m = be->alloc({2}, DType::F32), s = be->alloc({2}, DType::F32);
  Tensor o = be->alloc({2, 8}, DType::F32), out = be->alloc({2, 8}, DType::F32);
  Backend::DepthMixArgs mix;
  mix.m = &m, mix.s = &s, mix.o = &o;
  EXPECT_THROW(be->depth_phase2_prenorm(mix, in.partial, in.gain, 1e-6f, out), std::logic_error);
  mix.partial_is_source = false;
  mix.gate = Backend::DepthGate::Vector;
  EXPECT_THROW(be->depth_phase2_prenorm(mix, in.partial, in.gain, 1e-6f, out), std::logic_error);
}

}  // namespace
}  // namespace attnres::test
