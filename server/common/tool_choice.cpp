#include "server/common/tool_choice.h"

#include "server/common/request_error.h"

namespace attnres::server {
namespace {

using Json = nlohmann::ordered_json;

RequestError bad(const std::string& message, const std::string& param) {
  return RequestError(Refusal::InvalidArgument, message, param);
}

std::string type_of(const Json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "a list";
  return "an object";
}

// A call's opening and closing text in each syntax, around the arguments.
struct CallSyntax {
  std::string begin;
  std::string end;
  std::string separator;  // between parallel calls
};

CallSyntax call_syntax(ToolCallFormat format, const std::string& name) {
  // The name as a JSON string literal, exactly as the template writes it.
  const std::string quoted = Json(name).dump(-1, ' ', false);
  switch (format) {
    case ToolCallFormat::Hermes:
      return {"<tool_call>\n{\"name\": " + quoted + ", \"arguments\": ", "}\n</tool_call>", "\n"};
    case ToolCallFormat::Llama3Json:
      return {"{\"name\": " + quoted + ", \"parameters\": ", "}", "; "};
    case ToolCallFormat::Mistral:
      return {"[TOOL_CALLS][{\"name\": " + quoted + ", \"arguments\": ", "}]", ""};
    case ToolCallFormat::None:
      break;
  }
  throw Error("forced_tool_call_constraint: no tool-call syntax");
}

}  // namespace

std::vector<ToolFunction> read_tools(const Json& tools) {
  std::vector<ToolFunction> functions;
  if (tools.is_null()) return functions;
  if (!tools.is_array()) throw bad("field tools: expected a list, got " + type_of(tools), "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string where = "field tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) {
      throw bad(where + ": expected an object {\"type\": \"function\", \"function\": {...}}, got " +
                    type_of(tool),
                "tools");
    }
    auto type = tool.find("type");
    if (type == tool.end() || !type->is_string() || type->get<std::string>() != "function") {
      throw bad(where + ".type: expected \"function\" (the only tool type chat completions take)",
                "tools");
    }
    auto function = tool.find("function");
    if (function == tool.end() || !function->is_object()) {
      throw bad(where + ".function: expected an object with a \"name\"", "tools");
    }
    auto name = function->find("name");
    if (name == function->end() || !name->is_string() || name->get<std::string>().empty()) {
      throw bad(where + ".function.name: expected a non-empty string", "tools");
    }
    ToolFunction f;
    f.name = name->get<std::string>();
    auto parameters = function->find("parameters");
    if (parameters == function->end() || parameters->is_null()) {
      f.parameters = Json{{"type", "object"}};
    } else if (!parameters->is_object()) {
      throw bad(where + ".function.parameters: expected a JSON schema object, got " +
                    type_of(*parameters),
                "tools");
    } else {
      f.parameters = *parameters;
    }
    functions.push_back(std::move(f));
  }
  return functions;
}

ToolChoice read_tool_choice(const Json& tool_choice, const std::vector<ToolFunction>& tools) {
  ToolChoice choice;
  if (tool_choice.is_null()) {
    choice.mode = tools.empty() ? ToolChoiceMode::None : ToolChoiceMode::Auto;
    return choice;
  }
  if (tool_choice.is_string()) {
    const std::string mode = tool_choice.get<std::string>();
    if (mode == "none") {
      choice.mode = ToolChoiceMode::None;
    } else if (mode == "auto") {
      choice.mode = ToolChoiceMode::Auto;
    } else if (mode == "required") {
      if (tools.empty()) {
        throw bad("field tool_choice: \"required\" needs at least one tool in \"tools\"",
                  "tool_choice");
      }
      choice.mode = ToolChoiceMode::Required;
    } else {
      throw bad(
          "field tool_choice: expected \"none\", \"auto\", \"required\" or {\"type\": "
          "\"function\", \"function\": {\"name\": ...}}, got \"" +
              mode + "\"",
          "tool_choice");
    }
    return choice;
  }
  if (!tool_choice.is_object()) {
    throw bad("field tool_choice: expected a string or an object, got " + type_of(tool_choice),
              "tool_choice");
  }
  auto function = tool_choice.find("function");
  auto name = function != tool_choice.end() && function->is_object() ? function->find("name")
                                                                     : tool_choice.end();
  if (function == tool_choice.end() || !function->is_object() || name == function->end() ||
      !name->is_string()) {
    throw bad("field tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}",
              "tool_choice");
  }
  choice.mode = ToolChoiceMode::Named;
  choice.name = name->get<std::string>();
  for (const ToolFunction& f : tools) {
    if (f.name == choice.name) return choice;
  }
  throw bad("field tool_choice: names the function \"" + choice.name +
                "\", which is not one of the request's tools",
            "tool_choice");
}

OutputConstraint forced_tool_call_constraint(ToolCallFormat format,
                                             const std::vector<ToolFunction>& tools,
                                             const ToolChoice& choice, bool parallel) {
  Json tags = Json::array();
  std::string separator;
  for (const ToolFunction& f : tools) {
    if (choice.mode == ToolChoiceMode::Named && f.name != choice.name) continue;
    const CallSyntax syntax = call_syntax(format, f.name);
    separator = syntax.separator;
    // At most one whitespace character between JSON tokens: room for the `{"a": 1, "b": 2}`
    // that templates write, none for padding that never ends (xgrammar's structural-tag JSON
    // otherwise takes any amount).
    Json content = {
        {"type", "json_schema"}, {"json_schema", f.parameters}, {"max_whitespace_cnt", 1}};
    tags.push_back(Json{{"type", "tag"},
                        {"begin", syntax.begin},
                        {"content", std::move(content)},
                        {"end", syntax.end}});
    if (choice.mode == ToolChoiceMode::Named) break;
  }
  // Only calls: at least one, separated as the template separates them; the sequence ending
  // is the answer ending (the constraint then allows only the end-of-sequence token).
  Json format_json = {{"type", "tags_with_separator"},
                      {"tags", std::move(tags)},
                      {"separator", separator},
                      {"at_least_one", true},
                      {"stop_after_first", !parallel || choice.mode == ToolChoiceMode::Named}};
  OutputConstraint constraint;
  constraint.kind = ConstraintKind::StructuralTag;
  constraint.spec = Json{{"type", "structural_tag"}, {"format", std::move(format_json)}}.dump();
  return constraint;
}

}  // namespace attnres::server
