// A parsed chat answer in the OpenAI / vLLM shapes: the message fields, the streamed deltas
// (a call's id and name in a delta of their own, before its argument fragments) and the
// finish reason.
#include "server/http/chat_answer_json.h"

#include <gtest/gtest.h>

namespace attnres::server::http {
namespace {

const ChatAnswerFormat kQwen3{ReasoningFormat::Qwen3, PromptThinking::Unopened,
                              ToolCallFormat::Hermes};

TEST(ChatAnswerJson, MessageWithCallsAndReasoning) {
  ChatAnswer answer;
  answer.reasoning = "hm";
  answer.calls.push_back({"call_a", "f", "{\"x\": 1}"});
  Json message;
  set_message_answer(message, answer, kQwen3, /*include_reasoning=*/true);
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["reasoning_content"], "hm");
  EXPECT_EQ(message["reasoning"], "hm");
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0], Json::parse(R"({"id": "call_a", "type": "function",
                            "function": {"name": "f", "arguments": "{\"x\": 1}"}})"));
  Json hidden;
  set_message_answer(hidden, answer, kQwen3, /*include_reasoning=*/false);
  EXPECT_TRUE(hidden["reasoning_content"].is_null());
}

TEST(ChatAnswerJson, PlainFormatKeepsTheOldShape) {
  ChatAnswer answer;
  answer.content = "hello";
  Json message;
  set_message_answer(message, answer, ChatAnswerFormat{}, true);
  EXPECT_EQ(message, Json::parse(R"({"content": "hello"})"));
}

TEST(ChatAnswerJson, DeltasPutEachCallPieceInItsOwnDelta) {
  ChatAnswerDelta d;
  d.reasoning = "r";
  d.content = "c";
  d.calls.push_back({0, "call_a", "f", ""});
  d.calls.push_back({0, std::nullopt, std::nullopt, "{\"x\""});
  const std::vector<Json> deltas = chat_answer_deltas(d, /*include_reasoning=*/true);
  ASSERT_EQ(deltas.size(), 3u);
  EXPECT_EQ(deltas[0], Json::parse(R"({"reasoning_content": "r", "reasoning": "r",
                                       "content": "c"})"));
  EXPECT_EQ(deltas[1], Json::parse(R"({"tool_calls": [{"index": 0, "id": "call_a",
      "type": "function", "function": {"name": "f", "arguments": ""}}]})"));
  EXPECT_EQ(deltas[2],
            Json::parse(R"({"tool_calls": [{"index": 0, "function": {"arguments": "{\"x\""}}]})"));
  EXPECT_EQ(chat_answer_deltas(d, /*include_reasoning=*/false)[0],
            Json::parse(R"({"content": "c"})"));
  EXPECT_TRUE(chat_answer_deltas(ChatAnswerDelta{}, true).empty());
}

TEST(ChatAnswerJson, FinishReason) {
  EXPECT_EQ(chat_finish_reason_json(FinishReason::Stop, true), "tool_calls");
  EXPECT_EQ(chat_finish_reason_json(FinishReason::Stop, false), "stop");
  EXPECT_EQ(chat_finish_reason_json(FinishReason::Length, true), "length");
  EXPECT_TRUE(chat_finish_reason_json(FinishReason::None, true).is_null());
}

}  // namespace
}  // namespace attnres::server::http
