// Not a test: times one decode step of the 0.6B shapes ("attnres-0.6b", "plain-0.6b",
// random bf16 weights) on the CUDA backend at batch 1 and 64, against the floor set by
// reading every weight once at the measured device copy bandwidth; and the attention op
// alone against the floor of reading its K/V once.
//
//   bench_cuda_backend [--model NAME|DIR]... [--context N] [--steps N] [--batch B]...
//                      [--kv-dtype bfloat16|float32] [--only step|attention|prefill-attention]
//                      [--pdl on|off]
//   bench_cuda_backend --only prefill [--model NAME|DIR]... [--tokens T]... [--chunk N]
//                      [--linear-input-dtype bfloat16|float32|both]
//                      (bench_cuda_prefill.cpp)
//   bench_cuda_backend --only depth [--tokens T]... [--steps N] [--json PATH]
//                      (bench_cuda_depth.cpp: Phase 1 and Phase 2 alone, T 1K and 8K by
//                      default, 2, 4 and 8 bank entries, d 1024 and 2048, against the copy rate)
//
// Step: prints, per model and batch (--batch, default 1 and 64): median ms/step (CUDA events
// around Transformer::forward, host work of the step included), the weight-read floor,
// floor / measured, and the KV bytes the step reads (not in the floor); then the same for the
// step captured once into a CUDA graph and replayed (with a bit-exactness check against the
// eager logits). The KV cache is --kv-dtype (default bfloat16, what --kv-cache-dtype auto
// gives a bf16 checkpoint).
// Also the launches of one eager step (CudaBackend::launch_counts: our kernels, and calls into
// cuBLAS), and whether they used programmatic dependent launch (--pdl; default: the backend's,
// on for compute capability 9.0+ unless ATTNRES_CUDA_PDL=0), and the levers the environment
// switched on (kernels/cuda/NOTES.md "GEMV levers": the GEMVs', attention's last-block merge,
// the persistent MLP, the bf16 bank push in the residual GEMV's epilogue).
// Attention: the 0.6B layer's attention (16 query heads, 8 KV heads, hd 128, block 16) at
// batch 1 and 64 decode rows, context 1024 and 4096, f32 and bf16 caches: microseconds per
// call (eager: many calls between two events; graph: the calls captured once, replayed), the
// K/V bytes a call reads, the achieved rate and its fraction of the copy bandwidth.
// Prefill attention (only with --only prefill-attention): the attention op on one prefill
// chunk of 1K and 8K tokens from scratch, and 1K after a 4K cached prefix (the tensor-core
// kernel, cuda_prefill_attention.cu), hd 128 and 64, bf16 and f32 caches: microseconds per
// call (eager) and TFLOP/s of the causal work, 4 hd Hq (T P + T^2 / 2) for a chunk of T after
// P cached tokens, to compare with the measured bf16 GEMM rate (PERF.md); beside it the same
// rows by flash-decoding, and short chunks (16..128 rows after 4K) to place the dispatch's
// threshold (kPrefillMinRows).
// The bandwidth is a 1 GiB cudaMemcpy device-to-device, counting bytes read + written.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/loaded_model.h"
#include "engine/model/transformer.h"
#include "kernels/cuda/cuda_attention_dispatch.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cpp/kernels/cuda/bench_cuda_depth.h"
#include "tests/cpp/kernels/cuda/bench_cuda_prefill.h"

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

// Microseconds per call of `call`, `reps` calls between two events (after 3 warm-ups):
// eager, host work and launch gaps included.
template <class F>
double eager_us_per_call(CudaBackend& be, int reps, F&& call) {
  for (int i = 0; i < 3; ++i) call();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, be.stream()));
  for (int i = 0; i < reps; ++i) call();
  CUDA_CHECK(cudaEventRecord(stop, be.stream()));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return ms * 1e3 / reps;
}

