// ModelWeights' tensors under their checkpoint names (the Hugging Face layout of
// model_weights.h), for writing a model back out (`attnres quantize`).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace attnres {

using NamedTensor = std::pair<std::string, Tensor>;

// The weight matrices --quantization quantizes (projections, embedding, LM head), named; a
// tied LM head is not listed (it is the embedding).
std::vector<NamedTensor> named_weight_matrices(const ModelConfig& cfg, const ModelWeights& w);

// Every tensor ModelWeights::load would read back into `w`: the matrices above, norms,
// biases and the AttnRes depth-mix weights, scalars (recency biases, alphas) as 0-dim F32.
// Throws for what cannot be written back exactly (a sigmoid_scalar gate, kept as its sigmoid).
std::vector<NamedTensor> named_weight_tensors(const ModelConfig& cfg, const ModelWeights& w);

}  // namespace attnres
