// The residual add as the sublayer's last linear's epilogue (Backend::linear_residual): the
// Transformer calls it exactly where the sublayer output is read only through that add, for
// every AttnRes mode, and never under tensor parallelism (the output is summed over the
// ranks first). Which sublayers fuse is written out by hand per mode below, from the modes'
// definitions (docs/ATTNRES.md §2), not read back from the depth plan. And the default op (the
// CPU's) gives the bits of linear followed by the add, the bias added before the residual;
// linear_residual_push's default those of linear_residual then copy into the entry.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

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

// The CPU backend, recording which weights went through linear and which through
// linear_residual (CPU weights are the host tensors themselves: identified by pointer).
class EpilogueRecordingBackend : public CpuBackend {
 public:
  // fuses: what capabilities().fuses_linear_residual says (true: as CUDA's; the CpuBackend's is
  // false).
  explicit EpilogueRecordingBackend(bool fuses = true) : CpuBackend(1) {
    capabilities_.fuses_linear_residual = fuses;
  }
  const BackendCapabilities& capabilities() const override { return capabilities_; }
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    ++plain[w.data];
    CpuBackend::linear_impl(x, w, bias, out);
  }
  void linear_residual_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                            const Tensor& residual, Tensor& out) override {
    ++fused[w.data];
    if (out.data == residual.data) ++in_place;
    ++fused_total;
    // The default below calls linear() for its own product: not a plain call of the forward.
    --plain[w.data];
    CpuBackend::linear_residual_impl(x, w, bias, residual, out);
  }
  std::map<const void*, int> plain, fused;
  int in_place = 0;
  std::atomic<int> fused_total{0};

 private:
  BackendCapabilities capabilities_ = cpu_backend_capabilities();
};

struct Mode {
  const char* name;
  const char* mode;  // attnres_mode, "" for a plain qwen3
  const char* gate;
  bool null_source;
  bool final_mix;
  // Per layer of tp_test_config's 4 (2 blocks of 2 layers): whether attention's o_proj and
  // the MLP's down_proj add the residual in their epilogue.
  std::vector<std::pair<bool, bool>> fused;
};

constexpr std::pair<bool, bool> kBoth{true, true}, kNeither{false, false};

// Why each table reads as it does:
// - plain, block, full: the output only ever enters the partial (block and full push the
//   *sum*, which the fused op writes straight into the bank entry): every sublayer fuses.
// - delta, delta_v, pre_gated: every output is itself a bank entry, except the last one,
//   which no later mix reads (its push is dropped): only layer 3's MLP fuses.
// - delta_block: layers 0-1 add their outputs into the open entry that becomes block 0's
//   delta; block 1's delta is never read, so layers 2-3 only add to the partial.
// - first_layer: layer 0's MLP output is the bank's entry 1; everything else fuses.
std::vector<Mode> modes() {
  const std::vector<std::pair<bool, bool>> all(4, kBoth);
  const std::vector<std::pair<bool, bool>> last_mlp = {kNeither, kNeither, kNeither, {false, true}};
  return {
      {"plain", "", "bias", false, false, all},
      {"block", "block", "bias", false, false, all},
      {"block_final_mix", "block", "bias", false, true, all},
      {"full", "full", "bias", false, false, all},
      {"full_sigmoid_vector", "full", "sigmoid_vector", false, false, all},
      {"delta", "delta", "bias", true, false, last_mlp},
      {"delta_v", "delta_v", "sigmoid_vector", true, false, last_mlp},
      {"pre_gated", "pre_gated", "bias", false, false, last_mlp},
      {"delta_block",
       "delta_block",
       "sigmoid_scalar",
       true,
       false,
       {kNeither, kNeither, kBoth, kBoth}},
      {"first_layer", "first_layer", "bias", false, false, {{true, false}, kBoth, kBoth, kBoth}},
  };
}

class ResidualEpilogue : public ::testing::TestWithParam<std::tuple<Mode, DType>> {};

