// The decode GEMVs' levers (kernels/cuda/cuda_gemv_levers.h, NOTES.md "GEMV levers"), each
// switch and all of them together, against the same backend with them off and the CPU:
// - linear, linear_residual, linear_many (q, k, v in one launch) and linear_swiglu at the
//   0.6B decode shapes (d 1024, q 2048 / k, v 1024, o_proj 2048 -> 1024, gate / up 3072,
//   down 3072 -> 1024) at 1, 3 and 8 rows, and small shapes at every row count 1..8 (rows of
//   fewer vectors than a warp has lanes, a partial last batch of loads, K that takes the
//   scalar path): bit for bit against the levers off (a lever keeps every output's order of
//   operations), 1e-5 against the CPU (the GEMV's tolerance in cuda_ops_test.cpp);
// - whole models (plain and block AttnRes, bf16 and f32 weights; full AttnRes), whose decode
//   steps run the PreNorm-prologue GEMVs and the QKV GEMV with RoPE + the KV store (with and
//   without its prologue) too: the logits bit for bit against the levers off;
// - each environment variable switches its lever when a backend is built, and only then.
// The prefetch and bulk levers issue their prefetches / copies before the PDL wait; the tests
// run with PDL as the backend has it (on for compute capability 9.0+), so the early requests
// are exercised. The bulk lever with the other two on runs alone where its rows fit in shared
// memory (gemv_launch_levers) and the other two where they do not: "all" covers both, and rows
// of 8 x 32 KB (f32, K 8192) take the fallback.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "kernels/cuda/cuda_gemv_levers.h"
#include "tests/cpp/kernels/cuda/cuda_lever_test_util.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

struct LeverSet {
  const char* name;
  bool deep;
  bool prefetch;
  bool bulk;
};

// Each lever alone, the first two together, then all three.
const LeverSet kLeverSets[] = {{"deep", true, false, false},
                               {"prefetch", false, true, false},
                               {"deep + prefetch", true, true, false},
                               {"bulk", false, false, true},
                               {"all", true, true, true}};
constexpr LeverSet kLeversOff = {"off", false, false, false};

// Explicitly, both ways: a test run may have the environment switch a lever on.
void switch_levers(CudaBackend& be, const LeverSet& levers) {
  be.set_gemv_deep(levers.deep);
  be.set_gemv_weight_prefetch(levers.prefetch);
  be.set_gemv_bulk(levers.bulk);
}

struct Backends {
  explicit Backends(const LeverSet& levers) {
    switch_levers(off, kLeversOff);
    switch_levers(on, levers);
  }
  CpuBackend cpu{2};
  CudaBackend off{0};
  CudaBackend on{0};
};

struct Shape2 {
  int64_t k, n;
};

// linear / linear_residual of x [rows, k] by w [n, k] on the CPU, the GPU without the levers
// and with them.
void check_linear(Backends& be, const LeverSet& levers, int64_t rows, Shape2 s, DType wdt,
                  bool residual, std::mt19937& rng) {
  SCOPED_TRACE(std::string(levers.name) + ": linear" + (residual ? "_residual " : " ") +
               std::to_string(rows) + "x" + std::to_string(s.k) + " -> " + std::to_string(s.n) +
               " " + std::string(dtype_name(wdt)));
  const Tensor x = random_host({rows, s.k}, DType::F32, rng);
  const Tensor w = random_host({s.n, s.k}, wdt, rng);
  const Tensor b = random_host({s.n}, wdt == DType::F32 ? DType::F32 : DType::BF16, rng);
  const Tensor res = random_host({rows, s.n}, DType::F32, rng);
  Tensor want = Tensor::empty({rows, s.n}, DType::F32);
  if (residual) {
    be.cpu.linear_residual(x, w, &b, res, want);
  } else {
    be.cpu.linear(x, w, &b, want);
  }
  Tensor got[2];
  CudaBackend* gpus[2] = {&be.off, &be.on};
  for (int i = 0; i < 2; ++i) {
    CudaBackend& g = *gpus[i];
    const Tensor xd = g.upload(x), wd = g.upload(w), bd = g.upload(b), rd = g.upload(res);
    Tensor out = device_nan(g, {rows, s.n});
    if (residual) {
      g.linear_residual(xd, wd, &bd, rd, out);
    } else {
      g.linear(xd, wd, &bd, out);
    }
    got[i] = to_host(g, out);
  }
  EXPECT_TRUE(same_bytes(got[1], got[0])) << "levers on vs off";
  EXPECT_TRUE(close_to(got[1], want, 1e-5)) << "levers on vs the CPU";
}

