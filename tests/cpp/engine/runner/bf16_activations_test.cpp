// bf16 GEMM inputs (Backend::linear_input_dtype): a backend that asks for them gets the normed
// rows, the attention and SwiGLU outputs and the LM head's rows in bf16, written by their
// producers, and its GEMMs see exactly the bits they saw before, when the linear rounded its
// f32 input itself (CUDA's prefill path). Checked on the CPU with two backends:
// - GemmRoundingBackend, today's CUDA arithmetic: a linear of more than 8 rows with bf16
//   weights rounds its f32 x to bf16 first (as launch_convert_from_f32 does);
// - Bf16ActivationBackend, the same, answering BF16 where CUDA does (more than 8 rows, bf16
//   weights): its producers round into their bf16 out, its linears widen a bf16 x. It records
//   every op that got a bf16 tensor and refuses (records) one that does not declare it takes it.
// Whole forwards of every AttnRes mode give the same logits bit for bit on both, and the bf16
// inputs reach exactly the projections they should: q, k, v, o, gate, up, down and the LM
// head, never a depth gate (its input is the partial, which stays f32).
#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/tensor_parallel_runner.h"
#include "engine/runner/transformer_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres {
namespace {

using test::random_ids;
using test::run_prefill_then_decode;

constexpr int64_t kMaxGemvRows = 8;  // CUDA's: up to this many rows keep f32 x (the GEMV)

int64_t rows_of(const Tensor& t) { return t.dim(-1) ? t.numel() / t.dim(-1) : 0; }

// The CPU backend with CUDA's prefill GEMM rounding of an f32 input.
class GemmRoundingBackend : public CpuBackend {
 public:
  GemmRoundingBackend() : CpuBackend(1) {}
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    if (x.dtype == DType::F32 && w.dtype == DType::BF16 && rows_of(x) > kMaxGemvRows) {
      Tensor rounded = alloc(x.shape, DType::F32);
      for (int64_t i = 0; i < x.numel(); ++i)
        rounded.ptr<float>()[i] = bf16_to_f32(f32_to_bf16(x.ptr<float>()[i]));
      CpuBackend::linear_impl(rounded, w, bias, out);
      return;
    }
    CpuBackend::linear_impl(x, w, bias, out);
  }
};

// The same arithmetic with bf16 GEMM inputs written by their producers.
class Bf16ActivationBackend : public GemmRoundingBackend {
 public:
  DType linear_input_dtype(int64_t rows, DType weight_dtype) const override {
    return rows > kMaxGemvRows && weight_dtype == DType::BF16 ? DType::BF16 : DType::F32;
  }

  std::map<std::string, int> bf16_ops;      // ops that got a bf16 tensor, by name
  std::set<std::string> undeclared;         // ops that got one they do not take
  std::map<const void*, int> bf16_linears;  // weights whose linear read a bf16 x
  std::map<const void*, int> f32_linears;   // weights whose linear read an f32 x

