#include "kernels/builtin_backends.h"

#include <mutex>

#include "kernels/cpu/cpu_registration.h"
#ifdef ATTNRES_HAVE_CUDA
#include "kernels/cuda/cuda_registration.h"
#endif

namespace attnres {

void register_builtin_backends() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_cpu_backend();
#ifdef ATTNRES_HAVE_CUDA
    register_cuda_backend();
#endif
  });
}

}  // namespace attnres
