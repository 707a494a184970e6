// The pieces of /v1/responses that need no server: input items -> chat messages, tools, output
// items (function calls included), the event stream and the bounded response store.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/common/response_store.h"
#include "server/http/api_error.h"
#include "server/http/responses_output.h"
#include "server/http/responses_requests.h"

namespace attnres::server::http {
namespace {

ApiError expect_api_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError thrown";
  return ApiError(0, "");
}

TEST(ResponsesInput, StringIsOneUserMessage) {
  const Json items = responses_input_items("hi");
  EXPECT_EQ(responses_items_to_messages(items, "input"),
            Json::parse(R"([{"role": "user", "content": "hi"}])"));
}

TEST(ResponsesInput, ItemsBecomeChatMessages) {
  const Json items = Json::parse(R"([
    {"role": "developer", "content": "be brief"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                     {"type": "input_text", "text": "b"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [],
     "content": [{"type": "reasoning_text", "text": "think"}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "calling", "annotations": []}]},
    {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"x\":1}"},
    {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "one"},
    {"type": "function_call_output", "call_id": "call_2",
     "output": [{"type": "input_text", "text": "two"}]}
  ])");
  const Json expected = Json::parse(R"([
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "a\nb"},
    {"role": "assistant", "content": "calling", "reasoning_content": "think",
     "tool_calls": [
       {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
       {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "one", "name": "f"},
    {"role": "tool", "tool_call_id": "call_2", "content": "two", "name": "g"}
  ])");
  EXPECT_EQ(responses_items_to_messages(items, "input"), expected);
}

TEST(ResponsesInput, FunctionCallAloneOpensAnAssistantTurn) {
  const Json items = Json::parse(R"([
    {"role": "user", "content": "q"},
    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])");
  const Json messages = responses_items_to_messages(items, "input");
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[1]["role"], "assistant");
  EXPECT_EQ(messages[1]["content"], "");
  EXPECT_EQ(messages[1]["tool_calls"].size(), 1u);
}

TEST(ResponsesInput, BadItemsNameTheField) {
  struct Case {
    const char* input;
    const char* message_part;
  };
  const Case cases[] = {
      {R"(42)", "expected a string or a list of input items"},
      {R"([])", "must not be empty"},
      {R"([7])", "input[0]: expected an input item object"},
      {R"([{"content": "x"}])", "input[0].type: is required"},
      {R"([{"role": "tool", "content": "x"}])", "input[0].role: \"tool\""},
      {R"([{"role": "user"}])", "input[0].content: is required"},
      {R"([{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}])",
       "input[0].content[0].type: \"input_image\" is not supported"},
      {R"([{"type": "function_call", "name": "f", "arguments": "{}"}])",
       "input[0].call_id: is required"},
      {R"([{"type": "function_call_output", "call_id": "c"}])", "input[0].output: is required"},
      {R"([{"type": "item_reference", "id": "x"}])", "input[0].type: \"item_reference\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.input);
    const Json input = Json::parse(c.input);
    ApiError e = expect_api_error(
        [&] { responses_items_to_messages(responses_input_items(input), "input"); });
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "input");
    EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos) << e.what();
  }
}

TEST(ResponsesTools, FunctionToolsBecomeChatTools) {
  const Json tools = Json::parse(R"([{"type": "function", "name": "get_weather",
    "description": "d", "parameters": {"type": "object"}, "strict": true}])");
  EXPECT_EQ(responses_tools_to_chat(tools), Json::parse(R"([{"type": "function", "function":
    {"name": "get_weather", "description": "d", "parameters": {"type": "object"},
     "strict": true}}])"));
}

TEST(ResponsesTools, OtherToolTypesAreRefused) {
  for (const char* tools :
       {R"([{"type": "web_search"}])", R"([{"type": "file_search"}])", R"([{"type": "function"}])",
        R"({"type": "function"})", R"([{"type": "function", "name": "f", "parameters": 3}])"}) {
    SCOPED_TRACE(tools);
    ApiError e = expect_api_error([&] { responses_tools_to_chat(Json::parse(tools)); });
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "tools");
  }
}

// Ids "<prefix>_<n>" counting up, so expectations can name them.
ItemIdMaker counting_ids() {
  auto n = std::make_shared<int>(0);
  return [n](std::string_view prefix) { return std::string(prefix) + "_" + std::to_string(++*n); };
}

TEST(ResponsesOutput, PlainTextIsOneMessage) {
  const Json items = output_items(AssistantTurn{"", "hello", {}}, false, counting_ids());
  EXPECT_EQ(items, Json::parse(R"([{"id": "msg_1", "type": "message", "status": "completed",
    "role": "assistant", "content": [{"type": "output_text", "text": "hello",
    "annotations": [], "logprobs": []}]}])"));
  const Json cut = output_items(AssistantTurn{"", "hel", {}}, true, counting_ids());
  EXPECT_EQ(cut[0]["status"], "incomplete");
}

TEST(ResponsesOutput, ReasoningAndFunctionCalls) {
  AssistantTurn turn{"why", "", {{"call_a", "f", "{\"a\":1}"}, {"call_b", "g", "{}"}}};
  const Json items = output_items(turn, false, counting_ids());
  ASSERT_EQ(items.size(), 3u);  // no empty message next to calls
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[0]["content"][0]["text"], "why");
  EXPECT_EQ(items[1], Json::parse(R"({"id": "fc_2", "type": "function_call", "status":
    "completed", "call_id": "call_a", "name": "f", "arguments": "{\"a\":1}"})"));
  EXPECT_EQ(items[2]["name"], "g");
  EXPECT_EQ(items[2]["call_id"], "call_b");
  EXPECT_EQ(items[2]["id"], "fc_3");
}

