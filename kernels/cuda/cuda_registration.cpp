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
  // The KV cache and the depth bank may be F32 or BF16 (CudaBackend::kv_dtype_supported and
  // depth_bank_dtype_supported, the functions the backend answers with), so --kv-cache-dtype
  // and --depth-bank-dtype auto pick bf16 for a bf16 checkpoint. A fractional
  // --kv-cache-memory is of the GPU's free memory, not the host's RAM.
  BackendTraits traits{"CUDA", &CudaBackend::kv_dtype_supported,
                       &CudaBackend::depth_bank_dtype_supported, &cuda_free_memory_bytes};
  traits.device_available = &cuda_device_available;  // --device auto
  register_backend(
      "cuda",
      [](const BackendOptions& options) {
        if (!cuda_device_available()) throw Error("--device cuda: no CUDA device is visible");
        return make_cuda_backend(options.device_index);
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
