// CachingAllocator (see cuda_allocator.h): segments cut into blocks, best-fit reuse,
// coalescing on free, graph pools and the release policy.
#include "kernels/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace attnres::cuda {

namespace {
size_t round_up(size_t bytes, size_t granule) { return (bytes + granule - 1) / granule * granule; }
}  // namespace

// Free blocks ordered by (size, address): lower_bound(size) is the best fit, and the lowest
// address among equal sizes keeps the choice deterministic.
struct CachingAllocator::FreeList {
  struct BySize {
    using is_transparent = void;
    struct Size {
      size_t bytes;
    };
    bool operator()(const Block* a, const Block* b) const;
    bool operator()(const Block* a, Size b) const;
    bool operator()(Size a, const Block* b) const;
  };
  using Set = std::set<Block*, BySize>;

  FreeList(bool small, bool graph_pool) : small(small), graph_pool(graph_pool) {}
  Set blocks;
  const bool small;       // which pool's blocks (small / large segments)
  const bool graph_pool;  // counts as held for graphs, not as cached
};

struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;
  size_t requested = 0;   // handed out: the bytes asked for (at most size)
  bool small = false;     // of a small-pool segment
  Block* prev = nullptr;  // neighbours in the segment, by address
  Block* next = nullptr;
  FreeList* list = nullptr;       // the free list holding it; null while handed out
  std::weak_ptr<GraphPool> pool;  // handed out: the live pool it returns to, if any
  // Its free-list entry while it is in no list, so that freeing never allocates.
  FreeList::Set::node_type node;

  bool whole_segment() const { return !prev && !next; }
};

bool CachingAllocator::FreeList::BySize::operator()(const Block* a, const Block* b) const {
  return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
}
bool CachingAllocator::FreeList::BySize::operator()(const Block* a, Size b) const {
  return a->size < b.bytes;
}
bool CachingAllocator::FreeList::BySize::operator()(Size a, const Block* b) const {
  return a.bytes < b->size;
}
bool CachingAllocator::ByAddress::operator()(const Block* a, const Block* b) const {
  return a->ptr < b->ptr;
}

// A pool's free lists are guarded by its allocator's mutex. Members are destroyed after the
// destructor's body (which holds the mutex) and in reverse order: the (then empty) lists,
// `earlier` (which may run another pool's destructor) after the lock is released, `owner`
// last.
class CachingAllocator::GraphPool {
 public:
  explicit GraphPool(std::shared_ptr<CachingAllocator> owner) : owner(std::move(owner)) {}
  ~GraphPool() {
    std::lock_guard<std::mutex> lock(owner->mutex_);
    for (FreeList* list : {&small, &large}) {
      while (!list->blocks.empty()) {
        FreeList::Set::node_type node = list->blocks.extract(list->blocks.begin());
        Block* block = node.value();
        block->node = std::move(node);
        block->list = nullptr;
        owner->stats_.graph_pool_free -= block->size;
        owner->put_free(block, owner->general(block->small));
      }
    }
  }
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;
  FreeList& list(bool is_small) { return is_small ? small : large; }

  std::shared_ptr<CachingAllocator> owner;
  std::vector<std::shared_ptr<GraphPool>> earlier;  // pools of blocks this graph may use too
  FreeList small{true, true}, large{false, true};
};

