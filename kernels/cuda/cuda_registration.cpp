#include "kernels/cuda/cuda_registration.h"

#include <utility>
#include <vector>

#include "engine/core/backend_registry.h"
#include "engine/core/error.h"
#include "engine/parallel/communicator_registry.h"
#include "kernels/cuda/cuda_backend.h"
#ifdef ATTNRES_HAVE_NCCL
#include "kernels/cuda/nccl_communicator.h"
#endif

namespace attnres {

void register_cuda_backend() {
  // A fractional --kv-cache-memory is of the GPU's free memory, not the host's RAM.
  BackendTraits traits{.display_name = "CUDA",
                       .capabilities = cuda_backend_capabilities(),
                       .kv_memory_bytes = &cuda_free_memory_bytes};
  traits.device_available = &cuda_device_available;  // --device auto
  register_backend(
      "cuda",
      [](const BackendOptions& options) {
        if (!cuda_device_available()) throw Error("--device cuda: no CUDA device is visible");
        auto backend = make_cuda_backend(options.device_index);
        backend->set_bf16_linear_inputs(options.bf16_linear_inputs);
        return backend;
      },
      std::move(traits));
#ifdef ATTNRES_HAVE_NCCL
  register_communicator_group("cuda", [](int size) -> CommunicatorFactory {
    std::vector<int> devices(size);
    for (int r = 0; r < size; ++r) devices[r] = r;
    auto group = NcclGroup::create(devices);
    return [group](int rank, Backend& backend) { return group->communicator(rank, backend); };
  });
  // One GPU per process of an mpirun job: NCCL bootstrapped over the job's group.
  register_process_communicator("cuda", [](ProcessGroup& group, Backend& backend) {
    auto* cuda = dynamic_cast<CudaBackend*>(&backend);
    if (!cuda) throw Error("NCCL needs the CUDA backend (--device cuda)");
    return NcclGroup::create_for_process(group, cuda->device_index())
        ->communicator(group.rank(), backend);
  });
#endif
}

}  // namespace attnres
