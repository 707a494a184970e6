// Programmatic dependent launch and the launch counts (kernels/cuda/cuda_launch.h): with PDL
// each kernel may be scheduled while the one ahead of it finishes and waits for it on the GPU,
// so results must not change by a bit, eagerly or replayed from a captured CUDA graph (whose
// launches become programmatic edges); and the backend counts what it launched. The switch
// of the environment is host logic and runs without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "kernels/cuda/cuda_launch.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

// Restores ATTNRES_CUDA_PDL as it was.
class ScopedPdlEnv {
 public:
  ScopedPdlEnv() {
    const char* v = std::getenv("ATTNRES_CUDA_PDL");
    had_ = v != nullptr;
    if (had_) old_ = v;
  }
  ~ScopedPdlEnv() {
    if (had_) {
      setenv("ATTNRES_CUDA_PDL", old_.c_str(), 1);
    } else {
      unsetenv("ATTNRES_CUDA_PDL");
    }
  }
  void set(const char* v) { setenv("ATTNRES_CUDA_PDL", v, 1); }
  void unset() { unsetenv("ATTNRES_CUDA_PDL"); }

 private:
  bool had_ = false;
  std::string old_;
};

TEST(CudaLaunchEnv, ZeroOffOrFalseTurnsPdlOffAnythingElseLeavesItOn) {
  ScopedPdlEnv env;
  env.unset();
  EXPECT_TRUE(cuda::programmatic_launch_wanted_by_env());
  for (const char* off : {"0", "off", "false"}) {
    env.set(off);
    EXPECT_FALSE(cuda::programmatic_launch_wanted_by_env()) << off;
  }
  for (const char* on : {"1", "on", "true", ""}) {
    env.set(on);
    EXPECT_TRUE(cuda::programmatic_launch_wanted_by_env()) << "'" << on << "'";
  }
}

bool device_has_pdl() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9;
}

TEST(CudaLaunch, TheSwitchFollowsTheEnvironmentAndTheDevice) {
  SKIP_WITHOUT_CUDA();
  ScopedPdlEnv env;
  env.unset();
  CudaBackend on(0);
  EXPECT_EQ(on.programmatic_launch(), device_has_pdl());
  env.set("0");
  CudaBackend off(0);
  EXPECT_FALSE(off.programmatic_launch());
  off.set_programmatic_launch(true);
  EXPECT_EQ(off.programmatic_launch(), device_has_pdl());
  on.set_programmatic_launch(false);
  EXPECT_FALSE(on.programmatic_launch());
}

// One launch per op here: a <= 8-row linear is one GEMV kernel; a 12-row f32 one a cuBLASLt
// call with the f32 bias in its epilogue (no kernel of ours: seen on an H200, 2026-11-28);
// add_inplace one kernel; a captured op counts at capture, not at replay.
TEST(CudaLaunch, CountsOurKernelsAndCallsIntoCublas) {
  SKIP_WITHOUT_CUDA();
  CudaBackend be(0);
  std::mt19937 rng(3);
  const Tensor w = be.upload(random_host({48, 64}, DType::F32, rng));
  const Tensor bias = be.upload(random_host({48}, DType::F32, rng));
  const Tensor x4 = be.upload(random_host({4, 64}, DType::F32, rng));
  const Tensor x12 = be.upload(random_host({12, 64}, DType::F32, rng));
  Tensor out4 = be.alloc({4, 48}, DType::F32), out12 = be.alloc({12, 48}, DType::F32);
  auto delta = [&](const std::function<void()>& f) {
    const CudaBackend::LaunchCounts a = be.launch_counts();
    f();
    const CudaBackend::LaunchCounts b = be.launch_counts();
    return std::pair<uint64_t, uint64_t>{b.kernels - a.kernels, b.cublas_calls - a.cublas_calls};
  };
  EXPECT_EQ(delta([&] { be.linear(x4, w, &bias, out4); }), (std::pair<uint64_t, uint64_t>{1, 0}));
  EXPECT_EQ(delta([&] { be.linear(x12, w, &bias, out12); }), (std::pair<uint64_t, uint64_t>{0, 1}));
  EXPECT_EQ(delta([&] { be.linear_residual(x4, w, &bias, out4, out4); }),
            (std::pair<uint64_t, uint64_t>{1, 0}));
  EXPECT_EQ(delta([&] { be.add_inplace(out4, out4); }), (std::pair<uint64_t, uint64_t>{1, 0}));
  std::unique_ptr<CudaGraph> graph;
  EXPECT_EQ(delta([&] { graph = be.capture_graph([&] { be.add_inplace(out4, out4); }); }),
            (std::pair<uint64_t, uint64_t>{1, 0}));
  EXPECT_EQ(delta([&] { graph->replay(); }), (std::pair<uint64_t, uint64_t>{0, 0}));
  be.synchronize();
}

