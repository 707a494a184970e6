// Not a test: times one decode step of the 0.6B shapes ("attnres-0.6b", "plain-0.6b",
// random bf16 weights) on the CUDA backend at batch 1 and 64, against the floor set by
// reading every weight once at the measured device copy bandwidth.
//
//   bench_cuda_backend [--model NAME]... [--context N] [--steps N]
//
// Prints, per model and batch: median ms/step (CUDA events around Transformer::forward,
// host work of the step included), the weight-read floor, floor / measured, and the KV bytes
// the step reads (not in the floor); then the same for the step captured once into a CUDA
// graph and replayed (with a bit-exactness check against the eager logits). The bandwidth
// is a 1 GiB cudaMemcpy device-to-device, counting bytes read + written.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/loaded_model.h"
#include "engine/model/transformer.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace attnres {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Device-to-device copy bandwidth in bytes/s (read + written).
double measure_copy_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  CUDA_CHECK(cudaMalloc(&src, bytes));
  CUDA_CHECK(cudaMalloc(&dst, bytes));
  CUDA_CHECK(cudaMemset(src, 1, bytes));  // not zeros: nothing should take a fast path
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < 12; ++i) {
    CUDA_CHECK(cudaEventRecord(a));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= 2) ms.push_back(t);  // two warm-ups
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / (median(ms) * 1e-3);
}

void bench_model(const std::string& name, int context, int steps, double bandwidth) {
  LoadedModel lm = load_builtin_model(name);
  CudaBackend be(0);
  // The depth bank `attnres serve` gives this checkpoint (--depth-bank-dtype auto): bf16 for
  // bf16 weights (a plain model has no bank; the choice changes nothing there).
  const DType bank_dtype =
      lm.weights.dtype == DType::BF16 && be.supports_depth_bank_dtype(DType::BF16) ? DType::BF16
                                                                                   : DType::F32;
  Transformer model(lm.config, lm.weights, be, {}, bank_dtype);
  const ModelConfig& c = lm.config;
  const double floor_ms = static_cast<double>(model.weight_bytes()) / bandwidth * 1e3;
  std::printf(
      "%s: %s, %s depth bank\n  weights read per step %.1f MB -> floor %.3f ms at %.0f "
      "GB/s\n",
      name.c_str(), c.summary().c_str(), storage_dtype_name(bank_dtype).c_str(),
      model.weight_bytes() / 1e6, floor_ms, bandwidth / 1e9);
  for (int batch_size : {1, 64}) {
    const int block_size = 16;
    const int blocks_per_seq = (context + 1 + block_size - 1) / block_size;
    KvCache cache = KvCache::allocate(be, c, batch_size * blocks_per_seq, block_size);
    BatchMeta batch;
    batch.num_tokens = batch_size;
    batch.query_start.push_back(0);
    std::vector<int32_t> rows;
    for (int s = 0; s < batch_size; ++s) {
      std::vector<int32_t> table;
      for (int b = 0; b < blocks_per_seq; ++b) table.push_back(s * blocks_per_seq + b);
      batch.token_ids.push_back((s * 7919 + 13) % c.vocab_size);
      batch.positions.push_back(context);  // attends over `context` cached tokens + itself
      batch.slot_mapping.push_back(table[context / block_size] * block_size + context % block_size);
      batch.query_start.push_back(s + 1);
      batch.context_len.push_back(context + 1);
      batch.block_tables.push_back(table);
      rows.push_back(s);
    }
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<double> ms;
    for (int i = 0; i < steps + 3; ++i) {
      CUDA_CHECK(cudaEventRecord(start, be.stream()));
      Tensor logits = model.forward(batch, cache, rows);
      CUDA_CHECK(cudaEventRecord(stop, be.stream()));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (i >= 3) ms.push_back(t);  // three warm-ups (allocator, cuBLAS heuristics)
    }
    const double step_ms = median(ms);
    const double kv_mb =
        2.0 * c.num_layers * batch_size * (context + 1) * c.num_kv_heads * c.head_dim * 4 / 1e6;
    std::printf(
        "  batch %2d, context %d: eager %.3f ms/step (min %.3f), floor/measured %.2f, "
        "KV read %.1f MB, allocator in use %.1f MB\n",
        batch_size, context, step_ms, *std::min_element(ms.begin(), ms.end()), floor_ms / step_ms,
        kv_mb, be.allocated_bytes() / 1e6);

    // The same step captured into a CUDA graph and replayed (launch gaps removed). The eager
    // steps above warmed the caching allocator and the staging buffers; the graph keeps its
    // blocks to itself (capture_graph). The logits tensor the captured forward returns is
    // held for as long as the graph lives. Replays must give the eager logits bit for bit.
    try {
      Tensor eager = model.forward(batch, cache, rows);
      std::vector<float> eager_host(static_cast<size_t>(eager.numel()));
      be.download(eager, eager_host.data());
      eager = Tensor();
      Tensor captured;
      std::unique_ptr<CudaGraph> graph =
          be.capture_graph([&] { captured = model.forward(batch, cache, rows); });
      std::vector<double> gms;
      for (int i = 0; i < steps + 3; ++i) {
        CUDA_CHECK(cudaEventRecord(start, be.stream()));
        graph->replay();
        CUDA_CHECK(cudaEventRecord(stop, be.stream()));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        if (i >= 3) gms.push_back(t);
      }
      std::vector<float> graph_host(eager_host.size());
      be.download(captured, graph_host.data());
      const bool same = graph_host == eager_host;
      const double graph_ms = median(gms);
      std::printf(
          "  batch %2d, context %d: graph %.3f ms/step (min %.3f), floor/measured %.2f, "
          "logits %s the eager step's\n",
          batch_size, context, graph_ms, *std::min_element(gms.begin(), gms.end()),
          floor_ms / graph_ms, same ? "identical to" : "DIFFER from");
    } catch (const std::exception& e) {
      cudaGetLastError();
      std::printf("  batch %2d: CUDA graph capture failed: %s\n", batch_size, e.what());
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
  }
}

}  // namespace
}  // namespace attnres

int main(int argc, char** argv) {
  using namespace attnres;
  std::vector<std::string> models;
  int context = 256, steps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      models.push_back(argv[++i]);
    } else if (a == "--context" && i + 1 < argc) {
      context = std::atoi(argv[++i]);
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--model NAME]... [--context N] [--steps N]\n", argv[0]);
      return 2;
    }
  }
  if (models.empty()) models = {"attnres-0.6b", "plain-0.6b"};
  if (!cuda_device_available()) {
    std::fprintf(stderr, "no CUDA device: nothing to measure\n");
    return 1;
  }
  try {
    const double bw = measure_copy_bandwidth();
    std::printf("device copy bandwidth (1 GiB D2D, read + written): %.0f GB/s\n", bw / 1e9);
    for (const std::string& m : models) bench_model(m, context, steps, bw);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
