// Where the Transformer calls the fused ops (Backend::qk_norm_rope_store, prenorm_linear_many,
// prenorm_linear_swiglu, prenorm_qkv_rope_store, prenorm_mlp_residual) and where it must not:
// the final norm (its rows are the LM head's input), delta_v's attention (two mixes feed q / k
// and v: one depth_phase2_prenorm_pair), sequence-parallel steps (the normed rows are
// all-gathered before the projections), and the whole MLP only where its residual add is fused
// (a backend with capabilities().fuses_linear_residual, the output entering the partial only)
// and it pushes no bank entry. And Backend::linear_residual_push: only the last linear before
// a bf16 bank's push_and_reset (block mode's last down projection of a block), with a backend
// that fuses the residual add. On the CPU the fused ops' defaults are the old calls, so the
// logits also stay those of the plain backend bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/tensor_parallel_runner.h"
#include "engine/runner/transformer_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres {
namespace {

// The CPU backend, counting the calls the forward makes to the ops below (not the calls a
// default makes inside another op: prenorm_linear_many's own depth_phase2_prenorm is not one).
class OpCountingBackend : public CpuBackend {
 public:
  // fuses_residual: what capabilities().fuses_linear_residual says (the CpuBackend's is false;
  // true as CUDA's, so that the forward calls linear_residual and linear_residual_push).
  explicit OpCountingBackend(bool fuses_residual = false) : CpuBackend(1) {
    capabilities_.fuses_linear_residual = fuses_residual;
  }
  std::map<std::string, int> calls;
  std::map<const void*, int> pushed_by;  // linear_residual_push's calls per weight

  const BackendCapabilities& capabilities() const override { return capabilities_; }
  void linear_residual_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                            const Tensor& residual, Tensor& out) override {
    Count c(*this, "linear_residual");
    CpuBackend::linear_residual_impl(x, w, bias, residual, out);
  }
  void linear_residual_push_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                                 const Tensor& residual, Tensor& out, Tensor& entry) override {
    Count c(*this, "linear_residual_push");
    if (depth_ == 1) ++pushed_by[w.data];
    CpuBackend::linear_residual_push_impl(x, w, bias, residual, out, entry);
  }

  void prenorm_mlp_residual_impl(const PrenormArgs& in, const Tensor& wg, const Tensor* bg,
                                 const Tensor& wu, const Tensor* bu, Tensor& gate, Tensor& up,
                                 Tensor& act, const Tensor& wd, const Tensor* bd,
                                 const Tensor& residual, Tensor& out) override {
    Count c(*this, "prenorm_mlp_residual");
    CpuBackend::prenorm_mlp_residual_impl(in, wg, bg, wu, bu, gate, up, act, wd, bd, residual,
                                          out);
  }

  void depth_phase2_prenorm_impl(const DepthMixArgs& mix, const Tensor& partial, const Tensor& gain,
                                 float eps, Tensor& out) override {
    Count c(*this, "depth_phase2_prenorm");
    CpuBackend::depth_phase2_prenorm_impl(mix, partial, gain, eps, out);
  }
  void depth_phase2_prenorm_pair_impl(const DepthMixArgs& a, const DepthMixArgs& b,
                                      const Tensor& partial, const Tensor& gain, float eps,
                                      Tensor& out_a, Tensor& out_b) override {
    Count c(*this, "depth_phase2_prenorm_pair");
    CpuBackend::depth_phase2_prenorm_pair_impl(a, b, partial, gain, eps, out_a, out_b);
  }
  void prenorm_linear_many_impl(const PrenormArgs& in, std::span<const LinearTarget> t) override {
    Count c(*this, "prenorm_linear_many");
    CpuBackend::prenorm_linear_many_impl(in, t);
  }
  void prenorm_linear_swiglu_impl(const PrenormArgs& in, const Tensor& wg, const Tensor* bg,
                                  const Tensor& wu, const Tensor* bu, Tensor& gate, Tensor& up,
                                  Tensor& out) override {
    Count c(*this, "prenorm_linear_swiglu");
    CpuBackend::prenorm_linear_swiglu_impl(in, wg, bg, wu, bu, gate, up, out);
  }
  void linear_many_impl(const Tensor& x, std::span<const LinearTarget> t) override {
    Count c(*this, "linear_many");
    CpuBackend::linear_many_impl(x, t);
  }
  void linear_swiglu_impl(const Tensor& x, const Tensor& wg, const Tensor* bg, const Tensor& wu,
                          const Tensor* bu, Tensor& gate, Tensor& up, Tensor& out) override {
    Count c(*this, "linear_swiglu");
    CpuBackend::linear_swiglu_impl(x, wg, bg, wu, bu, gate, up, out);
  }
  void qk_norm_rope_impl(Tensor& q, Tensor& k, int hd, const Tensor* qg, const Tensor* kg,
                         float eps, const Tensor& inv_freq, const BatchMeta& batch) override {
    Count c(*this, "qk_norm_rope");
    CpuBackend::qk_norm_rope_impl(q, k, hd, qg, kg, eps, inv_freq, batch);
  }
  void store_kv_impl(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                     KvCacheLayer& cache) override {
    Count c(*this, "store_kv");
    CpuBackend::store_kv_impl(k, v, batch, cache);
  }
  void prenorm_qkv_rope_store_impl(const PrenormArgs& in, std::span<const LinearTarget, 3> qkv,
                                   const RopeStoreArgs& rope) override {
    Count c(*this, "prenorm_qkv_rope_store");
    CpuBackend::prenorm_qkv_rope_store_impl(in, qkv, rope);
  }
  void qk_norm_rope_store_impl(Tensor& q, Tensor& k, const Tensor& v, int hd, const Tensor* qg,
                               const Tensor* kg, float eps, const Tensor& inv_freq,
                               const BatchMeta& batch, KvCacheLayer& cache) override {
    Count c(*this, "qk_norm_rope_store");
    CpuBackend::qk_norm_rope_store_impl(q, k, v, hd, qg, kg, eps, inv_freq, batch, cache);
  }

 private:
  struct Count {
    Count(OpCountingBackend& b, const char* name) : backend(b) {
      if (backend.depth_++ == 0) ++backend.calls[name];
    }
    ~Count() { --backend.depth_; }
    OpCountingBackend& backend;
  };
  int depth_ = 0;
  BackendCapabilities capabilities_ = cpu_backend_capabilities();
};

