// Tensor-parallel communicator groups by backend name ("cpu": the in-process group, ranks as
// threads; "cuda": NCCL, one GPU per rank), and the communicators of multi-process jobs. Filled by
// the kernels/ libraries' registration functions, like the backend registry
// (engine/core/backend_registry.h says why explicitly), so engine/parallel builds a group for any
// backend without including kernels/.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/core/backend.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/process_group.h"

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

// A communicator across the processes of a multi-process job (one rank per process) for
// backend `name`'s tensors: "cpu" uses the group's host collectives (MPI), "cuda" NCCL
// bootstrapped over the group. Called on the rank's thread after its backend exists.
using ProcessCommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(ProcessGroup& group, Backend& backend)>;
void register_process_communicator(const std::string& name, ProcessCommunicatorFactory factory);
bool has_process_communicator(const std::string& name);
std::unique_ptr<Communicator> make_process_communicator(const std::string& name,
                                                        ProcessGroup& group, Backend& backend);

}  // namespace attnres
