// A dense, contiguous, row-major tensor: a typed view of memory plus a shared owner that
// keeps the memory alive (a heap buffer, a memory-mapped checkpoint, a device buffer).
// Views (reshape, row slices) share the owner, so a weight that points into an mmap'd
// safetensors file stays valid as long as any view of it exists.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/dtype.h"

namespace attnres {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
// The bytes of a dense tensor of this shape and dtype.
size_t nbytes_of(const Shape& shape, DType dtype);

struct Tensor;
// Element i of a host float tensor (F32, BF16 or F16), widened to f32. For loading-time
// work (folding gains, reading 0-dim biases), not for hot loops.
float element_as_float(const Tensor& t, int64_t i);
// Stores v into element i of a host float tensor, rounded to its dtype (bf16: to nearest even).
void set_element_from_float(Tensor& t, int64_t i, float v);

struct Tensor {
  DType dtype = DType::F32;
  Device device = Device::CPU;
  Shape shape;
  void* data = nullptr;
  std::shared_ptr<void> owner;

  // A new zero-filled CPU tensor, 64-byte aligned.
  static Tensor empty(const Shape& shape, DType dtype);
  // A view of memory someone else owns (owner keeps it alive; may be null for borrowed data).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                     Device device = Device::CPU);

  bool defined() const { return data != nullptr; }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  int64_t numel() const;
  size_t nbytes() const { return nbytes_of(shape, dtype); }

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  // Same memory, new shape with the same element count.
  Tensor reshape(const Shape& new_shape) const;
  // Rows [begin, end) along dimension 0.
  Tensor rows(int64_t begin, int64_t end) const;
  // Row i along dimension 0, with that dimension dropped.
  Tensor row(int64_t i) const;
};

}  // namespace attnres
