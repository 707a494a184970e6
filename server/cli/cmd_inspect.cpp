// attnres inspect: what a model directory holds and how the engine will run it. With a prompt
// (--prompt / --prompt-ids) it also runs the prompt offline, through the same engine loop and
// ModelRunner as the server (so chunked prefill and the depth-weight path are the server's),
// and reports the depth-attention weights averaged over the prompt (docs/ATTNRES.md §5): a text
// table, a heatmap PNG (--out) and JSON (--json).
#include <cmath>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "engine/model/depth_plan.h"
#include "engine/sched/engine_core.h"
#include "engine/sched/model_execution.h"
#include "server/cli/commands.h"
#include "server/cli/depth_heatmap.h"

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

std::vector<FlagSpec> inspect_flags() {
  std::vector<FlagSpec> specs = model_flags();
  std::vector<FlagSpec> own = {
      {"prompt", "TEXT",
       "run TEXT and print its depth-attention weights (the depth-mix softmax of every "
       "sublayer over its sources) averaged over the prompt's tokens; AttnRes models only"},
      {"prompt-ids", "IDS", "the prompt as comma-separated token ids instead of text"},
      {"no-special-tokens", "", "do not add the tokenizer's special tokens (e.g. BOS)"},
      {"out", "FILE.png",
       "with a prompt: write the weights as a heatmap PNG. Rows are the mixing sublayers, "
       "top to bottom (layer 0 attention, layer 0 mlp, ..., final); columns are the sources, "
       "left to right (the embedding, then the bank entries; a row's partial is the column "
       "right after its last bank entry, so the picture is lower-triangular); colour runs "
       "from dark purple (0) to yellow (the largest weight, printed), light grey where a row "
       "has no such source; the colour bar on the right has 0 at its bottom"},
      {"json", "FILE",
       "with a prompt: write {prompt_ids, sublayers, sources, prompt_mean} as JSON (null for "
       "unused cells), the shape the HTTP API returns"},
      {"max-num-batched-tokens", "N",
       "prompt tokens computed per step (default 2048); a longer prompt runs in chunks, as "
       "in the server"},
  };
  specs.insert(specs.end(), own.begin(), own.end());
  return specs;
}

std::vector<int32_t> prompt_ids_from_flags(const Flags& flags, const LoadedModel& model) {
  if (flags.has("prompt-ids")) {
    if (flags.has("prompt")) throw Error("give either --prompt or --prompt-ids, not both");
    return flags.get_int_list("prompt-ids");
  }
  return model.tokenizer->encode(flags.get("prompt"), !flags.has("no-special-tokens"));
}

struct PromptDepth {
  DepthAttentionLayout layout;
  DepthAttentionMatrix mean;
};

// Runs the prompt (plus the one token its last position samples) on the engine loop and
// returns the depth-attention weights averaged over its positions.
PromptDepth prompt_depth_attention(const Flags& flags, const LoadedModel& model,
                                   const std::vector<int32_t>& prompt) {
  if (prompt.empty()) throw Error("--prompt: is empty, at least one token is needed");
  const int block_size = 16;
  const int total = static_cast<int>(prompt.size()) + 1;
  const int num_blocks = (total + block_size - 1) / block_size;
  auto exec = make_model_execution(engine_args_from_flags(flags), model, num_blocks, block_size);
  EngineConfig config;
  config.scheduler.max_num_seqs = 1;
  config.scheduler.max_num_batched_tokens = flags.get_int("max-num-batched-tokens", 2048);
  config.scheduler.max_model_len = total;
  config.scheduler.validate();
  config.num_kv_blocks = num_blocks;
  config.block_size = block_size;
  config.eos_ids = model.eos_token_ids();
  EngineCore engine(config, *exec->runner);
  if (engine.depth_attention_layout().empty()) {
    throw Error(model.source +
                ": the model has no depth attention (it is not an AttnRes model), so there are "
                "no depth-attention weights to show");
  }
  EngineRequest request;
  request.request_id = "inspect";
  request.prompt_ids = prompt;
  request.params.temperature = 0.0f;
  request.params.max_tokens = 1;
  request.params.ignore_eos = true;
  request.params.depth_attention = true;
  SubmitResult submitted = engine.submit(std::move(request));
  if (!submitted.accepted()) throw Error(submitted.message);
  while (engine.step()) {
  }
  PromptDepth result{engine.depth_attention_layout(), {}};
  bool have_mean = false;
  while (std::optional<RequestOutput> out = submitted.stream->next()) {
    if (!out->error.empty()) throw Error("the forward failed: " + out->error);
    if (out->depth_prompt_mean) {
      result.mean = *out->depth_prompt_mean;
      have_mean = true;
    }
  }
  ATTNRES_CHECK(have_mean, "the engine sent no depth-attention prompt mean");
  return result;
}