  // --- the ops that take a bf16 tensor (Backend::linear_input_dtype's list) ---
  void rms_norm_impl(const Tensor& x, const Tensor& gain, float eps, Tensor& out) override {
    refuse("rms_norm", {&x});
    into(out, "rms_norm", [&](Tensor& o) { GemmRoundingBackend::rms_norm_impl(x, gain, eps, o); });
  }
  void depth_phase2_prenorm_impl(const DepthMixArgs& mix, const Tensor& partial, const Tensor& gain,
                                 float eps, Tensor& out) override {
    refuse("depth_phase2_prenorm",
           {&partial, mix.m, mix.s, mix.o, mix.query, mix.null_source, mix.gate_logits});
    into(out, "depth_phase2_prenorm", [&](Tensor& o) {
      GemmRoundingBackend::depth_phase2_prenorm_impl(mix, partial, gain, eps, o);
    });
  }
  // delta_v's two streams: as two depth_phase2_prenorm calls (the Backend default), each
  // through the override above, which records them.
  void depth_phase2_prenorm_pair_impl(const DepthMixArgs& a, const DepthMixArgs& b,
                                      const Tensor& partial, const Tensor& gain, float eps,
                                      Tensor& out_a, Tensor& out_b) override {
    Backend::depth_phase2_prenorm_pair_impl(a, b, partial, gain, eps, out_a, out_b);
  }
  void attention_impl(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
                      int head_dim, float scale, Tensor& out) override {
    refuse("attention", {&q, &cache.k, &cache.v});
    into(out, "attention", [&](Tensor& o) {
      GemmRoundingBackend::attention_impl(q, cache, batch, head_dim, scale, o);
    });
  }
  void swiglu_impl(const Tensor& gate, const Tensor& up, Tensor& out) override {
    refuse("swiglu", {&gate, &up});
    into(out, "swiglu", [&](Tensor& o) { GemmRoundingBackend::swiglu_impl(gate, up, o); });
  }
  void gather_rows_impl(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override {
    if (x.dtype == DType::BF16) ++bf16_ops["gather_rows"];
    GemmRoundingBackend::gather_rows_impl(x, rows, out);  // copies bytes: any dtype
  }
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    refuse("linear", {&out});
    if (x.dtype != DType::BF16) {
      ++f32_linears[w.data];
      GemmRoundingBackend::linear_impl(x, w, bias, out);
      return;
    }
    ++bf16_ops["linear"];
    ++bf16_linears[w.data];
    if (w.dtype != DType::BF16 || rows_of(x) <= kMaxGemvRows) undeclared.insert("linear (shape)");
    GemmRoundingBackend::linear_impl(widened(x), w, bias, out);
  }
  // The composite ops: their defaults call linear / swiglu / depth_phase2_prenorm above.
  void linear_residual_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                            const Tensor& residual, Tensor& out) override {
    refuse("linear_residual", {&residual, &out});
    if (x.dtype == DType::BF16) ++bf16_ops["linear_residual"];
    GemmRoundingBackend::linear_residual_impl(x, w, bias, residual, out);
  }
  void linear_many_impl(const Tensor& x, std::span<const LinearTarget> targets) override {
    if (x.dtype == DType::BF16) ++bf16_ops["linear_many"];
    GemmRoundingBackend::linear_many_impl(x, targets);
  }
  void linear_swiglu_impl(const Tensor& x, const Tensor& wg, const Tensor* bg, const Tensor& wu,
                          const Tensor* bu, Tensor& gate, Tensor& up, Tensor& out) override {
    refuse("linear_swiglu", {&gate, &up});
    if (x.dtype == DType::BF16) ++bf16_ops["linear_swiglu"];
    GemmRoundingBackend::linear_swiglu_impl(x, wg, bg, wu, bu, gate, up, out);
  }
  void prenorm_linear_many_impl(const PrenormArgs& in, std::span<const LinearTarget> t) override {
    refuse("prenorm_linear_many", {in.partial});
    if (in.normed->dtype == DType::BF16) ++bf16_ops["prenorm_linear_many"];
    GemmRoundingBackend::prenorm_linear_many_impl(in, t);
  }
  void prenorm_linear_swiglu_impl(const PrenormArgs& in, const Tensor& wg, const Tensor* bg,
                                  const Tensor& wu, const Tensor* bu, Tensor& gate, Tensor& up,
                                  Tensor& out) override {
    refuse("prenorm_linear_swiglu", {in.partial, &gate, &up});
    if (in.normed->dtype == DType::BF16) ++bf16_ops["prenorm_linear_swiglu"];
    GemmRoundingBackend::prenorm_linear_swiglu_impl(in, wg, bg, wu, bu, gate, up, out);
  }

  // --- ops that take no bf16 activation (a bf16 depth bank is not one: these tests use f32) ---
  void embedding_impl(const Tensor& table, const BatchMeta& batch, Tensor& out) override {
    refuse("embedding", {&out});
    GemmRoundingBackend::embedding_impl(table, batch, out);
  }
  void copy(const Tensor& src, Tensor& dst) override {
    refuse("copy", {&src, &dst});
    GemmRoundingBackend::copy(src, dst);
  }
  void add_inplace_impl(Tensor& x, const Tensor& y) override {
    refuse("add_inplace", {&x, &y});
    GemmRoundingBackend::add_inplace_impl(x, y);
  }
  void qk_norm_rope_store_impl(Tensor& q, Tensor& k, const Tensor& v, int hd, const Tensor* qg,
                               const Tensor* kg, float eps, const Tensor& inv_freq,
                               const BatchMeta& batch, KvCacheLayer& cache) override {
    refuse("qk_norm_rope_store", {&q, &k, &v});
    GemmRoundingBackend::qk_norm_rope_store_impl(q, k, v, hd, qg, kg, eps, inv_freq, batch, cache);
  }
  void depth_phase1_impl(const Tensor& queries, const Tensor& bank, int n, float eps, Tensor& m,
                         Tensor& s, Tensor& o, const Tensor* gate) override {
    refuse("depth_phase1", {&queries, &bank, &m, &s, &o, gate});
    GemmRoundingBackend::depth_phase1_impl(queries, bank, n, eps, m, s, o, gate);
  }
  void depth_weights_impl(const Tensor& query, const Tensor& bank, int n, const Tensor& partial,
                          float bias, float eps, Tensor& out,
                          const DepthSourceSwitches& sources) override {
    refuse("depth_weights", {&query, &bank, &partial, &out, sources.source_gate_logits});
    GemmRoundingBackend::depth_weights_impl(query, bank, n, partial, bias, eps, out, sources);
  }

 private:
  void refuse(const char* op, std::initializer_list<const Tensor*> tensors) {
    for (const Tensor* t : tensors)
      if (t && t->defined() && t->dtype == DType::BF16) undeclared.insert(op);
  }
  Tensor widened(const Tensor& x) {
    Tensor wide = alloc(x.shape, DType::F32);
    for (int64_t i = 0; i < x.numel(); ++i)
      wide.ptr<float>()[i] = bf16_to_f32(x.ptr<uint16_t>()[i]);
    return wide;
  }
  // Runs op into out, or (out bf16) into an f32 scratch then rounded into out.
  template <class Op>
  void into(Tensor& out, const char* name, Op&& op) {
    if (out.dtype != DType::BF16) {
      op(out);
      return;
    }
    ++bf16_ops[name];
    Tensor wide = alloc(out.shape, DType::F32);
    op(wide);
    for (int64_t i = 0; i < out.numel(); ++i)
      out.ptr<uint16_t>()[i] = f32_to_bf16(wide.ptr<float>()[i]);
  }
};

