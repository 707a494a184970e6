// CachingAllocator (see cuda_allocator.h).
#include "kernels/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.h"

namespace attnres::cuda {

// A pool's free lists are guarded by its allocator's mutex. Members are destroyed after the
// destructor's body (which holds the mutex) and in reverse order: `earlier` (which may run
// another pool's destructor) after the lock is released, `owner` last.
class CachingAllocator::GraphPool {
 public:
  explicit GraphPool(std::shared_ptr<CachingAllocator> owner) : owner(std::move(owner)) {}
  ~GraphPool() {
    std::lock_guard<std::mutex> lock(owner->mutex_);
    for (auto& [rounded, blocks] : free) {
      auto& general = owner->free_[rounded];
      general.insert(general.end(), blocks.begin(), blocks.end());
    }
    owner->pooled_ -= free_bytes;
    owner->cached_ += free_bytes;
  }
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;

  std::shared_ptr<CachingAllocator> owner;
  std::vector<std::shared_ptr<GraphPool>> earlier;  // pools of blocks this graph may use too
  FreeLists free;
  size_t free_bytes = 0;
};

CachingAllocator::RawMemory CachingAllocator::cuda_memory(int device) {
  RawMemory raw;
  raw.allocate = [device](size_t bytes) -> void* {
    // cudaMalloc allocates on the calling thread's current device: make it ours.
    ScopedDevice on_device(device);
    if (!on_device.ok())
      throw Error("CUDA allocation: cannot select device " + std::to_string(device));
    // A strict (thread-local) capture refuses cudaMalloc as potentially unsafe. A block for
    // the capture's pool is safe, though: it is not part of the graph, and the pool frees it
    // only once the graph is gone. So relax the mode around this one call (PyTorch's caching
    // allocator does the same); it is restored right after.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (err == cudaSuccess) return ptr;
    cudaGetLastError();  // clear the error state
    if (err == cudaErrorMemoryAllocation) return nullptr;
    throw Error("CUDA allocation of " + std::to_string(bytes) +
                " bytes failed: " + cudaGetErrorString(err));
  };
  raw.free = [device](void* ptr) {
    ScopedDevice on_device(device);
    cudaFree(ptr);  // implicitly synchronizes the device
  };
  return raw;
}

size_t CachingAllocator::round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kLargeFrom = size_t{1} << 20;
  if (bytes < kLargeFrom) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

CachingAllocator::~CachingAllocator() {
  // Runs when the last tensor, pool and the backend are gone, on any thread. Never throws.
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) raw_.free(p);
}

void* CachingAllocator::take(FreeLists& lists, size_t rounded) {
  auto it = lists.find(rounded);
  if (it == lists.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  return ptr;
}

std::shared_ptr<void> CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = round_size(bytes);
  void* ptr = nullptr;
  std::shared_ptr<GraphPool> pool;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pool = capturing_;
    if (pool && (ptr = take(pool->free, rounded))) {
      pool->free_bytes -= rounded;
      pooled_ -= rounded;
    } else if ((ptr = take(free_, rounded))) {
      cached_ -= rounded;
    }
  }
  if (!ptr) {
    ptr = raw_.allocate(rounded);
    if (!ptr && !pool) {  // empty the cache and try once more
      release_cached();
      ptr = raw_.allocate(rounded);
    }
    if (!ptr) {
      throw Error("CUDA allocation of " + std::to_string(rounded) +
                  " bytes failed: out of memory (in use " + std::to_string(in_use_bytes()) +
                  " bytes, held for CUDA graphs " + std::to_string(graph_pool_free_bytes()) +
                  " bytes)");
    }
  }
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_blocks_.emplace(ptr, Block{rounded, pool});
    in_use_ += rounded;
  } catch (...) {
    raw_.free(ptr);  // not handed out yet: nothing can use it
    throw;
  }
  std::shared_ptr<CachingAllocator> self = shared_from_this();
  return std::shared_ptr<void>(ptr, [self](void* p) { self->give_back(p); });
}

void CachingAllocator::give_back(void* ptr) noexcept {
  std::shared_ptr<GraphPool> pool;  // released after the lock: may run the pool's destructor
  bool placed = false;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_use_blocks_.find(ptr);
    if (it == in_use_blocks_.end()) return;  // not ours (cannot happen): leave it alone
    const size_t rounded = it->second.rounded;
    pool = it->second.pool.lock();
    in_use_blocks_.erase(it);
    in_use_ -= rounded;
    if (pool) {
      pool->free[rounded].push_back(ptr);
      pool->free_bytes += rounded;
      pooled_ += rounded;
    } else {
      free_[rounded].push_back(ptr);
      cached_ += rounded;
    }
    placed = true;
  } catch (...) {
  }
  // push_back could not allocate: hand the block straight back, unless a live graph may
  // still use it (then it leaks: reuse would be worse).
  if (!placed && !pool) raw_.free(ptr);
}

std::shared_ptr<CachingAllocator::GraphPool> CachingAllocator::begin_capture() {
  auto pool = std::make_shared<GraphPool>(shared_from_this());
  std::vector<std::shared_ptr<GraphPool>> earlier;  // released after the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ATTNRES_CHECK(!capturing_, "CachingAllocator: a capture is already under way");
    for (auto& [ptr, block] : in_use_blocks_) {
      if (std::shared_ptr<GraphPool> owner = block.pool.lock()) {
        earlier.push_back(std::move(owner));
      } else {
        block.pool = pool;
      }
    }
    capturing_ = pool;
  }
  std::sort(earlier.begin(), earlier.end());
  earlier.erase(std::unique(earlier.begin(), earlier.end()), earlier.end());
  pool->earlier = std::move(earlier);  // not yet reachable by another thread but through
                                       // capturing_, which touches only `free`
  return pool;
}

void CachingAllocator::end_capture() {
  std::shared_ptr<GraphPool> ended;  // released after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  ended.swap(capturing_);
}

void CachingAllocator::release_cached() {
  FreeLists to_free;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    to_free.swap(free_);
    cached_ = 0;
  }
  for (auto& [size, blocks] : to_free)
    for (void* p : blocks) raw_.free(p);
}

size_t CachingAllocator::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

size_t CachingAllocator::cached_free_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

size_t CachingAllocator::graph_pool_free_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pooled_;
}

}  // namespace attnres::cuda