// linear_many over q, k, v widths and linear_swiglu of width n_ffn, as above.
void check_many_and_swiglu(Backends& be, const LeverSet& levers, int64_t rows, int64_t k,
                           const std::vector<int64_t>& widths, int64_t n_ffn, DType wdt,
                           std::mt19937& rng) {
  SCOPED_TRACE(std::string(levers.name) + ": linear_many / linear_swiglu " + std::to_string(rows) +
               "x" + std::to_string(k) + " " + std::string(dtype_name(wdt)));
  const DType bias_dtype = wdt == DType::F32 ? DType::F32 : DType::BF16;
  const Tensor x = random_host({rows, k}, DType::F32, rng);
  std::vector<Tensor> w, b, want;
  for (int64_t n : widths) {
    w.push_back(random_host({n, k}, wdt, rng));
    b.push_back(random_host({n}, bias_dtype, rng));
    want.push_back(Tensor::empty({rows, n}, DType::F32));
    be.cpu.linear(x, w.back(), &b.back(), want.back());
  }
  const Tensor wg = random_host({n_ffn, k}, wdt, rng), wu = random_host({n_ffn, k}, wdt, rng);
  const Tensor bg = random_host({n_ffn}, bias_dtype, rng),
               bu = random_host({n_ffn}, bias_dtype, rng);
  Tensor gate = Tensor::empty({rows, n_ffn}, DType::F32),
         up = Tensor::empty({rows, n_ffn}, DType::F32),
         want_swiglu = Tensor::empty({rows, n_ffn}, DType::F32);
  be.cpu.linear_swiglu(x, wg, &bg, wu, &bu, gate, up, want_swiglu);

  std::vector<Tensor> got[2];
  Tensor got_swiglu[2];
  CudaBackend* gpus[2] = {&be.off, &be.on};
  for (int i = 0; i < 2; ++i) {
    CudaBackend& g = *gpus[i];
    const Tensor xd = g.upload(x);
    std::vector<Tensor> wd, bd, out;
    for (size_t t = 0; t < widths.size(); ++t) {
      wd.push_back(g.upload(w[t]));
      bd.push_back(g.upload(b[t]));
      out.push_back(device_nan(g, {rows, widths[t]}));
    }
    std::vector<Backend::LinearTarget> targets;
    for (size_t t = 0; t < widths.size(); ++t) targets.push_back({&wd[t], &bd[t], &out[t]});
    g.linear_many(xd, targets);
    for (const Tensor& o : out) got[i].push_back(to_host(g, o));
    const Tensor wgd = g.upload(wg), wud = g.upload(wu), bgd = g.upload(bg), bud = g.upload(bu);
    Tensor gd = device_nan(g, {rows, n_ffn}), ud = device_nan(g, {rows, n_ffn}),
           od = device_nan(g, {rows, n_ffn});
    g.linear_swiglu(xd, wgd, &bgd, wud, &bud, gd, ud, od);
    got_swiglu[i] = to_host(g, od);
  }
  for (size_t t = 0; t < widths.size(); ++t) {
    EXPECT_TRUE(same_bytes(got[1][t], got[0][t])) << "linear_many target " << t << " on vs off";
    EXPECT_TRUE(close_to(got[1][t], want[t], 1e-5)) << "linear_many target " << t << " vs the CPU";
  }
  EXPECT_TRUE(same_bytes(got_swiglu[1], got_swiglu[0])) << "linear_swiglu on vs off";
  EXPECT_TRUE(close_to(got_swiglu[1], want_swiglu, 1e-5)) << "linear_swiglu vs the CPU";
}

TEST(CudaGemvLevers, DecodeShapesEqualTheLeversOffAndTheCpu) {
  SKIP_WITHOUT_CUDA();
  for (const LeverSet& levers : kLeverSets) {
    Backends be(levers);
    std::mt19937 rng(48);
    for (DType wdt : {DType::BF16, DType::F32}) {
      for (int64_t rows : {1, 3, 8}) {
        check_many_and_swiglu(be, levers, rows, 1024, {2048, 1024, 1024}, 3072, wdt, rng);
        check_linear(be, levers, rows, {2048, 1024}, wdt, /*residual=*/true, rng);   // o_proj
        check_linear(be, levers, rows, {3072, 1024}, wdt, /*residual=*/true, rng);   // down
        check_linear(be, levers, rows, {1024, 2048}, wdt, /*residual=*/false, rng);  // q alone
      }
    }
    // Rows past the bulk lever's shared memory (f32, K 8192: 8 rows of 32 KB, 16 for SwiGLU):
    // the launch runs the other levers, or none.
    check_linear(be, levers, 2, {8192, 64}, DType::F32, /*residual=*/true, rng);
    check_many_and_swiglu(be, levers, 2, 8192, {64}, 40, DType::F32, rng);
  }
}

