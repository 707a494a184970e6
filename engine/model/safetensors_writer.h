// Writes one .safetensors file (the format safetensors.h reads): tensors laid out back to back
// (the format allows no holes), wider element types first so that every tensor stays aligned
// to its element size, after a header padded with spaces to a multiple of 64 bytes.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace attnres {

class SafetensorsWriter {
 public:
  // `data` (nbytes of it) must stay valid until write(); dtype as the header names it
  // ("BF16", "U8", ...), its size checked against shape.
  void add(const std::string& name, const std::string& dtype_name, const Shape& shape,
           const void* data, size_t nbytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Throws attnres::Error naming the path when it cannot be written.
  void write(const std::string& path) const;

 private:
  struct Item {
    std::string name, dtype_name;
    Shape shape;
    const void* data;
    size_t nbytes, element_bytes;
  };
  std::vector<Item> items_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace attnres
