// The docs/ATTNRES.md §2d switches of the depth ops on CUDA against the CPU backend (itself checked
// against a direct double-precision softmax in tests/cpp/kernels/cpu/cpu_depth_modes_test.cpp):
// Phase 1 with pre-gated sources, Phase 2 with every combination of partial-as-source,
// residual base, null source and gate and 1 to 7 newer entries, and depth_weights' [null] +
// bank + [partial], each on an F32 and a BF16 bank (both backends read the same rounded
// values), at d 37 (the kernels' scalar path) and 1024 (16-byte loads). Skips without a GPU.
// Tolerance: 2e-5 relative (f32 arithmetic either way; only the summation order differs).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/cpp/kernels/cpu/depth_modes_reference.h"
#include "tests/cpp/kernels/cuda/cuda_depth_bank_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

// Phase 1, Phase 2 and depth_weights of one switch combination over n sources, against the CPU.
void check_mode(CpuBackend& cpu, CudaBackend& gpu, std::mt19937& rng, int n, const ModeCase& c,
                int64_t d, DType bank_dtype) {
  SCOPED_TRACE(c.describe() + " n " + std::to_string(n) + " d " + std::to_string(d) + " bank " +
               std::string(dtype_name(bank_dtype)));
  const float eps = 1e-6f, norm_eps = 1e-5f;
  const int64_t t_dim = 5;
  ModeInputs in = ModeInputs::random(n, t_dim, d, rng);
  ModeInputs dev;  // the same inputs on the GPU
  dev.bank = bank_on(gpu, in.bank, bank_dtype);
  in.bank = bank_on(cpu, in.bank, bank_dtype);
  ASSERT_TRUE(same_bank_bits(cpu, in.bank, gpu, dev.bank));
  for (auto [to, from] : {std::pair{&dev.partial, &in.partial},
                          {&dev.query, &in.query},
                          {&dev.gain, &in.gain},
                          {&dev.null_source, &in.null_source},
                          {&dev.gate_logits, &in.gate_logits}}) {
    *to = gpu.upload(*from);
  }
  dev.bias = in.bias, dev.null_logit = in.null_logit, dev.gate_blend = in.gate_blend;

  Tensor m = Tensor::empty({1, t_dim}, DType::F32), s = Tensor::empty({1, t_dim}, DType::F32);
  Tensor o = Tensor::empty({1, t_dim, d}, DType::F32);
  const int phase1_n = n - c.newer;
  cpu.depth_phase1(in.query.reshape({1, d}), in.bank, phase1_n, eps, m, s, o,
                   c.pre_gated ? &in.gate_logits : nullptr);
  Tensor md = device_nan(gpu, {1, t_dim}), sd = device_nan(gpu, {1, t_dim});
  Tensor od = device_nan(gpu, {1, t_dim, d});
  gpu.depth_phase1(dev.query.reshape({1, d}), dev.bank, phase1_n, eps, md, sd, od,
                   c.pre_gated ? &dev.gate_logits : nullptr);
  const Tensor newer = in.bank.rows(phase1_n, n), newer_dev = dev.bank.rows(phase1_n, n);
  EXPECT_TRUE(close_to(to_host(gpu, od), o, 2e-5)) << "phase 1 o";

  Tensor ml = m.row(0), sl = s.row(0), ol = o.row(0);
  Tensor ref = Tensor::empty({t_dim, d}, DType::F32);
  cpu.depth_phase2_prenorm(mode_args(c, in, ml, sl, ol, eps, &newer), in.partial, in.gain, norm_eps,
                           ref);
  Tensor mdl = md.row(0), sdl = sd.row(0), odl = od.row(0);
  Tensor out = device_nan(gpu, {t_dim, d});
  gpu.depth_phase2_prenorm(mode_args(c, dev, mdl, sdl, odl, eps, &newer_dev), dev.partial, dev.gain,
                           norm_eps, out);
  EXPECT_TRUE(close_to(to_host(gpu, out), ref, 2e-5)) << "phase 2";

  Backend::DepthSourceSwitches sw;
  sw.partial_is_source = c.partial_is_source;
  sw.has_null = c.null_source;
  sw.null_logit = in.null_logit;
  sw.source_gate_logits = c.pre_gated ? &in.gate_logits : nullptr;
  Tensor wref = Tensor::empty({t_dim, sw.width(n)}, DType::F32);
  cpu.depth_weights(in.query, in.bank, n, in.partial, in.bias, eps, wref, sw);
  sw.source_gate_logits = c.pre_gated ? &dev.gate_logits : nullptr;
  Tensor w = device_nan(gpu, {t_dim, sw.width(n)});
  gpu.depth_weights(dev.query, dev.bank, n, dev.partial, dev.bias, eps, w, sw);
  EXPECT_TRUE(close_to(to_host(gpu, w), wref, 2e-5)) << "depth weights";
}