CachingAllocator::RawMemory CachingAllocator::cuda_memory(int device) {
  RawMemory raw;
  raw.allocate = [device](size_t bytes) -> void* {
    // cudaMalloc allocates on the calling thread's current device: make it ours.
    ScopedDevice on_device(device);
    if (!on_device.ok())
      throw Error("CUDA allocation: cannot select device " + std::to_string(device));
    // A strict (thread-local) capture refuses cudaMalloc as potentially unsafe. A segment for
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

size_t CachingAllocator::round_size(size_t bytes) { return round_up(bytes, kGranule); }

size_t CachingAllocator::segment_size(size_t bytes) {
  const size_t size = round_size(bytes);
  return size <= kSmallRequest ? kSmallSegment : round_up(size, kLargeSegmentGranule);
}

CachingAllocator::CachingAllocator(RawMemory raw, Options options)
    : raw_(std::move(raw)),
      options_(options),
      small_(std::make_unique<FreeList>(true, false)),
      large_(std::make_unique<FreeList>(false, false)) {}

CachingAllocator::~CachingAllocator() {
  // Runs when the last tensor, pool and the backend are gone, on any thread. Never throws.
  // Every block is free in the general cache by then, so each segment is one whole block.
  small_->blocks.clear();
  large_->blocks.clear();
  for (Block* head : segments_) {
    raw_.free(head->ptr);
    for (Block* block = head; block;) delete std::exchange(block, block->next);
  }
}

CachingAllocator::FreeList& CachingAllocator::general(bool small) {
  return small ? *small_ : *large_;
}

void CachingAllocator::hand_out(Block* block, size_t requested) {
  block->requested = requested;
  stats_.in_use += block->size;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  stats_.requested += requested;
  stats_.peak_requested = std::max(stats_.peak_requested, stats_.requested);
}

// Puts a block that is in no list into `list`, merged with its neighbours there. Extracting
// and reinserting set nodes never allocates, so this cannot fail.
void CachingAllocator::put_free(Block* block, FreeList& list) noexcept {
  size_t& bytes = list.graph_pool ? stats_.graph_pool_free : stats_.cached;
  block->pool.reset();
  if (Block* prev = block->prev; prev && prev->list == &list) {
    prev->node = list.blocks.extract(prev);
    bytes -= prev->size;
    prev->size += block->size;
    prev->next = block->next;
    if (block->next) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next && next->list == &list) {
    next->node = list.blocks.extract(next);
    bytes -= next->size;
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    delete next;
  }
  block->list = &list;
  bytes += block->size;
  list.blocks.insert(std::move(block->node));
}

// The smallest block of `list` that holds `size` bytes and exceeds it by at most
// `max_oversize`, taken out and cut to size; the remainder goes free into `remainder_list`.
// Null when there is none. Throws (a failed host allocation) before changing anything.
CachingAllocator::Block* CachingAllocator::take(FreeList& list, size_t size,
                                                const std::shared_ptr<GraphPool>& pool,
                                                FreeList* remainder_list, size_t max_oversize) {
  auto it = list.blocks.lower_bound(FreeList::BySize::Size{size});
  if (it == list.blocks.end() || (*it)->size - size > max_oversize) return nullptr;
  Block* block = *it;
  const size_t remainder = block->size - size;
  const bool cut = remainder > 0 && (list.small || remainder > kMinLargeRemainder);
  std::unique_ptr<Block> rest;
  if (cut) {
    rest = std::make_unique<Block>();
    FreeList::Set scratch;  // the remainder's own free-list node
    scratch.insert(rest.get());
    rest->node = scratch.extract(scratch.begin());
  }
  block->node = list.blocks.extract(it);
  block->list = nullptr;
  (list.graph_pool ? stats_.graph_pool_free : stats_.cached) -= block->size;
  if (cut) {
    Block* r = rest.release();
    r->ptr = block->ptr + size;
    r->size = remainder;
    r->small = block->small;
    r->prev = block;
    r->next = block->next;
    if (block->next) block->next->prev = r;
    block->next = r;
    block->size = size;
    put_free(r, *remainder_list);
  }
  block->pool = pool;
  return block;
}

// A new segment, free in `list`. Throws (a failed host allocation) without keeping it.
CachingAllocator::Block* CachingAllocator::add_segment(void* ptr, size_t size, bool small,
                                                       FreeList& list) {
  auto block = std::make_unique<Block>();
  block->ptr = static_cast<char*>(ptr);
  block->size = size;
  block->small = small;
  FreeList::Set scratch;
  scratch.insert(block.get());
  block->node = scratch.extract(scratch.begin());
  segments_.insert(block.get());
  Block* head = block.release();
  stats_.reserved += size;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  ++stats_.segments;
  put_free(head, list);
  return head;
}

// Removes whole free segments of the general cache from the books, largest first, until
// they add up to `at_least` bytes (or all of them), and returns their pointers for free_raw.
// Largest first: the fewest cudaFree calls reach the limit, and the small segments left
// serve the many small requests (measured against smallest first: NOTES.md).
std::vector<void*> CachingAllocator::take_whole_segments(size_t at_least, bool all) {
  std::vector<Block*> whole;
  for (FreeList* list : {small_.get(), large_.get()})
    for (Block* block : list->blocks)
      if (block->whole_segment()) whole.push_back(block);
  std::sort(whole.rbegin(), whole.rend(), FreeList::BySize{});
  std::vector<void*> ptrs;
  size_t released = 0;
  for (Block* block : whole) {
    if (!all && released >= at_least) break;
    ptrs.push_back(block->ptr);
    released += block->size;
    block->list->blocks.erase(block);
    segments_.erase(block);
    stats_.cached -= block->size;
    stats_.reserved -= block->size;
    --stats_.segments;
    ++stats_.raw_frees;
    delete block;
  }
  return ptrs;
}

void CachingAllocator::free_raw(const std::vector<void*>& ptrs) noexcept {
  for (void* ptr : ptrs) raw_.free(ptr);
}

std::shared_ptr<void> CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = round_size(bytes);
  const bool small = size <= kSmallRequest;
  const size_t segment = segment_size(bytes);
  constexpr size_t kAny = std::numeric_limits<size_t>::max();
  std::shared_ptr<GraphPool> pool;
  Block* block = nullptr;
  std::vector<void*> to_free;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pool = capturing_;
    if (pool) {
      // The capture's own blocks first; a general block only if the graph would not hold
      // much more than it asked for (the remainder becomes the pool's too).
      FreeList& own = pool->list(small);
      block = take(own, size, pool, &own, kAny);
      if (!block) block = take(general(small), size, pool, &own, kMaxCaptureOversize);
    } else {
      block = take(general(small), size, nullptr, &general(small), kAny);
    }
    if (block) {
      hand_out(block, bytes);
    } else if (!pool) {
      // The release policy: keep reserved within the factor of the peak in use.
      const double peak = double(std::max(stats_.peak_requested, stats_.requested + bytes));
      const double limit = options_.max_reserved_over_peak * peak;
      const double after = double(stats_.reserved + segment);
      if (after > limit) to_free = take_whole_segments(size_t(std::ceil(after - limit)), false);
    }
  }
  if (!block) {
    free_raw(to_free);  // a cudaFree synchronizes: never during a capture
    void* ptr = raw_.allocate(segment);
    if (!ptr && !pool) {  // empty the cache and try once more
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.failed_raw_allocations;
      }
      release_cached();
      ptr = raw_.allocate(segment);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!ptr) {
      ++stats_.failed_raw_allocations;
      throw Error("CUDA allocation of " + std::to_string(bytes) + " bytes (a new segment of " +
                  std::to_string(segment) + " bytes) failed: out of memory (in use " +
                  std::to_string(stats_.in_use) + " bytes, cached " +
                  std::to_string(stats_.cached) + " bytes, held for CUDA graphs " +
                  std::to_string(stats_.graph_pool_free) + " bytes" +
                  (pool ? "; during a capture the cache is not emptied" : "") + ")");
    }
    FreeList& list = pool ? pool->list(small) : general(small);
    try {
      add_segment(ptr, segment, small, list);
    } catch (...) {
      raw_.free(ptr);  // not in the books: nothing can use it
      throw;
    }
    ++stats_.raw_allocations;
    // Another thread may have freed a better fit meanwhile: best fit still picks it.
    block = take(list, size, pool, &list, kAny);
    ATTNRES_CHECK(block != nullptr, "CachingAllocator: a new segment does not hold its request");
    hand_out(block, bytes);
  }
  std::shared_ptr<CachingAllocator> self = shared_from_this();
  // (Should the control block fail to allocate, shared_ptr runs the deleter: no leak.)
  return std::shared_ptr<void>(block->ptr, [self, block](void*) { self->give_back(block); });
}

