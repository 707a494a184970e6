// A caching device allocator in the manner of PyTorch's CUDACachingAllocator (the design,
// not its code). cudaMalloc'd *segments* are cut into *blocks*; a freed block stays cached
// and serves later requests, so a decode step that allocates the same shapes every step does
// no cudaMalloc / cudaFree after the first (which also makes it graph-capturable).
//
// Why split and coalesce: under serving, every step's prefill chunk has another token count,
// so nearly every request has a size never seen before. A cache keyed by exact size kept one
// set of blocks per distinct size and grew until cudaMalloc failed (measured in NOTES.md,
// "Caching allocator"). Here a request takes the smallest cached block that fits (best fit),
// cuts off what it needs and leaves the remainder cached; a freed block merges with free
// neighbours of the same segment, so once a step's tensors are gone its segments are whole
// again and serve any smaller mix of sizes the next step asks for.
//
// - Sizes: requests round up to 512 B. Requests of at most 1 MiB come from the small pool
//   (2 MiB segments shared by many small blocks), larger ones from the large pool (a segment
//   of the request rounded up to 2 MiB). The pools never lend to each other, so a small
//   long-lived block cannot pin a large segment. A large block is cut only when more than
//   1 MiB would remain (a request may get up to 1 MiB more than it asked for).
// - Release: before adding a segment, when reserved bytes (in use + cached) would exceed
//   Options::max_reserved_over_peak x the peak bytes ever requested at once, whole free segments of
//   the general cache are given back (cudaFree: it synchronizes), largest first (the fewest
//   cudaFree calls; the small segments kept serve the many small requests). When cudaMalloc
//   still fails, every whole free segment goes and the request is retried once; then it
//   throws attnres::Error naming the size.
//
// Stream safety: every user of the memory is the backend's single stream, so a block freed
// while queued kernels still use it can be reused at once: whatever the next owner queues
// runs after them on that stream. (A second stream would need events per block.)
//
// CUDA graphs break that argument: a captured graph writes its blocks again at every replay,
// long after their tensors died. So a capture gets a pool (begin_capture / end_capture), a
// free list of its own:
// - blocks handed out while capturing come from the pool's free list first (then the
//   general cache, then cudaMalloc), and return to the pool when freed; a block the capture
//   cuts from a general one or from a new segment leaves its remainder in the pool too (so
//   a capture takes a general block only if it exceeds the request by at most 2 MiB: the
//   graph holds all of it);
// - blocks in use when the capture begins (the KV cache, kept workspaces, staging buffers:
//   the graph may read or write any of them) also return to the pool when freed;
// for as long as the pool lives: the graph holds it. Pool blocks are handed to nobody else,
// so eager steps between replays never get memory a replay writes. When the last handle
// goes, the pool's free blocks join the general cache and merge there (stream-ordered reuse
// is safe again: anything queued later runs after the graph's last replay). A block in use
// at a capture that already belongs to an earlier live pool stays with that pool, and the
// new pool keeps the earlier one alive, so the block waits for both graphs.
//
// Invariants (checked by cuda_allocator_test.cpp after every operation):
// 1. A segment's blocks tile it: in address order, linked by prev / next, no gaps or overlap.
// 2. A block is handed out (in no free list) or free, in exactly one free list: the general
//    cache's or one live pool's, of its segment's pool (small / large).
// 3. No two neighbouring blocks are free in the same list (they would have been merged).
// 4. in use + cached + held for graphs == reserved == the sum of the live segments' sizes.
// 5. Only a whole free segment of the general cache is ever given back to RawMemory; a pool's
//    blocks are handed out only during that pool's capture.
//
// Lifetime: tensors hold a shared_ptr to the allocator through their deleter, so a tensor
// may outlive the backend; the last reference frees everything. Deleters never throw (and
// never allocate host memory: each block keeps its own free-list node).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace attnres::cuda {

// (Outside the class: a nested struct with default member initializers cannot be a default
// argument of its enclosing class's constructors.)
struct CachingAllocatorOptions {
  // Reserved bytes may exceed the peak bytes ever requested at once by this factor before
  // whole free segments are given back ahead of a new cudaMalloc (each cudaFree
  // synchronizes). 1.5 measured best on the prefill workload (NOTES.md): 1.25 thrashes.
  double max_reserved_over_peak = 1.5;
};

