// Reasoning then tool calls in one answer, streamed in every two-piece split and whole.
#include "server/common/chat_answer.h"

#include <gtest/gtest.h>

namespace attnres::server {
namespace {

ToolCallIdMaker counter_ids() {
  auto next = std::make_shared<int>(0);
  return [next] { return "call_" + std::to_string((*next)++); };
}

struct Assembled {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

Assembled stream(const ChatAnswerFormat& format, const std::vector<std::string_view>& pieces) {
  ChatAnswerStream s(format, counter_ids());
  Assembled a;
  auto add = [&](const ChatAnswerDelta& d) {
    a.reasoning += d.reasoning;
    a.content += d.content;
    for (const ToolCallDelta& c : d.calls) {
      if (c.id) a.calls.push_back({*c.id, *c.name, ""});
      a.calls[static_cast<size_t>(c.index)].arguments += c.arguments;
    }
  };
  for (std::string_view p : pieces) add(s.push(p));
  add(s.finish());
  return a;
}

TEST(ChatAnswer, ReasoningThenToolCall) {
  const ChatAnswerFormat format{ReasoningFormat::Qwen3, PromptThinking::Unopened,
                                ToolCallFormat::Hermes};
  const std::string text =
      "<think>\nI need the weather; no <tool_call> here.\n</think>\n\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  const ChatAnswer whole = parse_chat_answer(format, text, counter_ids());
  EXPECT_EQ(whole.reasoning, "\nI need the weather; no <tool_call> here.\n");
  EXPECT_EQ(whole.content, std::nullopt);
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.calls[0].name, "get_weather");
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const Assembled a =
        stream(format, {std::string_view(text).substr(0, cut), std::string_view(text).substr(cut)});
    EXPECT_EQ(a.reasoning, *whole.reasoning) << cut;
    EXPECT_EQ(a.content, "") << cut;
    ASSERT_EQ(a.calls.size(), 1u) << cut;
    EXPECT_EQ(a.calls[0].id, whole.calls[0].id);
    EXPECT_EQ(a.calls[0].arguments, whole.calls[0].arguments) << cut;
  }
}

TEST(ChatAnswer, WithoutParsersTheTextIsContentAsIs) {
  const ChatAnswer a = parse_chat_answer({}, "<think>x</think><tool_call>{}</tool_call>");
  EXPECT_EQ(a.content, "<think>x</think><tool_call>{}</tool_call>");
  EXPECT_EQ(a.reasoning, std::nullopt);
  EXPECT_TRUE(a.calls.empty());
  EXPECT_EQ(parse_chat_answer({}, "").content, "");
}

TEST(ChatAnswer, ToolCallsNotParsedStayContentAfterReasoning) {
  const ChatAnswerFormat format{ReasoningFormat::Qwen3, PromptThinking::Open, ToolCallFormat::None};
  const ChatAnswer a = parse_chat_answer(format, "hm</think><tool_call>{}</tool_call>");
  EXPECT_EQ(a.reasoning, "hm");
  EXPECT_EQ(a.content, "<tool_call>{}</tool_call>");
}

TEST(ChatAnswer, FirstCallOnlyDropsTheOtherCallsStreamedAndWhole) {
  ChatAnswerFormat format{ReasoningFormat::None, PromptThinking::Unopened, ToolCallFormat::Hermes};
  format.first_call_only = true;
  const std::string text =
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
      "<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}</tool_call>";
  const ChatAnswer whole = parse_chat_answer(format, text, counter_ids());
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.calls[0].name, "a");
  EXPECT_EQ(whole.content, std::nullopt);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const Assembled a =
        stream(format, {std::string_view(text).substr(0, cut), std::string_view(text).substr(cut)});
    ASSERT_EQ(a.calls.size(), 1u) << cut;
    EXPECT_EQ(a.calls[0].name, "a");
    EXPECT_EQ(a.calls[0].arguments, "{}");
    EXPECT_EQ(a.content, "");
  }
}

}  // namespace
}  // namespace attnres::server
