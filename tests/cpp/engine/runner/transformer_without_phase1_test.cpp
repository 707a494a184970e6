// The forward skips Phase 1 for a depth group whose shared prefix is one bank entry, where the
// backend mixes without a Phase-1 state (Backend::mixes_without_phase1, the CPU's): each step
// of such a group reads the entry as its first newer source instead. The logits must be those
// of the forward that runs Phase 1 over that entry, bit for bit, in every mode and with either
// bank dtype, and the skip must really happen (fewer Phase-1 calls) wherever a mode has such
// a group.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/transformer_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres {
namespace {

// The CPU backend counting its Phase-1 calls, optionally claiming it cannot mix without a
// Phase-1 state (what a backend without the stateless Phase 2 answers).
class Phase1CountingBackend : public CpuBackend {
 public:
  explicit Phase1CountingBackend(bool without_phase1) : CpuBackend(2) {
    capabilities_.mixes_without_phase1 = without_phase1;
  }
  int phase1_calls = 0;

  const BackendCapabilities& capabilities() const override { return capabilities_; }
  void depth_phase1_impl(const Tensor& queries, const Tensor& bank, int n, float eps, Tensor& m,
                         Tensor& s, Tensor& o, const Tensor* source_gate_logits) override {
    ++phase1_calls;
    CpuBackend::depth_phase1_impl(queries, bank, n, eps, m, s, o, source_gate_logits);
  }

 private:
  BackendCapabilities capabilities_ = cpu_backend_capabilities();
};

struct Case {
  const char* mode;
  const char* gate;
  bool null_source;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.mode << " gate " << c.gate << (c.null_source ? " null source" : "");
}

class TransformerWithoutPhase1 : public ::testing::TestWithParam<std::tuple<Case, DType>> {};

TEST_P(TransformerWithoutPhase1, SameLogitsAsPhaseOneOverTheEntry) {
  const auto [c, bank_dtype] = GetParam();
  const ModelConfig config = test::tp_test_config(c.mode, c.gate, c.null_source);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 31, false});
  const int block_size = 4, n = 11, prefill = 8;
  const std::vector<int32_t> ids = test::random_ids(n, config.vocab_size, 5);
  const int blocks = (n + block_size - 1) / block_size;

  std::vector<float> logits[2];
  int phase1_calls[2] = {};
  for (int skip = 0; skip < 2; ++skip) {
    Phase1CountingBackend backend(skip == 1);
    Transformer model(config, weights, backend, {}, bank_dtype);
    TransformerRunner runner(model, blocks, block_size);
    logits[skip] = test::run_prefill_then_decode(runner, ids, prefill, block_size);
    phase1_calls[skip] = backend.phase1_calls;
  }
  EXPECT_EQ(logits[1], logits[0]);
  if (std::string(c.mode) == "pre_gated") {  // its groups gate their sources in Phase 1
    EXPECT_EQ(phase1_calls[1], phase1_calls[0]);
  } else {
    EXPECT_LT(phase1_calls[1], phase1_calls[0]) << "no group was skipped";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TransformerWithoutPhase1,
    ::testing::Combine(::testing::Values(Case{"block", "bias", false}, Case{"full", "bias", false},
                                         Case{"delta", "sigmoid_vector", true},
                                         Case{"delta_block", "sigmoid_scalar", true},
                                         Case{"delta_v", "sigmoid_vector", true},
                                         Case{"first_layer", "bias", false},
                                         Case{"pre_gated", "bias", false}),
                       ::testing::Values(DType::F32, DType::BF16)),
    [](const auto& info) {
      const Case& c = std::get<0>(info.param);
      return std::string(c.mode) + "_" + (c.null_source ? "null_" : "") + c.gate + "_" +
             (std::get<1>(info.param) == DType::BF16 ? "bf16" : "f32");
    });

}  // namespace
}  // namespace attnres
