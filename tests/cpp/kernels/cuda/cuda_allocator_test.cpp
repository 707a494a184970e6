// The caching allocator's bookkeeping (kernels/cuda/cuda_allocator.h) over host memory
// instead of cudaMalloc: which block goes to whom, how blocks are cut and merged, and when
// graph pools let blocks go. Needs no GPU, so these run (not skip) on every machine that
// builds the CUDA backend. The serving workload, a random fuzz and out-of-memory are in
// cuda_allocator_workload_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cuda/cuda_allocator.h"
#include "tests/cpp/kernels/cuda/allocator_test_util.h"

namespace attnres::cuda {
namespace {

using testing::check_invariants;
using testing::CountingMemory;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSmallSegment = CachingAllocator::kSmallSegment;

// These tests follow the bookkeeping block by block, so the release policy (which may give
// back a whole free segment before a cudaMalloc) is off unless a test is about it.
std::shared_ptr<CachingAllocator> make(CountingMemory& memory,
                                       double max_reserved_over_peak = 1e9) {
  CachingAllocator::Options options;
  options.max_reserved_over_peak = max_reserved_over_peak;
  return std::make_shared<CachingAllocator>(memory.raw(), options);
}

char* at(const std::shared_ptr<void>& p) { return static_cast<char*>(p.get()); }

// Whether [p, p + bytes) lies inside the raw allocation starting at `segment`.
bool inside(const void* p, const void* segment, size_t segment_bytes) {
  auto* c = static_cast<const char*>(p);
  auto* s = static_cast<const char*>(segment);
  return c >= s && c < s + segment_bytes;
}

#define EXPECT_INVARIANTS(alloc, memory) EXPECT_EQ(check_invariants(*(alloc), (memory)), "")

TEST(CachingAllocator, SizePolicy) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1000), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(3 * kMiB + 1), 3 * kMiB + 512);  // not 2 MiB granules
  EXPECT_EQ(CachingAllocator::segment_size(1000), kSmallSegment);
  EXPECT_EQ(CachingAllocator::segment_size(kMiB), kSmallSegment);
  EXPECT_EQ(CachingAllocator::segment_size(kMiB + 1), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(5 * kMiB), 6 * kMiB);
}

// Small requests share a 2 MiB segment: each cut from the free remainder, best fit first.
TEST(CachingAllocator, SmallRequestsAreCutFromOneSegment) {
  CountingMemory memory;
  auto alloc = make(memory);
  void* first = nullptr;
  {
    std::shared_ptr<void> a = alloc->allocate(1000);
    first = a.get();
    EXPECT_EQ(alloc->in_use_bytes(), 1024u);
    EXPECT_EQ(alloc->reserved_bytes(), kSmallSegment);
    EXPECT_INVARIANTS(alloc, memory);
  }
  EXPECT_EQ(alloc->cached_free_bytes(), kSmallSegment);  // merged back: one whole segment
  EXPECT_EQ(alloc->blocks().size(), 1u);
  std::shared_ptr<void> b = alloc->allocate(1020);  // the same 1024 bytes
  EXPECT_EQ(b.get(), first);
  std::shared_ptr<void> c = alloc->allocate(2000);  // cut right after it
  EXPECT_EQ(at(c), at(b) + 1024);
  EXPECT_EQ(memory.allocations, 1u);
  EXPECT_INVARIANTS(alloc, memory);
  c.reset();
  alloc->release_cached();  // the segment is partly in use: kept
  EXPECT_EQ(memory.live.size(), 1u);
  EXPECT_EQ(alloc->cached_free_bytes(), kSmallSegment - 1024);
  b.reset();
  alloc->release_cached();
  EXPECT_TRUE(memory.live.empty());
  EXPECT_INVARIANTS(alloc, memory);
}

