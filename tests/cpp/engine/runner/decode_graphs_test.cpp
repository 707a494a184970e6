// Decode steps run as step graphs (engine/runner/decode_graphs.h), checked on the CPU with a
// backend that "records" a step by keeping its closure and "replays" it by running it again,
// refusing, as a CUDA graph does, a replay whose batch was not staged since the last one or
// is laid out unlike the recorded one. So the padding, the buckets, the warm-up / capture /
// replay sequence and the validation run here; the CPU backend is batch-invariant, so a
// runner with graphs must give bit for bit the logits and K/V of one without.
// tests/cpp/kernels/cuda/cuda_decode_graphs_test.cpp runs the same steps on real CUDA graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "engine/core/error.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/decode_graphs.h"
#include "engine/runner/transformer_runner.h"
#include "engine/sched/batch_builder.h"
#include "engine/sched/block_manager.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/engine/runner/decode_graphs_test_util.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres {
namespace {

struct Layout {
  int tokens = 0, seqs = 0, width = 0;
  bool operator==(const Layout&) const = default;
};

Layout layout_of(const BatchMeta& batch) {
  size_t width = 1;
  for (const auto& table : batch.block_tables) width = std::max(width, table.size());
  return {batch.num_tokens, batch.num_seqs(), static_cast<int>(width)};
}

class RecordingBackend;

class RecordedStep : public StepGraph {
 public:
  RecordedStep(RecordingBackend& backend, std::function<void()> record, Layout layout)
      : backend_(backend), record_(std::move(record)), layout_(layout) {}
  void replay() override;
  bool stale() const override { return stale_; }
  void make_stale() { stale_ = true; }

 private:
  RecordingBackend& backend_;
  std::function<void()> record_;
  Layout layout_;
  bool stale_ = false;
};

class RecordingBackend : public CpuBackend {
 public:
  RecordingBackend() : CpuBackend(1) {}
  const BackendCapabilities& capabilities() const override { return capabilities_; }
  void prepare_batch(const BatchMeta& batch) override {
    staged_ = layout_of(batch);
    staged_since_replay_ = true;
  }
  std::unique_ptr<StepGraph> capture_step_graph(const std::function<void()>& record) override {
    if (fail_captures) throw Error("recording refused (test)");
    staged_since_replay_ = false;
    record();  // the host code runs at capture time, as under CUDA
    EXPECT_TRUE(staged_since_replay_) << "the recorded step staged no batch";
    auto graph = std::make_unique<RecordedStep>(*this, record, staged_);
    last = graph.get();
    ++captures;
    return graph;
  }

  // What a CUDA graph's replay checks before it launches.
  void check_replay(const Layout& recorded) {
    ASSERT_TRUE(staged_since_replay_) << "a replay without a batch staged since the last one";
    ASSERT_EQ(staged_, recorded) << "a replay of a batch laid out unlike the recorded one";
    staged_since_replay_ = false;
    ++replays;
  }

  bool fail_captures = false;
  int captures = 0, replays = 0;
  RecordedStep* last = nullptr;

