#include "server/http/responses_requests.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <unordered_map>

#include "server/http/api_error.h"
#include "server/http/field_reader.h"

namespace attnres::server::http {
namespace {

using Json = nlohmann::ordered_json;

std::string indexed(const std::string& list, size_t i) {
  std::string where = list;
  where += '[';
  where += std::to_string(i);
  where += ']';
  return where;
}

// The string at `key` of `object`; a 400 naming `where`.`key` (param `field`) when it is
// missing or not a string.
std::string required_string(const Json& object, const char* key, const std::string& where,
                            const std::string& field) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    std::string message = "field " + where + "." + key + ": ";
    message += it == object.end() || it->is_null()
                   ? std::string("is required (a string)")
                   : "expected a string, got " + json_type_name(*it);
    throw bad_request(message, field);
  }
  return it->get<std::string>();
}

// A text content: a string, or a list of parts whose types are in `text_types` (joined by
// newlines, as the chat path joins text parts).
std::string content_text(const Json& content, const std::string& where, const std::string& field,
                         std::initializer_list<const char*> text_types) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    throw bad_request("field " + where + ": expected a string or a list of content parts, got " +
                          json_type_name(content),
                      field);
  }
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string part_where = indexed(where, j);
    if (!part.is_object()) {
      throw bad_request(
          "field " + part_where + ": expected a content part object, got " + json_type_name(part),
          field);
    }
    const std::string type = required_string(part, "type", part_where, field);
    bool known = false;
    for (const char* t : text_types) known |= type == t;
    if (!known) {
      std::string allowed;
      for (const char* t : text_types)
        allowed += (allowed.empty() ? "\"" : ", \"") + std::string(t) + "\"";
      throw bad_request("field " + part_where + ".type: \"" + type +
                            "\" is not supported (this model takes text only: " + allowed + ")",
                        field);
    }
    if (j > 0) text += '\n';
    text += required_string(part, type == "refusal" ? "refusal" : "text", part_where, field);
  }
  return text;
}

std::string item_type(const Json& item, const std::string& where, const std::string& field) {
  auto type = item.find("type");
  if (type == item.end() || type->is_null()) {
    // EasyInputMessage: {"role", "content"} without a type.
    if (item.contains("role")) return "message";
    throw bad_request("field " + where + ".type: is required", field);
  }
  if (!type->is_string()) {
    throw bad_request("field " + where + ".type: expected a string, got " + json_type_name(*type),
                      field);
  }
  return type->get<std::string>();
}

// A sampling value as the client would write it (0.7, not the float's 0.699999988).
Json float_json(float v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.7g", static_cast<double>(v));
  return std::strtod(text, nullptr);
}

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw bad_request("field " + field + ": " + why, field);
}

// Fields the Responses API defines that would change the output and that this server does
// not implement: refused unless absent or at their no-op value.
void refuse_unimplemented_fields(const FieldReader& f) {
  if (f.boolean("background").value_or(false)) {
    refuse("background", "background responses are not supported; send background: false");
  }
  if (f.has("conversation")) {
    refuse("conversation",
           "conversations are not supported; chain turns with previous_response_id");
  }
  if (f.has("prompt")) refuse("prompt", "prompt templates are not supported");
  if (f.has("moderation")) refuse("moderation", "moderation is not supported");
  if (f.has("image")) refuse("image", "image generation is not supported");
  if (f.has("access_programs"))
    refuse("access_programs", "programmatic tool calling is not supported");
  if (const Json* context = f.find("context_management")) {
    if (!context->is_array() || !context->empty()) {
      refuse("context_management", "context management (compaction) is not supported");
    }
  }
  if (const Json* include = f.find("include")) {
    if (!include->is_array()) {
      refuse("include", "expected a list, got " + json_type_name(*include));
    }
    if (!include->empty()) {
      refuse("include", "no additional output data is available (send an empty list)");
    }
  }
  if (const Json* reasoning = f.find("reasoning")) {
    if (!reasoning->is_object()) {
      refuse("reasoning", "expected an object, got " + json_type_name(*reasoning));
    }
    for (const auto& [key, value] : reasoning->items()) {
      if (!value.is_null()) {
        refuse("reasoning", "reasoning." + key +
                                " is not supported (reasoning effort and summaries cannot be "
                                "controlled on this server)");
      }
    }
  }
  if (auto truncation = f.string("truncation"); truncation && *truncation != "disabled") {
    refuse("truncation", "\"" + *truncation +
                             "\" is not supported; only \"disabled\" (an input longer than the "
                             "context is a 400)");
  }
  if (auto top_logprobs = f.integer("top_logprobs", 0, 20); top_logprobs && *top_logprobs > 0) {
    refuse("top_logprobs", "logprobs are not returned by /v1/responses on this server");
  }
}

