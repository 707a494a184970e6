// Backend's public ops check their operands once for every backend (engine/core/backend.cpp)
// before the backend's body runs: a backend whose bodies only count their calls sees none of
// the refused calls, and one of each accepted call. The capability-driven rules follow the
// backend's BackendCapabilities (a bf16 cache, Phase 2 without a Phase-1 state, the weight
// dtypes and bf16 linear inputs).
#include <gtest/gtest.h>

#include <stdexcept>

#include "engine/core/backend.h"

namespace attnres {
namespace {

// Host tensors; every body counts its calls and computes nothing.
class CountingBackend : public Backend {
 public:
  explicit CountingBackend(BackendCapabilities caps = {}) : caps_(caps) {}
  int bodies = 0;

  Device device() const override { return Device::CPU; }
  std::string name() const override { return "counting"; }
  const BackendCapabilities& capabilities() const override { return caps_; }
  Tensor alloc(const Shape& shape, DType dtype) override { return Tensor::empty(shape, dtype); }
  Tensor upload(const Tensor& host) override { return host; }
  void download(const Tensor&, void*) override {}
  void copy(const Tensor&, Tensor&) override {}
  void fill_zero(Tensor&) override {}
  void synchronize() override {}

 protected:
  void embedding_impl(const Tensor&, const BatchMeta&, Tensor&) override { ++bodies; }
  void rms_norm_impl(const Tensor&, const Tensor&, float, Tensor&) override { ++bodies; }
  void linear_impl(const Tensor&, const Tensor&, const Tensor*, Tensor&) override { ++bodies; }
  void qk_norm_rope_impl(Tensor&, Tensor&, int, const Tensor*, const Tensor*, float, const Tensor&,
                         const BatchMeta&) override {
    ++bodies;
  }
  void store_kv_impl(const Tensor&, const Tensor&, const BatchMeta&, KvCacheLayer&) override {
    ++bodies;
  }
  void attention_impl(const Tensor&, const KvCacheLayer&, const BatchMeta&, int, float,
                      Tensor&) override {
    ++bodies;
  }
  void swiglu_impl(const Tensor&, const Tensor&, Tensor&) override { ++bodies; }
  void add_inplace_impl(Tensor&, const Tensor&) override { ++bodies; }
  void gather_rows_impl(const Tensor&, std::span<const int32_t>, Tensor&) override { ++bodies; }
  void sample_impl(Tensor&, const SampleBatch&, std::span<int32_t>) override { ++bodies; }
  void depth_phase1_impl(const Tensor&, const Tensor&, int, float, Tensor&, Tensor&, Tensor&,
                         const Tensor*) override {
    ++bodies;
  }
  void depth_phase2_prenorm_impl(const DepthMixArgs&, const Tensor&, const Tensor&, float,
                                 Tensor&) override {
    ++bodies;
  }
  void depth_weights_impl(const Tensor&, const Tensor&, int, const Tensor&, float, float, Tensor&,
                          const DepthSourceSwitches&) override {
    ++bodies;
  }