TEST_P(ResidualEpilogue, FusedExactlyWhereTheOutputOnlyEntersThePartial) {
  const Mode m = std::get<0>(GetParam());
  const DType bank_dtype = std::get<1>(GetParam());
  if (m.mode[0] == '\0' && bank_dtype != DType::F32) GTEST_SKIP() << "a plain model has no bank";
  const ModelConfig config = test::tp_test_config(m.mode, m.gate, m.null_source);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 23, m.final_mix});
  ASSERT_EQ(weights.layers.size(), m.fused.size());
  const int block_size = 16, n = 12, prefill = 9;  // a prefill step, then 3 decode steps
  const int forwards = 1 + (n - prefill);

  EpilogueRecordingBackend backend;
  Transformer model(config, weights, backend, {}, bank_dtype);
  TransformerRunner runner(model, 1, block_size);
  run_prefill_then_decode(runner, random_ids(n, config.vocab_size, 8), prefill, block_size);

  int expected_fused = 0;
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const auto [attn, mlp] = m.fused[l];
    for (const auto& [w, fused] : {std::pair{weights.layers[l].o_proj.data, attn},
                                   std::pair{weights.layers[l].down_proj.data, mlp}}) {
      const std::string where = "layer " + std::to_string(l) +
                                (w == weights.layers[l].o_proj.data ? " o_proj" : " down_proj");
      EXPECT_EQ(backend.fused[w], fused ? forwards : 0) << where;
      EXPECT_EQ(backend.plain[w], fused ? 0 : forwards) << where;
      expected_fused += fused ? forwards : 0;
    }
  }
  // Every fused call is one of the above (no other weight), and adds into the partial in
  // place unless it writes the pushed sum straight into an f32 bank (block's block ends,
  // full's every sublayer).
  EXPECT_EQ(backend.fused_total.load(), expected_fused);
  const bool sums_into_bank =
      bank_dtype == DType::F32 && (std::string(m.mode) == "full" || std::string(m.mode) == "block");
  if (!sums_into_bank) {
    EXPECT_EQ(backend.in_place, expected_fused);
  }
  if (std::string(m.mode) == "full" && bank_dtype == DType::F32) {
    // Every sum is a bank entry but the last sublayer's, which no mix reads (its push is
    // dropped): that one adds into the partial.
    EXPECT_EQ(backend.in_place, forwards);
  }
}

// A backend whose linear_residual fuses nothing (the CPU's) keeps the separate ops: the
// default would need a scratch per sublayer.
TEST(ResidualEpilogueUnfusedBackend, KeepsLinearThenAdd) {
  EXPECT_FALSE(CpuBackend(1).capabilities().fuses_linear_residual);
  const ModelConfig config = test::tp_test_config("block");
  const ModelWeights weights = make_random_weights(config, {DType::F32, 23, false});
  const int block_size = 16, n = 12, prefill = 9;
  EpilogueRecordingBackend backend(/*fuses=*/false);
  Transformer model(config, weights, backend, {}, DType::F32);
  TransformerRunner runner(model, 1, block_size);
  run_prefill_then_decode(runner, random_ids(n, config.vocab_size, 8), prefill, block_size);
  EXPECT_EQ(backend.fused_total.load(), 0);
  EXPECT_EQ(backend.plain[weights.layers[0].o_proj.data], 1 + (n - prefill));
}

INSTANTIATE_TEST_SUITE_P(EveryMode, ResidualEpilogue,
                         ::testing::Combine(::testing::ValuesIn(modes()),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) +
                                  (std::get<1>(info.param) == DType::BF16 ? "_bf16_bank" : "");
                         });

// Tensor parallelism sums each rank's partial output first (all-reduce, or reduce-scatter
// under sequence parallelism): no rank may add the residual into its own share.
TEST(ResidualEpilogueTensorParallel, NeverFusedAcrossRanks) {
  for (const char* mode : {"", "block", "full", "delta"}) {
    const ModelConfig config = test::tp_test_config(mode);
    const ModelWeights weights = make_random_weights(config, {DType::F32, 29, false});
    const int block_size = 16, n = 12;
    for (int sp : {0, 1}) {
      std::atomic<int> fused{0}, backends{0};
      TensorParallelOptions options = test::cpu_tensor_parallel_options(2, 1, block_size, sp);
      std::vector<EpilogueRecordingBackend*> ranks(2);
      options.make_backend = [&](int rank) {
        auto b = std::make_unique<EpilogueRecordingBackend>();
        ranks[rank] = b.get();
        ++backends;
        return std::unique_ptr<Backend>(std::move(b));
      };
      {
        TensorParallelRunner tp(config, weights, options);
        run_prefill_then_decode(tp, random_ids(n, config.vocab_size, 9), 9, block_size);
        for (EpilogueRecordingBackend* b : ranks) fused += b->fused_total.load();
      }
      EXPECT_EQ(backends.load(), 2);
      EXPECT_EQ(fused.load(), 0) << "mode '" << mode << "' sequence-parallel " << sp;
    }
  }
}