// The same with `per_graph` calls captured into one CUDA graph, replayed `replays` times
// (the median replay): the GPU time of a call without launch gaps. 0 when capture fails.
template <class F>
double graph_us_per_call(CudaBackend& be, int per_graph, int replays, F&& call) {
  try {
    std::unique_ptr<CudaGraph> graph = be.capture_graph([&] {
      for (int i = 0; i < per_graph; ++i) call();
    });
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<double> us;
    for (int i = 0; i < replays + 2; ++i) {
      CUDA_CHECK(cudaEventRecord(start, be.stream()));
      graph->replay();
      CUDA_CHECK(cudaEventRecord(stop, be.stream()));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (i >= 2) us.push_back(ms * 1e3 / per_graph);
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return median(us);
  } catch (const std::exception& e) {
    cudaGetLastError();
    std::printf("    (graph capture failed: %s)\n", e.what());
    return 0.0;
  }
}

// The attention op alone at the 0.6B layer's shape: decode rows, every sequence at `context`.
void bench_attention(double bandwidth) {
  const int hq = 16, hkv = 8, hd = 128, block_size = 16;
  CudaBackend be(0);
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, be.device_index()));
  std::printf(
      "\nattention (Hq %d, Hkv %d, hd %d, block %d, decode rows), %d SMs; floor = K/V "
      "bytes / copy bandwidth\n",
      hq, hkv, hd, block_size, sms);
  std::printf("  %-5s %5s %7s %6s %9s %9s %9s %9s %8s\n", "cache", "batch", "context", "splits",
              "eager us", "graph us", "KV MB", "GB/s", "of copy");
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (int batch_size : {1, 64}) {
      for (int context : {1024, 4096}) {
        const int blocks_per_seq = (context + block_size - 1) / block_size;
        const int num_blocks = batch_size * blocks_per_seq;
        KvCacheLayer cache{be.alloc({num_blocks, block_size, hkv, hd}, dtype),
                           be.alloc({num_blocks, block_size, hkv, hd}, dtype)};
        // Not zeros (0x3c3c...: ~0.0115 in both dtypes): no value takes a fast path.
        CUDA_CHECK(cudaMemset(cache.k.data, 0x3c, cache.k.nbytes()));
        CUDA_CHECK(cudaMemset(cache.v.data, 0x3c, cache.v.nbytes()));
        BatchMeta batch;
        batch.num_tokens = batch_size;
        batch.query_start.push_back(0);
        for (int s = 0; s < batch_size; ++s) {
          std::vector<int32_t> table;
          for (int b = 0; b < blocks_per_seq; ++b) table.push_back(s * blocks_per_seq + b);
          batch.token_ids.push_back(1);
          batch.positions.push_back(context - 1);
          batch.slot_mapping.push_back(table[(context - 1) / block_size] * block_size +
                                       (context - 1) % block_size);
          batch.query_start.push_back(s + 1);
          batch.context_len.push_back(context);
          batch.block_tables.push_back(table);
        }
        Tensor q_host = Tensor::empty({batch_size, hq * hd}, DType::F32);
        for (int64_t i = 0; i < q_host.numel(); ++i)
          q_host.ptr<float>()[i] = static_cast<float>((i * 7919) % 2001 - 1000) * 1e-3f;
        Tensor q = be.upload(q_host);
        Tensor out = be.alloc({batch_size, hq * hd}, DType::F32);
        be.prepare_batch(batch);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        auto call = [&] { be.attention(q, cache, batch, hd, scale, out); };
        const double eager = eager_us_per_call(be, 200, call);
        const double graph = graph_us_per_call(be, 50, 10, call);
        const double kv_bytes = 2.0 * batch_size * context * hkv * hd * dtype_size(dtype);
        const double best = graph > 0 ? graph : eager;
        const double rate = kv_bytes / (best * 1e-6);
        const cuda::AttentionSplitPlan plan =
            cuda::plan_attention_splits(batch_size, hq, hkv, context, sms);
        std::printf("  %-5s %5d %7d %6d %9.2f %9.2f %9.2f %9.0f %7.0f%%\n",
                    std::string(dtype_name(dtype)).c_str(), batch_size, context, plan.num_splits,
                    eager, graph, kv_bytes / 1e6, rate / 1e9, 100.0 * rate / bandwidth);
      }
    }
  }
}

