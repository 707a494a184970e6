// Everything a model directory provides, loaded and validated together: config,
// weights (memory-mapped), tokenizer and chat template. Also the built-in models that need
// no files: the demo model the commands use when no --model is given, and the benchmark
// shapes of docs/BENCHMARKS.md, both with deterministic random weights.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/model/quantize_weights.h"
#include "engine/sample/vocabulary.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"

namespace attnres {

struct LoadedModel {
  std::string source;  // the directory, or "built-in:<name>"
  ModelConfig config;
  ModelWeights weights;
  std::shared_ptr<const Tokenizer> tokenizer;
  TokenizerConfig tokenizer_config;
  std::optional<ChatTemplate> chat_template;
  // Set when the weights were quantized at load (ModelLoadOptions::quantization).
  std::optional<QuantizeSummary> quantized;

  // EOS ids: generation_config.json's, else config.json's, else the tokenizer's eos token.
  std::vector<int32_t> eos_token_ids() const;
  // The LM head's rows and the ones the tokenizer can decode (the rest are padding).
  Vocabulary vocabulary() const;
};

// How to load: --quantization ("" = the checkpoint's own weights; "int8" / "int4" quantizes
// every float weight matrix, quantize_weights.h) on `threads` threads (0 = all cores).
struct ModelLoadOptions {
  std::string quantization;
  int threads = 0;
};

// A Hugging Face model directory: config.json, safetensors, tokenizer.json,
// tokenizer_config.json (optional). Throws attnres::Error naming the file and the defect.
LoadedModel load_model(const std::string& model_dir, const ModelLoadOptions& options = {});

// Names accepted by load_builtin_model: "demo" and the benchmark shapes. An AttnRes shape
// also takes "@MODE" or "@MODE+GATE" (attnres-100m@delta_block+sigmoid_scalar): the same
// shape in another attnres_mode / attnres_gate_type.
std::vector<std::string> builtin_model_names();
// "demo": a small qwen3_attnres model (block mode) with the GPT-2 tokenizer from the
// repository. "attnres-100m" / "plain-100m": the 100M open-attnres shape and its
// no-AttnRes twin; "attnres-0.6b" / "plain-0.6b": the 0.6B shape and its twin.
LoadedModel load_builtin_model(const std::string& name, const ModelLoadOptions& options = {});

// The config.json of a built-in model (load_builtin_model's names).
nlohmann::json builtin_model_config(const std::string& name);

// A --model argument: a directory, or "builtin:NAME" / empty for the demo model.
LoadedModel load_model_arg(const std::string& arg, const ModelLoadOptions& options = {});

// Folder of the files the binary ships with (the demo tokenizer): $ATTNRES_ASSETS_DIR, or
// engine/model/assets in the source tree it was built from.
std::string assets_dir();

}  // namespace attnres
