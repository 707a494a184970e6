// Error checking for CUDA runtime and cuBLAS calls: a failing call throws attnres::Error
// whose message names the call, the file and line, and the runtime's own error string.
// Kernel launchers call CUDA_CHECK(cudaGetLastError()) right after each launch so that a bad
// launch configuration is reported at the launch, not at the next synchronize.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "engine/core/error.h"

namespace attnres::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                          int line) {
  throw Error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
              ") in " + call + " at " + file + ":" + std::to_string(line));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  throw Error(std::string("cuBLAS error ") + cublasGetStatusName(status) + " (" +
              cublasGetStatusString(status) + ") in " + call + " at " + file + ":" +
              std::to_string(line));
}

// The CUDA runtime's current device is per host thread. Makes `device` current on the calling
// thread for the guard's lifetime, then restores the previous one. Never throws (used in
// deleters and destructors); ok() says whether `device` is current.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    ok_ = previous_ == device || cudaSetDevice(device) == cudaSuccess;
    if (!ok_) cudaGetLastError();
    changed_ = ok_ && previous_ != device;
  }
  ~ScopedDevice() {
    if (changed_ && previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  bool ok() const { return ok_; }

 private:
  int previous_ = -1;
  bool ok_ = false, changed_ = false;
};

}  // namespace attnres::cuda

#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    const cudaError_t attnres_cuda_err_ = (call);                                      \
    if (attnres_cuda_err_ != cudaSuccess)                                              \
      ::attnres::cuda::throw_cuda_error(attnres_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                    \
  do {                                                                                        \
    const cublasStatus_t attnres_cublas_status_ = (call);                                     \
    if (attnres_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::attnres::cuda::throw_cublas_error(attnres_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
