#include "kernels/cuda/cuda_lt_gemm.h"

#include "kernels/cuda/cuda_check.h"

namespace attnres::cuda {

int pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int alignment = 1;
  while (alignment < 256 && address % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

// The descriptors and the algorithm of one problem. Pointers are set per call (the bias
// pointer is a descriptor attribute; the operands are arguments of cublasLtMatmul).
struct LtGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;  // what the chosen algorithm needs
  float beta = 0.0f;           // 1 with a residual (C), else 0

  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

LtGemm::LtGemm(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

LtGemm::Plan* LtGemm::plan_for(const Key& key, const LtGemmArgs& args) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();

  auto plan = std::make_unique<Plan>();
  const uint64_t R = static_cast<uint64_t>(args.rows), K = static_cast<uint64_t>(args.in),
                 N = static_cast<uint64_t>(args.out_features);
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                              sizeof(transpose)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  const cublasLtEpilogue_t epilogue =
      args.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof(epilogue)));
  if (args.bias) {
    const int32_t bias_type = CUDA_R_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)));
    // The heuristic reads the pointer's alignment; the call sets the real one.
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &args.bias, sizeof(args.bias)));
  }
  // Column-major views: W is [K, N] (op T -> [N, K]), x is [K, R], out / residual [N, R].
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, args.dtype, K, N, K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, args.dtype, K, R, K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, N, R, N));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_32F, N, R, N));
  plan->beta = args.residual ? 1.0f : 0.0f;

  cublasLtMatmulPreference_t preference = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  struct PreferenceGuard {
    cublasLtMatmulPreference_t p;
    ~PreferenceGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{preference};
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference,
                                                    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes_, sizeof(workspace_bytes_)));
  // What the heuristic may assume about the operands (the key's last four fields).
  const uint32_t alignments[] = {
      static_cast<uint32_t>(std::get<7>(key)), static_cast<uint32_t>(std::get<8>(key)),
      static_cast<uint32_t>(std::get<10>(key)), static_cast<uint32_t>(std::get<9>(key))};
  const cublasLtMatmulPreferenceAttributes_t alignment_attributes[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, alignment_attributes[i],
                                                      &alignments[i], sizeof(uint32_t)));
  }

  cublasLtMatmulHeuristicResult_t result{};
  int found_count = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c, plan->d,
                                              preference, 1, &result, &found_count));
  if (found_count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->workspace_bytes = result.workspaceSize;
  } else {
    plan.reset();  // remembered as "no algorithm"
  }
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

bool LtGemm::run(const LtGemmArgs& args, cudaStream_t stream) {
  const bool in_place = args.residual && args.residual == args.out;
  // C's alignment: the residual's, or (no residual: C is unread) the output's.
  const void* c_ptr = args.residual ? static_cast<const void*>(args.residual) : args.out;
  const Key key{args.rows,
                args.in,
                args.out_features,
                static_cast<int>(args.dtype),
                args.bias != nullptr,
                args.residual != nullptr,
                in_place,
                pointer_alignment(args.w),
                pointer_alignment(args.x),
                pointer_alignment(args.out),
                pointer_alignment(c_ptr)};
  Plan* plan = plan_for(key, args);
  if (!plan) return false;
  if (args.bias) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &args.bias, sizeof(args.bias)));
  }
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, plan->op, &alpha, args.w, plan->a, args.x, plan->b,
                              &plan->beta, c_ptr, plan->c, args.out, plan->d, &plan->algo,
                              workspace_, plan->workspace_bytes, stream));
  return true;
}

}  // namespace attnres::cuda
