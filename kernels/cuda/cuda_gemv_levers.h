// The decode GEMVs' experimental levers (kernels/cuda/NOTES.md "GEMV levers"): switches a
// CudaBackend reads from the environment once, when it is built, and that its GEMV launchers
// (cuda_gemv.cu, cuda_gemv_prenorm.cu) consult at each launch. Off by default: the kernels of
// the backend without them. Each lever keeps every output's reduction order, so the outputs
// have the same bits on or off; what they change is how the weight bytes are fetched.
// A plain C++ header, apart from cuda_launch.h so that the kernels which ignore the levers do
// not depend on it.
#pragma once

#include <atomic>
#include <memory>

namespace attnres::cuda {

struct GemvLevers {
  // ATTNRES_CUDA_GEMV_DEEP: a lane issues kGemvDeepLoads 16-byte weight loads before it
  // consumes the first (gate and up rows together in the SwiGLU GEMV), instead of row_dot's
  // unrolled loop of 4.
  std::atomic<bool> deep{false};
  // ATTNRES_CUDA_PDL_PREFETCH: each warp asks L2 for its weight rows (prefetch.L2, one
  // 128-byte line per lane in turn) before griddepcontrol.wait, so under programmatic
  // dependent launch the rows stream in while the kernel ahead still runs, and before the
  // PreNorm prologue's barriers. Weights do not change within a step: nothing the kernel ahead
  // writes is read early.
  std::atomic<bool> weight_prefetch{false};
  // ATTNRES_CUDA_GEMV_BULK: each warp has the TMA copy its weight rows into shared memory
  // (cp.async.bulk, one per row, completing on an mbarrier) before griddepcontrol.wait, then
  // reads them from there: every weight byte of a block in flight at once, from before the
  // kernel ahead ends. Where the rows fit in shared memory it replaces the other two.
  std::atomic<bool> bulk{false};
};

// The levers of the backend whose op runs on this thread (CudaBackend::on_device makes them
// current, as it does the launch context); null on a thread no backend ran on (all off).
const GemvLevers* current_gemv_levers();
void make_gemv_levers_current(const std::shared_ptr<GemvLevers>& levers);
inline bool gemv_deep_now() {
  const GemvLevers* l = current_gemv_levers();
  return l && l->deep.load(std::memory_order_relaxed);
}
inline bool gemv_weight_prefetch_now() {
  const GemvLevers* l = current_gemv_levers();
  return l && l->weight_prefetch.load(std::memory_order_relaxed);
}
inline bool gemv_bulk_now() {
  const GemvLevers* l = current_gemv_levers();
  return l && l->bulk.load(std::memory_order_relaxed);
}

// A lever's environment variable: "1", "on" or "true" switch it on; unset or anything else
// leaves it off.
bool gemv_lever_wanted_by_env(const char* name);

}  // namespace attnres::cuda
