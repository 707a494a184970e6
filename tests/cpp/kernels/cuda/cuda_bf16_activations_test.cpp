// bf16 activations into the prefill GEMMs (kernels/cuda/NOTES.md, "bf16 activations into the
// prefill GEMMs"). Each producing op with a bf16 out writes its f32 out rounded by f32_to_bf16,
// bit for bit (rms_norm, depth_phase2_prenorm in all its kernels, attention on both kernels and
// the split merge, swiglu); each linear with a bf16 x gives the bits of the same linear on the
// f32 x of the same values (the conversion of an exactly representable value changes nothing);
// and whole forwards with bf16 activations give the logits of the same backend with them off,
// bit for bit, for every AttnRes mode, prefill of 9 to 8192 rows, chunked and mixed steps.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"
#include "tests/cpp/kernels/cuda/paged_batch_util.h"

namespace attnres::test {
namespace {

// f32_to_bf16 of every element of a host f32 tensor: what a bf16 out must hold.
Tensor rounded_bits(const Tensor& f32) {
  Tensor t = Tensor::empty(f32.shape, DType::BF16);
  for (int64_t i = 0; i < f32.numel(); ++i) t.ptr<uint16_t>()[i] = f32_to_bf16(f32.ptr<float>()[i]);
  return t;
}

// A host f32 tensor holding a bf16 tensor's values, and its bf16 form.
Tensor widened_host(const Tensor& bf16) {
  Tensor t = Tensor::empty(bf16.shape, DType::F32);
  for (int64_t i = 0; i < bf16.numel(); ++i)
    t.ptr<float>()[i] = bf16_to_f32(bf16.ptr<uint16_t>()[i]);
  return t;
}

// A device bf16 tensor full of NaN bits (0x7fc1: not what any rounding of these inputs gives).
Tensor device_nan_bf16(Backend& be, const Shape& shape) {
  Tensor h = Tensor::empty(shape, DType::BF16);
  for (int64_t i = 0; i < h.numel(); ++i) h.ptr<uint16_t>()[i] = 0x7fc1;
  return be.upload(h);
}

// Runs op(out) into an f32 and a bf16 out; the bf16 one must be the f32 one rounded.
template <class Op>
void expect_rounded(CudaBackend& gpu, const Shape& shape, Op&& op, const std::string& what) {
  Tensor f32_out = device_nan(gpu, shape);
  Tensor bf16_out = device_nan_bf16(gpu, shape);
  op(f32_out);
  op(bf16_out);
  const Tensor want = rounded_bits(to_host(gpu, f32_out));
  EXPECT_TRUE(same_bytes(to_host(gpu, bf16_out), want)) << what;
}

TEST(CudaBf16Activations, RmsNormAndSwigluWriteTheRoundedF32) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu(0);
  std::mt19937 rng(3);
  for (int64_t n : {37, 1024, 3072}) {
    for (DType gain_dtype : {DType::F32, DType::BF16}) {
      const Tensor x = gpu.upload(random_host({17, n}, DType::F32, rng, -2.0f, 2.0f));
      const Tensor gain = gpu.upload(random_host({n}, gain_dtype, rng, 0.5f, 1.5f));
      expect_rounded(
          gpu, {17, n}, [&](Tensor& out) { gpu.rms_norm(x, gain, 1e-6f, out); },
          "rms_norm n " + std::to_string(n));
    }
    const Tensor gate = gpu.upload(random_host({17, n}, DType::F32, rng, -4.0f, 4.0f));
    const Tensor up = gpu.upload(random_host({17, n}, DType::F32, rng, -2.0f, 2.0f));
    expect_rounded(
        gpu, {17, n}, [&](Tensor& out) { gpu.swiglu(gate, up, out); },
        "swiglu n " + std::to_string(n));
  }
}

TEST(CudaBf16Activations, DepthPhase2WritesTheRoundedF32) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu(0);
  std::mt19937 rng(5);
  const int64_t T = 13;
  // d 37: the scalar path; 1024: the 16-byte path; 16384: past the bf16 staging (scratch, then
  // rounded).
  for (int64_t d : {37, 1024, 16384}) {
    for (DType bank_dtype : {DType::F32, DType::BF16}) {
      const Tensor partial = gpu.upload(random_host({T, d}, DType::F32, rng, -2.0f, 2.0f));
      const Tensor gain = gpu.upload(random_host({d}, DType::BF16, rng, 0.5f, 1.5f));
      const Tensor m = gpu.upload(random_host({T}, DType::F32, rng, -1.0f, 1.0f));
      const Tensor s = gpu.upload(random_host({T}, DType::F32, rng, 1.0f, 3.0f));
      const Tensor o = gpu.upload(random_host({T, d}, DType::F32, rng));
      const Tensor query = gpu.upload(random_host({d}, DType::F32, rng, -0.1f, 0.1f));
      const Tensor newer = gpu.upload(random_host({3, T, d}, bank_dtype, rng));
      const Tensor gate_logits = gpu.upload(random_host({T, d}, DType::F32, rng, -3.0f, 3.0f));
      const Tensor null_source = gpu.upload(random_host({d}, DType::F32, rng));
      const std::string at =
          "d " + std::to_string(d) + " bank " + std::string(dtype_name(bank_dtype));
      auto run = [&](const Backend::DepthMixArgs& mix) {
        return [&, mix](Tensor& out) { gpu.depth_phase2_prenorm(mix, partial, gain, 1e-6f, out); };
      };
      expect_rounded(gpu, {T, d}, run(Backend::DepthMixArgs{}), "no mix (rms_norm), " + at);
      Backend::DepthMixArgs plain;
      plain.m = &m;
      plain.s = &s;
      plain.o = &o;
      plain.query = &query;
      plain.bias = 0.25f;
      expect_rounded(gpu, {T, d}, run(plain), "plain merge, " + at);
      Backend::DepthMixArgs general = plain;
      general.newer = &newer;
      general.null_source = &null_source;
      general.null_logit = 0.5f;
      general.gate = Backend::DepthGate::Vector;
      general.gate_logits = &gate_logits;
      expect_rounded(gpu, {T, d}, run(general), "newer entries, null source, vector gate, " + at);
      general.gate = Backend::DepthGate::Scalar;
      general.gate_blend = 0.7f;
      general.adds_partial = true;
      general.partial_is_source = false;
      expect_rounded(gpu, {T, d}, run(general), "scalar gate, adds the partial, " + at);
    }
  }
}