// A large cached block serves a smaller request (best fit), cut when more than 1 MiB would
// remain; freed pieces merge back into the whole segment.
TEST(CachingAllocator, LargeBlocksAreCutAndMergedBack) {
  CountingMemory memory;
  auto alloc = make(memory);
  void* segment = nullptr;
  {
    std::shared_ptr<void> big = alloc->allocate(10 * kMiB);
    segment = big.get();
  }
  std::shared_ptr<void> a = alloc->allocate(4 * kMiB);
  EXPECT_EQ(a.get(), segment);
  std::shared_ptr<void> b = alloc->allocate(5 * kMiB);  // 6 MiB left: 1 MiB over is not cut
  EXPECT_EQ(at(b), at(a) + 4 * kMiB);
  EXPECT_EQ(alloc->in_use_bytes(), 10 * kMiB);
  EXPECT_EQ(alloc->stats().requested, 9 * kMiB);
  EXPECT_EQ(memory.allocations, 1u);
  EXPECT_INVARIANTS(alloc, memory);
  a.reset();
  EXPECT_INVARIANTS(alloc, memory);
  b.reset();
  EXPECT_EQ(alloc->blocks().size(), 1u);
  EXPECT_EQ(alloc->allocate(10 * kMiB).get(), segment);
  EXPECT_EQ(memory.allocations, 1u);
}

// Three neighbours freed in every order end as one free block, merged at each step where
// a free neighbour exists.
TEST(CachingAllocator, NeighboursMergeInEveryFreeOrder) {
  std::vector<int> order{0, 1, 2};
  do {
    CountingMemory memory;
    auto alloc = make(memory);
    alloc->allocate(12 * kMiB).reset();  // one segment, cut into three below
    std::vector<std::shared_ptr<void>> blocks;
    for (size_t bytes : {3 * kMiB, 4 * kMiB, 5 * kMiB}) blocks.push_back(alloc->allocate(bytes));
    ASSERT_EQ(memory.live.size(), 1u);
    ASSERT_EQ(alloc->blocks().size(), 3u);
    for (int i : order) {
      blocks[size_t(i)].reset();
      EXPECT_INVARIANTS(alloc, memory);
    }
    EXPECT_EQ(alloc->blocks().size(), 1u) << order[0] << order[1] << order[2];
  } while (std::next_permutation(order.begin(), order.end()));
}

// The small and the large pool never lend to each other: a small block cannot pin a large
// segment, and a large request never takes a small segment.
TEST(CachingAllocator, SmallAndLargePoolsAreSeparate) {
  CountingMemory memory;
  auto alloc = make(memory);
  alloc->allocate(1000).reset();  // a whole free small segment (2 MiB)
  std::shared_ptr<void> large = alloc->allocate(1536 * 1024);
  EXPECT_EQ(memory.allocations, 2u);
  large.reset();                                        // a whole free large segment (2 MiB)
  std::shared_ptr<void> small = alloc->allocate(kMiB);  // the small pool's largest request
  EXPECT_EQ(memory.allocations, 2u);
  const auto blocks = alloc->blocks();
  const auto where = std::find_if(blocks.begin(), blocks.end(),
                                  [&](const auto& b) { return b.ptr == small.get(); });
  ASSERT_NE(where, blocks.end());
  EXPECT_EQ(where->size, kMiB);  // cut from the small segment
  EXPECT_INVARIANTS(alloc, memory);
}

// A block freed during a capture is an intermediate the graph writes at every replay: it
// stays in the graph's pool, and is reused only by the same capture, until the graph goes.
TEST(CachingAllocator, BlocksFreedDuringACaptureStayWithTheGraph) {
  CountingMemory memory;
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
  EXPECT_EQ(alloc->graph_pool_free_bytes(), kSmallSegment);
  EXPECT_INVARIANTS(alloc, memory);

  std::shared_ptr<void> eager = alloc->allocate(1000);  // between replays
  EXPECT_NE(eager.get(), intermediate);
  eager.reset();

  graph.reset();  // the graph is destroyed: its blocks are anyone's again
  EXPECT_EQ(alloc->graph_pool_free_bytes(), 0u);
  EXPECT_EQ(alloc->cached_free_bytes(), 2 * kSmallSegment);
  EXPECT_INVARIANTS(alloc, memory);
  std::vector<std::shared_ptr<void>> xs;
  for (int i = 0; i < 2 * int(kSmallSegment / 1024); ++i) xs.push_back(alloc->allocate(1000));
  EXPECT_TRUE(std::any_of(xs.begin(), xs.end(), [&](auto& x) { return x.get() == intermediate; }));
  EXPECT_EQ(memory.allocations, 2u);
}

