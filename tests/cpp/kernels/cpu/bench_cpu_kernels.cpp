// Microbenchmark (not a test): bf16 linear throughput of the CPU backend on the 100M model's
// shapes, against the machine's measured copy bandwidth.
// - GEMV (R = 1 and 8): GB/s of weight bytes streamed. "cold" cycles through enough weight
//   copies (>= 512 MiB) that every call reads DRAM, the decode-step situation; "hot" repeats one
//   matrix, which stays in cache when it fits (an upper bound, not a roofline figure).
// - GEMM (prefill: R = 128 and 512 rows, the 100M and 0.6B shapes' projections): GFLOP/s =
//   2 R K N / time.
// Best of several repetitions; run it on an idle machine. `bench_cpu_kernels gemm` runs only
// the GEMM part.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/memory_bandwidth.h"

using namespace attnres;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Tensor random_bf16(int64_t rows, int64_t cols, std::mt19937& rng) {
  Tensor t = Tensor::empty({rows, cols}, DType::BF16);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto* p = t.ptr<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(dist(rng));
  return t;
}

// Best seconds per call over `reps` timed sweeps of all weight copies.
double time_linear(Backend& be, const Tensor& x, std::vector<Tensor>& ws, Tensor& out, int reps) {
  double best = 1e30;
  for (auto& w : ws) be.linear(x, w, nullptr, out);  // warm-up
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    for (auto& w : ws) be.linear(x, w, nullptr, out);
    best = std::min(best, (now_s() - t0) / static_cast<double>(ws.size()));
  }
  return best;
}

// The GEMV table: decode-sized rows, cold (DRAM) and hot weights, against the copy bandwidth.
void run_gemv(Backend* be, std::mt19937& rng) {
  const double copy_gbps = measure_copy_bandwidth_gbps();
  std::printf("copy bandwidth (read + write, 2 x 256 MiB): %.1f GB/s\n\n", copy_gbps);
  const int64_t shapes[][2] = {{512, 1536}, {1536, 512}, {512, 151936}};  // in -> out
  std::printf("%-16s %3s %6s %9s %9s %8s\n", "bf16 GEMV", "R", "mode", "us/call", "GB/s",
              "of copy");
  for (auto& s : shapes) {
    const int64_t in = s[0], out_n = s[1];
    const double bytes = 2.0 * in * out_n;
    const int copies = static_cast<int>(std::max(1.0, (512.0 * (1 << 20)) / bytes));
    std::vector<Tensor> cold;
    for (int i = 0; i < copies; ++i) cold.push_back(random_bf16(out_n, in, rng));
    std::vector<Tensor> hot = {cold[0]};
    for (int64_t r : {1, 8}) {
      Tensor x = Tensor::empty({r, in}, DType::F32);
      for (int64_t i = 0; i < x.numel(); ++i)
        x.ptr<float>()[i] = 0.01f * static_cast<float>(i % 97);
      Tensor out = Tensor::empty({r, out_n}, DType::F32);
      for (auto* mode : {"cold", "hot"}) {
        const bool is_cold = mode[0] == 'c';
        const double t = time_linear(*be, x, is_cold ? cold : hot, out, is_cold ? 5 : 200);
        std::printf("%5lld -> %-7lld %3lld %6s %9.1f %9.1f %7.0f%%\n", (long long)in,
                    (long long)out_n, (long long)r, mode, t * 1e6, bytes / t / 1e9,
                    100.0 * bytes / t / 1e9 / copy_gbps);
      }
    }
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const bool gemm_only = argc > 1 && std::string(argv[1]) == "gemm";
  auto be = make_cpu_backend(0);
  std::printf("backend: %s\n", be->name().c_str());
  std::mt19937 rng(1);
  if (!gemm_only) run_gemv(be.get(), rng);
  // {R, K (in), N (out)}: 100M's q/gate/up (512 -> 1536) and down (1536 -> 512); 0.6B's
  // gate/up (1024 -> 3072) and down (3072 -> 1024).
  const int64_t gemms[][3] = {{512, 512, 1536},  {512, 1536, 512},  {128, 1024, 3072},
                              {128, 3072, 1024}, {512, 1024, 3072}, {512, 3072, 1024}};
  for (auto& g : gemms) {
    const int64_t r = g[0], in = g[1], out_n = g[2];
    std::vector<Tensor> w = {random_bf16(out_n, in, rng)};
    Tensor x = Tensor::empty({r, in}, DType::F32);
    for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = 0.01f * static_cast<float>(i % 97);
    Tensor out = Tensor::empty({r, out_n}, DType::F32);
    const double t = time_linear(*be, x, w, out, 20);
    std::printf("bf16 GEMM R=%lld %lld -> %lld: %.2f ms, %.1f GFLOP/s\n", (long long)r,
                (long long)in, (long long)out_n, t * 1e3, 2.0 * r * in * out_n / t / 1e9);
  }
  return 0;
}
