// What the decode levers' tests share (kernels/cuda/NOTES.md "GEMV levers"): whole forwards
// with a lever off and on, whose logits must be the same bits, an environment variable put
// back when a test that sets it ends, and the check that a lever's variable switches it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {

// Sets a backend's lever(s): on or off, explicitly both ways (a test run's environment may
// have switched a lever on when the backend was built).
using SetLever = std::function<void(CudaBackend&, bool on)>;

struct LeverModelRun {
  std::vector<int> prompts;  // prompt lengths, one sequence each, prefilled in one step
  int decode_steps = 3;      // then this many decode steps of every sequence
  int num_blocks = 24;       // KV blocks of 4 tokens
  uint32_t weight_seed = 11;
  uint32_t token_seed = 5;
};

// A model of `config` with random weights run on two backends, the lever off on one and on on
// the other: every step's logits bit for bit.
inline void expect_lever_keeps_logits(const ModelConfig& config, DType weight_dtype,
                                      const SetLever& set_lever, const LeverModelRun& run) {
  SCOPED_TRACE(config.summary() + " " + std::string(dtype_name(weight_dtype)) + " weights");
  RandomWeightOptions opt;
  opt.dtype = weight_dtype;
  opt.seed = run.weight_seed;
  const ModelWeights weights = make_random_weights(config, opt);
  CudaBackend off(0), on(0);
  set_lever(off, false);
  set_lever(on, true);
  Transformer off_model(config, weights, off), on_model(config, weights, on);
  const int block_size = 4;
  KvCache off_cache = KvCache::allocate(off, config, run.num_blocks, block_size, DType::BF16);
  KvCache on_cache = KvCache::allocate(on, config, run.num_blocks, block_size, DType::BF16);
  std::mt19937 rng(run.token_seed);
  std::vector<int> lengths;
  for (int p : run.prompts) lengths.push_back(p + run.decode_steps);
  std::vector<Seq> seqs =
      random_sequences(lengths, block_size, run.num_blocks, config.vocab_size, rng);
  std::vector<int> begin(seqs.size(), 0), end = run.prompts;
  for (int step = 0; step <= run.decode_steps; ++step) {
    std::vector<int32_t> rows;
    const BatchMeta batch = make_step(seqs, begin, end, block_size, rows);
    const Tensor got = to_host(on, on_model.forward(batch, on_cache, rows));
    const Tensor want = to_host(off, off_model.forward(batch, off_cache, rows));
    EXPECT_TRUE(same_bytes(got, want)) << "step " << step;
    for (size_t s = 0; s < seqs.size(); ++s) begin[s] = end[s]++;
  }
}

// The variable as the test run had it, put back when the test ends.
class SavedEnvironment {
 public:
  explicit SavedEnvironment(const char* name) : name_(name) {
    const char* v = std::getenv(name);
    if (v) value_ = v;
    had_ = v != nullptr;
  }
  ~SavedEnvironment() {
    if (had_) {
      setenv(name_, value_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string value_;
  bool had_ = false;
};

// A lever read from the environment when a backend is built (lever_on reads it, set switches
// it): with the variable set, a new backend has the lever on; unset, off; a backend built
// before keeps what it read; the setter switches it afterwards. The variable is put back.
inline void expect_environment_switches_lever(
    const char* var, const std::function<bool(const CudaBackend&)>& lever_on,
    const std::function<void(CudaBackend&, bool)>& set) {
  const SavedEnvironment saved(var);
  ASSERT_EQ(unsetenv(var), 0);
  CudaBackend before(0);
  EXPECT_FALSE(lever_on(before)) << var << " unset";
  ASSERT_EQ(setenv(var, "1", 1), 0);
  CudaBackend with(0);
  ASSERT_EQ(unsetenv(var), 0);
  EXPECT_TRUE(lever_on(with)) << var << "=1";
  EXPECT_FALSE(lever_on(before)) << "a backend built before " << var << " was set";
  CudaBackend after(0);
  EXPECT_FALSE(lever_on(after)) << var << " unset again";
  set(with, false);
  EXPECT_FALSE(lever_on(with)) << "the setter";
  set(after, true);
  EXPECT_TRUE(lever_on(after)) << "the setter";
}

}  // namespace attnres::test