// text.format {type: "json_schema", name, schema, description, strict} -> the chat request's
// response_format {type: "json_schema", json_schema: {name, schema, description, strict}}.
Json json_schema_format(const Json& format) {
  auto bad = [](const std::string& key, const std::string& why) {
    return bad_request("field text.format." + key + ": " + why, "text.format");
  };
  Json json_schema = Json::object();
  json_schema["name"] = required_string(format, "name", "text.format", "text.format");
  auto schema = format.find("schema");
  if (schema == format.end() || !schema->is_object()) {
    throw bad("schema", "is required with type \"json_schema\" (a JSON schema object)");
  }
  json_schema["schema"] = *schema;
  for (const auto& [key, value] : format.items()) {
    if (key == "type" || key == "name" || key == "schema" || value.is_null()) continue;
    if (key == "description") {
      if (!value.is_string()) throw bad(key, "expected a string, got " + json_type_name(value));
      json_schema["description"] = value;
    } else if (key == "strict") {
      if (!value.is_boolean()) throw bad(key, "expected a boolean, got " + json_type_name(value));
      json_schema["strict"] = value;
    } else {
      throw bad(key, "is not a json_schema format field (name, schema, description, strict)");
    }
  }
  return {{"type", "json_schema"}, {"json_schema", std::move(json_schema)}};
}

// text: {format: {type: text | json_schema | json_object}, verbosity}. `response_format` is
// set to the chat spelling of a JSON format (left null for text).
Json read_text_config(const FieldReader& f, Json& response_format) {
  Json text = {{"format", {{"type", "text"}}}};
  const Json* given = f.find("text");
  if (!given) return text;
  if (!given->is_object()) refuse("text", "expected an object, got " + json_type_name(*given));
  if (auto format = given->find("format"); format != given->end() && !format->is_null()) {
    if (!format->is_object()) {
      refuse("text.format", "expected an object, got " + json_type_name(*format));
    }
    const std::string type = required_string(*format, "type", "text.format", "text.format");
    if (type == "json_schema") {
      response_format = json_schema_format(*format);
      text["format"] = {{"type", "json_schema"}};
      for (const auto& [key, value] : response_format["json_schema"].items()) {
        text["format"][key] = value;
      }
    } else if (type == "json_object") {
      response_format = {{"type", "json_object"}};
      text["format"] = response_format;
    } else if (type != "text") {
      refuse("text.format",
             "unknown type \"" + type + "\" (one of \"text\", \"json_schema\", \"json_object\")");
    }
  }
  if (auto verbosity = given->find("verbosity");
      verbosity != given->end() && !verbosity->is_null()) {
    if (!verbosity->is_string() || verbosity->get<std::string>() != "medium") {
      refuse("text.verbosity", "only \"medium\" is supported, got " + json_type_name(*verbosity));
    }
    text["verbosity"] = "medium";
  }
  return text;
}

