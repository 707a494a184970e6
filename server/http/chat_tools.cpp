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
  // As vLLM: constraints apply once the reasoning has ended (its end marker is one token in the
  // templates that use it); a prompt that closed it leaves nothing to wait for.
  auto after_reasoning = [&](OutputConstraint& constraint) {
    if (format.reasoning == ReasoningFormat::None ||
        format.prompt_thinking == PromptThinking::Closed) {
      return;
    }
    const std::vector<int32_t> end = state.model().tokenizer->encode(kThinkEnd, false);
    if (end.size() == 1) constraint.enforce_after_token = end[0];
  };
  if (params.constraint) after_reasoning(*params.constraint);  // response_format and the like
  if (mode == ToolChoiceMode::Required || mode == ToolChoiceMode::Named) {
    if (options.tool_call_format == ToolCallFormat::None) {
      throw bad_request(
          "field tool_choice: this server has no tool-call parser for the model's chat template, "
          "so it cannot force a call: start it with --tool-call-parser hermes|llama3_json|mistral",
          "tool_choice");
    }
    if (params.constraint) {
      throw bad_request(
          "field tool_choice: a forced tool call cannot be combined with another output "
          "constraint (response_format, structured_outputs, ...)",
          "tool_choice");
    }
    OutputConstraint constraint = forced_tool_call_constraint(
        options.tool_call_format, fields.functions, fields.choice, fields.parallel);
    after_reasoning(constraint);
    constraint.field = "tool_choice";
    params.constraint = std::move(constraint);
  }
  // Mistral's [TOOL_CALLS] is a special token: the text must keep it for the parser to see it.
  if (format.tool_calls == ToolCallFormat::Mistral) params.skip_special_tokens = false;
}

}  // namespace attnres::server::http