TEST(ResponsesOutput, SplitsAQwen3AnswerIntoReasoningContentAndCalls) {
  const AnswerFormats qwen3{ReasoningFormat::Qwen3, PromptThinking::Unopened,
                            ToolCallFormat::Hermes};
  const std::string text =
      "<think>\nNeed the weather.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const AssistantTurn turn = split_answer(qwen3, text);
  EXPECT_EQ(turn.reasoning, "\nNeed the weather.\n");
  EXPECT_EQ(turn.content, "\n\nChecking.");
  ASSERT_EQ(turn.calls.size(), 1u);
  EXPECT_EQ(turn.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(turn.calls[0].arguments), Json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(turn.calls[0].id.rfind("call_", 0), 0u);
  const Json items = output_items(turn, false, counting_ids());
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[1]["type"], "message");
  EXPECT_EQ(items[2]["type"], "function_call");
  EXPECT_EQ(items[2]["call_id"], turn.calls[0].id);

  // Without parsers (no tools, a template that does not think) the text is all content.
  EXPECT_EQ(split_answer(AnswerFormats{}, text).content, text);
  EXPECT_TRUE(split_answer(AnswerFormats{}, text).calls.empty());
}

TEST(ResponsesOutput, UsageShape) {
  Usage usage;
  usage.prompt_tokens = 10;
  usage.completion_tokens = 4;
  usage.cached_tokens = 8;
  EXPECT_EQ(responses_usage_json(usage, 2), Json::parse(R"({"input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 8}, "output_tokens": 4,
    "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 14})"));
}

// The (event line, data) pairs of an SSE byte string.
std::vector<std::pair<std::string, Json>> parse_events(const std::string& bytes) {
  std::vector<std::pair<std::string, Json>> events;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t end = bytes.find("\n\n", at);
    const std::string block = bytes.substr(at, end - at);
    const size_t newline = block.find('\n');
    EXPECT_EQ(block.rfind("event: ", 0), 0u);
    EXPECT_EQ(block.compare(newline + 1, 6, "data: "), 0);
    events.emplace_back(block.substr(7, newline - 7), Json::parse(block.substr(newline + 7)));
    at = end + 2;
  }
  return events;
}

TEST(ResponseEvents, StreamedMessageThenFunctionCall) {
  std::string bytes;
  int sequence = 0;
  ResponseEventWriter events(bytes, sequence);
  ResponseState state;
  state.id = "resp_1";
  const Json echo = {{"tools", Json::array()}};
  events.started(response_json(state, echo));
  events.message_started(0, "msg_1");
  events.text_delta(0, "msg_1", "hel");
  events.text_delta(0, "msg_1", "lo");
  state.status = "completed";
  state.output = Json::array({message_item("msg_1", "hello", "completed"),
                              function_call_item("fc_2", {"call_3", "f", "{}"}, "completed")});
  events.finished(response_json(state, echo), 1);

  const auto parsed = parse_events(bytes);
  std::vector<std::string> types;
  for (size_t i = 0; i < parsed.size(); ++i) {
    types.push_back(parsed[i].first);
    EXPECT_EQ(parsed[i].second["type"], parsed[i].first);
    EXPECT_EQ(parsed[i].second["sequence_number"], int(i));
  }
  const std::vector<std::string> expected = {
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
  };
  EXPECT_EQ(types, expected);
  EXPECT_EQ(parsed[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(parsed[2].second["item"]["status"], "in_progress");
  EXPECT_EQ(parsed[6].second["text"], "hello");
  EXPECT_EQ(parsed[9].second["item"]["arguments"], "");
  EXPECT_EQ(parsed[9].second["output_index"], 1);
  EXPECT_EQ(parsed[11].second["arguments"], "{}");
  EXPECT_EQ(parsed[13].second["response"]["output"].size(), 2u);
}

TEST(ResponseEvents, IncompleteEndsWithResponseIncomplete) {
  std::string bytes;
  int sequence = 0;
  ResponseEventWriter events(bytes, sequence);
  ResponseState state;
  state.status = "incomplete";
  state.output = Json::array({message_item("msg_1", "cut", "incomplete")});
  events.finished(response_json(state, Json::object()), 0);
  const auto parsed = parse_events(bytes);
  EXPECT_EQ(parsed.front().first, "response.output_item.added");
  EXPECT_EQ(parsed[2].first, "response.output_text.delta");  // the whole text at once
  EXPECT_EQ(parsed[2].second["delta"], "cut");
  EXPECT_EQ(parsed.back().first, "response.incomplete");
}

TEST(ResponseStore, EvictsTheLeastRecentlyUsed) {
  ResponseStore store(2);
  store.put("a", {Json::array({1}), Json::object()});
  store.put("b", {Json::array({2}), Json::object()});
  ASSERT_TRUE(store.get("a"));  // a is now the most recently used
  store.put("c", {Json::array({3}), Json::object()});
  EXPECT_TRUE(store.get("a"));
  EXPECT_FALSE(store.get("b"));
  EXPECT_EQ(store.get("c")->conversation, Json::array({3}));
  EXPECT_EQ(store.size(), 2u);
}

TEST(ResponseStore, CapacityZeroStoresNothing) {
  ResponseStore store(0);
  store.put("a", {Json::array(), Json::object()});
  EXPECT_FALSE(store.get("a"));
}

}  // namespace
}  // namespace attnres::server::http
