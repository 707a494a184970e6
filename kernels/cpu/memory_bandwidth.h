// Measured host memory bandwidth: the denominator of every decode roofline on the CPU.
#pragma once

namespace attnres {

// Multi-threaded copy between two 256 MiB buffers (the CPU backend's default thread count,
// cpu::default_thread_count(), each thread copying its own contiguous slice);
// GB/s = (bytes read + bytes written) / best time of several reps.
double measure_copy_bandwidth_gbps();

}  // namespace attnres
