// What a checkpoint's config.json "quantization_config" says about how its weights are stored,
// parsed and checked once (ModelConfig::quantization). Two kinds are read:
//   {"quant_method": "attnres", "format": "int8" | "int4"}: written by `attnres quantize`;
//     every quantized matrix is a U8 [rows, row_bytes] tensor in our row layout
//     (engine/core/quant_format.h), mapped as it is.
//   {"quant_method": "compressed-tensors", ...}: what llm-compressor writes for W8A16 / W4A16
//     (engine/model/compressed_tensors.h), converted exactly into Q8_B32 / Q4_B32 at load.
// Everything else (other methods, activation quantization, fp8, other bit widths, group sizes
// that are not a multiple of 32, act-order) is refused here with an error naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/core/dtype.h"

namespace attnres {

// One compressed-tensors weight scheme (config_groups.*.weights).
struct CompressedTensorsScheme {
  std::string format;  // "pack-quantized" | "int-quantized" | "naive-quantized"
  int num_bits = 8;    // 4 (pack-quantized) or 8
  bool symmetric = true;
  int group_size = 0;  // 0: one scale per output channel ("channel" strategy)
};

struct CheckpointQuantization {
  enum class Method { Attnres, CompressedTensors };
  Method method = Method::Attnres;
  DType format = DType::Q8_B32;    // what the quantized matrices become in memory
  CompressedTensorsScheme scheme;  // Method::CompressedTensors only

  // nullopt when config.json has no quantization_config; throws attnres::Error naming
  // `origin` and the field for anything not read.
  static std::optional<CheckpointQuantization> from_json(const nlohmann::json& config,
                                                         const std::string& origin);
  // "int8 (attnres)", "int4 (compressed-tensors pack-quantized, group 128, symmetric)".
  std::string description() const;
};

}  // namespace attnres
