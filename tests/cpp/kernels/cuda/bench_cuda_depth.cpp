// bench_cuda_backend --only depth: Phase 1 and Phase 2 of the depth mix (docs/ATTNRES.md §3)
// alone, at prefill shapes, against the device copy rate. The public AttnRes kernels time the
// same shapes in clients/bench/depth_peers/bench_depth_peers.py, which reads this bench's JSON
// (--json) and prints both side by side.
//
// Bytes per call, what the kernels must move at the least (each tensor once):
//   Phase 1: reads the n bf16 bank entries [n, T, d] and the S f32 queries [S, d]; writes m and
//            s [S, T] f32 and o [S, T, d] f32 (the engine keeps o unnormalised in f32: Phase 2
//            rescales it by its own maximum).
//   Phase 2: reads m, s [T] and o [T, d] of one sublayer, the partial [T, d] f32, the query and
//            the norm gain [d]; writes the normalised sublayer input [T, d] f32.
// The inputs are deterministic patterns (no zeros, no NaN); the values do not change the work.
#include "tests/cpp/kernels/cuda/bench_cuda_depth.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace attnres {
namespace {

double median_us(CudaBackend& be, int iters, const auto& work) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int i = 0; i < iters + 3; ++i) {
    CUDA_CHECK(cudaEventRecord(start, be.stream()));
    work();
    CUDA_CHECK(cudaEventRecord(stop, be.stream()));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) us.push_back(1e3 * ms);  // three warm-ups
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// A host tensor of `shape` holding a small deterministic pattern in (-1, 1).
Tensor pattern(const Shape& shape, int salt) {
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.ptr<float>()[i] = static_cast<float>((i * 7919 + salt * 104729) % 2001 - 1000) * 1e-3f;
  }
  return t;
}

struct Row {
  int phase, tokens, entries, d, queries;
  double us, read_bytes, written_bytes;
};

}  // namespace

void bench_depth(const DepthBenchOptions& options, double bandwidth) {
  CudaBackend be(0);
  const int S = options.queries;
  std::printf("\ndepth mix alone (bf16 bank, f32 activations, S = %d queries per Phase 1)\n", S);
  std::printf("  %5s %6s %2s %5s %10s %10s %10s %8s %7s\n", "phase", "T", "n", "d", "us", "read MB",
              "write MB", "GB/s", "of copy");
  std::vector<Row> rows;
  for (const int d : options.dims) {
    for (const int T : options.tokens) {
      for (const int n : options.entries) {
        // Phase 1: the bank written in bf16 from an f32 pattern (how entries enter it).
        Tensor bank_f32 = be.upload(pattern({n, T, d}, 1));
        Tensor bank = be.alloc({n, T, d}, DType::BF16);
        be.copy(bank_f32, bank);
        bank_f32 = Tensor();
        Tensor queries = be.upload(pattern({S, d}, 2));
        Tensor m = be.alloc({S, T}, DType::F32), s = be.alloc({S, T}, DType::F32);
        Tensor o = be.alloc({S, T, d}, DType::F32);
        const float eps = 1e-6f;
        const double p1_us =
            median_us(be, options.iters, [&] { be.depth_phase1(queries, bank, n, eps, m, s, o); });
        const double td = static_cast<double>(T) * d;
        rows.push_back(
            {1, T, n, d, S, p1_us, n * td * 2 + S * d * 4.0, S * (2.0 * T * 4) + S * td * 4});
        // Phase 2 of sublayer 0 over that state, fused with its PreNorm.
        Tensor partial = be.upload(pattern({T, d}, 3));
        Tensor gain = be.upload(pattern({d}, 4));
        Tensor out = be.alloc({T, d}, DType::F32);
        Tensor m0 = m.row(0), s0 = s.row(0), o0 = o.row(0), q0 = queries.row(0);
        Backend::DepthMixArgs mix;
        mix.m = &m0;
        mix.s = &s0;
        mix.o = &o0;
        mix.query = &q0;
        mix.bias = 0.25f;
        const double p2_us = median_us(
            be, options.iters, [&] { be.depth_phase2_prenorm(mix, partial, gain, eps, out); });
        rows.push_back({2, T, n, d, S, p2_us, 2.0 * T * 4 + td * 4 + td * 4 + 2.0 * d * 4, td * 4});
        for (size_t k = rows.size() - 2; k < rows.size(); ++k) {
          const Row& r = rows[k];
          const double rate = (r.read_bytes + r.written_bytes) / (r.us * 1e-6);
          std::printf("  %5d %6d %2d %5d %10.1f %10.1f %10.1f %8.0f %6.0f%%\n", r.phase, r.tokens,
                      r.entries, r.d, r.us, r.read_bytes / 1e6, r.written_bytes / 1e6, rate / 1e9,
                      100.0 * rate / bandwidth);
        }
      }
    }
  }
  if (options.json_path.empty()) return;
  FILE* f = std::fopen(options.json_path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", options.json_path.c_str());
    return;
  }
  std::fprintf(f, "{\"copy_bandwidth_bytes_per_s\": %.0f, \"rows\": [\n", bandwidth);
  for (size_t k = 0; k < rows.size(); ++k) {
    const Row& r = rows[k];
    std::fprintf(f,
                 "  {\"phase\": %d, \"tokens\": %d, \"entries\": %d, \"d\": %d, \"queries\": %d, "
                 "\"us\": %.3f, \"read_bytes\": %.0f, \"written_bytes\": %.0f}%s\n",
                 r.phase, r.tokens, r.entries, r.d, r.queries, r.us, r.read_bytes, r.written_bytes,
                 k + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
  std::printf("  (rows written to %s)\n", options.json_path.c_str());
}

}  // namespace attnres
