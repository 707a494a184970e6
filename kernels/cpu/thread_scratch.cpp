#include "kernels/cpu/thread_scratch.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>

namespace attnres::cpu {
namespace {

constexpr size_t kAlign = 64;  // a cache line, and one AVX-512 vector

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

struct Buffer {
  std::unique_ptr<float, FreeDeleter> data;
  size_t floats = 0;
};

}  // namespace

float* thread_scratch(ScratchSlot slot, size_t floats) {
  thread_local Buffer buffers[static_cast<size_t>(ScratchSlot::kCount)];
  Buffer& b = buffers[static_cast<size_t>(slot)];
  if (!b.data || floats > b.floats) {
    const size_t bytes = (std::max<size_t>(floats, 1) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    float* p = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
    if (!p) throw std::bad_alloc();
    b.data.reset(p);
    b.floats = bytes / sizeof(float);
  }
  return b.data.get();
}

}  // namespace attnres::cpu
