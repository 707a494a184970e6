#include "engine/model/quantized_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"

namespace attnres {
namespace {

using nlohmann::json;

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

}  // namespace

std::string quantized_tensor_metadata(DType format, const Shape& shape) {
  return json{{"format", quant_format_name(format)}, {"shape", shape}}.dump();
}

namespace {

// The f16 scales (and mins) a row of `format` stores, at their offsets in the row: each
// must be finite, and the scales >= 0.
struct StoredScales {
  size_t scales = 0, count = 0, stride = 2;  // the scales' offset, number, bytes apart
  size_t mins = 0, min_stride = 2;           // the mins' offset and bytes apart (as many)
  bool has_mins = false;
};

StoredScales stored_scales(DType format, int64_t cols) {
  const auto blocks = static_cast<size_t>(cols / kQuantBlock);
  const auto supers = static_cast<size_t>(cols / kQuantSuperBlock);
  switch (format) {
    case DType::Q4_K256: {  // d at 16 s, dmin at 16 s + 2 of the params
      const size_t params = quant_scales_offset(format, cols);
      return {params, supers, 16, params + 2, 16, true};
    }
    case DType::Q6_K256:
      return {quant_super_scales_offset(format, cols), supers, 2, 0, 2, false};
    case DType::Q4_B32:
      return {quant_scales_offset(format, cols), blocks, 2,
              quant_mins_offset(format, cols),   2,      true};
    default:
      return {quant_scales_offset(format, cols), blocks, 2, 0, 2, false};
  }
}

}  // namespace

void validate_quantized_matrix(const Tensor& q, const std::string& where) {
  ATTNRES_CHECK(q.rank() == 2 && is_block_quantized(q.dtype), "not a quantized matrix");
  const int64_t rows = q.dim(0), cols = q.dim(1);
  const size_t row_bytes = quant_row_bytes(q.dtype, cols);
  const StoredScales st = stored_scales(q.dtype, cols);
  const char* unit =
      st.count == static_cast<size_t>(cols / kQuantBlock) ? " block " : " super-block ";
  const auto* base = static_cast<const uint8_t*>(q.data);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = base + static_cast<size_t>(r) * row_bytes;
    for (size_t b = 0; b < st.count; ++b) {
      const float d = f16_at(row + st.scales + st.stride * b);
      if (!std::isfinite(d) || d < 0.0f) {
        throw Error(where + ": row " + std::to_string(r) + unit + std::to_string(b) +
                    " has scale " + std::to_string(d) + " (scales must be finite and >= 0): " +
                    "corrupt or not written in this format");
      }
      if (st.has_mins && !std::isfinite(f16_at(row + st.mins + st.min_stride * b))) {
        throw Error(where + ": row " + std::to_string(r) + unit + std::to_string(b) +
                    " has a min that is not finite: corrupt or not written in this format");
      }
    }
  }
}

Tensor read_quantized_matrix(const WeightStore& store, const std::string& name,
                             const Shape& expected, DType recipe, MatrixRole role) {
  const DType expected_format = recipe_matrix_format(recipe, role, expected[1]);
  const std::string where = store.file_of(name) + ": tensor " + name;
  const SafetensorsFile::Raw raw = store.raw(name);
  if (raw.dtype_name != "U8") {
    throw Error(where + " has dtype " + raw.dtype_name + ", expected U8 (a " +
                quant_format_name(expected_format) +
                " matrix: config.json has quantization_config " + "quant_method attnres)");
  }
  const auto& metadata = store.metadata_of(name);
  auto it = metadata.find(name);
  if (it == metadata.end()) {
    throw Error(where + ": no __metadata__ entry names its format and shape (expected " +
                quantized_tensor_metadata(expected_format, expected) + ")");
  }
  json meta;
  try {
    meta = json::parse(it->second);
  } catch (const json::exception&) {
    throw Error(where + ": __metadata__ entry '" + it->second + "' is not JSON");
  }
  if (!meta.is_object() || !meta.contains("format") || !meta.at("format").is_string() ||
      !meta.contains("shape") || !meta.at("shape").is_array()) {
    throw Error(where + ": __metadata__ entry '" + it->second +
                "' must be {\"format\": ..., \"shape\": [rows, cols]}");
  }
  const std::string fmt = meta.at("format").get<std::string>();
  const DType format = quant_tensor_format_from_name(fmt, where + ": __metadata__ format");
  const std::vector<DType> allowed = recipe_formats(recipe);
  if (std::find(allowed.begin(), allowed.end(), format) == allowed.end()) {
    std::string names;
    for (size_t i = 0; i < allowed.size(); ++i) {
      names += (i == 0                    ? ""
                : i + 1 == allowed.size() ? " and "
                                          : ", ") +
               quant_format_name(allowed[i]);
    }
    throw Error(where + " is " + fmt + ", but config.json's quantization_config format " +
                quant_format_name(recipe) + " stores " + names + " matrices only (its own " +
                "choice for this one: " + quant_format_name(expected_format) + ")");
  }
  Shape shape;
  for (const json& d : meta.at("shape")) {
    if (!d.is_number_integer()) throw Error(where + ": __metadata__ shape must be integers");
    shape.push_back(d.get<int64_t>());
  }
  if (shape != expected) {
    throw Error(where + " has logical shape " + shape_str(shape) + ", expected " +
                shape_str(expected));
  }
  if (expected[1] % quant_row_multiple(format) != 0) {
    throw Error(where + " is " + fmt + ", whose rows are multiples of " +
                std::to_string(quant_row_multiple(format)) + " weights; this one has " +
                std::to_string(expected[1]));
  }
  const size_t row_bytes = quant_row_bytes(format, expected[1]);
  const Shape storage{expected[0], static_cast<int64_t>(row_bytes)};
  if (raw.shape != storage) {
    throw Error(where + " is stored as " + shape_str(raw.shape) + ", expected " +
                shape_str(storage) + " (" + std::to_string(row_bytes) + " bytes per " + fmt +
                " row of " + std::to_string(expected[1]) + " weights)");
  }
  // const_cast: Tensor has no const view; the pages are PROT_READ, so a write faults loudly.
  Tensor q = Tensor::wrap(const_cast<std::byte*>(raw.data), expected, format, raw.owner);
  validate_quantized_matrix(q, where);
  return q;
}

}  // namespace attnres
