// One .safetensors file, memory-mapped read-only and validated on open.
//
// Format: 8-byte little-endian u64 header size N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data buffer; offsets are relative to the buffer's start. open() checks the whole
// header (types, dtype names, size = shape x element size, offsets inside the file, no
// overlaps) so that get() can hand out zero-copy views without further checks. Tensors whose
// dtype the engine cannot compute with (F64, I64, F8_E4M3, ...) are listed by entries() but
// get() refuses them; that way a checkpoint with a stray integer buffer still opens. raw()
// hands out any tensor's bytes (quantized checkpoints store U8, I8 and I32 tensors).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "engine/core/tensor.h"

namespace attnres {

class SafetensorsFile {
 public:
  struct Entry {
    DType dtype = DType::F32;  // meaningful only when supported
    Shape shape;
    size_t offset = 0;  // from the start of the data buffer
    size_t nbytes = 0;
    std::string dtype_name;  // as written in the header ("BF16", "F8_E4M3")
    bool supported = false;  // F32, BF16, F16 or I32
  };

  // Maps and validates the file; throws attnres::Error naming the file and what is wrong.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // Zero-copy view into the mapping, dtype as stored; the Tensor keeps the mapping alive.
  // (A tensor misaligned for its dtype, from a writer that did not pad the header, is
  // copied to aligned memory instead.)
  Tensor get(const std::string& name) const;
  // The stored bytes of any tensor whatever its dtype (the U8 / I8 / I32 tensors of quantized
  // checkpoints included), zero-copy; `owner` keeps the mapping alive. Checked like every
  // entry at open(): inside the file, size = shape x element size.
  struct Raw {
    const std::byte* data = nullptr;
    size_t nbytes = 0;
    Shape shape;
    std::string dtype_name;
    std::shared_ptr<void> owner;
  };
  Raw raw(const std::string& name) const;
  // Reads a one-element float tensor of any float dtype (F64, F32, BF16, F16) as a float.
  float read_scalar(const std::string& name) const;
  const std::string& path() const { return path_; }
  // The mapped bytes (for tests and diagnostics).
  const std::byte* mapping_begin() const;
  size_t mapping_size() const;

 private:
  SafetensorsFile() = default;
  const Entry& entry_or_throw(const std::string& name) const;
  const std::byte* data_of(const Entry& entry) const;

  std::string path_;
  std::shared_ptr<void> mapping_;  // owns the mmap (munmap on last release)
  const std::byte* base_ = nullptr;
  size_t file_size_ = 0;
  size_t data_start_ = 0;  // 8 + N
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace attnres