 private:
  BackendCapabilities caps_;
};

Tensor f32(const Shape& shape) { return Tensor::empty(shape, DType::F32); }

BatchMeta one_sequence(int tokens) {
  BatchMeta b;
  b.num_tokens = tokens;
  for (int t = 0; t < tokens; ++t) {
    b.token_ids.push_back(t);
    b.positions.push_back(t);
    b.slot_mapping.push_back(t);
  }
  b.query_start = {0, tokens};
  b.context_len = {tokens};
  b.block_tables = {{0}};
  return b;
}

TEST(BackendChecks, LinearShapesAndAliasing) {
  CountingBackend be;
  Tensor x = f32({3, 8}), w = f32({5, 8}), out = f32({3, 5});
  be.linear(x, w, nullptr, out);
  EXPECT_EQ(be.bodies, 1);
  Tensor wrong_in = f32({5, 7}), wrong_rows = f32({2, 5}), bias = f32({4});
  EXPECT_THROW(be.linear(x, wrong_in, nullptr, out), std::logic_error);
  EXPECT_THROW(be.linear(x, w, nullptr, wrong_rows), std::logic_error);
  EXPECT_THROW(be.linear(x, w, &bias, out), std::logic_error);
  Tensor square = f32({3, 8}), w8 = f32({8, 8});
  EXPECT_THROW(be.linear(square, w8, nullptr, square), std::logic_error);  // out aliases x
  // The fused default checks what its parts would: a residual of another shape.
  Tensor residual = f32({3, 4});
  EXPECT_THROW(be.linear_residual(x, w, nullptr, residual, out), std::logic_error);
  EXPECT_EQ(be.bodies, 1);
}

// The linear's weight and input dtypes follow the capabilities: a weight dtype the backend
// lists, a BF16 x only over BF16 weights on a backend that takes bf16 linear inputs.
TEST(BackendChecks, LinearDtypesFollowTheCapabilities) {
  BackendCapabilities caps;
  caps.bf16_linear_inputs = true;
  CountingBackend takes(caps), plain;
  Tensor x16 = Tensor::empty({3, 8}, DType::BF16), w16 = Tensor::empty({5, 8}, DType::BF16);
  Tensor x = f32({3, 8}), w = f32({5, 8}), out = f32({3, 5});
  takes.linear(x16, w16, nullptr, out);
  EXPECT_EQ(takes.bodies, 1);
  EXPECT_THROW(takes.linear(x16, w, nullptr, out), std::logic_error);    // f32 weights
  EXPECT_THROW(plain.linear(x16, w16, nullptr, out), std::logic_error);  // no bf16 inputs
  Tensor q8 = Tensor::empty({5, 32}, DType::Q8_B32), x32 = f32({3, 32});
  EXPECT_THROW(plain.linear(x32, q8, nullptr, out), std::logic_error);  // not a weight dtype
  const Backend::LinearTarget targets[2] = {{&w, nullptr, &out}, {&w16, nullptr, &out}};
  EXPECT_THROW(takes.linear_many(x16, targets), std::logic_error);  // one target's f32 weights
  EXPECT_EQ(takes.bodies, 1);
  EXPECT_EQ(plain.bodies, 0);
}

TEST(BackendChecks, AttentionHeadsAndCacheDtype) {
  BackendCapabilities caps;
  caps.kv_cache_dtypes = {DType::F32, DType::BF16};
  CountingBackend be(caps), f32_only;
  const BatchMeta batch = one_sequence(2);
  KvCacheLayer cache{f32({1, 16, 2, 4}), f32({1, 16, 2, 4})};
  Tensor q = f32({2, 4 * 4}), out = f32({2, 4 * 4});
  be.attention(q, cache, batch, 4, 0.5f, out);
  EXPECT_EQ(be.bodies, 1);
  Tensor q3 = f32({2, 3 * 4}), out3 = f32({2, 3 * 4});  // 3 query heads over 2 KV heads
  EXPECT_THROW(be.attention(q3, cache, batch, 4, 0.5f, out3), std::logic_error);
  EXPECT_THROW(be.attention(q, cache, batch, 4, 0.5f, q), std::logic_error);  // out is q
  EXPECT_THROW(be.attention(q, cache, one_sequence(3), 4, 0.5f, out), std::logic_error);
  EXPECT_EQ(be.bodies, 1);
  // A bf16 cache: taken where the capabilities list it, refused where they do not.
  KvCacheLayer bf16{Tensor::empty({1, 16, 2, 4}, DType::BF16),
                    Tensor::empty({1, 16, 2, 4}, DType::BF16)};
  be.attention(q, bf16, batch, 4, 0.5f, out);
  EXPECT_EQ(be.bodies, 2);
  EXPECT_THROW(f32_only.attention(q, bf16, batch, 4, 0.5f, out), std::logic_error);
  EXPECT_EQ(f32_only.bodies, 0);
}

TEST(BackendChecks, EmbeddingIdsInsideTheVocabulary) {
  CountingBackend be;
  Tensor table = f32({4, 8}), out = f32({3, 8});
  BatchMeta batch = one_sequence(3);
  be.embedding(table, batch, out);
  batch.token_ids[1] = 4;
  EXPECT_THROW(be.embedding(table, batch, out), std::logic_error);
  EXPECT_EQ(be.bodies, 1);
}

TEST(BackendChecks, PhaseTwoWithoutPhaseOneFollowsTheCapabilities) {
  const int64_t T = 2, d = 8;
  Tensor partial = f32({T, d}), out = f32({T, d}), query = f32({d}), newer = f32({1, T, d});
  Tensor gain = f32({d});
  Backend::DepthMixArgs mix;
  mix.query = &query;
  mix.newer = &newer;  // no m, s, o: every bank source a newer entry
  BackendCapabilities stateless;
  stateless.mixes_without_phase1 = true;
  CountingBackend takes(stateless), declines;
  takes.depth_phase2_prenorm(mix, partial, gain, 1e-6f, out);
  EXPECT_EQ(takes.bodies, 1);
  EXPECT_THROW(declines.depth_phase2_prenorm(mix, partial, gain, 1e-6f, out), std::logic_error);
  EXPECT_EQ(declines.bodies, 0);
  mix.query = nullptr;  // the newer entries need the step's query
  EXPECT_THROW(takes.depth_phase2_prenorm(mix, partial, gain, 1e-6f, out), std::logic_error);
  EXPECT_EQ(takes.bodies, 1);
}

TEST(BackendChecks, GatherRowsInRangeAndSampleShapes) {
  CountingBackend be;
  Tensor x = f32({4, 3}), out = f32({2, 3});
  const int32_t rows[2] = {3, 0}, bad[2] = {4, 0};
  be.gather_rows(x, rows, out);
  EXPECT_THROW(be.gather_rows(x, bad, out), std::logic_error);
  Tensor logits = f32({2, 10});
  SampleBatch batch;
  batch.rows.resize(2);
  int32_t ids[2];
  be.sample(logits, batch, ids);
  EXPECT_THROW(be.sample(logits, batch, std::span<int32_t>(ids, 1)), std::logic_error);
  batch.token_ids = {10};  // outside the vocabulary
  EXPECT_THROW(be.sample(logits, batch, ids), std::logic_error);
  batch.token_ids = {9};
  batch.bitmask = {0x7};  // one mask row of (10 + 31) / 32 words
  batch.rows[1].bitmask_row = 0;
  be.sample(logits, batch, ids);
  batch.rows[1].bitmask_row = 1;  // past the batch's one mask row
  EXPECT_THROW(be.sample(logits, batch, ids), std::logic_error);
  EXPECT_EQ(be.bodies, 3);
}

TEST(BackendChecks, TheBf16SwitchFollowsTheCapabilities) {
  CountingBackend plain;
  EXPECT_FALSE(plain.bf16_linear_inputs());
  EXPECT_THROW(plain.set_bf16_linear_inputs(true), std::logic_error);
  plain.set_bf16_linear_inputs(false);
  BackendCapabilities caps;
  caps.bf16_linear_inputs = true;
  CountingBackend takes(caps);
  takes.set_bf16_linear_inputs(true);
  EXPECT_TRUE(takes.bf16_linear_inputs());
}

}  // namespace
}  // namespace attnres