// A step of prefill chunks (tensor-core tiles) and decode rows after long contexts (split-K,
// then the merge kernel), and one of decode rows only.
TEST(CudaBf16Activations, AttentionWritesTheRoundedF32) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(7);
  const int block_size = 16, num_blocks = 1024;
  const std::vector<std::vector<SeqSpec>> steps = {
      {{0, 100}, {300, 1}, {1500, 1}, {64, 70}, {2000, 1}},
      {{2000, 1}, {1800, 1}, {900, 1}, {3000, 1}, {10, 1}, {700, 1}, {1200, 1}, {400, 1}, {5, 1}},
  };
  for (int hd : {32, 64, 128}) {
    for (DType cache_dtype : {DType::F32, DType::BF16}) {
      CudaBackend gpu(0);
      const int hq = 8, hkv = 2;
      const Shape cache_shape = {num_blocks, block_size, hkv, hd};
      KvCacheLayer cache{gpu.upload(random_host(cache_shape, cache_dtype, rng)),
                         gpu.upload(random_host(cache_shape, cache_dtype, rng))};
      for (const auto& seqs : steps) {
        const BatchMeta batch = paged_batch(seqs, block_size, num_blocks, rng);
        gpu.prepare_batch(batch);
        const Tensor q = gpu.upload(random_host({batch.num_tokens, hq * hd}, DType::F32, rng));
        expect_rounded(
            gpu, {batch.num_tokens, hq * hd},
            [&](Tensor& out) { gpu.attention(q, cache, batch, hd, 0.125f, out); },
            "attention hd " + std::to_string(hd) + " cache " +
                std::string(dtype_name(cache_dtype)) + ", " + std::to_string(batch.num_tokens) +
                " rows");
      }
    }
  }
}

