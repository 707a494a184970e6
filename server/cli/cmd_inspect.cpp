// attnres inspect: what a model directory holds and how the engine will run it.
#include <iostream>

#include "engine/model/depth_plan.h"
#include "server/cli/commands.h"

namespace attnres::cli {
namespace {

struct WeightTotals {
  int64_t params = 0;
  size_t bytes = 0;
};

void add(WeightTotals& totals, const Tensor& t) {
  if (!t.defined()) return;
  totals.params += t.numel();
  totals.bytes += t.nbytes();
}

WeightTotals count_weights(const ModelWeights& w) {
  WeightTotals totals;
  add(totals, w.embed_tokens);
  add(totals, w.final_norm);
  if (w.lm_head.data != w.embed_tokens.data) add(totals, w.lm_head);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t :
         {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_norm, &l.k_norm,
          &l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias, &l.post_attention_norm, &l.gate_proj,
          &l.up_proj, &l.down_proj, &l.gate_bias, &l.up_bias, &l.down_bias}) {
      add(totals, *t);
    }
    for (const auto* res : {&l.attn_res, &l.mlp_res}) {
      if (*res) {
        add(totals, (*res)->proj);
        add(totals, (*res)->norm);
      }
    }
  }
  return totals;
}

}  // namespace

int run_inspect(const std::vector<std::string>& args) {
  const auto specs = model_flags();
  if (print_help_if_asked(args, "inspect", "Print a model's summary and its AttnRes depth plan.",
                          specs)) {
    return 0;
  }
  Flags flags(specs, args);
  LoadedModel model = load_model_from_flags(flags);
  const WeightTotals totals = count_weights(model.weights);
  std::cout << "model:      " << model.source << "\n"
            << "config:     " << model.config.summary() << "\n"
            << "weights:    " << totals.params << " parameters, " << totals.bytes / 1e6 << " MB as "
            << dtype_name(model.weights.embed_tokens.dtype)
            << (model.weights.lm_head.data == model.weights.embed_tokens.data
                    ? ", tied LM head"
                    : ", separate LM head")
            << "\n"
            << "tokenizer:  " << model.tokenizer->vocab_size() << " tokens, chat template "
            << (model.chat_template ? "present" : "absent") << "\n";
  std::cout << DepthPlan::build(model.config, model.weights.final_res.has_value()).describe();
  return 0;
}

}  // namespace attnres::cli
