// cpu::thread_scratch (kernels/cpu/thread_scratch.h): cache-line aligned, kept across calls,
// one buffer per slot and per thread.
#include "kernels/cpu/thread_scratch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

namespace attnres::cpu {
namespace {

bool line_aligned(const float* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(ThreadScratch, IsCacheLineAlignedAtEverySize) {
  for (size_t floats : {size_t{0}, size_t{1}, size_t{3}, size_t{17}, size_t{1000}, size_t{123457}}) {
    float* p = thread_scratch(ScratchSlot::GemmPanel, floats);
    EXPECT_TRUE(line_aligned(p)) << floats;
    for (size_t i = 0; i < floats; ++i) p[i] = 1.0f;  // the whole request is writable
  }
}

TEST(ThreadScratch, KeepsItsBufferUntilAskedForMore) {
  float* first = thread_scratch(ScratchSlot::GemmPartials, 4096);
  first[4095] = 42.0f;
  EXPECT_EQ(thread_scratch(ScratchSlot::GemmPartials, 4096), first);
  EXPECT_EQ(thread_scratch(ScratchSlot::GemmPartials, 10), first);  // smaller: same buffer
  EXPECT_EQ(first[4095], 42.0f);
  float* grown = thread_scratch(ScratchSlot::GemmPartials, 1 << 20);
  EXPECT_TRUE(line_aligned(grown));
  grown[(1 << 20) - 1] = 1.0f;
}

TEST(ThreadScratch, SlotsAndThreadsDoNotShare) {
  float* panel = thread_scratch(ScratchSlot::GemmPanel, 256);
  float* partials = thread_scratch(ScratchSlot::GemmPartials, 256);
  float* logits = thread_scratch(ScratchSlot::DepthLogits, 256);
  EXPECT_NE(panel, partials);
  EXPECT_NE(panel, logits);
  EXPECT_NE(partials, logits);
  float* other = nullptr;
  std::thread([&] { other = thread_scratch(ScratchSlot::GemmPanel, 256); }).join();
  EXPECT_NE(other, panel);
}

}  // namespace
}  // namespace attnres::cpu
