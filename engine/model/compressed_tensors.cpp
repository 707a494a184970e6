#include "engine/model/compressed_tensors.h"

#include <cmath>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"

namespace attnres {
namespace {

int32_t i32_at(const std::byte* p, size_t i) {
  int32_t v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

// A float as f16 bits when it is one exactly; throws naming `where` otherwise.
uint16_t exact_f16(float v, const std::string& where, const char* what) {
  const uint16_t h = f32_to_f16(v);
  if (!(f16_to_f32(h) == v) || !std::isfinite(v)) {
    throw Error(where + ": " + what + " " + std::to_string(v) +
                " is not exactly an f16 value, so it has no exact form in our blocks (quantize "
                "the float model with --quantization instead)");
  }
  return h;
}

void store_f16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

// The scales, as [N, groups] floats, checked against the scheme.
std::vector<float> read_scales(const WeightStore& store, const std::string& name, int64_t rows,
                               int64_t groups) {
  const std::string where = store.file_of(name) + ": tensor " + name;
  const SafetensorsFile::Entry& e = store.entry(name);
  if (!e.supported || e.dtype == DType::I32)
    throw Error(where + " has dtype " + e.dtype_name + ", expected F32, BF16 or F16 scales");
  const bool ok = e.shape == Shape{rows, groups} || (groups == 1 && e.shape == Shape{rows});
  if (!ok) {
    throw Error(where + " has shape " + shape_str(e.shape) + ", expected " +
                shape_str({rows, groups}) + " for this scheme and the config's shape");
  }
  const Tensor t = store.get(name);
  std::vector<float> out(static_cast<size_t>(rows * groups));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = element_as_float(t, static_cast<int64_t>(i));
    if (!std::isfinite(out[i]) || out[i] < 0.0f) {
      throw Error(where + ": scale " + std::to_string(out[i]) + " at row " +
                  std::to_string(i / groups) + " is not finite and >= 0");
    }
  }
  return out;
}

// Zero points [N, groups] (signed), from the packed I32 form or an I8 one.
std::vector<int> read_zero_points(const WeightStore& store, const std::string& name, int64_t rows,
                                  int64_t groups) {
  const std::string where = store.file_of(name) + ": tensor " + name;
  const SafetensorsFile::Raw raw = store.raw(name);
  std::vector<int> z(static_cast<size_t>(rows * groups));
  const int64_t packed_rows = (rows + 7) / 8;
  if (raw.dtype_name == "I32" && raw.shape == Shape{packed_rows, groups}) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const auto word = static_cast<uint32_t>(i32_at(raw.data, (r / 8) * groups + g));
        z[r * groups + g] = static_cast<int>((word >> (4 * (r % 8))) & 0xf) - 8;
      }
    return z;
  }
  if (raw.dtype_name == "I8" && raw.shape == Shape{rows, groups}) {
    for (size_t i = 0; i < z.size(); ++i) {
      z[i] = static_cast<int>(reinterpret_cast<const int8_t*>(raw.data)[i]);
      if (z[i] < -8 || z[i] > 7)
        throw Error(where + ": zero point " + std::to_string(z[i]) + " is outside [-8, 7]");
    }
    return z;
  }
  throw Error(where + " is " + raw.dtype_name + " " + shape_str(raw.shape) + ", expected I32 " +
              shape_str({packed_rows, groups}) + " (packed along rows) or I8 " +
              shape_str({rows, groups}));
}

void check_shape_tensor(const WeightStore& store, const std::string& name, const Shape& expected) {
  const std::string where = store.file_of(name) + ": tensor " + name;
  const SafetensorsFile::Raw raw = store.raw(name);
  int64_t dims[2] = {0, 0};
  if (raw.shape != Shape{2} || (raw.dtype_name != "I32" && raw.dtype_name != "I64"))
    throw Error(where + " is " + raw.dtype_name + " " + shape_str(raw.shape) +
                ", expected I32 or I64 [2]");
  for (int i = 0; i < 2; ++i) {
    if (raw.dtype_name == "I32") {
      dims[i] = i32_at(raw.data, i);
    } else {
      std::memcpy(&dims[i], raw.data + 8 * i, 8);
    }
  }
  if (Shape{dims[0], dims[1]} != expected)
    throw Error(where + " says the weight is " + shape_str({dims[0], dims[1]}) + ", expected " +
                shape_str(expected));
}

}  // namespace

bool has_compressed_tensors_matrix(const WeightStore& store, const std::string& prefix,
                                   const CompressedTensorsScheme& scheme) {
  if (!store.has(prefix + ".weight_scale")) return false;
  if (scheme.num_bits == 4) return store.has(prefix + ".weight_packed");
  return store.has(prefix + ".weight") && store.entry(prefix + ".weight").dtype_name == "I8";
}

