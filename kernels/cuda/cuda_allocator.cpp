// CachingAllocator (see cuda_allocator.h).
#include "kernels/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"

namespace attnres::cuda {

size_t CachingAllocator::round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kLargeFrom = size_t{1} << 20;
  if (bytes < kLargeFrom) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

CachingAllocator::~CachingAllocator() {
  // Runs when the last tensor and the backend are gone, on any thread. Never throws.
  ScopedDevice on_device(device_);
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) cudaFree(p);
}

std::shared_ptr<void> CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = round_size(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(rounded);
    if (it != free_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      cached_ -= rounded;
    }
  }
  if (!ptr) {
    // cudaMalloc allocates on the calling thread's current device: make it ours.
    ScopedDevice on_device(device_);
    if (!on_device.ok())
      throw Error("CUDA allocation: cannot select device " + std::to_string(device_));
    cudaError_t err = cudaMalloc(&ptr, rounded);
    if (err == cudaErrorMemoryAllocation) {  // empty the cache and try once more
      cudaGetLastError();                    // clear the sticky-free error state
      release_cached();
      err = cudaMalloc(&ptr, rounded);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw Error("CUDA allocation of " + std::to_string(rounded) +
                  " bytes failed: " + cudaGetErrorString(err) + " (in use " +
                  std::to_string(in_use_bytes()) + " bytes)");
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ += rounded;
  }
  std::shared_ptr<CachingAllocator> self = shared_from_this();
  return std::shared_ptr<void>(ptr, [self, rounded](void* p) { self->give_back(p, rounded); });
}

void CachingAllocator::give_back(void* ptr, size_t rounded) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[rounded].push_back(ptr);
    in_use_ -= rounded;
    cached_ += rounded;
  } catch (...) {
    cudaFree(ptr);  // push_back could not allocate: hand the block straight back
  }
}

void CachingAllocator::release_cached() {
  std::map<size_t, std::vector<void*>> to_free;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    to_free.swap(free_);
    cached_ = 0;
  }
  ScopedDevice on_device(device_);
  for (auto& [size, blocks] : to_free)
    for (void* p : blocks) cudaFree(p);  // implicitly synchronizes the device
}

size_t CachingAllocator::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

size_t CachingAllocator::cached_free_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

}  // namespace attnres::cuda