// The calls one step makes: per layer, the fused projections unless the step reads its normed
// rows again (an attention step's with RoPE and the KV store); the final norm alone. `fused`:
// whether the step may fuse (not sequence-parallel). `fuses_residual`: the backend's
// capabilities().fuses_linear_residual (no tensor parallelism): a sublayer whose output only
// enters the partial (DepthBank::output_slot: not pushed as itself, not accumulated) adds it
// in its last linear, and an MLP whose halves are adjacent (no push-and-reset between) then
// runs whole.
std::map<std::string, int> expected_calls(const DepthPlan& plan, bool fused,
                                          bool fuses_residual = false) {
  std::map<std::string, int> want;
  for (const DepthStep& step : plan.steps) {
    const bool residual =
        fuses_residual && fused && !step.push_output_after && !step.accumulate_output;
    if (step.kind == SublayerKind::Final) {
      ++want["depth_phase2_prenorm"];
    } else if (step.kind == SublayerKind::Mlp) {
      if (residual && !step.push_and_reset_after_mix) {
        ++want["prenorm_mlp_residual"];
        continue;
      }
      ++want[fused ? "prenorm_linear_swiglu" : "linear_swiglu"];
      if (!fused) ++want["depth_phase2_prenorm"];
      if (residual) ++want["linear_residual"];
    } else {
      if (residual) ++want["linear_residual"];
      const bool value_stream = step.value_slot >= 0;
      if (fused && !value_stream) {
        ++want["prenorm_qkv_rope_store"];
      } else {
        ++want["linear_many"];
        // delta_v: both streams in one call
        ++want[value_stream ? "depth_phase2_prenorm_pair" : "depth_phase2_prenorm"];
        ++want["qk_norm_rope_store"];
      }
    }
  }
  return want;
}

std::map<std::string, int> times(std::map<std::string, int> calls, int n) {
  for (auto& [name, count] : calls) count *= n;
  return calls;
}

class TransformerFusedOps : public ::testing::TestWithParam<const char*> {};

// Every step of a plain run (prefill, then decode steps) fuses, bar delta_v's attention and
// the final norm; the logits equal a plain CPU backend's bit for bit.
TEST_P(TransformerFusedOps, CalledWhereTheNormedRowsAreNotReadAgain) {
  const ModelConfig config = test::tp_test_config(GetParam());
  const ModelWeights weights = make_random_weights(config, {DType::F32, 21, false});
  const int block_size = 4, n = 11, prefill = 8;
  const std::vector<int32_t> ids = test::random_ids(n, config.vocab_size, 3);
  const int blocks = (n + block_size - 1) / block_size;

  auto plain_backend = make_cpu_backend(1);
  Transformer plain(config, weights, *plain_backend);
  TransformerRunner plain_runner(plain, blocks, block_size);
  const std::vector<float> want =
      test::run_prefill_then_decode(plain_runner, ids, prefill, block_size);

  OpCountingBackend counting;
  Transformer model(config, weights, counting);
  TransformerRunner runner(model, blocks, block_size);
  const std::vector<float> got = test::run_prefill_then_decode(runner, ids, prefill, block_size);
  EXPECT_EQ(got, want);
  const int steps = 1 + n - prefill;
  EXPECT_EQ(counting.calls, times(expected_calls(model.plan(), true), steps));
  if (std::string(GetParam()) == "delta_v") {  // the fallback is exercised, not vacuous
    EXPECT_GT(counting.calls["linear_many"], 0);
  }
}