Tensor convert_compressed_tensors_matrix(const WeightStore& store, const std::string& prefix,
                                         const Shape& expected,
                                         const CompressedTensorsScheme& scheme,
                                         std::vector<std::string>& used) {
  const int64_t rows = expected[0], cols = expected[1];
  if (store.has(prefix + ".weight_g_idx")) {
    throw Error(store.file_of(prefix + ".weight_g_idx") + ": tensor " + prefix +
                ".weight_g_idx: activation-ordered groups (g_idx) are not read");
  }
  if (cols % kQuantBlock != 0) {
    throw Error(store.source() + ": " + prefix + " has " + std::to_string(cols) +
                " columns, not a multiple of " + std::to_string(kQuantBlock));
  }
  const int64_t group = scheme.group_size ? scheme.group_size : cols;
  if (cols % group != 0) {
    throw Error(store.source() + ": " + prefix + " has " + std::to_string(cols) +
                " columns, not a multiple of group_size " + std::to_string(group));
  }
  const int64_t groups = cols / group;
  const std::string scale_name = prefix + ".weight_scale";
  const std::vector<float> scales = read_scales(store, scale_name, rows, groups);
  used.push_back(scale_name);

  const DType format = scheme.num_bits == 4 ? DType::Q4_B32 : DType::Q8_B32;
  Tensor out = Tensor::empty(expected, format);
  const size_t row_bytes = quant_row_bytes(format, cols);
  const size_t scales_at = quant_scales_offset(format, cols);
  const int64_t blocks = cols / kQuantBlock;

  if (scheme.num_bits == 8) {
    const std::string name = prefix + ".weight";
    const std::string where = store.file_of(name) + ": tensor " + name;
    const SafetensorsFile::Raw raw = store.raw(name);
    if (raw.dtype_name != "I8" || raw.shape != expected)
      throw Error(where + " is " + raw.dtype_name + " " + shape_str(raw.shape) + ", expected I8 " +
                  shape_str(expected));
    used.push_back(name);
    if (store.has(prefix + ".weight_zero_point")) {
      // Symmetric schemes may still carry all-zero points.
      for (int z : read_zero_points(store, prefix + ".weight_zero_point", rows, groups))
        if (z != 0) throw Error(where + ": a non-zero zero point under a symmetric scheme");
      used.push_back(prefix + ".weight_zero_point");
    }
    const auto* q = reinterpret_cast<const int8_t*>(raw.data);
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = out.ptr<uint8_t>() + r * row_bytes;
      for (int64_t k = 0; k < cols; ++k) {
        const int8_t v = q[r * cols + k];
        if (v == -128) {
          throw Error(where + ": row " + std::to_string(r) + " column " + std::to_string(k) +
                      " holds -128, outside our int8 range [-127, 127], so this checkpoint has "
                      "no exact int8 form (quantize the float model with --quantization int8)");
        }
        row[k] = static_cast<uint8_t>(v);
      }
      for (int64_t b = 0; b < blocks; ++b) {
        const float s = scales[r * groups + b * kQuantBlock / group];
        store_f16(row + scales_at + 2 * b,
                  exact_f16(s, store.file_of(scale_name) + ": tensor " + scale_name, "scale"));
      }
    }
    return out;
  }

  const std::string name = prefix + ".weight_packed";
  const std::string where = store.file_of(name) + ": tensor " + name;
  const SafetensorsFile::Raw raw = store.raw(name);
  if (raw.dtype_name != "I32" || raw.shape != Shape{rows, cols / 8})
    throw Error(where + " is " + raw.dtype_name + " " + shape_str(raw.shape) + ", expected I32 " +
                shape_str({rows, cols / 8}) + " (eight 4-bit values per int32)");
  used.push_back(name);
  if (store.has(prefix + ".weight_shape")) {
    check_shape_tensor(store, prefix + ".weight_shape", expected);
    used.push_back(prefix + ".weight_shape");
  }
  std::vector<int> zero(static_cast<size_t>(rows * groups), 0);
  const std::string zp_name = prefix + ".weight_zero_point";
  if (store.has(zp_name)) {
    zero = read_zero_points(store, zp_name, rows, groups);
    used.push_back(zp_name);
    if (scheme.symmetric)
      for (int z : zero)
        if (z != 0) throw Error(where + ": a non-zero zero point under a symmetric scheme");
  } else if (!scheme.symmetric) {
    throw Error(store.source() + ": tensor " + zp_name + " is missing (the scheme is asymmetric)");
  }
  const std::string scale_where = store.file_of(scale_name) + ": tensor " + scale_name;
  const size_t mins_at = quant_mins_offset(format, cols);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = out.ptr<uint8_t>() + r * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t u[kQuantBlock];
      for (int j = 0; j < kQuantBlock; ++j) {
        const int64_t k = b * kQuantBlock + j;
        const auto word = static_cast<uint32_t>(i32_at(raw.data, r * (cols / 8) + k / 8));
        u[j] = static_cast<uint8_t>((word >> (4 * (k % 8))) & 0xf);  // q + 8
      }
      for (int j = 0; j < kQuantBlock / 2; ++j)
        row[b * (kQuantBlock / 2) + j] = static_cast<uint8_t>(u[j] | (u[j + 16] << 4));
      const int64_t g = r * groups + b * kQuantBlock / group;
      const float s = scales[g];
      // w = s (q - z) = s (q + 8) - s (8 + z): the f32 product is exact (an f16 times an
      // integer below 16), so m is exact iff it is an f16 value.
      const float m = -(s * static_cast<float>(8 + zero[g]));
      store_f16(row + scales_at + 2 * b, exact_f16(s, scale_where, "scale"));
      store_f16(row + mins_at + 2 * b,
                exact_f16(m, scale_where, "min (-scale x (8 + zero point))"));
    }
  }
  return out;
}

}  // namespace attnres