struct Mode {
  const char* name;
  const char* mode;  // attnres_mode, "" for a plain qwen3
  const char* gate;
  bool null_source;
  bool final_mix;
};

void PrintTo(const Mode& m, std::ostream* os) { *os << m.name; }

std::vector<Mode> modes() {
  return {
      {"plain", "", "bias", false, false},
      {"block", "block", "bias", false, false},
      {"block_final_mix", "block", "bias", false, true},
      {"full", "full", "bias", false, false},
      {"full_sigmoid_vector", "full", "sigmoid_vector", false, false},
      {"delta", "delta", "bias", true, false},
      {"delta_v", "delta_v", "sigmoid_vector", true, false},
      {"pre_gated", "pre_gated", "bias", false, false},
      {"delta_block", "delta_block", "sigmoid_scalar", true, false},
      {"first_layer", "first_layer", "bias", false, false},
  };
}

// A prefill of `prefill` rows (every row's logits: the LM head reads `prefill` rows), then
// decode steps of one row (f32 everywhere: the GEMV's side of CUDA).
constexpr int kBlockSize = 16, kTokens = 44, kPrefill = 40;

class Bf16Activations : public ::testing::TestWithParam<Mode> {};

// Chunked prefill: chunks of 12, 20 and 12 rows (every one GEMM-sized), each step asking for
// the logits of its last row only (the LM head's rows gathered). Every step's logits.
std::vector<float> run_chunked(const ModelConfig& config, const ModelWeights& weights,
                               const std::vector<int32_t>& ids, Backend& backend) {
  Transformer model(config, weights, backend);
  TransformerRunner runner(model, 4, kBlockSize);
  BlockManager blocks(4, kBlockSize);
  SequenceBlocks seq;
  blocks.append(seq, kTokens);
  std::vector<float> all;
  StepResult step;
  int done = 0;
  for (int chunk : {12, 20, 12}) {
    StepBatch batch;
    add_to_batch(batch.meta, seq, std::span(ids).subspan(done, chunk), kBlockSize);
    batch.logit_rows = {chunk - 1};
    runner.execute(batch, step);
    all.insert(all.end(), step.logits.begin(), step.logits.end());
    done += chunk;
  }
  return all;
}

