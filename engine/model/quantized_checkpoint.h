// `attnres quantize`: a loaded model whose matrices are quantized (--quantization, or a
// compressed-tensors checkpoint converted at load) written out as a checkpoint that loads
// without re-quantizing: model.safetensors with each quantized matrix as a U8 tensor of our
// rows (quantized_tensors.h), every other tensor as the source stored it, config.json with
// "quantization_config": {"quant_method": "attnres", "format": "int8" | "int4"}, and the
// tokenizer and generation files copied.
#pragma once

#include <string>

#include "engine/model/loaded_model.h"

namespace attnres {

// Throws attnres::Error when the model has no quantized matrix, or `out_dir` is the source
// directory, or a file cannot be written.
void write_quantized_checkpoint(const LoadedModel& model, const std::string& out_dir);

}  // namespace attnres
