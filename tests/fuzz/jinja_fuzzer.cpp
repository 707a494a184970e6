// Jinja: an arbitrary template parsed and rendered the way chat templates are (messages,
// add_generation_prompt, tools). Template errors and raise_exception are attnres::Error.
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/tokenizer/chat_template.h"
#include "fuzz_support.h"

using namespace attnres;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi <b>there</b> \u00e9"},
    {"role": "assistant", "content": "Hello", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
    {"role": "tool", "content": "42"}])");
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  try {
    // Small limits keep a pathological template (a huge loop) from timing the fuzzer out;
    // exceeding them is an Error like any other template error.
    ChatTemplateLimits limits;
    limits.max_output_bytes = 1 << 16;
    limits.max_loop_iterations = 1 << 12;
    const ChatTemplate tmpl =
        ChatTemplate::parse(std::string(fuzz::as_text(data, size))).with_limits(limits);
    TokenizerConfig cfg;
    (void)tmpl.apply_ordered(messages, true, cfg, tools);
  } catch (const Error&) {
  }
  return 0;
}