std::vector<float> host_floats(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(t, v.data());
  return v;
}

// One model on one backend, PDL on or off: a prefill step of three sequences, then decode
// steps; the last decode step again, captured into a CUDA graph and replayed.
struct ModelRun {
  std::vector<std::vector<float>> eager;  // every step's logits
  std::vector<float> replayed;            // the last step's, from the graph
  uint64_t decode_kernels = 0;            // launches of the last eager decode step
};

ModelRun run_model(const ModelConfig& config, const ModelWeights& weights, bool pdl) {
  CudaBackend be(0);
  be.set_programmatic_launch(pdl);
  EXPECT_EQ(be.programmatic_launch(), pdl && device_has_pdl());
  Transformer model(config, weights, be);
  const int block_size = 4, num_blocks = 32;
  KvCache cache = KvCache::allocate(be, config, num_blocks, block_size);
  std::mt19937 rng(19);
  const std::vector<int> prompts = {6, 3, 9};
  const int decode_steps = 3;
  std::vector<int> lengths;
  for (int p : prompts) lengths.push_back(p + decode_steps);
  const std::vector<Seq> seqs =
      random_sequences(lengths, block_size, num_blocks, config.vocab_size, rng);
  std::vector<int> begin(seqs.size(), 0), end = prompts;
  ModelRun run;
  BatchMeta last;
  std::vector<int32_t> last_rows;
  for (int step = 0; step <= decode_steps; ++step) {
    std::vector<int32_t> rows;
    const BatchMeta batch = make_step(seqs, begin, end, block_size, rows);
    const uint64_t before = be.launch_counts().kernels;
    run.eager.push_back(host_floats(be, model.forward(batch, cache, rows)));
    run.decode_kernels = be.launch_counts().kernels - before;
    last = batch;
    last_rows = rows;
    for (size_t s = 0; s < seqs.size(); ++s) {
      begin[s] = end[s];
      end[s] += 1;
    }
  }
  // The last step again (it rewrites the same K/V slots with the same values), as a graph.
  Tensor captured;
  std::unique_ptr<CudaGraph> graph =
      be.capture_graph([&] { captured = model.forward(last, cache, last_rows); });
  graph->replay();
  graph->replay();
  run.replayed = host_floats(be, captured);
  return run;
}

TEST(CudaLaunch, PdlOnOffAndGraphReplaysGiveTheSameBits) {
  SKIP_WITHOUT_CUDA();
  for (const char* mode : {"", "block", "full", "delta_v"}) {
    const ModelConfig config = small_config(mode, 4, 2, "sigmoid_vector", mode[0] == 'd');
    for (DType wdt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string("mode '") + mode + "' " + std::string(dtype_name(wdt)));
      RandomWeightOptions opt;
      opt.dtype = wdt;
      opt.seed = 29;
      const ModelWeights weights = make_random_weights(config, opt);
      const ModelRun on = run_model(config, weights, true);
      const ModelRun off = run_model(config, weights, false);
      ASSERT_EQ(on.eager.size(), off.eager.size());
      for (size_t step = 0; step < on.eager.size(); ++step) {
        EXPECT_EQ(on.eager[step], off.eager[step]) << "step " << step;
      }
      EXPECT_EQ(on.replayed, on.eager.back());
      EXPECT_EQ(off.replayed, off.eager.back());
      EXPECT_EQ(on.decode_kernels, off.decode_kernels);
      EXPECT_GT(on.decode_kernels, 0u);
    }
  }
}

}  // namespace
}  // namespace attnres::test