// A backend that fuses the residual add (as CUDA does): every MLP sublayer whose output only
// enters the partial runs whole (prenorm_mlp_residual), the others keep prenorm_linear_swiglu
// and their own last linear; the logits stay the plain CPU backend's bit for bit. The delta
// modes push most outputs as themselves, first_layer its first MLP's: those keep the halves.
TEST_P(TransformerFusedOps, WholeMlpWhereTheResidualAddIsFused) {
  const ModelConfig config = test::tp_test_config(GetParam());
  const ModelWeights weights = make_random_weights(config, {DType::F32, 24, false});
  const int block_size = 4, n = 11, prefill = 8;
  const std::vector<int32_t> ids = test::random_ids(n, config.vocab_size, 5);
  const int blocks = (n + block_size - 1) / block_size;

  auto plain_backend = make_cpu_backend(1);
  Transformer plain(config, weights, *plain_backend);
  TransformerRunner plain_runner(plain, blocks, block_size);
  const std::vector<float> want =
      test::run_prefill_then_decode(plain_runner, ids, prefill, block_size);

  OpCountingBackend counting(/*fuses_residual=*/true);
  Transformer model(config, weights, counting);
  TransformerRunner runner(model, blocks, block_size);
  const std::vector<float> got = test::run_prefill_then_decode(runner, ids, prefill, block_size);
  EXPECT_EQ(got, want);
  const int steps = 1 + n - prefill;
  EXPECT_EQ(counting.calls, times(expected_calls(model.plan(), true, true), steps));
  // Not vacuous: every mode has an MLP that runs whole (the delta modes' last one, whose push
  // is dropped), and the delta modes MLPs that do not.
  EXPECT_GT(counting.calls["prenorm_mlp_residual"], 0);
  const std::string mode = GetParam();
  if (mode == "delta" || mode == "delta_v" || mode == "first_layer") {
    EXPECT_GT(counting.calls["prenorm_linear_swiglu"], 0);
  }
  if (mode.empty() || mode == "block") {  // every MLP whole: none of its halves alone
    EXPECT_EQ(counting.calls.count("prenorm_linear_swiglu"), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, TransformerFusedOps,
                         ::testing::Values("", "block", "full", "delta", "delta_v",
                                           "first_layer"),
                         [](const auto& info) {
                           const std::string mode = info.param;
                           return mode.empty() ? std::string("plain") : mode;
                         });

// Tensor parallelism: a sequence-parallel step (the prefill) gathers its normed rows before the
// projections, so it takes the unfused calls; the decode steps (not sharded) fuse.
TEST(TransformerFusedOpsParallel, SequenceParallelStepsTakeTheUnfusedCalls) {
  const ModelConfig config = test::tp_test_config("block");
  const ModelWeights weights = make_random_weights(config, {DType::F32, 22, false});
  const int block_size = 4, n = 10, prefill = 8, P = 2;
  const std::vector<int32_t> ids = test::random_ids(n, config.vocab_size, 4);
  const int blocks = (n + block_size - 1) / block_size;
  TensorParallelOptions options = test::cpu_tensor_parallel_options(P, blocks, block_size, 2);
  std::vector<OpCountingBackend*> ranks(P, nullptr);
  options.make_backend = [&ranks](int rank) {
    auto backend = std::make_unique<OpCountingBackend>();
    ranks[rank] = backend.get();
    return std::unique_ptr<Backend>(std::move(backend));
  };
  TensorParallelRunner tp(config, weights, options);
  test::run_prefill_then_decode(tp, ids, prefill, block_size);
  const DepthPlan& plan = tp.rank_model(0).plan();
  std::map<std::string, int> want = expected_calls(plan, false);  // the sharded prefill
  for (const auto& [name, count] : times(expected_calls(plan, true), n - prefill)) {
    want[name] += count;
  }
  for (int r = 0; r < P; ++r) {
    ASSERT_NE(ranks[r], nullptr);
    EXPECT_EQ(ranks[r]->calls, want) << "rank " << r;
    EXPECT_GT(ranks[r]->calls["linear_many"], 0) << "rank " << r << ": no sharded step";
  }
}

// Host tensors of uniform values in [-1, 1).
Tensor random_tensor(const Shape& shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = dist(rng);
  return t;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape, t.dtype);
  std::memcpy(c.data, t.data, t.nbytes());
  return c;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// The default prenorm_mlp_residual: prenorm_linear_swiglu then linear_residual, bit for bit,
// with out apart and with out the residual and the partial itself (the forward's case); and
// the checks of both ops, with out refused over the input half's scratch.
TEST(PrenormMlpResidualDefault, IsTheTwoOpsBitForBit) {
  CpuBackend cpu(1);
  std::mt19937 rng(31);
  const int64_t rows = 3, d = 16, ffn = 24;
  const Tensor partial = random_tensor({rows, d}, rng), gain = random_tensor({d}, rng);
  const Tensor wg = random_tensor({ffn, d}, rng), bg = random_tensor({ffn}, rng);
  const Tensor wu = random_tensor({ffn, d}, rng), bu = random_tensor({ffn}, rng);
  const Tensor wd = random_tensor({d, ffn}, rng), bd = random_tensor({d}, rng);
  const Tensor residual = random_tensor({rows, d}, rng);
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "out apart");
    Tensor want_partial = copy_of(partial), got_partial = copy_of(partial);
    Tensor normed = Tensor::empty({rows, d}, DType::F32);
    Tensor gate = Tensor::empty({rows, ffn}, DType::F32), up = Tensor::empty({rows, ffn}, DType::F32);
    Tensor act = Tensor::empty({rows, ffn}, DType::F32);
    Backend::PrenormArgs in;
    in.gain = &gain;
    in.normed = &normed;
    // The two ops.
    in.partial = &want_partial;
    Tensor want = in_place ? want_partial : Tensor::empty({rows, d}, DType::F32);
    cpu.prenorm_linear_swiglu(in, wg, &bg, wu, &bu, gate, up, act);
    cpu.linear_residual(act, wd, &bd, in_place ? want_partial : residual, want);
    // The one op.
    in.partial = &got_partial;
    Tensor got = in_place ? got_partial : Tensor::empty({rows, d}, DType::F32);
    cpu.prenorm_mlp_residual(in, wg, &bg, wu, &bu, gate, up, act, wd, &bd,
                             in_place ? got_partial : residual, got);
    EXPECT_TRUE(same_bits(got, want));
    // Refused: out over act (the down projection's x), the normed or gate scratch, or
    // neither the residual nor apart from it.
    for (Tensor* bad : {&act, &normed, &gate}) {
      Tensor over = bad->reshape({bad->numel()}).rows(0, rows * d).reshape({rows, d});
      EXPECT_THROW(cpu.prenorm_mlp_residual(in, wg, &bg, wu, &bu, gate, up, act, wd, &bd,
                                            residual, over),
                   std::logic_error);
    }
    Tensor shifted = Tensor::empty({rows + 1, d}, DType::F32);
    Tensor res_view = shifted.rows(0, rows), out_view = shifted.rows(1, rows + 1);
    EXPECT_THROW(cpu.prenorm_mlp_residual(in, wg, &bg, wu, &bu, gate, up, act, wd, &bd, res_view,
                                          out_view),
                 std::logic_error);
  }
}

