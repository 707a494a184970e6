#include "engine/core/huge_page_arena.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

namespace attnres {
namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// An anonymous mapping of `size` bytes (a multiple of 2 MB) starting on a 2 MB boundary and
// marked MADV_HUGEPAGE (`advised`: whether the kernel took the mark). mmap guarantees only
// 4 KB alignment, so map 2 MB more and unmap the unaligned head and the tail. Fresh anonymous
// pages read as zero: no memset, which would also fault the whole mapping in.
std::shared_ptr<std::byte> map_huge(size_t size, bool& advised) {
  const size_t padded = size + HugePageArena::kHugePage;
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(start, HugePageArena::kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  const size_t tail = start + padded - (aligned + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  auto* base = reinterpret_cast<std::byte*>(aligned);
  advised = madvise(base, size, MADV_HUGEPAGE) == 0;
  return std::shared_ptr<std::byte>(base, [size](std::byte* p) { munmap(p, size); });
}

Tensor shaped(const Shape& shape, DType dtype) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

}  // namespace

Tensor HugePageArena::empty(const Shape& shape, DType dtype) {
  Tensor t = shaped(shape, dtype);
  const size_t bytes = round_up(t.nbytes() > 0 ? t.nbytes() : 1, 64);
  if (!chunk_ || used_ + bytes > chunk_size_) {
    chunk_size_ = round_up(bytes > kMinChunk ? bytes : kMinChunk, kHugePage);
    bool advised = false;
    chunk_ = map_huge(chunk_size_, advised);
    advised_ = advised_ && advised;
    used_ = 0;
  }
  t.data = chunk_.get() + used_;
  t.owner = std::shared_ptr<void>(chunk_, t.data);  // shares the chunk's lifetime
  used_ += bytes;
  return t;
}

Tensor huge_page_tensor(const Shape& shape, DType dtype) {
  Tensor t = shaped(shape, dtype);
  bool advised = false;
  std::shared_ptr<std::byte> mapping =
      map_huge(round_up(t.nbytes() > 0 ? t.nbytes() : 1, HugePageArena::kHugePage), advised);
  t.data = mapping.get();
  t.owner = std::move(mapping);
  return t;
}

}  // namespace attnres