// The attention op on one prefill chunk (the tensor-core prefill kernel's work).
void bench_prefill_attention() {
  const int hq = 16, hkv = 8, block_size = 16;
  CudaBackend be(0);
  std::printf("\nprefill attention (Hq %d, Hkv %d, block %d, one chunk, causal)\n", hq, hkv,
              block_size);
  std::printf("  %-5s %4s %6s %6s %10s %9s %8s %12s %8s\n", "cache", "hd", "chunk", "prefix", "us",
              "GFLOP", "TFLOP/s", "flash-dec us", "speedup");
  struct Shape2 {
    int chunk, prefix;
  };
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (int hd : {128, 64}) {
      for (const Shape2 c : {Shape2{1024, 0}, Shape2{8192, 0}, Shape2{1024, 4096}, Shape2{16, 4096},
                             Shape2{32, 4096}, Shape2{64, 4096}, Shape2{128, 4096}}) {
        const int context = c.prefix + c.chunk;
        const int num_blocks = (context + block_size - 1) / block_size;
        KvCacheLayer cache{be.alloc({num_blocks, block_size, hkv, hd}, dtype),
                           be.alloc({num_blocks, block_size, hkv, hd}, dtype)};
        CUDA_CHECK(cudaMemset(cache.k.data, 0x3c, cache.k.nbytes()));  // ~0.0115, not zeros
        CUDA_CHECK(cudaMemset(cache.v.data, 0x3c, cache.v.nbytes()));
        BatchMeta batch;
        batch.num_tokens = c.chunk;
        batch.query_start = {0, c.chunk};
        batch.context_len = {context};
        batch.block_tables.emplace_back();
        for (int b = 0; b < num_blocks; ++b) batch.block_tables[0].push_back(b);
        for (int p = c.prefix; p < context; ++p) {
          batch.token_ids.push_back(1);
          batch.positions.push_back(p);
          batch.slot_mapping.push_back(p);  // blocks in order: slot = position
        }
        Tensor q_host = Tensor::empty({c.chunk, hq * hd}, DType::F32);
        for (int64_t i = 0; i < q_host.numel(); ++i)
          q_host.ptr<float>()[i] = static_cast<float>((i * 7919) % 2001 - 1000) * 1e-3f;
        Tensor q = be.upload(q_host);
        Tensor out = be.alloc({c.chunk, hq * hd}, DType::F32);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        // Every row through one kernel: the tensor-core one (threshold 1), then flash-decoding
        // (a threshold never reached), to place kPrefillMinRows.
        auto time_with = [&](int min_rows) {
          be.set_prefill_min_rows(min_rows);
          be.prepare_batch(batch);
          return eager_us_per_call(be, c.chunk >= 8192 ? 5 : 20,
                                   [&] { be.attention(q, cache, batch, hd, scale, out); });
        };
        const double us = time_with(1);
        const double flash_us = time_with(INT32_MAX);
        be.set_prefill_min_rows(cuda::kPrefillMinRows);
        const double flops = 4.0 * hd * hq *
                             (static_cast<double>(c.chunk) * c.prefix +
                              static_cast<double>(c.chunk) * c.chunk / 2.0);
        std::printf("  %-5s %4d %6d %6d %10.1f %9.1f %8.1f %12.1f %7.2fx\n",
                    std::string(dtype_name(dtype)).c_str(), hd, c.chunk, c.prefix, us, flops / 1e9,
                    flops / (us * 1e-6) / 1e12, flash_us, flash_us / us);
      }
    }
  }
}