// linear, linear_many, linear_swiglu and linear_residual with a bf16 x: the bits of the same
// op on an f32 x of the same values (which the op rounds to those same bf16 values itself).
TEST(CudaBf16Activations, LinearsTakeABf16XWithTheSameBits) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu(0);
  CpuBackend cpu(2);
  std::mt19937 rng(11);
  const int64_t K = 1024, N = 3072, N2 = 512;
  const Tensor w_host = random_host({N, K}, DType::BF16, rng, -0.05f, 0.05f);
  const Tensor w2_host = random_host({N2, K}, DType::BF16, rng, -0.05f, 0.05f);
  const Tensor bias_host = random_host({N}, DType::F32, rng);
  const Tensor w = gpu.upload(w_host), w2 = gpu.upload(w2_host), bias = gpu.upload(bias_host);
  for (int64_t R : {9, 100, 2048}) {
    const std::string at = std::to_string(R) + " rows";
    const Tensor x_bf16_host = random_host({R, K}, DType::BF16, rng, -2.0f, 2.0f);
    const Tensor x_bf16 = gpu.upload(x_bf16_host);
    const Tensor x_f32 = gpu.upload(widened_host(x_bf16_host));
    auto both = [&](const Shape& shape, auto&& op) {
      Tensor a = device_nan(gpu, shape), b = device_nan(gpu, shape);
      op(x_f32, a);
      op(x_bf16, b);
      return std::pair{to_host(gpu, a), to_host(gpu, b)};
    };
    const auto [lin_f32, lin_bf16] =
        both({R, N}, [&](const Tensor& x, Tensor& out) { gpu.linear(x, w, &bias, out); });
    EXPECT_TRUE(same_bytes(lin_bf16, lin_f32)) << "linear, " << at;
    Tensor ref = Tensor::empty({R, N}, DType::F32);
    cpu.linear(widened_host(x_bf16_host), w_host, &bias_host, ref);
    EXPECT_TRUE(rel_l2_close(lin_bf16, ref, 1e-4)) << "linear against the CPU, " << at;

    const Tensor residual = gpu.upload(random_host({R, N}, DType::F32, rng));
    const auto [res_f32, res_bf16] = both({R, N}, [&](const Tensor& x, Tensor& out) {
      gpu.linear_residual(x, w, &bias, residual, out);
    });
    EXPECT_TRUE(same_bytes(res_bf16, res_f32)) << "linear_residual, " << at;

    const auto [many_f32, many_bf16] = both({R, N2}, [&](const Tensor& x, Tensor& out) {
      Tensor first = device_nan(gpu, {R, N});
      const Backend::LinearTarget targets[] = {{&w, &bias, &first}, {&w2, nullptr, &out}};
      gpu.linear_many(x, targets);
    });
    EXPECT_TRUE(same_bytes(many_bf16, many_f32)) << "linear_many, " << at;

    const auto [swiglu_f32, swiglu_bf16] = both({R, N}, [&](const Tensor& x, Tensor& out) {
      Tensor gate = device_nan(gpu, {R, N}), up = device_nan(gpu, {R, N});
      gpu.linear_swiglu(x, w, &bias, w, nullptr, gate, up, out);
    });
    EXPECT_TRUE(same_bytes(swiglu_bf16, swiglu_f32)) << "linear_swiglu, " << at;
  }
  // A bf16 x at decode sizes (a view of a larger bf16 tensor) takes the GEMM too.
  const Tensor x4_host = random_host({4, K}, DType::BF16, rng);
  Tensor out4 = device_nan(gpu, {4, N});
  gpu.linear(gpu.upload(x4_host), w, &bias, out4);
  Tensor ref4 = Tensor::empty({4, N}, DType::F32);
  cpu.linear(widened_host(x4_host), w_host, &bias_host, ref4);
  EXPECT_TRUE(rel_l2_close(to_host(gpu, out4), ref4, 1e-4));
  // A bf16 x with f32 weights: refused before anything runs.
  const Tensor w_f32 = gpu.upload(random_host({N2, K}, DType::F32, rng));
  Tensor out = device_nan(gpu, {9, N2});
  EXPECT_THROW(gpu.linear(gpu.upload(random_host({9, K}, DType::BF16, rng)), w_f32, nullptr, out),
               std::logic_error);
}

TEST(CudaBf16Activations, TheSwitchAndTheAnswer) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu(0);
  EXPECT_FALSE(gpu.bf16_linear_inputs());  // off until the engine sets --linear-input-dtype's
  EXPECT_EQ(gpu.linear_input_dtype(9, DType::BF16), DType::F32);
  gpu.set_bf16_linear_inputs(true);
  EXPECT_EQ(gpu.linear_input_dtype(8, DType::BF16), DType::F32);  // the GEMV's rows
  EXPECT_EQ(gpu.linear_input_dtype(9, DType::BF16), DType::BF16);
  EXPECT_EQ(gpu.linear_input_dtype(8192, DType::F32), DType::F32);
  EXPECT_EQ(gpu.linear_input_dtype(8192, DType::F16), DType::F32);
  gpu.set_bf16_linear_inputs(false);
  EXPECT_EQ(gpu.linear_input_dtype(8192, DType::BF16), DType::F32);
}

// A config whose attention takes the tensor-core prefill kernel (head_dim 64).
ModelConfig prefill_config(const std::string& mode, const std::string& gate, bool null_source) {
  const bool attnres = !mode.empty();
  nlohmann::json j = {{"model_type", attnres ? "qwen3_attnres" : "qwen3"},
                      {"hidden_size", 256},
                      {"intermediate_size", 768},
                      {"num_hidden_layers", 4},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 64},
                      {"vocab_size", 1000},
                      {"max_position_embeddings", 16384},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 1000000.0},
                      {"tie_word_embeddings", true}};
  if (attnres) {
    j["attnres_mode"] = mode;
    j["attnres_num_blocks"] = 2;
    j["attnres_gate_type"] = gate;
    j["attnres_use_null_source"] = null_source;
  }
  return ModelConfig::from_json(j, "bf16 activations test config");
}

