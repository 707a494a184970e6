#include "engine/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"

namespace attnres {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

size_t nbytes_of(const Shape& shape, DType dtype) {
  if (is_block_quantized(dtype)) {
    ATTNRES_CHECK(!shape.empty(), "a " + std::string(dtype_name(dtype)) + " tensor has rank >= 1");
    size_t bytes = quant_row_bytes(dtype, shape.back());
    for (size_t i = 0; i + 1 < shape.size(); ++i) bytes *= static_cast<size_t>(shape[i]);
    return bytes;
  }
  size_t bytes = dtype_size(dtype);
  for (int64_t d : shape) bytes *= static_cast<size_t>(d);
  return bytes;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  size_t bytes = t.nbytes();
  size_t alloc = (bytes + 63) / 64 * 64;
  if (alloc == 0) alloc = 64;
  void* p = std::aligned_alloc(64, alloc);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, alloc);
  t.data = p;
  t.owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                    Device device) {
  Tensor t;
  t.dtype = dtype;
  t.device = device;
  t.shape = shape;
  t.data = data;
  t.owner = std::move(owner);
  return t;
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  Tensor t = *this;
  t.shape = new_shape;
  ATTNRES_CHECK(t.numel() == numel(),
                "reshape " + shape_str(shape) + " -> " + shape_str(new_shape));
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  ATTNRES_CHECK(
      rank() >= 1 && begin >= 0 && begin <= end && end <= shape[0],
      "rows [" + std::to_string(begin) + "," + std::to_string(end) + ") of " + shape_str(shape));
  Tensor t = *this;
  size_t row_bytes = shape[0] ? nbytes() / static_cast<size_t>(shape[0]) : 0;
  t.data = static_cast<char*>(data) + static_cast<size_t>(begin) * row_bytes;
  t.shape[0] = end - begin;
  return t;
}

Tensor Tensor::row(int64_t i) const {
  Tensor t = rows(i, i + 1);
  t.shape.erase(t.shape.begin());
  return t;
}

float element_as_float(const Tensor& t, int64_t i) {
  ATTNRES_CHECK(t.device == Device::CPU && i >= 0 && i < t.numel(), "element_as_float");
  switch (t.dtype) {
    case DType::F32:
      return t.ptr<const float>()[i];
    case DType::BF16:
      return bf16_to_f32(t.ptr<const uint16_t>()[i]);
    case DType::F16:
      return f16_to_f32(t.ptr<const uint16_t>()[i]);
    case DType::I32:
      return static_cast<float>(t.ptr<const int32_t>()[i]);
    case DType::Q8_B32:
    case DType::Q6_B32:
    case DType::Q4_B32:
    case DType::Q4_K256:
    case DType::Q6_K256:
      ATTNRES_CHECK(false, "element_as_float on a block-quantized tensor");
  }
  return 0.0f;
}

void set_element_from_float(Tensor& t, int64_t i, float v) {
  ATTNRES_CHECK(t.device == Device::CPU && i >= 0 && i < t.numel(), "set_element_from_float");
  switch (t.dtype) {
    case DType::F32:
      t.ptr<float>()[i] = v;
      return;
    case DType::BF16:
      t.ptr<uint16_t>()[i] = f32_to_bf16(v);
      return;
    case DType::F16:
      t.ptr<uint16_t>()[i] = f32_to_f16(v);
      return;
    case DType::I32:
    case DType::Q8_B32:
    case DType::Q6_B32:
    case DType::Q4_B32:
    case DType::Q4_K256:
    case DType::Q6_K256:
      ATTNRES_CHECK(false, "set_element_from_float on a " + std::string(dtype_name(t.dtype)) +
                               " tensor");
  }
}

void internal_error(const char* file, int line, const std::string& what) {
  throw std::logic_error(std::string("internal error at ") + file + ":" + std::to_string(line) +
                         ": " + what);
}

}  // namespace attnres
