// Backends by name ("cpu", "cuda"): the engine builds the backend a command asks for through
// this registry, so nothing under engine/ includes kernels/ (issue #15, "an engine that knows
// no backend"). Each kernels/ library has a registration function (register_cpu_backend in
// kernels/cpu, register_cuda_backend in kernels/cuda) that fills this registry and the
// communicator-group registry (engine/parallel/communicator_registry.h);
// kernels/builtin_backends.h's register_builtin_backends() calls those that were built.
//
// Why an explicit registration call and not self-registering static objects: the backends are
// static libraries, and the linker takes an object file out of a static library only when
// something references one of its symbols. A file whose only job is a static registrar is
// referenced by nobody, so it would be dropped without a word (no "cuda" backend, no link
// error) unless every executable and test linked it --whole-archive; and the order of static
// initialisation across files would make the registry's own state a second trap. One call at
// the top of main() (and in each test that uses the registry) is visible to the linker and to
// the reader, and costs one line.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/backend_capabilities.h"

namespace attnres {

// What a backend is built with. Fields a backend has no use for are ignored.
struct BackendOptions {
  int device_index = 0;  // which device of its kind (a GPU's ordinal); rank r of a group uses r
  int threads = 0;       // CPU: worker threads, 0 = all cores
  // CPU: the ranks of a tensor-parallel group on this host share `threads` (or all cores)
  // evenly, each getting at least one.
  int ranks_sharing_host = 1;
  // Round a linear's input to bf16 before it meets bf16 weights (--linear-input-dtype,
  // resolved: BackendCapabilities::bf16_linear_inputs says whether a backend takes it).
  bool bf16_linear_inputs = false;
};

using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendOptions& options)>;

// What the engine needs to know about a backend before building one (sizing the KV cache
// comes before the backend exists).
struct BackendTraits {
  std::string display_name;  // for messages: "CPU", "CUDA" ("" = the registered name)
  // The backend's capabilities: the object its instances answer Backend::capabilities() with.
  BackendCapabilities capabilities = {};
  // The bytes a fractional --kv-cache-memory (0.2) is a fraction of, for the device of that
  // index. Null: the host's physical memory (host_physical_memory_bytes), right for a backend
  // that computes in host RAM. A device backend answers its device's free memory (CUDA:
  // cudaMemGetInfo), read before the weights are uploaded: they, the activations and the
  // runtime's own needs come out of the rest.
  std::function<size_t(int device_index)> kv_memory_bytes = nullptr;
  // Whether a device of this kind is there to run on (--device auto picks CUDA when it is;
  // null: always, as for the host).
  std::function<bool()> device_available = nullptr;
};

// The host's physical memory in bytes (the default BackendTraits::kv_memory_bytes).
size_t host_physical_memory_bytes();

// Adds (or replaces) the factory for `name`. Thread-safe; usually called once from main().
void register_backend(const std::string& name, BackendFactory factory, BackendTraits traits = {});
bool has_backend(const std::string& name);
// The traits `name` was registered with (throws like make_backend if there is none), with
// display_name, kv_memory_bytes and device_available filled in.
BackendTraits backend_traits(const std::string& name);
// The registered names, sorted.
std::vector<std::string> registered_backends();
// Builds the backend `name` (throws attnres::Error naming the registered ones if there is none,
// or whatever the factory throws, e.g. no visible device).
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options = {});

}  // namespace attnres