// tool_choice: "auto" | "none" | "required" | {"type": "function", "name"}; hosted-tool and
// allowed_tools choices are refused. Returns the value to echo; `chat` is set to the chat
// request's spelling (left null when absent: "auto").
Json read_tool_choice(const FieldReader& f, const Json& tools, Json& chat) {
  const Json* choice = f.find("tool_choice");
  if (!choice) return "auto";
  if (choice->is_string()) {
    const std::string mode = choice->get<std::string>();
    if (mode == "required" && tools.empty()) {
      refuse("tool_choice", "\"required\" needs at least one tool in tools");
    }
    if (mode == "auto" || mode == "none" || mode == "required") {
      chat = mode;
      return mode;
    }
    refuse("tool_choice",
           "unknown value \"" + mode + "\" (one of \"auto\", \"none\", \"required\")");
  }
  if (!choice->is_object()) {
    refuse("tool_choice", "expected a string or an object, got " + json_type_name(*choice));
  }
  const std::string type = required_string(*choice, "type", "tool_choice", "tool_choice");
  if (type != "function") {
    refuse("tool_choice", "type \"" + type + "\" is not supported (only function tools)");
  }
  const std::string name = required_string(*choice, "name", "tool_choice", "tool_choice");
  bool found = false;
  for (const Json& tool : tools) found |= tool.value("name", "") == name;
  if (!found) refuse("tool_choice", "names the function \"" + name + "\", which is not in tools");
  chat = {{"type", "function"}, {"function", {{"name", name}}}};
  return {{"type", "function"}, {"name", name}};
}

// metadata: at most 16 string pairs (keys up to 64 characters, values up to 512), as OpenAI.
Json read_metadata(const FieldReader& f) {
  const Json* metadata = f.find("metadata");
  if (!metadata) return nullptr;
  if (!metadata->is_object()) {
    refuse("metadata", "expected an object of strings, got " + json_type_name(*metadata));
  }
  if (metadata->size() > 16) refuse("metadata", "at most 16 keys");
  for (const auto& [key, value] : metadata->items()) {
    if (key.size() > 64)
      refuse("metadata", "key \"" + key.substr(0, 64) + "...\" is over 64 characters");
    if (!value.is_string()) {
      refuse("metadata",
             "metadata[\"" + key + "\"]: expected a string, got " + json_type_name(value));
    }
    if (value.get<std::string>().size() > 512) {
      refuse("metadata", "metadata[\"" + key + "\"]: over 512 characters");
    }
  }
  return *metadata;
}

// The sampling extras vLLM's Responses endpoint takes beyond OpenAI's, passed to the chat
// parser, which checks them and names them in its errors.
constexpr const char* kForwardedFields[] = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "ignore_eos",
    "min_tokens",
    "logit_bias",
    "repetition_penalty",
    "user",
    "stream",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "skip_special_tokens",
    "allowed_token_ids",
    "chat_template_kwargs",
};

// A chat parser error about the conversation or the token budget, renamed to the Responses
// fields it came from.
ApiError renamed(const ApiError& e) {
  auto rename = [](std::string text, const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
    return text;
  };
  if (e.param() == "messages")
    return ApiError(e.status(), rename(e.what(), "messages", "input"), "input", e.code());
  if (e.param() == "min_tokens")
    return ApiError(e.status(), rename(e.what(), "max_tokens", "max_output_tokens"), e.param(),
                    e.code());
  if (e.param() == "response_format") {
    const std::string message =
        rename(rename(e.what(), "response_format.json_schema", "text.format"), "response_format",
               "text.format");
    return ApiError(e.status(), message, "text.format", e.code());
  }
  return e;
}

}  // namespace

Json responses_input_items(const Json& input) {
  if (input.is_string()) {
    return Json::array({{{"type", "message"}, {"role", "user"}, {"content", input}}});
  }
  if (!input.is_array()) {
    refuse("input", "expected a string or a list of input items, got " + json_type_name(input));
  }
  if (input.empty()) refuse("input", "must not be empty");
  return input;
}

