// The Transformer keeps its depth bank and Phase-1 buffers across forwards (DepthBank,
// engine/model/depth_bank.h): a later, smaller step reads a bank that still holds an earlier
// step's values. Every mode must give bit for bit the logits of a fresh model, which fails if any
// step read a bank entry or Phase-1 row it had not written first (delta_block's open entry
// summing into an old value, say). With a bf16 bank too.
#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/transformer_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres {
namespace {

using test::random_ids;
using test::run_prefill_then_decode;

struct Mode {
  const char* name;
  const char* mode;
  const char* gate;
  bool null_source;
  bool final_mix;
};

// Every mode, with an f32 and a bf16 bank (whose delta_block open entry is its own f32 buffer).
class DepthWorkspace : public ::testing::TestWithParam<std::tuple<Mode, DType>> {};

TEST_P(DepthWorkspace, AStepAfterALargerOneMatchesAFreshModel) {
  const Mode m = std::get<0>(GetParam());
  const DType bank_dtype = std::get<1>(GetParam());
  const ModelConfig config = test::tp_test_config(m.mode, m.gate, m.null_source);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 17, m.final_mix});
  const int block_size = 16;
  const std::vector<int32_t> first = random_ids(40, config.vocab_size, 3);
  const std::vector<int32_t> second = random_ids(12, config.vocab_size, 4);

  auto fresh_backend = make_cpu_backend(1);
  Transformer fresh(config, weights, *fresh_backend, {}, bank_dtype);
  TransformerRunner fresh_runner(fresh, 1, block_size);
  const std::vector<float> want = run_prefill_then_decode(fresh_runner, second, 9, block_size);

  auto backend = make_cpu_backend(1);
  Transformer reused(config, weights, *backend, {}, bank_dtype);
  TransformerRunner earlier(reused, 3, block_size);
  run_prefill_then_decode(earlier, first, 37, block_size);  // fills the kept buffers
  TransformerRunner later(reused, 1, block_size);
  const std::vector<float> got = run_prefill_then_decode(later, second, 9, block_size);
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(
    EveryMode, DepthWorkspace,
    ::testing::Combine(::testing::Values(Mode{"block", "block", "bias", false, false},
                                         Mode{"block_final_mix", "block", "bias", false, true},
                                         Mode{"full", "full", "bias", false, false},
                                         Mode{"delta", "delta", "bias", true, false},
                                         Mode{"delta_block", "delta_block", "sigmoid_scalar", true,
                                              false},
                                         Mode{"delta_v", "delta_v", "sigmoid_vector", true, false},
                                         Mode{"first_layer", "first_layer", "bias", false, false},
                                         Mode{"pre_gated", "pre_gated", "bias", false, false}),
                       ::testing::Values(DType::F32, DType::BF16)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) +
             (std::get<1>(info.param) == DType::BF16 ? "_bf16_bank" : "");
    });

// A backend whose depth ops read an f32 bank only: the Transformer refuses a bf16 one.
class F32BankBackend : public CpuBackend {
 public:
  F32BankBackend() : CpuBackend(1) { capabilities_.depth_bank_dtypes = {DType::F32}; }
  const BackendCapabilities& capabilities() const override { return capabilities_; }

 private:
  BackendCapabilities capabilities_ = cpu_backend_capabilities();
};

TEST(DepthBankDtype, ABackendWithoutABf16BankIsRefused) {
  const ModelConfig config = test::tp_test_config("full", "bias", false);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 17, false});
  F32BankBackend backend;
  try {
    Transformer model(config, weights, backend, {}, DType::BF16);
    FAIL() << "a bf16 bank on a backend that reads f32 only";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--depth-bank-dtype bfloat16"), std::string::npos)
        << e.what();
  }
  Transformer model(config, weights, backend, {}, DType::F32);
  EXPECT_EQ(model.depth_bank_dtype(), DType::F32);
}

}  // namespace
}  // namespace attnres
