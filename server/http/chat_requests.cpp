#include "server/http/chat_requests.h"

#include "server/http/api_error.h"
#include "server/http/field_reader.h"

namespace attnres::server::http {
namespace {

std::string at(size_t i) {
  std::string where = "messages[";
  where += std::to_string(i);
  where += ']';
  return where;
}

// A list of content parts -> one string (text parts joined by newlines).
std::string join_text_parts(const nlohmann::ordered_json& parts, const std::string& where) {
  std::string text;
  for (size_t j = 0; j < parts.size(); ++j) {
    const auto& part = parts[j];
    std::string part_where = where;
    part_where += ".content[";
    part_where += std::to_string(j);
    part_where += ']';
    if (!part.is_object()) {
      throw bad_request(part_where +
                            ": expected an object {\"type\": \"text\", \"text\": ...}, got " +
                            json_type_name(part),
                        "messages");
    }
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      throw bad_request(part_where + ".type: missing (expected \"text\")", "messages");
    }
    if (type->get<std::string>() != "text") {
      throw bad_request(part_where + ".type: \"" + type->get<std::string>() +
                            "\" is not supported (this model takes text only)",
                        "messages");
    }
    auto value = part.find("text");
    if (value == part.end() || !value->is_string()) {
      throw bad_request(part_where + ".text: expected a string", "messages");
    }
    if (j > 0) text += '\n';
    text += value->get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls as templates expect them: each function's `arguments`
// JSON string parsed into its object (vLLM does the same, so that templates that write
// `arguments | tojson` or walk its items see an object, as transformers users pass it). A
// string that is not a JSON object stays a string.
void parse_tool_call_arguments(nlohmann::ordered_json& message, const std::string& where) {
  auto calls = message.find("tool_calls");
  if (calls == message.end() || calls->is_null()) return;
  if (!calls->is_array()) {
    throw bad_request(where + ".tool_calls: expected a list, got " + json_type_name(*calls),
                      "messages");
  }
  for (auto& call : *calls) {
    if (!call.is_object()) {
      throw bad_request(
          where + ".tool_calls: each call must be an object, got " + json_type_name(call),
          "messages");
    }
    auto function = call.find("function");
    if (function == call.end() || !function->is_object()) continue;
    auto arguments = function->find("arguments");
    if (arguments == function->end() || !arguments->is_string()) continue;
    const std::string& text = arguments->get_ref<const std::string&>();
    auto parsed = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) *arguments = std::move(parsed);
  }
}

}  // namespace

nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) {
    throw bad_request(
        "field messages: expected a list of messages, got " + json_type_name(messages), "messages");
  }
  if (messages.empty()) throw bad_request("field messages: must not be empty", "messages");
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& message = messages[i];
    if (!message.is_object()) {
      throw bad_request(at(i) + ": expected an object with \"role\" and \"content\", got " +
                            json_type_name(message),
                        "messages");
    }
    auto role = message.find("role");
    if (role == message.end() || !role->is_string()) {
      throw bad_request(at(i) + ".role: missing or not a string", "messages");
    }
    nlohmann::ordered_json copy = message;
    auto content = message.find("content");
    if (content != message.end()) {
      if (content->is_array()) {
        copy["content"] = join_text_parts(*content, at(i));
      } else if (!content->is_string() && !content->is_null()) {
        throw bad_request(at(i) + ".content: expected a string or a list of text parts, got " +
                              json_type_name(*content),
                          "messages");
      }
    }
    parse_tool_call_arguments(copy, at(i));
    out.push_back(std::move(copy));
  }
  return out;
}

std::string render_chat_prompt(const LoadedModel& model, const nlohmann::ordered_json& messages,
                               bool add_generation_prompt, const nlohmann::ordered_json& tools,
                               const nlohmann::ordered_json& extra,
                               const ChatTemplate* request_template) {
  if (request_template) {
    return request_template->apply_ordered(messages, add_generation_prompt, model.tokenizer_config,
                                           tools, extra);
  }
  if (!model.chat_template) {
    throw bad_request(
        "this model has no chat template (tokenizer_config.json chat_template): use "
        "/v1/completions");
  }
  // apply_ordered keeps the client's key order (tools | tojson must match transformers).
  return model.chat_template->apply_ordered(messages, add_generation_prompt, model.tokenizer_config,
                                            tools, extra);
}

std::string cut_after_final_message(const std::string& rendered,
                                    const nlohmann::ordered_json& messages) {
  const auto& final_message = messages.back();
  auto content = final_message.find("content");
  const std::string text =
      content != final_message.end() && content->is_string() ? content->get<std::string>() : "";
  constexpr const char* kSpace = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(kSpace);
  const std::string lstripped = first == std::string::npos ? "" : text.substr(first);
  const std::string stripped = lstripped.substr(0, lstripped.find_last_not_of(kSpace) + 1);
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos) {
    throw bad_request(
        "field continue_final_message: the final message does not appear in the conversation "
        "the chat template rendered, so it cannot be continued",
        "continue_final_message");
  }
  // Keep the message's trailing whitespace when the template kept it too.
  if (rendered.compare(at, lstripped.size(), lstripped) == 0 && lstripped == text) {
    return rendered.substr(0, at + lstripped.size());
  }
  return rendered.substr(0, at + stripped.size());
}

}  // namespace attnres::server::http