// A block in use when the capture begins (the KV cache, a kept workspace, a staging buffer)
// may be read or written by the graph: freed while the graph lives, it waits for the graph.
TEST(CachingAllocator, BlocksInUseAtACaptureWaitForTheGraphWhenFreed) {
  CountingMemory memory;
  auto alloc = make(memory);
  std::shared_ptr<void> workspace = alloc->allocate(5000);
  void* old = workspace.get();
  std::shared_ptr<CachingAllocator::GraphPool> graph = alloc->begin_capture();
  alloc->end_capture();
  workspace.reset();  // regrown by a later eager step, say
  EXPECT_EQ(alloc->graph_pool_free_bytes(), 5120u);
  std::shared_ptr<void> other = alloc->allocate(5000);
  EXPECT_NE(other.get(), old);
  other.reset();
  graph.reset();
  EXPECT_EQ(alloc->blocks().size(), 1u);  // merged with the rest of its segment
  EXPECT_EQ(alloc->allocate(5000).get(), old);

  // A block allocated after the capture is the eager steps' own: back to the cache at once.
  std::shared_ptr<CachingAllocator::GraphPool> graph2 = alloc->begin_capture();
  alloc->end_capture();
  std::shared_ptr<void> later = alloc->allocate(700);
  void* later_ptr = later.get();
  later.reset();
  EXPECT_EQ(alloc->allocate(700).get(), later_ptr);
  EXPECT_INVARIANTS(alloc, memory);
}

// Blocks in use at a capture share their segment with eager free space: freed, they merge
// only with each other (the pool's), never with the general remainder next to them, and
// the remainder still serves eager requests (the graph never touched it).
TEST(CachingAllocator, PoolBlocksAndGeneralBlocksShareASegmentWithoutMerging) {
  CountingMemory memory;
  auto alloc = make(memory);
  std::shared_ptr<void> x = alloc->allocate(1000), y = alloc->allocate(1000);
  ASSERT_EQ(at(y), at(x) + 1024);
  char* segment = at(x);
  auto graph = alloc->begin_capture();
  alloc->end_capture();
  x.reset();
  y.reset();
  EXPECT_EQ(alloc->graph_pool_free_bytes(), 2048u);
  EXPECT_EQ(alloc->blocks().size(), 2u);  // pool [x, y] merged, general remainder
  EXPECT_INVARIANTS(alloc, memory);
  std::shared_ptr<void> eager = alloc->allocate(1000);
  EXPECT_EQ(at(eager), segment + 2048);  // the general remainder, not x or y
  eager.reset();
  graph.reset();
  EXPECT_EQ(alloc->blocks().size(), 1u);
  EXPECT_EQ(alloc->cached_free_bytes(), kSmallSegment);
  EXPECT_INVARIANTS(alloc, memory);
}

// A block two live graphs may use returns to the cache only when both are gone, whichever
// goes first.
TEST(CachingAllocator, ABlockSharedByTwoGraphsWaitsForBoth) {
  for (bool first_graph_goes_first : {true, false}) {
    CountingMemory memory;
    auto alloc = make(memory);
    std::shared_ptr<void> cache = alloc->allocate(3 * kMiB);  // a whole 4 MiB segment
    void* ptr = cache.get();
    auto g1 = alloc->begin_capture();
    alloc->end_capture();
    auto g2 = alloc->begin_capture();
    alloc->end_capture();
    cache.reset();
    (first_graph_goes_first ? g1 : g2).reset();
    EXPECT_NE(alloc->allocate(3 * kMiB).get(), ptr) << first_graph_goes_first;
    (first_graph_goes_first ? g2 : g1).reset();
    std::shared_ptr<void> a = alloc->allocate(3 * kMiB), b = alloc->allocate(3 * kMiB);
    EXPECT_TRUE(a.get() == ptr || b.get() == ptr) << first_graph_goes_first;
    EXPECT_INVARIANTS(alloc, memory);
  }
}

