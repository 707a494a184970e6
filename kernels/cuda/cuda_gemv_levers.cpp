// The current backend's GEMV levers and their environment variables (cuda_gemv_levers.h).
#include "kernels/cuda/cuda_gemv_levers.h"

#include <cstdlib>
#include <string>

namespace attnres::cuda {
namespace {

// Shared, not borrowed: a thread that outlives its backend keeps valid (if stale) levers.
thread_local std::shared_ptr<GemvLevers> current;

}  // namespace

const GemvLevers* current_gemv_levers() { return current.get(); }

void make_gemv_levers_current(const std::shared_ptr<GemvLevers>& levers) {
  if (current != levers) current = levers;
}

bool gemv_lever_wanted_by_env(const char* name) {
  const char* value = std::getenv(name);
  if (!value) return false;
  const std::string v(value);
  return v == "1" || v == "on" || v == "true";
}

}  // namespace attnres::cuda
