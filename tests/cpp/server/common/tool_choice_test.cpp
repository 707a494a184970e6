// tools / tool_choice checking and the structural tag that forces calls: its JSON is checked
// field by field (what xgrammar compiles), and the text it describes is checked to parse back
// through the same format's tool-call parser.
#include "server/common/tool_choice.h"

#include <gtest/gtest.h>

#include "server/common/request_error.h"

namespace attnres::server {
namespace {

using Json = nlohmann::ordered_json;

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "now"}}
])");

std::string refusal_param(const std::function<void()>& f) {
  try {
    f();
  } catch (const RequestError& e) {
    EXPECT_EQ(e.refusal(), Refusal::InvalidArgument);
    return e.param();
  }
  return "(no error)";
}

TEST(ReadTools, FunctionsWithTheirSchemas) {
  const std::vector<ToolFunction> tools = read_tools(kTools);
  ASSERT_EQ(tools.size(), 2u);
  EXPECT_EQ(tools[0].name, "get_weather");
  EXPECT_EQ(tools[0].parameters["required"], Json::array({"city"}));
  EXPECT_EQ(tools[1].name, "now");
  EXPECT_EQ(tools[1].parameters, Json({{"type", "object"}}));
  EXPECT_TRUE(read_tools(nullptr).empty());
}

TEST(ReadTools, MalformedToolsAre400sNamingTools) {
  for (const char* bad :
       {R"({"type": "function"})", R"([3])", R"([{"type": "retrieval"}])",
        R"([{"type": "function"}])", R"([{"type": "function", "function": {}}])",
        R"([{"type": "function", "function": {"name": "f", "parameters": 1}}])"}) {
    EXPECT_EQ(refusal_param([&] { read_tools(Json::parse(bad)); }), "tools") << bad;
  }
}

TEST(ReadToolChoice, ModesAndDefaults) {
  const std::vector<ToolFunction> tools = read_tools(kTools);
  EXPECT_EQ(read_tool_choice(nullptr, tools).mode, ToolChoiceMode::Auto);
  EXPECT_EQ(read_tool_choice(nullptr, {}).mode, ToolChoiceMode::None);
  EXPECT_EQ(read_tool_choice("none", tools).mode, ToolChoiceMode::None);
  EXPECT_EQ(read_tool_choice("auto", tools).mode, ToolChoiceMode::Auto);
  EXPECT_EQ(read_tool_choice("required", tools).mode, ToolChoiceMode::Required);
  const ToolChoice named =
      read_tool_choice(Json::parse(R"({"type": "function", "function": {"name": "now"}})"), tools);
  EXPECT_EQ(named.mode, ToolChoiceMode::Named);
  EXPECT_EQ(named.name, "now");
}

TEST(ReadToolChoice, ImpossibleChoicesAre400sNamingToolChoice) {
  const std::vector<ToolFunction> tools = read_tools(kTools);
  EXPECT_EQ(refusal_param([&] { read_tool_choice("required", {}); }), "tool_choice");
  EXPECT_EQ(refusal_param([&] {
              read_tool_choice(Json::parse(R"({"type": "function", "function": {"name": "x"}})"),
                               tools);
            }),
            "tool_choice");
  EXPECT_EQ(refusal_param([&] { read_tool_choice("always", tools); }), "tool_choice");
  EXPECT_EQ(refusal_param([&] { read_tool_choice(3, tools); }), "tool_choice");
  EXPECT_EQ(refusal_param([&] { read_tool_choice(Json::parse(R"({"type": "function"})"), tools); }),
            "tool_choice");
}

// The text a tag describes, with `arguments` in it.
std::string tag_text(const Json& tag, const std::string& arguments) {
  return tag["begin"].get<std::string>() + arguments + tag["end"].get<std::string>();
}