// A capture takes blocks from the general cache (they become the graph's), but never from
// another live graph's pool.
TEST(CachingAllocator, ACaptureNeverTakesAnotherGraphsBlocks) {
  CountingMemory memory;
  auto alloc = make(memory);
  alloc->allocate(1000).reset();  // one cached segment
  auto g1 = alloc->begin_capture();
  void* g1_block = nullptr;
  {
    std::shared_ptr<void> a = alloc->allocate(1000);  // cut from the cached one, now g1's
    g1_block = a.get();
  }
  alloc->end_capture();
  EXPECT_EQ(memory.allocations, 1u);
  EXPECT_EQ(alloc->graph_pool_free_bytes(), kSmallSegment);  // the remainder too
  auto g2 = alloc->begin_capture();
  std::shared_ptr<void> b = alloc->allocate(1000);
  EXPECT_FALSE(inside(b.get(), g1_block, kSmallSegment));
  EXPECT_EQ(memory.allocations, 2u);
  b.reset();
  alloc->end_capture();
  EXPECT_ANY_THROW({
    auto g3 = alloc->begin_capture();
    alloc->begin_capture();  // one capture at a time
  });
  alloc->end_capture();
  // An out-of-memory capture throws without emptying the cache (that would synchronize).
  alloc->allocate(8 * kMiB).reset();
  memory.capacity = memory.live_bytes;
  auto g4 = alloc->begin_capture();
  EXPECT_THROW(alloc->allocate(16 * kMiB), Error);
  alloc->end_capture();
  EXPECT_EQ(alloc->cached_free_bytes(), 8 * kMiB);
  EXPECT_EQ(memory.frees, 0u);
  EXPECT_INVARIANTS(alloc, memory);
}

// Cutting during a capture: the remainder of a block the capture cuts (from its own pool,
// from a new segment or from the general cache) is the graph's while the graph lives, and
// no eager request gets any of it; once the graph is gone, every piece merges back.
TEST(CachingAllocator, BlocksCutDuringACaptureKeepTheirRemainderInThePool) {
  CountingMemory memory;
  auto alloc = make(memory);
  alloc->allocate(8 * kMiB).reset();   // a general 8 MiB segment
  alloc->allocate(64 * kMiB).reset();  // and a 64 MiB one
  ASSERT_EQ(memory.allocations, 2u);
  void* general8 = nullptr;
  void* general64 = nullptr;
  for (const auto& b : alloc->blocks())
    (b.size == 8 * kMiB ? general8 : general64) = const_cast<void*>(b.ptr);

  auto graph = alloc->begin_capture();
  // From the general cache: 6.5 MiB of the 8 MiB block (1.5 MiB over: within the bound).
  std::shared_ptr<void> a = alloc->allocate(6 * kMiB + kMiB / 2);
  EXPECT_EQ(a.get(), general8);
  // Not from the 64 MiB block: the graph would hold all of it. A new segment instead.
  std::shared_ptr<void> b = alloc->allocate(16 * kMiB);
  EXPECT_FALSE(inside(b.get(), general64, 64 * kMiB));
  EXPECT_EQ(memory.allocations, 3u);
  void* new_segment = b.get();
  b.reset();  // the capture's intermediate: now pool free, 16 MiB
  // Cut from the pool's own free block, twice.
  std::shared_ptr<void> c = alloc->allocate(4 * kMiB), d = alloc->allocate(5 * kMiB);
  EXPECT_EQ(c.get(), new_segment);
  EXPECT_EQ(at(d), at(c) + 4 * kMiB);
  // A small request: a new small segment, cut; the rest of it is the pool's too.
  std::shared_ptr<void> e = alloc->allocate(1000);
  void* small_segment = e.get();
  EXPECT_EQ(memory.allocations, 4u);
  alloc->end_capture();
  c.reset();
  d.reset();
  e.reset();
  EXPECT_INVARIANTS(alloc, memory);
  EXPECT_EQ(alloc->cached_free_bytes(), 64 * kMiB);
  EXPECT_EQ(alloc->graph_pool_free_bytes(), kSmallSegment + 16 * kMiB + 1536 * 1024);

  // Eager requests between replays, of sizes that every pool remainder would fit.
  std::vector<std::shared_ptr<void>> eager;
  for (size_t bytes : {size_t{1000}, size_t{1000}, kMiB + kMiB / 4, 3 * kMiB, 10 * kMiB}) {
    eager.push_back(alloc->allocate(bytes));
    EXPECT_FALSE(inside(eager.back().get(), general8, 8 * kMiB)) << bytes;
    EXPECT_FALSE(inside(eager.back().get(), new_segment, 16 * kMiB)) << bytes;
    EXPECT_FALSE(inside(eager.back().get(), small_segment, kSmallSegment)) << bytes;
  }
  EXPECT_INVARIANTS(alloc, memory);
  eager.clear();
  a.reset();  // a still-live graph block freed after the capture: back to the pool
  EXPECT_EQ(alloc->graph_pool_free_bytes(), kSmallSegment + 16 * kMiB + 8 * kMiB);

  graph.reset();
  EXPECT_EQ(alloc->graph_pool_free_bytes(), 0u);
  EXPECT_EQ(alloc->in_use_bytes(), 0u);
  for (const auto& block : alloc->blocks())  // every segment whole again
    EXPECT_EQ(block.size, memory.live.at(const_cast<void*>(block.ptr)));
  EXPECT_INVARIANTS(alloc, memory);
}

