// The tool-call parsers over whole answers and streams. Every stream test feeds the text in
// every two-piece split (and one character at a time) and checks that the deltas assemble to
// the whole answer's content and calls, so no marker split can leak into content or lose text.
#include "server/common/tool_call_parser.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace attnres::server {
namespace {

ToolCallIdMaker counter_ids() {
  auto next = std::make_shared<int>(0);
  return [next] { return "call_" + std::to_string((*next)++); };
}

ParsedToolCalls parse(ToolCallFormat format, std::string_view text) {
  return parse_tool_calls(format, text, counter_ids());
}

// What a client builds from the deltas of one stream.
struct Assembled {
  std::string content;
  std::vector<ToolCall> calls;
};

void apply(const ToolStreamDelta& d, Assembled& a) {
  a.content += d.content;
  for (const ToolCallDelta& c : d.calls) {
    if (c.id) {
      ASSERT_EQ(c.index, static_cast<int>(a.calls.size())) << "calls start in order";
      ASSERT_TRUE(c.name.has_value()) << "a call's first delta names it";
      EXPECT_EQ(c.arguments, "") << "a call's first delta has empty arguments";
      a.calls.push_back({*c.id, *c.name, ""});
    } else {
      ASSERT_LT(c.index, static_cast<int>(a.calls.size())) << "fragment before its call";
      EXPECT_FALSE(c.name.has_value());
      a.calls[static_cast<size_t>(c.index)].arguments += c.arguments;
    }
  }
}

Assembled stream(ToolCallFormat format, const std::vector<std::string_view>& pieces) {
  ToolCallStreamParser parser(format, counter_ids());
  Assembled a;
  for (std::string_view p : pieces) apply(parser.push(p), a);
  apply(parser.finish(), a);
  return a;
}

void expect_same(const Assembled& streamed, const ParsedToolCalls& whole, const std::string& how) {
  EXPECT_EQ(streamed.content, whole.content.value_or("")) << how;
  ASSERT_EQ(streamed.calls.size(), whole.calls.size()) << how;
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    EXPECT_EQ(streamed.calls[i].id, whole.calls[i].id) << how;
    EXPECT_EQ(streamed.calls[i].name, whole.calls[i].name) << how;
    EXPECT_EQ(streamed.calls[i].arguments, whole.calls[i].arguments) << how;
  }
}

// Streams `text` whole, in every two-piece split and one byte at a time: each must assemble
// to parse()'s answer. Only for well-formed answers (a malformed call is content only whole).
void expect_streams_match(ToolCallFormat format, std::string_view text) {
  const ParsedToolCalls whole = parse(format, text);
  expect_same(stream(format, {text}), whole, "in one piece");
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    expect_same(stream(format, {text.substr(0, cut), text.substr(cut)}), whole,
                "split at " + std::to_string(cut));
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  expect_same(stream(format, bytes), whole, "byte by byte");
}

TEST(ToolCallFormat, NamesAndTemplateDetection) {
  EXPECT_EQ(tool_call_format_from_name("hermes"), ToolCallFormat::Hermes);
  EXPECT_EQ(tool_call_format_from_name("llama3_json"), ToolCallFormat::Llama3Json);
  EXPECT_EQ(tool_call_format_from_name("mistral"), ToolCallFormat::Mistral);
  EXPECT_EQ(tool_call_format_from_name("none"), ToolCallFormat::None);
  EXPECT_EQ(tool_call_format_from_name("pythonic"), std::nullopt);
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::Llama3Json), "llama3_json");
  EXPECT_EQ(detect_tool_call_format("{{- '<tool_call>\\n' }}{{ tool | tojson }}"),
            ToolCallFormat::Hermes);
  EXPECT_EQ(detect_tool_call_format("{{ '[TOOL_CALLS][' }}"), ToolCallFormat::Mistral);
  EXPECT_EQ(detect_tool_call_format("<|start_header_id|>ipython ... <|python_tag|>"),
            ToolCallFormat::Llama3Json);
  EXPECT_EQ(detect_tool_call_format("{{ message.content }}"), ToolCallFormat::None);
}

