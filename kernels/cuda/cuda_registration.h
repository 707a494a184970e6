// Registers the CUDA backend under "cuda" (engine/core/backend_registry.h) and, in a build
// with NCCL, the NCCL tensor-parallel group for it (engine/parallel/communicator_registry.h):
// rank r drives GPU r. Idempotent.
#pragma once

namespace attnres {

void register_cuda_backend();

}  // namespace attnres
