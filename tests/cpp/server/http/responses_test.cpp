// The pieces of /v1/responses that need no server: input items -> chat messages, tools, output
// items (function calls included), the event stream and the bounded response store.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "server/common/response_store.h"
#include "server/http/api_error.h"
#include "server/http/responses_output.h"
#include "server/http/responses_requests.h"
#include "server/http/responses_stream.h"
#include "tests/cpp/server/http/expect_api_error.h"

namespace attnres::server::http {
namespace {

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

// An answer's items built from pieces of `sizes` bytes (0: whole), with its events.
struct Built {
  Json items;
  std::vector<std::pair<std::string, Json>> events;
  std::string reasoning;
};
Built build(const ChatAnswerFormat& formats, const std::string& text, size_t piece,
            bool incomplete = false, int max_calls = 100) {
  std::string bytes;
  ResponseEventWriter events;
  events.set_output(&bytes);
  ResponseItemBuilder builder(formats, counting_ids(), &events, max_calls);
  if (piece == 0) piece = std::max<size_t>(text.size(), 1);
  for (size_t at = 0; at < text.size(); at += piece) builder.push(text.substr(at, piece));
  Built b;
  b.items = builder.finish(incomplete);
  b.events = parse_events(bytes);
  b.reasoning = builder.reasoning_text();
  return b;
}

// The items without their call ids (the tool-call parser draws them at random).
Json without_call_ids(Json items) {
  for (Json& item : items) item.erase("call_id");
  return items;
}

const ChatAnswerFormat kPlain{};
const ChatAnswerFormat kQwen3{ReasoningFormat::Qwen3, PromptThinking::Unopened,
                              ToolCallFormat::Hermes, /*first_call_only=*/false};
const std::string kQwen3Answer =
    "<think>\nNeed the weather.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": "
    "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n"
    "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

TEST(ResponseItems, PlainTextIsOneMessage) {
  const Built b = build(kPlain, "hello", 2);
  EXPECT_EQ(b.items, Json::parse(R"([{"id": "msg_1", "type": "message", "status": "completed",
    "role": "assistant", "content": [{"type": "output_text", "text": "hello",
    "annotations": [], "logprobs": []}]}])"));
  EXPECT_EQ(build(kPlain, "hel", 0, /*incomplete=*/true).items[0]["status"], "incomplete");
  // No text at all: still one (empty) message.
  EXPECT_EQ(build(kPlain, "", 0).items[0]["content"][0]["text"], "");
}

TEST(ResponseItems, Qwen3AnswerSplitsIntoReasoningMessageAndCalls) {
  const Built b = build(kQwen3, kQwen3Answer, 0);
  ASSERT_EQ(b.items.size(), 4u) << b.items.dump();
  EXPECT_EQ(b.items[0]["type"], "reasoning");
  EXPECT_EQ(b.items[0]["content"][0]["text"], "\nNeed the weather.\n");
  EXPECT_EQ(b.reasoning, "\nNeed the weather.\n");
  EXPECT_EQ(b.items[1]["type"], "message");
  EXPECT_EQ(b.items[1]["content"][0]["text"], "\n\nChecking.");
  EXPECT_EQ(b.items[2]["type"], "function_call");
  EXPECT_EQ(b.items[2]["name"], "get_weather");
  EXPECT_EQ(Json::parse(b.items[2]["arguments"].get<std::string>()),
            Json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(b.items[2]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(b.items[2]["id"], "fc_3");
  EXPECT_EQ(b.items[3]["name"], "get_time");
  for (const Json& item : b.items) EXPECT_EQ(item["status"], "completed");
  // Without parsers the same text is all content.
  EXPECT_EQ(build(kPlain, kQwen3Answer, 0).items[0]["content"][0]["text"], kQwen3Answer);
}

TEST(ResponseItems, PiecesGiveTheWholeAnswersItemsAndTheirEventsAssembleToThem) {
  const Json whole = without_call_ids(build(kQwen3, kQwen3Answer, 0).items);
  for (size_t piece : {1, 2, 3, 7}) {
    SCOPED_TRACE(piece);
    const Built b = build(kQwen3, kQwen3Answer, piece);
    EXPECT_EQ(without_call_ids(b.items), whole);
    // Replay the events: every item's deltas assemble to its final text or arguments.
    std::map<int, std::string> text, arguments, reasoning;
    std::vector<std::string> opened, done;
    for (size_t i = 0; i < b.events.size(); ++i) {
      const auto& [type, data] = b.events[i];
      EXPECT_EQ(data["type"], type);
      EXPECT_EQ(data["sequence_number"], int(i));
      const int index = data.value("output_index", -1);
      if (type == "response.output_item.added") {
        EXPECT_EQ(index, int(opened.size()));
        EXPECT_EQ(data["item"]["status"], "in_progress");
        opened.push_back(data["item"]["id"]);
      } else if (type == "response.output_text.delta") {
        text[index] += data["delta"].get<std::string>();
      } else if (type == "response.function_call_arguments.delta") {
        arguments[index] += data["delta"].get<std::string>();
      } else if (type == "response.reasoning_text.delta") {
        reasoning[index] += data["delta"].get<std::string>();
      } else if (type == "response.output_item.done") {
        EXPECT_EQ(index, int(done.size()));
        EXPECT_EQ(data["item"], b.items[size_t(index)]);
        done.push_back(data["item"]["id"]);
      }
    }
    EXPECT_EQ(opened, done);
    ASSERT_EQ(done.size(), 4u);
    EXPECT_EQ(reasoning[0], b.items[0]["content"][0]["text"]);
    EXPECT_EQ(text[1], b.items[1]["content"][0]["text"]);
    EXPECT_EQ(arguments[2], b.items[2]["arguments"]);
    EXPECT_EQ(arguments[3], b.items[3]["arguments"]);
  }
}

TEST(ResponseItems, WhitespaceBeforeCallsIsNoMessageAndMaxCallsCaps) {
  const std::string calls_only =
      "\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
  const ChatAnswerFormat hermes{ReasoningFormat::None, PromptThinking::Unopened,
                                ToolCallFormat::Hermes, /*first_call_only=*/false};
  for (size_t piece : {0, 1}) {
    const Built b = build(hermes, calls_only, piece);
    ASSERT_EQ(b.items.size(), 2u) << b.items.dump();
    EXPECT_EQ(b.items[0]["name"], "f");
    EXPECT_EQ(b.items[1]["name"], "g");
    const Built one = build(hermes, calls_only, piece, false, /*max_calls=*/1);
    ASSERT_EQ(one.items.size(), 1u);
    EXPECT_EQ(one.items[0]["name"], "f");
  }
}

TEST(ResponseItems, ACutAnswerMarksOnlyItsLastItemIncomplete) {
  const Built b = build(kQwen3, "<think>\nhm\n</think>\n\nPartial ans", 3, /*incomplete=*/true);
  ASSERT_EQ(b.items.size(), 2u);
  EXPECT_EQ(b.items[0]["status"], "completed");
  EXPECT_EQ(b.items[1]["status"], "incomplete");
}

TEST(ResponsesOutput, FunctionCallItemShape) {
  EXPECT_EQ(function_call_item("fc_2", {"call_a", "f", "{\"a\":1}"}, "completed"),
            Json::parse(R"({"id": "fc_2", "type": "function_call", "status":
    "completed", "call_id": "call_a", "name": "f", "arguments": "{\"a\":1}"})"));
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

TEST(ResponseEvents, LifecycleEvents) {
  std::string bytes;
  ResponseEventWriter events;
  events.set_output(&bytes);
  ResponseState state;
  state.id = "resp_1";
  events.started(response_json(state, Json::object()));
  state.status = "incomplete";
  events.ended(response_json(state, Json::object()));
  state.status = "completed";
  events.ended(response_json(state, Json::object()));
  state.status = "failed";
  events.failed(response_json(state, Json::object()));
  std::vector<std::string> types;
  for (const auto& [type, data] : parse_events(bytes)) types.push_back(type);
  EXPECT_EQ(types, (std::vector<std::string>{"response.created", "response.in_progress",
                                             "response.incomplete", "response.completed",
                                             "response.failed"}));
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