// K 64: fewer bf16 vectors than lanes; K 320: 40 bf16 / 80 f32 vectors, one batch of a lane's
// loads with most of them past the row's end; K 2056: 257 bf16 vectors, a second batch of one
// load (514 f32: a third); K 37: the scalar path, which the levers leave alone.
TEST(CudaGemvLevers, SmallShapesAtEveryRowCount) {
  SKIP_WITHOUT_CUDA();
  for (const LeverSet& levers : kLeverSets) {
    Backends be(levers);
    std::mt19937 rng(49);
    for (DType wdt : {DType::BF16, DType::F32}) {
      for (int64_t rows = 1; rows <= 8; ++rows) {
        check_many_and_swiglu(be, levers, rows, 64, {96, 32, 32}, 44, wdt, rng);
        check_many_and_swiglu(be, levers, rows, 320, {36, 20, 20}, 9, wdt, rng);
        check_linear(be, levers, rows, {2056, 24}, wdt, /*residual=*/true, rng);
        check_linear(be, levers, rows, {37, 17}, wdt, /*residual=*/false, rng);
      }
    }
  }
}

// A prefill and decode steps of two sequences; the logits of every step bit for bit.
void compare_model(const ModelConfig& config, DType weight_dtype, const LeverSet& levers) {
  SCOPED_TRACE(levers.name);
  LeverModelRun run;
  run.prompts = {6, 2};
  expect_lever_keeps_logits(
      config, weight_dtype,
      [&](CudaBackend& be, bool on) { switch_levers(be, on ? levers : kLeversOff); }, run);
}

TEST(CudaGemvLevers, ModelLogitsEqualTheLeversOff) {
  SKIP_WITHOUT_CUDA();
  for (const LeverSet& levers : kLeverSets) {
    for (DType wdt : {DType::BF16, DType::F32}) {
      compare_model(small_config("", 3, 0), wdt, levers);
      compare_model(small_config("block", 4, 2), wdt, levers);
    }
    // full: the QKV GEMV with RoPE + store reads x from memory (the merge keeps its launch).
    compare_model(small_config("full", 4, 2), DType::BF16, levers);
  }
}

// The environment variables are read when a backend is built: set, a new backend has that
// lever on and the other off; unset, off; a backend built before keeps what it read.
// What a backend's GEMV levers are: deep, prefetch, bulk.
std::vector<bool> levers_of(const CudaBackend& be) {
  return {be.gemv_deep(), be.gemv_weight_prefetch(), be.gemv_bulk()};
}

TEST(CudaGemvLevers, EnvironmentSwitchesALeverWhenABackendIsBuilt) {
  SKIP_WITHOUT_CUDA();
  const char* vars[] = {"ATTNRES_CUDA_GEMV_DEEP", "ATTNRES_CUDA_PDL_PREFETCH",
                        "ATTNRES_CUDA_GEMV_BULK"};
  const SavedEnvironment saved_deep(vars[0]), saved_prefetch(vars[1]), saved_bulk(vars[2]);
  for (const char* var : vars) ASSERT_EQ(unsetenv(var), 0);
  CudaBackend before(0);
  EXPECT_EQ(levers_of(before), std::vector<bool>({false, false, false}));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(setenv(vars[i], "1", 1), 0);
    CudaBackend with(0);
    ASSERT_EQ(unsetenv(vars[i]), 0);
    std::vector<bool> want(3, false);
    want[i] = true;
    EXPECT_EQ(levers_of(with), want) << vars[i];
  }
  EXPECT_EQ(levers_of(before), std::vector<bool>({false, false, false}));
  CudaBackend after(0);
  EXPECT_EQ(levers_of(after), std::vector<bool>({false, false, false}));
}

// The values that switch a lever on, and those that leave it off (no GPU needed).
TEST(CudaGemvLevers, EnvironmentValues) {
  const char* name = "ATTNRES_CUDA_GEMV_LEVER_TEST_VALUE";
  const SavedEnvironment saved(name);
  ASSERT_EQ(unsetenv(name), 0);
  EXPECT_FALSE(cuda::gemv_lever_wanted_by_env(name));
  for (const char* on : {"1", "on", "true"}) {
    ASSERT_EQ(setenv(name, on, 1), 0);
    EXPECT_TRUE(cuda::gemv_lever_wanted_by_env(name)) << on;
  }
  for (const char* off : {"0", "off", "false", "", "yes"}) {
    ASSERT_EQ(setenv(name, off, 1), 0);
    EXPECT_FALSE(cuda::gemv_lever_wanted_by_env(name)) << off;
  }
}

}  // namespace
}  // namespace attnres::test
