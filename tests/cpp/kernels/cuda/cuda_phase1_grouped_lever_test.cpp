// Depth attention's lever, Phase 1 over groups of bank entries (ATTNRES_CUDA_PHASE1_GROUPED,
// CudaBackend::set_depth_phase1_grouped; cuda_depth_phase1_grouped.cu, kernels/cuda/NOTES.md
// "GEMV levers"). It reduces a group's sums in one block reduction whose tree is the same for
// every value, and applies the updates in bank order, so against the lever off:
// - depth_phase1 at every query count of a launch (1..8) and two launches (9, 12), bank sizes
//   on both sides of each group size (1..9 entries; groups of 8, 4 or 2), d 1024 and 2048 (the
//   0.6B and 1.7B widths, 8-wide), d 64 and 67 (a partial warp; the scalar path), a misaligned
//   bank (scalar, up to 1024 threads), f32 and bf16 banks, with and without pre_gated's source
//   gate: m, s and o bit for bit, the CPU within the Phase-1 tolerance of cuda_ops_test.cpp;
// - rows a thread does not hold in one chunk (d 4096; d 1500 misaligned): declined, the same
//   bits as the kernel without the lever;
// - whole models' logits (block, full and pre_gated AttnRes): bit for bit;
// - the environment variable switches the lever when a backend is built.
// The sanitizer-sized case runs every instance at small shapes (docs/RELIABILITY.md "GPU
// sanitizers"). Without a GPU every test skips.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "engine/core/dtype.h"
#include "tests/cpp/kernels/cuda/cuda_depth_bank_util.h"
#include "tests/cpp/kernels/cuda/cuda_lever_test_util.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

struct Backends {
  Backends() {
    off.set_depth_phase1_grouped(false);
    on.set_depth_phase1_grouped(true);
  }
  CpuBackend cpu{2};
  CudaBackend off{0};
  CudaBackend on{0};
};

struct Phase1Case {
  int S, n;
  int64_t T, d;
  DType bank_dtype;
  bool gated = false;
  bool misaligned = false;  // the bank a view one element into its buffer: the scalar path
};

std::string describe(const Phase1Case& c) {
  return "S " + std::to_string(c.S) + " n " + std::to_string(c.n) + " T " + std::to_string(c.T) +
         " d " + std::to_string(c.d) + " bank " + std::string(dtype_name(c.bank_dtype)) +
         (c.gated ? " gated" : "") + (c.misaligned ? " misaligned" : "");
}

// depth_phase1 on the CPU and on both GPU backends, from the same host values.
void check(Backends& be, const Phase1Case& c, std::mt19937& rng) {
  SCOPED_TRACE(describe(c));
  const int capacity = c.n + 1;
  const Tensor queries = random_host({c.S, c.d}, DType::F32, rng);
  const int64_t skip = c.misaligned ? 1 : 0;
  Tensor flat = random_host({skip + capacity * c.T * c.d}, DType::F32, rng, -2.0f, 2.0f);
  for (int64_t i = skip + c.n * c.T * c.d; i < flat.numel(); ++i)
    flat.ptr<float>()[i] = kNaN;  // past the live entries
  const Tensor gate = random_host({c.T, c.d}, DType::F32, rng, -3.0f, 3.0f);
  auto bank_view = [&](const Tensor& whole) {
    return whole.rows(skip, flat.numel()).reshape({capacity, c.T, c.d});
  };
  const Tensor cpu_flat = bank_on(be.cpu, flat, c.bank_dtype);
  Tensor m = Tensor::empty({c.S, c.T}, DType::F32), s = Tensor::empty({c.S, c.T}, DType::F32);
  Tensor o = Tensor::empty({c.S, c.T, c.d}, DType::F32);
  be.cpu.depth_phase1(queries, bank_view(cpu_flat), c.n, 1e-6f, m, s, o, c.gated ? &gate : nullptr);

  Tensor got[2][3];  // [off, on][m, s, o]
  CudaBackend* gpus[2] = {&be.off, &be.on};
  for (int g = 0; g < 2; ++g) {
    CudaBackend& gpu = *gpus[g];
    const Tensor gpu_flat = bank_on(gpu, flat, c.bank_dtype);
    ASSERT_TRUE(same_bank_bits(be.cpu, cpu_flat, gpu, gpu_flat));
    const Tensor gate_d = gpu.upload(gate);
    Tensor md = device_nan(gpu, {c.S, c.T}), sd = device_nan(gpu, {c.S, c.T});
    Tensor od = device_nan(gpu, {c.S, c.T, c.d});
    gpu.depth_phase1(gpu.upload(queries), bank_view(gpu_flat), c.n, 1e-6f, md, sd, od,
                     c.gated ? &gate_d : nullptr);
    got[g][0] = to_host(gpu, md);
    got[g][1] = to_host(gpu, sd);
    got[g][2] = to_host(gpu, od);
  }
  const char* names[3] = {"m", "s", "o"};
  const Tensor* want[3] = {&m, &s, &o};
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(same_bytes(got[1][k], got[0][k])) << names[k] << ": lever on vs off";
    EXPECT_TRUE(close_to(got[1][k], *want[k], 2e-5)) << names[k] << ": lever on vs the CPU";
  }
}

