#include "kernels/cpu/cpu_registration.h"

#include <algorithm>

#include "engine/core/backend_registry.h"
#include "engine/parallel/communicator_registry.h"
#include "engine/parallel/in_process_communicator.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/worker_pool.h"

namespace attnres {

void register_cpu_backend() {
  register_backend(
      "cpu",
      [](const BackendOptions& options) {
        int threads = options.threads;
        if (options.ranks_sharing_host > 1) {
          // The ranks of one group split the cores (or --threads) evenly, at least one each.
          const int total = threads > 0 ? threads : cpu::default_thread_count();
          threads = std::max(1, total / options.ranks_sharing_host);
        }
        auto backend = std::make_unique<CpuBackend>(threads);
        backend->set_bf16_linear_inputs(options.bf16_linear_inputs);
        return std::unique_ptr<Backend>(std::move(backend));
      },
      BackendTraits{.display_name = "CPU", .capabilities = cpu_backend_capabilities()});
  register_communicator_group("cpu", [](int size) -> CommunicatorFactory {
    auto group = InProcessGroup::create(size);
    return [group](int rank, Backend&) { return group->communicator(rank); };
  });
  // One rank per process: the launcher's collectives on host memory (MPI).
  register_process_communicator(
      "cpu", [](ProcessGroup& group, Backend&) { return group.host_communicator(); });
}

}  // namespace attnres
