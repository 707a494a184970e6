// A caching device allocator: cudaMalloc'd blocks are kept in free lists keyed by their
// (rounded) size when their tensor dies, and handed out again to the next request of that
// size. A decode step allocates the same shapes every step, so after the first step no
// cudaMalloc / cudaFree happens at all (which also makes the forward graph-capturable once
// warmed up).
//
// Stream safety: every user of the memory is the backend's single stream, so a block freed
// while queued kernels still use it can be reused at once: whatever the next owner queues
// runs after them on that stream. (A second stream would need events per block.)
//
// Lifetime: tensors hold a shared_ptr to the allocator through their deleter, so a tensor
// may outlive the backend; the last reference frees everything. Deleters never throw.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace attnres::cuda {

class CachingAllocator : public std::enable_shared_from_this<CachingAllocator> {
 public:
  explicit CachingAllocator(int device) : device_(device) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A device block of at least `bytes` (not zeroed), owned by the returned shared_ptr: its
  // deleter puts the block back on the free list. bytes == 0 gives a null owner.
  // Throws attnres::Error when the device is out of memory even after the cache is emptied.
  std::shared_ptr<void> allocate(size_t bytes);

  // cudaFree of every cached free block (blocks in use are untouched).
  void release_cached();

  size_t in_use_bytes() const;
  size_t cached_free_bytes() const;

  // Sizes are rounded so that nearby requests share a free list: 512 B granules below
  // 1 MiB, 2 MiB granules above.
  static size_t round_size(size_t bytes);

 private:
  void give_back(void* ptr, size_t rounded) noexcept;

  int device_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;  // rounded size -> free blocks
  size_t in_use_ = 0, cached_ = 0;
};

}  // namespace attnres::cuda
