// Weight-only quantized matrices of the compressed-tensors format (what llm-compressor writes
// for vLLM), converted exactly into our Q8_B32 / Q4_B32 rows at load.
//
// Followed: compressed-tensors' own compressors as of its 0.10 series
// (compressors/quantized_compressors/pack_quantized.py and naive_quantized.py):
//   pack-quantized (W4A16), for the Linear weight PREFIX.weight:
//     PREFIX.weight_packed      I32 [N, K / 8]  eight 4-bit values per int32, value k of a row
//                               in bits [4 (k % 8), 4 (k % 8) + 4) of word k / 8, each stored
//                               as q + 8 for the signed q in [-8, 7]
//     PREFIX.weight_scale       float [N, K / group] (group strategy) or [N, 1] (channel)
//     PREFIX.weight_shape       I32 / I64 [2] = [N, K]
//     PREFIX.weight_zero_point  asymmetric only: I32 [ceil(N / 8), K / group], packed the same
//                               way along the rows (or, from older writers, I8 [N, K / group])
//   int-quantized / naive-quantized (W8A16):
//     PREFIX.weight             I8 [N, K], q in [-128, 127]
//     PREFIX.weight_scale       float [N, K / group] or [N, 1]
//   w = scale * (q - zero_point).
// Into ours: int4 -> Q4_B32 with d = scale, m = -scale (8 + zero_point), stored q + 8;
// int8 (symmetric) -> Q8_B32 with d = scale. Exact when every scale (and min) is an f16
// value and no int8 q is -128 (ours holds [-127, 127]); anything else is refused, naming the
// tensor, as are act-order groups (PREFIX.weight_g_idx).
#pragma once

#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/model/checkpoint_quantization.h"
#include "engine/model/weight_store.h"

namespace attnres {

// Whether the store holds PREFIX (a Linear's name, without ".weight") in the scheme's
// compressed form.
bool has_compressed_tensors_matrix(const WeightStore& store, const std::string& prefix,
                                   const CompressedTensorsScheme& scheme);

// The matrix PREFIX of logical shape `expected` [N, K] converted into a new host Q8_B32 /
// Q4_B32 tensor; `used` gets the tensor names it read. Throws attnres::Error naming the
// tensor when the stored form disagrees with the scheme or the config, or is not exact in ours.
Tensor convert_compressed_tensors_matrix(const WeightStore& store, const std::string& prefix,
                                         const Shape& expected,
                                         const CompressedTensorsScheme& scheme,
                                         std::vector<std::string>& used);

}  // namespace attnres
