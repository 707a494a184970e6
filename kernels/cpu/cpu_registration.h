// Registers the CPU backend under "cpu" (engine/core/backend_registry.h) and the in-process
// tensor-parallel group for it (engine/parallel/communicator_registry.h). Idempotent.
#pragma once

namespace attnres {

void register_cpu_backend();

}  // namespace attnres