TEST(ForcedToolCallConstraint, RequiredOffersEveryFunctionInTheTemplateSyntax) {
  const std::vector<ToolFunction> tools = read_tools(kTools);
  const OutputConstraint c = forced_tool_call_constraint(
      ToolCallFormat::Hermes, tools, read_tool_choice("required", tools), /*parallel=*/true);
  EXPECT_EQ(c.kind, ConstraintKind::StructuralTag);
  EXPECT_FALSE(c.enforce_after_token.has_value());
  const Json spec = Json::parse(c.spec);
  EXPECT_EQ(spec["type"], "structural_tag");
  const Json& format = spec["format"];
  EXPECT_EQ(format["type"], "tags_with_separator");
  EXPECT_EQ(format["at_least_one"], true);
  EXPECT_EQ(format["stop_after_first"], false);
  EXPECT_EQ(format["separator"], "\n");
  ASSERT_EQ(format["tags"].size(), 2u);
  const Json& weather = format["tags"][0];
  EXPECT_EQ(weather["type"], "tag");
  EXPECT_EQ(weather["begin"], "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_EQ(weather["end"], "}\n</tool_call>");
  EXPECT_EQ(weather["content"]["type"], "json_schema");
  EXPECT_EQ(weather["content"]["json_schema"], tools[0].parameters);
  EXPECT_EQ(weather["content"]["max_whitespace_cnt"], 1);
  // Two calls as the constraint lays them out parse back into those two calls.
  const std::string text = tag_text(format["tags"][0], "{\"city\": \"Oslo\"}") + "\n" +
                           tag_text(format["tags"][1], "{}");
  const ParsedToolCalls parsed = parse_tool_calls(ToolCallFormat::Hermes, text);
  EXPECT_EQ(parsed.content, std::nullopt);
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(parsed.calls[0].arguments, "{\"city\": \"Oslo\"}");
  EXPECT_EQ(parsed.calls[1].name, "now");
}

TEST(ForcedToolCallConstraint, NamedAndNotParallelAllowOneCall) {
  const std::vector<ToolFunction> tools = read_tools(kTools);
  const ToolChoice named =
      read_tool_choice(Json::parse(R"({"type": "function", "function": {"name": "now"}})"), tools);
  const Json format = Json::parse(
      forced_tool_call_constraint(ToolCallFormat::Hermes, tools, named, true).spec)["format"];
  ASSERT_EQ(format["tags"].size(), 1u);
  EXPECT_EQ(format["tags"][0]["begin"], "<tool_call>\n{\"name\": \"now\", \"arguments\": ");
  EXPECT_EQ(format["stop_after_first"], true);
  const Json required = Json::parse(forced_tool_call_constraint(ToolCallFormat::Hermes, tools,
                                                                read_tool_choice("required", tools),
                                                                /*parallel=*/false)
                                        .spec)["format"];
  EXPECT_EQ(required["stop_after_first"], true);
  EXPECT_EQ(required["tags"].size(), 2u);
}

TEST(ForcedToolCallConstraint, EachFormatsSyntaxParsesBack) {
  const std::vector<ToolFunction> tools = read_tools(Json::parse(
      R"([{"type": "function", "function": {"name": "say \"hi\" ☀", "parameters":
          {"type": "object"}}}])"));
  for (ToolCallFormat format :
       {ToolCallFormat::Hermes, ToolCallFormat::Llama3Json, ToolCallFormat::Mistral}) {
    const Json spec = Json::parse(
        forced_tool_call_constraint(format, tools, read_tool_choice("required", tools), true).spec);
    const Json& tag = spec["format"]["tags"][0];
    const ParsedToolCalls parsed = parse_tool_calls(format, tag_text(tag, "{\"a\": [1]}"));
    ASSERT_EQ(parsed.calls.size(), 1u) << tool_call_format_name(format);
    EXPECT_EQ(parsed.calls[0].name, "say \"hi\" ☀");
    EXPECT_EQ(parsed.calls[0].arguments, "{\"a\": [1]}");
    EXPECT_EQ(parsed.content, std::nullopt);
  }
}

}  // namespace
}  // namespace attnres::server
