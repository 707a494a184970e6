#include "engine/model/quantized_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "engine/model/named_weights.h"
#include "engine/model/quantized_tensors.h"
#include "engine/model/safetensors_writer.h"
#include "engine/model/weight_store.h"

namespace attnres {
namespace fs = std::filesystem;
namespace {

constexpr const char* kBuiltinPrefix = "built-in:";

// The files of a model directory besides config.json and the weights.
constexpr const char* kCopiedFiles[] = {"tokenizer.json",
                                        "tokenizer_config.json",
                                        "generation_config.json",
                                        "special_tokens_map.json",
                                        "vocab.json",
                                        "merges.txt",
                                        "chat_template.jinja",
                                        "tokenizer.model"};

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw Error(path.string() + ": cannot write");
}

// The names a quantized matrix PREFIX.weight may be stored under in the source (as floats,
// ours, or compressed-tensors'): none of them is copied, the new matrix replaces them.
void add_replaced_names(const std::string& weight_name, std::set<std::string>& names) {
  const std::string prefix = weight_name.substr(0, weight_name.size() - 7);  // ".weight"
  for (const char* suffix :
       {".weight", ".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point"}) {
    names.insert(prefix + suffix);
  }
}

}  // namespace

void write_quantized_checkpoint(const LoadedModel& model, const std::string& out_dir) {
  if (!model.weights.quant_format) {
    throw Error("quantize: " + model.source +
                " has no quantized weights: pass --quantization "
                "int8 or int4");
  }
  const bool builtin = model.source.rfind(kBuiltinPrefix, 0) == 0;
  fs::create_directories(out_dir);
  if (!builtin && fs::equivalent(out_dir, model.source)) {
    throw Error("quantize: --output " + out_dir + " is the source model directory");
  }
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  std::set<std::string> written;
  const DType recipe = *model.weights.quant_format;
  for (const auto& [name, t] : named_weight_matrices(model.config, model.weights)) {
    if (!is_block_quantized(t.dtype)) continue;
    // The loader reads any format of the recipe, each tensor's own as its metadata names it.
    const std::vector<DType> allowed = recipe_formats(recipe);
    ATTNRES_CHECK(std::find(allowed.begin(), allowed.end(), t.dtype) != allowed.end(),
                  name + " is " + quant_format_name(t.dtype) + ", not a format of the " +
                      quant_format_name(recipe) + " recipe");
    const int64_t row_bytes = static_cast<int64_t>(quant_row_bytes(t.dtype, t.dim(1)));
    writer.add(name, "U8", {t.dim(0), row_bytes}, t.data, t.nbytes());
    writer.set_metadata(name, quantized_tensor_metadata(t.dtype, t.shape));
    add_replaced_names(name, written);
  }
  const std::vector<NamedTensor> builtin_tensors =
      builtin ? named_weight_tensors(model.config, model.weights) : std::vector<NamedTensor>{};
  std::optional<WeightStore> store;
  if (builtin) {
    for (const auto& [name, t] : builtin_tensors) {
      if (written.count(name)) continue;
      writer.add(name, std::string(dtype_name(t.dtype)), t.shape, t.data, t.nbytes());
    }
  } else {
    store = WeightStore::open(model.source);
    if (model.config.tie_word_embeddings) written.insert("lm_head.weight");  // ignored at load
    for (const std::string& name : store->names()) {
      if (written.count(name)) continue;
      const SafetensorsFile::Raw raw = store->raw(name);
      writer.add(name, raw.dtype_name, raw.shape, raw.data, raw.nbytes);
    }
  }
  writer.write((fs::path(out_dir) / "model.safetensors").string());

  nlohmann::json config = builtin
                              ? builtin_model_config(model.source.substr(strlen(kBuiltinPrefix)))
                              : read_json(fs::path(model.source) / "config.json");
  config["quantization_config"] = {{"quant_method", "attnres"},
                                   {"format", quant_format_name(recipe)}};
  write_text(fs::path(out_dir) / "config.json", config.dump(2) + "\n");
  if (builtin) {
    fs::copy_file(fs::path(assets_dir()) / "gpt2" / "tokenizer.json",
                  fs::path(out_dir) / "tokenizer.json", fs::copy_options::overwrite_existing);
    nlohmann::json tokenizer_config = {{"eos_token", model.tokenizer_config.eos_token},
                                       {"bos_token", model.tokenizer_config.bos_token}};
    if (model.tokenizer_config.chat_template)
      tokenizer_config["chat_template"] = *model.tokenizer_config.chat_template;
    write_text(fs::path(out_dir) / "tokenizer_config.json", tokenizer_config.dump(2) + "\n");
    return;
  }
  for (const char* file : kCopiedFiles) {
    const fs::path from = fs::path(model.source) / file;
    if (fs::exists(from))
      fs::copy_file(from, fs::path(out_dir) / file, fs::copy_options::overwrite_existing);
  }
}

}  // namespace attnres