TEST(CudaDepthModes, EverySwitchCombinationMatchesTheCpu) {
  SKIP_WITHOUT_CUDA();
  CpuBackend cpu(2);
  CudaBackend gpu(0);
  std::mt19937 rng(21);
  // Every combination over all n sources in Phase 1; then, not pre-gated, with the last 1 to
  // 7 of them merged by Phase 2 (newer entries; Phase 1 reads one or two before them).
  std::vector<std::pair<int, ModeCase>> cases;
  for (int n : {1, 4})
    for (const ModeCase& c : all_mode_cases()) cases.push_back({n, c});
  for (int newer = 1; newer < Backend::kMaxNewerSources; ++newer)
    for (const ModeCase& c : newer_mode_cases(newer)) cases.push_back({newer + 1 + newer % 2, c});
  for (DType bank_dtype : kBankDtypes)
    for (int64_t d : {37, 1024})
      for (const auto& [n, c] : cases) check_mode(cpu, gpu, rng, n, c, d, bank_dtype);
}

// Sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers"): each switch on and off, each gate,
// pre-gated Phase 1, and 0, 1 and 7 newer entries, in turn at d 37 (the scalar kernels) on an
// F32 bank and d 64 (16-byte loads, one vector per thread) on a BF16 one: every depth mode's
// path through depth_phase1_kernel, depth_phase2_general_kernel and depth_weights_kernel in
// ten cases instead of every combination.
TEST(CudaSanitizerSized, DepthEveryMode) {
  SKIP_WITHOUT_CUDA();
  CpuBackend cpu(2);
  CudaBackend gpu(0);
  std::mt19937 rng(22);
  using Gate = Backend::DepthGate;
  std::vector<std::pair<int, ModeCase>> cases;
  int i = 0;
  for (Gate gate : {Gate::None, Gate::Scalar, Gate::Vector}) {
    for (bool pre : {false, true}) {
      ModeCase c;
      c.partial_is_source = i % 2 == 0;
      c.adds_partial = i % 3 == 1;
      c.null_source = i % 2 == 1;
      c.gate = gate;
      c.pre_gated = pre;
      cases.push_back({4, c});
      ++i;
    }
  }
  for (int newer : {1, Backend::kMaxNewerSources - 1}) {
    for (const ModeCase& c : newer_mode_cases(newer)) {
      // Two of the 24 combinations per count: all switches on, and the plain merge.
      const bool all_on =
          c.adds_partial && c.null_source && !c.partial_is_source && c.gate == Gate::Vector;
      const bool plain =
          !c.adds_partial && !c.null_source && c.partial_is_source && c.gate == Gate::None;
      if (all_on || plain) cases.push_back({newer + 1 + newer % 2, c});
    }
  }
  for (size_t k = 0; k < cases.size(); ++k) {  // scalar and vector paths in turn
    const auto& [n, c] = cases[k];
    if (k % 2 == 0) {
      check_mode(cpu, gpu, rng, n, c, 37, DType::F32);
    } else {
      check_mode(cpu, gpu, rng, n, c, 64, DType::BF16);
    }
  }
}

}  // namespace
}  // namespace attnres::test