class CachingAllocator : public std::enable_shared_from_this<CachingAllocator> {
 public:
  // Where the segments come from. allocate: a block of exactly `bytes`, null when out of
  // memory, throws attnres::Error on any other failure; free never throws. The default is
  // cudaMalloc / cudaFree on the allocator's device; tests pass host memory to check the
  // caching and pool logic without a GPU.
  struct RawMemory {
    std::function<void*(size_t bytes)> allocate;
    std::function<void(void* ptr)> free;
  };
  static RawMemory cuda_memory(int device);

  using Options = CachingAllocatorOptions;

  explicit CachingAllocator(int device, Options options = {})
      : CachingAllocator(cuda_memory(device), options) {}
  explicit CachingAllocator(RawMemory raw, Options options = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A device block of at least `bytes` (not zeroed), owned by the returned shared_ptr: its
  // deleter puts the block back in the cache. bytes == 0 gives a null owner.
  // Throws attnres::Error when the device is out of memory even after the cache is emptied
  // (during a capture the cache is not emptied: freeing would synchronize).
  std::shared_ptr<void> allocate(size_t bytes);

  // A graph's memory pool (see the header comment). Opaque: hold it while the graph lives.
  class GraphPool;
  // Starts routing allocations into a new pool; one capture at a time. Then end_capture().
  std::shared_ptr<GraphPool> begin_capture();
  void end_capture();

  // cudaFree of every whole free segment of the general cache (blocks in use, segments
  // partly in use and pool blocks untouched).
  void release_cached();

  struct Stats {
    size_t reserved = 0;         // every live segment: in_use + cached + graph_pool_free
    size_t in_use = 0;           // blocks handed out (request sizes rounded up)
    size_t cached = 0;           // the general cache: reusable by anyone
    size_t graph_pool_free = 0;  // free, but held for live graphs
    size_t requested = 0;        // the bytes asked for by the blocks handed out
    size_t peak_in_use = 0;      // the most in_use ever was
    size_t peak_requested = 0;   // the most requested ever was (the release policy's yardstick)
    size_t peak_reserved = 0;    // the most reserved ever was
    size_t segments = 0;         // live raw allocations
    size_t raw_allocations = 0;  // RawMemory::allocate calls that succeeded, ever
    size_t raw_frees = 0;        // RawMemory::free calls, ever (each a cudaFree: a sync)
    size_t failed_raw_allocations = 0;  // RawMemory::allocate calls that returned null
  };
  Stats stats() const;
  size_t in_use_bytes() const;
  size_t cached_free_bytes() const;      // the general cache: reusable by anyone
  size_t graph_pool_free_bytes() const;  // free, but held for live graphs
  size_t reserved_bytes() const;

  // The size policy (see the header comment), exposed for tests.
  static constexpr size_t kGranule = 512;
  static constexpr size_t kSmallRequest = size_t{1} << 20;  // at most this: the small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kLargeSegmentGranule = size_t{2} << 20;
  static constexpr size_t kMinLargeRemainder = size_t{1} << 20;  // cut only above this
  static constexpr size_t kMaxCaptureOversize = size_t{2} << 20;
  static size_t round_size(size_t bytes);    // the block size a request gets (at least)
  static size_t segment_size(size_t bytes);  // the segment a request would cudaMalloc

  // Every block of every segment, in address order within a segment, for tests.
  struct BlockInfo {
    const void* ptr;
    size_t size;
    size_t segment;  // index of its segment in this listing
    bool in_use;
    bool in_graph_pool;     // free in a pool's list, or handed out and returning to a live pool
    const void* free_list;  // free: which list holds it (opaque); null while in use
  };
  std::vector<BlockInfo> blocks() const;

 private:
  struct Block;
  struct FreeList;
  struct ByAddress {
    bool operator()(const Block* a, const Block* b) const;
  };

  Block* take(FreeList& list, size_t size, const std::shared_ptr<GraphPool>& pool,
              FreeList* remainder_list, size_t max_oversize);
  Block* add_segment(void* ptr, size_t size, bool small, FreeList& list);
  void put_free(Block* block, FreeList& list) noexcept;
  void give_back(Block* block) noexcept;
  FreeList& general(bool small);
  std::vector<void*> take_whole_segments(size_t at_least, bool all);
  void free_raw(const std::vector<void*>& ptrs) noexcept;
  void hand_out(Block* block, size_t requested);

  RawMemory raw_;
  Options options_;
  mutable std::mutex mutex_;  // guards everything below, and every pool's free lists
  std::unique_ptr<FreeList> small_, large_;  // the general cache
  std::set<Block*, ByAddress> segments_;     // each live segment's first block
  std::shared_ptr<GraphPool> capturing_;
  Stats stats_;
};

}  // namespace attnres::cuda