struct Mode {
  const char* mode;
  const char* gate;
  bool null_source;
};
const Mode kModes[] = {{"", "bias", false},
                       {"block", "bias", false},
                       {"full", "sigmoid_vector", false},
                       {"delta_v", "sigmoid_vector", true},
                       {"pre_gated", "bias", false}};

// The same steps through two CUDA backends, bf16 activations on and off: the logits of each
// step bit for bit, and near the CPU's (bf16 weights: 3e-2) where the CPU runs it too.
// steps[i]: per sequence, the rows of step i (0: none; a sequence's length is the sum of its
// rows); every row's logits are asked for when all_logits, else the last row of each sequence's
// chunk.
void compare_on_and_off(const Mode& m, const std::vector<std::vector<int>>& steps, bool all_logits,
                        bool with_cpu) {
  const ModelConfig config = prefill_config(m.mode, m.gate, m.null_source);
  SCOPED_TRACE(config.summary());
  RandomWeightOptions opt;
  opt.dtype = DType::BF16;
  opt.seed = 19;
  const ModelWeights weights = make_random_weights(config, opt);
  CudaBackend on(0), off(0);
  on.set_bf16_linear_inputs(true);
  off.set_bf16_linear_inputs(false);
  CpuBackend cpu(8);
  Transformer on_model(config, weights, on), off_model(config, weights, off);
  Transformer cpu_model(config, weights, cpu);
  const int block_size = 16;
  std::vector<int> lengths(steps[0].size(), 0);
  for (const auto& step : steps)
    for (size_t s = 0; s < lengths.size(); ++s) lengths[s] += step[s];
  int num_blocks = 0;
  for (int n : lengths) num_blocks += n / block_size + 1;
  KvCache on_cache = KvCache::allocate(on, config, num_blocks, block_size);
  KvCache off_cache = KvCache::allocate(off, config, num_blocks, block_size);
  KvCache cpu_cache = KvCache::allocate(cpu, config, with_cpu ? num_blocks : 1, block_size);
  std::mt19937 rng(23);
  const std::vector<Seq> seqs =
      random_sequences(lengths, block_size, num_blocks, config.vocab_size, rng);
  std::vector<int> done(seqs.size(), 0);
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<Seq> active;
    std::vector<int> b, e;
    for (size_t s = 0; s < seqs.size(); ++s) {
      if (steps[i][s] == 0) continue;
      active.push_back(seqs[s]);
      b.push_back(done[s]);
      e.push_back(done[s] + steps[i][s]);
      done[s] += steps[i][s];
    }
    std::vector<int32_t> rows;
    const BatchMeta batch = make_step(active, b, e, block_size, rows);
    if (all_logits) {
      rows.resize(batch.num_tokens);
      for (int r = 0; r < batch.num_tokens; ++r) rows[r] = r;
    }
    const Tensor got = to_host(on, on_model.forward(batch, on_cache, rows));
    const Tensor want = to_host(off, off_model.forward(batch, off_cache, rows));
    EXPECT_TRUE(same_bytes(got, want)) << "step " << i << " (" << batch.num_tokens << " rows)";
    if (with_cpu) {
      const Tensor ref = cpu_model.forward(batch, cpu_cache, rows);
      EXPECT_TRUE(rel_l2_close(got, ref, 3e-2)) << "step " << i << " against the CPU";
    }
  }
}

TEST(CudaBf16Activations, ForwardsGiveTheLogitsOfTheConvertingPath) {
  SKIP_WITHOUT_CUDA();
  for (const Mode& m : kModes) {
    // 8 sequences: a prefill of 6 to 70 rows each (236 rows, every row's logits), a decode step
    // of 5 (the GEMV, f32), one of 9 rows (a chunk of 2 among decode rows: bf16 again), then
    // chunks beside decode rows.
    compare_on_and_off(m,
                       {{20, 6, 70, 9, 10, 40, 17, 64},
                        {1, 1, 1, 0, 1, 1, 0, 0},
                        {2, 1, 1, 1, 1, 1, 1, 1},
                        {17, 1, 29, 0, 19, 1, 0, 65}},
                       true, true);
  }
}

TEST(CudaBf16Activations, LongPrefillWholeAndChunked) {
  SKIP_WITHOUT_CUDA();
  for (const Mode& m : kModes) {
    compare_on_and_off(m, {{8192}}, false, false);                 // one step, one logit row
    compare_on_and_off(m, {{3000}, {3000}, {2192}}, true, false);  // chunks, every row's
  }
}

}  // namespace
}  // namespace attnres::test
