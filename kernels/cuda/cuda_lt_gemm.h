// The prefill GEMM (more rows than the decode GEMV takes) through cuBLASLt, so the bias and
// the residual add ride in the GEMM's epilogue instead of two more passes over [R, N]:
//   out = x W^T + bias + residual       (out may be residual itself: in place)
// W [N, K] row-major (= column-major [K, N], transposed by the op), x [R, K], out / residual
// [R, N] f32. W and x share one dtype (F32, BF16 or F16; x already rounded to it); the
// accumulation is f32 (CUBLAS_COMPUTE_32F: no TF32 for F32 inputs).
//
// cuBLASLt takes the bias in the output's type, so only an f32 bias is fused (the model
// widens its biases to f32 at load, losslessly; see Transformer's constructor). The order of
// the additions is cuBLASLt's (A*B + C, then the bias), not the CPU's (bias first): the
// prefill path already differs from the CPU at bf16 precision (x is rounded), far coarser.
//
// Choosing an algorithm is a heuristic query of tens of microseconds, so each (shape, dtype,
// epilogue, operand alignment) keeps its descriptors and algorithm after its first call.
// Not thread-safe: one per backend, used on its stream.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace attnres::cuda {

struct LtGemmArgs {
  int64_t rows = 0, in = 0, out_features = 0;  // R, K, N
  cudaDataType_t dtype = CUDA_R_32F;           // of w and x
  const void* w = nullptr;
  const void* x = nullptr;
  const float* bias = nullptr;      // [N] or null
  const float* residual = nullptr;  // [R, N] or null; may equal out
  float* out = nullptr;
};

class LtGemm {
 public:
  // workspace: device memory the GEMMs may use (shared with cuBLAS: same stream, serial).
  LtGemm(void* workspace, size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Enqueues the GEMM; false (nothing enqueued) when cuBLASLt has no algorithm for the
  // problem, remembered per problem: the caller then runs it another way.
  bool run(const LtGemmArgs& args, cudaStream_t stream);

  // How many distinct problems have been planned (found an algorithm or not).
  size_t plans() const { return plans_.size(); }

 private:
  // (R, K, N, dtype, has bias, has residual, in place, alignments of w, x, out, residual)
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, bool, bool, int, int, int, int>;
  struct Plan;
  Plan* plan_for(const Key& key, const LtGemmArgs& args);  // null: no algorithm

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

// The largest power of two, up to 256, that divides the address: what cuBLASLt's heuristic
// may assume about an operand (a row view of a larger tensor is less aligned than its base).
int pointer_alignment(const void* p);

}  // namespace attnres::cuda