TEST_P(Bf16Activations, SameLogitsAsRoundingInTheLinearBitForBit) {
  const Mode m = GetParam();
  const ModelConfig config = test::tp_test_config(m.mode, m.gate, m.null_source);
  const ModelWeights weights = make_random_weights(config, {DType::BF16, 41, m.final_mix});
  const std::vector<int32_t> ids = random_ids(kTokens, config.vocab_size, 5);

  GemmRoundingBackend reference_backend;
  Transformer reference(config, weights, reference_backend);
  TransformerRunner reference_runner(reference, 4, kBlockSize);
  const std::vector<float> want =
      run_prefill_then_decode(reference_runner, ids, kPrefill, kBlockSize);

  Bf16ActivationBackend backend;
  Transformer model(config, weights, backend);
  TransformerRunner runner(model, 4, kBlockSize);
  const std::vector<float> got = run_prefill_then_decode(runner, ids, kPrefill, kBlockSize);

  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "logit " << i;
  EXPECT_TRUE(backend.undeclared.empty()) << *backend.undeclared.begin();

  // The prefill's projections read bf16 (once each), the decode steps' f32; the LM head too
  // (the prefill asks for 40 rows of logits).
  const int decode_steps = kTokens - kPrefill;
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& w = weights.layers[l];
    for (const Tensor* t :
         {&w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.gate_proj, &w.up_proj, &w.down_proj}) {
      EXPECT_EQ(backend.bf16_linears[t->data], 1) << "layer " << l;
      EXPECT_EQ(backend.f32_linears[t->data], decode_steps) << "layer " << l;
    }
  }
  EXPECT_EQ(backend.bf16_linears[weights.lm_head.data], 1);
  EXPECT_EQ(backend.f32_linears[weights.lm_head.data], decode_steps);
  int bf16_total = 0;
  for (const auto& [w, n] : backend.bf16_linears) bf16_total += n;
  EXPECT_EQ(bf16_total, 7 * static_cast<int>(weights.layers.size()) + 1)
      << "a linear other than the projections and the LM head read a bf16 x";
  // Producers: the attention and SwiGLU outputs once per layer; the normed rows through the
  // PreNorm (rms_norm on CUDA's side of the plain pre-norm, depth_phase2_prenorm here).
  EXPECT_EQ(backend.bf16_ops["attention"], static_cast<int>(weights.layers.size()));
  EXPECT_EQ(backend.bf16_ops["swiglu"], static_cast<int>(weights.layers.size()));
  EXPECT_GE(backend.bf16_ops["depth_phase2_prenorm"], 2 * static_cast<int>(weights.layers.size()));
  if (std::string(m.mode) == "pre_gated") {
    // The gates read the partial: f32, so their linears round it themselves, as before.
    for (const auto& [w, n] : backend.bf16_linears) {
      for (const LayerWeights& layer : weights.layers) {
        for (const auto& res : {layer.attn_res, layer.mlp_res}) {
          if (res) {
            EXPECT_NE(w, res->pre_gate.data);
          }
        }
      }
    }
  }
}

// Chunked prefill (chunks of 12 and 20 rows after a first one of 12: every chunk is GEMM
// sized) and a step whose LM head reads few rows (the last of each chunk): that LM head keeps
// f32 rows (CUDA's GEMV), the rest of the step bf16.
TEST_P(Bf16Activations, ChunkedPrefillWithOneLogitRowPerChunk) {
  const Mode m = GetParam();
  const ModelConfig config = test::tp_test_config(m.mode, m.gate, m.null_source);
  const ModelWeights weights = make_random_weights(config, {DType::BF16, 43, m.final_mix});
  const std::vector<int32_t> ids = random_ids(kTokens, config.vocab_size, 6);
  GemmRoundingBackend reference_backend;
  Bf16ActivationBackend backend;
  const std::vector<float> want = run_chunked(config, weights, ids, reference_backend);
  const std::vector<float> got = run_chunked(config, weights, ids, backend);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "logit " << i;
  EXPECT_TRUE(backend.undeclared.empty()) << *backend.undeclared.begin();
  EXPECT_EQ(backend.bf16_linears[weights.lm_head.data], 0);
  EXPECT_EQ(backend.f32_linears[weights.lm_head.data], 3);
  EXPECT_EQ(backend.bf16_linears[weights.layers[0].q_proj.data], 3);
}

// The CPU backend's own bf16 linear inputs (AVX512_BF16, vdpbf16ps): its producers write the
// normed rows, the attention and SwiGLU outputs and the LM head's rows in bf16, and the
// logits equal those of the same backend rounding each linear's f32 x itself (its path
// before the producers did), bit for bit, for a prefill, decode steps and chunked prefill.
class RoundingInTheLinearCpu : public CpuBackend {
 public:
  RoundingInTheLinearCpu() : CpuBackend(2) { set_bf16_linear_inputs(true); }
  DType linear_input_dtype(int64_t, DType) const override { return DType::F32; }
};