nlohmann::json matrix_json(const DepthAttentionMatrix& m) {
  nlohmann::json rows = nlohmann::json::array();
  for (int r = 0; r < m.rows; ++r) {
    nlohmann::json row = nlohmann::json::array();
    for (int c = 0; c < m.cols; ++c) {
      const float v = m.at(r, c);
      row.push_back(std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

void report_prompt_depth(const Flags& flags, const LoadedModel& model) {
  const std::vector<int32_t> prompt = prompt_ids_from_flags(flags, model);
  const PromptDepth depth = prompt_depth_attention(flags, model, prompt);
  std::cout << "depth attention, mean over the " << prompt.size()
            << " prompt tokens (rows: sublayers, columns: sources):\n"
            << depth_attention_table(depth.layout, depth.mean);
  if (flags.has("out")) {
    const float top = write_depth_heatmap_png(flags.get("out"), depth.mean);
    std::cout << "heatmap: " << flags.get("out") << " (colour scale 0 to " << top << ")\n";
  }
  if (flags.has("json")) {
    const nlohmann::json j = {{"model", model.source},
                              {"prompt_ids", prompt},
                              {"sublayers", depth.layout.sublayers},
                              {"sources", depth.layout.sources},
                              {"prompt_mean", matrix_json(depth.mean)}};
    std::ofstream out(flags.get("json"));
    out << j.dump() << "\n";
    out.close();
    if (!out) throw Error(flags.get("json") + ": cannot write the JSON file");
  }
}

}  // namespace

int run_inspect(const std::vector<std::string>& args) {
  const auto specs = inspect_flags();
  if (print_help_if_asked(args, "inspect",
                          "Print a model's summary and its AttnRes depth plan; with --prompt, the "
                          "prompt's depth-attention weights (table, heatmap PNG, JSON).",
                          specs)) {
    return 0;
  }
  Flags flags(specs, args);
  const bool with_prompt = flags.has("prompt") || flags.has("prompt-ids");
  if (!with_prompt && (flags.has("out") || flags.has("json"))) {
    throw Error("--out and --json need a prompt (--prompt or --prompt-ids)");
  }
  LoadedModel model = load_model_from_flags(flags);
  const WeightTotals totals = count_weights(model.weights);
  std::cout << "model:      " << model.source << "\n"
            << "config:     " << model.config.summary() << "\n"
            << "weights:    " << totals.params << " parameters, " << totals.bytes / 1e6 << " MB as "
            << dtype_name(model.weights.dtype)
            << (model.weights.quant_format
                    ? ", weight matrices " + quant_format_name(*model.weights.quant_format)
                    : "")
            << (model.weights.lm_head.data == model.weights.embed_tokens.data
                    ? ", tied LM head"
                    : ", separate LM head")
            << "\n"
            << "tokenizer:  " << model.tokenizer->vocab_size() << " tokens, chat template "
            << (model.chat_template ? "present" : "absent") << "\n";
  // What the engine would store and compute in with these flags on this machine (the
  // resolved auto settings: --kv-cache-dtype, --depth-bank-dtype, --linear-input-dtype).
  const EngineArgs engine = engine_args_from_flags(flags);
  std::cout << "engine:     " << engine.device << ", KV cache "
            << storage_dtype_name(kv_cache_dtype(engine, model)) << ", depth bank "
            << storage_dtype_name(depth_bank_dtype(engine, model)) << ", linear inputs "
            << linear_input_dtype_name(engine, model) << "\n";
  std::cout << DepthPlan::build(model.config, model.weights.final_res.has_value()).describe();
  if (with_prompt) report_prompt_depth(flags, model);
  return 0;
}

}  // namespace attnres::cli