Json responses_items_to_messages(const Json& items, const std::string& field) {
  Json messages = Json::array();
  std::string reasoning;  // from reasoning items, for the next assistant message
  std::unordered_map<std::string, std::string> call_names;  // call_id -> function name
  auto attach_reasoning = [&reasoning](Json& message) {
    if (!reasoning.empty()) message["reasoning_content"] = std::move(reasoning);
    reasoning.clear();
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const Json& item = items[i];
    const std::string where = indexed(field, i);
    if (!item.is_object()) {
      throw bad_request(
          "field " + where + ": expected an input item object, got " + json_type_name(item), field);
    }
    const std::string type = item_type(item, where, field);
    if (type == "message") {
      std::string role = required_string(item, "role", where, field);
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        throw bad_request("field " + where + ".role: \"" + role +
                              "\" is not one of \"user\", \"system\", \"developer\", \"assistant\"",
                          field);
      }
      auto content = item.find("content");
      if (content == item.end() || content->is_null()) {
        throw bad_request("field " + where + ".content: is required", field);
      }
      Json message;
      message["role"] = role == "developer" ? "system" : role;
      message["content"] =
          role == "assistant"
              ? content_text(*content, where + ".content", field,
                             {"output_text", "input_text", "refusal"})
              : content_text(*content, where + ".content", field, {"input_text", "output_text"});
      if (role == "assistant") attach_reasoning(message);
      messages.push_back(std::move(message));
    } else if (type == "function_call") {
      const std::string call_id = required_string(item, "call_id", where, field);
      const std::string name = required_string(item, "name", where, field);
      Json call = {
          {"id", call_id},
          {"type", "function"},
          {"function",
           {{"name", name}, {"arguments", required_string(item, "arguments", where, field)}}}};
      call_names[call_id] = name;
      // Calls that follow an assistant message (or each other) belong to that turn.
      if (messages.empty() || messages.back()["role"] != "assistant") {
        messages.push_back({{"role", "assistant"}, {"content", ""}});
      }
      Json& turn = messages.back();
      attach_reasoning(turn);
      if (!turn.contains("tool_calls")) turn["tool_calls"] = Json::array();
      turn["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      const std::string call_id = required_string(item, "call_id", where, field);
      auto output = item.find("output");
      if (output == item.end() || output->is_null()) {
        throw bad_request("field " + where + ".output: is required", field);
      }
      Json message = {{"role", "tool"},
                      {"tool_call_id", call_id},
                      {"content", content_text(*output, where + ".output", field, {"input_text"})}};
      if (auto name = call_names.find(call_id); name != call_names.end())
        message["name"] = name->second;
      messages.push_back(std::move(message));
    } else if (type == "reasoning") {
      // The text of a reasoning item this server produced (content), or a summary.
      for (const char* key : {"content", "summary"}) {
        auto parts = item.find(key);
        if (parts == item.end() || parts->is_null()) continue;
        const std::string text =
            content_text(*parts, where + "." + key, field, {"reasoning_text", "summary_text"});
        if (!text.empty()) reasoning += reasoning.empty() ? text : "\n" + text;
        break;
      }
    } else {
      throw bad_request("field " + where + ".type: \"" + type +
                            "\" is not supported (message, function_call, function_call_output "
                            "and reasoning items are)",
                        field);
    }
  }
  return messages;
}

Json responses_tools_to_chat(const Json& tools) {
  if (!tools.is_array()) refuse("tools", "expected a list, got " + json_type_name(tools));
  Json chat = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string where = indexed("tools", i);
    if (!tool.is_object()) {
      throw bad_request("field " + where + ": expected a tool object, got " + json_type_name(tool),
                        "tools");
    }
    const std::string type = required_string(tool, "type", where, "tools");
    if (type != "function") {
      throw bad_request("field " + where + ".type: \"" + type +
                            "\" is not supported: only function tools (type \"function\") run "
                            "on this server",
                        "tools");
    }
    Json function;
    function["name"] = required_string(tool, "name", where, "tools");
    if (auto d = tool.find("description"); d != tool.end() && !d->is_null()) {
      if (!d->is_string()) {
        throw bad_request(
            "field " + where + ".description: expected a string, got " + json_type_name(*d),
            "tools");
      }
      function["description"] = *d;
    }
    if (auto p = tool.find("parameters"); p != tool.end() && !p->is_null()) {
      if (!p->is_object()) {
        throw bad_request("field " + where + ".parameters: expected a JSON schema object, got " +
                              json_type_name(*p),
                          "tools");
      }
      function["parameters"] = *p;
    }
    if (auto s = tool.find("strict"); s != tool.end() && !s->is_null()) {
      if (!s->is_boolean()) {
        throw bad_request(
            "field " + where + ".strict: expected a boolean, got " + json_type_name(*s), "tools");
      }
      function["strict"] = *s;
    }
    chat.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return chat;
}

