// Quantized matrices in checkpoints written by `attnres quantize` (quantization_config
// {"quant_method": "attnres"}): each one a U8 tensor [rows, row_bytes] under the weight's own
// name holding the rows of engine/core/quant_format.h, described in the file's __metadata__
// under the same name as {"format": "int8" | "int6" | "int4", "shape": [rows, cols]}. Loading maps
// the bytes as they are (no copy, no re-quantization) after checking them.
#pragma once

#include <string>

#include "engine/core/quant_format.h"
#include "engine/core/tensor.h"
#include "engine/model/weight_store.h"

namespace attnres {

// The __metadata__ value describing a quantized matrix of `format` and logical shape.
std::string quantized_tensor_metadata(DType format, const Shape& shape);

// Throws attnres::Error naming `where` unless every scale of the host block-quantized matrix
// `q` is finite and >= 0 and (Q4_B32) every min is finite.
void validate_quantized_matrix(const Tensor& q, const std::string& where);

// The quantized matrix `name`, checked: U8 storage, metadata naming its format and the logical
// shape `expected` (the config's), row bytes equal to quant_row_bytes, scales valid. The
// metadata's format is the tensor's own: any format of the recipe (config.json's
// quantization_config.format; recipe_formats) is read, so a checkpoint converted from
// compressed-tensors (every projection int4) loads as well as one `attnres quantize` wrote
// from floats (recipe_matrix_format per matrix). `role` only names the recipe's own choice in
// errors.
Tensor read_quantized_matrix(const WeightStore& store, const std::string& name,
                             const Shape& expected, DType recipe, MatrixRole role);

}  // namespace attnres