 private:
  // The CPU's, with step graphs.
  BackendCapabilities capabilities_ = [] {
    BackendCapabilities c = cpu_backend_capabilities();
    c.step_graphs = true;
    return c;
  }();
  Layout staged_;
  bool staged_since_replay_ = false;
};

void RecordedStep::replay() {
  backend_.check_replay(layout_);
  record_();
}

struct Pair {
  explicit Pair(const ModelConfig& config, const ModelWeights& weights, int blocks, int block_size,
                int max_graph_batch)
      : eager_model(config, weights, eager_backend),
        graph_model(config, weights, graph_backend),
        eager(eager_model, blocks, block_size, RunnerOptions{DType::F32, max_graph_batch}),
        graphs(graph_model, blocks, block_size, RunnerOptions{DType::F32, max_graph_batch}) {}
  CpuBackend eager_backend{1};  // supports no graphs: every step eagerly
  RecordingBackend graph_backend;
  Transformer eager_model, graph_model;
  TransformerRunner eager, graphs;
};

// What TransformerRunner asks: the LM head's rows are the sampled rows, then the logit rows.
bool takes(const DecodeGraphs& graphs, const StepBatch& step) {
  std::vector<int32_t> head_rows(step.sample_rows.begin(), step.sample_rows.end());
  head_rows.insert(head_rows.end(), step.logit_rows.begin(), step.logit_rows.end());
  return graphs.takes(step.meta, head_rows, step.wants_depth_weights());
}

class DecodeGraphsMatchEager : public ::testing::TestWithParam<const char*> {};

// Decode steps of 1..9 sequences (max_graph_batch 8: 9 runs eagerly) whose contexts cross
// block boundaries, so rows and block-table widths move between buckets, each bucket warming
// up, recording and replaying; interleaved with prefill steps, which run eagerly.
TEST_P(DecodeGraphsMatchEager, LogitsAndCacheBitForBit) {
  const ModelConfig config = test::tp_test_config(GetParam());
  const ModelWeights weights = make_random_weights(config, {DType::F32, 5});
  const int block_size = 4, blocks = 64;
  Pair pair(config, weights, blocks, block_size, 8);
  ASSERT_NE(pair.graphs.decode_graphs(), nullptr);
  EXPECT_EQ(pair.eager.decode_graphs(), nullptr);

  test::DecodeSchedule schedule(config.vocab_size, blocks, block_size, 9, 11);
  const std::vector<std::vector<int>> rounds = test::decode_rounds();
  StepResult want, got;
  for (size_t step = 0; step < schedule.steps(rounds); ++step) {
    const StepBatch batch = schedule.next(rounds);
    pair.eager.execute(batch, want);
    pair.graphs.execute(batch, got);
    ASSERT_EQ(got.logits, want.logits) << "step " << step;
  }
  const DecodeGraphs& graphs = *pair.graphs.decode_graphs();
  EXPECT_GT(graphs.graphs_captured(), 3);
  EXPECT_GT(graphs.replays(), graphs.graphs_captured());
  EXPECT_EQ(graphs.replays(), pair.graph_backend.replays);
  EXPECT_EQ(graphs.graphs_captured(), pair.graph_backend.captures);
  EXPECT_TRUE(graphs.capture_error().empty());

  // The engine's blocks hold the same K/V: padding rows wrote only the padding blocks.
  for (size_t l = 0; l < pair.eager.cache().layers.size(); ++l) {
    for (const bool k : {true, false}) {
      const Tensor& e = k ? pair.eager.cache().layers[l].k : pair.eager.cache().layers[l].v;
      const Tensor& g = k ? pair.graphs.cache().layers[l].k : pair.graphs.cache().layers[l].v;
      const size_t n = static_cast<size_t>(e.numel());
      ASSERT_GT(static_cast<size_t>(g.numel()), n);  // the padding blocks come after
      EXPECT_TRUE(std::equal(e.ptr<float>(), e.ptr<float>() + n, g.ptr<float>()))
          << "layer " << l << (k ? " K" : " V");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PlainAndAttnRes, DecodeGraphsMatchEager,
                         ::testing::Values("", "full", "delta_v"), [](const auto& info) {
                           return std::string(*info.param ? info.param : "plain");
                         });

TEST(DecodeGraphs, BucketsArePowersOfTwo) {
  EXPECT_EQ(decode_graph_bucket(1), 1);
  EXPECT_EQ(decode_graph_bucket(2), 2);
  EXPECT_EQ(decode_graph_bucket(3), 4);
  EXPECT_EQ(decode_graph_bucket(64), 64);
  EXPECT_EQ(decode_graph_bucket(65), 128);
  EXPECT_EQ(DecodeGraphs::padding_blocks(8, 4), 2);
  EXPECT_EQ(DecodeGraphs::padding_blocks(9, 4), 3);
}

// A failed recording leaves its bucket eager (the step still computes), with the reason kept.
TEST(DecodeGraphs, AFailedCaptureRunsEagerly) {
  const ModelConfig config = test::tp_test_config("block");
  const ModelWeights weights = make_random_weights(config, {DType::F32, 6});
  Pair pair(config, weights, 32, 4, 4);
  pair.graph_backend.fail_captures = true;
  test::DecodeSchedule schedule(config.vocab_size, 32, 4, 3, 5);
  const std::vector<std::vector<int>> rounds = {{0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {1}, {1}, {1}};
  StepResult want, got;
  for (size_t step = 0; step < schedule.steps(rounds); ++step) {
    const StepBatch batch = schedule.next(rounds);
    pair.eager.execute(batch, want);
    pair.graphs.execute(batch, got);
    ASSERT_EQ(got.logits, want.logits) << "step " << step;
  }
  EXPECT_EQ(pair.graphs.decode_graphs()->replays(), 0);
  EXPECT_NE(pair.graphs.decode_graphs()->capture_error().find("recording refused"),
            std::string::npos);
}

// A graph that can no longer replay (CUDA: its staging buffer was regrown by a larger batch)
// is recorded again on its bucket's next step.
TEST(DecodeGraphs, AStaleGraphIsRecordedAgain) {
  const ModelConfig config = test::tp_test_config("");
  const ModelWeights weights = make_random_weights(config, {DType::F32, 7});
  Pair pair(config, weights, 32, 4, 4);
  test::DecodeSchedule schedule(config.vocab_size, 32, 4, 2, 3);
  const std::vector<std::vector<int>> rounds = {{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}};
  StepResult want, got;
  for (size_t step = 0; step < schedule.steps(rounds); ++step) {
    const StepBatch batch = schedule.next(rounds);
    if (step == 4) {  // prefill, warm-up, capture, replay: then the graph goes stale
      ASSERT_NE(pair.graph_backend.last, nullptr);
      pair.graph_backend.last->make_stale();
    }
    pair.eager.execute(batch, want);
    pair.graphs.execute(batch, got);
    ASSERT_EQ(got.logits, want.logits) << "step " << step;
  }
  EXPECT_EQ(pair.graph_backend.captures, 2);
}

// A replay runs none of the ops' host checks: the runner refuses a bad decode batch itself.
TEST(DecodeGraphs, ABadBatchIsRefusedBeforeAnyReplay) {
  const ModelConfig config = test::tp_test_config("");
  const ModelWeights weights = make_random_weights(config, {DType::F32, 8});
  const int block_size = 4, blocks = 16;
  Pair pair(config, weights, blocks, block_size, 4);
  test::DecodeSchedule schedule(config.vocab_size, blocks, block_size, 2, 3);
  const std::vector<std::vector<int>> rounds = {{0, 1}, {0, 1}, {0, 1}, {0, 1}};
  StepResult result;
  for (size_t step = 0; step + 1 < schedule.steps(rounds); ++step) {
    pair.graphs.execute(schedule.next(rounds), result);  // prefill, warm-up, capture, replay
  }
  const StepBatch good = schedule.next(rounds);
  ASSERT_TRUE(takes(*pair.graphs.decode_graphs(), good));
  const int replays = pair.graph_backend.replays;
  auto refused = [&](const char* what, auto&& corrupt) {
    StepBatch bad = good;
    corrupt(bad.meta);
    try {
      pair.graphs.execute(bad, result);
      ADD_FAILURE() << "accepted a batch with " << what;
    } catch (const std::exception& e) {  // an internal error: the engine built a bad batch
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused("token id", [&](BatchMeta& m) { m.token_ids[1] = config.vocab_size; });
  refused("slot", [&](BatchMeta& m) { m.slot_mapping[0] = blocks * block_size; });
  refused("block id", [&](BatchMeta& m) { m.block_tables[1][0] = blocks; });  // a padding block
  refused("position", [&](BatchMeta& m) { m.positions[0] = m.context_len[0]; });
  refused("blocks", [&](BatchMeta& m) {
    m.context_len[1] = 1000;
    m.positions[1] = 999;
  });
  EXPECT_EQ(pair.graph_backend.replays, replays);
  pair.graphs.execute(good, result);  // and the runner goes on
  EXPECT_EQ(pair.graph_backend.replays, replays + 1);
}

// Only decode steps whose logit rows are every row in order, without depth weights, up to
// max_batch sequences.
TEST(DecodeGraphs, TakesOnlyPlainDecodeSteps) {
  const ModelConfig config = test::tp_test_config("full");
  const ModelWeights weights = make_random_weights(config, {DType::F32, 9});
  Pair pair(config, weights, 32, 4, 2);
  const DecodeGraphs& graphs = *pair.graphs.decode_graphs();
  test::DecodeSchedule schedule(config.vocab_size, 32, 4, 3, 2);
  const std::vector<std::vector<int>> rounds = {{0, 1}, {0, 1, 2}};
  const StepBatch prefill = schedule.next(rounds);
  EXPECT_FALSE(takes(graphs, prefill));
  const StepBatch two = schedule.next(rounds);
  EXPECT_TRUE(takes(graphs, two));
  StepBatch reordered = two;
  std::swap(reordered.logit_rows[0], reordered.logit_rows[1]);
  EXPECT_FALSE(takes(graphs, reordered));
  StepBatch depth = two;
  depth.depth_rows = {0};
  EXPECT_FALSE(takes(graphs, depth));
  EXPECT_FALSE(takes(graphs, schedule.next(rounds)));  // 3 sequences > max_batch 2
  // Rows sampled on the device come first in the LM head's rows: sample_rows then logit_rows.
  StepBatch split = two;
  split.sample_rows = {0};
  split.logit_rows = {1};
  EXPECT_TRUE(takes(graphs, split));
  std::swap(split.sample_rows, split.logit_rows);
  EXPECT_FALSE(takes(graphs, split));
}

}  // namespace
}  // namespace attnres
