// Stand-ins for device memory behind the caching allocator (kernels/cuda/cuda_allocator.h),
// and a check of its invariants against them, for host tests that need no GPU.
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "kernels/cuda/cuda_allocator.h"

namespace attnres::cuda::testing {

// Raw memory that counts its calls and what is live. Real host memory (tests may write it),
// or with `fake_addresses` only address ranges (never touched), for workloads of gigabytes.
// `capacity` bytes at most live at once: beyond it allocate returns null (out of memory).
struct CountingMemory {
  explicit CountingMemory(bool fake_addresses = false) : fake(fake_addresses) {}
  bool fake;
  size_t capacity = ~size_t{0};
  std::map<void*, size_t> live;  // pointer -> bytes
  size_t live_bytes = 0, allocations = 0, frees = 0, refusals = 0;
  uintptr_t next_fake = uintptr_t{1} << 40;

  CachingAllocator::RawMemory raw() {
    return {[this](size_t bytes) -> void* {
              if (live_bytes + bytes > capacity) {
                ++refusals;
                return nullptr;
              }
              void* p = nullptr;
              if (fake) {
                p = reinterpret_cast<void*>(next_fake);
                next_fake += bytes + 4096;  // a gap: segments are never contiguous
              } else {
                p = std::malloc(bytes);
              }
              live[p] = bytes;
              live_bytes += bytes;
              ++allocations;
              return p;
            },
            [this](void* p) {
              live_bytes -= live.at(p);
              live.erase(p);
              ++frees;
              if (!fake) std::free(p);
            }};
  }
};

inline std::string mib(size_t bytes) { return std::to_string(double(bytes) / (1 << 20)) + " MiB"; }

// Every invariant of cuda_allocator.h's header comment, against the raw memory's own books.
// Empty when all hold, else what is broken.
inline std::string check_invariants(const CachingAllocator& alloc, const CountingMemory& memory) {
  const CachingAllocator::Stats s = alloc.stats();
  const std::vector<CachingAllocator::BlockInfo> blocks = alloc.blocks();
  size_t in_use = 0, cached = 0, pooled = 0, segments = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    const bool first = i == 0 || blocks[i - 1].segment != b.segment;
    if (b.size == 0 || b.size % CachingAllocator::kGranule != 0)
      return "a block of " + std::to_string(b.size) + " bytes";
    if (first) {
      ++segments;
      auto raw = memory.live.find(const_cast<void*>(b.ptr));
      if (raw == memory.live.end()) return "a segment that is not a live raw allocation";
      size_t total = 0;
      for (size_t j = i; j < blocks.size() && blocks[j].segment == b.segment; ++j)
        total += blocks[j].size;
      if (total != raw->second)
        return "a segment's blocks add up to " + std::to_string(total) + " of " +
               std::to_string(raw->second) + " bytes";
    } else {
      const auto& prev = blocks[i - 1];
      if (static_cast<const char*>(prev.ptr) + prev.size != b.ptr)
        return "a gap or overlap between neighbouring blocks";
      if (!prev.in_use && !b.in_use && prev.free_list == b.free_list)
        return "two neighbouring free blocks in the same list, not merged";
    }
    if (b.in_use) {
      in_use += b.size;
    } else if (b.free_list == nullptr) {
      return "a free block in no list";
    } else {
      (b.in_graph_pool ? pooled : cached) += b.size;
    }
  }
  if (in_use != s.in_use)
    return "in_use " + std::to_string(s.in_use) + " != " + std::to_string(in_use);
  if (cached != s.cached)
    return "cached " + std::to_string(s.cached) + " != " + std::to_string(cached);
  if (pooled != s.graph_pool_free)
    return "graph_pool_free " + std::to_string(s.graph_pool_free) + " != " + std::to_string(pooled);
  if (s.reserved != in_use + cached + pooled) return "reserved != in_use + cached + pooled";
  if (s.reserved != memory.live_bytes)
    return "reserved " + std::to_string(s.reserved) + " != raw live " +
           std::to_string(memory.live_bytes);
  if (segments != s.segments || segments != memory.live.size()) return "segment count differs";
  if (s.raw_allocations != memory.allocations || s.raw_frees != memory.frees)
    return "raw call counts differ";
  if (s.requested > s.in_use) return "requested > in_use";
  return "";
}

}  // namespace attnres::cuda::testing
