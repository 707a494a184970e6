// Tool calls out of a chat model's text, in the call syntaxes of the families the server runs
// (the names are vLLM's --tool-call-parser names):
//   hermes       Qwen3 / Hermes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>,
//                several blocks in a row for parallel calls; text around them is content.
//   llama3_json  Llama 3.x: the whole answer is {"name": ..., "parameters": {...}} (or
//                "arguments"), optionally after <|python_tag|>, several separated by ';'.
//                An answer that does not start with one is all content.
//   mistral      Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or the newer
//                [TOOL_CALLS]name[ARGS]{...}; text before the marker is content.
// One incremental parser serves both shapes of an answer: ToolCallStreamParser turns text as it
// is generated into content and tool-call deltas (a call's id and name first, then fragments of
// its arguments, as vLLM streams them), and parse_tool_calls runs it over a whole answer, so a
// stream's deltas always assemble to the whole answer's calls. Arguments are the model's own
// JSON text for the value, byte for byte (a call object that does not open with "name" then
// "arguments" is taken whole once complete, its arguments re-serialized).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnres::server {

enum class ToolCallFormat { None, Hermes, Llama3Json, Mistral };

// "hermes" / "llama3_json" / "mistral" / "none"; nullopt for another name.
std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);
// The format a chat template asks its model to write, from the template's text (its call
// markers); None when it shows none.
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

struct ToolCall {
  std::string id;  // "call_" + 24 random alphanumerics
  std::string name;
  std::string arguments;  // JSON text
};

// A piece of one call, in stream order: the first piece of call `index` carries its id and
// name (and arguments ""), later ones fragments of its arguments.
struct ToolCallDelta {
  int index = 0;
  std::optional<std::string> id;
  std::optional<std::string> name;
  std::string arguments;
};

// What one push() released: text outside calls, and call pieces.
struct ToolStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

// Makes call ids; the default draws random ones. Tests pass a counter.
using ToolCallIdMaker = std::function<std::string()>;
std::string random_tool_call_id();

class ToolCallStreamParser {
 public:
  explicit ToolCallStreamParser(ToolCallFormat format,
                                ToolCallIdMaker make_id = random_tool_call_id);

  // Feeds the next piece of the answer; returns what became certain. Text that might still
  // turn out to be part of a call marker or a call is held back until it is decided.
  ToolStreamDelta push(std::string_view text);
  // The answer ended: releases what was held back (an unfinished call is closed as it stands).
  ToolStreamDelta finish();

  // Calls started so far.
  int calls_started() const { return static_cast<int>(calls_.size()); }

  struct CallState {
    std::string id;
    std::string name;
    std::string arguments;  // sent so far
    std::string raw;        // the call's whole JSON text once it ended (for validation)
  };
  const std::vector<CallState>& calls() const { return calls_; }

 private:
  ToolStreamDelta parse(bool final);

  ToolCallFormat format_;
  ToolCallIdMaker make_id_;
  std::string text_;         // the whole answer so far
  size_t content_sent_ = 0;  // bytes of content released so far
  std::vector<CallState> calls_;
};

// A whole answer split into content and calls. vLLM's non-streamed rule: when a call's JSON
// does not parse (or lacks a string "name"), no calls are made and the whole text is content.
struct ParsedToolCalls {
  std::optional<std::string> content;  // nullopt when empty (vLLM sends null)
  std::vector<ToolCall> calls;
};
ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view text,
                                 const ToolCallIdMaker& make_id = random_tool_call_id);

}  // namespace attnres::server
