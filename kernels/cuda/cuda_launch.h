// How a CudaBackend's kernels are launched: programmatic dependent launch (PDL) on or off, and
// how many launches its work took. A plain C++ header (CudaBackend::Impl holds a context);
// the launch itself is cuda_common.cuh's launch_kernel, which every kernel file uses.
//
// PDL (compute capability 9.0+): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled before the kernel ahead
// of it in the stream has finished, once every block of that kernel has triggered
// (griddepcontrol.launch_dependents) or exited; it then waits (griddepcontrol.wait, which
// returns once the kernel ahead has completed and its writes are visible) before it touches
// memory. Every kernel of kernels/cuda starts with that wait (cuda_common.cuh,
// wait_for_previous_kernel), so launch latency hides behind the previous kernel's tail.
// Stream capture records such launches as programmatic edges of the CUDA graph.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace attnres::cuda {

struct LaunchContext {
  // Launch with the PDL attribute. Off where the device lacks it (compute capability < 9.0).
  std::atomic<bool> programmatic{false};
  std::atomic<uint64_t> kernels{0};       // launches through launch_kernel
  std::atomic<uint64_t> cublas_calls{0};  // calls into cuBLAS (each launches its own kernels)
};

// The context of the backend whose op runs on this thread: CudaBackend::on_device, which
// every op calls before it launches anything, makes it current. Null on a thread no backend
// ran on; launch_kernel then launches plainly and counts nothing. Held (shared) by the
// thread, so it outlives a destroyed backend rather than dangle.
LaunchContext* current_launch_context();
void make_launch_context_current(const std::shared_ptr<LaunchContext>& context);

// ATTNRES_CUDA_PDL=0 (or "off", "false") starts new backends with PDL off; unset or anything
// else leaves it on where the device supports it.
bool programmatic_launch_wanted_by_env();

}  // namespace attnres::cuda
