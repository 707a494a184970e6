// bench_cuda_backend --only prefill: prefill on the CUDA backend (issue #14's acceptance
// figures; part of that binary, so the GPU session carries one bench). For each model and
// prompt length T: the forward of a T-token prompt (one sequence, no cached prefix; in chunks
// of --chunk tokens like the server's chunked prefill when given), timed with CUDA events
// (median of --iters after two warm-ups), as tokens/s and as a FLOP rate against the bf16
// GEMM rate measured in the same run; and the time to first token of a 1024-token prompt
// (its forward, the LM head of the last row included, without sampling or the server): the
// 1024-token row.
//
//   bench_cuda_backend --only prefill [--model NAME|DIR]... [--tokens T]... [--chunk N]
//                      [--steps N (iterations)] [--linear-input-dtype bfloat16|float32|both]
//
// --linear-input-dtype (the server's flag): the GEMM inputs written in bf16 by their producers
// (bfloat16, the default for bf16 weights, as auto picks) or f32 and converted by each linear
// (float32); both: each length timed both ways in the same run, with the ratio
// (kernels/cuda/NOTES.md, "bf16 activations into the prefill GEMMs").
//
// NAME: a built-in shape (plain-0.6b, attnres-0.6b, ...); DIR: a Hugging Face directory.
// Defaults: the bench's models, T = 1024 and 8192, whole prompts.
// FLOPs counted: the linears, 2 * T * (weights of every projection), and the causal attention,
// 2 * 2 * (T^2 / 2) * head_dim * query heads per layer (QK^T and PV over the lower triangle);
// the LM head of the last row and everything elementwise are left out. The GEMM rate is
// cublasGemmEx bf16 x bf16 -> f32 at the model's MLP shape [T, d] x [d, ffn], the median of
// 10 after 3 warm-ups.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/loaded_model.h"
#include "engine/model/transformer.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "tests/cpp/kernels/cuda/bench_cuda_prefill.h"

namespace attnres {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Milliseconds of `work` on the backend's stream: median of `iters` after two warm-ups.
template <class F>
double median_ms(CudaBackend& be, int iters, F&& work) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < iters + 2; ++i) {
    CUDA_CHECK(cudaEventRecord(start, be.stream()));
    work();
    CUDA_CHECK(cudaEventRecord(stop, be.stream()));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (i >= 2) ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return median(ms);
}

// bf16 GEMM rate in FLOP/s: [m, k] x [k, n] -> f32, the tensor cores' best case for a
// prefill projection of this shape.
double measure_gemm_rate(int m, int k, int n) {
  void *a = nullptr, *b = nullptr, *c = nullptr;
  CUDA_CHECK(cudaMalloc(&a, size_t(m) * k * 2));
  CUDA_CHECK(cudaMalloc(&b, size_t(k) * n * 2));
  CUDA_CHECK(cudaMalloc(&c, size_t(m) * n * 4));
  CUDA_CHECK(cudaMemset(a, 0x3c, size_t(m) * k * 2));  // not zeros: no fast path
  CUDA_CHECK(cudaMemset(b, 0x3c, size_t(k) * n * 2));
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.0f, beta = 0.0f;
  std::vector<double> ms;
  for (int i = 0; i < 13; ++i) {
    CUDA_CHECK(cudaEventRecord(start));
    // Column-major: C [n, m] = B^T [n, k] x A^T [k, m], i.e. row-major [m, k] x [k, n].
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, n,
                              a, CUDA_R_16BF, k, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (i >= 3) ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * m * k * n / (median(ms) * 1e-3);
}

// One sequence's prompt of `tokens` tokens in chunks of `chunk` (0: whole): the batches of
// the successive forwards, positions continuing, each attending over what came before.
std::vector<BatchMeta> prompt_chunks(const ModelConfig& c, int tokens, int chunk, int block_size) {
  if (chunk <= 0) chunk = tokens;
  std::vector<int32_t> table;
  for (int b = 0; b * block_size < tokens; ++b) table.push_back(b);
  std::vector<BatchMeta> chunks;
  for (int begin = 0; begin < tokens; begin += chunk) {
    const int end = std::min(tokens, begin + chunk);
    BatchMeta batch;
    batch.num_tokens = end - begin;
    batch.query_start = {0, end - begin};
    batch.context_len = {end};
    batch.block_tables = {table};
    for (int p = begin; p < end; ++p) {
      batch.token_ids.push_back((p * 7919 + 13) % c.vocab_size);
      batch.positions.push_back(p);
      batch.slot_mapping.push_back(p);  // blocks 0, 1, ... in order: slot = position
    }
    chunks.push_back(std::move(batch));
  }
  return chunks;
}

}  // namespace