ResponsesRequest parse_responses_request(const Json& body, const ServerState& state) {
  FieldReader f(body);
  check_model_field(body, state);
  refuse_unimplemented_fields(f);
  ResponsesRequest request;
  Json& echo = request.echo;

  const Json* input = f.find("input");
  if (!input) refuse("input", "is required");
  const Json items = responses_input_items(*input);
  const std::optional<std::string> instructions = f.string("instructions");
  const std::optional<std::string> previous = f.string("previous_response_id");
  if (previous) {
    std::optional<StoredResponse> stored = state.response_store().get(*previous);
    if (!stored) {
      throw ApiError(404,
                     "Previous response with id '" + *previous +
                         "' not found: it was never stored (store: false), or it was evicted from "
                         "this server's store of the " +
                         std::to_string(state.response_store().capacity()) +
                         " most recent responses, or the server restarted",
                     "previous_response_id", "previous_response_not_found");
    }
    request.conversation = std::move(stored->conversation);
  }
  for (const Json& item : items) request.conversation.push_back(item);
  // Instructions are this turn's only: a previous response's are not carried over (OpenAI).
  Json messages = Json::array();
  if (instructions) messages.push_back({{"role", "system"}, {"content", *instructions}});
  for (Json& m : responses_items_to_messages(request.conversation, "input")) {
    messages.push_back(std::move(m));
  }

  Json tools = Json::array();
  if (const Json* t = f.find("tools")) tools = *t;
  const Json chat_tools = responses_tools_to_chat(tools);
  Json chat_tool_choice;
  const Json tool_choice = read_tool_choice(f, tools, chat_tool_choice);
  request.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
  if (auto v = f.integer("max_tool_calls", 1, INT32_MAX)) request.max_tool_calls = int(*v);
  request.store = f.boolean("store").value_or(true);
  Json response_format;
  const Json text = read_text_config(f, response_format);
  const Json metadata = read_metadata(f);
  const std::optional<int64_t> max_output_tokens = f.integer("max_output_tokens", 1, INT32_MAX);

  Json chat_body = Json::object();
  if (const Json* model = f.find("model")) chat_body["model"] = *model;
  chat_body["messages"] = std::move(messages);
  // As on the chat path, tool_choice "none" still shows the tools to the template and parses
  // no calls.
  if (!chat_tools.empty()) chat_body["tools"] = chat_tools;
  if (!chat_tool_choice.is_null()) chat_body["tool_choice"] = chat_tool_choice;
  chat_body["parallel_tool_calls"] = request.parallel_tool_calls;
  if (!response_format.is_null()) chat_body["response_format"] = response_format;
  if (max_output_tokens) chat_body["max_tokens"] = *max_output_tokens;
  for (const char* name : kForwardedFields) {
    if (const Json* v = f.find(name)) chat_body[name] = *v;
  }
  try {
    request.chat = parse_chat_request(chat_body, state);
  } catch (const ApiError& e) {
    throw renamed(e);
  }
  // The engine names the field in a schema it cannot compile.
  if (auto& constraint = request.chat.options.params.constraint;
      constraint && constraint->field == "response_format") {
    constraint->field = "text.format";
  }

  const SamplingParams& params = request.chat.options.params;
  echo["instructions"] = instructions ? Json(*instructions) : Json(nullptr);
  echo["max_output_tokens"] = max_output_tokens ? Json(*max_output_tokens) : Json(nullptr);
  echo["max_tool_calls"] = request.max_tool_calls ? Json(*request.max_tool_calls) : Json(nullptr);
  echo["parallel_tool_calls"] = request.parallel_tool_calls;
  echo["previous_response_id"] = previous ? Json(*previous) : Json(nullptr);
  echo["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  echo["service_tier"] = "default";
  echo["store"] = request.store;
  echo["temperature"] = float_json(params.temperature);
  echo["text"] = text;
  echo["tool_choice"] = tool_choice;
  echo["tools"] = tools;
  echo["top_p"] = float_json(params.top_p);
  echo["truncation"] = "disabled";
  echo["user"] = f.has("user") ? Json(*f.string("user")) : Json(nullptr);
  echo["metadata"] = metadata.is_null() ? Json::object() : metadata;
  return request;
}

}  // namespace attnres::server::http
