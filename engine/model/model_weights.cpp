#include "engine/model/model_weights.h"

#include <cmath>
#include <set>
#include <string>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "engine/model/compressed_tensors.h"
#include "engine/model/quantized_tensors.h"

namespace attnres {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Takes tensors out of the store one by one, checking each against what the config implies,
// and remembers which names were used so leftovers can be reported at the end.
class WeightChecker {
 public:
  WeightChecker(const ModelConfig& cfg, const WeightStore& store) : cfg_(cfg), store_(store) {}

  Tensor take(const std::string& name, const Shape& expected) {
    if (!store_.has(name)) {
      throw Error(store_.source() + ": tensor " + name + " is missing (expected shape " +
                  shape_str(expected) + " for this " + cfg_.model_type + " config" +
                  missing_hint(name) + ")");
    }
    used_.insert(name);
    const SafetensorsFile::Entry& entry = store_.entry(name);
    std::string file = store_.file_of(name);
    if (!entry.supported || entry.dtype == DType::I32) {
      throw Error(file + ": unsupported dtype " + entry.dtype_name + " for tensor " + name +
                  " (weights must be F32, BF16 or F16)");
    }
    if (entry.shape != expected) {
      throw Error(file + ": tensor " + name + " has shape " + shape_str(entry.shape) +
                  ", expected " + shape_str(expected));
    }
    if (!dtype_) {
      dtype_ = entry.dtype;
      dtype_source_ = name;
    } else if (entry.dtype != *dtype_) {
      throw Error(file + ": tensor " + name + " has dtype " + entry.dtype_name + ", but " +
                  dtype_source_ + " is " + std::string(dtype_name(*dtype_)) +
                  ": all weights must share one dtype");
    }
    return store_.get(name);
  }

  // A weight matrix (a projection, the embedding or the LM head): a float tensor, or, in a
  // quantized checkpoint, its quantized form (read as it is, or converted exactly from
  // compressed-tensors). `name` ends in ".weight".
  Tensor take_matrix(const std::string& name, const Shape& expected) {
    if (!cfg_.quantization) return take(name, expected);
    const CheckpointQuantization& q = *cfg_.quantization;
    if (q.method == CheckpointQuantization::Method::Attnres) {
      if (!store_.has(name) || store_.entry(name).dtype_name != "U8") return take(name, expected);
      used_.insert(name);
      return read_quantized_matrix(store_, name, expected, q.format,
                                   matrix_role(name, cfg_.num_layers));
    }
    const std::string prefix = name.substr(0, name.size() - std::string_view(".weight").size());
    if (!has_compressed_tensors_matrix(store_, prefix, q.scheme)) return take(name, expected);
    std::vector<std::string> used;
    Tensor t = convert_compressed_tensors_matrix(store_, prefix, expected, q.scheme, used);
    used_.insert(used.begin(), used.end());
    return t;
  }

  // A 0-dim float of any float dtype (a bias, gate logit or alpha), read as a float. `why`
  // says which config field implies it.
  float take_scalar(const std::string& name, const std::string& why) {
    if (!store_.has(name)) {
      throw Error(store_.source() + ": tensor " + name + " is missing (expected a 0-dim float; " +
                  why + ")");
    }
    used_.insert(name);
    const SafetensorsFile::Entry& entry = store_.entry(name);
    if (!(entry.shape.empty() || entry.shape == Shape{1})) {
      throw Error(store_.file_of(name) + ": tensor " + name + " has shape " +
                  shape_str(entry.shape) + ", expected [] (a single value)");
    }
    return store_.read_scalar(name);
  }

  // A sublayer's depth query and what its mode and gate read (docs/ATTNRES.md §2d). `prefix` is
  // "model.layers.{i}.attn" / ".mlp" / "model.final"; `null_prefix` names the null source
  // ("model.layers.{i}.attn_null_source"), empty for the final mix.
  AttnResWeights take_res(const std::string& prefix, const std::string& null_prefix = "") {
    const int64_t d = cfg_.hidden_size;
    const AttnResMode mode = cfg_.attnres_mode;
    const bool final_mix = null_prefix.empty();
    AttnResWeights res;
    res.proj = take(prefix + "_res_proj.weight", {1, d});
    res.norm = take(prefix + "_res_norm.weight", {d});
    // The recency bias: read by block / full mixes; the code writes it under every gate, so
    // it is required once attnres_gate_type is written, optional (0) when the key is absent.
    const std::string bias = prefix + "_res_bias";
    const bool reads_bias = mode == AttnResMode::Block || mode == AttnResMode::Full;
    if (reads_bias && (!cfg_.attnres_gate_type.empty() || store_.has(bias))) {
      res.bias =
          take_scalar(bias, "config.json has attnres_gate_type \"" + cfg_.attnres_gate_type + "\"");
    } else if (store_.has(bias)) {
      ignore(bias);
    }
    take_gate(prefix, final_mix || !attnres_mode_has_gate(mode), res);
    if (!final_mix && cfg_.attnres_use_null_source) {
      if (attnres_is_delta(mode)) {
        res.null_source = take(null_prefix, {d});
      } else if (store_.has(null_prefix)) {
        ignore(null_prefix);  // created by the code, read only by the delta modes
      }
    }
    if (!final_mix && mode == AttnResMode::PreGated) {
      res.pre_gate = take(prefix + "_pre_gate.weight", {d, d});
      res.pre_gate_bias = take(prefix + "_pre_gate.bias", {d});
    }
    return res;
  }

