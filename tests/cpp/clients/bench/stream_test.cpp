// SSE parsing (the WHATWG event-stream rules, fed in every possible split) and the stream
// recorder's vLLM timing rules on scripted event sequences with hand-written timestamps.
#include <gtest/gtest.h>

#include "clients/bench/sse_parser.h"
#include "clients/bench/stream_recorder.h"

namespace attnres::bench {
namespace {

std::vector<std::string> parse_all(const std::string& body, size_t piece) {
  SseParser parser;
  std::vector<std::string> events;
  for (size_t i = 0; i < body.size(); i += piece) {
    for (std::string& e : parser.feed(body.substr(i, piece))) events.push_back(std::move(e));
  }
  return events;
}

TEST(SseParser, EventsSurviveAnySplit) {
  const std::string body =
      "data: {\"a\":1}\n\n"
      ": a comment, e.g. a keep-alive ping\n\n"
      "data:{\"b\":2}\r\n\r\n"                // no space after the colon, CRLF line ends
      "event: message\ndata: x\rdata: y\r\r"  // other fields ignored; CR line ends; two data lines
      "data: [DONE]\n\n"
      "data: unterminated";  // never dispatched
  const std::vector<std::string> expected = {"{\"a\":1}", "{\"b\":2}", "x\ny", "[DONE]"};
  for (size_t piece = 1; piece <= body.size(); ++piece) {
    EXPECT_EQ(parse_all(body, piece), expected) << "pieces of " << piece << " bytes";
  }
}

TEST(SseParser, DataWithoutValueAndBlankLinesAlone) {
  EXPECT_EQ(parse_all("\n\ndata\n\ndata: \n\n", 3), (std::vector<std::string>{"", ""}));
}

std::string completion_chunk(const std::string& text) {
  return R"({"object":"text_completion","choices":[{"index":0,"text":")" + text +
         R"(","finish_reason":null}]})";
}

constexpr const char* kUsage =
    R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}})";

TEST(StreamRecorder, CompletionTimeline) {
  RequestOutput out;
  OpenAiStreamRecorder r(OpenAiApi::kCompletions, 100.0, out);
  r.on_event(completion_chunk("a"), 100.5);  // TTFT 0.5
  r.on_event(completion_chunk(""), 100.75);  // an empty text still counts as a chunk (vLLM)
  r.on_event(completion_chunk("c"), 101.25);
  r.on_event(kUsage, 102.0);  // not a chunk: does not move the end
  r.on_event("[DONE]", 103.0);
  r.finish();
  EXPECT_TRUE(out.success) << out.error;
  EXPECT_DOUBLE_EQ(out.ttft, 0.5);
  EXPECT_EQ(out.itl, (std::vector<double>{0.25, 0.5}));
  EXPECT_DOUBLE_EQ(out.latency, 1.25);
  EXPECT_EQ(out.output_tokens, 3);
  EXPECT_EQ(out.prompt_len, 12);
  EXPECT_EQ(out.generated_text, "ac");
}

// llama.cpp's llama-server sends no `choices: []` event: usage rides on the last chunk, whose
// text is empty and which still counts as a chunk.
TEST(StreamRecorder, UsageOnTheLastChunk) {
  RequestOutput out;
  OpenAiStreamRecorder r(OpenAiApi::kCompletions, 10.0, out);
  r.on_event(completion_chunk("a"), 10.5);
  r.on_event(completion_chunk("b"), 11.0);
  r.on_event(R"({"choices":[{"text":"","index":0,"finish_reason":"length"}],)"
             R"("usage":{"completion_tokens":2,"prompt_tokens":7,"total_tokens":9}})",
             11.25);
  r.on_event("[DONE]", 11.5);
  r.finish();
  EXPECT_TRUE(out.success) << out.error;
  EXPECT_EQ(out.output_tokens, 2);
  EXPECT_EQ(out.prompt_len, 7);
  EXPECT_EQ(out.itl, (std::vector<double>{0.5, 0.25}));
  EXPECT_DOUBLE_EQ(out.latency, 1.25);
  EXPECT_EQ(out.generated_text, "ab");
}