// Before a new segment would take reserved bytes past 1.5x the peak requested, whole free
// segments of the general cache go, largest first; pool blocks and partly used segments stay.
TEST(CachingAllocator, ReleasePolicyKeepsReservedNearThePeak) {
  CountingMemory memory;
  auto alloc = make(memory, 1.5);
  {
    std::shared_ptr<void> a = alloc->allocate(8 * kMiB), b = alloc->allocate(6 * kMiB);
    std::shared_ptr<void> c = alloc->allocate(2 * kMiB);
  }
  EXPECT_EQ(alloc->stats().peak_requested, 16 * kMiB);
  auto graph = alloc->begin_capture();
  alloc->allocate(3 * kMiB).reset();  // a new 4 MiB pool segment: the policy may not touch it
  alloc->end_capture();
  std::shared_ptr<void> pinned = alloc->allocate(kMiB + kMiB / 2);  // takes the 2 MiB segment
  EXPECT_EQ(memory.allocations, 4u);
  EXPECT_EQ(alloc->reserved_bytes(), 20 * kMiB);
  // 24 MiB: nothing fits. The limit is 1.5 x (1.5 + 24) = 38.25 MiB; 20 + 24 = 44: 5.75 MiB
  // must go, and the largest whole free segment (8 MiB) is enough.
  std::shared_ptr<void> big = alloc->allocate(24 * kMiB);
  EXPECT_EQ(memory.frees, 1u);
  EXPECT_EQ(alloc->reserved_bytes(), 36 * kMiB);
  EXPECT_EQ(alloc->stats().segments, 4u);  // 6 MiB, 2 MiB (in use), the pool's, 24 MiB
  EXPECT_INVARIANTS(alloc, memory);
  big.reset();
  pinned.reset();
  // 30 MiB: the limit is 1.5 x 30 = 45 MiB, 36 + 30 = 66: 21 MiB must go, the 24 MiB
  // segment is enough; the 6 and 2 MiB ones stay cached.
  std::shared_ptr<void> again = alloc->allocate(30 * kMiB);
  EXPECT_EQ(memory.frees, 2u);
  EXPECT_EQ(alloc->reserved_bytes(), 42 * kMiB);
  EXPECT_EQ(alloc->cached_free_bytes(), 8 * kMiB);
  EXPECT_EQ(alloc->graph_pool_free_bytes(), 4 * kMiB);
  EXPECT_INVARIANTS(alloc, memory);
  // release_cached gives back every whole free segment of the general cache, no more.
  alloc->release_cached();
  EXPECT_EQ(alloc->reserved_bytes(), 34 * kMiB);
  EXPECT_INVARIANTS(alloc, memory);
}

TEST(CachingAllocator, ReleaseCachedLeavesGraphBlocksAlone) {
  CountingMemory memory;
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
  EXPECT_EQ(memory.allocations, memory.frees);
}

}  // namespace
}  // namespace attnres::cuda