void CachingAllocator::give_back(Block* block) noexcept {
  std::shared_ptr<GraphPool> pool;  // released after the lock: may run the pool's destructor
  std::lock_guard<std::mutex> lock(mutex_);
  pool = block->pool.lock();
  stats_.in_use -= block->size;
  stats_.requested -= block->requested;
  put_free(block, pool ? pool->list(block->small) : general(block->small));
}

std::shared_ptr<CachingAllocator::GraphPool> CachingAllocator::begin_capture() {
  auto pool = std::make_shared<GraphPool>(shared_from_this());
  std::vector<std::shared_ptr<GraphPool>> earlier;  // released after the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ATTNRES_CHECK(!capturing_, "CachingAllocator: a capture is already under way");
    for (Block* head : segments_) {
      for (Block* block = head; block; block = block->next) {
        if (block->list) continue;  // free
        if (std::shared_ptr<GraphPool> owner = block->pool.lock()) {
          earlier.push_back(std::move(owner));
        } else {
          block->pool = pool;
        }
      }
    }
    capturing_ = pool;
  }
  std::sort(earlier.begin(), earlier.end());
  earlier.erase(std::unique(earlier.begin(), earlier.end()), earlier.end());
  pool->earlier = std::move(earlier);  // not yet reachable by another thread but through
                                       // capturing_, which touches only the free lists
  return pool;
}

void CachingAllocator::end_capture() {
  std::shared_ptr<GraphPool> ended;  // released after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  ended.swap(capturing_);
}

void CachingAllocator::release_cached() {
  std::vector<void*> to_free;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    to_free = take_whole_segments(0, true);
  }
  free_raw(to_free);
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}
size_t CachingAllocator::in_use_bytes() const { return stats().in_use; }
size_t CachingAllocator::cached_free_bytes() const { return stats().cached; }
size_t CachingAllocator::graph_pool_free_bytes() const { return stats().graph_pool_free; }
size_t CachingAllocator::reserved_bytes() const { return stats().reserved; }

std::vector<CachingAllocator::BlockInfo> CachingAllocator::blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<BlockInfo> out;
  size_t segment = 0;
  for (const Block* head : segments_) {
    for (const Block* block = head; block; block = block->next) {
      const bool in_pool = block->list ? block->list->graph_pool : !block->pool.expired();
      out.push_back(
          {block->ptr, block->size, segment, block->list == nullptr, in_pool, block->list});
    }
    ++segment;
  }
  return out;
}

}  // namespace attnres::cuda
