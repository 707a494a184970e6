// The model's weights as named views into the mapped checkpoint, checked against the config:
// every expected tensor present with the expected shape, one float dtype for all of them,
// and no tensor left over (a leftover means the config and the checkpoint disagree, and
// computing without it would silently give a different model).
//
// Tensor names (Hugging Face layout; AttnRes names per docs/ATTNRES.md §2a/2b):
//   model.embed_tokens.weight [V,d]   model.norm.weight [d]   lm_head.weight [V,d] (untied)
//   model.layers.{i}.input_layernorm.weight [d]  .post_attention_layernorm.weight [d]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ .bias)  .self_attn.{q,k}_norm.weight [hd]
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight (+ .bias)
//   model.layers.{i}.{attn,mlp}_res_proj.weight [1,d]  .{attn,mlp}_res_norm.weight [d]
//   model.layers.{i}.{attn,mlp}_res_bias []            (any attnres_gate_type; read by
//                                                       block / full, ignored elsewhere)
//   model.final_res_proj.weight [1,d]  model.final_res_norm.weight [d]  model.final_res_bias []
// docs/ATTNRES.md §2d, per sublayer prefix {attn,mlp}:
//   {p}_res_gate_logit []  (sigmoid_scalar)   {p}_res_alpha []  (learnable_alpha)
//   {p}_res_gate_proj.weight [d,d] .bias [d]  (sigmoid_vector)
//   {p}_null_source [d]  (attnres_use_null_source; read by the delta modes only)
//   {p}_pre_gate.weight [d,d] .bias [d]       (pre_gated)
//   model.layers.{i}.v_res_proj.weight [1,d]  .v_res_norm.weight [d]  (delta_v)
// Quantized checkpoints (ModelConfig::quantization) store the matrices differently
// (quantized_tensors.h, compressed_tensors.h); they load as Q8_B32 / Q4_B32 tensors.
// A tensor the mode creates but never reads (a null source outside the delta modes, gate
// weights under first_layer / pre_gated, the bias of a delta mix) is accepted and ignored.
#pragma once

#include <optional>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_store.h"

namespace attnres {

// One depth-attention query: logit_j = proj . RMSNorm_norm(src_j) (+ bias on the last source),
// and what the sublayer's mode and gate add around it (docs/ATTNRES.md §2d). Only what the mode
// reads is set.
struct AttnResWeights {
  Tensor proj;                // [1, d]
  Tensor norm;                // [d]
  std::optional<float> bias;  // block / full mixes, when the checkpoint has *_res_bias
  // sigmoid_scalar: sigmoid(*_res_gate_logit); learnable_alpha: *_res_alpha. The blend
  // h = x + blend (h_mix - x), computed once here.
  std::optional<float> gate_blend;
  Tensor gate_proj, gate_bias;     // sigmoid_vector: [d, d], [d]
  Tensor null_source;              // delta modes with attnres_use_null_source: [d]
  Tensor pre_gate, pre_gate_bias;  // pre_gated: [d, d], [d]
};

struct LayerWeights {
  Tensor input_norm, q_proj, k_proj, v_proj, o_proj;
  Tensor q_norm, k_norm;                  // [head_dim]; undefined unless cfg.qk_norm
  Tensor q_bias, k_bias, v_bias, o_bias;  // undefined when the config has none
  Tensor post_attention_norm, gate_proj, up_proj, down_proj;
  Tensor gate_bias, up_bias, down_bias;             // undefined unless cfg.mlp_bias
  std::optional<AttnResWeights> attn_res, mlp_res;  // qwen3_attnres only
  // delta_v: the V stream's own query (proj, norm); null source and gate are attn_res's.
  std::optional<AttnResWeights> v_res;
};

struct ModelWeights {
  Tensor embed_tokens, final_norm;
  Tensor lm_head;  // the same view as embed_tokens when tied
  std::vector<LayerWeights> layers;
  // Present => variant 2b (block sums with reset and a final mix); absent on 2a and 2c.
  std::optional<AttnResWeights> final_res;
  // The one float dtype every weight left in float shares (gains, biases, depth-mix weights,
  // and the matrices that are not quantized).
  DType dtype = DType::BF16;
  // The block-quantized format (engine/core/quant_format.h) of the matrices that are
  // quantized: projections, embedding and LM head, each tensor's own dtype saying whether it
  // is (a compressed-tensors checkpoint usually keeps its LM head in float). Unset: none.
  std::optional<DType> quant_format;

  // Validates names, shapes and dtypes against cfg and throws attnres::Error on the first
  // defect (naming the file, the tensor, what was found and what was expected).
  static ModelWeights load(const ModelConfig& cfg, const WeightStore& store);

  // The bytes of every distinct tensor (a tied LM head counted once): what uploading the
  // weights to a device takes.
  size_t total_bytes() const;
};

}  // namespace attnres
