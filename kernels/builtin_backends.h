// The one call an executable makes to get every backend this build has: registers the CPU
// backend and, in a CUDA build, the CUDA one (with NCCL when found) in the engine's registries
// (engine/core/backend_registry.h explains why registration is an explicit call). Idempotent
// and thread-safe.
#pragma once

namespace attnres {

void register_builtin_backends();

}  // namespace attnres
