// Tensor-parallel communicator groups by backend name ("cpu": the in-process group, ranks as
// threads; "cuda": NCCL, one GPU per rank). Filled by the kernels/ libraries' registration
// functions, like the backend registry (engine/core/backend_registry.h says why explicitly),
// so engine/parallel builds a group for any backend without including kernels/.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/core/backend.h"
#include "engine/parallel/communicator.h"

namespace attnres {

// Rank `rank`'s communicator, called on the rank's thread after its backend exists (the type
// of TensorParallelOptions::make_communicator).
using CommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(int rank, Backend& backend)>;
// Creates one group of `size` ranks (rank r on device r) and returns its per-rank factory.
using CommunicatorGroupFactory = std::function<CommunicatorFactory(int size)>;

// Adds (or replaces) the group factory for backend `name`. Thread-safe.
void register_communicator_group(const std::string& name, CommunicatorGroupFactory factory);
bool has_communicator_group(const std::string& name);
// One group of `size` ranks for backend `name` (throws attnres::Error when none is registered).
CommunicatorFactory make_communicator_group(const std::string& name, int size);

}  // namespace attnres
