// The reasoning parsers over whole answers and streams (every two-piece split, and byte by
// byte: the streamed pieces must assemble to the whole answer's parts).
#include "server/common/reasoning_parser.h"

#include <gtest/gtest.h>

namespace attnres::server {
namespace {

struct Parts {
  std::string reasoning;
  std::string content;
};

Parts stream(ReasoningFormat format, PromptThinking prompt,
             const std::vector<std::string_view>& pieces) {
  ReasoningStreamParser parser(format, prompt);
  Parts parts;
  auto add = [&](const ReasoningDelta& d) {
    parts.reasoning += d.reasoning;
    parts.content += d.content;
  };
  for (std::string_view p : pieces) add(parser.push(p));
  add(parser.finish());
  return parts;
}

void expect_streams_match(ReasoningFormat format, PromptThinking prompt, std::string_view text) {
  const ParsedReasoning whole = parse_reasoning(format, prompt, text);
  auto check = [&](const Parts& p, const std::string& how) {
    EXPECT_EQ(p.reasoning, whole.reasoning.value_or("")) << how;
    EXPECT_EQ(p.content, whole.content.value_or("")) << how;
  };
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    check(stream(format, prompt, {text.substr(0, cut), text.substr(cut)}),
          "split at " + std::to_string(cut));
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  check(stream(format, prompt, bytes), "byte by byte");
}

TEST(ReasoningFormat, NamesAndTemplateDetection) {
  EXPECT_EQ(reasoning_format_from_name("qwen3"), ReasoningFormat::Qwen3);
  EXPECT_EQ(reasoning_format_from_name("deepseek_r1"), ReasoningFormat::DeepSeekR1);
  EXPECT_EQ(reasoning_format_from_name("none"), ReasoningFormat::None);
  EXPECT_EQ(reasoning_format_from_name("granite"), std::nullopt);
  EXPECT_STREQ(reasoning_format_name(ReasoningFormat::DeepSeekR1), "deepseek_r1");
  EXPECT_EQ(detect_reasoning_format("{{ '<think>\\n\\n</think>\\n\\n' }}"), ReasoningFormat::Qwen3);
  EXPECT_EQ(detect_reasoning_format("{{'<｜Assistant｜><think>\\n'}}"),
            ReasoningFormat::DeepSeekR1);
  EXPECT_EQ(detect_reasoning_format("{{ message.content }}"), ReasoningFormat::None);
}

TEST(PromptThinking, LastMarkerDecides) {
  EXPECT_EQ(prompt_thinking("<|im_start|>assistant\n"), PromptThinking::Unopened);
  EXPECT_EQ(prompt_thinking("<|im_start|>assistant\n<think>\n"), PromptThinking::Open);
  EXPECT_EQ(prompt_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            PromptThinking::Closed);
  EXPECT_EQ(prompt_thinking("<think>a</think>b<|im_start|>assistant\n<think>\n"),
            PromptThinking::Open);
}

TEST(Qwen3Reasoning, ThinkBlockThenAnswer) {
  const std::string text = "<think>\nLet me think: 2+2.\n</think>\n\nIt is 4.";
  const ParsedReasoning p = parse_reasoning(ReasoningFormat::Qwen3, PromptThinking::Unopened, text);
  EXPECT_EQ(p.reasoning, "\nLet me think: 2+2.\n");
  EXPECT_EQ(p.content, "\n\nIt is 4.");
  expect_streams_match(ReasoningFormat::Qwen3, PromptThinking::Unopened, text);
}

TEST(Qwen3Reasoning, NoThinkBlockIsAllContent) {
  const std::string text = "<thin is not a tag; </think> here is just text";
  const ParsedReasoning p = parse_reasoning(ReasoningFormat::Qwen3, PromptThinking::Unopened, text);
  EXPECT_EQ(p.reasoning, std::nullopt);
  EXPECT_EQ(p.content, text);
  expect_streams_match(ReasoningFormat::Qwen3, PromptThinking::Unopened, text);
}

TEST(Qwen3Reasoning, PromptThatClosedThinkingMakesEverythingContent) {
  const std::string text = "<think>x</think>y";
  const ParsedReasoning p = parse_reasoning(ReasoningFormat::Qwen3, PromptThinking::Closed, text);
  EXPECT_EQ(p.reasoning, std::nullopt);
  EXPECT_EQ(p.content, text);
}

TEST(Qwen3Reasoning, PromptThatOpenedThinkingStartsInReasoning) {
  const std::string text = "pondering ☂ 東京…</think>\n\nDone.";
  const ParsedReasoning p = parse_reasoning(ReasoningFormat::Qwen3, PromptThinking::Open, text);
  EXPECT_EQ(p.reasoning, "pondering ☂ 東京…");
  EXPECT_EQ(p.content, "\n\nDone.");
  expect_streams_match(ReasoningFormat::Qwen3, PromptThinking::Open, text);
}

TEST(Qwen3Reasoning, UnclosedReasoningStaysReasoning) {
  const std::string text = "<think>\nstill thinking when max_tokens hit";
  const ParsedReasoning p = parse_reasoning(ReasoningFormat::Qwen3, PromptThinking::Unopened, text);
  EXPECT_EQ(p.reasoning, "\nstill thinking when max_tokens hit");
  EXPECT_EQ(p.content, std::nullopt);
  expect_streams_match(ReasoningFormat::Qwen3, PromptThinking::Unopened, text);
}

TEST(DeepSeekR1Reasoning, StartsInsideReasoningWithOrWithoutTheTag) {
  for (const std::string text : {"a</think>b", "<think>a</think>b"}) {
    const ParsedReasoning p =
        parse_reasoning(ReasoningFormat::DeepSeekR1, PromptThinking::Unopened, text);
    EXPECT_EQ(p.reasoning, "a") << text;
    EXPECT_EQ(p.content, "b") << text;
    expect_streams_match(ReasoningFormat::DeepSeekR1, PromptThinking::Unopened, text);
  }
}

TEST(NoReasoningFormat, EverythingIsContent) {
  const std::string text = "<think>a</think>b";
  const ParsedReasoning p = parse_reasoning(ReasoningFormat::None, PromptThinking::Open, text);
  EXPECT_EQ(p.reasoning, std::nullopt);
  EXPECT_EQ(p.content, text);
}

}  // namespace
}  // namespace attnres::server
