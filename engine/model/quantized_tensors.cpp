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

void validate_quantized_matrix(const Tensor& q, const std::string& where) {
  ATTNRES_CHECK(q.rank() == 2 && is_block_quantized(q.dtype), "not a quantized matrix");
  const int64_t rows = q.dim(0), cols = q.dim(1), blocks = cols / kQuantBlock;
  const size_t row_bytes = quant_row_bytes(q.dtype, cols);
  const size_t scales = quant_scales_offset(q.dtype, cols);
  const bool has_mins = q.dtype == DType::Q4_B32;
  const size_t mins = has_mins ? quant_mins_offset(q.dtype, cols) : 0;
  const auto* base = static_cast<const uint8_t*>(q.data);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = base + static_cast<size_t>(r) * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const float d = f16_at(row + scales + 2 * b);
      if (!std::isfinite(d) || d < 0.0f) {
        throw Error(where + ": row " + std::to_string(r) + " block " + std::to_string(b) +
                    " has scale " + std::to_string(d) + " (scales must be finite and >= 0): " +
                    "corrupt or not written in this format");
      }
      if (has_mins && !std::isfinite(f16_at(row + mins + 2 * b))) {
        throw Error(where + ": row " + std::to_string(r) + " block " + std::to_string(b) +
                    " has a min that is not finite: corrupt or not written in this format");
      }
    }
  }
}

Tensor read_quantized_matrix(const WeightStore& store, const std::string& name,
                             const Shape& expected, DType recipe, MatrixRole role) {
  const DType expected_format = recipe_matrix_format(recipe, role);
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
    for (const DType f : allowed) names += (names.empty() ? "" : " and ") + quant_format_name(f);
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