void bench_model(const std::string& name, int context, int steps, const std::vector<int>& batches,
                 DType kv_dtype, double bandwidth, const std::string& pdl) {
  // A built-in shape, or a Hugging Face directory (the checkpoint transformers is timed on).
  LoadedModel lm = load_bench_model(name);
  CudaBackend be(0);
  if (!pdl.empty()) be.set_programmatic_launch(pdl == "on");
  be.set_bf16_linear_inputs(lm.weights.dtype == DType::BF16);  // --linear-input-dtype auto's
  // The depth bank `attnres serve` gives this checkpoint (--depth-bank-dtype auto): bf16 for
  // bf16 weights (a plain model has no bank; the choice changes nothing there).
  const DType bank_dtype =
      lm.weights.dtype == DType::BF16 && be.capabilities().depth_bank_dtypes.contains(DType::BF16)
          ? DType::BF16
          : DType::F32;
  Transformer model(lm.config, lm.weights, be, {}, bank_dtype);
  const ModelConfig& c = lm.config;
  const double floor_ms = static_cast<double>(model.weight_bytes()) / bandwidth * 1e3;
  std::printf(
      "%s: %s, %s depth bank\n  weights read per step %.1f MB -> floor %.3f ms at %.0f "
      "GB/s\n",
      name.c_str(), c.summary().c_str(), storage_dtype_name(bank_dtype).c_str(),
      model.weight_bytes() / 1e6, floor_ms, bandwidth / 1e9);
  for (int batch_size : batches) {
    const int block_size = 16;
    const int blocks_per_seq = (context + 1 + block_size - 1) / block_size;
    KvCache cache = KvCache::allocate(be, c, batch_size * blocks_per_seq, block_size, kv_dtype);
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
    CudaBackend::LaunchCounts before, after;
    for (int i = 0; i < steps + 3; ++i) {
      CUDA_CHECK(cudaEventRecord(start, be.stream()));
      before = be.launch_counts();
      Tensor logits = model.forward(batch, cache, rows);
      after = be.launch_counts();
      CUDA_CHECK(cudaEventRecord(stop, be.stream()));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (i >= 3) ms.push_back(t);  // three warm-ups (allocator, cuBLAS heuristics)
    }
    const double step_ms = median(ms);
    const double kv_mb = 2.0 * c.num_layers * batch_size * (context + 1) * c.num_kv_heads *
                         c.head_dim * dtype_size(kv_dtype) / 1e6;
    std::printf(
        "  batch %2d, context %d: eager %.3f ms/step (min %.3f), floor/measured %.2f, "
        "KV read %.1f MB (%s), allocator in use %.1f MB\n",
        batch_size, context, step_ms, *std::min_element(ms.begin(), ms.end()), floor_ms / step_ms,
        kv_mb, storage_dtype_name(kv_dtype).c_str(), be.allocated_bytes() / 1e6);
    // The last eager step's launches (the LM head included; memsets and copies not counted).
    const uint64_t kernels = after.kernels - before.kernels;
    const uint64_t cublas = after.cublas_calls - before.cublas_calls;
    std::printf(
        "  batch %2d: kernel launches per decode step %llu (%llu ours + %llu calls into cuBLAS), "
        "%.1f per layer; programmatic dependent launch %s; levers: deep %s, prefetch %s, "
        "bulk %s, last-block-merge %s, phase1-grouped %s, persistent-mlp %s, push-epilogue %s\n",
        batch_size, static_cast<unsigned long long>(kernels + cublas),
        static_cast<unsigned long long>(kernels), static_cast<unsigned long long>(cublas),
        static_cast<double>(kernels + cublas) / c.num_layers,
        be.programmatic_launch() ? "on" : "off", be.gemv_deep() ? "on" : "off",
        be.gemv_weight_prefetch() ? "on" : "off", be.gemv_bulk() ? "on" : "off",
        be.attention_last_block_merge() ? "on" : "off",
        be.depth_phase1_grouped() ? "on" : "off", be.persistent_mlp() ? "on" : "off",
        be.bank_push_epilogue() ? "on" : "off");

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
    // The caching allocator after the eager steps and the replays (cuda_allocator.h).
    const cuda::CachingAllocator::Stats a = be.allocator_stats();
    std::printf(
        "  allocator: reserved %.1f MB (peak %.1f), in use %.1f, cached %.1f, graph pools %.1f, "
        "peak requested %.1f MB; %zu segments, %zu cudaMalloc, %zu cudaFree\n",
        a.reserved / 1e6, a.peak_reserved / 1e6, a.in_use / 1e6, a.cached / 1e6,
        a.graph_pool_free / 1e6, a.peak_requested / 1e6, a.segments, a.raw_allocations,
        a.raw_frees);
  }
}

}  // namespace
}  // namespace attnres

