// Chat templates: the Jinja program a Hugging Face model ships to turn a conversation into
// prompt text. Rendering matches transformers' apply_chat_template (jinja2 with
// trim_blocks, lstrip_blocks, loopcontrols, an immutable sandbox, its tojson,
// raise_exception and strftime_now) byte for byte.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/tokenizer/tokenizer_config.h"

namespace attnres {

namespace jinja {
struct Template;
}

// Caps that keep a hostile template or request from exhausting the server.
struct ChatTemplateLimits {
  size_t max_output_bytes = 16u << 20;
  int max_call_depth = 64;
  int64_t max_loop_iterations = 1'000'000;
};

class ChatTemplate {
 public:
  // Parses once; syntax errors throw attnres::Error with line/column and what was expected.
  static ChatTemplate parse(const std::string& source);

  // Renders with the given variables (a JSON object). raise_exception("...") in the
  // template, type errors, undefined-attribute errors etc. throw attnres::Error.
  // Note: nlohmann::json sorts object keys; use render_ordered when key order matters
  // (e.g. `tools | tojson` must keep the caller's order to match transformers).
  std::string render(const nlohmann::json& context) const;
  std::string render_ordered(const nlohmann::ordered_json& context) const;

  // transformers' apply_chat_template: context = {messages, add_generation_prompt, tools
  // (null when absent), documents (null), the tokenizer's special tokens (only those that
  // are set), ...extra (e.g. enable_thinking, date_string)}.
  std::string apply(const nlohmann::json& messages, bool add_generation_prompt,
                    const TokenizerConfig& cfg, const nlohmann::json& tools = nullptr,
                    const nlohmann::json& extra = nlohmann::json::object()) const;
  std::string apply_ordered(
      const nlohmann::ordered_json& messages, bool add_generation_prompt,
      const TokenizerConfig& cfg, const nlohmann::ordered_json& tools = nullptr,
      const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // A copy sharing the parsed template, with other limits.
  ChatTemplate with_limits(const ChatTemplateLimits& limits) const;

 private:
  std::shared_ptr<const jinja::Template> tmpl_;  // immutable, shared by copies
  ChatTemplateLimits limits_;
};

}  // namespace attnres
