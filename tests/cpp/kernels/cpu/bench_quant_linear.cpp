// Linear over bf16, int8 (Q8_B32), int6 (Q6_B32), int6k (Q6_K256), int4 (Q4_B32) and int4k
// (Q4_K256) weights at the 0.6B model's shapes:
// - GEMV (R = 1 and 8; q/k/v, gate/up, down and the LM head): us per call and GB/s of weight
//   bytes, every call reading DRAM (enough copies of each matrix, >= 512 MiB, cycled through).
// - GEMM (prefill, R = 128 and 512, gate/up and down): ms per call and GFLOP/s = 2 R K N / t.
// bf16 runs with bf16 linear inputs where the build has AVX512_BF16 (the engine's choice on a
// CPU where vdpbf16ps is the faster, CpuBackend::bf16_linear_inputs_faster). The formats
// are timed in turn, one sweep each, `kRounds` times; each figure is the median of its
// sweeps, so that a machine shared with other work slows all of them alike.
#include "tests/cpp/kernels/cpu/bench_quant_linear.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/quant_format.h"
#include "kernels/cpu/cpu_linear_quant.h"

namespace attnres {
namespace {

constexpr int kRounds = 7;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One [n, k] matrix of random weights in `format` (bf16 or quantized), and `copies` copies of
// it (distinct memory, the same bytes).
std::vector<Tensor> weights(DType format, int64_t n, int64_t k, int copies, std::mt19937& rng) {
  Tensor f = Tensor::empty({n, k}, DType::BF16);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < f.numel(); ++i) f.ptr<uint16_t>()[i] = f32_to_bf16(dist(rng));
  const Tensor first = format == DType::BF16 ? f : quantize_matrix(f, format);
  std::vector<Tensor> out;
  for (int c = 0; c < copies; ++c) {
    Tensor t = Tensor::empty({n, k}, format);
    std::memcpy(t.data, first.data, first.nbytes());
    out.push_back(t);
  }
  return out;
}

// Seconds per call of one sweep over all the copies.
double sweep(Backend& be, const Tensor& x, const std::vector<Tensor>& ws, Tensor& out) {
  const double t0 = now_s();
  for (const Tensor& w : ws) be.linear(x, w, nullptr, out);
  return (now_s() - t0) / static_cast<double>(ws.size());
}

std::string label(DType f) { return f == DType::BF16 ? "bf16" : quant_format_name(f); }

}  // namespace

void run_quant_linear(CpuBackend& be) {
  std::mt19937 rng(7);
  if (CpuBackend::bf16_linear_inputs_supported()) be.set_bf16_linear_inputs(true);
  std::printf(
      "quantized linear kernel: %s; bf16 with %s inputs; medians of %d alternated rounds\n\n",
      cpu::quantized_linear_isa(), be.bf16_linear_inputs() ? "bf16" : "f32", kRounds);
  const DType formats[] = {DType::BF16,    DType::Q8_B32, DType::Q6_B32,
                           DType::Q6_K256, DType::Q4_B32, DType::Q4_K256};
  constexpr size_t kFormats = std::size(formats);
  // in -> out: q (and o), k/v, gate/up, down, LM head.
  const int64_t gemv_shapes[][2] = {
      {1024, 2048}, {1024, 1024}, {1024, 3072}, {3072, 1024}, {1024, 151936}};
  std::printf("%-16s %3s %6s %9s %9s\n", "GEMV in -> out", "R", "format", "us/call", "GB/s");
  for (auto& s : gemv_shapes) {
    const int64_t k = s[0], n = s[1];
    std::vector<std::vector<Tensor>> ws;
    for (DType f : formats) {
      const double bytes = static_cast<double>(nbytes_of({n, k}, f));
      ws.push_back(
          weights(f, n, k, static_cast<int>(std::max(2.0, 512.0 * (1 << 20) / bytes)), rng));
    }
    for (int64_t r : {1, 8}) {
      Tensor x = Tensor::empty({r, k}, DType::F32);
      for (int64_t i = 0; i < x.numel(); ++i)
        x.ptr<float>()[i] = 0.01f * static_cast<float>(i % 97 - 48);
      Tensor out = Tensor::empty({r, n}, DType::F32);
      std::vector<std::vector<double>> times(kFormats);
      for (size_t f = 0; f < kFormats; ++f) sweep(be, x, ws[f], out);  // warm-up
      for (int round = 0; round < kRounds; ++round)
        for (size_t f = 0; f < kFormats; ++f) times[f].push_back(sweep(be, x, ws[f], out));
      for (size_t f = 0; f < kFormats; ++f) {
        const double t = median(times[f]);
        std::printf("%5lld -> %-7lld %3lld %6s %9.1f %9.1f\n", (long long)k, (long long)n,
                    (long long)r, label(formats[f]).c_str(), t * 1e6, ws[f][0].nbytes() / t / 1e9);
      }
    }
  }
  std::printf("\n%-24s %6s %9s %9s\n", "GEMM R, in -> out", "format", "ms/call", "GFLOP/s");
  const int64_t gemms[][3] = {
      {128, 1024, 3072}, {128, 3072, 1024}, {512, 1024, 3072}, {512, 3072, 1024}};
  for (auto& g : gemms) {
    const int64_t r = g[0], k = g[1], n = g[2];
    std::vector<std::vector<Tensor>> ws;
    for (DType f : formats) ws.push_back(weights(f, n, k, 1, rng));
    Tensor x = Tensor::empty({r, k}, DType::F32);
    for (int64_t i = 0; i < x.numel(); ++i)
      x.ptr<float>()[i] = 0.01f * static_cast<float>(i % 97 - 48);
    Tensor out = Tensor::empty({r, n}, DType::F32);
    std::vector<std::vector<double>> times(kFormats);
    for (size_t f = 0; f < kFormats; ++f) sweep(be, x, ws[f], out);
    for (int round = 0; round < kRounds; ++round)
      for (size_t f = 0; f < kFormats; ++f) times[f].push_back(sweep(be, x, ws[f], out));
    for (size_t f = 0; f < kFormats; ++f) {
      const double t = median(times[f]);
      std::printf("%4lld, %5lld -> %-8lld %6s %9.2f %9.1f\n", (long long)r, (long long)k,
                  (long long)n, label(formats[f]).c_str(), t * 1e3, 2.0 * r * k * n / t / 1e9);
    }
  }
  be.set_bf16_linear_inputs(false);
}

}  // namespace attnres
