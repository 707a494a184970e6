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
// CUDA graphs break that argument: a captured graph writes its blocks again at every replay,
// long after their tensors died. So a capture gets a pool (begin_capture / end_capture):
// - blocks handed out while capturing come from the pool's own free list first (then the
//   general cache, then cudaMalloc), and return to the pool when freed;
// - blocks in use when the capture begins (the KV cache, kept workspaces, staging buffers:
//   the graph may read or write any of them) also return to the pool when freed;
// for as long as the pool lives: the graph holds it. Pool blocks are handed to nobody else,
// so eager steps between replays never get memory a replay writes. When the last handle
// goes, the pool's free blocks join the general cache (stream-ordered reuse is safe again:
// anything queued later runs after the graph's last replay). A block in use at a capture
// that already belongs to an earlier live pool stays with that pool, and the new pool keeps
// the earlier one alive, so the block waits for both graphs.
//
// Lifetime: tensors hold a shared_ptr to the allocator through their deleter, so a tensor
// may outlive the backend; the last reference frees everything. Deleters never throw.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace attnres::cuda {

class CachingAllocator : public std::enable_shared_from_this<CachingAllocator> {
 public:
  // Where the blocks come from. allocate: a block of exactly `bytes`, null when out of
  // memory, throws attnres::Error on any other failure; free never throws. The default is
  // cudaMalloc / cudaFree on the allocator's device; tests pass host memory to check the
  // caching and pool logic without a GPU.
  struct RawMemory {
    std::function<void*(size_t bytes)> allocate;
    std::function<void(void* ptr)> free;
  };
  static RawMemory cuda_memory(int device);

  explicit CachingAllocator(int device) : CachingAllocator(cuda_memory(device)) {}
  explicit CachingAllocator(RawMemory raw) : raw_(std::move(raw)) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A device block of at least `bytes` (not zeroed), owned by the returned shared_ptr: its
  // deleter puts the block back on its free list. bytes == 0 gives a null owner.
  // Throws attnres::Error when the device is out of memory even after the cache is emptied
  // (during a capture the cache is not emptied: freeing would synchronize).
  std::shared_ptr<void> allocate(size_t bytes);

  // A graph's memory pool (see the header comment). Opaque: hold it while the graph lives.
  class GraphPool;
  // Starts routing allocations into a new pool; one capture at a time. Then end_capture().
  std::shared_ptr<GraphPool> begin_capture();
  void end_capture();

  // cudaFree of every block in the general cache (blocks in use and pool blocks untouched).
  void release_cached();

  size_t in_use_bytes() const;
  size_t cached_free_bytes() const;      // the general cache: reusable by anyone
  size_t graph_pool_free_bytes() const;  // free, but held for live graphs

  // Sizes are rounded so that nearby requests share a free list: 512 B granules below
  // 1 MiB, 2 MiB granules above.
  static size_t round_size(size_t bytes);

 private:
  using FreeLists = std::map<size_t, std::vector<void*>>;  // rounded size -> free blocks
  struct Block {
    size_t rounded = 0;
    std::weak_ptr<GraphPool> pool;  // expired or empty: the general cache
  };
  void give_back(void* ptr) noexcept;
  static void* take(FreeLists& lists, size_t rounded);

  RawMemory raw_;
  mutable std::mutex mutex_;  // guards everything below, and every pool's free lists
  FreeLists free_;
  std::unordered_map<void*, Block> in_use_blocks_;
  std::shared_ptr<GraphPool> capturing_;
  size_t in_use_ = 0, cached_ = 0, pooled_ = 0;
};

}  // namespace attnres::cuda