int main(int argc, char** argv) {
  using namespace attnres;
  std::vector<std::string> models;
  int context = 256, steps = 20;
  DType kv_dtype = DType::BF16;
  std::string only, pdl, linear_inputs, json;
  std::vector<int> prefill_tokens, batches;
  int chunk = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      models.push_back(argv[++i]);
    } else if (a == "--kv-dtype" && i + 1 < argc) {
      try {
        kv_dtype = storage_dtype_from_name(argv[++i], "--kv-dtype");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
      }
    } else if (a == "--only" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "step" || std::string(argv[i + 1]) == "attention" ||
                std::string(argv[i + 1]) == "prefill-attention" ||
                std::string(argv[i + 1]) == "prefill" || std::string(argv[i + 1]) == "depth")) {
      only = argv[++i];
    } else if (a == "--tokens" && i + 1 < argc) {
      prefill_tokens.push_back(std::max(1, std::atoi(argv[++i])));
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--chunk" && i + 1 < argc) {
      chunk = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--pdl" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "on" || std::string(argv[i + 1]) == "off")) {
      pdl = argv[++i];
    } else if (a == "--linear-input-dtype" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "bfloat16" || std::string(argv[i + 1]) == "float32" ||
                std::string(argv[i + 1]) == "both")) {
      linear_inputs = argv[++i];
    } else if (a == "--batch" && i + 1 < argc) {
      batches.push_back(std::max(1, std::atoi(argv[++i])));
    } else if (a == "--context" && i + 1 < argc) {
      context = std::atoi(argv[++i]);
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--model NAME|DIR]... [--context N] [--steps N] [--batch B]... "
          "[--kv-dtype bfloat16|float32] "
          "[--only step|attention|prefill-attention|prefill|depth] "
          "[--tokens T]... [--chunk N] [--pdl on|off] "
          "[--linear-input-dtype bfloat16|float32|both] [--json PATH]\n",
          argv[0]);
      return 2;
    }
  }
  if (models.empty()) models = {"attnres-0.6b", "plain-0.6b"};
  if (batches.empty()) batches = {1, 64};
  if (!cuda_device_available()) {
    std::fprintf(stderr, "no CUDA device: nothing to measure\n");
    return 1;
  }
  try {
    const double bw = measure_copy_bandwidth();
    std::printf("device copy bandwidth (1 GiB D2D, read + written): %.0f GB/s\n", bw / 1e9);
    if (only == "prefill-attention") {
      bench_prefill_attention();
      return 0;
    }
    if (only == "depth") {
      DepthBenchOptions options;
      if (!prefill_tokens.empty()) options.tokens = prefill_tokens;
      options.iters = steps;
      options.json_path = json;
      bench_depth(options, bw);
      return 0;
    }
    if (only == "prefill") {
      if (prefill_tokens.empty()) prefill_tokens = {1024, 8192};
      for (const std::string& m : models)
        bench_prefill(m, prefill_tokens, chunk, steps, linear_inputs);
      return 0;
    }
    if (only != "attention")
      for (const std::string& m : models)
        bench_model(m, context, steps, batches, kv_dtype, bw, pdl);
    if (only != "step") bench_attention(bw);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
