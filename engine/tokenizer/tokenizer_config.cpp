#include "engine/tokenizer/tokenizer_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/json_fields.h"

namespace attnres {
namespace {

using Fields = JsonFields<nlohmann::json>;

// A special token: its text, or an AddedToken object {"content": text, ...}; "" when absent.
std::string token_text(const Fields& fields, const char* field) {
  const nlohmann::json* v = fields.find(field);
  if (!v) return "";
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) {
    auto content = v->find("content");
    if (content != v->end() && content->is_string()) return content->get<std::string>();
  }
  fields.fail(field, "expected a string or an AddedToken object with a string \"content\", got " +
                         json_value_text(*v));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TokenizerConfig TokenizerConfig::from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) throw Error(origin + ": expected a JSON object at the top level");
  TokenizerConfig cfg;
  auto tmpl = j.find("chat_template");
  if (tmpl != j.end() && !tmpl->is_null()) {
    if (tmpl->is_string()) {
      cfg.chat_template = tmpl->get<std::string>();
    } else if (tmpl->is_array()) {
      for (const auto& entry : *tmpl) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string()) {
          throw Error(origin +
                      ": chat_template list entries must be {\"name\": string, "
                      "\"template\": string}");
        }
        cfg.named_templates[entry["name"].get<std::string>()] =
            entry["template"].get<std::string>();
      }
      auto def = cfg.named_templates.find("default");
      if (def != cfg.named_templates.end()) cfg.chat_template = def->second;
    } else {
      throw Error(origin + ": chat_template must be a string or a list of named templates");
    }
  }
  const Fields fields(j, JsonFieldOptions::with_origin(origin));
  cfg.bos_token = token_text(fields, "bos_token");
  cfg.eos_token = token_text(fields, "eos_token");
  cfg.pad_token = token_text(fields, "pad_token");
  cfg.unk_token = token_text(fields, "unk_token");
  cfg.add_bos_token = fields.boolean("add_bos_token");
  cfg.add_eos_token = fields.boolean("add_eos_token");
  auto mml = j.find("model_max_length");
  if (mml != j.end() && mml->is_number()) {
    double v = mml->get<double>();
    // HF writes int(1e30) when a model has no limit; anything that large means "unknown".
    if (v > 0 && v < 1e12) cfg.model_max_length = static_cast<int64_t>(v);
  }
  return cfg;
}

TokenizerConfig TokenizerConfig::load(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": invalid JSON: " + e.what());
  }
  TokenizerConfig cfg = from_json(j, path);
  if (!cfg.chat_template) {
    auto sibling = std::filesystem::path(path).parent_path() / "chat_template.jinja";
    std::error_code ec;
    if (std::filesystem::exists(sibling, ec)) cfg.chat_template = read_file(sibling.string());
  }
  return cfg;
}

}  // namespace attnres