// The default op: linear into the out (or, in place, into a scratch), then the add, so
// out[r, o] = (x[r] . w[o] + bias[o]) + residual[r, o] with the CPU linear's own bits.
TEST(ResidualEpilogueDefault, IsTheLinearThenTheAddBitForBit) {
  CpuBackend backend(1);
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random = [&](const Shape& shape) {
    Tensor t = backend.alloc(shape, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = u(rng);
    return t;
  };
  for (int64_t rows : {1, 3, 8, 13}) {
    const int64_t K = 96, N = 64;
    const Tensor x = random({rows, K}), w = random({N, K}), bias = random({N});
    const Tensor residual = random({rows, N});
    Tensor y = backend.alloc({rows, N}, DType::F32);
    backend.linear(x, w, &bias, y);
    std::vector<float> want(residual.numel());
    for (int64_t i = 0; i < residual.numel(); ++i) {
      want[i] = y.ptr<float>()[i] + residual.ptr<float>()[i];
    }
    Tensor apart = backend.alloc({rows, N}, DType::F32);
    backend.linear_residual(x, w, &bias, residual, apart);
    Tensor in_place = backend.alloc({rows, N}, DType::F32);
    backend.copy(residual, in_place);
    backend.linear_residual(x, w, &bias, in_place, in_place);
    for (int64_t i = 0; i < residual.numel(); ++i) {
      ASSERT_EQ(apart.ptr<float>()[i], want[i]) << "rows " << rows << " element " << i;
      ASSERT_EQ(in_place.ptr<float>()[i], want[i]) << "rows " << rows << " element " << i;
    }
  }
}

// linear_residual_push's default: linear_residual, then copy() into the entry (bf16: rounded
// as f32_to_bf16; f32: the same bits), out and the entry bit for bit, out in place or apart.
TEST(ResidualEpilogueDefault, PushIsTheLinearResidualThenTheCopy) {
  CpuBackend backend(1);
  std::mt19937 rng(37);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random = [&](const Shape& shape) {
    Tensor t = backend.alloc(shape, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = u(rng);
    return t;
  };
  for (DType entry_dtype : {DType::BF16, DType::F32}) {
    for (int64_t rows : {1, 3, 8, 13}) {
      const int64_t K = 96, N = 64;
      const Tensor x = random({rows, K}), w = random({N, K}), bias = random({N});
      const Tensor residual = random({rows, N});
      Tensor want = backend.alloc({rows, N}, DType::F32);
      backend.linear_residual(x, w, &bias, residual, want);
      Tensor want_entry = backend.alloc({rows, N}, entry_dtype);
      backend.copy(want, want_entry);
      for (bool in_place : {false, true}) {
        Tensor out = backend.alloc({rows, N}, DType::F32);
        if (in_place) backend.copy(residual, out);
        Tensor entry = backend.alloc({rows, N}, entry_dtype);
        backend.linear_residual_push(x, w, &bias, in_place ? out : residual, out, entry);
        const std::string where = std::string(dtype_name(entry_dtype)) + " rows " +
                                  std::to_string(rows) + (in_place ? " in place" : "");
        EXPECT_EQ(std::memcmp(out.data, want.data, want.nbytes()), 0) << where;
        EXPECT_EQ(std::memcmp(entry.data, want_entry.data, want_entry.nbytes()), 0) << where;
      }
    }
  }
}

TEST(ResidualEpilogueDefault, PushRefusesOverlapsAndMismatches) {
  CpuBackend backend(1);
  const Tensor x = backend.alloc({2, 8}, DType::F32), w = backend.alloc({4, 8}, DType::F32);
  Tensor residual = backend.alloc({2, 4}, DType::F32);
  auto expect_error = [](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "accepted: " << words;
    } catch (const std::logic_error& e) {  // ATTNRES_CHECK: a caller's bug
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  Tensor both = backend.alloc({3, 4}, DType::F32);
  Tensor out = both.rows(0, 2), overlapping = both.rows(1, 3);
  expect_error([&] { backend.linear_residual_push(x, w, nullptr, residual, out, overlapping); },
               "entry must not overlap");
  expect_error([&] { backend.linear_residual_push(x, w, nullptr, out, out, out); },
               "entry must not overlap");
  Tensor wide = backend.alloc({2, 8}, DType::BF16);
  expect_error([&] { backend.linear_residual_push(x, w, nullptr, residual, out, wide); },
               "linear_residual_push entry");
  Tensor ints = backend.alloc({2, 4}, DType::I32);
  expect_error([&] { backend.linear_residual_push(x, w, nullptr, residual, out, ints); },
               "linear_residual_push entry");
  Tensor entry = backend.alloc({2, 4}, DType::BF16);
  Tensor narrow = backend.alloc({2, 2}, DType::F32);
  expect_error([&] { backend.linear_residual_push(x, w, nullptr, narrow, out, entry); },
               "one shape");  // linear_residual's own checks too
}

TEST(ResidualEpilogueDefault, RefusesOverlapsAndMismatches) {
  CpuBackend backend(1);
  const Tensor x = backend.alloc({2, 8}, DType::F32), w = backend.alloc({4, 8}, DType::F32);
  Tensor both = backend.alloc({3, 4}, DType::F32);
  Tensor residual = both.rows(0, 2), shifted = both.rows(1, 3);
  auto expect_error = [](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "accepted: " << words;
    } catch (const std::logic_error& e) {  // ATTNRES_CHECK: a caller's bug
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error([&] { backend.linear_residual(x, w, nullptr, residual, shifted); }, "not overlap");
  Tensor wide = backend.alloc({2, 8}, DType::F32);
  Tensor narrow = backend.alloc({2, 4}, DType::F32);
  expect_error([&] { backend.linear_residual(x, w, nullptr, wide, narrow); }, "one shape");
  Tensor x_as_out = backend.alloc({2, 8}, DType::F32);
  const Tensor w8 = backend.alloc({8, 8}, DType::F32);
  expect_error([&] { backend.linear_residual(x_as_out, w8, nullptr, x_as_out, x_as_out); },
               "x must not overlap");
}

}  // namespace
}  // namespace attnres