TEST(CudaPhase1Grouped, EqualsTheLeverOffAndTheCpu) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(480);
  for (DType bank : kBankDtypes) {
    for (int S : {1, 2, 4, 5, 8, 9, 12})
      for (int n : {1, 2, 3, 4, 5, 8, 9}) check(be, {S, n, 2, 1024, bank}, rng);
    for (int S : {3, 7}) {
      check(be, {S, 6, 3, 2048, bank}, rng);
      check(be, {S, 5, 3, 64, bank}, rng);
      check(be, {S, 5, 3, 67, bank}, rng);                 // the scalar path
      check(be, {S, 9, 2, 1000, bank, false, true}, rng);  // scalar, 1000 threads
      check(be, {S, 7, 2, 1024, bank, true}, rng);         // pre_gated's source gate
      check(be, {S, 3, 2, 67, bank, true}, rng);
    }
  }
}

// The rows the grouped kernel does not take run the kernel without the lever.
TEST(CudaPhase1Grouped, DeclinesRowsOfMoreThanOneChunkPerThread) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(481);
  for (DType bank : kBankDtypes) {
    check(be, {4, 5, 2, 4096, bank}, rng);               // 8-wide, o in memory
    check(be, {4, 5, 2, 1500, bank, false, true}, rng);  // scalar, two chunks per thread
  }
}

TEST(CudaPhase1Grouped, ModelLogitsEqualTheLeverOff) {
  SKIP_WITHOUT_CUDA();
  LeverModelRun run;
  run.prompts = {6, 2};
  const SetLever set = [](CudaBackend& be, bool on) { be.set_depth_phase1_grouped(on); };
  for (DType wdt : {DType::BF16, DType::F32}) {
    expect_lever_keeps_logits(small_config("block", 6, 2), wdt, set, run);
    expect_lever_keeps_logits(small_config("full", 4, 2), wdt, set, run);
  }
  expect_lever_keeps_logits(small_config("pre_gated", 4, 2), DType::BF16, set, run);
}

TEST(CudaPhase1Grouped, EnvironmentSwitchesTheLeverWhenABackendIsBuilt) {
  SKIP_WITHOUT_CUDA();
  expect_environment_switches_lever(
      "ATTNRES_CUDA_PHASE1_GROUPED",
      [](const CudaBackend& be) { return be.depth_phase1_grouped(); },
      [](CudaBackend& be, bool on) { be.set_depth_phase1_grouped(on); });
}

// depth_phase1_grouped_kernel<S, V, B, G>: every query count, both vector widths and bank
// dtypes, a bank of one group and of a group and a partial one.
TEST(CudaSanitizerSized, DepthPhase1Grouped) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(482);
  for (int S = 1; S <= 8; ++S) {
    const DType bank = S % 2 ? DType::F32 : DType::BF16;
    check(be, {S, S <= 4 ? 9 : 5, 1, 64, bank}, rng);
    check(be, {S, 3, 1, 67, bank, S == 3}, rng);
  }
}

}  // namespace
}  // namespace attnres::test
