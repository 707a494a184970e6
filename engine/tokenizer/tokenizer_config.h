// The parts of a Hugging Face tokenizer_config.json the server needs: the chat template(s)
// and the special tokens the template refers to.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace attnres {

struct TokenizerConfig {
  // String form, or the "default" entry of the list form.
  std::optional<std::string> chat_template;
  // List form [{"name": ..., "template": ...}], e.g. "default", "tool_use", "rag".
  std::map<std::string, std::string> named_templates;
  // Plain string or AddedToken dict {"content": ...}; "" when null/absent.
  std::string bos_token, eos_token, pad_token, unk_token;
  std::optional<bool> add_bos_token, add_eos_token;
  int64_t model_max_length = 0;  // 0 if absent or absurd (HF's 1e30 "no limit" marker)

  // Reads the file; a sibling chat_template.jinja (newer HF layout) fills chat_template
  // when the JSON has none. Throws attnres::Error naming the file.
  static TokenizerConfig load(const std::string& path);
  // `origin` names the source in error messages.
  static TokenizerConfig from_json(const nlohmann::json& j, const std::string& origin);
};

}  // namespace attnres
