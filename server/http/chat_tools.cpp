#include "server/http/chat_tools.h"

#include "server/http/api_error.h"

namespace attnres::server::http {

ChatToolFields read_chat_tool_fields(const FieldReader& f) {
  ChatToolFields fields;
  const auto* tools = f.find("tools");
  fields.functions = read_tools(tools ? *tools : nlohmann::ordered_json(nullptr));
  const auto* tool_choice = f.find("tool_choice");
  fields.choice = read_tool_choice(tool_choice ? *tool_choice : nlohmann::ordered_json(nullptr),
                                   fields.functions);
  if (auto v = f.boolean("parallel_tool_calls")) fields.parallel = *v;
  if (auto v = f.boolean("include_reasoning")) fields.include_reasoning = *v;
  return fields;
}

void apply_chat_tool_fields(const ChatToolFields& fields, const ServerState& state,
                            ChatRequest& request) {
  const ServeOptions& options = state.options();
  ChatAnswerFormat& format = request.answer_format;
  format.reasoning = options.reasoning_format;
  format.prompt_thinking = prompt_thinking(request.prompt.text);
  const ToolChoiceMode mode = fields.choice.mode;
  if (mode != ToolChoiceMode::None) format.tool_calls = options.tool_call_format;
  format.first_call_only = !fields.parallel;
  request.include_reasoning = fields.include_reasoning;

  SamplingParams& params = request.options.params;
  if (mode == ToolChoiceMode::Required || mode == ToolChoiceMode::Named) {
    // Forcing a call takes constrained decoding (tool_choice.h builds the constraint), which
    // this engine does not apply: refused rather than answered with unforced text.
    throw bad_request(
        "field tool_choice: \"required\" and named functions need constrained decoding, which "
        "this server does not support; use \"auto\" or \"none\"",
        "tool_choice");
  }
  // Mistral's [TOOL_CALLS] is a special token: the text must keep it for the parser to see it.
  if (format.tool_calls == ToolCallFormat::Mistral) params.skip_special_tokens = false;
}

}  // namespace attnres::server::http