TEST(ToolCallIds, RandomIdsLookLikeOpenAIs) {
  const std::string a = random_tool_call_id(), b = random_tool_call_id();
  EXPECT_EQ(a.rfind("call_", 0), 0u);
  EXPECT_EQ(a.size(), 29u);
  EXPECT_NE(a, b);
}

TEST(HermesToolCalls, OneCallWithTextBefore) {
  const std::string text =
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": [1, 2]}}\n</tool_call>";
  const ParsedToolCalls p = parse(ToolCallFormat::Hermes, text);
  EXPECT_EQ(p.content, "Let me look.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].id, "call_0");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\", \"days\": [1, 2]}");
  expect_streams_match(ToolCallFormat::Hermes, text);
}

TEST(HermesToolCalls, ParallelCallsAndNoContent) {
  const std::string text =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"b\", \"arguments\": {\"x\": \"}{\\\" </tool_call\"}}\n</tool_call>";
  const ParsedToolCalls p = parse(ToolCallFormat::Hermes, text);
  EXPECT_EQ(p.content, std::nullopt);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "a");
  EXPECT_EQ(p.calls[0].arguments, "{}");
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(nlohmann::json::parse(p.calls[1].arguments)["x"], "}{\" </tool_call");
  expect_streams_match(ToolCallFormat::Hermes, text);
}

TEST(HermesToolCalls, PlainAnswerIsContent) {
  const std::string text = "No tools needed: 2 < 3, and <tool is not a tag.";
  const ParsedToolCalls p = parse(ToolCallFormat::Hermes, text);
  EXPECT_EQ(p.content, text);
  EXPECT_TRUE(p.calls.empty());
  expect_streams_match(ToolCallFormat::Hermes, text);
}

TEST(HermesToolCalls, UnicodeNamesAndArguments) {
  const std::string text =
      "Voilà ☀\n<tool_call>\n{\"name\": \"météo\", \"arguments\": {\"ville\": \"Zürich 東京 "
      "🌧\"}}"
      "\n</tool_call>\n";
  const ParsedToolCalls p = parse(ToolCallFormat::Hermes, text);
  EXPECT_EQ(p.content, "Voilà ☀");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "météo");
  EXPECT_EQ(nlohmann::json::parse(p.calls[0].arguments)["ville"], "Zürich 東京 🌧");
  expect_streams_match(ToolCallFormat::Hermes, text);
}

TEST(HermesToolCalls, ArgumentsBeforeNameStillParse) {
  const std::string text =
      "<tool_call>{\"arguments\": {\"q\": 1}, \"name\": \"search\"}</tool_call>";
  const ParsedToolCalls p = parse(ToolCallFormat::Hermes, text);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "search");
  EXPECT_EQ(p.calls[0].arguments, "{\"q\":1}");
  expect_streams_match(ToolCallFormat::Hermes, text);
}

TEST(HermesToolCalls, InvalidJsonMakesTheWholeAnswerContent) {
  for (const std::string text : {
           "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": tru}}\n</tool_call>",
           "<tool_call>not json at all</tool_call>",
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}</tool_call>",
           "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ",  // cut off mid-call
       }) {
    const ParsedToolCalls p = parse(ToolCallFormat::Hermes, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

TEST(HermesToolCalls, NotAJsonCallStreamsAsContent) {
  // The header never matches, so nothing was sent as a call: the block streams as content.
  const std::string text = "A <tool_call>not json</tool_call> B";
  Assembled a = stream(ToolCallFormat::Hermes, {text.substr(0, 9), text.substr(9)});
  EXPECT_TRUE(a.calls.empty());
  EXPECT_EQ(a.content, "A<tool_call>not json</tool_call>B");
}

TEST(HermesToolCalls, StreamSendsNameBeforeArguments) {
  ToolCallStreamParser parser(ToolCallFormat::Hermes, counter_ids());
  EXPECT_TRUE(parser.push("<tool_").empty());
  EXPECT_TRUE(parser.push("call>\n{\"name\": \"get_wea").empty());
  ToolStreamDelta d = parser.push("ther\", \"arguments\": {\"ci");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].id, "call_0");
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, "");
  EXPECT_EQ(d.calls[1].arguments, "{\"ci");
  d = parser.push("ty\": \"Oslo\"}}\n</tool_");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, "ty\": \"Oslo\"}");
  EXPECT_TRUE(parser.push("call>").empty());
  EXPECT_TRUE(parser.finish().empty());
}

