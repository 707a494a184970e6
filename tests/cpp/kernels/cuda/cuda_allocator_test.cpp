// The caching allocator's bookkeeping (kernels/cuda/cuda_allocator.h) over host memory
// instead of cudaMalloc: which block goes to whom, and when graph pools let blocks go.
// Needs no GPU, so these run (not skip) on every machine that builds the CUDA backend.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <set>

#include "engine/core/error.h"
#include "kernels/cuda/cuda_allocator.h"

namespace attnres::cuda {
namespace {

// Host memory standing in for the device, counting what is live.
struct HostMemory {
  std::set<void*> live;
  size_t mallocs = 0;
  bool out_of_memory = false;
  CachingAllocator::RawMemory raw() {
    return {[this](size_t bytes) -> void* {
              if (out_of_memory) return nullptr;
              void* p = std::malloc(bytes);
              live.insert(p);
              ++mallocs;
              return p;
            },
            [this](void* p) {
              live.erase(p);
              std::free(p);
            }};
  }
};

std::shared_ptr<CachingAllocator> make(HostMemory& memory) {
  return std::make_shared<CachingAllocator>(memory.raw());
}

TEST(CachingAllocator, ReusesFreedBlocksOfTheSameSizeClass) {
  HostMemory memory;
  auto alloc = make(memory);
  void* first = nullptr;
  {
    std::shared_ptr<void> a = alloc->allocate(1000);
    first = a.get();
    EXPECT_EQ(alloc->in_use_bytes(), 1024u);
  }
  EXPECT_EQ(alloc->cached_free_bytes(), 1024u);
  std::shared_ptr<void> b = alloc->allocate(1020);  // rounds to the same 1024
  EXPECT_EQ(b.get(), first);
  EXPECT_EQ(memory.mallocs, 1u);
  std::shared_ptr<void> c = alloc->allocate(2000);
  EXPECT_NE(c.get(), first);
  c.reset();
  alloc->release_cached();
  EXPECT_EQ(alloc->cached_free_bytes(), 0u);
  EXPECT_EQ(memory.live.size(), 1u);  // b only
}

TEST(CachingAllocator, OutOfMemoryEmptiesTheCacheThenThrows) {
  HostMemory memory;
  auto alloc = make(memory);
  alloc->allocate(4096).reset();
  memory.out_of_memory = true;
  EXPECT_THROW(alloc->allocate(512), Error);
  EXPECT_EQ(alloc->cached_free_bytes(), 0u);  // emptied before giving up
  EXPECT_TRUE(memory.live.empty());
}

// A block freed during a capture is an intermediate the graph writes at every replay: it
// stays in the graph's pool, and is reused only by the same capture, until the graph goes.
TEST(CachingAllocator, BlocksFreedDuringACaptureStayWithTheGraph) {
  HostMemory memory;
  auto alloc = make(memory);
  void* intermediate = nullptr;
  std::shared_ptr<CachingAllocator::GraphPool> graph = alloc->begin_capture();
  {
    std::shared_ptr<void> a = alloc->allocate(1000);
    intermediate = a.get();
  }
  std::shared_ptr<void> again = alloc->allocate(1000);  // same capture: reuses its own block
  EXPECT_EQ(again.get(), intermediate);
  again.reset();
  alloc->end_capture();
  EXPECT_EQ(alloc->cached_free_bytes(), 0u);
  EXPECT_EQ(alloc->graph_pool_free_bytes(), 1024u);

  std::shared_ptr<void> eager = alloc->allocate(1000);  // between replays
  EXPECT_NE(eager.get(), intermediate);
  eager.reset();

  graph.reset();  // the graph is destroyed: its blocks are anyone's again
  EXPECT_EQ(alloc->graph_pool_free_bytes(), 0u);
  EXPECT_EQ(alloc->cached_free_bytes(), 2048u);
  std::shared_ptr<void> x = alloc->allocate(1000), y = alloc->allocate(1000);
  EXPECT_TRUE(x.get() == intermediate || y.get() == intermediate);
  EXPECT_EQ(memory.mallocs, 2u);
}

// A block in use when the capture begins (the KV cache, a kept workspace, a staging buffer)
// may be read or written by the graph: freed while the graph lives, it waits for the graph.
TEST(CachingAllocator, BlocksInUseAtACaptureWaitForTheGraphWhenFreed) {
  HostMemory memory;
  auto alloc = make(memory);
  std::shared_ptr<void> workspace = alloc->allocate(5000);
  void* old = workspace.get();
  std::shared_ptr<CachingAllocator::GraphPool> graph = alloc->begin_capture();
  alloc->end_capture();
  workspace.reset();  // regrown by a later eager step, say
  EXPECT_EQ(alloc->cached_free_bytes(), 0u);
  std::shared_ptr<void> other = alloc->allocate(5000);
  EXPECT_NE(other.get(), old);
  other.reset();
  graph.reset();
  std::shared_ptr<void> a = alloc->allocate(5000), b = alloc->allocate(5000);
  EXPECT_TRUE(a.get() == old || b.get() == old);

  // A block allocated after the capture is the eager steps' own: back to the cache at once.
  std::shared_ptr<CachingAllocator::GraphPool> graph2 = alloc->begin_capture();
  alloc->end_capture();
  std::shared_ptr<void> later = alloc->allocate(700);
  void* later_ptr = later.get();
  later.reset();
  EXPECT_EQ(alloc->allocate(700).get(), later_ptr);
}

// A block two live graphs may use returns to the cache only when both are gone, whichever
// goes first.
TEST(CachingAllocator, ABlockSharedByTwoGraphsWaitsForBoth) {
  for (bool first_graph_goes_first : {true, false}) {
    HostMemory memory;
    auto alloc = make(memory);
    std::shared_ptr<void> cache = alloc->allocate(3000);
    void* ptr = cache.get();
    auto g1 = alloc->begin_capture();
    alloc->end_capture();
    auto g2 = alloc->begin_capture();
    alloc->end_capture();
    cache.reset();
    (first_graph_goes_first ? g1 : g2).reset();
    EXPECT_NE(alloc->allocate(3000).get(), ptr) << first_graph_goes_first;
    (first_graph_goes_first ? g2 : g1).reset();
    std::shared_ptr<void> a = alloc->allocate(3000), b = alloc->allocate(3000);
    EXPECT_TRUE(a.get() == ptr || b.get() == ptr) << first_graph_goes_first;
  }
}

// A capture takes blocks from the general cache (they become the graph's), but never from
// another live graph's pool.
TEST(CachingAllocator, ACaptureNeverTakesAnotherGraphsBlocks) {
  HostMemory memory;
  auto alloc = make(memory);
  alloc->allocate(1000).reset();  // one cached block
  auto g1 = alloc->begin_capture();
  void* g1_block = nullptr;
  {
    std::shared_ptr<void> a = alloc->allocate(1000);  // the cached one, now g1's
    g1_block = a.get();
  }
  alloc->end_capture();
  EXPECT_EQ(memory.mallocs, 1u);
  auto g2 = alloc->begin_capture();
  std::shared_ptr<void> b = alloc->allocate(1000);
  EXPECT_NE(b.get(), g1_block);
  EXPECT_EQ(memory.mallocs, 2u);
  b.reset();
  alloc->end_capture();
  EXPECT_ANY_THROW({
    auto g3 = alloc->begin_capture();
    alloc->begin_capture();  // one capture at a time
  });
  alloc->end_capture();
  // An out-of-memory capture throws without emptying the cache (that would synchronize).
  alloc->allocate(8192).reset();
  memory.out_of_memory = true;
  auto g4 = alloc->begin_capture();
  EXPECT_THROW(alloc->allocate(512), Error);
  alloc->end_capture();
  EXPECT_EQ(alloc->cached_free_bytes(), 8192u);
}

TEST(CachingAllocator, ReleaseCachedLeavesGraphBlocksAlone) {
  HostMemory memory;
  auto alloc = make(memory);
  auto graph = alloc->begin_capture();
  void* held = nullptr;
  {
    std::shared_ptr<void> a = alloc->allocate(1000);
    held = a.get();
  }
  alloc->end_capture();
  alloc->allocate(2000).reset();
  alloc->release_cached();
  EXPECT_EQ(memory.live.size(), 1u);
  EXPECT_EQ(memory.live.count(held), 1u);
  graph.reset();
  alloc.reset();  // the allocator frees what it cached
  EXPECT_TRUE(memory.live.empty());
}

}  // namespace
}  // namespace attnres::cuda
