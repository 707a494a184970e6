// bench_cuda_backend --only depth (bench_cuda_depth.cpp): the depth mix's two phases alone.
#pragma once

#include <string>
#include <vector>

namespace attnres {

struct DepthBenchOptions {
  std::vector<int> tokens = {1024, 8192};  // T
  std::vector<int> entries = {2, 4, 8};    // n, the bank entries Phase 1 reads
  std::vector<int> dims = {1024, 2048};    // d
  int queries = 2;                         // S, the sublayers sharing one Phase 1
  int iters = 20;
  std::string json_path;  // where the rows go as JSON too ("": nowhere)
};

// Times depth_phase1 (S queries over n bf16 bank entries) and depth_phase2_prenorm (one
// sublayer's merge of the partial, f32 activations) at prefill shapes on a fresh CudaBackend:
// microseconds per call (median), the bytes each reads and writes, the achieved GB/s and its
// fraction of `bandwidth` (the device copy rate, bytes/s read + written).
void bench_depth(const DepthBenchOptions& options, double bandwidth);

}  // namespace attnres