  // The gate tensors of attnres_gate_type (docs/ATTNRES.md §2d); `unread`: the mode has no gate
  // (first_layer, pre_gated) or this is the final mix, and present tensors are ignored.
  void take_gate(const std::string& prefix, bool unread, AttnResWeights& res) {
    const int64_t d = cfg_.hidden_size;
    const std::string why = "config.json has attnres_gate_type \"" + cfg_.attnres_gate_type + "\"";
    if (unread) {
      for (const char* suffix :
           {"_res_gate_logit", "_res_alpha", "_res_gate_proj.weight", "_res_gate_proj.bias"}) {
        if (store_.has(prefix + suffix)) ignore(prefix + suffix);
      }
      return;
    }
    switch (cfg_.attnres_gate) {
      case AttnResGate::Bias:
        break;
      case AttnResGate::SigmoidScalar:
        res.gate_blend = 1.0f / (1.0f + std::exp(-take_scalar(prefix + "_res_gate_logit", why)));
        break;
      case AttnResGate::LearnableAlpha:
        res.gate_blend = take_scalar(prefix + "_res_alpha", why);
        break;
      case AttnResGate::SigmoidVector:
        res.gate_proj = take(prefix + "_res_gate_proj.weight", {d, d});
        res.gate_bias = take(prefix + "_res_gate_proj.bias", {d});
        break;
    }
  }

  // Names may appear without being used: known buffers that carry no weights.
  void ignore(const std::string& name) { used_.insert(name); }

  void reject_leftovers() const {
    for (const std::string& name : store_.names()) {
      if (used_.count(name) || ends_with(name, ".rotary_emb.inv_freq")) continue;
      throw Error(store_.file_of(name) + ": unexpected tensor " + name + " (a " + cfg_.model_type +
                  " model with this config.json has no such weight" + leftover_hint(name) + ")");
    }
  }

  DType dtype() const { return dtype_.value_or(DType::BF16); }

 private:
  std::string missing_hint(const std::string& name) const {
    if (name == "lm_head.weight") {
      return "; config.json has tie_word_embeddings false, set it true if the embeddings are "
             "shared";
    }
    if (ends_with(name, "_bias") || ends_with(name, ".bias")) {
      return "; the config implies this bias";
    }
    return "";
  }

  std::string leftover_hint(const std::string& name) const {
    if (name.find("_res_") != std::string::npos && cfg_.arch != Architecture::Qwen3AttnRes) {
      return "; AttnRes weights need model_type qwen3_attnres";
    }
    if (ends_with(name, "_null_source")) {
      return "; config.json has no attnres_use_null_source true";
    }
    if (ends_with(name, "_pre_gate.weight") || ends_with(name, "_pre_gate.bias")) {
      return "; only attnres_mode \"pre_gated\" has a pre-gate";
    }
    if (name.find(".v_res_") != std::string::npos) {
      return "; only attnres_mode \"delta_v\" has a V-stream mix";
    }
    if (name.find("_res_gate_") != std::string::npos || ends_with(name, "_res_alpha")) {
      return "; config.json's attnres_gate_type \"" + cfg_.attnres_gate_type +
             "\" has no such gate tensor";
    }
    if (name.rfind("model.layers.", 0) == 0) {
      int layer = std::atoi(name.c_str() + std::string("model.layers.").size());
      if (layer >= cfg_.num_layers) {
        return "; config.json has num_hidden_layers " + std::to_string(cfg_.num_layers);
      }
    }
    if (ends_with(name, ".bias")) return "; the config implies no bias here";
    if (ends_with(name, "q_norm.weight") || ends_with(name, "k_norm.weight")) {
      return "; only the qwen3 family has q_norm / k_norm";
    }
    return "";
  }