TEST(StreamRecorder, ChatRoleChunkIsTheFirstChunk) {
  RequestOutput out;
  OpenAiStreamRecorder r(OpenAiApi::kChatCompletions, 0.0, out);
  r.on_event(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", 0.25);
  r.on_event(R"({"choices":[{"index":0,"delta":{"content":"Hi"}}]})", 0.5);
  r.on_event(R"({"choices":[{"index":0,"delta":{},"finish_reason":"length"}]})", 0.75);
  r.on_event(kUsage, 1.0);
  r.on_event("[DONE]", 1.0);
  r.finish();
  EXPECT_TRUE(out.success) << out.error;
  EXPECT_DOUBLE_EQ(out.ttft, 0.25);
  EXPECT_EQ(out.itl, (std::vector<double>{0.25, 0.25}));
  EXPECT_DOUBLE_EQ(out.latency, 0.75);
  EXPECT_EQ(out.generated_text, "Hi");
}

TEST(StreamRecorder, FailuresNameTheirCause) {
  struct Case {
    std::vector<std::string> events;
    std::string error_part;
  };
  const std::vector<Case> cases = {
      {{completion_chunk("a"), R"({"error":{"message":"engine died","type":"x"}})", "[DONE]"},
       "in-band error: engine died"},
      {{completion_chunk("a"), kUsage}, "without data: [DONE]"},
      {{completion_chunk("a"), "[DONE]"}, "no usage"},
      {{kUsage, "[DONE]"}, "never received a chunk"},
      {{"not json"}, "not a JSON object"},
  };
  for (const Case& c : cases) {
    RequestOutput out;
    OpenAiStreamRecorder r(OpenAiApi::kCompletions, 0.0, out);
    double t = 0;
    for (const std::string& e : c.events) r.on_event(e, t += 0.25);
    r.finish();
    EXPECT_FALSE(out.success);
    EXPECT_NE(out.error.find(c.error_part), std::string::npos) << out.error;
  }
}

TEST(CheckLengths, ExactWithIgnoreEos) {
  BenchPrompt prompt{"x", 12, 3, {}};
  RequestOutput out;
  out.success = true;
  out.prompt_len = 12;
  out.output_tokens = 3;
  check_lengths(prompt, true, out);
  EXPECT_TRUE(out.success);

  RequestOutput short_output = out;
  short_output.output_tokens = 2;
  check_lengths(prompt, true, short_output);
  EXPECT_FALSE(short_output.success);
  EXPECT_NE(short_output.error.find("generated 2 tokens, expected 3"), std::string::npos);
  short_output.success = true;
  short_output.error.clear();
  check_lengths(prompt, false, short_output);  // EOS may end it early without ignore_eos
  EXPECT_TRUE(short_output.success);

  RequestOutput wrong_prompt = out;
  wrong_prompt.prompt_len = 13;
  check_lengths(prompt, true, wrong_prompt);
  EXPECT_FALSE(wrong_prompt.success);
  EXPECT_NE(wrong_prompt.error.find("counted 13 prompt tokens, expected 12"), std::string::npos);
}

TEST(ChunkTimer, FirstChunkIsTtftAndTheRestAreGaps) {
  RequestOutput out;
  ChunkTimer timer(10.0);
  EXPECT_FALSE(timer.any());
  timer.on_chunk(10.5, out);
  timer.on_chunk(10.5, out);  // two chunks in one read: a gap of 0
  timer.on_chunk(11.0, out);
  timer.finish(out);
  EXPECT_DOUBLE_EQ(out.ttft, 0.5);
  EXPECT_EQ(out.itl, (std::vector<double>{0.0, 0.5}));
  EXPECT_DOUBLE_EQ(out.latency, 1.0);
}

}  // namespace
}  // namespace attnres::bench
