// Memory in transparent huge pages (2 MB), where the kernel gives them: a model's weights
// (HugePageArena) and the long-lived buffers the CPU backend keeps across steps
// (huge_page_tensor).
//
// Why: a CPU decode step streams every weight once (230 MB at the 100M shape). Weights on
// 4 KB heap pages land wherever the guest's free memory is fragmented, and there a model
// decoded up to 10% slower than the same model on contiguous memory; in one process, the
// models loaded first ran slowest (docs/perf-log/twin-gap.md, "in one process, the models loaded
// first run slower"). 2 MB pages are contiguous by construction and cost one TLB entry per
// 2 MB instead of 512.
//
// How: anonymous mappings, 2 MB aligned, marked MADV_HUGEPAGE, which the default THP setting
// (`madvise`) honours. Where the kernel has THP off (`never`) or no huge page is free, the
// memory is ordinary 4 KB pages: slower placement, same contents. Tensors are carved out of
// chunks of at least 64 MB; a chunk's untouched tail costs address space, not memory.
//
// The built-in models' random weights come from here. A checkpoint's weights stay in its file
// mapping, which asks for the same (SafetensorsFile::open): on a filesystem whose page cache
// takes large folios (ext4 on Linux 6.18 here), the file is then read in as 2 MB folios and
// mapped with 2 MB entries, so built-in benchmarks and served checkpoints see one placement.
#pragma once

#include <cstddef>
#include <memory>

#include "engine/core/tensor.h"

namespace attnres {

class HugePageArena {
 public:
  // A new zero-filled CPU tensor, 64-byte aligned, kept alive (with its chunk) by its owner.
  // Not thread-safe: one arena fills one model's weights on one thread.
  Tensor empty(const Shape& shape, DType dtype);

  // Whether the chunks were marked for huge pages (false where madvise refused it: a kernel
  // without THP). Whether the kernel then backs them with huge pages is its decision.
  bool advised() const { return advised_; }

  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kMinChunk = size_t{64} << 20;

 private:
  std::shared_ptr<std::byte> chunk_;  // the chunk tensors are carved from now
  size_t chunk_size_ = 0, used_ = 0;
  bool advised_ = true;
};

// A zero-filled CPU tensor in a mapping of its own, 2 MB aligned and marked for huge pages like
// the arena's chunks, unmapped with its last view: for long-lived buffers that are replaced as
// they grow (the depth bank, the Phase-1 state), which an arena could not give back.
Tensor huge_page_tensor(const Shape& shape, DType dtype);

}  // namespace attnres