  const ModelConfig& cfg_;
  const WeightStore& store_;
  std::set<std::string> used_;
  std::optional<DType> dtype_;
  std::string dtype_source_;
};

LayerWeights load_layer(const ModelConfig& cfg, WeightChecker& checker, int i) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const int64_t d = cfg.hidden_size, ffn = cfg.intermediate_size, hd = cfg.head_dim;
  const int64_t q_out = cfg.num_heads * hd, kv_out = cfg.num_kv_heads * hd;
  LayerWeights w;
  w.input_norm = checker.take(p + "input_layernorm.weight", {d});
  w.q_proj = checker.take_matrix(p + "self_attn.q_proj.weight", {q_out, d});
  w.k_proj = checker.take_matrix(p + "self_attn.k_proj.weight", {kv_out, d});
  w.v_proj = checker.take_matrix(p + "self_attn.v_proj.weight", {kv_out, d});
  w.o_proj = checker.take_matrix(p + "self_attn.o_proj.weight", {d, q_out});
  if (cfg.attention_bias) {
    w.q_bias = checker.take(p + "self_attn.q_proj.bias", {q_out});
    w.k_bias = checker.take(p + "self_attn.k_proj.bias", {kv_out});
    w.v_bias = checker.take(p + "self_attn.v_proj.bias", {kv_out});
  }
  if (cfg.o_proj_bias) w.o_bias = checker.take(p + "self_attn.o_proj.bias", {d});
  if (cfg.qk_norm) {
    w.q_norm = checker.take(p + "self_attn.q_norm.weight", {hd});
    w.k_norm = checker.take(p + "self_attn.k_norm.weight", {hd});
  }
  w.post_attention_norm = checker.take(p + "post_attention_layernorm.weight", {d});
  w.gate_proj = checker.take_matrix(p + "mlp.gate_proj.weight", {ffn, d});
  w.up_proj = checker.take_matrix(p + "mlp.up_proj.weight", {ffn, d});
  w.down_proj = checker.take_matrix(p + "mlp.down_proj.weight", {d, ffn});
  if (cfg.mlp_bias) {
    w.gate_bias = checker.take(p + "mlp.gate_proj.bias", {ffn});
    w.up_bias = checker.take(p + "mlp.up_proj.bias", {ffn});
    w.down_bias = checker.take(p + "mlp.down_proj.bias", {d});
  }
  if (cfg.attnres_mode != AttnResMode::None) {
    w.attn_res = checker.take_res(p + "attn", p + "attn_null_source");
    w.mlp_res = checker.take_res(p + "mlp", p + "mlp_null_source");
  }
  if (cfg.attnres_mode == AttnResMode::DeltaV) {
    AttnResWeights v;
    v.proj = checker.take(p + "v_res_proj.weight", {1, d});
    v.norm = checker.take(p + "v_res_norm.weight", {d});
    w.v_res = std::move(v);
  }
  return w;
}

}  // namespace

ModelWeights ModelWeights::load(const ModelConfig& cfg, const WeightStore& store) {
  WeightChecker checker(cfg, store);
  const int64_t d = cfg.hidden_size, vocab = cfg.vocab_size;
  ModelWeights w;
  w.embed_tokens = checker.take_matrix("model.embed_tokens.weight", {vocab, d});
  for (int i = 0; i < cfg.num_layers; ++i) w.layers.push_back(load_layer(cfg, checker, i));
  w.final_norm = checker.take("model.norm.weight", {d});
  if (cfg.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
    // Some exporters still write the tied copy; transformers ignores it when tied, so do we.
    if (store.has("lm_head.weight")) checker.ignore("lm_head.weight");
  } else {
    w.lm_head = checker.take_matrix("lm_head.weight", {vocab, d});
  }

  // Variant 2b is told apart from 2a only by the final-mix weights (docs/ATTNRES.md §2b).
  const char* kFinalResNames[] = {"model.final_res_proj.weight", "model.final_res_norm.weight",
                                  "model.final_res_bias"};
  for (const char* name : kFinalResNames) {
    if (!store.has(name) || cfg.arch != Architecture::Qwen3AttnRes) continue;
    if (cfg.attnres_mode != AttnResMode::Block) {
      throw Error(store.file_of(name) + ": tensor " + name + " (the final mix of variant 2b) " +
                  "requires attnres_mode \"block\", but config.json has attnres_mode \"" +
                  std::string(attnres_mode_name(cfg.attnres_mode)) + "\"");
    }
    w.final_res = checker.take_res("model.final");
    break;
  }
  checker.reject_leftovers();
  w.dtype = checker.dtype();
  if (cfg.quantization) w.quant_format = cfg.quantization->format;
  return w;
}

size_t ModelWeights::total_bytes() const {
  std::set<const void*> seen;
  size_t bytes = 0;
  auto add = [&](const Tensor& t) {
    if (t.defined() && seen.insert(t.data).second) bytes += t.nbytes();
  };
  auto add_mix = [&](const std::optional<AttnResWeights>& m) {
    if (!m) return;
    for (const Tensor* t : {&m->proj, &m->norm, &m->gate_proj, &m->gate_bias, &m->null_source,
                            &m->pre_gate, &m->pre_gate_bias}) {
      add(*t);
    }
  };
  add(embed_tokens);
  add(final_norm);
  add(lm_head);
  add_mix(final_res);
  for (const LayerWeights& l : layers) {
    for (const Tensor* t :
         {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_norm, &l.k_norm,
          &l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias, &l.post_attention_norm, &l.gate_proj,
          &l.up_proj, &l.down_proj, &l.gate_bias, &l.up_bias, &l.down_bias}) {
      add(*t);
    }
    add_mix(l.attn_res);
    add_mix(l.mlp_res);
    add_mix(l.v_res);
  }
  return bytes;
}

}  // namespace attnres
