// CudaBackend::capture_graph and CudaGraph::replay (kernels/cuda/cuda_graph.cpp): a replay
// computes what the captured step computed, eager work between replays never gets memory a
// replay writes, and what cannot be captured is refused with an error. Needs a GPU (skips
// without one); the allocator's pool bookkeeping alone is cuda_allocator_test.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

std::vector<float> host_floats(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(t, v.data());
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// x += y captured once, replayed three times: x0 + 3 y (exact in f32 for these values).
TEST(CudaGraph, ReplaysTheCapturedKernels) {
  SKIP_WITHOUT_CUDA();
  CudaBackend be;
  Tensor x = be.upload(filled_host({1000}, 1.0f));
  Tensor y = be.upload(filled_host({1000}, 0.25f));
  std::unique_ptr<CudaGraph> graph = be.capture_graph([&] { be.add_inplace(x, y); });
  for (float v : host_floats(be, x)) ASSERT_EQ(v, 1.0f);  // captured, not run
  for (int i = 0; i < 3; ++i) graph->replay();
  for (float v : host_floats(be, x)) ASSERT_EQ(v, 1.75f);
}

// A capture is strict: a call that would run once at capture time and be missing from every
// replay (a synchronize, a download, an upload's cudaMalloc) fails it, and the backend is
// usable afterwards.
TEST(CudaGraph, CallsThatCannotBeCapturedFailTheCapture) {
  SKIP_WITHOUT_CUDA();
  CudaBackend be;
  Tensor x = be.upload(filled_host({64}, 2.0f));
  std::vector<float> sink(64);
  const std::vector<std::function<void()>> illegal = {
      [&] { be.synchronize(); },
      [&] { be.download(x, sink.data()); },
      [&] { be.upload(filled_host({64}, 1.0f)); },
  };
  for (size_t i = 0; i < illegal.size(); ++i) {
    EXPECT_THROW(be.capture_graph([&] {
      be.add_inplace(x, x);
      illegal[i]();
    }),
                 std::exception)
        << "call " << i;
  }
  be.add_inplace(x, x);  // eager, after the failed captures
  for (float v : host_floats(be, x)) ASSERT_EQ(v, 4.0f);
  std::unique_ptr<CudaGraph> graph = be.capture_graph([&] { be.add_inplace(x, x); });
  graph->replay();
  for (float v : host_floats(be, x)) ASSERT_EQ(v, 8.0f);
}

// A captured copy reads its pinned staging buffer at replay time: staging it twice in one
// capture, or growing it during the capture, is refused.
TEST(CudaGraph, StagingTwiceOrGrowingItDuringACaptureIsRefused) {
  SKIP_WITHOUT_CUDA();
  CudaBackend be;
  std::mt19937 rng(11);
  Tensor x = be.upload(random_host({10, 16}, DType::F32, rng));
  Tensor a = be.alloc({3, 16}, DType::F32), b = be.alloc({3, 16}, DType::F32);
  const std::vector<int32_t> rows = {4, 0, 9}, other = {1, 2, 3};
  be.gather_rows(x, rows, a);  // eager: sizes the row staging for 3
  EXPECT_NE(error_of([&] {
              be.capture_graph([&] {
                be.gather_rows(x, rows, a);
                be.gather_rows(x, other, b);
              });
            }).find("once"),
            std::string::npos);
  Tensor many = be.alloc({64, 16}, DType::F32);
  const std::vector<int32_t> many_rows(64, 5);
  EXPECT_NE(error_of([&] {
              be.capture_graph([&] { be.gather_rows(x, many_rows, many); });
            }).find("eagerly once first"),
            std::string::npos);
  // One staging per capture is fine, and the replay gathers the staged rows.
  std::unique_ptr<CudaGraph> graph = be.capture_graph([&] { be.gather_rows(x, rows, b); });
  graph->replay();
  EXPECT_EQ(host_floats(be, b), host_floats(be, a));
}

struct Decode {
  ModelConfig config = small_config("block", 4, 2);
  ModelWeights weights;
  CudaBackend be;
  std::unique_ptr<Transformer> model;
  KvCache cache;
  std::vector<Seq> seqs;
  static constexpr int kBlockSize = 4;

  // `count` sequences prefilled eagerly; decode_step() feeds each its next token.
  explicit Decode(int count) {
    RandomWeightOptions opt;
    opt.dtype = DType::BF16;
    opt.seed = 3;
    weights = make_random_weights(config, opt);
    model = std::make_unique<Transformer>(config, weights, be);
    cache = KvCache::allocate(be, config, 8 * count, kBlockSize);
    std::mt19937 rng(9);
    seqs = random_sequences(std::vector<int>(count, 10), kBlockSize, 8 * count, config.vocab_size,
                            rng);
    std::vector<int32_t> rows;
    const BatchMeta prefill =
        make_step(seqs, std::vector<int>(count, 0), std::vector<int>(count, 9), kBlockSize, rows);
    model->forward(prefill, cache, rows);
  }
  BatchMeta decode_step(std::vector<int32_t>& rows) const {
    const int n = static_cast<int>(seqs.size());
    return make_step(seqs, std::vector<int>(n, 9), std::vector<int>(n, 10), kBlockSize, rows);
  }
};

// The captured decode step of a depth-attention model replays to the eager logits bit for
// bit, and eager steps between replays keep their results: none of their blocks is one the
// graph writes (before the allocator's graph pools, the eager step's tensors could land in
// the captured step's freed scratch and be overwritten by the next replay).
TEST(CudaGraph, ReplayGivesTheEagerLogitsAndLeavesEagerTensorsAlone) {
  SKIP_WITHOUT_CUDA();
  Decode d(2);
  std::vector<int32_t> rows;
  const BatchMeta step = d.decode_step(rows);
  const std::vector<float> eager = host_floats(d.be, d.model->forward(step, d.cache, rows));

  Tensor captured;
  std::unique_ptr<CudaGraph> graph =
      d.be.capture_graph([&] { captured = d.model->forward(step, d.cache, rows); });
  EXPECT_GT(d.be.graph_pool_free_bytes(), 0u);  // the step's scratch, held for the graph
  graph->replay();
  EXPECT_EQ(host_floats(d.be, captured), eager);

  // An eager step (same batch: it rewrites the same KV slots with the same values) whose
  // logits and scratch are allocated while the graph lives, and tensors from the caching
  // allocator in the size classes of the step's scratch (upload() would bypass it).
  Tensor between = d.model->forward(step, d.cache, rows);
  std::vector<Tensor> held;
  for (int64_t n : {64, 128, 192, 202, 256, 384}) {
    held.push_back(d.be.alloc({n}, DType::F32));
    d.be.copy(d.be.upload(filled_host({n}, 7.0f)), held.back());
  }
  for (int i = 0; i < 3; ++i) graph->replay();
  EXPECT_EQ(host_floats(d.be, captured), eager);
  EXPECT_EQ(host_floats(d.be, between), eager);
  for (const Tensor& t : held)
    for (float v : host_floats(d.be, t)) ASSERT_EQ(v, 7.0f);
  graph.reset();
  EXPECT_EQ(d.be.graph_pool_free_bytes(), 0u);  // back in the general cache
}

// A replay reads the batch last packed into the staging buffers: it refuses one of another
// layout, or a buffer regrown since the capture; the captured layout prepared again replays.
TEST(CudaGraph, ReplayRefusesAnotherLayoutOrRegrownStaging) {
  SKIP_WITHOUT_CUDA();
  Decode d(3);
  std::vector<int32_t> rows;
  const BatchMeta step = d.decode_step(rows);
  const std::vector<float> eager = host_floats(d.be, d.model->forward(step, d.cache, rows));
  Tensor captured;
  std::unique_ptr<CudaGraph> graph =
      d.be.capture_graph([&] { captured = d.model->forward(step, d.cache, rows); });

  std::vector<int32_t> fewer_rows;
  std::vector<Seq> two(d.seqs.begin(), d.seqs.begin() + 2);
  const BatchMeta fewer = make_step(two, {9, 9}, {10, 10}, Decode::kBlockSize, fewer_rows);
  d.be.prepare_batch(fewer);  // smaller: no regrowth, another layout
  EXPECT_NE(error_of([&] { graph->replay(); }).find("not laid out like"), std::string::npos);
  d.be.prepare_batch(step);
  graph->replay();
  EXPECT_EQ(host_floats(d.be, captured), eager);

  std::vector<int32_t> prefill_rows;
  const BatchMeta big = make_step(d.seqs, {0, 0, 0}, {10, 10, 10}, Decode::kBlockSize,
                                  prefill_rows);  // 30 tokens: the staging grows
  d.model->forward(big, d.cache, prefill_rows);
  d.be.prepare_batch(step);
  EXPECT_NE(error_of([&] { graph->replay(); }).find("capture again"), std::string::npos);
}

}  // namespace
}  // namespace attnres::test
