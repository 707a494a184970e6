// The thread's current launch context and the PDL switch of the environment (cuda_launch.h).
#include "kernels/cuda/cuda_launch.h"

#include <cstdlib>
#include <string>

namespace attnres::cuda {
namespace {

// Shared, not borrowed: a thread that outlives its backend keeps a valid (if stale) context.
thread_local std::shared_ptr<LaunchContext> current;

}  // namespace

LaunchContext* current_launch_context() { return current.get(); }

void make_launch_context_current(const std::shared_ptr<LaunchContext>& context) {
  if (current != context) current = context;
}

bool programmatic_launch_wanted_by_env() {
  const char* value = std::getenv("ATTNRES_CUDA_PDL");
  if (!value) return true;
  const std::string v(value);
  return !(v == "0" || v == "off" || v == "false");
}

}  // namespace attnres::cuda
