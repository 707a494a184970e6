#include "engine/model/named_weights.h"

#include "engine/core/error.h"

namespace attnres {
namespace {

Tensor scalar_tensor(float v) {
  Tensor t = Tensor::empty({}, DType::F32);
  *t.ptr<float>() = v;
  return t;
}

void add(std::vector<NamedTensor>& out, const std::string& name, const Tensor& t) {
  if (t.defined()) out.emplace_back(name, t);
}

// A sublayer's depth-mix tensors (model_weights.h); `prefix` "model.layers.{i}.attn",
// `null_name` its null source's name ("" for the final mix).
void add_mix(std::vector<NamedTensor>& out, const ModelConfig& cfg, const std::string& prefix,
             const std::string& null_name, const AttnResWeights& m) {
  add(out, prefix + "_res_proj.weight", m.proj);
  add(out, prefix + "_res_norm.weight", m.norm);
  if (m.bias) out.emplace_back(prefix + "_res_bias", scalar_tensor(*m.bias));
  if (m.gate_blend) {
    if (cfg.attnres_gate != AttnResGate::LearnableAlpha) {
      throw Error(prefix +
                  "_res_gate_logit: a sigmoid_scalar gate is held as its sigmoid and "
                  "cannot be written back exactly");
    }
    out.emplace_back(prefix + "_res_alpha", scalar_tensor(*m.gate_blend));
  }
  add(out, prefix + "_res_gate_proj.weight", m.gate_proj);
  add(out, prefix + "_res_gate_proj.bias", m.gate_bias);
  if (!null_name.empty()) add(out, null_name, m.null_source);
  add(out, prefix + "_pre_gate.weight", m.pre_gate);
  add(out, prefix + "_pre_gate.bias", m.pre_gate_bias);
}

}  // namespace

std::vector<NamedTensor> named_weight_matrices(const ModelConfig& cfg, const ModelWeights& w) {
  std::vector<NamedTensor> out;
  add(out, "model.embed_tokens.weight", w.embed_tokens);
  if (!cfg.tie_word_embeddings) add(out, "lm_head.weight", w.lm_head);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(out, p + "self_attn.q_proj.weight", l.q_proj);
    add(out, p + "self_attn.k_proj.weight", l.k_proj);
    add(out, p + "self_attn.v_proj.weight", l.v_proj);
    add(out, p + "self_attn.o_proj.weight", l.o_proj);
    add(out, p + "mlp.gate_proj.weight", l.gate_proj);
    add(out, p + "mlp.up_proj.weight", l.up_proj);
    add(out, p + "mlp.down_proj.weight", l.down_proj);
  }
  return out;
}

std::vector<NamedTensor> named_weight_tensors(const ModelConfig& cfg, const ModelWeights& w) {
  std::vector<NamedTensor> out = named_weight_matrices(cfg, w);
  add(out, "model.norm.weight", w.final_norm);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(out, p + "input_layernorm.weight", l.input_norm);
    add(out, p + "post_attention_layernorm.weight", l.post_attention_norm);
    add(out, p + "self_attn.q_norm.weight", l.q_norm);
    add(out, p + "self_attn.k_norm.weight", l.k_norm);
    add(out, p + "self_attn.q_proj.bias", l.q_bias);
    add(out, p + "self_attn.k_proj.bias", l.k_bias);
    add(out, p + "self_attn.v_proj.bias", l.v_bias);
    add(out, p + "self_attn.o_proj.bias", l.o_bias);
    add(out, p + "mlp.gate_proj.bias", l.gate_bias);
    add(out, p + "mlp.up_proj.bias", l.up_bias);
    add(out, p + "mlp.down_proj.bias", l.down_bias);
    if (l.attn_res) add_mix(out, cfg, p + "attn", p + "attn_null_source", *l.attn_res);
    if (l.mlp_res) add_mix(out, cfg, p + "mlp", p + "mlp_null_source", *l.mlp_res);
    if (l.v_res) {
      add(out, p + "v_res_proj.weight", l.v_res->proj);
      add(out, p + "v_res_norm.weight", l.v_res->norm);
    }
  }
  if (w.final_res) add_mix(out, cfg, "model.final", "", *w.final_res);
  return out;
}

}  // namespace attnres