// linear_residual_push: called for exactly the last linear before each push_and_reset of a
// bf16 bank (block mode with the final mix, 2b's block sums with reset; tp_test_config's 2
// blocks of 2 layers: layer 1's down projection, once per forward), never in another mode
// (block without the final mix pushes 2a's snapshots after the add), with an f32 bank, or where
// the backend does not fuse the residual add; the other fused residual adds stay
// linear_residual. The logits equal the plain CPU backend's (no fused residual add, no push in
// the linear) bit for bit.
struct BankPushCase {
  const char* name;
  const char* mode;
  bool final_mix;
  DType bank_dtype;
  bool fuses;
};

class TransformerBankPush : public ::testing::TestWithParam<BankPushCase> {};

TEST_P(TransformerBankPush, PushedByTheLastLinearBeforeABf16BlockBoundary) {
  const BankPushCase c = GetParam();
  const ModelConfig config = test::tp_test_config(c.mode);
  const ModelWeights weights = make_random_weights(config, {DType::F32, 24, c.final_mix});
  const int block_size = 4, n = 11, prefill = 8;
  const std::vector<int32_t> ids = test::random_ids(n, config.vocab_size, 5);
  const int blocks = (n + block_size - 1) / block_size;
  const int forwards = 1 + n - prefill;

  auto plain_backend = make_cpu_backend(1);
  Transformer plain(config, weights, *plain_backend, {}, c.bank_dtype);
  TransformerRunner plain_runner(plain, blocks, block_size);
  const std::vector<float> want =
      test::run_prefill_then_decode(plain_runner, ids, prefill, block_size);

  OpCountingBackend counting(c.fuses);
  Transformer model(config, weights, counting, {}, c.bank_dtype);
  TransformerRunner runner(model, blocks, block_size);
  const std::vector<float> got = test::run_prefill_then_decode(runner, ids, prefill, block_size);
  EXPECT_EQ(got, want);

  const bool resetting = std::string(c.mode) == "block" && c.final_mix;
  const bool pushes = resetting && c.bank_dtype == DType::BF16 && c.fuses;
  // The plan's block boundaries, read back: one, at layer 2's attention (not a vacuous test).
  int resets = 0;
  for (const DepthStep& step : model.plan().steps) resets += step.push_and_reset_after_mix;
  EXPECT_EQ(resets, resetting ? 1 : 0);
  std::map<const void*, int> want_pushed;
  if (pushes) want_pushed[weights.layers[1].down_proj.data] = forwards;
  EXPECT_EQ(counting.pushed_by, want_pushed);
  EXPECT_EQ(counting.calls["linear_residual_push"], pushes ? forwards : 0);
  if (c.fuses) {  // every sublayer of these modes fuses its residual add, one way or the other
    const int sublayers = 2 * static_cast<int>(weights.layers.size());
    // The whole-MLP op fuses it too (its default calls linear_residual inside, uncounted).
    EXPECT_EQ(counting.calls["linear_residual"] + counting.calls["linear_residual_push"] +
                  counting.calls["prenorm_mlp_residual"],
              sublayers * forwards);
    // The MLP whose down projection pushes the entry runs in two ops, not the whole-MLP one.
    EXPECT_EQ(counting.calls["prenorm_mlp_residual"],
              (static_cast<int>(weights.layers.size()) - (pushes ? 1 : 0)) * forwards);
  } else {
    EXPECT_EQ(counting.calls["linear_residual"], 0);
    EXPECT_EQ(counting.calls["prenorm_mlp_residual"], 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TransformerBankPush,
    ::testing::Values(
        BankPushCase{"block_final_mix_bf16_bank", "block", true, DType::BF16, true},
        BankPushCase{"block_final_mix_f32_bank", "block", true, DType::F32, true},
        BankPushCase{"block_final_mix_bf16_bank_unfused", "block", true, DType::BF16, false},
        BankPushCase{"block_bf16_bank", "block", false, DType::BF16, true},
        BankPushCase{"full_bf16_bank", "full", false, DType::BF16, true},
        BankPushCase{"plain", "", false, DType::F32, true}),
    [](const auto& info) { return std::string(info.param.name); });

// Tensor parallelism sums each rank's output before the residual add: no rank pushes from its
// linear, and the sequence-parallel prefill's bank gets its entry by copy as before.
TEST(TransformerBankPushParallel, NeverUnderTensorParallelism) {
  const ModelConfig config = test::tp_test_config("block");
  const ModelWeights weights = make_random_weights(config, {DType::F32, 25, true});
  const int block_size = 4, n = 10, prefill = 8, P = 2;
  const std::vector<int32_t> ids = test::random_ids(n, config.vocab_size, 6);
  const int blocks = (n + block_size - 1) / block_size;
  for (int sp : {0, 2}) {
    TensorParallelOptions options = test::cpu_tensor_parallel_options(P, blocks, block_size, sp);
    options.depth_bank_dtype = DType::BF16;
    std::vector<OpCountingBackend*> ranks(P, nullptr);
    options.make_backend = [&ranks](int rank) {
      auto backend = std::make_unique<OpCountingBackend>(/*fuses_residual=*/true);
      ranks[rank] = backend.get();
      return std::unique_ptr<Backend>(std::move(backend));
    };
    TensorParallelRunner tp(config, weights, options);
    test::run_prefill_then_decode(tp, ids, prefill, block_size);
    for (int r = 0; r < P; ++r) {
      ASSERT_NE(ranks[r], nullptr);
      EXPECT_EQ(ranks[r]->calls["linear_residual_push"], 0) << "rank " << r << " sp " << sp;
      EXPECT_EQ(ranks[r]->calls["linear_residual"], 0) << "rank " << r << " sp " << sp;
    }
  }
}

}  // namespace
}  // namespace attnres