LoadedModel load_bench_model(const std::string& arg) {
  return arg.find('/') != std::string::npos ? load_model(arg) : load_builtin_model(arg);
}

void bench_prefill(const std::string& name, const std::vector<int>& lengths, int chunk, int iters,
                   const std::string& linear_inputs) {
  LoadedModel lm = load_bench_model(name);
  CudaBackend be(0);
  std::vector<bool> act_settings = {lm.weights.dtype == DType::BF16};
  if (linear_inputs == "bfloat16" || linear_inputs == "float32") {
    act_settings = {linear_inputs == "bfloat16"};
  }
  if (linear_inputs == "both") act_settings = {true, false};
  const DType bank_dtype =
      lm.weights.dtype == DType::BF16 && be.capabilities().depth_bank_dtypes.contains(DType::BF16)
          ? DType::BF16
          : DType::F32;
  Transformer model(lm.config, lm.weights, be, {}, bank_dtype);
  const ModelConfig& c = lm.config;
  const double linear_weights =
      double(c.num_layers) *
      (double(c.hidden_size) * (c.num_heads + 2.0 * c.num_kv_heads) * c.head_dim +
       double(c.num_heads) * c.head_dim * c.hidden_size +
       3.0 * c.hidden_size * c.intermediate_size);
  std::printf("%s: %s, %s depth bank, chunk %s\n", name.c_str(), c.summary().c_str(),
              storage_dtype_name(bank_dtype).c_str(),
              chunk > 0 ? std::to_string(chunk).c_str() : "whole prompt");
  const int block_size = 16;
  for (int tokens : lengths) {
    const std::vector<BatchMeta> chunks = prompt_chunks(c, tokens, chunk, block_size);
    KvCache cache =
        KvCache::allocate(be, c, (tokens + block_size - 1) / block_size, block_size, DType::BF16);
    const double gemm_rate = measure_gemm_rate(tokens, c.hidden_size, c.intermediate_size);
    std::vector<double> times;
    for (bool bf16 : act_settings) {
      be.set_bf16_linear_inputs(bf16);
      const double ms = median_ms(be, iters, [&] {
        for (const BatchMeta& batch : chunks) {
          // Only the final chunk wants a logits row (its last token): the first token's.
          std::vector<int32_t> rows;
          if (&batch == &chunks.back()) rows.push_back(batch.num_tokens - 1);
          Tensor logits = model.forward(batch, cache, rows);
        }
      });
      times.push_back(ms);
      const double attention_flops =
          2.0 * 2.0 * (double(tokens) * tokens / 2.0) * c.head_dim * c.num_heads * c.num_layers;
      const double flops = 2.0 * tokens * linear_weights + attention_flops;
      const double rate = flops / (ms * 1e-3);
      std::printf(
          "  %5d tokens, bf16 activations %-3s: %8.2f ms, %9.0f tok/s, %6.1f TFLOP/s (linears "
          "%.2f + attention %.2f TFLOP), bf16 GEMM %d x %d x %d in the same run %.1f TFLOP/s -> "
          "%.0f%% of it\n",
          tokens, bf16 ? "on" : "off", ms, tokens / (ms * 1e-3), rate / 1e12,
          2.0 * tokens * linear_weights / 1e12, attention_flops / 1e12, tokens, c.hidden_size,
          c.intermediate_size, gemm_rate / 1e12, 100.0 * rate / gemm_rate);
    }
    if (times.size() == 2) {
      std::printf("  %5d tokens: bf16 activations on / off = %.3f (%.2f ms saved)\n", tokens,
                  times[0] / times[1], times[1] - times[0]);
    }
  }
}

}  // namespace attnres