TEST(Llama3JsonToolCalls, CallsWithAndWithoutPythonTag) {
  for (const std::string text : {
           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
           "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
       }) {
    const ParsedToolCalls p = parse(ToolCallFormat::Llama3Json, text);
    EXPECT_EQ(p.content, std::nullopt) << text;
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Rome\"}");
    expect_streams_match(ToolCallFormat::Llama3Json, text);
  }
}

TEST(Llama3JsonToolCalls, SeveralCallsSeparatedBySemicolons) {
  const std::string text =
      "{\"name\": \"a\", \"arguments\": {\"n\": 1}}; {\"name\": \"b\", \"parameters\": {}}";
  const ParsedToolCalls p = parse(ToolCallFormat::Llama3Json, text);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "a");
  EXPECT_EQ(p.calls[0].arguments, "{\"n\": 1}");
  EXPECT_EQ(p.calls[1].name, "b");
  expect_streams_match(ToolCallFormat::Llama3Json, text);
}

TEST(Llama3JsonToolCalls, AnswerNotStartingWithACallIsContent) {
  const std::string text = "The answer is {\"name\": \"x\"}.";
  const ParsedToolCalls p = parse(ToolCallFormat::Llama3Json, text);
  EXPECT_EQ(p.content, text);
  EXPECT_TRUE(p.calls.empty());
  expect_streams_match(ToolCallFormat::Llama3Json, text);
}

TEST(MistralToolCalls, ListFormat) {
  const std::string text =
      "Sure.[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, "
      "{\"name\": \"neg\", \"arguments\": {\"a\": -1.5e3}}]";
  const ParsedToolCalls p = parse(ToolCallFormat::Mistral, text);
  EXPECT_EQ(p.content, "Sure.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "add");
  EXPECT_EQ(p.calls[0].arguments, "{\"a\": 1, \"b\": 2}");
  EXPECT_EQ(p.calls[1].arguments, "{\"a\": -1.5e3}");
  expect_streams_match(ToolCallFormat::Mistral, text);
}

TEST(MistralToolCalls, NameArgsFormat) {
  const std::string text =
      "[TOOL_CALLS]add[ARGS]{\"a\": 1, \"b\": 2}[TOOL_CALLS]neg[ARGS]{\"a\": \"[ARGS]\"}";
  const ParsedToolCalls p = parse(ToolCallFormat::Mistral, text);
  EXPECT_EQ(p.content, std::nullopt);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "add");
  EXPECT_EQ(p.calls[0].arguments, "{\"a\": 1, \"b\": 2}");
  EXPECT_EQ(p.calls[1].name, "neg");
  EXPECT_EQ(p.calls[1].arguments, "{\"a\": \"[ARGS]\"}");
  expect_streams_match(ToolCallFormat::Mistral, text);
}

TEST(MistralToolCalls, PlainAnswerIsContent) {
  const std::string text = "Just text with a [TOOL bracket.";
  const ParsedToolCalls p = parse(ToolCallFormat::Mistral, text);
  EXPECT_EQ(p.content, text);
  expect_streams_match(ToolCallFormat::Mistral, text);
}

}  // namespace
}  // namespace attnres::server