TEST_P(Bf16Activations, TheCpuProducersWriteTheRowsItsLinearsRounded) {
  if (!CpuBackend::bf16_linear_inputs_supported()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  const Mode m = GetParam();
  const ModelConfig config = test::tp_test_config(m.mode, m.gate, m.null_source);
  const ModelWeights weights = make_random_weights(config, {DType::BF16, 47, m.final_mix});
  const std::vector<int32_t> ids = random_ids(kTokens, config.vocab_size, 7);
  auto run = [&](Backend& backend, bool chunked) {
    if (chunked) return run_chunked(config, weights, ids, backend);
    Transformer model(config, weights, backend);
    TransformerRunner runner(model, 4, kBlockSize);
    return run_prefill_then_decode(runner, ids, kPrefill, kBlockSize);
  };
  CpuBackend producers(2);
  producers.set_bf16_linear_inputs(true);
  ASSERT_EQ(producers.linear_input_dtype(1, DType::BF16), DType::BF16);
  ASSERT_EQ(producers.linear_input_dtype(64, DType::F32), DType::F32);
  RoundingInTheLinearCpu reference;
  for (bool chunked : {false, true}) {
    const std::vector<float> want = run(reference, chunked);
    const std::vector<float> got = run(producers, chunked);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << "logit " << i << (chunked ? ", chunked" : "");
  }
}

INSTANTIATE_TEST_SUITE_P(EveryMode, Bf16Activations, ::testing::ValuesIn(modes()),
                         [](const auto& info) { return std::string(info.param.name); });

// F32 weights: the backend answers F32, nothing is bf16 and the logits are the CPU's own.
TEST(Bf16ActivationsF32Weights, NothingChanges) {
  const ModelConfig config = test::tp_test_config("block");
  const ModelWeights weights = make_random_weights(config, {DType::F32, 47, false});
  const std::vector<int32_t> ids = random_ids(kTokens, config.vocab_size, 7);
  CpuBackend cpu(1);
  Transformer reference(config, weights, cpu);
  TransformerRunner reference_runner(reference, 4, kBlockSize);
  const std::vector<float> want =
      run_prefill_then_decode(reference_runner, ids, kPrefill, kBlockSize);
  Bf16ActivationBackend backend;
  Transformer model(config, weights, backend);
  TransformerRunner runner(model, 4, kBlockSize);
  EXPECT_EQ(run_prefill_then_decode(runner, ids, kPrefill, kBlockSize), want);
  EXPECT_TRUE(backend.bf16_ops.empty());
}

// The default backend never asks for bf16, whatever the rows and weights.
TEST(Bf16ActivationsDefault, BackendAnswersF32) {
  CpuBackend cpu(1);
  for (int64_t rows : {1, 8, 9, 8192})
    for (DType w : {DType::F32, DType::BF16, DType::F16})
      EXPECT_EQ(cpu.linear_input_dtype(rows, w), DType::F32);
}

// Tensor parallelism, sequence-parallel prefill included: the sharded steps' sublayer inputs
// and LM head rows stay f32 (all-gathered), the attention and SwiGLU outputs go bf16, and the
// logits are the rounding reference's bit for bit.
TEST(Bf16ActivationsTensorParallel, SequenceParallelKeepsGatheredRowsF32) {
  const ModelConfig config = test::tp_test_config("block");
  const ModelWeights weights = make_random_weights(config, {DType::BF16, 53, false});
  const std::vector<int32_t> ids = random_ids(kTokens, config.vocab_size, 8);
  for (int sp : {0, 1}) {
    auto run = [&](bool bf16, std::set<std::string>* undeclared) {
      TensorParallelOptions options = test::cpu_tensor_parallel_options(2, 4, kBlockSize, sp);
      std::vector<Bf16ActivationBackend*> ranks(2, nullptr);
      options.make_backend = [&](int rank) -> std::unique_ptr<Backend> {
        if (!bf16) return std::make_unique<GemmRoundingBackend>();
        auto b = std::make_unique<Bf16ActivationBackend>();
        ranks[rank] = b.get();
        return b;
      };
      TensorParallelRunner tp(config, weights, options);
      std::vector<float> logits = run_prefill_then_decode(tp, ids, kPrefill, kBlockSize);
      for (Bf16ActivationBackend* b : ranks) {
        if (!b) continue;
        undeclared->insert(b->undeclared.begin(), b->undeclared.end());
        EXPECT_GT(b->bf16_ops["attention"], 0) << "sequence-parallel " << sp;
      }
      return logits;
    };
    std::set<std::string> undeclared;
    const std::vector<float> want = run(false, &undeclared);
    const std::vector<float> got = run(true, &undeclared);
    EXPECT_EQ(got, want) << "sequence-parallel " << sp;
    EXPECT_TRUE(undeclared.empty()) << *undeclared.begin();
  }
}

}  // namespace
}  // namespace attnres
